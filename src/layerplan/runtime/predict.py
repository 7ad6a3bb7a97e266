"""The cost engine's prediction for a RunSpec, in the runtime's terms (role names, byte counting).

``predict_run(spec)`` is what ``layerplan train`` shows beside the measurement and what ``validate``
compares with it. It builds the strategy Config the run executes, the ClusterSpec the run stands for
(``local_cluster`` for ranks on this machine, the emulated cluster's own spec, or a calibrated file)
and calls ``strategies.predict``; role names are renamed to the runtime's (``conv`` → ``conv_worker``,
``fc`` → ``fc_worker`` for stanza and hybrid, ralp's ``ps`` → ``ps_worker``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from layerplan import hardware
from layerplan.errors import ConfigError

# Engine role → runtime role kind (runtime/layout.py), per strategy.
ROLE_NAMES: dict[str, dict[str, str]] = {
    "ps": {"worker": "worker", "server": "server"},
    "allreduce": {"worker": "worker"},
    "stanza": {"conv": "conv_worker", "fc": "fc_worker"},
    "ralp": {"worker": "worker", "ps": "ps_worker"},
    "hybrid": {"conv": "conv_worker", "fc": "fc_worker"},
}

LOOPBACK = hardware.LinkSpec(
    name="loopback", bandwidth_bytes_per_s=2.0e9, latency_s=40e-6, efficiency=1.0,
    note="ranks on one machine talking over lo (gloo TCP); `layerplan calibrate --on local` measures it")


def local_cluster(nodes: int, device: hardware.DeviceSpec | None = None, link: hardware.LinkSpec | None = None,
                  shared_cores: int | None = None) -> hardware.ClusterSpec:
    """Ranks as processes on this machine: one rank per 'node', all sharing this machine's cores
    (one torch thread each), talking over loopback."""
    return hardware.ClusterSpec(name="local", nodes=nodes, device=device or hardware.DEVICES["cpu-core"],
                                nic=link or LOOPBACK, shared_cores=shared_cores or os.cpu_count() or 1)


def strategy_config(spec, net) -> Any:
    """The engine's Config for what the run executes (the split resolved as the runtime resolves it)."""
    from layerplan import strategies
    from layerplan.runtime.model import split_layer

    c = spec.config
    s = strategies.get(spec.strategy)
    if spec.strategy == "ps":
        return s.Config(workers=c["workers"], servers=c["servers"])
    if spec.strategy == "allreduce":
        return s.Config(workers=c["workers"])
    if spec.strategy == "stanza":
        return s.Config(conv_workers=c["conv_workers"], fc_workers=c["fc_workers"])
    if spec.strategy == "ralp":
        return s.Config(workers=c["workers"], split=split_layer(spec, net), setting=c["ralp_setting"])
    if spec.strategy == "hybrid":
        return s.Config(conv_workers=c["conv_workers"], fc_workers=c["fc_workers"], replicate=tuple(c["replicate"]))
    raise ConfigError(f"no prediction for strategy {spec.strategy!r}")


def run_net(spec, net):
    """The NetSpec as the run holds it: its dtype, and for stanza and hybrid its split as the phase
    boundary."""
    from layerplan.runtime.model import split_layer

    dtype_bytes = 8 if spec.dtype == "float64" else 4
    net = net.with_dtype_bytes(dtype_bytes)
    if spec.strategy in ("stanza", "hybrid"):
        net = replace(net, boundary=split_layer(spec, net))
    return net


def predict_run(spec, cluster: hardware.ClusterSpec | None = None, net=None) -> dict[str, Any]:
    """Prediction.to_dict() for ``spec`` on ``cluster`` (default: ``local_cluster``), with runtime
    role names, plus ``strategy``, ``config``, ``global_batch`` and ``cluster``."""
    from layerplan import strategies
    from layerplan.runtime.layout import global_batch, world_size
    from layerplan.runtime.model import resolve

    if net is None:
        net, _ = resolve(spec)
    net = run_net(spec, net)
    world = world_size(spec)
    if cluster is None:
        cluster = local_cluster(world)
    elif cluster.nodes < world:
        cluster = replace(cluster, nodes=world)
    config = strategy_config(spec, net)
    pred = strategies.predict(net, cluster, spec.strategy, config, spec.batch_size).to_dict()
    names = ROLE_NAMES[spec.strategy]
    out = rename_roles(pred, names)
    out.update(strategy=spec.strategy, config=strategies.get(spec.strategy).config_to_dict(config),
               global_batch=global_batch(spec), cluster=cluster.to_dict())
    return out


def rename_roles(pred: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    def ren(d: dict) -> dict:
        return {names.get(k, k): v for k, v in d.items()}

    out = dict(pred)
    out["groups"] = ren(pred["groups"])
    out["breakdown"] = ren(pred["breakdown"])
    for k in ("memory_bytes_per_role", "memory_per_role"):
        if k in pred:
            out[k] = ren(pred[k])
    b = dict(pred["bytes_per_step"])
    for k in ("per_role", "wire_per_role", "wire_per_role_all_nodes", "wire_received_per_role"):
        if k in b:
            b[k] = ren(b[k])
    out["bytes_per_step"] = b
    return out
