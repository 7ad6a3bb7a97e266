"""The `layerplan` command line: one parser, subcommands, and one place that turns bad input into
a single line and exit code 2 (``--debug`` shows the traceback instead)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from layerplan import __version__
from layerplan.errors import LayerplanError

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


def int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4,8, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="a zoo name (see `layerplan zoo`), file.py:factory, package.module:factory, or a saved NetSpec .json")
    p.add_argument("--input-size", type=positive_int, metavar="S", help="input height = width in pixels (overrides the model's default)")
    p.add_argument("--num-classes", type=positive_int, metavar="C", help="number of output classes (overrides the model's default)")


def add_cluster_args(p: argparse.ArgumentParser, nodes_default: int | None = None) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", metavar="PRESET|FILE", default=None,
                   help="a node preset (see `layerplan hardware`) or a cluster file (.yaml/.json); default titan-x")
    g.add_argument("--nodes", type=positive_int, default=nodes_default, metavar="N", help="number of nodes (machines)")
    g.add_argument("--device", metavar="D", help="replace the preset's device (e.g. v100, k80)")
    g.add_argument("--bandwidth", metavar="RATE", help="replace the NIC rate, e.g. 10Gbit, 100Mbit, or a link preset")
    g.add_argument("--shared-cores", type=positive_int, metavar="C",
                   help="all nodes share C CPU cores (as on the emulated cluster)")


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

        emit_json({"devices": {k: asdict(v) for k, v in hardware.DEVICES.items()},
                   "links": {k: asdict(v) for k, v in hardware.LINKS.items()},
                   "nodes": {k: {"device": d, "devices_per_node": n, "nic": nic, "note": note}
                             for k, (d, n, nic, note) in hardware.NODES.items()}})
    else:
        report.print_hardware()
    return 0


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

    for register in _EXTENSIONS:
        register(sub)
    return parser


# Later command groups (predict/plan/scale, train, cluster, ...) register themselves here.
_EXTENSIONS: list[Callable[[argparse._SubParsersAction], None]] = []


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_BAD_INPUT
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


if __name__ == "__main__":
    sys.exit(main())
