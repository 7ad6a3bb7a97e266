"""`layerplan tune`'s choice against running every g (Omnivore §V-B), on the digits data.

    PYTHONPATH=src .venv/bin/python benchmarks/tune_vs_every_g.py [--model debug] [--workers 4]
        [--target-loss 0.3] [--steps 300] [--json]

1. ``layerplan tune`` as a user runs it: Algorithm 1's trials, then the chosen (g, µ, η) trained
   for ``--steps`` iterations per group; its search time and its time to the target loss.
2. Every g that divides N: momentum × learning rate tuned for that g by the same short trials
   (the grid of Algorithm 1 at the cold-start learning rate; tune's own trials where it ran that
   g), then trained for ``--steps`` iterations; its time to the target loss.

Prints, per g, the time to target, then tune's choice against the best g (the figure: within 10%)
and tune's search overhead as a share of its run to the target (the figure: ≤ 10%). Everything
runs in one ``launch.Session`` per part: trials cost their iterations, not process start-ups.
The machine is shared by all N + 2 ranks, so times are noisy: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="debug")
    ap.add_argument("--workers", type=int, default=4, help="conv machines N (default 4)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--target-loss", type=float, default=0.3)
    ap.add_argument("--trial-steps", type=int, default=12)
    ap.add_argument("--steps", type=int, default=300, help="iterations per group of every run to the target")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from layerplan.plan.tune import MOMENTA
    from layerplan.runtime.launch import Session
    from layerplan.runtime.tune import best_for, final_loss, run_spec, run_summary

    say = (lambda *a: None) if args.json else (lambda text: print(text, flush=True))
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "tune.json"
        say(f"1. layerplan tune {args.model} --workers {args.workers} --target-loss {args.target_loss:g}")
        cmd = [sys.executable, "-m", "layerplan", "tune", args.model, "--workers", str(args.workers),
               "--batch-size", str(args.batch_size), "--trial-steps", str(args.trial_steps), "--steps", str(args.steps),
               "--target-loss", str(args.target_loss), "--seed", str(args.seed), "--no-compare", "--out", str(out)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=sys.stderr if args.json else None)
        if r.returncode:
            return r.returncode
        tune_wall = time.perf_counter() - t0
        tuned = json.loads(out.read_text())

    class Trial(SimpleNamespace):
        pass

    trials = [Trial(**{**t, "loss": math.inf if t["loss"] is None else t["loss"]}) for t in tuned["trials"]]
    ns = SimpleNamespace(model=args.model, workers=args.workers, input_size=None, num_classes=None,
                         batch_size=args.batch_size, seed=args.seed)
    every = []
    say("2. every g, momentum and learning rate tuned for it, trained to the target")
    with Session(run_spec(ns, 1, 0.9, 0.01, args.trial_steps)) as session:
        for g in [d for d in range(1, args.workers + 1) if args.workers % d == 0]:
            best = best_for(trials, g)
            grid_s = 0.0
            if best is None:
                t1 = time.perf_counter()
                lr_c = tuned["cold_start_lr"]
                _, mu, lr = min((final_loss(session.run(run_spec(ns, g, mu, lr, args.trial_steps))), mu, lr)
                                for lr in (lr_c, lr_c / 10) for mu in MOMENTA)
                grid_s = time.perf_counter() - t1
            else:
                mu, lr = best.momentum, best.lr
            t1 = time.perf_counter()
            m = session.run(run_spec(ns, g, mu, lr, args.steps))
            row = run_summary(m, args.target_loss, f"g={g}", g, mu, lr, time.perf_counter() - t1)
            row["grid_s"] = grid_s
            every.append(row)
            ttt = row["time_to_target_s"]
            say(f"  g={g:<3} µ={mu:<4} η={lr:<8g} step {1000 * row['step_time_s']:.1f} ms, loss {row['first_loss']:.3f} → "
                f"{row['loss']:.3f}, to {args.target_loss:g}: " + (f"{ttt:.2f} s" if ttt is not None else "not reached"))
    chosen = tuned["runs"][0]
    reached = [r for r in every if r["time_to_target_s"] is not None]
    best = min(reached, key=lambda r: r["time_to_target_s"]) if reached else None
    ratio = (chosen["time_to_target_s"] / best["time_to_target_s"]
             if best and chosen["time_to_target_s"] is not None else None)
    doc = {"model": args.model, "workers": args.workers, "target_loss": args.target_loss, "steps": args.steps,
           "tune": {"groups": tuned["groups"], "momentum": tuned["momentum"], "lr": tuned["lr"],
                    "tuning_s": tuned["tuning_s"], "trials": len(tuned["trials"]), "wall_s": tune_wall,
                    "time_to_target_s": chosen["time_to_target_s"], "overhead": tuned["overhead"]},
           "every_g": every, "best_g": best["groups"] if best else None,
           "chosen_vs_best": ratio}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    t = doc["tune"]
    say(f"tune chose g = {t['groups']}, µ = {t['momentum']}, η = {t['lr']:g}: {t['trials']} trials in "
        f"{t['tuning_s']:.1f} s; its run reached loss {args.target_loss:g} in "
        + (f"{t['time_to_target_s']:.2f} s" if t["time_to_target_s"] is not None else "— (not reached)"))
    if best:
        say(f"best g by running every g: g = {best['groups']} ({best['time_to_target_s']:.2f} s)")
    if ratio is not None:
        say(f"tune's choice / best: {ratio:.2f}× (target ≤ 1.10×)")
    if t["overhead"] is not None:
        say(f"search overhead: {100 * t['overhead']:.0f}% of the chosen run's time to target (target ≤ 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
