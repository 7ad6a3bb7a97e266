"""Implicit momentum of asynchronous updates, measured (Omnivore §IV-C, Theorem 1; Mitliagkas et al.,
"Asynchrony begets momentum").

Theorem 1: with g asynchronous groups, no explicit momentum and step size η, if the next update
comes from a uniformly random group (staleness S geometric, P(S = s) = (1/g)(1 − 1/g)^s), the
expected update is that of momentum SGD

    E[w_{t+1} − w_t] = µ E[w_t − w_{t−1}] − η' E[∇f(w_t)],   µ = 1 − 1/g,  η' = η/g.

Here the expectation is measured: many runs from the same start, the trajectories averaged, and
(µ, η') fitted by least squares to the averaged steps (``fit_momentum``). The objective is a
linear regression (a quadratic, so E[∇f(w)] = ∇f(E[w]) and the expectation passes through the
gradient). With full-batch gradients the update order is the only randomness.

Two sources of asynchrony, reported side by side:

- ``threaded_runs``: a real execution — g threads race to a model server (a lock): each pulls the
  current model, computes its gradient, works for a random time (exponential: the memoryless
  compute times under which Theorem 1's uniformly random next group holds) and pushes; the server
  applies pushes in the order they really arrive. The order is decided by the OS scheduler and its
  timers, so it differs from run to run. ``service="constant"`` gives every thread the same work
  time, so the groups tend to take turns (staleness ≈ g − 1 every time), outside the theorem's
  assumption.
- ``queue_runs``: the theorem's queue model — each update from a uniformly random group.

Pure NumPy: no torch, importable from the core.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class LinearRegression:
    """f(w) = ‖X w − y‖² / (2n): a quadratic with Hessian XᵀX/n (eigenvalues from ``curvature_min``
    to ``curvature_max``, log-spaced, so fast and slow directions both shape the trajectory)."""

    x: np.ndarray
    y: np.ndarray
    w0: np.ndarray
    """The start of every run."""

    @classmethod
    def make(cls, dim: int = 8, samples: int = 256, curvature_min: float = 1.0, curvature_max: float = 10.0,
             seed: int = 0) -> "LinearRegression":
        rng = np.random.default_rng(seed)
        q, _ = np.linalg.qr(rng.standard_normal((samples, dim)))  # orthonormal columns
        x = q * np.sqrt(samples * np.geomspace(curvature_min, curvature_max, dim))  # XᵀX/n = diag(curvatures)
        w_true = rng.standard_normal(dim)
        y = x @ w_true + 0.1 * rng.standard_normal(samples)
        return cls(x=x, y=y, w0=w_true + rng.standard_normal(dim) * 2.0)

    @property
    def dim(self) -> int:
        return self.x.shape[1]

    def grad(self, w: np.ndarray) -> np.ndarray:
        """∇f at w (w: (..., d)); full batch."""
        n = self.x.shape[0]
        return ((w @ self.x.T - self.y) @ self.x) / n


@dataclass(frozen=True, kw_only=True, slots=True)
class MomentumFit:
    momentum: float
    """µ: the fitted momentum of the expected update."""
    step: float
    """η': the fitted effective step size."""
    r2: float
    """Fraction of the averaged steps' variance the fit explains."""
    runs: int
    steps: int


def fit_momentum(trajectories: np.ndarray, grad, skip: int = 1) -> MomentumFit:
    """Least squares of E[Δ_t] = µ E[Δ_{t−1}] − η' ∇f(E[w_t]) over steps t ≥ ``skip`` and every
    coordinate, E taken as the mean over runs. ``trajectories``: (runs, steps + 1, d)."""
    traj = np.asarray(trajectories, dtype=float)
    if traj.ndim != 3 or traj.shape[1] < skip + 3:
        raise ValueError(f"trajectories must be (runs, steps + 1, d) with steps > {skip + 1}, got {traj.shape}")
    mean = traj.mean(axis=0)
    d = np.diff(mean, axis=0)  # Δ_t = w_{t+1} − w_t
    t = np.arange(max(skip, 1), d.shape[0])
    target = d[t].ravel()
    design = np.stack([d[t - 1].ravel(), -grad(mean[t]).ravel()], axis=1)
    (mu, step), *_ = np.linalg.lstsq(design, target, rcond=None)
    resid = target - design @ np.array([mu, step])
    r2 = 1.0 - float(resid @ resid) / float(target @ target) if target.any() else 1.0
    return MomentumFit(momentum=float(mu), step=float(step), r2=r2, runs=traj.shape[0], steps=d.shape[0])


def momentum_sgd_runs(problem: LinearRegression, momentum: float, lr: float, steps: int, runs: int = 1,
                      noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """Plain momentum SGD (v ← µv − η(∇f + noise), w ← w + v): the estimator's known answer."""
    rng = np.random.default_rng(seed)
    w = np.repeat(problem.w0[None], runs, axis=0)
    v = np.zeros_like(w)
    out = [w.copy()]
    for _ in range(steps):
        v = momentum * v - lr * (problem.grad(w) + noise * rng.standard_normal(w.shape))
        w = w + v
        out.append(w.copy())
    return np.stack(out, axis=1)


def queue_runs(problem: LinearRegression, groups: int, lr: float, steps: int, runs: int,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Theorem 1's queue model: every group holds the model it last read; each update comes from a
    uniformly random group, which applies −η∇f(its read) and reads the new model.
    (trajectories (runs, steps + 1, d), staleness (runs, steps))."""
    rng = np.random.default_rng(seed)
    w = np.repeat(problem.w0[None], runs, axis=0)
    reads = np.repeat(w[:, None], groups, axis=1)
    read_at = np.zeros((runs, groups), dtype=int)
    rows = np.arange(runs)
    out, stale = [w.copy()], []
    for t in range(steps):
        j = rng.integers(groups, size=runs)
        w = w - lr * problem.grad(reads[rows, j])
        stale.append(t - read_at[rows, j])
        reads[rows, j] = w
        read_at[rows, j] = t + 1
        out.append(w.copy())
    return np.stack(out, axis=1), np.stack(stale, axis=1)


class _ModelServer:
    """The model behind a lock: pushes are applied in the order they arrive."""

    def __init__(self, w0: np.ndarray, lr: float, steps: int):
        self._lock = threading.Lock()
        self.w = w0.copy()
        self.lr = lr
        self.steps = steps
        self.version = 0
        self.trajectory = [w0.copy()]
        self.staleness: list[int] = []

    def pull(self) -> tuple[np.ndarray, int]:
        with self._lock:
            return self.w.copy(), self.version

    def push(self, grad: np.ndarray, read_version: int) -> bool:
        """Apply one update; False once the run has all its updates."""
        with self._lock:
            if self.version >= self.steps:
                return False
            self.w = self.w - self.lr * grad
            self.staleness.append(self.version - read_version)
            self.version += 1
            self.trajectory.append(self.w.copy())
            return self.version < self.steps


def _group(server: _ModelServer, problem: LinearRegression, work_s: float, service: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    while True:
        w, version = server.pull()
        g = problem.grad(w)
        time.sleep(rng.exponential(work_s) if service == "exponential" else work_s)
        if not server.push(g, version):
            return


def threaded_run(problem: LinearRegression, groups: int, lr: float, steps: int, work_s: float = 5e-3,
                 service: str = "exponential", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One real asynchronous run: ``groups`` threads race to one model server until it has applied
    ``steps`` updates. (trajectory (steps + 1, d), staleness (steps,))."""
    if service not in ("exponential", "constant"):
        raise ValueError(f"service must be exponential or constant, got {service!r}")
    server = _ModelServer(problem.w0, lr, steps)
    threads = [threading.Thread(target=_group, args=(server, problem, work_s, service, seed * 1000 + j), daemon=True)
               for j in range(groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return np.stack(server.trajectory), np.array(server.staleness)


def threaded_runs(problem: LinearRegression, groups: int, lr: float, steps: int, runs: int, work_s: float = 5e-3,
                  service: str = "exponential", concurrent: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``runs`` real runs, ``concurrent`` of them at a time (independent servers; the threads mostly
    wait, so runs side by side barely change each other's order — as long as the threads' CPU time
    per update stays well below ``work_s``: CPU-bound threads queue for the cores and the GIL, and
    fewer groups than g are really in flight). Stacked like ``queue_runs``."""
    trajs: list = [None] * runs
    stale: list = [None] * runs

    def one(i: int) -> None:
        trajs[i], stale[i] = threaded_run(problem, groups, lr, steps, work_s, service, seed=seed * 100_003 + i)

    for start in range(0, runs, concurrent):
        batch = [threading.Thread(target=one, args=(i,)) for i in range(start, min(runs, start + concurrent))]
        for t in batch:
            t.start()
        for t in batch:
            t.join()
    return np.stack(trajs), np.stack(stale)


def theorem1_momentum(groups: int) -> float:
    return 1.0 - 1.0 / groups  # Omnivore Theorem 1


def measure(groups: int, *, source: str = "threads", lr: float = 0.02, steps: int = 60, runs: int = 200,
            problem: LinearRegression | None = None, work_s: float = 5e-3, threads: int = 32,
            seed: int = 0) -> dict:
    """Measured implicit momentum for ``groups`` asynchronous groups: source ``threads`` (real
    execution, exponential work times), ``threads-constant`` (real, equal work times) or ``queue``
    (Theorem 1's queue model); ``threads``: at most this many group threads at once (runs side by
    side). A JSON-ready dict."""
    problem = problem or LinearRegression.make(seed=seed)
    t0 = time.perf_counter()
    if source == "queue":
        traj, stale = queue_runs(problem, groups, lr, steps, runs, seed=seed)
    elif source in ("threads", "threads-constant"):
        service = "constant" if source == "threads-constant" else "exponential"
        traj, stale = threaded_runs(problem, groups, lr, steps, runs, work_s, service, max(1, threads // groups),
                                    seed=seed)
    else:
        raise ValueError(f"source must be threads, threads-constant or queue, got {source!r}")
    fit = fit_momentum(traj, problem.grad)
    s = stale.ravel()
    return {"groups": groups, "source": source, "measured_momentum": fit.momentum,
            "theorem1_momentum": theorem1_momentum(groups), "error": fit.momentum - theorem1_momentum(groups),
            "fitted_step": fit.step, "theorem1_step": lr / groups, "lr": lr, "r2": fit.r2, "runs": runs,
            "steps": steps, "staleness_mean": float(s.mean()), "staleness_p_zero": float((s == 0).mean()),
            "wall_s": time.perf_counter() - t0}
