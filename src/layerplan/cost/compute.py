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
- Parents on another device (model parallelism) are not charged here: the engine's transfers carry
  those bytes.

A DAG on one device runs its branches one after another, so a phase's time is the sum of its
layers' times (PALEO §3.1: a sequential device executes parallel branches sequentially).
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


def layer_time_s(layer: LayerSpec, device: DeviceSpec, batch: int, *, direction: str, in_bytes: int | None = None,
                 conv_algorithm: str = "gemm", geometry: ConvGeometry | None = None, bytes_scale: float = 1.0) -> float:
    """PALEO §3.1.1 eq.1 time of one layer for ``batch`` samples on ``device``.

    ``in_bytes``: the layer's input bytes per sample (its parents' outputs, or the network input);
    ``None`` leaves the input out of R and W — ``phase_time_s`` always passes it.
    ``conv_algorithm``: "gemm" (the NetSpec's FLOPs, the default everywhere), "fft" or "auto"
    (the faster of the two); the last two need ``geometry`` for conv layers and ignore other kinds.
    ``bytes_scale``: multiplies every byte count of the spec (e.g. 0.5 to train an fp32 spec in
    fp16); FLOPs do not change.
    """
    _check_common(batch, direction)
    inp = (0 if in_bytes is None else in_bytes) * bytes_scale
    flops = _compute_flops(layer, batch, direction, conv_algorithm, geometry)
    c = flops / device.achieved_flops_per_s  # PALEO §3.1.1 eq.1 C = FLOPs / (peak · PPP_comp)
    w = float(layer.param_bytes) * bytes_scale
    out = float(layer.out_bytes) * bytes_scale
    if direction == "fwd":
        read = inp * batch + w
        write = out * batch
    else:
        read = (out + inp) * batch + w
        write = (inp * batch if layer.parents else 0.0) + w
    bw = device.mem_bandwidth_bytes_per_s
    return read / bw + c + write / bw  # PALEO §3.1.1 eq.1: T = R + C + W


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
def peak_memory_bytes(net: NetSpec, layers: Sequence[LayerSpec], batch: int, *, optimizer_slots: int = 1,
                      comm_buffer_bytes: float = 0, dtype_bytes: int | None = None) -> int:
    """Device memory a node needs to train ``layers`` at ``batch`` samples:

    parameters + gradients + optimizer state (``optimizer_slots`` copies of the parameters:
    momentum SGD = 1, Adam = 2) + activations kept for backward (every layer's output, and the
    inputs that enter ``layers`` from outside: the network input or another node's activations)
    + communication buffers (e.g. a bucket being all-reduced, received activations), in bytes as
    given. ``dtype_bytes``: bytes per value to train in (None = the spec's ``net.dtype_bytes``).
    """
    if optimizer_slots < 0 or comm_buffer_bytes < 0 or batch < 0:
        raise ConfigError("peak memory: optimizer_slots, comm_buffer_bytes and batch must be non-negative")
    names = {layer.name for layer in layers}
    params = sum(layer.param_bytes for layer in layers)
    weights = params * (2 + optimizer_slots)  # SYSTEMS.md §1: parameters + gradients + optimizer slots
    sizes = {layer.name: layer.out_bytes for layer in net.layers}
    outside: set[str] = set()
    reads_input = False
    for layer in layers:
        if not layer.parents:
            reads_input = True
        outside.update(p for p in layer.parents if p not in names)
    per_sample = sum(layer.out_bytes for layer in layers) + sum(sizes[p] for p in outside)
    if reads_input:
        per_sample += math.prod(net.input_shape) * net.dtype_bytes
    activations = per_sample * batch  # PALEO §3.1.1: every output a later backward reads stays resident
    return int((weights + activations) * _scale(net, dtype_bytes) + comm_buffer_bytes)


def check_fits(nbytes: float, device: DeviceSpec, what: str) -> None:
    """Raise ConfigError when ``nbytes`` do not fit in ``device``'s memory."""
    if nbytes > device.memory_bytes:
        raise ConfigError(f"{what} needs {units.format_bytes(nbytes, binary=True, digits=3)} on a "
                          f"{units.format_bytes(device.memory_bytes, binary=True, digits=3)} {device.name}")


__all__ = ["ConvGeometry", "check_fits", "fwd_bwd_time_s", "input_bytes", "layer_time_s", "peak_memory_bytes", "phase_time_s"]
