"""The one cost engine: a ``StepGraph`` (what a strategy does in one step) → a ``Prediction``.

ARCHITECTURE.md principle 1: strategies describe a step — which tasks run on which node group,
which bytes cross which NICs, what depends on what — and this engine turns it into time.

**Symmetric node groups.** A graph names roles, each with a number of identical nodes
(``{"worker": 1024, "server": 64}``). Every node has its own compute device and its own NIC, full
duplex: egress and ingress each carry ``nic.bandwidth · nic.efficiency`` bytes/s, and where the link
says a direction keeps only ``nic.duplex_efficiency`` d of that while the other is busy too (TCP's
acknowledgements), the two together carry at most 2·d of it (one more shared resource per NIC,
"NIC both ways": one direction alone still runs at the full rate). A task runs on
every node of its group at once, all nodes alike, so the engine simulates one representative node
per group and flow *classes* with multiplicities instead of single flows: a PS step with 1,024
workers is four tasks, not a million flows.

**Tasks** (frozen dataclasses; each has a unique ``name``, ``deps`` that must finish first, a
``tag`` for the breakdown and an optional ``queue``):

- ``Compute(group, seconds)``: ``seconds`` is its duration alone on one device. Compute tasks
  active on one node at once share its device (processor sharing). With ``cluster.shared_cores``
  set, every active compute task of the whole cluster (one per node of its group) also shares that
  many cores: each runs at ``min(1, capacity / active)`` (one thread per task; the capacity is
  ``shared_core_capacity``, the cores' worth with all busy, calibrated or the presets'
  ``hardware.SHARED_CORE_SHARE``, else shared_cores). Moving bytes
  costs CPU too where the cluster says so: ``comm_cpu_s_per_byte`` at each end of every message
  and ``reduce_cpu_s_per_byte`` on half of an all-reduce's bytes (the reduction), drawn from the
  same shared cores — on an emulated cluster at 10 Gbit/s, TCP and gloo's copies and reductions
  take cores away from compute. Every collective call also waits ``collective_wait_s`` (its ranks
  meet: the step goes at the slowest rank's pace since the last call, and gloo's threads wake on
  cores busy with compute) but one that follows only collectives of its own group (its ranks just
  met), and so does a transfer that ``meets`` (a gather whose senders the receiver waits for:
  Stanza's and hybrid's activations); with more nodes in the step than shared cores, every collective round
  and every message also waits ``oversubscribed_wait_s`` (its receiver may be off its core), each
  node that sends or receives a transfer spends ``oversubscribed_message_cpu_s`` of CPU on it (it
  blocks and wakes on a busy core) — where the transfer starts while the compute running takes
  every core; with a core free, it wakes there (stanza's activations after the forward pass,
  a parameter server's pushes after the workers' backward, with every rank of the step waiting) —,
  a transfer that ``wakes`` its receivers (they blocked for it through a phase) waits that much
  more all the same, as they wake cold, and
  while more compute threads run than there are cores, the cores give
  ``oversubscribed_core_capacity`` (time slicing: each switch refills the caches); with as many or
  fewer, the messages' threads count by the cores' worth they take, the capacity moving linearly
  to the oversubscribed one as compute and messages add up to a thread more (``_oversubscribed_weight``). A link with a
  token bucket (``LinkSpec.burst_bytes``, the emulated cluster's tbf) passes bytes at once while
  its bucket holds a packet's worth, and the bucket refills with the rate the link leaves unused.
- ``Transfer(src, dst, bytes_per_flow, pattern)``: a class of flows between two groups.
  ``messages · latency_s`` pass before the bytes move. Patterns, with n_s / n_d nodes:

  ============ ==================================== =========== =========== ==============
  pattern      who sends to whom                    flows/src   flows/dst   flows in all
  ============ ==================================== =========== =========== ==============
  all_to_all   every src node to every dst node     n_d         n_s         n_s·n_d
               (src = dst: to every other node)     (n−1)       (n−1)       n·(n−1)
  spread       src nodes split evenly over dsts      1           ⌈n_s/n_d⌉   n_s
  broadcast    each dst node from one src node       ⌈n_d/n_s⌉   1           n_d
  within       src = dst, each node to another one   1           1           n
  ============ ==================================== =========== =========== ==============

  Uneven splits (n_s not a multiple of n_d) charge every node the busiest node's flow count: the
  step waits for the busiest one. Byte totals use the exact flow counts. ``share`` weighs the
  class's flows against others on the resources they share (weighted max-min; default 1).
- ``Collective(group, scheme, bytes)``: a ``collectives.SCHEMES`` scheme over the group's nodes,
  run as one coupled flow: ``rounds · latency_s``, then ``critical_bytes`` of progress, during
  which each node's egress carries ``send/critical`` and its ingress ``recv/critical`` bytes per
  byte of progress, and progress never runs faster than one NIC direction (the critical path
  crosses one NIC at a time). Alone on a NIC it takes exactly the closed form of
  ``collectives.py``; sharing a NIC, a tree's reduce-then-broadcast leaves on average half of each
  direction to other flows.
- ``Delay(seconds)``: a fixed wait (no resource).

Tasks sharing a ``queue`` name run one at a time, in the order they become ready (FIFO; ties in
the order the tasks are listed): a server that serves one batch at a time whoever sent it (RALP's
PS worker, Omnivore's merged FC server). A task of the queue that the end of the one before makes
ready goes next, ahead of those waiting: the server finishes what it started (the merged FC
server's SGD step after it has sent a group batch's gradients). Time waiting in the queue is not
part of the task. A queue serialises task classes: on a group of n nodes all n instances move in
lockstep.

Every role has nodes of its own: two roles never share a node's device or NIC (model a colocated
service inside the role that hosts it).

**Rates: max-min fair sharing** (progressive filling) of every resource — each group's per-node
device, NIC egress, NIC ingress, the shared core pool and the switch (when
``switch_bandwidth_bytes_per_s`` is set) — computed over task classes with multiplicities: the load
a class puts on one node's NIC is its per-flow rate × its flows per node. Rates are compared in
each activity's unit — a second of compute per second, a NIC's bandwidth of bytes per second. The
shared cores, which serve compute and the CPU side of transfers at once, are shared as Linux's CFS
shares them: per thread, each getting what it needs up to an equal share. A gloo thread that needs
0.06 of a core for its bytes at 1 Gbit/s gets it, however busy the compute threads keep the cores;
at 10 Gbit/s, where a flow's threads would need more than their share, they get their share
(``_max_min_rates``). Measured: vgg16_cifar stanza, 4 workers, 1 Gbit/s, 1.060 s a step; 1.022 s
predicted this way, 1.178 s when every activity froze at one common level in its own unit (the
all-reduce held to the compute threads' fraction of its NIC rate). Among flows this is byte-wise
max-min, each flow weighted by its ``share`` (TCP's uneven split among short flows leaving one NIC:
``LinkSpec.lead_share``). Event-driven: at each start or finish the rates are recomputed and time
advances to the next finish. Overlap of communication and computation happens wherever the deps
allow it; strategies express a runtime's real overlap (or the papers' lack of it) through deps.

**Groups out of phase** (``StepGraph.mean_field_cores``, Omnivore's asynchronous compute groups):
on shared cores the event-driven schedule lines up groups that share no clock the way the graph
lets them, with none of a run's jitter, and their compute overlaps less than it does in the run.
Such a graph is simulated again with every thread at a fixed speed, its mean over how many others
are busy, until the step settles: with a spread (below), over the threads the drawn schedule has
busy beside it (``_occupancy_field``); without one, each other group busy independently for its
share of the last pass's step (``_mean_field``).

**A run's spread** (``StepGraph.spread``): a run's stages do not take the same time every
iteration. Where groups pass stations in turn in a closed loop near balance, that costs time no
mean shows (a late group leaves the next station idle; an early one waits). Such a graph is
simulated over ``spread_iterations``, each compute task's time drawn (``simulate``).

**Iterations and steady state.** ``simulate(graph, cluster, iterations=k)`` unrolls k iterations:

- static form: ``graph.tasks`` is one iteration; task ``x`` of iteration i becomes ``it{i}/x``, a
  dep ``"x"`` means this iteration's ``x`` and ``"prev/x"`` the previous iteration's (dropped in
  iteration 0 and when k = 1). A graph whose tasks never use ``prev/`` cannot be unrolled (its
  iterations would not be ordered).
- builder form: ``graph.build(i)`` returns iteration i's tasks with their final names (use
  ``iteration_name(i, "x")`` for ``it{i}/x``); deps may name any task of iterations ≤ i.

With k = 1 the step time is the makespan. With k ≥ 2, F_i = the finish of the last task of
iteration i, m = k//2 − 1 and the **step time = (F_{k−1} − F_m)/(k − 1 − m)**: the mean over the
second half of the iterations, after the pipeline fills. Breakdown, bytes and utilisation are
measured over the same window and given per step. ``TAIL_ITERATIONS`` more iterations are
simulated after the k (neither measured nor in the timeline): in a long run the next iterations' tasks
compete for the links and queues while iteration k − 1 finishes, and without them the last
measured iteration ran alone. Omnivore's 4 groups of one machine at 100 Mbit/s queue their pulls
at the conv model server with one group an iteration behind the others; the last round, its
pull unqueued, ended a pull early, and the step came out 6% short of the 820 ms × 4 of the
steady state (3.08 s against 3.28 s; measured 3.30 s).

**Prediction**: step time, throughput (``samples_per_step`` / step time), per-role breakdown
(``compute_s`` = the union of the intervals in which the role's tasks tagged "compute" ran,
``comm_s`` the same for tasks tagged "comm" that the role sends or receives in; a task's interval
includes its latency phase, not queueing), bytes per step (wire bytes sent per node and per role,
received per node, the runtime's payload count, per link class, total; ``to_dict`` puts the
runtime's payload count under ``bytes_per_step.total``/``per_role``, as the Measurement does, and
the wire bytes under ``wire_*``), utilisation of every resource over the step, the bottleneck (the
resource saturated longest, e.g. "server NIC ingress (97% busy)"; "network latency" when latency
phases fill more of the step) and a timeline. ``Prediction.to_dict()`` is JSON-ready.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

from layerplan.cost.collectives import ALLREDUCE, SCHEMES, collective_cost
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec

PATTERNS = ("all_to_all", "spread", "broadcast", "within")
PREV = "prev/"
TAIL_ITERATIONS = 2
"""Iterations simulated after the k of a multi-iteration graph, neither measured nor in the timeline."""
MAX_SPREAD = 1.0
"""The largest ``StepGraph.spread`` (a coefficient of variation) a graph may ask for."""
RANK_SPREAD = 0.13
"""On oversubscribed shared cores (more ranks than cores), the coefficient of variation of the time
a group's ranks take from their last meeting to a collective call: the kernel time-slices them, and
a rank that gets ahead spends its turns on work past the call while the last one to arrive still
computes towards it. Logged per rank in DDP steps of alexnet_cifar, 4 workers at 1 Gbit/s on 2
cores (24 steps, two runs): from the last bucket's all-reduce of one step to the first bucket's
call of the next, 0.40-0.42 s on average, the last rank 11-12% behind the mean, 0.14-0.15 of it
the ranks' spread (stanza's CONV workers of vgg16_cifar, 4 on 2 cores: the backward's last rank
16% behind the mean). 2 workers on the 2 cores: 0.9% behind (``_rank_lag_s``)."""


# ---- tasks ---------------------------------------------------------------------------------------
def _deps_tuple(obj: Any) -> None:
    deps = obj.deps
    if isinstance(deps, str):
        deps = (deps,)
    deps = tuple(deps)
    if any(not isinstance(d, str) or not d for d in deps):
        raise ConfigError(f"task {obj.name!r}: deps must be task names, got {obj.deps!r}")
    object.__setattr__(obj, "deps", deps)
    if not isinstance(obj.name, str) or not obj.name:
        raise ConfigError(f"a task needs a non-empty name, got {obj.name!r}")
    if obj.queue is not None and (not isinstance(obj.queue, str) or not obj.queue):
        raise ConfigError(f"task {obj.name!r}: queue must be a non-empty name or None, got {obj.queue!r}")


def _finite(obj: Any, what: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"task {obj.name!r}: {what} must be a finite non-negative number, got {v!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Compute:
    """Every node of ``group`` computes for ``seconds`` (its time alone on one device)."""

    name: str
    group: str
    seconds: float
    deps: tuple[str, ...] = ()
    tag: str = "compute"
    queue: str | None = None
    """Tasks with the same queue name run one at a time, first ready first served (a task made
    ready by the end of the one before it goes next)."""

    def __post_init__(self) -> None:
        _deps_tuple(self)
        _finite(self, "seconds", self.seconds)


@dataclass(frozen=True, kw_only=True, slots=True)
class Transfer:
    """A class of flows from the nodes of ``src`` to the nodes of ``dst`` (see ``PATTERNS``)."""

    name: str
    src: str
    dst: str
    bytes_per_flow: float
    pattern: str
    deps: tuple[str, ...] = ()
    messages: int = 1
    """Messages per flow on the critical path: ``messages · latency_s`` pass before bytes move."""
    tag: str = "comm"
    queue: str | None = None
    share: float = 1.0
    """Each flow's weight where it shares a resource (weighted max-min): a flow of share 2 gets
    twice the bytes/s of a share-1 flow on a NIC both saturate (``LinkSpec.lead_share``: the TCP
    flow that leads among flows leaving one NIC together)."""
    meets: bool = False
    """Its senders meet here: a gather whose receiver computes once the last has arrived (Stanza's
    and hybrid's activations). On shared cores it waits ``collective_wait_s``, as a collective call
    does: the step goes at its slowest sender's pace since they last met."""
    wakes: bool = False
    """Its receivers blocked for it through a phase of the step (Stanza's FC worker through the
    forward pass, the CONV workers through the FC phase). With more nodes than shared cores each
    wakes cold: ``oversubscribed_message_cpu_s`` more before the bytes are of use, even with a core
    free (the ``contested_cpu`` rule waives a busy core's turn, not this). Stanza's FC pass of
    resnet_cifar at 4 workers, 0.3 ms warm, took 3-4 ms of CPU after its wait with cores free."""

    def __post_init__(self) -> None:
        _deps_tuple(self)
        _finite(self, "bytes_per_flow", self.bytes_per_flow)
        if (not isinstance(self.share, (int, float)) or isinstance(self.share, bool) or not math.isfinite(self.share)
                or self.share <= 0):
            raise ConfigError(f"transfer {self.name!r}: share must be a positive number, got {self.share!r}")
        if self.pattern not in PATTERNS:
            raise ConfigError(f"transfer {self.name!r}: pattern {self.pattern!r} is not one of {', '.join(PATTERNS)}")
        if not isinstance(self.messages, int) or isinstance(self.messages, bool) or self.messages < 0:
            raise ConfigError(f"transfer {self.name!r}: messages must be a non-negative integer, got {self.messages!r}")
        same = self.src == self.dst
        if self.pattern == "within" and not same:
            raise ConfigError(f"transfer {self.name!r}: pattern 'within' needs src == dst, got {self.src!r} → {self.dst!r}")
        if self.pattern in ("spread", "broadcast") and same:
            raise ConfigError(f"transfer {self.name!r}: pattern {self.pattern!r} needs two different groups")


@dataclass(frozen=True, kw_only=True, slots=True)
class Collective:
    """A collective (``collectives.SCHEMES`` name) of ``bytes`` per node over the nodes of ``group``."""

    name: str
    group: str
    scheme: str
    bytes: float
    deps: tuple[str, ...] = ()
    tag: str = "comm"
    queue: str | None = None

    def __post_init__(self) -> None:
        _deps_tuple(self)
        _finite(self, "bytes", self.bytes)
        if self.scheme not in SCHEMES:
            raise ConfigError(f"collective {self.name!r}: unknown scheme {self.scheme!r}; known: {', '.join(SCHEMES)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Delay:
    """A fixed wait of ``seconds``; shown on ``group``'s timeline row when one is given."""

    name: str
    seconds: float
    deps: tuple[str, ...] = ()
    group: str | None = None
    tag: str = "delay"
    queue: str | None = None

    def __post_init__(self) -> None:
        _deps_tuple(self)
        _finite(self, "seconds", self.seconds)


Task = Union[Compute, Transfer, Collective, Delay]


def iteration_name(i: int, name: str) -> str:
    """The name task ``name`` of iteration ``i`` gets when a graph is unrolled: ``it{i}/name``."""
    return f"it{i}/{name}"


def _groups_of(t: Task) -> tuple[str, ...]:
    if isinstance(t, Transfer):
        return (t.src,) if t.src == t.dst else (t.src, t.dst)
    if isinstance(t, Delay):
        return () if t.group is None else (t.group,)
    return (t.group,)


# ---- the graph -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StepGraph:
    """One training step (or a builder of iterations) over symmetric node groups."""

    groups: Mapping[str, int]
    """Role name → number of identical nodes."""
    tasks: tuple[Task, ...] = ()
    """One iteration's tasks (static form)."""
    samples_per_step: int
    """Samples one iteration processes over the whole cluster (the global batch)."""
    build: Callable[[int], Sequence[Task]] | None = field(default=None, compare=False)
    """Builder form: iteration i's tasks with their final names (``tasks`` must then be empty)."""
    iterations: int = 1
    """Iterations ``simulate`` unrolls when not told otherwise (≥ 2 for asynchronous schedules)."""
    mean_field_cores: bool = False
    """The groups run out of phase, on no common clock (Omnivore's asynchronous compute groups): on
    shared cores each compute task runs at the speed the others' average load leaves it, not at its
    share of the simulated instant (``simulate``)."""
    spread: float = 0.0
    """Coefficient of variation of each compute task's time from one iteration to the next, as a
    run's stages vary (0: every iteration alike). Drawn in a last pass (``simulate``)."""
    spread_iterations: int = 0
    """Iterations of that last pass (0: ``iterations``): enough that the draws average out."""
    report_as: Mapping[str, str] = field(default_factory=dict)
    """Group → the role its figures are reported under (groups absent report as themselves). For
    nodes of one role that run out of phase, e.g. RALP's workers, which the PS worker serves one
    after another: each is its own group in the simulation, one role in the Prediction (figures
    per node are node-weighted means over the groups, totals are sums)."""

    def __post_init__(self) -> None:
        groups = dict(self.groups)
        for role, n in groups.items():
            if not isinstance(role, str) or not role:
                raise ConfigError(f"step graph: role names must be non-empty strings, got {role!r}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ConfigError(f"step graph: role {role!r} needs at least 1 node, got {n!r}")
        object.__setattr__(self, "groups", groups)
        report_as = dict(self.report_as)
        for g, role in report_as.items():
            if g not in groups:
                raise ConfigError(f"step graph: report_as names {g!r}, which is not a group (groups: {', '.join(groups)})")
            if not isinstance(role, str) or not role or (role in groups and report_as.get(role, role) != role):
                raise ConfigError(f"step graph: group {g!r} cannot report as {role!r}")
        object.__setattr__(self, "report_as", report_as)
        object.__setattr__(self, "tasks", tuple(self.tasks))
        if not isinstance(self.samples_per_step, (int, float)) or isinstance(self.samples_per_step, bool) or self.samples_per_step < 0:
            raise ConfigError(f"step graph: samples_per_step must be a non-negative number, got {self.samples_per_step!r}")
        if not isinstance(self.iterations, int) or self.iterations < 1:
            raise ConfigError(f"step graph: iterations must be a positive integer, got {self.iterations!r}")
        if not isinstance(self.spread, (int, float)) or isinstance(self.spread, bool) or not 0 <= self.spread <= MAX_SPREAD:
            raise ConfigError(f"step graph: spread must be a number in [0, {MAX_SPREAD:g}], got {self.spread!r}")
        if not isinstance(self.spread_iterations, int) or isinstance(self.spread_iterations, bool) or self.spread_iterations < 0:
            raise ConfigError(f"step graph: spread_iterations must be a non-negative integer, got {self.spread_iterations!r}")
        if self.build is not None:
            if self.tasks:
                raise ConfigError("step graph: give either tasks or build, not both")
            return
        if not self.tasks:
            raise ConfigError("step graph: no tasks")
        _validate(self.tasks, groups, static=True)


def _validate(tasks: Sequence[Task], groups: Mapping[str, int], *, static: bool) -> None:
    names: set[str] = set()
    for t in tasks:
        if not isinstance(t, (Compute, Transfer, Collective, Delay)):
            raise ConfigError(f"step graph: {t!r} is not a Compute, Transfer, Collective or Delay")
        if t.name in names:
            raise ConfigError(f"step graph: task name {t.name!r} appears twice")
        if static and t.name.startswith(PREV):
            raise ConfigError(f"step graph: task name {t.name!r} may not start with {PREV!r}")
        names.add(t.name)
        for g in _groups_of(t):
            if g not in groups:
                raise ConfigError(f"task {t.name!r} runs on role {g!r}, which the graph does not have "
                                  f"(roles: {', '.join(groups)})")
    for t in tasks:
        for d in t.deps:
            target = d[len(PREV):] if static and d.startswith(PREV) else d
            if target not in names:
                raise ConfigError(f"task {t.name!r} depends on {d!r}, which is not a task of the graph")
            if target == t.name and not d.startswith(PREV):
                raise ConfigError(f"task {t.name!r} depends on itself")


def _unroll(graph: StepGraph, k: int) -> tuple[list[Task], list[int]]:
    """All tasks of k iterations with final names, and each one's iteration."""
    out: list[Task] = []
    its: list[int] = []
    if graph.build is not None:
        for i in range(k):
            for t in graph.build(i):
                out.append(t)
                its.append(i)
        _validate(out, graph.groups, static=False)
        return out, its
    if k == 1:
        for t in graph.tasks:
            deps = tuple(d for d in t.deps if not d.startswith(PREV))
            out.append(t if deps == t.deps else _renamed(t, t.name, deps))
            its.append(0)
        return out, its
    if not any(d.startswith(PREV) for t in graph.tasks for d in t.deps):
        raise ConfigError("step graph: unrolling needs at least one 'prev/…' dependency between iterations; "
                          "without one the iterations would all run at once")
    for i in range(k):
        for t in graph.tasks:
            deps = []
            for d in t.deps:
                if d.startswith(PREV):
                    if i > 0:
                        deps.append(iteration_name(i - 1, d[len(PREV):]))
                else:
                    deps.append(iteration_name(i, d))
            out.append(_renamed(t, iteration_name(i, t.name), tuple(deps)))
            its.append(i)
    return out, its


def _renamed(t: Task, name: str, deps: tuple[str, ...]) -> Task:
    from dataclasses import replace

    return replace(t, name=name, deps=deps)


# ---- the prediction ------------------------------------------------------------------------------
class TimelineEntry(NamedTuple):
    """One task on one role's row of the timeline (a transfer shows on its source and its destination)."""

    name: str
    group: str
    start_s: float
    end_s: float
    tag: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """What the engine predicts for one step (per step = per iteration; see ``simulate``)."""

    step_time_s: float
    samples_per_step: float
    throughput_samples_per_s: float
    groups: dict[str, int]
    """Role → nodes."""
    breakdown: dict[str, dict[str, float]]
    """Role → {"compute_s", "comm_s", "compute_work_s"}: time per step one node of the role spends
    in compute tasks / in communication tasks (union of their intervals), and the seconds its
    compute tasks would take alone on the device (no sharing: the work)."""
    bytes_sent_per_node: dict[str, float]
    """Role → wire bytes one node of the role sends per step (mean over the role's nodes)."""
    bytes_received_per_node: dict[str, float]
    """Role → wire bytes one node of the role receives per step."""
    bytes_sent_by_role: dict[str, float]
    """Role → wire bytes all nodes of the role send per step."""
    payload_sent_per_node: dict[str, float]
    """Role → bytes per node as the runtime counts them (metrics.py): a collective's payload once
    per participant, point-to-point bytes as sent."""
    bytes_per_link: dict[str, float]
    """"src->dst" role pair → wire bytes per step over all nodes."""
    total_bytes: float
    """Wire bytes sent per step by all nodes."""
    utilization: dict[str, float]
    """Resource → mean load over the step as a share of its capacity (one node of a role's
    device / NIC egress / NIC ingress; the shared core pool; the switch)."""
    saturated: dict[str, float]
    """Resource → share of the step it ran at full capacity (what the bottleneck is chosen by)."""
    latency_share: float
    """Share of the step during which some task was in its latency phase."""
    bottleneck: str
    timeline: tuple[TimelineEntry, ...]
    """Every task of every simulated iteration."""
    iterations: int
    window_s: tuple[float, float]
    """The interval the per-step figures are measured over."""

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "kind": "prediction",
            "step_time_s": self.step_time_s,
            "throughput_samples_per_s": num(self.throughput_samples_per_s),
            "samples_per_step": self.samples_per_step,
            "groups": dict(self.groups),
            "breakdown": {r: dict(b) for r, b in self.breakdown.items()},
            # "total" and "per_role" follow the runtime's Measurement (payload counting rule) so
            # the two compare directly; the wire_* keys are what the NICs carry.
            "bytes_per_step": {
                "total": sum(b * self.groups[g] for g, b in self.payload_sent_per_node.items()),
                "per_role": dict(self.payload_sent_per_node),
                "wire_total": self.total_bytes,
                "wire_per_role": dict(self.bytes_sent_per_node),
                "wire_per_role_all_nodes": dict(self.bytes_sent_by_role),
                "wire_received_per_role": dict(self.bytes_received_per_node),
                "wire_per_link": dict(self.bytes_per_link),
            },
            "utilization": dict(self.utilization),
            "saturated": dict(self.saturated),
            "latency_share": self.latency_share,
            "bottleneck": self.bottleneck,
            "iterations": self.iterations,
            "window_s": list(self.window_s),
            "timeline": [e._asdict() for e in self.timeline],
        }


# ---- compiling tasks to activities ---------------------------------------------------------------
def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _flows(t: Transfer, groups: Mapping[str, int]) -> tuple[int, int, int]:
    """(flows out of one src NIC, flows into one dst NIC, flows in all)."""
    n_s, n_d = groups[t.src], groups[t.dst]
    if t.pattern == "all_to_all":
        if t.src == t.dst:
            return n_s - 1, n_s - 1, n_s * (n_s - 1)
        return n_d, n_s, n_s * n_d
    if t.pattern == "spread":
        return 1, _ceil_div(n_s, n_d), n_s
    if t.pattern == "broadcast":
        return _ceil_div(n_d, n_s), 1, n_d
    return (1, 1, n_s) if n_s > 1 else (0, 0, 0)  # within


class _Resources:
    def __init__(self, groups: Mapping[str, int], cluster: ClusterSpec) -> None:
        self.names: list[str] = []
        self.caps: list[float] = []
        self.dev: dict[str, int] = {}
        self.egress: dict[str, int] = {}
        self.ingress: dict[str, int] = {}
        self.both: dict[str, int] = {}  # egress + ingress together, where the link is not fully duplex
        bw = cluster.nic.payload_bytes_per_s  # PALEO §3.3: payload share of the line rate
        d = cluster.nic.duplex_efficiency
        self.group_index = {g: j for j, g in enumerate(groups)}
        self.nic_of: list[int] = []  # per resource: the group whose NIC it is, or -1
        for j, g in enumerate(groups):
            self.dev[g] = self._add(f"{g} compute", 1.0, -1)
            self.egress[g] = self._add(f"{g} NIC egress", bw, j)
            self.ingress[g] = self._add(f"{g} NIC ingress", bw, j)
            if d < 1:
                self.both[g] = self._add(f"{g} NIC both ways", 2.0 * d * bw, j)
        cores = cluster.shared_core_capacity or cluster.shared_cores  # contention: busy cores give less
        self.cores = None if cluster.shared_cores is None else self._add("shared cores", float(cores), -1)
        over = cluster.oversubscribed_core_capacity
        self.oversubscribed_cores = None if self.cores is None or over is None else float(over)
        sw = cluster.switch_bandwidth_bytes_per_s
        self.switch = None if sw is None else self._add("switch", float(sw), -1)

    def _add(self, name: str, cap: float, nic_of: int) -> int:
        self.names.append(name)
        self.caps.append(cap)
        self.nic_of.append(nic_of)
        return len(self.names) - 1


@dataclass(slots=True)
class _Act:
    """One task compiled: a latency phase, then ``amount`` units of progress at a shared rate."""

    index: int
    name: str
    iteration: int
    latency: float
    amount: float
    coefs: list[tuple[int, float]]
    queue: str | None
    rows: tuple[str, ...]
    tag: str
    sent: dict[str, float]
    recv: dict[str, float]
    payload: dict[str, float]
    links: dict[str, float]
    network: bool
    nic_group: int = -1
    """For a collective: the index of its group (its run at ``cap`` keeps that group's NIC busy)."""
    cap: float = math.inf
    """Upper bound on the rate: a collective's critical path crosses one NIC direction at a time."""
    scale: float = 1.0
    """Fairness compares rates in units of this: 1 for compute (seconds of work per second), the
    NIC's bandwidth for bytes."""
    threads: float = 0.0
    """A network activity's threads on the shared cores (CFS shares the cores by thread): a flow's
    two ends, a collective's one per node."""
    contested_cpu: float = 0.0
    """A point-to-point message's CPU on oversubscribed cores (``oversubscribed_message_cpu_s`` per
    end, as a part of its shared-cores coefficient): charged only where the message starts while
    the compute running takes every core (``simulate``)."""
    cpu_cap: float = math.inf
    """Upper bound on a network activity's rate from the CPU its threads get (the mean field)."""
    work: float = 0.0
    """A compute task's seconds alone on one device (``amount`` unless stretched by the mean field)."""
    cpu_threads: float = 0.0
    """A compute task's threads on the shared cores (one per node), whether or not it draws on them."""
    deps: list[int] = field(default_factory=list)
    dependents: list[int] = field(default_factory=list)
    waiting: int = 0
    start: float = math.nan
    end: float = math.nan
    remaining: float = 0.0
    rate: float = 0.0


def _computing_threads(running: list[_Act], cores: int | None) -> float:
    """Compute threads running on the shared cores (one per node of each running compute task)."""
    return sum(a.cpu_threads for a in running if not a.network) if cores is not None else 0.0


def _oversubscribed_weight(running: list[_Act], res: "_Resources", cores: int) -> float:
    """How far the running threads oversubscribe the shared cores, from 0 (they fit) to 1 (a whole
    thread more than the cores): the compute threads plus the cores' worth the messages' threads
    take at the rates they get, less the cores. With no compute running it is 0: the
    oversubscribed capacity is compute's loss (each switch refills a compute thread's caches).

    Measured on the emulated cluster (2 cores, 10 Gbit/s), per-thread CPU from /proc of
    alexnet_cifar under DDP: the training thread of each of 2 ranks took 192 ms of CPU a step, as
    much as each of 4 ranks took (195 ms), for 165.5 ms of work alone on a core — 0.86 of its speed
    alone in both, where 2 compute threads alone on the cores keep 0.935 (``shared_core_capacity``)
    and 4 keep 0.875 (``oversubscribed_core_capacity``): 2 ranks' gloo threads, busy 0.3 of a core
    each while their buckets overlap the backward pass, slice the cores as 2 more ranks would."""
    threads = _computing_threads(running, res.cores)
    if threads > cores + 1e-9:
        return 1.0
    if threads <= 0 or not any(a.network for a in running):
        return 0.0
    _max_min_rates(running, list(res.caps), res.cores)
    demand = sum(c * a.rate for a in running if a.network for r, c in a.coefs if r == res.cores)
    return min(1.0, max(0.0, threads + demand - cores))


def _is_network(t) -> bool:
    return isinstance(t, (Transfer, Collective))


def _in_step(t: Collective, tasks: Sequence[Task], index: Mapping[str, int]) -> bool:
    """True when a collective follows only collectives over its own group: its ranks have just
    met and run nothing in between, so there is no drift for it to wait out again (DDP's second
    buffer broadcast, of the int64 counters, right after the first)."""
    deps = [tasks[index[d]] for d in t.deps if d in index]
    return bool(deps) and all(isinstance(d, Collective) and d.group == t.group for d in deps)


def idle_collective_cpu_s_per_byte(cluster: ClusterSpec, reduces: bool) -> float:
    """CPU seconds a byte a collective sends (every rank's, summed) takes from the shared cores, as
    timed on idle cores: the message's CPU at both ends, and an all-reduce (``reduces``) reduces half
    of what it moves (ring: (n−1)·S of 2(n−1)·S)."""
    return 2.0 * cluster.comm_cpu_s_per_byte + (cluster.reduce_cpu_s_per_byte / 2.0 if reduces else 0.0)


def collective_cpu_s_per_byte(cluster: ClusterSpec, reduces: bool) -> float:
    """What the engine charges a byte a collective sends: the idle-core charge, or where measured
    beside its ranks' compute and larger, that (``ClusterSpec.collective_busy_cpu_s_per_byte``)."""
    idle = idle_collective_cpu_s_per_byte(cluster, reduces)
    busy = cluster.collective_busy_cpu_s_per_byte
    return idle if busy is None else max(idle, busy)


@functools.lru_cache(maxsize=64)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normal draws] (0 for n = 1; 1.029 for n = 4): the integral of
    x · n φ(x) Φ(x)^(n−1) on a grid of 0.001 over ±8."""
    if n <= 1:
        return 0.0
    nd = statistics.NormalDist()
    h = 1e-3
    return math.fsum(x * n * nd.pdf(x) * nd.cdf(x) ** (n - 1) * h for x in (j * h for j in range(-8000, 8001)))


class _Chains:
    """Each group's chain of compute, for ``_rank_lag_s``: which compute waited on the network (its
    ranks met there), the per-core compute from the last meeting to a task's end, and the compute
    that may follow a task without waiting. Memoized over one compiled task list."""

    def __init__(self, tasks: Sequence[Task], its: Sequence[int], index: Mapping[str, int]) -> None:
        self.tasks, self.its = tasks, its
        self.deps = [[index[d] for d in t.deps if d in index] for t in tasks]
        self.succ: list[list[int]] = [[] for _ in tasks]
        for j, ds in enumerate(self.deps):
            for d in ds:
                self.succ[d].append(j)
        self.waited = [any(_is_network(tasks[d]) for d in ds) for ds in self.deps]
        self._back: dict[int, float] = {}
        self._ahead: dict[int, float] = {}
        self._tail: dict[tuple[str, int], float] = {}
        self._from_wait: dict[int, bool] = {}
        self._waits_later: dict[int, bool] = {}

    def own(self, j: int, g: str) -> bool:
        t = self.tasks[j]
        return isinstance(t, Compute) and t.group == g

    def back(self, j: int) -> float:
        """Per-core compute from the group's last meeting to the end of compute task j. A chain that
        starts the step (one iteration's graph, as DDP's) goes back to the compute after the step's
        last wait (the previous step's, in the steady state)."""
        if j not in self._back:
            g = self.tasks[j].group
            before = 0.0
            if not self.waited[j]:
                prev = [d for d in self.deps[j] if self.own(d, g)]
                before = max((self.back(d) for d in prev), default=0.0) if prev else self.tail(g, self.its[j])
            self._back[j] = self.tasks[j].seconds + before
        return self._back[j]

    def ahead(self, j: int) -> float:
        """Per-core compute of the group that may follow task j without waiting on the network."""
        if j not in self._ahead:
            g = self.tasks[j].group
            self._ahead[j] = max((self.tasks[s].seconds + self.ahead(s) for s in self.succ[j]
                                  if self.own(s, g) and not self.waited[s]), default=0.0)
        return self._ahead[j]

    def tail(self, g: str, it: int) -> float:
        """Per-core compute of group g's iteration ``it`` at or after its chain's last wait (DDP's
        unbucket, then its update)."""
        if (g, it) not in self._tail:
            self._tail[(g, it)] = math.fsum(t.seconds for j, t in enumerate(self.tasks)
                                            if self.its[j] == it and self.own(j, g)
                                            and self.from_wait(j) and not self.waits_later(j))
        return self._tail[(g, it)]

    def from_wait(self, j: int) -> bool:
        if j not in self._from_wait:
            g = self.tasks[j].group
            self._from_wait[j] = self.waited[j] or any(self.own(d, g) and self.from_wait(d) for d in self.deps[j])
        return self._from_wait[j]

    def waits_later(self, j: int) -> bool:
        if j not in self._waits_later:
            g = self.tasks[j].group
            self._waits_later[j] = any(self.own(s, g) and (self.waited[s] or self.waits_later(s)) for s in self.succ[j])
        return self._waits_later[j]


def _rank_lag_s(i: int, chains: _Chains, groups: Mapping[str, int], cluster: ClusterSpec,
                speeds: "_MeanField | None") -> float:
    """Seconds collective ``tasks[i]`` waits, on oversubscribed shared cores, for the last of its
    group's n ranks beyond their mean (``RANK_SPREAD``): E[max of n normals] · RANK_SPREAD · the time
    the ranks compute from their last meeting to the call (``_Chains.back``) — no more than the time
    of the compute that may run past the call without waiting on the network (``_Chains.ahead``),
    the work a rank ahead can spend its turns on (none after the backward's last bucket: there the
    ranks ahead idle and the last one gets the cores). Per-core compute stretched to the group's
    speed on the cores: the mean field's, else the oversubscribed capacity shared by its ranks."""
    t = chains.tasks[i]
    g, n = t.group, groups[t.group]
    feeds = [d for d in chains.deps[i] if chains.own(d, g)]
    if not feeds:
        return 0.0
    work_s = min(max(chains.back(j) for j in feeds), max(chains.ahead(j) for j in feeds))
    if speeds is not None:
        speed = speeds.groups[g]
    else:
        cap = cluster.oversubscribed_core_capacity or cluster.shared_core_capacity or cluster.shared_cores
        speed = min(1.0, float(cap) / n)
    return expected_max_normal(n) * RANK_SPREAD * work_s / speed


def _compile(tasks: Sequence[Task], its: Sequence[int], groups: Mapping[str, int], cluster: ClusterSpec,
             res: _Resources, speeds: "_MeanField | None" = None,
             spread: Mapping[int, float] | None = None) -> list[_Act]:
    lat_s = cluster.nic.latency_s
    message_cpu_s = 0.0  # CPU per message end (ClusterSpec.oversubscribed_message_cpu_s)
    if cluster.shared_cores is not None and sum(groups.values()) > cluster.shared_cores:
        lat_s += cluster.oversubscribed_wait_s  # more ranks than cores: a message waits for its receiver's turn
        message_cpu_s = cluster.oversubscribed_message_cpu_s
    index = {t.name: i for i, t in enumerate(tasks)}
    chains: _Chains | None = None  # built on the first collective that needs it (_rank_lag_s)
    acts: list[_Act] = []
    for i, t in enumerate(tasks):
        coefs: list[tuple[int, float]] = []
        latency, amount, threads = 0.0, 0.0, 0.0
        contested_cpu = 0.0
        sent: dict[str, float] = {}
        recv: dict[str, float] = {}
        payload: dict[str, float] = {}
        links: dict[str, float] = {}
        work = cpu_threads = 0.0
        cpu_cap = math.inf
        if isinstance(t, Compute):
            amount = work = float(t.seconds)
            coefs.append((res.dev[t.group], 1.0))  # processor sharing of the node's device
            if res.cores is not None:
                cpu_threads = float(groups[t.group])
                # one thread per task on the shared pool; with the mean field (simulate) it runs at its
                # group's mean speed, the pool not binding: progress in units of work/speed, one a
                # second on its device, speed·threads of the pool's CPU per unit (its use reported)
                speed = 1.0 if speeds is None else speeds.groups[t.group]
                amount = work / speed
                coefs.append((res.cores, cpu_threads * speed))
            if spread:  # this iteration's draw of the task's time (``_spread_factors``)
                amount *= spread.get(i, 1.0)
        elif isinstance(t, Transfer):
            out_f, in_f, total_f = _flows(t, groups)
            if total_f > 0:
                latency = t.messages * lat_s  # α term: per-message latency before the bytes
                if t.meets and cluster.shared_cores is not None and groups[t.src] > 1:
                    latency += cluster.collective_wait_s  # the senders meet: the receiver waits for the slowest
                if t.wakes:
                    latency += message_cpu_s  # oversubscribed cores: the receivers wake cold (Transfer.wakes)
                amount = float(t.bytes_per_flow)
                if amount > 0:
                    coefs.append((res.egress[t.src], float(out_f)))
                    coefs.append((res.ingress[t.dst], float(in_f)))
                    if res.both:
                        coefs += [(res.both[t.src], float(out_f)), (res.both[t.dst], float(in_f))]
                    if res.switch is not None:
                        coefs.append((res.switch, float(total_f)))
                    if res.cores is not None and (cluster.comm_cpu_s_per_byte > 0 or message_cpu_s > 0):
                        # both ends' CPU: every byte of every flow, and on oversubscribed cores every
                        # node that sends or receives the transfer once (it blocks and wakes once)
                        ends = (groups[t.src] if out_f else 0) + (groups[t.dst] if in_f else 0)
                        coefs.append((res.cores, 2.0 * cluster.comm_cpu_s_per_byte * total_f + message_cpu_s * ends / amount))
                        contested_cpu = message_cpu_s * ends / amount
                        threads = 2.0 * total_f
                total = t.bytes_per_flow * total_f
                sent[t.src] = total
                recv[t.dst] = total
                payload[t.src] = total
                links[f"{t.src}->{t.dst}"] = total
        elif isinstance(t, Collective):
            n = groups[t.group]
            cost = collective_cost(t.scheme, t.bytes, n)
            latency = cost.rounds * lat_s  # α term: rounds on the critical path
            if n > 1 and cluster.shared_cores is not None and not _in_step(t, tasks, index):
                latency += cluster.collective_wait_s  # the ranks meet: each call waits for the slowest
                if sum(groups.values()) > cluster.shared_cores:  # oversubscribed: the last rank lags
                    chains = chains or _Chains(tasks, its, index)
                    latency += _rank_lag_s(i, chains, groups, cluster, speeds)
            amount = cost.critical_bytes
            if amount > 0:
                for r, b in ((res.egress[t.group], cost.send_bytes_per_node), (res.ingress[t.group], cost.recv_bytes_per_node)):
                    if b > 0:
                        coefs.append((r, b / amount))
                if res.both and cost.send_bytes_per_node + cost.recv_bytes_per_node > 0:
                    coefs.append((res.both[t.group], (cost.send_bytes_per_node + cost.recv_bytes_per_node) / amount))
                if res.switch is not None and cost.total_bytes > 0:
                    coefs.append((res.switch, cost.total_bytes / amount))
                if res.cores is not None and cost.total_bytes > 0:
                    # every byte sent costs CPU at both ends; an all-reduce also reduces half of what
                    # it moves (ring: (n−1)·S of 2(n−1)·S), on the same shared cores
                    cpu = collective_cpu_s_per_byte(cluster, t.scheme in ALLREDUCE) * cost.total_bytes
                    if cpu > 0:
                        coefs.append((res.cores, cpu / amount))
                        threads = float(n)
                        if cluster.collective_core_share is not None:  # each rank's thread: at most that share of a core
                            cpu_cap = cluster.collective_core_share * threads * amount / cpu
            if n > 1:
                sent[t.group] = cost.total_bytes
                recv[t.group] = cost.total_bytes
                payload[t.group] = float(t.bytes) * n  # metrics.py: a collective's payload once per participant
                links[f"{t.group}->{t.group}"] = cost.total_bytes
        else:  # Delay
            latency = float(t.seconds)
        if not coefs:
            amount = 0.0
        cap, nic_group = math.inf, -1
        if isinstance(t, Collective) and amount > 0:
            cap = res.caps[res.egress[t.group]]  # the critical path moves through one NIC direction at a time
            nic_group = res.group_index[t.group]
        # the unit fairness counts rates in: a second of compute per second, a NIC's worth of bytes
        scale = res.caps[res.egress[t.src if isinstance(t, Transfer) else t.group]] if _is_network(t) else 1.0
        if isinstance(t, Transfer):
            scale *= t.share  # weighted max-min: its flows get ``share`` times a share-1 flow's rate
        acts.append(_Act(index=i, name=t.name, iteration=its[i], latency=latency, amount=amount, coefs=coefs,
                         queue=t.queue, rows=_groups_of(t), tag=t.tag, sent=sent, recv=recv, payload=payload, links=links,
                         network=_is_network(t), nic_group=nic_group, cap=cap, threads=threads,
                         contested_cpu=contested_cpu, cpu_cap=cpu_cap, work=work, cpu_threads=cpu_threads,
                         scale=scale if 0 < scale < math.inf else 1.0))
    if speeds is not None and res.cores is not None:  # the mean field: a message's threads at their mean speed
        for a in acts:
            c = next((c for r, c in a.coefs if r == res.cores), 0.0)
            if a.network and c > 0 and a.threads > 0:
                a.cpu_cap = min(a.cpu_cap, a.threads * speeds.network / c)
    for a, t in zip(acts, tasks):
        a.deps = [index[d] for d in t.deps]
        a.waiting = len(a.deps)
        for d in a.deps:
            acts[d].dependents.append(a.index)
    return acts


# ---- rates ---------------------------------------------------------------------------------------
def _max_min_rates(running: list[_Act], caps: list[float], cores: int | None = None) -> None:
    """Rates of the running activities: max-min fair on every resource, with the shared cores
    shared as Linux's CFS shares them.

    Network activities and compute meet on one resource only, the shared cores (compute uses the
    devices and the cores; transfers and collectives the NICs, the switch and, for their CPU side,
    the cores). So the rates come in two passes:

    1. Network activities get max-min fair rates among themselves (``_fill``), each within the
       CPU share CFS gives it: on saturated cores every runnable thread gets an equal share of the
       cores, and a thread that needs less (a gloo thread whose bytes need 0.06 of a core at
       1 Gbit/s) gets all it needs while the compute threads share what is left. The share is a
       water level f over the cores' threads (``_Act.threads``: a compute task's one per node, a
       flow's two ends, a collective's one per node): each gets min(its demand, f). A network
       activity whose demand exceeds its share is capped at the rate that share buys, and the
       network pass runs again (capping one frees NIC bandwidth for the others).
    2. Compute gets max-min fair rates on what the network left of the cores (and on its devices).

    Without shared cores, or with nothing on them from one side, this is plain progressive filling."""
    if cores is None:
        _fill(running, list(caps))
        return
    net = [a for a in running if a.network]
    comp = [a for a in running if not a.network]
    cpu = {a.index: c for a in net for r, c in a.coefs if r == cores}
    if not net or not comp or not cpu:
        _fill(running, list(caps))
        return
    # each compute thread's demand: its rate on its device alone (processor sharing of a node's device)
    unbounded = list(caps)
    unbounded[cores] = math.inf
    _fill(comp, unbounded)
    comp_demands = [(c * a.rate, c) for a in comp for r, c in a.coefs if r == cores]
    capacity = caps[cores]
    limit: dict[int, float] = {}
    for _ in range(len(net) + 1):  # each round caps at least one more activity, or stops
        residual = list(caps)
        _fill(net, residual, limit)
        demands = comp_demands + [(cpu[a.index] * a.rate, a.threads) for a in net if a.index in cpu]
        share = _water_level(demands, capacity)
        tighter = False
        for a in net:
            c = cpu.get(a.index)
            if c and c * a.rate > share * a.threads * (1 + 1e-9):
                limit[a.index] = share * a.threads / c
                tighter = True
        if not tighter:
            break
    _fill(comp, residual)


def _water_level(demands: list[tuple[float, float]], capacity: float) -> float:
    """CFS's share of ``capacity`` per thread: the level f at which Σ min(demand, f·threads) over
    the (demand, threads) pairs uses it all (∞ when the demands fit)."""
    if sum(d for d, _ in demands) <= capacity:
        return math.inf
    left, threads = capacity, sum(w for _, w in demands)
    for d, w in sorted(demands, key=lambda x: x[0] / x[1]):
        if d / w * threads >= left:  # the rest are all capped at the level
            return left / threads
        left -= d
        threads -= w
    return math.inf


def _fill(running: list[_Act], residual: list[float], limit: Mapping[int, float] | None = None) -> None:
    """Max-min fair rates by progressive filling of ``residual`` (used up in place), each
    activity's rate counted in its own unit (``_Act.scale``) and at most its ``cap`` (and its
    ``limit``): raise every unfrozen activity's rate in units together until a resource
    saturates, freeze the activities using it, repeat. Every flow has the same unit (the NIC's
    bandwidth) times its ``Transfer.share``, so among transfers this is byte-wise max-min, flow by
    flow, weighted by share; compute counts seconds of work per second."""
    unfrozen = running
    caps = {a.index: min(a.cap, a.cpu_cap, limit.get(a.index, math.inf)) if limit else min(a.cap, a.cpu_cap)
            for a in running}
    while unfrozen:
        load: dict[int, float] = {}
        for a in unfrozen:
            for r, c in a.coefs:
                load[r] = load.get(r, 0.0) + c * a.scale
        level = math.inf
        for r, ld in load.items():
            t = residual[r] / ld
            if t < level:
                level = t
        for a in unfrozen:
            if caps[a.index] / a.scale < level:
                level = caps[a.index] / a.scale
        if level < 0:
            level = 0.0
        cut = level * (1 + 1e-9) + 1e-300
        saturated = {r for r, ld in load.items() if residual[r] / ld <= cut}
        still = []
        for a in unfrozen:
            if caps[a.index] / a.scale <= cut or any(r in saturated for r, _ in a.coefs):
                a.rate = level * a.scale
                for r, c in a.coefs:
                    residual[r] -= c * a.rate
            else:
                still.append(a)
        unfrozen = still


# ---- simulation ----------------------------------------------------------------------------------
def simulate(graph: StepGraph, cluster: ClusterSpec, iterations: int | None = None) -> Prediction:
    """Simulate ``graph`` on ``cluster`` (``iterations`` defaults to ``graph.iterations``).

    With ``graph.spread`` (and k ≥ 2): over ``graph.spread_iterations`` iterations (at least k),
    each compute task's time drawn (``_spread_factors``). A closed loop near balance — stations
    that each group passes in turn, none of them busy all the time — loses time to the spread that
    no mean time shows: a late group leaves the next station idle, an early one waits, and neither
    gives the time back.

    With ``graph.mean_field_cores`` on shared cores: first as every graph, then again with every
    thread at a fixed speed, its mean over how many others run, until the step moves less than
    ``MEAN_FIELD_TOL`` (at most ``MEAN_FIELD_PASSES`` passes, each pass's speeds halfway from the
    last's to what the last pass's schedule gives: undamped, the speeds and the overlaps they make
    chase each other). With a spread, every pass is drawn, and a thread meets the threads that the
    drawn schedule has busy beside it (``_occupancy_field``); without one, the others busy
    independently (``_mean_field``): the undrawn schedule lines the groups up with none of a run's
    jitter, and overlaps them less than a run does."""
    k = graph.iterations if iterations is None else iterations
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"iterations must be a positive integer, got {k!r}")
    draws = None
    if graph.spread > 0 and k >= 2:
        k = max(k, graph.spread_iterations)
    tasks, its = _unroll(graph, k + TAIL_ITERATIONS if k >= 2 else k)
    if graph.spread > 0 and k >= 2:
        draws = _spread_factors(tasks, its, graph.spread, k)
    pred, acts, res = _simulate_once(graph, cluster, k, tasks, its, None, draws)
    if graph.mean_field_cores and cluster.shared_cores is not None:
        pred, _ = _settle_mean_field(graph, cluster, k, tasks, its, pred, acts, res, draws)
    return pred


def _spread_factors(tasks: Sequence[Task], its: Sequence[int], cv: float, k: int) -> dict[int, float]:
    """Task index → the factor its compute time is drawn with (``StepGraph.spread``): lognormal, mean
    1 and coefficient of variation ``cv``. Each compute task of the iteration (its name less the
    ``it{i}/`` prefix) takes, over the iterations of each part of the run — before the measured
    window, the window (``_window``), the tail —, the quantiles (r + ½)/n of that distribution,
    scaled to a mean of exactly 1, in an order shuffled by its name and part: the same draws every
    call and in every process, and no part's mean time moved by the luck of its draws."""
    import random
    import statistics
    import zlib

    sigma = math.sqrt(math.log1p(cv * cv))
    unit = statistics.NormalDist(-sigma * sigma / 2.0, sigma)  # log of a lognormal with mean 1
    parts = ((0, k // 2), (k // 2, k), (k, math.inf))
    by_name: dict[tuple[str, int], list[int]] = {}
    for i, t in enumerate(tasks):
        if isinstance(t, Compute):
            part = next(j for j, (lo, hi) in enumerate(parts) if lo <= its[i] < hi)
            prefix = iteration_name(its[i], "")
            name = t.name[len(prefix):] if t.name.startswith(prefix) else t.name
            by_name.setdefault((name, part), []).append(i)
    out: dict[int, float] = {}
    for (name, part), indices in by_name.items():
        n = len(indices)
        draws = [math.exp(unit.inv_cdf((r + 0.5) / n)) for r in range(n)]
        mean = math.fsum(draws) / n
        random.Random(zlib.crc32(f"{name}/{part}".encode())).shuffle(draws)
        for i, x in zip(sorted(indices, key=lambda i: its[i]), draws):
            out[i] = x / mean
    return out


def _settle_mean_field(graph: StepGraph, cluster: ClusterSpec, k: int, tasks: list[Task], its: list[int],
                       pred: "Prediction", acts: list["_Act"], res: "_Resources",
                       draws: Mapping[int, float] | None = None) -> tuple["Prediction", "_MeanField"]:
    """The mean field's passes (``simulate``; ``draws``: the spread's, every pass drawn alike): the
    prediction they settle on and its speeds."""
    field_now: _MeanField | None = None
    for _ in range(MEAN_FIELD_PASSES):
        new = _occupancy_field(graph, cluster, acts, res, k) if draws else _mean_field(graph, cluster, acts, res, k)
        if field_now is not None:
            new = _MeanField({g: (field_now.groups[g] + v) / 2.0 for g, v in new.groups.items()},
                             (field_now.network + new.network) / 2.0)
        field_now, last = new, pred.step_time_s
        pred, acts, res = _simulate_once(graph, cluster, k, tasks, its, field_now, draws)
        if abs(pred.step_time_s - last) <= MEAN_FIELD_TOL * last:
            break
    assert field_now is not None
    return pred, field_now


MEAN_FIELD_PASSES = 8
MEAN_FIELD_TOL = 1e-3


class _MeanField(NamedTuple):
    """Speeds on the shared cores, each a thread's mean over how many others run (``_mean_field``)."""

    groups: dict[str, float]
    """Group → the speed of each of its nodes' compute threads (seconds of work per second)."""
    network: float
    """The speed of a message's threads (each end's share of a core)."""


def _mean_field(graph: StepGraph, cluster: ClusterSpec, acts: list[_Act], res: _Resources, k: int) -> _MeanField:
    """The speeds threads get on the shared cores when groups compute independently of each other
    (``StepGraph.mean_field_cores``), from the busy shares of the last pass's measured window.

    The event-driven schedule lines groups that share no clock up the way the graph lets them, with
    none of the jitter of a run, and their compute overlaps less than a run's. Measured on the
    emulated cluster (2 cores), Omnivore's merged FC server and conv machines, per round: alexnet_cifar,
    4 groups of 1 machine at 1 Gbit/s, a conv machine's forward and backward took 144-155 ms and the
    FC server 342 ms, where the schedule gave 104 and 268 and this gives 140 and 317 (the rest is the
    FC layers' profile, 8% under what they take in the run); 2 groups of 2 at 1 Gbit/s, 129 and 206
    ms against 117 and 162 (this: 119 and 199); 2 groups of 1 at 10 Gbit/s, 106 and 152 against 96
    and 128 (this: 114 and 148).

    A thread of group g among T busy threads runs at min(1, (C − M)/T): C the shared cores' capacity
    (``oversubscribed_core_capacity`` when T exceeds the cores), M the cores' worth the messages
    took over the window (CFS gives threads that need little all they need: they come first). T is
    its group's nodes, busy together, plus every other group h, busy (all its n_h nodes at once)
    independently with probability d_h: its busy share of the window, less what it spends serving g
    — work between two of g's computes of one iteration in the graph, as the merged FC server on
    g's group batch between g's forward and backward, never runs while g computes — over the time
    it is not serving g. The speed is the mean over the Poisson-binomial count. A message's thread
    meets the compute threads the same way, at min(1, C/T)."""
    lo, hi = _window(acts, k)
    span = hi - lo
    groups = graph.groups
    computes: dict[str, list[_Act]] = {g: [] for g in groups}
    for a in acts:
        if not a.network and a.cpu_threads > 0:
            for g in a.rows:
                computes[g].append(a)

    def busy(which: list[_Act]) -> float:
        return _union_clipped([(a.start, a.end) for a in which], lo, hi)

    if span <= 0:
        return _MeanField(dict.fromkeys(groups, 1.0), 1.0)
    duty = {g: min(1.0, busy(computes[g]) / span) for g in groups}
    comm = _messages_cores(acts, res, lo, hi)

    def mean_speed(alone: int, others: list[tuple[int, float]], taken: float) -> float:
        dist = [0.0] * (alone + sum(n for n, _ in others) + 1)  # P(this many threads busy)
        dist[alone] = 1.0
        for n, d in others:
            if d > 0:
                dist = [p * (1 - d) + (dist[m - n] * d if m >= n else 0.0) for m, p in enumerate(dist)]
        return sum(p * _thread_speed(cluster, m, taken) for m, p in enumerate(dist) if p)

    out = {}
    for g in groups:
        served: dict[str, list[_Act]] = {}
        for a in _between(acts, computes[g]):
            for h in a.rows:
                served.setdefault(h, []).append(a)
        others = []
        for h in groups:
            if h != g:
                s = busy(served[h]) if h in served else 0.0
                others.append((groups[h], min(1.0, max(0.0, duty[h] * span - s) / max(span - s, 1e-12 * span))))
        out[g] = mean_speed(groups[g], others, comm)
    return _MeanField(out, mean_speed(1, [(groups[h], duty[h]) for h in groups], 0.0))


def _thread_speed(cluster: ClusterSpec, threads: float, taken: float) -> float:
    """A compute thread's speed among ``threads`` busy on the shared cores, the messages taking
    ``taken`` cores' worth (``_mean_field``): min(1, (C − M)/T), C the cores' capacity with all busy
    (``oversubscribed_core_capacity`` beyond the cores)."""
    if threads <= 0:
        return 1.0
    cores = cluster.shared_cores or 1
    shared = cluster.shared_core_capacity or cores
    over = cluster.oversubscribed_core_capacity or shared
    # the messages never take every core from the compute (a floor of 5%: CFS still runs it).
    # The capacity goes by compute threads alone: moving it by the messages' cores as well
    # (``_oversubscribed_weight``) put four of Omnivore's five 10 Gbit/s rows 0.5-1.4 points
    # further off over 13 full runs repredicted
    return min(1.0, max((shared if threads <= cores + 1e-9 else over) - taken, 0.05 * shared) / threads)


def _messages_cores(acts: list[_Act], res: _Resources, lo: float, hi: float) -> float:
    """The cores' worth the messages that start in [lo, hi) take over it (their CPU over the span)."""
    return sum(c * a.amount for a in acts if a.network and lo <= a.start < hi
               for r, c in a.coefs if r == res.cores) / (hi - lo)


def _occupancy_field(graph: StepGraph, cluster: ClusterSpec, acts: list[_Act], res: _Resources, k: int) -> _MeanField:
    """The speeds threads get on the shared cores where groups that share no clock run with a
    run's spread (``StepGraph.mean_field_cores`` with ``StepGraph.spread``): each group's compute
    thread at the mean, over the time it computes in the last (drawn) pass's measured window, of
    ``_thread_speed`` with as many threads as that schedule has busy then — its own among them —,
    a message's thread (one more) at the mean over the time messages run.

    ``_mean_field`` takes the other groups busy independently of each other. They are not: the
    servers that every group passes in turn (the conv model server's link, the merged FC server)
    space them, so their compute overlaps more evenly. Traced on the emulated cluster (2 cores, a
    Zen 3 VM; each rank's compute spans): vgg16_cifar, 4 groups of one machine at 1 Gbit/s, the
    threads computing at once had a variance of 0.43 against 1.17 for the same busy shares drawn
    independently (mean 1.88: 1, 2, 3 busy 26, 59, 14% of the time); alexnet_cifar there, 0.59
    against 1.14 (mean 3.10: 2, 3, 4 busy 20, 49, 28%). The drawn schedule has them as the run does
    — 1.79 (27, 67, 6%) and 3.07 (23, 44, 30%) —, where the independent draws of ``_mean_field``
    had 2.2 and 3.5 threads busy on average beside the schedule's own 2.07 and 3.12; vf144's row of
    vgg16_cifar, at the link's bound in the run (1.978 s a round), predicted 2.274 s that way and
    2.038 s this way."""
    lo, hi = _window(acts, k)
    if hi <= lo:
        return _MeanField(dict.fromkeys(graph.groups, 1.0), 1.0)
    comm = _messages_cores(acts, res, lo, hi)
    comps = [a for a in acts if not a.network and a.cpu_threads > 0 and a.end > lo and a.start < hi]
    edges = sorted([(max(a.start, lo), a.cpu_threads) for a in comps] + [(min(a.end, hi), -a.cpu_threads) for a in comps])
    starts: list[float] = []  # stretches of constant occupancy: (start, end, threads busy)
    stretches: list[tuple[float, float, float]] = []
    busy, last = 0.0, lo
    for t, d in edges:
        if t > last:
            starts.append(last)
            stretches.append((last, t, busy))
        busy, last = busy + d, t

    def mean_speed(spans: list[tuple[float, float]], extra: float, taken: float) -> float:
        num = den = 0.0
        for a0, a1 in spans:
            i = max(0, bisect.bisect_right(starts, a0) - 1)
            while i < len(stretches) and stretches[i][0] < a1:
                s0, s1, m = stretches[i]
                w = min(s1, a1) - max(s0, a0)
                if w > 0:
                    num += w * _thread_speed(cluster, round(m + extra, 6), taken)
                    den += w
                i += 1
        return num / den if den > 0 else 1.0

    out = {g: mean_speed([(max(a.start, lo), min(a.end, hi)) for a in comps if g in a.rows], 0.0, comm)
           for g in graph.groups}
    messages = [(max(a.start, lo), min(a.end, hi)) for a in acts if a.network and a.end > lo and a.start < hi]
    return _MeanField(out, mean_speed(messages, 1.0, 0.0))


def _between(acts: list[_Act], ends: list[_Act]) -> list[_Act]:
    """The compute activities that follow one of ``ends`` and precede another of the same iteration
    in the graph (walking that iteration only)."""
    out: list[_Act] = []
    for it in {a.iteration for a in ends}:
        mine = [a.index for a in ends if a.iteration == it]
        if len(mine) < 2:
            continue

        def reach(step) -> set[int]:
            seen: set[int] = set()
            todo = list(mine)
            while todo:
                for j in step(acts[todo.pop()]):
                    if j not in seen and acts[j].iteration == it:
                        seen.add(j)
                        todo.append(j)
            return seen

        out += [acts[j] for j in reach(lambda a: a.dependents) & reach(lambda a: a.deps)
                if not acts[j].network and acts[j].cpu_threads > 0]
    return out


def _window(acts: list[_Act], k: int) -> tuple[float, float]:
    """The measured window: from the end of iteration k//2 − 1 to the end of k − 1 (from 0 to the
    end of the only one when k = 1); the tail iterations are not measured."""
    finish = [0.0] * k
    for a in acts:
        if a.iteration < k and a.end > finish[a.iteration]:
            finish[a.iteration] = a.end
    return (0.0, finish[0]) if k == 1 else (finish[k // 2 - 1], finish[k - 1])


def _simulate_once(graph: StepGraph, cluster: ClusterSpec, k: int, tasks: list[Task], its: list[int],
                   speeds: "_MeanField | None", spread: Mapping[int, float] | None = None,
                   ) -> tuple[Prediction, list[_Act], _Resources]:
    """One event-driven run of the unrolled tasks (with ``speeds``: the mean field's; ``spread``: the
    compute times' draws; ``simulate``)."""
    groups = graph.groups
    res = _Resources(groups, cluster)
    acts = _compile(tasks, its, groups, cluster, res, speeds, spread)
    full = [c * (1 - 1e-9) for c in res.caps]
    nic_of = res.nic_of
    # One record per stretch of constant rates: (t0, t1, load per resource, saturated resources,
    # groups whose NIC is busy). Integrated over the measured window at the end.
    segments: list[tuple[float, float, dict[int, float], list[int], set[int]]] = []

    now = 0.0
    running: list[_Act] = []
    latent: list[tuple[float, int]] = []  # (end of latency phase, index)
    queues: dict[str, list[int]] = {}
    queue_busy: dict[str, bool] = {}
    ready = [a.index for a in acts if a.waiting == 0]
    done = 0

    def begin(a: _Act, fresh: list[int]) -> None:
        a.start = now
        if a.contested_cpu and _computing_threads(running, res.cores) < cluster.shared_cores - 1e-9:
            # a core is free: the message's ranks wake on it without taking a busy core's turn
            a.coefs = [(r, c - a.contested_cpu if r == res.cores else c) for r, c in a.coefs
                       if r != res.cores or c - a.contested_cpu > 1e-15]
        if a.latency > 0:
            heapq.heappush(latent, (now + a.latency, a.index))
        elif a.amount > 0:
            a.remaining = a.amount
            running.append(a)
        else:
            finish(a, fresh)

    def finish(a: _Act, fresh: list[int]) -> None:
        nonlocal done
        a.end = now
        done += 1
        follow = None  # a task of the same queue that a's end makes ready: the server goes on with it
        for d in a.dependents:
            b = acts[d]
            b.waiting -= 1
            if b.waiting == 0:
                if follow is None and a.queue is not None and b.queue == a.queue:
                    follow = b
                else:
                    fresh.append(d)
        if follow is not None:
            begin(follow, fresh)
        elif a.queue is not None:
            q = queues.get(a.queue)
            if q:
                begin(acts[q.pop(0)], fresh)
            else:
                queue_busy[a.queue] = False

    def launch(indices: list[int]) -> None:
        while indices:
            indices.sort()
            fresh: list[int] = []
            for i in indices:
                a = acts[i]
                if a.queue is not None:
                    if queue_busy.get(a.queue):
                        queues.setdefault(a.queue, []).append(i)
                        continue
                    queue_busy[a.queue] = True
                begin(a, fresh)
            indices = fresh

    # More compute threads than shared cores: the cores give oversubscribed_core_capacity instead
    over_caps = over_full = None
    if res.oversubscribed_cores is not None:
        over_caps = list(res.caps)
        over_caps[res.cores] = res.oversubscribed_cores
        over_full = [c * (1 - 1e-9) for c in over_caps]
    caps_now, full_now = res.caps, full

    # A token bucket in front of each NIC direction (LinkSpec.burst_bytes): bytes pass at once
    # (BURST_RATE times the line rate) while it holds a packet's worth; it drains by what passes
    # beyond the line rate and refills by what the link leaves unused, up to burst_bytes.
    burst = float(cluster.nic.burst_bytes)
    buckets = {r: burst for g in groups for r in (res.egress[g], res.ingress[g])} if burst > 0 else {}
    launch(ready)
    while running or latent:
        if running:
            caps_now, full_now = res.caps, full
            if over_caps is not None and speeds is None:  # (the mean field's pool does not bind)
                w = _oversubscribed_weight(running, res, cluster.shared_cores)
                if w >= 1.0:
                    caps_now, full_now = over_caps, over_full
                elif w > 0.0:
                    caps_now = list(res.caps)
                    caps_now[res.cores] -= w * (res.caps[res.cores] - res.oversubscribed_cores)
                    full_now = [c * (1 - 1e-9) for c in caps_now]
            if buckets:
                caps_now, full_now = list(caps_now), list(full_now)
                for r, level in buckets.items():
                    if level >= PACKET_BYTES:
                        caps_now[r] = full_now[r] = res.caps[r] * BURST_RATE
            if speeds is not None:  # the mean field: every thread at its mean speed, the pool not binding
                caps_now = list(caps_now)
                caps_now[res.cores] = math.inf
                _max_min_rates(running, caps_now, None)
            else:
                _max_min_rates(running, caps_now, res.cores)
        t_next = latent[0][0] if latent else math.inf
        for a in running:
            t = now + a.remaining / a.rate if a.rate > 0 else math.inf
            if t < t_next:
                t_next = t
        if buckets:
            t_next = _drain_buckets(buckets, running, res.caps, now, t_next, burst)
        if not math.isfinite(t_next):
            raise ConfigError("step graph: a task cannot make progress (a resource with no capacity)")
        dt = t_next - now
        if dt > 0 and running:
            usage: dict[int, float] = {}
            busy_nics: set[int] = set()
            for a in running:
                a.remaining -= a.rate * dt
                for r, c in a.coefs:
                    usage[r] = usage.get(r, 0.0) + c * a.rate
                if a.nic_group >= 0 and a.rate >= a.cap * (1 - 1e-9):
                    busy_nics.add(a.nic_group)
            sat = [r for r, u in usage.items() if u >= full_now[r]]
            for r in sat:
                if nic_of[r] >= 0:
                    busy_nics.add(nic_of[r])
            segments.append((now, t_next, usage, sat, busy_nics))
        now = t_next
        fresh: list[int] = []
        current = running[:]
        running.clear()  # finish() may begin queued tasks, which join ``running`` afresh
        for a in current:
            if a.remaining <= a.amount * 1e-9 or (a.rate > 0 and a.remaining / a.rate <= 1e-12 * max(now, 1e-300)):
                a.remaining = 0.0
                finish(a, fresh)
            else:
                running.append(a)
        while latent and latent[0][0] <= now * (1 + 1e-12):
            _, i = heapq.heappop(latent)
            a = acts[i]
            if a.amount > 0:
                a.remaining = a.amount
                running.append(a)
            else:
                finish(a, fresh)
        launch(fresh)

    if done < len(acts):
        stuck = [a.name for a in acts if math.isnan(a.end)]
        raise ConfigError(f"step graph: {len(stuck)} task(s) never start (a dependency cycle?): {', '.join(stuck[:5])}")
    return _predict(graph, acts, res, k, segments), acts, res


PACKET_BYTES = 1500.0
"""A token bucket passes bytes at once while it holds this much (one packet; below, the line rate)."""
BURST_RATE = 1e3
"""How much faster than the line rate a full bucket passes bytes (the other limits — the far end,
the CPU a byte costs — still hold)."""


def _drain_buckets(buckets: dict[int, float], running: list[_Act], caps: list[float], now: float, t_next: float,
                   burst: float) -> float:
    """Advance each NIC direction's token bucket to the next event, which is brought forward to
    the moment a bucket that passes bytes at once runs out of a packet's worth; returns it."""
    net: dict[int, float] = dict.fromkeys(buckets, 0.0)
    for a in running:
        for r, c in a.coefs:
            if r in net:
                net[r] += c * a.rate
    for r in net:
        d = net[r] - caps[r]  # > 0: the bucket drains; < 0: the link leaves rate unused, it refills
        net[r] = 0.0 if abs(d) < 1e-6 * caps[r] else d
        if net[r] > 0 and buckets[r] >= PACKET_BYTES:
            t_next = min(t_next, now + (buckets[r] - PACKET_BYTES * 0.5) / net[r])
    if math.isfinite(t_next):
        for r, d in net.items():
            level = buckets[r] - d * (t_next - now)
            buckets[r] = 0.0 if level < PACKET_BYTES * 0.5 else min(burst, level)
    return t_next


def _union_clipped(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    spans = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _predict(graph: StepGraph, acts: list[_Act], res: _Resources, k: int,
             segments: list[tuple[float, float, dict[int, float], list[int], set[int]]]) -> Prediction:
    lo, hi = _window(acts, k)
    count, measured = (1, {0}) if k == 1 else (k - 1 - (k // 2 - 1), set(range(k // 2, k)))
    span = hi - lo
    step = span / count

    nres = len(res.caps)
    load = [0.0] * nres
    sat_time = [0.0] * nres
    nic_time = [0.0] * len(graph.groups)
    for t0, t1, usage, sat, nics in segments:
        d = min(t1, hi) - max(t0, lo)
        if d <= 0:
            continue
        for r, u in usage.items():
            load[r] += u * d
        for r in sat:
            sat_time[r] += d
        for j in nics:
            nic_time[j] += d

    groups = dict(graph.groups)
    compute_iv: dict[str, list[tuple[float, float]]] = {g: [] for g in groups}
    comm_iv: dict[str, list[tuple[float, float]]] = {g: [] for g in groups}
    latency_iv: list[tuple[float, float]] = []
    sent = dict.fromkeys(groups, 0.0)
    recv = dict.fromkeys(groups, 0.0)
    payload = dict.fromkeys(groups, 0.0)
    links: dict[str, float] = {}
    timeline: list[TimelineEntry] = []
    for a in acts:
        for g in a.rows:
            if a.iteration < k:
                timeline.append(TimelineEntry(a.name, g, a.start, a.end, a.tag))
            if a.tag == "compute":
                compute_iv[g].append((a.start, a.end))
            elif a.tag == "comm":
                comm_iv[g].append((a.start, a.end))
        if a.latency > 0 and a.network:
            latency_iv.append((a.start, a.start + a.latency))
        if a.iteration in measured:
            for g, b in a.sent.items():
                sent[g] += b
            for g, b in a.recv.items():
                recv[g] += b
            for g, b in a.payload.items():
                payload[g] += b
            for key, b in a.links.items():
                links[key] = links.get(key, 0.0) + b
    work = {g: 0.0 for g in groups}  # compute seconds alone on a device, per step and node
    for a in acts:
        if a.iteration in measured and a.tag == "compute" and not a.network:
            for g in a.rows:
                work[g] += a.work
    breakdown = {g: {"compute_s": _union_clipped(compute_iv[g], lo, hi) / count,
                     "comm_s": _union_clipped(comm_iv[g], lo, hi) / count,
                     "compute_work_s": work[g] / count} for g in groups}
    share = (lambda x: x / span) if span > 0 else (lambda x: 0.0)
    utilization = {name: share(load[r] / cap) for r, (name, cap) in enumerate(zip(res.names, res.caps))}
    saturated = {name: share(sat_time[r]) for r, name in enumerate(res.names)}
    nic_busy = {g: share(nic_time[j]) for j, g in enumerate(groups)}
    latency_share = share(_union_clipped(latency_iv, lo, hi))
    bottleneck = _bottleneck(res, saturated, nic_busy, latency_share)
    total = sum(sent.values()) / count
    pred = Prediction(
        step_time_s=step,
        samples_per_step=graph.samples_per_step,
        throughput_samples_per_s=graph.samples_per_step / step if step > 0 else math.inf,
        groups=groups,
        breakdown=breakdown,
        bytes_sent_per_node={g: sent[g] / count / groups[g] for g in groups},
        bytes_received_per_node={g: recv[g] / count / groups[g] for g in groups},
        bytes_sent_by_role={g: sent[g] / count for g in groups},
        payload_sent_per_node={g: payload[g] / count / groups[g] for g in groups},
        bytes_per_link={key: b / count for key, b in links.items()},
        total_bytes=total,
        utilization=utilization,
        saturated=saturated,
        latency_share=latency_share,
        bottleneck=bottleneck,
        timeline=tuple(timeline),
        iterations=k,
        window_s=(lo, hi),
    )
    return _report_as(pred, graph.report_as) if graph.report_as else pred


def _report_as(pred: Prediction, report_as: Mapping[str, str]) -> Prediction:
    """``pred`` with the groups of ``report_as`` merged into their roles (StepGraph.report_as)."""
    role = {g: report_as.get(g, g) for g in pred.groups}
    nodes: dict[str, int] = {}
    for g, n in pred.groups.items():
        nodes[role[g]] = nodes.get(role[g], 0) + n

    def per_node(d: Mapping[str, float]) -> dict[str, float]:  # node-weighted mean
        out = dict.fromkeys(nodes, 0.0)
        for g, v in d.items():
            out[role[g]] += v * pred.groups[g] / nodes[role[g]]
        return out

    def summed(d: Mapping[str, float]) -> dict[str, float]:
        out = dict.fromkeys(nodes, 0.0)
        for g, v in d.items():
            out[role[g]] += v
        return out

    def resource(name: str) -> tuple[str, int]:  # "worker3 NIC egress" → ("worker NIC egress", 1 node)
        g, _, rest = name.partition(" ")
        return (f"{role[g]} {rest}", pred.groups[g]) if g in role and rest else (name, 0)

    def resources(d: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, v in d.items():
            key, n = resource(name)
            out[key] = out.get(key, 0.0) + (v * n / nodes[role[name.partition(" ")[0]]] if n else v)
        return out

    breakdown = {r: {} for r in nodes}
    for g, b in pred.breakdown.items():
        for f, v in b.items():
            breakdown[role[g]][f] = breakdown[role[g]].get(f, 0.0) + v * pred.groups[g] / nodes[role[g]]
    links: dict[str, float] = {}
    for key, b in pred.bytes_per_link.items():
        src, _, dst = key.partition("->")
        k2 = f"{role.get(src, src)}->{role.get(dst, dst)}"
        links[k2] = links.get(k2, 0.0) + b
    head, _, tail = pred.bottleneck.partition(" ")
    return replace(
        pred, groups=nodes, breakdown=breakdown,
        bytes_sent_per_node=per_node(pred.bytes_sent_per_node),
        bytes_received_per_node=per_node(pred.bytes_received_per_node),
        bytes_sent_by_role=summed(pred.bytes_sent_by_role),
        payload_sent_per_node=per_node(pred.payload_sent_per_node),
        bytes_per_link=links, utilization=resources(pred.utilization), saturated=resources(pred.saturated),
        bottleneck=f"{role[head]} {tail}" if head in role and tail else pred.bottleneck,
        timeline=tuple(e._replace(group=role.get(e.group, e.group)) for e in pred.timeline))


def _bottleneck(res: _Resources, saturated: Mapping[str, float], nic_busy: Mapping[str, float], latency_share: float) -> str:
    """The resource saturated for the largest share of the step. A NIC whose two directions are
    saturated one after the other (a server receiving every push, then sending every pull), or
    that carries a collective's critical path at full speed, counts as one busy NIC."""
    best_name, best = "none", 0.0
    for name, u in saturated.items():
        if u > best * (1 + 1e-9):
            best_name, best = f"{name} ({u:.0%} busy)", u
    for g, u in nic_busy.items():
        if u > best * (1 + 1e-6):
            e, i = saturated[res.names[res.egress[g]]], saturated[res.names[res.ingress[g]]]
            detail = f": ingress {i:.0%}, egress {e:.0%}" if e > 0 and i > 0 else ""
            best_name, best = f"{g} NIC ({u:.0%} busy{detail})", u
    if latency_share > best * (1 + 1e-9) and latency_share > 0:
        return f"network latency ({latency_share:.0%} of the step)"
    return best_name


__all__ = ["PATTERNS", "Collective", "Compute", "Delay", "Prediction", "StepGraph", "Task", "TimelineEntry", "Transfer",
           "iteration_name", "simulate"]
