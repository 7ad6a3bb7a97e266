"""One file per strategy: the communication each rank performs in one training step.

Every role follows the same contract (``RoleBase``): ``step(s)`` runs global step s (BSP: every
rank's step s uses the parameters after step s−1; Omnivore's asynchronous groups read it as one
round, see ``groups.py``), timing compute and communication and counting
bytes in the rank's Meter; ``state_dict``/``load_state_dict`` hold what a checkpoint needs;
``owned_params`` names the parameters this rank holds (for comparisons with the reference).

gloo rules followed throughout (EMULATION.md): sends are ``isend`` (gloo's send is a rendezvous),
every Work handle and its buffer stay referenced until ``wait()``, sources are explicit and every
message carries a tag for its step and phase. Two ranks that send to each other at once post
their ``irecv`` before their ``isend`` (hybrid's exchanges between FC machines): with the sends
posted first, half the exchanges of 29.4 MB each way on the emulated 100 Mbit/s link ran one
direction after the other, 4.8-4.9 s against 2.5 s; with the receives first, every one took 2.5 s,
as an all-reduce of the same bytes does (``benchmarks/exchange_order.py``). At 1 Gbit/s 2 of 8
ran so (0.47-0.49 s against 0.25); at 10 Gbit/s the median went from 38 to 50 ms.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from dataclasses import dataclass
from typing import Any

PHASES = 16


def tag(step: int, phase: int) -> int:
    """Message tag of (step, phase): distinct within a window of 2^20 steps."""
    return (step % (1 << 20)) * PHASES + phase


@dataclass
class Context:
    spec: Any
    rank: int
    roles: dict
    role: Any
    net: Any
    module: Any
    device: Any
    meter: Any
    sharder: Any
    global_batch: int


class RoleBase(ABC):
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.meter = ctx.meter
        self._scratch: dict[str, Any] = {}

    @abstractmethod
    def step(self, s: int) -> None:
        """Each subclass implements it."""

    def checkpoint_comm(self, s: int) -> None:
        """Traffic a checkpoint needs before ranks write their files (Stanza §5.3)."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Each subclass implements it."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Each subclass implements it."""

    def owned_params(self) -> dict:
        return {}

    def resume_at(self, step: int) -> None:
        """Called after ``load_state_dict`` with the steps the checkpoint had done (roles that count
        iterations themselves, as the groups servers do, start there)."""

    # ---- helpers -------------------------------------------------------------------------
    def scratch(self, name: str, shape, dtype):
        """A buffer this rank keeps from step to step (its contents are whatever the last use left).
        Parameter-sized tensors allocated afresh every step cost page faults: glibc maps every
        allocation over 32 MB anew and the kernel zeroes each page on first touch. Measured here: a
        PS server's update of a 60 MB shard from two workers' buffers took 120 ms with new buffers
        every step, 59 ms with kept ones — the update the cost model charges (``update_s``)."""
        import torch

        shape = tuple(shape)
        t = self._scratch.get(name)
        if t is None or tuple(t.shape) != shape or t.dtype != dtype:
            t = self._scratch[name] = torch.empty(shape, dtype=dtype, device=self.ctx.device)
        return t

    def wait(self, works) -> None:
        with self.meter.comm():
            for w in works:
                w.wait()

    def isend(self, t, dst: int, tg: int, group=None):
        import torch.distributed as dist

        self.meter.sent(t)
        return dist.isend(t, dst=dst, tag=tg, group=group)

    def irecv(self, t, src: int, tg: int, group=None):
        import torch.distributed as dist

        self.meter.recv(t)
        return dist.irecv(t, src=src, tag=tg, group=group)

    def all_reduce(self, t, group=None) -> None:
        import torch.distributed as dist

        self.meter.collective(t)
        with self.meter.comm():
            dist.all_reduce(t, group=group)

    def batch(self, s: int):
        x, y = self.ctx.sharder.batch(s, self.ctx.role.data_index)
        return x.to(self.ctx.device), y.to(self.ctx.device)

    def inputs(self, s: int):
        return self.ctx.sharder.inputs(s, self.ctx.role.data_index).to(self.ctx.device)

    def labels_of(self, rank: int, s: int):
        return self.ctx.sharder.labels(s, self.ctx.roles[rank].data_index).to(self.ctx.device)

    def sgd(self, params):
        from layerplan.runtime.optim import sgd

        sp = self.ctx.spec
        return sgd(params, lr=sp.lr, momentum=sp.momentum, weight_decay=sp.weight_decay)

    def load_sgd(self, opt, state: dict) -> None:
        """Restore ``opt``'s state (the momentum buffers) from a checkpoint, keeping this run's learning
        rate, momentum and weight decay: torch's ``load_state_dict`` would bring back the saved ones."""
        from layerplan.runtime.optim import load_state

        sp = self.ctx.spec
        load_state(opt, state, lr=sp.lr, momentum=sp.momentum, weight_decay=sp.weight_decay)


def flat_grads(params, out=None):
    """One contiguous vector of the gradients of ``params`` (zeros where a parameter got none),
    written into ``out`` when given (a ``RoleBase.scratch`` buffer of their total size)."""
    import torch

    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    return torch.cat(parts) if out is None else torch.cat(parts, out=out)


def summed(bufs, out):
    """The sum of the received gradients ``bufs``, added in their order: ``bufs[0]`` itself when
    there is one, else written into ``out`` — the first two added into it, then one add_ each, 3
    passes over the bytes an add (``strategies.base.sum_passes`` charges them)."""
    import torch

    if len(bufs) == 1:
        return bufs[0]
    torch.add(bufs[0], bufs[1], out=out)
    for b in bufs[2:]:
        out.add_(b)
    return out


def set_grads(params, flat) -> None:
    """The gradients of ``params`` as views of the flat vector ``flat`` (no copy: a copy of a
    parameter-sized gradient into fresh memory every step costs its page faults too — hybrid's 4
    CONV workers of vgg16_cifar, 59 MB of conv gradients each, at 10 Gbit/s: from the all-reduce's
    end to the step's 71 ms with copies, 32 ms without). ``flat`` must outlive the
    step's optimizer step and not be written before the next ``zero_grad(set_to_none=True)``: every
    caller's flat vector is a ``scratch`` buffer refilled only after that."""
    off = 0
    for p in params:
        n = p.numel()
        p.grad = flat[off:off + n].view_as(p)
        off += n


def set_params(params, flat) -> None:
    import torch

    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[off:off + n].view_as(p))
            off += n


def flat_params(params):
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in params])


def make_role(ctx: Context) -> RoleBase:
    from layerplan.runtime.roles import allreduce, groups, hybrid, ps, ralp, stanza

    return {"ps": ps.make, "allreduce": allreduce.make, "stanza": stanza.make, "ralp": ralp.make,
            "hybrid": hybrid.make, "groups": groups.make}[ctx.spec.strategy](ctx)
