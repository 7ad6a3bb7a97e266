"""Omnivore's optimizer (§V-B, Algorithm 1): choose the number of groups g, the momentum µ and the
learning rate η by short trials.

    cold start: synchronous (g = 1), momentum 0.9, learning rates tried low → high, stopping as soon
                as the loss gets worse
    g ← the smallest g that saturates the FC server (HE(g), plan/omnivore.py)
    (µ, η) ← gridSearch({0, 0.3, 0.6, 0.9} × {η_last, η_last/10} | g)   lowest loss wins
    while µ = 0 and g > 1:  g ← g/2 (the next divisor of N at or below it);  grid search again

Asynchrony adds implicit momentum 1 − 1/g (Theorem 1, ``stats/momentum.py``): when even µ = 0 is
the best explicit momentum, the implicit part is already too much and g is halved.

Pure: a trial is a callable ``trial(groups, momentum, lr) -> loss`` (the runtime's is a short run on
digits, ``runtime/tune.py``), so the search is tested without processes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

MOMENTA = (0.0, 0.3, 0.6, 0.9)  # Omnivore's released optimizer
COLD_LRS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)  # Omnivore §V-B: 0.1 … 0.00001, tried from low to high
COLD_MOMENTUM = 0.9


@dataclass(frozen=True, kw_only=True, slots=True)
class Trial:
    phase: str
    """cold-start | grid."""
    groups: int
    momentum: float
    lr: float
    loss: float
    """The trial's final loss (lower is better; inf when it diverged)."""
    seconds: float


@dataclass(kw_only=True, slots=True)
class TuneResult:
    groups: int
    momentum: float
    lr: float
    loss: float
    cold_start_lr: float
    start_groups: int
    trials: list[Trial] = field(default_factory=list)
    tuning_s: float = 0.0
    stopped: str | None = None
    """Why the search stopped early (the time budget), or None."""

    def to_dict(self) -> dict:
        return {"groups": self.groups, "momentum": self.momentum, "lr": self.lr, "loss": self.loss,
                "cold_start_lr": self.cold_start_lr, "start_groups": self.start_groups, "tuning_s": self.tuning_s,
                "stopped": self.stopped,
                "trials": [{"phase": t.phase, "groups": t.groups, "momentum": t.momentum, "lr": t.lr,
                            "loss": t.loss if math.isfinite(t.loss) else None, "seconds": t.seconds}
                           for t in self.trials]}


class _OutOfBudget(Exception):
    pass


def tune(trial: Callable[[int, float, float], float], machines: int, start_groups: int, *,
         momenta: tuple[float, ...] = MOMENTA, cold_lrs: tuple[float, ...] = COLD_LRS,
         budget_s: float | None = None, progress: Callable[[Trial], None] | None = None) -> TuneResult:
    """Algorithm 1 once (one 'epoch' of the paper's loop); ``budget_s`` bounds the tuning wall time
    (the best trial so far wins when it runs out)."""
    if machines % start_groups:
        raise ValueError(f"start_groups {start_groups} does not divide {machines}")
    t0 = time.perf_counter()
    trials: list[Trial] = []

    def run(phase: str, g: int, mu: float, lr: float) -> Trial:
        if budget_s is not None and trials and time.perf_counter() - t0 > budget_s:
            raise _OutOfBudget
        t = time.perf_counter()
        loss = float(trial(g, mu, lr))
        tr = Trial(phase=phase, groups=g, momentum=mu, lr=lr, loss=loss if math.isfinite(loss) else math.inf,
                   seconds=time.perf_counter() - t)
        trials.append(tr)
        if progress:
            progress(tr)
        return tr

    def grid(g: int, last_lr: float) -> Trial:
        best = None
        for lr in (last_lr, last_lr / 10):
            for mu in momenta:
                tr = run("grid", g, mu, lr)
                if best is None or tr.loss < best.loss:
                    best = tr
        return best

    cold = None
    g = start_groups
    best = None
    stopped = None
    try:
        for lr in cold_lrs:  # cold start: synchronous, low → high, stop when the loss gets worse
            tr = run("cold-start", 1, COLD_MOMENTUM, lr)
            if cold is not None and not tr.loss < cold.loss:
                break
            cold = tr
        best = grid(g, cold.lr)
        while best.momentum == 0 and g > 1:
            g = next_groups(machines, g)
            best = grid(g, cold.lr)
    except _OutOfBudget:
        stopped = f"time budget of {budget_s:g} s spent"
    pool = [t for t in trials if t.phase == "grid"] or trials
    if best is None or stopped:
        best = min(pool, key=lambda t: t.loss)
    return TuneResult(groups=best.groups, momentum=best.momentum, lr=best.lr, loss=best.loss,
                      cold_start_lr=cold.lr if cold else best.lr, start_groups=start_groups, trials=trials,
                      tuning_s=time.perf_counter() - t0, stopped=stopped)


def next_groups(machines: int, g: int) -> int:
    """Halve g (Algorithm 1), rounded down to a divisor of the machines."""
    half = max(1, g // 2)
    return max(d for d in range(1, half + 1) if machines % d == 0)


def time_to_target(losses: list[float | None], step_times_s: list[float], target: float,
                   window: int = 1) -> float | None:
    """Seconds of training until the first step at which the mean loss of the last ``window`` steps
    is at or below ``target`` (None: never; a run shorter than the window: all its steps). A window
    > 1 keeps one lucky mini-batch from counting as reaching the target."""
    window = max(1, min(window, sum(1 for x in losses if x is not None)))
    elapsed = 0.0
    recent: list[float] = []
    for loss, dt in zip(losses, step_times_s):
        elapsed += dt
        if loss is None:
            continue
        recent = (recent + [loss])[-window:]
        if len(recent) == window and sum(recent) / window <= target:
            return elapsed
    return None
