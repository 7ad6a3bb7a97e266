"""`layerplan validate`: run a matrix of strategies × networks × workers × link rates on the emulated
cluster and compare every measured step with the cost engine's prediction for it.

Per configuration: the median step after warm-up (runtime), the prediction with the calibrated
cluster and with presets only, the error (predicted − measured) / measured, the lower bound
max(compute, bytes / bandwidth) and the measured efficiency against it, and how busy the run kept
the shared cores (every rank's CPU time over its wall time, summed) against the engine's shared
cores busy — where the two part, the model has the CPU's work wrong, not the network's. Summary:
median, p90 and max |error|, Spearman ρ between predicted and measured step time, and per scenario
(net, workers, rate) whether the predicted best strategy is the measured best.

The full matrix also runs Omnivore's compute groups (N = workers conv machines + the merged FC
server + the conv model server) for several g dividing N; a groups row's step is one round (each
group one iteration) and it is labelled ``groups(g=G)``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from layerplan import hardware, units
from layerplan.cost.engine import idle_collective_cpu_s_per_byte
from layerplan.errors import ConfigError

RUNTIME_STRATEGIES = ("ps", "allreduce", "stanza", "ralp", "hybrid")
QUICK_STRATEGIES = ("ps", "allreduce", "stanza", "ralp")
EMULATION_NAME = "validate"


@dataclass(frozen=True)
class Matrix:
    models: tuple[str, ...]
    workers: tuple[int, ...]
    rates: tuple[str, ...]
    strategies: tuple[str, ...] = QUICK_STRATEGIES
    batch_size: int = 16
    target_s: float = 12.0
    """Measure about this long per configuration (steps = target / predicted step, clamped)."""
    min_steps: int = 3
    max_steps: int = 12
    max_step_s: float = 30.0
    """Configurations predicted slower than this per step are skipped, with the reason (at
    100 Mbit/s a parameter server moving vgg16_cifar's 134 MB four times takes 90 s a step: five
    such runs would double --full's time and are never a scenario's best)."""
    groups: tuple[int, ...] = (1,)
    """groups rows (when "groups" is among the strategies): these g, where they divide the workers."""
    decide_s: float = 60.0
    """Per rate, at most this many seconds of runs again to decide close scenarios (DECIDE_WITHIN)."""
    budget_s: float | None = None
    """The whole command's wall time, calibration included: where the rows' estimate at ``target_s``
    would overrun what the calibration left of it, each row measures fewer seconds of steps
    (``fit_target_s``, down to MIN_TARGET_S) — on a slower machine the calibration and every step
    take longer, and the matrix still ends in time."""
    calibrate_s: float | None = None
    """Under a budget, the seconds the calibration may take measuring disturbed sections again
    (``calibrate.calibrate``'s ``again_within_s``). Its sections took 4.6-5.0 min in full runs on
    a steady host; with other guests busy every one of them was disturbed and measured twice: 9.3
    min, which left the rows, at MIN_TARGET_S, over the budget (a full run of 47.2 min)."""
    link_tries: int = 0
    """How many times an unsteady rate's link measurements are taken at most (``measure_rate_links``;
    0: LINK_TRIES). --quick takes them once: with the calibration and the rows at their least, two
    tries more of the 1 Gbit/s link (70-90 s) took `make validate` to 10 min 32 s."""
    limit_s: float | None = None
    """The wall time the command must end within (``budget_s`` less its margin for the unforeseen):
    the deciding runs give way to it where the rows run behind their estimate (``decide_allowance_s``)."""


MATRICES = {
    # FC-heavy (alexnet_cifar) and conv-heavy (resnet_cifar), 2 workers, 100 Mbit/s and 1 Gbit/s.
    # At least 2 steps, as --full (alexnet_cifar's DDP at 100 Mbit/s: 10 s a step on a slower machine).
    # Its limit leaves 25 s for starting Python and torch and writing the plots: `make validate`
    # took 10 min 2 s at 600 (a calibration of 5.0 min, five sections measured twice) and 10 min
    # 1.5 s at 585 (its deciding runs overran their estimate: AGAIN_PROBES_S).
    "quick": Matrix(models=("alexnet_cifar", "resnet_cifar"), workers=(2,), rates=("100Mbit", "1Gbit"), target_s=8.0,
                    min_steps=2, max_steps=40, decide_s=25.0, budget_s=545.0, limit_s=575.0, link_tries=1,
                    calibrate_s=300.0),
    # + vgg16_cifar (the Stanza comparisons), 2 and 4 workers, 10 Gbit/s, hybrid (all three nets
    # have an FC phase it can partition) and Omnivore's groups with g = 1, 2, 4 (of 2 and 4 conv machines).
    # Configurations predicted over 20 s a step are left out (at 100 Mbit/s: vgg16_cifar and
    # alexnet_cifar ps, vgg16_cifar ralp and groups — never a scenario's best), ~8.5 s of steps are
    # measured per configuration, at least 2 (a 10 s step at 100 Mbit/s is one long, steady
    # transfer) and at most 30 (12 steps of resnet_cifar's 40 ms at 10 Gbit/s were 0.5 s, and a
    # step's time spreads ±15% from one to the next there), and close scenarios get 35 s a rate of
    # runs again (DECIDE_WITHIN), so --full fits 45 min: 124 configurations took 48 min with 12 s
    # and 3; 129 took 43.5-44.4 min with 10 s, 30 and no deciding; 42.7-43.1 min with 9 s, 45 s
    # a rate within 2%, and 45.3 min within 3%: so 8.5 s and 35 s. Three full runs at 35 s left
    # 2, 2 and 1 scenarios within 3% undecided for want of time (their gaps 0.8-2.8%): so 60 s,
    # the budget (``fit_target_s``) taking the 75 s from the rows' seconds of steps. Since the
    # rows measure MIN_TARGET_S (the calibration takes 4-7 min of the budget) full runs took
    # 39.5-42.2 min: 90 s, for DECIDE_CHECK_WITHIN's pairs (``decide_allowance_s`` keeps 45 min).
    # Its limit leaves 50 s for starting Python and torch, predicting the last rate's rows again with
    # its link's later readings, and writing the plots: at 2700 s vf142 took 45 min 2 s, its last link
    # measured again after its rows up to the limit; at 2675 s vf146, on a busy host, 45 min 3 s.
    "full": Matrix(models=("vgg16_cifar", "alexnet_cifar", "resnet_cifar"), workers=(2, 4),
                   rates=("100Mbit", "1Gbit", "10Gbit"), strategies=(*RUNTIME_STRATEGIES, "groups"), groups=(1, 2, 4),
                   max_step_s=20.0, target_s=8.5, min_steps=2, max_steps=30, decide_s=90.0, budget_s=2580.0,
                   limit_s=2650.0, calibrate_s=420.0),
}


def sync_nets(matrix: Matrix) -> tuple[str, ...]:
    """Whose training steps the calibration times in lockstep (``calibrate.measure_synchronized_steps``):
    all of the matrix's nets but the one of the most FLOPs a step (one net stays), the fewest FLOPs
    last (``collective_wait_s`` is timed on it). The cores' capacity is the median over the nets and
    moved by up to 5% from one to the next (one calibration here: vgg16_cifar 1.76, alexnet_cifar 1.82,
    resnet_cifar 1.85 of 2 cores), where vgg16_cifar's steps took 196 of the 376 s the three took."""
    from layerplan.netspec.load import resolve_model

    flops = {}
    for m in matrix.models:
        net = resolve_model(m)[0]
        flops[m] = net.fwd_flops + net.bwd_flops
    kept = sorted(matrix.models, key=lambda m: flops[m])[:max(1, len(matrix.models) - 1)]
    return tuple(sorted(kept, key=lambda m: -flops[m]))


def profile_batches(matrix: Matrix) -> tuple[int, ...]:
    """The batches the matrix's layers run at: K on every data worker, n·K on a Stanza FC worker or
    RALP PS worker that serves n workers."""
    return tuple(sorted({matrix.batch_size} | {matrix.batch_size * n for n in matrix.workers}))


@dataclass(frozen=True)
class Case:
    model: str
    strategy: str
    workers: int
    rate: str
    config: dict

    @property
    def scenario(self) -> tuple[str, int, str]:
        return (self.model, self.workers, self.rate)

    @property
    def label(self) -> str:
        return f"groups(g={self.config['groups']})" if self.strategy == "groups" else self.strategy


def cases(matrix: Matrix) -> list[Case]:
    """Every (model, workers, rate, strategy) of the matrix with the runtime config it runs: ps with
    one server, allreduce (DDP), stanza with one FC worker, ralp (RALP-N) at the profile's split,
    hybrid with its fc layers partitioned over two FC machines (n_c = workers), groups with n conv
    machines for each of the matrix's g that divides n."""
    out = []
    for rate in matrix.rates:
        for model in matrix.models:
            for n in matrix.workers:
                for s in matrix.strategies:
                    if s == "groups":
                        out += [Case(model, s, n, rate, config_for(s, n, g)) for g in matrix.groups if n % g == 0]
                        continue
                    out.append(Case(model, s, n, rate, config_for(s, n)))
    return out


def config_for(strategy: str, workers: int, groups: int | None = None) -> dict:
    """The runtime config a matrix row of ``strategy`` with ``workers`` runs."""
    if strategy == "groups":
        return {"machines": workers, "groups": groups}
    return {"ps": {"workers": workers, "servers": 1}, "allreduce": {"workers": workers},
            "stanza": {"conv_workers": workers, "fc_workers": 1}, "ralp": {"workers": workers},
            "hybrid": {"conv_workers": workers, "fc_workers": 2}}[strategy]


def lower_bound_s(pred: dict, rate_bytes_per_s: float) -> tuple[float, float, float]:
    """(bound, compute, communication): the busiest role's compute work — its compute alone on a
    core (cores shared: the sum of every rank's compute work over the cores) — and the most bytes
    one NIC moves in one direction over the line rate. No schedule can beat either."""
    groups = pred["groups"]

    def work(b: dict) -> float:  # compute alone on a core (older predictions: the shared time)
        return b.get("compute_work_s", b["compute_s"])

    comp_role = max((work(b) for b in pred["breakdown"].values()), default=0.0)
    cores = (pred.get("cluster") or {}).get("shared_cores")
    if cores:
        total = sum(work(b) * groups.get(r, 1) for r, b in pred["breakdown"].items())
        comp_role = max(comp_role, total / cores)
    b = pred["bytes_per_step"]
    sent = b.get("wire_per_role") or {}
    recv = b.get("wire_received_per_role") or {}
    nic = max([*sent.values(), *recv.values(), 0.0])
    comm = nic / rate_bytes_per_s
    return max(comp_role, comm), comp_role, comm


START_S = 2.0
"""Seconds a configuration costs besides its steps: forking the ranks into their hosts, building
the model, the rendezvous, the warm-up step's extra (a run's wall time less its warm-up and
measured steps at its median, measured by --quick: 0.4–2.2 s on a machine of 34 GFLOP/s a core,
alexnet_cifar's DDP at 100 Mbit/s 10.6 s, its first step broadcasting the model; 2–4 s before)."""
REPEAT_BELOW_S = 6.0
"""A configuration whose steps are predicted to take less than this in all (the matrix's steps
times its predicted step) is run a second time, after the rest of its rate's rows and in reverse
order, and its measured step is the mean of the two runs' medians. A short run's median moves
with the run more than with its steps: resnet_cifar's DDP, 2 workers at 10 Gbit/s, six runs of 30
steps one after another read 43.0-46.8 ms, and the same configuration read 40.9 ms half an hour
earlier; a run's own steps spread less than that. Where the matrix measures fewer seconds of steps
(a budget: ``fit_target_s``), the bound is REPEAT_BELOW_SHARE of them, if lower: the rows run twice
are still those cut short by ``max_steps``, not every row."""
REPEAT_BELOW_SHARE = 0.7


ROW_PROBE_WINDOW_S = 0.2
"""The speed probe before each row runs its calls this long (at calibration time: 0.3 s): it is a
record, and 129 rows' probes took 100 s of --full at 0.3 s."""
DECIDE_WITHIN = 0.03
"""Where a scenario's fastest configurations measured within this of the fastest one, ``validate``
runs them again, interleaved (``contenders``), before it names the measured best: their runs ran
minutes apart, and the machine drifts between them. resnet_cifar's DDP and stanza, 4 workers at
100 Mbit/s, run one after the other five times each: 207.4-211.0 and 206.5-211.8 ms, a 0.5%
difference of the means against a 1.7% spread of one's runs; over six full runs, each measured
once, stanza's step read 0.989-1.014 of DDP's. At 2 workers and 1 Gbit/s, DDP measured 0-6%
faster than stanza in eight full runs and 2.6% slower in the ninth (so 3%, not 2%)."""
DECIDE_CONTENDERS = 3
DECIDE_CHECK_WITHIN = 0.2
"""Where a scenario's predicted best and the fastest other configuration measured within this of
each other, those two run again as well (``contenders``): the summary's verdict on the prediction
is between them, and one run of each, minutes apart on a machine whose speed moves 5-10% from row
to row, can turn it either way. In vf60, resnet_cifar at 4 workers and 10 Gbit/s, ps and ralp
(predicted 1% apart) measured 10.2% apart, ps 5.8% slower and ralp 6.0% faster than predicted; and
at 1 Gbit/s stanza, its steps 15% slower than predicted, 8.9% behind groups(g=4) — both once. A
match and a miss are checked alike: the predicted best against its closest rival, whichever
measured faster. One run lands up to 10-12% from its row's mean (``repeatability``'s p90 in four
full runs), so two rows' gap can move twice that: at 0.12 (until vf94) ten verdicts in five full
runs stood on one run of each, the predicted best 13-17% behind its rival (vf94: alexnet_cifar and
vgg16_cifar, 4 workers at 10 Gbit/s, hybrid behind groups(g=2), which ran 7% and 19% faster than
predicted). vf95, at 0.2: 39 runs again to decide (vf94: 21), 15 of 18 scenarios' best predicted
(vf94: 11), 40.2 min."""
AGAIN_PROBES_S = 1.0
"""What a run again takes besides its run (``run_wall_s``): both cores' probe before and after it,
and its row written; a deciding round is charged it per run, and none starts that would end past
``Matrix.limit_s``."""
DECIDE_ROUNDS = 2
"""Rounds of runs again: each round runs every contender of every close scenario once, the slowest
first in the first round and the fastest first in the next (drift within a round weighs on both
ends alike); a scenario whose contenders a round leaves more than DECIDE_WITHIN apart is decided."""


def planned_throughput(row: dict) -> float:
    """The throughput a scenario's predicted best is named by: as calibrated (``calibrated_step_s``,
    before the machine's pace, where the row has one), every configuration at one speed as ``plan``
    ranks them before anything runs — the pace each row is predicted at (``pace``) moves with the
    rows before it, and so would a near-tie's verdict (over eleven full runs the rows' own paces and
    one speed named the measured best in 123 of 198 scenarios alike, not always the same ones)."""
    if row.get("calibrated_step_s") and row.get("predicted_step_s"):
        return row["predicted_throughput"] * row["predicted_step_s"] / row["calibrated_step_s"]
    return row["predicted_throughput"]


def contenders(rows: list[dict]) -> list[dict]:
    """One scenario's rows that ``validate`` runs again to decide which is fastest: those measured
    within DECIDE_WITHIN of the fastest (at most DECIDE_CONTENDERS), and the predicted best with the
    fastest other row where those two measured within DECIDE_CHECK_WITHIN of each other, or
    whatever their gap where the fastest is one run whose probes read disturbed (``disturbed``);
    fastest first; none where fewer than two are."""
    rs = sorted(rows, key=lambda r: r["measured_step_s"])
    close = [r for r in rs[:DECIDE_CONTENDERS] if r["measured_step_s"] <= rs[0]["measured_step_s"] * (1 + DECIDE_WITHIN)]
    predicted = [r for r in rs if r.get("predicted_throughput") is not None]
    if len(predicted) > 1:  # the predicted best as ``summarize`` names it
        best = max(predicted, key=planned_throughput)
        rival = next(r for r in rs if r is not best)
        lo, hi = sorted((best["measured_step_s"], rival["measured_step_s"]))
        if hi <= lo * (1 + DECIDE_CHECK_WITHIN) or disturbed(rs[0]):
            close += [r for r in (best, rival) if not any(r is c for c in close)]
    close.sort(key=lambda r: r["measured_step_s"])
    return close if len(close) > 1 else []


def disturbed(row: dict) -> bool:
    """Whether ``row`` stands on one run whose probes of both cores read below DISTURBED_LOAD of
    the calibration's (``load_speed``; a row run again while disturbed keeps the steadier run, and
    a run later only replaces it: ``validate``'s ``again``). In vf104, vgg16_cifar at 4 workers and
    10 Gbit/s, groups(g=4) measured 16% faster than predicted at 0.66 — every other row there 4-17%
    slower — 21% ahead of the predicted best, and was named the measured best on that run alone."""
    return row.get("load_speed", 1.0) < DISTURBED_LOAD and not row.get("measured_runs_s")


def gap(rows: list[dict], scenario: tuple) -> float:
    """How far apart a scenario's fastest two rows measured (their steps' ratio less 1; inf with one)."""
    steps = sorted(r["measured_step_s"] for r in rows if (r["model"], r["workers"], r["rate"]) == scenario)
    return steps[1] / steps[0] - 1.0 if len(steps) > 1 and steps[0] > 0 else math.inf


def decide_allowance_s(to_deadline_s: float, spent_s: float, planned_s: float, later_s: list[float],
                       decide_s: float) -> float:
    """Seconds of deciding runs a rate may take under a budget: what is left before the deadline
    once the later rates are done — each its planned wall time (rows and RATE_OVERHEAD_S) at the
    pace the rows went so far (``spent_s`` of rows against the ``planned_s`` of them; never
    faster than planned) and its own ``decide_s``. A full run on a slow stretch of the machine
    (its rows and rates 25% over their estimate, seven rows run again as disturbed) took 49.9 min
    of its 45 with every rate's deciding runs in full. ``validate`` counts to ``Matrix.limit_s``
    (the budget, 43 min in --full, is what the rows are fitted to)."""
    pace = max(1.0, spent_s / planned_s) if planned_s > 0 else 1.0
    return max(0.0, to_deadline_s - sum(pace * s + decide_s for s in later_s))


def run_wall_s(row: dict) -> float:
    """The wall time one run of a row took (its runs' mean)."""
    return row["wall_s"] / max(1, len(row.get("measured_runs_s") or [None]))


def repeats(matrix: Matrix, predicted_step_s: float) -> int:
    """How many times ``validate`` runs a configuration predicted to take ``predicted_step_s`` a step."""
    below_s = min(REPEAT_BELOW_S, REPEAT_BELOW_SHARE * matrix.target_s)
    return 2 if measured_steps(matrix, predicted_step_s) * predicted_step_s < below_s else 1


def measured_steps(matrix: Matrix, predicted_step_s: float) -> int:
    """Steps measured after warm-up: about ``matrix.target_s`` of them, clamped to the matrix's range."""
    return max(matrix.min_steps, min(matrix.max_steps, math.ceil(matrix.target_s / max(predicted_step_s, 1e-3))))


MIN_TARGET_S = 4.0
"""``fit_target_s`` measures no row for less than this many seconds of steps (at least the matrix's
``min_steps``): resnet_cifar's steps spread ±15% from one to the next, and a run's median settles
over a few seconds of them."""
RATE_OVERHEAD_S = 60.0
"""Seconds a rate costs besides its rows: bringing the emulated cluster up and down, and timing its
link (messages, the duplex all-reduce, the flows' lead: ``measure_link``, ``measure_duplex``,
``measure_flow_lead``; unsteady link measurements taken again add up to 70 s: ``LINK_TRIES``).
validate.json's ``rate_wall_s`` less its rows' ``wall_s`` is what it took."""
ROW_OVERHEAD_S = 2.6
"""Seconds a configuration costs besides its runs: the speed probes around it (three, 0.55-0.61 s
each), its net's pass before it (``calibrate.net_probe``: 0.4 s, vgg16_cifar's pass 0.7 s), its
predictions (7 s for 126 rows) and the JSON written after it."""


def unmeasured_steps(strategy: str, config: Mapping[str, Any]) -> int:
    """Steps a run takes besides ``measured_steps``: its warm-up (``RunSpec.warmup_steps``) and,
    where groups run asynchronously (g > 1), one more round: each group but the first to finish
    loses its last iteration to the steady window (``metrics._steady_steps``)."""
    from layerplan.runtime.run_spec import RunSpec

    warmup = RunSpec(model="-", strategy=strategy, config=config).warmup_steps
    return warmup + (1 if strategy == "groups" and int(config.get("groups", 1)) > 1 else 0)


def row_estimate_s(matrix: Matrix, predicted_step_s: float, warmup_steps: int, runs: int | None = None) -> float:
    """The wall time one configuration is estimated to take: its runs (``repeats``, or ``runs``),
    each a start and its warm-up and measured steps."""
    runs = repeats(matrix, predicted_step_s) if runs is None else runs
    return ROW_OVERHEAD_S + runs * (START_S + (measured_steps(matrix, predicted_step_s) + warmup_steps) * predicted_step_s)


def fit_target_s(matrix: Matrix, steps: Iterable[tuple[float, int]], available_s: float) -> float:
    """The longest ``target_s``, at most the matrix's and at least MIN_TARGET_S (in 0.25 s), with
    which the configurations — ``steps``: (predicted step, warm-up steps) each — are estimated to
    run within ``available_s`` (``row_estimate_s``); MIN_TARGET_S where none does. Every candidate
    is tried: a row cut short by ``max_steps`` runs twice (``repeats``), so the estimate need not
    fall with the target."""
    steps = list(steps)
    t = matrix.target_s
    while t > MIN_TARGET_S:
        m = replace(matrix, target_s=t)
        if sum(row_estimate_s(m, s, w) for s, w in steps) <= available_s:
            return t
        t = max(MIN_TARGET_S, t - 0.25)
    return min(matrix.target_s, MIN_TARGET_S)


LEAVE_OUT_BEHIND = 2.0
"""Under a budget whose rows do not fit even at MIN_TARGET_S (a calibration disturbed in every
section took 9.5 min of vf122's and its rows at 4 s took --full to 48 min), the configurations
predicted at least this many times their scenario's predicted best step are left out, the longest
first, until the rest fit (``leave_out``): in vf122-vf124 every row predicted so far behind measured
1.89x or more behind its scenario's measured best. Stanza and its two peers (ps, allreduce: the
speedups) are kept."""

COMPARED = ("stanza", "ps", "allreduce")
"""The strategies of the speedups (``speedups``), which ``leave_out`` never leaves out."""


def pending_estimate_s(matrix: Matrix, r: Mapping[str, Any], runs: int | None = None) -> float:
    """``row_estimate_s`` of one of ``estimate``'s rows (its predicted step, strategy and config);
    ``runs`` = 1: without the second run a short row gets (``repeats``)."""
    return row_estimate_s(matrix, r["predicted_step_s"], unmeasured_steps(r["strategy"], r["config"]), runs)


def behind_best(pending: list[dict]) -> dict[tuple, float]:
    """Each of ``estimate``'s rows' predicted step over its scenario's best predicted step (by ``key``)."""
    best: dict[tuple, float] = {}
    for r in pending:
        sc = (r["model"], r["workers"], r["rate"])
        best[sc] = min(best.get(sc, math.inf), r["predicted_step_s"])
    return {key(r): r["predicted_step_s"] / best[(r["model"], r["workers"], r["rate"])] for r in pending}


def leave_out(pending: list[dict], matrix: Matrix, available_s: float) -> dict[tuple, str]:
    """Which of ``pending`` (``estimate``'s rows: predicted step, strategy, config) to leave out,
    each with the reason, so that the others' estimated wall time at ``matrix.target_s``
    (``row_estimate_s``) fits ``available_s``: those predicted LEAVE_OUT_BEHIND or more times their
    scenario's predicted best and not COMPARED, the longest first, as many as it takes (all of
    them where that is not enough); none where the rows fit."""
    total_s = sum(pending_estimate_s(matrix, r) for r in pending)
    if total_s <= available_s:
        return {}
    ratio = behind_best(pending)
    behind = [(pending_estimate_s(matrix, r), ratio[key(r)], r) for r in pending
              if r["strategy"] not in COMPARED and ratio[key(r)] >= LEAVE_OUT_BEHIND]
    out = {}
    for row_s, times, r in sorted(behind, key=lambda x: -x[0]):
        if total_s <= available_s:
            break
        total_s -= row_s
        out[key(r)] = (
            f"predicted {times:.1f}× its scenario's best step: left out to end within the budget of "
            f"{(matrix.budget_s or 0) / 60:.1f} min (the rows at {matrix.target_s:g} s of steps would overrun it)")
    return out


def behind_plan(pending: list[dict], matrix: Matrix, available_s: float, slow: float) -> dict[tuple, str]:
    """Under a limit, before a rate, where the rows run so far took ``slow`` times their estimate
    (``pending_estimate_s``; a host slower than at calibration): which of ``pending`` (the rows
    left, ``estimate``'s) to leave out so that the others, that much slower than estimated, end
    within ``available_s`` — those predicted farthest behind their scenario's predicted best first,
    whatever the ratio, never COMPARED; none where they fit. vf148's host ran its rows 1.2× their
    estimate (its paces a median 0.85×) and its disturbed rows again: 47.4 min, 2.4 over the 45
    that its plan, made at calibration time, kept (``leave_out``)."""
    total_s = slow * sum(pending_estimate_s(matrix, r) for r in pending)
    if total_s <= available_s:
        return {}
    ratio = behind_best(pending)
    out = {}
    for r in sorted((r for r in pending if r["strategy"] not in COMPARED), key=lambda r: -ratio[key(r)]):
        if total_s <= available_s:
            break
        total_s -= slow * pending_estimate_s(matrix, r)
        out[key(r)] = (f"predicted {ratio[key(r)]:.1f}× its scenario's best step: left out to end within the "
                       f"command's limit of {(matrix.limit_s or 0) / 60:.1f} min (the rows so far took "
                       f"{slow:.2f}× their estimate: the machine ran slower than at calibration)")
    return out


def estimate(matrix: Matrix, calibrated: hardware.ClusterSpec | None = None, done: Iterable[Case] = ()) -> list[dict]:
    """What ``validate`` would run, without running it: per configuration the predicted step, the
    steps it would measure and its estimated wall time (or why it is skipped or already done)."""
    from layerplan.runtime import emulate
    from layerplan.runtime.layout import world_size
    from layerplan.runtime.model import check, resolve
    from layerplan.runtime.run_spec import RunSpec

    finished = {key(c) for c in done}
    out = []
    for c in cases(matrix):
        row = {"model": c.model, "strategy": c.strategy, "label": c.label, "workers": c.workers, "rate": c.rate,
               "config": c.config, "predicted_step_s": None, "steps": None, "estimated_s": 0.0, "skip": None}
        out.append(row)
        spec = RunSpec(model=c.model, strategy=c.strategy, config=c.config, batch_size=matrix.batch_size)
        try:
            check(spec, resolve(spec)[0])
        except ConfigError as e:
            row["skip"] = str(e)
            continue
        emu = emulate.Emulated(name=EMULATION_NAME, hosts=world_size(spec),
                               rate_bytes_per_s=units.parse_bandwidth(c.rate), subnet=0)
        step = sizing_step_s(c, emu, calibrated, matrix)
        row["skip"] = too_slow(c, emu, calibrated, matrix, step)
        if row["skip"]:
            continue
        row["predicted_step_s"] = step
        row["steps"] = measured_steps(matrix, step)
        if key(c) in finished:
            row["skip"] = "measured already (--resume)"
            continue
        row["runs"] = repeats(matrix, step)
        row["estimated_s"] = row_estimate_s(matrix, step, unmeasured_steps(c.strategy, c.config))
    return out


def key(case_or_row) -> tuple:
    """What identifies a configuration across runs (for --resume)."""
    if isinstance(case_or_row, Case):
        return (case_or_row.model, case_or_row.label, case_or_row.workers, case_or_row.rate)
    r = case_or_row
    return (r["model"], r.get("label", r["strategy"]), r["workers"], r["rate"])


def run_case(case: Case, emu, calibrated: hardware.ClusterSpec | None, matrix: Matrix,
             run_dir: Path, predicted_step_s: float | None = None) -> dict[str, Any]:
    """Run ``case`` on ``emu`` for about ``matrix.target_s`` of steps after warm-up; the predicted
    step that sizes it is ``predicted_step_s`` where the caller has it, else ``sizing_step_s``."""
    from layerplan.runtime.launch import launch_emulated
    from layerplan.runtime.run_spec import RunSpec

    spec = RunSpec(model=case.model, strategy=case.strategy, config=case.config, batch_size=matrix.batch_size,
                   steps=matrix.max_steps, progress=False, timeout_s=60.0)
    if predicted_step_s is None:
        predicted_step_s = sizing_step_s(case, emu, calibrated, matrix)
    steps = measured_steps(matrix, predicted_step_s)
    spec = spec.replace(steps=steps + unmeasured_steps(case.strategy, case.config),
                        timeout_s=max(60.0, 10 * predicted_step_s))
    t0 = time.perf_counter()
    m = launch_emulated(spec, emu.name, run_dir=run_dir, quiet=True, start="fork")
    wall = time.perf_counter() - t0
    row = {
        "model": case.model, "strategy": case.strategy, "label": case.label, "workers": case.workers, "rate": case.rate,
        "rate_bytes_per_s": emu.rate_bytes_per_s, "batch_size": spec.batch_size, "run_config": case.config,
        "global_batch": m["global_batch"], "steps_measured": len(m["step_times_s"]) - m["warmup_steps"]
        if "step_times_s" in m else steps,
        "measured_step_s": m["step_time_s"], "measured_throughput": m["throughput_samples_per_s"],
        "measured_bytes_per_step": m["bytes_per_step"]["total"], "wall_s": wall,
    }
    if "cpu_cores_busy" in m:  # how busy the run kept the shared cores (metrics.py: CPU time over wall time)
        row["measured_cpu_cores"] = m["cpu_cores_busy"]
        row["measured_cpu_cores_by_role"] = {k: b["cpu_cores"] for k, b in m["breakdown"].items()}
    marks = {k: b["marks_s"] for k, b in m["breakdown"].items() if b.get("marks_s")}
    if marks:  # where in its step each role reached the schedule's points (metrics.Meter.mark)
        row["measured_marks_s"] = marks
    return row


RUNS_DISAGREE = 0.15
"""Where a configuration's two runs' steps differ by more than this (the slower over the faster,
less 1), ``validate`` runs it a third time and takes the median: resnet_cifar's groups(g=2) at 2
workers and 10 Gbit/s read 43.8 and 70.3 ms in one full run, 43-48 ms in every run of five others.
A row run once whose deciding run brings its second likewise, as long as the rate's deciding time
lasts, the two farthest apart first: in vf154, vgg16_cifar's hybrid at 2 workers and 10 Gbit/s
read 0.677 and 0.492 s (predicted 0.487), and on their mean it was named 6.4% behind stanza."""


def disagree(row: dict) -> bool:
    """Whether ``row``'s runs are two that differ by more than RUNS_DISAGREE."""
    runs = row.get("measured_runs_s") or []
    return len(runs) == 2 and min(runs) > 0 and max(runs) / min(runs) - 1.0 > RUNS_DISAGREE


def merge_runs(first: dict, again: dict) -> dict:
    """One row from runs of a configuration: the measured step is the mean of two runs' and the
    median of more (``measured_runs_s`` keeps each: one disturbed run of three does not count),
    throughput from it, steps and wall time summed; the cores busy, the marks and ``fc_speed`` the
    mean of the runs'."""
    runs = [*first.get("measured_runs_s", [first["measured_step_s"]]), again["measured_step_s"]]
    step = statistics.fmean(runs) if len(runs) < 3 else statistics.median(runs)
    cpu, n = {}, len(runs) - 1  # ``first`` holds the mean of n runs' cores busy
    if "measured_cpu_cores" in first and "measured_cpu_cores" in again:
        cpu["measured_cpu_cores"] = (n * first["measured_cpu_cores"] + again["measured_cpu_cores"]) / (n + 1)
        cpu["measured_cpu_cores_by_role"] = {k: (n * v + again["measured_cpu_cores_by_role"].get(k, v)) / (n + 1)
                                             for k, v in first["measured_cpu_cores_by_role"].items()}
    if first.get("fc_speed") and again.get("fc_speed"):  # and the FC probe's reading before each run
        cpu["fc_speed"] = (n * first["fc_speed"] + again["fc_speed"]) / (n + 1)
    if "measured_marks_s" in first and "measured_marks_s" in again:  # likewise the marks
        cpu["measured_marks_s"] = {k: {m: (n * t + again["measured_marks_s"].get(k, {}).get(m, t)) / (n + 1)
                                       for m, t in v.items()} for k, v in first["measured_marks_s"].items()}
    return {**first, **cpu, "measured_runs_s": runs, "measured_step_s": step,
            "measured_throughput": first["global_batch"] / step if step > 0 else 0.0,
            "steps_measured": first["steps_measured"] + again["steps_measured"], "wall_s": first["wall_s"] + again["wall_s"]}


def scored(pred: dict, meas: float) -> dict[str, Any]:
    """A prediction's errors against the measured step ``meas`` (calibrated and presets) and the
    efficiency against its lower bound, each where ``pred`` has its figure."""
    out: dict[str, Any] = {}
    for name, field in (("error", "predicted_step_s"), ("preset_error", "preset_predicted_step_s"),
                        ("calibrated_error", "calibrated_step_s")):
        if pred.get(field) is not None:
            out[name] = (pred[field] - meas) / meas if meas > 0 else None
    if "lower_bound_s" in pred:
        out["efficiency"] = pred["lower_bound_s"] / meas if meas > 0 else None
    return out


def rescored(row: dict) -> dict:
    """A row whose measured step changed (runs again: ``merge_runs``) against the prediction it has.
    The prediction depends on the configuration and its rate's link measurements, the same for
    every run of it (``prediction``), and on its pace: where it has one, ``validate`` predicts it
    again at its runs' pace (``run_pace``) before this."""
    return {**row, **scored(row, row["measured_step_s"])}


def prediction(row: dict, emu, calibrated: hardware.ClusterSpec | None) -> dict[str, Any]:
    """The predicted half of a row (measured: ``row``'s): with the calibrated cluster and with the
    presets, the error of each, the lower bound and the efficiency against it. Where the row has
    its link's measured CPU cost per byte at its rate (``link_cpu_s_per_byte``, both ends), that
    replaces the calibration's; where it has the link's measured payload rate
    (``link_payload_bytes_per_s``), that over the line rate is the link's efficiency; where it has
    the link measured both ways at once (``link_duplex``), ``duplex_efficiency`` fits it (and,
    where it has the CPU of both, ``reduce_cpu_s_per_byte`` replaces the calibration's, and where
    the engine has that all-reduce bound by its CPU, ``collective_core_share``); where it
    has flows from one host measured (``link_flow_lead``), its ``flow_lead_bytes``; where it has a
    ring's bytes measured beside its ranks' compute (``link_busy_cpu_s_per_byte``), the
    collectives' ``collective_busy_cpu_s_per_byte``; where it has
    the machine's ``pace``, the device computes at that speed (``DeviceSpec.at_speed``), and the
    prediction without it is kept as ``calibrated_step_s`` (its error ``calibrated_error``)."""
    from layerplan.runtime.predict import predict_run, timeline_marks
    from layerplan.runtime.run_spec import RunSpec

    spec = RunSpec(model=row["model"], strategy=row["strategy"], config=row["run_config"], batch_size=row["batch_size"])
    preset_cluster = emu.cluster_spec()
    cluster = calibrated_for(emu, calibrated) if calibrated else preset_cluster
    if calibrated and row.get("link_cpu_s_per_byte") is not None:
        cluster = replace(cluster, comm_cpu_s_per_byte=row["link_cpu_s_per_byte"] / 2.0)  # per end
    if calibrated and row.get("link_payload_bytes_per_s"):  # the link's efficiency as measured at its rate
        cluster = replace(cluster, nic=replace(cluster.nic, efficiency=min(
            1.0, row["link_payload_bytes_per_s"] / cluster.nic.bandwidth_bytes_per_s)))
    if calibrated and row.get("link_duplex"):
        red = reduce_cpu_s_per_byte(row["link_duplex"], row.get("link_cpu_s_per_byte"))
        if red is not None:  # the reduction's CPU as this path costs it (before the duplex fit, which uses it)
            cluster = replace(cluster, reduce_cpu_s_per_byte=red)
        share = collective_core_share(row["link_duplex"], cluster)
        if share is not None:  # a ring its CPU bounds: its threads' share of a core (before the duplex fit, which uses it)
            cluster = replace(cluster, collective_core_share=share)
        cluster = replace(cluster, nic=replace(cluster.nic, duplex_efficiency=duplex_efficiency(row["link_duplex"],
                                                                                                 cluster)))
    busy = row.get("link_busy_cpu_s_per_byte") if calibrated else None
    busy_charged = busy is not None and busy >= BUSY_RING_APART * idle_collective_cpu_s_per_byte(cluster, reduces=True)
    if busy_charged:
        cluster = replace(cluster, collective_busy_cpu_s_per_byte=busy)  # a ring's bytes beside its ranks' compute
    if calibrated and row.get("link_flow_lead"):  # how the link shares flows that leave a host together
        cluster = replace(cluster, nic=replace(cluster.nic, flow_lead_bytes=row["link_flow_lead"]["flow_lead_bytes"]))
    as_calibrated = None
    if calibrated and (row.get("pace") or {}).get("speed"):
        as_calibrated = predict_run(spec, cluster)
        cluster = replace(cluster, device=cluster.device.at_speed(row["pace"]["speed"],
                                                                  memory_speed=row["pace"].get("memory_speed")))
    pred = predict_run(spec, cluster)
    preset = predict_run(spec, preset_cluster) if calibrated else pred
    meas = row["measured_step_s"]
    bound, comp, comm = lower_bound_s(pred, emu.rate_bytes_per_s)
    out = {
        "config": pred["config"], "predicted_step_s": pred["step_time_s"],
        "preset_predicted_step_s": preset["step_time_s"],
        "predicted_throughput": pred["throughput_samples_per_s"],
        "lower_bound_s": bound, "lower_bound_compute_s": comp, "lower_bound_comm_s": comm,
        "predicted_bytes_per_step": pred["bytes_per_step"]["total"], "bottleneck": pred["bottleneck"],
        "link_efficiency": cluster.nic.efficiency, "link_duplex_efficiency": cluster.nic.duplex_efficiency,
        "link_flow_lead_bytes": cluster.nic.flow_lead_bytes,
        "link_busy_charged": busy_charged if busy is not None else None,
        "link_core_share": cluster.collective_core_share,
        # the engine's shared cores busy (its load over the capacity) as cores of CPU time, as the run counts them
        "predicted_cpu_cores": pred["utilization"]["shared cores"] * cluster.shared_cores
        if cluster.shared_cores and "shared cores" in pred["utilization"] else None,
    }
    if row.get("measured_marks_s"):  # the same points of the predicted step
        out["predicted_marks_s"] = timeline_marks(pred, row["measured_marks_s"])
        if calibrated:  # and of the step as calibrated: how fast the run went, for the rows after (``pace``)
            out["calibrated_marks_s"] = timeline_marks(as_calibrated or pred, row["measured_marks_s"])
    if as_calibrated is not None:
        out["calibrated_step_s"] = as_calibrated["step_time_s"]
    return {**out, **scored(out, meas)}


PACE_FIELDS = ("pace", "calibrated_step_s", "calibrated_error", "calibrated_marks_s")


def repredict(doc: dict, calibrated: hardware.ClusterSpec | None, paced: bool = True) -> dict:
    """A validate result's measured rows predicted again — with the current model and
    ``calibrated`` (None: the presets) — without running anything. ``paced``: each row at the pace
    of the rows before it (``pace``: their marks against this calibration's step, or the probes
    read against the calibration the run made; another calibration was made at another pace, so
    pass False)."""
    from layerplan.runtime import emulate
    from layerplan.runtime.layout import world_size
    from layerplan.runtime.run_spec import RunSpec

    rows = []
    before = [{k: v for k, v in r.items() if k not in PACE_FIELDS} for r in doc["rows"]]
    for r in before:  # vf113 timed the net after its run too, net_speed the slower: the reading before, as now
        if isinstance(r.get("net_probe_s"), list) and r.get("net_speed"):
            r["net_speed"] *= max(r["net_probe_s"]) / r["net_probe_s"][0]
            r["net_probe_s"] = r["net_probe_s"][0]
    for r in before:  # in the order they ran: each row's pace from the rows before it as predicted now
        if paced and calibrated:
            r = {**r, "pace": pace(rows)}
        if "run_config" not in r:  # rows of an older layerplan: the matrix's config for the row
            label = r.get("label", r["strategy"])
            g = int(label.split("=")[1].rstrip(")")) if r["strategy"] == "groups" else None
            r = {**r, "run_config": config_for(r["strategy"], r["workers"], g)}
        spec = RunSpec(model=r["model"], strategy=r["strategy"], config=r["run_config"], batch_size=r["batch_size"])
        emu = emulate.Emulated(name=EMULATION_NAME, hosts=world_size(spec), rate_bytes_per_s=r["rate_bytes_per_s"],
                               subnet=0)
        rows.append({**r, **prediction(r, emu, calibrated)})
    return {"summary": summarize(rows), "rows": rows, "skipped": doc.get("skipped", []),
            "calibrated_cluster": calibrated.to_dict() if calibrated else None,
            **{k: v for k, v in doc.items() if k.startswith(("speed_", "load_", "memory_", "net_"))}}


def sizing_step_s(case: Case, emu, calibrated: hardware.ClusterSpec | None, matrix: Matrix) -> float:
    """The predicted step that sizes ``case``'s run and decides whether it runs (``too_slow``):
    with the calibration as it is for ``emu`` (``prediction`` adds the rate's link measurements)."""
    from layerplan.runtime.predict import predict_run
    from layerplan.runtime.run_spec import RunSpec

    spec = RunSpec(model=case.model, strategy=case.strategy, config=case.config, batch_size=matrix.batch_size)
    return predict_run(spec, calibrated_for(emu, calibrated) if calibrated else emu.cluster_spec())["step_time_s"]


def too_slow(case: Case, emu, calibrated: hardware.ClusterSpec | None, matrix: Matrix,
             step: float | None = None) -> str | None:
    """Why ``case`` is left out (its predicted step, ``step`` or ``sizing_step_s``, exceeds
    ``matrix.max_step_s``), or None."""
    step = sizing_step_s(case, emu, calibrated, matrix) if step is None else step
    if step <= matrix.max_step_s:
        return None
    return (f"predicted {step:.0f} s per step, over the matrix's {matrix.max_step_s:.0f} s: "
            f"{matrix.min_steps + 1} steps would take {(matrix.min_steps + 1) * step / 60:.0f} min")


UNSHAPED_RATE = "400Gbit"
"""A rate no tbf limit reaches here: the emulated path then runs as fast as the CPU moves bytes."""


def emulated_comm_cpu_s_per_byte(nbytes: int = 200_000_000) -> float:
    """CPU seconds per byte at each end of a message on the emulated cluster's path (veth, bridge,
    tbf qdiscs: more kernel work per byte than loopback, which ``calibrate`` fits on): one TCP
    stream between two hosts of an unshaped cluster is CPU-bound at both ends, so each end spends
    1/R per byte. Measured here: R ≈ 1.2 GB/s, against ≈ 3.9 GB/s on loopback."""
    from layerplan.runtime import emulate

    with emulate.running(2, UNSHAPED_RATE, EMULATION_NAME + "-cpu") as emu:
        return 1.0 / emulate.measure_rate(emu, nbytes=nbytes)


def with_emulated_comm_cpu(calibrated: hardware.ClusterSpec, c_s_per_byte: float) -> hardware.ClusterSpec:
    """A local calibration with the emulated path's per-byte CPU cost (the larger of the two)."""
    return replace(calibrated, comm_cpu_s_per_byte=max(calibrated.comm_cpu_s_per_byte, c_s_per_byte))


def calibrated_for(emu, calibrated: hardware.ClusterSpec) -> hardware.ClusterSpec:
    """The emulated cluster's spec with the calibrated device, CPU cost of communication and link
    efficiency/latency."""
    base = emu.cluster_spec(device=calibrated.device)
    cap = calibrated.shared_core_capacity
    over = calibrated.oversubscribed_core_capacity
    if calibrated.shared_cores:  # the same share of the cores
        if cap is not None:
            cap = min(base.shared_cores, cap * base.shared_cores / calibrated.shared_cores)
        if over is not None:
            over = min(base.shared_cores, over * base.shared_cores / calibrated.shared_cores)
    base = replace(base, comm_cpu_s_per_byte=calibrated.comm_cpu_s_per_byte,
                   reduce_cpu_s_per_byte=calibrated.reduce_cpu_s_per_byte, shared_core_capacity=cap,
                   oversubscribed_core_capacity=over, oversubscribed_wait_s=calibrated.oversubscribed_wait_s,
                   oversubscribed_message_cpu_s=calibrated.oversubscribed_message_cpu_s,
                   collective_wait_s=calibrated.collective_wait_s)
    if not calibrated.name.startswith("emulated"):  # a local calibration knows loopback, not these links
        return base
    nic = replace(base.nic, efficiency=calibrated.nic.efficiency, latency_s=calibrated.nic.latency_s)
    return replace(base, nic=nic)


def spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr(x, y).statistic
    return None if rho is None or not math.isfinite(rho) else float(rho)


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def summarize(rows: list[dict]) -> dict[str, Any]:
    errs = [abs(r["error"]) for r in rows]
    effs = efficiencies(rows)
    preset = [abs(r["preset_error"]) for r in rows]
    speeds = [r["speed"] for r in rows if r.get("speed")]
    scenarios: dict[tuple, list[dict]] = {}
    for r in rows:
        scenarios.setdefault((r["model"], r["workers"], r["rate"]), []).append(r)
    resolution = statistics.median(errs) if errs else 0.0  # the model's own median |error| over the matrix
    best = []
    for key, rs in scenarios.items():
        if len(rs) < 2:
            continue
        p = max(rs, key=planned_throughput)  # as ``plan`` would rank them: at one speed
        m = max(rs, key=lambda r: r["measured_throughput"])
        pl, ml = p.get("label", p["strategy"]), m.get("label", m["strategy"])
        # the runner-up by prediction, and every configuration predicted within the model's median
        # |error| of the best: the prediction cannot tell those from it. resnet_cifar at 4 workers and
        # 1 Gbit/s puts stanza, DDP and groups(g=4) within 1.2% of each other, where their rows err by
        # 2-3% either way: over twelve full runs the measured best was groups(g=4) 5 times,
        # groups(g=2) 4, DDP 2 and hybrid once, never the predicted stanza
        # (by throughput, as the best is named: a scenario's configurations need not step the same samples)
        others = sorted((r for r in rs if r is not p), key=planned_throughput, reverse=True)
        top = planned_throughput(others[0])
        margin = planned_throughput(p) / top - 1.0 if top > 0 else math.inf
        close = [r.get("label", r["strategy"]) for r in others
                 if planned_throughput(r) * (1 + resolution) >= planned_throughput(p)]
        # what following the prediction costs: the predicted best's measured throughput short of the best's
        loss = 1.0 - p["measured_throughput"] / m["measured_throughput"] if m["measured_throughput"] > 0 else 0.0
        # how far apart the two runs of either configuration were (rows run twice: REPEAT_BELOW_S)
        noise = max((run_spread(r) for r in (p, m)), default=0.0)
        best.append({"model": key[0], "workers": key[1], "rate": key[2], "predicted_best": pl,
                     "measured_best": ml, "match": pl == ml, "choice_loss": loss,
                     "within_run_spread": pl != ml and loss <= noise,
                     "predicted_runner_up": others[0].get("label", others[0]["strategy"]), "predicted_margin": margin,
                     "too_close": close, "among_close": pl == ml or ml in close,
                     # its fastest were run again, interleaved, to decide (DECIDE_WITHIN)
                     "decided": [r.get("label", r["strategy"]) for r in rs if r.get("decider_runs")]})
    return {
        "configurations": len(rows),
        "median_abs_error": statistics.median(errs) if errs else None,
        "p90_abs_error": percentile(errs, 90) if errs else None,
        "max_abs_error": max(errs) if errs else None,
        "preset_median_abs_error": statistics.median(preset) if preset else None,
        "speed_range": [min(speeds), max(speeds)] if speeds else None,
        "slow_rows": sum(1 for x in speeds if x < SLOW_SPEED),
        "steady_rows": steady_errors(rows),
        "marks_pace": marks_pace(rows),
        "repeatability": repeatability(rows),
        # runs again (a short row's second, deciding runs) not kept: the cores slowed around them (DISTURBED_LOAD)
        "dropped_runs": sum(len(r.get("dropped_runs", [])) for r in rows),
        "memory_speed": speed_figures([r["memory_speed"] for r in rows if r.get("memory_speed")]),
        "fc_speed": speed_figures([r["fc_speed"] for r in rows if r.get("fc_speed")]),
        **paced_figures(rows),
        "spearman": spearman([r["predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows]),
        "best_match_fraction": (sum(b["match"] for b in best) / len(best)) if best else None,
        "best_within_run_spread": sum(b["within_run_spread"] for b in best),
        # the measured best is the predicted best or one predicted within the model's median |error| of it
        "best_among_close_fraction": (sum(b["among_close"] for b in best) / len(best)) if best else None,
        "best_decided": sum(bool(b["decided"]) for b in best),
        "max_choice_loss": max((b["choice_loss"] for b in best), default=None),
        "scenarios": best,
        "speedups": speedups(rows),
        "efficiencies": effs,
        "efficiency_verdict": efficiency_verdict(effs),
        "by_strategy": by_strategy(rows),
    }


def steady_errors(rows: list[dict]) -> dict[str, Any] | None:
    """The |error| figures over the rows whose speed probe read at least ``SLOW_SPEED`` of the
    calibration's: what the model does while the machine ran as calibrated (on a host-slowed VM,
    one full run's 56 such rows erred 4.7% at the median where all 127 erred 5.1%, another's 8.0%
    against 16.6%). None where no row has a probe, or none ran slowed (the overall figures say it)."""
    probed = [r for r in rows if r.get("speed") is not None]
    if all(r["speed"] >= SLOW_SPEED for r in probed):
        return None
    return error_figures([abs(r["error"]) for r in probed if r["speed"] >= SLOW_SPEED])


def pace(before: list[dict]) -> dict[str, Any] | None:
    """The machine's pace for the next row: by default (``PACE_FIELD`` "marks") the median speed at
    which the last PACE_MARKS_ROWS rows of ``before`` (in the order they ran) with marked points
    reached them against their step as calibrated (1 / ``latest_marks_ratio`` of
    ``calibrated_marks_s``: each role's latest point, ``PACE_MARKS``; "all": ``marks_ratio``);
    else the median ``PACE_FIELD`` reading (else ``load_speed``) of the last PACE_PROBES rows that
    have one, with the median ``memory_speed`` of the last PACE_PROBES that have one
    (``MEMORY_PACE``). How many rows it stands on; None where none has a reading."""
    if PACE_FIELD == "marks":
        read = latest_marks_ratio if PACE_MARKS == "last" else marks_ratio
        ratios = (read(r, "calibrated_marks_s") for r in before)
        speeds = [1.0 / x for x in ratios if x][-PACE_MARKS_ROWS:]
    else:
        readings = (r.get(PACE_FIELD) or r.get("load_speed") for r in before)
        speeds = [v for v in readings if v][-PACE_PROBES:]
    if not speeds:
        return None
    out = {"speed": statistics.median(speeds), "probes": len(speeds)}
    if PACE_FIELD == "marks":
        out["follows"] = "marks"
    memory = [r["memory_speed"] for r in before if r.get("memory_speed")][-PACE_PROBES:]
    if memory and MEMORY_PACE and PACE_FIELD != "marks":  # non-matmul layers at the memory probe's (marks time them)
        out["memory_speed"] = statistics.median(memory)
    return out


def run_pace(before: dict | None, runs: int, now: dict | None) -> dict | None:
    """The pace of a row whose step is the mean of ``runs`` runs paced at ``before`` and one more
    paced at ``now`` (``runs`` 0: the new run replaces them): the mean of their speeds, a run with
    no pace (none marked before it) at the calibration's (1.0). A row run again — a short row's
    second run, a deciding run, minutes later — was paced at its first run's moment only until
    vf120, whose 39 such rows erred a median 7.1% (max 32.7%) against 2.8% (max 19.1%) for its 87
    rows of one run: resnet_cifar's ps at 4 workers and 10 Gbit/s paced at 1.01× when it first ran
    and measured as the mean with a deciding run in a faster stretch."""
    if before is None and now is None:
        return None
    speed = lambda p: p["speed"] if p else 1.0  # noqa: E731
    mean = (runs * speed(before) + speed(now)) / (runs + 1)
    out = {**(now or before), "speed": mean}
    for k in ("memory_speed",):
        if (now or {}).get(k) and (before or {}).get(k) and runs:
            out[k] = (runs * before[k] + now[k]) / (runs + 1)
    return {**out, "runs": runs + 1} if runs else out


def paced_figures(rows: list[dict]) -> dict[str, Any]:
    """Where rows were predicted at the machine's pace (``pace``): the paces' range and median
    (``pace``) and the |error| figures of the predictions as calibrated, without it
    (``as_calibrated``); nothing where none was."""
    paces = speed_figures([r["pace"]["speed"] for r in rows if r.get("calibrated_step_s") is not None])
    if not paces:
        return {}
    errs = [abs(r["calibrated_error"] if r.get("calibrated_error") is not None else r["error"]) for r in rows]
    if any((r.get("pace") or {}).get("follows") == "marks" for r in rows):
        follows, window = "marks", PACE_MARKS_ROWS
    else:  # an older result without net_speed: its probes
        follows, window = PACE_FIELD if any(r.get(PACE_FIELD) for r in rows) else "load_speed", PACE_PROBES
    return {"pace": {**paces, "probes": window, "follows": follows}, "as_calibrated": error_figures(errs)}


def speed_figures(speeds: list[float]) -> dict[str, Any] | None:
    """How many speeds (ratios to a calibration-time reading) and their median, min and max; None
    where there are none."""
    if not speeds:
        return None
    return {"rows": len(speeds), "median": statistics.median(speeds), "min": min(speeds), "max": max(speeds)}


def marks_ratio(row: dict, predicted: str = "predicted_marks_s") -> float | None:
    """The median over a row's marked points (``measured_marks_s``: where in its step each role
    reached the schedule's points, e.g. the end of forward/backward or of the update) of the measured
    time over the predicted time of the same point (``predicted``: the row's prediction, or
    ``calibrated_marks_s``, the step as calibrated); None where the row has none to compare."""
    meas, pred = row.get("measured_marks_s") or {}, row.get(predicted) or {}
    ratios = [t / pred[role][mark] for role, marks in meas.items() for mark, t in marks.items()
              if (pred.get(role) or {}).get(mark, 0.0) > 0.0]
    return statistics.median(ratios) if ratios else None


def latest_marks_ratio(row: dict, predicted: str = "predicted_marks_s") -> float | None:
    """Per role, the measured over the predicted time (``predicted``, as in ``marks_ratio``) of the
    marked point the prediction puts latest in the role's step — the one that has the most of the
    step behind it — and the median of that over the roles; None where no role has one to compare."""
    meas, pred = row.get("measured_marks_s") or {}, row.get(predicted) or {}
    ratios = []
    for role, marks in meas.items():
        known = [(pred[role][mark], t) for mark, t in marks.items() if (pred.get(role) or {}).get(mark, 0.0) > 0.0]
        if known:
            at_s, t = max(known)
            ratios.append(t / at_s)
    return statistics.median(ratios) if ratios else None


def marks_pace(rows: list[dict]) -> dict[str, Any] | None:
    """How late the runs reached their steps' marked points against the prediction (``marks_ratio``):
    the median, p10 and p90 over the rows, overall and per rate. Where the one-thread probe
    (``speed``) reads the machine as calibrated and the marks still come late, the cores ran slower
    under the runs than at calibration: in one full run, alexnet_cifar's and resnet_cifar's rows at
    1 and 10 Gbit/s reached their marks a median 1.19-1.58× their predicted time while the probe read
    0.93-0.97× (their step times erred a median -23% to -37%). None where no row has marks."""
    def figures(ratios: list[float]) -> dict[str, Any]:
        return {"rows": len(ratios), "median": statistics.median(ratios),
                "p10": percentile(ratios, 10), "p90": percentile(ratios, 90)}

    by_rate: dict[str, list[float]] = {}
    for r in rows:
        x = marks_ratio(r)
        if x is not None:
            by_rate.setdefault(r["rate"], []).append(x)
    if not by_rate:
        return None
    return {**figures([x for xs in by_rate.values() for x in xs]),
            "by_rate": {rate: figures(xs) for rate, xs in by_rate.items()}}


def error_figures(errs: list[float]) -> dict[str, Any]:
    """How many |errors| and their median, p90 and max (None where there are none)."""
    return {"configurations": len(errs), "median_abs_error": statistics.median(errs) if errs else None,
            "p90_abs_error": percentile(errs, 90) if errs else None, "max_abs_error": max(errs, default=None)}


def run_spread(r: dict) -> float:
    """(max − min) / mean of a row's runs' steps (``measured_runs_s``); 0 for a row run once."""
    runs = r.get("measured_runs_s") or []
    return (max(runs) - min(runs)) / statistics.fmean(runs) if len(runs) > 1 else 0.0


def repeatability(rows: list[dict]) -> dict[str, Any] | None:
    """How far a configuration's runs land from the step its row keeps (``measured_runs_s``: rows
    run more than once — the short ones, REPEAT_BELOW_S, and the contenders run again to decide,
    DECIDE_WITHIN): the rows, the runs, and the median, p90 and max of |run / kept step − 1|. The
    same configuration measured minutes apart on the same machine: a floor under the |error|
    figures that no model of the configuration can go below (in seven full runs on this shared
    VM, a median 2.0–3.8%, p90 4.7–11.5%, max 13–31%). None where no row ran twice."""
    devs = [abs(t / r["measured_step_s"] - 1.0) for r in rows if len(r.get("measured_runs_s") or ()) > 1
            and r["measured_step_s"] > 0 for t in r["measured_runs_s"]]
    if not devs:
        return None
    return {"rows": sum(1 for r in rows if len(r.get("measured_runs_s") or ()) > 1), "runs": len(devs),
            "median": statistics.median(devs), "p90": percentile(devs, 90), "max": max(devs)}


def by_strategy(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per strategy: its rows, and the median, p90 and max |error| over them."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["strategy"], []).append(abs(r["error"]))
    return {k: error_figures(v) for k, v in groups.items()}


def speedups(rows: list[dict]) -> list[dict]:
    """Stanza against ps and against DDP in every scenario that has them: measured and predicted."""
    out = []
    by = {(r["model"], r["workers"], r["rate"], r["strategy"]): r for r in rows}
    for (model, n, rate, s), r in by.items():
        if s != "stanza":
            continue
        for peer in ("ps", "allreduce"):
            q = by.get((model, n, rate, peer))
            if q:
                meas = q["measured_step_s"] / r["measured_step_s"]
                pred = q["predicted_step_s"] / r["predicted_step_s"]
                out.append({"model": model, "workers": n, "rate": rate, "vs": peer, "measured": meas, "predicted": pred,
                            "error": (pred - meas) / meas})
    return out


EFFICIENCY_TARGET = 0.85
"""Stanza and DDP should reach this share of their lower bound, max(compute, bytes/bandwidth);
where a row does not, the summary gives the model's efficiency for it and its bottleneck, the reason."""


def efficiencies(rows: list[dict]) -> list[dict]:
    """Stanza's and DDP's efficiency against the lower bound in every scenario that has both:
    measured, predicted (the bound over the predicted step) and the model's bottleneck."""
    by = {(r["model"], r["workers"], r["rate"], r["strategy"]): r for r in rows}
    out = []
    for (model, n, rate, s), r in by.items():
        if s == "stanza" and (model, n, rate, "allreduce") in by:
            for q in (r, by[(model, n, rate, "allreduce")]):
                if "lower_bound_s" not in q:
                    continue
                out.append({"model": model, "workers": n, "rate": rate, "strategy": q["strategy"],
                            "measured": q["efficiency"], "predicted": q["lower_bound_s"] / q["predicted_step_s"],
                            "bottleneck": q.get("bottleneck")})
    return out


def efficiency_verdict(effs: list[dict]) -> dict[str, Any] | None:
    """The efficiency figure's verdict over ``efficiencies``: how many rows reach EFFICIENCY_TARGET;
    how many the model predicts below it on this machine (the issue's "if the model says a target
    cannot be met, show the prediction and the reason": each keeps its bottleneck), and how far
    their measured efficiency lay from the model's (``max_difference``: the largest, a share of the
    lower bound as the efficiencies are; ×100 the percentage points printed); and how
    many the model predicts at the target or above that measured below it (``short``: the misses).
    None where there are no rows."""
    if not effs:
        return None
    below = [e for e in effs if e["measured"] < EFFICIENCY_TARGET and e["predicted"] < EFFICIENCY_TARGET]
    return {"target": EFFICIENCY_TARGET, "rows": len(effs),
            "reach": sum(e["measured"] >= EFFICIENCY_TARGET for e in effs),
            "predicted_below": len(below),
            "max_difference": max((abs(e["measured"] - e["predicted"]) for e in below), default=None),
            "short": sum(e["measured"] < EFFICIENCY_TARGET <= e["predicted"] for e in effs)}


LINK_CPU_REPEATS = 3
DUPLEX_S, DUPLEX_REPEATS = 2.0, 3
"""The link both ways at once: 2 s of bytes, 3 times (one all-reduce at 100 Mbit/s takes 1.02–1.06×
the message; 5 times before, 40 s a rate on a machine of 34 GFLOP/s a core)."""
PACE_OFF = 0.1
"""Where the runs reached their marked points (``marks_pace``) a median more than this share off
their predicted time, the summary says the calibration no longer describes the machine: 1.18× and
1.33× in two full runs whose rows, predicted again with the calibration of a slower moment, erred
5.3% and 4.0% at the median (against 15.3% and 18.2%); 0.95-1.01× in runs that met their figures."""
SLOW_SPEED = 0.9
"""A row whose speed probe read below this is flagged: the machine was busy with something else."""
MEMORY_PACE = True
"""A row's ``pace`` carries the median ``memory_speed`` of the PACE_PROBES rows before it, and the
measured times of its layers that are not matrix products (batch norm, ReLU, pooling: the caches and
memory) run at that pace instead of the cores' (``DeviceSpec.at_speed``). On a 2-core EPYC (Zen 5)
VM whose other guests held the memory probe at 0.5-0.8× its calibration-time speed through a whole
full run (vf106) while both cores' compute probe read 0.72-1.06×, resnet_cifar's rows — rich in
batch norm — were predicted a median 10.1% fast; at the memory pace 4.8%, and every row's median /
p90 / max |error| 5.1 / 17.8 / 28.1% → 3.8 / 14.8 / 21.5%. Where the two probes read alike it moves
little, and not always closer: the next full run there (vf107: memory 0.70-0.99×, compute 0.67-0.93×
over the paces) 3.6 / 12.2 / 25.3% → 4.0 / 13.0 / 25.5%; on a Xeon VM (vf93) 4.2 / 14.8 / 44.3% →
4.7 / 15.3 / 45.7%."""
PACE_FIELD = "marks"
"""What a row's ``pace`` follows: "marks" (the speed at which the rows before it reached their
steps' marked points against their step as calibrated: PACE_MARKS_ROWS), or a probe's reading:
``net_speed`` (the row's own net's training pass on both
cores just before its run, ``calibrate.net_probe``) or ``load_speed`` (``calibrate.speed_probe``'s
convolution and matrix product on both cores, around it), each against its calibration-time
reading; a row without it (a result of an older layerplan) counts by its ``load_speed``. On a 2-core
EPYC (Zen 4) VM whose other guests moved the nets' passes apart from the compute probe (vf112: the
probe read a median 0.81× through the run while the rows' steps ran at the calibration's speed),
vf113's 126 rows paced by the compute probe erred 5.2 / 24.7 / 52.0% (median / p90 / max |error|),
reached their marked points at 0.89× the time predicted and were predicted slow for every strategy
(signed medians +1.8 to +9.3%); by their nets' passes, repredicted, 5.3 / 15.4 / 35.3%, marks at
1.01× and signed medians −3.5 to +0.4% (the slower of a probe before and after the run: 5.7 / 15.6
/ 40.8%). But each probe stands on its reading at calibration time, a second of it: vf114's
calibration was disturbed, its nets' passes read slow then (alexnet_cifar's 0.505 s against 0.28-0.46
through the rows), and its rows, paced by them at a median 1.12× while they ran at 0.86× (their
steps as calibrated over the measured), erred 19.1 / 35.4 / 43.8% (by the compute probe 4.4 / 15.8 /
31.5%, which vf112 and vf113 it had misled: 10.7 / 29.7 / 50.3% and 5.2 / 24.7 / 52.0%). The runs'
own marked points need no reference: over those five full runs (vf110-vf114, repredicted) paced by
them 4.6-6.9% at the median, p90 12.9-19.8%, max 22.3-35.2%; by the probes 4.4-19.8 / 12.7-36.6 /
20.1-50.3%; as calibrated 5.1-13.1 / 19.1-31.0 / 30.0-39.9%."""
PACE_MARKS_ROWS = 6
"""A row's marks pace stands on the last this many rows with marked points run before it (the
compute groups' rows mark none; RALP's since vf116): over vf110-vf114 the median |error| of 2, 3, 4, 6 and 8 rows averaged
5.6, 5.9, 5.8, 5.6 and 5.9%, the max 28.9, 28.9, 29.7, 28.5 and 30.7%. A row's own marks are not
its pace: they are its measurement."""
PACE_MARKS = "last"
"""Which of a marked row's points its speed for the pace is read at: "last" (``latest_marks_ratio``:
each role's latest point, the median over the roles) or "all" (``marks_ratio``: the median over
every point, until vf118). The early points — the end of forward, of the convolutions' forward, an
FC worker's per-layer forward, the activations' arrival — came a median 0.90-0.99× their paced time
at 1 and 10 Gbit/s (0.94-1.01× at 100 Mbit/s) in vf115-vf117 while the latest came 1.00-1.05×
(alexnet_cifar's stanza CONV workers' forward at 0.75-0.97 of their step's ratio): the first pass
of a step runs on caches the previous update left warm and while the other ranks still wait, so
the median over every point read the machine fast, and the rows' signed median errors were −1.1,
−2.3 and −3.9%. Repredicted over the eight full runs vf110-vf117, the median / p90 / max |error|
averaged 4.81 / 15.85 / 27.63% over every point, 4.88 / 14.50 / 28.05% at each role's latest
(vf116 3.38 / 14.75 / 26.76 → 3.81 / 12.58 / 27.18%; vf117 4.99 / 18.05 / 27.21 → 4.81 / 13.99 /
25.15%), 5.04 / 14.46 / 28.41% at the single latest point of the row."""
PACE_PROBES = 8
"""Paced by a probe (``PACE_FIELD`` other than "marks", as until vf115), a row is predicted with the
calibration's compute at the median reading ``PACE_FIELD`` names (the nets' passes in vf113-vf114;
before, ``load_speed``, both cores' compute probe, against its calibration-time reading) of the
PACE_PROBES rows run before it, none of its own. This host's other tenants move its speed by 10-30% for stretches of minutes: over nine full
runs repredicted so, the median |error| of the four whose machine left the calibration's speed went
from 12.4-18.2% to 3.1-6.5% (a fifth, 12.7% to 9.9%: its probe read 0.92× while its steps ran 1.22×
long), of the four that held it from 3.1-5.1% to 3.2-5.0%. One thread's probe (``speed``) moved
a third as far as the steps did; the two-core probe's median over the rate, 4, 5 or 12 rows
before, or that of both probes' geometric mean did no better."""


def load_reference_of(calibration: dict, around: tuple[float, float]) -> float:
    """The two-core probe's reading (FLOP/s a thread) the rows' ``load_speed`` and so their ``pace``
    are set against: the one around the calibration's layer profile — the reading it kept
    (``steadiness``) — where it profiled, as the layers' measured times are what the predictions
    compute with; else the mean of ``around`` (the probes just before and after the calibration).
    On a 2-core EPYC VM whose other guests moved its speed by a third within a calibration, the
    probes either side of it read 64.7 GFLOP/s a thread where the profile's read 79.4: every row was
    paced 1.37× (median) and predicted a median 8.0% off, p90 24.2%; against the profile's probe the
    same rows, predicted again, err 3.0% / 12.7% (three more runs there: 5.1 → 4.5%, 5.6 → 4.7%,
    15.2 → 8.3%), and the rows run in an episode are run again (``DISTURBED_LOAD``)."""
    st = (calibration.get("steadiness") or {}).get("profile") or {}
    kept = st.get("kept_probe_flops_per_s")
    probes = st.get("probe_flops_per_s") or []
    if not kept and probes and (len(probes) == 1 or st.get("kept_disturbed") is None):
        kept = probes[-1]  # a calibration before it said: its one reading, or the undisturbed (last) one
    return kept if kept else (around[0] + around[1]) / 2.0


def rereferenced(doc: dict, calibration: dict) -> dict:
    """A validate result whose rows' ``load_speed`` are read against ``load_reference_of`` its own
    calibration (``calibration.json`` beside it), as a run now sets them — for ``--repredict`` of
    a result written when the reference was the probes either side of the calibration. Unchanged
    where the calibration has no profile probe (its reference was already those probes')."""
    old = doc.get("load_reference_flops_per_s")
    if not old:
        return doc
    new = load_reference_of(calibration, (old, old))
    rows = [{**r, "load_speed": r["load_speed"] * old / new} if r.get("load_speed") else r for r in doc["rows"]]
    return {**doc, "rows": rows, "load_reference_flops_per_s": new}


DISTURBED_LOAD = 0.8
"""A row whose probe of both cores (``load_speed``: before or after its run, the lower) read below
this share of its calibration-time figure is run once more and the steadier run kept. Another
tenant of this host took about half of its cores in episodes of seconds to minutes: the probe read
14 GFLOP/s a thread against 29 while one thread alone still read 30, and the rows run then
measured up to 2× slow. A run again (a short row's second, a deciding run) whose probes read below
it is not kept (``dropped_runs``): in one full run every deciding run of vgg16_cifar and
alexnet_cifar at 10 Gbit/s fell in such an episode, 30-60% slower than the rows' first runs, and
the rows not run again — their first runs kept alone — were named the measured best."""
RERUN_SHARE = 0.1
"""The share of a budget's row time (``--budget``) kept for those second runs."""


CPU_BOUND_RING = 1.05
"""The link's all-reduce is bound by its CPU where the engine, at full duplex, has it take this much
longer than its bytes alone on the link would (``collective_core_share``)."""


def collective_core_share(m: dict, cluster: hardware.ClusterSpec) -> float | None:
    """``ClusterSpec.collective_core_share`` from ``emulate.measure_duplex``'s all-reduce of 2 hosts:
    the machine's busy CPU over its time, per host — where the engine (full duplex, no such share)
    has that ring bound by its CPU (``CPU_BOUND_RING``): the cores, not the link, set its pace, and
    what they give it is what its threads keep busy. None where the link bounds it (its threads wait
    on the wire and their share says nothing), where the measurement has no CPU figure, or where
    the ring kept a whole core a host busy.

    Measured at 10 Gbit/s (vf136): 256 MiB in 0.357 s with 0.54 s of both hosts' CPU, 0.76 of a core
    a host, where the engine had the 2 cores bound it at 0.297 s (1.92 cores' worth). The hybrid
    strategy's conv all-reduce of vgg16_cifar at 2 workers, on idle cores after the backward, ran
    84-108 ms against 68-76 predicted in vf132-vf136, and every 2-worker row at 10 Gbit/s ran a
    median 5% slow of the model."""
    from layerplan.cost.engine import simulate

    if m.get("allreduce_cpu_s") is None or not m.get("allreduce_s") or not m.get("bytes"):
        return None
    full = replace(cluster, nodes=2, collective_core_share=None, nic=replace(cluster.nic, duplex_efficiency=1.0))
    ring = _link_ring(m["bytes"])
    wire = simulate(ring, replace(full, comm_cpu_s_per_byte=0.0, reduce_cpu_s_per_byte=0.0,
                                  collective_busy_cpu_s_per_byte=None)).step_time_s
    if simulate(ring, full).step_time_s < CPU_BOUND_RING * wire:
        return None
    share = m["allreduce_cpu_s"] / (2.0 * m["allreduce_s"])
    return share if 0 < share < 1 else None


def _link_ring(nbytes: float):
    """``emulate.measure_duplex``'s all-reduce as the engine runs it: a ring of ``nbytes`` over 2 hosts."""
    from layerplan.cost.engine import Collective, StepGraph

    return StepGraph(groups={"w": 2}, samples_per_step=1, tasks=(
        Collective(name="allreduce", group="w", scheme="ring", bytes=nbytes),))


def duplex_efficiency(m: dict, cluster: hardware.ClusterSpec) -> float:
    """The link's ``duplex_efficiency`` from ``emulate.measure_duplex``'s message and all-reduce
    of the same bytes: how much more slowly the all-reduce ran against the message than the engine
    (full duplex, with the cluster's CPU cost of moving bytes and its collectives' share of a core,
    ``collective_core_share``) predicts they would. At 10 Gbit/s both are CPU-bound, the share
    explains the all-reduce's extra time and the fit reads about 1."""
    from layerplan.cost.engine import StepGraph, Transfer, simulate

    full = replace(cluster, nodes=2, nic=replace(cluster.nic, duplex_efficiency=1.0))
    one = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="message", src="a", dst="b", bytes_per_flow=m["bytes"], pattern="spread"),))
    ring = _link_ring(m["bytes"])
    predicted = simulate(one, full).step_time_s / simulate(ring, full).step_time_s
    return min(1.0, max(0.5, (m["p2p_s"] / m["allreduce_s"]) / predicted))


def reduce_cpu_s_per_byte(m: dict, message_cpu_s_per_byte: float | None = None) -> float | None:
    """The reduction's CPU per byte on the emulated path (``ClusterSpec.reduce_cpu_s_per_byte``)
    from ``emulate.measure_duplex``'s busy CPU: a 2-host all-reduce of S bytes moves 2S and reduces
    S/2 on each host, so with c the CPU a message's byte costs (both ends: the row's
    ``link_cpu_s_per_byte``, else the duplex measurement's own message) c_red = CPU_allreduce/S − 2c
    (the rule ``calibrate.comm_cpu_costs`` fits on loopback, in CPU seconds), at least 0: the model's
    all-reduce then costs the CPU the measured one took, whatever the message measurement read.
    None where the measurement has no CPU figures (older rows).

    Measured here: an all-reduce's busy CPU per byte it moves is close to a message's (10 Gbit/s:
    0.80–0.88 against 0.60–0.91 ns/B, the message's reading moving more from one measurement to
    the next; gloo's reduction, torch's ``add_`` at 0.02–0.05 ns/B, is lost in the noise), where
    loopback's fit reads 0.2–0.5 ns/B. With loopback's on top of a message reading of 0.84 ns/B, a
    collective cost 0.98 ns per byte moved, and DDP's steps with 4 workers at 10 Gbit/s were
    predicted up to 22% slow (alexnet_cifar +4 to +22% over eight full runs); per-thread CPU in the
    run put the gloo threads' user time, where the reduction runs, at 0.03–0.1 ns/B. At 100 Mbit/s
    the all-reduce costs more (5–6 against 2–3 ns/B), in a step the link bounds."""
    if m.get("allreduce_cpu_s") is None or not m.get("bytes"):
        return None
    if message_cpu_s_per_byte is None:
        if m.get("p2p_cpu_s") is None:
            return None
        message_cpu_s_per_byte = m["p2p_cpu_s"] / m["bytes"]
    return max(0.0, m["allreduce_cpu_s"] / m["bytes"] - 2.0 * message_cpu_s_per_byte)


LINK_STEADY, DUPLEX_STEADY = 0.93, 0.92
"""A rate's link measurements are steady where the messages' payload (``measure_link``'s median)
reached this share of the line rate, and the duplex measurement's message that one. TCP over
Ethernet carries at most 1448 of each 1514 bytes (0.956), and a steady machine reached it: 0.954-
0.956 at 100 Mbit/s, 1 and 10 Gbit/s over five full runs (the duplex message 0.950-0.957). Where
something else had the machine, its sender fell behind: one run read 0.945 / 0.85 / 0.81 with 13.2 /
4.7 / 1.18 ns of CPU a byte against 3.6-5.2 / 1.0-1.3 / 0.8-0.9, and its 1 Gbit/s rows were
predicted a median 5.5% slow (DDP vgg16_cifar with 4 workers 42%: 3.22 s against 2.1-2.3 s in the
other runs, measured 2.27 s). Set below the steady figures by as much again: a quick run read 0.945
at 1 Gbit/s (1.7 ns a byte), and three tries cost it 75 s of its 10 minutes for little."""
LINK_TRIES, LINK_WAIT_S = 3, 5.0
"""Unsteady link measurements are taken again, ``LINK_WAIT_S`` later, up to ``LINK_TRIES`` in all;
the steadiest are kept (``link_steadiness``)."""

LINK_AGAIN_S = 70.0
"""Seconds a rate's link measured again after its rows may take (up to ``LINK_TRIES`` readings of its
messages, both directions and its flows): not begun where it would end past the command's limit
(``Matrix.limit_s``; vf117 took 45.2 min, its 10 Gbit/s link measured three times more at the end),
the later rates' rows and deciding runs counted before it as ``decide_allowance_s`` counts them:
vq141, on a host whose other guests kept its calibration at 4.9 min, measured its 100 Mbit/s link
again after its rows, 50 s, and `make validate` took 10 min 21 s."""


def link_steadiness(rate_bytes_per_s: float, link_rate: float, duplex: dict | None) -> float:
    """How far the rate's link measurements fall short of steady: the least of the messages'
    payload share of the line rate over ``LINK_STEADY`` and the duplex message's over
    ``DUPLEX_STEADY`` (1 or more: steady; 1 where neither was measured)."""
    shares = [link_rate / rate_bytes_per_s / LINK_STEADY] if link_rate else []
    if duplex and duplex.get("p2p_s"):
        shares.append(duplex["bytes"] / duplex["p2p_s"] / rate_bytes_per_s / DUPLEX_STEADY)
    return min(shares, default=1.0)


def measure_rate_links(emu, progress: Callable[[str], None] | None = None,
                       sleep: Callable[[float], None] = time.sleep, most: int = LINK_TRIES,
                       probe: Callable[[], dict] | None = None) -> dict:
    """The rate's link measurements (``measure_link``, ``emulate.measure_duplex``), taken again
    while unsteady (``most`` tries in all, LINK_TRIES unless said, ``LINK_WAIT_S`` apart):
    {"cpu_s_per_byte", "rate_bytes_per_s", "duplex", "tries": the steadiness of each try,
    "probe"}, the steadiest try's figures. ``probe()``, called just before each try, reads the
    machine (``{"load_speed", "memory_speed"}``, as the rows' probes: ``link_apart``); "probe" is
    the kept try's reading (None without one)."""
    from layerplan.runtime import emulate

    best, tries = None, []
    for i in range(max(1, most)):
        if i:
            if progress:
                progress(f"the link measurements read {tries[-1]:.3f} of steady (payload {LINK_STEADY:g} of the line rate) "
                         f"(something else had the machine): again in {LINK_WAIT_S:g} s ({i + 1} of {most})")
            sleep(LINK_WAIT_S)
        machine = probe() if probe else None
        cpu, rate = measure_link(emu)
        duplex = emulate.measure_duplex(emu, seconds=DUPLEX_S, repeats=DUPLEX_REPEATS)
        tries.append(link_steadiness(emu.rate_bytes_per_s, rate, duplex))
        if best is None or tries[-1] > best[0]:
            best = (tries[-1], cpu, rate, duplex, machine)
        if tries[-1] >= 1.0:
            break
    return {"cpu_s_per_byte": best[1], "rate_bytes_per_s": best[2], "duplex": best[3], "tries": tries,
            "probe": best[4]}


BUSY_RING_MIN_BYTES_PER_S = 1e9 / 8
"""Rates from which each rate's link measurements include a ring beside its ranks' compute
(``emulate.measure_busy_ring``, 7 s). At 100 Mbit/s a 2-rank ring's bytes need a few hundredths of
a core, below what two 2-second windows of compute can tell apart, and the idle-core charge
(4-5 ns a byte there) stands."""

BUSY_RING_APART = 1.5
"""A rate's ring measured beside its ranks' compute (``link_busy_cpu_s_per_byte``) replaces the
collectives' idle-core charge (the link's CPU a byte, both ends, and the reduction's half) only
where it reads this many times that charge: its two 2-second windows of compute read within about
15% of each other's pace, and a ring's bytes at 10 Gbit/s cost their ranks' compute what they cost
idle cores (1.0-1.2 ns a byte both ways), where at 1 Gbit/s 2.5-3.3× as much."""


LINK_AGAIN_BELOW = 0.9
"""Where every try of a rate's link measurements read below this share of steady
(``link_steadiness``), they are taken again after the rate's rows, minutes later, and the rows
predicted with the steadier reading (``relinked``; ``link_tries`` lists every try). Another guest's
episodes last seconds to minutes: in vf106 (a 2-core EPYC, Zen 5) all three tries at 10 Gbit/s, 5 s
apart, read 0.53-0.55 (5.15 Gbit/s of payload at 2.6 ns of CPU a byte) while the rows then ran as a
link of 0.89 and 1.2 ns a byte (as the same measurement read afterwards): the rate's 45 rows were
predicted a median 20% slow, max 55%; with the later reading the run's median / p90 / max |error|
went 6.9 / 26.2 / 54.6% → 5.1 / 17.8 / 28.1%, Spearman ρ 0.993 → 0.997. Not for a near-steady
reading: in vf107 the 10 Gbit/s link's best try read 0.963, three more after the rows 0.88-0.93,
and those 30 s took the full run to 44.9 minutes of its 45."""


LINK_PROBE_APART = 0.25
"""Where the machine read this much faster or slower (a ratio: 1.25× or 1/1.25×) just before the
rate's kept link measurement than around its rows (the median of their ``load_speed`` and of their
``memory_speed``), the link is measured again after the rows and the reading taken nearer the rows'
conditions is kept (``link_apart``). The link's CPU per byte is the machine's CPU moving the bytes,
and other guests move it: in vf108 (a 2-core EPYC, Zen 5) the 100 Mbit/s link read 22 ns of CPU a
byte where the runs before read 4-5 — yet 0.9 of steady in payload, so ``LINK_AGAIN_BELOW`` did not
take it again — and DDP's and stanza's rows at that rate erred up to 77%."""


def link_apart(probe: dict | None, rows: list[dict]) -> str | None:
    """Why the machine the rate's link was measured on differs from the one its ``rows`` ran on
    (``LINK_PROBE_APART``), or None: alike, or either unread."""
    if not probe or not rows:
        return None
    why = []
    for field, what in (("load_speed", "both cores"), ("memory_speed", "the memory")):
        ran = [r[field] for r in rows if r.get(field)]
        if not ran or not probe.get(field):
            continue
        ratio = probe[field] / statistics.median(ran)
        if not 1 / (1 + LINK_PROBE_APART) <= ratio <= 1 + LINK_PROBE_APART:
            why.append(f"{what} read {probe[field]:.2f}× then, {statistics.median(ran):.2f}× around its rows")
    return "; ".join(why) or None


def probe_distance(probe: dict | None, rows: list[dict]) -> float:
    """How far (the largest |log| of a ratio) ``probe`` read from the median of ``rows``' probes;
    inf without a reading."""
    out = []
    for field in ("load_speed", "memory_speed"):
        ran = [r[field] for r in rows if r.get(field)]
        if ran and probe and probe.get(field):
            out.append(abs(math.log(probe[field] / statistics.median(ran))))
    return max(out) if out else math.inf


def relinked(row: dict, emu, calibrated: hardware.ClusterSpec | None, cpu_s_per_byte: float | None,
             rate_bytes_per_s: float | None, duplex: dict | None, tries: list[float], after_rows: int) -> dict:
    """``row`` with its rate's link measurements replaced (``LINK_AGAIN_BELOW``: ``tries``, the last
    ``after_rows`` of them taken after the rate's rows) and predicted again."""
    row = {**row, "link_cpu_s_per_byte": cpu_s_per_byte, "link_payload_bytes_per_s": rate_bytes_per_s,
           "link_duplex": duplex, "link_tries": list(tries), "link_tries_after_rows": after_rows}
    return {**row, **prediction(row, emu, calibrated)}


def measure_link(emu) -> tuple[float, float]:
    """The emulated link at its rate, as gloo messages between two hosts cross it (the median of a
    few measurements): (CPU seconds per byte, both ends; payload bytes per second)."""
    from layerplan.runtime import emulate

    ms = [emulate.measure_link_cpu(emu) for _ in range(LINK_CPU_REPEATS)]
    return statistics.median(m["cpu_s_per_byte"] for m in ms), statistics.median(m["rate_bytes_per_s"] for m in ms)


def validate(matrix: Matrix, out_dir: Path, calibrated: hardware.ClusterSpec | None = None,
             progress: Callable[[str], None] | None = None, skip: Callable[[Case, str], None] | None = None,
             done: Iterable[dict] = (), speed_reference: float | None = None,
             load_reference: float | None = None, deadline: float | None = None,
             memory_reference: float | None = None, net_reference: dict[str, float] | None = None,
             fc_reference: float | None = None) -> dict:
    """Run the matrix; returns {"summary", "rows", "skipped"} and writes validate.json + plots.
    ``done``: rows measured before (``--resume``); configurations among them are not run again.

    With a calibration, each rate's link has its CPU cost per byte measured first (``prediction``
    uses it), and every configuration runs after a ``calibrate.speed_probe`` call: the probe over
    ``speed_reference`` (the probe at calibration time; None: now) is the row's ``speed``, a
    record of the machine's drift. It is not applied: one thread's speed overstates how a run's
    speed moves (in one full run the probe read 1.06-1.20× for 91 rows whose steps ran a median 3%
    faster than predicted, not 10-20%). The same probe on two threads at once (both cores loaded,
    as the runs load them) against ``load_reference`` is the row's ``load_speed``. The rows before
    a row give its ``pace``, the speed its prediction computes at: by default the speed at which
    they reached their marked points against their step as calibrated (``PACE_FIELD``,
    ``PACE_MARKS_ROWS``), else the probes named below (``PACE_PROBES``). A memory-bound
    probe (``calibrate.memory_probe``) before and after it against ``memory_reference`` (seconds a
    call; None: now) is the row's ``memory_speed`` (the slower reading); the rows before a row give
    its pace's ``memory_speed`` (``MEMORY_PACE``), the speed its layers that are not matrix
    products run at. The row's own net's training pass on both cores (``calibrate.net_probe``)
    just before it against ``net_reference`` (seconds a pass per net at calibration time; None, or
    a net missing: now) is its ``net_speed``, which a probe pace follows (``PACE_FIELD``). A large
    FC layer's pass at a small batch (``calibrate.fc_probe``: its weights streamed from memory) just
    before it against ``fc_reference`` (seconds a call at calibration time; None: now) is its
    ``fc_speed``, a record: no prediction follows it yet.

    ``deadline`` (``time.monotonic()``'s clock: when the command started plus ``matrix.budget_s``):
    the rows measure fewer seconds of steps where they would not end by it (``fit_target_s``)."""
    from layerplan.runtime import emulate
    from layerplan.runtime.launch import RunError
    from layerplan.runtime.layout import world_size
    from layerplan.runtime.model import check, resolve
    from layerplan.runtime.run_spec import RunSpec

    emulate.check_available()
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = [r for r in done if key(r) in {key(c) for c in cases(matrix)}]
    runs: list[dict] = list(rows)  # every kept run in the order it ran, its own marks: the pace's (``run_pace``)
    finished = {key(r) for r in rows}
    todo, skipped, hosts = [], [], 0
    for c in cases(matrix):
        if key(c) in finished:
            continue
        try:
            spec = RunSpec(model=c.model, strategy=c.strategy, config=c.config, batch_size=matrix.batch_size)
            net, _ = resolve(spec)
            check(spec, net)
            todo.append(c)
            hosts = max(hosts, world_size(spec))
        except ConfigError as e:
            skipped.append({"model": c.model, "strategy": c.strategy, "workers": c.workers, "rate": c.rate, "reason": str(e)})
            if skip:
                skip(c, str(e))
    track = calibrated is not None
    if track:
        from layerplan.calibrate import fc_probe, memory_probe, net_probe, speed_probe

        if speed_reference is None:
            speed_reference = speed_probe()
        if load_reference is None:
            load_reference = speed_probe(threads=2)
        if memory_reference is None:
            memory_reference = memory_probe()
        if fc_reference is None:
            fc_reference = fc_probe()
        net_reference = dict(net_reference or {})
        for m in sorted({c.model for c in todo} - set(net_reference)):
            net_reference[m] = net_probe(m, batch=matrix.batch_size)
    meta = {"speed_reference_flops_per_s": speed_reference, "load_reference_flops_per_s": load_reference,
            "memory_reference_s": memory_reference, "net_reference_s": net_reference,
            "fc_reference_s": fc_reference} if track else {}
    def machine_now() -> dict:
        """The machine's speed now, as each row's probes read it (``link_apart``)."""
        return {"load_speed": speed_probe(ROW_PROBE_WINDOW_S, threads=2) / load_reference,
                "memory_speed": memory_reference / memory_probe()}

    rerun_left_s = math.inf  # for disturbed rows' second runs (RERUN_SHARE of a budget)
    planned_s: dict[str, float] = {}  # per rate, under a budget: its rows' estimated wall time and RATE_OVERHEAD_S
    left_out: dict[tuple, str] = {}  # under a budget the rows overrun: those left out, with the reason (``leave_out``)
    plan_rows: dict[tuple, dict] = {}  # under a budget: the rows planned (``estimate``'s) and each one's estimated wall time
    row_plan_s: dict[tuple, float] = {}
    rows_spent_s = rows_planned_s = 0.0  # the rows run so far: their wall time, and what the plan estimated (``behind_plan``)
    once: set[tuple] = set()  # rows that fit before the limit only without their second run (``repeats``)
    if deadline is not None:  # fit the rows into what is left of the budget (Matrix.budget_s)
        pending = [r for r in estimate(matrix, calibrated) if r["predicted_step_s"] and not r["skip"]
                   and (r["model"], r["label"], r["workers"], r["rate"]) not in finished]
        rates = len({r["rate"] for r in pending})
        available_s = deadline - time.monotonic() - rates * (RATE_OVERHEAD_S + matrix.decide_s)
        fitted = fit_target_s(matrix, [(r["predicted_step_s"], unmeasured_steps(r["strategy"], r["config"]))
                                       for r in pending], available_s * (1 - RERUN_SHARE))
        # the disturbed rows' second runs: RERUN_SHARE of it, or what the rows at MIN_TARGET_S leave
        # (a run whose rows did not fit at 4 s took 8 second runs, 160 s, past its budget)
        rows_s = sum(row_estimate_s(replace(matrix, target_s=fitted), r["predicted_step_s"],
                                    unmeasured_steps(r["strategy"], r["config"])) for r in pending)
        meta["target_s"] = fitted
        if fitted < matrix.target_s:
            if progress:
                progress(f"each configuration for {fitted:g} s of steps (not {matrix.target_s:g}), to end "
                         f"within the budget of {matrix.budget_s / 60:.1f} min")
            matrix = replace(matrix, target_s=fitted)
        # at MIN_TARGET_S and still over: the rows far behind their scenario's best give way (LEAVE_OUT_BEHIND)
        left_out = leave_out(pending, matrix, available_s * (1 - RERUN_SHARE))
        if left_out:
            pending = [r for r in pending if key(r) not in left_out]
            rows_s = sum(pending_estimate_s(matrix, r) for r in pending)
            if progress:
                progress(f"without {len(left_out)} configurations predicted {LEAVE_OUT_BEHIND:g}× or more their "
                         f"scenario's best step, to end within the budget of {matrix.budget_s / 60:.1f} min: "
                         + ", ".join(f"{m} {lab} {n}w {rate}" for m, lab, n, rate in left_out))
        rerun_left_s = max(0.0, min(available_s * RERUN_SHARE, available_s - rows_s))
        for r in pending:
            planned_s[r["rate"]] = planned_s.get(r["rate"], RATE_OVERHEAD_S) + pending_estimate_s(matrix, r)
            plan_rows[key(r)], row_plan_s[key(r)] = r, pending_estimate_s(matrix, r)
    left_s = 0.0  # seconds of deciding runs the rates before did not use
    t_rows, deciding_s, planned_done_s = time.monotonic(), 0.0, 0.0
    # the deciding runs count to the command's limit (the rows were fitted to the budget, less)
    limit = None if deadline is None else deadline + max(0.0, (matrix.limit_s or 0.0) - (matrix.budget_s or 0.0))

    def allowance_s(rate: str, done_s: float) -> float:
        """Seconds the limit allows now besides the rates after ``rate`` (``decide_allowance_s``),
        ``done_s`` of the rows' planned time behind."""
        later = [planned_s[r] for r in matrix.rates[matrix.rates.index(rate) + 1:] if r in planned_s]
        now = time.monotonic()
        return decide_allowance_s(limit - now, now - t_rows - deciding_s, done_s, later, matrix.decide_s)
    for rate in matrix.rates:
        batch = [c for c in todo if c.rate == rate]
        if not batch:
            continue
        t_rate = time.monotonic()
        with emulate.running(hosts, rate, EMULATION_NAME) as emu:
            link_cpu, link_rate, duplex, link_tries, link_probe = None, None, None, None, None
            if track:  # LINK_STEADY: measured again where something else had the machine
                links = measure_rate_links(emu, progress, most=matrix.link_tries or LINK_TRIES, probe=machine_now)
                link_cpu, link_rate, duplex, link_tries = (links["cpu_s_per_byte"], links["rate_bytes_per_s"],
                                                           links["duplex"], links["tries"])
                link_probe = links.get("probe")
            lead = emulate.measure_flow_lead(emu) if track and emu.hosts >= 3 else None
            busy_ring = (emulate.measure_busy_ring(emu)["cpu_s_per_byte"]
                         if track and emu.rate_bytes_per_s >= BUSY_RING_MIN_BYTES_PER_S else None)
            later_rates = [r for r in matrix.rates[matrix.rates.index(rate) + 1:] if any(c.rate == r for c in todo)]
            behind = rows_spent_s / rows_planned_s if rows_planned_s > 0 else 1.0
            guard = limit is not None and rows_planned_s > 0  # from the second rate on: no row runs past the limit
            end_by = (limit or 0.0) - len(later_rates) * RATE_OVERHEAD_S  # when this rate's rows must have ended

            def ends_past(estimate_s: float) -> bool:
                """Whether work estimated at ``estimate_s``, started now at the rows' pace, ends past ``end_by``."""
                return time.monotonic() + max(1.0, behind) * estimate_s > end_by

            if limit is not None and behind > 1.0:  # the rows left that fit at the pace the rows have run (``behind_plan``)
                left = [r for k, r in plan_rows.items() if k[3] in (rate, *later_rates) and k not in left_out]
                more = behind_plan(left, matrix, end_by - time.monotonic() - rerun_left_s, behind)
                for k in more:
                    planned_s[k[3]] -= row_plan_s[k]
                left_out.update(more)
                if more and progress:
                    progress(f"without {len(more)} more configurations, the rows so far having taken {behind:.2f}× "
                             f"their estimate, to end within the command's limit: "
                             + ", ".join(f"{m} {lab} {n}w {r}" for m, lab, n, r in more))
            for c in batch:
                sized = sizing_step_s(c, emu, calibrated, matrix)
                slow = left_out.get(key(c)) or too_slow(c, emu, calibrated, matrix, sized)
                if not slow and guard and key(c) in row_plan_s and ends_past(row_plan_s[key(c)]):
                    if not ends_past(pending_estimate_s(matrix, plan_rows[key(c)], runs=1)):
                        once.add(key(c))  # a short row's second run does not fit: its first does
                    else:
                        slow = (f"not run: at the pace of the rows before it ({max(1.0, behind):.2f}× their "
                                f"estimate) it would end past the command's limit of {(matrix.limit_s or 0) / 60:.1f} min")
                if slow:
                    skipped.append({"model": c.model, "strategy": c.strategy, "workers": c.workers, "rate": c.rate,
                                    "reason": slow})
                    if skip:
                        skip(c, slow)
                    continue
                if progress:
                    progress(f"{c.model} {c.label} {c.workers}w {rate}")
                t_row, rerun_s = time.monotonic(), 0.0
                try:
                    def probed_run() -> dict:
                        """One run between speed probes: one thread's before, both cores' and the memory's
                        before and after."""
                        probe = speed_probe(ROW_PROBE_WINDOW_S) if track else None
                        load = speed_probe(ROW_PROBE_WINDOW_S, threads=2) if track else None
                        mem = memory_probe() if track else None
                        net = net_probe(c.model, batch=matrix.batch_size) if track else None
                        fc = fc_probe() if track else None
                        row = run_case(c, emu, calibrated, matrix, out_dir / "runs", sized)
                        if track:
                            row.update(net_speed=net_reference[c.model] / net, net_probe_s=net,
                                       fc_speed=fc_reference / fc, fc_probe_s=fc)
                            mem_after = memory_probe()
                            row.update(memory_speed=memory_reference / max(mem, mem_after), memory_probe_s=mem,
                                       memory_after_s=mem_after)
                            after = speed_probe(ROW_PROBE_WINDOW_S, threads=2)
                            row.update(speed=probe / speed_reference, probe_flops_per_s=probe,
                                       link_cpu_s_per_byte=link_cpu, link_payload_bytes_per_s=link_rate,
                                       link_tries=link_tries, link_probe=link_probe,
                                       link_duplex=duplex, link_flow_lead=lead, link_busy_cpu_s_per_byte=busy_ring,
                                       load_speed=min(load, after) / load_reference,
                                       load_probe_flops_per_s=load, load_after_flops_per_s=after)
                        return row

                    row = probed_run()
                    if track and row["load_speed"] < DISTURBED_LOAD and rerun_left_s >= row["wall_s"]:
                        if progress:  # DISTURBED_LOAD: another tenant had the cores; the steadier run is kept
                            progress(f"{c.model} {c.label} {c.workers}w {rate} (again: the cores ran at "
                                     f"{row['load_speed']:.2f}× their calibration-time speed around it)")
                        rerun_left_s -= row["wall_s"]
                        t_rerun = time.monotonic()
                        row, other = sorted((row, probed_run()), key=lambda r: r["load_speed"], reverse=True)
                        rerun_s = time.monotonic() - t_rerun  # the rerun share's, not the row's planned time
                        row = {**row, "disturbed_runs": 1, "disturbed_step_s": other["measured_step_s"]}
                    if track:  # the machine's pace over the runs before this one (``pace``)
                        row["pace"] = pace(runs)
                    rows.append({**row, **prediction(row, emu, calibrated)})
                    runs.append(rows[-1])
                except RunError as e:  # one failed configuration is reported, the matrix goes on
                    reason = f"failed: {e}"
                    skipped.append({"model": c.model, "strategy": c.strategy, "workers": c.workers, "rate": c.rate,
                                    "reason": reason})
                    if skip:
                        skip(c, reason)
                write(out_dir, rows, skipped, calibrated, meta, plots=False)  # a partial result survives an interrupted run
                if key(c) in row_plan_s:
                    rows_spent_s += time.monotonic() - t_row - rerun_s
                    rows_planned_s += row_plan_s[key(c)]

            def again(c: Case, why: str) -> None:
                """Run ``c`` once more; its row's measured step becomes the mean of its runs' (``merge_runs``).
                Between both cores' probes: a run during which they read below DISTURBED_LOAD is not
                one of the row's (``dropped_runs``); a steady one replaces a row that stands on a
                disturbed run (``disturbed``), rather than being averaged with it."""
                i = next(i for i, r in enumerate(rows) if key(r) == key(c))
                if progress:
                    progress(f"{c.model} {c.label} {c.workers}w {rate} ({why})")
                load = speed_probe(ROW_PROBE_WINDOW_S, threads=2) if track else None
                net = net_probe(c.model, batch=matrix.batch_size) if track else None
                pace_now = pace(runs) if track else None  # this run's moment (``run_pace``)
                speed_now = None
                try:  # sized by its row's prediction (``sizing_step_s`` less the link's measurements)
                    more = run_case(c, emu, calibrated, matrix, out_dir / "runs", rows[i]["predicted_step_s"])
                except RunError as e:  # the runs before stand
                    skipped.append({"model": c.model, "strategy": c.strategy, "workers": c.workers, "rate": c.rate,
                                    "reason": f"a run again failed (the runs before are kept): {e}"})
                    return
                if track:
                    speed_now = min(load, speed_probe(ROW_PROBE_WINDOW_S, threads=2)) / load_reference
                    if speed_now < DISTURBED_LOAD:
                        if progress:
                            progress(f"{c.model} {c.label} {c.workers}w {rate} ({why}: not kept, the cores ran at "
                                     f"{speed_now:.2f}× their calibration-time speed around it)")
                        rows[i] = {**rows[i], "dropped_runs": [*rows[i].get("dropped_runs", []), {
                            "why": why, "step_s": more["measured_step_s"], "load_speed": speed_now}]}
                        write(out_dir, rows, skipped, calibrated, meta, plots=False)
                        return
                if track:
                    runs.append({**more, "calibrated_marks_s": rows[i].get("calibrated_marks_s")})
                if disturbed(rows[i]):  # a steady run in place of one disturbed (DISTURBED_LOAD), not beside it
                    merged = {**rows[i], **more, "load_speed": speed_now, "net_speed": net_reference[c.model] / net,
                              "net_probe_s": net,
                              "disturbed_runs": rows[i].get("disturbed_runs", 0) + 1,
                              "disturbed_step_s": rows[i]["measured_step_s"]}
                    kept = 0
                else:
                    merged = merge_runs(rows[i], more)
                    kept = len(rows[i].get("measured_runs_s") or [rows[i]["measured_step_s"]])
                if why == "deciding":
                    merged["decider_runs"] = rows[i].get("decider_runs", 0) + 1
                if track and "pace" in rows[i]:  # its runs' moments' pace, as its step is their mean
                    merged["pace"] = run_pace(rows[i]["pace"], kept, pace_now)
                    rows[i] = rescored({**merged, **prediction(merged, emu, calibrated)})
                else:
                    rows[i] = rescored(merged)
                write(out_dir, rows, skipped, calibrated, meta, plots=False)

            ours = {key(c) for c in batch}
            ran = [r for r in rows if key(r) in ours and r.get("link_tries") is not None]
            unsteady = bool(link_tries) and max(link_tries) < LINK_AGAIN_BELOW  # far off steady on every try
            apart = link_apart(link_probe, ran) if track and link_tries and ran else None
            if track and link_tries and ran and (unsteady or apart):
                why = (f"read at most {max(link_tries):.3f} of steady before its rows" if unsteady
                       else f"was measured on a machine unlike its rows' ({apart})")
                # the command's limit first, the later rates' rows before it (vq141)
                if limit is not None and allowance_s(rate, planned_done_s + planned_s.get(rate, 0.0)) < LINK_AGAIN_S:
                    if progress:
                        progress(f"the {rate} link {why}: not measured again, for want of time")
                else:
                    if progress:
                        progress(f"the {rate} link {why}: measured again after them")
                    later = measure_rate_links(emu, progress, most=matrix.link_tries or LINK_TRIES, probe=machine_now)
                    if unsteady:
                        steadier = max(later["tries"]) > max(link_tries)
                    else:  # as steady in payload, and read nearer the rows' conditions
                        steadier = (max(later["tries"]) >= LINK_AGAIN_BELOW and probe_distance(later.get("probe"), ran)
                                    < probe_distance(link_probe, ran))
                    link_tries = [*link_tries, *later["tries"]]
                    if steadier:
                        link_cpu, link_rate, duplex = later["cpu_s_per_byte"], later["rate_bytes_per_s"], later["duplex"]
                        link_probe = later.get("probe")
                    rows[:] = [{**relinked(r, emu, calibrated, link_cpu, link_rate, duplex, link_tries,
                                           len(later["tries"])),
                                "link_probe": link_probe, "link_again": why, "link_later_kept": steadier}
                               if key(r) in ours and r.get("link_tries") is not None else r for r in rows]
                    write(out_dir, rows, skipped, calibrated, meta, plots=False)
            # the short configurations once more, the last first (REPEAT_BELOW_S)
            for c in reversed(batch):
                r = next((r for r in rows if key(r) == key(c)), None)
                if (r is not None and guard and key(c) in plan_rows and key(c) not in once
                        and ends_past(pending_estimate_s(matrix, plan_rows[key(c)], runs=1) - ROW_OVERHEAD_S)):
                    once.add(key(c))  # the rows after it took the time: its second run would end past the limit
                if (r is not None and "measured_runs_s" not in r and repeats(matrix, r["predicted_step_s"]) >= 2
                        and key(c) not in once):
                    t_again = time.monotonic()
                    again(c, "again")
                    if disagree(next(r for r in rows if key(r) == key(c))):  # RUNS_DISAGREE: a third, the median
                        again(c, "a third time: its two runs disagree")
                    if key(c) in row_plan_s:  # the plan's estimate counts the row's runs (``repeats``)
                        rows_spent_s += time.monotonic() - t_again
            # where a scenario's fastest measured within DECIDE_WITHIN, or its predicted best and its
            # closest rival within DECIDE_CHECK_WITHIN (``contenders``): those again, interleaved, the
            # closest scenarios first, as long as the rate's time for it lasts (Matrix.decide_s, and
            # what the rates before left of theirs)
            by_key = {key(c): c for c in batch}
            left_s += matrix.decide_s
            if limit is not None:  # behind the plan (a slow stretch of the machine): what the limit still allows
                planned_done_s += planned_s.get(rate, 0.0)
                left_s = min(left_s, allowance_s(rate, planned_done_s))
            t_decide = time.monotonic()

            def fits(cost_s: float) -> bool:
                """Whether runs again of ``cost_s`` fit the rate's deciding time and the command's limit
                (however much the plan left)."""
                return cost_s <= left_s and (limit is None or time.monotonic() + cost_s <= limit)

            for round_ in range(DECIDE_ROUNDS):
                for scenario in sorted(dict.fromkeys(c.scenario for c in batch), key=lambda sc: gap(rows, sc)):
                    close = contenders([r for r in rows if (r["model"], r["workers"], r["rate"]) == scenario])
                    cost_s = sum(run_wall_s(r) + AGAIN_PROBES_S for r in close)
                    if not close or not fits(cost_s) or any(key(r) not in by_key for r in close):  # --resume's rows
                        continue
                    left_s -= cost_s
                    for r in (close[::-1] if round_ % 2 == 0 else close):
                        again(by_key[key(r)], "deciding")
                    # RUNS_DISAGREE: two runs far apart, a third and the median, the farthest apart first
                    now = [next(x for x in rows if key(x) == key(r)) for r in close]
                    for r in sorted((r for r in now if disagree(r)), key=lambda r: -max(r["measured_runs_s"])
                                    / min(r["measured_runs_s"])):
                        cost_s = run_wall_s(r) + AGAIN_PROBES_S
                        if fits(cost_s):
                            left_s -= cost_s
                            again(by_key[key(r)], "a third time: its two runs disagree")
            deciding_s += time.monotonic() - t_decide
        # the rate's wall time, its cluster, link timing and rows ("wall_s" of its rows: their runs)
        meta.setdefault("rate_wall_s", {})[rate] = time.monotonic() - t_rate
        if rate != matrix.rates[-1]:  # the plots too, after each rate (after the last: the write below)
            write(out_dir, rows, skipped, calibrated, meta)
    return write(out_dir, rows, skipped, calibrated, meta)


def write(out_dir: Path, rows: list[dict], skipped: list[dict], calibrated, meta: dict | None = None,
          plots: bool = True) -> dict:
    return write_doc(out_dir, {"summary": summarize(rows), "rows": rows, "skipped": skipped,
                               "calibrated_cluster": calibrated.to_dict() if calibrated else None, **(meta or {})}, plots)


def write_doc(out_dir: Path, doc: dict, plots: bool = True) -> dict:
    """validate.json and (``plots``) the two plots. ``validate`` writes the JSON after every row (a
    partial result survives an interrupted run) and the plots after each rate's rows: drawing them
    took 1-2 s a time with a full matrix's rows on a machine of 34 GFLOP/s a core, 2-3 min a full run."""
    from layerplan.runtime.checkpoint import atomic_write_json

    atomic_write_json(out_dir / "validate.json", doc)
    if plots and doc["rows"]:
        scatter_plot(doc["rows"], out_dir / "predicted-vs-measured.png")
        bars_plot(doc["rows"], out_dir / "throughput-by-strategy.png")
    return doc


def scatter_plot(rows: list[dict], path: Path) -> None:
    from layerplan.plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 6))
    marks = {"ps": "o", "allreduce": "s", "stanza": "^", "ralp": "D", "groups": "v", "hybrid": "P"}
    for s in dict.fromkeys(r["strategy"] for r in rows):
        rs = [r for r in rows if r["strategy"] == s]
        ax.scatter([r["measured_step_s"] for r in rs], [r["predicted_step_s"] for r in rs], marker=marks.get(s, "x"),
                   label=s, alpha=0.8)
    lo = min(min(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 0.8
    hi = max(max(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="y = x")
    ax.plot([lo, hi], [lo * 1.1, hi * 1.1], "k:", lw=0.8, label="±10%")
    ax.plot([lo, hi], [lo / 1.1, hi / 1.1], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    s = summarize(rows)
    ax.set_title(f"predicted vs measured, emulated cluster ({len(rows)} configs)\n"
                 f"median |error| {100 * s['median_abs_error']:.1f}%, Spearman ρ "
                 f"{s['spearman'] if s['spearman'] is None else round(s['spearman'], 3)}")
    ax.legend()
    _save(fig, path)
    plt.close(fig)


def bars_plot(rows: list[dict], path: Path) -> None:
    from layerplan.plots import _pyplot, _save

    plt = _pyplot()
    scen = list(dict.fromkeys((r["model"], r["workers"], r["rate"]) for r in rows))
    strats = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(scen)), 4.8))
    w = 0.8 / max(1, len(strats))
    for j, s in enumerate(strats):
        xs, meas, pred = [], [], []
        for i, key in enumerate(scen):
            r = next((r for r in rows if (r["model"], r["workers"], r["rate"]) == key and r["strategy"] == s), None)
            if r:
                xs.append(i + (j - (len(strats) - 1) / 2) * w)
                meas.append(r["measured_throughput"])
                pred.append(r["predicted_throughput"])
        ax.bar(xs, meas, width=w, label=f"{s} measured")
        ax.scatter(xs, pred, marker="_", s=300, color="k", zorder=3, label="predicted" if j == 0 else None)
    ax.set_xticks(range(len(scen)))
    ax.set_xticklabels([f"{m}\n{n} workers, {r}" for m, n, r in scen], fontsize=8)
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title("measured throughput by strategy on the emulated cluster (black: predicted)")
    ax.legend(fontsize=8, ncol=2)
    _save(fig, path)
    plt.close(fig)


def print_rows(rows: Iterable[dict], con=None) -> None:
    from rich.table import Table

    from layerplan.report import console

    con = con or console()
    t = Table(title="predicted vs measured (median step after warm-up)")
    for col in ("net", "workers", "rate", "strategy", "measured", "predicted", "error", "presets", "lower bound", "efficiency",
                "cores busy (meas / pred)"):
        t.add_column(col, justify="left" if col in ("net", "strategy", "rate") else "right")
    for r in rows:
        cores = [r.get("measured_cpu_cores"), r.get("predicted_cpu_cores")]
        t.add_row(r["model"], str(r["workers"]), r["rate"], r.get("label", r["strategy"]), units.format_seconds(r["measured_step_s"]),
                  units.format_seconds(r["predicted_step_s"]), f"{100 * r['error']:+.1f}%", f"{100 * r['preset_error']:+.1f}%",
                  units.format_seconds(r["lower_bound_s"]), percent_below(r["efficiency"]),
                  " / ".join("–" if c is None else f"{c:.2f}" for c in cores))
    con.print(t)


def link_tries_said(r: dict) -> str:
    """What ``print_summary`` says of a row's link measured more than once: which reading it kept, and why."""
    tries = " / ".join(f"{t:.3f}" for t in r["link_tries"])
    if r.get("link_tries_after_rows") and r.get("link_again"):  # LINK_AGAIN_BELOW or LINK_PROBE_APART
        kept = "the later reading kept" if r.get("link_later_kept") else "the first kept"
        return (f" ({r['link_tries_after_rows']} after its rows: it {r['link_again']}; {kept}; of steady, payload "
                f"{LINK_STEADY:g} of the line rate: {tries})")
    after = f" ({r['link_tries_after_rows']} after its rows)" if r.get("link_tries_after_rows") else ""
    return (f"{after}, the steadiest kept (of steady, payload {LINK_STEADY:g} of the line rate: {tries}; something "
            "else had the machine)")


def print_summary(doc: dict, con=None) -> None:
    from layerplan.report import console

    con = con or console()
    s = doc["summary"]

    def pc(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    con.print(f"[bold]{s['configurations']} configurations[/]: median |error| {pc(s['median_abs_error'])}, "
              f"p90 {pc(s['p90_abs_error'])}, max {pc(s['max_abs_error'])}; presets only: median "
              f"{pc(s['preset_median_abs_error'])}; Spearman ρ "
              f"{'–' if s['spearman'] is None else format(s['spearman'], '.3f')}; predicted best = measured best in "
              f"{pc(s['best_match_fraction'])} of scenarios" + (
                  f" (where not, the predicted best ran at most {pc(s['max_choice_loss'])} below the measured best"
                  + (f"; in {s['best_within_run_spread']} of them by less than its or the best's two runs differed"
                     if s.get("best_within_run_spread") else "") + ")"
                  if s.get("max_choice_loss") else ""))
    if s.get("by_strategy"):
        con.print("  by strategy, median / p90 / max |error|: " + "; ".join(
            f"{k} ({v['configurations']}) {pc(v['median_abs_error'])} / {pc(v['p90_abs_error'])} / {pc(v['max_abs_error'])}"
            for k, v in s["by_strategy"].items()))
    if s.get("speed_range"):
        lo, hi = s["speed_range"]
        con.print(f"  one thread of this machine ran at {lo:.2f}–{hi:.2f}× its calibration-time speed "
                  "(probed before every row: `speed`" + ("" if s.get("pace") else
                                                         "; predictions use the calibration as it is") + ")")
        if s.get("slow_rows"):
            con.print(f"  [yellow]{s['slow_rows']} row(s) ran while the machine was below {SLOW_SPEED:g}× that speed "
                      "(something else took the CPU): their errors measure that too[/]")
            st = s.get("steady_rows")
            if st and st["configurations"]:
                con.print(f"  the {st['configurations']} row(s) at {SLOW_SPEED:g}× or above: median |error| "
                          f"{pc(st['median_abs_error'])}, p90 {pc(st['p90_abs_error'])}, max {pc(st['max_abs_error'])}")
    if s.get("pace"):
        p, a = s["pace"], s["as_calibrated"]
        if p.get("follows") == "marks":
            how = (f"at which the {p['probes']} rows with marked points before each reached them against their "
                   f"step as calibrated ({p['min']:.2f}–{p['max']:.2f}×, median {p['median']:.2f}×: `pace`)")
        else:
            what = ("the rows' own nets' passes on both cores read just before each of"
                    if p.get("follows") == "net_speed" else "both cores' probe read around")
            how = (f"{what} the {p['probes']} rows before each ({p['min']:.2f}–{p['max']:.2f}×, median "
                   f"{p['median']:.2f}× its calibration-time reading: `pace`)")
        con.print(f"  predicted at the machine's pace: the calibration's compute at the speed {how}; "
                  "as calibrated, without it: median "
                  f"|error| {pc(a['median_abs_error'])}, p90 {pc(a['p90_abs_error'])}, max {pc(a['max_abs_error'])}")
    mem = s.get("memory_speed")
    if mem:
        con.print(f"  a memory-bound probe (batch norm, ReLU and an add on both cores) read {mem['min']:.2f}–{mem['max']:.2f}× "
                  f"(median {mem['median']:.2f}×) its calibration-time speed around the rows (`memory_speed`)"
                  + ("; the layers that are not matrix products (batch norm, ReLU, pooling) predicted at its pace"
                     if any((r.get("pace") or {}).get("memory_speed") for r in doc["rows"]) else ""))
    fc = s.get("fc_speed")
    if fc:
        con.print("  a large FC layer's pass at a small batch (its weights streamed from memory, both cores) read "
                  f"{fc['min']:.2f}–{fc['max']:.2f}× (median {fc['median']:.2f}×) its calibration-time speed before the "
                  "rows (`fc_speed`; a record, not applied)")
    rep = s.get("repeatability")
    if rep:
        con.print(f"  repeatability: the {rep['rows']} configurations run more than once ({rep['runs']} runs) landed "
                  f"a median {pc(rep['median'])}, p90 {pc(rep['p90'])}, max {pc(rep['max'])} from the step their row "
                  "keeps — the same configuration, minutes apart: a floor under the |error| figures")
    if s.get("dropped_runs"):
        con.print(f"  {s['dropped_runs']} run(s) again (a short row's second, or deciding) not kept: both cores' probe "
                  f"read below {DISTURBED_LOAD:.1f}× its calibration-time speed around them (`dropped_runs` in their rows)")
    pace = s.get("marks_pace")
    if pace:
        con.print(f"  the runs reached their steps' marked points (end of forward/backward, of the update, ...) a median "
                  f"{pace['median']:.2f}× their predicted time (p10–p90 {pace['p10']:.2f}–{pace['p90']:.2f}×; "
                  + ", ".join(f"{rate} {v['median']:.2f}×" for rate, v in pace["by_rate"].items())
                  + "): above 1, the runs' compute or messages were slower than the calibration says")
        if abs(pace["median"] - 1.0) > PACE_OFF:
            con.print(f"  [yellow]the calibration described a machine {pace['median']:.2f}× as fast as the one "
                      "the rows ran on (the machine's speed moved): calibrate at a steadier moment, or predict these "
                      "rows again with another calibration: `layerplan validate --out DIR --repredict --calibration "
                      "FILE`[/yellow]")
    links = {r["rate"]: r for r in doc["rows"] if r.get("link_payload_bytes_per_s") and "link_efficiency" in r}
    for rate, r in links.items():  # what each rate's link measured, as the predictions use it
        con.print(f"  {rate} link: payload {units.format_bandwidth(r['link_payload_bytes_per_s'])} "
                  f"(efficiency {r['link_efficiency']:.3f}), each direction {r['link_duplex_efficiency']:.3f} of it "
                  f"with both busy, {1e9 * r['link_cpu_s_per_byte']:.1f} ns of CPU per byte"
                  + (f", flows leaving a host together: the first leads by √({r['link_flow_lead_bytes'] / 1e3:.0f} kB·S)"
                     if r.get("link_flow_lead") else "")
                  + (f", a ring's bytes beside its ranks' compute {1e9 * r['link_busy_cpu_s_per_byte']:.1f} ns each"
                     + (" (charged to the collectives)" if r.get("link_busy_charged") else
                        f" (under {BUSY_RING_APART:g}× the idle-core charge: not charged)"
                        if r.get("link_busy_charged") is False else "")
                     if r.get("link_busy_cpu_s_per_byte") is not None else "")
                  + (f", a ring its CPU bounds keeps {r['link_core_share']:.2f} of a core a rank busy"
                     if r.get("link_core_share") else "")
                  + (f"; measured {len(r['link_tries'])} times" + link_tries_said(r) if len(r.get("link_tries") or ()) > 1
                     else ""))
    if s.get("best_among_close_fraction") is not None and s["best_match_fraction"] is not None \
            and s["best_among_close_fraction"] > s["best_match_fraction"]:
        con.print(f"  the measured best was the predicted best or one predicted within the model's median |error| "
                  f"({pc(s['median_abs_error'])}) of it in {pc(s['best_among_close_fraction'])} of scenarios: "
                  "closer than that, the prediction cannot tell them apart (`too_close`)")
    for b in s["scenarios"]:
        margin = b.get("predicted_margin")
        lead = "" if margin is None or not math.isfinite(margin) else (
            f" (by {100 * margin:.1f}% over {b['predicted_runner_up']}"
            + (f"; too close to call: {', '.join(b['too_close'])}" if b.get("too_close") else "") + ")")
        con.print(f"  {b['model']}, {b['workers']} workers, {b['rate']}: predicted best {b['predicted_best']}{lead}, "
                  f"measured best {b['measured_best']} " + ("✓" if b["match"] else
                  f"✗ (the predicted best ran {100 * b.get('choice_loss', 0.0):.1f}% below it"
                  + (", less than the two runs of either differed" if b.get("within_run_spread") else "") + ")")
                  + (f" (decided by running {', '.join(b['decided'])} again, interleaved)" if b.get("decided") else ""))
    for sp in s["speedups"]:
        con.print(f"  stanza vs {sp['vs']} ({sp['model']}, {sp['workers']} workers, {sp['rate']}): measured "
                  f"{sp['measured']:.2f}×, predicted {sp['predicted']:.2f}× ({100 * sp['error']:+.1f}%)")
    effs = s.get("efficiencies") or []
    if effs:
        v = efficiency_verdict(effs)
        con.print(f"  stanza and DDP against their lower bound: {v['reach']} of {v['rows']} rows reach "
                  f"{EFFICIENCY_TARGET:.0%}; {v['predicted_below']} the model predicts below it on this machine"
                  + (f" (measured within {100 * v['max_difference']:.1f} percentage points of the model's figure)"
                     if v["max_difference"] is not None
                     else "") + f"; {v['short']} predicted to reach it fell short"
                  + (". Each row below it, with the model's figure and bottleneck (the reason):"
                     if v["rows"] > v["reach"] else ""))
        for e in effs:
            if e["measured"] >= EFFICIENCY_TARGET:
                continue
            name = "DDP" if e["strategy"] == "allreduce" else e["strategy"]
            con.print(f"    {name} ({e['model']}, {e['workers']} workers, {e['rate']}): {percent_below(e['measured'])}, "
                      f"predicted {percent_below(e['predicted'])}" + (f" — {e['bottleneck']}" if e.get("bottleneck") else "")
                      + (" — predicted to reach it: short" if e["predicted"] >= EFFICIENCY_TARGET else ""))
    for k in doc.get("skipped", []):
        con.print(f"  skipped {k['model']} {k['strategy']} {k['workers']}w {k['rate']}: {k['reason']}")


def percent_below(x: float) -> str:
    """``x`` as a whole percent, rounded down: an efficiency of 0.849 reads 84%, not the target's 85%."""
    return f"{math.floor(100 * x + 1e-9):.0f}%"


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
