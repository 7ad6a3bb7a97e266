"""Hardware specs: devices, links, clusters; the seeds' presets; cluster files (YAML or JSON).

Pure Python. SI inside (FLOP/s, bytes/s, bytes, seconds). A cluster file is a mapping whose keys
are exactly the fields of ``ClusterSpec``; ``device`` and ``nic`` may name a preset or spell the
fields out; values may carry human units ("10Gbit", "6.1TFLOPS", "12GiB", "50us").

    name: lab
    nodes: 8
    devices_per_node: 1
    device: titan-x              # or {name: ..., peak_flops_per_s: 6.1TFLOPS, ...}
    nic: 10gbe                   # or {name: ..., bandwidth_bytes_per_s: 10Gbit, latency_s: 50us, efficiency: 0.95}
    shared_cores: null           # set when all nodes share a few CPU cores (the emulated cluster)
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from layerplan import units
from layerplan.errors import LayerplanError, SpecError


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfiledLayer:
    """A layer's measured time on this device, as ``layerplan calibrate --profile`` measures it —
    PALEO's analytical layer time replaced by a profile of the layer itself, the way PALEO §4
    compares its model with measured layer times: forward and backward at each of ``batches``
    (``fwd_s``/``bwd_s``), linear between them, and beyond them each ``fixed_s + per_sample_s ·
    batch`` (a least-squares line through the batches measured). A fully connected layer's time is
    not a line in the batch: alexnet_cifar's FC phase took 64.6 ms backward at batch 16 and 80.6 at
    32, where its layers' lines through 16, 32 and 64 gave 54 ms at 16. ``key`` is
    ``cost.compute.profile_key(layer, in_bytes)``: op, input bytes, output shape, parameters and
    FLOPs per sample, so a layer of any network with the same shape uses the same entry."""

    key: str
    fwd_fixed_s: float
    fwd_per_sample_s: float
    bwd_fixed_s: float
    bwd_per_sample_s: float
    batches: tuple[int, ...] = ()
    """The batch sizes measured."""
    fwd_s: tuple[float, ...] = ()
    """The forward time measured at each of ``batches`` (empty: the line only)."""
    bwd_s: tuple[float, ...] = ()
    """The backward time measured at each of ``batches`` (empty: the line only)."""

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise SpecError(f"profiled layer: key must be a non-empty string, got {self.key!r}")
        for f in ("fwd_fixed_s", "fwd_per_sample_s", "bwd_fixed_s", "bwd_per_sample_s"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise SpecError(f"profiled layer {self.key!r}: {f} must be a number of seconds, got {v!r}")
        object.__setattr__(self, "batches", tuple(self.batches))
        for f in ("fwd_s", "bwd_s"):
            v = tuple(getattr(self, f))
            object.__setattr__(self, f, v)
            if v and (len(v) != len(self.batches) or any(
                    not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x) or x < 0 for x in v)):
                raise SpecError(f"profiled layer {self.key!r}: {f} must hold one non-negative time per batch "
                                f"({len(self.batches)}), got {list(v)!r}")
        if list(self.batches) != sorted(set(self.batches)):
            raise SpecError(f"profiled layer {self.key!r}: batches must be increasing, got {list(self.batches)!r}")

    def time_s(self, batch: int, direction: str) -> float:
        points = self.fwd_s if direction == "fwd" else self.bwd_s
        bs = self.batches
        if points and bs[0] <= batch <= bs[-1]:  # measured: linear between the batches around it
            for (b0, t0), (b1, t1) in zip(zip(bs, points), zip(bs[1:], points[1:])):
                if batch <= b1:
                    return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
            return points[-1]  # one batch measured, this one
        fixed, per = ((self.fwd_fixed_s, self.fwd_per_sample_s) if direction == "fwd"
                      else (self.bwd_fixed_s, self.bwd_per_sample_s))
        return max(0.0, fixed + per * batch)


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelCost:
    """What a layer's kernel costs on a device beyond PALEO's R + C + W (§3.1.1 eq. 1), for the ops
    whose library kernels are neither FLOP- nor bandwidth-bound: a cost per call (dispatch, the
    autograd node, a primitive's setup), per byte of input (a max-pool's compares and index writes,
    a dropout mask's random numbers, batch norm's statistics passes) and extra passes over the
    weights (a CPU GEMM packs its weight matrix before it multiplies). PALEO §3.3 folds such costs
    into one PPP per platform; a CPU core running PyTorch needs them per op
    (``CPU_KERNEL_CYCLES``). ``cost.compute.layer_time_s`` adds them to layers the device has no
    measured profile of."""

    op: str
    """The layer's op (``LayerSpec.op``: 'MaxPool2d', 'Dropout', ...)."""
    fwd_fixed_s: float = 0.0
    bwd_fixed_s: float = 0.0
    fwd_s_per_input_byte: float = 0.0
    bwd_s_per_input_byte: float = 0.0
    fwd_weight_passes: float = 0.0
    """Extra reads of the parameter bytes at the memory bandwidth, forward."""
    bwd_weight_passes: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.op, str) or not self.op:
            raise SpecError(f"kernel cost: op must be a non-empty string, got {self.op!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "op" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
                raise SpecError(f"kernel cost {self.op!r}: {f.name} must be a non-negative number, got {v!r}")

    def time_s(self, batch: int, direction: str, in_bytes: float, param_bytes: float, mem_bytes_per_s: float) -> float:
        """Seconds this kernel adds for ``batch`` samples of ``in_bytes`` each."""
        fwd = direction == "fwd"
        fixed, per_byte, passes = ((self.fwd_fixed_s, self.fwd_s_per_input_byte, self.fwd_weight_passes) if fwd
                                   else (self.bwd_fixed_s, self.bwd_s_per_input_byte, self.bwd_weight_passes))
        return fixed + per_byte * in_bytes * batch + passes * param_bytes / mem_bytes_per_s

    def at_speed(self, speed: float) -> "KernelCost":
        return replace(self, fwd_fixed_s=self.fwd_fixed_s / speed, bwd_fixed_s=self.bwd_fixed_s / speed,
                       fwd_s_per_input_byte=self.fwd_s_per_input_byte / speed,
                       bwd_s_per_input_byte=self.bwd_s_per_input_byte / speed)


COMPUTE_BOUND_OPS = frozenset({"Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                               "ConvTranspose3d", "Linear", "Bilinear"})
"""Ops whose measured time is the cores' arithmetic (matrix products): ``DeviceSpec.at_speed`` paces
them by the machine's compute speed, every other op's by its memory speed where that is given."""


@functools.lru_cache(maxsize=64)
def _profile_index(profiled: tuple[ProfiledLayer, ...]) -> dict[str, ProfiledLayer]:
    return {p.key: p for p in profiled}


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """One compute device (a GPU, or a CPU socket/node)."""

    name: str
    peak_flops_per_s: float
    """Peak fp32 FLOP/s from the datasheet."""
    mem_bandwidth_bytes_per_s: float
    """Device memory bandwidth (PALEO §3.1.1: the R and W terms)."""
    memory_bytes: float
    """Device memory size; a config whose peak memory exceeds it is infeasible."""
    compute_efficiency: float = 0.5
    """Share of peak reached on real layers (PALEO §3.3 PPP_comp; Omnivore: ~50% on conv)."""
    fc_efficiency: float | None = None
    """Share of peak on fully connected layers (matrix products at training batch sizes), where it
    differs from convolutions' — PALEO §3.3 fits its PPP per layer type; on CPUs a Linear layer at
    batch 32 reaches about a third of a convolution's FLOP/s. None: compute_efficiency."""
    cores: int = 1
    """CPU cores behind this device (CPU devices), used when ranks share cores."""
    profiled_layers: tuple[ProfiledLayer, ...] = ()
    """Measured layer times (``layerplan calibrate``); layers not listed use the efficiencies."""
    kernel_costs: tuple[KernelCost, ...] = ()
    """Costs of ops' kernels beyond R + C + W (``KernelCost``), by op; the CPU core presets have
    PyTorch's (``cpu_kernel_costs``). Measured profiles replace them; empty: none."""
    kind: str = "gpu"
    """'gpu' or 'cpu'."""
    note: str = ""
    """Where the numbers come from."""
    update_bandwidth: tuple[tuple[float, float], ...] = ()
    """(parameter bytes, bytes/s) of an SGD-with-momentum update of that many parameter bytes, as
    ``layerplan calibrate`` measures it at a few sizes: on a CPU a small update runs from the caches
    and a large one from DRAM (this machine: 26 GB/s at 32 MiB of parameters, 15.6–16.6 at 128 MiB).
    ``update_bytes_per_s`` interpolates it; empty: mem_bandwidth_bytes_per_s at every size."""
    sum_bandwidth: tuple[tuple[float, float], ...] = ()
    """(parameter bytes, bytes/s) of adding two gradients of that many bytes into a third (3 passes
    over them, ``runtime.roles.summed``), as ``layerplan calibrate`` measures it: a server summing
    what its workers pushed. This machine: 0.6–0.8 of the SGD update's bandwidth from 8 MiB up.
    ``sum_bytes_per_s`` interpolates it; empty: the update's."""

    def __post_init__(self) -> None:
        _check_positive(self, ("peak_flops_per_s", "mem_bandwidth_bytes_per_s", "memory_bytes"))
        for name in ("update_bandwidth", "sum_bandwidth"):
            try:
                pts = tuple(sorted((float(b), float(r)) for b, r in getattr(self, name)))
            except (TypeError, ValueError):
                raise SpecError(f"device {self.name!r}: {name} must be [parameter bytes, bytes/s] pairs, "
                                f"got {getattr(self, name)!r}") from None
            if any(not (math.isfinite(b) and b > 0 and math.isfinite(r) and r > 0) for b, r in pts):
                raise SpecError(f"device {self.name!r}: {name} needs positive sizes and rates, got {list(pts)!r}")
            object.__setattr__(self, name, pts)
        if not 0 < self.compute_efficiency <= 1:
            raise SpecError(f"device {self.name!r}: compute_efficiency must be in (0, 1], got {self.compute_efficiency!r}")
        if self.fc_efficiency is not None and not 0 < self.fc_efficiency <= 1:
            raise SpecError(f"device {self.name!r}: fc_efficiency must be in (0, 1] or null, got {self.fc_efficiency!r}")
        if not isinstance(self.cores, int) or self.cores < 1:
            raise SpecError(f"device {self.name!r}: cores must be a positive integer, got {self.cores!r}")
        if self.kind not in ("gpu", "cpu"):
            raise SpecError(f"device {self.name!r}: kind must be 'gpu' or 'cpu', got {self.kind!r}")
        if not isinstance(self.profiled_layers, tuple):
            object.__setattr__(self, "profiled_layers", tuple(self.profiled_layers))
        if not all(isinstance(p, ProfiledLayer) for p in self.profiled_layers):
            raise SpecError(f"device {self.name!r}: profiled_layers must be ProfiledLayer entries")
        if not isinstance(self.kernel_costs, tuple):
            object.__setattr__(self, "kernel_costs", tuple(self.kernel_costs))
        if not all(isinstance(k, KernelCost) for k in self.kernel_costs):
            raise SpecError(f"device {self.name!r}: kernel_costs must be KernelCost entries")
        ops = [k.op for k in self.kernel_costs]
        if len(set(ops)) != len(ops):
            raise SpecError(f"device {self.name!r}: kernel_costs lists an op twice ({', '.join(sorted(ops))})")

    def update_bytes_per_s(self, param_bytes: float) -> float:
        """Memory bandwidth an SGD update of ``param_bytes`` of parameters sees: ``update_bandwidth``
        interpolated linearly in log(size), the nearest point outside it; else mem_bandwidth."""
        if not self.update_bandwidth:
            return self.mem_bandwidth_bytes_per_s
        return _by_size(self.update_bandwidth, param_bytes)

    def sum_bytes_per_s(self, param_bytes: float) -> float:
        """Memory bandwidth a sum of gradients of ``param_bytes`` sees: ``sum_bandwidth`` as
        ``update_bytes_per_s`` reads its curve; else the update's."""
        if not self.sum_bandwidth:
            return self.update_bytes_per_s(param_bytes)
        return _by_size(self.sum_bandwidth, param_bytes)

    def at_speed(self, speed: float, memory_speed: float | None = None) -> "DeviceSpec":
        """This device computing at ``speed`` × the pace it was calibrated at (a machine whose
        other tenants took a share of its cores since): every measured layer time over ``speed``
        and the efficiencies times it (at most 1) — PALEO's layer time C = FLOPs / (peak · PPP_comp)
        (§3.1.1 eq. 1) with the PPP the machine gives now. Memory bandwidths stay as measured.
        ``memory_speed``: the measured times of the layers that are not matrix products
        (``COMPUTE_BOUND_OPS``: batch norm, ReLU, pooling, dropout — bound by the caches and
        memory, which other tenants slow apart from the cores' arithmetic) over it instead."""
        for s in (speed, memory_speed):
            if s is not None and not (math.isfinite(s) and s > 0):
                raise SpecError(f"device {self.name!r}: a speed must be a positive number, got {s!r}")
        if speed == 1.0 and memory_speed in (None, 1.0):
            return self

        def scaled(p: ProfiledLayer) -> ProfiledLayer:
            by = speed if memory_speed is None or p.key.split("|", 1)[0] in COMPUTE_BOUND_OPS else memory_speed
            return replace(p, fwd_fixed_s=p.fwd_fixed_s / by, fwd_per_sample_s=p.fwd_per_sample_s / by,
                           bwd_fixed_s=p.bwd_fixed_s / by, bwd_per_sample_s=p.bwd_per_sample_s / by,
                           fwd_s=tuple(t / by for t in p.fwd_s), bwd_s=tuple(t / by for t in p.bwd_s))

        layers = tuple(scaled(p) for p in self.profiled_layers)
        fc = None if self.fc_efficiency is None else min(1.0, self.fc_efficiency * speed)
        return replace(self, compute_efficiency=min(1.0, self.compute_efficiency * speed), fc_efficiency=fc,
                       profiled_layers=layers, kernel_costs=tuple(k.at_speed(speed) for k in self.kernel_costs))

    @property
    def achieved_flops_per_s(self) -> float:
        return self.peak_flops_per_s * self.compute_efficiency

    def profiled(self, key: str) -> "ProfiledLayer | None":
        """The measured entry for a ``cost.compute.profile_key``, or None."""
        return _profile_index(self.profiled_layers).get(key) if self.profiled_layers else None

    def kernel_cost(self, op: str) -> KernelCost | None:
        """The ``kernel_costs`` entry of ``op``, or None."""
        for k in self.kernel_costs:
            if k.op == op:
                return k
        return None

    def achieved_flops_per_s_for(self, kind: str) -> float:
        """FLOP/s reached on a layer of ``kind`` (LayerSpec.kind): fc_efficiency for "fc" where set."""
        if kind == "fc" and self.fc_efficiency is not None:
            return self.peak_flops_per_s * self.fc_efficiency
        return self.achieved_flops_per_s


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """A network link (a node's NIC to the switch), full duplex."""

    name: str
    bandwidth_bytes_per_s: float
    """Line rate per direction."""
    latency_s: float = 50e-6
    """Per-message latency (one way)."""
    efficiency: float = 1.0
    """Share of the line rate that payload reaches (TCP/IP headers, stack; PALEO §3.3 PPP_comm)."""
    duplex_efficiency: float = 1.0
    """Share of the payload rate each direction keeps while both directions carry payload: a TCP
    stream's acknowledgements ride the other direction and take its capacity, more so where they
    queue behind that direction's data (the emulated link, acknowledgements first, measured ≈ 0.98
    at 100 Mbit/s and ≈ 1.0 at 1 Gbit/s; with one FIFO 0.94 and 0.98 for one stream each way, and
    as low as 0.6 for 3 streams out and 1 in; ``validate`` measures it per rate). 1: full duplex,
    each direction independent."""
    flow_lead_bytes: float = 0.0
    """TCP flows that leave one NIC together do not share it evenly while they are short: one of them
    leads, by √(flow_lead_bytes · S) of its S bytes when the first finishes (``lead_share``). The
    lead fades against the flow's size: measured on the emulated link, 4 flows from one host, the
    first finished at 0.58 / 0.67-0.72 / 0.66-0.83 / 0.94 / 0.95 of the fair time for 0.27 / 1.1 /
    4.4 / 17 / 60 MB each (100 Mbit/s and 1 Gbit/s alike), fitted by ≈ 150 kB. 0: even shares."""
    burst_bytes: float = 0.0
    """A token bucket in front of the line rate (a shaped link, a cloud NIC's burst allowance):
    bytes pass at once while the bucket holds a packet's worth, and it refills at the line rate
    while the link carries less. The emulated cluster's tbf links hold max(64 kB, rate × 1 ms):
    resnet_cifar's Stanza FC worker's 4 kB messages, after a step's compute, cross a 100 Mbit/s
    link at once, where the line rate alone charges 0.3 ms each. 0: no bucket."""
    note: str = ""

    def __post_init__(self) -> None:
        _check_positive(self, ("bandwidth_bytes_per_s",))
        if not isinstance(self.latency_s, (int, float)) or self.latency_s < 0:
            raise SpecError(f"link {self.name!r}: latency_s must be non-negative, got {self.latency_s!r}")
        if not 0 < self.efficiency <= 1:
            raise SpecError(f"link {self.name!r}: efficiency must be in (0, 1], got {self.efficiency!r}")
        if not isinstance(self.duplex_efficiency, (int, float)) or not 0.5 <= self.duplex_efficiency <= 1:
            raise SpecError(f"link {self.name!r}: duplex_efficiency must be in [0.5, 1], got {self.duplex_efficiency!r}")
        if (not isinstance(self.flow_lead_bytes, (int, float)) or isinstance(self.flow_lead_bytes, bool)
                or not math.isfinite(self.flow_lead_bytes) or self.flow_lead_bytes < 0):
            raise SpecError(f"link {self.name!r}: flow_lead_bytes must be a non-negative number, got {self.flow_lead_bytes!r}")
        if (not isinstance(self.burst_bytes, (int, float)) or isinstance(self.burst_bytes, bool)
                or not math.isfinite(self.burst_bytes) or self.burst_bytes < 0):
            raise SpecError(f"link {self.name!r}: burst_bytes must be a non-negative number, got {self.burst_bytes!r}")

    @property
    def payload_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency

    def lead_share(self, bytes_per_flow: float) -> float:
        """The weight (``engine.Transfer.share``) of the leading flow among flows of
        ``bytes_per_flow`` bytes leaving one NIC together, the others at 1: with weight ω it is
        S·(1 − 1/ω) ahead when it finishes, so ω = S / (S − L), L = √(flow_lead_bytes · S), at most
        two thirds of S (ω ≤ 3; 1 with no lead)."""
        s = float(bytes_per_flow)
        if self.flow_lead_bytes <= 0 or s <= 0:
            return 1.0
        return s / (s - self.lead_bytes(s))

    def lead_bytes(self, bytes_per_flow: float) -> float:
        """L = √(flow_lead_bytes · S), at most two thirds of S: how far the first of flows of S
        bytes leaving one NIC together is ahead when it finishes."""
        s = float(bytes_per_flow)
        return min(math.sqrt(self.flow_lead_bytes * s), 2.0 * s / 3.0)

    def stagger_shares(self, bytes_per_flow: float, counts: Sequence[int]) -> tuple[float, ...]:
        """The weights (``engine.Transfer.share``) of groups of ``counts[i]`` flows of
        ``bytes_per_flow`` bytes each that leave one NIC together, so that they finish one group
        after another: the first flow as ``lead_share`` puts it (at f = 1 − (N−1)·L/(N·S) of the
        time T all N·S bytes take), the later flows evenly spaced from there to T, a group where
        its flows' mean falls (the last group at T). Two groups, a leader and the rest, give ``lead_share``'s
        weights; all 1 with no lead.

        With group i's flows weighted w_i = 1/u_i (u_last = 1), group j finishes at t_j when
        B·t_j/S = Σ_{i≤j} c_i + u_j·Σ_{i>j} c_i/u_i (the finished groups' bytes and what each
        unfinished flow has of its S by then), solved from the last group back."""
        counts = [int(c) for c in counts]
        if not counts or any(c < 1 for c in counts):
            raise SpecError(f"stagger_shares needs groups of at least one flow, got {counts!r}")
        s, n = float(bytes_per_flow), sum(counts)
        if len(counts) == 1 or self.flow_lead_bytes <= 0 or s <= 0:
            return (1.0,) * len(counts)
        first = 1.0 - (n - 1) * self.lead_bytes(s) / (n * s)  # the first flow's finish over T (lead_share's)
        at = [first + (1.0 - first) * k / (n - 1) for k in range(n)]  # each flow's finish over T
        done, tau = 0, []
        for c in counts:
            tau.append(n * statistics.fmean(at[done:done + c]))  # B·t_j/S
            done += c
        u = [1.0] * len(counts)
        for j in range(len(counts) - 2, -1, -1):
            rest = sum(c / x for c, x in zip(counts[j + 1:], u[j + 1:]))
            u[j] = min(u[j + 1], max(1e-3, (tau[j] - sum(counts[:j + 1])) / rest))
        return tuple(1.0 / x for x in u)


def fit_flow_lead_bytes(flows: int, bytes_per_flow: float, first_over_last: float) -> float:
    """``LinkSpec.flow_lead_bytes`` from one measurement: ``flows`` flows of ``bytes_per_flow`` bytes
    left one NIC together and the first finished at ``first_over_last`` of the last one's time (the
    last finishes when all the bytes have crossed, as with even shares). The inverse of
    ``lead_share``: the leader's weight ω = (n − 1) / (f·n − 1), within [1, 3]; its lead
    L = S·(1 − 1/ω); flow_lead_bytes = L² / S."""
    n, s, f = int(flows), float(bytes_per_flow), float(first_over_last)
    if n < 2 or s <= 0 or not 0 < f <= 1:
        raise SpecError(f"a flow lead needs 2 or more flows of some bytes and the first's share of the last's time "
                        f"in (0, 1], got {n} flows of {s} bytes, {f}")
    w = 3.0 if f * n <= 1 + (n - 1) / 3.0 else max(1.0, (n - 1) / (f * n - 1))
    lead = s * (1.0 - 1.0 / w)
    return lead * lead / s


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """Nodes with devices, one NIC each, on a switch."""

    name: str
    nodes: int
    devices_per_node: int = 1
    device: DeviceSpec
    nic: LinkSpec
    switch_bandwidth_bytes_per_s: float | None = None
    """Total switch capacity; None = non-blocking (every port at line rate at once)."""
    shared_cores: int | None = None
    """When set, all ranks of the cluster share this many CPU cores (the emulated cluster runs
    every host on the same 2 cores): compute of concurrent ranks is slowed accordingly."""
    comm_cpu_s_per_byte: float = 0.0
    """With shared_cores: CPU seconds each end of a message spends per byte (kernel TCP, gloo's
    copies), taken from the shared cores. ``layerplan calibrate`` fits it from loopback, where
    moving bytes costs nothing but CPU. 0: not modelled."""
    reduce_cpu_s_per_byte: float = 0.0
    """With shared_cores: CPU seconds per byte of an all-reduce's reduction (gloo on CPU), fitted
    from the loopback all-reduce: what a 2-rank all-reduce costs beyond its messages (on the
    emulated cluster ``validate`` measures it on the shaped path at each rate: 0–0.45 ns/B at 10
    Gbit/s, about 0 at 1 Gbit/s, 5–6 at 100 Mbit/s, where the link bounds the step). 0: not
    modelled."""
    shared_core_capacity: float | None = None
    """With shared_cores: how many cores' worth of compute they give with every core busy. Cores
    share memory bandwidth and caches, so two busy cores do less than twice one core's work, and
    ranks in lockstep go at the pace of the least free core; ``layerplan calibrate`` measures it
    (training steps of one process per core with a barrier after each, against one process alone;
    without that measurement, the FLOP/s of one process per core at once over one process alone:
    ``effective_cores``). A task alone still runs at full speed; ``a`` tasks at once each get
    min(1, capacity / a). None: shared_cores (no contention)."""
    oversubscribed_core_capacity: float | None = None
    """With shared_cores: how many cores' worth of compute they give while more compute threads
    run than there are cores. The kernel time-slices them, and each switch finds the caches full
    of another process's data: 4 training processes on 2 cores here took 1.04-1.08× twice the time
    of 2 (alexnet_cifar, vgg16_cifar, resnet_cifar at batch 16). ``layerplan calibrate`` times
    whole training steps in lockstep with two processes per core against one alone. Messages'
    threads slice the cores too: the engine moves toward this capacity by the cores' worth they
    take beyond what the compute threads leave. None: shared_core_capacity."""
    oversubscribed_wait_s: float = 0.0
    """With shared_cores: seconds each collective round and each message waits, beyond the link's
    latency, when a step's ranks outnumber the cores — the rank a message goes to may be off its
    core, and gloo's waiting ranks poll. ``layerplan calibrate`` times a small all-reduce with as
    many ranks as cores and with twice as many (here: 0.15 ms a ring round with 2 ranks on 2
    cores, 0.75-0.8 ms with 4). 0: not modelled."""
    oversubscribed_message_cpu_s: float = 0.0
    """With shared_cores: CPU seconds a point-to-point message costs at each end — each node that
    sends a transfer and each that receives it — when a step's ranks outnumber the cores, drawn
    from the shared cores like compute. A rank that blocks on a message and wakes on a core other
    processes keep busy spends CPU beyond the message's bytes: here 0.05 ms an end with 2 ranks on
    the 2 cores, 0.4-1 ms with 4; resnet_cifar's runs counted 1-7 ms of CPU a step per rank beyond
    compute and bytes (Omnivore's 4 groups of one machine at 1 Gbit/s: 7 ms on each server).
    ``layerplan calibrate`` times pairs of ranks, twice as many as cores, exchanging a message
    after each burst of compute. The engine charges it to a transfer that starts while the step's
    compute takes every core; one that starts with a core free wakes its ranks there. A
    collective's calls are ``collective_wait_s``'s (timed whole, their CPU with them). 0: not
    modelled."""
    collective_wait_s: float = 0.0
    """With shared_cores: seconds every collective call (an all-reduce, a broadcast) adds to a
    training step beyond its rounds' latency and its bytes. The ranks meet at each call, so each
    call stretches the step to its slowest rank's pace since the last one, and gloo's threads wake
    on cores busy with the step's compute. ``layerplan calibrate`` times training steps in lockstep
    with three more small all-reduces a step, between the forward pass's layers, than the lockstep
    baseline (which ``shared_core_capacity`` already holds), the difference over the calls, the
    median over pairs of such windows: here 1.8-3.1 ms a call for resnet_cifar over loopback; on the
    emulated links DDP's BatchNorm buffer broadcast alone cost resnet_cifar's 2 ranks 1-2.5 ms a
    step. A call that follows only calls of its own ranks (DDP's second buffer broadcast, right
    after the first) does not wait again: its ranks have just met. 0: not modelled."""
    collective_busy_cpu_s_per_byte: float | None = None
    """With shared_cores: CPU seconds a byte a collective sends (a ring's bytes, each rank's, summed)
    takes from the shared cores while its own ranks compute beside it — measured, not derived from
    ``comm_cpu_s_per_byte`` (timed on idle cores): each wake-up of a gloo thread on a core busy with
    the backward costs the compute more than the thread's own CPU (its caches refilled). The engine
    charges a collective's bytes the larger of the two. ``validate`` measures it at each emulated
    rate of 1 Gbit/s and more (``emulate.measure_busy_ring``): here 1.7-2.0 ns a byte at 1 Gbit/s
    (the idle-core charge 0.66), 1.0-1.1 at 10 Gbit/s (1.2). None: the idle-core charge."""
    collective_core_share: float | None = None
    """With shared_cores: the most of a core a collective's thread on each rank keeps busy, its
    bytes' CPU included — a ring's rank sends, receives and reduces in turn and waits on its peers
    in between, so where its bytes' CPU bounds it, it runs at this share of a core a rank even with
    the cores free. ``validate`` fits it per rate from the link's all-reduce of 2 hosts, where the
    model's ring is bound by its CPU: the machine's busy CPU over the all-reduce's time, per host
    (here at 10 Gbit/s 0.69-0.77 of a core: 256 MiB in 0.36 s with 0.54 s of CPU, where the engine
    had it bound by the 2 cores at 0.30 s). None: no bound but the cores' share."""

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or self.nodes < 1:
            raise SpecError(f"cluster {self.name!r}: nodes must be a positive integer, got {self.nodes!r}")
        if not isinstance(self.devices_per_node, int) or self.devices_per_node < 1:
            raise SpecError(f"cluster {self.name!r}: devices_per_node must be a positive integer, got {self.devices_per_node!r}")
        if self.switch_bandwidth_bytes_per_s is not None and self.switch_bandwidth_bytes_per_s <= 0:
            raise SpecError(f"cluster {self.name!r}: switch_bandwidth_bytes_per_s must be positive or null")
        if self.shared_cores is not None and (not isinstance(self.shared_cores, int) or self.shared_cores < 1):
            raise SpecError(f"cluster {self.name!r}: shared_cores must be a positive integer or null, got {self.shared_cores!r}")
        cap = self.shared_core_capacity
        if cap is not None and (self.shared_cores is None or not isinstance(cap, (int, float)) or isinstance(cap, bool)
                                or not math.isfinite(cap) or not 0 < cap <= self.shared_cores):
            raise SpecError(f"cluster {self.name!r}: shared_core_capacity must be a number in (0, shared_cores] "
                            f"with shared_cores set, got {cap!r}")
        over = self.oversubscribed_core_capacity
        if over is not None and (self.shared_cores is None or not isinstance(over, (int, float)) or isinstance(over, bool)
                                 or not math.isfinite(over) or not 0 < over <= self.shared_cores):
            raise SpecError(f"cluster {self.name!r}: oversubscribed_core_capacity must be a number in (0, shared_cores] "
                            f"with shared_cores set, got {over!r}")
        for f in ("comm_cpu_s_per_byte", "reduce_cpu_s_per_byte", "oversubscribed_wait_s", "oversubscribed_message_cpu_s",
                  "collective_wait_s"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise SpecError(f"cluster {self.name!r}: {f} must be a non-negative number of seconds, got {v!r}")
        busy = self.collective_busy_cpu_s_per_byte
        if busy is not None and (not isinstance(busy, (int, float)) or isinstance(busy, bool) or not math.isfinite(busy)
                                 or busy < 0):
            raise SpecError(f"cluster {self.name!r}: collective_busy_cpu_s_per_byte must be a non-negative number "
                            f"of seconds or null, got {busy!r}")
        share = self.collective_core_share
        if share is not None and (not isinstance(share, (int, float)) or isinstance(share, bool) or not math.isfinite(share)
                                  or not 0 < share <= 1):
            raise SpecError(f"cluster {self.name!r}: collective_core_share must be a number in (0, 1] or null, got {share!r}")

    def with_nodes(self, nodes: int) -> "ClusterSpec":
        return replace(self, nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "device": _device_dict(self.device),
            "nic": {f.name: getattr(self.nic, f.name) for f in fields(LinkSpec)},
            "switch_bandwidth_bytes_per_s": self.switch_bandwidth_bytes_per_s,
            "shared_cores": self.shared_cores,
            "comm_cpu_s_per_byte": self.comm_cpu_s_per_byte,
            "reduce_cpu_s_per_byte": self.reduce_cpu_s_per_byte,
            "shared_core_capacity": self.shared_core_capacity,
            "oversubscribed_core_capacity": self.oversubscribed_core_capacity,
            "oversubscribed_wait_s": self.oversubscribed_wait_s,
            "oversubscribed_message_cpu_s": self.oversubscribed_message_cpu_s,
            "collective_wait_s": self.collective_wait_s,
            "collective_busy_cpu_s_per_byte": self.collective_busy_cpu_s_per_byte,
            "collective_core_share": self.collective_core_share,
        }

    def describe(self) -> str:
        dev = f"{self.devices_per_node}×{self.device.name}" if self.devices_per_node > 1 else self.device.name
        rate = units.format_bandwidth(self.nic.bandwidth_bytes_per_s)
        nic = rate if self.nic.name.replace(" ", "") == rate.replace(" ", "") else f"{rate} {self.nic.name}"
        return f"{self.nodes} × {dev}, {nic}"


def _by_size(pts: tuple[tuple[float, float], ...], size: float) -> float:
    """A (size, rate) curve read at ``size``: interpolated linearly in log(size), the nearest point outside it."""
    if size <= pts[0][0]:
        return pts[0][1]
    for (b0, r0), (b1, r1) in zip(pts, pts[1:]):
        if size <= b1:
            return r0 + (r1 - r0) * math.log(size / b0) / math.log(b1 / b0)
    return pts[-1][1]


def _device_dict(d: DeviceSpec) -> dict[str, Any]:
    out = {f.name: getattr(d, f.name) for f in fields(DeviceSpec)}
    for name in ("update_bandwidth", "sum_bandwidth"):
        out[name] = [list(p) for p in getattr(d, name)]
        if not out[name]:
            del out[name]
    out["profiled_layers"] = [{**{f.name: getattr(p, f.name) for f in fields(ProfiledLayer)}, "batches": list(p.batches),
                               "fwd_s": list(p.fwd_s), "bwd_s": list(p.bwd_s)} for p in d.profiled_layers]
    if not out["profiled_layers"]:
        del out["profiled_layers"]
    out["kernel_costs"] = [{f.name: getattr(k, f.name) for f in fields(KernelCost)} for k in d.kernel_costs]
    if not out["kernel_costs"]:
        del out["kernel_costs"]
    return out


def _check_positive(obj: Any, names: tuple[str, ...]) -> None:
    for n in names:
        v = getattr(obj, n)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise SpecError(f"{type(obj).__name__} {obj.name!r}: {n} must be a positive number, got {v!r}")


# ---- presets ---------------------------------------------------------------------------------
GB = 1e9
GiB = 2.0**30

CPU_KERNEL_CYCLES: dict[str, tuple[float, float, float, float, float, float]] = {
    # op: (cycles a call forward, backward; cycles a byte of input forward, backward; extra weight passes forward, backward)
    "Conv2d": (372e3, 567e3, 0.0, 0.0, 0.0, 0.0),
    "Linear": (26e3, 192e3, 0.08, 0.52, 0.55, 0.6),
    "BatchNorm2d": (26e3, 273e3, 1.12, 0.21, 0.0, 0.0),
    "ReLU": (0.0, 156e3, 0.0, 0.11, 0.0, 0.0),
    "Dropout": (122e3, 273e3, 8.6, 0.6, 0.0, 0.0),
    "MaxPool2d": (70e3, 208e3, 4.4, 0.36, 0.0, 0.0),
    "AdaptiveAvgPool2d": (16e3, 86e3, 0.0, 0.36, 0.0, 0.0),
}
"""PyTorch's CPU kernels beyond PALEO's R + C + W at a core's ``compute_efficiency`` (``KernelCost``),
in clock cycles of one core: a non-negative least-squares fit (of relative error) of the measured
excess over the cpu-core preset's layer times, over the profiled layers of vgg16_cifar,
alexnet_cifar and resnet_cifar at batch 16–64 in two calibrations of a 2-core AVX-512 Xeon VM at
2.6 GHz (1,404 layer times, forward and backward). Without them that preset took max-pooling forward at 0.03× its
measured time (its compares and int64 index writes: 1.7 ns a byte of input), dropout forward at
0.03× (a random number an element: 3.3 ns a byte), batch norm forward at 0.2× (statistics passes),
every backward of an activation, norm or pooling 0.3–0.5× (≈ 60–105 µs an autograd node),
resnet_cifar's narrow convolutions 0.8–0.9× (≈ 140 / 220 µs a call) and Linear layers 0.7× (a GEMM
packs its weights first). With them, repredicted, the emulated cluster's presets-only median
|error| over two full validations went 15.5 → 8.1% and 20.2 → 11.4% (README)."""


def cpu_kernel_costs(clock_hz: float, cores: int = 1) -> tuple[KernelCost, ...]:
    """``CPU_KERNEL_CYCLES`` as seconds on ``cores`` cores at ``clock_hz``."""
    per_cycle = 1.0 / (clock_hz * cores)
    return tuple(KernelCost(op=op, fwd_fixed_s=f * per_cycle, bwd_fixed_s=b * per_cycle,
                            fwd_s_per_input_byte=fb * per_cycle, bwd_s_per_input_byte=bb * per_cycle,
                            fwd_weight_passes=fw, bwd_weight_passes=bw)
                 for op, (f, b, fb, bb, fw, bw) in CPU_KERNEL_CYCLES.items())


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        DeviceSpec(name="titan-x", peak_flops_per_s=6.1e12, mem_bandwidth_bytes_per_s=336.5 * GB, memory_bytes=12 * GiB,
                   note="NVIDIA GeForce GTX TITAN X (Maxwell); 6.1 TFLOPS as PALEO uses"),
        DeviceSpec(name="titan-xp", peak_flops_per_s=12.15e12, mem_bandwidth_bytes_per_s=547.7 * GB, memory_bytes=12 * GiB,
                   note="NVIDIA TITAN Xp (Pascal) datasheet, boost clock"),
        DeviceSpec(name="k20", peak_flops_per_s=3.52e12, mem_bandwidth_bytes_per_s=208 * GB, memory_bytes=5 * GiB,
                   note="NVIDIA Tesla K20; 3.52 TFLOPS as PALEO uses"),
        DeviceSpec(name="k20x", peak_flops_per_s=3.93e12, mem_bandwidth_bytes_per_s=250 * GB, memory_bytes=6 * GiB,
                   note="NVIDIA Tesla K20X; 3.93 TFLOPS as PALEO uses"),
        DeviceSpec(name="k40", peak_flops_per_s=4.29e12, mem_bandwidth_bytes_per_s=288 * GB, memory_bytes=12 * GiB,
                   note="NVIDIA Tesla K40; 4.29 TFLOPS as PALEO uses"),
        DeviceSpec(name="k80", peak_flops_per_s=2.8e12, mem_bandwidth_bytes_per_s=240 * GB, memory_bytes=12 * GiB,
                   note="one GK210 of an NVIDIA Tesla K80 at base clock (4.37 TFLOPS at boost; PALEO: 2.8-4.4)"),
        DeviceSpec(name="k520", peak_flops_per_s=2.45e12, mem_bandwidth_bytes_per_s=160 * GB, memory_bytes=4 * GiB,
                   note="one GK104 of an NVIDIA GRID K520 (EC2 g2 instances)"),
        DeviceSpec(name="v100", peak_flops_per_s=15.7e12, mem_bandwidth_bytes_per_s=900 * GB, memory_bytes=16 * GiB,
                   note="NVIDIA Tesla V100 SXM2 16 GB (EC2 p3.2xlarge)"),
        DeviceSpec(name="h100", peak_flops_per_s=67e12, mem_bandwidth_bytes_per_s=3350 * GB, memory_bytes=80 * GiB,
                   note="NVIDIA H100 SXM5 80 GB, fp32 without tensor cores"),
        DeviceSpec(name="xeon-e5-2450-node", peak_flops_per_s=268.8e9, mem_bandwidth_bytes_per_s=76.8 * GB,
                   memory_bytes=64 * GiB, cores=16, kind="cpu",
                   note="2 × 8-core Xeon E5-2450 at 2.1 GHz: 268.8 GFLOP/s (Yan et al. KDD'15 §6)"),
        DeviceSpec(name="c4.4xlarge-cpu", peak_flops_per_s=742.4e9, mem_bandwidth_bytes_per_s=51.2 * GB,
                   memory_bytes=30 * GiB, cores=8, kind="cpu",
                   note="8 Haswell cores (Xeon E5-2666 v3) at 2.9 GHz × 32 FLOP/cycle (AVX2 FMA)"),
        DeviceSpec(name="c4.8xlarge-cpu", peak_flops_per_s=1670.4e9, mem_bandwidth_bytes_per_s=102.4 * GB,
                   memory_bytes=60 * GiB, cores=18, kind="cpu",
                   note="18 Haswell cores (Xeon E5-2666 v3) at 2.9 GHz × 32 FLOP/cycle (AVX2 FMA)"),
        DeviceSpec(name="cpu-core", peak_flops_per_s=160e9, mem_bandwidth_bytes_per_s=20 * GB, memory_bytes=8 * GiB,
                   compute_efficiency=0.7, cores=1, kind="cpu", kernel_costs=cpu_kernel_costs(2.5e9),
                   note="one AVX-512 core at ~2.5 GHz (64 FLOP/cycle); ~100-130 GFLOP/s measured on conv nets; "
                        "PyTorch's per-op kernel costs. Calibrate for a precise figure."),
    ]
}

LINKS: dict[str, LinkSpec] = {
    link.name: link
    for link in [
        LinkSpec(name="100mbe", bandwidth_bytes_per_s=100e6 / 8, latency_s=100e-6, efficiency=0.956, note="Fast Ethernet (TCP)"),
        LinkSpec(name="1gbe", bandwidth_bytes_per_s=1e9 / 8, latency_s=50e-6, efficiency=0.956, note="Gigabit Ethernet (TCP payload ≈ 95.6%)"),
        LinkSpec(name="2.6gbit", bandwidth_bytes_per_s=2.6e9 / 8, latency_s=50e-6, efficiency=0.956,
                 note="2.6 Gbit/s: EC2 'high' networking as measured"),
        LinkSpec(name="10gbe", bandwidth_bytes_per_s=10e9 / 8, latency_s=30e-6, efficiency=0.956, note="10 Gigabit Ethernet"),
        LinkSpec(name="25gbe", bandwidth_bytes_per_s=25e9 / 8, latency_s=20e-6, efficiency=0.956, note="25 Gigabit Ethernet"),
        LinkSpec(name="40gbe", bandwidth_bytes_per_s=40e9 / 8, latency_s=15e-6, efficiency=0.956, note="40 Gigabit Ethernet"),
        LinkSpec(name="56gbit-ib", bandwidth_bytes_per_s=56e9 / 8, latency_s=2e-6, efficiency=1.0, note="InfiniBand FDR 4x"),
        LinkSpec(name="70gbit-ib", bandwidth_bytes_per_s=70e9 / 8, latency_s=2e-6, efficiency=1.0,
                 note="70 Gbit/s InfiniBand as in PALEO's FireCaffe case study"),
        LinkSpec(name="100gbit", bandwidth_bytes_per_s=100e9 / 8, latency_s=2e-6, efficiency=1.0, note="100 Gbit/s InfiniBand EDR / Ethernet"),
    ]
}

# Node presets: a device, how many per node, and the NIC. A cluster preset is N of these.
NODES: dict[str, tuple[str, int, str, str]] = {
    # name: (device, devices_per_node, nic, note)
    "titan-x": ("titan-x", 1, "10gbe", "one TITAN X per node, 10 GbE"),
    "titan-xp": ("titan-xp", 1, "10gbe", "one TITAN Xp per node, 10 GbE"),
    "k20": ("k20", 1, "10gbe", "one K20 per node, 10 GbE (PALEO's TensorFlow case)"),
    "k20x": ("k20x", 1, "70gbit-ib", "one K20X per node, 70 Gbit/s InfiniBand (PALEO's FireCaffe case)"),
    "k40": ("k40", 1, "10gbe", "one K40 per node"),
    "k80": ("k80", 1, "25gbe", "one K80 GK210 per node"),
    "v100": ("v100", 1, "25gbe", "one V100 per node"),
    "h100": ("h100", 1, "100gbit", "one H100 per node, 100 Gbit/s"),
    "xeon-e5-2450": ("xeon-e5-2450-node", 1, "10gbe", "Yan et al.'s Adam machines: 2×8-core Xeon E5-2450, 10 Gbit/s"),
    "c4.4xlarge": ("c4.4xlarge-cpu", 1, "2.6gbit", "EC2 c4.4xlarge: 8 cores, 'high' networking (Omnivore's CPU cluster)"),
    "c4.8xlarge": ("c4.8xlarge-cpu", 1, "10gbe", "EC2 c4.8xlarge: 18 cores, 10 Gbit/s"),
    "g2.2xlarge": ("k520", 1, "1gbe", "EC2 g2.2xlarge: one GRID K520 GPU"),
    "g2.8xlarge": ("k520", 4, "10gbe", "EC2 g2.8xlarge: four GRID K520 GPUs, 10 Gbit/s"),
    "p3.2xlarge": ("v100", 1, "10gbe", "EC2 p3.2xlarge: one V100, up to 10 Gbit/s (Stanza's EC2 runs)"),
    "local-cpu": ("cpu-core", 1, "1gbe", "one core of this kind of machine per node"),
}


def device(name: str) -> DeviceSpec:
    """A device preset by name; ``this-cpu``: one core of this machine (``this_cpu``)."""
    if name.lower() == "this-cpu":
        dev = this_cpu()
        if dev is None:
            raise SpecError("cannot tell this machine's CPU (no /proc/cpuinfo with its vector flags and clock): "
                            "use the cpu-core preset, or measure it with `layerplan calibrate -o cluster.yaml`")
        return dev
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise SpecError(f"unknown device {name!r}; known: {', '.join(DEVICES)}, this-cpu") from None


CPU_EFFICIENCY = {"avx512f": 0.7, "avx2": 0.85, "zen4": 0.95}
"""``compute_efficiency`` of a core by its widest vector unit, against its nominal clock: conv nets'
layers at one thread ran at 100-130 GFLOP/s on Intel AVX-512 cores of 160 GFLOP/s nominal (the
cpu-core preset's 0.7; Intel runs AVX-512 code below the nominal clock), and at 26.7-27.7 GFLOP/s
on an AVX2 core of 31.9 (AMD EPYC, Zen 1 at 2.0 GHz nominal, which boosts above it): 0.84-0.87.
AMD Zen 4 (family 0x19 with AVX-512) keeps its clock under AVX-512 and boosts above its nominal
one: on a 2-core EPYC VM of 83 GFLOP/s nominal a thread ran 1024² matrix products at 80-88 GFLOP/s
and its calibrations' conv layers at 88-106; the presets of three validate runs there, predicted
again, erred a median 3.0 / 4.7 / 16.4% at 0.85 and 4.2 / 4.5 / 12.6% at 0.95."""


def cpu_efficiency(flags: set[str], vendor: str = "", family: int = 0) -> float:
    """``CPU_EFFICIENCY`` of a core: AMD Zen 4's (family 0x19 with AVX-512) "zen4"; Intel's with
    AVX-512 the "avx512f" figure (AVX-512 code slows its clock); every other the "avx2" one — AMD
    Zen 5's (family 0x1A) too: on a 2-core EPYC VM of 166 GFLOP/s nominal a calibration's
    convolutions ran at 145 GFLOP/s (0.87), and its presets erred a median 4.4% over a full run."""
    if "avx512f" in flags and vendor == "AuthenticAMD":
        return CPU_EFFICIENCY["zen4" if family == 0x19 else "avx2"]
    return CPU_EFFICIENCY["avx512f" if "avx512f" in flags else "avx2"]


def cpu_flops_per_cycle(flags: set[str], vendor: str = "", family: int = 0, model: int = 0) -> int:
    """FP32 FLOP one core issues a cycle by its vector unit: AVX-512 64 (two 16-lane FMA units) —
    but AMD Zen 4 (family 0x19) 32, its 512-bit operations two 256-bit halves on two 8-lane FMA
    units (AMD's Zen 4 optimization guide; one thread here: 80-88 GFLOP/s of 1024² matrix products
    at 2.6 GHz nominal), while Zen 5 (family 0x1A) has full-width units (a thread of a 2.6 GHz
    EPYC: 145-185 GFLOP/s of convolutions) — AVX2 with FMA 32 (two 8-lane) — but AMD Zen 1 and Zen+ (family 0x17,
    model below 0x30) 16, their 256-bit operations two 128-bit halves — AVX 16 (an 8-lane multiply
    and add), else SSE 8."""
    if "avx512f" in flags:
        return 32 if vendor == "AuthenticAMD" and family == 0x19 else 64
    if "avx2" in flags and "fma" in flags:
        return 16 if vendor == "AuthenticAMD" and family == 0x17 and model < 0x30 else 32
    return 16 if "avx" in flags else 8


@functools.lru_cache(maxsize=1)
def _proc_cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return None


def this_cpu(cpuinfo: str | None = None) -> DeviceSpec | None:
    """One core of this machine as a device, from /proc/cpuinfo (or ``cpuinfo``'s text) alone —
    no measurement: peak = ``cpu_flops_per_cycle`` × the nominal clock (the model name's
    "@ x.xxGHz", else "cpu MHz"), ``cpu_efficiency`` of it, PyTorch's kernel costs at that clock
    (``cpu_kernel_costs``); memory as the cpu-core preset's.
    None where the text does not say (not Linux, no clock)."""
    import re

    if cpuinfo is None:
        cpuinfo = _proc_cpuinfo()
        if cpuinfo is None:
            return None
    first = cpuinfo.strip().split("\n\n")[0]
    info = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in first.splitlines()) if v}
    flags = set(info.get("flags", "").split())
    name = info.get("model name", "")
    ghz = re.search(r"@\s*([0-9.]+)\s*GHz", name)
    try:
        clock_hz = float(ghz.group(1)) * 1e9 if ghz else float(info["cpu MHz"]) * 1e6
        family, model = int(info.get("cpu family", "0")), int(info.get("model", "0"))
    except (KeyError, ValueError):
        return None
    if not flags or clock_hz <= 0:
        return None
    vendor = info.get("vendor_id", "")
    per_cycle = cpu_flops_per_cycle(flags, vendor, family, model)
    base = DEVICES["cpu-core"]
    return replace(base, name="this-cpu", peak_flops_per_s=per_cycle * clock_hz,
                   compute_efficiency=cpu_efficiency(flags, vendor, family), kernel_costs=cpu_kernel_costs(clock_hz),
                   note=f"one core of this machine ({name or 'unnamed CPU'}): {per_cycle} FLOP/cycle at "
                        f"{clock_hz / 1e9:.2f} GHz nominal, from /proc/cpuinfo, PyTorch's per-op kernel costs at that "
                        "clock; calibrate for a measured figure")


def local_device() -> DeviceSpec:
    """One core of this machine: ``this_cpu()``, else the cpu-core preset."""
    return this_cpu() or DEVICES["cpu-core"]


def link(name_or_rate: str) -> LinkSpec:
    """A link preset by name ('10gbe') or a rate ('10Gbit', '100Mbit/s')."""
    key = str(name_or_rate).lower()
    if key in LINKS:
        return LINKS[key]
    try:
        rate = units.parse_bandwidth(name_or_rate, "link")
    except LayerplanError:
        raise SpecError(f"unknown link {name_or_rate!r}; use a preset ({', '.join(LINKS)}) or a rate like 10Gbit") from None
    # TCP Ethernet defaults for a bare rate; the efficiency is what the emulated cluster measures.
    return LinkSpec(name=units.format_bandwidth(rate).replace(" ", ""), bandwidth_bytes_per_s=rate, latency_s=50e-6,
                    efficiency=0.956, note="from a rate")


SHARED_CORE_SHARE = 0.9
"""Preset ``shared_core_capacity`` per core (2 cores or more; no calibration): the cores' worth a
core gives to training steps in lockstep with one process on each core. Busy cores share memory
bandwidth, caches and the clock's headroom; measured (``layerplan calibrate``) on a 2-core AMD EPYC
(Zen 1) 1.77-1.87 of 2 in ten idle calibrations, on a 2-core AVX-512 Xeon VM 1.87: 0.885-0.935 a core."""

OVERSUBSCRIBED_CORE_SHARE = 0.86
"""Preset ``oversubscribed_core_capacity`` per core (2 cores or more): the same with two processes on
each core, time-sliced (each switch refills the caches): 1.65-1.74 of 2 on the EPYC, 1.80 on the
Xeon, 0.825-0.90 a core. With both presets the emulated cluster's presets-only predictions of two
full validations on the Xeon (vf70, vf71, repredicted) moved from a median |error| of 17.6% and
16.2% to 14.2% and 11.8%: the presets had every core's full count, and every row ran slower."""


def shared_cores_preset(cores: int | None) -> dict[str, Any]:
    """ClusterSpec fields for ``cores`` shared cores without a calibration: the cores and the
    presets' capacities (``SHARED_CORE_SHARE``, ``OVERSUBSCRIBED_CORE_SHARE``). One core has no
    other core to contend with: its capacity stays the core's (None)."""
    if not cores:
        return {"shared_cores": None}
    if cores < 2:
        return {"shared_cores": cores}
    return {"shared_cores": cores, "shared_core_capacity": SHARED_CORE_SHARE * cores,
            "oversubscribed_core_capacity": OVERSUBSCRIBED_CORE_SHARE * cores}


def cluster(preset: str = "titan-x", *, nodes: int = 4, device_name: str | None = None,
            bandwidth: str | None = None, shared_cores: int | None = None) -> ClusterSpec:
    """N nodes of a node preset, optionally with another device or link rate; with
    ``shared_cores``, the presets' capacities of them (``shared_cores_preset``)."""
    key = preset.lower()
    if key not in NODES:
        raise SpecError(f"unknown cluster preset {preset!r}; known: {', '.join(NODES)} (or give a cluster file)")
    dev_name, per_node, nic_name, _ = NODES[key]
    dev = device(device_name or dev_name)
    nic = link(bandwidth) if bandwidth else LINKS[nic_name]
    return ClusterSpec(name=key, nodes=nodes, devices_per_node=per_node, device=dev, nic=nic,
                       **shared_cores_preset(shared_cores))


# ---- cluster files ---------------------------------------------------------------------------
_PARSERS = {
    "peak_flops_per_s": units.parse_flops,
    "mem_bandwidth_bytes_per_s": units.parse_bandwidth,
    "memory_bytes": units.parse_bytes,
    "bandwidth_bytes_per_s": units.parse_bandwidth,
    "latency_s": units.parse_seconds,
    "switch_bandwidth_bytes_per_s": units.parse_bandwidth,
}


def _from_mapping(cls: type, data: Any, where: str, defaults_ok: bool = True) -> Any:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; expected {', '.join(names)}")
    from dataclasses import MISSING

    required = [n for n, f in names.items() if f.default is MISSING and f.default_factory is MISSING]
    missing = [n for n in required if n not in data]
    if missing:
        raise SpecError(f"{where}: missing key(s) {', '.join(map(repr, missing))}")
    kw: dict[str, Any] = {}
    for k, v in data.items():
        if k in _PARSERS and v is not None:
            kw[k] = _PARSERS[k](v, f"{where}: {k}")
        else:
            kw[k] = v
    try:
        return cls(**kw)
    except TypeError as e:
        raise SpecError(f"{where}: {e}") from None


def _device_from_mapping(data: Any, where: str) -> DeviceSpec:
    for key, cls in (("profiled_layers", ProfiledLayer), ("kernel_costs", KernelCost)):
        if isinstance(data, dict) and key in data:
            rows = data[key]
            if not isinstance(rows, list):
                raise SpecError(f"{where}: {key} must be a list, got {type(rows).__name__}")
            data = {**data, key: tuple(_from_mapping(cls, r, f"{where}: {key}[{i}]") for i, r in enumerate(rows))}
    return _from_mapping(DeviceSpec, data, where)


def cluster_from_dict(data: Any, where: str = "cluster") -> ClusterSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping of cluster fields, got {type(data).__name__}")
    d = dict(data)
    if "device" in d:
        d["device"] = device(d["device"]) if isinstance(d["device"], str) else _device_from_mapping(d["device"], f"{where}: device")
    if "nic" in d:
        d["nic"] = link(d["nic"]) if isinstance(d["nic"], str) else _from_mapping(LinkSpec, d["nic"], f"{where}: nic")
    return _from_mapping(ClusterSpec, d, where)


def load_cluster(path: str | Path) -> ClusterSpec:
    """A cluster file, YAML (.yaml/.yml) or JSON."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"cannot read cluster file {str(p)!r}: {e.strerror}") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise SpecError(f"{p}: not valid YAML{at}") from None
    return cluster_from_dict(data, str(p))


def save_cluster(spec: ClusterSpec, path: str | Path) -> None:
    p = Path(path)
    if p.suffix.lower() == ".json":
        p.write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
    else:
        import yaml

        p.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))


def resolve_cluster(spec: str | None, *, nodes: int | None = None, device_name: str | None = None,
                    bandwidth: str | None = None, shared_cores: int | None = None) -> ClusterSpec:
    """What the CLI's --cluster/--nodes/--device/--bandwidth mean: a preset name or a file path,
    with overrides."""
    if spec and (spec.endswith((".yaml", ".yml", ".json")) or Path(spec).is_file()):
        c = load_cluster(spec)
        if nodes is not None:
            c = replace(c, nodes=nodes)
        if device_name:
            c = replace(c, device=device(device_name))
        if bandwidth:
            c = replace(c, nic=link(bandwidth))
        if shared_cores is not None:
            c = replace(c, shared_cores=shared_cores)
        return c
    if nodes is not None and nodes < 1:
        raise SpecError(f"--nodes must be at least 1, got {nodes}")
    return cluster(spec or "titan-x", nodes=nodes or 4, device_name=device_name, bandwidth=bandwidth, shared_cores=shared_cores)
