"""`allreduce`: data parallelism with gradients all-reduced among the workers (PALEO §2), as torch's
DistributedDataParallel runs it: gradients are grouped into buckets in reverse layer order (the
order backward produces them) and each bucket's all-reduce starts as soon as its gradients are
ready, overlapping the rest of backward; as many bucket all-reduces run at once as the backend
has threads for them (``buckets_in_flight``: gloo 2, NCCL 1), later ones wait their turn. Before
each forward, DDP broadcasts the model's buffers (BatchNorm statistics) from rank 0. DDP moves
every gradient through its bucket: copied in as backward produces it, divided by the workers
before the all-reduce, copied back to the parameter once every bucket is reduced: 6·P bytes of
memory traffic a step, each copy at the update's bandwidth (``base.copy_s``). Measured here with one
process, where the all-reduce is nothing: DDP's step of vgg16_cifar (135 MB of parameters) 27 ms
longer than the plain step (this accounts 21 ms), of resnet_cifar (1 MB) no longer.

Algorithms: ring (Horovod, NCCL/gloo default for large buffers), tree and butterfly (PALEO §2),
recursive doubling (Stanza §4), one-to-all (PALEO §2).
"""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.cost.collectives import ALLREDUCE
from layerplan.cost import compute
from layerplan.cost.compute import MemoryUse
from layerplan.cost.engine import Collective, Compute, StepGraph
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.errors import ConfigError
from layerplan.strategies.base import Strategy, bwd_s, copy_s, fwd_s, require_nodes, require_positive, update_s

DDP_FIRST_BUCKET_BYTES = 1 * 2**20  # torch DDP: the first bucket is capped at 1 MiB
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb default
GLOO_THREADS = 2  # torch ProcessGroupGloo: each process group runs its work on 2 threads


def buckets_in_flight(cluster: ClusterSpec) -> int:
    """How many of DDP's bucket all-reduces run at once. On CPUs the runtime's gloo hands each
    call to one of its process group's ``GLOO_THREADS`` threads: measured here, 4 ranks on 2 cores,
    an 8000-float all-reduce issued 5 ms after a 64 MiB one finished in 19-34 ms, the 64 MiB one in
    88-135 ms. On GPUs NCCL runs a communicator's calls one after another on its stream."""
    return GLOO_THREADS if cluster.device.kind == "cpu" else 1


def bucket_deps(bwd: str, started: list[str], in_flight: int) -> tuple[str, ...]:
    """A bucket's all-reduce starts when backward has produced it and, with ``in_flight`` calls
    already going (``started`` lists the earlier ones, in order), once the oldest of them is done."""
    return (bwd,) if len(started) < in_flight else (bwd, started[-in_flight])


@dataclass(frozen=True, kw_only=True, slots=True)
class AllreduceConfig:
    workers: int
    """Nodes, each a full replica."""
    algorithm: str = "ring"
    """ring, tree, butterfly, recursive_doubling or one_to_all."""
    bucket_bytes: int = DDP_BUCKET_BYTES
    """Gradient bucket size (DDP bucket_cap_mb); 0 = one all-reduce after the whole backward."""


class Allreduce(Strategy):
    name = "allreduce"
    Config = AllreduceConfig
    summary = "data parallel, gradients all-reduced (DDP: bucketed, overlapped with backward)"

    def check(self, net, cluster, config: AllreduceConfig) -> None:
        require_positive(self.name, workers=config.workers)
        require_nodes(self.name, config.workers, cluster, f"{config.workers} workers")
        if config.algorithm not in ALLREDUCE:
            raise ConfigError(f"allreduce: unknown algorithm {config.algorithm!r}; use one of {', '.join(ALLREDUCE)}")
        if config.bucket_bytes < 0:
            raise ConfigError("allreduce: bucket_bytes must be non-negative")

    role_labels = {"worker": "a worker"}

    def roles(self, config):
        return {"worker": config.workers}

    def memory(self, net: NetSpec, cluster: ClusterSpec, config: AllreduceConfig, batch: int) -> dict[str, MemoryUse]:
        """A full replica with momentum, plus DDP's gradient buckets (a copy of every gradient)
        when there is someone to all-reduce with."""
        self.check(net, cluster, config)
        buckets_b = net.param_bytes if config.workers > 1 else 0
        return {"worker": compute.training_memory(net, net.layers, batch, buffers_bytes=buckets_b)}

    def global_batch(self, config, batch):
        return config.workers * batch

    def default(self, net, cluster, batch, *, workers=None, algorithm=None, **_):
        return AllreduceConfig(workers=workers or cluster.nodes, algorithm=algorithm or "ring")

    def space(self, net, cluster, batch):
        return [AllreduceConfig(workers=cluster.nodes, algorithm=a) for a in ALLREDUCE]

    def schedule(self, net: NetSpec, cluster: ClusterSpec, config: AllreduceConfig, batch: int) -> StepGraph:
        self.check(net, cluster, config)
        tasks = []
        if config.workers > 1:
            # DDP (broadcast_buffers, its default) sends rank 0's buffers (BatchNorm's running
            # statistics and batch counters) to every worker before each forward: one broadcast per
            # dtype, one after another, every worker waits for each
            for i, nbytes in enumerate(buffer_calls(net)):
                tasks.append(Collective(name=f"buffers{i}", group="worker", scheme="scatter", bytes=nbytes,
                                        deps=(tasks[-1].name,) if tasks else ()))
        tasks.append(Compute(name="fwd", group="worker", seconds=fwd_s(net, net.layers, cluster, batch),
                             deps=(tasks[-1].name,) if tasks else ()))
        prev_bwd, started = "fwd", []
        in_flight = buckets_in_flight(cluster)
        into = 2 if config.workers > 1 else 1  # copied in, and divided by the workers before its all-reduce
        for i, layers in enumerate(buckets(net, config.bucket_bytes)):
            bwd = f"bwd{i}"
            nbytes = sum(layer.param_bytes for layer in layers)
            tasks.append(Compute(name=bwd, group="worker", deps=(prev_bwd,), seconds=bwd_s(net, layers, cluster, batch)
                                 + copy_s(nbytes, cluster, passes=into, model_bytes=net.param_bytes)))
            prev_bwd = bwd
            if config.workers > 1 and nbytes > 0:
                ar = f"allreduce{i}"
                tasks.append(Collective(name=ar, group="worker", scheme=config.algorithm, bytes=nbytes,
                                        deps=bucket_deps(bwd, started, in_flight)))
                started.append(ar)
        last = (prev_bwd, *started)
        tasks.append(Compute(name="unbucket", group="worker", deps=last,  # the buckets copied back to the gradients
                             seconds=copy_s(net.param_bytes, cluster)))
        tasks.append(Compute(name="update", group="worker", seconds=update_s(net.param_bytes, cluster), deps=("unbucket",)))
        return StepGraph(groups=self.roles(config), tasks=tuple(tasks), samples_per_step=config.workers * batch)


def buffer_calls(net: NetSpec) -> tuple[int, ...]:
    """Bytes of each broadcast DDP makes of the model's buffers before a forward: the buffers of
    each dtype coalesced into one call (resnet_cifar: its float32 statistics and its int64 batch
    counters, two calls, as torch's process group counts them)."""
    return net.buffer_bytes_by_dtype or ((net.buffer_bytes,) if net.buffer_bytes else ())


def buckets(net: NetSpec, bucket_bytes: int, layers=None) -> list[list]:
    """Layers (``layers``, default all of the net's) in backward order, cut where DDP closes a
    gradient bucket. The first bucket holds at most 1 MiB (DDP), later ones ``bucket_bytes``;
    0 = a single bucket."""
    order = list(reversed(net.layers if layers is None else layers))
    if bucket_bytes <= 0:
        return [order]
    out, cur, size, cap = [], [], 0, min(DDP_FIRST_BUCKET_BYTES, bucket_bytes)
    for layer in order:
        cur.append(layer)
        size += layer.param_bytes
        if size >= cap:
            out.append(cur)
            cur, size, cap = [], 0, bucket_bytes
    if cur:
        out.append(cur)
    return out
