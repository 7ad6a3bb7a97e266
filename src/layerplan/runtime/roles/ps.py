"""Parameter servers (SYSTEMS.md §4 Stanza §7.1 / Yan §4.2 / TF-style sharded PS), BSP.

n_w workers, n_s servers. Server j owns shard j of the flattened parameter vector (contiguous,
balanced by element count: ``layout.ps_shards``) and its momentum buffer. Per step each worker
computes the gradient of its batch (mean loss over its K samples) and pushes every shard's slice to
its server (isend); a server sums the n_w slices in worker order, averages, applies torch.optim.SGD
(momentum, weight decay) to its shard, and sends the updated shard back to every worker (pull).

Bytes per step (Stanza eq.6's 2·n_w·P/n_s per server): a worker sends P·4 (all gradients once)
and receives P·4; server j receives and sends n_w × |shard j|·4.
"""

from __future__ import annotations

from layerplan.runtime.layout import ps_shards
from layerplan.runtime.roles import RoleBase, flat_grads, flat_params, set_params, summed, tag

PUSH, PULL = 0, 1


class Worker(RoleBase):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.model = ctx.module.to(ctx.device)
        self.params = [p for p in self.model.parameters()]
        self.servers = ctx.role.peers
        self.shards = ps_shards(sum(p.numel() for p in self.params), len(self.servers))
        self.n_workers = len(ctx.roles[self.servers[0]].peers)
        self.n_params = sum(p.numel() for p in self.params)

    def step(self, s: int) -> None:
        import torch.nn.functional as F

        x, y = self.batch(s)
        with self.meter.compute():
            for p in self.params:
                p.grad = None
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            g = flat_grads(self.params, out=self.scratch("grad", (self.n_params,), self.params[0].dtype))
        self.meter.mark("fwd_bwd")  # the schedule's task (strategies/ps.py) that ends here
        new = self.scratch("params", g.shape, g.dtype)
        works = []
        for (a, b), srv in zip(self.shards, self.servers):
            works.append(self.isend(g[a:b], srv, tag(s, PUSH)))
            works.append(self.irecv(new[a:b], srv, tag(s, PULL)))
        self.wait(works)
        with self.meter.compute():
            set_params(self.params, new)
        self.meter.loss(loss.item() / self.n_workers, shown=loss.item())

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])

    def owned_params(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.model.named_parameters()}


class Server(RoleBase):
    def __init__(self, ctx):
        import torch

        super().__init__(ctx)
        params = list(ctx.module.parameters())
        shards = ps_shards(sum(p.numel() for p in params), _n_servers(ctx))
        self.a, self.b = shards[ctx.role.index]
        self.shard = torch.nn.Parameter(flat_params(params)[self.a:self.b].clone().to(ctx.device))
        self.opt = self.sgd([self.shard])
        self.workers = ctx.role.peers
        ctx.module = None  # the server keeps its shard only

    def step(self, s: int) -> None:
        shape, dtype = self.shard.shape, self.shard.dtype
        bufs = [self.scratch(f"push{i}", shape, dtype) for i in range(len(self.workers))]
        works = [self.irecv(buf, w, tag(s, PUSH)) for buf, w in zip(bufs, self.workers)]
        self.wait(works)
        with self.meter.compute():
            g = summed(bufs, self.scratch("grad", shape, dtype))
            self.shard.grad = g.div_(len(bufs)) if len(bufs) > 1 else g
            self.opt.step()
            out = self.shard.detach()
        self.meter.mark("update")  # the schedule's task (strategies/ps.py) that ends here
        works = [self.isend(out, w, tag(s, PULL)) for w in self.workers]
        self.wait(works)

    def state_dict(self) -> dict:
        return {"shard": self.shard.detach().clone(), "range": (self.a, self.b), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        import torch

        if tuple(state["range"]) != (self.a, self.b):
            raise ValueError(f"checkpoint shard {state['range']} != this server's {(self.a, self.b)}")
        with torch.no_grad():
            self.shard.copy_(state["shard"])
        self.load_sgd(self.opt, state["opt"])


def _n_servers(ctx) -> int:
    return sum(1 for r in ctx.roles.values() if r.kind == "server")


def make(ctx) -> RoleBase:
    return Worker(ctx) if ctx.role.kind == "worker" else Server(ctx)
