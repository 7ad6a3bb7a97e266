"""Omnivore's Algorithm 1 on made-up trial losses: cold start order and early stop, grid, halving g."""

from __future__ import annotations

import math

import pytest

from layerplan.plan.tune import COLD_LRS, Search, epoch_diverged, next_groups, optimize, time_to_target


def test_cold_start_climbs_until_worse_then_grid_picks_the_lowest_loss():
    calls = []

    def trial(g, mu, lr):
        calls.append((g, mu, lr))
        if g == 1 and mu == 0.9:  # cold start: best at 1e-3
            return {1e-5: 2.0, 1e-4: 1.5, 1e-3: 1.0, 1e-2: 1.2}.get(lr, 9.0)
        return abs(mu - 0.3) + (0 if lr == 1e-3 else 0.5)  # at g = 4: µ = 0.3, η = last wins

    s = Search(trial)
    cold = s.cold_start()
    assert calls == [(1, 0.9, lr) for lr in COLD_LRS[:4]]  # stopped at 1e-2 (worse than 1e-3)
    best = s.algorithm1(machines=4, g=4, last_lr=cold.lr)
    assert (best.groups, best.momentum, best.lr, cold.lr) == (4, 0.3, 1e-3, 1e-3)
    assert len([t for t in s.trials if t.phase == "grid"]) == 8 and s.stopped is None
    assert [t.index for t in s.trials] == list(range(len(s.trials)))


def test_groups_are_halved_while_the_best_momentum_is_zero():
    def trial(g, mu, lr):
        if g == 1 and mu == 0.9 and lr in COLD_LRS:
            return 1.0 / (1 + COLD_LRS.index(lr))  # keeps improving: last cold lr wins
        best_mu = {8: 0.0, 4: 0.0, 2: 0.6}.get(g, 0.9)  # too much implicit momentum until g = 2
        return abs(mu - best_mu) + (0.0 if lr == 0.1 else 0.2) + g * 1e-3

    s = Search(trial)
    best = s.algorithm1(machines=8, g=8, last_lr=s.cold_start().lr)
    assert [t.groups for t in s.trials if t.phase == "grid"] == [8] * 8 + [4] * 8 + [2] * 8
    assert (best.groups, best.momentum, best.lr) == (2, 0.6, 0.1)


def test_diverged_trials_lose_and_the_budget_stops_the_search():
    s = Search(lambda g, mu, lr: math.nan if lr > 1e-3 else 1.0 - lr)
    s.algorithm1(machines=2, g=2, last_lr=s.cold_start().lr)
    assert s.trials[2].lr == 1e-3 and all(t.loss == math.inf for t in s.trials if t.lr > 1e-3)
    s = Search(lambda g, mu, lr: 1.0, budget_s=0.0)
    assert s.cold_start().phase == "cold-start" and s.algorithm1(machines=2, g=2, last_lr=0.1) is None
    assert len(s.trials) == 1 and s.stopped == "time budget of 0 s spent"


def test_successive_halving_runs_the_grid_in_rungs_from_where_each_trial_stopped():
    """R = 3: all 8 (µ, η) for a quarter of a trial, the better 4 continued to half, the better 2
    to a whole trial — 4 trials' iterations — and the lowest loss at the end wins."""
    runs, ext = [], []
    quality = {(mu, lr): abs(mu - 0.6) + (0.0 if lr == 0.1 else 0.3) for mu in (0.0, 0.3, 0.6, 0.9) for lr in (0.1, 0.01)}
    cfg = {}

    def trial(g, mu, lr, fraction=1.0):
        runs.append((g, mu, lr, fraction))
        cfg[len(cfg)] = (mu, lr)
        return quality.get((mu, lr), 1.0) + 1.0 / (1 + fraction) if g == 4 else 1.0 / (1 + COLD_LRS.index(lr))

    def extend(index, fraction):
        ext.append((index, fraction))
        return quality[cfg[index]] + 1.0 / (1 + fraction)

    with pytest.raises(ValueError, match="extend"):
        Search(trial, rungs=3)
    s = Search(trial, extend=extend, rungs=3)
    best = s.algorithm1(machines=4, g=4, last_lr=0.1, halve=False)
    assert [r[3] for r in runs] == [0.25] * 8 and [f for _, f in ext] == [0.5] * 4 + [1.0] * 2
    assert sum(0.25 for _ in runs) + sum(0.25 for _, f in ext if f == 0.5) + sum(0.5 for _, f in ext if f == 1.0) == 4.0
    assert (best.momentum, best.lr, best.fraction) == (0.6, 0.1, 1.0) and s.trials[best.index] == best
    assert len(s.trials) == 8 and {t.fraction for t in s.trials} == {0.25, 0.5, 1.0}
    r = FakeRunner()
    res = optimize(r, machines=4, start_groups=4, rungs=3)
    assert res.final == (4, 0.3, 0.01) and r.log[1] == ("adopt", "grid", 4, 0.3, 0.1)
    assert {t.fraction for t in res.trials if t.phase == "grid"} == {0.25, 0.5, 1.0}
    cold = [t for t in res.trials if t.phase == "cold-start"]  # a quarter each, the best continued to a whole
    assert sorted(t.fraction for t in cold) == [0.25] * (len(cold) - 1) + [1.0] and r.log[0][:2] == ("adopt", "cold-start")


@pytest.mark.parametrize("async_rate, halve, grid_groups", [(105.0, True, 1), (150.0, True, 4), (105.0, False, 4)])
def test_the_grid_goes_synchronous_where_asynchrony_buys_no_throughput(async_rate, halve, grid_groups):
    """The first grid trial at g = 4 runs 1.05× the cold start's samples/s (< 1 + HE_GAIN): the grid
    runs at g = 1 instead; at 1.5× it stays at g = 4; with g fixed (no halving) it stays too."""
    rates = []

    def trial(g, mu, lr):
        rates.append(100.0 if g == 1 else async_rate)
        return abs(mu - 0.3) + (0 if lr == 0.1 else 0.5) + (0.01 if g == 1 else 0.0)

    told = []
    s = Search(trial, rate=lambda i: rates[i], on_sync=lambda t, sync: told.append((t.groups, t.samples_per_s, sync)))
    cold = s.cold_start((0.01, 0.1))
    best = s.algorithm1(machines=4, g=4, last_lr=cold.lr, halve=halve)
    assert told == ([(4, async_rate, 100.0)] if grid_groups == 1 else [])
    grid = [t for t in s.trials if t.phase == "grid"]
    assert grid[0].groups == 4 and grid[0].samples_per_s == async_rate
    assert {t.groups for t in grid[1:]} == {grid_groups} and len(grid) == (9 if grid_groups == 1 else 8)
    assert (best.groups, best.momentum, best.lr) == (grid_groups, 0.3, 0.1)


class FakeRunner:
    """A model whose state is its loss: a trial or an epoch multiplies it by a factor of (g, µ, η);
    η = 0.1 trains well for a trial but collapses to chance over an epoch (as on digits)."""

    def __init__(self, target=0.05, max_epochs=6):
        self.w, self.first_loss, self.target, self.max_epochs = 2.3, 2.3, target, max_epochs
        self.kept, self.pending, self.log, self.epochs = {}, None, [], 0

    @property
    def current_loss(self):
        return self.w

    def factor(self, g, mu, lr):
        return 0.5 + abs(mu - {1: 0.9, 2: 0.6, 4: 0.3}[g]) + abs(math.log10(lr) + 1) * 0.1 + 0.01 * (4 - g)

    def trial(self, g, mu, lr, fraction=1.0):
        loss = self.w * self.factor(g, mu, lr) ** fraction
        self.kept[len(self.kept)] = loss
        self.cfg = {**getattr(self, "cfg", {}), len(self.kept) - 1: ((g, mu, lr), fraction)}
        return loss

    def extend(self, index, fraction):
        (g, mu, lr), done = self.cfg[index]
        self.kept[index] *= self.factor(g, mu, lr) ** (fraction - done)
        self.cfg[index] = ((g, mu, lr), fraction)
        return self.kept[index]

    def adopt(self, t):
        self.w = self.kept[t.index]
        self.log.append(("adopt", t.phase, t.groups, t.momentum, t.lr))

    def train(self, g, mu, lr):
        self.epochs += 1
        if lr >= 0.1:
            self.pending = 2.3
            return [self.w, self.w * 2, 2.3, 2.3]
        self.pending = self.w * self.factor(g, mu, lr) ** 3
        return [self.w, self.pending]

    def commit(self):
        self.w = self.pending
        self.log.append(("commit", self.w))

    def rollback(self):
        self.log.append(("rollback", self.w))

    def done(self):
        return self.w <= self.target or self.epochs >= self.max_epochs


def test_optimize_adopts_winning_trials_rolls_back_a_collapse_and_searches_a_lower_lr():
    r = FakeRunner()
    res = optimize(r, machines=4, start_groups=4)
    assert r.log[0][:2] == ("adopt", "cold-start") and r.log[1] == ("adopt", "grid", 4, 0.3, 0.1)
    assert res.epochs[0].diverged and res.epochs[0].lr == 0.1 and r.log[2][0] == "rollback"
    assert r.log[3] == ("adopt", "retune", 4, 0.3, 0.01)  # the grid again at η/10, η/100, from the same W
    assert [e.diverged for e in res.epochs[1:]] == [False] * (len(res.epochs) - 1) and r.w <= r.target
    assert res.final == (4, 0.3, 0.01) and (res.groups, res.lr) == (4, 0.1) and res.stopped is None
    assert len([t for t in res.trials if t.phase == "retune"]) == 8 and res.to_dict()["epochs"][0]["diverged"]


def test_optimize_retunes_every_k_epochs_and_stops_after_repeated_collapses():
    r = FakeRunner(target=1e-9, max_epochs=4)
    res = optimize(r, machines=4, start_groups=4, cold_lrs=(1e-3, 1e-2), retune_epochs=1)
    assert [t.phase for t in res.trials].count("retune") == 8 * 3  # after epochs 1, 2, 3 (not after the last)
    collapsing = FakeRunner()
    collapsing.train = lambda g, mu, lr: [1.0, 2.3, 2.3]
    res = optimize(collapsing, machines=2, start_groups=2, max_rollbacks=2)
    assert len(res.epochs) == 3 and res.stopped == "3 epochs diverged and were rolled back"


def test_optimize_with_fixed_groups_never_halves():
    r = FakeRunner()
    r.factor = lambda g, mu, lr: 0.5 + mu + abs(math.log10(lr) + 2) * 0.1  # µ = 0 always best: would halve
    res = optimize(r, machines=4, start_groups=4, fixed_groups=True)
    assert {t.groups for t in res.trials if t.phase != "cold-start"} == {4} and res.final[0] == 4
    assert all(e.groups == 4 for e in res.epochs)


def test_epoch_diverged_tells_a_collapse_from_noise_near_zero():
    assert epoch_diverged([0.5] * 10 + [2.3] * 10, first_loss=2.3)
    assert epoch_diverged([0.5, math.nan], first_loss=2.3)
    assert not epoch_diverged([0.001] * 10 + [0.004] * 10, first_loss=2.3)  # 4× but near zero
    assert not epoch_diverged([1.0] * 10 + [1.5] * 10, first_loss=2.3)
    assert not epoch_diverged([None, None], first_loss=2.3)
    assert epoch_diverged([0.3] * 20, first_loss=2.3, start_loss=0.1)  # regressed from where W was
    assert not epoch_diverged([0.15] * 20, first_loss=2.3, start_loss=0.1)
    assert epoch_diverged([2.30] * 20, first_loss=2.32, start_loss=1.52)  # back at chance: under 2× 1.52
    assert not epoch_diverged([2.25] * 20, first_loss=2.32, start_loss=2.2)  # never left it: nothing lost
    assert not epoch_diverged([1.9] * 20, first_loss=2.32, start_loss=1.52)  # worse, not back at chance


def test_next_groups_and_time_to_target():
    assert [next_groups(12, g) for g in (12, 6, 3, 2)] == [6, 3, 1, 1]
    assert next_groups(6, 6) == 3 and next_groups(6, 3) == 1
    assert time_to_target([3.0, None, 1.0, 0.5], [1.0, 1.0, 2.0, 1.0], 1.0) == pytest.approx(4.0)
    assert time_to_target([3.0], [1.0], 1.0) is None
    assert time_to_target([0.5, 3.0, 1.0, 0.9, 0.8], [1.0] * 5, 1.0, window=3) == pytest.approx(5.0)  # not the lucky first


@pytest.mark.parametrize("argv, words", [
    (["nin"], "groups needs an FC phase"),
    (["debug", "--on", "emulated"], "local processes only"),
    (["debug", "--budget", "3parsecs"], "unknown time unit"),
    (["debug", "--workers", "4", "--groups", "3"], "does not divide --workers 4"),
    (["debug", "--retune-every", "-1"], "--retune-every must be >= 0"),
    (["debug", "--target-loss", "-1"], "--target-loss must be a positive number, got -1"),
    (["debug", "--target-loss", "nan"], "--target-loss must be a positive number, got nan"),
])
def test_tune_rejects_bad_input_in_one_line(capsys, argv, words):
    from layerplan import cli

    rc = cli.main(["tune", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1, err


@pytest.mark.dist
def test_tune_runs_every_trial_in_one_session_and_compares_sync_and_async(capsys, tmp_path):
    import json

    from layerplan import cli

    out = tmp_path / "tune.json"
    assert cli.main(["tune", "debug", "--workers", "2", "--trial-steps", "2", "--steps", "4", "--budget", "0s",
                     "--target-loss", "1e-6", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    assert doc["stopped"] and len([t for t in doc["trials"] if t["phase"] == "cold-start"]) == 1
    runs = {r["label"]: r for r in doc["runs"]}
    assert set(runs) >= {"chosen", "async"} and runs["async"]["groups"] == 2
    assert set(runs) == {"chosen", "sync", "async"} or doc["groups"] == 1
    for r in runs.values():
        assert r["steps"] == 4 and r["time_to_target_s"] is None and r["wall_s"] > 0  # loss 1e-6: not in 4 steps
    # budget 0: the one cold-start trial is adopted (2 iterations), one epoch trains the other 2
    assert doc["trials"][0]["from_step"] == 0 and [e["from_step"] for e in doc["epochs"]] == [2]
    assert doc["search_s"] == 0 and doc["overhead"] is None  # no losing trial, no rolled-back epoch; no target


def test_tune_by_successive_halving_continues_trials_from_their_checkpoints(capsys, tmp_path):
    """--rungs 2: the grid's 8 trials run half a trial (3 iterations), the better 4 continue from
    their checkpoints to a whole one (6); the winner's 6 iterations are the run's, after the cold
    start's adopted 6."""
    import json

    from layerplan import cli

    assert cli.main(["tune", "debug", "--workers", "2", "--groups", "2", "--trial-steps", "6", "--rungs", "2",
                     "--steps", "14", "--epoch-steps", "2", "--no-compare", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    grid = [t for t in doc["trials"] if t["phase"] == "grid"]
    assert [t["iterations"] for t in grid] == [3] * 8 + [6] * 4
    assert sorted(t["trial"] for t in grid[8:]) == sorted({t["trial"] for t in grid[8:]}) and \
        {t["trial"] for t in grid[8:]} <= {t["trial"] for t in grid[:8]}
    first = {t["trial"]: t for t in grid[:8]}
    kept = sorted(first.values(), key=lambda t: t["loss"])[:4]  # the better half went on
    assert {t["trial"] for t in grid[8:]} == {t["trial"] for t in kept}
    assert doc["epochs"][0]["from_step"] == 12 and doc["runs"][0]["steps"] == 14


def test_run_summary_flags_a_run_that_ends_no_better_than_it_began():
    from layerplan.runtime.tune import run_summary

    def m(loss):
        return {"loss": loss, "step_time_s": 0.01, "step_times_s": [0.01] * len(loss)}

    collapsed = run_summary(m([2.3, 1.0, 0.01, 0.02, 2.31, 2.32, 2.33]), 0.05, "chosen", 2, 0.9, 0.1, 1.0)
    assert collapsed["diverged"] and collapsed["min_loss"] == 0.01 and collapsed["min_loss_step"] == 2
    assert collapsed["time_to_target_s"] is None or collapsed["time_to_target_s"] > 0
    fine = run_summary(m([2.3, 1.0, 0.5, 0.2, 0.1, 0.05, 0.04]), 0.05, "chosen", 2, 0.6, 0.1, 1.0)
    assert not fine["diverged"] and fine["min_loss_step"] == 6
    nan = run_summary(m([2.3, 1.0, math.nan, math.nan, math.nan]), None, "chosen", 1, 0.9, 0.1, 1.0)
    assert nan["diverged"] and nan["min_loss"] == 1.0


def test_tune_will_not_write_its_model_over_a_non_empty_directory(capsys, tmp_path):
    from layerplan import cli

    (tmp_path / "something").write_text("kept")
    rc = cli.main(["tune", "debug", "--checkpoint-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "is not an empty directory" in err and err.count("\n") == 1
    assert (tmp_path / "something").read_text() == "kept"
