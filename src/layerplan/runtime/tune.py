"""`layerplan tune`: Omnivore's Algorithm 1 (``plan/tune.py``) with real trials — short runs of the
groups runtime on the digits data — then a run with the chosen (g, µ, η) to a target loss.

    layerplan tune debug --workers 4 --target-loss 1.0 --budget 5min

Every trial starts from the model's initialisation (the groups runtime keeps no checkpoints, so
the paper's "continue from the current model W" becomes "the same start for every trial"); its
loss is the mean of its last three steps' losses (asynchronous losses are noisy).
"""

from __future__ import annotations

import argparse
import math
import time

from layerplan.errors import ConfigError

LAST_STEPS = 3


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


def cmd_tune(args: argparse.Namespace) -> int:
    from layerplan import units
    from layerplan.plan import omnivore
    from layerplan.plan.tune import time_to_target, tune
    from layerplan.runtime.launch import RunError, launch_local, preflight
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

    def trial(g: int, mu: float, lr: float) -> float:
        try:
            return final_loss(launch_local(run_spec(args, g, mu, lr, args.trial_steps), start="fork"))
        except RunError as e:  # a diverged run may fail; it loses the trial
            if not args.json:
                print(f"  trial g={g} µ={mu} η={lr:g} failed: {e}")
            return math.inf

    def show(t) -> None:
        if not args.json:
            print(f"  {t.phase:<10} g={t.groups:<3} µ={t.momentum:<4} η={t.lr:<8g} loss {t.loss:.4f}  ({t.seconds:.1f} s)",
                  flush=True)

    if not args.json:
        print(f"tune {args.model}: {args.workers} conv machines, FC-saturating start g = {start} (HE(g), Omnivore §IV-B)")
    r = tune(trial, args.workers, start, budget_s=budget, progress=show)
    t0 = time.perf_counter()
    m = launch_local(run_spec(args, r.groups, r.momentum, r.lr, args.steps), start="fork")
    wall = time.perf_counter() - t0
    out = {**r.to_dict(), "final": {"steps": args.steps, "loss": final_loss(m), "wall_s": wall,
                                     "step_time_s": m["step_time_s"],
                                     "staleness_mean": (m.get("staleness") or {}).get("mean")},
           "target_loss": args.target_loss,
           "time_to_target_s": None if args.target_loss is None else time_to_target(m["loss"], m["step_times_s"],
                                                                                  args.target_loss)}
    if args.json:
        from layerplan.cli import emit_json

        emit_json(out)
        return 0
    print(f"chosen: g = {r.groups}, momentum {r.momentum}, learning rate {r.lr:g} (cold start {r.cold_start_lr:g}); "
          f"{len(r.trials)} trials in {units.format_seconds(r.tuning_s)}" + (f" — {r.stopped}" if r.stopped else ""))
    line = (f"final run: {args.steps} iterations per group, loss {m['loss'][0]:.4f} → {out['final']['loss']:.4f}, "
            f"step {units.format_seconds(m['step_time_s'])}")
    if args.target_loss is not None:
        ttt = out["time_to_target_s"]
        line += (f"; time to loss {args.target_loss:g}: " + (units.format_seconds(ttt) if ttt is not None
                                                             else f"not reached in {args.steps} iterations"))
    print(line)
    return 0
