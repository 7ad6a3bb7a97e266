"""`ralp`: resource-aware layer placement (RALP). Workers run the head up to the split layer; the
parameter server's machine (the "PS worker") runs the tail, one worker's activations at a time, and
aggregates the head's parameters. Only the head's parameters cross the network as model
aggregation; the split layer's activations go to the PS worker and their gradients come back.

Settings: RALP-N uses N−1 workers + the PS worker; RALP-H uses N/2 workers + the PS worker.
The default split is the RALP profiler's (plan/ralp.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.cost import compute
from layerplan.cost.compute import MemoryUse
from layerplan.cost.engine import Compute, StepGraph, Transfer
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.plan import ralp as profiler
from layerplan.strategies.base import LEAD_ROUNDS, Strategy, bwd_s, copy_s, fwd_s, param_bytes, require_nodes, require_positive, update_s


WAVES = 8
"""The schedule simulates the workers as at most this many groups, served by the PS worker in turn."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RalpConfig:
    workers: int
    """Nodes running the head; the PS worker is one more node."""
    split: str
    """Last layer of the head."""
    setting: str = "N"
    """'N' (N−1 workers) or 'H' (N/2 workers): how the workers were chosen, for reports."""


def workers_for(setting: str, nodes: int) -> int:
    if setting == "N":
        return nodes - 1  # RALP-N
    if setting == "H":
        return max(1, nodes // 2)  # RALP-H
    raise ConfigError(f"ralp: setting must be 'N' or 'H', got {setting!r}")


class Ralp(Strategy):
    name = "ralp"
    Config = RalpConfig
    summary = "head on the workers, FC tail on the parameter server's machine (RALP-N / RALP-H)"
    needs_fc_phase = True

    def check(self, net, cluster, config: RalpConfig) -> None:
        self.require_applies(net)
        require_positive(self.name, workers=config.workers)
        require_nodes(self.name, config.workers + 1, cluster, f"{config.workers} workers + the PS worker")
        if config.setting not in ("N", "H"):
            raise ConfigError(f"ralp: setting must be 'N' or 'H', got {config.setting!r}")
        i = net.index(config.split)
        if i == len(net.layers) - 1:
            raise ConfigError(f"ralp: split after {config.split!r} leaves the PS worker nothing to run")
        if profiler.between_convs(net, i):
            raise ConfigError(f"ralp: split after {config.split!r} falls between two conv layers (RALP never splits there)")
        if not net.cut_is_single(i):
            raise ConfigError(f"ralp: split after {config.split!r} is inside a block: other layers' outputs cross it too")
        if not any(layer.kind == "conv" for layer in net.layers[: i + 1]):
            raise ConfigError(f"ralp: split after {config.split!r} leaves the workers no conv layer to run")

    role_labels = {"worker": "a worker", "ps": "the PS worker"}

    def roles(self, config):
        return {"worker": config.workers, "ps": 1}

    def memory(self, net: NetSpec, cluster: ClusterSpec, config: RalpConfig, batch: int) -> dict[str, MemoryUse]:
        """A worker: the head for its K samples without optimizer state (the PS worker updates
        it), the split activations' gradient it receives, the flattened head gradient it pushes
        and the buffer the head is pulled into (runtime/roles/ralp.py). The PS worker: the tail
        with momentum for one worker's K samples at a time, but the activations of all n_w workers
        received (they arrive together and wait their turn), plus the head's parameter server
        (head parameters, summed gradient, momentum, one receive buffer per worker)."""
        self.check(net, cluster, config)
        n_w = config.workers
        head, tail = net.head(config.split), net.tail(config.split)
        act = net.layer(config.split).out_bytes * batch
        p_head = param_bytes(head)
        worker = compute.training_memory(net, head, batch, optimizer_slots=0, buffers_bytes=act + 2 * p_head)
        ps = compute.training_memory(net, tail, batch, inputs_bytes=n_w * act) + compute.server_memory(p_head, n_w)
        return {"worker": worker, "ps": ps}

    def global_batch(self, config, batch):
        return config.workers * batch

    def default(self, net, cluster, batch, *, workers=None, split=None, setting=None, **_):
        self.require_applies(net)
        setting = setting or "N"
        if split is None:
            split = profiler.profile(net, batch).split_after
            if split is None:
                raise ConfigError(f"ralp: the RALP profiler finds no split for {net.name}")
        return RalpConfig(workers=workers or workers_for(setting, cluster.nodes), split=split, setting=setting)

    def space(self, net, cluster, batch):
        if self.applies(net) or cluster.nodes < 2:
            return []
        split = profiler.profile(net, batch).split_after
        if split is None:
            return []
        out = [RalpConfig(workers=workers_for("N", cluster.nodes), split=split, setting="N")]
        if cluster.nodes >= 4:
            out.append(RalpConfig(workers=workers_for("H", cluster.nodes), split=split, setting="H"))
        return out

    def schedule(self, net: NetSpec, cluster: ClusterSpec, config: RalpConfig, batch: int) -> StepGraph:
        self.check(net, cluster, config)
        n_w = config.workers
        head, tail = net.head(config.split), net.tail(config.split)
        act = net.layer(config.split).out_bytes * batch
        p_head, p_tail = param_bytes(head), param_bytes(tail)
        # RALP: the PS worker processes one worker's activations at a time (not interleaved) and
        # returns each worker its activation gradient as soon as that worker is served
        # (runtime/roles/ralp.py), so a worker's head backward overlaps the tail of the workers after
        # it. The workers are simulated as up to WAVES groups served in turn (one worker each when
        # n_w ≤ WAVES), reported as the one role "worker".
        t_tail = fwd_s(net, tail, cluster, batch) + bwd_s(net, tail, cluster, batch)
        waves = [n_w // min(n_w, WAVES) + (j < n_w % min(n_w, WAVES)) for j in range(min(n_w, WAVES))]
        names = [f"worker{j}" for j in range(len(waves))]
        # a worker gathers its head's gradient flat to push it, and copies the pulled head into its
        # model (runtime/roles/ralp.py): one copy of the head's bytes each
        t_set = copy_s(p_head, cluster)
        t_fwd, t_bwd = fwd_s(net, head, cluster, batch), bwd_s(net, head, cluster, batch) + t_set
        # The PS worker's pulls leave its NIC together: where TCP does not share it evenly among
        # short flows (LinkSpec.flow_lead_bytes), they arrive one after another
        # (LinkSpec.stagger_shares) and each worker starts its next step as its own is in, which
        # shows over LEAD_ROUNDS steps. The PS worker serves the next step once all its pulls are out
        # (it waits for its sends, runtime/roles/ralp.py): a worker's head forward overlaps the later
        # workers' pulls, its tail does not. resnet_cifar at 100 Mbit/s, eight full validations:
        # 2 workers 365-377 ms a step, predicted 373 (333-360 where the first worker's tail went
        # ahead); 4 workers 678-735 ms, predicted 759 (587-666). Measured on the emulated link, a
        # gloo send returns while 1.1-1.2 MB of it is still on its way at 100 Mbit/s (2.3 MB at 1
        # Gbit/s): resnet_cifar's 1.1 MB pulls are out at once, so why the steps fit a PS worker that
        # waits for their arrival (without it: 11% fast) is still open.
        shares = cluster.nic.stagger_shares(p_head, waves) if len(names) > 1 else (1.0,)
        prev = any(w != 1.0 for w in shares)
        served = tuple(f"prev/pull_head@{w}" for w in names) if prev else ()
        tasks = []
        for j, w in enumerate(names):
            tasks += [
                Compute(name=f"head_fwd@{w}", group=w, seconds=t_fwd, deps=(f"prev/set_params@{w}",) if prev else ()),
                Transfer(name=f"activations@{w}", src=w, dst="ps", bytes_per_flow=act, pattern="spread",
                         deps=(f"head_fwd@{w}",)),
                Compute(name=f"tail_fwd_bwd@{w}", group="ps", seconds=waves[j] * t_tail,
                        deps=(f"activations@{w}",) + ((f"tail_fwd_bwd@{names[j - 1]}",) if j else served)),
                Transfer(name=f"act_grads@{w}", src="ps", dst=w, bytes_per_flow=act, pattern="broadcast",
                         deps=(f"tail_fwd_bwd@{w}",)),
                Compute(name=f"head_bwd@{w}", group=w, seconds=t_bwd, deps=(f"act_grads@{w}",)),
                Transfer(name=f"push_head@{w}", src=w, dst="ps", bytes_per_flow=p_head, pattern="spread",
                         deps=(f"head_bwd@{w}",)),
            ]
        tasks.append(Compute(name="update", group="ps",
                             seconds=update_s(p_head, cluster, gradients_summed=n_w, copied=True) + update_s(p_tail, cluster),
                             deps=(f"tail_fwd_bwd@{names[-1]}",) + tuple(f"push_head@{w}" for w in names)))
        tasks += [Transfer(name=f"pull_head@{w}", src="ps", dst=w, bytes_per_flow=p_head, pattern="broadcast",
                           deps=("update",), share=shares[j]) for j, w in enumerate(names)]
        tasks += [Compute(name=f"set_params@{w}", group=w, seconds=t_set, deps=(f"pull_head@{w}",)) for w in names]
        groups = dict(zip(names, waves)) | {"ps": 1}
        return StepGraph(groups=groups, tasks=tuple(tasks), samples_per_step=n_w * batch, iterations=LEAD_ROUNDS if prev else 1,
                         report_as=dict.fromkeys(names, "worker"))
