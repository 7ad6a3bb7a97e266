"""What a run measures, per rank and per step, and the Measurement it adds up to.

Per step and rank: wall time, compute time (forward, backward, optimizer, packing), communication
time (time spent blocked in ``wait()`` or inside a collective), CPU time (the whole process's, all
threads: gloo's, DDP's reducer, a server's waiters — ``time.process_time``), bytes sent and
received, the rank's part of the loss (the parts of one step sum to the global-batch mean loss),
and the wall-clock time the step ended (``end_s``, ``time.time()``: comparable across ranks).

Bytes-counting rule (what the roles are *asked* to move, not TCP wire bytes):
- point to point: ``numel · element_size`` of every tensor a rank sends / receives;
- a collective (all-reduce, DDP's gradient buckets, DDP's buffer broadcast): the payload tensor's
  bytes, once per call, counted as both sent and received by every participant. The wire traffic
  of the algorithm is a multiple of it (ring all-reduce: 2·(n−1)/n × payload per rank), which the
  cost model charges; the runtime reports the payload so the two can be compared.
- checkpoint traffic (Stanza §5.3's FC parameter copies) is counted separately, not in the step.

The Measurement (a plain dict, the schema of the cost engine's Prediction.to_dict where they
overlap): strategy, model, config, world_size, nodes, roles {rank: kind}, batch_size,
global_batch, steps (run in this process: [first, last]), warmup_steps, step_time_s (median over
the steps after warm-up of the ranks' mean step wall time; asynchronous compute groups: the round
time their measured throughput gives, ``_group_round_s``), throughput_samples_per_s,
bytes_per_step {total, per_role {kind: sent bytes per rank per step}, per_rank [...]},
breakdown {kind: {compute_s, comm_s, cpu_cores, marks_s}} (per step, median after warm-up, mean
over the ranks of the kind; ``cpu_cores``: the rank's CPU time over its wall time in the steps
after warm-up, the cores it kept busy; ``marks_s``, where the role marks them (``Meter.mark``:
allreduce, stanza): when it reached each named point, the end of the schedule's task of that
name, after the step started (``_step_starts``: on the ranks of the role that opens the schedule) —
``predict.timeline_marks`` finds the same points in the predicted step), cpu_cores_busy (their
sum over every rank: on shared cores, against the cores there are, how busy the run kept them),
bottleneck (the kind with the largest compute time), loss [per step], step_times_s (the ranks'
mean wall of each step), checkpoint_bytes_sent; plus whatever a role adds to ``Meter.extra``
(groups: ``staleness`` and ``group_updates``, see ``roles/groups.py``).

Why the ranks' mean and not the slowest rank's wall: each rank's step ends at its own point of the
cycle (a worker when its push is in the kernel's buffers, the server when its last pull went out),
and that point moves from step to step with how the flows sharing a link happen to finish. Every
rank's walls add up to the same elapsed time, so each rank's mean is the period; the slowest rank
of each step is not — it takes the long side of every rank's jitter. Traced on the emulated cluster
(alexnet_cifar, Omnivore's 4 machines in one group, 100 Mbit/s): the 4 machines' pushes completed
1.1 s apart from one round to the next, the per-step maximum read 7.69 s a round where every
machine's own walls averaged 6.5–6.9 s.

Asynchronous roles (Omnivore's groups) keep the step loop: a step is one round (each group one
iteration; a server's step serves the next g arrivals). A server whose records do not line up
with the steps whose losses it computes files them with ``Meter.step_loss(step, part)``.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from typing import Any


def nbytes(t) -> int:
    return t.numel() * t.element_size()


class Meter:
    """Per-rank step records."""

    def __init__(self, rank: int, kind: str):
        self.rank = rank
        self.kind = kind
        self.records: list[dict[str, Any]] = []
        self._cur: dict[str, Any] | None = None
        self._t0 = 0.0
        self._cpu0 = 0.0
        self.checkpoint_bytes_sent = 0
        self.step_losses: dict[int, float] = {}
        self.extra: dict[str, Any] = {}
        """Strategy results that go into the Measurement under their own keys (rank-unique keys)."""

    def start_step(self, step: int) -> None:
        self._cur = {"step": step, "wall_s": 0.0, "compute_s": 0.0, "comm_s": 0.0, "cpu_s": 0.0, "sent_bytes": 0,
                     "recv_bytes": 0, "loss": None}
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()

    def end_step(self) -> dict[str, Any]:
        assert self._cur is not None
        self._cur["wall_s"] = time.perf_counter() - self._t0
        self._cur["cpu_s"] = time.process_time() - self._cpu0
        self._cur["end_s"] = time.time()  # wall clock: comparable across ranks and machines
        rec, self._cur = self._cur, None
        self.records.append(rec)
        return rec

    @contextmanager
    def compute(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            if self._cur is not None:
                self._cur["compute_s"] += time.perf_counter() - t

    @contextmanager
    def comm(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            if self._cur is not None:
                self._cur["comm_s"] += time.perf_counter() - t

    def mark(self, name: str) -> None:
        """The step reached ``name`` now (wall clock, as ``end_s``): a point of its cycle the cost
        model names too (a task of the strategy's schedule ends there), so that a run's phases can
        be set against the predicted timeline's (``summarize``'s ``marks_s``)."""
        if self._cur is not None:
            self._cur.setdefault("marks", {})[name] = time.time()

    def add_time(self, what: str, seconds: float) -> None:
        if self._cur is not None:
            self._cur[what] += seconds

    def sent(self, t_or_bytes) -> None:
        if self._cur is not None:
            self._cur["sent_bytes"] += t_or_bytes if isinstance(t_or_bytes, int) else nbytes(t_or_bytes)

    def recv(self, t_or_bytes) -> None:
        if self._cur is not None:
            self._cur["recv_bytes"] += t_or_bytes if isinstance(t_or_bytes, int) else nbytes(t_or_bytes)

    def collective(self, t_or_bytes) -> None:
        """A collective's payload: sent and received once by this rank."""
        self.sent(t_or_bytes)
        self.recv(t_or_bytes)

    def loss(self, part: float, shown: float | None = None) -> None:
        """``part``: this rank's share of the global-batch mean loss (the shares of a step sum to
        it); ``shown``: what the progress bar shows (the mean loss of the batch this rank saw)."""
        if self._cur is not None:
            self._cur["loss"] = (self._cur["loss"] or 0.0) + float(part)
            if shown is not None:
                self._cur["shown_loss"] = float(shown)

    def step_loss(self, step: int, part: float) -> None:
        """A share of global step ``step``'s loss, whichever of this rank's steps computed it."""
        self.step_losses[step] = self.step_losses.get(step, 0.0) + float(part)

    def fragment(self) -> dict[str, Any]:
        return {"rank": self.rank, "kind": self.kind, "records": self.records,
                "checkpoint_bytes_sent": self.checkpoint_bytes_sent, "step_losses": self.step_losses,
                "extra": self.extra}


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _group_round_s(fragments: list[dict[str, Any]], roles: dict, measured: set[int]) -> float | None:
    """Asynchronous compute groups (roles with a ``group``): the round time their throughput gives.
    Group j's iteration time w_j is the mean over its steady steps of its machines' step walls
    (their mean: see the module docstring); the groups together process N·B samples in
    g / Σ_j 1/w_j seconds (the harmonic mean of the w_j; = w when they are equal). Every rank's
    steps are not one period here: the g groups run out of phase (the per-step maximum over every
    rank read +17% on vgg16_cifar with 4 groups), and a server's step serves whichever arrivals come
    next. None when no rank belongs to a group.

    A group's steady steps are its measured steps that ended by the time the first group finished
    (``_steady_steps``): every group runs the same number of iterations, out of phase, so once the
    first is done the others' last iterations share the cores and the servers with fewer groups and
    run faster than the steady state the engine predicts."""
    members: dict[int, list[dict]] = {}
    for f in fragments:
        role = roles.get(f["rank"])
        if getattr(role, "group", None) is not None:
            members.setdefault(role.group, []).append(f)
    if not members:
        return None
    steady = _steady_steps(members, measured)
    inverse = 0.0
    for j, frags in members.items():
        walls = [r["wall_s"] for f in frags for r in f["records"] if r["step"] in steady[j]]
        if not walls:
            return None
        w = statistics.fmean(walls)
        if w <= 0:
            return None
        inverse += 1.0 / w
    return len(members) / inverse


def _steady_steps(members: dict[int, list[dict]], measured: set[int]) -> dict[int, set[int]]:
    """Group → its measured steps that every one of its machines ended by the time the first group
    ended its last measured step (records' ``end_s``); a group with none such (or records without
    ``end_s``, from an older layerplan) keeps every measured step."""
    ends: dict[int, dict[int, float]] = {}
    complete = True
    for j, frags in members.items():
        by_step: dict[int, float] = {}
        for f in frags:
            for r in f["records"]:
                if r["step"] in measured:
                    complete = complete and "end_s" in r
                    by_step[r["step"]] = max(by_step.get(r["step"], -math.inf), r.get("end_s", 0.0))
        ends[j] = by_step
    lasts = [max(e.values()) for e in ends.values() if e]
    if not lasts or not complete:
        return {j: set(e) for j, e in ends.items()}
    first_done = min(lasts)
    out = {}
    for j, e in ends.items():
        kept = {s for s, t in e.items() if t <= first_done}
        out[j] = kept or set(e)
    return out


def _marks_s(records: list[dict[str, Any]], starts: dict[int, float]) -> dict[str, float]:
    """Each mark (``Meter.mark``) that every one of ``records`` reached: its median time after its
    step's start (``starts``, wall clock)."""
    records = [r for r in records if r["step"] in starts]
    names = set.intersection(*(set(r.get("marks") or {}) for r in records)) if records else set()
    return {n: _median([r["marks"][n] - starts[r["step"]] for r in records]) for n in names}


OPENING_ROLE = {"stanza": "conv_worker", "hybrid": "conv_worker", "ralp": "worker"}
"""The role whose tasks open a strategy's schedule (the cost model's time 0), where it has others."""


def _step_starts(fragments: list[dict[str, Any]], opener: str | None = None) -> dict[int, float]:
    """When each step started, wall clock: the mean start of the ranks of the role that opens the
    schedule (``opener``, the cost model's time 0), else of the role that starts it last. A role
    that waits on others begins a step as soon as it is done with the last one and idles (Stanza's
    FC worker), so the opening role mostly starts last — but not always: Stanza's FC workers, two
    or more, sum their FC gradients at the end of their step, and at small batches the CONV
    workers are into the next step's forward by then. Its ranks start a few ms apart on shared
    cores (so the mean of them, not the last: a rank's marks then read as from its own start, on
    average). Steps some rank did not record with its ``end_s`` are left out."""
    by_kind: dict[int, dict[str, list[float]]] = {}
    missing: set[int] = set()
    for f in fragments:
        for r in f["records"]:
            if "end_s" not in r:
                missing.add(r["step"])
            else:
                by_kind.setdefault(r["step"], {}).setdefault(f["kind"], []).append(r["end_s"] - r["wall_s"])
    return {s: statistics.fmean(kinds[opener]) if opener in kinds else max(statistics.fmean(v) for v in kinds.values())
            for s, kinds in by_kind.items() if s not in missing}


def cpu_cores(records: list[dict[str, Any]]) -> float:
    """The cores a rank kept busy over ``records``: its CPU time over its wall time (records of an
    older layerplan, without ``cpu_s``, read 0)."""
    wall = sum(r["wall_s"] for r in records)
    return sum(r.get("cpu_s", 0.0) for r in records) / wall if wall > 0 else 0.0


def summarize(fragments: list[dict[str, Any]], spec, roles: dict, nodes: int, global_batch: int) -> dict[str, Any]:
    """Merge every rank's fragment into the Measurement dict (see the module docstring)."""
    fragments = sorted(fragments, key=lambda f: f["rank"])
    steps = sorted({r["step"] for f in fragments for r in f["records"]})
    measured = steps[spec.warmup_steps:] if len(steps) > spec.warmup_steps else steps
    by_step: dict[int, list[dict]] = {s: [] for s in steps}
    for f in fragments:
        for r in f["records"]:
            by_step[r["step"]].append(r)
    mean_wall = {s: statistics.fmean(r["wall_s"] for r in by_step[s]) for s in steps}
    step_times = [mean_wall[s] for s in steps]
    step_time = _median([mean_wall[s] for s in measured])
    rounds = _group_round_s(fragments, roles, set(measured))
    if rounds is not None:
        step_time = rounds
    losses = []
    for s in steps:
        parts = [r["loss"] for r in by_step[s] if r["loss"] is not None]
        parts += [f["step_losses"][s] for f in fragments if s in f.get("step_losses", {})]
        losses.append(float(sum(parts)) if parts else None)

    per_rank = []
    starts = _step_starts(fragments, OPENING_ROLE.get(spec.strategy))
    marks: dict[int, dict[str, float]] = {}
    kinds: dict[str, list[dict]] = {}
    for f in fragments:
        recs = [r for r in f["records"] if r["step"] in set(measured)] or f["records"]
        row = {"rank": f["rank"], "role": f["kind"],
               "sent": int(_median([r["sent_bytes"] for r in recs])),
               "recv": int(_median([r["recv_bytes"] for r in recs])),
               "compute_s": _median([r["compute_s"] for r in recs]),
               "comm_s": _median([r["comm_s"] for r in recs]),
               "cpu_cores": cpu_cores(recs)}
        marks[f["rank"]] = _marks_s(recs, starts)
        per_rank.append(row)
        kinds.setdefault(f["kind"], []).append(row)
    per_role = {k: int(round(statistics.fmean(r["sent"] for r in rows))) for k, rows in kinds.items()}
    breakdown = {k: {"compute_s": statistics.fmean(r["compute_s"] for r in rows),
                     "comm_s": statistics.fmean(r["comm_s"] for r in rows),
                     "cpu_cores": statistics.fmean(r["cpu_cores"] for r in rows)} for k, rows in kinds.items()}
    for k, rows in kinds.items():  # the marks every rank of the kind reached, averaged over them
        ms = [marks[r["rank"]] for r in rows]
        common = set.intersection(*(set(m) for m in ms))
        if common:
            breakdown[k]["marks_s"] = {n: statistics.fmean(m[n] for m in ms) for n in sorted(common, key=ms[0].get)}
    bottleneck = max(breakdown, key=lambda k: breakdown[k]["compute_s"]) if breakdown else None
    extra = {k: v for f in fragments for k, v in (f.get("extra") or {}).items()}
    return {
        **extra,
        "kind": "measurement",
        "strategy": spec.strategy,
        "model": spec.model,
        "config": dict(spec.config),
        "world_size": len(roles),
        "nodes": nodes,
        "roles": {str(r): role.kind for r, role in roles.items()},
        "data": spec.data,
        "threads_per_rank": spec.threads_per_rank,
        "batch_size": spec.batch_size,
        "global_batch": global_batch,
        "steps": [steps[0], steps[-1]] if steps else [],
        "warmup_steps": spec.warmup_steps,
        "step_time_s": step_time,
        "throughput_samples_per_s": global_batch / step_time if step_time > 0 else 0.0,
        "bytes_per_step": {"total": sum(r["sent"] for r in per_rank), "per_role": per_role, "per_rank": per_rank},
        "breakdown": breakdown,
        "cpu_cores_busy": sum(r["cpu_cores"] for r in per_rank),
        "bottleneck": bottleneck,
        "loss": losses,
        "step_times_s": step_times,
        "checkpoint_bytes_sent": {str(f["rank"]): f["checkpoint_bytes_sent"] for f in fragments},
    }


class Progress:
    """Rank 0's progress bar (rich): steps, loss (as far as rank 0 knows it), step time."""

    def __init__(self, enabled: bool, total: int, start: int, label: str):
        self._bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

        self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False,
                                 console=Console(stderr=True))  # stdout stays clean for --json
        self._task = self._bar.add_task(label, total=total, completed=start, info="")

    def __enter__(self):
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, rec: dict[str, Any]) -> None:
        if self._bar is None:
            return
        info = f"step {rec['wall_s'] * 1e3:.0f} ms"
        if rec.get("shown_loss") is not None:
            info = f"loss {rec['shown_loss']:.4f} (rank 0's batch)  " + info
        self._bar.update(self._task, advance=1, info=info)
