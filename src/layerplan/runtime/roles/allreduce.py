"""All-reduce data parallelism: torch DistributedDataParallel, as users run it (our peer).

Every worker holds a replica, computes the gradient of its batch (mean over its K samples); DDP
all-reduces the gradient buckets during backward (averaging over the n workers) and each replica
applies the same torch.optim.SGD step.

Counting: a comm hook (the same arithmetic as DDP's default ``allreduce_hook``: divide by n, then
all-reduce) records each bucket's payload bytes — the sum over a step is all gradient bytes, P·4 —
and each bucket's in-flight interval. DDP's buffer broadcast (BatchNorm statistics, from rank 0
before each forward) is counted as a collective of the buffers' bytes. Time: DDP overlaps the
all-reduce with backward, so ``comm_s`` is the union of the buckets' in-flight intervals and
``compute_s`` the step's wall time less the part spent waiting after the last bucket was launched.
"""

from __future__ import annotations

import time

from layerplan.runtime.roles import RoleBase


class Worker(RoleBase):
    def __init__(self, ctx):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        super().__init__(ctx)
        self.model = ctx.module.to(ctx.device)
        dev = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.ddp = DDP(self.model, device_ids=dev)
        self.world = dist.get_world_size()
        self.buckets = DdpBuckets(self.meter, divisor=self.world)
        self.ddp.register_comm_hook(self.buckets, counting_hook)
        self.buffer_bytes = sum(b.numel() * b.element_size() for b in self.model.buffers())
        self.opt = self.sgd(self.model.parameters())

    def step(self, s: int) -> None:
        import torch.nn.functional as F

        x, y = self.batch(s)
        self.buckets.intervals = []
        t0 = time.perf_counter()
        if self.buffer_bytes and self.world > 1 and self.ddp.broadcast_buffers:
            self.meter.collective(self.buffer_bytes)
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.ddp(x), y)
        self.meter.mark("fwd")  # the schedule's tasks (strategies/allreduce.py) that end here
        loss.backward()  # returns once every bucket is all-reduced
        t_bwd = time.perf_counter()
        self.meter.mark("unbucket")
        self.opt.step()
        self.buckets.record_times(t0, t_bwd, time.perf_counter())
        self.meter.loss(loss.item() / self.world, shown=loss.item())

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.load_sgd(self.opt, state["opt"])

    def owned_params(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.model.named_parameters()}


class DdpBuckets:
    """A DDP comm hook's state: the meter it counts into, what it divides each bucket by (DDP's
    default hook: the group size; 1 = sum), the process group, and each bucket's in-flight interval."""

    def __init__(self, meter, divisor: int = 1, group=None):
        self.meter = meter
        self.divisor = divisor
        self.group = group
        self.intervals: list[tuple[float, float]] = []

    def record_times(self, t0: float, t_bwd: float, t1: float) -> None:
        """DDP overlaps the all-reduce with backward (started at ``t0``, returned at ``t_bwd``, step
        done at ``t1``): comm = the union of the buckets' in-flight intervals, compute = the step's
        wall less the wait after the last bucket was launched."""
        comm = _union(self.intervals)
        exposed = min(comm, max(0.0, t_bwd - max(a for a, _ in self.intervals))) if self.intervals else 0.0
        self.meter.add_time("comm_s", comm)
        self.meter.add_time("compute_s", (t1 - t0) - exposed)


def counting_hook(state: DdpBuckets, bucket):
    """All-reduce the bucket (divided by ``state.divisor`` first, as DDP's default hook divides by
    the group size), counting its payload bytes and in-flight interval."""
    import torch.distributed as dist

    buf = bucket.buffer()
    state.meter.collective(buf)
    t0 = time.perf_counter()
    if state.divisor != 1:
        buf.div_(state.divisor)
    fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()

    def done(f):
        state.intervals.append((t0, time.perf_counter()))
        return f.value()[0]

    return fut.then(done)


def _union(iv: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(iv):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def make(ctx) -> RoleBase:
    return Worker(ctx)
