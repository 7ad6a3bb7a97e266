"""`hybrid`: data-parallel conv phase, model-parallel FC phase ("One Weird Trick", Krizhevsky 2014,
as PALEO models it; Yan et al. KDD'15 §6.4 for the per-layer choice).

n_c CONV workers run the conv phase data-parallel (conv gradients ring-all-reduced among them).
n_f FC machines hold the FC phase. Each fc layer is either

- **partitioned** by output features (each FC machine holds 1/n_f of its weights and computes its
  slice of the outputs for the whole global batch G = n_c·B): its input must be on every FC machine
  in full ("full" layout) and its output is split by features; or
- **replicated** (Yan §6.4: partition vs replicate the output layer): every FC machine holds all of
  its weights and computes it for G/n_f samples ("batch" layout); its weight gradients are
  all-reduced among the FC machines.

Between layers the activations move to the layout the next layer needs, and the gradients move
back: the boundary activations of the whole batch go to every FC machine for a partitioned first
layer (all-gather), slices are exchanged between partitioned layers (all-gather forward,
reduce-scatter of the input gradients backward), and the loss is computed on batch-split logits.
Partitioning moves activations; replicating moves weights — the trade-off Yan §6.4 describes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from layerplan.cost import compute
from layerplan.cost.compute import MemoryUse
from layerplan.cost.engine import Collective, Compute, StepGraph, Transfer
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import LayerSpec, NetSpec
from layerplan.strategies.base import Strategy, bwd_s, copy_s, fwd_s, param_bytes, require_nodes, require_positive, update_s

MAX_ENUMERATED_FC_LAYERS = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class HybridConfig:
    conv_workers: int
    """n_c: data-parallel CONV workers."""
    fc_workers: int
    """n_f: FC machines sharing the FC phase."""
    replicate: tuple[str, ...] = ()
    """fc layers computed replicated (data parallel over the FC machines) instead of partitioned."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicate", tuple(self.replicate))


def fc_blocks(net: NetSpec) -> list[tuple[LayerSpec, list[LayerSpec]]]:
    """The FC phase as (fc layer, the element-wise layers that follow it) blocks; element-wise
    layers before the first fc layer join its block."""
    blocks: list[tuple[LayerSpec, list[LayerSpec]]] = []
    lead: list[LayerSpec] = []
    for layer in net.fc_layers:
        if layer.kind == "fc":
            blocks.append((layer, []))
        elif blocks:
            blocks[-1][1].append(layer)
        else:
            lead.append(layer)
    if blocks and lead:
        blocks[0][1][:0] = lead
    return blocks


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerChoice:
    """Why one fc layer of a hybrid config is partitioned or replicated (Yan §6.4), in bytes per
    step per FC machine, each way."""

    layer: str
    choice: str
    """partitioned | replicated | whole (one FC machine: nothing to choose)."""
    activation_bytes: float
    """Partitioned: remote input activations one FC machine receives forward (Yan eq.6, A(l,p) for
    an fc segment, which reads all its input and holds 1/n_f of it), and as many error terms it
    sends backward (M_b); G samples."""
    weight_bytes: float
    """Replicated: weight-gradient bytes one FC machine sends (and receives) in the ring all-reduce
    among the n_f FC machines, 2·(n_f−1)/n_f·W."""
    cheaper: str
    """The choice that moves fewer bytes (partitioned | replicated | either)."""

    @property
    def reason(self) -> str:
        from layerplan import units

        act, wts = units.format_bytes(self.activation_bytes), units.format_bytes(self.weight_bytes)
        if self.choice == "whole":
            return "whole on the one FC machine (nothing to partition or replicate)"
        if self.choice == "partitioned":
            said = (f"moves {act} of activations in and {act} of error terms out per FC machine per step (Yan eq.6), "
                    f"vs {wts} each way of weight gradients if replicated")
        else:
            said = (f"moves {wts} of weight gradients each way per FC machine per step (ring all-reduce), vs {act} "
                    f"of activations in and {act} of error terms out if partitioned (Yan eq.6)")
        if self.cheaper in (self.choice, "either"):
            return f"{self.choice}: {said}"
        return f"{self.choice}, though {self.cheaper} would move less: {said}"

    def to_dict(self) -> dict:
        return {"layer": self.layer, "choice": self.choice, "activation_bytes": self.activation_bytes,
                "weight_bytes": self.weight_bytes, "cheaper": self.cheaper, "reason": self.reason}


def layer_choices(net: NetSpec, config: HybridConfig, batch: int) -> tuple[LayerChoice, ...]:
    """Per fc layer: partitioned or replicated, and the bytes each choice moves (Yan §6.4:
    partitioning moves activations, replicating moves weights). Partitioning moves less exactly
    when the layer's input for the global batch is smaller than twice its weights: G·in·(1 − 1/n_f)
    against 2·(n_f − 1)/n_f·W."""
    from layerplan.plan.yan import remote_fraction

    n_f = config.fc_workers
    G = config.conv_workers * batch
    out = []
    for fc, tail in fc_blocks(net):
        in_bytes = net.layer(fc.parents[0]).out_bytes if fc.parents else net.boundary_bytes
        act = remote_fraction(True, n_f, n_f) * in_bytes * G  # Yan eq.6 (§5.2 greedy mapping)
        w = param_bytes([fc, *tail])
        wts = 2.0 * (n_f - 1) / n_f * w  # ring all-reduce, per node each way (PALEO §2)
        cheaper = "either" if math.isclose(act, wts) else ("partitioned" if act < wts else "replicated")
        choice = "whole" if n_f == 1 else ("replicated" if fc.name in config.replicate else "partitioned")
        out.append(LayerChoice(layer=fc.name, choice=choice, activation_bytes=act, weight_bytes=wts, cheaper=cheaper))
    return tuple(out)


class Hybrid(Strategy):
    name = "hybrid"
    Config = HybridConfig
    summary = "conv data-parallel on n_c workers, each FC layer partitioned (or replicated) over n_f machines"
    needs_fc_phase = True

    def check(self, net, cluster, config: HybridConfig) -> None:
        self.require_applies(net)
        require_positive(self.name, conv_workers=config.conv_workers, fc_workers=config.fc_workers)
        require_nodes(self.name, config.conv_workers + config.fc_workers, cluster,
                      f"{config.conv_workers} CONV workers + {config.fc_workers} FC machines")
        names = {b[0].name for b in fc_blocks(net)}
        for r in config.replicate:
            if r not in names:
                raise ConfigError(f"hybrid: {r!r} is not an fc layer of the FC phase ({', '.join(sorted(names))})")

    role_labels = {"conv": "a CONV worker", "fc": "an FC machine"}

    def roles(self, config):
        return {"conv": config.conv_workers, "fc": config.fc_workers}

    def memory(self, net: NetSpec, cluster: ClusterSpec, config: HybridConfig, batch: int) -> dict[str, MemoryUse]:
        """A CONV worker: as Stanza's (ring all-reduce of a flat conv gradient when n_c > 1). An FC
        machine, for the global batch G = n_c·B: 1/n_f of each partitioned block's parameters and
        all of each replicated block's, with gradients and momentum; 1/n_f of every FC-phase output
        (a feature slice of G samples or ⌈G/n_f⌉ whole samples); the boundary activations it
        receives (all G samples for a partitioned first layer, its ⌈G/n_f⌉ otherwise); the full
        input that each later partitioned block all-gathers (G samples); and the flat gradient of
        the replicated blocks it all-reduces (n_f > 1)."""
        self.check(net, cluster, config)
        n_c, n_f = config.conv_workers, config.fc_workers
        G = n_c * batch
        g_part = math.ceil(G / n_f)
        p_c = param_bytes(net.conv_layers)
        conv = compute.training_memory(net, net.conv_layers, batch,
                                       buffers_bytes=net.boundary_bytes * batch + (p_c if n_c > 1 else 0))
        held, replicated_b, gathered, inputs = 0.0, 0.0, 0.0, 0.0
        partitioned_any = False
        for i, (fc, tail) in enumerate(fc_blocks(net)):
            p = param_bytes([fc, *tail])
            replicated = fc.name in config.replicate or n_f == 1
            held += p if replicated else p / n_f
            if replicated and n_f > 1:
                replicated_b += p
            partitioned_any |= not replicated
            if i == 0:
                inputs = net.boundary_bytes * (g_part if replicated else G)
            elif not replicated:
                in_bytes = net.layer(fc.parents[0]).out_bytes if fc.parents else net.boundary_bytes
                gathered += in_bytes * G
        fc_mem = MemoryUse(parameters_bytes=held, gradients_bytes=held, optimizer_bytes=held,
                           activations_bytes=compute.activation_bytes(net.fc_layers, g_part), inputs_bytes=inputs,
                           buffers_bytes=gathered + replicated_b, samples=G if partitioned_any else g_part)
        return {"conv": conv, "fc": fc_mem}

    def global_batch(self, config, batch):
        return config.conv_workers * batch

    def default(self, net, cluster, batch, *, conv_workers=None, fc_workers=None, workers=None, **_):
        self.require_applies(net)
        if conv_workers is None and fc_workers is None and workers is None:
            from layerplan import strategies

            space = self.space(net, cluster, batch)
            if not space:
                raise ConfigError(f"hybrid needs at least 2 nodes, the cluster has {cluster.nodes}")
            fits = [c for c in space if not self.memory_problem(cluster, self.memory(net, cluster, c, batch))]
            if not fits:
                least = min(space, key=lambda c: max(m.total_bytes for m in self.memory(net, cluster, c, batch).values()))
                raise ConfigError(self.memory_problem(cluster, self.memory(net, cluster, least, batch))
                                  + f"; no split of {cluster.nodes} nodes into CONV workers and FC machines fits")
            return max(fits, key=lambda c: strategies.predict(net, cluster, self.name, c, batch).throughput_samples_per_s)
        n_f = fc_workers or 1
        n_c = conv_workers or workers or cluster.nodes - n_f
        return HybridConfig(conv_workers=n_c, fc_workers=n_f)

    def space(self, net, cluster, batch):
        if self.applies(net) or cluster.nodes < 2:
            return []
        fcs = [b[0].name for b in fc_blocks(net)]
        if len(fcs) <= MAX_ENUMERATED_FC_LAYERS:
            subsets = [tuple(s) for r in range(len(fcs) + 1) for s in itertools.combinations(fcs, r)]
        else:
            subsets = [(), (fcs[-1],), tuple(fcs)]
        out = []
        n_f = 1
        while n_f <= cluster.nodes // 2:
            for rep in (subsets if n_f > 1 else [()]):  # with one FC machine both choices are the same
                out.append(HybridConfig(conv_workers=cluster.nodes - n_f, fc_workers=n_f, replicate=rep))
            n_f *= 2
        return out

    def schedule(self, net: NetSpec, cluster: ClusterSpec, config: HybridConfig, batch: int) -> StepGraph:
        self.check(net, cluster, config)
        n_c, n_f = config.conv_workers, config.fc_workers
        G = n_c * batch
        g_part = math.ceil(G / n_f)  # samples per FC machine in the batch layout
        tasks: list = [Compute(name="conv_fwd", group="conv", seconds=fwd_s(net, net.conv_layers, cluster, batch))]
        last = "conv_fwd"
        counter = itertools.count()

        def add(task) -> str:
            nonlocal last
            tasks.append(task)
            last = task.name
            return task.name

        def move(layout_from: str, layout_to: str, values_bytes_per_sample: int, backward: bool) -> None:
            """Move a tensor of ``values_bytes_per_sample`` per sample between layouts."""
            i = next(counter)
            name = f"{'grad' if backward else 'act'}_{layout_from}_to_{layout_to}_{i}"
            per = values_bytes_per_sample
            if layout_from == layout_to and layout_from in ("batch", "full"):
                return
            if layout_from == "conv" or layout_to == "conv":
                # as Stanza's: the CONV workers meet at the gather, the FC machines, blocked through the forward
                # pass, wake cold, and the CONV workers for the gradients (Transfer.meets, Transfer.wakes)
                if n_f == 1 and layout_from == "conv":
                    add(Transfer(name=name, src="conv", dst="fc", bytes_per_flow=per * batch, pattern="spread", deps=(last,),
                                 meets=True, wakes=True))
                elif layout_from == "conv":
                    pattern = "all_to_all" if layout_to == "full" else "spread"
                    add(Transfer(name=name, src="conv", dst="fc", bytes_per_flow=per * batch, pattern=pattern, deps=(last,),
                                 meets=True, wakes=True))
                else:  # gradients back to the CONV workers
                    pattern = "all_to_all" if layout_from == "partial" else "broadcast"
                    add(Transfer(name=name, src="fc", dst="conv", bytes_per_flow=per * batch, pattern=pattern, deps=(last,),
                                 wakes=True))
                return
            if n_f == 1:
                return
            if (layout_from, layout_to) in (("feature", "full"), ("batch", "full"), ("partial", "feature"), ("partial", "batch")):
                nbytes = per * G / n_f  # all-gather forward / reduce-scatter backward: one slice to each other machine
            else:  # feature <-> batch: a transpose, each machine keeps 1/n_f of its slice
                nbytes = per * G / (n_f * n_f)
            add(Transfer(name=name, src="fc", dst="fc", bytes_per_flow=nbytes, pattern="all_to_all", deps=(last,)))

        def block_s(phase_s, layers, replicated: bool) -> float:
            """A replicated block: the whole layers for the machine's g_part samples. A partitioned
            one: 1/n_f of the whole layers for the global batch — its slice of the features. Not the
            whole layers for G/n_f samples: a layer's time has a part that goes with its weights
            (reading them, writing their gradient; the measured profile's fixed term, 31 ms of
            alexnet_cifar's 4096x4096 layer's 40 ms backward at batch 16), and a slice holds 1/n_f."""
            return phase_s(net, layers, cluster, g_part) if replicated else phase_s(net, layers, cluster, G) / n_f

        blocks = fc_blocks(net)
        layouts = []  # (input layout needed, output layout produced) per block
        cur = "conv"
        for fc, tail in blocks:
            replicated = fc.name in config.replicate or n_f == 1
            need = "batch" if replicated else "full"
            in_bytes = net.layer(fc.parents[0]).out_bytes if fc.parents else net.boundary_bytes
            move(cur, need, in_bytes, backward=False)
            layers = [fc, *tail]
            add(Compute(name=f"fwd_{fc.name}", group="fc", seconds=block_s(fwd_s, layers, replicated), deps=(last,)))
            out = "batch" if replicated else "feature"
            layouts.append((need, out, in_bytes))
            cur = out
        # the loss needs whole rows of logits: batch-split them
        # the logits: the last block's last layer in network order (element-wise layers before the
        # first fc layer join its block, so with one block its tail may start before its fc layer)
        out_bytes = max([blocks[-1][0], *blocks[-1][1]], key=lambda x: net.index(x.name)).out_bytes
        move(cur, "batch", out_bytes, backward=False)
        move("batch", cur, out_bytes, backward=True)
        fc_reduces = []
        for bi in reversed(range(len(blocks))):
            fc, tail = blocks[bi]
            need, out, in_bytes = layouts[bi]
            layers = [fc, *tail]
            reduced = need == "batch" and n_f > 1 and fc.param_bytes > 0
            add(Compute(name=f"bwd_{fc.name}", group="fc", deps=(last,),  # a reduced block's gradient gathered flat
                        seconds=block_s(bwd_s, layers, need == "batch") + (copy_s(param_bytes(layers), cluster) if reduced else 0.0)))
            if reduced:
                fc_reduces.append(Collective(name=f"allreduce_{fc.name}", group="fc", scheme="ring",
                                             bytes=param_bytes(layers), deps=(last,)))
            prev_layout = "conv" if bi == 0 else layouts[bi - 1][1]
            grad_from = "partial" if need == "full" else "batch"
            if prev_layout == "conv":
                move(grad_from, "conv", in_bytes, backward=True)
            else:
                move(grad_from, prev_layout, in_bytes, backward=True)
        tasks += fc_reduces
        grads_at_conv = last
        p_conv = param_bytes(net.conv_layers)
        tasks.append(Compute(name="conv_bwd", group="conv", deps=(grads_at_conv,),  # the gradient gathered flat (n_c > 1)
                             seconds=bwd_s(net, net.conv_layers, cluster, batch) + (copy_s(p_conv, cluster) if n_c > 1 else 0.0)))
        conv_done = "conv_bwd"
        if n_c > 1:
            tasks.append(Collective(name="conv_allreduce", group="conv", scheme="ring",
                                    bytes=p_conv, deps=("conv_bwd",)))
            conv_done = "conv_allreduce"
        tasks.append(Compute(name="conv_update", group="conv", seconds=update_s(p_conv, cluster),
                             deps=(conv_done,)))
        fc_bytes = sum(param_bytes([fc, *tail]) / (1 if fc.name in config.replicate or n_f == 1 else n_f)
                       for fc, tail in blocks)
        tasks.append(Compute(name="fc_update", group="fc", seconds=update_s(fc_bytes, cluster),
                             deps=(grads_at_conv, *[t.name for t in fc_reduces])))
        return StepGraph(groups=self.roles(config), tasks=tuple(tasks), samples_per_step=G)
