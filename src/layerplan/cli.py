"""The `layerplan` command line: one parser, subcommands, and one place that turns bad input into
a single line and exit code 2 (``--debug`` shows the traceback instead)."""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from typing import Callable, Sequence

from layerplan import __version__
from layerplan.errors import ConfigError, LayerplanError

EXIT_BAD_INPUT = 2

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def rate_list(text: str) -> list[str]:
    """--rates: comma-separated link rates, each checked here (100Mbit,1Gbit)."""
    from layerplan import units

    rates = [x.strip() for x in text.split(",") if x.strip()]
    if not rates:
        raise argparse.ArgumentTypeError(f"expected rates like 100Mbit,1Gbit, got {text!r}")
    for r in rates:
        try:
            units.parse_bandwidth(r)
        except LayerplanError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return rates


def int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4,8, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return list(dict.fromkeys(vals))  # each once, in the order given: `--workers 1,1,2` means 1,2


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("model", metavar="MODEL", **({} if required else {"nargs": "?", "default": None}),
                   help="a zoo name (see `layerplan zoo`), file.py:factory, package.module:factory, or a saved NetSpec .json")
    p.add_argument("--input-size", type=positive_int, metavar="S", help="input height = width in pixels (overrides the model's default)")
    p.add_argument("--num-classes", type=positive_int, metavar="C", help="number of output classes (overrides the model's default)")


def add_cluster_args(p: argparse.ArgumentParser, nodes_default: int | None = None) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", metavar="PRESET|FILE", default=None,
                   help="a node preset (see `layerplan hardware`) or a cluster file (.yaml/.json); default titan-x")
    g.add_argument("--nodes", type=positive_int, default=nodes_default, metavar="N", help="number of nodes (machines)")
    g.add_argument("--device", metavar="D", help="replace the preset's device (e.g. v100, k80; this-cpu: a core of this machine, from /proc/cpuinfo)")
    g.add_argument("--bandwidth", metavar="RATE", help="replace the NIC rate, e.g. 10Gbit, 100Mbit, or a link preset")
    g.add_argument("--shared-cores", type=positive_int, metavar="C",
                   help="all nodes share C CPU cores (as on the emulated cluster); a preset's C ≥ 2 give 0.9·C cores' "
                        "worth with all busy, 0.86·C oversubscribed (measure yours: layerplan calibrate)")


def load_net(args: argparse.Namespace):
    """The NetSpec (and module factory) that MODEL, --input-size, --num-classes name."""
    from layerplan.netspec.load import resolve_model

    return resolve_model(args.model, input_size=args.input_size, num_classes=args.num_classes)


def load_cluster(args: argparse.Namespace):
    """The ClusterSpec that --cluster/--nodes/--device/--bandwidth/--shared-cores name."""
    from layerplan.hardware import resolve_cluster

    return resolve_cluster(args.cluster, nodes=args.nodes, device_name=args.device, bandwidth=args.bandwidth,
                           shared_cores=args.shared_cores)


def emit_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


# ---- commands --------------------------------------------------------------------------------
def cmd_profile(args: argparse.Namespace) -> int:
    from layerplan import report
    from layerplan.plan import ralp

    net, _ = load_net(args)
    prof = ralp.profile(net, batch=args.batch_size, threshold=args.ralp_threshold)
    if args.save:
        net.save(args.save)
    if args.plot:
        from layerplan import plots

        plots.profile_plot(net, args.plot)
    if args.json:
        emit_json(report.profile_dict(net, prof))
    else:
        report.print_profile(net, prof, show_all=not args.weighted_only)
        if args.save:
            report.console().print(f"saved NetSpec to {args.save}")
        if args.plot:
            report.console().print(f"saved plot to {args.plot}")
    return 0


def cmd_zoo(args: argparse.Namespace) -> int:
    from layerplan import report
    from layerplan.netspec import zoo

    if args.json:
        emit_json([{"name": e.name, "input_size": e.default_input_size, "num_classes": e.default_num_classes,
                    "source": e.source} for e in zoo.ZOO.values()])
    else:
        report.print_zoo(zoo.ZOO)
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from layerplan import hardware, report

    if args.cluster or args.nodes or args.device or args.bandwidth or args.shared_cores:
        c = load_cluster(args)
        if args.json:
            emit_json(c.to_dict())
        else:
            report.print_cluster(c)
        if args.save:
            hardware.save_cluster(c, args.save)
        return 0
    if args.json:
        from dataclasses import asdict

        this = hardware.this_cpu()
        emit_json({"devices": {**{k: asdict(v) for k, v in hardware.DEVICES.items()},
                               **({"this-cpu": asdict(this)} if this else {})},
                   "links": {k: asdict(v) for k, v in hardware.LINKS.items()},
                   "nodes": {k: {"device": d, "devices_per_node": n, "nic": nic, "note": note}
                             for k, (d, n, nic, note) in hardware.NODES.items()}})
    else:
        report.print_hardware()
    return 0


STRATEGY_OPTIONS = ("workers", "servers", "conv_workers", "fc_workers", "split", "algorithm", "setting", "groups",
                    "machines")


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("strategy options (unset = the strategy's own choice for the cluster)")
    g.add_argument("--workers", type=positive_int, metavar="N", help="ps/allreduce/ralp: worker nodes")
    g.add_argument("--servers", type=positive_int, metavar="N", help="ps: parameter-server shards (nodes)")
    g.add_argument("--conv-workers", type=positive_int, metavar="N", help="stanza: CONV workers (n_c)")
    g.add_argument("--fc-workers", type=positive_int, metavar="N", help="stanza: FC workers (n_f)")
    g.add_argument("--split", metavar="LAYER", help="ralp: last layer of the workers' head (default: the RALP profiler's)")
    g.add_argument("--setting", choices=("N", "H"), help="ralp: RALP-N (N-1 workers) or RALP-H (N/2 workers)")
    g.add_argument("--algorithm", choices=("ring", "tree", "butterfly", "recursive_doubling", "one_to_all"),
                   help="allreduce: the all-reduce algorithm (default ring)")
    g.add_argument("--machines", type=positive_int, metavar="N", help="groups: conv machines (default nodes − 2)")
    g.add_argument("--groups", type=positive_int, metavar="G",
                   help="groups: compute groups (default: the smallest g that saturates the FC server, Omnivore)")


def strategy_options(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in STRATEGY_OPTIONS if getattr(args, k, None) is not None}


def cmd_predict(args: argparse.Namespace) -> int:
    from layerplan import report, strategies

    net, _ = load_net(args)
    cluster = load_cluster(args)
    s = strategies.get(args.strategy)
    config = s.default(net, cluster, args.batch_size, **strategy_options(args))
    pred = strategies.predict(net, cluster, args.strategy, config, args.batch_size)
    if args.timeline:
        from layerplan import plots

        plots.timeline_plot(pred, args.timeline, title=f"{net.name}, {args.strategy} {report.config_text(config)}, "
                                                        f"{cluster.describe()}, batch {args.batch_size}/worker")
    doc = report.prediction_dict(net, cluster, args.strategy, s.config_to_dict(config), args.batch_size, pred)
    if args.json:
        emit_json(doc)
    else:
        report.print_prediction(doc, pred)
        if args.timeline:
            report.console().print(f"saved timeline to {args.timeline}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from layerplan import report
    from layerplan.plan import planner

    net, _ = load_net(args)
    cluster = load_cluster(args)
    names = args.strategies.split(",") if args.strategies else None
    if names:
        from layerplan import strategies

        for n in names:
            strategies.get(n)
    ranked = planner.rank(net, cluster, args.batch_size, names)
    if not ranked:

        raise ConfigError(f"no strategy can run {net.name} on {cluster.describe()}")
    skipped = planner.why_not(net, cluster, names)
    if args.output:
        planner.make_plan(args.model, args.input_size, args.num_classes, args.batch_size, cluster, ranked[0]).save(args.output)
    if args.json:
        emit_json(report.plan_dict(net, cluster, args.batch_size, ranked, skipped, top=args.top))
    else:
        report.print_plan(net, cluster, args.batch_size, ranked, skipped, top=args.top)
        if args.output:
            report.console().print(f"saved the best plan to {args.output} (run it: layerplan train --plan {args.output})")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    from layerplan import report
    from layerplan.plan import scaling

    net, _ = load_net(args)
    cluster = load_cluster(args)
    names = args.strategy.split(",")
    curves = scaling.curves(net, cluster, names, args.workers, args.batch_size, strong=args.strong,
                            options=strategy_options(args))
    if args.plot:
        from layerplan import plots

        plots.scaling_plot(curves, args.plot, title=f"{net.name} on {cluster.device.name}, "
                           f"{report.units.format_bandwidth(cluster.nic.bandwidth_bytes_per_s)}, "
                           + (f"strong scaling, global batch {args.batch_size}" if args.strong else f"weak scaling, batch {args.batch_size}/worker"))
    if args.json:
        emit_json(scaling.to_dict(curves))
    else:
        report.print_scaling(curves, strong=args.strong)
        if args.plot:
            report.console().print(f"saved plot to {args.plot}")
    return 0


def _register_engine(sub) -> None:
    from layerplan.strategies import STRATEGIES

    names = ", ".join(STRATEGIES)
    p = sub.add_parser("predict", help="predicted step time, throughput, traffic and bottleneck of one strategy",
                       description=f"Predict one strategy ({names}) for a network on a cluster with the cost engine.")
    add_model_args(p)
    p.add_argument("--strategy", required=True, metavar="S", help=f"one of: {names}")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="B", help="samples per worker per step (default 32)")
    add_cluster_args(p)
    add_strategy_args(p)
    p.add_argument("--timeline", metavar="PNG", help="draw the predicted step as a timeline per role")
    p.add_argument("--json", action="store_true")
    COMMANDS["predict"] = cmd_predict

    p = sub.add_parser("plan", help="rank every strategy and config; write the best as a plan file",
                       description="Rank every applicable strategy × config (the papers' optimizers pick the "
                                   "candidates, the cost engine predicts them) by throughput.")
    add_model_args(p)
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="B", help="samples per worker per step (default 32)")
    add_cluster_args(p)
    p.add_argument("--strategies", "--strategy", metavar="S1,S2", help=f"only these strategies (default all: {names})")
    p.add_argument("--top", type=positive_int, default=10, metavar="K", help="rows to show (default 10)")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the best plan (what `train --plan` runs)")
    p.add_argument("--json", action="store_true")
    COMMANDS["plan"] = cmd_plan

    p = sub.add_parser("scale", help="PALEO-style scaling curves: throughput and speedup vs workers",
                       description="Throughput and speedup against the number of workers for one or more strategies "
                                   "(weak scaling: fixed batch per worker; strong: fixed global batch).")
    add_model_args(p)
    p.add_argument("--strategy", required=True, metavar="S1,S2", help=f"one or more of: {names}")
    p.add_argument("--workers", type=int_list, default=[1, 2, 4, 8, 16], metavar="1,2,4,...",
                   help="worker counts (default 1,2,4,8,16)")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="B",
                   help="weak: samples per worker; strong: the global batch (default 32)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--weak", action="store_true", help="fixed batch per worker (default)")
    mode.add_argument("--strong", action="store_true", help="fixed global batch split over the workers")
    add_cluster_args(p)
    g = p.add_argument_group("strategy options")
    g.add_argument("--servers", type=positive_int, metavar="N", help="ps: servers (default 1)")
    g.add_argument("--fc-workers", type=positive_int, metavar="N", help="stanza: FC workers (default 1)")
    g.add_argument("--algorithm", choices=("ring", "tree", "butterfly", "recursive_doubling", "one_to_all"))
    p.add_argument("--plot", metavar="PNG", help="plot throughput and speedup against workers")
    p.add_argument("--json", action="store_true")
    COMMANDS["scale"] = cmd_scale


def cmd_cluster(args: argparse.Namespace) -> int:
    from layerplan import report
    from layerplan.runtime import emulate

    if args.action == "up":
        emu = emulate.up(args.hosts, args.bandwidth, args.name)
        doc = emu.to_dict()
        if args.measure:
            doc["measured_payload_bytes_per_s"] = emulate.measure_rate(emu)
        if args.json:
            emit_json(doc)
        else:
            report.console().print(
                f"emulated cluster [bold]{emu.name}[/] is up: {emu.hosts} hosts {emu.address(0)}..{emu.address(emu.hosts - 1)}, "
                f"{report.units.format_bandwidth(emu.rate_bytes_per_s)} each way per host (tbf on both ends)")
            if args.measure:
                r = doc["measured_payload_bytes_per_s"]
                report.console().print(f"measured payload rate host 0 → 1: {report.units.format_bandwidth(r)} "
                                       f"({100 * r / emu.rate_bytes_per_s:.1f}% of the configured rate)")
    elif args.action == "down":
        n = emulate.down(args.name)
        if args.json:
            emit_json({"name": args.name, "namespaces_removed": n})
        else:
            report.console().print(f"emulated cluster {args.name}: {n} namespace(s) removed" if n else
                                   f"emulated cluster {args.name}: nothing to remove")
    else:
        st = emulate.status()
        if args.json:
            emit_json(st)
        elif not st:
            report.console().print("no emulated cluster is up")
        else:
            for d in st:
                report.console().print(f"{d['name']}: {d['hosts']} hosts at {report.units.format_bandwidth(d['rate_bytes_per_s'])}, "
                                       f"subnet 10.77.{d['subnet']}.0/24, {'up' if d['up'] else 'gone'}, {d['processes']} process(es)")
    return 0


def _register_cluster(sub) -> None:
    p = sub.add_parser("cluster", help="an emulated cluster on this machine: network namespaces with shaped links",
                       description="Hosts in network namespaces on a bridge, each link shaped with tbf on both ends "
                                   "(needs root or an unprivileged user namespace). `train --on emulated[:NAME]` runs "
                                   "one rank per host.")
    p.add_argument("action", choices=("up", "status", "down"))
    p.add_argument("--hosts", type=positive_int, default=4, metavar="N", help="hosts (default 4)")
    p.add_argument("--bandwidth", default="1Gbit", metavar="RATE", help="line rate of every host's link (default 1Gbit)")
    p.add_argument("--name", default="default", metavar="NAME", help="cluster name (default 'default')")
    p.add_argument("--measure", action="store_true", help="after `up`, measure the payload rate between two hosts")
    p.add_argument("--json", action="store_true")
    COMMANDS["cluster"] = cmd_cluster


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _batches(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise ConfigError(f"--profile-batches takes positive integers separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise ConfigError(f"--profile-batches takes positive integers separated by commas, got {text!r}")
    return out


def _compare_calibrations(args: argparse.Namespace) -> int:
    """``calibrate --compare A B``: two calibrations' figures side by side; measures nothing."""
    from rich.table import Table

    from layerplan import calibrate, report

    given = [flag for flag, on in (("-o", args.output), ("--quick", args.quick), ("--profile", args.profile),
                                   ("--profile-batches", args.profile_batches != "16,64"),
                                   ("--repeats", args.repeats != 3), ("--on", args.on != "local")) if on]
    if given:
        raise ConfigError(f"--compare measures nothing: drop {', '.join(given)}")
    a_path, b_path = args.compare
    res = calibrate.compare(calibrate.load_result(a_path), calibrate.load_result(b_path))
    if args.json:
        emit_json({"a": a_path, "b": b_path, **res})
        return 0
    con = report.console()
    t = Table(title=f"calibrations compared: A = {a_path} ({res['a_when']}), B = {b_path} ({res['b_when']})")
    for col in ("figure", "A", "B", "apart", "stated spread (A / B)", "agree", "ranges meet"):
        t.add_column(col, justify="left" if col == "figure" else "right",
                     overflow="fold" if col == "figure" else "ellipsis")  # a figure's path whole, folded
    for r in res["rows"]:
        t.add_row(r["figure"], calibrate.format_figure(r["figure"], r["a"]), calibrate.format_figure(r["figure"], r["b"]),
                  f"{r['apart']:.1%}", f"{r['a_spread']:.1%} / {r['b_spread']:.1%}",
                  "[green]yes[/]" if r["agree"] else "[red]no[/]", "yes" if r["overlap"] else "no")
    con.print(t)
    for sec, s in res["sections"].items():
        con.print(f"{sec}: {s['agree']} of {s['figures']} figures agree within the stated spread, "
                  f"{s['overlap']} of {s['figures']} ranges meet")
    con.print(f"[bold]{res['agree']} of {res['figures']} figures agree within their stated spread[/] "
              f"(medians apart by no more than the larger of the two runs' (max − min) / median); "
              f"{res['overlap']} of {res['figures']} ranges meet")
    for side, only in (("A", res["only_in_a"]), ("B", res["only_in_b"])):
        if only:
            con.print(f"only in {side} ({len(only)}): {', '.join(only)}")
    for note in res["notes"]:
        con.print(f"[yellow]note:[/] {note}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from layerplan import calibrate, report

    if args.compare:
        return _compare_calibrations(args)
    if args.output:  # before minutes of measuring
        from layerplan.outputs import writable_file

        writable_file(args.output, "cluster file")
    res = calibrate.calibrate(on=args.on.partition(":")[0], name=args.on.partition(":")[2] or "default",
                              repeats=args.repeats, quick=args.quick, progress=not args.json or sys.stderr.isatty(),
                              profile=_names(args.profile), profile_batches=_batches(args.profile_batches))
    if args.output:
        calibrate.save(res, args.output)
    if args.json:
        emit_json(res)
    else:
        for line in calibrate.summary_lines(res):
            report.console().print(line)
        if args.output:
            report.console().print(f"wrote {args.output} (use it: layerplan predict ... --cluster {args.output}, "
                                   f"layerplan train ... --cluster {args.output})")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from layerplan import report, units, validate
    from layerplan.hardware import cluster_from_dict, resolve_cluster

    started = time.monotonic()  # the budget counts from here, calibration included (Matrix.budget_s)
    matrix = validate.MATRICES["full" if args.full else "quick"]
    if args.budget is not None:
        if not math.isfinite(args.budget) or args.budget < 0:
            raise ConfigError(f"--budget takes minutes, at least 0 (0: no budget), got {args.budget:g}")
        budget_s = args.budget * 60.0 or None  # the budget is the limit; the calibration's share scales with it
        matrix = validate.replace(matrix, budget_s=budget_s, limit_s=None, calibrate_s=(
            matrix.calibrate_s * budget_s / matrix.budget_s if budget_s and matrix.calibrate_s and matrix.budget_s else None))
    if args.models:
        matrix = validate.replace(matrix, models=tuple(args.models.split(",")))
    if args.strategies:
        names = tuple(x.strip() for x in args.strategies.split(",") if x.strip())
        known = (*validate.RUNTIME_STRATEGIES, "groups")
        unknown = [x for x in names if x not in known]
        if unknown or not names:
            raise ConfigError(f"--strategies: unknown strategy {', '.join(unknown) or '(none given)'}; "
                              f"choose from {', '.join(known)}")
        matrix = validate.replace(matrix, strategies=names)
    if args.workers:
        matrix = validate.replace(matrix, workers=tuple(args.workers))
    if args.rates:
        matrix = validate.replace(matrix, rates=tuple(args.rates))
    out = Path(args.out)
    done: list[dict] = []
    calibrated = measured = None
    speed_reference = load_reference = memory_reference = net_reference = fc_reference = None  # None: probed when validate starts
    if args.repredict:
        return _validate_repredict(args, out)
    if not args.dry_run:  # before minutes of calibration: root, or this command again in a user namespace
        from layerplan.runtime import emulate

        emulate.in_user_namespace([sys.executable, "-m", "layerplan", *args.argv])
        from layerplan.outputs import writable_dir

        writable_dir(out, "--out")  # before minutes of calibration and runs
    if args.resume:
        previous = out / "validate.json"
        if not previous.exists():
            raise ConfigError(f"--resume: {previous} does not exist (nothing to resume; drop --resume)")
        try:
            doc = validate.load_json(previous)
            done = list(doc["rows"])
            speed_reference = doc.get("speed_reference_flops_per_s")
            load_reference = doc.get("load_reference_flops_per_s")
            memory_reference = doc.get("memory_reference_s")
            net_reference = doc.get("net_reference_s")
            fc_reference = doc.get("fc_reference_s")
            if doc.get("calibrated_cluster") and not args.calibration and not args.presets_only:
                calibrated = cluster_from_dict(doc["calibrated_cluster"], str(previous))
        except (ValueError, KeyError, TypeError) as e:  # a bad cluster inside: its own one-line error
            raise ConfigError(f"--resume: {previous} is not a validate result ({e})") from None
    if args.calibration:
        calibrated = resolve_cluster(args.calibration)
        # another calibration: the machine when validate starts
        speed_reference = load_reference = memory_reference = net_reference = fc_reference = None
    elif args.dry_run and calibrated is None and not args.presets_only:
        pass  # the estimate uses the presets: calibrating takes minutes
    elif calibrated is None and not args.presets_only:
        from layerplan import calibrate

        con = report.console()
        if not args.json:
            con.print("calibrating this machine's compute and profiling the matrix's layers "
                      "(quick; --calibration FILE reuses a calibration)")
        # the speed the calibration saw: probed on both sides of it, one thread and both cores loaded
        before, before_load, before_memory = calibrate.speed_probe(), calibrate.speed_probe(threads=2), calibrate.memory_probe()
        before_net = {m: calibrate.net_probe(m, batch=matrix.batch_size) for m in matrix.models}
        before_fc = calibrate.fc_probe()
        measured = calibrate.calibrate(on="local", quick=True, progress=not args.json, profile=matrix.models,
                                       profile_batches=validate.profile_batches(matrix),
                                       profile_net_batches=(matrix.batch_size,), sync_nets=validate.sync_nets(matrix),
                                       again_within_s=matrix.calibrate_s if matrix.budget_s else None)
        if not args.json:
            con.print(f"calibrated in {measured['duration_s'] / 60:.1f} min (" + ", ".join(
                f"{k.replace('_', ' ')} {v:.0f} s" for k, v in measured.get("durations_s", {}).items()) + ")")
        out.mkdir(parents=True, exist_ok=True)
        calibrated = calibrate.save(measured, out / "calibration.yaml")  # --calibration FILE reuses it
        (out / "calibration.json").write_text(json.dumps(measured, indent=1) + "\n")  # every figure, for a post-mortem
        if not args.json:
            for line in calibrate.steadiness_lines(measured):
                con.print(line, style="yellow", markup=False, highlight=False)
            if calibrate.still_disturbed(measured):
                con.print("[bold yellow]rerun on an idle machine, or reuse a steady calibration with "
                          "--calibration FILE[/]")
        speed_reference = (before + calibrate.speed_probe()) / 2.0
        load_reference = validate.load_reference_of(measured, (before_load, calibrate.speed_probe(threads=2)))
        memory_reference = (before_memory + calibrate.memory_probe()) / 2.0
        net_reference = {m: (s + calibrate.net_probe(m, batch=matrix.batch_size)) / 2.0 for m, s in before_net.items()}
        fc_reference = (before_fc + calibrate.fc_probe()) / 2.0
        from layerplan.runtime import emulate

        emulate.check_available()
        c = validate.emulated_comm_cpu_s_per_byte()
        calibrated = validate.with_emulated_comm_cpu(calibrated, c)
        if not args.json:
            con.print(f"the emulated path, unshaped, moves {units.format_bandwidth(1 / c)} on this CPU: its "
                      "per-byte CPU cost estimates which configurations to skip; each rate's link is measured "
                      "before its rows")
    con = report.console()
    if args.dry_run:
        return _validate_dry_run(validate.estimate(matrix, calibrated, [c for c in validate.cases(matrix)
                                                                        if validate.key(c) in {validate.key(r) for r in done}]),
                                 args.json, matrix)
    doc = validate.validate(matrix, out, calibrated, done=done, speed_reference=speed_reference,
                            load_reference=load_reference, memory_reference=memory_reference,
                            net_reference=net_reference, fc_reference=fc_reference,
                            deadline=started + matrix.budget_s if matrix.budget_s else None,
                            progress=None if args.json else (lambda what: con.print(f"[dim]running {what}[/]")))
    if args.json:
        emit_json({**doc["summary"], "rows": doc["rows"], "skipped": doc["skipped"]})
    else:
        validate.print_rows(doc["rows"])
        validate.print_summary(doc)
        con.print(f"wrote {out / 'validate.json'}, {out / 'predicted-vs-measured.png'}, {out / 'throughput-by-strategy.png'}"
                  + (f" and the calibration it used, {out / 'calibration.yaml'}" if measured is not None else ""))
    return 0


def _validate_repredict(args: argparse.Namespace, out) -> int:
    from layerplan import report, validate
    from layerplan.hardware import cluster_from_dict, resolve_cluster

    previous = out / "validate.json"
    try:
        doc = validate.load_json(previous)
        rows = doc["rows"]
    except OSError as e:
        raise ConfigError(f"--repredict: cannot read {previous}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--repredict: {previous} is not a validate result ({e})") from None
    if not rows:
        raise ConfigError(f"--repredict: {previous} has no measured rows")
    if args.presets_only:
        calibrated = None
    elif args.calibration:
        calibrated = resolve_cluster(args.calibration)
    elif doc.get("calibrated_cluster"):
        calibrated = cluster_from_dict(doc["calibrated_cluster"], str(previous))
    else:
        calibrated = None
    if not args.calibration and (out / "calibration.json").exists():  # its probes against the profile's, as a run now
        try:
            doc = validate.rereferenced(doc, json.loads((out / "calibration.json").read_text()))
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(f"--repredict: {out / 'calibration.json'} is not a calibration ({e})") from None
    # the rows' probes read the machine against the run's own calibration: its pace, not another's
    new = validate.repredict(doc, calibrated, paced=not args.calibration)
    from pathlib import Path

    target = Path(args.repredict_out) if args.repredict_out else out / "repredicted"
    target.mkdir(parents=True, exist_ok=True)
    validate.write_doc(target, new)
    if args.json:
        emit_json({**new["summary"], "rows": new["rows"], "skipped": new["skipped"]})
        return 0
    validate.print_rows(new["rows"])
    validate.print_summary(new)
    report.console().print(f"wrote {target / 'validate.json'} and its plots (the measurements of {previous}, "
                           "predicted again)")
    return 0


def _validate_dry_run(rows: list[dict], as_json: bool, matrix) -> int:
    from rich.table import Table

    from layerplan import report, units

    total_s = sum(r["estimated_s"] for r in rows)
    if as_json:
        emit_json({"configurations": rows, "estimated_s": total_s, "decide_s_per_rate": matrix.decide_s,
                   "runs": sum(1 for r in rows if not r["skip"])})
        return 0
    t = Table(title="validate --dry-run: what would run (predicted with the presets unless --calibration/--resume)")
    for col in ("net", "workers", "rate", "strategy", "predicted step", "steps", "estimated", "note"):
        t.add_column(col, justify="left" if col in ("net", "rate", "strategy", "note") else "right")
    for r in rows:
        t.add_row(r["model"], str(r["workers"]), r["rate"], r["label"],
                  units.format_seconds(r["predicted_step_s"]) if r["predicted_step_s"] else "–",
                  str(r["steps"] or "–"), units.format_seconds(r["estimated_s"]) if r["estimated_s"] else "–",
                  r["skip"] or "")
    con = report.console()
    con.print(t)
    con.print(f"{sum(1 for r in rows if not r['skip'])} configurations to run, about {total_s / 60:.0f} min "
              f"(+ about a minute per rate to build the cluster, up to {matrix.decide_s:.0f} s per rate — what one "
              "leaves goes to the next — to run close scenarios' contenders again and, unless --calibration, a few minutes to calibrate)")
    return 0


def _register_closed_loop(sub) -> None:
    from layerplan.runtime.commands import where

    p = sub.add_parser("calibrate", help="measure this machine (or an emulated cluster): FLOP/s, link rate, latency",
                       description="Short micro-benchmarks: achieved FLOP/s of convolutions and matrix products (per "
                                   "thread and with the cores shared), point-to-point and all-reduce efficiency of the "
                                   "links, message latency; writes a cluster file with the fitted efficiencies.")
    p.add_argument("--on", type=where, default="local", metavar="local|emulated[:NAME]",
                   help="local: ranks on this machine over loopback (default); emulated[:NAME]: between two hosts of "
                        "an emulated cluster (`layerplan cluster up`)")
    p.add_argument("-o", "--output", metavar="cluster.yaml", help="write the fitted cluster file (YAML or JSON by extension)")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="R", help="repeats per figure, for the spread (default 3)")
    p.add_argument("--quick", action="store_true", help="fewer sizes (about a minute)")
    p.add_argument("--profile", metavar="NET1,NET2", default="",
                   help="also time every layer of these zoo nets on its own; predictions for them then use the "
                        "measured layer times (e.g. alexnet_cifar,vgg16_cifar,resnet_cifar: about a minute each)")
    p.add_argument("--profile-batches", metavar="B1,B2", default="16,64",
                   help="batch sizes the layers are timed at; other batches are interpolated (default 16,64)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="measure nothing: set two calibrations side by side, figure by figure, and say which agree "
                        "within their stated spread (A, B: `layerplan calibrate --json > A.json`'s output, or a "
                        "`layerplan validate --out DIR` folder)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (the progress bar stays on a terminal's stderr)")
    COMMANDS["calibrate"] = cmd_calibrate

    p = sub.add_parser("validate", help="run strategies on the emulated cluster and compare measured with predicted",
                       description="A matrix of strategies × networks × workers × link rates on the emulated cluster "
                                   "(needs root or an unprivileged user namespace): measured median step against the "
                                   "prediction, the lower bound and the efficiency; summary error statistics, Spearman "
                                   "ρ, whether the predicted best is the measured best; JSON and two plots.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="alexnet_cifar and resnet_cifar, 2 workers, 100 Mbit/s and 1 Gbit/s (default)")
    mode.add_argument("--full", action="store_true",
                      help="+ vgg16_cifar, 4 workers, 10 Gbit/s, hybrid, Omnivore groups (g = 1, 2, 4)")
    p.add_argument("--models", metavar="M1,M2", help="replace the matrix's networks")
    p.add_argument("--strategies", metavar="S1,S2",
                   help="replace the matrix's strategies (ps, allreduce, stanza, ralp, hybrid, groups)")
    p.add_argument("--workers", type=int_list, metavar="N1,N2", help="replace the matrix's worker counts")
    p.add_argument("--rates", type=rate_list, metavar="R1,R2", help="replace the matrix's link rates (e.g. 100Mbit,1Gbit)")
    p.add_argument("--calibration", metavar="FILE", help="predict with this cluster file (from `layerplan calibrate -o`)")
    p.add_argument("--presets-only", action="store_true", help="predict with the presets, no calibration")
    p.add_argument("--dry-run", action="store_true",
                   help="list the configurations, their predicted step and the estimated time; run nothing")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows (and the calibration) of DIR/validate.json and run only what is missing")
    p.add_argument("--repredict", action="store_true",
                   help="run nothing: predict DIR/validate.json's measured rows again with the current model (and "
                        "--calibration FILE, or the stored calibration — each row at the pace the rows run before it "
                        "reached their marked points —, or --presets-only); writes DIR/repredicted/")
    p.add_argument("--repredict-out", metavar="DIR2", help="with --repredict: write here instead of DIR/repredicted")
    p.add_argument("--budget", type=float, metavar="MIN",
                   help="minutes the whole command may take, calibration included (default: --quick 9.5, --full 43): "
                        "on a slower machine each configuration measures fewer seconds of steps to end in time; "
                        "0: no budget")
    p.add_argument("--out", default="validate-out", metavar="DIR", help="where validate.json and the plots go (default validate-out)")
    p.add_argument("--json", action="store_true", help="print the summary and rows as JSON")
    COMMANDS["validate"] = cmd_validate


_EXTENSIONS_BUILTIN = [_register_engine, _register_cluster, _register_closed_loop]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layerplan",
        description="Given a network and a cluster: how to train it fastest, and how long it will take. "
                    "Profiles any PyTorch model, predicts step time for every parallel strategy "
                    "(PALEO, Yan et al., Omnivore, Stanza, RALP), plans, and runs the plan on torch.distributed.",
    )
    parser.add_argument("--version", action="version", version=f"layerplan {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("profile", help="per-layer parameters, FLOPs and activations of a network; its RALP profile",
                       description="Per-layer parameters, FLOPs (forward and backward, per sample) and activation "
                                   "sizes; the conv/FC split; RALP's skewness, eligibility and split.")
    add_model_args(p)
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="B",
                   help="samples per worker, for the RALP split cost (activations scale with it); default 32")
    p.add_argument("--ralp-threshold", type=float, default=-0.5, metavar="K",
                   help="RALP eligibility threshold K (skewness < K); default -0.5")
    p.add_argument("--weighted-only", action="store_true", help="table: only layers with parameters")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--save", metavar="FILE", help="save the NetSpec as JSON (reusable as MODEL)")
    p.add_argument("--plot", metavar="PNG", help="plot cumulative parameters and FLOPs over the layers")
    COMMANDS["profile"] = cmd_profile

    p = sub.add_parser("zoo", help="list the model zoo")
    p.add_argument("--json", action="store_true")
    COMMANDS["zoo"] = cmd_zoo

    p = sub.add_parser("hardware", help="list device, link and node presets, or show one resolved cluster",
                       description="Without options: the presets. With --cluster/--nodes/...: the cluster they "
                                   "describe, with every value in units (--save writes it as a cluster file).")
    add_cluster_args(p)
    p.add_argument("--save", metavar="FILE", help="write the resolved cluster as YAML or JSON (by extension)")
    p.add_argument("--json", action="store_true")
    COMMANDS["hardware"] = cmd_hardware

    for register in _EXTENSIONS_BUILTIN + _EXTENSIONS:
        register(sub)
    return parser


# Later command groups (predict/plan/scale, train, cluster, ...) register themselves here.
def _register_runtime(sub) -> None:
    from layerplan.runtime.commands import register

    register(sub)


_EXTENSIONS: list[Callable[[argparse._SubParsersAction], None]] = [_register_runtime]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # to run the same command again (validate: a user namespace)
    if not args.command:
        parser.print_help()
        return EXIT_BAD_INPUT
    previous = _unwind_on_sigterm()
    try:
        return COMMANDS[args.command](args)
    except LayerplanError as e:
        if args.debug:
            raise
        print(f"layerplan {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:
        if args.debug:
            raise
        where = f" {e.filename!r}" if getattr(e, "filename", None) else ""
        print(f"layerplan {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"layerplan {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"layerplan {args.command}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(BaseException):
    """SIGTERM, raised where the command is (``_unwind_on_sigterm``): like an interrupt, it unwinds
    through every ``finally`` and context manager — benchmark and rank processes are killed, an
    emulated cluster torn down, the last good checkpoint left as it was."""


def _unwind_on_sigterm():
    """SIGTERM's default ends Python at once, leaving the processes a command started (a
    calibration's benchmarks, a run's ranks) running on: raise ``Terminated`` instead. The handler
    it replaces, or None where this is not the main thread (signals cannot be set there)."""
    def _raise(signum, frame):
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread
        return None


if __name__ == "__main__":
    # run as `python -m layerplan.cli`: subcommands register in the imported module's COMMANDS,
    # which is not this __main__ copy — hand over to it
    from layerplan import cli as _cli

    sys.exit(_cli.main())
