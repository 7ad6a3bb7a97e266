"""torch ``nn.Module`` → :class:`NetSpec`, on the meta device (no weights are allocated).

How it works (EMULATION.md "Model analysis"):

1. The module is copied to the meta device (a module already on meta is used as it is) and put in
   train mode, so the FLOPs are those of training.
2. ``torch.fx.symbolic_trace`` gives the DAG. Every node that computes (``call_module``,
   ``call_function``, ``call_method``) is run by an ``fx.Interpreter`` through its own small
   wrapper module, so ``torch.utils.flop_counter.FlopCounterMode`` attributes FLOPs per *node*:
   functional ops (``F.linear`` on a parameter, ``torch.matmul``) and each call of a module that
   is called several times (ResNet's shared ReLU) get their own count. The same run records every
   node's output (what ``ShapeProp`` would do). Nodes that produce no tensor (``x.size(0)``,
   ``getattr``, a namedtuple of outputs) are not layers; their parents and parameters pass on to
   the layers that read them. Models fx cannot trace fall back to forward hooks on the leaf
   modules; the DAG is then the call-order chain.
3. FLOPs come only from ``FlopCounterMode`` (2 per multiply-add; it counts convolutions and
   matrix products, so ``add``/``cat``/activations are 0). One forward on a batch of 2 (BatchNorm
   needs 2 samples) with the input and the trainable parameters requiring grad is counted, then
   two backward passes over the same graph: ``autograd.grad(loss, [input])`` computes only the
   gradients w.r.t. layer inputs (``B``), ``autograd.grad(loss, [input, *params])`` both (``C``).
   Per layer, ``bwd_weight_flops = C − B``; ``bwd_input_flops = B`` where training needs the
   gradient of the layer's input (some earlier layer has trainable parameters), else 0 — the first
   conv computes no input gradient; ``bwd_flops`` is their sum. Counts are divided by the batch.
   A real training backward (input not requiring grad) gives the same totals (tested); counting it
   directly would need a third pass, since ``ModuleTracker`` never closes the window of a layer
   whose input needs no gradient.
4. Each layer's inputs are cloned before the layer runs. ``ModuleTracker`` opens a module's
   backward window when its output gradient is ready and closes it when the gradient of its
   *input tensors* is complete; without the private clone, a tensor read by two layers (a residual
   block's input) keeps the window of the first open while the other branch runs backward, and the
   other branch's FLOPs are counted twice (plain ``FlopCounterMode`` on ResNet-50 attributes
   40.2 GFLOP of backward to its leaf modules against a true 32.2 GFLOP).
5. torch.nn's normalisation, elementwise-activation and dropout layers run as ``x.clone()``
   (``_stand_in``): FlopCounterMode counts nothing for them either way, and their meta kernels are
   slow Python decompositions. This makes ResNet-152 take ~0.35 s instead of ~2.6 s.

``batch_check`` (default on) rejects a model whose output does not keep the batch as its first
dimension: its per-sample numbers would be meaningless.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode

from layerplan.errors import ModelError
from layerplan.netspec.spec import LayerSpec, NetSpec, find_boundary

BATCH = 2
"""Samples per analysed batch: BatchNorm in train mode rejects a batch of 1; FLOPs and activation
sizes are linear in the batch and are divided by it."""

# ---- layer kinds ------------------------------------------------------------------------------
_CONV_MODULES = (nn.modules.conv._ConvNd,)
_FC_MODULES = (nn.Linear, nn.Bilinear)
_POOL_MODULES = (
    nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd, nn.modules.pooling._LPPoolNd, nn.FractionalMaxPool2d,
    nn.FractionalMaxPool3d, nn.modules.pooling._MaxUnpoolNd,
)
_NORM_MODULES = (
    nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.CrossMapLRN2d,
    nn.RMSNorm,
)
_ACT_MODULES = (
    nn.ReLU, nn.ReLU6, nn.Sigmoid, nn.Tanh, nn.GELU, nn.SiLU, nn.Softmax, nn.LogSoftmax, nn.LeakyReLU,
    nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.ELU, nn.SELU, nn.CELU, nn.PReLU, nn.Mish, nn.Softplus,
    nn.Softsign, nn.Tanhshrink, nn.Threshold, nn.GLU, nn.Softmax2d, nn.Softmin, nn.LogSigmoid, nn.RReLU,
)
_DROPOUT_MODULES = (nn.modules.dropout._DropoutNd,)

_FUNCTION_KINDS = {
    **dict.fromkeys(("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                     "convolution"), "conv"),
    **dict.fromkeys(("linear", "bilinear"), "fc"),
    **dict.fromkeys(("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
                     "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
                     "adaptive_max_pool2d", "adaptive_max_pool3d", "lp_pool1d", "lp_pool2d", "lp_pool3d",
                     "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices"), "pool"),
    **dict.fromkeys(("batch_norm", "layer_norm", "group_norm", "instance_norm", "local_response_norm", "rms_norm",
                     "normalize"), "norm"),
    **dict.fromkeys(("relu", "relu6", "sigmoid", "tanh", "gelu", "silu", "softmax", "log_softmax", "leaky_relu",
                     "hardswish", "hardsigmoid", "hardtanh", "elu", "selu", "celu", "prelu", "mish", "softplus",
                     "softsign", "tanhshrink", "threshold", "glu", "softmin", "logsigmoid", "rrelu"), "act"),
    **dict.fromkeys(("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"),
                    "dropout"),
}
_MERGE_FUNCTIONS = {"add", "iadd", "mul", "imul", "sub", "isub", "cat", "concat", "concatenate", "stack"}
_ALWAYS_MERGE = {"cat", "concat", "concatenate", "stack"}


def _module_kind(mod: nn.Module) -> str:
    for kind, classes in (("conv", _CONV_MODULES), ("fc", _FC_MODULES), ("pool", _POOL_MODULES),
                          ("norm", _NORM_MODULES), ("act", _ACT_MODULES), ("dropout", _DROPOUT_MODULES)):
        if isinstance(mod, classes):
            return kind
    return "other"


def _function_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    return name.strip("_") if name.startswith("__") else name


def _function_kind(op: str, tensor_args: int) -> str:
    base = op[:-1] if op.endswith("_") and not op.endswith("__") else op
    if base in _MERGE_FUNCTIONS:
        return "merge" if (base in _ALWAYS_MERGE or tensor_args >= 2) else "other"
    return _FUNCTION_KINDS.get(base, "other")


# ---- helpers ----------------------------------------------------------------------------------
def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _isolate(value: Any) -> Any:
    """A private copy of every tensor that requires grad (see the module docstring, point 4)."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.requires_grad else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_isolate(v) for v in value))
    if isinstance(value, (tuple, list)):  # fx's immutable_list becomes a plain list
        items = [_isolate(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {k: _isolate(v) for k, v in value.items()}
    return value


def _fresh_outputs(out: Any, inputs: Any) -> Any:
    """``out`` with a clone in place of every tensor that *is* one of ``inputs`` (``nn.Identity``,
    ``getitem`` of a tuple, a namedtuple of results). ModuleTracker would otherwise hang the
    layer's backward-start and backward-end hooks on the same tensor, the end first, and leave the
    layer's window open for the rest of the backward pass."""
    ids = {id(t) for t in _tensors(inputs) if t.requires_grad}
    if not ids:
        return out
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) and id(t) in ids else t, out)


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _per_sample(count: int) -> int:
    return int(round(count / BATCH))


def _out_geometry(value: Any) -> tuple[tuple[int, ...], int]:
    """(out_shape per sample, out_bytes per sample) of a tensor, or of the tensors of a tuple."""
    tensors = _tensors(value)
    total = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        total += n // BATCH if (t.dim() >= 1 and t.shape[0] == BATCH) else n
    first = tensors[0]
    shape = tuple(int(d) for d in (first.shape[1:] if first.dim() >= 1 and first.shape[0] == BATCH else first.shape))
    return shape, total


def _param_bytes(params: list[nn.Parameter]) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _unique(names: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def _tracker_names(root: nn.Module) -> dict[nn.Module, str]:
    """The names ``ModuleTracker`` gives modules when ``root`` is the first module called."""
    names: dict[nn.Module, str] = {root: type(root).__name__}
    seen: set[int] = set()

    def visit(mod: nn.Module) -> None:
        if id(mod) in seen:
            return
        for child_name, child in mod.named_children():
            names[child] = f"{names[mod]}.{child_name}"
            visit(child)
        seen.add(id(mod))

    visit(root)
    return names


def _to_meta(module: nn.Module) -> nn.Module:
    """The module itself when all its tensors are on meta, else a meta copy (no data copied)."""
    tensors = list(module.parameters()) + list(module.buffers())
    if all(t.device.type == "meta" for t in tensors):
        return module
    memo: dict[int, Any] = {}
    for t in tensors:
        if id(t) in memo:
            continue
        if isinstance(t, nn.Parameter):
            memo[id(t)] = nn.Parameter(torch.empty_like(t, device="meta"), requires_grad=t.requires_grad)
        else:
            memo[id(t)] = torch.empty_like(t, device="meta")
    try:
        return copy.deepcopy(module, memo)
    except Exception as e:  # noqa: BLE001 — arbitrary user attributes may refuse to be copied
        raise ModelError(f"cannot copy model {type(module).__name__} to the meta device for analysis "
                         f"({_first_line(e)}); build it under `with torch.device('meta'):` instead") from None


# ---- FLOP measurement -------------------------------------------------------------------------
class _Call(nn.Module):
    """Runs one traced op; FlopCounterMode attributes the op's FLOPs to this module's name."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.__dict__["fn"] = fn  # not registered: the wrapped leaf keeps its own place in the tree

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _fresh_outputs(self.fn(*args, **kwargs), (args, kwargs))


class _Root(nn.Module):
    """Holds the per-node wrappers so that ModuleTracker names them ``_Root.calls.<i>``."""

    def __init__(self, calls: list[_Call], run: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.calls = nn.ModuleList(calls)
        self.__dict__["run"] = run

    def forward(self, x: torch.Tensor) -> Any:
        return self.run(x)


_ELEMENTWISE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.Sigmoid, nn.Tanh, nn.GELU, nn.SiLU, nn.LeakyReLU, nn.Hardswish, nn.Hardsigmoid,
    nn.Hardtanh, nn.ELU, nn.SELU, nn.CELU, nn.Mish, nn.Softplus, nn.Softsign, nn.Tanhshrink, nn.Threshold,
    nn.LogSigmoid, nn.RReLU, *_DROPOUT_MODULES,
)
_SOFTMAX_MODULES = (nn.Softmax, nn.LogSoftmax, nn.Softmin)


def _stand_in_accepts(mod: nn.Module, x: torch.Tensor) -> bool:
    """Would the real layer accept ``x`` (and return its shape)?"""
    if isinstance(mod, _ELEMENTWISE_MODULES):
        return True
    if isinstance(mod, _SOFTMAX_MODULES):
        return mod.dim is not None and -x.dim() <= mod.dim < x.dim()
    if x.dim() < 2:
        return False
    if isinstance(mod, nn.modules.batchnorm._NormBase):
        return x.shape[1] == mod.num_features
    if isinstance(mod, nn.GroupNorm):
        return x.shape[1] == mod.num_channels
    if isinstance(mod, (nn.LayerNorm, nn.RMSNorm)):
        shape = tuple(mod.normalized_shape)
        return tuple(x.shape[x.dim() - len(shape):]) == shape
    return isinstance(mod, nn.LocalResponseNorm) and x.dim() >= 3


def _stand_in(mod: nn.Module) -> Callable[..., Any]:
    """A torch.nn normalisation, elementwise-activation or dropout layer as ``x.clone()``: the
    same output shape, still on the autograd path, and FlopCounterMode counts no FLOPs for either
    (it counts convolutions and matrix products only; the totals are checked against real runs in
    the tests). Their meta kernels are Python decompositions that would take most of the analysis
    time (ResNet-152: 155 BatchNorms, 151 ReLUs). An input the real layer would reject runs the
    real layer, so its error reaches the user."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor) and _stand_in_accepts(mod, args[0]):
            return args[0].clone()
        return mod(*args, **kwargs)

    return call


def _has_stand_in(mod: nn.Module) -> bool:
    """Is ``mod`` one of torch.nn's own layers that _stand_in replaces?"""
    return (type(mod).__module__.startswith("torch.nn.")
            and isinstance(mod, (*_NORM_MODULES, *_ELEMENTWISE_MODULES, *_SOFTMAX_MODULES)))


def _method_caller(name: str) -> Callable[..., Any]:
    def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(obj, name)(*args, **kwargs)

    return call


@dataclass
class _Flops:
    """FLOPs per key at batch BATCH: forward, backward for input grads only (B), and for input and
    parameter grads (C)."""

    fwd: dict[str, int] = field(default_factory=dict)
    bwd_in: dict[str, int] = field(default_factory=dict)
    bwd_all: dict[str, int] = field(default_factory=dict)

    def split(self, key: str) -> tuple[int, int, int]:
        """(forward, input-grad, weight-grad) FLOPs of one key."""
        f = self.fwd.get(key, 0)
        b = self.bwd_in.get(key, 0)
        return f, b, max(self.bwd_all.get(key, 0) - b, 0)


def _totals(fc: FlopCounterMode) -> dict[str, int]:
    return {k: sum(v.values()) for k, v in fc.flop_counts.items()}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items()}


def _measure(run: Callable[[], Any], x: torch.Tensor, trainable: list[nn.Parameter], name: str,
             on_error: Callable[[BaseException], ModelError]) -> tuple[Any, _Flops]:
    """One counted forward, then the two backward passes of the module docstring (point 3)."""
    flops = _Flops()
    with FlopCounterMode(display=False) as fc:
        try:
            out = run()
        except Exception as e:  # noqa: BLE001 — a model may raise anything for a bad input
            raise on_error(e) from None
        flops.fwd = _totals(fc)
        outs = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
        if outs:
            loss = sum(t.sum() for t in outs)
            try:
                torch.autograd.grad(loss, [x], retain_graph=True, allow_unused=True)
                after_in = _totals(fc)
                torch.autograd.grad(loss, [x, *trainable], allow_unused=True)
            except Exception as e:  # noqa: BLE001 — custom autograd functions may raise anything
                raise ModelError(f"model {name} cannot be analysed: its backward pass failed on the meta device "
                                 f"({_first_line(e)})") from None
            flops.bwd_in = _delta(after_in, flops.fwd)
            flops.bwd_all = _delta(_totals(fc), after_in)
    return out, flops


# ---- analysis ---------------------------------------------------------------------------------
@dataclass
class _Carry:
    """Parameters and FLOPs of a skipped node, handed to the first layer that reads it."""

    params: list[nn.Parameter] = field(default_factory=list)
    fwd: int = 0
    bwd_in: int = 0
    bwd_w: int = 0
    taken: bool = False


def analyze(module: nn.Module, input_shape: tuple[int, ...], *, name: str, source: str = "",
            num_classes: int | None = None, batch_check: bool = True) -> NetSpec:
    """Per-layer shapes, parameters and training FLOPs of ``module`` for one input of ``input_shape``."""
    if not isinstance(module, nn.Module):
        raise ModelError(f"model {name}: expected a torch.nn.Module, got {type(module).__name__}")
    if (not isinstance(input_shape, (tuple, list)) or not input_shape
            or any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in input_shape)):
        raise ModelError(f"model {name}: input shape must be positive integers such as (3, 224, 224), "
                         f"got {input_shape!r}")
    input_shape = tuple(input_shape)
    meta = _to_meta(module)
    modes = [(m, m.training) for m in meta.modules()]
    meta.train()
    try:
        float_params = [p for p in meta.parameters() if p.is_floating_point()]
        dtype = float_params[0].dtype if float_params else torch.float32
        x = torch.empty((BATCH, *input_shape), dtype=dtype, device="meta", requires_grad=True)
        trainable = list({id(p): p for p in meta.parameters() if p.requires_grad}.values())
        try:
            gm = fx.symbolic_trace(meta)
        except Exception as e:  # noqa: BLE001 — fx raises many types for untraceable code
            layers, out = _analyze_hooks(meta, x, trainable, name, input_shape, _first_line(e))
        else:
            layers, out = _analyze_graph(gm, x, trainable, name, input_shape)
    finally:
        for m, was_training in modes:
            m.training = was_training

    tensors = _tensors(out)
    if batch_check and (tensors[0].dim() == 0 or tensors[0].shape[0] != BATCH):
        raise ModelError(f"model {name}: its output has shape {tuple(tensors[0].shape)} for a batch of {BATCH} "
                         "inputs; layerplan needs the batch as the first dimension of the output")
    if num_classes is None and tensors[0].dim() == 2 and tensors[0].shape[0] == BATCH:
        num_classes = int(tensors[0].shape[1])
    if not layers:
        raise ModelError(f"model {name} has no layers (its forward computes nothing from its input)")
    by_dtype: dict = {}  # DDP broadcasts each dtype's buffers as one call, in the order they first appear
    for b in meta.buffers():
        by_dtype[b.dtype] = by_dtype.get(b.dtype, 0) + b.numel() * b.element_size()
    return NetSpec(name=name, input_shape=input_shape, dtype_bytes=torch.empty((), dtype=dtype).element_size(),
                   layers=tuple(layers), boundary=find_boundary(layers), num_classes=num_classes, source=source,
                   buffer_bytes=sum(by_dtype.values()), buffer_bytes_by_dtype=tuple(by_dtype.values()))


def _check_output(out: Any, name: str) -> None:
    if not _tensors(out):
        raise ModelError(f"model {name} returns {type(out).__name__}, not a tensor: layerplan analyses models whose "
                         "forward returns a tensor (or a tuple/dict of tensors)")


def _rejects(name: str, input_shape: tuple[int, ...]) -> Callable[[BaseException], ModelError]:
    def error(e: BaseException) -> ModelError:
        return ModelError(f"model {name} rejects input shape {input_shape}: {_first_line(e)}")

    return error


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _analyze_graph(gm: fx.GraphModule, x: torch.Tensor, trainable: list[nn.Parameter], name: str,
                   input_shape: tuple[int, ...]) -> tuple[list[LayerSpec], Any]:
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    required = [n for n in placeholders[1:] if not n.args]
    if not placeholders or required:
        raise ModelError(f"model {name}: forward takes {len(placeholders)} required inputs; layerplan analyses "
                         "models with one input tensor")
    compute = [n for n in nodes if n.op in ("call_module", "call_function", "call_method")]
    calls: dict[fx.Node, _Call] = {}
    stand_ins: dict[fx.Node, Callable[..., Any]] = {}  # no FLOPs to attribute: no wrapper, no clones
    for n in compute:
        if n.op == "call_module":
            mod = gm.get_submodule(str(n.target))
            if _has_stand_in(mod):
                stand_ins[n] = _stand_in(mod)
                continue
            fn: Any = mod
        elif n.op == "call_method":
            fn = _method_caller(str(n.target))
        else:
            fn = n.target
        calls[n] = _Call(fn)
    values: dict[fx.Node, Any] = {}

    class Runner(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            if n in stand_ins:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                out = stand_ins[n](*args, **kwargs)
            elif n in calls:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                out = calls[n](*_isolate(args), **_isolate(kwargs))
            else:
                return super().run_node(n)
            values[n] = out
            return out

    runner = Runner(gm)
    root = _Root(list(calls.values()), lambda inp: runner.run(inp))
    keys = {n: f"_Root.calls.{i}" for i, n in enumerate(calls)}
    out, flops = _measure(lambda: root(x.clone()), x, trainable, name, _rejects(name, input_shape))
    _check_output(out, name)

    trainable_ids = {id(p) for p in trainable}
    seen_params: set[int] = set()
    needs_grad: dict[fx.Node, bool] = {}  # does this node's output depend on a trainable parameter?
    layer_of: dict[fx.Node, str] = {}
    forwarded: dict[fx.Node, tuple[str, ...]] = {}
    carries: dict[fx.Node, list[_Carry]] = {}
    used: set[str] = set()
    module_calls: Counter[str] = Counter()
    layers: list[LayerSpec] = []

    def own_params(mod: nn.Module) -> list[nn.Parameter]:
        return [p for p in mod.parameters() if id(p) in trainable_ids]

    for n in nodes:
        inputs = n.all_input_nodes
        if n.op == "placeholder":
            needs_grad[n], forwarded[n] = False, ()
            continue
        if n.op == "output":
            continue
        if n.op == "get_attr":
            value = _fetch_attr(gm, str(n.target))
            params = [value] if isinstance(value, nn.Parameter) and id(value) in trainable_ids else []
            if isinstance(value, nn.Module):
                params = own_params(value)
            needs_grad[n], forwarded[n] = bool(params), ()
            carries[n] = [_Carry(params=params)] if params else []
            continue
        value = values[n]
        input_grad = any(needs_grad[i] for i in inputs if i.op != "get_attr")
        mod = gm.get_submodule(str(n.target)) if n.op == "call_module" else None
        direct = own_params(mod) if mod is not None else []
        detached = n.op in ("call_function", "call_method") and _function_name(n.target) == "detach"
        needs_grad[n] = not detached and (any(needs_grad[i] for i in inputs) or bool(direct))
        parents = _unique([p for i in inputs for p in ((layer_of[i],) if i in layer_of else forwarded.get(i, ()))])
        pending = [c for i in inputs if i not in layer_of for c in carries.get(i, []) if not c.taken]
        fwd, b_in, b_w = flops.split(keys[n]) if n in keys else (0, 0, 0)
        is_tensor = isinstance(value, torch.Tensor)
        if not is_tensor and not (_tensors(value) and (direct or fwd or b_in or b_w)):
            forwarded[n] = parents
            carries[n] = pending + [_Carry(params=direct, fwd=fwd, bwd_in=b_in if input_grad else 0, bwd_w=b_w)]
            continue
        params = list(direct)
        b_in = b_in if input_grad else 0
        for c in pending:
            c.taken = True
            params += c.params
            fwd, b_in, b_w = fwd + c.fwd, b_in + c.bwd_in, b_w + c.bwd_w
        params = list({id(p): p for p in params if id(p) not in seen_params}.values())
        seen_params.update(id(p) for p in params)
        if mod is not None:
            path = str(n.target)
            k = module_calls[path]
            module_calls[path] += 1
            layer_name = path if k == 0 else f"{path}_{k}"
            kind, op = _module_kind(mod), type(mod).__name__
        else:
            layer_name = n.name
            op = str(n.target) if n.op == "call_method" else _function_name(n.target)
            kind = _function_kind(op, _tensor_args(n, values))
        layer_name = _fresh(layer_name, n.name, used)
        used.add(layer_name)
        layer_of[n] = layer_name
        out_shape, out_bytes = _out_geometry(value)
        bwd_input = _per_sample(b_in)
        bwd_weight = _per_sample(b_w)
        layers.append(LayerSpec(
            name=layer_name, kind=kind, op=op, parents=parents, out_shape=out_shape,
            params=sum(p.numel() for p in params), param_bytes=_param_bytes(params), out_bytes=out_bytes,
            fwd_flops=_per_sample(fwd), bwd_flops=bwd_input + bwd_weight,
            bwd_input_flops=bwd_input, bwd_weight_flops=bwd_weight,
        ))
    return layers, out


def _tensor_args(n: fx.Node, values: dict[fx.Node, Any]) -> int:
    """How many of the node's arguments are tensors computed from the input, counting repeats."""
    count = 0

    def visit(a: Any) -> Any:
        nonlocal count
        if isinstance(a, fx.Node) and (a.op == "placeholder" or isinstance(values.get(a), torch.Tensor)):
            count += 1
        return a

    fx.node.map_aggregate((n.args, n.kwargs), visit)
    return count


def _fresh(preferred: str, fallback: str, used: set[str]) -> str:
    for candidate in (preferred, fallback):
        if candidate not in used:
            return candidate
    k = 1
    while f"{preferred}_{k}" in used:
        k += 1
    return f"{preferred}_{k}"


def _analyze_hooks(meta: nn.Module, x: torch.Tensor, trainable: list[nn.Parameter], name: str,
                   input_shape: tuple[int, ...], trace_error: str) -> tuple[list[LayerSpec], Any]:
    """Fallback for models torch.fx cannot trace: forward hooks on the leaf modules; the DAG is
    the chain of leaf calls in call order. FLOPs of a module called n times are split evenly over
    its calls; FLOPs and parameters of functional code in a non-leaf module's own forward go to the
    last leaf layer called inside it."""
    names = _tracker_names(meta)
    root_name = names[meta]
    modules = list(names)
    module_set = set(modules)
    leaves = [m for m in modules if next(m.children(), None) is None]
    calls: list[tuple[nn.Module, Any]] = []

    def isolate_hook(mod: nn.Module, args: Any) -> Any:
        return _isolate(args) if mod in module_set else None

    def record_hook(mod: nn.Module, args: Any, out: Any) -> None:
        calls.append((mod, out))

    def fresh_hook(mod: nn.Module, args: Any, out: Any) -> Any:
        return _fresh_outputs(out, args) if mod in module_set else None

    # Registered before FlopCounterMode's ModuleTracker, so they run before its hooks.
    handles = [torch.nn.modules.module.register_module_forward_pre_hook(isolate_hook),
               torch.nn.modules.module.register_module_forward_hook(fresh_hook)]
    handles += [m.register_forward_hook(record_hook) for m in leaves]

    def cannot(e: BaseException) -> ModelError:
        return ModelError(f"model {name} cannot be analysed: torch.fx cannot trace it ({trace_error}) and running it "
                          f"on the meta device with input shape {input_shape} failed ({_first_line(e)})")

    try:
        out, flops = _measure(lambda: meta(x), x, trainable, name, cannot)
    finally:
        for h in handles:
            h.remove()
    _check_output(out, name)
    if not calls:
        raise ModelError(f"model {name} has no layers: torch.fx cannot trace it ({trace_error}) and no leaf "
                         "module ran in its forward")

    def path(mod: nn.Module) -> str:
        full = names[mod]
        return full[len(root_name) + 1:] if full != root_name else type(mod).__name__.lower()

    n_calls = Counter(id(m) for m, _ in calls)
    trainable_ids = {id(p) for p in trainable}
    # FLOPs and parameters of each module's own code (not in a child) go to its last leaf call.
    extra: dict[int, list[Any]] = {}
    last_call_inside: dict[nn.Module, int] = {}
    for i, (mod, _) in enumerate(calls):
        for anc in modules:
            if names[mod] == names[anc] or names[mod].startswith(names[anc] + "."):
                last_call_inside[anc] = i
    for anc in modules:
        if anc in leaves or anc not in last_call_inside:
            continue
        own = flops.split(names[anc])
        for child in anc.children():
            c = flops.split(names[child])
            own = tuple(a - b for a, b in zip(own, c))
        direct = [p for p in anc.parameters(recurse=False) if id(p) in trainable_ids]
        slot = extra.setdefault(last_call_inside[anc], [0, 0, 0, []])
        for j in range(3):
            slot[j] += max(own[j], 0)
        slot[3] += direct

    seen_params: set[int] = set()
    k_of: Counter[int] = Counter()
    used: set[str] = set()
    layers: list[LayerSpec] = []
    any_params_before = False
    for i, (mod, value) in enumerate(calls):
        k = k_of[id(mod)]
        k_of[id(mod)] += 1
        share = n_calls[id(mod)]
        f, b_in, b_w = (v // share + (v % share if k == 0 else 0) for v in flops.split(names[mod]))
        params = [p for p in mod.parameters() if id(p) in trainable_ids]
        if i in extra:
            f, b_in, b_w = f + extra[i][0], b_in + extra[i][1], b_w + extra[i][2]
            params += extra[i][3]
        params = list({id(p): p for p in params if id(p) not in seen_params}.values())
        seen_params.update(id(p) for p in params)
        if not _tensors(value):
            continue
        base = path(mod) if k == 0 else f"{path(mod)}_{k}"
        layer_name = _fresh(base, base, used)
        used.add(layer_name)
        out_shape, out_bytes = _out_geometry(value)
        bwd_input = _per_sample(b_in) if any_params_before else 0
        bwd_weight = _per_sample(b_w)
        layers.append(LayerSpec(
            name=layer_name, kind=_module_kind(mod), op=type(mod).__name__,
            parents=(layers[-1].name,) if layers else (), out_shape=out_shape,
            params=sum(p.numel() for p in params), param_bytes=_param_bytes(params), out_bytes=out_bytes,
            fwd_flops=_per_sample(f), bwd_flops=bwd_input + bwd_weight,
            bwd_input_flops=bwd_input, bwd_weight_flops=bwd_weight,
        ))
        any_params_before = any_params_before or bool(params)
    return layers, out


__all__ = ["BATCH", "analyze"]
