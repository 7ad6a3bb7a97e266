"""The implicit-momentum estimator (Omnivore Theorem 1): it recovers a known momentum, finds none
without asynchrony, and finds 1 − 1/g in the theorem's own queue model."""

from __future__ import annotations

import numpy as np
import pytest

from layerplan.stats.momentum import (LinearRegression, fit_momentum, measure, momentum_sgd_runs, queue_runs,
                                      threaded_run, theorem1_momentum)

PROBLEM = LinearRegression.make(seed=3)


@pytest.mark.parametrize("mu", [0.0, 0.3, 0.6, 0.9])
def test_fit_recovers_explicit_momentum(mu):
    fit = fit_momentum(momentum_sgd_runs(PROBLEM, mu, 0.01, 80), PROBLEM.grad)
    assert fit.momentum == pytest.approx(mu, abs=1e-9) and fit.step == pytest.approx(0.01, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)


def test_fit_recovers_momentum_through_gradient_noise_averaged_over_runs():
    fit = fit_momentum(momentum_sgd_runs(PROBLEM, 0.6, 0.01, 80, runs=400, noise=0.5, seed=1), PROBLEM.grad)
    assert fit.momentum == pytest.approx(0.6, abs=0.03) and fit.step == pytest.approx(0.01, rel=0.1)


def test_one_group_has_no_implicit_momentum():
    traj, stale = queue_runs(PROBLEM, 1, 0.02, 40, 10)
    assert not stale.any() and abs(fit_momentum(traj, PROBLEM.grad).momentum) < 1e-9
    traj, stale = threaded_run(PROBLEM, 1, 0.02, 30, work_s=0.0)
    assert traj.shape == (31, PROBLEM.dim) and not stale.any()
    assert abs(fit_momentum(traj[None], PROBLEM.grad).momentum) < 1e-9


@pytest.mark.parametrize("g", [2, 4, 8])
def test_queue_model_gives_theorem_1(g):
    r = measure(g, source="queue", runs=400, problem=PROBLEM)
    assert r["measured_momentum"] == pytest.approx(theorem1_momentum(g), abs=0.03)
    assert r["fitted_step"] == pytest.approx(0.02 / g, rel=0.1)


def test_a_real_threaded_run_applies_every_update_once():
    traj, stale = threaded_run(PROBLEM, 4, 0.02, 40, work_s=1e-4)
    assert traj.shape == (41, PROBLEM.dim) and stale.shape == (40,)
    assert stale.min() >= 0 and stale[0] == 0 and np.all(stale <= np.arange(40))
