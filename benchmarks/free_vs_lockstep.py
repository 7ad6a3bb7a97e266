"""How much more of the cores processes get free-running than in lockstep.

The calibration's capacities (``shared_core_capacity``, ``oversubscribed_core_capacity``) time a
net's training step in one process per core, then two, with a synchronization after every step,
the way every synchronous rank of the emulated cluster runs: a step goes at its slowest rank's
pace, and the others idle until it arrives. Omnivore's compute groups share no clock; the engine's
mean field (``StepGraph.mean_field_cores``) gives their threads the same capacity. This measures
the gap: N processes (one thread each) run the net's training step for a window free-running,
then in lockstep (an all-reduce of one flag after every step, as the calibration does), in turn,
with one process alone timed before and after each pair (the machine's pace drifts). Prints per
pair each capacity in alone-cores' worth (steps per second of all N over one alone) and the
processes' CPU (cores busy), and the median ratio free / lockstep. Asserts nothing.

    python benchmarks/free_vs_lockstep.py [--net alexnet_cifar] [--procs 4] [--window 6] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

BATCH = 16  # the calibration's batch for its synchronized steps


def rank_net(rank: int, world: int, port: int, net: str):
    """One rank of ``world`` (one thread, gloo over loopback) with ``net`` in training mode and a
    batch of ``BATCH`` random inputs and labels: (model, x, y). Shared by the benchmarks here."""
    import torch
    import torch.distributed as dist

    from layerplan.netspec import zoo

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    model, shape = zoo.build(net)
    model.train()
    x = torch.randn(BATCH, *shape[-3:])
    return model, x, torch.randint(0, model(x).shape[-1], (BATCH,))


def run_ranks(ctx, target, procs: int, *args) -> list:
    """``procs`` processes of ``target(rank, procs, port, *args, queue)`` at once; what each put on the queue."""
    from layerplan.runtime.launch import free_port

    out, port = ctx.Queue(), free_port()
    ps = [ctx.Process(target=target, args=(r, procs, port, *args, out)) for r in range(procs)]
    for p in ps:
        p.start()
    got = [out.get() for _ in ps]
    for p in ps:
        p.join()
    return got


def _worker(rank: int, world: int, port: int, lockstep: bool, net: str, window_s: float, out) -> None:
    import torch
    import torch.distributed as dist

    from layerplan.calibrate import _training_step

    model, x, y = rank_net(rank, world, port, net)
    step = _training_step(model, list(model.parameters()), x, y)
    step()
    step()  # warm: allocator, kernels
    dist.barrier()
    t0, cpu0, steps = time.perf_counter(), time.process_time(), 0
    while True:
        step()
        steps += 1
        over = time.perf_counter() - t0 >= window_s
        if lockstep:  # every rank learns rank 0's "over" in the step's synchronization
            flag = torch.tensor([1.0 if over and rank == 0 else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            over = flag.item() > 0
        if over:
            break
    wall = time.perf_counter() - t0
    out.put((steps / wall, (time.process_time() - cpu0) / wall))
    dist.barrier()
    dist.destroy_process_group()


def window(ctx, procs: int, lockstep: bool, net: str, window_s: float) -> tuple[float, float]:
    """(steps per second of all ``procs`` processes together, their cores busy) over one window."""
    got = run_ranks(ctx, _worker, procs, lockstep, net, window_s)
    return sum(r for r, _ in got), sum(c for _, c in got)


def main() -> int:
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="alexnet_cifar", help="a zoo net (default alexnet_cifar)")
    ap.add_argument("--procs", type=int, default=4, help="processes at once (default 4: two a core on 2 cores)")
    ap.add_argument("--window", type=float, default=6.0, help="seconds of steps per window")
    ap.add_argument("--pairs", type=int, default=5, help="free and lockstep windows, in turn")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    pairs = []
    for i in range(args.pairs):
        before = window(ctx, 1, False, args.net, args.window)[0]
        order = (False, True) if i % 2 == 0 else (True, False)  # alternate which goes first
        got = {lockstep: window(ctx, args.procs, lockstep, args.net, args.window) for lockstep in order}
        alone = (before + window(ctx, 1, False, args.net, args.window)[0]) / 2
        pair = {"alone_step_s": 1 / alone, "free": got[False][0] / alone, "free_cores_busy": got[False][1],
                "lockstep": got[True][0] / alone, "lockstep_cores_busy": got[True][1]}
        pair["ratio"] = pair["free"] / pair["lockstep"]
        pairs.append(pair)
        if not args.json:
            print(f"pair {i}: alone {pair['alone_step_s'] * 1e3:.0f} ms a step; free {pair['free']:.3f} "
                  f"(cores busy {pair['free_cores_busy']:.2f}), lockstep {pair['lockstep']:.3f} "
                  f"({pair['lockstep_cores_busy']:.2f}): free / lockstep {pair['ratio']:.3f}", flush=True)
    median = statistics.median(p["ratio"] for p in pairs)
    if args.json:
        print(json.dumps({"net": args.net, "procs": args.procs, "cores": len(os.sched_getaffinity(0)),
                          "pairs": pairs, "median_ratio": median}, indent=1))
    else:
        print(f"{args.procs} processes of {args.net} on {len(os.sched_getaffinity(0))} cores: free-running over "
              f"lockstep capacity, median {median:.3f} over {len(pairs)} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
