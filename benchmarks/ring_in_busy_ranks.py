"""How fast a ring all-reduce moves while its own ranks compute, and what it takes from them.

DDP's and Stanza's CONV workers all-reduce their gradient buckets while their backward pass still
runs: the ranks that reduce are the ranks that compute. Here each of N emulated hosts runs one
rank (one thread) that computes vgg16_cifar's convolutional head, forward and backward at batch
16, in a loop, while a thread of its own (as gloo's threads run beside the backward) all-reduces
three buffers of the conv gradients' bucket sizes (9.4, 28.3 and 21.1 MB), issued together as DDP
issues them, round after round. Three windows: the compute alone, the compute beside the
all-reduces, and (the peer, measured in the same run) the all-reduces alone. Prints, per rate and
rank count: the ranks' compute pace alone and beside the all-reduces, the cores' worth of compute
lost, the all-reduce's wire rate per rank beside the compute against its rate alone, and the
compute lost per wire byte — against what the cost model charges a collective's bytes (the CPU a
byte measured on idle cores, ``calibrate``/``validate``: about 0.6 ns at 1 Gbit/s, 1.1 at 10).
Asserts nothing; needs root or an unprivileged user namespace (skips with the reason otherwise).

    python benchmarks/ring_in_busy_ranks.py [--rates 1Gbit,10Gbit] [--ranks 2,4] [--window 5]
"""

from __future__ import annotations

import argparse
import json
import sys

RANK = r"""
import datetime, json, sys, threading, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
from layerplan.netspec import zoo
from layerplan.netspec.load import resolve_model
from layerplan.runtime.split import split_module
window = WINDOW
net = resolve_model("vgg16_cifar")[0]
module, shape = zoo.build("vgg16_cifar")
module.train()
head = split_module(module, net.boundary).head
x = torch.randn(16, *shape)
def compute():
    h = head(x)
    h.backward(torch.ones_like(h))
for _ in range(2):
    compute()
bufs = [torch.ones(n) for n in (2_359_808, 7_079_424, 5_275_776)]  # vgg16_cifar's conv buckets
flag = torch.zeros(1)
def rounds(t0, out):
    # rounds of the three buckets' all-reduces, issued together as DDP issues them, until every
    # rank has seen the window end (a 4-byte all-reduce after each round: the ranks agree on the
    # number of calls)
    n = 0
    while True:
        for w in [dist.all_reduce(b, async_op=True) for b in bufs]:
            w.wait()
        n += 1
        flag[0] = float(time.perf_counter() - t0 < window)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag[0] == 0:
            break
    out["rounds"], out["ring_s"] = n, time.perf_counter() - t0
out = {}
for mode in ("compute", "both", "ring"):
    dist.barrier()
    res, t0, c0, passes, last = {}, time.perf_counter(), time.process_time(), 0, 0.0
    comm = threading.Thread(target=rounds, args=(t0, res)) if mode != "compute" else None
    if comm:
        comm.start()
    while (comm.is_alive() if comm else time.perf_counter() - t0 < window) and mode != "ring":
        compute()
        passes, last = passes + 1, time.perf_counter() - t0
    if comm:
        comm.join()
    out[mode] = {"passes": passes, "pass_s": last, "payload": res.get("rounds", 0) * sum(4 * b.numel() for b in bufs),
                 "s": res.get("ring_s", time.perf_counter() - t0), "cpu_s": time.process_time() - c0}
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, out)
if dist.get_rank() == 0:
    print(json.dumps(gathered), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def once(rate: str, ranks: int, window_s: float, port: int) -> dict:
    from layerplan.runtime import emulate

    with emulate.running(ranks, rate) as emu:
        per_rank = emulate._rank0_json(emu, RANK.replace("WINDOW", repr(window_s)), ranks, port,
                                       600 + 10 * window_s, "the ring benchmark")
    wire = 2 * (ranks - 1) / ranks  # a ring's bytes on each rank's link per payload byte

    def pace(mode: str) -> float:  # passes a second, summed over the ranks
        return sum(r[mode]["passes"] / r[mode]["pass_s"] for r in per_rank)

    def wire_rate(mode: str) -> float:
        return sum(r[mode]["payload"] * wire / r[mode]["s"] for r in per_rank) / ranks

    return {"pace_alone": pace("compute"), "pace_both": pace("both"),
            "wire_both": wire_rate("both"), "wire_ring": wire_rate("ring"),
            "ring_cpu_cores": sum(r["ring"]["cpu_s"] / r["ring"]["s"] for r in per_rank)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1Gbit,10Gbit")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--window", type=float, default=5.0, help="seconds each window runs (default 5)")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from layerplan.runtime import emulate

    con = Console(highlight=False, width=150)
    try:
        emulate.check_available()
    except emulate.EmulationError as e:
        con.print(f"skipped: {e}")
        return 0
    try:
        import os

        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = 1
    table = Table(title=f"a ring all-reduce beside its own ranks' compute (vgg16_cifar's conv head, {cores} cores)")
    for col in ("rate", "ranks", "compute alone", "beside the ring", "cores lost", "ring alone",
                "ring beside compute", "beside / alone", "lost a wire byte"):
        table.add_column(col, justify="right")
    port = 29680
    for rate in args.rates.split(","):
        for n in (int(k) for k in args.ranks.split(",")):
            r = once(rate, n, args.window, port)
            port += 1
            lost = 1.0 - r["pace_both"] / r["pace_alone"]
            lost_cores = lost * min(n, cores)
            wire_all = r["wire_both"] * n
            table.add_row(rate, str(n), f"{r['pace_alone']:.2f} passes/s", f"{r['pace_both']:.2f} ({1 - lost:.2f}×)",
                          f"{lost_cores:.2f}", f"{r['wire_ring'] / 1e6:.1f} MB/s a rank",
                          f"{r['wire_both'] / 1e6:.1f} MB/s", f"{r['wire_both'] / r['wire_ring']:.2f}×",
                          f"{lost_cores / wire_all * 1e9:.2f} ns" if wire_all > 0 else "—")
            con.print(json.dumps({"rate": rate, "ranks": n, **r}))
    con.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
