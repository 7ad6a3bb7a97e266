"""The single-process reference a distributed run must equal: torch.optim.SGD (``optim.sgd``) on each
step's global batch, built from the same data shards (``Sharder``) and the same initial weights.

``chunked=True`` (default) evaluates the global-batch loss the way the strategy does — the model
per data worker's K samples (ps, allreduce), the head per CONV worker and the tail per FC
worker's block (stanza), the CONV workers' part per CONV worker and the FC phase over the whole
global batch (hybrid), the head and the tail per worker (ralp), the head per conv machine and the
tail over the whole global batch (groups with g = 1: one group, the merged FC server) — and sums
the cross-entropy over
the global batch divided by its size. For a network without batch-dependent layers this is the
same function as one forward over the concatenated batch (``chunked=False``); with BatchNorm it
reproduces the per-worker batch statistics that every data-parallel run without SyncBatchNorm
has, so the comparison stays exact.

Dropout draws from each rank's RNG, so exact comparisons need ``RunSpec.deterministic`` (p = 0).

Omnivore's groups have a single-process reference only with g = 1 (synchronous SGD, Omnivore
§IV-A); with g > 1 the update order depends on timing, so there is none (ConfigError).
"""

from __future__ import annotations


def reference_run(spec, *, chunked: bool = True, net=None, factory=None) -> dict:
    """{"params": {name: tensor}, "loss": [per step]} after ``spec.steps`` steps from step 0."""
    import torch
    import torch.nn.functional as F

    from layerplan.runtime import model
    from layerplan.runtime.data import Sharder, make_source
    from layerplan.errors import ConfigError
    from layerplan.runtime.layout import data_workers, layout
    from layerplan.runtime.optim import sgd

    if spec.strategy == "groups" and spec.config["groups"] != 1:
        raise ConfigError(f"groups: {spec.config['groups']} asynchronous groups have no single-process reference "
                          "(the update order depends on timing); only g = 1 equals synchronous SGD")
    net, module = model.build(spec, net, factory)
    n = data_workers(spec)
    k = spec.batch_size
    g = n * k
    sharder = Sharder(make_source(spec.data, net.input_shape, model.num_classes(net, spec), spec.seed), n, k, spec.seed,
                      dtype=model.torch_dtype(spec))
    opt = sgd(module.parameters(), lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    split = None
    groups: list[list[int]] = [[w] for w in range(n)]
    if spec.strategy in ("stanza", "ralp", "hybrid", "groups") and chunked:
        from layerplan.runtime.split import split_module

        if spec.strategy == "hybrid":
            split = split_module(module, model.hybrid_phase(spec, net).conv_end)
            groups = [list(range(n))]
        else:
            split = split_module(module, model.split_layer(spec, net))
        if spec.strategy == "stanza":
            roles = layout(spec)
            groups = [[roles[c].data_index for c in r.peers] for r in roles.values() if r.kind == "fc_worker"]
        elif spec.strategy == "groups":
            groups = [list(range(n))]
    losses = []
    for s in range(spec.steps):
        opt.zero_grad(set_to_none=True)
        if not chunked:
            x, y = sharder.global_batch(s)
            loss = F.cross_entropy(module(x), y)
        else:
            batches = [sharder.batch(s, w) for w in range(n)]
            loss = 0.0
            if split is None:
                for x, y in batches:
                    loss = loss + F.cross_entropy(module(x), y, reduction="sum") / g
            else:
                hs = [split.head(x) for x, _ in batches]
                for grp in groups:
                    out = split.tail(torch.cat([hs[w] for w in grp]))
                    y = torch.cat([batches[w][1] for w in grp])
                    loss = loss + F.cross_entropy(out, y, reduction="sum") / g
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return {"params": {k: v.detach().clone() for k, v in module.named_parameters()}, "loss": losses}


def load_params(params_out) -> dict:
    """Merge the ``params-rank{r}.pt`` files of a run (``RunSpec.params_out``); on names held by several
    ranks the lowest rank wins. Slices ``"<name>[lo:hi]"`` (rows lo..hi−1 along dim 0, a hybrid
    partitioned layer's part on one FC machine) are concatenated into ``<name>``; they must cover it
    without gaps."""
    from pathlib import Path

    import torch

    files = sorted(Path(params_out).glob("params-rank*.pt"), key=lambda p: int(p.stem.split("rank")[1]))
    out: dict = {}
    for f in files:
        for k, v in torch.load(f, map_location="cpu").items():
            out.setdefault(k, v)
    return merge_slices(out)


def merge_slices(params: dict) -> dict:
    """``{"w[0:3]": a, "w[3:5]": b, ...}`` → ``{"w": cat([a, b]), ...}`` (other names unchanged)."""
    import re

    import torch

    pattern = re.compile(r"^(.*)\[(\d+):(\d+)\]$")
    out: dict = {}
    parts: dict[str, list] = {}
    for k, v in params.items():
        m = pattern.match(k)
        if m:
            parts.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(3)), v))
        else:
            out[k] = v
    for name, ps in parts.items():
        ps.sort(key=lambda p: p[0])
        end = 0
        for lo, hi, v in ps:
            if lo != end or v.shape[0] != hi - lo:
                raise ValueError(f"slices of {name!r} do not tile it: {[(lo, hi) for lo, hi, _ in ps]}")
            end = hi
        out[name] = torch.cat([v for _, _, v in ps])
    return out
