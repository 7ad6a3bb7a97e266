"""Omnivore's hardware-efficiency model and its starting number of compute groups (§IV-B, app. D).

N conv machines form g groups of k = N/g. With t_fc the merged FC server's time per group batch
(FC forward + backward, plus moving the group's activations and gradients through its NIC) and
t_conv(k) a group's conv phase,

    HE(g) = max(t_fc, (t_conv(k) + t_fc) / g)        time per group batch in steady state
    t_conv(k) = max(T_cc / k, T_nc · k)               compute splits over k machines; the conv
                                                      model goes to (and gradients come from)
                                                      each of the k machines through one server NIC

The FC server saturates when t_conv(k) + t_fc < g · t_fc. Algorithm 1 starts from the smallest g
that saturates it. With pipelining (two batches in flight per group) the conv-bound time is
t_conv(k)/g. Here a group batch is k·B samples (B per machine, as everywhere in layerplan), so
T_cc/k is one machine's conv time at batch B.
"""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.strategies.base import bwd_s, fwd_s, param_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupTimes:
    """Omnivore §IV-B inputs for one (net, cluster, batch)."""

    conv_compute_s: float
    """One machine's conv forward + backward at B samples (T_cc/k)."""
    conv_model_s: float
    """T_nc: one copy of the conv model out and its gradient back over one NIC."""
    fc_compute_s_per_sample: float
    """FC forward + backward per sample on the FC server."""
    act_s_per_sample: float
    """Boundary activations in and their gradients out, per sample, over the FC server's NIC."""

    def t_fc(self, k: int, batch: int) -> float:
        return k * batch * (self.fc_compute_s_per_sample + self.act_s_per_sample)

    def t_conv(self, k: int) -> float:
        return max(self.conv_compute_s, self.conv_model_s * k)  # Omnivore app. D: max(T_cc/k, T_nc·k)


def group_times(net: NetSpec, cluster: ClusterSpec, batch: int) -> GroupTimes:
    bw = cluster.nic.payload_bytes_per_s
    t_cc = fwd_s(net, net.conv_layers, cluster, batch) + bwd_s(net, net.conv_layers, cluster, batch)
    t_fc = (fwd_s(net, net.fc_layers, cluster, batch) + bwd_s(net, net.fc_layers, cluster, batch)) / batch
    return GroupTimes(conv_compute_s=t_cc, conv_model_s=2 * param_bytes(net.conv_layers) / bw,
                      fc_compute_s_per_sample=t_fc, act_s_per_sample=2 * net.boundary_bytes / bw)


def he(times: GroupTimes, machines: int, groups: int, batch: int, pipelined: bool = False) -> float:
    """Omnivore HE(g): seconds per group batch in steady state."""
    k = machines // groups
    t_fc = times.t_fc(k, batch)
    conv = times.t_conv(k) / groups if pipelined else (times.t_conv(k) + t_fc) / groups
    return max(t_fc, conv)  # Omnivore §IV-B


def throughput(times: GroupTimes, machines: int, groups: int, batch: int, pipelined: bool = False) -> float:
    k = machines // groups
    return k * batch / he(times, machines, groups, batch, pipelined)


def saturating_groups(times: GroupTimes, machines: int, batch: int) -> int:
    """The smallest g (dividing N) that saturates the FC server: t_conv(k) + t_fc < g·t_fc;
    N (fully asynchronous) when none does (Algorithm 1's starting point)."""
    for g in divisors(machines):
        k = machines // g
        if times.t_conv(k) + times.t_fc(k, batch) < g * times.t_fc(k, batch):
            return g
    return machines


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
