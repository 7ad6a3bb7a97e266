"""Calibrate: measure this machine (or an emulated cluster) and fit the hardware figures the cost
engine uses — ``DeviceSpec.compute_efficiency``, ``LinkSpec.latency_s`` and ``efficiency``.

``calibrate(on="local"|"emulated", name=...)`` runs short micro-benchmarks in child processes
(this process imports no torch) and returns a JSON-able result; ``to_cluster(result)`` turns it
into a ``hardware.ClusterSpec`` and ``save(result, path)`` writes that as a cluster file (YAML or
JSON by extension) that ``hardware.load_cluster`` / ``--cluster FILE`` read back.

What is measured, each ``repeats`` times (every figure: median and spread = (max − min) / median):

- **compute**: forward + backward of every distinct Conv2d / Linear layer of ``alexnet_cifar`` and
  ``vgg16_cifar`` (3×32×32 input) at batch 16 and 64 (32 when ``quick``), FLOPs counted by
  ``torch.utils.flop_counter.FlopCounterMode``, one intra-op thread per process — first one
  process alone (per-thread FLOP/s), then one process per core at once (the shared-core FLOP/s:
  ranks of a local or emulated run share this machine's cores). Layers are weighted by how often
  the two nets use them. ``compute_efficiency`` is fitted so that the engine's PALEO layer time
  (``cost.compute.layer_time_s``: memory reads/writes + FLOPs / (peak · efficiency)) with the
  ``cpu-core`` preset's peak and memory bandwidth reproduces the measured single-thread time.
- **links**: gloo point-to-point between two ranks (1 KiB … 16 MiB; rank 0 sends, rank 1 answers
  with 4 bytes; per size the lower quartile of many ping-pongs) fitted to
  ``t = 2·latency + bytes / payload_rate``, and all-reduce of one tensor
  over 2 and 3 ranks (bus bandwidth as nccl-tests defines it). ``local``: ranks over loopback;
  ``emulated``: ranks in hosts 0, 1 (and 2) of the named emulated cluster, so
  ``efficiency`` = payload rate / the cluster's configured line rate.
- **ring rounds**: a small all-reduce among as many processes as cores and twice as many
  (``oversubscribed_wait_s``).
- **messages on oversubscribed cores** (``measure_message_cpu``): twice as many ranks as cores in
  pairs, each a burst of compute then a round trip with its partner: the CPU a message costs at
  each end beyond its bytes (``oversubscribed_message_cpu_s``).
- **training steps in lockstep** (``measure_synchronized_steps``): whole training steps of the
  profiled nets (else alexnet_cifar, vgg16_cifar, resnet_cifar) alone, then one process per core
  and two per core with a barrier after every step: the cores' worth distributed steps get
  (``shared_core_capacity``, ``oversubscribed_core_capacity``).

Each section runs between probes of every core's speed (``_prober``) and is measured once more
where other work on the machine disturbed it (``disturbance``: the probes, the hypervisor's steal,
its own repeats' disagreement), the steadier reading kept; ``steadiness`` in the result says which.

The CLI (``layerplan calibrate``) is a thin wrapper; the worker processes are this module:
``python -m layerplan.calibrate compute|link|profile|rounds|messages|steps --config JSON``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from layerplan import hardware, units
from layerplan.errors import ConfigError, LayerplanError

FORMAT_VERSION = 1
DEVICE_PRESET = "cpu-core"
NETS = ("alexnet_cifar", "vgg16_cifar")
P2P_SIZES_BYTES = tuple(4**k * 1024 for k in range(8))  # 1 KiB, 4 KiB, ... 16 MiB
ACK_BYTES = 4
MAX_ALLREDUCE_BYTES = 16 * 2**20
WHOLE_PASS_CALLS = 7  # calls of each whole pass the profile takes the median of (and a time window)
SMALL_ALLREDUCE_BYTES = 4096
"""An all-reduce this small is all latency: its time over the ring's rounds (PALEO §2: 2(n−1)) is a round's."""
SMALL_ALLREDUCE_ITERS = 100
WORKER_TIMEOUT_S = 180.0  # no line from a benchmark process for this long: it is stuck


class CalibrationError(LayerplanError):
    """A benchmark could not run or gave no usable figure."""


# ---- fits (pure) -----------------------------------------------------------------------------
def fit_link(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """(intercept_s, bandwidth_bytes_per_s) of ``t = intercept + bytes / bandwidth`` — Hockney's
    model: PALEO §2's ``T = |D| / B`` plus a per-message latency. The slope comes from a least-squares
    line through the large messages (≥ 1/64 of the largest: a token bucket's burst or TCP's slow
    start no longer shows there), the intercept from the latency-bound ones (``bytes / bandwidth``
    under a tenth of the time; else the smallest): the median of ``t − bytes / bandwidth``. Exact on
    exact data; a negative intercept (noise) becomes 0."""
    import numpy as np

    n = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if n.shape != t.shape or n.size < 2 or len(set(n.tolist())) < 2:
        raise CalibrationError("a link fit needs at least two different message sizes")
    if not (np.all(t > 0) and np.all(np.isfinite(t)) and np.all(n > 0)):
        raise CalibrationError(f"a link fit needs positive sizes and times, got {n.tolist()} B, {t.tolist()} s")
    big = n >= n.max() / 64
    if len(set(n[big].tolist())) < 2:
        big = n >= np.sort(np.unique(n))[-2]  # at least the two largest sizes
    slope = np.polyfit(n[big], t[big], 1)[0]
    if slope <= 0:
        raise CalibrationError("link times do not grow with the message size: no bandwidth to fit")
    bound = n * slope < 0.1 * t
    if not bound.any():
        bound = n == n.min()
    intercept = float(np.median(t[bound] - n[bound] * slope))
    return max(0.0, intercept), float(1.0 / slope)


def lower_quartile(values: Sequence[float]) -> float:
    """The 25th percentile (linear interpolation): a ping-pong is slowed, never sped up, when another
    process holds the core its peer must wake on, so the fast side of the spread is the link's."""
    vals = sorted(values)
    if not vals:
        raise CalibrationError("no measurement to summarise")
    pos = 0.25 * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def bus_bytes_per_s(size_bytes: float, ranks: int, time_s: float) -> float:
    """All-reduce bus bandwidth: ``size · 2(n−1)/n / t`` (nccl-tests PERFORMANCE.md, busBw), the
    per-rank traffic of a ring all-reduce per second — comparable with a point-to-point rate."""
    return size_bytes * 2 * (ranks - 1) / ranks / time_s


def layer_spec(layer: dict):
    """The ``LayerSpec`` of one benchmarked layer (fields as the compute worker reports them)."""
    from layerplan.netspec.spec import LayerSpec

    b = layer["batch"]
    return LayerSpec(name=layer["key"], kind=layer["kind"], op=layer["op"], parents=() if layer["first"] else ("input",),
                     out_shape=(layer["out_bytes"] // 4,), params=layer["param_bytes"] // 4,
                     param_bytes=layer["param_bytes"], out_bytes=layer["out_bytes"],
                     fwd_flops=layer["fwd_flops"] // b, bwd_flops=(layer["flops"] - layer["fwd_flops"]) // b)


def engine_time_s(layers: Iterable[dict], device: hardware.DeviceSpec) -> tuple[float, float]:
    """(time, FLOPs) of forward + backward of ``layers`` (each × its ``count``) as the engine
    charges them on ``device`` (PALEO §3.1.1 eq.1 via cost.compute.layer_time_s)."""
    from layerplan.cost.compute import layer_time_s

    total_s = total_flops = 0.0
    for layer in layers:
        spec = layer_spec(layer)
        for direction in ("fwd", "bwd"):
            total_s += layer["count"] * layer_time_s(spec, device, layer["batch"], direction=direction,
                                                     in_bytes=layer["in_bytes"])
        total_flops += layer["count"] * layer["flops"]
    return total_s, total_flops


def fit_compute_efficiency(layers: Sequence[dict], times_s: dict[str, float], device: hardware.DeviceSpec) -> float:
    """The ``compute_efficiency`` with which the engine's layer times on ``device`` add up to the
    measured ones: T = M + F / (peak · e), M = the memory terms (PALEO §3.1.1 eq.1), so
    e = F / (peak · (T − M)). ``times_s``: measured seconds per forward + backward, by layer key.
    Above 1 when the preset's peak is below what was measured (``to_cluster`` then raises the peak)."""
    measured = sum(layer["count"] * times_s[layer["key"]] for layer in layers)
    ideal = replace(device, compute_efficiency=1.0)
    t1, flops = engine_time_s(layers, ideal)
    memory_s = t1 - flops / device.peak_flops_per_s
    if measured <= memory_s:
        raise CalibrationError(f"measured layers ran in {measured:.4g} s, faster than the preset's memory bandwidth "
                               f"allows ({memory_s:.4g} s): the {device.name!r} preset does not describe this machine")
    return flops / (device.peak_flops_per_s * (measured - memory_s))


def spread(values: Sequence[float]) -> dict:
    """{median, spread = (max − min) / median, values}."""
    vals = [float(v) for v in values]
    if not vals:
        raise CalibrationError("no measurement to summarise")
    med = statistics.median(vals)
    return {"median": med, "spread": (max(vals) - min(vals)) / med if med else 0.0, "values": vals}


# ---- the benchmark processes -------------------------------------------------------------------
class _Procs:
    """Benchmark child processes speaking JSON lines on stdout; killed (by PID) on any exit."""

    def __init__(self, argvs: list[list[str]], envs: list[dict], log_dir: Path):
        self.log_dir = log_dir
        self.lines: queue.Queue = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        self.finished: set[int] = set()
        self.pending: list[tuple[int, dict]] = []
        self.logs = []
        try:
            for i, (argv, env) in enumerate(zip(argvs, envs)):
                log = open(log_dir / f"proc{i}.log", "wb")
                self.logs.append(log)
                p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
                self.procs.append(p)
                threading.Thread(target=self._read, args=(i, p), daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _read(self, i: int, p: subprocess.Popen) -> None:
        for line in p.stdout:
            if line.startswith("{"):
                try:
                    self.lines.put((i, json.loads(line)))
                except json.JSONDecodeError:
                    pass
        self.lines.put((i, None))  # EOF

    def next(self, timeout_s: float = WORKER_TIMEOUT_S) -> tuple[int, dict]:
        """The next message of any process; a process that ends before saying "done" is an error."""
        if self.pending:
            return self.pending.pop(0)
        while True:
            try:
                i, msg = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                raise CalibrationError(f"a benchmark process was silent for {timeout_s:.0f} s; killed it "
                                       f"(logs in {self.log_dir})") from None
            if msg is not None:
                if msg.get("event") == "done":
                    self.finished.add(i)
                return i, msg
            if i in self.finished:
                continue
            code = self.procs[i].wait()
            raise CalibrationError(f"benchmark process {i} exited with code {code} before it finished "
                                   f"({self._last_line(i)}); logs in {self.log_dir}")

    def expect(self, event: str, who: Iterable[int] | int) -> dict[int, dict]:
        """One ``event`` message from each process in ``who`` (or from the first ``who``); every
        other message stays queued for a later call, in order."""
        want = set(range(who)) if isinstance(who, int) else set(who)
        got: dict[int, dict] = {}
        later = []
        try:
            while set(got) != want:
                i, msg = self.next()
                if msg.get("event") == event and i in want and i not in got:
                    got[i] = msg
                else:
                    later.append((i, msg))
        finally:
            self.pending = later + self.pending
        return got

    def send(self, text: str, who: Iterable[int] | None = None) -> None:
        """A line to every process (or to those in ``who``)."""
        for i in range(len(self.procs)) if who is None else who:
            self.procs[i].stdin.write(text + "\n")
            self.procs[i].stdin.flush()

    def _last_line(self, i: int) -> str:
        try:
            lines = [ln for ln in (self.log_dir / f"proc{i}.log").read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        return lines[-1][:300] if lines else "no output"

    def close(self) -> None:
        from layerplan.runtime.launch import _kill

        _kill({i: p for i, p in enumerate(self.procs)})
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:  # a dead child's pipe
                pass
        for f in self.logs:
            f.close()


def _worker_argv(kind: str, cfg: dict) -> list[str]:
    return [sys.executable, "-m", "layerplan.calibrate", kind, "--config", json.dumps(cfg)]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _base_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    src = str(Path(__file__).resolve().parents[1])  # a source checkout runs without installing
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run_compute(processes: int, cfg: dict, log_dir: Path, advance
                 ) -> tuple[list[dict], list[list[dict[str, float]]], list[list[dict[str, float]]],
                            tuple[float, list[list[float]]]]:
    """Layers; per repeat, process 0's seconds per forward+backward by layer key alone, then every
    process's with all running at once; process 0's update memory bandwidth (at 32 MiB, and by
    size), alone, before the repeats and after them, the higher of the two at each size. Alone and
    shared alternate repeat by repeat on the same processes, so a drift of the machine's speed
    (which moves both) does not pass for contention; all processes start a shared repeat together (a
    "go" line), so they really share the cores."""
    procs = _Procs([_worker_argv("compute", cfg)] * processes, [_base_env()] * processes, log_dir)

    def update_curve() -> tuple[list[list[float]], list[list[float]]]:
        procs.send("update", [0])
        got = procs.expect("update", [0])[0]
        return got["update_curve"], got["sum_curve"]

    try:
        layers = procs.expect("ready", processes)[0]["layers"]
        first = update_curve()
        alone, shared = [], []
        for _ in range(cfg["repeats"]):
            procs.send("go", [0])
            alone.append([procs.expect("repeat", [0])[0]["time_s"]])
            advance()
            procs.send("go")
            got = procs.expect("repeat", processes)
            shared.append([got[i]["time_s"] for i in range(processes)])
            advance()
        # measured while the other processes build their layers, a 128 MiB update read 22 GB/s in
        # one calibration against 34-39 in eight others: alone, twice, the higher
        curve, sums = ([[b, max(r0, r1)] for (b, r0), (_, r1) in zip(c0, c1)] for c0, c1 in zip(first, update_curve()))
        procs.send("stop")
        procs.expect("done", processes)
        return layers, alone, shared, (next(r for b, r in curve if b == 4 * UPDATE_PARAMS), curve, sums)
    finally:
        procs.close()


def _flops_per_s(layers: list[dict], times: dict[str, float], kind: str | None = None) -> float:
    sel = [layer for layer in layers if kind is None or layer["kind"] == kind]
    return sum(lyr["count"] * lyr["flops"] for lyr in sel) / sum(lyr["count"] * times[lyr["key"]] for lyr in sel)


def compute_config(repeats: int = 3, quick: bool = False) -> dict:
    """What ``measure_compute`` runs: nets, batches, timing window per layer, repeats."""
    return {"nets": list(NETS), "batches": [32] if quick else [16, 64], "repeats": repeats,
            "window_s": 0.05 if quick else 0.2, "min_iters": 1 if quick else 2}


def link_config(repeats: int = 3, quick: bool = False, sizes: Sequence[int] | None = None) -> dict:
    """What ``measure_links`` runs: message sizes, timing window per size, repeats."""
    sizes = list(sizes or P2P_SIZES_BYTES)
    if len(set(sizes)) < 2 or any(not isinstance(n, int) or n < 4 or n % 4 for n in sizes):
        raise ConfigError(f"link sizes must be at least two different multiples of 4 bytes, got {sizes}")
    return {"sizes": sizes, "repeats": repeats, "window_s": 0.2 if quick else 0.3, "min_iters": 2 if quick else 3,
            "allreduce_iters": 32, "timeout_s": 60.0}


def measure_compute(repeats: int = 3, quick: bool = False, *, cfg: dict | None = None, log_dir: str | Path | None = None,
                    advance=None, processes: int | None = None) -> dict:
    """The compute part of ``calibrate``: FLOP/s of one process alone, then of ``processes``
    (default: one per core) at once; the fitted ``compute_efficiency``. ``advance()`` is called
    after every repeat of either (2 · repeats calls)."""
    cfg = cfg or compute_config(repeats, quick)
    cores = processes or _cores()
    with _log_dir(log_dir) as d:
        return _compute_section(cfg, d, advance or (lambda: None), cores)


def _compute_section(cfg: dict, log_dir: Path, advance, cores: int) -> dict:
    (log_dir / "compute").mkdir(exist_ok=True)
    layers, alone, shared, (update_bw, update_curve, sum_curve) = _run_compute(cores, cfg, log_dir / "compute", advance)
    # the memory terms of the fit (PALEO §3.1.1 R, W) at this machine's measured bandwidth
    # efficiencies fitted as PALEO's eq.1 has them (its C = FLOPs / (peak · PPP)): the preset's
    # kernel costs are its stand-in for what a calibration measures
    device = replace(hardware.DEVICES[DEVICE_PRESET], mem_bandwidth_bytes_per_s=update_bw, kernel_costs=())
    per_thread = [_flops_per_s(layers, rep[0]) for rep in alone]
    shared_total = [sum(_flops_per_s(layers, t) for t in rep) for rep in shared]
    by_layer = {layer["key"]: spread([rep[0][layer["key"]] for rep in alone]) for layer in layers}
    out = {
        "device_preset": DEVICE_PRESET,
        "peak_flops_per_s": device.peak_flops_per_s,
        "nets": list(cfg["nets"]),
        "batches": list(cfg["batches"]),
        "threads_per_process": 1,
        "mem_bandwidth_bytes_per_s": update_bw,
        "update_bandwidth": update_curve,
        "sum_bandwidth": sum_curve,
        "per_thread_flops_per_s": spread(per_thread),
        "per_thread_conv_flops_per_s": spread([_flops_per_s(layers, rep[0], "conv") for rep in alone]),
        "per_thread_linear_flops_per_s": spread([_flops_per_s(layers, rep[0], "fc") for rep in alone]),
        "shared_processes": cores,
        "shared_flops_per_s": spread(shared_total),
        "shared_per_process_flops_per_s": spread([s / cores for s in shared_total]),
        "share_of_peak_per_thread": spread([f / device.peak_flops_per_s for f in per_thread]),
        # this core's own nominal peak (its FLOP a cycle × its clock, /proc/cpuinfo), as Omnivore's
        # single-device study sets achieved FLOP/s against the device's peak
        "this_cpu_peak_flops_per_s": getattr(hardware.this_cpu(), "peak_flops_per_s", None),
        "share_of_peak_shared": spread([s / cores / device.peak_flops_per_s for s in shared_total]),
        "effective_cores": spread([s / f for s, f in zip(shared_total, per_thread)]),
        "compute_efficiency": spread([fit_compute_efficiency(layers, rep[0], device) for rep in alone]),
        # per layer type (PALEO §3.3): convolutions, and fully connected layers (DeviceSpec.fc_efficiency)
        "conv_efficiency": spread([fit_compute_efficiency([x for x in layers if x["kind"] == "conv"], rep[0], device)
                                   for rep in alone]),
        "fc_efficiency": spread([fit_compute_efficiency([x for x in layers if x["kind"] == "fc"], rep[0], device)
                                 for rep in alone]),
        "layers": [{**layer, "time_s": by_layer[layer["key"]]["median"], "time_spread": by_layer[layer["key"]]["spread"],
                    "flops_per_s": layer["flops"] / by_layer[layer["key"]]["median"]} for layer in layers],
    }
    return out


def measure_links(on: str = "local", name: str = "default", repeats: int = 3, quick: bool = False, *,
                  sizes: Sequence[int] | None = None, ranks: int = 3, log_dir: str | Path | None = None,
                  advance=None) -> dict:
    """The link part of ``calibrate``: gloo point-to-point between ranks 0 and 1 (latency and
    payload rate fitted per repeat) and all-reduce over 2..``ranks`` ranks, over loopback
    (``local``) or between hosts of the emulated cluster ``name``. ``advance()`` after each repeat."""
    if on not in ("local", "emulated"):
        raise ConfigError(f"calibrate on 'local' or 'emulated', got {on!r}")
    if not isinstance(ranks, int) or ranks < 2:
        raise ConfigError(f"link calibration needs at least 2 ranks, got {ranks!r}")
    cfg = link_config(repeats, quick, sizes)
    with _log_dir(log_dir) as d:
        return _link_section(on, name, cfg, d, advance or (lambda: None), ranks)


def round_ranks(cores: int) -> list[int]:
    """The rank counts ``measure_rounds`` runs: as many as the cores (at least 2) and twice as
    many, on machines of up to 8 cores (beyond, the emulation's few hosts never outnumber the
    cores). One more rank than cores is bimodal here (3 on 2 cores: 0.2 or 0.7 ms a round from one
    run to the next); twice as many is steady."""
    if cores > 8:
        return []
    return sorted({max(2, cores), 2 * cores})


def measure_rounds(cores: int, repeats: int, log_dir: Path) -> dict:
    """A ring all-reduce of a few bytes among n processes over loopback, for each n of
    ``round_ranks``: all latency, its time over its 2(n−1) rounds is a round's. With more ranks
    than cores a round waits for its receiver to get a core (here, 2 vCPUs: 0.2 ms a round with 2
    ranks, 0.7-0.8 ms with 4). ``oversubscribed_wait_s``: the round with twice as many ranks as
    cores less the round with as many (``oversubscribed_wait``; 0 when not measured)."""
    from layerplan.cost.collectives import collective_cost
    from layerplan.runtime.launch import free_port

    out: dict[str, Any] = {"bytes": SMALL_ALLREDUCE_BYTES, "round_s": {}}
    for n in round_ranks(cores):
        envs = _loopback_envs(n, free_port())
        (log_dir / str(n)).mkdir(exist_ok=True)
        cfg = {"repeats": repeats, "iters": SMALL_ALLREDUCE_ITERS, "timeout_s": 60.0}
        procs = _Procs([_worker_argv("rounds", cfg)] * n, envs, log_dir / str(n))
        try:
            times = procs.expect("rounds", [0])[0]["time_s"]
            procs.expect("done", n)
        finally:
            procs.close()
        rounds = collective_cost("ring", SMALL_ALLREDUCE_BYTES, n).rounds
        out["round_s"][str(n)] = spread([t / rounds for t in times])
    out["oversubscribed_wait_s"] = oversubscribed_wait(out["round_s"], cores)
    return out


def oversubscribed_wait(round_s: dict, cores: int) -> float:
    """A ring round with more ranks than cores (their repeats' median: waiting for a core is what
    is measured) less the round with as many ranks as cores, the least of its repeats: with one
    rank a core no rank waits for one, so other work on the machine can only add to it. Three
    validate calibrations here read 2-rank rounds of 1.75, 0.25 and 1.37 ms; 0.23, 0.22 and 0.29
    ms; 0.71, 0.36 and 0.39 ms — the medians 1.37 ms above the 0.79 ms of 4 ranks, the least
    0.22-0.36 ms each time."""
    base = round_s.get(str(max(2, cores)))
    over = [row["median"] for k, row in round_s.items() if int(k) > cores]
    return max(0.0, statistics.fmean(over) - min(base["values"])) if base and over else 0.0


MESSAGE_ROUNDTRIPS = 30
"""Round trips each pair of ``measure_message_cpu``'s ranks makes per repeat (after one warm-up repeat)."""
MESSAGE_REPEATS = 6
"""``measure_message_cpu`` repeats at least this often: a repeat's figure moves by ±50% here; the
result (the geometric mean over 4 ranks × 6 repeats) varied from call to call with a coefficient
of variation of 0.13 over ten calls (3 repeats: 0.18)."""
MESSAGE_FLOOR_S = 1e-6
"""A rank's figure of a repeat is at least this (a microsecond) before its logarithm is taken."""
MESSAGE_BURST_MATMULS = 75
"""Products of two 256×256 matrices each rank computes before each round trip: 35 ms here, the
compute of resnet_cifar's step at batch 16 between its messages. The figure depends on it: the
median over ranks read 1.0-1.4 ms an end after bursts of 20 ms, 0.5-1 ms after 35 ms."""


def measure_message_cpu(cores: int, repeats: int, log_dir: Path) -> dict:
    """The CPU a point-to-point message costs at each end on oversubscribed cores
    (``ClusterSpec.oversubscribed_message_cpu_s``): twice as many ranks as cores over loopback, in
    pairs, each rank a burst of compute then a round trip of a small message with its partner —
    the pattern of a training step's ranks. A rank's CPU time beyond its bursts' over its round
    trips, halved (a round trip is one send and one receive at each end), is its figure of a
    repeat; the result is the geometric mean over ranks and repeats. With the cores free a message costs
    next to nothing (0.05 ms an end here); with each core shared by two ranks, a rank blocks while
    its partner waits for a core and pays on waking (0.1-3 ms an end here, one rank and repeat to
    the next; their geometric mean 0.45-0.84 ms over ten calls). Not measured (0) on machines of over 8 cores, as ``round_ranks``."""
    from layerplan.runtime.launch import free_port

    if cores > 8:
        return {"ranks": 0, "oversubscribed_message_cpu_s": 0.0}
    n, repeats = 2 * cores, max(repeats, MESSAGE_REPEATS)
    cfg = {"repeats": repeats, "roundtrips": MESSAGE_ROUNDTRIPS, "burst": MESSAGE_BURST_MATMULS, "timeout_s": 60.0}
    procs = _Procs([_worker_argv("messages", cfg)] * n, _loopback_envs(n, free_port()), log_dir)
    try:
        got = procs.expect("messages", n)
        procs.expect("done", n)
    finally:
        procs.close()
    # each rank's figure of each repeat, their geometric mean: the figures spread over a decade
    # (0.1-3 ms in one call: a rank preempted in the middle of its waits reads several times its
    # partner), and their median sits now in the low cluster, now in the high one (0.40-1.03 ms over
    # ten calls; the geometric mean 0.45-0.84 ms)
    values = [v for i in range(n) for v in got[i]["cpu_s_per_end"]]
    row = spread(values)
    row["geometric_mean"] = math.exp(statistics.fmean(math.log(max(v, MESSAGE_FLOOR_S)) for v in values))
    return {"ranks": n, "burst_cpu_s": statistics.fmean(got[i]["burst_cpu_s"] for i in range(n)),
            "cpu_s_per_end": row, "oversubscribed_message_cpu_s": row["geometric_mean"]}


SYNC_NETS = ("alexnet_cifar", "vgg16_cifar", "resnet_cifar")
"""Whose training steps ``measure_synchronized_steps`` times when no nets are profiled."""
SYNC_MIN_STEPS = 6
"""Each window holds at least this many of one oversubscribed process's steps: this many of the
step every process times once ready, all of them at once (2 per core), which is about an
oversubscribed step (alexnet_cifar: 1.70 s ready, 1.58 s a step in the oversubscribed window, 0.78 s
alone). Twice that, as before, made a quick calibration's windows 20 s on a machine of 34 GFLOP/s a
core, and its synchronized steps 290 of its 486 s."""
ALONE_OTHER_CORES_MAX = 0.25
"""Cores' worth of other work the machine may carry while one process is timed alone in
``measure_synchronized_steps`` (/proc/stat's busy time, less the one core the process keeps busy);
above it the window is timed again, up to ``ALONE_TRIES`` times, and the least disturbed kept.
Other work makes "alone" slow and every capacity high: one validate whose calibration shared the
machine read 1.91 and 1.79 cores' worth (ten idle calibrations 1.77-1.87 and 1.65-1.74), and its
rows at 10 Gbit/s ran 9% slower than predicted."""
ALONE_TRIES = 3
SYNC_EXTRA_BYTES = 4096
"""The small all-reduce ``measure_synchronized_steps`` adds to a step (DDP's BatchNorm buffer
broadcast of resnet_cifar is 5.6 kB)."""
SYNC_WAIT_PAIRS = 3
"""Windows in lockstep without and with the extra all-reduces, per repeat, on the nets timed for
``collective_wait_s``: the difference of one pair is noise-sized — six pairs of resnet_cifar in a row
here read 1.38, 2.18, 1.46, 2.30, 1.57 and 0.04 ms, and a calibration of two (0.04 and 1.38: 0.7 ms)
predicted its DDP rows at 10 Gbit/s 8-10% fast; the median of three pairs a repeat holds."""
SYNC_EXTRA_MAX_STEP_S = 0.1
"""``collective_wait_s`` is timed on the nets whose step alone takes less than this (none: on the
last net): a difference of two step times of a few ms, it drowns in the noise of a net whose steps
take hundreds (one quick calibration here read −10.6 to +4.2 ms on alexnet_cifar and vgg16_cifar,
1.6 and 1.9 ms on resnet_cifar)."""


SYNC_EXTRA_CALLS = 3
"""Small all-reduces the "with" windows add to a step, spread through its forward pass (before
its first layer, a third and two thirds of the way through), as DDP's calls fall between its
layers' compute; ``collective_wait_s`` is the difference over the calls. One call's 1-3 ms are
the size of the windows' noise: six pairs with one call, resnet_cifar, read 0.26-4.1 ms a call
(medians of two calibrations 1.7 and 2.3 ms; one validate's calibration read 1.06 ms and
predicted DDP 9% fast at 10 Gbit/s, where another's 1.96 ms predicted it within 2%); with three,
1.8-3.1 ms (medians 2.7 and 2.2 ms)."""


# ---- a later reading: the spread over minutes, not only over seconds ----------------------------
LATER_READING_SECTIONS = ("link", "rounds")
"""Sections ``calibrate`` reads once more at its end, minutes after their first reading, merging the
two readings' repeats (``merge_readings``; not with ``quick``). A section's repeats come seconds
apart, and these figures drift over minutes more than their repeats spread. Two calibrations here,
6 minutes apart:
- loopback payload: 3.49 and 2.64 GB/s, each run's repeats within 21% and 6%;
- 3-rank all-reduce: 19 and 23 ms, within 3% and 13%;
- 2-rank ring round: 0.157 and 0.194 ms, within 7% and 10%.

Three blocks of three repeats in a row, within a minute: 3.07–3.37, 3.69–4.05 and 3.34–3.58 GB/s.
With the later reading merged, the spread the file states holds the drift seen during the
calibration (the next one: 4.04–4.11 GB/s first, 3.27–3.94 later, a 21% spread). A host that
slows after the calibration is not in it: two such calibrations 14 minutes apart, the second on a
host 8% slower in one thread's FLOP/s, read 3.99 and 2.56 GB/s. The compute figures of the first two
calibrations were 0.3–2.8% apart (the fully connected layers' 4.7–6.3%), within their repeats'
spread but for the effective cores (5.0% against 3.0%); its section takes a minute, so it is read once."""


def merge_readings(first: Any, later: Any) -> Any:
    """``first`` with every figure that is a ``spread`` summary (median, spread, values) holding the
    repeats of both readings, recomputed; everything else ``first``'s."""
    if isinstance(first, dict) and isinstance(later, dict):
        if "values" in first and "median" in first and isinstance(later.get("values"), list):
            return spread(list(first["values"]) + list(later["values"]))
        return {k: merge_readings(v, later[k]) if k in later else v for k, v in first.items()}
    return first


def merge_link(first: dict, later: dict) -> dict:
    """Two readings of the link section as one: their repeats merged (``merge_readings``), the
    point-to-point time per size the median over both readings' repeats."""
    out = merge_readings(first, later)
    if first.get("sizes_bytes") == later.get("sizes_bytes") and "p2p_time_s_by_repeat" in later:
        reps = list(first["p2p_time_s_by_repeat"]) + list(later["p2p_time_s_by_repeat"])
        out["p2p_time_s_by_repeat"] = reps
        out["p2p_time_s"] = [spread([rep[k] for rep in reps])["median"] for k in range(len(first["sizes_bytes"]))]
    return out


def merge_rounds(first: dict, later: dict, cores: int) -> dict:
    """Two readings of the ring rounds as one: the rounds' repeats merged, ``oversubscribed_wait_s``
    from them again."""
    out = merge_readings(first, later)
    out["oversubscribed_wait_s"] = oversubscribed_wait(out["round_s"], cores)
    return out


# ---- a steady machine: a section measured again where something else disturbed it ------------
SECTION_TRIES = 2
"""How often ``calibrate`` measures a section at most: one that ``disturbance`` flags is measured
once more and the less disturbed of the two kept (``steadiness`` in the result says which, and
why). One validate --full calibration here ran while another tenant of the host took CPU time: its
one-thread compute repeats spread 17.5% (2–5% in steady ones), its lockstep capacity read 1.59
cores (spread 56%) against 1.87 (7%), and every prediction came out 10–14% slow."""
COMPUTE_SPREAD_MAX = 0.10
"""The compute section's repeats (one thread alone; all cores at once) agree within this when the
machine is steady (2–5% in a dozen calibrations here)."""
SYNC_SPREAD_MAX = 0.20
"""A net's lockstep capacities (``measure_synchronized_steps``) agree within this when steady
(2–11% here)."""
SYNC_VS_SHARED_MIN = 0.90
"""A net's lockstep capacity is at least this share of the cores' worth the compute section's
independent processes got (``effective_cores``) when steady: lockstep only adds a barrier a step
(here 0.95–1.03 of 1.85–1.89 cores; the disturbed calibration read 0.85)."""
PROBE_DROP = 0.8
"""A section before or after which every core's ``speed_probe`` (in a child process that sleeps in
between) read below this share of the calibration's best is disturbed: another tenant of this host
took about half its cores in episodes of seconds to minutes (14 GFLOP/s a thread against 29; the
steady probe varies by ±5%), which the hypervisor did not report as steal."""
ROUNDS_SPREAD_MAX = 1.0
"""A ring round's repeats (``measure_rounds``) agree within this when steady; one validate
calibration here read 1.75, 0.25 and 1.37 ms for a round of 2 ranks (0.36–0.39 ms in steady ones)
and 0.74–0.84 ms with 4 — fewer ranks cannot take longer on the same cores — so its
``oversubscribed_wait_s`` came out 0 (it now takes the least 2-rank repeat: ``oversubscribed_wait``)."""
STEADY_WAIT_S, STEADY_POLL_S = 60.0, 2.0
"""Before a disturbed section's second reading the cores are probed every 2 s until they run at
``PROBE_DROP`` of the best again, for up to a minute: the ring rounds' 13 s, read again at once,
fell in the same episode (0.66 and 0.64 of the best; its wait a round 0.90 ms where steady
readings give 0.47–0.56)."""
STEAL_SHARE_MAX = 0.02
"""A section during which the hypervisor gave more than this share of the cores' time to other
guests (/proc/stat's steal) is disturbed whatever its spread."""


def steal_s() -> float | None:
    """CPU seconds the hypervisor gave to other guests since boot (/proc/stat's steal column);
    None where the kernel does not say."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()
        return int(v[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def sync_disturbed_nets(sync: dict, effective_cores: float | None) -> dict[str, str]:
    """{net: why} for the nets whose lockstep steps look disturbed: their capacities spread more
    than ``SYNC_SPREAD_MAX`` or read below ``SYNC_VS_SHARED_MIN`` of the most of
    ``effective_cores`` and the other nets' capacities (a disturbed compute section reads low too)."""
    out = {}
    per_net = sync.get("per_net") or {}
    for net, row in per_net.items():
        why = []
        for k in ("capacity", "oversubscribed_capacity"):
            if row[k]["spread"] > SYNC_SPREAD_MAX:
                why.append(f"{k.replace('_', ' ')} spread {row[k]['spread']:.0%} (> {SYNC_SPREAD_MAX:.0%})")
        others = {f"{n}'s lockstep": r["capacity"]["median"] for n, r in per_net.items() if n != net}
        if effective_cores:
            others["independent processes'"] = effective_cores
        if others:
            whose, ref = max(others.items(), key=lambda kv: kv[1])
            if row["capacity"]["median"] < SYNC_VS_SHARED_MIN * ref:
                why.append(f"capacity {row['capacity']['median']:.2f} cores, below {SYNC_VS_SHARED_MIN:.0%} of "
                           f"the {ref:.2f} of {whose}")
        if why:
            out[net] = "; ".join(why)
    return out


def disturbance(stage: str, result: dict, steal_share: float | None, effective_cores: float | None = None,
                probe_share: float | None = None) -> str | None:
    """Why section ``stage``'s ``result`` looks disturbed by other work on the machine (None: it
    does not): the cores' speed around it (``probe_share``, of the calibration's best) below
    ``PROBE_DROP``, the hypervisor's steal over ``STEAL_SHARE_MAX`` of the section's core time, and
    for compute, lockstep steps and ring rounds their repeats' disagreement (``COMPUTE_SPREAD_MAX``,
    ``sync_disturbed_nets``, ``ROUNDS_SPREAD_MAX``; a round of more ranks faster than of fewer)."""
    why = []
    if probe_share is not None and probe_share < PROBE_DROP:
        why.append(f"the cores ran at {probe_share:.2f}× their best speed around it")
    if steal_share is not None and steal_share > STEAL_SHARE_MAX:
        why.append(f"the hypervisor gave {steal_share:.1%} of the cores' time to other guests")
    if stage == "compute":
        for k, what in (("per_thread_flops_per_s", "one thread's"), ("shared_flops_per_s", "all cores'")):
            if result[k]["spread"] > COMPUTE_SPREAD_MAX:
                why.append(f"{what} FLOP/s spread {result[k]['spread']:.1%} (> {COMPUTE_SPREAD_MAX:.0%})")
    elif stage == "synchronized_steps":
        why += [f"{net}: {w}" for net, w in sync_disturbed_nets(result, effective_cores).items()]
    elif stage == "rounds" and result.get("round_s"):
        rounds = sorted(result["round_s"].items(), key=lambda kv: int(kv[0]))
        for n, row in rounds:
            if row["spread"] > ROUNDS_SPREAD_MAX:
                why.append(f"ring rounds with {n} ranks spread {row['spread']:.0%} (> {ROUNDS_SPREAD_MAX:.0%})")
        (few, lo), (many, hi) = rounds[0], rounds[-1]
        if len(rounds) > 1 and hi["median"] < lo["median"]:
            why.append(f"a ring round with {many} ranks ({units.format_seconds(hi['median'])}) took less than with "
                       f"{few} ({units.format_seconds(lo['median'])})")
    return "; ".join(why) or None


def unsteadiness(stage: str, result: dict, steal_share: float | None, probe_share: float | None = None) -> float:
    """How disturbed a section's reading looks, to keep the steadier of two disturbed ones: the
    cores' slowdown around it (1 − ``probe_share``) plus the compute section's larger spread, or
    else the hypervisor's steal share."""
    slow = 1.0 - min(1.0, probe_share) if probe_share is not None else 0.0
    if stage == "compute":
        return slow + max(result["per_thread_flops_per_s"]["spread"], result["shared_flops_per_s"]["spread"])
    return slow + (steal_share or 0.0)


def steadiness_lines(result: dict) -> list[str]:
    """A line for each section of a ``calibrate`` result measured more than once: why, and whether
    the kept reading is steady (else a warning)."""
    lines = []
    for stage, st in (result.get("steadiness") or {}).items():
        if st.get("out_of_time") and st["tries"] == 1 and st["kept_disturbed"]:
            lines.append(f"{stage.replace('_', ' ')}: disturbed by other work ({st['kept_disturbed']}) and not "
                         "measured again, for want of time: predictions from it may be off — calibrate on an "
                         "idle machine, or give validate a longer --budget")
        elif st["tries"] > 1:
            lines.append(f"{stage.replace('_', ' ')}: measured {st['tries']} times, the first disturbed by other work "
                         f"({st['disturbed'][0]})" + (f"; warning: still disturbed ({st['kept_disturbed']}): predictions "
                                                      "from it may be off — calibrate on an idle machine"
                                                      if st["kept_disturbed"] else "; the steady reading kept"))
    later = {stage: st["later_reading_after_s"] for stage, st in (result.get("steadiness") or {}).items()
             if st.get("later_reading_after_s") is not None}
    if later:
        mins = list(dict.fromkeys(f"{v / 60:.1f}" for v in later.values()))
        lines.append(" and ".join(k.replace("_", " ") for k in later) + " read again "
                     + " and ".join(mins) + " min after their first reading: "
                     "their spreads are over both readings (these figures drift over minutes)")
    return lines


def still_disturbed(result: dict) -> dict[str, str]:
    """{section: why} for the sections of a ``calibrate`` result that stayed disturbed after
    ``SECTION_TRIES`` readings."""
    return {k: v["kept_disturbed"] for k, v in (result.get("steadiness") or {}).items() if v.get("kept_disturbed")}


def merge_synchronized(old: dict, new: dict) -> dict:
    """``old`` lockstep steps with the nets ``new`` measured again replaced where the new reading
    is the steadier (the smaller capacity spread); the totals recomputed over the nets kept."""
    per_net = dict(old["per_net"])
    for net, row in new.get("per_net", {}).items():
        prev = per_net.get(net)
        score = lambda r: max(r["capacity"]["spread"], r["oversubscribed_capacity"]["spread"])  # noqa: E731
        if prev is None or score(row) < score(prev):
            row = dict(row)
            if prev is not None and "collective_wait_s" not in prev:
                row.pop("collective_wait_s", None)  # timed on the fast nets (or the last) of the first reading only
            per_net[net] = row
    every = lambda k: [v for r in per_net.values() if k in r for v in r[k]["values"]]  # noqa: E731
    out = {**old, "per_net": per_net, "alone_other_cores": max(old["alone_other_cores"], new.get("alone_other_cores", 0.0)),
           "capacity": spread(every("capacity")), "oversubscribed_capacity": spread(every("oversubscribed_capacity"))}
    if every("collective_wait_s"):
        out["collective_wait_s"] = spread(every("collective_wait_s"))
    return out


def synchronized_steps_config(nets: Sequence[str] = (), repeats: int = 3, quick: bool = False,
                              extra_calls: int = SYNC_EXTRA_CALLS) -> dict:
    """What ``measure_synchronized_steps`` runs: nets, batch, the shortest window, repeats, the
    extra calls a step of the "with" windows."""
    return {"nets": list(nets or SYNC_NETS), "batch": 16, "repeats": 2 if quick else max(2, min(repeats, 3)),
            "window_s": 1.5 if quick else 2.5, "timeout_s": WORKER_TIMEOUT_S, "extra_calls": extra_calls}


def timed_alone(window: Callable[[], float], busy_cpu_s: Callable[[], float],
                clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(step, other work's cores) of one process timed alone by ``window()``: timed again while the
    machine's busy CPU (``busy_cpu_s()``, seconds since boot) shows more than ``ALONE_OTHER_CORES_MAX``
    cores besides the process's own, up to ``ALONE_TRIES`` times; the least disturbed is kept."""
    tries = []
    for _ in range(ALONE_TRIES):
        b0, t0 = busy_cpu_s(), clock()
        step = window()
        other = max(0.0, (busy_cpu_s() - b0) / max(clock() - t0, 1e-9) - 1.0)
        tries.append((other, step))
        if other <= ALONE_OTHER_CORES_MAX:
            break
    other, step = min(tries)
    return step, other


def measure_synchronized_steps(cores: int, cfg: dict, log_dir: Path, advance=None) -> dict:
    """Training steps of each net (batch 16, one thread per process): one process alone, then
    one process per core with a barrier after every step, then two per core with a barrier after
    every step — the way every distributed step of the emulated cluster runs, its ranks in
    lockstep — then one alone again; two repeats. Per repeat and net, with "alone" the mean of the
    two alone (this machine's pace drifts by several percent over a minute, and one validate's
    quick calibration, one repeat with alone timed first, read 1.84 of 2 cores where the previous
    read 1.77, its runs then predicted 4% fast): ``capacity`` = cores · alone / synchronized step, and
    ``oversubscribed_capacity`` = 2·cores · alone / oversubscribed step, in cores' worth
    (``ClusterSpec.shared_core_capacity`` and ``oversubscribed_core_capacity``). One process per
    core is also timed with ``SYNC_EXTRA_CALLS`` small all-reduces spread through every step's
    forward pass besides the barrier after it, as DDP broadcasts its buffers and all-reduces its
    buckets between layers: the difference over the calls is ``collective_wait_s``, what one more
    collective call costs a step in lockstep (here 1.8-3.1 ms a call for resnet_cifar's 36 ms, where
    the call alone, cores idle, takes 0.2-0.4 ms), on the nets of short steps (``SYNC_EXTRA_MAX_STEP_S``).

    Both are below what independent benchmarks give. The cores are not equally free (the
    kernel's and other processes' work lands on one more than the other), and a synchronized step
    goes at the pace of its slowest rank: here 2 resnet_cifar processes took 32.0 and 35.2 ms a
    step free-running, 36.8 ms each in lockstep. With two processes per core the kernel time-slices
    them and each switch finds the core's caches full of the other's data: 4 processes took
    1.04-1.08× twice the time of 2 (alexnet_cifar 1.04, vgg16_cifar 1.05, resnet_cifar 1.08).
    A window alone is timed again while /proc/stat shows other work on the machine
    (``ALONE_OTHER_CORES_MAX``); ``alone_other_cores`` is the most any kept window carried.
    Skipped (empty) on machines of more than 8 cores, as ``round_ranks``. ``advance()`` after each net."""
    from layerplan.runtime.launch import free_port

    if cores > 8:
        return {}
    from layerplan.runtime.emulate import busy_cpu_s

    n = 2 * cores
    others: list[float] = []  # other work's cores while one process ran alone, per window kept
    caps: dict[str, list[float]] = {}
    overs: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    walls: dict[str, float] = {}
    for i, net in enumerate(cfg["nets"]):
        t_net = time.monotonic()
        (log_dir / net).mkdir(parents=True, exist_ok=True)
        envs = _loopback_envs(n, free_port())
        procs = _Procs([_worker_argv("steps", {**cfg, "net": net, "cores": cores})] * n, envs, log_dir / net)
        try:
            ready = procs.expect("ready", n)
            step_s = max(r["step_s"] for r in ready.values())
            window_s = max(cfg["window_s"], SYNC_MIN_STEPS * step_s)  # step_s: n processes at once
            # the collective's wait on the fast nets, or on the last net if none before it was fast
            timed = step_s < SYNC_EXTRA_MAX_STEP_S or (not waits and i == len(cfg["nets"]) - 1)

            def window(ranks: int, extra: int = 0) -> float:
                """The ranks' mean step over one window (``extra`` small all-reduces a step more)."""
                procs.send(f"go {window_s} {ranks} {extra}", range(ranks))
                return statistics.fmean(r["step_s"] for r in procs.expect("steps", range(ranks)).values())

            def alone() -> float:
                step, other = timed_alone(lambda: window(1), busy_cpu_s)
                others.append(other)
                return step

            for _ in range(cfg["repeats"]):
                before, sync, over = alone(), window(cores), window(n)
                alone_s = (before + alone()) / 2  # the machine's pace drifts: alone around the synchronized runs
                caps.setdefault(net, []).append(cores * alone_s / sync)
                overs.setdefault(net, []).append(n * alone_s / over)
                calls = cfg.get("extra_calls", 1)
                for _ in range(SYNC_WAIT_PAIRS if timed else 0):  # one process per core without, then with
                    plain = window(cores)                              # a few more small all-reduces a step
                    waits.setdefault(net, []).append((window(cores, calls) - plain) / calls)
            procs.send("stop")
            procs.expect("done", n)
        finally:
            procs.close()
        walls[net] = time.monotonic() - t_net
        if advance:
            advance()
    return {"processes": [1, cores, n], "cores": cores, "batch": cfg["batch"], "extra_calls": cfg.get("extra_calls", 1),
            "alone_other_cores": max(others, default=0.0),
            "per_net": {k: {"wall_s": walls[k], "capacity": spread(caps[k]), "oversubscribed_capacity": spread(overs[k]),
                            **({"collective_wait_s": spread(waits[k])} if k in waits else {})} for k in caps},
            "capacity": spread([v for vs in caps.values() for v in vs]),
            "oversubscribed_capacity": spread([v for vs in overs.values() for v in vs]),
            "collective_wait_s": spread([v for vs in waits.values() for v in vs])}


def _training_step(module, params, x, y):
    """One training step as validate's runs take it — zero_grad, cross-entropy forward, backward,
    SGD with momentum — as a callable (torch imported by the caller's process)."""
    import torch

    from layerplan.runtime.optim import sgd

    opt = sgd(params, lr=1e-6, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module(x), y).backward()
        opt.step()

    return step


def _steps_worker(cfg: dict) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from layerplan.netspec import zoo

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    first = dist.new_group(list(range(cfg["cores"])))  # every rank takes part in making it
    model, shape = zoo.build(cfg["net"])
    model.train()
    x = torch.randn(cfg["batch"], *shape[-3:])
    out = model(x)
    y = torch.randint(0, out.shape[-1], (cfg["batch"],))
    step = _training_step(model, list(model.parameters()), x, y)
    step()  # warm-up: allocator, kernels
    t0 = time.perf_counter()
    step()
    _emit(event="ready", step_s=time.perf_counter() - t0)
    tiny = torch.zeros(SYNC_EXTRA_BYTES // 4)
    layers = [m for m in model.modules() if not list(m.children())]
    calls: list = []  # the group each hook all-reduces in, in a window with the extra calls; else empty

    def call(*_):
        for group in calls:
            dist.all_reduce(tiny, group=group)

    n_calls = max(1, cfg.get("extra_calls", 1))
    for i in range(n_calls):  # spread through the forward pass
        layers[i * len(layers) // n_calls].register_forward_pre_hook(call)
    while True:
        line = sys.stdin.readline().split()
        if not line or line[0] != "go":  # "stop" (or the parent gone) ends
            break
        window_s, k = float(line[1]), int(line[2])
        extra = int(line[3]) if len(line) > 3 else 0  # with the extra calls (cfg["extra_calls"] hooks) or without
        group = None if k == 1 else first if k == cfg["cores"] else dist.group.WORLD
        if group is not None:
            dist.barrier(group=group)  # start together
        end = time.perf_counter() + window_s
        times: list[float] = []
        calls[:] = [group] if extra and group is not None else []  # each hook: one call
        while True:
            t1 = time.perf_counter()
            step()
            over = len(times) >= 2 and time.perf_counter() >= end
            if group is not None:  # the step's synchronization, which also tells every rank rank 0's "over"
                flag = torch.tensor([1.0 if over and rank == 0 else 0.0])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
                over = flag.item() > 0
            times.append(time.perf_counter() - t1)
            if over:
                break
        _emit(event="steps", step_s=statistics.median(times[1:]))
    dist.barrier()
    _emit(event="done")


def _loopback_envs(world: int, port: int) -> list[dict]:
    """Each rank's environment for a gloo group of ``world`` local processes over loopback."""
    return [dict(_base_env(), RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 GLOO_SOCKET_IFNAME="lo") for r in range(world)]


def _rounds_worker(cfg: dict) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    t = torch.ones(SMALL_ALLREDUCE_BYTES // 4)
    medians = []
    for _ in range(cfg["repeats"]):
        times = []
        for _ in range(cfg["iters"] + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times[1:]))
    if rank == 0:
        _emit(event="rounds", time_s=medians)
    dist.barrier()
    _emit(event="done")


def _messages_worker(cfg: dict) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    x, msg, peer, trips = torch.randn(256, 256), torch.zeros(16), rank ^ 1, cfg["roundtrips"]
    per_end, bursts = [], []
    for rep in range(cfg["repeats"] + 1):  # the first is a warm-up
        dist.barrier()
        work = 0.0
        start = time.process_time()
        for i in range(trips):
            t0 = time.process_time()
            for _ in range(cfg["burst"]):
                torch.tanh(x @ x)
            work += time.process_time() - t0
            tg = rep * trips + i
            if rank % 2 == 0:
                dist.isend(msg, peer, tag=tg).wait()
                dist.irecv(msg, peer, tag=tg).wait()
            else:
                dist.irecv(msg, peer, tag=tg).wait()
                dist.isend(msg, peer, tag=tg).wait()
        if rep:
            per_end.append((time.process_time() - start - work) / trips / 2)
            bursts.append(work / trips)
    _emit(event="messages", cpu_s_per_end=per_end, burst_cpu_s=statistics.fmean(bursts))
    dist.barrier()
    _emit(event="done")


def _link_section(on: str, name: str, cfg: dict, log_dir: Path, advance, ranks: int = 3) -> dict:
    from layerplan.runtime import emulate
    from layerplan.runtime.launch import free_port

    port = free_port()
    if on == "local":
        world, rate = ranks, None
        envs = _loopback_envs(world, port)
        prefixes: list[list[str]] = [[] for _ in range(world)]
        where = "loopback"
    else:
        emu = _emulated(name)
        if emu.hosts < 2:
            raise ConfigError(f"calibrating links needs 2 hosts, cluster {name!r} has {emu.hosts}: "
                              f"layerplan cluster up --hosts 3 --name {name}")
        world, rate = min(ranks, emu.hosts), emu.rate_bytes_per_s
        envs = [dict(_base_env(), **emulate.host_env(emu, r, world, 0, port)) for r in range(world)]
        prefixes = [emu.exec_prefix(r) for r in range(world)]
        where = f"emulated cluster {name!r}: {emu.address(0)} ↔ {emu.address(1)}"
    ar_bytes = MAX_ALLREDUCE_BYTES if rate is None else \
        int(min(MAX_ALLREDUCE_BYTES, max(2**20, 2 ** math.floor(math.log2(rate * 0.25)))))  # ~0.25 s on the wire
    cfg = dict(cfg, allreduce_bytes=ar_bytes, allreduce_ranks=list(range(2, world + 1)))
    procs = _Procs([prefix + _worker_argv("link", cfg) for prefix in prefixes], envs, log_dir)
    try:
        reps = []
        for _ in range(cfg["repeats"]):
            reps.append(procs.expect("repeat", [0])[0])  # rank 0 reports; the others only say "done"
            advance()
        procs.expect("done", world)
    finally:
        procs.close()
    sizes = cfg["sizes"]
    fits = [fit_link(sizes, rep["p2p_s"]) for rep in reps]
    lat = [a / 2 for a, _ in fits]  # t = L (message) + L (ack) + bytes / B
    bw = [b for _, b in fits]
    out: dict[str, Any] = {
        "where": where,
        "configured_bytes_per_s": rate,
        "ranks": world,
        "sizes_bytes": sizes,
        "p2p_time_s": [spread([rep["p2p_s"][k] for rep in reps])["median"] for k in range(len(sizes))],
        "p2p_time_s_by_repeat": [rep["p2p_s"] for rep in reps],
        "latency_s": spread(lat),
        "payload_bytes_per_s": spread(bw),
        "allreduce": {},
    }
    if rate is not None:
        out["efficiency"] = spread([b / rate for b in bw])
    for n in cfg["allreduce_ranks"]:
        ts = [rep["allreduce_s"][str(n)] for rep in reps]
        bus = [bus_bytes_per_s(ar_bytes, n, t) for t in ts]
        row = {"bytes": ar_bytes, "time_s": spread(ts), "bus_bytes_per_s": spread(bus),
               "vs_p2p": spread([x / b for x, b in zip(bus, bw)])}
        if rate is not None:
            row["efficiency"] = spread([x / rate for x in bus])
        out["allreduce"][str(n)] = row
    if on != "local" and emu.hosts >= 3:  # how the link shares flows that leave one host together
        out["flow_lead"] = emulate.measure_flow_lead(emu)
    return out


def _emulated(name: str):
    from layerplan.runtime import emulate

    emulate.check_available()
    try:
        return emulate.find(name)
    except emulate.EmulationError:
        raise emulate.EmulationError(f"no emulated cluster named {name!r} is up; create it first: layerplan "
                                     f"cluster up --hosts 3 --bandwidth 1Gbit --name {name}") from None


def calibrate(on: str = "local", name: str = "default", repeats: int = 3, quick: bool = False,
              progress: bool = True, profile: Sequence[str] = (), profile_batches: Sequence[int] = (16, 64),
              profile_net_batches: Sequence[int] | None = None, sync_nets: Sequence[str] | None = None,
              again_within_s: float | None = None) -> dict:
    """Measure compute and links (see the module docstring); the result dict (JSON-able).

    ``on``: "local" (links over loopback) or "emulated" (links between hosts of the emulated
    cluster ``name``, which must be up). ``repeats``: how often each figure is measured (≥ 2 gives a
    spread). ``quick``: batch 32 only and shorter timing windows (under a minute on 2 cores).
    ``progress``: a rich progress bar on stderr. ``profile``: zoo nets whose every layer is also
    timed on its own at ``profile_batches`` (``measure_profile``), so predictions for those layers
    use their measured times (``hardware.ProfiledLayer``); ``profile_net_batches``: the batches the
    whole nets' passes are timed at (None: all of ``profile_batches``; ``profile_config``).
    ``sync_nets``: whose training steps are timed in lockstep (None: the profiled nets, else
    ``SYNC_NETS``; ``synchronized_steps_config``). ``again_within_s``: a disturbed section is
    measured again only where the calibration, that reading included (as long as the section's
    first), still ends within this many seconds (None: always; ``validate`` bounds it to keep its
    budget, ``Matrix.calibrate_s``); the steadiness record says which were not (``out_of_time``).
    """
    if on not in ("local", "emulated"):
        raise ConfigError(f"calibrate on 'local' or 'emulated', got {on!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats must be a positive integer, got {repeats!r}")
    if on == "emulated":
        _emulated(name)  # fail before minutes of compute benchmarks
    cores = _cores()
    compute_cfg = compute_config(repeats, quick)
    link_cfg = link_config(repeats, quick)
    profile_cfg = profile_config(profile, profile_batches, quick, repeats, profile_net_batches) if profile else None
    t0 = time.monotonic()
    with _log_dir(None) as log_dir, _progress(progress) as bar, ExitStack() as stack:
        task = bar.add_task("compute: 1 thread", total=3 * repeats) if bar else None

        def step() -> None:
            if bar is not None:
                bar.advance(task)
                done = bar.tasks[0].completed
                if done == repeats:
                    bar.update(task, description=f"compute: {cores} processes at once")
                elif done == 2 * repeats:
                    bar.update(task, description=f"links: gloo on {on}")

        stages: dict[str, float] = {}  # each section's wall time (``durations_s``)
        lap = time.monotonic()

        def done(stage: str) -> None:
            nonlocal lap
            now = time.monotonic()
            stages[stage], lap = now - lap, now

        steadiness: dict[str, dict] = {}
        probe_speeds: list[float] = []  # every probe of the cores' speed, in order
        probe_now = stack.enter_context(_prober(log_dir / "probe", cores))

        def probe() -> float:
            probe_speeds.append(probe_now())
            return probe_speeds[-1]

        history: dict[str, list[dict]] = {}  # a section's readings: result, steal share, lowest probe around it
        merged: set[str] = set()  # sections whose second reading merges into the first (``again``)
        out_of_time: set[str] = set()  # disturbed sections not measured again (``again_within_s``)

        def judge(stage: str, reading: dict) -> tuple[str | None, float]:
            """(why disturbed or None, unsteadiness) of a reading, its probes against the best so far."""
            share = reading["probe"] / max(probe_speeds)
            return (disturbance(stage, reading["result"], reading["steal"], effective, share),
                    unsteadiness(stage, reading["result"], reading["steal"], share))

        def kept(stage: str) -> dict:
            """The reading a section keeps (the last of a merged one; else the undisturbed, else the
            steadier), its record in ``steadiness``."""
            judged = [(*judge(stage, r), r) for r in history[stage]]
            keep = judged[-1] if stage in merged else min(judged, key=lambda j: (j[0] is not None, j[1]))
            steadiness[stage] = {"tries": len(judged), "disturbed": [j[0] for j in judged if j[0]],
                                 "kept_disturbed": keep[0], "probe_flops_per_s": [r["probe"] for r in history[stage]],
                                 "kept_probe_flops_per_s": keep[2]["probe"], "out_of_time": stage in out_of_time}
            return keep[2]["result"]

        def steady(stage: str, measure: Callable[[], dict], again: Callable[[dict, str], dict] | None = None) -> dict:
            """``measure()``, once more where ``disturbance`` flags it (``again(result, why)`` where
            given, else ``measure()``), up to ``SECTION_TRIES`` readings; the one ``kept``."""
            hist = history.setdefault(stage, [])
            if again is not None:
                merged.add(stage)
            while len(hist) < SECTION_TRIES:
                if hist and again_within_s is not None and (
                        time.monotonic() - t0 + hist[0]["wall_s"] > again_within_s):  # out of time: as it stands
                    out_of_time.add(stage)
                    break
                if hist:  # a reading again: once the cores are back to speed, or STEADY_WAIT_S on
                    wait_until = time.monotonic() + STEADY_WAIT_S
                    while probe() < PROBE_DROP * max(probe_speeds) and time.monotonic() < wait_until:
                        time.sleep(STEADY_POLL_S)
                before = probe_speeds[-1] if probe_speeds else probe()  # the last section's after, or the wait's last
                s0, t_read = steal_s(), time.monotonic()
                result = measure() if not hist or again is None else again(hist[-1]["result"],
                                                                         judge(stage, hist[-1])[0] or "")
                s1 = steal_s()
                share = (s1 - s0) / (cores * max(time.monotonic() - t_read, 1e-9)) if s0 is not None and s1 is not None else None
                hist.append({"result": result, "steal": share, "probe": min(before, probe()),
                             "wall_s": time.monotonic() - t_read})
                if judge(stage, hist[-1])[0] is None:
                    break
            return kept(stage)

        effective: float | None = None
        results: dict[str, dict] = {}
        sections: dict[str, tuple[Callable[[], dict], Callable[[dict, str], dict] | None]] = {}

        first_read: dict[str, float] = {}  # when each section's first reading began

        def section(stage: str, what: str, measure: Callable[[], dict], again=None) -> dict:
            sections[stage] = (measure, again)
            first_read[stage] = time.monotonic()
            if bar is not None and what:
                bar.update(task, description=what)
            results[stage] = steady(stage, measure, again)
            done(stage)
            return results[stage]

        def compute_section() -> dict:
            if bar is not None and "compute" in history:
                bar.reset(task, total=3 * repeats, description="compute: 1 thread (again: the machine was disturbed)")
            return _compute_section(compute_cfg, log_dir, step, cores)

        effective = section("compute", "", compute_section)["effective_cores"]["median"]
        for d in ("link", "rounds", "messages"):
            (log_dir / d).mkdir(exist_ok=True)
        if bar is not None:
            bar.update(task, completed=2 * repeats)
        section("link", f"links: gloo on {on}", lambda: _link_section(on, name, link_cfg, log_dir / "link", step))
        section("rounds", f"ring rounds: {' and '.join(map(str, round_ranks(cores)))} ranks",
                lambda: measure_rounds(cores, repeats, log_dir / "rounds"))
        section("messages", f"messages: {2 * cores} ranks in pairs on {cores} cores",
                lambda: measure_message_cpu(cores, repeats, log_dir / "messages"))
        sync_cfg = synchronized_steps_config(profile if sync_nets is None else sync_nets, repeats, quick)

        def sync_again(first: dict, why: str) -> dict:
            """The disturbed nets' lockstep steps once more (all of them where the probes or the
            steal say the whole section was), merged into ``first``."""
            nets = list(sync_disturbed_nets(first, effective)) or list(sync_cfg["nets"])
            if bar is not None:
                bar.update(task, description=f"synchronized training steps again (disturbed): {', '.join(nets)}")
            return merge_synchronized(first, measure_synchronized_steps(cores, {**sync_cfg, "nets": nets},
                                                                        log_dir / "synchronized-again"))

        section("synchronized_steps", f"synchronized training steps, 1, {cores} and {2 * cores} processes: "
                                      f"{', '.join(sync_cfg['nets'])}",
                lambda: measure_synchronized_steps(cores, sync_cfg, log_dir / "synchronized"), sync_again)
        if profile_cfg is not None:
            (log_dir / "profile").mkdir(exist_ok=True)
            ptask = bar.add_task(f"profile: layers of {', '.join(profile)}", total=None) if bar else None
            section("profile", "", lambda: measure_profile(profile_cfg, log_dir / "profile",
                                                           (lambda: bar.advance(ptask)) if bar is not None else None))
        # a probe tells a disturbed section only against the calibration's best, known at its end: a
        # section whose probes now read below PROBE_DROP of it is measured again if it has a try left
        for stage, (measure, again) in sections.items():
            results[stage] = kept(stage)
            if steadiness[stage]["kept_disturbed"] and len(history[stage]) < SECTION_TRIES:
                if bar is not None:
                    bar.update(task, description=f"{stage.replace('_', ' ')} again: the machine was disturbed")
                t_again = time.monotonic()
                results[stage] = steady(stage, measure, again)
                if stage == "compute":
                    effective = results["compute"]["effective_cores"]["median"]
                stages[stage] += time.monotonic() - t_again
        if not quick:  # the drifting figures read once more, minutes on (LATER_READING_SECTIONS)
            for stage in LATER_READING_SECTIONS:
                if bar is not None:
                    bar.update(task, description=f"{stage} again, minutes later: their spread over both readings")
                t_later = time.monotonic()
                later = sections[stage][0]()
                results[stage] = (merge_link(results[stage], later) if stage == "link"
                                  else merge_rounds(results[stage], later, cores))
                steadiness[stage]["later_reading_after_s"] = t_later - first_read[stage]
                stages[stage] += time.monotonic() - t_later
    rounds = {**results["rounds"], "messages": results["messages"]}
    prof = results.get("profile")
    out = {
        "format": FORMAT_VERSION,
        "on": on,
        "cluster": name if on == "emulated" else None,
        "repeats": repeats,
        "quick": quick,
        "duration_s": time.monotonic() - t0,
        "durations_s": stages,
        "machine": {"cpu": _cpu_name(), "cores": cores, "python": platform.python_version(),
                    "when": time.strftime("%Y-%m-%d %H:%M:%S")},
        "compute": results["compute"],
        "link": results["link"],
        "rounds": rounds,
        "synchronized_steps": results["synchronized_steps"],
        "steadiness": steadiness,
    }
    if prof is not None:
        out["profile"] = prof
    return out


@contextmanager
def _prober(log_dir: Path, cores: int) -> Iterator[Callable[[], float]]:
    """A function that returns every core's speed now, per thread (``speed_probe`` on ``cores``
    threads, in a child process that sleeps between calls)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = _Procs([_worker_argv("probe", {"threads": cores, "window_s": PROBE_WINDOW_S})], [_base_env()], log_dir)
    try:
        procs.expect("ready", 1)

        def probe() -> float:
            procs.send("probe")
            return procs.expect("probe", 1)[0]["flops_per_s"]
        yield probe
    finally:
        procs.close()


@contextmanager
def _log_dir(path: str | Path | None) -> Iterator[Path]:
    """Where benchmark processes log: ``path``, or a temporary directory that is removed after a
    clean measurement and kept (the error names it) after a failed one."""
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
        return
    tmp = Path(tempfile.mkdtemp(prefix="layerplan-calibrate-"))
    try:
        yield tmp
    except CalibrationError:
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)


class _NoBar:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _progress(show: bool):
    if not show:
        return _NoBar()
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---- result → cluster file -----------------------------------------------------------------------
def to_cluster(result: dict, nodes: int | None = None) -> hardware.ClusterSpec:
    """The ClusterSpec a calibration stands for: the ``cpu-core`` preset with the fitted
    ``compute_efficiency`` (its peak raised to the measurement where that exceeds it), the fitted
    link, and ``shared_cores`` = this machine's cores (every local or emulated rank shares them).
    ``nodes``: default the emulated cluster's hosts, or one per core for ``local``."""
    try:
        comp, link = result["compute"], result["link"]
        base = replace(hardware.DEVICES[comp["device_preset"]], kernel_costs=())  # as fitted (measure_compute)
        eff = comp.get("conv_efficiency", comp["compute_efficiency"])["median"]
        fc_eff = comp["fc_efficiency"]["median"] if "fc_efficiency" in comp else None
        cores = result["machine"]["cores"]
        lat = link["latency_s"]["median"]
        payload = link["payload_bytes_per_s"]["median"]
    except (KeyError, TypeError) as e:
        raise CalibrationError(f"not a calibration result: missing {e}") from None
    peak = base.peak_flops_per_s
    top = max(eff, fc_eff or 0.0)
    if top > 1:  # the machine beats the preset's peak: keep the measured rates, the best at efficiency 1
        peak, eff, fc_eff = peak * top, eff / top, None if fc_eff is None else fc_eff / top
    per_thread = comp["per_thread_flops_per_s"]["median"]
    device = replace(base, name=f"{base.name}-calibrated", peak_flops_per_s=peak, compute_efficiency=eff, fc_efficiency=fc_eff,
                     mem_bandwidth_bytes_per_s=comp.get("mem_bandwidth_bytes_per_s", base.mem_bandwidth_bytes_per_s),
                     update_bandwidth=tuple(tuple(p) for p in comp.get("update_bandwidth", ())),
                     sum_bandwidth=tuple(tuple(p) for p in comp.get("sum_bandwidth", ())),
                     profiled_layers=profiled_layers(result["profile"]) if result.get("profile") else (),
                     note=f"calibrated {result['machine']['when']} on {result['machine']['cpu']}: "
                          f"{units.format_flops_rate(per_thread)} per thread (FLOP-weighted conv+linear fwd+bwd, "
                          f"alexnet/vgg16 CIFAR layers), {units.format_flops_rate(comp['shared_flops_per_s']['median'])} "
                          f"with {comp['shared_processes']} processes")
    rate = link.get("configured_bytes_per_s")
    if rate:
        # a 2-rank ring all-reduce sends and receives its bytes at once: its bus bandwidth against
        # the one-way payload rate is how much of it each direction keeps with both busy
        two = (link.get("allreduce") or {}).get("2")
        duplex = 1.0 if not two else min(1.0, max(0.5, two["bus_bytes_per_s"]["median"] / payload))
        lead = (link.get("flow_lead") or {}).get("flow_lead_bytes")
        if lead is None:  # two hosts: no fan-out to measure; the emulated link's, as measured here
            from layerplan.runtime.emulate import FLOW_LEAD_BYTES as lead
        nic = hardware.LinkSpec(name=f"emulated {units.format_bandwidth(rate)}", bandwidth_bytes_per_s=rate,
                                latency_s=lat, efficiency=min(1.0, payload / rate), duplex_efficiency=duplex,
                                flow_lead_bytes=lead,
                                note=f"calibrated gloo point-to-point and 2-rank all-reduce, {link['where']}")
        name = f"emulated:{result.get('cluster')}"
        default_nodes = None
        try:
            from layerplan.runtime import emulate

            default_nodes = emulate.find(result.get("cluster") or "default").hosts
        except LayerplanError:
            pass
        default_nodes = default_nodes or link["ranks"]
    else:
        nic = hardware.LinkSpec(name="loopback", bandwidth_bytes_per_s=payload, latency_s=lat, efficiency=1.0,
                                note="calibrated gloo point-to-point over loopback (bandwidth = measured payload rate)")
        name = "calibrated-local"
        default_nodes = cores
    comm_cpu, reduce_cpu = comm_cpu_costs(link)
    eff_cores = (comp.get("effective_cores") or {}).get("median")
    capacity = None if not eff_cores else min(float(cores), max(eff_cores, 1e-3))
    sync = result.get("synchronized_steps") or {}
    over = None
    if sync.get("capacity"):  # what distributed steps get: their ranks run in lockstep
        capacity = min(float(cores), max(sync["capacity"]["median"], 1e-3))
        # time slicing never gives more than one process per core does (more is noise)
        over = min(capacity, max(sync["oversubscribed_capacity"]["median"], 1e-3))
    wait = max(0.0, (sync.get("collective_wait_s") or {}).get("median", 0.0))
    return hardware.ClusterSpec(name=name, nodes=nodes or default_nodes, device=device, nic=nic, shared_cores=cores,
                                comm_cpu_s_per_byte=comm_cpu, reduce_cpu_s_per_byte=reduce_cpu,
                                shared_core_capacity=capacity, oversubscribed_core_capacity=over,
                                oversubscribed_wait_s=(result.get("rounds") or {}).get("oversubscribed_wait_s", 0.0),
                                oversubscribed_message_cpu_s=((result.get("rounds") or {}).get("messages") or {}).get(
                                    "oversubscribed_message_cpu_s", 0.0),
                                collective_wait_s=wait)


def comm_cpu_costs(link: dict) -> tuple[float, float]:
    """(comm_cpu_s_per_byte, reduce_cpu_s_per_byte) from a loopback link section (0, 0 for an
    emulated one, whose rate limit hides the CPU). On loopback, moving bytes costs only CPU: the
    point-to-point payload rate R keeps each end busy, so each end spends 1/R per byte. A 2-rank
    ring all-reduce of S bytes has each rank send S, receive S and reduce S/2 on its own core, so
    S / bus = 2S/R + (S/2)·c_red, i.e. c_red = 2·(1/bus − 2/R) (nccl-tests' bus bandwidth).

    c_red is a difference of two rates, so both are taken at the same message size where the
    point-to-point sizes include the all-reduce's: the rate fitted over 1 KiB–16 MiB read 5.0–5.3
    GB/s here while 16 MiB messages alone moved 3.7–4.9 GB/s, and the fitted rate put c_red at
    0.6–1.2 ns/B against 0.3 ns/B from one size (which the rows at 10 Gbit/s confirm: DDP's
    steps with 4 workers were predicted 24–30% slow with 1.2 ns/B)."""
    if link.get("configured_bytes_per_s"):
        return 0.0, 0.0
    comm = 1.0 / link["payload_bytes_per_s"]["median"]
    row = link.get("allreduce", {}).get("2")
    if not row:
        return comm, 0.0
    rate = 1.0 / comm
    sizes, times = link.get("sizes_bytes") or [], link.get("p2p_time_s") or []
    if row["bytes"] in sizes and len(times) == len(sizes) and times[sizes.index(row["bytes"])] > 0:
        rate = row["bytes"] / times[sizes.index(row["bytes"])]
    return comm, max(0.0, 2.0 * (1.0 / row["bus_bytes_per_s"]["median"] - 2.0 / rate))


def summary_lines(result: dict) -> list[str]:
    """The measured figures, one per line, for people (and the cluster file's header)."""
    c, ln = result["compute"], result["link"]

    def f(d: dict, fmt) -> str:
        return f"{fmt(d['median'])} (spread {d['spread']:.1%})"

    lines = [
        f"compute, 1 thread: {f(c['per_thread_flops_per_s'], units.format_flops_rate)} = "
        f"{c['share_of_peak_per_thread']['median']:.1%} of the {c['device_preset']} peak"
        + (f", {c['per_thread_flops_per_s']['median'] / c['this_cpu_peak_flops_per_s']:.1%} of this core's nominal "
           f"{units.format_flops_rate(c['this_cpu_peak_flops_per_s'])} (FLOP a cycle × clock, /proc/cpuinfo)"
           if c.get("this_cpu_peak_flops_per_s") else "")
        + f" (conv {units.format_flops_rate(c['per_thread_conv_flops_per_s']['median'])}, "
        f"linear {units.format_flops_rate(c['per_thread_linear_flops_per_s']['median'])})",
        f"compute, {c['shared_processes']} processes at once: {f(c['shared_flops_per_s'], units.format_flops_rate)} "
        f"in all ({c['effective_cores']['median']:.2f} cores' worth)",
        f"fitted compute_efficiency: {f(c['compute_efficiency'], lambda v: f'{v:.3f}')} (conv layers "
        f"{c['conv_efficiency']['median']:.3f}, fully connected {c['fc_efficiency']['median']:.3f})"
        if "fc_efficiency" in c else f"fitted compute_efficiency: {f(c['compute_efficiency'], lambda v: f'{v:.3f}')}",
        *([f"memory bandwidth (SGD update, 1 thread): {units.format_bytes(c['mem_bandwidth_bytes_per_s'])}/s"
           + ("" if not c.get("update_bandwidth") else " (by parameter bytes: " + ", ".join(
               f"{units.format_bytes(b)} {units.format_bytes(r)}/s" for b, r in c["update_bandwidth"]) + ")")]
          if "mem_bandwidth_bytes_per_s" in c else []),
        *(["memory bandwidth (sum of two gradients, 1 thread) by parameter bytes: " + ", ".join(
            f"{units.format_bytes(b)} {units.format_bytes(r)}/s" for b, r in c["sum_bandwidth"])]
          if c.get("sum_bandwidth") else []),
        f"link ({ln['where']}): latency {f(ln['latency_s'], units.format_seconds)}, "
        f"payload {f(ln['payload_bytes_per_s'], units.format_bandwidth)}",
    ]
    if "efficiency" in ln:
        lines.append(f"link efficiency (payload / {units.format_bandwidth(ln['configured_bytes_per_s'])}): "
                     f"{f(ln['efficiency'], lambda v: f'{v:.3f}')}")
    for n, row in ln["allreduce"].items():
        extra = f", {row['efficiency']['median']:.3f} of the line rate" if "efficiency" in row else ""
        lines.append(f"all-reduce {units.format_bytes(row['bytes'], binary=True)} on {n} ranks: bus "
                     f"{f(row['bus_bytes_per_s'], units.format_bandwidth)} = {row['vs_p2p']['median']:.2f}× p2p{extra}")
    lead = ln.get("flow_lead")
    if lead:
        firsts = [statistics.median(row) for row in lead["first_over_last"]]
        lines.append(f"{lead['receivers']} flows leaving one host together: the first in at " + ", ".join(
            f"{x:.2f}" for x in firsts) + " of the last's time for " + ", ".join(
            units.format_bytes(s) for s in lead["sizes_bytes"]) + f" each (medians): flow_lead_bytes "
            f"{units.format_bytes(lead['flow_lead_bytes'])}")
    rounds = result.get("rounds") or {}
    if rounds.get("round_s"):
        lines.append("ring round of a small all-reduce (loopback): " + ", ".join(
            f"{units.format_seconds(row['median'])} with {n} ranks" for n, row in rounds["round_s"].items())
            + f" on {result['machine']['cores']} cores: oversubscribed_wait_s "
              f"{units.format_seconds(rounds['oversubscribed_wait_s'])}")
    msgs = rounds.get("messages") or {}
    if msgs.get("ranks"):
        lines.append(f"a message between {msgs['ranks']} ranks in pairs on {result['machine']['cores']} cores, after "
                     f"{units.format_seconds(msgs['burst_cpu_s'])} of compute each: "
                     f"{units.format_seconds(msgs['oversubscribed_message_cpu_s'])} of CPU at each end "
                     f"(oversubscribed_message_cpu_s; the geometric mean of {len(msgs['cpu_s_per_end']['values'])} "
                     f"figures, {units.format_seconds(min(msgs['cpu_s_per_end']['values']))}–"
                     f"{units.format_seconds(max(msgs['cpu_s_per_end']['values']))})")
    sync = result.get("synchronized_steps") or {}
    if sync.get("capacity"):
        lines.append(f"training steps in lockstep (a barrier each), against one process alone: {sync['cores']} processes "
                     f"{f(sync['capacity'], lambda v: f'{v:.2f}')} cores' worth, {2 * sync['cores']} processes "
                     f"{f(sync['oversubscribed_capacity'], lambda v: f'{v:.2f}')} (" + ", ".join(
                         f"{k} {v['capacity']['median']:.2f}/{v['oversubscribed_capacity']['median']:.2f}"
                         for k, v in sync["per_net"].items()) + ")")
        if sync.get("alone_other_cores", 0.0) > ALONE_OTHER_CORES_MAX:
            lines.append(f"warning: other work kept {sync['alone_other_cores']:.2f} cores busy while one process was "
                         f"timed alone, after {ALONE_TRIES} tries: the capacities above read high — calibrate on an "
                         "idle machine")
        if sync.get("collective_wait_s"):
            calls = sync.get("extra_calls", 1)
            lines.append(f"{calls} more small all-reduce{'s' if calls > 1 else ''} a step in lockstep, between its "
                         f"layers: {f(sync['collective_wait_s'], units.format_seconds)} more a step each "
                         "(collective_wait_s)")
    lines += steadiness_lines(result)
    if result.get("profile"):
        p = result["profile"]
        lines.append(f"profiled {len(p['layers'])} distinct layers of {', '.join(p['nets'])} at batch "
                     f"{', '.join(map(str, p['batches']))} (their predictions use the measured times)")
        for n in p.get("whole", []):
            at = ", ".join(f"{fs:.2f}×/{bs:.2f}× at batch {b}" for b, fs, bs in zip(n["batches"], n["fwd_scale"], n["bwd_scale"]))
            what = {"conv": "conv phase's (whole less FC)", "fc": "FC phase's"}.get(n.get("phase"), "whole")
            lines.append(f"{n['net']}'s {what} pass against the sum of its layers timed alone (forward/backward): {at} "
                         "(layer times scaled to the pass)")
    return lines


def save(result: dict, path: str | Path, nodes: int | None = None) -> hardware.ClusterSpec:
    """Write ``to_cluster(result)`` as a cluster file (.json: JSON; otherwise YAML, headed by the
    measured figures as comments). ``hardware.load_cluster(path)`` reads it back unchanged."""
    spec = to_cluster(result, nodes)
    p = Path(path)
    hardware.save_cluster(spec, p)
    if p.suffix.lower() != ".json":
        head = [f"# layerplan calibrate --on {result['on']}"
                + (f" --name {result['cluster']}" if result.get("cluster") else "")
                + f" ({result['repeats']} repeats{', quick' if result.get('quick') else ''}, {result['machine']['when']})"]
        head += [f"# {line}" for line in summary_lines(result)]
        p.write_text("\n".join(head) + "\n" + p.read_text())
    return spec


# ---- two calibrations side by side (``layerplan calibrate --compare A B``) -----------------------
def load_result(path: str | Path) -> dict:
    """A calibration result from ``path``: the JSON ``calibrate --json`` prints, or a ``validate
    --out`` folder (its ``calibration.json``). Anything else: ``ConfigError`` saying what to give."""
    p = Path(path)
    if p.is_dir():
        if not (p / "calibration.json").is_file():
            raise ConfigError(f"{p} holds no calibration.json (give `layerplan calibrate --json > FILE`'s output, "
                              "or a `layerplan validate --out DIR` folder)")
        p = p / "calibration.json"
    if not p.is_file():
        raise ConfigError(f"no such calibration: {p}")
    if p.suffix.lower() in (".yaml", ".yml"):
        raise ConfigError(f"{p} is a cluster file, which keeps only the fitted figures: compare the full results "
                          "(`layerplan calibrate --json > A.json`, or a `validate --out DIR` folder)")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{p} is not a calibration's JSON ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or "compute" not in doc or "format" not in doc:
        raise ConfigError(f"{p} is not a calibration's JSON (no 'format' and 'compute'): give "
                          "`layerplan calibrate --json > FILE`'s output")
    return doc


def _is_spread(d: Any) -> bool:
    return isinstance(d, dict) and {"median", "spread", "values"} <= d.keys() and isinstance(d["values"], list)


def spread_figures(result: dict) -> dict[str, dict]:
    """Every figure of ``result`` stated with its spread (``spread``'s {median, spread, values}),
    by its dotted path (``compute.per_thread_flops_per_s``, ``link.allreduce.2.bus_bytes_per_s``);
    the bookkeeping sections (``steadiness``, ``durations_s``, ``machine``) are left out."""
    out: dict[str, dict] = {}

    def walk(node: Any, path: str) -> None:
        if _is_spread(node):
            if node["values"] and node["median"]:
                out[path] = node
            return
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))

    for section, node in result.items():
        if section not in ("steadiness", "durations_s", "machine"):
            walk(node, section)
    return out


def compare(a: dict, b: dict) -> dict:
    """Two calibrations figure by figure. A figure *agrees* when its medians lie apart (|a − b| /
    their mean) by no more than the larger of the two runs' stated spreads ((max − min) / median of
    each run's repeats) — what "two runs agree within their stated spread" asks; ``overlap`` says
    whether the two runs' ranges of repeats meet. Also: per section counts, figures only one run
    has, and the setup differences (``notes``) that make figures incomparable."""
    fa, fb = spread_figures(a), spread_figures(b)
    rows = []
    for path in [p for p in fa if p in fb]:
        x, y = fa[path], fb[path]
        mean = (x["median"] + y["median"]) / 2.0
        apart = abs(x["median"] - y["median"]) / abs(mean) if mean else 0.0
        stated = max(x["spread"], y["spread"])
        rows.append({"figure": path, "section": path.split(".", 1)[0], "a": x["median"], "b": y["median"],
                     "apart": apart, "a_spread": x["spread"], "b_spread": y["spread"], "stated_spread": stated,
                     "agree": apart <= stated + 1e-12,
                     "overlap": min(max(x["values"]), max(y["values"])) >= max(min(x["values"]), min(y["values"]))})
    sections: dict[str, dict] = {}
    for r in rows:
        s = sections.setdefault(r["section"], {"figures": 0, "agree": 0, "overlap": 0})
        s["figures"] += 1
        s["agree"] += r["agree"]
        s["overlap"] += r["overlap"]
    notes = []
    for key, what in (("on", "measured on"), ("quick", "quick"), ("repeats", "repeats")):
        if a.get(key) != b.get(key):
            notes.append(f"{what}: {a.get(key)!r} against {b.get(key)!r}")
    ma, mb = a.get("machine") or {}, b.get("machine") or {}
    for key in ("cpu", "cores"):
        if ma.get(key) != mb.get(key):
            notes.append(f"machine {key}: {ma.get(key)!r} against {mb.get(key)!r}")
    for name, doc in (("A", a), ("B", b)):
        kept = [s for s, rec in (doc.get("steadiness") or {}).items() if rec.get("kept_disturbed")]
        if kept:
            notes.append(f"{name} kept disturbed readings of {', '.join(kept)} (its spread there may be wide)")
    return {"a_when": ma.get("when"), "b_when": mb.get("when"), "notes": notes,
            "figures": len(rows), "agree": sum(r["agree"] for r in rows), "overlap": sum(r["overlap"] for r in rows),
            "sections": sections, "rows": rows,
            "only_in_a": [p for p in fa if p not in fb], "only_in_b": [p for p in fb if p not in fa]}


def format_figure(path: str, value: float) -> str:
    """``value`` in the unit its name says (…_flops_per_s, …_bytes_per_s, …_s, …_s_per_…; the last
    part of ``path`` that is not a count of ranks), else 4 digits."""
    name = next((part for part in reversed(path.split(".")) if not part.isdigit()), "")
    if name.endswith("flops_per_s"):
        return units.format_flops_rate(value)
    if name.endswith("bytes_per_s"):
        return units.format_bandwidth(value)
    if name.endswith("_s") or "_s_per_" in name:
        return units.format_seconds(value)
    return f"{value:.4g}"


# ---- worker processes (python -m layerplan.calibrate compute|link --config JSON) ----------------
def _emit(**msg) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


PROBE_WINDOW_S = 0.3


def speed_probe(window_s: float = PROBE_WINDOW_S, threads: int = 1) -> float:
    """This machine's compute speed now: FLOP/s of a fixed convolution + matrix product, forward and
    backward on one thread, the fastest call within ``window_s`` (the fastest: a call that another
    process interrupts is noise, a slower machine slows every call). ``validate`` runs it before
    every configuration and records it against the same probe at calibration time.

    ``threads`` > 1: the same calls on that many threads at once (one core each, as a run's ranks
    load the shared cores), FLOP/s per thread of the median call — the speed of a loaded machine,
    which need not move with one thread's (turbo, shared caches, the host's other tenants)."""
    import statistics

    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)

        def make():
            conv = nn.Conv2d(128, 128, 3, padding=1)
            x = torch.randn(16, 128, 16, 16, generator=gen, requires_grad=True)
            fc = nn.Linear(2048, 2048)
            z = torch.randn(64, 2048, generator=gen, requires_grad=True)

            def call() -> None:
                conv(x).sum().backward()
                fc(z).sum().backward()
            return call

        calls = [make() for _ in range(threads)]
        with FlopCounterMode(display=False) as counter:  # also the warm-up
            calls[0]()
        flops = counter.get_total_flops()
        times = _timed_calls(calls, window_s)
        if threads == 1:
            return flops / min(times[0])
        return flops / statistics.median(t for ts in times for t in ts)
    finally:
        torch.set_num_threads(before)


def _timed_calls(calls: Sequence[Callable[[], None]], window_s: float) -> list[list[float]]:
    """Each of ``calls`` on its own thread at once (on the caller's thread where there is one),
    called over and over for ``window_s``: the seconds of each call, per thread."""
    import threading

    times: list[list[float]] = [[] for _ in calls]

    def loop(j: int, end: float) -> None:
        while True:
            t0 = time.perf_counter()
            calls[j]()
            t1 = time.perf_counter()
            times[j].append(t1 - t0)
            if t1 >= end:
                return

    end = time.perf_counter() + window_s
    if len(calls) == 1:
        loop(0, end)
        return times
    workers = [threading.Thread(target=loop, args=(j, end)) for j in range(len(calls))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return times


NET_PROBE_WINDOW_S = 0.4
"""``net_probe``'s window: about one vgg16_cifar pass a thread at batch 16 on a 2-core host."""
_NET_PROBE_CALLS: dict[tuple[str, int, int], list[Callable[[], None]]] = {}


def net_probe(net_name: str, window_s: float = NET_PROBE_WINDOW_S, threads: int = 2, batch: int = 16) -> float:
    """Seconds of zoo net ``net_name``'s own training pass now (cross-entropy forward and backward
    of the whole net at ``batch``, one thread each), the median over ``threads`` threads running it
    at once for ``window_s`` (at least one pass each): the work a validate row runs, where
    ``speed_probe``'s convolution and matrix product are a stand-in for it. A host's other tenants
    need not slow the two alike: in one full run both cores' probe read a median 0.81× its
    calibration-time speed around the rows while the rows' steps reached their marked points at
    0.83× the time predicted at that pace (their compute ran at the calibration's speed). The net
    and its inputs are built once per (net, threads, batch) and kept."""
    import copy

    import torch

    def build() -> list[Callable[[], None]]:
        from layerplan.netspec import zoo

        module, in_shape = zoo.build(net_name)
        module.train()
        gen = torch.Generator().manual_seed(0)

        def make(m):
            params = [p for p in m.parameters() if p.requires_grad]
            x = torch.randn(batch, *in_shape, generator=gen)
            with torch.no_grad():
                classes = m(x[:1]).shape[-1]
            y = torch.randint(0, classes, (batch,), generator=gen)

            def call() -> None:
                torch.autograd.grad(torch.nn.functional.cross_entropy(m(x), y), params)
            return call

        return [make(module if j == 0 else copy.deepcopy(module)) for j in range(threads)]

    return _kept_calls_median_s(_NET_PROBE_CALLS, (net_name, threads, batch), build, window_s)


def _kept_calls_median_s(kept: dict, key: tuple, build: Callable[[], list[Callable[[], None]]],
                         window_s: float) -> float:
    """The median seconds of a call of the calls ``kept[key]`` — built by ``build()`` and warmed up
    (the allocator, the kernels) the first time — each on its own thread at once for ``window_s``,
    torch at one thread each (restored after)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        calls = kept.get(key)
        if calls is None:
            calls = build()
            for c in calls:
                c()
            kept[key] = calls
        return statistics.median(t for ts in _timed_calls(calls, window_s) for t in ts)
    finally:
        torch.set_num_threads(before)


MEMORY_PROBE_WINDOW_S = 0.1


def memory_probe(window_s: float = MEMORY_PROBE_WINDOW_S, threads: int = 2) -> float:
    """Seconds of a memory-bound call now, the median over ``threads`` threads running it at once
    (one core each, as a run's ranks load the shared cores) for ``window_s``: batch norm, ReLU and
    a residual add, forward and backward, over a 2 MB activation (resnet_cifar's first stage at a
    batch of 32) — the work ``speed_probe``'s convolution and matrix product do not time. A host's
    other tenants can slow the caches and memory without slowing those: in host-slowed full runs
    the rows of resnet_cifar, rich in such layers, ran up to 1.3× as long as both cores' compute
    probe said. ``validate`` runs it around every row (``memory_speed``) against its reading at
    calibration time and predicts the layers that are not matrix products at its pace over the rows
    before (``validate.MEMORY_PACE``)."""
    import statistics

    import torch
    from torch import nn

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)

        def make():
            bn = nn.BatchNorm2d(16)
            x = torch.randn(32, 16, 32, 32, generator=gen, requires_grad=True)

            def call() -> None:
                (torch.relu(bn(x)) + x).sum().backward()
            return call

        calls = [make() for _ in range(threads)]
        for c in calls:  # warm-up
            c()
        return statistics.median(t for ts in _timed_calls(calls, window_s) for t in ts)
    finally:
        torch.set_num_threads(before)


FC_PROBE_WINDOW_S = 0.3
"""``fc_probe``'s window: about six calls a thread on a 2-core host."""
FC_PROBE_FEATURES = 4096
"""``fc_probe``'s layer: 4096 inputs and outputs, alexnet_cifar's and vgg16_cifar's largest FC
layer (64 MiB of weights, more than a core's share of most caches)."""
FC_PROBE_BATCH = 16
_FC_PROBE_CALLS: dict[tuple[int, int], list[Callable[[], None]]] = {}


def fc_probe(window_s: float = FC_PROBE_WINDOW_S, threads: int = 2, features: int = FC_PROBE_FEATURES,
             batch: int = FC_PROBE_BATCH) -> float:
    """Seconds of a large FC layer's training pass at a small batch now — its forward, its backward
    (the input's gradient and the weights') and an SGD step with momentum over its weights — the
    median over ``threads`` threads running it at once for ``window_s``, each its own layer. At a
    batch of 16 such a pass does 8 FLOP a byte of its weights and streams them some six times: the
    caches and memory bound it, not the cores' arithmetic that ``speed_probe`` and the nets'
    passes (``net_probe``, convolutions mostly) time, nor the small activations ``memory_probe``
    keeps in the caches. A host's other tenants slowed it apart from those: in vf157 the calibration
    process read alexnet_cifar's FC phase at batch 16 in 17.6 ms forward and an hour later in 22.3
    ms, while its whole training pass on both cores ran 4-8% faster than at calibration time, and the
    compute groups' merged FC server — four such passes and updates a step — ran 17% slow of the
    model. ``validate`` runs it before every row against its reading at calibration time
    (``fc_speed``). The products are written in place (``out=``), the step is the runs' SGD
    (``runtime.optim.sgd``), the layers are kept between calls."""
    import torch

    from layerplan.runtime.optim import sgd

    def build() -> list[Callable[[], None]]:
        gen = torch.Generator().manual_seed(0)

        def make():
            w = torch.nn.Parameter(torch.randn(features, features, generator=gen) * features ** -0.5)
            w.grad = torch.empty_like(w)
            opt = sgd([w], lr=1e-9, momentum=0.9)
            x, dy = torch.randn(batch, features, generator=gen), torch.randn(batch, features, generator=gen)
            y, dx = torch.empty(batch, features), torch.empty(batch, features)

            def call() -> None:
                with torch.no_grad():
                    torch.mm(x, w.t(), out=y)  # forward
                    torch.mm(dy, w, out=dx)  # backward: the input's gradient
                    torch.mm(dy.t(), x, out=w.grad)  # and the weights'
                opt.step()
            return call

        return [make() for _ in range(threads)]

    return _kept_calls_median_s(_FC_PROBE_CALLS, (features, batch), build, window_s)


def _probe_worker(cfg: dict) -> None:
    """``speed_probe`` on ``cfg["threads"]`` threads at every "probe" line of stdin, until "stop"."""
    speed_probe(0.05, threads=cfg["threads"])  # torch imported, the calls warmed up
    _emit(event="ready")
    for line in sys.stdin:
        if line.strip() == "stop":
            break
        _emit(event="probe", flops_per_s=speed_probe(cfg["window_s"], threads=cfg["threads"]))
    _emit(event="done")


def _per_call_s(fn, min_iters: int, window_s: float) -> float:
    """Seconds per call of ``fn``: called at least ``min_iters`` times and for at least ``window_s``."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed_s = time.perf_counter() - t0
        if n >= min_iters and elapsed_s >= window_s:
            return elapsed_s / n


def _bench_layers(nets: Sequence[str], batches: Sequence[int]) -> list[dict]:
    """Every distinct Conv2d / Linear of ``nets`` (input shape included), with its multiplicity."""
    import torch
    from torch import nn

    from layerplan.netspec import zoo

    found: dict[tuple, dict] = {}
    for net_name in nets:
        with torch.device("meta"):
            net, in_shape = zoo.build(net_name)
        seen: list[tuple[str, nn.Module, tuple, tuple]] = []
        hooks = [m.register_forward_hook(lambda m, i, o, n=n: seen.append((n, m, tuple(i[0].shape[1:]), tuple(o.shape[1:]))))
                 for n, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        with torch.no_grad():
            net(torch.empty(1, *in_shape, device="meta"))
        for h in hooks:
            h.remove()
        for idx, (mod_name, m, ishape, oshape) in enumerate(seen):
            if isinstance(m, nn.Conv2d):
                arch = ("conv", m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups,
                        m.bias is not None, ishape, idx == 0)
            else:
                arch = ("fc", m.in_features, m.out_features, m.bias is not None, ishape, idx == 0)
            if arch in found:
                found[arch]["count"] += 1
            else:
                found[arch] = {"arch": arch, "name": f"{net_name}.{mod_name}", "module": m, "in_shape": ishape,
                               "out_shape": oshape, "first": idx == 0, "count": 1}
    out = []
    for b in batches:
        for d in found.values():
            out.append({**d, "batch": b, "key": f"{d['name']}@{b}"})
    return out


def _make_step(item: dict):
    """(forward+backward closure, fwd FLOPs, fwd+bwd FLOPs) of one layer at its batch, FLOPs
    counted by FlopCounterMode (2 per multiply-add; ARCHITECTURE/EMULATION.md)."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    m = item["module"]
    if isinstance(m, nn.Conv2d):
        mod = nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups,
                        bias=m.bias is not None)
    else:
        mod = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
    x = torch.randn(item["batch"], *item["in_shape"], requires_grad=not item["first"])
    params = list(mod.parameters())
    inputs = params + ([] if item["first"] else [x])  # the net's first layer computes no input-grad
    g = torch.randn(item["batch"], *item["out_shape"])

    def step():
        y = mod(x)
        torch.autograd.grad(y, inputs, g)

    with FlopCounterMode(display=False) as fwd_counter:
        y = mod(x)
    with FlopCounterMode(display=False) as bwd_counter:
        torch.autograd.grad(y, inputs, g)
    fwd = int(fwd_counter.get_total_flops())
    return step, fwd, fwd + int(bwd_counter.get_total_flops()), sum(p.numel() for p in params) * 4


UPDATE_PARAMS = 8 * 2**20  # 32 MiB of float32 parameters
UPDATE_CURVE_PARAMS = (2**18, 2**21, UPDATE_PARAMS, 2**25)
"""Parameter counts the update bandwidth is measured at (1, 8, 32, 128 MiB of float32: from the
caches to DRAM; one 32 MiB measurement read 17.5 GB/s in one calibration and 27.2 in another,
the size at which the caches stop helping). The 32 MiB point is also ``mem_bandwidth_bytes_per_s``."""


def _update_bytes_per_s(params: int) -> float:
    """Memory bandwidth as the engine's SGD update uses it (``strategies.base.update_s``: read the
    gradient, parameters and momentum, write parameters and momentum = 5 × the parameter bytes),
    from the runs' SGD with momentum (``runtime.optim.sgd``: torch's fused kernel) on one thread over
    ``params`` parameters: the lowest of 5 steps."""
    return 5 * params * 4 / _flat_update_s(params)


def _flat_update_s(params: int) -> float:
    """Seconds of one step of the runs' SGD with momentum (``runtime.optim.sgd``) over one flat tensor
    of ``params`` parameters, on one thread: the lowest of 5 steps."""
    import torch

    from layerplan.runtime.optim import sgd

    p = torch.nn.Parameter(torch.randn(max(1, params)))
    p.grad = torch.randn_like(p)
    opt = sgd([p], lr=1e-3, momentum=0.9)
    opt.step()  # creates the momentum buffer
    return _lowest_s(opt.step)


def _lowest_s(fn, calls: int = 5) -> float:
    """Seconds of the fastest of ``calls`` calls of ``fn``."""
    best = math.inf
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _update_curve() -> list[list[float]]:
    """[parameter bytes, update bandwidth] at ``UPDATE_CURVE_PARAMS`` (DeviceSpec.update_bandwidth)."""
    return [[4.0 * n, _update_bytes_per_s(n)] for n in UPDATE_CURVE_PARAMS]


def _sum_bytes_per_s(params: int) -> float:
    """Memory bandwidth of a server's sum of gradients (``runtime.roles.summed``: two read, one
    written = 3 × the parameter bytes) over ``params`` float32 parameters, on one thread: the
    lowest of 5 sums."""
    import torch

    a, b, out = torch.randn(max(1, params)), torch.randn(max(1, params)), torch.empty(max(1, params))
    torch.add(a, b, out=out)  # warm-up: the pages of out
    return 3 * params * 4 / _lowest_s(lambda: torch.add(a, b, out=out))


def _sum_curve() -> list[list[float]]:
    """[parameter bytes, sum bandwidth] at ``UPDATE_CURVE_PARAMS`` (DeviceSpec.sum_bandwidth)."""
    return [[4.0 * n, _sum_bytes_per_s(n)] for n in UPDATE_CURVE_PARAMS]


def _compute_worker(cfg: dict) -> None:
    import torch

    torch.set_num_threads(1)
    items = _bench_layers(cfg["nets"], cfg["batches"])
    steps = {}
    layers = []
    for it in items:
        step, fwd, total, pbytes = _make_step(it)
        step()  # warm-up: allocator, kernels
        steps[it["key"]] = step
        layers.append({"key": it["key"], "kind": it["arch"][0], "op": "Conv2d" if it["arch"][0] == "conv" else "Linear",
                       "batch": it["batch"], "count": it["count"], "first": it["first"], "fwd_flops": fwd,
                       "flops": total, "param_bytes": pbytes, "in_bytes": math.prod(it["in_shape"]) * 4,
                       "out_bytes": math.prod(it["out_shape"]) * 4})
    _emit(event="ready", layers=layers)
    rep = 0
    while (command := sys.stdin.readline().strip()) in ("go", "update"):  # as the parent says; "stop" ends
        if command == "update":  # its 32 MiB point is the device's mem_bandwidth_bytes_per_s
            _emit(event="update", update_curve=_update_curve(), sum_curve=_sum_curve())
            continue
        times = {}  # alone or with the others
        for key, step in steps.items():  # a time window per layer keeps concurrent processes in step
            times[key] = _per_call_s(step, cfg["min_iters"], cfg["window_s"])
        _emit(event="repeat", rep=rep, time_s=times)
        rep += 1
    _emit(event="done")


def _link_worker(cfg: dict) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    pair = dist.new_group([0, 1])  # every rank creates every group, in the same order
    groups = {n: (dist.new_group(list(range(n))) if n < world else None) for n in cfg["allreduce_ranks"]}
    ack = torch.zeros(ACK_BYTES // 4)
    count = torch.zeros(1, dtype=torch.int64)
    for rep in range(cfg["repeats"]):
        p2p = []
        est_s = 1e-3
        for size in cfg["sizes"]:
            buf = torch.ones(size // 4)
            if rank == 0:  # rank 0 picks the iterations from the last size's time and tells rank 1
                count[0] = max(cfg["min_iters"], min(200, math.ceil(cfg["window_s"] / est_s)))
                dist.send(count, 1, group=pair)
            elif rank == 1:
                dist.recv(count, 0, group=pair)
            if rank > 1:
                continue
            times = []
            for _ in range(int(count[0]) + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(buf, 1, group=pair)
                    dist.recv(ack, 1, group=pair)
                else:
                    dist.recv(buf, 0, group=pair)
                    dist.send(ack, 0, group=pair)
                times.append(time.perf_counter() - t0)
            typical = lower_quartile(times[1:])
            p2p.append(typical)
            est_s = typical * 4  # sizes grow ×4
        dist.barrier()
        ar = {}
        for n, group in groups.items():
            if rank < n:
                t = torch.ones(cfg["allreduce_bytes"] // 4)
                times = []
                for _ in range(cfg["allreduce_iters"] + 1):
                    t0 = time.perf_counter()
                    dist.all_reduce(t, group=group)
                    times.append(time.perf_counter() - t0)
                # one 16 MiB all-reduce's time swings 3× from one call to the next here (0.9–3.0
                # GB/s of bus rate on loopback): like the point-to-point times, the lower quartile,
                # of 32 calls (comm_cpu_costs' c_red read 0.22–0.50 ns/B over four calibrations
                # with 12 calls each, 0.27–0.30 with 32)
                ar[str(n)] = lower_quartile(times[1:])
            dist.barrier()
        if rank == 0:
            _emit(event="repeat", rep=rep, p2p_s=p2p, allreduce_s=ar)
    dist.barrier()
    _emit(event="done")


def _profile_items(net_name: str) -> list[dict]:
    """Every module layer of zoo net ``net_name`` that can be timed on its own — one input, the
    output of one parent (or the net's input) — with its ``profile_key`` and a CPU copy of the
    module. Layer names follow the analysis (module path, ``path_k`` for its k-th further call)."""
    import copy

    import torch.fx as fx

    from layerplan.cost.compute import input_bytes, profile_key
    from layerplan.netspec import zoo
    from layerplan.netspec.load import resolve_model

    net, _ = resolve_model(net_name)
    module, _ = zoo.build(net_name)
    module.train()
    try:
        gm = fx.symbolic_trace(module)
    except Exception as e:  # noqa: BLE001 — fx raises many types for untraceable code
        raise CalibrationError(f"{net_name}: cannot profile its layers (torch.fx cannot trace it: {e})") from None
    by_name = {layer.name: layer for layer in net.layers}
    calls: dict[str, int] = {}
    items = []
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        path = str(node.target)
        k = calls.get(path, 0)
        calls[path] = k + 1
        layer = by_name.get(path if k == 0 else f"{path}_{k}")
        if layer is None or len(layer.parents) > 1:
            continue
        in_shape = net.layer(layer.parents[0]).out_shape if layer.parents else net.input_shape
        mod = copy.deepcopy(gm.get_submodule(path))
        for m in mod.modules():
            if getattr(m, "inplace", False):
                m.inplace = False  # the input of a timed layer is a leaf that requires grad
        items.append({"key": profile_key(layer, input_bytes(net, layer)), "layer": layer.name, "net": net_name,
                      "module": mod, "in_shape": tuple(in_shape), "input_grad": bool(layer.parents)})
    return items


def lower_passes(a: dict, b: dict) -> dict:
    """Two timings of the same whole pass (``_profile_worker``): per batch, the one whose forward +
    backward is lower, forward and backward together (they are one window apart)."""
    out = {**a, "fwd_s": [], "bwd_s": []}
    for i in range(len(a["batches"])):
        pick = a if a["fwd_s"][i] + a["bwd_s"][i] <= b["fwd_s"][i] + b["bwd_s"][i] else b
        out["fwd_s"].append(pick["fwd_s"][i])
        out["bwd_s"].append(pick["bwd_s"][i])
    return out


def _profile_worker(cfg: dict) -> None:
    """Forward, then forward + backward, of every distinct layer of ``cfg["nets"]`` at each batch:
    seconds per call (a time window per measurement, the lowest of ``repeats`` windows); and of
    each net's whole passes, before and after the layers (``lower_passes`` of the two)."""
    import torch

    from layerplan.netspec.load import resolve_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    seen: dict[str, dict] = {}
    counts: dict[str, dict[str, dict[str, int]]] = {}  # per net and phase: how many of its layers each key times
    for net_name in cfg["nets"]:
        fc_names = {layer.name for layer in resolve_model(net_name)[0].fc_layers}
        for it in _profile_items(net_name):
            seen.setdefault(it["key"], it)
            per = counts.setdefault(net_name, {}).setdefault("fc" if it["layer"] in fc_names else "conv", {})
            per[it["key"]] = per.get(it["key"], 0) + 1
    passes = {net_name: _phase_modules(net_name, phases) for net_name, phases in counts.items()}
    _emit(event="ready", layers=len(seen), nets=sum(len(v) for v in passes.values()))

    def window(fn) -> float:
        return min(_per_call_s(fn, cfg["min_iters"], cfg["window_s"]) for _ in range(cfg["repeats"]))

    def typical(fn) -> float:
        """A whole pass's median call, at least ``WHOLE_PASS_CALLS`` calls and ``whole_window_s``
        seconds: the statistic validate compares with (a run's median step), where the lowest of a
        few short windows picks the luckiest calls."""
        times, t0 = [], time.perf_counter()
        while len(times) < WHOLE_PASS_CALLS or time.perf_counter() - t0 < cfg["whole_window_s"]:
            t1 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t1)
        return statistics.median(times)

    def time_passes() -> list[dict]:
        """Every whole pass, as training runs it: forward and forward + backward (the net's: a training step) per batch."""
        out = []
        for net_name, timed in passes.items():
            for phase, per, module, in_shape, input_grad in timed:
                params = [p for p in module.parameters() if p.requires_grad]
                whole = {"net": net_name, "phase": phase, "counts": per, "batches": [], "fwd_s": [], "bwd_s": []}
                if phase == "net":  # what the step adds to the passes, less the update the model charges
                    whole["update_s"] = _flat_update_s(sum(p.numel() for p in params))
                for b in cfg.get("net_batches", cfg["batches"]) if phase == "net" else cfg["batches"]:
                    x = torch.randn(b, *in_shape, requires_grad=input_grad)
                    inputs = params + ([x] if input_grad else [])

                    def fwd():
                        return module(x)

                    out_t = fwd()
                    g = torch.randn_like(out_t)
                    y = torch.randint(0, out_t.shape[-1], (b,))

                    def fwd_bwd():
                        torch.autograd.grad(module(x), inputs, g)

                    step = _training_step(module, params, x, y) if phase == "net" else fwd_bwd
                    step()
                    t_fwd = typical(fwd)
                    t_all = typical(step) - whole.get("update_s", 0.0)
                    whole["batches"].append(b)
                    whole["fwd_s"].append(t_fwd)
                    whole["bwd_s"].append(max(0.0, t_all - t_fwd))
                out.append(whole)
        return out

    # Whole passes before and after the layers (a minute or more apart), each figure the lower of the
    # two medians: a slow spell of the machine (a host's other tenants) over one of them would scale
    # every layer of the net (here once 1.2x resnet_cifar's, in a calibration 5% slow by its probe).
    before = time_passes()

    for key, it in seen.items():
        mod = it["module"]
        params = [p for p in mod.parameters() if p.requires_grad]
        row = {"key": key, "net": it["net"], "layer": it["layer"], "batches": [], "fwd_s": [], "bwd_s": []}
        for b in cfg["batches"]:
            x = torch.randn(b, *it["in_shape"], requires_grad=it["input_grad"])
            inputs = params + ([x] if it["input_grad"] else [])

            def fwd():
                return mod(x)

            y = fwd()
            g = torch.randn_like(y)

            def fwd_bwd():
                out = mod(x)
                if inputs:
                    torch.autograd.grad(out, inputs, g)

            fwd_bwd()  # warm-up: allocator, kernels
            t_fwd = window(fwd)
            t_all = window(fwd_bwd) if inputs else t_fwd
            row["batches"].append(b)
            row["fwd_s"].append(t_fwd)
            row["bwd_s"].append(max(0.0, t_all - t_fwd))
        _emit(event="layer", row=row)
    after = time_passes()
    for a, b in zip(before, after):
        _emit(event="net", row=lower_passes(a, b))
    _emit(event="done")


def _phase_modules(net_name: str, phases: dict[str, dict[str, int]]):
    """(phase, its layer counts, module, input shape, whether the input needs a gradient) to time
    as whole passes for zoo net ``net_name``: the whole net ("net"), and its FC phase ("fc", cut
    at the phase boundary as the strategies that separate the phases run it: its input is an
    activation whose gradient goes back) when it has one that can be cut. ``measure_profile``
    scales the FC layers to the FC phase's pass and the conv layers to the rest of the whole
    pass: a large FC layer timed alone, call after call, keeps much of its weights in the
    last-level cache, which the FC phase's pass does not (alexnet_cifar's two large layers: 38 and
    67 MB of weights, 105 MB in all); and inside the whole pass the FC weights also evict the conv
    layers' data (the conv phase timed alone ran at the sum of its layers, the whole net at
    1.28× / 1.09× of it)."""
    import torch

    from layerplan.netspec import zoo
    from layerplan.netspec.load import resolve_model
    from layerplan.runtime.split import split_module

    net = resolve_model(net_name)[0]
    module, in_shape = zoo.build(net_name)
    module.train()
    merged: dict[str, int] = {}
    for per in phases.values():
        for k, c in per.items():
            merged[k] = merged.get(k, 0) + c
    out = [("net", merged, module, in_shape, False)]
    if net.boundary is not None and phases.get("fc") and phases.get("conv"):
        try:
            split = split_module(module, net.boundary)
        except LayerplanError:
            return out
        with torch.no_grad():
            act_shape = tuple(split.head(torch.zeros(1, *in_shape)).shape[1:])
        out.append(("fc", phases["fc"], split.tail, act_shape, True))
    return out


def phase_passes(nets: list[dict]) -> list[dict]:
    """The passes ``scale_to_whole_pass`` scales to, from the profile's records: per net with an
    FC phase record, the FC phase's pass and a conv-phase record (its layers' counts) whose times
    are the whole net's less the FC phase's; a net without one, its whole pass."""
    out = []
    for n in nets:
        if n.get("phase") == "fc":
            continue
        fc = next((m for m in nets if m["net"] == n["net"] and m.get("phase") == "fc"), None)
        if fc is None or not set(n["batches"]) <= set(fc["batches"]):
            out.append(n)
            continue
        at = [fc["batches"].index(b) for b in n["batches"]]  # the FC phase's pass at the whole net's batches
        counts = {k: c - fc["counts"].get(k, 0) for k, c in n["counts"].items() if c > fc["counts"].get(k, 0)}
        conv = {"net": n["net"], "phase": "conv", "counts": counts, "batches": list(n["batches"]),
                **{f"{d}_s": [max(0.0, w - fc[f"{d}_s"][i]) for w, i in zip(n[f"{d}_s"], at)] for d in ("fwd", "bwd")}}
        out += [conv, fc]
    return out


def fit_line(batches: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """(fixed_s, per_sample_s) of ``t = fixed + per_sample · batch``, least squares; through the
    origin (fixed 0) when one batch was measured or the line would have a negative slope or
    intercept (noise on a layer whose time barely grows with the batch)."""
    import numpy as np

    b = np.asarray(batches, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if b.size >= 2 and len(set(b.tolist())) >= 2:
        per, fixed = np.polyfit(b, t, 1)
        if per >= 0 and fixed >= 0:
            return float(fixed), float(per)
        if per < 0:
            return float(np.mean(t)), 0.0
    return 0.0, float(np.sum(t * b) / np.sum(b * b))


def profile_config(nets: Sequence[str], batches: Sequence[int] = (16, 64), quick: bool = False,
                   repeats: int = 3, net_batches: Sequence[int] | None = None) -> dict:
    """What ``measure_profile`` runs. ``net_batches``: the batches (of ``batches``) the whole
    net's pass is timed at (None: all); an FC phase's pass is timed at every batch."""
    from layerplan.netspec import zoo

    unknown = [n for n in nets if n not in zoo.ZOO]
    if unknown:
        raise ConfigError(f"cannot profile {', '.join(map(repr, unknown))}: --profile takes zoo names (see `layerplan zoo`)")
    if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches):
        raise ConfigError(f"profile batches must be positive integers, got {list(batches)}")
    batches = sorted(set(batches))
    whole = sorted(set(net_batches) & set(batches)) if net_batches is not None else batches
    if not whole:
        raise ConfigError(f"the whole net's batches {list(net_batches or [])} must be among the profile's {batches}")
    return {"nets": list(nets), "batches": batches, "net_batches": whole,
            "repeats": max(1, min(repeats, 2) if quick else repeats),
            "window_s": 0.03 if quick else 0.06, "min_iters": 2, "whole_window_s": 0.3 if quick else 0.6}


def measure_profile(cfg: dict, log_dir: Path, advance=None) -> dict:
    """Measured forward/backward time of every distinct layer of the profiled nets (one process,
    one thread) and the fitted ``hardware.ProfiledLayer`` lines. ``advance()`` after each layer."""
    procs = _Procs([_worker_argv("profile", cfg)], [_base_env()], log_dir)
    rows, nets = [], []
    try:
        ready = procs.expect("ready", 1)[0]
        for _ in range(ready["layers"] + ready["nets"]):
            _, msg = procs.next()
            if msg.get("event") not in ("layer", "net"):
                raise CalibrationError(f"profile: unexpected message {msg}")
            (rows if msg["event"] == "layer" else nets).append(msg["row"])
            if advance:
                advance()
        procs.expect("done", 1)
    finally:
        procs.close()
    nets = phase_passes(nets)
    scale_to_whole_pass(rows, nets)
    for row in rows:
        row["fwd_fixed_s"], row["fwd_per_sample_s"] = fit_line(row["batches"], row["fwd_s"])
        row["bwd_fixed_s"], row["bwd_per_sample_s"] = fit_line(row["batches"], row["bwd_s"])
    return {"nets": list(cfg["nets"]), "batches": list(cfg["batches"]), "layers": rows, "whole": nets}


def scale_to_whole_pass(rows: list[dict], nets: list[dict]) -> None:
    """Scale each layer's measured times (``rows``, in place) to what the layer takes inside its
    network's whole pass (``nets``: forward and forward + backward at each batch of the whole
    net, or of its phases — ``phase_passes`` — with how many of its layers each key times). A
    layer timed alone, call after call, finds its weights and input in the caches and no autograd
    bookkeeping around it; inside the pass each layer's data was evicted by the layers between. Measured here (`calibrate --quick
    --profile alexnet_cifar,vgg16_cifar,resnet_cifar`, one thread, batch 16): alexnet_cifar's whole
    pass took 1.28× (forward) and 1.09× (backward) the sum of its layers alone, vgg16_cifar
    1.25× / 1.19×, resnet_cifar 1.35× / 0.98×.

    Per net, direction and batch: ``s = whole / Σ count·layer``; a layer shared by several nets
    gets the mean of their factors; at a batch its pass was not timed at, the factor of the
    nearest batch it was (validate times the whole net at the batch its data workers run, the FC
    phase at every batch: the conv phase's factors moved by 0-5% from batch 16 to 64 here, and
    timing the whole vgg16_cifar at 32 and 64 took about two of the profile's seven minutes). Each
    net's record gains ``fwd_scale``/``bwd_scale`` (per batch) and the layer rows ``fwd_alone_s``/``bwd_alone_s`` (the times before scaling). Layers the
    profile cannot time alone (merges) keep the analytical model and are not in the sum."""
    by_key = {r["key"]: r for r in rows}
    factors: dict[str, dict[str, list[dict[int, float]]]] = {}  # per key and direction: each net's factor per batch
    for n in nets:
        for d in ("fwd", "bwd"):
            scales, measured = [], {}
            for i, b in enumerate(n["batches"]):
                parts = 0.0
                for key, c in n["counts"].items():
                    r = by_key.get(key)
                    if r is not None and b in r["batches"]:
                        parts += c * r[f"{d}_s"][r["batches"].index(b)]
                whole = n[f"{d}_s"][i]
                scales.append(whole / parts if parts > 0 and whole > 0 else 1.0)
                if parts > 0 and whole > 0:
                    measured[b] = scales[-1]
            n[f"{d}_scale"] = scales
            for key in n["counts"]:
                factors.setdefault(key, {}).setdefault(d, []).append(measured)
    for r in rows:
        f = factors.get(r["key"])
        if not f:
            continue
        for d in ("fwd", "bwd"):
            r[f"{d}_alone_s"] = list(r[f"{d}_s"])
            out = []
            for i, b in enumerate(r["batches"]):
                per_net = [s[min(s, key=lambda m: (abs(m - b), m))] for s in f[d] if s]
                out.append(r[f"{d}_s"][i] * (sum(per_net) / len(per_net) if per_net else 1.0))
            r[f"{d}_s"] = out


def profiled_layers(profile: dict) -> tuple[hardware.ProfiledLayer, ...]:
    return tuple(hardware.ProfiledLayer(key=r["key"], fwd_fixed_s=r["fwd_fixed_s"], fwd_per_sample_s=r["fwd_per_sample_s"],
                                        bwd_fixed_s=r["bwd_fixed_s"], bwd_per_sample_s=r["bwd_per_sample_s"],
                                        batches=tuple(r["batches"]), fwd_s=tuple(r["fwd_s"]), bwd_s=tuple(r["bwd_s"]))
                 for r in profile["layers"])


def _main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m layerplan.calibrate", description="a calibration benchmark process")
    ap.add_argument("kind", choices=("compute", "link", "profile", "rounds", "messages", "steps", "probe"))
    ap.add_argument("--config", required=True)
    args = ap.parse_args(argv)
    cfg = json.loads(args.config)
    from layerplan.runtime.allocator import keep_freed_memory

    keep_freed_memory()  # as the ranks run (runtime/allocator.py)
    {"compute": _compute_worker, "link": _link_worker, "profile": _profile_worker, "rounds": _rounds_worker,
     "messages": _messages_worker, "steps": _steps_worker, "probe": _probe_worker}[args.kind](cfg)
    return 0


if __name__ == "__main__":
    code = _main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: gloo's threads can abort from C++ destructors
