"""`ps`: data parallelism through n_s sharded parameter servers, BSP (Stanza §7.1, Yan §4.2).

Each step every worker computes the gradient of its batch, pushes the slice of it that each
server owns (P/n_s bytes to each of the n_s servers), each server sums n_w slices and updates its
shard, and every worker pulls the updated shards back. Servers are separate nodes. Under the
paper's assumptions this is Stanza eq.6: t_ps = 2·n_w·P/(n_s·B) + T_ps.
"""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.cost import compute
from layerplan.cost.compute import MemoryUse
from layerplan.cost.engine import Compute, StepGraph, Transfer
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.strategies.base import (LEAD_ROUNDS, Strategy, bwd_s, copy_s, fwd_s, require_nodes, require_positive,
                                       stagger_groups, update_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class PSConfig:
    workers: int
    """n_w: nodes computing gradients."""
    servers: int = 1
    """n_s: nodes each owning 1/n_s of the parameters."""


class PS(Strategy):
    name = "ps"
    Config = PSConfig
    summary = "parameter servers: every worker pushes all gradients and pulls all parameters (n_s shards)"

    def check(self, net: NetSpec, cluster: ClusterSpec, config: PSConfig) -> None:
        require_positive(self.name, workers=config.workers, servers=config.servers)
        require_nodes(self.name, config.workers + config.servers, cluster, f"{config.workers} workers + {config.servers} servers")

    role_labels = {"worker": "a worker", "server": "a server"}

    def roles(self, config: PSConfig) -> dict[str, int]:
        return {"worker": config.workers, "server": config.servers}

    def memory(self, net: NetSpec, cluster: ClusterSpec, config: PSConfig, batch: int) -> dict[str, MemoryUse]:
        """A worker: a full replica (parameters, gradients, activations, input batch) without
        optimizer state — the servers update — plus the flattened gradient it pushes and the
        buffer the parameters are pulled into (runtime/roles/ps.py). A server: its shard, the
        summed gradient, the momentum of the shard and one receive buffer per worker."""
        self.check(net, cluster, config)
        p = net.param_bytes
        return {"worker": compute.training_memory(net, net.layers, batch, optimizer_slots=0, buffers_bytes=2 * p),
                "server": compute.server_memory(p / config.servers, config.workers)}

    def global_batch(self, config: PSConfig, batch: int) -> int:
        return config.workers * batch

    def default(self, net, cluster, batch, *, workers=None, servers=None, **_):
        servers = servers or 1
        if workers is None:
            workers = cluster.nodes - servers
            if workers < 1:
                raise ConfigError(f"ps: a cluster of {cluster.nodes} node(s) has no room for workers beside {servers} server(s)")
        return PSConfig(workers=workers, servers=servers)

    def space(self, net, cluster, batch):
        out = []
        s = 1
        while s < cluster.nodes:
            out.append(PSConfig(workers=cluster.nodes - s, servers=s))
            s = s + 1 if s < 8 else s * 2
        return out

    def schedule(self, net: NetSpec, cluster: ClusterSpec, config: PSConfig, batch: int) -> StepGraph:
        self.check(net, cluster, config)
        n_w, n_s = config.workers, config.servers
        shard = net.param_bytes / n_s
        # the worker gathers its gradient flat to push it, and copies the pulled parameters into its
        # model (runtime/roles/ps.py): one copy of its parameters' bytes each
        t_set = copy_s(net.param_bytes, cluster)
        t_compute = fwd_s(net, net.layers, cluster, batch) + bwd_s(net, net.layers, cluster, batch) + t_set
        t_update = update_s(shard, cluster, gradients_summed=n_w, averaged=True)  # runtime/roles/ps.py
        counts = stagger_groups(n_w)
        shares = cluster.nic.stagger_shares(shard, counts)
        if n_w == 1 or all(w == 1.0 for w in shares):
            tasks = [
                Compute(name="fwd_bwd", group="worker", seconds=t_compute),
                Transfer(name="push", src="worker", dst="server", bytes_per_flow=shard, pattern="all_to_all", deps=("fwd_bwd",)),
                Compute(name="update", group="server", seconds=t_update, deps=("push",)),
                Transfer(name="pull", src="server", dst="worker", bytes_per_flow=shard, pattern="all_to_all", deps=("update",)),
                Compute(name="set_params", group="worker", seconds=t_set, deps=("pull",)),
            ]
            return StepGraph(groups=self.roles(config), tasks=tuple(tasks), samples_per_step=n_w * batch)
        # A server's n_w pulls leave its NIC together, and TCP does not share it evenly while they
        # are short (LinkSpec.flow_lead_bytes): they arrive one after another, and each worker starts
        # its next step and pushes while the later ones still receive. Simulated as up to
        # STAGGER_GROUPS groups of workers served in turn (LinkSpec.stagger_shares), reported as the
        # one role "worker", over LEAD_ROUNDS steps.
        names = {f"worker{j}": c for j, c in enumerate(counts)}
        tasks = []
        for w in names:
            tasks += [Compute(name=f"fwd_bwd@{w}", group=w, seconds=t_compute, deps=(f"prev/set_params@{w}",)),
                      Transfer(name=f"push@{w}", src=w, dst="server", bytes_per_flow=shard, pattern="all_to_all",
                               deps=(f"fwd_bwd@{w}",))]
        tasks.append(Compute(name="update", group="server", seconds=t_update, deps=tuple(f"push@{w}" for w in names)))
        tasks += [Transfer(name=f"pull@{w}", src="server", dst=w, bytes_per_flow=shard, pattern="all_to_all", deps=("update",),
                           share=share) for w, share in zip(names, shares)]
        tasks += [Compute(name=f"set_params@{w}", group=w, seconds=t_set, deps=(f"pull@{w}",)) for w in names]
        return StepGraph(groups=names | {"server": n_s}, tasks=tuple(tasks), samples_per_step=n_w * batch,
                         iterations=LEAD_ROUNDS, report_as=dict.fromkeys(names, "worker"))
