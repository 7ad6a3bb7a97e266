"""`stanza`: layer separation (Stanza §4). n_c CONV workers run the conv phase data-parallel; n_f
FC workers hold the FC phase. Per iteration: CONV workers send their boundary activations (A·K
values) to their FC worker; the FC worker runs the FC phase for its n_c/n_f CONV workers' samples,
returns each its activation gradient and updates the FC parameters (all-reduced among FC workers
when n_f > 1, overlapped with the CONV side); CONV workers backpropagate and all-reduce the conv
gradients among themselves by recursive doubling (a ``StanzaRunConfig`` names another scheme: the
runtime's ring). Under the paper's assumptions (no overlap, no latency) the step is Stanza eq.3:
t_s = T_c + (n_c/n_f)·T_f + 2·n_c·A·K/(n_f·B) + P_c·R(n_c)/B.

The paper all-reduces the conv gradient after the backward pass. ``bucket_bytes`` > 0 overlaps it
with the backward pass instead, bucket by bucket in the order backward produces the gradients, as
torch DDP does (layerplan's runtime: DDP over the CONV workers with a summing comm hook); the
conv all-reduce then hides behind all of the conv backward but its first bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerplan.cost import compute
from layerplan.cost.collectives import ALLREDUCE
from layerplan.cost.compute import MemoryUse
from layerplan.cost.engine import Collective, Compute, StepGraph, Transfer
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.strategies.allreduce import DDP_BUCKET_BYTES, bucket_deps, buckets, buckets_in_flight
from layerplan.strategies.base import Strategy, bwd_s, copy_s, fwd_s, param_bytes, require_nodes, require_positive, update_s


@dataclass(frozen=True, kw_only=True, slots=True)
class StanzaConfig:
    conv_workers: int
    """n_c: nodes running the conv phase, data parallel."""
    fc_workers: int = 1
    """n_f: nodes running the FC phase; CONV workers are split evenly among them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StanzaRunConfig(StanzaConfig):
    """Stanza as layerplan's runtime runs it (``runtime.predict``): the all-reduces are gloo's
    all_reduce, a ring — with 4 CONV workers 1.5 model sizes per worker where Stanza's recursive
    doubling moves 2."""

    algorithm: str = "ring"
    """Any ``collectives.ALLREDUCE`` scheme."""
    bucket_bytes: int = DDP_BUCKET_BYTES
    """The conv gradient's all-reduce overlaps the conv backward in buckets of this size (torch
    DDP's); 0 = one all-reduce after the backward pass (Stanza's schedule)."""


def allreduce_scheme(config: StanzaConfig) -> str:
    """The all-reduce among CONV (and FC) workers: Stanza's recursive doubling unless the config says."""
    return getattr(config, "algorithm", "recursive_doubling")


class Stanza(Strategy):
    name = "stanza"
    Config = StanzaConfig
    summary = "conv layers on n_c data-parallel CONV workers, FC layers on n_f FC workers (activations cross)"
    needs_fc_phase = True

    def check(self, net, cluster, config: StanzaConfig) -> None:
        self.require_applies(net)
        require_positive(self.name, conv_workers=config.conv_workers, fc_workers=config.fc_workers)
        require_nodes(self.name, config.conv_workers + config.fc_workers, cluster,
                      f"{config.conv_workers} CONV workers + {config.fc_workers} FC workers")
        if allreduce_scheme(config) not in ALLREDUCE:
            raise ConfigError(f"stanza: unknown algorithm {allreduce_scheme(config)!r}; use one of {', '.join(ALLREDUCE)}")
        if config.fc_workers > config.conv_workers:
            raise ConfigError(f"stanza: {config.fc_workers} FC workers for {config.conv_workers} CONV workers leaves an FC worker idle")

    role_labels = {"conv": "a CONV worker", "fc": "an FC worker"}

    def roles(self, config):
        return {"conv": config.conv_workers, "fc": config.fc_workers}

    def global_batch(self, config, batch):
        return config.conv_workers * batch

    def memory(self, net: NetSpec, cluster: ClusterSpec, config: StanzaConfig, batch: int) -> dict[str, MemoryUse]:
        """A CONV worker: the conv phase with momentum for its K samples, the activation gradients
        it receives, and the flat conv gradient it all-reduces (n_c > 1). An FC worker: the FC
        phase with momentum for the concatenated batch of its ⌈n_c/n_f⌉ CONV workers (Stanza eq.2),
        the activations it receives, and the flat FC gradient it all-reduces (n_f > 1)."""
        self.check(net, cluster, config)
        n_c, n_f = config.conv_workers, config.fc_workers
        fc_batch = math.ceil(n_c / n_f) * batch
        p_c, p_f = param_bytes(net.conv_layers), param_bytes(net.fc_layers)
        conv = compute.training_memory(net, net.conv_layers, batch,
                                       buffers_bytes=net.boundary_bytes * batch + (p_c if n_c > 1 else 0))
        fc = compute.training_memory(net, net.fc_layers, fc_batch, inputs_bytes=net.boundary_bytes * fc_batch,
                                     buffers_bytes=p_f if n_f > 1 else 0)
        return {"conv": conv, "fc": fc}

    def default(self, net, cluster, batch, *, conv_workers=None, fc_workers=None, workers=None, **_):
        self.require_applies(net)
        n_c = conv_workers or workers
        if n_c is None and fc_workers is None:
            from layerplan.plan.assign import best_stanza

            return best_stanza(net, cluster, batch)
        n_f = fc_workers or 1
        if n_c is None:
            n_c = cluster.nodes - n_f
        return StanzaConfig(conv_workers=n_c, fc_workers=n_f)

    def space(self, net, cluster, batch):
        if self.applies(net) or cluster.nodes < 2:
            return []
        return [StanzaConfig(conv_workers=cluster.nodes - f, fc_workers=f) for f in range(1, cluster.nodes // 2 + 1)]

    def schedule(self, net: NetSpec, cluster: ClusterSpec, config: StanzaConfig, batch: int) -> StepGraph:
        self.check(net, cluster, config)
        n_c, n_f = config.conv_workers, config.fc_workers
        fc_batch = math.ceil(n_c / n_f) * batch  # Stanza eq.2: the FC worker serves n_c/n_f CONV workers
        act = net.boundary_bytes * batch  # A·K values per CONV worker
        p_c, p_f = param_bytes(net.conv_layers), param_bytes(net.fc_layers)
        tasks = [
            Compute(name="conv_fwd", group="conv", seconds=fwd_s(net, net.conv_layers, cluster, batch)),
            # the CONV workers meet at the gather, and the FC worker, blocked through the forward pass, wakes
            # cold; so do the CONV workers for the gradients (Transfer.meets, Transfer.wakes)
            Transfer(name="activations", src="conv", dst="fc", bytes_per_flow=act, pattern="spread", deps=("conv_fwd",),
                     meets=True, wakes=True),
            Compute(name="fc_fwd_bwd", group="fc", deps=("activations",),  # the gradient gathered flat (n_f > 1)
                    seconds=fwd_s(net, net.fc_layers, cluster, fc_batch) + bwd_s(net, net.fc_layers, cluster, fc_batch)
                    + (copy_s(p_f, cluster) if n_f > 1 else 0.0)),
            Transfer(name="act_grads", src="fc", dst="conv", bytes_per_flow=act, pattern="broadcast", deps=("fc_fwd_bwd",),
                     wakes=True),
        ]
        bucket_bytes = getattr(config, "bucket_bytes", 0)
        if bucket_bytes <= 0:
            tasks.append(Compute(name="conv_bwd", group="conv", deps=("act_grads",),  # the gradient gathered flat (n_c > 1)
                                 seconds=bwd_s(net, net.conv_layers, cluster, batch) + (copy_s(p_c, cluster) if n_c > 1 else 0.0)))
            conv_done: tuple[str, ...] = ("conv_bwd",)
            if n_c > 1:
                tasks.append(Collective(name="conv_allreduce", group="conv", scheme=allreduce_scheme(config), bytes=p_c,
                                        deps=("conv_bwd",)))
                conv_done = ("conv_allreduce",)
        else:  # DDP: each bucket's all-reduce starts when backward has produced it and a thread is free
            prev_bwd, started = "act_grads", []
            in_flight = buckets_in_flight(cluster)
            ddp = n_c > 1  # the runtime wraps the head in DDP where there is someone to all-reduce with
            for i, layers in enumerate(buckets(net, bucket_bytes, net.conv_layers)):
                bwd = f"conv_bwd{i}"
                nbytes = sum(layer.param_bytes for layer in layers)
                # DDP copies each gradient into its bucket (summed, not divided: runtime/roles/stanza.py)
                tasks.append(Compute(name=bwd, group="conv", deps=(prev_bwd,), seconds=bwd_s(net, layers, cluster, batch)
                                     + (copy_s(nbytes, cluster, model_bytes=p_c) if ddp else 0.0)))
                prev_bwd = bwd
                if n_c > 1 and nbytes > 0:
                    ar = f"conv_allreduce{i}"
                    tasks.append(Collective(name=ar, group="conv", scheme=allreduce_scheme(config), bytes=nbytes,
                                            deps=bucket_deps(bwd, started, in_flight)))
                    started.append(ar)
            conv_done = (prev_bwd, *started)
            if ddp:  # and copies the buckets back to the gradients once every one is reduced
                tasks.append(Compute(name="conv_unbucket", group="conv", deps=conv_done,
                                     seconds=copy_s(p_c, cluster)))
                conv_done = ("conv_unbucket",)
        tasks.append(Compute(name="conv_update", group="conv", seconds=update_s(p_c, cluster), deps=conv_done))
        fc_done = "fc_fwd_bwd"
        if n_f > 1:
            tasks.append(Collective(name="fc_allreduce", group="fc", scheme=allreduce_scheme(config), bytes=p_f,
                                    deps=("act_grads",)))
            fc_done = "fc_allreduce"
        tasks.append(Compute(name="fc_update", group="fc", seconds=update_s(p_f, cluster), deps=(fc_done,)))
        return StepGraph(groups=self.roles(config), tasks=tuple(tasks), samples_per_step=n_c * batch)
