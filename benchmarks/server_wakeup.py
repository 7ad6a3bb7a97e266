"""How much of the cores a server that sleeps between requests gets beside ranks that never sleep.

Omnivore's merged FC server and conv model server (``strategies/groups.py``) wait for a request,
compute, answer and wait again, while the conv machines compute without pause; with four groups
of one machine, six ranks share the emulated cluster's 2 cores. The engine's mean field
(``StepGraph.mean_field_cores``) gives every busy thread an equal share of the cores, so a server
beside K busy ranks on C cores computes (K + 1) / C times its time alone (K + 1 > C). Linux's
scheduler runs the runnable thread with the least CPU time so far (EEVDF since 6.6, CFS before
it): a thread that wakes from a wait has fallen behind, and runs ahead of the ones that never
stopped, until it has caught up.

One server process (one thread) answers requests from this process: each request, a fixed amount
of matrix products (``--work`` ms alone), then the answer; the next request ``--gap`` ms after the
answer. Beside it K busy processes (one thread each) multiply matrices without pause. Prints, for
each K: the server's time per request against its time alone, the equal share's stretch (K + 1
threads over the cores' capacity, measured in the same run as C busy processes at once), and the
busy processes' rate against theirs alone (their peer, measured in the same run). Asserts nothing.

    python benchmarks/server_wakeup.py [--busy 0,1,2,4] [--work 20] [--gap 20] [--window 6]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

SIZE = 256  # a 256x256 product: 34 MFLOP, about 0.5 ms on one core here


def _setup() -> None:
    import torch

    torch.set_num_threads(1)


def _server(conn, reps: int) -> None:
    import torch

    _setup()
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        for _ in range(reps):
            a @ b
        conn.send(time.perf_counter())


def _busy(ready, go, stop, out) -> None:
    """Multiply matrices from ``go`` to ``stop``; put the products per second on ``out``."""
    import torch

    _setup()
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    a @ b
    ready.put(os.getpid())
    go.wait()
    n = 0
    t0 = time.perf_counter()
    while not stop.is_set():
        for _ in range(20):
            a @ b
        n += 20
    out.put(n / (time.perf_counter() - t0))


def with_busy(ctx, n: int, during):
    """Run ``during()`` while ``n`` busy processes multiply matrices (all started, their imports
    done, before it begins); returns what it returned and each busy process's products per second."""
    ready, out, go, stop = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_busy, args=(ready, go, stop, out), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get()
    go.set()
    try:
        result = during()
    finally:
        stop.set()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return result, rates


def busy_rates(ctx, n: int, window_s: float) -> list[float]:
    """Products per second of each of ``n`` busy processes with nothing else beside them."""
    return with_busy(ctx, n, lambda: time.sleep(window_s))[1]


def _reps_for(work_s: float) -> int:
    import torch

    _setup()
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    for _ in range(50):
        a @ b
    t0 = time.perf_counter()
    for _ in range(200):
        a @ b
    return max(1, round(work_s / ((time.perf_counter() - t0) / 200)))


def measure(busy: int, reps: int, gap_s: float, window_s: float, ctx) -> dict:
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_server, args=(child, reps), daemon=True)
    server.start()
    parent.send("warm")
    parent.recv()

    def serve() -> list[float]:
        time.sleep(0.3)
        times = []
        end = time.perf_counter() + window_s
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            parent.send("go")
            parent.recv()
            times.append(time.perf_counter() - t0)
            time.sleep(gap_s)
        return times

    times, rates = with_busy(ctx, busy, serve)
    parent.send(None)
    server.join()
    return {"busy": busy, "requests": len(times), "request_s": statistics.median(times),
            "busy_rate": statistics.mean(rates) if rates else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", default="0,1,2,4", help="busy processes beside the server, per window")
    ap.add_argument("--work", type=float, default=20.0, help="the server's work per request, ms alone")
    ap.add_argument("--gap", type=float, default=20.0, help="ms from an answer to the next request")
    ap.add_argument("--window", type=float, default=6.0, help="seconds per window")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    ctx = mp.get_context("spawn")
    reps = _reps_for(args.work / 1e3)
    window = min(3.0, args.window)
    alone_rate = busy_rates(ctx, 1, window)[0]
    # the cores' capacity: ``cores`` busy processes at once, in alone-cores (the engine's
    # shared_core_capacity; the mean field gives each of n > cores busy threads capacity / n)
    capacity = sum(busy_rates(ctx, cores, window)) / alone_rate
    rows = [measure(int(k), reps, args.gap / 1e3, args.window, ctx) for k in args.busy.split(",")]
    base = next((r["request_s"] for r in rows if r["busy"] == 0), None)
    if base is None:
        base = measure(0, reps, args.gap / 1e3, args.window, ctx)["request_s"]
    for r in rows:
        r["stretch"] = r["request_s"] / base
        n = r["busy"] + 1
        r["equal_share_stretch"] = 1.0 if n < cores else n / capacity
        r["busy_rate_vs_alone"] = r["busy_rate"] / alone_rate if r["busy_rate"] else None
    if args.json:
        print(json.dumps({"cores": cores, "capacity": capacity, "work_ms": args.work, "gap_ms": args.gap, "rows": rows},
                         indent=1))
        return 0
    print(f"{cores} cores; the server's {args.work:.0f} ms of work per request took {base * 1e3:.1f} ms alone, "
          f"the next request {args.gap:.0f} ms after each answer; {cores} busy processes at once ran "
          f"{capacity:.2f} alone-cores' worth (the capacity)")
    print(f"{'busy':>4}  {'request':>9}  {'stretch':>7}  {'equal share':>11}  {'busy rate vs alone':>18}")
    print("  (equal share: the stretch the mean field gives, threads / capacity once they fill the cores)")
    for r in rows:
        vs = f"{r['busy_rate_vs_alone']:.2f}" if r["busy_rate_vs_alone"] else "-"
        print(f"{r['busy']:>4}  {r['request_s'] * 1e3:>7.1f}ms  {r['stretch']:>6.2f}x  {r['equal_share_stretch']:>10.2f}x  "
              f"{vs:>18}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
