"""Omnivore's Theorem 1, measured: the implicit momentum of g asynchronous groups against 1 − 1/g.

    PYTHONPATH=src .venv/bin/python benchmarks/implicit_momentum.py [--groups 1,2,4,8] [--out plot.png] [--json]

For each g: many runs of asynchronous SGD without explicit momentum on a linear regression, from
the same start; the trajectories are averaged (the expectation) and µ, η' are fitted by least
squares to E[Δ_t] = µ E[Δ_{t−1}] − η' ∇f(E[w_t]) (``layerplan.stats.momentum``). Sources, each
labelled in the table, the JSON and the plot:

- real (exponential work): g threads race to a model server; each computes its gradient and works
  for an exponentially distributed time — the memoryless compute times under which Theorem 1's
  "next update from a uniformly random group" holds — and the server applies pushes as they arrive;
- queue model: Theorem 1's own assumption, each update from a uniformly random group;
- real (equal work): the same threads with equal work times: the groups mostly take turns
  (staleness g − 1 every time), outside the theorem's assumption.
"""

from __future__ import annotations

import argparse
import json
import sys

from layerplan.stats.momentum import LinearRegression, measure, theorem1_momentum

LABELS = {"threads": "real threads, exponential work", "queue": "queue model (Theorem 1)",
          "threads-constant": "real threads, equal work"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", default="1,2,4,8", help="g values (default 1,2,4,8)")
    ap.add_argument("--sources", default="threads,queue,threads-constant",
                    help="threads, queue, threads-constant (default: all three)")
    ap.add_argument("--runs", type=int, default=200, help="runs per g, averaged (default 200)")
    ap.add_argument("--steps", type=int, default=60, help="updates per run (default 60)")
    ap.add_argument("--lr", type=float, default=0.02, help="step size η (default 0.02; curvatures 1..10)")
    ap.add_argument("--work-ms", type=float, default=5.0, help="mean work time per gradient, real runs (default 5 ms)")
    ap.add_argument("--threads", type=int, default=32, help="group threads at once, runs side by side (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", metavar="PLOT.png", help="plot measured µ against 1 − 1/g")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    gs = [int(x) for x in args.groups.split(",")]
    sources = args.sources.split(",")
    bad = [s for s in sources if s not in LABELS]
    if bad or any(g < 1 for g in gs):
        print(f"implicit_momentum: error: sources must be among {', '.join(LABELS)} and g >= 1", file=sys.stderr)
        return 2
    problem = LinearRegression.make(seed=args.seed)
    rows = []
    for src in sources:
        for g in gs:
            r = measure(g, source=src, lr=args.lr, steps=args.steps, runs=args.runs, problem=problem,
                        work_s=args.work_ms / 1e3, threads=args.threads, seed=args.seed)
            r["label"] = LABELS[src]
            rows.append(r)
            if not args.json:
                print(f"{LABELS[src]:<32} g={g:<3} measured µ = {r['measured_momentum']:.3f}   1 − 1/g = "
                      f"{r['theorem1_momentum']:.3f}   error {r['error']:+.3f}   η' = {r['fitted_step']:.4f} "
                      f"(η/g = {r['theorem1_step']:.4f})   mean staleness {r['staleness_mean']:.2f}   "
                      f"R² {r['r2']:.4f}   {r['wall_s']:.1f} s", flush=True)
    if args.out:
        plot(rows, gs, args.out)
    if args.json:
        print(json.dumps({"problem": {"dim": problem.dim, "samples": int(problem.x.shape[0])}, "rows": rows}, indent=1))
    elif args.out:
        print(f"wrote {args.out}")
    return 0


def plot(rows: list[dict], gs: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    grid = np.geomspace(1, max(gs), 200)
    ax.plot(grid, [theorem1_momentum(g) for g in grid], "k-", lw=1, label="Theorem 1: 1 − 1/g")
    marks = {"threads": "o", "queue": "s", "threads-constant": "^"}
    for src in dict.fromkeys(r["source"] for r in rows):
        rs = [r for r in rows if r["source"] == src]
        ax.plot([r["groups"] for r in rs], [r["measured_momentum"] for r in rs], marks.get(src, "x"), ms=7,
                mfc="none", label=f"measured: {LABELS[src]}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gs, [str(g) for g in gs])
    ax.set_xlabel("asynchronous groups g")
    ax.set_ylabel("implicit momentum µ")
    ax.set_title("Implicit momentum of asynchronous updates")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
