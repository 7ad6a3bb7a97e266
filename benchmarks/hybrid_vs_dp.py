"""hybrid (data-parallel conv phase, fc layers partitioned over n_f FC machines) against DDP all-reduce,
measured on local ranks (gloo, CPU) and predicted by the cost engine for the same ranks.

For each number of CONV workers n (default 2 and 4) it runs allreduce with n workers, then hybrid
with n CONV workers and n_f = 1 and 2 FC machines (n + n_f ranks), the same batch per worker, and
prints measured and predicted throughput (samples/s), the prediction's error, and each run's
throughput relative to DDP with the same n — measured and predicted. Asserts nothing.

    python benchmarks/hybrid_vs_dp.py [MODEL] [--conv-workers 2,4] [--fc-workers 1,2] [--steps 6] [--json]

All ranks share this machine's cores (one thread each) and talk over loopback, so hybrid's FC
machines compete with the CONV workers for the same cores: the figures show the runtime and the
engine's model of that sharing (``predict.local_cluster``), not a cluster's speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="alexnet_cifar")
    ap.add_argument("--conv-workers", type=int_list, default=[2, 4], metavar="2,4",
                    help="CONV workers of hybrid = DDP workers (default 2,4)")
    ap.add_argument("--fc-workers", type=int_list, default=[1, 2], metavar="1,2", help="hybrid FC machines (default 1,2)")
    ap.add_argument("--steps", type=int, default=6, help="steps per run, 2 of them warm-up (default 6)")
    ap.add_argument("--batch-size", type=int, default=16, help="samples per worker (default 16)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)

    from layerplan.runtime.launch import launch_local
    from layerplan.runtime.predict import predict_run
    from layerplan.runtime.run_spec import RunSpec

    rows = []
    for n in args.conv_workers:
        runs = [("allreduce", {"workers": n})] + [("hybrid", {"conv_workers": n, "fc_workers": f})
                                                  for f in args.fc_workers]
        peer = None
        for strategy, config in runs:
            spec = RunSpec(model=args.model, strategy=strategy, config=config, batch_size=args.batch_size,
                           steps=args.steps, warmup_steps=2, progress=False, timeout_s=120.0)
            t = time.perf_counter()
            m = launch_local(spec, start="fork")
            wall = time.perf_counter() - t
            p = predict_run(spec)
            row = {"conv_workers": n, "strategy": strategy, "config": dict(spec.config), "ranks": m["world_size"],
                   "global_batch": m["global_batch"], "measured_samples_per_s": m["throughput_samples_per_s"],
                   "predicted_samples_per_s": p["throughput_samples_per_s"],
                   "error": (p["throughput_samples_per_s"] - m["throughput_samples_per_s"]) / m["throughput_samples_per_s"],
                   "measured_step_s": m["step_time_s"], "predicted_step_s": p["step_time_s"],
                   "bytes_per_step": m["bytes_per_step"]["total"], "predicted_bytes_per_step": p["bytes_per_step"]["total"],
                   "wall_s": wall}
            if strategy == "allreduce":
                peer = row
            row["measured_vs_ddp"] = row["measured_samples_per_s"] / peer["measured_samples_per_s"]
            row["predicted_vs_ddp"] = row["predicted_samples_per_s"] / peer["predicted_samples_per_s"]
            rows.append(row)
            if not args.json:
                print(f"{strategy:9s} {config}: {wall:.1f} s wall", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": args.model, "batch_size": args.batch_size, "steps": args.steps, "rows": rows},
                         indent=1))
        return 0

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{args.model}: hybrid vs DDP all-reduce on local ranks (shared cores), batch {args.batch_size}/worker, "
                    f"median of {args.steps - 2} steps")
    for col in ("n_c", "strategy", "ranks", "global batch", "measured samples/s", "predicted samples/s", "error",
                "measured vs DDP", "predicted vs DDP"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        name = r["strategy"] if r["strategy"] == "allreduce" else f"hybrid n_f={r['config']['fc_workers']}"
        t.add_row(str(r["conv_workers"]), name, str(r["ranks"]), str(r["global_batch"]),
                  f"{r['measured_samples_per_s']:.1f}", f"{r['predicted_samples_per_s']:.1f}", f"{100 * r['error']:+.0f}%",
                  f"{r['measured_vs_ddp']:.2f}x", f"{r['predicted_vs_ddp']:.2f}x")
    Console(highlight=False, width=max(Console().width, 150)).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
