"""Yan et al. (KDD'15) — model/data parallelism with parameter servers, and its optimizer.

Configuration Φ: N_ps parameter servers, N_mr model replicas, N_wr workers per replica, and per
layer l a number of partitions P(l) (model parallelism inside a replica). Constraint C1:
N_ps + N_mr·N_wr ≤ N. The optimizer (§5) makes the search polynomial with two ideas:

- a greedy segment→worker mapping: each segment of layer l goes to the worker that holds most of
  its inputs (§5.2);
- dynamic programming over layers (§5.3):
  T([1,l], p_l) = min_{p_{l-1}} T([1,l-1], p_{l-1}) + U(l, p_l) + M(l, l-1, p_l, p_{l-1}),
  base T([1,1], p_1) = U(1, p_1), answer min_{p_L} T([1,L], p_L);
  then outer loops over (N_ps, N_mr, N_wr).

The per-sample costs are Yan's (§4.1): compute U = U_f + U_b + U_w (eq.5, eq.7, eq.8) and
communication M = M_f + M_b (eq.6 and its backward twin), with the platform constants measured on
one machine — here derived from the device and NIC specs (``YanCosts.from_cluster``).

Segments: a layer's output index space [0, 1) is cut into P equal ranges; segment j of a
conv/pool/norm/act layer reads the same relative range of its input (local connectivity, the halo
ignored as in Yan's balanced-segment model); a segment of an fc layer reads all of its input. The
greedy mapping puts segment j on the worker holding the largest share of what it reads, so a
segment's remote activations A(l, p) are what it reads minus that share. Since this depends only
on (P(l), P(l−1)), the DP is exact; ``brute_force`` checks it on small instances.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import LayerSpec, NetSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class YanCosts:
    """Yan §4.1 platform constants (seconds per unit)."""

    c_muladd_s: float
    """Time of one multiply-add (one connection)."""
    c_act_s: float
    """Time to apply the activation function to one neuron."""
    c_err_s: float
    """Time to compute one neuron's error term."""
    c_ncost_s: float
    """Fixed cost (latency) of one network message."""
    c_bits: int
    """Bits per transferred value."""
    c_nbw_bits_per_s: float
    """NIC bandwidth."""

    @classmethod
    def from_cluster(cls, cluster: ClusterSpec, dtype_bytes: int = 4) -> "YanCosts":
        speed = cluster.device.achieved_flops_per_s
        # 2 FLOPs per multiply-add; an activation or error term ~ a few FLOPs each (Yan §4.1
        # measures them; 4 FLOPs is a conservative stand-in when not calibrated).
        return cls(c_muladd_s=2.0 / speed, c_act_s=4.0 / speed, c_err_s=4.0 / speed, c_ncost_s=cluster.nic.latency_s,
                   c_bits=8 * dtype_bytes, c_nbw_bits_per_s=8.0 * cluster.nic.payload_bytes_per_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class YanLayer:
    """What Yan's model needs of a layer, per sample."""

    name: str
    connections: float
    """W(l): multiply-adds per sample (forward FLOPs / 2)."""
    neurons: float
    """N_neuron(l): output values per sample."""
    weights: float
    """Trainable parameters (values read from the parameter servers)."""
    dense: bool
    """True for fc layers: each segment reads the whole input."""

    @classmethod
    def from_spec(cls, layer: LayerSpec) -> "YanLayer":
        return cls(name=layer.name, connections=layer.fwd_flops / 2.0, neurons=float(layer.activations),
                   weights=float(layer.params), dense=layer.kind == "fc")


def model_layers(net: NetSpec) -> list[YanLayer]:
    """The layers Yan partitions: those that compute (conv, fc) or hold values worth moving;
    weightless element-wise layers fold into their producer (they partition with it)."""
    return [YanLayer.from_spec(layer) for layer in net.layers if layer.kind in ("conv", "fc", "pool")]


@functools.lru_cache(maxsize=None)
def remote_fraction(dense: bool, p: int, p_prev: int) -> float:
    """Largest share of a layer's input (as a fraction of the previous layer's output) that one
    segment must receive from other workers under the greedy mapping (Yan §5.2)."""
    if dense:
        return 1.0 - 1.0 / p_prev  # an fc segment reads everything; one input segment is local
    worst = 0.0
    for j in range(p):
        lo, hi = j / p, (j + 1) / p
        held = 0.0
        for i in range(int(lo * p_prev), min(p_prev, int(hi * p_prev) + 1)):
            held = max(held, min(hi, (i + 1) / p_prev) - max(lo, i / p_prev))
        worst = max(worst, (hi - lo) - held)
    return worst if worst > 1e-12 else 0.0


@functools.lru_cache(maxsize=None)
def _fraction_matrix(dense: bool, n: int) -> np.ndarray:
    """remote_fraction(dense, p, q) for p, q in 1..n (row p-1, column q-1)."""
    return np.array([[remote_fraction(dense, p, q) for q in range(1, n + 1)] for p in range(1, n + 1)])


def compute_cost(layer: YanLayer, p: int, c: YanCosts) -> float:
    """U(l, p) per sample: Yan eq.5 (forward) + eq.7 (backward) + eq.8 (weight update)."""
    w = layer.connections / p
    n = layer.neurons / p
    u_f = c.c_muladd_s * w + c.c_act_s * n  # Yan eq.5
    u_b = c.c_muladd_s * w + n * c.c_err_s  # Yan eq.7 (W' ≈ W: the transposed product)
    u_w = c.c_muladd_s * w  # Yan eq.8
    return u_f + u_b + u_w


def comm_cost(layer: YanLayer, prev: YanLayer | None, p: int, p_prev: int, c: YanCosts) -> float:
    """M(l, l−1, p_l, p_{l−1}) per sample: Yan eq.6 forward + its backward twin (error terms)."""
    if prev is None:
        return 0.0
    frac = remote_fraction(layer.dense, p, p_prev)
    if frac <= 0:
        return 0.0
    values = frac * prev.neurons
    m_f = c.c_ncost_s + values * c.c_bits / c.c_nbw_bits_per_s  # Yan eq.6 (A = remote activations)
    m_b = c.c_ncost_s + values * c.c_bits / c.c_nbw_bits_per_s  # Yan §4.1: M_b with E = remote error terms
    return m_f + m_b


@dataclass(frozen=True, kw_only=True, slots=True)
class Partitioning:
    partitions: tuple[int, ...]
    """P(l) per model layer."""
    time_per_sample_s: float
    """Σ_l U + M for one sample through one replica."""


def dp(layers: Sequence[YanLayer], max_partitions: int, c: YanCosts) -> Partitioning:
    """Yan §5.3: the optimal partitions per layer by dynamic programming over layers
    (vectorised over p_l and p_{l−1})."""
    if not layers:
        return Partitioning(partitions=(), time_per_sample_s=0.0)
    n = max_partitions
    ps = np.arange(1, n + 1, dtype=float)

    def u(layer: YanLayer) -> np.ndarray:  # Yan eq.5 + eq.7 + eq.8 for every p at once
        w, neu = layer.connections / ps, layer.neurons / ps
        return (c.c_muladd_s * w + c.c_act_s * neu) + (c.c_muladd_s * w + neu * c.c_err_s) + c.c_muladd_s * w

    best = u(layers[0])  # base: T([1,1], p_1) = U(1, p_1)
    back = []
    per_value = c.c_bits / c.c_nbw_bits_per_s
    for li in range(1, len(layers)):
        layer, prev = layers[li], layers[li - 1]
        frac = _fraction_matrix(layer.dense, n)
        # Yan eq.6 forward + backward twin: 2·(C_ncost + A·C_bits/C_nbw) where anything is remote
        m = np.where(frac > 0, 2.0 * (c.c_ncost_s + frac * prev.neurons * per_value), 0.0)
        total = best[None, :] + m  # [p, q]
        arg = np.argmin(total, axis=1)
        best = u(layer) + total[np.arange(n), arg]
        back.append(arg)
    p_last = int(np.argmin(best))
    parts = [p_last]
    for arg in reversed(back):
        parts.append(int(arg[parts[-1]]))
    return Partitioning(partitions=tuple(p + 1 for p in reversed(parts)), time_per_sample_s=float(best[p_last]))


def path_cost(layers: Sequence[YanLayer], parts: Sequence[int], c: YanCosts) -> float:
    """Σ_l U(l, p_l) + M(l, l−1, p_l, p_{l−1}) for one assignment."""
    t = 0.0
    for i, (layer, p) in enumerate(zip(layers, parts)):  # the DP's objective, summed directly
        t += compute_cost(layer, p, c)
        if i:
            t += comm_cost(layer, layers[i - 1], p, parts[i - 1], c)
    return t


def brute_force(layers: Sequence[YanLayer], max_partitions: int, c: YanCosts) -> Partitioning:
    """Exhaustive search over all partition vectors (exponential: tests only)."""
    best = None
    for parts in itertools.product(range(1, max_partitions + 1), repeat=len(layers)):
        t = path_cost(layers, parts, c)
        if best is None or t < best.time_per_sample_s:
            best = Partitioning(partitions=tuple(parts), time_per_sample_s=t)
    assert best is not None
    return best


def ps_read_time_s(layers: Sequence[YanLayer], n_ps: int, n_mr: int, n_wr: int, c: YanCosts) -> float:
    """Time for one replica to read all weights from the parameter servers.

    Between Yan's bounds: eq.10 worst case Σ_l (C_ncost + N_mr·W(l)/C_nbw) — every replica reads
    through one link at once — and eq.11 best case Σ_l (C_ncost + W(l)/(C_nbw·min(N_ps, N_wr))) —
    a replica uses as many PS links as it has workers. Here the N_ps server links are shared by the
    N_mr replicas reading at once, and a replica can use at most N_wr of them.
    """
    links = min(float(n_wr), n_ps / n_mr)
    links = max(links, 1.0 / n_mr)
    return sum(c.c_ncost_s + layer.weights * c.c_bits / (c.c_nbw_bits_per_s * links) for layer in layers)


def ps_read_bounds_s(layers: Sequence[YanLayer], n_ps: int, n_mr: int, n_wr: int, c: YanCosts) -> tuple[float, float]:
    """(eq.11 best case, eq.10 worst case)."""
    best = sum(c.c_ncost_s + layer.weights * c.c_bits / (c.c_nbw_bits_per_s * min(n_ps, n_wr)) for layer in layers)  # Yan eq.11
    worst = sum(c.c_ncost_s + n_mr * layer.weights * c.c_bits / c.c_nbw_bits_per_s for layer in layers)  # Yan eq.10
    return best, worst


@dataclass(frozen=True, kw_only=True, slots=True)
class YanConfig:
    n_ps: int
    n_mr: int
    n_wr: int
    partitions: tuple[int, ...]
    layer_names: tuple[str, ...]
    epoch_time_s: float
    samples_per_s: float


def epoch_time_s(layers: Sequence[YanLayer], part: Partitioning, n_ps: int, n_mr: int, n_wr: int, c: YanCosts,
                 n_sample: int, n_read: int, threads: int = 1) -> float:
    """Yan §4.2: T_epoch = M_w·N_sample/N_read + Σ_l [U_f+M_f+U_b+M_b+U_w](l)·N_sample/Q(l), with
    Q(l) = H(l)·R(l)·N_mr (no layer replication here: R = 1; H threads share the NIC)."""
    q = threads * n_mr
    m_w = ps_read_time_s(layers, n_ps, n_mr, n_wr, c)
    return m_w * n_sample / n_read + part.time_per_sample_s * n_sample / q


def optimize(net: NetSpec, cluster: ClusterSpec, *, n_sample: int = 1_000_000, n_read: int = 1_000,
             max_partitions: int | None = None) -> list[YanConfig]:
    """Yan §5: outer loops over (N_ps, N_mr, N_wr) with N_ps + N_mr·N_wr ≤ N (C1), the DP inside;
    configurations ranked by epoch time (best first)."""
    layers = model_layers(net)
    c = YanCosts.from_cluster(cluster, net.dtype_bytes)
    n = cluster.nodes
    dp_cache: dict[int, Partitioning] = {}
    out = []
    for n_wr in _candidates(n - 1):
        cap = min(n_wr, max_partitions or n_wr)
        if cap not in dp_cache:
            dp_cache[cap] = dp(layers, cap, c)
        part = dp_cache[cap]
        for n_mr in _candidates((n - 1) // n_wr):
            for n_ps in _candidates(n - n_mr * n_wr):  # Yan C1: N_ps + N_mr·N_wr ≤ N
                t = epoch_time_s(layers, part, n_ps, n_mr, n_wr, c, n_sample, n_read)
                out.append(YanConfig(n_ps=n_ps, n_mr=n_mr, n_wr=n_wr, partitions=part.partitions,
                                     layer_names=tuple(layer.name for layer in layers), epoch_time_s=t,
                                     samples_per_s=n_sample / t))
    out.sort(key=lambda y: (y.epoch_time_s, y.n_ps + y.n_mr * y.n_wr))
    return out


def _candidates(limit: int) -> list[int]:
    """1..limit exhaustively up to 32, then powers of two and the limit itself (keeps the outer
    loops of §5 polynomial and fast on large clusters)."""
    if limit < 1:
        return []
    vals = set(range(1, min(limit, 32) + 1))
    v = 64
    while v <= limit:
        vals.add(v)
        v *= 2
    vals.add(limit)
    return sorted(vals)
