"""Yan et al. (KDD'15 §6.4): partition or replicate the output layer? Measured and predicted.

Runs the ImageNet-22K net of Yan et al. (zoo ``yan_imagenet22k``), scaled down to fit this machine
(``--input-size``, ``--num-classes``), with the hybrid strategy twice: the output fc layer
partitioned by output features over the FC machines, then replicated on each (data parallel over
them, its weight gradients all-reduced). Partitioning moves activations, replicating moves weights
(``strategies.hybrid.layer_choices`` gives the bytes of each). Prints measured and predicted
throughput, bytes per step, and whether the measured order of the two matches the predicted one.
Asserts nothing.

    python benchmarks/yan_partition_vs_replicate.py [--on local | --on emulated:NAME] [--json]

``--on local`` (default): ranks on this machine, sharing its cores, over loopback (prediction:
``predict.local_cluster``). ``--on emulated:NAME``: one rank per host of an emulated cluster that
``layerplan cluster up --hosts N --bandwidth RATE --name NAME`` started (N ≥ conv + FC workers;
prediction: that cluster's own spec). A minute or so on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input-size", type=int, default=67, help="input side in pixels (default 67, the smallest)")
    ap.add_argument("--num-classes", type=int, default=4000, help="width of the output layer (default 4000; Yan: 22,000)")
    ap.add_argument("--conv-workers", type=int, default=2)
    ap.add_argument("--fc-workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8, help="samples per CONV worker (default 8)")
    ap.add_argument("--steps", type=int, default=8, help="steps per run, 2 of them warm-up (default 8)")
    ap.add_argument("--on", default="local", metavar="local|emulated:NAME")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.on != "local" and not (args.on.startswith("emulated:") and len(args.on) > 9):
        ap.error(f"--on: expected local or emulated:NAME, got {args.on!r}")

    from layerplan.runtime.launch import launch_emulated, launch_local
    from layerplan.runtime.model import resolve
    from layerplan.runtime.predict import predict_run, run_net, strategy_config
    from layerplan.runtime.run_spec import RunSpec
    from layerplan.strategies.hybrid import layer_choices

    cluster, name = None, None
    if args.on.startswith("emulated:"):
        from layerplan.runtime import emulate

        name = args.on.partition(":")[2]
        cluster = emulate.find(name).cluster_spec()
    rows = []
    for choice in ("partitioned", "replicated"):
        spec = RunSpec(model="yan_imagenet22k", strategy="hybrid", input_size=args.input_size,
                       num_classes=args.num_classes, batch_size=args.batch_size, steps=args.steps, warmup_steps=2,
                       config={"conv_workers": args.conv_workers, "fc_workers": args.fc_workers}, progress=False,
                       timeout_s=120.0)
        net, _ = resolve(spec)
        last = [x for x in net.layers if x.kind == "fc"][-1].name
        if choice == "replicated":
            spec = spec.replace(config={**spec.config, "replicate": [last]})
        t = time.perf_counter()
        m = launch_emulated(spec, name, quiet=True, start="fork") if name else launch_local(spec, start="fork")
        wall = time.perf_counter() - t
        p = predict_run(spec, cluster)
        why = {c.layer: c for c in layer_choices(run_net(spec, net), strategy_config(spec, net), spec.batch_size)}[last]
        rows.append({"choice": choice, "layer": last, "config": dict(spec.config), "ranks": m["world_size"],
                     "measured_samples_per_s": m["throughput_samples_per_s"],
                     "predicted_samples_per_s": p["throughput_samples_per_s"],
                     "error": (p["throughput_samples_per_s"] - m["throughput_samples_per_s"]) / m["throughput_samples_per_s"],
                     "measured_bytes_per_step": m["bytes_per_step"]["total"],
                     "predicted_bytes_per_step": p["bytes_per_step"]["total"],
                     "yan_activation_bytes": why.activation_bytes, "yan_weight_bytes": why.weight_bytes,
                     "reason": why.reason, "wall_s": wall})
        if not args.json:
            print(f"{choice}: {wall:.1f} s wall", file=sys.stderr)
    part, repl = rows
    pred_part = part["predicted_samples_per_s"] > repl["predicted_samples_per_s"]
    meas_part = part["measured_samples_per_s"] > repl["measured_samples_per_s"]
    verdict = {"predicted_faster": "partitioned" if pred_part else "replicated",
               "predicted_ratio": part["predicted_samples_per_s"] / repl["predicted_samples_per_s"],
               "measured_faster": "partitioned" if meas_part else "replicated",
               "measured_ratio": part["measured_samples_per_s"] / repl["measured_samples_per_s"],
               "order_matches": pred_part == meas_part}
    if args.json:
        print(json.dumps({"on": args.on, "input_size": args.input_size, "num_classes": args.num_classes,
                          "batch_size": args.batch_size, "steps": args.steps, "rows": rows, **verdict}, indent=1))
        return 0

    from rich.console import Console
    from rich.table import Table

    from layerplan import units

    con = Console(highlight=False, width=max(Console().width, 150))
    t = Table(title=f"yan_imagenet22k at {args.input_size}px, {args.num_classes} classes, {args.conv_workers} CONV + "
                    f"{args.fc_workers} FC ranks ({args.on}), batch {args.batch_size}/CONV worker: output layer {part['layer']}")
    for col in ("output layer", "measured samples/s", "predicted samples/s", "error", "bytes/step measured",
                "bytes/step predicted"):
        t.add_column(col, justify="left" if col == "output layer" else "right")
    for r in rows:
        t.add_row(r["choice"], f"{r['measured_samples_per_s']:.1f}", f"{r['predicted_samples_per_s']:.1f}",
                  f"{100 * r['error']:+.0f}%", units.format_bytes(r["measured_bytes_per_step"]),
                  units.format_bytes(r["predicted_bytes_per_step"]))
    con.print(t)
    con.print(f"Yan §6.4, {part['layer']}: {part['reason']}", markup=False)
    con.print(f"predicted: {verdict['predicted_faster']} faster (partitioned/replicated = {verdict['predicted_ratio']:.2f}×); "
              f"measured: {verdict['measured_faster']} faster ({verdict['measured_ratio']:.2f}×) — the measured order "
              f"{'matches' if verdict['order_matches'] else 'does NOT match'} the predicted one", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
