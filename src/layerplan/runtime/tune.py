"""`layerplan tune`: Omnivore's optimizer (``plan/tune.py``) with real trials — short runs of the
groups runtime on the digits data — as the paper's loop: the cold start, the search from the current
model, then epochs of training, each checkpointed.

    layerplan tune debug --workers 4 --target-loss 0.05 --steps 2000

Every trial starts from the current model W (the latest checkpoint of the run, ``RunSpec.init_from``)
and ends in its own checkpoint; the winning trial's checkpoint becomes W, so its iterations are
training and only the losing trials are search overhead. Training then runs in epochs of
``--epoch-steps`` iterations from W; an epoch whose loss collapses is rolled back to W and the
search runs again at a tenth of the learning rate (short trials cannot see a learning rate that
diverges over a long run). The run ends at the target loss or after ``--steps`` iterations.

All trials and epochs go to one ``launch.Session``: the N + 2 ranks start and meet once, and each
run only builds its model and roles (a fraction of a second). A trial's loss is the mean of its last
three steps' losses (asynchronous losses are noisy). ``--out FILE`` keeps the state after every
trial and epoch, so an interrupted tune shows how far it got; ``--checkpoint-dir DIR`` keeps the
tuned model (``DIR/model``, a checkpoint ``train --resume`` of a groups run can continue).
"""

from __future__ import annotations

import argparse
import math
import time

from layerplan.errors import ConfigError

LAST_STEPS = 3
TARGET_WINDOW = 20
"""A run has reached the target loss when the mean of its last 20 steps' losses has (5 let a few
lucky mini-batches count: lenet5 on digits-augmented "reached" 0.03 at an iteration whose epoch
ended at 0.06)."""


def register(subparsers) -> None:
    from layerplan.cli import COMMANDS, add_model_args, positive_int

    p = subparsers.add_parser(
        "tune", help="choose Omnivore's groups, momentum and learning rate by short trials (Algorithm 1)",
        description="Cold start (synchronous, learning rates low → high), then from the FC-saturating number of "
                    "groups a grid of momenta {0, 0.3, 0.6, 0.9} × learning rates {last, last/10}, halving the "
                    "groups while the best momentum is 0; short runs of the groups runtime on the digits data, each "
                    "from the current model, the winner's progress kept. Then training in checkpointed epochs "
                    "(a collapsed epoch is rolled back and searched again at a tenth of the learning rate) to "
                    "--target-loss. Reports the chosen (g, µ, η), the search overhead and the time to the target.")
    add_model_args(p)
    p.add_argument("--workers", type=positive_int, default=4, metavar="N", help="conv machines N (default 4)")
    p.add_argument("--on", default="local", metavar="local", help="where trials run (local only)")
    p.add_argument("--target-loss", type=float, metavar="L", help="report the training time to reach this loss")
    p.add_argument("--budget", metavar="TIME", help="tuning time budget, e.g. 90s, 5min (the best trial so far wins)")
    p.add_argument("--batch-size", type=positive_int, default=8, metavar="B", help="samples per machine (default 8)")
    p.add_argument("--trial-steps", type=positive_int, default=12, metavar="K", help="iterations per group per trial (default 12)")
    p.add_argument("--rungs", type=positive_int, default=1, metavar="R",
                   help="run each grid by successive halving in R rungs: every (µ, η) for K/2^(R-1) iterations, "
                        "the better half continued to twice as far, ..., the last two to K (R = 3: 8 configurations "
                        "for the iterations of 4 trials; default 1: the paper's grid, every trial K iterations)")
    p.add_argument("--steps", type=positive_int, default=600, metavar="K",
                   help="iterations per group of the tuned run, adopted trials included; it ends earlier at "
                        "--target-loss (default 600)")
    p.add_argument("--epoch-steps", type=positive_int, default=100, metavar="K",
                   help="iterations per training epoch: each is checkpointed, and rolled back if its loss collapses "
                        "(default 100)")
    p.add_argument("--retune-every", type=int, default=0, metavar="E",
                   help="search again from the current model every E epochs, as Omnivore does every hour "
                        "(default 0: once)")
    p.add_argument("--groups", type=positive_int, metavar="G",
                   help="fix the number of groups (must divide N): tune momentum and learning rate for it alone")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="keep the tuned model's checkpoint in DIR/model "
                   "(default: a temporary directory, removed)")
    p.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                   help="also run synchronous (g = 1) and fully asynchronous (g = N) to the target, each with its "
                        "best momentum (default on)")
    p.add_argument("--out", metavar="FILE", help="write the search (every trial) and the runs as JSON, after each trial")
    p.add_argument("--data", choices=("digits", "digits-augmented"), default="digits",
                   help="the learning task: scikit-learn's digits (default; the debug net's training loss is near 0 "
                        "within ~1,000 iterations), or the digits with each sample randomly rotated, scaled and "
                        "shifted (its training loss falls over thousands of iterations, to ~0.2; trials need "
                        "--trial-steps ~100 to rank learning rates)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    COMMANDS["tune"] = cmd_tune


def run_spec(args, groups: int, momentum: float, lr: float, steps: int):
    from layerplan.runtime.run_spec import RunSpec

    return RunSpec(model=args.model, strategy="groups", config={"machines": args.workers, "groups": groups},
                   input_size=args.input_size, num_classes=args.num_classes, batch_size=args.batch_size, steps=steps,
                   lr=lr, momentum=momentum, data=args.data, seed=args.seed, progress=False, timeout_s=30.0)


def final_loss(m: dict) -> float:
    tail = [x for x in m["loss"][-LAST_STEPS:] if x is not None]
    v = sum(tail) / len(tail) if tail else math.inf
    return v if math.isfinite(v) else math.inf


def best_for(trials, groups: int):
    """The lowest-loss grid trial at ``groups`` (None: its momentum was never tuned — the cold start
    tries one momentum only)."""
    pool = [t for t in trials if t.groups == groups and t.phase == "grid" and math.isfinite(t.loss)]
    return min(pool, key=lambda t: t.loss) if pool else None


def run_summary(m: dict, target: float | None, label: str, g: int, mu: float, lr: float, wall_s: float) -> dict:
    from layerplan.plan.tune import time_to_target

    seen = [(x, i) for i, x in enumerate(m["loss"]) if x is not None and math.isfinite(x)]
    best, best_step = min(seen) if seen else (None, None)
    last = final_loss(m)
    return {"label": label, "groups": g, "momentum": mu, "lr": lr, "steps": len(m["loss"]), "loss": last,
            "first_loss": m["loss"][0], "min_loss": best, "min_loss_step": best_step,
            # the run ended no better than it began: (g, µ, η) won the short trials but diverges over a long
            # run (e.g. µ = 0.9, η = 0.1 on digits collapses to chance after ~200 synchronous steps)
            "diverged": not math.isfinite(last) or (m["loss"][0] is not None and last >= m["loss"][0]),
            "step_time_s": m["step_time_s"], "wall_s": wall_s,
            "staleness_mean": (m.get("staleness") or {}).get("mean"),
            "time_to_target_s": None if target is None else time_to_target(m["loss"], m["step_times_s"], target,
                                                                                 TARGET_WINDOW)}


class LiveRunner:
    """``plan.tune.Runner`` on real processes: W is a checkpoint directory (None: the initialisation);
    every trial and epoch is a groups run ``init_from`` W into a directory of its own."""

    def __init__(self, args, work, run, say):
        self.args, self.work, self._run, self._say = args, work, run, say
        self.w: str | None = None
        self.step = 0  # iterations per group on the kept trajectory
        self.first_loss = math.inf
        self.kept: list[tuple[str, dict, float]] = []  # (what, measurement, wall s) of the trajectory's segments
        self.trials: list[tuple[str, dict, float]] = []  # (checkpoint dir, measurement, wall s) per trial
        self.trial_cfg: list[tuple[int, float, float]] = []  # (g, µ, η) per trial
        self.adopted: set[int] = set()
        self.rolled_back_s = 0.0
        self.pending: tuple[str, dict, float] | None = None
        self.last_epoch: dict | None = None

    def _go(self, name: str, g: int, mu: float, lr: float, steps: int) -> tuple[str, dict, float]:
        out = str(self.work / name)
        spec = run_spec(self.args, g, mu, lr, self.step + steps).replace(checkpoint_dir=out, init_from=self.w)
        t = time.perf_counter()
        m = self._run(spec)
        if not math.isfinite(self.first_loss) and m["loss"] and m["loss"][0] is not None:
            self.first_loss = m["loss"][0]
        return out, m, time.perf_counter() - t

    def samples_per_s(self, index: int) -> float | None:
        """Trial ``index``'s measured throughput (samples per second of the whole run)."""
        m = self.trials[index][1] if index < len(self.trials) else {}
        return m.get("throughput_samples_per_s") or None

    def trial_steps(self, fraction: float) -> int:
        """Iterations per group of ``fraction`` of a trial (a part: at least the LAST_STEPS its loss is of)."""
        k = self.args.trial_steps
        return k if fraction >= 1 else min(k, max(LAST_STEPS, round(k * fraction)))

    def trial(self, g: int, mu: float, lr: float, fraction: float = 1.0) -> float:
        from layerplan.runtime.launch import RunError

        i = len(self.trials)
        self.trial_cfg.append((g, mu, lr))
        try:
            self.trials.append(self._go(f"trial-{i}", g, mu, lr, self.trial_steps(fraction)))
        except RunError as e:  # a diverged run may fail: it loses the trial
            self._say(f"  trial g={g} µ={mu} η={lr:g} failed: {e}")
            self.trials.append((str(self.work / f"trial-{i}"), {"loss": []}, 0.0))
            return math.inf
        return final_loss(self.trials[-1][1])

    def extend(self, index: int, fraction: float) -> float:
        """Trial ``index`` continued from its checkpoint to ``fraction`` of a trial: one measurement
        of both segments, one wall time, the new checkpoint in place of the old."""
        import shutil

        from layerplan.runtime.launch import RunError

        out, m, wall = self.trials[index]
        done = len(m["loss"])
        more = self.trial_steps(fraction) - done
        if not m["loss"] or more <= 0:
            return final_loss(m) if m["loss"] else math.inf
        g, mu, lr = self.trial_cfg[index]
        name = f"trial-{index}-{done + more}"
        spec = run_spec(self.args, g, mu, lr, self.step + done + more).replace(
            checkpoint_dir=str(self.work / name), init_from=out)
        t = time.perf_counter()
        try:
            m2 = self._run(spec)
        except RunError as e:
            self._say(f"  trial g={g} µ={mu} η={lr:g} failed: {e}")
            self.trials[index] = (out, {**m, "loss": m["loss"] + [math.nan]}, wall + time.perf_counter() - t)
            return math.inf
        merged = {**m2, "loss": m["loss"] + m2["loss"], "step_times_s": m["step_times_s"] + m2["step_times_s"]}
        self.trials[index] = (str(self.work / name), merged, wall + time.perf_counter() - t)
        shutil.rmtree(out, ignore_errors=True)
        return final_loss(merged)

    def adopt(self, t) -> None:
        out, m, wall = self.trials[t.index]
        if not m["loss"]:  # a failed trial (every trial failed): it left no checkpoint, W stays
            return
        self._move_to(out, m, wall, f"{t.phase} trial")
        self.adopted.add(t.index)

    def train(self, g: int, mu: float, lr: float) -> list:
        from layerplan.runtime.launch import RunError

        steps = min(self.args.epoch_steps, self.args.steps - self.step)
        t = time.perf_counter()
        try:
            self.pending = self._go(f"epoch-{self.step}", g, mu, lr, steps)
        except RunError as e:  # e.g. a rank died of the diverged numbers: roll it back like a collapse
            self._say(f"  epoch g={g} µ={mu} η={lr:g} failed: {e}")
            self.pending = (str(self.work / f"epoch-{self.step}"), {"loss": [math.nan]}, time.perf_counter() - t)
        return self.pending[1]["loss"]

    def commit(self) -> None:
        out, m, wall = self.pending
        self.last_epoch = m
        self._move_to(out, m, wall, "epoch")

    def rollback(self) -> None:
        import shutil

        out, _, wall = self.pending
        self.rolled_back_s += wall
        shutil.rmtree(out, ignore_errors=True)
        self.pending = None

    def _move_to(self, out: str, m: dict, wall: float, what: str) -> None:
        """W ← ``out``: the run's segment joins the trajectory; the previous W is removed."""
        import shutil

        if self.w and self.w != out:
            shutil.rmtree(self.w, ignore_errors=True)
        self.w = out
        self.step += len(m["loss"])
        self.kept.append((what, m, wall))
        for i, (d, _, _) in enumerate(self.trials):  # losing trials' checkpoints are no longer needed
            if i not in self.adopted and d != out:
                shutil.rmtree(d, ignore_errors=True)

    def trajectory(self) -> dict:
        """The kept segments as one run's measurement (losses and step times in order)."""
        import statistics

        loss = [x for _, m, _ in self.kept for x in m["loss"]]
        times = [x for _, m, _ in self.kept for x in m["step_times_s"]]
        epochs = [m for what, m, _ in self.kept if what == "epoch"] or [m for _, m, _ in self.kept]
        return {"loss": loss, "step_times_s": times,
                "step_time_s": statistics.median([m["step_time_s"] for m in epochs]) if epochs else None,
                "staleness": (self.last_epoch or {}).get("staleness")}

    def reached(self) -> bool:
        from layerplan.plan.tune import time_to_target

        tr = self.trajectory()
        return (self.args.target_loss is not None
                and time_to_target(tr["loss"], tr["step_times_s"], self.args.target_loss, TARGET_WINDOW) is not None)

    def done(self) -> bool:
        return self.step >= self.args.steps or self.reached()

    @property
    def current_loss(self) -> float | None:
        tail = [x for x in self.trajectory()["loss"][-10:] if x is not None]
        return sum(tail) / len(tail) if tail else None

    def search_s(self) -> float:
        """Wall time of what the run did not keep: losing trials and rolled-back epochs."""
        return sum(w for i, (_, _, w) in enumerate(self.trials) if i not in self.adopted) + self.rolled_back_s


def cmd_tune(args: argparse.Namespace) -> int:
    import shutil
    import tempfile
    from pathlib import Path

    from layerplan import units
    from layerplan.plan import omnivore
    from layerplan.plan.tune import HE_GAIN, MOMENTA, optimize
    from layerplan.runtime.checkpoint import atomic_write_json
    from layerplan.runtime.launch import RunError, Session, preflight
    from layerplan.runtime.model import resolve
    from layerplan.runtime.predict import local_cluster, run_net

    if args.on != "local":
        raise ConfigError(f"tune: trials run on local processes only (--on local), not {args.on!r}")
    if args.retune_every < 0:
        raise ConfigError(f"--retune-every must be >= 0 epochs, got {args.retune_every}")
    if args.target_loss is not None and not (math.isfinite(args.target_loss) and args.target_loss > 0):
        # the training loss (cross-entropy) is positive: a target at or below 0 is never reached
        raise ConfigError(f"--target-loss must be a positive number, got {args.target_loss:g}")
    budget = units.parse_seconds(args.budget, "--budget") if args.budget else None
    probe = run_spec(args, 1, 0.9, 0.01, args.trial_steps)
    preflight(probe)  # no FC phase, unfit data, too many ranks: one line before any trial
    if args.checkpoint_dir:
        keep = Path(args.checkpoint_dir)
        if keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
            raise ConfigError(f"--checkpoint-dir {keep} exists and is not an empty directory")
    net = run_net(probe, resolve(probe)[0])
    times = omnivore.group_times(net, local_cluster(args.workers + 2), args.batch_size)
    start = omnivore.saturating_groups(times, args.workers, args.batch_size)
    if args.groups is not None:
        if args.workers % args.groups:
            raise ConfigError(f"--groups {args.groups} does not divide --workers {args.workers}")
        start = args.groups
    state: dict = {"model": args.model, "workers": args.workers, "start_groups": start, "target_loss": args.target_loss,
                   "trials": [], "epochs": [], "runs": []}

    def save() -> None:
        if args.out:
            atomic_write_json(args.out, state)

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    say(f"tune {args.model}: {args.workers} conv machines, " + (f"g = {start} fixed (--groups)" if args.groups else
                                                                 f"FC-saturating start g = {start} (HE(g), Omnivore §IV-B)"))
    t_start = time.perf_counter()
    sessions = [Session(probe)]
    say(f"  ranks started and connected in {time.perf_counter() - t_start:.1f} s (once for every trial)")

    def run(spec) -> dict:
        try:
            return sessions[-1].run(spec)
        except RunError:  # the session is gone: the next run gets fresh ranks
            sessions.append(Session(probe))
            raise

    work = Path(tempfile.mkdtemp(prefix="layerplan-tune-"))
    runner = LiveRunner(args, work, run, say)
    try:
        def show(t) -> None:
            state["trials"].append({"phase": t.phase, "groups": t.groups, "momentum": t.momentum, "lr": t.lr,
                                    "loss": t.loss if math.isfinite(t.loss) else None, "seconds": t.seconds,
                                    "iterations": runner.trial_steps(t.fraction), "trial": t.index,
                                    "samples_per_s": t.samples_per_s,
                                    "from_step": runner.step})
            save()
            say(f"  {t.phase:<10} g={t.groups:<3} µ={t.momentum:<4} η={t.lr:<8g} loss {t.loss:.4f}  ({t.seconds:.2f} s"
                + ("" if args.rungs == 1 else f", {runner.trial_steps(t.fraction)} iterations") + ")")

        def went_sync(t, sync_samples_per_s: float) -> None:
            say(f"  g={t.groups} ran {t.samples_per_s:.0f} samples/s, under {1 + HE_GAIN:g}× the synchronous "
                f"{sync_samples_per_s:.0f} samples/s: asynchrony buys no throughput here, the grid runs at g = 1")

        def show_epoch(e) -> None:
            state["epochs"].append({"index": e.index, "groups": e.groups, "momentum": e.momentum, "lr": e.lr,
                                    "first_loss": e.first_loss, "last_loss": e.last_loss, "diverged": e.diverged,
                                    "seconds": e.seconds, "from_step": runner.step})
            save()
            last = "—" if e.last_loss is None else f"{e.last_loss:.4f}"
            say(f"  epoch {e.index:<4} g={e.groups:<3} µ={e.momentum:<4} η={e.lr:<8g} loss → {last}  "
                f"({e.seconds:.2f} s)" + ("  collapsed: rolled back to the last checkpoint, searching η/10"
                                          if e.diverged else f"  iteration {runner.step + len(runner.pending[1]['loss'])}"))

        r = optimize(runner, args.workers, start, budget_s=budget, retune_epochs=args.retune_every,
                     fixed_groups=args.groups is not None, progress=show, on_epoch=show_epoch, rungs=args.rungs,
                     on_sync=went_sync)
        state.update({k: v for k, v in r.to_dict().items() if k not in ("trials", "epochs")})
        state["start_groups"] = start
        save()
        say(f"chosen: g = {r.groups}, momentum {r.momentum}, learning rate {r.lr:g} (cold start {r.cold_start_lr:g}); "
            f"{len(r.trials)} trials in {units.format_seconds(r.tuning_s)}" + (f" — {r.stopped}" if r.stopped else "")
            + ("" if r.final == (r.groups, r.momentum, r.lr) else
               f"; ended with g = {r.final[0]}, µ = {r.final[1]}, η = {r.final[2]:g}"))
        row = run_summary(runner.trajectory(), args.target_loss, "chosen", *r.final,
                          sum(w for _, _, w in runner.kept))
        row["search_s"] = runner.search_s()
        state["runs"].append(row)
        save()
        report(say, row, args)
        if args.checkpoint_dir and runner.w:
            Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            shutil.move(runner.w, Path(args.checkpoint_dir) / "model")
            say(f"  the tuned model: {Path(args.checkpoint_dir) / 'model'} (step {runner.step})")
        plan = []
        if args.compare:
            for label, g in (("sync", 1), ("async", args.workers)):
                if g == r.groups:
                    continue
                best = best_for(r.trials, g)
                if best is None:  # its momentum tuned for it: the grid at the cold-start learning rate, from scratch
                    say(f"  tuning momentum for {label} (g = {g}) — not part of the search")
                    grid = [(mu, lr) for lr in (r.cold_start_lr, r.cold_start_lr / 10) for mu in MOMENTA]
                    _, mu, lr = min((trial_from_scratch(args, run, g, mu, lr), mu, lr) for mu, lr in grid)
                else:
                    mu, lr = best.momentum, best.lr
                plan.append((label, g, mu, lr))
        for label, g, mu, lr in plan:  # from the initialisation, as a user who did not tune would run them
            t0 = time.perf_counter()
            m = run(run_spec(args, g, mu, lr, args.steps))
            row = run_summary(m, args.target_loss, label, g, mu, lr, time.perf_counter() - t0)
            state["runs"].append(row)
            save()
            report(say, row, args)
    finally:
        sessions[-1].close()
        shutil.rmtree(work, ignore_errors=True)
    chosen = state["runs"][0]
    state["search_s"] = chosen["search_s"]
    state["overhead"] = (chosen["search_s"] / chosen["time_to_target_s"]) if chosen.get("time_to_target_s") else None
    save()
    if args.json:
        from layerplan.cli import emit_json

        emit_json(state)
        return 0
    if state["overhead"] is not None:
        say(f"search overhead: {units.format_seconds(chosen['search_s'])} of losing trials and rolled-back epochs = "
            f"{100 * state['overhead']:.0f}% of the tuned run's {units.format_seconds(chosen['time_to_target_s'])} "
            f"to loss {args.target_loss:g} (all {len(r.trials)} trials: {units.format_seconds(r.tuning_s)})")
    return 0


def trial_from_scratch(args, run, g: int, mu: float, lr: float) -> float:
    from layerplan.runtime.launch import RunError

    try:
        return final_loss(run(run_spec(args, g, mu, lr, args.trial_steps)))
    except RunError:
        return math.inf


def report(say, row: dict, args) -> None:
    from layerplan import units

    ttt = row["time_to_target_s"]
    say(f"  {row['label']:<7} g={row['groups']:<3} µ={row['momentum']:<4} η={row['lr']:<8g} {row['steps']} iterations: "
        f"loss {row['first_loss']:.4f} → {row['loss']:.4f}, step {units.format_seconds(row['step_time_s'])}"
        + ("" if args.target_loss is None else
           f", to loss {args.target_loss:g}: " + (units.format_seconds(ttt) if ttt is not None else "not reached")))
    if row["diverged"]:
        low = "" if row["min_loss"] is None else f" (lowest {row['min_loss']:.4f} at iteration {row['min_loss_step']})"
        say(f"    ! its loss ended no lower than it began{low}: η = {row['lr']:g} with µ = {row['momentum']:g} at "
            f"g = {row['groups']} diverges over a long run, which short trials cannot see; a lower learning rate "
            "(or a run of at most the iterations before the low point) avoids it")
