"""Communication schemes against the papers' closed forms (PALEO §2, Stanza §4 and eq.6, RALP)."""

from __future__ import annotations

import math

import pytest

from layerplan.cost import collectives as co
from layerplan.errors import ConfigError

B = 1.25e9  # 10 Gbit/s in bytes/s
S = 100e6  # a 100 MB gradient
T = S / B  # PALEO §2: T = |D|/B


@pytest.mark.parametrize("k", [2, 4, 8, 16, 64])
def test_paleo_schemes(k):
    # PALEO §2: OneToAll 2·K·T (K workers and a separate master: K + 1 participants),
    # Tree AllReduce 2·log2(K)·T, Butterfly AllReduce log2(K)·T.
    assert co.OneToAllAllReduce().cost(S, k + 1).time_s(B) == pytest.approx(2 * k * T)
    assert co.TreeAllReduce().cost(S, k).time_s(B) == pytest.approx(2 * math.log2(k) * T)
    assert co.ButterflyAllReduce().cost(S, k).time_s(B) == pytest.approx(math.log2(k) * T)


def test_paleo_ordering():
    # For K ≥ 4 butterfly < tree < one-to-all, as PALEO's AlexNet cloud study shows.
    for k in (4, 8, 32):
        t = {name: co.ALLREDUCE[name].cost(S, k).time_s(B) for name in ("one_to_all", "tree", "butterfly")}
        assert t["butterfly"] < t["tree"] < t["one_to_all"]


@pytest.mark.parametrize("w", [2, 3, 4, 7, 8, 100])
def test_ring_moves_2s_w_minus_1(w):
    # RALP: Horovod's ring all-reduce moves 2·S·(W−1) per step; each node 2(W−1)/W·S each way.
    c = co.RingAllReduce().cost(S, w)
    assert c.total_bytes == pytest.approx(2 * S * (w - 1))
    assert c.send_bytes_per_node == pytest.approx(2 * (w - 1) / w * S)
    assert c.recv_bytes_per_node == pytest.approx(2 * (w - 1) / w * S)
    assert c.rounds == 2 * (w - 1)
    assert c.time_s(B) == pytest.approx(2 * (w - 1) / w * T)
    # the bandwidth term tends to 2·T, independent of W
    assert c.time_s(B) < 2 * T


@pytest.mark.parametrize("n,rounds", [(1, 0), (2, 1), (3, 3), (4, 2), (5, 4), (6, 4), (7, 4), (8, 3), (9, 5), (10, 5),
                                      (16, 4), (17, 6)])
def test_recursive_doubling_rounds(n, rounds):
    # Stanza §4: log2 n for a power of 2, else ⌊log2 n⌋ + 2.
    assert co.recursive_doubling_rounds(n) == rounds
    c = co.RecursiveDoubling().cost(S, n)
    assert c.rounds == rounds
    assert c.critical_bytes == pytest.approx(rounds * S)  # each round moves the full S
    assert c.time_s(B) == pytest.approx(rounds * T)


def test_recursive_doubling_bytes():
    # 6 nodes: 4 do two exchanges, 2 surplus nodes fold in and get the result back.
    c = co.RecursiveDoubling().cost(S, 6)
    assert c.total_bytes == pytest.approx((2 * 2 + 4 * 2) * S)
    assert c.send_bytes_per_node == pytest.approx(3 * S)  # a partner: 2 exchanges + the result back
    c8 = co.RecursiveDoubling().cost(S, 8)
    assert c8.total_bytes == pytest.approx(8 * 3 * S)
    assert c8.send_bytes_per_node == c8.critical_bytes  # power of 2: every round a full-duplex exchange


def test_point_to_point_gather_scatter():
    p = co.PointToPoint().cost(S)
    assert (p.rounds, p.total_bytes, p.time_s(B, latency_s=1e-3)) == (1, S, pytest.approx(T + 1e-3))
    g = co.Gather().cost(S, 5)
    assert g.recv_bytes_per_node == 4 * S and g.send_bytes_per_node == S
    assert g.rounds == 1 and g.time_s(B) == pytest.approx(4 * T)
    sc = co.OneToMany().cost(S, 5)
    assert sc.send_bytes_per_node == 4 * S and sc.recv_bytes_per_node == S and sc.total_bytes == 4 * S
    assert co.ManyToOne is co.Gather


@pytest.mark.parametrize("n_w,n_s", [(4, 1), (8, 2), (16, 4), (10, 3), (32, 32)])
def test_sharded_ps_stanza_eq6(n_w, n_s):
    # Stanza eq.6 (communication part): 2·n_w·P/(n_s·B) when n_w ≥ n_s.
    c = co.ShardedPS(servers=n_s).cost(S, n_w)
    assert c.time_s(B) == pytest.approx(2 * n_w * S / (n_s * B))
    assert c.worker_send_bytes == S and c.worker_recv_bytes == S
    assert c.server_recv_bytes == pytest.approx(n_w * S / n_s)
    assert c.total_bytes == pytest.approx(2 * n_w * S)


def test_sharded_ps_more_servers_than_workers():
    # With n_s > n_w the workers' NICs bind: 2·P/B, not eq.6's smaller figure.
    c = co.ShardedPS(servers=8).cost(S, 2)
    assert c.time_s(B) == pytest.approx(2 * T)


def test_stanza_table1_ps_bytes():
    # Stanza Table 1: AlexNet 61.1M fp32 params: grads + params = 488.8 MB per worker; four workers
    # through one server's NIC at 10 Gbit/s: 4 × 488.8 MB / 1.25 GB/s = 1.56 s.
    p = 61.1e6 * 4
    c = co.ShardedPS(servers=1).cost(p, 4)
    assert c.worker_send_bytes + c.worker_recv_bytes == pytest.approx(488.8e6)
    assert c.time_s(B) == pytest.approx(1.56416)
    assert round(c.time_s(B), 2) == 1.56
    v = co.ShardedPS(servers=1).cost(138e6 * 4, 4)
    assert v.worker_send_bytes + v.worker_recv_bytes == pytest.approx(1104e6)
    assert round(v.time_s(B), 2) == 3.53


@pytest.mark.parametrize("name", list(co.SCHEMES))
def test_one_node_costs_nothing(name):
    c = co.collective_cost(name, S, 1)
    assert c == co.ZERO
    assert c.time_s(B, latency_s=1.0) == 0.0


@pytest.mark.parametrize("name", list(co.ALLREDUCE))
def test_allreduce_invariants(name):
    for n in (2, 3, 5, 8, 13):
        c = co.ALLREDUCE[name].cost(S, n)
        # the critical path can never be shorter than what the busiest NIC direction carries
        assert c.critical_bytes >= max(c.send_bytes_per_node, c.recv_bytes_per_node) - 1e-6
        # every participant must at least receive the others' contribution once: ≥ (n−1)/n·S
        assert c.critical_bytes >= (n - 1) / n * S - 1e-6
        # and in all, the network carries at least (n−1)·S
        assert c.total_bytes >= (n - 1) * S - 1e-6
        # latency term
        assert c.time_s(B, latency_s=1e-3) == pytest.approx(c.time_s(B) + c.rounds * 1e-3)


def test_registry_and_errors():
    assert set(co.ALLREDUCE) == {"ring", "tree", "butterfly", "recursive_doubling", "one_to_all"}
    assert co.allreduce_time_s("ring", S, 4, B) == pytest.approx(1.5 * T)
    with pytest.raises(ConfigError, match="unknown collective scheme"):
        co.collective_cost("nope", S, 4)
    with pytest.raises(ConfigError, match="unknown all-reduce"):
        co.allreduce_time_s("gather", S, 4, B)
    with pytest.raises(ConfigError, match="at least 1 participant"):
        co.RingAllReduce().cost(S, 0)
    with pytest.raises(ConfigError, match="non-negative"):
        co.RingAllReduce().cost(-1, 4)
    with pytest.raises(ConfigError, match="at least 1 server"):
        co.ShardedPS(servers=0)
