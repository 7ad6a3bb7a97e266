"""The cost engine's prediction for a RunSpec, in the runtime's terms (role names, byte counting).

``predict_run(spec)`` is what ``layerplan train`` shows beside the measurement and what ``validate``
compares with it. It builds the strategy Config the run executes, the ClusterSpec the run stands for
(``local_cluster`` for ranks on this machine, the emulated cluster's own spec, or a calibrated file)
and calls ``strategies.predict``; role names are renamed to the runtime's (``conv`` → ``conv_worker``,
``fc`` → ``fc_worker`` for stanza and hybrid, ralp's ``ps`` → ``ps_worker``; groups: the engine's
``group0`` … ``group{g−1}`` → ``conv_machine`` (per-node quantities averaged over the groups, node
counts summed), ``fc`` → ``fc_server``, ``conv_model`` → ``conv_model_server``).
"""

from __future__ import annotations

import os
import statistics
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
    "groups": {"group": "conv_machine", "fc": "fc_server", "conv_model": "conv_model_server"},
}

LOOPBACK = hardware.LinkSpec(
    name="loopback", bandwidth_bytes_per_s=2.0e9, latency_s=40e-6, efficiency=1.0,
    note="ranks on one machine talking over lo (gloo TCP); `layerplan calibrate --on local` measures it")


def local_cluster(nodes: int, device: hardware.DeviceSpec | None = None, link: hardware.LinkSpec | None = None,
                  shared_cores: int | None = None) -> hardware.ClusterSpec:
    """Ranks as processes on this machine: one rank per 'node', all sharing this machine's cores
    (one torch thread each, the presets' capacities: ``hardware.shared_cores_preset``), talking over
    loopback."""
    return hardware.ClusterSpec(name="local", nodes=nodes, device=device or hardware.local_device(),
                                nic=link or LOOPBACK, **hardware.shared_cores_preset(shared_cores or os.cpu_count() or 1))


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
        from layerplan.strategies.stanza import StanzaRunConfig

        return StanzaRunConfig(conv_workers=c["conv_workers"], fc_workers=c["fc_workers"],  # gloo's ring
                               **({} if c.get("overlap", True) else {"bucket_bytes": 0}))
    if spec.strategy == "ralp":
        return s.Config(workers=c["workers"], split=split_layer(spec, net), setting=c["ralp_setting"])
    if spec.strategy == "hybrid":
        return s.Config(conv_workers=c["conv_workers"], fc_workers=c["fc_workers"], replicate=tuple(c["replicate"]))
    if spec.strategy == "groups":  # the runtime runs merged FC (Omnivore §V-A), not pipelined
        return s.Config(machines=c["machines"], groups=c["groups"], merged_fc=True, pipelined=c["pipelined"])
    raise ConfigError(f"no prediction for strategy {spec.strategy!r}")


def run_net(spec, net):
    """The NetSpec as the run holds it: its dtype, and for stanza and hybrid its split as the phase
    boundary."""
    from layerplan.runtime.model import split_layer

    dtype_bytes = 8 if spec.dtype == "float64" else 4
    net = net.with_dtype_bytes(dtype_bytes)
    if spec.strategy in ("stanza", "hybrid", "groups"):
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
    if spec.strategy == "groups":
        pred = merge_groups(pred)
    out = rename_roles(pred, names)
    out.update(strategy=spec.strategy, config=strategies.get(spec.strategy).config_to_dict(config),
               global_batch=global_batch(spec), cluster=cluster.to_dict())
    return out


def merge_groups(pred: dict[str, Any]) -> dict[str, Any]:
    """The engine's per-group roles ``group0`` … as one role ``group`` (the runtime's conv machines are
    one kind): per-node values averaged over the groups (they are symmetric), node counts summed."""
    import statistics

    def is_group(k: str) -> bool:
        return k.startswith("group") and k[5:].isdigit()

    def merge(d: dict, how: str = "mean") -> dict:
        keys = [k for k in d if is_group(k)]
        if not keys:
            return d
        out = {k: v for k, v in d.items() if not is_group(k)}
        vals = [d[k] for k in keys]
        if how == "sum":
            out["group"] = sum(vals)
        elif all(isinstance(v, dict) for v in vals):
            out["group"] = {f: statistics.fmean(v[f] for v in vals) if all(isinstance(v.get(f), (int, float))
                                                                          and not isinstance(v.get(f), bool) for v in vals)
                            else vals[0][f] for f in vals[0]}
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out["group"] = statistics.fmean(vals)
        else:
            out["group"] = vals[0]
        return out

    out = dict(pred)
    out["groups"] = merge(pred["groups"], "sum")
    out["breakdown"] = merge(pred["breakdown"])
    for k in ("memory_bytes_per_role", "memory_per_role"):
        if isinstance(pred.get(k), dict):
            out[k] = merge(pred[k])
    b = dict(pred["bytes_per_step"])
    for k in ("per_role", "wire_per_role", "wire_per_role_all_nodes", "wire_received_per_role"):
        if k in b:
            b[k] = merge(b[k], "sum" if k == "wire_per_role_all_nodes" else "mean")
    out["bytes_per_step"] = b
    if isinstance(pred.get("bottleneck"), str) and is_group(pred["bottleneck"]):
        out["bottleneck"] = "group"
    return out


def rename_roles(pred: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    def ren(d: dict) -> dict:
        return {names.get(k, k): v for k, v in d.items()}

    out = dict(pred)
    out["groups"] = ren(pred["groups"])
    out["breakdown"] = ren(pred["breakdown"])
    if "timeline" in pred:
        out["timeline"] = [{**e, "group": names.get(e["group"], e["group"])} for e in pred["timeline"]]
    for k in ("memory_bytes_per_role", "memory_per_role"):
        if k in pred:
            out[k] = ren(pred[k])
    b = dict(pred["bytes_per_step"])
    for k in ("per_role", "wire_per_role", "wire_per_role_all_nodes", "wire_received_per_role"):
        if k in b:
            b[k] = ren(b[k])
    out["bytes_per_step"] = b
    return out


def timeline_marks(pred: dict[str, Any], marks: dict[str, Any]) -> dict[str, dict[str, float]]:
    """When the predicted step reaches each of a run's marks (``metrics.Meter.mark``; ``marks``:
    {role: {mark: ...}}, a Measurement's ``breakdown`` will do): the end of the schedule's task of
    that name on the role's row of ``pred``'s timeline, for the marks the timeline has (a task
    simulated per group of nodes, ``fwd_bwd@worker0``, counts as ``fwd_bwd``). Where it ends
    several times on the row: for a role of several nodes (``pred["groups"]``) the mean of those
    ends, as a run's mark is the mean over the role's ranks (``metrics.summarize``) — RALP's
    workers, served in turn, end their head backward one after another (alexnet_cifar, 4 workers:
    the last at 1.13x their mean); for a role of one node the last (RALP's PS worker marks the
    tail's pass after serving each worker: the last mark stands). A timeline of several
    iterations (``it0/…``, ``it1/…``: engine.iteration_name) is read in its last, from that
    iteration's start as a run times it (``_opening_s``)."""
    timeline = list(pred.get("timeline", ()))
    rounds = {_iteration(e["name"])[0] for e in timeline}
    last = max(rounds, default=-1)
    tasks = [e for e in timeline if _iteration(e["name"])[0] == last]
    origin = _opening_s(tasks) if last >= 0 else 0.0
    out: dict[str, dict[str, float]] = {}
    for role, names in marks.items():
        ends: dict[str, list[float]] = {}
        for e in tasks:
            name = _iteration(e["name"])[1].partition("@")[0]
            if e["group"] == role and name in names:
                ends.setdefault(name, []).append(e["end_s"] - origin)
        several = (pred.get("groups") or {}).get(role, 1) > 1
        if ends:
            out[role] = {n: statistics.fmean(ends[n]) if several else max(ends[n]) for n in names if n in ends}
    return out


def _opening_s(tasks: list[dict[str, Any]]) -> float:
    """When the iteration of ``tasks`` starts, as a run times its steps' start: the mean over the
    nodes of the role that opens it (the role of its first task) of when each starts (a task
    simulated per group of nodes, ``head_fwd@worker1``, names its node after the ``@``). The
    schedule staggers the workers' starts where their pulls leave the server one after another
    (``LinkSpec.stagger_shares``), and a run's step starts at its ranks' mean start
    (``metrics._step_starts``): from the first worker's start, RALP's head forward read 0.36-0.87x
    the predicted time at 4 workers and 100 Mbit/s."""
    if not tasks:
        return 0.0
    role = min(tasks, key=lambda e: e["start_s"])["group"]
    firsts: dict[str, float] = {}
    for e in tasks:
        if e["group"] == role:
            node = _iteration(e["name"])[1].partition("@")[2]
            firsts[node] = min(firsts.get(node, e["start_s"]), e["start_s"])
    return statistics.fmean(firsts.values())


def _iteration(name: str) -> tuple[int, str]:
    """(iteration, task) of a timeline entry's name: ``it2/push`` → (2, "push"); a name of a
    one-iteration timeline → (−1, name)."""
    head, sep, rest = name.partition("/")
    if sep and head.startswith("it") and head[2:].isdigit():
        return int(head[2:]), rest
    return -1, name
