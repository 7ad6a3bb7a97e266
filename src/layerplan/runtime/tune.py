"""`layerplan tune`: Omnivore's Algorithm 1 (``plan/tune.py``) with real trials — short runs of the
groups runtime on the digits data — then runs with the chosen (g, µ, η), with synchronous g = 1 and
with fully asynchronous g = N (each with the momentum its own trials liked best) to a target loss.

    layerplan tune debug --workers 4 --target-loss 0.3 --budget 5min

All trials and runs go to one ``launch.Session``: the N + 2 ranks start and meet once, and each
trial only builds its model and roles (a fraction of a second) — the search costs its trials'
iterations, not process start-ups. Every trial starts from the model's initialisation (the
paper's "continue from the current model W" with W the initial model); its loss is the mean of
its last three steps' losses (asynchronous losses are noisy). ``--out FILE`` keeps the search's
state after every trial (what was tried, the losses), so an interrupted tune shows how far it got.
"""

from __future__ import annotations

import argparse
import math
import time

from layerplan.errors import ConfigError

LAST_STEPS = 3
TARGET_WINDOW = 5
"""A run has reached the target loss when the mean of its last 5 steps' losses has."""


def register(subparsers) -> None:
    from layerplan.cli import COMMANDS, add_model_args, positive_int

    p = subparsers.add_parser(
        "tune", help="choose Omnivore's groups, momentum and learning rate by short trials (Algorithm 1)",
        description="Cold start (synchronous, learning rates low → high), then from the FC-saturating number of "
                    "groups a grid of momenta {0, 0.3, 0.6, 0.9} × learning rates {last, last/10}, halving the "
                    "groups while the best momentum is 0; short runs of the groups runtime on the digits data. "
                    "Reports the chosen (g, µ, η), the tuning time and the time to --target-loss.")
    add_model_args(p)
    p.add_argument("--workers", type=positive_int, default=4, metavar="N", help="conv machines N (default 4)")
    p.add_argument("--on", default="local", metavar="local", help="where trials run (local only)")
    p.add_argument("--target-loss", type=float, metavar="L", help="report the training time to reach this loss")
    p.add_argument("--budget", metavar="TIME", help="tuning time budget, e.g. 90s, 5min (the best trial so far wins)")
    p.add_argument("--batch-size", type=positive_int, default=8, metavar="B", help="samples per machine (default 8)")
    p.add_argument("--trial-steps", type=positive_int, default=12, metavar="K", help="iterations per group per trial (default 12)")
    p.add_argument("--steps", type=positive_int, default=60, metavar="K", help="iterations per group of the final run (default 60)")
    p.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                   help="also run synchronous (g = 1) and fully asynchronous (g = N) to the target, each with its "
                        "best momentum (default on)")
    p.add_argument("--out", metavar="FILE", help="write the search (every trial) and the runs as JSON, after each trial")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    COMMANDS["tune"] = cmd_tune


def run_spec(args, groups: int, momentum: float, lr: float, steps: int):
    from layerplan.runtime.run_spec import RunSpec

    return RunSpec(model=args.model, strategy="groups", config={"machines": args.workers, "groups": groups},
                   input_size=args.input_size, num_classes=args.num_classes, batch_size=args.batch_size, steps=steps,
                   lr=lr, momentum=momentum, data="digits", seed=args.seed, progress=False, timeout_s=30.0)


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


def cmd_tune(args: argparse.Namespace) -> int:
    from layerplan import units
    from layerplan.plan import omnivore
    from layerplan.plan.tune import MOMENTA, tune
    from layerplan.runtime.checkpoint import atomic_write_json
    from layerplan.runtime.launch import RunError, Session, preflight
    from layerplan.runtime.model import resolve
    from layerplan.runtime.predict import local_cluster, run_net

    if args.on != "local":
        raise ConfigError(f"tune: trials run on local processes only (--on local), not {args.on!r}")
    budget = units.parse_seconds(args.budget, "--budget") if args.budget else None
    probe = run_spec(args, 1, 0.9, 0.01, args.trial_steps)
    preflight(probe)  # no FC phase, unfit data, too many ranks: one line before any trial
    net = run_net(probe, resolve(probe)[0])
    times = omnivore.group_times(net, local_cluster(args.workers + 2), args.batch_size)
    start = omnivore.saturating_groups(times, args.workers, args.batch_size)
    state: dict = {"model": args.model, "workers": args.workers, "start_groups": start, "target_loss": args.target_loss,
                   "trials": [], "runs": []}

    def save() -> None:
        if args.out:
            atomic_write_json(args.out, state)

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    say(f"tune {args.model}: {args.workers} conv machines, FC-saturating start g = {start} (HE(g), Omnivore §IV-B)")
    t_start = time.perf_counter()
    sessions = [Session(probe)]
    say(f"  ranks started and connected in {time.perf_counter() - t_start:.1f} s (once for every trial)")

    def run(spec) -> dict:
        return sessions[-1].run(spec)

    def trial(g: int, mu: float, lr: float) -> float:
        try:
            return final_loss(run(run_spec(args, g, mu, lr, args.trial_steps)))
        except RunError as e:  # a diverged run may fail: it loses the trial; the next gets fresh ranks
            say(f"  trial g={g} µ={mu} η={lr:g} failed: {e}")
            sessions.append(Session(probe))
            return math.inf

    try:
        def show(t) -> None:
            state["trials"].append({"phase": t.phase, "groups": t.groups, "momentum": t.momentum, "lr": t.lr,
                                    "loss": t.loss if math.isfinite(t.loss) else None, "seconds": t.seconds})
            save()
            say(f"  {t.phase:<10} g={t.groups:<3} µ={t.momentum:<4} η={t.lr:<8g} loss {t.loss:.4f}  ({t.seconds:.2f} s)")

        r = tune(trial, args.workers, start, budget_s=budget, progress=show)
        state.update(r.to_dict())
        state["start_groups"] = start
        save()
        say(f"chosen: g = {r.groups}, momentum {r.momentum}, learning rate {r.lr:g} (cold start {r.cold_start_lr:g}); "
            f"{len(r.trials)} trials in {units.format_seconds(r.tuning_s)}" + (f" — {r.stopped}" if r.stopped else ""))
        plan = [("chosen", r.groups, r.momentum, r.lr)]
        if args.compare:
            for label, g in (("sync", 1), ("async", args.workers)):
                if g == r.groups:
                    continue
                best = best_for(r.trials, g)
                if best is None:  # its momentum tuned for it: the grid at the cold-start learning rate
                    say(f"  tuning momentum for {label} (g = {g}) — not part of the search")
                    grid = [(mu, lr) for lr in (r.cold_start_lr, r.cold_start_lr / 10) for mu in MOMENTA]
                    _, mu, lr = min((trial(g, mu, lr), mu, lr) for mu, lr in grid)
                else:
                    mu, lr = best.momentum, best.lr
                plan.append((label, g, mu, lr))
        for label, g, mu, lr in plan:
            t0 = time.perf_counter()
            m = run(run_spec(args, g, mu, lr, args.steps))
            row = run_summary(m, args.target_loss, label, g, mu, lr, time.perf_counter() - t0)
            state["runs"].append(row)
            save()
            ttt = row["time_to_target_s"]
            say(f"  {label:<7} g={g:<3} µ={mu:<4} η={lr:<8g} {args.steps} iterations: loss {row['first_loss']:.4f} → "
                f"{row['loss']:.4f}, step {units.format_seconds(row['step_time_s'])}"
                + ("" if args.target_loss is None else
                   f", to loss {args.target_loss:g}: " + (units.format_seconds(ttt) if ttt is not None else "not reached")))
            if row["diverged"]:
                low = ("" if row["min_loss"] is None else
                       f" (lowest {row['min_loss']:.4f} at iteration {row['min_loss_step']})")
                say(f"    ! its loss ended no lower than it began{low}: η = {lr:g} with µ = {mu:g} at g = {g} "
                    "diverges over a long run, which short trials cannot see; a lower learning rate "
                    "(or a run of at most the iterations before the low point) avoids it")
    finally:
        sessions[-1].close()
    chosen = state["runs"][0]
    state["overhead"] = (r.tuning_s / chosen["time_to_target_s"]) if chosen.get("time_to_target_s") else None
    save()
    if args.json:
        from layerplan.cli import emit_json

        emit_json(state)
        return 0
    if state["overhead"] is not None:
        say(f"search overhead: {units.format_seconds(r.tuning_s)} of trials = {100 * state['overhead']:.0f}% of the "
            f"chosen run's {units.format_seconds(chosen['time_to_target_s'])} to loss {args.target_loss:g}")
    return 0
