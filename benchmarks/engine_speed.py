"""How fast the cost engine simulates: the planner ranks thousands of configs for 1,024 nodes in
well under a second, so one simulation of a symmetric graph must take well under a millisecond.

    .venv/bin/python benchmarks/engine_speed.py

Prints the median wall time per ``simulate`` call for representative graphs, and a planner-like
sweep (thousands of PS / all-reduce / Stanza configs on 1,024 nodes) with its total time.
"""

from __future__ import annotations

import statistics
import time

from layerplan.cost.engine import Collective, Compute, StepGraph, Transfer, simulate
from layerplan.hardware import cluster

C = cluster("titan-x", nodes=1088)
P = 61.1e6 * 4  # AlexNet fp32


def ps(n_w: int, n_s: int) -> StepGraph:
    shard = P / n_s
    return StepGraph(groups={"worker": n_w, "server": n_s}, samples_per_step=32 * n_w, tasks=(
        Compute(name="fwd_bwd", group="worker", seconds=0.03),
        Transfer(name="push", src="worker", dst="server", bytes_per_flow=shard, pattern="all_to_all", deps=("fwd_bwd",)),
        Compute(name="update", group="server", seconds=0.001, deps=("push",)),
        Transfer(name="pull", src="server", dst="worker", bytes_per_flow=shard, pattern="all_to_all", deps=("update",)),
    ))


def ddp(n: int, buckets: int, scheme: str = "ring") -> StepGraph:
    tasks = [Compute(name="fwd", group="worker", seconds=0.01)]
    prev_b, prev_ar = "fwd", None
    for i in range(buckets):
        tasks.append(Compute(name=f"bwd{i}", group="worker", seconds=0.02 / buckets, deps=(prev_b,)))
        deps = (f"bwd{i}",) if prev_ar is None else (f"bwd{i}", prev_ar)
        tasks.append(Collective(name=f"ar{i}", group="worker", scheme=scheme, bytes=P / buckets, deps=deps))
        prev_b, prev_ar = f"bwd{i}", f"ar{i}"
    tasks.append(Compute(name="update", group="worker", seconds=0.001, deps=(prev_b, prev_ar)))
    return StepGraph(groups={"worker": n}, samples_per_step=32 * n, tasks=tuple(tasks))


def stanza(n_c: int, n_f: int) -> StepGraph:
    a_k = 9216 * 4 * 32
    return StepGraph(groups={"conv": n_c, "fc": n_f}, samples_per_step=32 * n_c, tasks=(
        Compute(name="conv_fwd", group="conv", seconds=0.01),
        Transfer(name="act", src="conv", dst="fc", bytes_per_flow=a_k, pattern="spread", deps=("conv_fwd",)),
        Compute(name="fc", group="fc", seconds=0.002 * n_c / n_f, deps=("act",)),
        Transfer(name="grad", src="fc", dst="conv", bytes_per_flow=a_k, pattern="broadcast", deps=("fc",)),
        Compute(name="conv_bwd", group="conv", seconds=0.02, deps=("grad",)),
        Collective(name="conv_ar", group="conv", scheme="recursive_doubling", bytes=2.47e6 * 4, deps=("conv_bwd",)),
        Collective(name="fc_ar", group="fc", scheme="recursive_doubling", bytes=58.6e6 * 4, deps=("grad",)),
    ))


def omnivore(g: int, iterations: int) -> StepGraph:
    tasks = []
    for j in range(g):
        tasks.append(Compute(name=f"conv{j}", group=f"group{j}", seconds=1.0, deps=(f"prev/fc{j}",)))
        tasks.append(Compute(name=f"fc{j}", group="fc", seconds=0.3, deps=(f"conv{j}",), queue="fc"))
    return StepGraph(groups={f"group{j}": 1024 // g for j in range(g)} | {"fc": 1}, tasks=tuple(tasks), samples_per_step=g,
                     iterations=iterations)


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    cases = [
        ("ps 1,024 workers + 64 servers", ps(1024, 64), 1),
        ("ps 4 workers + 1 server", ps(4, 1), 1),
        ("ring all-reduce 1,024 nodes, 1 bucket", ddp(1024, 1), 1),
        ("ring all-reduce 1,024 nodes, 10 DDP buckets", ddp(1024, 10), 1),
        ("ring all-reduce 1,024 nodes, 40 DDP buckets", ddp(1024, 40), 1),
        ("stanza 1,000 CONV + 24 FC workers", stanza(1000, 24), 1),
        ("omnivore g=8, 20 iterations unrolled", omnivore(8, 20), 20),
        ("omnivore g=32, 20 iterations unrolled", omnivore(32, 20), 20),
    ]
    print(f"{'graph':48s} {'tasks':>6s} {'simulate':>11s}   step time")
    for name, graph, k in cases:
        simulate(graph, C, iterations=k)
        t = median_s(lambda: simulate(graph, C, iterations=k), 50 if k == 1 else 5)
        pred = simulate(graph, C, iterations=k)
        print(f"{name:48s} {len(graph.tasks) * k:6d} {t * 1e3:8.3f} ms   {pred.step_time_s * 1e3:9.2f} ms  ({pred.bottleneck})")

    # planner-like sweep: every (n_w, n_s) PS split, every all-reduce algorithm × bucket count, and
    # every Stanza split of 1,024 nodes
    graphs = [ps(1024 - s, s) for s in range(1, 513)]
    graphs += [ddp(1024, b, a) for a in ("ring", "tree", "butterfly", "recursive_doubling", "one_to_all") for b in (1, 4, 10)]
    graphs += [stanza(1024 - f, f) for f in range(1, 513)]
    t0 = time.perf_counter()
    for g in graphs:
        simulate(g, C)
    total = time.perf_counter() - t0
    print(f"\nsweep: {len(graphs)} configs on 1,024 nodes in {total * 1e3:.1f} ms "
          f"({total / len(graphs) * 1e6:.0f} µs per config)")


if __name__ == "__main__":
    main()
