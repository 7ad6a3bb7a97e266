"""The module a run trains and where it is cut: the same on every rank and in the reference."""

from __future__ import annotations

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
    """The layer Stanza, RALP or Omnivore's groups cut after: the configured split, else the phase
    boundary (stanza, groups) / the RALP profile's split. ConfigError when the net has no FC phase
    or the layer is not a single cut."""
    if spec.strategy not in ("stanza", "ralp", "groups"):
        raise ConfigError(f"{spec.strategy} does not split the network")
    if net.boundary is None:
        raise ConfigError(f"{spec.strategy} needs an FC phase: {net.name} has no conv/FC boundary "
                          "(no fully connected layers after its convolutions)")
    layer = spec.config.get("split")
    if layer is None:
        if spec.strategy in ("stanza", "groups"):
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
    if spec.strategy == "ps":
        ps_shards(net.total_params, spec.config["servers"])
    if spec.data.startswith("imagefolder:"):
        from pathlib import Path

        path = spec.data.split(":", 1)[1]
        if not Path(path).is_dir():
            raise ConfigError(f"imagefolder: {path!r} is not a directory")
