"""Omnivore's compute groups with a merged FC server (SYSTEMS.md §3; Omnivore §IV-A, §V-A).

Layout (``layout.py``): N conv machines in g contiguous groups of k = N/g, the merged FC server,
the conv model server — the nodes ``strategies/groups.py`` schedules, so a prediction describes
the run. Every message goes where the schedule sends it:

- conv machine (group j, iteration s): receive the conv model from the conv model server (pull);
  head forward on its B samples; send the boundary activations to the FC server; receive their
  gradient; head backward; send its conv gradient to the conv model server (push). Inside a group
  this is synchronous data parallelism on one group batch of k·B samples: the FC server serves the
  group batch whole and the conv model server sums the k gradients into one update.
- merged FC server: serves whole group batches **in arrival order** (a group batch has arrived
  when all k of its machines' activations have): loss = sum of cross-entropy / (k·B), FC forward,
  backward, SGD step on the FC model, the activation gradients back to the group's machines. One
  group batch at a time, so the FC model is never stale (Omnivore §V-A).
- conv model server: applies group pushes in arrival order (the k gradients summed, SGD with the
  run's lr, momentum and weight decay) and sends the updated model to the group that pushed, which
  is its next pull — one group's pull and one group's push on its link at a time, the others
  waiting in turn (``ConvModelServer``). It counts the **staleness** of every update: how many
  other groups' updates were applied between the model the group pulled and its push (Omnivore
  §IV-A: S = g − 1 when groups take turns).

Steps: every group does ``spec.steps`` iterations; one step is one round (each group one
iteration, N·B samples), as the engine counts ``samples_per_step``. A server's step serves the
next g arrivals, whichever groups they come from, so the servers know how many updates to expect
(g·steps) and the run ends without a hang. Group j's iteration s reads its machines' slices of
global batch s, so with g = 1 the run is synchronous SGD on the global batch, exactly the
single-process reference. Per-step losses are the mean of the g group-batch losses of iteration s;
``group_updates`` lists every FC update (order served, group, iteration, loss).

Arrival order: gloo's point-to-point Work reports ``is_completed()`` only after ``wait()``, so a
server cannot poll its receives. Each server posts its receives from explicit sources with
per-iteration tags and hands them to a waiter thread per expected group message; the thread blocks
in ``wait()`` (which releases the GIL) and queues the group when all k receives are done — the
queue's order is the arrival order.

BatchNorm running statistics stay on each conv machine (as in data parallelism without
SyncBatchNorm); the conv model server holds the parameters. Bytes per step: conv machine B·A
(activations) + P_c (gradient) sent; FC server N·B·A; conv model server N·P_c. A server counts
the bytes of an update in the step that serves it (the conv model server: the pull that fed it and
its push; the FC server: the group batch and its gradients), so a server's step — g updates —
carries exactly one round's bytes, whenever the messages actually moved.

Checkpoints: after the last step only (RunSpec rejects ``checkpoint_every``): then every group has
done every iteration and every message has arrived, a consistent cut — the conv model server's
model and momentum, the FC server's, each conv machine's BatchNorm statistics. A run that starts
from one (``resume``, or ``init_from`` with other groups, momentum or learning rate: Omnivore's
optimizer continues every trial from the current model) starts every group at that iteration.
Not run here: pipelining (two batches in flight per group).
"""

from __future__ import annotations

import queue
import threading
import time

from layerplan.runtime.roles import RoleBase, flat_grads, flat_params, set_params, summed, tag

PULL, ACT, GRAD, PUSH, READY = 0, 1, 2, 3, 4


def members(ctx) -> list[list[int]]:
    """Group j → its conv machines' ranks, in batch order."""
    out: dict[int, list[int]] = {}
    for r, role in ctx.roles.items():
        if role.kind == "conv_machine":
            out.setdefault(role.group, []).append(r)
    return [out[j] for j in sorted(out)]


class Arrivals:
    """Group messages in the order they complete (see the module docstring)."""

    def __init__(self, timeout_s: float):
        self._q: queue.Queue = queue.Queue()
        self._timeout_s = timeout_s

    def expect(self, group: int, works: list, payload) -> None:
        """``works`` (kept referenced with ``payload`` until taken) complete group ``group``'s message."""
        threading.Thread(target=self._wait, args=(group, works, payload), daemon=True).start()

    def _wait(self, group: int, works: list, payload) -> None:
        try:
            for w in works:
                w.wait()
        except BaseException as e:  # noqa: BLE001 — handed to the server thread, which raises it
            self._q.put((group, payload, e))
            return
        self._q.put((group, payload, None))

    def next(self):
        """(group, payload) of the next completed group message."""
        try:
            group, payload, err = self._q.get(timeout=self._timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no group message arrived within {self._timeout_s:.0f} s") from None
        if err is not None:
            raise err
        return group, payload


class _Sends:
    """A server's sends to each group, in flight until reaped: a server waits for them only when the
    group's next message shows they arrived, never as a barrier between steps (which would hold
    every group back to the slowest's transfers and keep them in lockstep)."""

    pending: list[list]

    def _reap(self, j: int) -> None:
        """Wait for (once: gloo counts each wait as one completion) and forget group j's sends."""
        sends, self.pending[j] = self.pending[j], []
        self.wait([w for w, _ in sends])


class ConvMachine(RoleBase):
    def __init__(self, ctx, split):
        super().__init__(ctx)
        self.head = split.head.to(ctx.device)
        self.params = list(self.head.parameters())
        self.fc, self.conv_model = ctx.role.peers
        self.n_params = sum(p.numel() for p in self.params)
        # the conv model server sends one group's pull at a time (ConvModelServer): with several
        # groups, each machine says when its pull has arrived
        self.say_ready = len(members(ctx)) > 1

    def step(self, s: int) -> None:
        import torch
        import torch.distributed as dist

        model = self.scratch("model", (self.n_params,), self.params[0].dtype)
        self.wait([self.irecv(model, self.conv_model, tag(s, PULL))])
        if self.say_ready:  # a one-element control message, not counted as the step's bytes
            self.wait([dist.isend(self.scratch("ready", (1,), model.dtype), self.conv_model, tag=tag(s, READY))])
        x = self.inputs(s)
        with self.meter.compute():
            set_params(self.params, model)
            h = self.head(x)
            act = h.detach().contiguous()
            grad = torch.empty_like(act)
        self.wait([self.isend(act, self.fc, tag(s, ACT)), self.irecv(grad, self.fc, tag(s, GRAD))])
        with self.meter.compute():
            for p in self.params:
                p.grad = None
            h.backward(grad)
            g = flat_grads(self.params, out=self.scratch("grad", (self.n_params,), self.params[0].dtype))
        self.wait([self.isend(g, self.conv_model, tag(s, PUSH))])

    def state_dict(self) -> dict:
        return {"buffers": {k: v.clone() for k, v in self.head.named_buffers()}}  # BatchNorm statistics

    def load_state_dict(self, state: dict) -> None:
        import torch

        with torch.no_grad():
            for k, v in self.head.named_buffers():
                v.copy_(state["buffers"][k])


class FcServer(_Sends, RoleBase):
    def __init__(self, ctx, split, act):
        super().__init__(ctx)
        self.tail = split.tail.to(ctx.device)
        self.params = list(self.tail.parameters())
        self.opt = self.sgd(self.params)
        self.groups = members(ctx)
        self.act_shape, self.act_dtype = act
        self.b = ctx.spec.batch_size
        self.next_iter = [0] * len(self.groups)  # the iteration each group's next batch belongs to
        self.arrivals = Arrivals(ctx.spec.timeout_s)
        self.updates: list[dict] = []
        self.meter.extra["group_updates"] = self.updates
        self.pending: list[list] = [[] for _ in self.groups]  # each group's gradient sends in flight
        self._started = False
        self.t0 = time.perf_counter()

    def _expect(self, j: int) -> None:
        import torch
        import torch.distributed as dist

        it = self.next_iter[j]
        bufs = [torch.empty((self.b, *self.act_shape), dtype=self.act_dtype, device=self.ctx.device)
                for _ in self.groups[j]]
        works = [dist.irecv(buf, src=r, tag=tag(it, ACT)) for buf, r in zip(bufs, self.groups[j])]
        self.arrivals.expect(j, works, bufs)

    def step(self, s: int) -> None:
        import torch
        import torch.nn.functional as F

        if not self._started:
            self._started = True
            for j in range(len(self.groups)):
                self._expect(j)
        for _ in range(len(self.groups)):
            with self.meter.comm():
                j, bufs = self.arrivals.next()
            for buf in bufs:
                self.meter.recv(buf)
            # group j's last gradients have arrived (it sent this batch after them): done at once
            self._reap(j)
            it = self.next_iter[j]
            ranks = self.groups[j]
            with self.meter.compute():
                y = torch.cat([self.labels_of(r, it) for r in ranks])
                a = torch.cat(bufs).requires_grad_(True)
                loss = F.cross_entropy(self.tail(a), y, reduction="sum") / (len(ranks) * self.b)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                slices = [g.contiguous() for g in a.grad.split(self.b)]
            self.pending[j] = [(self.isend(g, r, tag(it, GRAD)), g) for g, r in zip(slices, ranks)]
            with self.meter.compute():
                self.opt.step()
            self.next_iter[j] += 1
            if self.next_iter[j] < self.ctx.spec.steps:
                self._expect(j)
            value = loss.item()
            self.updates.append({"order": len(self.updates), "group": j, "iteration": it, "loss": value,
                                 "t_s": time.perf_counter() - self.t0})
            self.meter.step_loss(it, value / len(self.groups))
        if s == self.ctx.spec.steps - 1:  # no barrier between steps: the groups stay asynchronous
            for j in range(len(self.groups)):
                self._reap(j)

    def state_dict(self) -> dict:
        return {"tail": self.tail.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.tail.load_state_dict(state["tail"])
        self.load_sgd(self.opt, state["opt"])

    def resume_at(self, step: int) -> None:
        self.next_iter = [step] * len(self.groups)

    def owned_params(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.tail.named_parameters()}


class ConvModelServer(_Sends, RoleBase):
    """Applies group pushes in arrival order and sends each group its next pull — one group's pull
    and one group's push on its link at a time. A pull goes out once the previous one's machines
    have said (a one-element READY message) that it arrived; pulls due meanwhile wait in arrival
    order. A push comes in once the previous one has: its receives are posted then (gloo's send
    waits for them), in the order the pulls went out. Sent at once, pulls due together share this
    server's egress and all arrive late, their groups push together, and the groups fall into
    lockstep: g pulls, then g pushes, each direction of the link idle while the other works
    (measured on the emulated cluster at 100 Mbit/s: vgg16_cifar, 2 machines in 2 groups, 15 s a
    round where one group's pull riding another's push gives 10 s). Pushes let in together drift
    the same way where a group has k ≥ 2 machines: their k flows share the ingress unevenly, the
    group's slowest push gates its next pull, the next group's push catches up with it and the
    egress idles (traced: alexnet_cifar, 4 machines in 2 groups, 1.3 s of an idle egress in a 4.1 s
    round). One at a time, the first groups start one pull apart and stay so: a group's pull meets
    another's push on the link's other direction. The schedule (strategies/groups.py) starts the
    groups the same way. A send's completion cannot stand in for the READY: gloo completes it once
    the bytes are in the kernel's socket buffers, megabytes before they arrive."""

    def __init__(self, ctx, split):
        import collections

        import torch

        super().__init__(ctx)
        named = list(split.head.named_parameters())
        self.names = [(k, tuple(v.shape), v.numel()) for k, v in named]
        self.w = torch.nn.Parameter(flat_params([v for _, v in named]).clone().to(ctx.device))
        self.opt = self.sgd([self.w])
        self.groups = members(ctx)
        self.next_iter = [0] * len(self.groups)
        self.version = 0  # updates applied so far
        self.pulled_at = [0] * len(self.groups)  # version each group's current pull carried
        self.arrivals = Arrivals(ctx.spec.timeout_s)
        self.staleness: list[dict] = []
        self.pending: list[list] = [[] for _ in self.groups]  # each group's model sends in flight
        self.due: collections.deque[int] = collections.deque()  # groups whose pull waits for the link
        self.pulling: int | None = None  # the group whose pull is on the link (not yet READY)
        self.push_due: collections.deque[int] = collections.deque()  # groups whose push waits for the link
        self.pushing: int | None = None  # the group whose push may come in now
        self._started = False
        self.t0 = time.perf_counter()
        ctx.module = None  # the server keeps the flat conv model only

    def _pull(self, j: int) -> None:
        """Group j's next pull: now when the link is free, else after the pulls due before it."""
        if self.pulling is None:
            self._send_model(j)
        else:
            self.due.append(j)

    def _send_model(self, j: int) -> None:
        import torch
        import torch.distributed as dist

        # the model keeps changing while the sends are in flight: group j's own copy, reused once
        # its previous sends were reaped (its push arrived)
        shape, dtype = self.w.shape, self.w.dtype
        with torch.no_grad():
            snapshot = self.scratch(f"snapshot{j}", shape, dtype).copy_(self.w)
        it = self.next_iter[j]
        self.pending[j] = [(dist.isend(snapshot, dst=r, tag=tag(it, PULL)), snapshot) for r in self.groups[j]]
        self.pulled_at[j] = self.version
        if self.pushing is None:
            self._receive_push(j)
        else:
            self.push_due.append(j)
        if len(self.groups) > 1:
            self.pulling = j
            ready = [self.scratch(f"ready{r}", (1,), dtype) for r in self.groups[j]]
            self.arrivals.expect(("ready", j), [dist.irecv(t, src=r, tag=tag(it, READY))
                                                for t, r in zip(ready, self.groups[j])], ready)

    def _receive_push(self, j: int) -> None:
        """Post the receives of group j's next push: its machines' sends wait for them (gloo's send
        is a rendezvous), so only this group's push comes in until it has arrived."""
        import torch.distributed as dist

        it = self.next_iter[j]
        bufs = [self.scratch(f"push{j}.{i}", self.w.shape, self.w.dtype) for i in range(len(self.groups[j]))]
        self.arrivals.expect(j, [dist.irecv(buf, src=r, tag=tag(it, PUSH)) for buf, r in zip(bufs, self.groups[j])],
                             bufs)
        self.pushing = j

    def _next_push(self):
        """(group, pushed gradients) of the next push to arrive — the next push due then may come
        in; READYs met meanwhile free the link for the next pull due."""
        while True:
            j, bufs = self.arrivals.next()
            if not isinstance(j, tuple):
                self.pushing = None
                if self.push_due:
                    self._receive_push(self.push_due.popleft())
                return j, bufs
            self._ready()

    def _ready(self) -> None:
        """The pull on the link has arrived: the next one due goes out."""
        self.pulling = None
        if self.due:
            self._send_model(self.due.popleft())

    def step(self, s: int) -> None:
        if not self._started:
            self._started = True
            for j in range(len(self.groups)):  # one after another (the class docstring)
                self._pull(j)
        for _ in range(len(self.groups)):
            with self.meter.comm():
                j, bufs = self._next_push()
            # group j pushed after receiving its last pull: those sends are done at once
            self._reap(j)
            for buf in bufs:  # this update's bytes: the pull that fed it and its push (module docstring)
                self.meter.sent(buf)
                self.meter.recv(buf)
            with self.meter.compute():
                # the group's gradient: the k machines' parts of one group batch, summed
                self.w.grad = summed(bufs, self.scratch("grad", bufs[0].shape, bufs[0].dtype))
                self.opt.step()
            self.staleness.append({"order": len(self.staleness), "group": j, "iteration": self.next_iter[j],
                                   "staleness": self.version - self.pulled_at[j], "t_s": time.perf_counter() - self.t0})
            self.version += 1
            self.next_iter[j] += 1
            if self.next_iter[j] < self.ctx.spec.steps:
                self._pull(j)
        if s == self.ctx.spec.steps - 1:  # no barrier between steps: the groups stay asynchronous
            while self.pulling is not None:  # the last pull's READY (every push is in)
                j, _ = self.arrivals.next()
                if not isinstance(j, tuple):
                    raise RuntimeError(f"group {j} pushed after its last iteration")
                self._ready()
            for j in range(len(self.groups)):
                self._reap(j)
            self.meter.extra["staleness"] = staleness_summary(self.staleness, len(self.groups))

    def state_dict(self) -> dict:
        return {"w": self.w.detach().clone(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        import torch

        with torch.no_grad():
            self.w.copy_(state["w"])
        self.load_sgd(self.opt, state["opt"])

    def resume_at(self, step: int) -> None:
        self.next_iter = [step] * len(self.groups)

    def owned_params(self) -> dict:
        out, off = {}, 0
        flat = self.w.detach().cpu()
        for name, shape, n in self.names:
            out[name] = flat[off:off + n].view(shape).clone()
            off += n
        return out


def staleness_summary(records: list[dict], groups: int) -> dict:
    """Median, mean, max and histogram {staleness: updates} of the measured staleness per update."""
    import statistics

    values = [r["staleness"] for r in records]
    hist: dict[str, int] = {}
    for v in sorted(values):
        hist[str(v)] = hist.get(str(v), 0) + 1
    return {"groups": groups, "updates": len(values), "expected": groups - 1,  # Omnivore §IV-A: S = g − 1
            "median": float(statistics.median(values)) if values else None,
            "mean": statistics.fmean(values) if values else None, "max": max(values, default=None),
            "histogram": hist, "per_update": records}


def make(ctx) -> RoleBase:
    from layerplan.runtime.model import split_layer
    from layerplan.runtime.roles.stanza import activation_shape
    from layerplan.runtime.split import split_module

    split = split_module(ctx.module, split_layer(ctx.spec, ctx.net))
    kind = ctx.role.kind
    if kind == "conv_machine":
        return ConvMachine(ctx, split)
    if kind == "fc_server":
        return FcServer(ctx, split, activation_shape(ctx, split))
    return ConvModelServer(ctx, split)
