import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import chain, make_net
from layerplan import hardware
from layerplan.plan import yan

COSTS = yan.YanCosts(c_muladd_s=1e-9, c_act_s=2e-9, c_err_s=2e-9, c_ncost_s=5e-5, c_bits=32, c_nbw_bits_per_s=10e9)

layer_st = st.builds(
    yan.YanLayer,
    name=st.just("l"),
    connections=st.floats(1e3, 1e9),
    neurons=st.floats(1, 1e6),
    weights=st.floats(0, 1e8),
    dense=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(layers=st.lists(layer_st, min_size=1, max_size=5), n=st.integers(1, 4),
       ncost=st.floats(0, 1e-3), bw=st.floats(1e8, 1e11))
def test_dp_equals_brute_force(layers, n, ncost, bw):
    c = yan.YanCosts(c_muladd_s=1e-9, c_act_s=2e-9, c_err_s=2e-9, c_ncost_s=ncost, c_bits=32, c_nbw_bits_per_s=bw)
    a = yan.dp(layers, n, c)
    b = yan.brute_force(layers, n, c)
    assert a.time_per_sample_s == pytest.approx(b.time_per_sample_s, rel=1e-9)
    assert yan.path_cost(layers, a.partitions, c) == pytest.approx(b.time_per_sample_s, rel=1e-9)


def test_greedy_per_layer_can_be_suboptimal():
    # Yan footnote 6: minimising each layer on its own ignores the cost of re-partitioning.
    big = yan.YanLayer(name="a", connections=1e8, neurons=1e5, weights=0, dense=False)
    small = yan.YanLayer(name="b", connections=1e4, neurons=1e5, weights=0, dense=True)
    layers = [big, small, big]
    greedy = [min(range(1, 5), key=lambda p: yan.compute_cost(layer, p, COSTS)) for layer in layers]
    best = yan.dp(layers, 4, COSTS)
    assert yan.path_cost(layers, greedy, COSTS) >= best.time_per_sample_s


def test_remote_fraction_greedy_mapping():
    assert yan.remote_fraction(True, 4, 1) == 0.0  # input on one worker: that worker gets the segment
    assert yan.remote_fraction(True, 2, 4) == pytest.approx(0.75)
    assert yan.remote_fraction(False, 4, 4) == 0.0  # aligned local segments
    assert yan.remote_fraction(False, 2, 3) > 0.0  # misaligned


def test_ps_read_between_eq10_and_eq11():
    layers = [yan.YanLayer(name=str(i), connections=1e6, neurons=1e3, weights=w, dense=True) for i, w in
              enumerate([1e6, 3e6, 5e5])]
    for n_ps, n_mr, n_wr in [(1, 1, 1), (4, 1, 4), (2, 4, 2), (8, 2, 3), (1, 5, 1)]:
        lo, hi = yan.ps_read_bounds_s(layers, n_ps, n_mr, n_wr, COSTS)
        t = yan.ps_read_time_s(layers, n_ps, n_mr, n_wr, COSTS)
        assert lo - 1e-12 <= t <= hi + 1e-12
    # eq.11 with a single replica is reached exactly; eq.10 with a single server too
    assert yan.ps_read_time_s(layers, 4, 1, 2, COSTS) == pytest.approx(yan.ps_read_bounds_s(layers, 4, 1, 2, COSTS)[0])
    assert yan.ps_read_time_s(layers, 1, 3, 2, COSTS) == pytest.approx(yan.ps_read_bounds_s(layers, 1, 3, 2, COSTS)[1])


def test_one_worker_replica_gains_nothing_from_a_second_ps():
    layers = [yan.YanLayer(name="x", connections=1e6, neurons=1e3, weights=1e7, dense=True)]
    assert yan.ps_read_time_s(layers, 1, 1, 1, COSTS) == yan.ps_read_time_s(layers, 2, 1, 1, COSTS)  # Yan eq.11


def _yan_like_nets():
    mnist = make_net(chain(("c1", "conv", 520, (20, 24, 24), 2 * 288_000), ("p1", "pool", 0, (20, 12, 12), 0),
                           ("c2", "conv", 25_050, (50, 8, 8), 2 * 1_600_000), ("p2", "pool", 0, (50, 4, 4), 0),
                           ("f1", "fc", 400_500, (500,), 2 * 400_000), ("f2", "fc", 5_010, (10,), 2 * 5_000)))
    i22k = make_net(chain(("c1", "conv", 35_000, (96, 55, 55), 2 * 105_000_000), ("p1", "pool", 0, (96, 27, 27), 0),
                          ("c2", "conv", 614_000, (256, 27, 27), 2 * 448_000_000), ("p2", "pool", 0, (256, 13, 13), 0),
                          ("c3", "conv", 885_000, (384, 13, 13), 2 * 150_000_000),
                          ("c4", "conv", 1_327_000, (384, 13, 13), 2 * 224_000_000),
                          ("c5", "conv", 885_000, (256, 13, 13), 2 * 150_000_000), ("p5", "pool", 0, (256, 6, 6), 0),
                          ("f6", "fc", 37_752_832, (4096,), 2 * 37_748_736), ("f7", "fc", 16_781_312, (4096,), 2 * 16_777_216),
                          ("f8", "fc", 90_134_000, (22_000,), 2 * 90_112_000)))
    return mnist, i22k


def test_optimizer_findings_on_20_machines():
    cluster = hardware.cluster("xeon-e5-2450", nodes=20)
    mnist, i22k = _yan_like_nets()
    ranked = {}
    for key, net in (("mnist", mnist), ("22k", i22k)):
        ranked[key] = yan.optimize(net, cluster)
        assert all(c.n_ps + c.n_mr * c.n_wr <= 20 for c in ranked[key])  # Yan C1
    # the best and the worst configurations on 20 machines differ by more than 10x (ImageNet-22K)
    assert ranked["22k"][-1].epoch_time_s / ranked["22k"][0].epoch_time_s > 10
    # the best configuration differs by workload: MNIST wants replicas, ImageNet-22K partitions
    m, i = ranked["mnist"][0], ranked["22k"][0]
    assert m.n_mr > 1 and max(m.partitions) == 1
    assert i.n_wr > 1 and max(i.partitions) > 1
