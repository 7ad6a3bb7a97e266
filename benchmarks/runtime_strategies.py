"""Measure every strategy for real on local ranks (gloo, CPU) and print a table.

Same model, same number of ranks (4 by default: ps 3 workers + 1 server, allreduce 4 workers,
stanza 3 CONV + 1 FC worker, RALP-N 3 workers + 1 PS worker), same per-worker batch. Prints measured
step time, throughput, bytes sent per rank per step by role, compute/comm per role, and each
strategy's throughput relative to DDP all-reduce (the peer every user would run). Asserts nothing.

    python benchmarks/runtime_strategies.py [MODEL] [--steps 12] [--batch-size 16] [--ranks 4]

All ranks share this machine's cores (1 thread each), so the numbers show the runtime's own
overheads and traffic, not a cluster's speed; run it inside the emulated cluster for that.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="alexnet_cifar")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--start", choices=("exec", "fork"), default="fork")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from layerplan import units
    from layerplan.runtime.launch import launch_local
    from layerplan.runtime.run_spec import RunSpec

    n = args.ranks
    runs = [("allreduce", {"workers": n}), ("ps", {"workers": n - 1, "servers": 1}),
            ("stanza", {"conv_workers": n - 1, "fc_workers": 1}), ("ralp", {"workers": n - 1})]
    con = Console(highlight=False)
    results = []
    for strategy, config in runs:
        spec = RunSpec(model=args.model, strategy=strategy, config=config, batch_size=args.batch_size,
                       steps=args.steps, warmup_steps=2, progress=False, timeout_s=120.0)
        t = time.perf_counter()
        m = launch_local(spec, start=args.start)
        con.print(f"{strategy:9s} {config}: {time.perf_counter() - t:.1f} s wall")
        results.append(m)
    peer = results[0]["throughput_samples_per_s"]
    t = Table(title=f"{args.model}: {n} local ranks, batch {args.batch_size}/worker, median of {args.steps} steps")
    for col in ("strategy", "global batch", "step time", "samples/s", "vs allreduce", "bytes/step"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for m in results:
        t.add_row(m["strategy"], str(m["global_batch"]), units.format_seconds(m["step_time_s"]),
                  f"{m['throughput_samples_per_s']:.1f}", f"{m['throughput_samples_per_s'] / peer:.2f}x",
                  units.format_bytes(m["bytes_per_step"]["total"]))
    con.print(t)
    r = Table(title="per role: sent bytes per rank per step, compute and communication time per step")
    for col in ("strategy", "role", "ranks", "sent", "compute", "comm"):
        r.add_column(col, justify="left" if col in ("strategy", "role") else "right")
    for m in results:
        for role, sent in m["bytes_per_step"]["per_role"].items():
            b = m["breakdown"][role]
            ranks = sum(1 for k in m["roles"].values() if k == role)
            r.add_row(m["strategy"], role, str(ranks), units.format_bytes(sent), units.format_seconds(b["compute_s"]),
                      units.format_seconds(b["comm_s"]))
    con.print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
