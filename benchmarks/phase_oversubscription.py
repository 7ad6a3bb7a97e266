"""How a net's forward and its backward each slow down with more processes than cores.

The calibration's capacities (``shared_core_capacity``, ``oversubscribed_core_capacity``) time a
whole training step — forward, backward and update together — in one process per core, then two,
in lockstep; the engine stretches every compute phase of a step by the same capacity. This times
the two phases apart: N processes (one thread each) run the net's forward, meet at a barrier, run
its backward and update, meet again — as a CONV worker of Stanza, RALP or hybrid waits between its
forward and its backward for the gradients from the FC machines — for a window, with N = 1, the
cores, and twice the cores in turn, one alone window before and after each round (the machine's
pace drifts). Each phase is timed to the ranks' meeting after it: the slowest rank's, as a
synchronous step goes. Prints, per round and N, each phase's mean time and its capacity over
alone: alone-cores' worth = N · alone / phase. Asserts nothing.

    python benchmarks/phase_oversubscription.py [--net vgg16_cifar] [--window 6] [--rounds 3] [--ranks 2,4,6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from free_vs_lockstep import BATCH, rank_net, run_ranks  # benchmarks/ is the script's folder: on sys.path


def _worker(rank: int, world: int, port: int, net: str, window_s: float, out) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from layerplan.runtime.optim import sgd

    model, x, y = rank_net(rank, world, port, net)
    opt = sgd(list(model.parameters()), lr=1e-6, momentum=0.9)
    flag = torch.zeros(1)

    def step() -> tuple[float, float, float]:
        """(forward, backward and update, end): seconds from the step's start to each phase's end
        at the ranks' meeting after it — the slowest rank's pace, as a synchronous step goes."""
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        dist.barrier()  # the ranks meet between the phases, as at the FC machines' gradients
        t1 = time.perf_counter()
        loss.backward()
        opt.step()
        return t0, t1, time.perf_counter()

    for _ in range(2):  # warm: allocator, kernels
        step()
    dist.barrier()
    fwds, bwds, start = [], [], time.perf_counter()
    while True:
        t0, t1, _ = step()
        flag.fill_(1.0 if rank == 0 and time.perf_counter() - start >= window_s else 0.0)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the step's synchronization carries rank 0's "over"
        fwds.append(t1 - t0)
        bwds.append(time.perf_counter() - t1)
        if flag.item() > 0:
            break
    out.put((statistics.fmean(fwds), statistics.fmean(bwds)))
    dist.barrier()
    dist.destroy_process_group()


def window(ctx, procs: int, net: str, window_s: float) -> tuple[float, float]:
    """(forward, backward and update) mean seconds a step, each phase to the ranks' meeting after
    it, over one window of ``procs`` ranks (their means averaged)."""
    got = run_ranks(ctx, _worker, procs, net, window_s)
    return statistics.fmean(f for f, _ in got), statistics.fmean(b for _, b in got)


def main() -> int:
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="vgg16_cifar", help="a zoo net (default vgg16_cifar)")
    ap.add_argument("--window", type=float, default=6.0, help="seconds of steps per window")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the process counts")
    ap.add_argument("--ranks", default="", help="comma-separated process counts (default: the cores, twice the cores)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    cores = len(os.sched_getaffinity(0))
    try:
        counts = sorted({int(n) for n in args.ranks.split(",") if n.strip()}) or [cores, 2 * cores]
    except ValueError:
        ap.error(f"--ranks: comma-separated whole numbers, got {args.ranks!r}")
    if counts[0] < 1:
        ap.error(f"--ranks: counts must be at least 1, got {args.ranks!r}")
    rounds = []
    for i in range(args.rounds):
        before = window(ctx, 1, args.net, args.window)
        got = {n: window(ctx, n, args.net, args.window) for n in counts}
        after = window(ctx, 1, args.net, args.window)
        alone = ((before[0] + after[0]) / 2, (before[1] + after[1]) / 2)
        r = {"alone_fwd_s": alone[0], "alone_bwd_s": alone[1],
             **{f"{n}": {"fwd_s": f, "bwd_s": b, "fwd_capacity": n * alone[0] / f, "bwd_capacity": n * alone[1] / b}
                for n, (f, b) in got.items()}}
        rounds.append(r)
        if not args.json:
            print(f"round {i}: alone fwd {alone[0] * 1e3:.1f} ms, bwd+update {alone[1] * 1e3:.1f} ms; "
                  + "; ".join(f"{n} ranks: fwd {r[str(n)]['fwd_s'] * 1e3:.1f} ms ({r[str(n)]['fwd_capacity']:.2f} cores' worth), "
                              f"bwd {r[str(n)]['bwd_s'] * 1e3:.1f} ms ({r[str(n)]['bwd_capacity']:.2f})" for n in got),
                  flush=True)
    med = {f"{n}": {k: statistics.median(r[f"{n}"][k] for r in rounds) for k in ("fwd_capacity", "bwd_capacity")}
           for n in counts}
    if args.json:
        print(json.dumps({"net": args.net, "cores": cores, "batch": BATCH, "rounds": rounds, "median": med}, indent=1))
    else:
        print(f"{args.net} on {cores} cores, median over {len(rounds)} rounds: "
              + "; ".join(f"{n} ranks fwd {v['fwd_capacity']:.2f}, bwd {v['bwd_capacity']:.2f} cores' worth"
                          for n, v in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
