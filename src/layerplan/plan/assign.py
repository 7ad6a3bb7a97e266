"""Stanza's node assignment (Stanza §4.2.1 eq.2–5): choose n_c CONV and n_f FC workers with
n_c + n_f = N to maximise throughput, exhaustively. The closed form ranks all N−1 splits in
microseconds; the planner then runs the best few through the cost engine. A split whose CONV or
FC workers need more memory than a device has is left out (an FC worker keeps the activations of
⌈n_c/n_f⌉ CONV workers' batches)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerplan.cost.collectives import recursive_doubling_rounds
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.strategies.base import bwd_s, fwd_s, param_bytes
from layerplan.strategies.stanza import Stanza, StanzaConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class Assignment:
    config: StanzaConfig
    step_time_s: float
    """Stanza eq.3."""
    throughput_samples_per_s: float
    """Stanza eq.4."""


def stanza_step_s(net: NetSpec, cluster: ClusterSpec, n_c: int, n_f: int, batch: int) -> float:
    """Stanza eq.3: t_s = T_c + (n_c/n_f)·T_f + 2·n_c·A·K/(n_f·B) + P_c·R(n_c)/B.

    With n_f > 1 the FC workers also all-reduce the FC gradients, "overlapped with the CONV
    all-reduce" (Stanza §4): the last term becomes max(P_c·R(n_c), P_f·R(n_f))/B. For n_f = 1 this
    is eq.3 exactly; without it eq.3 would favour many FC workers for FC-heavy nets, whose FC
    all-reduce then dominates the step."""
    t_c = fwd_s(net, net.conv_layers, cluster, batch) + bwd_s(net, net.conv_layers, cluster, batch)
    t_f = fwd_s(net, net.fc_layers, cluster, batch) + bwd_s(net, net.fc_layers, cluster, batch)
    bw = cluster.nic.payload_bytes_per_s
    a_k = net.boundary_bytes * batch
    p_c, p_f = param_bytes(net.conv_layers), param_bytes(net.fc_layers)
    t_cs = t_c + math.ceil(n_c / n_f) * t_f  # Stanza eq.2
    allreduce = max(p_c * recursive_doubling_rounds(n_c), p_f * recursive_doubling_rounds(n_f) if n_f > 1 else 0.0)
    return t_cs + 2 * math.ceil(n_c / n_f) * a_k / bw + allreduce / bw  # Stanza eq.3


def stanza_assignment(net: NetSpec, cluster: ClusterSpec, batch: int, *,
                      skipped: dict[int, str] | None = None) -> list[Assignment]:
    """All (n_c, n_f) with n_c + n_f = N, n_c ≥ n_f ≥ 1 that fit in the devices' memory, best first
    (Stanza eq.5). ``skipped``, when given, receives n_f → why for the splits left out."""
    out = []
    stanza = Stanza()
    for n_f in range(1, cluster.nodes // 2 + 1):
        n_c = cluster.nodes - n_f
        config = StanzaConfig(conv_workers=n_c, fc_workers=n_f)
        why = stanza.memory_problem(cluster, stanza.memory(net, cluster, config, batch))
        if why:
            if skipped is not None:
                skipped[n_f] = why
            continue
        t = stanza_step_s(net, cluster, n_c, n_f, batch)
        out.append(Assignment(config=config, step_time_s=t, throughput_samples_per_s=n_c * batch / t))  # Stanza eq.4
    out.sort(key=lambda a: -a.throughput_samples_per_s)
    return out


def best_stanza(net: NetSpec, cluster: ClusterSpec, batch: int, finalists: int = 3) -> StanzaConfig:
    """Eq.5's best few by the closed form, confirmed by the cost engine. Raises ConfigError when no
    split fits in memory."""
    from layerplan import strategies

    skipped: dict[int, str] = {}
    top = [a.config for a in stanza_assignment(net, cluster, batch, skipped=skipped)[:finalists]]
    if not top:
        if not skipped:
            raise ConfigError(f"stanza needs at least 2 nodes, the cluster has {cluster.nodes}")
        n_f = max(skipped)  # the most FC workers: the smallest FC batch
        raise ConfigError(f"{skipped[n_f]}; no split of {cluster.nodes} nodes into CONV and FC workers fits")
    return max(top, key=lambda c: strategies.predict(net, cluster, "stanza", c, batch).throughput_samples_per_s)
