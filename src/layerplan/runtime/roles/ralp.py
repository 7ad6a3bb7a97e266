"""RALP — resource-aware layer placement (SYSTEMS.md §5).

n_w workers run the head (up to the split: the configured layer, else the RALP profile's
``split_after``); the PS worker (rank n_w) holds the tail *and* the head's master parameters.

- Worker w: head forward on its K samples; isend the split activations to the PS worker; receive
  their gradient; head backward; push the head gradients (flattened) to the PS worker; pull the
  updated head parameters.
- PS worker: serves ONE worker at a time, in rank order — tail forward, loss (sum of
  cross-entropy / global batch), tail backward, isend that worker its activation gradient and
  post the receive of its head gradient (gloo moves a message's bytes once its receive is posted:
  posted after the serving, the n_w head gradients waited for it, alexnet_cifar 4 workers at
  1 Gbit/s 1.10 s a step) — then sums the head gradients of all workers (rank order) and applies
  one SGD step (momentum buffers live here) to head and tail, and sends the head parameters back
  to every worker.

The paper processes one worker's activations at a time "so forward and backward see the same
weights". Here the tail's gradients of the n_w workers are *accumulated* and the tail is updated
once per step, after every worker has been served: each worker's forward and backward still see
the same tail weights (those of the step), and the run equals synchronous SGD on the global batch
exactly — which an update after every worker would not.

Bytes per step: a worker sends K·A·4 activations + P_head·4 head gradients and receives the same;
the PS worker n_w times that.
"""

from __future__ import annotations

from layerplan.runtime.roles import RoleBase, flat_grads, flat_params, set_grads, set_params, summed, tag

ACT, ACT_GRAD, HEAD_GRAD, HEAD_PARAMS = 0, 1, 2, 3


class Worker(RoleBase):
    def __init__(self, ctx, split):
        super().__init__(ctx)
        self.head = split.head.to(ctx.device)
        self.params = list(self.head.parameters())
        self.ps = ctx.role.peers[0]
        self.n_params = sum(p.numel() for p in self.params)

    def step(self, s: int) -> None:
        import torch

        x = self.inputs(s)
        with self.meter.compute():
            h = self.head(x)
            act = h.detach().contiguous()
            grad = torch.empty_like(act)
        self.meter.mark("head_fwd")  # the schedule's tasks (strategies/ralp.py) that end here
        self.wait([self.isend(act, self.ps, tag(s, ACT)), self.irecv(grad, self.ps, tag(s, ACT_GRAD))])
        if not self.params:
            return
        with self.meter.compute():
            for p in self.params:
                p.grad = None
            h.backward(grad)
            g = flat_grads(self.params, out=self.scratch("grad", (self.n_params,), self.params[0].dtype))
            new = self.scratch("params", g.shape, g.dtype)
        self.meter.mark("head_bwd")
        self.wait([self.isend(g, self.ps, tag(s, HEAD_GRAD)), self.irecv(new, self.ps, tag(s, HEAD_PARAMS))])
        with self.meter.compute():
            set_params(self.params, new)

    def state_dict(self) -> dict:
        return {"head": self.head.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])

    def owned_params(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.head.named_parameters()}


class PsWorker(RoleBase):
    def __init__(self, ctx, split, act):
        super().__init__(ctx)
        self.head = split.head.to(ctx.device)  # master copy of the head's parameters; never run here
        self.tail = split.tail.to(ctx.device)
        self.head_params = list(self.head.parameters())
        self.tail_params = list(self.tail.parameters())
        self.opt = self.sgd(self.head_params + self.tail_params)
        self.workers = ctx.role.peers
        self.act_shape, self.act_dtype = act
        self.k = ctx.spec.batch_size
        self.n_head = sum(p.numel() for p in self.head_params)

    def step(self, s: int) -> None:
        import torch
        import torch.nn.functional as F

        dev = self.ctx.device
        acts = [torch.empty((self.k, *self.act_shape), dtype=self.act_dtype, device=dev) for _ in self.workers]
        act_works = [self.irecv(a, w, tag(s, ACT)) for a, w in zip(acts, self.workers)]
        labels = [self.labels_of(w, s) for w in self.workers]
        self.opt.zero_grad(set_to_none=True)
        sends = []
        hgrads = ([self.scratch(f"head_grad{i}", (self.n_head,), self.head_params[0].dtype) for i in range(len(self.workers))]
                  if self.n_head else [])
        hg_works = []
        total = 0.0
        for i, (w, a, work, y) in enumerate(zip(self.workers, acts, act_works, labels)):  # one worker at a time, rank order
            self.wait([work])
            with self.meter.compute():
                a.requires_grad_(True)
                loss = F.cross_entropy(self.tail(a), y, reduction="sum") / self.ctx.global_batch
                loss.backward()
                total += loss.item()
            self.meter.mark("tail_fwd_bwd")  # the schedule's tasks (strategies/ralp.py): the last worker's ends here
            sends.append(self.isend(a.grad, w, tag(s, ACT_GRAD)))
            # this worker's head gradient may come in while the next ones are served (a transport
            # moves a message once its receive is posted); posted after its activation gradient, as
            # NCCL runs one pair's p2p operations in order
            if self.n_head:
                hg_works.append(self.irecv(hgrads[i], w, tag(s, HEAD_GRAD)))
        if self.n_head:
            self.wait(hg_works)
            with self.meter.compute():
                set_grads(self.head_params, summed(hgrads, self.scratch("head_grad", (self.n_head,), self.head_params[0].dtype)))
        self.wait(sends)
        with self.meter.compute():
            self.opt.step()
            new = flat_params(self.head_params).contiguous() if self.n_head else None
        self.meter.mark("update")
        if self.n_head:
            self.wait([self.isend(new, w, tag(s, HEAD_PARAMS)) for w in self.workers])
        self.meter.loss(total, shown=total)  # the PS worker sees the whole global batch

    def state_dict(self) -> dict:
        return {"head": self.head.state_dict(), "tail": self.tail.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        self.tail.load_state_dict(state["tail"])
        self.load_sgd(self.opt, state["opt"])

    def owned_params(self) -> dict:
        d = {k: v.detach().cpu() for k, v in self.head.named_parameters()}
        d.update({k: v.detach().cpu() for k, v in self.tail.named_parameters()})
        return d


def make(ctx) -> RoleBase:
    from layerplan.runtime.model import split_layer
    from layerplan.runtime.roles.stanza import activation_shape
    from layerplan.runtime.split import split_module

    split = split_module(ctx.module, split_layer(ctx.spec, ctx.net))
    if ctx.role.kind == "worker":
        return Worker(ctx, split)
    return PsWorker(ctx, split, activation_shape(ctx, split))
