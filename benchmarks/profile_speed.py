"""How long resolving + analysing each zoo model takes (build on meta, fx trace, one counted forward,
two counted backward passes).

    python benchmarks/profile_speed.py            # every zoo model, then resnet152 cold
    python benchmarks/profile_speed.py alexnet    # just these

Each model is timed in this process (imports already paid, first-call warm-up excluded by a
`debug` run) as the best of --repeat runs with the in-process cache cleared; then resnet152 is timed
cold in a fresh interpreter, imports included, against the 3 s target, and `layerplan profile
resnet152` end to end, first and repeat runs (the zoo analysis cache).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

TARGET_S = 3.0

COLD = """
import time
t0 = time.perf_counter()
import torch, torchvision  # noqa: F401
t1 = time.perf_counter()
from layerplan.netspec.load import resolve_model
net, _ = resolve_model({name!r})
t2 = time.perf_counter()
print(f"{{t2 - t0:.3f}} {{t1 - t0:.3f}} {{t2 - t1:.3f}}")
"""


def warm(names: list[str], repeat: int) -> None:
    from layerplan import units
    from layerplan.netspec import load

    load.resolve_model("debug")  # first FlopCounterMode use imports torch._dynamo
    print(f"{'model':18s} {'time':>9s} {'layers':>7s} {'params':>9s} {'fwd/img':>12s} {'fwd+bwd/img':>12s}  boundary")
    for name in names:
        best = float("inf")
        for _ in range(repeat):
            load._resolve_cached.cache_clear()
            t = time.perf_counter()
            net, _ = load.resolve_model(name)
            best = min(best, time.perf_counter() - t)
        print(f"{name:18s} {best:8.3f}s {len(net.layers):7d} {units.format_count(net.total_params):>9s} "
              f"{units.format_flops(net.fwd_flops):>12s} {units.format_flops(net.fwd_flops + net.bwd_flops):>12s}  "
              f"{net.boundary}")


def cold(name: str) -> None:
    out = subprocess.run([sys.executable, "-c", COLD.format(name=name)], capture_output=True, text=True, check=True)
    total, imports, analysis = (float(v) for v in out.stdout.split())
    verdict = "within" if total <= TARGET_S else "over"
    print(f"\n{name} cold, fresh process: {total:.2f} s = imports of torch+torchvision {imports:.2f} s + "
          f"resolve_model {analysis:.2f} s ({verdict} the {TARGET_S:.0f} s target; "
          f"{total / TARGET_S:.2f}× of it)")


def cli_wall(name: str) -> None:
    """`layerplan profile NAME` as a user runs it: the first time (empty cache: imports + analysis)
    and again (the zoo analysis comes from the on-disk cache; torch is not imported)."""
    import os
    import tempfile
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("layerplan"))
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if k != "LAYERPLAN_NO_CACHE"} | {"LAYERPLAN_CACHE_DIR": d}
        times = []
        for _ in range(3):
            t = time.perf_counter()
            subprocess.run([exe, "profile", name, "--json"], env=env, capture_output=True, check=True)
            times.append(time.perf_counter() - t)
    first, again = times[0], min(times[1:])
    print(f"`layerplan profile {name}` wall: first run {first:.2f} s ({'within' if first <= TARGET_S else 'over'} "
          f"{TARGET_S:.0f} s), repeat runs {again:.2f} s (cached analysis; "
          f"{'within' if again <= TARGET_S else 'over'} {TARGET_S:.0f} s)")


def main() -> None:
    from layerplan.netspec.zoo import ZOO

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="zoo models (default: all)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    import os

    os.environ["LAYERPLAN_NO_CACHE"] = "1"  # time the analysis itself (the subprocesses inherit it)
    warm(args.names or list(ZOO), args.repeat)
    cold("resnet152")
    cli_wall("resnet152")


if __name__ == "__main__":
    main()
