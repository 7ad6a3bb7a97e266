"""hybrid — data-parallel conv phase, model-parallel FC phase ("One Weird Trick", Krizhevsky 2014;
Yan et al. KDD'15 §6.4 for partitioning vs replicating a layer). SYSTEMS.md §1, §2, §6.

The communication is exactly what ``strategies/hybrid.py``'s schedule charges (the same layouts and
moves; tests compare the bytes per role). Ranks (``layout``): n_c CONV workers, then n_f FC machines.
The CONV workers run everything up to the first fc layer of the FC phase (``model.hybrid_phase``);
the FC phase runs as blocks, one per fc layer with the element-wise layers that follow it. A block is

- **partitioned** (default when n_f > 1): FC machine j holds output features ``feature_slices(F,
  n_f)[j]`` of the fc layer (a row slice of its weight and bias, as an nn.Linear of its own) and
  computes them for the whole global batch G = n_c·K. Its input must be on every FC machine in full
  ("full" layout); its output is a feature slice of G samples ("feature");
- **replicated** (its fc layer in ``replicate``, or n_f = 1): every FC machine holds the whole block
  and runs it on its rows of the batch ("batch" layout: FC machine j holds the samples of its block
  of CONV workers, ``layout``); its weight gradients are all-reduced (sum) among the FC machines.

Per step, forward:

- CONV worker i: conv phase on its K samples; isend the activations (K·A values) to every FC
  machine when the first block is partitioned, else to the FC machine holding its rows.
- FC machine: receive them (all n_c CONV workers' for a partitioned first block, its own block's
  otherwise), then per block: move its input to the layout the block needs — feature → full:
  all-gather of the slices; batch → full: all-gather of the rows; feature → batch: a transpose
  (machine k gets its rows of my slice) —, run the block. The loss needs whole rows of logits:
  a partitioned last block's logits are transposed to the batch layout.
- Loss on FC machine j = Σ cross-entropy over its rows / G, so the summed gradients equal
  single-process SGD on the global batch.

Backward, in reverse, each move's twin: logit gradients transposed back; a partitioned block's
input gradient is a *partial* sum over its output slice, reduced on the way back — to the previous
block's slices or rows (reduce-scatter: each machine sends every other machine that machine's part
of its partial, and sums what it receives, in FC-machine order), to the CONV workers (each FC
machine sends every CONV worker its K rows; the CONV worker sums the n_f partials in FC-machine
order); a replicated block's input gradient goes back as rows (transpose back to a partitioned
previous block, nothing to a replicated one, its own K rows to each CONV worker of its block).
A replicated block's weight gradients are all-reduced (async, on the FC subgroup) as soon as its
backward is done, overlapping the rest; the CONV workers all-reduce their gradients (conv subgroup)
after their backward. Then every rank applies torch.optim.SGD to what it holds.

Subgroups are created on every rank in the same order (CONV group, then FC group). Messages of
zero elements (an FC machine holding no rows when n_f > n_c) are not sent.

``owned_params``: CONV workers and replicated blocks return parameters under their names; a
partitioned fc layer's slice j comes back as ``"<name>[lo:hi]"`` (rows lo..hi−1 of the full weight
or bias, dim 0); ``reference.load_params`` concatenates the slices of all FC machines back into the
full tensor.

Bytes per step (payload rule, metrics.py), A = per-sample activation values at the boundary, K the
batch per CONV worker: CONV worker n_f·K·A (partitioned first block) or K·A, plus P_conv when
n_c > 1; FC machines (mean over them): n_c·K·A (partitioned first block) or n_c·K·A/n_f back to
the CONV workers, (n_f−1)/n_f·G·X per all-gather or reduce-scatter of X values per sample,
(n_f−1)/n_f²·G·X per transpose, and P_block per replicated block with parameters when n_f > 1.
"""

from __future__ import annotations

from layerplan.runtime.roles import RoleBase, flat_grads, set_grads
from layerplan.runtime.roles.stanza import groups  # the same CONV and FC process groups

ACT, GRAD, LOGITS_FWD, LOGITS_BWD = 0, 1, 2, 3
PHASES = 64


def htag(step: int, phase: int) -> int:
    """Message tag of (step, phase) with room for 30 fc blocks (forward and backward move each)."""
    return (step % (1 << 20)) * PHASES + phase


def fwd_phase(block: int) -> int:
    return 4 + 2 * block


def bwd_phase(block: int) -> int:
    return 5 + 2 * block


class ConvWorker(RoleBase):
    def __init__(self, ctx, head, g_conv, targets):
        super().__init__(ctx)
        self.head = head.to(ctx.device)
        self.params = list(self.head.parameters())
        self.n_params = sum(p.numel() for p in self.params)
        self.opt = self.sgd(self.params)
        self.group = g_conv
        self.targets = targets
        """FC machines the activations go to (ascending rank: partial gradients are summed in this order)."""

    def step(self, s: int) -> None:
        import torch

        x = self.inputs(s)
        with self.meter.compute():
            h = self.head(x)
            act = h.detach().contiguous()
            grads = [torch.empty_like(act) for _ in self.targets]
        self.meter.mark("conv_fwd")  # the schedule's tasks (strategies/hybrid.py) that end here
        works = [self.isend(act, f, htag(s, ACT)) for f in self.targets]
        works += [self.irecv(g, f, htag(s, GRAD)) for g, f in zip(grads, self.targets)]
        self.wait(works)
        with self.meter.compute():
            grad = grads[0]
            for g in grads[1:]:
                grad = grad + g
            self.opt.zero_grad(set_to_none=True)
            h.backward(grad)
            if self.group is not None:
                flat = flat_grads(self.params, out=self.scratch("grad", (self.n_params,), self.params[0].dtype))
        self.meter.mark("conv_bwd")
        if self.group is not None:
            self.all_reduce(flat, group=self.group)
            self.meter.mark("conv_allreduce")
            with self.meter.compute():
                set_grads(self.params, flat)
        with self.meter.compute():
            self.opt.step()

    def state_dict(self) -> dict:
        return {"head": self.head.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        self.load_sgd(self.opt, state["opt"])

    def owned_params(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.head.named_parameters()}


class Block:
    """One fc block as this FC machine runs it."""

    def __init__(self, spec_block, piece, in_shape, out_shape, n_f: int, j: int):
        from layerplan.runtime.layout import feature_slices

        self.fc = spec_block.fc
        self.partitioned = spec_block.partitioned
        self.piece = piece
        self.in_shape = tuple(in_shape)
        """Per-sample input shape (whole)."""
        self.out_shape = tuple(out_shape)
        """Per-sample output shape (whole)."""
        self.slices = feature_slices(self.out_shape[-1], n_f) if self.partitioned else None
        if self.partitioned:
            _slice_linear(piece, self.fc, *self.slices[j])
        self.params = list(piece.parameters())


def _slice_linear(piece, name: str, lo: int, hi: int) -> None:
    """Replace the nn.Linear ``name`` inside ``piece`` by one holding output features lo..hi−1."""
    import torch
    import torch.nn as nn

    lin = piece.get_submodule(name)
    if not isinstance(lin, nn.Linear):
        from layerplan.errors import ConfigError

        raise ConfigError(f"hybrid: {name!r} is a {type(lin).__name__}, not an nn.Linear; add it to replicate")
    part = nn.utils.skip_init(nn.Linear, lin.in_features, hi - lo, bias=lin.bias is not None,
                              device=lin.weight.device, dtype=lin.weight.dtype)
    with torch.no_grad():
        part.weight.copy_(lin.weight[lo:hi])
        if lin.bias is not None:
            part.bias.copy_(lin.bias[lo:hi])
    parent, _, leaf = name.rpartition(".")
    setattr(piece.get_submodule(parent) if parent else piece, leaf, part)


class FcMachine(RoleBase):
    def __init__(self, ctx, phase, pieces, shapes, g_fc):
        super().__init__(ctx)
        sp = ctx.spec
        self.n_c, self.n_f = sp.config["conv_workers"], sp.config["fc_workers"]
        self.j = ctx.role.index
        self.k = sp.batch_size
        self.G = ctx.global_batch
        self.fc_ranks = [self.n_c + q for q in range(self.n_f)]
        self.my_convs = ctx.role.peers
        # rows of the global batch each FC machine holds in the batch layout (layout.py)
        self.rows = [((q * self.n_c // self.n_f) * self.k, ((q + 1) * self.n_c // self.n_f) * self.k)
                     for q in range(self.n_f)]
        self.group = g_fc
        self.act_shape = shapes[0]
        self.blocks = [Block(b, piece.to(ctx.device), shapes[i], shapes[i + 1], self.n_f, self.j)
                       for i, (b, piece) in enumerate(zip(phase.blocks, pieces))]
        self.params = [p for b in self.blocks for p in b.params]
        self.opt = self.sgd(self.params)
        self.dtype = next(iter(self.params)).dtype

    # ---- moves between layouts --------------------------------------------------------------
    def _exchange(self, s: int, phase: int, outgoing: dict, incoming: dict) -> dict:
        """Send ``outgoing[q]`` to FC machine q and receive a tensor of shape ``incoming[q]`` from it,
        for every other machine q; returns the received tensors. The receives are posted before
        the sends: posted after them, gloo ran half such exchanges one direction after the other
        (roles/__init__.py)."""
        import torch

        got, works, keep = {}, [], []
        for q, shape in incoming.items():
            got[q] = torch.empty(shape, dtype=self.dtype, device=self.ctx.device)
            if got[q].numel():
                works.append(self.irecv(got[q], self.fc_ranks[q], htag(s, phase)))
        for q, t in outgoing.items():
            t = t.contiguous()
            keep.append(t)  # referenced until wait()
            if t.numel():
                works.append(self.isend(t, self.fc_ranks[q], htag(s, phase)))
        self.wait(works)
        return got

    def _others(self):
        return [q for q in range(self.n_f) if q != self.j]

    def _nrows(self, q: int) -> int:
        return self.rows[q][1] - self.rows[q][0]

    def gather_features(self, s, phase, y, slices):
        """feature → full: all-gather the feature slices of all G samples."""
        import torch

        got = self._exchange(s, phase, {q: y for q in self._others()},
                             {q: (*y.shape[:-1], hi - lo) for q, (lo, hi) in enumerate(slices) if q != self.j})
        with self.meter.compute():
            return torch.cat([y if q == self.j else got[q] for q in range(self.n_f)], dim=-1)

    def gather_rows(self, s, phase, y):
        """batch → full: all-gather the rows."""
        import torch

        got = self._exchange(s, phase, {q: y for q in self._others()},
                             {q: (self._nrows(q), *y.shape[1:]) for q in self._others()})
        with self.meter.compute():
            return torch.cat([y if q == self.j else got[q] for q in range(self.n_f)], dim=0)

    def features_to_rows(self, s, phase, y, slices):
        """feature → batch (transpose): machine q gets its rows of my slice."""
        import torch

        lo, hi = self.rows[self.j]
        got = self._exchange(s, phase, {q: y[self.rows[q][0]:self.rows[q][1]] for q in self._others()},
                             {q: (hi - lo, *y.shape[1:-1], b - a) for q, (a, b) in enumerate(slices) if q != self.j})
        with self.meter.compute():
            return torch.cat([y[lo:hi] if q == self.j else got[q] for q in range(self.n_f)], dim=-1)

    def rows_to_features(self, s, phase, g, slices):
        """batch → feature (the transpose's twin): machine q gets my rows of its slice."""
        import torch

        a, b = slices[self.j]
        got = self._exchange(s, phase, {q: g[..., slices[q][0]:slices[q][1]] for q in self._others()},
                             {q: (self._nrows(q), *g.shape[1:-1], b - a) for q in self._others()})
        with self.meter.compute():
            return torch.cat([g[..., a:b] if q == self.j else got[q] for q in range(self.n_f)], dim=0)

    def reduce_features(self, s, phase, g, slices):
        """partial → feature (reduce-scatter by features): sum every machine's partial of my slice."""
        a, b = slices[self.j]
        got = self._exchange(s, phase, {q: g[..., slices[q][0]:slices[q][1]] for q in self._others()},
                             {q: (*g.shape[:-1], b - a) for q in self._others()})
        with self.meter.compute():
            return _ordered_sum([g[..., a:b] if q == self.j else got[q] for q in range(self.n_f)])

    def reduce_rows(self, s, phase, g):
        """partial → batch (reduce-scatter by rows): sum every machine's partial of my rows."""
        lo, hi = self.rows[self.j]
        got = self._exchange(s, phase, {q: g[self.rows[q][0]:self.rows[q][1]] for q in self._others()},
                             {q: (hi - lo, *g.shape[1:]) for q in self._others()})
        with self.meter.compute():
            return _ordered_sum([g[lo:hi] if q == self.j else got[q] for q in range(self.n_f)])

    def forward_move(self, s, i, y):
        """The output of block i−1 to the layout block i needs."""
        prev, blk = self.blocks[i - 1], self.blocks[i]
        if blk.partitioned:
            if prev.partitioned:
                return self.gather_features(s, fwd_phase(i), y, prev.slices)
            return self.gather_rows(s, fwd_phase(i), y)
        if prev.partitioned:
            return self.features_to_rows(s, fwd_phase(i), y, prev.slices)
        return y

    def backward_move(self, s, i, g):
        """The input gradient of block i to the layout of block i−1's output."""
        prev, blk = self.blocks[i - 1], self.blocks[i]
        if blk.partitioned:
            if prev.partitioned:
                return self.reduce_features(s, bwd_phase(i), g, prev.slices)
            return self.reduce_rows(s, bwd_phase(i), g)
        if prev.partitioned:
            return self.rows_to_features(s, bwd_phase(i), g, prev.slices)
        return g

    def grads_to_conv(self, s, g, partitioned: bool) -> list:
        """Input gradients of the first block back to the CONV workers (works and their buffers)."""
        works = []
        if partitioned:  # a partial sum over my slice for every sample: each CONV worker gets its K rows
            for i in range(self.n_c):
                t = g[i * self.k:(i + 1) * self.k].contiguous()
                works.append((self.isend(t, i, htag(s, GRAD)), t))
        else:
            first = self.rows[self.j][0]
            for i in self.my_convs:
                t = g[i * self.k - first:(i + 1) * self.k - first].contiguous()
                works.append((self.isend(t, i, htag(s, GRAD)), t))
        return works

    # ---- one step -----------------------------------------------------------------------------
    def step(self, s: int) -> None:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        first = self.blocks[0]
        srcs = range(self.n_c) if first.partitioned else self.my_convs
        bufs = [torch.empty((self.k, *self.act_shape), dtype=self.dtype, device=self.ctx.device) for _ in srcs]
        works = [self.irecv(b, c, htag(s, ACT)) for b, c in zip(bufs, srcs)]
        labels = [self.labels_of(c, s) for c in self.my_convs]
        y = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=self.ctx.device)
        self.wait(works)
        with self.meter.compute():
            self.opt.zero_grad(set_to_none=True)
            x = torch.cat(bufs) if bufs else torch.empty((0, *self.act_shape), dtype=self.dtype, device=self.ctx.device)
        xs, outs = [], []
        for i, blk in enumerate(self.blocks):
            if i:
                x = self.forward_move(s, i, outs[-1].detach())
            with self.meter.compute():
                x = x.detach().requires_grad_(True)
                out = blk.piece(x)
            self.meter.mark(f"fwd_{blk.fc}")  # the schedule's tasks (strategies/hybrid.py) that end here
            xs.append(x)
            outs.append(out)
        last = self.blocks[-1]
        logits = outs[-1].detach()
        if last.partitioned:  # the loss needs whole rows
            logits = self.features_to_rows(s, LOGITS_FWD, logits, last.slices)
        with self.meter.compute():
            logits.requires_grad_(True)
            loss = F.cross_entropy(logits, y, reduction="sum") / self.G
            loss.backward()
            g = logits.grad
        if last.partitioned:
            g = self.rows_to_features(s, LOGITS_BWD, g, last.slices)
        reduces, sends = [], []
        for i in reversed(range(len(self.blocks))):
            blk = self.blocks[i]
            with self.meter.compute():
                outs[i].backward(g)
                gx = xs[i].grad
            self.meter.mark(f"bwd_{blk.fc}")
            if not blk.partitioned and self.group is not None and blk.params:
                with self.meter.compute():
                    flat = flat_grads(blk.params, out=self.scratch(f"grad{i}", (sum(p.numel() for p in blk.params),),
                                                                  blk.params[0].dtype))
                self.meter.collective(flat)
                reduces.append((blk, flat, dist.all_reduce(flat, group=self.group, async_op=True)))
            if i:
                g = self.backward_move(s, i, gx)
            else:
                sends = self.grads_to_conv(s, gx, blk.partitioned)
        self.wait([w for w, _ in sends] + [w for _, _, w in reduces])
        with self.meter.compute():
            for blk, flat, _ in reduces:
                set_grads(blk.params, flat)
            self.opt.step()
        self.meter.mark("fc_update")
        rows = self._nrows(self.j)
        part = loss.item()
        self.meter.loss(part, shown=part * self.G / rows if rows else None)

    def state_dict(self) -> dict:
        return {"blocks": [b.piece.state_dict() for b in self.blocks], "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for b, sd in zip(self.blocks, state["blocks"]):
            b.piece.load_state_dict(sd)
        self.load_sgd(self.opt, state["opt"])

    def owned_params(self) -> dict:
        out = {}
        for b in self.blocks:
            for name, p in b.piece.named_parameters():
                if b.partitioned and name.rpartition(".")[0] == b.fc:
                    lo, hi = b.slices[self.j]
                    name = f"{name}[{lo}:{hi}]"
                out[name] = p.detach().cpu()
        return out


def _ordered_sum(parts):
    total = parts[0]
    for t in parts[1:]:
        total = total + t
    return total


def shapes_of(ctx, pieces) -> list[tuple[int, ...]]:
    """Per-sample shapes: the CONV workers' output, then each block's output (a dry forward of one
    sample in eval mode, so no BatchNorm statistics change)."""
    import torch

    was = [p.training for p in pieces]
    out = []
    with torch.no_grad():
        h = torch.zeros((1, *ctx.net.input_shape), dtype=ctx.sharder.dtype)
        for p in pieces:
            p.eval()
            h = p(h)
            out.append(tuple(h.shape[1:]))
    for p, w in zip(pieces, was):
        p.train(w)
    return out


def make(ctx) -> RoleBase:
    from layerplan.runtime.model import hybrid_phase
    from layerplan.runtime.split import split_chain

    phase = hybrid_phase(ctx.spec, ctx.net)
    cuts = [phase.conv_end] + [b.layers[-1] for b in phase.blocks[:-1]]
    pieces = split_chain(ctx.module, cuts)
    g_conv, g_fc = groups(ctx)
    if ctx.role.kind == "conv_worker":
        n_c = ctx.spec.config["conv_workers"]
        fcs = tuple(range(n_c, n_c + ctx.spec.config["fc_workers"]))
        targets = fcs if phase.blocks[0].partitioned else ctx.role.peers[:1]
        return ConvWorker(ctx, pieces[0], g_conv, targets)
    return FcMachine(ctx, phase, pieces[1:], shapes_of(ctx, pieces), g_fc)
