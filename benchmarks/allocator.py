"""Freed memory kept in the process (``runtime/allocator.py``) against glibc's defaults, measured in
the same run: a net's training step in one process (one thread, the step validate's ranks take:
zero_grad(set_to_none=True), cross-entropy, backward, SGD with momentum), and a short local run
of the runtime with each setting.

    .venv/bin/python benchmarks/allocator.py [MODEL] [--steps 20] [--strategy stanza] [--json]

Prints per setting the median step, the page faults and the peak memory of the one-process step,
the runtime run's median step, and the ratios defaults / kept. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

STEP = r"""
import json, resource, statistics, sys, time
from layerplan.runtime.allocator import keep_freed_memory
applied = keep_freed_memory()
import torch
from layerplan.netspec import zoo
torch.set_num_threads(1)
torch.manual_seed(0)
module, in_shape = zoo.build(sys.argv[1])
module.train()
opt = torch.optim.SGD(module.parameters(), lr=1e-6, momentum=0.9)
x = torch.randn(int(sys.argv[3]), *in_shape)
y = torch.randint(0, 10, (int(sys.argv[3]),))
times = []
faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(int(sys.argv[2]) + 2):
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(module(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"applied": applied, "step_s": statistics.median(times[2:]),
                  "page_faults_per_step": (ru.ru_minflt - faults0) / len(times), "peak_rss_bytes": ru.ru_maxrss * 1024}))
"""


def one_process(model: str, steps: int, batch: int, keep: bool) -> dict:
    env = {**os.environ, "LAYERPLAN_KEEP_FREED_MEMORY": "1" if keep else "0"}
    out = subprocess.run([sys.executable, "-c", STEP, model, str(steps), str(batch)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def runtime_run(model: str, strategy: str, steps: int, batch: int, keep: bool) -> float:
    from layerplan.runtime.launch import launch_local
    from layerplan.runtime.run_spec import RunSpec
    from layerplan.validate import config_for

    os.environ["LAYERPLAN_KEEP_FREED_MEMORY"] = "1" if keep else "0"  # the ranks' environment
    spec = RunSpec(model=model, strategy=strategy, config=config_for(strategy, 2), batch_size=batch,
                   steps=steps + 2, progress=False)
    return launch_local(spec, quiet=True)["step_time_s"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="alexnet_cifar")
    ap.add_argument("--steps", type=int, default=20, help="steps measured per setting (default 20)")
    ap.add_argument("--batch-size", type=int, default=16, help="samples per step (default 16)")
    ap.add_argument("--strategy", default="stanza", help="the runtime run's strategy, 2 workers (default stanza)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    rows = {}
    for keep in (False, True):
        r = one_process(args.model, args.steps, args.batch_size, keep)
        r["runtime_step_s"] = runtime_run(args.model, args.strategy, args.steps, args.batch_size, keep)
        rows["kept" if keep else "defaults"] = r
    d, k = rows["defaults"], rows["kept"]
    ratios = {"step": d["step_s"] / k["step_s"], "runtime_step": d["runtime_step_s"] / k["runtime_step_s"]}
    if args.json:
        print(json.dumps({"model": args.model, "strategy": args.strategy, **rows, "ratio_defaults_over_kept": ratios}))
        return 0
    print(f"{args.model}, batch {args.batch_size}, one thread; the runtime: {args.strategy} with 2 workers on this machine")
    print(f"{'setting':<10} {'step (ms)':>10} {'page faults/step':>17} {'peak RSS (MB)':>14} {'runtime step (ms)':>18}")
    for name, r in rows.items():
        print(f"{name:<10} {r['step_s'] * 1e3:>10.1f} {r['page_faults_per_step']:>17.0f} {r['peak_rss_bytes'] / 1e6:>14.0f} "
              f"{r['runtime_step_s'] * 1e3:>18.1f}" + ("" if r["applied"] or name == "defaults" else "  (not applied here)"))
    print(f"defaults / kept: step {ratios['step']:.2f}x, runtime step {ratios['runtime_step']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
