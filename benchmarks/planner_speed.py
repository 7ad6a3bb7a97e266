"""Planner speed (issue figures): `plan` over all strategies for 1,024 nodes (target < 1 s) and
Yan's DP for 50 layers × 64 machines (target < 2 s). Prints figures; asserts nothing."""

from __future__ import annotations

import random
import time

from layerplan import hardware
from layerplan.netspec.load import resolve_model
from layerplan.plan import planner, yan


def best_of(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    for model in ("alexnet", "vgg16_cifar", "resnet50"):
        net, _ = resolve_model(model)
        cluster = hardware.cluster("p3.2xlarge", nodes=1024)
        t, ranked = best_of(lambda: planner.rank(net, cluster, 32))
        print(f"plan {model:12s} on 1,024 nodes: {t:.3f} s for {len(ranked)} simulated plans "
              f"(best: {ranked[0].strategy}, {ranked[0].throughput:,.0f} samples/s) — target < 1 s: {'met' if t < 1 else 'MISSED'}")
    rng = random.Random(0)
    layers = [yan.YanLayer(name=f"l{i}", connections=rng.uniform(1e5, 1e9), neurons=rng.uniform(1e2, 1e6),
                           weights=rng.uniform(0, 1e7), dense=rng.random() < 0.3) for i in range(50)]
    costs = yan.YanCosts.from_cluster(hardware.cluster("xeon-e5-2450", nodes=64))
    t, part = best_of(lambda: yan.dp(layers, 64, costs))
    print(f"Yan DP, 50 layers × 64 machines: {t:.3f} s — target < 2 s: {'met' if t < 2 else 'MISSED'}")
    net, _ = resolve_model("yan_imagenet22k")
    t, ranked = best_of(lambda: yan.optimize(net, hardware.cluster("xeon-e5-2450", nodes=64)), repeat=1)
    print(f"Yan optimizer (outer loops over N_ps, N_mr, N_wr + DP) for yan_imagenet22k on 64 machines: {t:.3f} s, "
          f"{len(ranked)} configurations; best N_ps={ranked[0].n_ps} N_mr={ranked[0].n_mr} N_wr={ranked[0].n_wr}")


if __name__ == "__main__":
    main()
