"""One rank of a layerplan training run — started by ``layerplan train`` / ``launch_local``, or by
torchrun (env:// rendezvous: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from the environment).

Write the run spec first (``layerplan train MODEL --strategy ps --workers 2 --on torchrun --spec-out
spec.json`` writes it and prints the command), then, on one machine with 3 ranks (ps: 2 workers
and 1 server)::

    torchrun --nproc-per-node 3 -m layerplan.runtime.worker --spec spec.json

On two machines (the same spec.json on both; torchrun's default static rendezvous numbers the
ranks node by node, so the layout — which rank is a worker, a server, a CONV or FC worker —
follows ``--node-rank`` and ``--nproc-per-node``)::

    # on HOST (node 0)
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --rdzv-endpoint HOST:29500 \
        -m layerplan.runtime.worker --spec spec.json
    # on the other machine (node 1)
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 --rdzv-endpoint HOST:29500 \
        -m layerplan.runtime.worker --spec spec.json

(set ``GLOO_SOCKET_IFNAME`` to the interface that connects the machines). The world size must
equal the layout's (``layerplan.runtime.layout``). Rank 0 writes the Measurement to the spec's
``metrics_out`` and, when not started by layerplan's launcher, prints the summary.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path


def heartbeat(run_dir: str | None, rank: int, steps_done: int) -> None:
    """The launcher's watchdog reads these: the steps this rank has finished."""
    if not run_dir:
        return
    p = Path(run_dir) / f"hb-rank{rank}"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(str(steps_done))
    os.replace(tmp, p)


def run_rank(spec, rank: int, world: int, run_dir: str | None = None) -> dict | None:
    """Train this rank's part of ``spec`` inside an initialised process group; rank 0 returns the
    Measurement."""
    import torch
    import torch.distributed as dist

    from layerplan.runtime import checkpoint, metrics, model
    from layerplan.runtime.data import Sharder, make_source
    from layerplan.runtime.layout import data_workers, layout, nodes_represented
    from layerplan.runtime.roles import Context, make_role

    roles = layout(spec)
    role = roles[rank]
    if spec.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    net, module = model.build(spec)
    torch.manual_seed(spec.seed * 1000 + 1 + rank)  # dropout differs per rank, as in any DDP job
    n = data_workers(spec)
    gb = n * spec.batch_size
    sharder = Sharder(make_source(spec.data, net.input_shape, model.num_classes(net, spec), spec.seed),
                      n, spec.batch_size, spec.seed, dtype=model.torch_dtype(spec))
    meter = metrics.Meter(rank, role.kind)
    ctx = Context(spec=spec, rank=rank, roles=roles, role=role, net=net, module=module, device=device, meter=meter,
                  sharder=sharder, global_batch=gb)
    worker = make_role(ctx)
    del module
    start = checkpoint.load(spec, rank, world, worker) if spec.resume or spec.init_from else 0
    heartbeat(run_dir, rank, start)
    show = rank == 0 and spec.progress
    with metrics.Progress(show, spec.steps, start, f"{spec.strategy} {spec.model}") as bar:
        for s in range(start, spec.steps):
            meter.start_step(s)
            worker.step(s)
            rec = meter.end_step()
            bar.update(rec)
            if checkpoint.due(spec, s + 1):
                checkpoint.save(spec, rank, world, s + 1, worker, sharder, dist.barrier)
            heartbeat(run_dir, rank, s + 1)
    if spec.params_out:
        Path(spec.params_out).mkdir(parents=True, exist_ok=True)
        checkpoint.atomic_torch_save(worker.owned_params(), Path(spec.params_out) / f"params-rank{rank}.pt")
    frags = [None] * world if rank == 0 else None
    dist.gather_object(meter.fragment(), frags, dst=0)
    m = None
    if rank == 0:
        m = metrics.summarize(frags, spec, roles, nodes_represented(spec), gb)
        if spec.metrics_out:
            checkpoint.atomic_write_json(spec.metrics_out, m)
    dist.barrier()  # nobody tears the group down while a peer still talks to it
    return m


def serve_session(rank: int, world: int, run_dir: str) -> None:
    """``launch.Session``'s side: run each ``run-I.json`` that appears in ``run_dir`` in turn (the
    process group stays up between them) until ``stop`` appears."""
    import time

    from layerplan.runtime.run_spec import RunSpec

    import torch.distributed as dist

    d = Path(run_dir)
    dist.barrier()  # every rank has joined the group
    (d / f"ready-rank{rank}").write_text("")
    i = 0
    while True:
        nxt, stop = d / f"run-{i}.json", d / "stop"
        while not nxt.exists():
            if stop.exists():
                return
            time.sleep(0.005)
        run_rank(RunSpec.load(nxt), rank, world, run_dir)
        i += 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m layerplan.runtime.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="the run spec JSON (layerplan train ... --spec-out)")
    ap.add_argument("--run-dir", default=os.environ.get("LAYERPLAN_RUN_DIR"), help="heartbeat files for the launcher")
    args = ap.parse_args(argv)

    from layerplan.runtime.allocator import keep_freed_memory

    keep_freed_memory()  # before the model and its gradients are allocated
    import torch
    import torch.distributed as dist

    from layerplan.errors import LayerplanError
    from layerplan.runtime.layout import world_size
    from layerplan.runtime.run_spec import RunSpec

    try:
        spec = RunSpec.load(args.spec)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world != world_size(spec):
            raise LayerplanError(f"the spec's {spec.strategy} layout needs {world_size(spec)} ranks, "
                                 f"but WORLD_SIZE is {world}")
    except KeyError as e:
        print(f"layerplan worker: error: {e.args[0]} is not set (start with torchrun or layerplan train)",
              file=sys.stderr)
        return 2
    except LayerplanError as e:
        print(f"layerplan worker: error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(spec.threads_per_rank)
    heartbeat(args.run_dir, rank, 0)
    dist.init_process_group(backend=spec.backend, init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=spec.timeout_s))
    try:
        if os.environ.get("LAYERPLAN_SESSION"):
            serve_session(rank, world, args.run_dir)
            return 0
        m = run_rank(spec, rank, world, args.run_dir)
    except LayerplanError as e:
        print(f"layerplan worker rank {rank}: error: {e}", file=sys.stderr)
        return 2
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 — a failed peer may have broken the group already
            pass
    if m is not None and not os.environ.get("LAYERPLAN_LAUNCHED"):  # torchrun: nobody else reports
        from layerplan.runtime.commands import print_summary

        print_summary(m)
    return 0


def _exit(code: int) -> None:
    """Leave without interpreter teardown: gloo's threads can abort the process from C++ static
    destructors ("terminate called without an active exception") after a clean run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
