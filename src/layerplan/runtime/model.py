"""The module a run trains and where it is cut: the same on every rank and in the reference."""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.errors import ConfigError, ModelError, SpecError


def resolve(spec):
    """(NetSpec, factory) for the spec's MODEL; ModelError when it cannot be trained (a saved
    NetSpec JSON has no code to run)."""
    from layerplan.netspec.load import resolve_model

    net, factory = resolve_model(spec.model, input_size=spec.input_size, num_classes=spec.num_classes)
    if factory is None:
        raise ModelError(f"{spec.model!r} is a NetSpec without code: training needs a zoo name, file.py:factory "
                         "or package.module:factory")
    return net, factory


def build(spec, net=None, factory=None):
    """(NetSpec, module): the module initialised from ``spec.seed`` — identical on every rank and in the
    single-process reference; dropout disabled when ``spec.deterministic``."""
    import torch

    from layerplan.runtime.split import disable_dropout

    if net is None or factory is None:
        net, factory = resolve(spec)
    torch.manual_seed(spec.seed)
    module = factory().to(getattr(torch, spec.dtype))
    if spec.deterministic:
        disable_dropout(module)
    module.train()
    return net, module


def torch_dtype(spec):
    import torch

    return getattr(torch, spec.dtype)


def num_classes(net, spec) -> int:
    if spec.num_classes is not None:
        return spec.num_classes
    if net.num_classes is not None:
        return net.num_classes
    shape = net.layers[-1].out_shape
    if len(shape) != 1:
        raise ModelError(f"{net.name}: cannot tell the number of classes from the output shape {shape}; "
                         "pass --num-classes")
    return shape[0]


def split_layer(spec, net) -> str:
    """The layer Stanza, hybrid, RALP or Omnivore's groups cut after: the configured split, else the
    phase boundary (stanza, hybrid, groups) / the RALP profile's split. ConfigError when the net has
    no FC phase or the layer is not a single cut."""
    if spec.strategy not in ("stanza", "ralp", "hybrid", "groups"):
        raise ConfigError(f"{spec.strategy} does not split the network")
    if net.boundary is None:
        raise ConfigError(f"{spec.strategy} needs an FC phase: {net.name} has no conv/FC boundary "
                          "(no fully connected layers after its convolutions)")
    layer = spec.config.get("split")
    if layer is None:
        if spec.strategy in ("stanza", "hybrid", "groups"):
            layer = net.boundary
        else:
            from layerplan.plan import ralp

            prof = ralp.profile(net, batch=spec.batch_size)
            layer = prof.split_after
            if layer is None:
                raise ConfigError(f"ralp needs an FC tail: {net.name} has no split point ({prof.reason})")
    try:
        i = net.index(layer)
    except SpecError:
        raise ConfigError(f"{spec.strategy}: split layer {layer!r} is not a layer of {net.name}") from None
    if i == len(net.layers) - 1:
        raise ConfigError(f"{spec.strategy}: split layer {layer!r} is the last layer of {net.name} (nothing left "
                          "for the FC side)")
    if not any(x.params for x in net.tail(layer)):
        raise ConfigError(f"{spec.strategy}: nothing with parameters follows {layer!r}; split before the FC layers")
    if not net.cut_is_single(i):
        raise ConfigError(f"{spec.strategy}: the cut after {layer!r} is not single (other values cross it); "
                          f"pick a layer such as the phase boundary {net.boundary!r}")
    return layer


def check(spec, net) -> None:
    """Everything about spec × net that can be checked before processes start."""
    from layerplan.runtime.layout import ps_shards

    if spec.strategy in ("stanza", "ralp", "groups"):
        split_layer(spec, net)
    if spec.strategy == "hybrid":
        hybrid_phase(spec, net)
    if spec.strategy == "ps":
        ps_shards(net.total_params, spec.config["servers"])
    if spec.data.startswith("imagefolder:"):
        from pathlib import Path

        path = spec.data.split(":", 1)[1]
        if not Path(path).is_dir():
            raise ConfigError(f"imagefolder: {path!r} is not a directory")


# Layers a partitioned fc layer may be followed by in its block: they act on each output feature
# alone, so they run on a feature slice as on the whole (LayerSpec.op as netspec.analyze names it).
ELEMENTWISE_OPS = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh", "Hardtanh",
    "Hardswish", "Hardsigmoid", "Softplus", "Softsign", "Tanhshrink", "LogSigmoid", "Identity", "Dropout",
    "AlphaDropout", "relu", "relu_", "sigmoid", "tanh", "gelu", "silu", "dropout"})


@dataclass(frozen=True, kw_only=True, slots=True)
class HybridBlock:
    """One fc layer of the FC phase and the layers that follow it up to the next fc layer."""

    fc: str
    """The fc layer's name."""
    layers: tuple[str, ...]
    """The fc layer, then the layers that follow it (element-wise when partitioned)."""
    partitioned: bool
    """True: split by output features over the FC machines; False: replicated on each (or n_f = 1)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HybridPhase:
    """How a hybrid run cuts the network (strategies/hybrid.py's fc blocks, as the runtime runs them)."""

    conv_end: str
    """The last layer the CONV workers run: the layer before the first fc layer after the split
    (weightless layers between the split and that fc layer, e.g. a dropout, are per-sample and run
    data-parallel with the conv phase)."""
    blocks: tuple[HybridBlock, ...]


def hybrid_phase(spec, net) -> HybridPhase:
    """The FC phase of a hybrid run; ConfigError (one line) for a net or config it cannot run: no FC
    phase, an unknown ``replicate`` name, an FC phase that is not a chain, a partitioned fc layer that
    is not an nn.Linear or is followed by a layer that is not element-wise."""
    split = split_layer(spec, net)
    tail = net.tail(split)
    fcs = [layer for layer in tail if layer.kind == "fc"]
    if not fcs:
        raise ConfigError(f"hybrid needs fc layers after the split: {net.name} has none after {split!r}")
    replicate = list(spec.config.get("replicate") or [])
    names = [f.name for f in fcs]
    unknown = [r for r in replicate if r not in names]
    if unknown:
        raise ConfigError(f"hybrid: replicate names {', '.join(map(repr, unknown))}, not an fc layer of the FC "
                          f"phase of {net.name} (its fc layers: {', '.join(names)})")
    n_f = spec.config["fc_workers"]
    first = net.index(fcs[0].name)
    for layer in net.layers[net.index(split) + 1:first]:
        if layer.params:
            raise ConfigError(f"hybrid: {layer.name!r} ({layer.op}) has parameters but comes before the first fc "
                              f"layer {fcs[0].name!r} of the FC phase; split after it instead")
    blocks = []
    for k, fc in enumerate(fcs):
        i = net.index(fc.name)
        if not net.cut_is_single(i - 1):
            raise ConfigError(f"hybrid: the FC phase of {net.name} is not a chain (other values cross into "
                              f"{fc.name!r}); it needs each fc layer to read only the layer before it")
        stop = net.index(fcs[k + 1].name) if k + 1 < len(fcs) else len(net.layers)
        layers = net.layers[i:stop]
        partitioned = n_f > 1 and fc.name not in replicate
        if partitioned:
            if fc.op != "Linear":
                raise ConfigError(f"hybrid: {fc.name!r} is a {fc.op}, not an nn.Linear: only Linear layers can be "
                                  f"partitioned by output features; add it to replicate")
            for layer in layers[1:]:
                if layer.op not in ELEMENTWISE_OPS:
                    raise ConfigError(f"hybrid: {layer.name!r} ({layer.op}) after {fc.name!r} is not element-wise, "
                                      f"so {fc.name!r} cannot be partitioned by output features; add it to replicate")
            features = fc.out_shape[-1] if fc.out_shape else 0
            if features < n_f:
                raise ConfigError(f"hybrid: {fc.name!r} has {features} output features, fewer than the {n_f} FC "
                                  f"machines it would be partitioned over; add it to replicate")
        blocks.append(HybridBlock(fc=fc.name, layers=tuple(x.name for x in layers), partitioned=partitioned))
    return HybridPhase(conv_end=net.layers[first - 1].name, blocks=tuple(blocks))
