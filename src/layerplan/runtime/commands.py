"""`layerplan train`: run a strategy for real on torch.distributed and report what it measured.

``register(subparsers)`` adds the subcommand and puts ``cmd_train`` into ``layerplan.cli.COMMANDS``.
The prediction seam: ``run_train(args, predictor)`` calls ``predictor(spec, measurement)`` when one
is given and shows measured, predicted and relative error side by side (``attach_prediction``).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any, Callable

from layerplan.errors import ConfigError

DEFAULT_WORKERS = 2
STRATEGY_OPTIONS = {  # CLI option -> (config key, strategies it applies to)
    "workers": ("workers", ("ps", "allreduce", "ralp")),  # stanza, hybrid: CONV workers; groups: conv machines
    "servers": ("servers", ("ps",)),
    "conv_workers": ("conv_workers", ("stanza", "hybrid")),
    "fc_workers": ("fc_workers", ("stanza", "hybrid")),
    "replicate": ("replicate", ("hybrid",)),
    "split": ("split", ("stanza", "ralp", "hybrid", "groups")),
    "overlap": ("overlap", ("stanza",)),
    "ralp_setting": ("ralp_setting", ("ralp",)),
    "machines": ("machines", ("groups",)),
    "groups": ("groups", ("groups",)),
}


def register(subparsers) -> None:
    from layerplan.cli import COMMANDS, add_model_args, positive_int
    from layerplan.runtime.run_spec import STRATEGIES

    p = subparsers.add_parser(
        "train", help="run a strategy for real on torch.distributed and measure it",
        description="Train MODEL with a strategy on local processes (gloo on CPU): measured step time, "
                    "throughput, bytes per role per step, compute/communication time per role.")
    add_model_args(p, required=False)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--strategy", choices=STRATEGIES, help=" | ".join(STRATEGIES))
    src.add_argument("--plan", metavar="PLAN.json",
                     help="run what `layerplan plan -o PLAN.json` wrote (model, strategy, config, batch size)")
    g = p.add_argument_group("strategy configuration")
    g.add_argument("--workers", type=positive_int, metavar="N",
                   help=f"ps/allreduce/ralp workers (ralp: plus one PS worker), stanza/hybrid: CONV workers, groups: "
                        f"conv machines N (plus the FC server and the conv model server); default {DEFAULT_WORKERS}")
    g.add_argument("--servers", type=positive_int, metavar="N", help="ps: parameter servers (default 1)")
    g.add_argument("--conv-workers", type=positive_int, metavar="N",
                   help=f"stanza/hybrid: CONV workers (default {DEFAULT_WORKERS})")
    g.add_argument("--fc-workers", type=positive_int, metavar="N",
                   help="stanza: FC workers, hybrid: FC machines the fc layers are partitioned over (default 1)")
    g.add_argument("--replicate", type=name_list, metavar="FC1,FC2",
                   help="hybrid: fc layers computed replicated on every FC machine (data parallel over them, weight "
                        "gradients all-reduced) instead of partitioned by output features (Yan §6.4; default none)")
    g.add_argument("--split", metavar="LAYER",
                   help="stanza/ralp/hybrid/groups: cut after this layer (default: the phase boundary / the RALP "
                        "profile's split)")
    g.add_argument("--no-overlap", dest="overlap", action="store_false", default=None,
                   help="stanza: all-reduce the conv gradient after the backward pass, as the paper does (default: "
                        "during it, bucket by bucket as torch DDP does)")
    g.add_argument("--ralp-setting", choices=("N", "H"), help="ralp: RALP-N (N−1 workers) or RALP-H (N/2 workers)")
    g.add_argument("--groups", type=positive_int, metavar="G",
                   help="groups: Omnivore compute groups g (must divide --workers; 1 = synchronous, N = fully "
                        "asynchronous); --steps is iterations per group")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=positive_int, default=20, metavar="K", help="steps (default 20)")
    t.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                   help="samples per worker (default 32, or the plan's)")
    t.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    t.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    t.add_argument("--weight-decay", type=float, default=0.0, help="SGD weight decay (default 0)")
    t.add_argument("--data", default="synthetic", metavar="SOURCE",
                   help="synthetic | digits | digits-augmented (each sample randomly rotated, scaled and shifted) | "
                        "imagefolder:PATH (default synthetic)")
    t.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed (default 0)")
    t.add_argument("--deterministic", action="store_true", help="disable dropout (runs equal single-process SGD)")
    t.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="parameter/activation type")
    r = p.add_argument_group("run")
    r.add_argument("--on", type=where, default="local", metavar="local|emulated[:NAME]|torchrun",
                   help="local: start the ranks here (default); emulated[:NAME]: one rank per host of an emulated "
                        "cluster (`layerplan cluster up`); torchrun: write the spec and print the torchrun command")
    r.add_argument("--cluster", metavar="FILE|PRESET",
                   help="predict with this cluster (e.g. the file `layerplan calibrate -o` wrote) instead of the "
                        "built-in description of where the run happens; with --on emulated its device and CPU costs "
                        "on the emulated cluster's links")
    r.add_argument("--no-predict", action="store_true", help="measure only; skip the prediction beside it")
    r.add_argument("--threads-per-rank", type=positive_int, default=1, metavar="T", help="torch threads per rank (default 1)")
    r.add_argument("--timeout", type=float, default=20.0, metavar="S",
                   help="seconds a rank waits for a peer before the run fails (default 20)")
    r.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU, default) or nccl (CUDA)")
    r.add_argument("--metrics-out", metavar="FILE", help="write the Measurement JSON here")
    r.add_argument("--checkpoint-dir", metavar="D", help="write checkpoints here")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                   help="checkpoint every K steps (default: only after the last step)")
    r.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    r.add_argument("--init-from", metavar="D",
                   help="start from the latest checkpoint in D (another run of the same model, data and ranks) with "
                        "this run's --lr, --momentum and --groups; --steps counts on from its step (e.g. "
                        "`tune --checkpoint-dir D` writes D/model)")
    r.add_argument("--spec-out", metavar="FILE", help="also write the run spec (JSON) here")
    r.add_argument("--json", action="store_true", help="print the Measurement as JSON instead of tables")
    COMMANDS["train"] = cmd_train
    from layerplan.runtime import tune

    tune.register(subparsers)


def name_list(text: str) -> list[str]:
    """--replicate: comma-separated layer names (an empty string: none)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a layer is named twice in {text!r}")
    return names


def where(text: str) -> str:
    """--on: local | torchrun | emulated | emulated:NAME."""
    if text in ("local", "torchrun", "emulated") or (text.startswith("emulated:") and len(text) > 9):
        return text
    raise argparse.ArgumentTypeError(f"expected local, emulated[:NAME] or torchrun, got {text!r}")


PLAN_TO_RUN = {  # plan (engine) config key -> RunSpec config key; None: not a runtime setting
    "ps": {"workers": "workers", "servers": "servers"},
    "allreduce": {"workers": "workers", "algorithm": None, "bucket_bytes": None},
    "stanza": {"conv_workers": "conv_workers", "fc_workers": "fc_workers"},
    "ralp": {"workers": "workers", "split": "split", "setting": "ralp_setting"},
    "hybrid": {"conv_workers": "conv_workers", "fc_workers": "fc_workers", "replicate": "replicate"},
    "groups": {"machines": "workers", "groups": "groups", "merged_fc": None, "pipelined": None},
}


def plan_args(args: argparse.Namespace) -> None:
    """Fill model, strategy, config options and batch size from --plan (explicit options win)."""
    from layerplan.plan.planner import Plan

    plan = Plan.load(args.plan)
    if plan.strategy not in PLAN_TO_RUN:
        raise ConfigError(f"{args.plan}: the runtime cannot execute strategy {plan.strategy!r} yet "
                          f"(it runs {', '.join(PLAN_TO_RUN)}); plan with --strategies {','.join(PLAN_TO_RUN)}")
    if args.model is not None and args.model != plan.model:
        raise ConfigError(f"{args.plan} is a plan for {plan.model!r}, not {args.model!r}")
    if plan.strategy == "groups" and not plan.config.get("merged_fc", True):
        raise ConfigError(f"{args.plan}: the runtime runs groups with a merged FC server only (Omnivore §V-A); "
                          "this plan has one FC compute server per group")
    if plan.strategy == "groups" and plan.config.get("pipelined"):
        raise ConfigError(f"{args.plan}: the runtime does not run pipelined groups; plan without pipelining")
    args.model = plan.model
    args.strategy = plan.strategy
    for k in ("input_size", "num_classes", "batch_size"):
        if getattr(args, k) is None:
            setattr(args, k, getattr(plan, k))
    for key, value in plan.config.items():
        opt = PLAN_TO_RUN[plan.strategy].get(key)
        if opt is not None and getattr(args, opt, None) is None:
            setattr(args, opt, value)
    args.plan_predicted = plan.predicted


def spec_from_args(args: argparse.Namespace):
    from layerplan.runtime.run_spec import RunSpec

    if getattr(args, "plan", None):
        plan_args(args)
    if args.model is None:
        raise ConfigError("give MODEL (a zoo name, file.py:factory, module:factory) or --plan PLAN.json")
    if args.strategy is None:
        from layerplan.runtime.run_spec import STRATEGIES

        raise ConfigError(f"give --strategy ({', '.join(STRATEGIES)}) or --plan PLAN.json")
    if args.batch_size is None:
        args.batch_size = 32
    if args.strategy in ("stanza", "hybrid") and args.workers is not None:
        if args.conv_workers is not None and args.conv_workers != args.workers:
            raise ConfigError(f"{args.strategy}: --workers and --conv-workers both given and differ (they mean the same)")
        args.conv_workers, args.workers = args.workers, None
    args.machines = None
    if args.strategy == "groups":
        args.machines, args.workers = args.workers or DEFAULT_WORKERS, None
        if args.groups is None:
            raise ConfigError("groups: give --groups G (compute groups; G must divide --workers, the conv machines)")
    config: dict[str, Any] = {}
    for opt, (key, applies) in STRATEGY_OPTIONS.items():
        v = getattr(args, opt, None)
        if v is None:
            continue
        if args.strategy not in applies:
            flag = "no-overlap" if opt == "overlap" else opt.replace("_", "-")
            raise ConfigError(f"--{flag} does not apply to {args.strategy} "
                              f"(only to {', '.join(applies)})")
        config[key] = v
    if args.strategy in ("stanza", "hybrid"):
        config.setdefault("conv_workers", DEFAULT_WORKERS)
    elif args.strategy != "groups":
        config.setdefault("workers", DEFAULT_WORKERS)
    if args.checkpoint_every < 0:
        raise ConfigError(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    return RunSpec(model=args.model, strategy=args.strategy, config=config, input_size=args.input_size,
                   num_classes=args.num_classes, batch_size=args.batch_size, steps=args.steps, lr=args.lr,
                   momentum=args.momentum, weight_decay=args.weight_decay, data=args.data, seed=args.seed,
                   threads_per_rank=args.threads_per_rank, checkpoint_dir=args.checkpoint_dir,
                   checkpoint_every=args.checkpoint_every, resume=args.resume, init_from=args.init_from,
                   metrics_out=args.metrics_out,
                   timeout_s=args.timeout, deterministic=args.deterministic, backend=args.backend, dtype=args.dtype,
                   progress=not args.json)


def cmd_train(args: argparse.Namespace) -> int:
    return run_train(args, predictor=None if args.no_predict else make_predictor(args))


def make_predictor(args: argparse.Namespace) -> Callable[[Any, dict], dict]:
    """The engine's prediction for where the run happens: on an emulated cluster its own spec (its
    links, its nodes, the cores they share) with the --cluster file's device and CPU costs where one
    is given (``validate.calibrated_for``, as validate predicts); else the --cluster file/preset if
    given, else ranks sharing this machine's cores over loopback."""

    def predictor(spec, measurement: dict) -> dict:
        from layerplan.hardware import resolve_cluster
        from layerplan.runtime.predict import predict_run

        cluster = resolve_cluster(args.cluster) if args.cluster else None
        if args.on.startswith("emulated"):
            from layerplan.runtime import emulate

            emu = emulate.find(args.on.partition(":")[2] or "default")
            if cluster is None:
                cluster = emu.cluster_spec()
            else:
                from layerplan.validate import calibrated_for

                cluster = calibrated_for(emu, cluster)
        return predict_run(spec, cluster)

    return predictor


def run_train(args: argparse.Namespace, predictor: Callable[[Any, dict], dict] | None = None) -> int:
    """The train command; ``predictor(spec, measurement) -> Prediction.to_dict()`` adds the cost
    engine's prediction beside the measurement (the seam for the engine)."""
    from layerplan.cli import emit_json
    from layerplan.runtime.launch import launch_local, preflight
    from layerplan.runtime.layout import world_size

    spec = spec_from_args(args)
    if args.spec_out:
        spec.save(args.spec_out)
    if args.on == "torchrun":
        preflight(spec)
        path = args.spec_out or "spec.json"
        if not args.spec_out:
            spec.save(path)
        print(f"wrote {path}; run it with:\n  torchrun --nproc-per-node {world_size(spec)} "
              f"-m layerplan.runtime.worker --spec {shlex.quote(str(Path(path)))}")
        return 0
    if args.cluster:  # a bad cluster file fails before any process starts
        from layerplan.hardware import resolve_cluster

        resolve_cluster(args.cluster)
    if args.on.startswith("emulated"):
        from layerplan.runtime.launch import launch_emulated

        m = launch_emulated(spec, args.on.partition(":")[2] or "default", quiet=args.json)
    else:
        m = launch_local(spec, quiet=args.json)
    if predictor is not None:
        m = attach_prediction(m, predictor(spec, m))
        if spec.metrics_out:  # the file carries the prediction and the error too
            from layerplan.runtime.checkpoint import atomic_write_json

            atomic_write_json(spec.metrics_out, m)
    if args.json:
        emit_json(m)
    else:
        print_summary(m)
    return 0


def attach_prediction(measurement: dict, prediction: dict) -> dict:
    """Measured, predicted and relative error side by side: adds ``prediction`` (as given) and
    ``comparison`` {quantity: {measured, predicted, rel_error}} for step time, throughput, total
    bytes per step, per-role compute/comm time, the shared cores kept busy (on a cluster whose
    nodes share cores: the engine's load on them as cores of CPU time) and how far into the step
    each role reached its marks (``predict.timeline_marks``) where both sides have them."""
    from layerplan.runtime.predict import timeline_marks

    out = dict(measurement)
    out["prediction"] = prediction
    rows: dict[str, dict[str, float | None]] = {}

    def add(name: str, meas: Any, pred: Any) -> None:
        if isinstance(meas, (int, float)) and isinstance(pred, (int, float)):
            rows[name] = {"measured": float(meas), "predicted": float(pred),
                          "rel_error": (float(pred) - float(meas)) / float(meas) if meas else None}

    add("step_time_s", measurement.get("step_time_s"), prediction.get("step_time_s"))
    add("throughput_samples_per_s", measurement.get("throughput_samples_per_s"),
        prediction.get("throughput_samples_per_s"))
    mb, pb = measurement.get("bytes_per_step") or {}, prediction.get("bytes_per_step") or {}
    add("bytes_per_step.total", mb.get("total"), pb.get("total") if isinstance(pb, dict) else pb)
    for role, sent in (mb.get("per_role") or {}).items():
        if isinstance(pb, dict):
            add(f"bytes_per_step.{role}", sent, (pb.get("per_role") or {}).get(role))
    for role, b in (measurement.get("breakdown") or {}).items():
        pr = (prediction.get("breakdown") or {}).get(role) or {}
        for k in ("compute_s", "comm_s"):
            add(f"breakdown.{role}.{k}", b.get(k), pr.get(k))
    marks = {k: b["marks_s"] for k, b in (measurement.get("breakdown") or {}).items() if b.get("marks_s")}
    for role, points in timeline_marks(prediction, marks).items():  # where in the step each role got to
        for name, t in points.items():
            add(f"marks_s.{role}.{name}", marks[role][name], t)
    cores = (prediction.get("cluster") or {}).get("shared_cores")
    busy = (prediction.get("utilization") or {}).get("shared cores")
    if cores and busy is not None:
        add("cpu_cores_busy", measurement.get("cpu_cores_busy"), busy * cores)
    out["comparison"] = rows
    return out


def print_summary(m: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from layerplan import units

    con = Console(highlight=False)
    cfg = ", ".join(f"{k}={v}" for k, v in m["config"].items() if v is not None)
    losses = [x for x in m["loss"] if x is not None]
    con.print(f"[bold]{m['strategy']}[/bold] ({cfg}) on {m['model']}: {m['world_size']} ranks, global batch "
              f"{m['global_batch']}, steps {m['steps'][0]}–{m['steps'][-1]}" if m["steps"] else "no steps run")
    how = ("a round at the groups' throughput" if m["strategy"] == "groups" else "median")
    con.print(f"step time {units.format_seconds(m['step_time_s'])} ({how} after {m['warmup_steps']} warm-up), "
              f"throughput {m['throughput_samples_per_s']:.1f} samples/s, "
              f"bytes per step {units.format_bytes(m['bytes_per_step']['total'])}"
              + (f", loss {losses[0]:.4f} → {losses[-1]:.4f}" if losses else ""))
    st = m.get("staleness")
    if st and st.get("updates"):
        hist = ", ".join(f"{k}: {v}" for k, v in st["histogram"].items())
        con.print(f"staleness per conv update (other groups' updates between pull and push): median {st['median']:g}, "
                  f"mean {st['mean']:.2f} (g − 1 = {st['expected']}), max {st['max']}; histogram {{{hist}}}")
    t = Table(title="per role, per rank, per step")
    for col in ("role", "ranks", "sent", "received", "compute", "comm", "CPU (cores)"):
        t.add_column(col, justify="left" if col == "role" else "right")
    rows: dict[str, list[dict]] = {}
    for r in m["bytes_per_step"]["per_rank"]:
        rows.setdefault(r["role"], []).append(r)
    for role, rs in rows.items():
        b = m["breakdown"][role]
        recv = sum(r["recv"] for r in rs) / len(rs)
        t.add_row(role, str(len(rs)), units.format_bytes(m["bytes_per_step"]["per_role"][role]),
                  units.format_bytes(recv), units.format_seconds(b["compute_s"]), units.format_seconds(b["comm_s"]),
                  f"{b['cpu_cores']:.2f}" if "cpu_cores" in b else "–")
    con.print(t)
    if m.get("comparison"):
        c = Table(title="measured vs predicted")
        for col in ("quantity", "measured", "predicted", "error"):
            c.add_column(col, justify="left" if col == "quantity" else "right")
        for name, row in m["comparison"].items():
            err = "–" if row["rel_error"] is None else f"{100 * row['rel_error']:+.1f}%"
            c.add_row(name, f"{row['measured']:.4g}", f"{row['predicted']:.4g}", err)
        con.print(c)
