"""How much compute a shaped link's traffic takes from the cores it shares, on the emulated cluster.

Two compute processes (one thread each: a convolution's forward and backward in a loop, as a CONV
worker's backward runs) keep this machine's cores busy; in the middle of their window two emulated
hosts all-reduce 20 MB buffers over a link shaped to RATE (gloo, one thread each, as DDP's buckets
go). Prints, per rate: the compute loop's pace without traffic and during it, the cores' worth the
traffic took from compute (2 cores × the pace lost), and the ratio of that to the CPU time the two
all-reducing processes account for themselves (the peer: what a per-byte CPU charge measured on an
idle machine sees). Above 1, the traffic costs the compute more than the CPU it is charged: its
threads wake on cores busy with compute and the compute refills its caches after each wake-up.
Also prints the all-reduce's payload rate during the compute against the same all-reduce's on idle
cores (the peer, measured in the same run): below 1, busy cores slow the link itself. Also
prints, per window of WINDOW_SLICE_S, the slower compute process's pace over the two's mean,
without traffic and during it: where the traffic's CPU lands on one process's core rather than
spread over both, it falls during the traffic. Asserts nothing; needs root or an unprivileged user
namespace (skips with the reason otherwise).

    python benchmarks/comm_interference.py [--rates 100Mbit,1Gbit,10Gbit] [--repeats 2]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import time

COMPUTE = r"""
import sys, time, torch
torch.set_num_threads(1)
x = torch.randn(16, 128, 16, 16, requires_grad=True)
conv = torch.nn.Conv2d(128, 128, 3, padding=1)
end, marks = time.time() + float(sys.argv[1]), []
while time.time() < end:
    conv(x).sum().backward()
    marks.append(time.time())
print(" ".join(f"{m:.4f}" for m in marks))
"""

ALLREDUCE = r"""
import datetime, json, os, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
buf = torch.zeros(5_000_000)
start, stop = float(os.environ["T_START"]), float(os.environ["T_STOP"])
while time.time() < start:
    time.sleep(0.01)
n, t0, c0 = 0, time.time(), time.process_time()
while time.time() < stop:
    dist.all_reduce(buf)
    n += 1
t1, cpu = time.time(), time.process_time() - c0
print(json.dumps({"calls": n, "t0": t0, "t1": t1, "bytes": n * buf.numel() * 4, "cpu_s": cpu}))
dist.destroy_process_group()
"""

WINDOW_S, QUIET_S, TRAFFIC_S = 16.0, 7.0, 5.0
WINDOW_SLICE_S = 0.25  # about one DDP bucket's all-reduce at 1 Gbit/s: how long a rank's lag can build


def once(rate: str, port: int, compute: bool = True) -> dict:
    """One window: compute alone, then with the all-reduce, then alone again (``compute`` False:
    the all-reduce alone on idle cores, its payload rate only)."""
    from layerplan.runtime import emulate

    with emulate.running(2, rate) as emu:
        now = time.time()
        start, stop = now + QUIET_S, now + QUIET_S + TRAFFIC_S
        comps = [subprocess.Popen([sys.executable, "-c", COMPUTE, str(WINDOW_S)], stdout=subprocess.PIPE, text=True)
                 for _ in range(2 if compute else 0)]
        ranks = [subprocess.Popen([*emu.exec_prefix(i), sys.executable, "-c", ALLREDUCE], stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, **emulate.host_env(emu, i, 2, port=port),
                                                  "T_START": str(start), "T_STOP": str(stop)})
                 for i in range(2)]
        ar = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in ranks]
        marks = [[float(m) for m in p.communicate(timeout=120)[0].split()] for p in comps]
    if not compute:
        return {"bytes_per_s": ar[0]["bytes"] / (ar[0]["t1"] - ar[0]["t0"])}
    first = max(min(m[0] for m in marks), now) + 0.5  # after the compute processes' start-up
    last = min(m[-1] for m in marks)
    quiet_spans = [(a, b) for a, b in ((first, start), (stop + 0.5, last)) if b > a]  # compute alone: around the traffic

    def passes(ms: list[float], a: float, b: float) -> int:
        return sum(1 for m in ms if a <= m < b)

    def pace_over(spans: list[tuple[float, float]], which: list[list[float]]) -> float:
        """Passes a second of the processes ``which`` together over ``spans``."""
        return sum(passes(ms, a, b) for ms in which for a, b in spans) / sum(b - a for a, b in spans)

    t0, t1 = ar[0]["t0"] + 0.2, ar[0]["t1"]
    quiet = pace_over(quiet_spans, marks)
    busy = pace_over([(t0, t1)], marks)
    lost_cores = 2.0 * (1.0 - busy / quiet)
    alone = [pace_over(quiet_spans, [ms]) for ms in marks]  # each process's own pace alone

    def done(ms: list[float], t: float) -> float:
        """Passes done by time t, counting the pass under way by the share of it elapsed."""
        i = bisect.bisect_right(ms, t)
        if i == 0 or i == len(ms):
            return float(i)
        return i + (t - ms[i - 1]) / (ms[i] - ms[i - 1])

    def slowest(spans: list[tuple[float, float]]) -> float:
        """Per window of WINDOW_SLICE_S in ``spans``: the slower process's pace over the two's mean
        (each against its own pace alone), averaged over the windows (nan: no whole window)."""
        out = []
        for a, b in spans:
            w = a
            while w + WINDOW_SLICE_S <= b:
                r = [(done(ms, w + WINDOW_SLICE_S) - done(ms, w)) / WINDOW_SLICE_S / p for ms, p in zip(marks, alone)]
                if sum(r) > 0:
                    out.append(min(r) / (sum(r) / len(r)))
                w += WINDOW_SLICE_S
        return statistics.fmean(out) if out else float("nan")

    accounted_cores = sum(r["cpu_s"] for r in ar) / (ar[0]["t1"] - ar[0]["t0"])
    return {"quiet_per_s": quiet, "busy_per_s": busy, "lost_cores": lost_cores, "accounted_cores": accounted_cores,
            "slowest_quiet": slowest(quiet_spans), "slowest_busy": slowest([(t0, t1)]),
            "bytes_per_s": ar[0]["bytes"] / (ar[0]["t1"] - ar[0]["t0"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="100Mbit,1Gbit,10Gbit")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from layerplan.runtime import emulate

    con = Console(highlight=False)
    try:
        emulate.check_available()
    except emulate.EmulationError as e:
        con.print(f"skipped: {e}")
        return 0
    table = Table(title="compute taken by a shaped link's all-reduce (2 compute threads on the cores)")
    for col in ("rate", "compute pace alone", "during the all-reduce", "cores taken", "all-reduce's own CPU",
                "taken / own", "slower of the two / mean (alone → traffic)", "all-reduce payload",
                "payload, cores idle", "busy / idle"):
        table.add_column(col, justify="right")
    for rate in args.rates.split(","):
        runs = [once(rate, 29640 + i) for i in range(args.repeats)]
        idle = statistics.median(once(rate, 29660 + i, compute=False)["bytes_per_s"] for i in range(args.repeats))
        med = {k: statistics.median([r[k] for r in runs if r[k] == r[k]] or [float("nan")]) for k in runs[0]}  # nan: no window
        spread = ", ".join(f"{r['lost_cores']:.2f}" for r in runs)
        table.add_row(rate, f"{med['quiet_per_s']:.1f} passes/s", f"{med['busy_per_s']:.1f} passes/s ({med['busy_per_s'] / med['quiet_per_s']:.2f}×)",
                      f"{med['lost_cores']:.2f} cores ({spread})", f"{med['accounted_cores']:.2f} cores",
                      f"{med['lost_cores'] / med['accounted_cores']:.1f}×" if med["accounted_cores"] > 0 else "—",
                      f"{med['slowest_quiet']:.2f} → {med['slowest_busy']:.2f}",
                      f"{med['bytes_per_s'] / 1e6:.1f} MB/s a rank", f"{idle / 1e6:.1f} MB/s",
                      f"{med['bytes_per_s'] / idle:.3f}×")
    con.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
