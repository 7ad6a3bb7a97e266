"""Stanza — layer separation (SYSTEMS.md §4).

n_c CONV workers run the head (up to the phase boundary, or the configured split) data-parallel;
n_f FC workers hold the tail. CONV workers are assigned to FC workers in contiguous blocks
(``layout``). Per step:

- CONV worker i: head forward on its K samples; isend the boundary activations (K·A values) to
  its FC worker; receive their gradient; head backward, which all-reduces (sums) the head
  gradients among the CONV workers (a subgroup) bucket by bucket as backward produces them (torch
  DDP with a summing comm hook; Stanza's paper all-reduces after the backward pass, which leaves
  the network idle during it); SGD step.
- FC worker j: receive its CONV workers' activations, concatenate them in rank order, tail
  forward, loss = sum of cross-entropy / global batch (n_c·K) — so the summed gradients are
  exactly those of single-process SGD on the global batch —, backward, isend each CONV worker its
  slice of the activation gradient, all-reduce (sum) the tail gradients among the FC workers when
  n_f > 1 (a subgroup; it overlaps the CONV all-reduce), SGD step.

Subgroups are created on all ranks in the same order (CONV group, then FC group).

Stanza §5.3 fault tolerance: at every checkpoint FC worker j also sends its FC parameters to one
CONV worker — the first of its block, a deterministic stand-in for the paper's random choice —,
which keeps them in its own checkpoint file (``fc_backup``): losing an FC node loses no FC state.
That traffic is counted as checkpoint bytes, not step bytes.

Bytes per step: CONV worker K·A·4 sent and received, plus the head gradient payload P_c·4 when
n_c > 1; FC worker (its block)·K·A·4 sent and received, plus P_f·4 when n_f > 1.
"""

from __future__ import annotations

import time

from layerplan.runtime.roles import RoleBase, flat_grads, flat_params, set_grads, tag
from layerplan.runtime.roles.allreduce import DdpBuckets, counting_hook

ACT, GRAD, BACKUP = 0, 1, 5


def groups(ctx):
    """(CONV group, FC group), created on every rank in the same order."""
    import torch.distributed as dist

    conv = [r for r, role in ctx.roles.items() if role.kind == "conv_worker"]
    fc = [r for r, role in ctx.roles.items() if role.kind == "fc_worker"]
    g_conv = dist.new_group(conv) if len(conv) > 1 else None
    g_fc = dist.new_group(fc) if len(fc) > 1 else None
    return g_conv, g_fc


class ConvWorker(RoleBase):
    def __init__(self, ctx, split, g_conv):
        import torch

        super().__init__(ctx)
        self.head = split.head.to(ctx.device)
        self.params = list(self.head.parameters())
        self.n_params = sum(p.numel() for p in self.params)
        self.opt = self.sgd(self.params)
        self.group = g_conv
        self.ddp = None
        if g_conv is not None and ctx.spec.config.get("overlap", True):
            from torch.nn.parallel import DistributedDataParallel as DDP

            dev = [ctx.device.index] if ctx.device.type == "cuda" else None
            # the CONV workers' own BatchNorm statistics, as before DDP (no buffer broadcast)
            self.ddp = DDP(self.head, device_ids=dev, process_group=g_conv, broadcast_buffers=False)
            # summed, not averaged: the FC worker's loss is already divided by the global batch
            self.buckets = DdpBuckets(self.meter, divisor=1, group=g_conv)
            self.ddp.register_comm_hook(self.buckets, counting_hook)
        self.fc = ctx.role.peers[0]
        self.backup_size = sum(p.numel() for p in split.tail.parameters())
        self.keeps_backup = ctx.roles[self.fc].peers[0] == ctx.rank
        self.fc_backup = None
        self._dtype = next(iter(split.tail.parameters()), torch.empty(0)).dtype

    def step(self, s: int) -> None:
        import torch

        x = self.inputs(s)
        with self.meter.compute():
            h = (self.ddp or self.head)(x)
            act = h.detach().contiguous()
            grad = torch.empty_like(act)
        self.meter.mark("conv_fwd")  # the schedule's tasks (strategies/stanza.py) that end here
        self.wait([self.isend(act, self.fc, tag(s, ACT)), self.irecv(grad, self.fc, tag(s, GRAD))])
        self.meter.mark("act_grads")
        self.opt.zero_grad(set_to_none=True)
        if self.ddp is None:  # Stanza's schedule: the all-reduce after the backward pass
            with self.meter.compute():
                h.backward(grad)
                if self.group is not None:
                    g = flat_grads(self.params, out=self.scratch("grad", (self.n_params,), self.params[0].dtype))
            self.meter.mark("conv_bwd")
            if self.group is not None:
                self.all_reduce(g, group=self.group)
                self.meter.mark("conv_allreduce")
                with self.meter.compute():
                    set_grads(self.params, g)
            with self.meter.compute():
                self.opt.step()
            return
        self.buckets.intervals = []
        t0 = time.perf_counter()
        h.backward(grad)  # DDP: returns once every bucket is all-reduced
        t_bwd = time.perf_counter()
        self.meter.mark("conv_unbucket")
        self.opt.step()
        self.buckets.record_times(t0, t_bwd, time.perf_counter())

    def checkpoint_comm(self, s: int) -> None:
        import torch

        if not self.keeps_backup:
            return
        import torch.distributed as dist

        buf = torch.empty(self.backup_size, dtype=self._dtype, device=self.ctx.device)
        dist.irecv(buf, src=self.fc, tag=tag(s, BACKUP)).wait()
        self.fc_backup = {"fc_rank": self.fc, "step": s + 1, "params": buf.cpu()}

    def state_dict(self) -> dict:
        d = {"head": self.head.state_dict(), "opt": self.opt.state_dict()}
        if self.fc_backup is not None:
            d["fc_backup"] = self.fc_backup
        return d

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        self.load_sgd(self.opt, state["opt"])
        self.fc_backup = state.get("fc_backup")

    def owned_params(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.head.named_parameters()}


class FcWorker(RoleBase):
    def __init__(self, ctx, split, g_fc, act):
        super().__init__(ctx)
        self.tail = split.tail.to(ctx.device)
        self.params = list(self.tail.parameters())
        self.n_params = sum(p.numel() for p in self.params)
        self.opt = self.sgd(self.params)
        self.group = g_fc
        self.convs = ctx.role.peers
        self.act_shape, self.act_dtype = act
        self.k = ctx.spec.batch_size

    def step(self, s: int) -> None:
        import torch
        import torch.nn.functional as F

        bufs = [torch.empty((self.k, *self.act_shape), dtype=self.act_dtype, device=self.ctx.device)
                for _ in self.convs]
        works = [self.irecv(b, c, tag(s, ACT)) for b, c in zip(bufs, self.convs)]
        y = torch.cat([self.labels_of(c, s) for c in self.convs])
        self.wait(works)
        self.meter.mark("activations")  # the schedule's tasks (strategies/stanza.py) that end here
        with self.meter.compute():
            a = torch.cat(bufs).requires_grad_(True)
            out = self.tail(a)
            loss = F.cross_entropy(out, y, reduction="sum") / self.ctx.global_batch
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            slices = [g.contiguous() for g in a.grad.split(self.k)]
        self.meter.mark("fc_fwd_bwd")
        sends = [self.isend(g, c, tag(s, GRAD)) for g, c in zip(slices, self.convs)]
        if self.group is not None:
            with self.meter.compute():
                g = flat_grads(self.params, out=self.scratch("grad", (self.n_params,), self.params[0].dtype))
            self.all_reduce(g, group=self.group)
            with self.meter.compute():
                set_grads(self.params, g)
        self.wait(sends)
        with self.meter.compute():
            self.opt.step()
        self.meter.loss(loss.item(), shown=loss.item() * self.ctx.global_batch / (self.k * len(self.convs)))

    def checkpoint_comm(self, s: int) -> None:
        import torch.distributed as dist

        flat = flat_params(self.params).contiguous()
        self.meter.checkpoint_bytes_sent += flat.numel() * flat.element_size()
        dist.isend(flat, dst=self.convs[0], tag=tag(s, BACKUP)).wait()

    def state_dict(self) -> dict:
        return {"tail": self.tail.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.tail.load_state_dict(state["tail"])
        self.load_sgd(self.opt, state["opt"])

    def owned_params(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.tail.named_parameters()}


def activation_shape(ctx, split):
    """(per-sample shape, dtype) of the split layer's output (a dry forward of one sample in eval
    mode, so no BatchNorm statistics change)."""
    import torch

    head = split.head
    was = head.training
    head.eval()
    with torch.no_grad():
        out = head(torch.zeros((1, *ctx.net.input_shape), dtype=ctx.sharder.dtype))
    head.train(was)
    return tuple(out.shape[1:]), out.dtype


def make(ctx) -> RoleBase:
    from layerplan.runtime.model import split_layer
    from layerplan.runtime.split import split_module

    split = split_module(ctx.module, split_layer(ctx.spec, ctx.net))
    g_conv, g_fc = groups(ctx)
    if ctx.role.kind == "conv_worker":
        return ConvWorker(ctx, split, g_conv)
    return FcWorker(ctx, split, g_fc, activation_shape(ctx, split))
