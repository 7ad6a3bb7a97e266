"""Compute time of layers on one device (PALEO §3.1) and the memory a node needs.

Layer time, PALEO §3.1.1 eq.1: ``T(u) = R(Pa(u)) + C(f, d) + W(f, d)``.

- ``C = FLOPs · batch / (peak · efficiency)``: ``efficiency`` is ``DeviceSpec.compute_efficiency``
  (PALEO §3.3 PPP_comp). FLOPs come from the NetSpec (GEMM counts, 2 per multiply-add) unless the
  FFT path is asked for with an explicit ``ConvGeometry`` (PALEO §3.1.3).
- ``R`` and ``W``: bytes read from and written to device memory / memory bandwidth. Exact accounting
  (``in`` = the layer's input bytes per sample, ``out`` = its output bytes per sample, ``w`` = its
  parameter bytes):

  ======== ====================================== =========================================
  phase    read (R)                               write (W)
  ======== ====================================== =========================================
  forward  in·batch + w  (inputs and weights)     out·batch
  backward out·batch + in·batch + w               in·batch + w
           (output-grad, saved input, weights)    (input-grad, weight-grad)
  ======== ====================================== =========================================

  A layer that reads the network input writes no input-gradient (autograd does not compute it).
  PALEO's eq.1 names only the parents' outputs in R; the weights are read from the same memory, and
  for FC layers at small batch they are most of the traffic, so they are counted.
- A CPU core's kernels cost more than R + C + W for some ops (a max-pool's compares, a dropout
  mask's random numbers, an autograd node a call): ``DeviceSpec.kernel_costs`` adds them
  (``hardware.KernelCost``, the CPU presets' ``hardware.CPU_KERNEL_CYCLES``).
- Parents on another device (model parallelism) are not charged here: the engine's transfers carry
  those bytes.

A DAG on one device runs its branches one after another, so a phase's time is the sum of its
layers' times (PALEO §3.1: a sequential device executes parallel branches sequentially).

Memory (``MemoryUse``, ``training_memory``, ``server_memory``): the peak bytes one node holds —
parameters, gradients, optimizer state, the outputs of the layers it runs for the samples it
processes (PALEO §3.1.1: backward reads them), the inputs of those samples, and communication
buffers. Every strategy says this per role; a config whose peak exceeds ``DeviceSpec.memory_bytes``
is infeasible (Stanza §4.2 assigns nodes within the GPUs' memory). Outputs are counted as the
NetSpec gives them, in-place activations included: an upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from layerplan import units
from layerplan.errors import ConfigError
from layerplan.hardware import DeviceSpec
from layerplan.netspec.spec import LayerSpec, NetSpec

DIRECTIONS = ("fwd", "bwd")
CONV_ALGORITHMS = ("gemm", "fft", "auto")


@dataclass(frozen=True, kw_only=True, slots=True)
class ConvGeometry:
    """The shape of a 2-D convolution with stride 1, for the FFT path (PALEO §3.1.3 letters)."""

    filters: int
    """K: output channels."""
    channels: int
    """C: input channels."""
    kernel_h: int
    """R: filter height."""
    kernel_w: int
    """S: filter width."""
    out_h: int
    """P: output height."""
    out_w: int
    """Q: output width."""

    def __post_init__(self) -> None:
        for f in ("filters", "channels", "kernel_h", "kernel_w", "out_h", "out_w"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"conv geometry: {f} must be a positive integer, got {v!r}")

    @property
    def transform_size(self) -> int:
        """n: points of one 2-D transform, the padded input (P+R−1)×(Q+S−1)."""
        return (self.out_h + self.kernel_h - 1) * (self.out_w + self.kernel_w - 1)

    def gemm_flops(self, batch: int) -> float:
        """Forward FLOPs of the lowered GEMM."""
        k, c, r, s, p, q = self.filters, self.channels, self.kernel_h, self.kernel_w, self.out_h, self.out_w
        return 2.0 * k * c * r * s * batch * p * q  # PALEO §3.1.3: 2·K·C·R·S·N·P·Q

    def fft_flops(self, batch: int) -> float:
        """Forward FLOPs by FFT: transform N·C inputs and K·C filters, multiply pointwise (a complex
        multiply-add = 8 FLOPs per point per (sample, filter, channel)), inverse-transform N·K
        outputs. Each complex 2-D transform of n points costs 5·n·log2(n)."""
        n = self.transform_size
        k, c = self.filters, self.channels
        transforms = batch * c + k * c + batch * k
        per_transform = 5.0 * n * math.log2(n) if n > 1 else 0.0  # PALEO §3.1.3: 5·n·log2(n) per complex FFT
        return transforms * per_transform + 8.0 * batch * k * c * n  # PALEO §3.1.3: plus the elementwise products


def _check_common(batch: int, direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ConfigError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 0:
        raise ConfigError(f"batch must be a non-negative integer, got {batch!r}")


def _compute_flops(layer: LayerSpec, batch: int, direction: str, conv_algorithm: str,
                   geometry: ConvGeometry | None) -> float:
    if conv_algorithm not in CONV_ALGORITHMS:
        raise ConfigError(f"conv_algorithm must be one of {', '.join(CONV_ALGORITHMS)}, got {conv_algorithm!r}")
    gemm = float(layer.fwd_flops if direction == "fwd" else layer.bwd_flops) * batch
    if conv_algorithm == "gemm" or layer.kind != "conv":
        return gemm
    if geometry is None:
        raise ConfigError(f"layer {layer.name!r}: the {conv_algorithm} convolution needs its ConvGeometry "
                          "(a NetSpec does not record kernel sizes)")
    fft = geometry.fft_flops(batch) * (1.0 if direction == "fwd" else 2.0)  # PALEO §3.1.3: backward = two convolutions
    if conv_algorithm == "fft":
        return fft
    return min(gemm, fft)  # PALEO §3.1.3: a cuDNN-like heuristic picks the faster algorithm


def profile_key(layer: LayerSpec, in_bytes: int | None) -> str:
    """What identifies a layer's cost for a measured profile (``DeviceSpec.profiled_layers``): op,
    input bytes per sample, output shape, parameters, forward and backward FLOPs per sample (the
    backward count tells a first layer, which computes no input gradient, from the same layer
    deeper in a net). Names are left out, so equal layers of different nets share an entry."""
    shape = "x".join(map(str, layer.out_shape))
    return f"{layer.op}|in={in_bytes}|out={shape}|p={layer.params}|f={layer.fwd_flops}|b={layer.bwd_flops}"


def layer_time_s(layer: LayerSpec, device: DeviceSpec, batch: int, *, direction: str, in_bytes: int | None = None,
                 conv_algorithm: str = "gemm", geometry: ConvGeometry | None = None, bytes_scale: float = 1.0) -> float:
    """PALEO §3.1.1 eq.1 time of one layer for ``batch`` samples on ``device``.

    ``in_bytes``: the layer's input bytes per sample (its parents' outputs, or the network input);
    ``None`` leaves the input out of R and W — ``phase_time_s`` always passes it.
    ``conv_algorithm``: "gemm" (the NetSpec's FLOPs, the default everywhere), "fft" or "auto"
    (the faster of the two); the last two need ``geometry`` for conv layers and ignore other kinds.
    ``bytes_scale``: multiplies every byte count of the spec (e.g. 0.5 to train an fp32 spec in
    fp16); FLOPs do not change.

    A device with ``kernel_costs`` (the CPU core presets) adds its op's ``hardware.KernelCost``: per
    call, per input byte and extra weight passes, what a library kernel costs beyond eq.1.

    A layer the device has a measured profile of (``DeviceSpec.profiled_layers``, from
    ``layerplan calibrate``) takes its measured time instead — at the profile's own bytes (scale 1)
    and with the GEMM algorithm, the only case a profile describes.
    """
    _check_common(batch, direction)
    if device.profiled_layers and bytes_scale == 1.0 and conv_algorithm == "gemm":
        measured = device.profiled(profile_key(layer, in_bytes))
        if measured is not None:
            return measured.time_s(batch, direction)
    inp = (0 if in_bytes is None else in_bytes) * bytes_scale
    flops = _compute_flops(layer, batch, direction, conv_algorithm, geometry)
    c = flops / device.achieved_flops_per_s_for(layer.kind)  # PALEO §3.1.1 eq.1 C = FLOPs / (peak · PPP_comp)
    w = float(layer.param_bytes) * bytes_scale
    out = float(layer.out_bytes) * bytes_scale
    if direction == "fwd":
        read = inp * batch + w
        write = out * batch
    else:
        read = (out + inp) * batch + w
        write = (inp * batch if layer.parents else 0.0) + w
    bw = device.mem_bandwidth_bytes_per_s
    kernel = device.kernel_cost(layer.op) if device.kernel_costs else None
    extra = kernel.time_s(batch, direction, inp, w, bw) if kernel else 0.0  # hardware.KernelCost: beyond eq.1
    return read / bw + c + write / bw + extra  # PALEO §3.1.1 eq.1: T = R + C + W


def input_bytes(net: NetSpec, layer: LayerSpec, out_bytes: Mapping[str, int] | None = None) -> int:
    """Bytes per sample a layer reads: its parents' outputs, or the network input."""
    if not layer.parents:
        return math.prod(net.input_shape) * net.dtype_bytes
    if out_bytes is None:
        return sum(net.layer(p).out_bytes for p in layer.parents)
    return sum(out_bytes[p] for p in layer.parents)


def _scale(net: NetSpec, dtype_bytes: int | None) -> float:
    """Byte scale to train ``net`` (whose spec counts ``net.dtype_bytes`` per value) in ``dtype_bytes``."""
    if dtype_bytes is None or dtype_bytes == net.dtype_bytes:
        return 1.0
    if dtype_bytes not in (1, 2, 4, 8):
        raise ConfigError(f"dtype_bytes must be 1, 2, 4 or 8, got {dtype_bytes!r}")
    return dtype_bytes / net.dtype_bytes


def phase_time_s(net: NetSpec, layers: Sequence[LayerSpec], device: DeviceSpec, batch: int, direction: str, *,
                 conv_algorithm: str = "gemm", geometries: Mapping[str, ConvGeometry] | None = None,
                 dtype_bytes: int | None = None) -> float:
    """Forward or backward time of ``layers`` (a part of ``net``) for ``batch`` samples on one
    device: the sum of their layer times. Branches of a DAG run one after another on one device
    (PALEO §3.1: sequential execution of a supernode's branches). ``dtype_bytes``: bytes per value
    to train in (None = the spec's own ``net.dtype_bytes``)."""
    _check_common(batch, direction)
    scale = _scale(net, dtype_bytes)
    sizes = {layer.name: layer.out_bytes for layer in net.layers}
    geoms = geometries or {}
    total = 0.0
    for layer in layers:
        total += layer_time_s(layer, device, batch, direction=direction, in_bytes=input_bytes(net, layer, sizes),
                              conv_algorithm=conv_algorithm, geometry=geoms.get(layer.name),
                              bytes_scale=scale)  # PALEO §3.1: sum over a chain
    return total


def fwd_bwd_time_s(net: NetSpec, layers: Sequence[LayerSpec], device: DeviceSpec, batch: int, *,
                   conv_algorithm: str = "gemm", geometries: Mapping[str, ConvGeometry] | None = None,
                   dtype_bytes: int | None = None) -> float:
    """Forward plus backward time of ``layers`` (one training step's compute, no update)."""
    kw = {"conv_algorithm": conv_algorithm, "geometries": geometries, "dtype_bytes": dtype_bytes}
    return phase_time_s(net, layers, device, batch, "fwd", **kw) + phase_time_s(net, layers, device, batch, "bwd", **kw)


# ---- memory --------------------------------------------------------------------------------------
# Peak device memory of one node (PALEO §3.1.1 keeps every output that backward reads; Stanza §4.2
# assigns nodes under the GPU's memory). A node holds, at the end of its forward pass (the peak:
# backward frees activations as it goes): its parameters, their gradients, the optimizer state,
# the outputs of every layer it runs for the samples it processes, the inputs of those samples
# (the network input, or activations received from another node) and its communication buffers.
@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryUse:
    """Peak device memory of one node of a role, by what holds it (bytes, the NetSpec's dtype)."""

    parameters_bytes: float = 0.0
    """Parameters the node holds (a replica, a phase, a shard or a partition)."""
    gradients_bytes: float = 0.0
    """Their gradients (on a server: the sum of the pushed gradients)."""
    optimizer_bytes: float = 0.0
    """Optimizer state: SGD momentum = one buffer per parameter the node updates."""
    activations_bytes: float = 0.0
    """Outputs of the layers the node runs, kept for backward: Σ out_bytes × samples."""
    inputs_bytes: float = 0.0
    """Inputs of those samples kept for backward: the network input batch, or the activations
    received from other nodes (Stanza's boundary activations, RALP's split layer)."""
    buffers_bytes: float = 0.0
    """Communication buffers: a flat gradient for an all-reduce (DDP's buckets), received gradient
    or parameter messages, gathered activations."""
    samples: int = 0
    """Samples whose activations the node keeps at once."""

    def __post_init__(self) -> None:
        for f in ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "inputs_bytes",
                  "buffers_bytes", "samples"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"memory use: {f} must be a finite non-negative number, got {v!r}")

    @property
    def total_bytes(self) -> float:
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.inputs_bytes + self.buffers_bytes)

    def __add__(self, other: "MemoryUse") -> "MemoryUse":
        """Two things one node does (RALP's PS worker: the tail's training and the head's server)."""
        if not isinstance(other, MemoryUse):
            return NotImplemented
        return MemoryUse(parameters_bytes=self.parameters_bytes + other.parameters_bytes,
                         gradients_bytes=self.gradients_bytes + other.gradients_bytes,
                         optimizer_bytes=self.optimizer_bytes + other.optimizer_bytes,
                         activations_bytes=self.activations_bytes + other.activations_bytes,
                         inputs_bytes=self.inputs_bytes + other.inputs_bytes,
                         buffers_bytes=self.buffers_bytes + other.buffers_bytes, samples=max(self.samples, other.samples))

    def to_dict(self) -> dict[str, float]:
        return {"parameters_bytes": self.parameters_bytes, "gradients_bytes": self.gradients_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
                "inputs_bytes": self.inputs_bytes, "buffers_bytes": self.buffers_bytes, "samples": self.samples,
                "total_bytes": self.total_bytes}

    def describe(self) -> str:
        """'parameters 528 MiB, gradients 528 MiB, …, activations 1.8 GiB for 32 samples' (parts > 0)."""
        parts = []
        for label, v in (("parameters", self.parameters_bytes), ("gradients", self.gradients_bytes),
                         ("momentum", self.optimizer_bytes), ("activations", self.activations_bytes),
                         ("inputs", self.inputs_bytes), ("buffers", self.buffers_bytes)):
            if v > 0:
                text = f"{label} {_gib_text(v)}"
                if label == "activations" and self.samples:
                    text += f" for {self.samples} samples"
                parts.append(text)
        return ", ".join(parts)


def _gib_text(n: float) -> str:
    """Binary units, 3 significant digits ('13.2 GiB'); 4 where 3 would print an exponent (1016 MiB)."""
    text = units.format_bytes(n, binary=True, digits=3)
    return units.format_bytes(n, binary=True, digits=4) if "e+" in text else text


def activation_bytes(layers: Sequence[LayerSpec], samples: int) -> int:
    """Outputs of ``layers`` kept for backward: Σ out_bytes × samples."""
    return sum(layer.out_bytes for layer in layers) * samples  # PALEO §3.1.1: each output a later backward reads stays resident


def entering_bytes(net: NetSpec, layers: Sequence[LayerSpec]) -> int:
    """Bytes per sample that enter ``layers`` from outside: the network input (when one of them
    reads it) and the outputs of parents that are not among them (another node's activations)."""
    names = {layer.name for layer in layers}
    outside: set[str] = set()
    reads_input = False
    for layer in layers:
        if not layer.parents:
            reads_input = True
        outside.update(p for p in layer.parents if p not in names)
    per_sample = sum(net.layer(p).out_bytes for p in outside)
    if reads_input:
        per_sample += math.prod(net.input_shape) * net.dtype_bytes
    return per_sample


def training_memory(net: NetSpec, layers: Sequence[LayerSpec], samples: int, *, param_share: float = 1.0,
                    optimizer_slots: int = 1, buffers_bytes: float = 0.0, inputs_bytes: float | None = None) -> MemoryUse:
    """Memory of a node that runs forward and backward of ``layers`` for ``samples`` samples.

    ``param_share``: the share of the layers' parameters it holds (1/n for a partition).
    ``optimizer_slots``: copies of those parameters in optimizer state (momentum SGD = 1, Adam = 2,
    0 when a server updates them). ``inputs_bytes``: what it keeps of its inputs (default: the bytes
    entering ``layers`` from outside × ``samples``). ``buffers_bytes``: communication buffers."""
    if optimizer_slots < 0 or samples < 0 or buffers_bytes < 0 or param_share < 0:
        raise ConfigError("memory: optimizer_slots, samples, buffers_bytes and param_share must be non-negative")
    params = sum(layer.param_bytes for layer in layers) * param_share
    return MemoryUse(parameters_bytes=params, gradients_bytes=params, optimizer_bytes=params * optimizer_slots,
                     activations_bytes=activation_bytes(layers, samples),
                     inputs_bytes=entering_bytes(net, layers) * samples if inputs_bytes is None else inputs_bytes,
                     buffers_bytes=buffers_bytes, samples=samples)


def server_memory(param_bytes: float, pushers: int, *, optimizer_slots: int = 1) -> MemoryUse:
    """A parameter server holding ``param_bytes`` of parameters: the parameters, the summed
    gradient, the optimizer state, and one receive buffer per node that pushes a gradient to it at
    once (runtime/roles/ps.py posts a receive per worker; the engine runs the pushes together)."""
    if pushers < 0 or param_bytes < 0 or optimizer_slots < 0:
        raise ConfigError("memory: param_bytes, pushers and optimizer_slots must be non-negative")
    return MemoryUse(parameters_bytes=param_bytes, gradients_bytes=param_bytes, optimizer_bytes=param_bytes * optimizer_slots,
                     buffers_bytes=param_bytes * pushers)


def peak_memory_bytes(net: NetSpec, layers: Sequence[LayerSpec], batch: int, *, optimizer_slots: int = 1,
                      comm_buffer_bytes: float = 0, dtype_bytes: int | None = None) -> int:
    """Device memory a node needs to train ``layers`` at ``batch`` samples:

    parameters + gradients + optimizer state (``optimizer_slots`` copies of the parameters:
    momentum SGD = 1, Adam = 2) + activations kept for backward (every layer's output, and the
    inputs that enter ``layers`` from outside: the network input or another node's activations)
    + communication buffers (e.g. a bucket being all-reduced, received activations), in bytes as
    given. ``dtype_bytes``: bytes per value to train in (None = the spec's ``net.dtype_bytes``).
    ``training_memory`` gives the same figure by part.
    """
    if optimizer_slots < 0 or comm_buffer_bytes < 0 or batch < 0:
        raise ConfigError("peak memory: optimizer_slots, comm_buffer_bytes and batch must be non-negative")
    m = training_memory(net, layers, batch, optimizer_slots=optimizer_slots)
    return int(m.total_bytes * _scale(net, dtype_bytes) + comm_buffer_bytes)


def check_fits(nbytes: float, device: DeviceSpec, what: str, detail: str = "") -> None:
    """Raise ConfigError when ``nbytes`` do not fit in ``device``'s memory (``detail``: what the
    bytes are, added in parentheses)."""
    if nbytes > device.memory_bytes:
        raise ConfigError(f"{what} needs {_gib_text(nbytes)} on a {_gib_text(device.memory_bytes)} {device.name}"
                          + (f" ({detail})" if detail else ""))


__all__ = ["ConvGeometry", "MemoryUse", "activation_bytes", "check_fits", "entering_bytes", "fwd_bwd_time_s", "input_bytes",
           "layer_time_s", "peak_memory_bytes", "phase_time_s", "server_memory", "training_memory"]
