"""Cut an ``nn.Module`` into a head and a tail at one layer, with torch.fx.

Stanza and RALP run the head (up to the phase boundary, or RALP's split) on the workers and the
tail where the FC parameters live. The cut must be *single*: the split layer's output is the only
value that crosses it, so the tail is a function of that one tensor and ``tail(head(x)) ==
module(x)`` exactly (the same ops in the same order).

Layer names follow ``netspec.analyze``: a ``call_module`` node is named by its module path
(``node.target``, e.g. ``features.0``); ``call_function``/``call_method`` nodes by the fx node name
(``flatten``, ``add_3``). When one module object is called several times (ResNet's shared ReLU),
its first call carries the module path and later calls are named ``<path>_1``, ``<path>_2`` ...;
the fx node name is accepted too.

The head and the tail are ``GraphModule``s whose submodules are the original module's own
submodule objects: their parameters are the *same* tensors as the original's, under the same
names (``features.0.weight``), so a single-process reference and a split run start from identical
weights and can be compared name by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Split:
    """A module cut in two at ``layer``."""

    head: object
    """``torch.fx.GraphModule``: the network input(s) → the split layer's output."""
    tail: object
    """``torch.fx.GraphModule``: the split layer's output (one tensor) → the network output."""
    layer: str
    """The layer name the cut is after."""


def layer_names(graph) -> dict[str, object]:
    """Layer name → fx node for every computing node of ``graph`` (see the module docstring)."""
    names: dict[str, object] = {}
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        if node.op == "call_module":
            base = str(node.target)
            k = calls.get(base, 0)
            calls[base] = k + 1
            name = base if k == 0 else f"{base}_{k}"
        else:
            name = node.name
        names.setdefault(name, node)
    return names


def find_node(graph, layer: str):
    """The fx node of ``layer`` (layer name first, then the raw fx node name)."""
    names = layer_names(graph)
    if layer in names:
        return names[layer]
    for node in graph.nodes:
        if node.name == layer and node.op not in ("placeholder", "output", "get_attr"):
            return node
    known = ", ".join(list(names)[:12])
    raise ConfigError(f"split layer {layer!r} is not a layer of this network (layers: {known}, ...)")


def split_module(module, layer: str) -> Split:
    """Cut ``module`` after ``layer`` into head and tail GraphModules (ConfigError if the cut is not
    single: another head value, or the network input, is read after the split)."""
    import torch.fx as fx

    try:
        gm = fx.symbolic_trace(module)
    except Exception as e:  # noqa: BLE001 — fx raises many types for untraceable code
        raise ConfigError(f"cannot trace {type(module).__name__} with torch.fx ({type(e).__name__}: {e}); "
                          "layer separation needs a traceable forward") from None
    graph = gm.graph
    cut = find_node(graph, layer)
    nodes = list(graph.nodes)
    pos = nodes.index(cut)
    head_nodes, tail_nodes = nodes[: pos + 1], nodes[pos + 1 :]
    head_set = set(head_nodes)
    output = next(n for n in tail_nodes if n.op == "output") if any(n.op == "output" for n in tail_nodes) else None
    if output is None or not any(n.op.startswith("call_") for n in tail_nodes):
        raise ConfigError(f"split layer {layer!r} is the network's last layer: the tail would be empty")
    crossing = set()
    for n in tail_nodes:
        for inp in n.all_input_nodes:
            if inp in head_set and inp is not cut and inp.op != "get_attr":
                crossing.add(inp.name)
    if crossing:
        raise ConfigError(f"split after {layer!r} is not a single cut: {', '.join(sorted(crossing))} also cross it "
                          "(pick a layer whose output is the only value the rest of the network reads)")

    head_graph = fx.Graph()
    env: dict = {}
    for n in head_nodes:
        env[n] = head_graph.node_copy(n, lambda x: env[x])
    head_graph.output(env[cut])

    tail_graph = fx.Graph()
    tenv: dict = {cut: tail_graph.placeholder("x")}
    for n in tail_nodes:
        for inp in n.all_input_nodes:
            if inp not in tenv and inp.op == "get_attr":  # parameters/constants read by the tail
                tenv[inp] = tail_graph.node_copy(inp, lambda x: tenv[x])
        tenv[n] = tail_graph.node_copy(n, lambda x: tenv[x])

    head = fx.GraphModule(gm, head_graph, class_name=f"{type(module).__name__}Head")
    tail = fx.GraphModule(gm, tail_graph, class_name=f"{type(module).__name__}Tail")
    for part in (head, tail):
        part.graph.eliminate_dead_code()
        part.recompile()
        part.delete_all_unused_submodules()
    return Split(head=head, tail=tail, layer=layer)


def split_chain(module, cuts) -> list:
    """Cut ``module`` after each layer of ``cuts`` (in network order): ``len(cuts) + 1`` GraphModules
    whose composition is ``module`` (hybrid: the CONV workers' part, then one piece per fc block).
    Every cut must be single (ConfigError otherwise, as ``split_module``); parameters are shared with
    ``module`` under their original names."""
    pieces = []
    rest = module
    for layer in cuts:
        s = split_module(rest, layer)
        pieces.append(s.head)
        rest = s.tail
    pieces.append(rest)
    return pieces


def disable_dropout(module) -> int:
    """Set p = 0 on every dropout module (RunSpec.deterministic): dropout draws from each rank's RNG,
    so a distributed run can only equal the single-process reference without it. Returns how many."""
    import torch.nn as nn

    n = 0
    for m in module.modules():
        if isinstance(m, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                          nn.FeatureAlphaDropout)):
            m.p = 0.0
            n += 1
    return n
