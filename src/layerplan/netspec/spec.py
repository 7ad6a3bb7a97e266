"""NetSpec: what a network is, per layer, in plain numbers. Pure Python (no torch).

A network is a DAG of layers in topological order. Each layer records its output shape and
activation bytes per sample, parameters, and forward/backward FLOPs per sample (2 FLOPs per
multiply-add, as ``torch.utils.flop_counter`` and SYSTEMS.md count them). The **phase boundary**
is the layer after which the network is "FC phase": the cut where Stanza, RALP and Omnivore
separate the conv part (large data, small model) from the FC part (small data, large model).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable

from layerplan.errors import SpecError

LAYER_KINDS = ("conv", "fc", "pool", "norm", "act", "dropout", "merge", "other")
FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerSpec:
    """One layer (a leaf module or a tensor op such as ResNet's residual add)."""

    name: str
    """Unique name: the module path ("features.0") or the traced op ("add_3")."""
    kind: str
    """One of LAYER_KINDS."""
    op: str
    """What it is, for people: "Conv2d", "Linear", "add", "cat" ..."""
    parents: tuple[str, ...]
    """Names of the layers whose outputs it reads; empty = reads the network input."""
    out_shape: tuple[int, ...]
    """Output shape of one sample (no batch dimension)."""
    params: int
    """Trainable parameters owned by this layer."""
    param_bytes: int
    """Bytes of those parameters."""
    out_bytes: int
    """Bytes of the output activation of one sample."""
    fwd_flops: int
    """Forward FLOPs per sample."""
    bwd_flops: int
    """Backward FLOPs per sample as training runs it (input-grad + weight-grad)."""
    bwd_input_flops: int | None = None
    """Part of bwd_flops for the gradient w.r.t. the input, where known."""
    bwd_weight_flops: int | None = None
    """Part of bwd_flops for the gradient w.r.t. the weights, where known."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise SpecError(f"layer name must be a non-empty string, got {self.name!r}")
        if self.kind not in LAYER_KINDS:
            raise SpecError(f"layer {self.name!r}: kind {self.kind!r} is not one of {', '.join(LAYER_KINDS)}")
        for f in ("params", "param_bytes", "out_bytes", "fwd_flops", "bwd_flops"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SpecError(f"layer {self.name!r}: {f} must be a non-negative integer, got {v!r}")
        for f in ("bwd_input_flops", "bwd_weight_flops"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SpecError(f"layer {self.name!r}: {f} must be a non-negative integer or null, got {v!r}")
        if any((not isinstance(d, int)) or d < 0 for d in self.out_shape):
            raise SpecError(f"layer {self.name!r}: out_shape must hold non-negative integers, got {self.out_shape!r}")
        if self.name in self.parents:
            raise SpecError(f"layer {self.name!r} lists itself as a parent")

    @property
    def activations(self) -> int:
        """Number of output values per sample."""
        n = 1
        for d in self.out_shape:
            n *= d
        return n


@dataclass(frozen=True, kw_only=True, slots=True)
class NetSpec:
    """A network: layers in topological order, the input, and the phase boundary."""

    name: str
    """Model name (zoo name, factory path or file name)."""
    input_shape: tuple[int, ...]
    """Shape of one input sample, e.g. (3, 224, 224)."""
    dtype_bytes: int
    """Bytes per value of parameters and activations (4 for fp32)."""
    layers: tuple[LayerSpec, ...]
    """All layers in a topological order of the DAG."""
    boundary: str | None
    """Name of the last layer of the conv phase; the FC phase follows. None: no FC phase."""
    num_classes: int | None = None
    """Width of the output, where known."""
    source: str = ""
    """Where the spec came from (for people)."""
    buffer_bytes: int = 0
    """Bytes of the model's state that is not parameters (BatchNorm's running statistics and batch
    counters): torch DDP broadcasts them from rank 0 before every forward."""
    buffer_bytes_by_dtype: tuple[int, ...] = ()
    """``buffer_bytes`` split by dtype (BatchNorm: float statistics, int64 batch counters). DDP
    coalesces the buffers of each dtype into one broadcast, so each entry is one call a step.
    Empty: a single call of ``buffer_bytes``."""
    _single: tuple[bool, ...] = field(default=(), init=False, repr=False, compare=False)
    """single_cuts(layers), computed once."""

    def __post_init__(self) -> None:
        if not self.layers:
            raise SpecError(f"network {self.name!r} has no layers")
        if self.dtype_bytes not in (1, 2, 4, 8):
            raise SpecError(f"network {self.name!r}: dtype_bytes must be 1, 2, 4 or 8, got {self.dtype_bytes!r}")
        if not self.input_shape or any((not isinstance(d, int)) or d <= 0 for d in self.input_shape):
            raise SpecError(f"network {self.name!r}: input_shape must be positive integers, got {self.input_shape!r}")
        seen: set[str] = set()
        for layer in self.layers:
            if layer.name in seen:
                raise SpecError(f"network {self.name!r}: layer name {layer.name!r} appears twice")
            for p in layer.parents:
                if p not in seen:
                    raise SpecError(
                        f"network {self.name!r}: layer {layer.name!r} reads {p!r}, which is not an earlier layer "
                        "(layers must be in topological order)"
                    )
            seen.add(layer.name)
        if not isinstance(self.buffer_bytes, int) or isinstance(self.buffer_bytes, bool) or self.buffer_bytes < 0:
            raise SpecError(f"network {self.name!r}: buffer_bytes must be a non-negative integer, got {self.buffer_bytes!r}")
        by_dtype = self.buffer_bytes_by_dtype
        if by_dtype and (any(not isinstance(b, int) or isinstance(b, bool) or b <= 0 for b in by_dtype)
                         or sum(by_dtype) != self.buffer_bytes):
            raise SpecError(f"network {self.name!r}: buffer_bytes_by_dtype must be positive integers summing to "
                            f"buffer_bytes ({self.buffer_bytes}), got {list(by_dtype)!r}")
        if self.boundary is not None and self.boundary not in seen:
            raise SpecError(f"network {self.name!r}: boundary {self.boundary!r} is not a layer")
        object.__setattr__(self, "_single", single_cuts(self.layers))

    # ---- lookups -------------------------------------------------------------------------
    def index(self, name: str) -> int:
        for i, layer in enumerate(self.layers):
            if layer.name == name:
                return i
        raise SpecError(f"network {self.name!r} has no layer {name!r}")

    def layer(self, name: str) -> LayerSpec:
        return self.layers[self.index(name)]

    @property
    def boundary_index(self) -> int | None:
        return None if self.boundary is None else self.index(self.boundary)

    @property
    def conv_layers(self) -> tuple[LayerSpec, ...]:
        """Layers of the conv phase (all layers when there is no FC phase)."""
        b = self.boundary_index
        return self.layers if b is None else self.layers[: b + 1]

    @property
    def fc_layers(self) -> tuple[LayerSpec, ...]:
        """Layers of the FC phase (none when there is no boundary)."""
        b = self.boundary_index
        return () if b is None else self.layers[b + 1 :]

    def head(self, split: str) -> tuple[LayerSpec, ...]:
        """Layers up to and including ``split``."""
        return self.layers[: self.index(split) + 1]

    def tail(self, split: str) -> tuple[LayerSpec, ...]:
        """Layers after ``split``."""
        return self.layers[self.index(split) + 1 :]

    def with_dtype_bytes(self, dtype_bytes: int) -> "NetSpec":
        """The same network stored in another element size (float64 runs, fp16 what-ifs): parameter
        and activation bytes scale by dtype_bytes / self.dtype_bytes; FLOPs do not change."""
        if dtype_bytes == self.dtype_bytes:
            return self
        if dtype_bytes not in (1, 2, 4, 8):
            raise SpecError(f"network {self.name!r}: dtype_bytes must be 1, 2, 4 or 8, got {dtype_bytes!r}")
        layers = tuple(replace(layer, param_bytes=layer.params * dtype_bytes,
                               out_bytes=layer.activations * dtype_bytes) for layer in self.layers)
        return replace(self, dtype_bytes=dtype_bytes, layers=layers)  # buffers keep their dtypes

    # ---- totals --------------------------------------------------------------------------
    @property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def conv_params(self) -> int:
        return sum(layer.params for layer in self.conv_layers)

    @property
    def fc_params(self) -> int:
        return sum(layer.params for layer in self.fc_layers)

    @property
    def conv_param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.conv_layers)

    @property
    def fc_param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.fc_layers)

    @property
    def fwd_flops(self) -> int:
        """Forward FLOPs per sample."""
        return sum(layer.fwd_flops for layer in self.layers)

    @property
    def bwd_flops(self) -> int:
        """Backward FLOPs per sample."""
        return sum(layer.bwd_flops for layer in self.layers)

    @property
    def boundary_bytes(self) -> int:
        """Activation bytes per sample that cross the phase boundary (Stanza's A·dtype)."""
        b = self.boundary_index
        return 0 if b is None else self.layers[b].out_bytes

    def cut_is_single(self, i: int) -> bool:
        """True when the cut after layer i is crossed by layer i's output alone (no earlier layer
        feeds a later one): a split point for Stanza, RALP and Omnivore must be such a cut."""
        return self._single[i]

    # ---- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "input_shape": list(self.input_shape),
            "dtype_bytes": self.dtype_bytes,
            "boundary": self.boundary,
            "num_classes": self.num_classes,
            "source": self.source,
            "buffer_bytes": self.buffer_bytes,
            "buffer_bytes_by_dtype": list(self.buffer_bytes_by_dtype),
            "layers": [_layer_to_dict(layer) for layer in self.layers],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: Any, where: str = "NetSpec") -> "NetSpec":
        if not isinstance(data, dict):
            raise SpecError(f"{where}: expected a JSON object, got {type(data).__name__}")
        keys = {"format", "name", "input_shape", "dtype_bytes", "boundary", "num_classes", "source", "layers"}
        optional = {"buffer_bytes", "buffer_bytes_by_dtype"}
        _exact_keys({k: v for k, v in data.items() if k not in optional}, keys, where)
        if data["format"] != FORMAT_VERSION:
            raise SpecError(f"{where}: format {data['format']!r} is not supported (expected {FORMAT_VERSION})")
        if not isinstance(data["layers"], list):
            raise SpecError(f"{where}: 'layers' must be a list")
        layers = tuple(_layer_from_dict(d, f"{where}: layer {i}") for i, d in enumerate(data["layers"]))
        return cls(
            name=_typed(data["name"], str, f"{where}: name"),
            input_shape=_int_tuple(data["input_shape"], f"{where}: input_shape"),
            dtype_bytes=_typed(data["dtype_bytes"], int, f"{where}: dtype_bytes"),
            boundary=None if data["boundary"] is None else _typed(data["boundary"], str, f"{where}: boundary"),
            num_classes=None if data["num_classes"] is None else _typed(data["num_classes"], int, f"{where}: num_classes"),
            source=_typed(data["source"], str, f"{where}: source"),
            buffer_bytes=_typed(data.get("buffer_bytes", 0), int, f"{where}: buffer_bytes"),
            buffer_bytes_by_dtype=tuple(_typed(b, int, f"{where}: buffer_bytes_by_dtype")
                                        for b in _typed(data.get("buffer_bytes_by_dtype", []), list,
                                                        f"{where}: buffer_bytes_by_dtype")),
            layers=layers,
        )

    @classmethod
    def from_json(cls, text: str, where: str = "NetSpec") -> "NetSpec":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        return cls.from_dict(data, where)

    @classmethod
    def load(cls, path: str | Path) -> "NetSpec":
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise SpecError(f"cannot read NetSpec file {str(p)!r}: {e.strerror}") from None
        return cls.from_json(text, where=str(p))


_LAYER_FIELDS = tuple(f.name for f in fields(LayerSpec))


def _layer_to_dict(layer: LayerSpec) -> dict[str, Any]:
    d = {name: getattr(layer, name) for name in _LAYER_FIELDS}
    d["parents"] = list(layer.parents)
    d["out_shape"] = list(layer.out_shape)
    return d


def _layer_from_dict(d: Any, where: str) -> LayerSpec:
    if not isinstance(d, dict):
        raise SpecError(f"{where}: expected an object")
    _exact_keys(d, set(_LAYER_FIELDS), where)
    kw = dict(d)
    kw["parents"] = tuple(_typed(p, str, f"{where}: parents") for p in _typed(d["parents"], list, f"{where}: parents"))
    kw["out_shape"] = _int_tuple(d["out_shape"], f"{where}: out_shape", allow_zero=True)
    for f in ("name", "kind", "op"):
        _typed(d[f], str, f"{where}: {f}")
    return LayerSpec(**kw)


def _exact_keys(d: dict, keys: set[str], where: str) -> None:
    unknown = sorted(set(d) - keys)
    missing = sorted(keys - set(d))
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
    if missing:
        raise SpecError(f"{where}: missing key(s) {', '.join(map(repr, missing))}")


def _typed(v: Any, t: type, where: str) -> Any:
    if not isinstance(v, t) or (t is int and isinstance(v, bool)):
        raise SpecError(f"{where}: expected {t.__name__}, got {v!r}")
    return v


def _int_tuple(v: Any, where: str, allow_zero: bool = False) -> tuple[int, ...]:
    if not isinstance(v, list) or any(not isinstance(x, int) or isinstance(x, bool) for x in v):
        raise SpecError(f"{where}: expected a list of integers, got {v!r}")
    if any(x < 0 or (x == 0 and not allow_zero) for x in v):
        raise SpecError(f"{where}: dimensions must be positive, got {v!r}")
    return tuple(v)


def find_boundary(layers: Iterable[LayerSpec]) -> str | None:
    """The phase boundary of a layer list (Stanza §4: split after the last conv layer, after
    the last pooling layer if one follows).

    Rule: take the first single-tensor cut at or after the last conv layer; then move it forward
    over pooling, activation, normalisation and reshaping layers (not dropout, not fc) while the
    cut stays single. None when no fc layer follows the last conv, or there is no conv at all.
    """
    layers = tuple(layers)
    convs = [i for i, layer in enumerate(layers) if layer.kind == "conv"]
    if not convs:
        return None
    last_conv = convs[-1]
    if not any(layer.kind == "fc" for layer in layers[last_conv + 1 :]):
        return None
    single = single_cuts(layers)
    i = last_conv
    while i < len(layers) and not single[i]:
        if layers[i].kind == "fc":
            return None
        i += 1
    if i >= len(layers) - 1 or layers[i].kind == "fc":
        return None
    while (
        i + 1 < len(layers) - 1
        and layers[i + 1].kind in ("pool", "act", "norm", "other")
        and single[i + 1]
    ):
        i += 1
    return layers[i].name


def single_cuts(layers: tuple[LayerSpec, ...]) -> tuple[bool, ...]:
    """``single_cut(layers, i)`` for every i, in one pass: the cut after i is single when no layer
    before i is read after i or read by no one (a second output), and no layer after i reads the
    network input."""
    pos = {layer.name: i for i, layer in enumerate(layers)}
    n = len(layers)
    last_read = [math.inf] * n  # read by no one: crosses every later cut
    for k, layer in enumerate(layers):
        for p in layer.parents:
            j = pos[p]
            last_read[j] = k if last_read[j] == math.inf else max(last_read[j], k)
    parentless_after = [False] * n  # some layer after i reads the network input
    seen = False
    for i in range(n - 1, -1, -1):
        parentless_after[i] = seen
        seen = seen or not layers[i].parents
    out, reach = [], -math.inf  # reach: the latest reader of any layer before i
    for i in range(n):
        out.append(reach <= i and not parentless_after[i])
        reach = max(reach, last_read[i])
    return tuple(out)


def single_cut(layers: tuple[LayerSpec, ...], i: int) -> bool:
    """True when only layer i's output crosses the cut after layer i. A layer of the head that no
    layer reads is a second network output (Inception's auxiliary logits): it crosses every later
    cut, since the loss needs it beside the tail's output."""
    head = {layer.name for layer in layers[: i + 1]}
    me = layers[i].name
    read: set[str] = set()
    for layer in layers:
        read.update(layer.parents)
    if any(layer.name not in read and layer.name != me for layer in layers[: i + 1]):
        return False
    for layer in layers[i + 1 :]:
        if not layer.parents:
            return False  # a later layer reads the network input directly
        for p in layer.parents:
            if p in head and p != me:
                return False
    return True
