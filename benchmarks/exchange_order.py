"""Two ranks sending to each other at once over gloo: does it matter which they post first?

Hybrid's FC machines move activations and their gradients between layouts by exchanging slices,
every machine sending to every other while receiving from it (``runtime/roles/hybrid.py``,
``FcMachine._exchange``). Here two hosts of an emulated cluster exchange ``--mb`` MB each way,
over and over: each rank posting its ``irecv`` before its ``isend``, or its ``isend`` first; and,
the peer measured in the same run, one all-reduce of as many bytes (a 2-rank ring sends half of
them and receives half in each of its two phases: as many bytes each way). Prints each exchange's time and rate each way. Asserts nothing; needs root or
an unprivileged user namespace (skips with the reason otherwise).

    python benchmarks/exchange_order.py [--rate 100Mbit] [--mb 29.4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

RANK = r"""
import datetime, json, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
r = dist.get_rank()
n = NUMEL
out_buf, in_buf, flat = torch.ones(n), torch.ones(n), torch.ones(n)
def recv_first():
    ws = [dist.irecv(in_buf, 1 - r), dist.isend(out_buf, 1 - r)]
    for w in ws:
        w.wait()
def send_first():
    ws = [dist.isend(out_buf, 1 - r), dist.irecv(in_buf, 1 - r)]
    for w in ws:
        w.wait()
def allreduce():
    dist.all_reduce(flat)
out = {"irecv first": [], "isend first": [], "all-reduce": []}
for _ in range(REPEATS):
    for name, fn in (("irecv first", recv_first), ("isend first", send_first), ("all-reduce", allreduce)):
        for _ in range(2):
            dist.barrier()
            t = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t)
if r == 0:
    print(json.dumps([out]), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="100Mbit", help="the emulated link's rate (default 100Mbit)")
    ap.add_argument("--mb", type=float, default=29.4, help="MB each way per exchange (default 29.4)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the three, two calls each (default 3)")
    args = ap.parse_args(argv)

    from layerplan import units
    from layerplan.runtime import emulate

    try:
        emulate.check_available()
    except emulate.EmulationError as e:
        print(f"skipped: {e}")
        return 0
    numel = int(args.mb * 1e6 / 4)
    code = RANK.replace("NUMEL", str(numel)).replace("REPEATS", str(args.repeats))
    with emulate.running(2, args.rate) as emu:
        res = emulate._rank0_json(emu, code, 2, 29721, 600 + 60 * args.repeats, "the exchange benchmark")[0]
    each_way = 4 * numel
    print(f"2 hosts at {args.rate}, {units.format_bytes(each_way)} each way per exchange")
    for name, times in res.items():
        rates = [each_way * 8 / t / 1e6 for t in times]
        print(f"  {name:12s} median {statistics.median(times):6.3f} s  each call: "
              + " ".join(f"{t:.2f}" for t in times) + f"  (Mbit/s each way: {min(rates):.1f}–{max(rates):.1f})")
    print(json.dumps({"rate": args.rate, "bytes_each_way": each_way, **res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
