"""Omnivore's optimizer (§V-B, Algorithm 1): choose the number of groups g, the momentum µ and the
learning rate η by short trials.

    cold start: synchronous (g = 1), momentum 0.9, learning rates tried low → high, stopping as soon
                as the loss gets worse
    g ← the smallest g that saturates the FC server (HE(g), plan/omnivore.py)
    (µ, η) ← gridSearch({0, 0.3, 0.6, 0.9} × {η_last, η_last/10} | g)   lowest loss wins
    while µ = 0 and g > 1:  g ← g/2 (the next divisor of N at or below it);  grid search again

With ``rungs`` R > 1 the grid runs as successive halving (Jamieson & Talwalkar 2016, Li et al.'s
Hyperband 2018): every (µ, η) for 1/2^(R−1) of a trial, the better half continued from where it
stopped to twice as far, and so on until the last two have run a whole trial; the lowest loss
then wins. The same 8 configurations cost 4 trials' iterations instead of 8 (R = 3), and the
losing ones are stopped early — what makes the search's overhead small beside the run. The cold
start's learning rates then run 1/2^(R−1) of a trial each, the best continued to a whole one.

Asynchrony adds implicit momentum 1 − 1/g (Theorem 1, ``stats/momentum.py``): when even µ = 0 is
the best explicit momentum, the implicit part is already too much and g is halved.

Algorithm 1 starts from the smallest g that saturates the FC server because asynchrony is assumed
to buy hardware efficiency up to there. Where the trials' measured throughput says it does not —
the first trial at g runs fewer than (1 + HE_GAIN)× the samples per second of the synchronous cold
start's — the search goes to g = 1 at once (on 2 shared cores lenet5's 4 machines ran 3,546
samples/s synchronously, 3,108 in 4 groups: asynchrony's staleness there buys nothing).

``optimize`` is the paper's loop around it: the search from the current model W, W ← the winning
trial's end state, then epochs of training, each checkpointed; an epoch whose loss collapses is
rolled back and searched again at a tenth of the learning rate; every E epochs the search may run
again (the paper: every hour).

Pure: a trial is a callable ``trial(groups, momentum, lr) -> loss`` and the loop drives a ``Runner``
(the runtime's are short runs of the groups runtime on digits, ``runtime/tune.py``), so the search
is tested without processes.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

MOMENTA = (0.0, 0.3, 0.6, 0.9)  # Omnivore's released optimizer
COLD_LRS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)  # Omnivore §V-B: 0.1 … 0.00001, tried from low to high
COLD_MOMENTUM = 0.9
HE_GAIN = 0.1
"""Asynchrony must run at least this much faster than synchronous training to be searched."""


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
    index: int | None = None
    """Its place in the search's trials."""
    fraction: float = 1.0
    """The share of a whole trial's iterations it has run (successive halving runs them in rungs)."""
    samples_per_s: float | None = None
    """Its measured throughput, where the trial callable's runner reports it."""


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
    epochs: list[Epoch] = field(default_factory=list)
    """``optimize``: the training epochs, rolled back ones included."""
    final: tuple[int, float, float] | None = None
    """``optimize``: the (g, µ, η) the run ended with (a rollback or a re-tune may change the first choice)."""

    def to_dict(self) -> dict:
        return {"groups": self.groups, "momentum": self.momentum, "lr": self.lr, "loss": self.loss,
                "cold_start_lr": self.cold_start_lr, "start_groups": self.start_groups, "tuning_s": self.tuning_s,
                "stopped": self.stopped, "final": list(self.final) if self.final else None,
                "epochs": [{"index": e.index, "groups": e.groups, "momentum": e.momentum, "lr": e.lr,
                            "first_loss": e.first_loss, "last_loss": e.last_loss, "diverged": e.diverged,
                            "seconds": e.seconds} for e in self.epochs],
                "trials": [{"phase": t.phase, "groups": t.groups, "momentum": t.momentum, "lr": t.lr,
                            "loss": t.loss if math.isfinite(t.loss) else None, "seconds": t.seconds,
                            "fraction": t.fraction} for t in self.trials]}


class _OutOfBudget(Exception):
    pass


class Search:
    """The trials of Algorithm 1, in the order run; ``budget_s`` bounds their wall time (a search
    that runs out returns the best trial so far). ``rungs`` > 1: each grid by successive halving,
    which needs ``trial(g, µ, η, fraction)`` (a trial of that share of the iterations) and
    ``extend(index, fraction) -> loss`` (trial ``index`` continued from where it stopped until it
    has run that share)."""

    def __init__(self, trial: Callable[..., float], *, momenta: tuple[float, ...] = MOMENTA,
                 budget_s: float | None = None, progress: Callable[[Trial], None] | None = None,
                 extend: Callable[[int, float], float] | None = None, rungs: int = 1,
                 rate: Callable[[int], float | None] | None = None,
                 on_sync: Callable[[Trial, float], None] | None = None):
        if rungs < 1 or (rungs > 1 and extend is None):
            raise ValueError("successive halving (rungs > 1) needs extend()")
        self._trial, self.momenta, self.budget_s, self._progress = trial, momenta, budget_s, progress
        self._extend, self.rungs, self._rate, self._on_sync = extend, rungs, rate, on_sync
        self.trials: list[Trial] = []
        self.stopped: str | None = None
        self.seconds = 0.0

    def _check_budget(self) -> None:
        if self.budget_s is not None and self.trials and self.seconds > self.budget_s:
            self.stopped = f"time budget of {self.budget_s:g} s spent"
            raise _OutOfBudget

    def run(self, phase: str, g: int, mu: float, lr: float, fraction: float = 1.0) -> Trial:
        self._check_budget()
        t = time.perf_counter()
        loss = float(self._trial(g, mu, lr) if self.rungs == 1 else self._trial(g, mu, lr, fraction))
        tr = Trial(phase=phase, groups=g, momentum=mu, lr=lr, loss=loss if math.isfinite(loss) else math.inf,
                   seconds=time.perf_counter() - t, index=len(self.trials), fraction=fraction,
                   samples_per_s=self._rate(len(self.trials)) if self._rate else None)
        self.seconds += tr.seconds
        self.trials.append(tr)
        if self._progress:
            self._progress(tr)
        return tr

    def extend(self, tr: Trial, fraction: float) -> Trial:
        """Trial ``tr`` continued until it has run ``fraction`` of a whole trial."""
        self._check_budget()
        t = time.perf_counter()
        loss = float(self._extend(tr.index, fraction)) if math.isfinite(tr.loss) else math.inf
        dt = time.perf_counter() - t
        out = replace(tr, loss=loss if math.isfinite(loss) else math.inf, seconds=tr.seconds + dt, fraction=fraction)
        self.seconds += dt
        self.trials[tr.index] = out
        if self._progress:
            self._progress(out)
        return out

    def sync_rate(self) -> float | None:
        """The synchronous (g = 1) trials' median measured samples per second, if known."""
        rates = [t.samples_per_s for t in self.trials if t.groups == 1 and t.samples_per_s]
        return statistics.median(rates) if rates else None

    def no_gain(self, tr: Trial) -> bool:
        """Trial ``tr`` (at g > 1) ran fewer than (1 + HE_GAIN)× the synchronous samples per second."""
        sync = self.sync_rate()
        return tr.groups > 1 and sync is not None and tr.samples_per_s is not None and \
            tr.samples_per_s < (1.0 + HE_GAIN) * sync

    def grid(self, phase: str, g: int, configs: list[tuple[float, float]], to_sync: bool = False) -> Trial:
        """The lowest-loss (µ, η) of ``configs`` at g: each a whole trial, or by successive halving.
        ``to_sync``: when its first trial shows asynchrony at g buys no throughput (``no_gain``), the
        grid runs at g = 1 instead."""
        fractions = [2.0 ** (r - self.rungs + 1) for r in range(self.rungs)]  # R = 3: 1/4, 1/2, 1
        first = self.run(phase, g, *configs[0], fractions[0])
        if to_sync and self.no_gain(first):
            if self._on_sync:
                self._on_sync(first, self.sync_rate())
            g = 1
            first = self.run(phase, g, *configs[0], fractions[0])
        if self.rungs == 1:
            return min([first] + [self.run(phase, g, mu, lr) for mu, lr in configs[1:]], key=lambda t: t.loss)
        alive = [first] + [self.run(phase, g, mu, lr, fractions[0]) for mu, lr in configs[1:]]
        for f in fractions[1:]:
            alive = sorted(alive, key=lambda t: t.loss)[:max(1, math.ceil(len(alive) / 2))]
            alive = [self.extend(t, f) for t in alive]
        return min(alive, key=lambda t: t.loss)

    def cold_start(self, cold_lrs: tuple[float, ...] = COLD_LRS) -> Trial:
        """Synchronous, momentum 0.9, learning rates low → high until the loss gets worse. With
        rungs > 1 each for the first rung's share of a trial, and the best then continued to a whole
        trial (the learning rates are 10× apart: a quarter trial tells them apart)."""
        cold = None
        first = 2.0 ** (1 - self.rungs)
        try:
            for lr in cold_lrs:
                tr = self.run("cold-start", 1, COLD_MOMENTUM, lr, first)
                if cold is not None and not tr.loss < cold.loss:
                    break
                cold = tr
            if cold is not None and cold.fraction < 1.0:
                cold = self.extend(cold, 1.0)
        except _OutOfBudget:
            pass
        return cold

    def algorithm1(self, machines: int, g: int, last_lr: float, phase: str = "grid", halve: bool = True) -> Trial | None:
        """gridSearch(momenta × {last, last/10} | g), halving g while the best momentum is 0, and
        going to g = 1 where asynchrony buys no throughput (unless ``halve`` is off: g fixed by the
        user); None when the budget allowed no trial."""
        start = len(self.trials)

        def grid(g: int) -> Trial:
            return self.grid(phase, g, [(mu, lr) for lr in (last_lr, last_lr / 10) for mu in self.momenta],
                             to_sync=halve)

        try:
            best = grid(g)
            while halve and best.momentum == 0 and best.groups > 1:
                best = grid(next_groups(machines, best.groups))
            return best
        except _OutOfBudget:
            pool = self.trials[start:]
            return min(pool, key=lambda t: t.loss) if pool else None


# ---- the paper's loop: search, train an epoch, checkpoint ----------------------------------------
ROLLBACK_RISE = 2.0
ROLLBACK_FLOOR = 0.1
ROLLBACK_CHANCE = 0.9
"""An epoch that started below this share of the run's first loss (for a fresh model: chance) and
ends at or above it has lost what training had learnt, however little it rose: digits' debug net at
µ = 0.9, η = 0.1 went from a trial's 1.52 back to 2.30 (chance: ln 10) in its first epoch, under
ROLLBACK_RISE × 1.52, and stayed there for every later epoch."""


def epoch_diverged(losses: list[float | None], first_loss: float, start_loss: float | None = None,
                   window: int = 10) -> bool:
    """An epoch diverged when its loss ends non-finite, or its last ``window`` steps' mean is at least
    ROLLBACK_RISE × the loss it started from (``start_loss``, the model's recent loss; default its own
    first window's) and above ROLLBACK_FLOOR × the run's first loss: a collapse or a lasting
    regression, not the noise of small batches near zero loss; or when it started below
    ROLLBACK_CHANCE × the run's first loss and ends back above it (back at chance)."""
    seen = [x for x in losses if x is not None]
    if not seen:
        return False
    if not all(math.isfinite(x) for x in seen):
        return True
    w = max(1, min(window, len(seen) // 2))
    tail = sum(seen[-w:]) / w
    ref = start_loss if start_loss is not None and math.isfinite(start_loss) else sum(seen[:w]) / w
    if ref < ROLLBACK_CHANCE * first_loss <= tail:
        return True
    return tail >= ROLLBACK_RISE * ref and tail > ROLLBACK_FLOOR * first_loss


@dataclass(frozen=True, kw_only=True, slots=True)
class Epoch:
    index: int
    groups: int
    momentum: float
    lr: float
    first_loss: float | None
    last_loss: float | None
    diverged: bool
    seconds: float


class Runner(Protocol):
    """What ``optimize`` drives (``runtime/tune.py``'s runs one on real processes): a current model W
    (initially the initialisation), trials and epochs that start from it."""

    first_loss: float
    """The run's first loss (the scale ``epoch_diverged`` compares with); known after the first trial."""
    current_loss: float | None
    """W's recent loss: the mean of the kept run's last steps (what an epoch must not double)."""

    def trial(self, groups: int, momentum: float, lr: float, fraction: float = 1.0) -> float:
        """A short run from W (``fraction`` of a whole trial's iterations); its end state is kept
        aside. Its final loss."""

    def extend(self, index: int, fraction: float) -> float:
        """Trial ``index`` continued from its end state until it has run ``fraction`` of a whole
        trial (successive halving; optional). Its final loss."""

    def adopt(self, trial: Trial) -> None:
        """W ← that trial's end state (its iterations become part of the run)."""

    def train(self, groups: int, momentum: float, lr: float) -> list[float | None]:
        """One epoch from W; its per-step losses. Its end state is pending: commit or roll back."""

    def commit(self) -> None:
        """W ← the epoch's end state (checkpointed)."""

    def rollback(self) -> None:
        """Forget the epoch: W stays the last good checkpoint."""

    def done(self) -> bool:
        """The target loss is reached or the run's iterations are spent."""


def optimize(runner: Runner, machines: int, start_groups: int, *, momenta: tuple[float, ...] = MOMENTA,
             cold_lrs: tuple[float, ...] = COLD_LRS, budget_s: float | None = None, retune_epochs: int = 0,
             max_rollbacks: int = 3, fixed_groups: bool = False, progress: Callable[[Trial], None] | None = None,
             on_epoch: Callable[[Epoch], None] | None = None, rungs: int = 1,
             on_sync: Callable[[Trial, float], None] | None = None) -> TuneResult:
    """Omnivore's optimizer as a loop (§V-B, Algorithm 1): the cold start, then the search from the
    current model, whose winning trial is adopted (its iterations are training, not overhead), then
    epochs of training, each checkpointed. Every ``retune_epochs`` epochs (0: never) the search runs
    again from the current model, as the paper does every hour. An epoch that diverged
    (``epoch_diverged``) is rolled back to the last checkpoint and the search runs again with
    learning rates a tenth of the diverged one's; after ``max_rollbacks`` the run stops.
    ``fixed_groups``: g stays ``start_groups`` (momentum and learning rate tuned for it alone).
    ``rungs`` > 1: each grid by successive halving (the runner's ``trial`` then takes a fraction
    and it has ``extend``). ``on_sync(trial, sync_samples_per_s)``: told when a grid goes to g = 1
    because asynchrony bought no throughput (the runner's ``samples_per_s`` measures it)."""
    if machines % start_groups:
        raise ValueError(f"start_groups {start_groups} does not divide {machines}")
    search = Search(runner.trial, momenta=momenta, budget_s=budget_s, progress=progress,
                    extend=getattr(runner, "extend", None), rungs=rungs, rate=getattr(runner, "samples_per_s", None),
                    on_sync=on_sync)
    cold = search.cold_start(cold_lrs)
    runner.adopt(cold)
    halve = not fixed_groups
    best = search.algorithm1(machines, start_groups, cold.lr, halve=halve)
    if best is not None:
        runner.adopt(best)
    else:  # no budget left for the grid: the cold start's (µ, η), at g when g is fixed
        best = replace(cold, groups=start_groups) if fixed_groups else cold
    chosen = best
    epochs: list[Epoch] = []
    rollbacks, since, stopped = 0, 0, None
    while not runner.done():
        t = time.perf_counter()
        before = runner.current_loss
        losses = runner.train(best.groups, best.momentum, best.lr)
        seen = [x for x in losses if x is not None]
        ep = Epoch(index=len(epochs), groups=best.groups, momentum=best.momentum, lr=best.lr,
                   first_loss=seen[0] if seen else None, last_loss=seen[-1] if seen else None,
                   diverged=epoch_diverged(losses, runner.first_loss, before), seconds=time.perf_counter() - t)
        epochs.append(ep)
        if on_epoch:
            on_epoch(ep)
        if ep.diverged:
            runner.rollback()
            rollbacks += 1
            if rollbacks > max_rollbacks:
                stopped = f"{rollbacks} epochs diverged and were rolled back"
                break
            found = search.algorithm1(machines, best.groups, best.lr / 10, phase="retune", halve=halve)
            if found is None:  # no budget left for trials: the same (g, µ), a tenth of the learning rate
                best = replace(best, lr=best.lr / 10)
            else:
                best = found
                runner.adopt(best)
            since = 0
            continue
        runner.commit()
        since += 1
        if retune_epochs and since >= retune_epochs and not runner.done():
            found = search.algorithm1(machines, best.groups, best.lr, phase="retune", halve=halve)
            if found is not None:
                best = found
                runner.adopt(best)
            since = 0
    return TuneResult(groups=chosen.groups, momentum=chosen.momentum, lr=chosen.lr, loss=chosen.loss,
                      cold_start_lr=cold.lr, start_groups=start_groups, trials=search.trials,
                      tuning_s=search.seconds, stopped=stopped or search.stopped, epochs=epochs,
                      final=(best.groups, best.momentum, best.lr))


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
