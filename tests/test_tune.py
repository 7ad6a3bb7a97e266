"""Omnivore's Algorithm 1 on made-up trial losses: cold start order and early stop, grid, halving g."""

from __future__ import annotations

import math

import pytest

from layerplan.plan.tune import COLD_LRS, next_groups, time_to_target, tune


def test_cold_start_climbs_until_worse_then_grid_picks_the_lowest_loss():
    calls = []

    def trial(g, mu, lr):
        calls.append((g, mu, lr))
        if g == 1 and mu == 0.9:  # cold start: best at 1e-3
            return {1e-5: 2.0, 1e-4: 1.5, 1e-3: 1.0, 1e-2: 1.2}.get(lr, 9.0)
        return abs(mu - 0.3) + (0 if lr == 1e-3 else 0.5)  # at g = 4: µ = 0.3, η = last wins

    r = tune(trial, machines=4, start_groups=4)
    cold = [c for c in calls if c[0] == 1]
    assert cold == [(1, 0.9, lr) for lr in COLD_LRS[:4]]  # stopped at 1e-2 (worse than 1e-3)
    assert (r.groups, r.momentum, r.lr, r.cold_start_lr) == (4, 0.3, 1e-3, 1e-3)
    assert len([t for t in r.trials if t.phase == "grid"]) == 8 and r.stopped is None


def test_groups_are_halved_while_the_best_momentum_is_zero():
    def trial(g, mu, lr):
        if g == 1 and mu == 0.9 and lr in COLD_LRS:
            return 1.0 / (1 + COLD_LRS.index(lr))  # keeps improving: last cold lr wins
        best_mu = {8: 0.0, 4: 0.0, 2: 0.6}.get(g, 0.9)  # too much implicit momentum until g = 2
        return abs(mu - best_mu) + (0.0 if lr == 0.1 else 0.2) + g * 1e-3

    r = tune(trial, machines=8, start_groups=8)
    assert [t.groups for t in r.trials if t.phase == "grid"] == [8] * 8 + [4] * 8 + [2] * 8
    assert (r.groups, r.momentum, r.lr) == (2, 0.6, 0.1)


def test_diverged_trials_lose_and_the_budget_stops_the_search():
    r = tune(lambda g, mu, lr: math.nan if lr > 1e-3 else 1.0 - lr, machines=2, start_groups=2)
    assert r.cold_start_lr == 1e-3 and all(t.loss == math.inf for t in r.trials if t.lr > 1e-3)
    r = tune(lambda g, mu, lr: 1.0, machines=2, start_groups=2, budget_s=0.0)
    assert len(r.trials) == 1 and r.stopped and r.to_dict()["trials"][0]["phase"] == "cold-start"


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
                     "--target-loss", "100", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    assert doc["stopped"] and len([t for t in doc["trials"] if t["phase"] == "cold-start"]) == 1
    runs = {r["label"]: r for r in doc["runs"]}
    assert set(runs) >= {"chosen", "async"} and runs["async"]["groups"] == 2
    assert set(runs) == {"chosen", "sync", "async"} or doc["groups"] == 1
    for r in runs.values():
        assert r["steps"] == 4 and 0 < r["time_to_target_s"] <= r["wall_s"]  # loss 100: reached at once
    assert doc["overhead"] == pytest.approx(doc["tuning_s"] / runs["chosen"]["time_to_target_s"])


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
