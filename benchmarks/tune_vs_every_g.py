"""`layerplan tune`'s choice against running every g (Omnivore §V-B), on the digits data.

    PYTHONPATH=src .venv/bin/python benchmarks/tune_vs_every_g.py [--model debug] [--workers 4]
        [--target-loss 0.3] [--steps 300] [--trial-steps K] [--rungs R] [--data digits-augmented] [--json]

1. ``layerplan tune`` as a user runs it: Algorithm 1's trials, each from the current model, the
   winner's iterations kept, then checkpointed epochs (a collapsed one rolled back and searched
   again) to the target or ``--steps``; its search overhead (losing trials, rolled-back epochs) and
   its time to the target loss.
2. Every g that divides N: ``layerplan tune --groups g`` — the same loop with g fixed (momentum and
   learning rate tuned for that g alone, collapsed epochs rolled back); its time to the target.

Prints, per g, the time to target, then tune's choice against the best g (the figure: within 10%)
and tune's search overhead as a share of its run to the target (the figure: ≤ 10%). Each tune runs
in one ``launch.Session``: trials cost their iterations, not process start-ups.
The machine is shared by all N + 2 ranks, so times are noisy: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="debug")
    ap.add_argument("--workers", type=int, default=4, help="conv machines N (default 4)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--target-loss", type=float, default=0.3)
    ap.add_argument("--trial-steps", type=int, default=12)
    ap.add_argument("--rungs", type=int, default=1, help="tune --rungs: successive halving of each grid (default 1)")
    ap.add_argument("--steps", type=int, default=300, help="iterations per group of every run to the target")
    ap.add_argument("--epoch-steps", type=int, default=100, help="tune's training epoch (iterations)")
    ap.add_argument("--data", default="digits", choices=("digits", "digits-augmented"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    say = (lambda *a: None) if args.json else (lambda text: print(text, flush=True))

    def tune_run(extra: list[str], out: Path) -> dict | None:
        cmd = [sys.executable, "-m", "layerplan", "tune", args.model, "--workers", str(args.workers),
               "--batch-size", str(args.batch_size), "--trial-steps", str(args.trial_steps), "--steps", str(args.steps),
               "--epoch-steps", str(args.epoch_steps), "--target-loss", str(args.target_loss), "--seed", str(args.seed),
               "--data", args.data, "--rungs", str(args.rungs),
               "--no-compare", "--out", str(out), *extra]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL if args.json or extra else None, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text()) if r.returncode == 0 else None

    every = []
    with tempfile.TemporaryDirectory() as tmp:
        say(f"1. layerplan tune {args.model} --workers {args.workers} --target-loss {args.target_loss:g}")
        t0 = time.perf_counter()
        tuned = tune_run([], Path(tmp) / "tune.json")
        if tuned is None:
            return 1
        tune_wall = time.perf_counter() - t0
        say("2. every g: layerplan tune --groups g (momentum and learning rate tuned for that g, same loop)")
        for g in [d for d in range(1, args.workers + 1) if args.workers % d == 0]:
            doc = tune_run(["--groups", str(g)], Path(tmp) / f"g{g}.json")
            if doc is None:
                say(f"  g={g:<3} failed")
                continue
            row = {**doc["runs"][0], "search_s": doc["search_s"]}
            every.append(row)
            ttt = row["time_to_target_s"]
            say(f"  g={g:<3} µ={row['momentum']:<4} η={row['lr']:<8g} step {1000 * row['step_time_s']:.1f} ms, "
                f"{row['steps']} iterations, loss {row['first_loss']:.3f} → {row['loss']:.3f}, to {args.target_loss:g}: "
                + (f"{ttt:.2f} s" if ttt is not None else "not reached"))
    chosen = tuned["runs"][0]
    reached = [r for r in every if r["time_to_target_s"] is not None]
    best = min(reached, key=lambda r: r["time_to_target_s"]) if reached else None
    ratio = (chosen["time_to_target_s"] / best["time_to_target_s"]
             if best and chosen["time_to_target_s"] is not None else None)
    doc = {"model": args.model, "workers": args.workers, "target_loss": args.target_loss, "steps": args.steps,
           "tune": {"groups": tuned["groups"], "momentum": tuned["momentum"], "lr": tuned["lr"],
                    "tuning_s": tuned["tuning_s"], "search_s": tuned["search_s"], "trials": len(tuned["trials"]),
                    "epochs": len(tuned["epochs"]), "rolled_back": sum(e["diverged"] for e in tuned["epochs"]),
                    "final": tuned["final"], "wall_s": tune_wall,
                    "time_to_target_s": chosen["time_to_target_s"], "overhead": tuned["overhead"]},
           "every_g": every, "best_g": best["groups"] if best else None,
           "chosen_vs_best": ratio}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    t = doc["tune"]
    say(f"tune chose g = {t['groups']}, µ = {t['momentum']}, η = {t['lr']:g} (ended with g, µ, η = {t['final']}): "
        f"{t['trials']} trials in {t['tuning_s']:.1f} s, {t['search_s']:.1f} s of them lost (and rolled-back epochs: "
        f"{t['rolled_back']} of {t['epochs']}); its run reached loss {args.target_loss:g} in "
        + (f"{t['time_to_target_s']:.2f} s" if t["time_to_target_s"] is not None else "— (not reached)"))
    if best:
        say(f"best g by running every g: g = {best['groups']} ({best['time_to_target_s']:.2f} s)")
    if ratio is not None:
        say(f"tune's choice / best: {ratio:.2f}× (target ≤ 1.10×)")
    if t["overhead"] is not None:
        say(f"search overhead: {100 * t['overhead']:.0f}% of the tuned run's time to target (target ≤ 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
