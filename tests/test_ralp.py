import pytest

from conftest import chain, make_net
from layerplan.plan import ralp


def test_fc_heavy_net_is_eligible_and_splits_after_the_conv_block(alexnetish):
    p = ralp.profile(alexnetish, batch=32)
    assert p.skewness < -0.5
    assert p.eligible
    # the cheapest cut after the last conv: p5 and flat carry the same 9216 values; ties go to the earlier
    assert p.split_after == "p5"
    assert p.split_activation_bytes == 9216 * 4 * 32
    assert p.head_param_bytes == 4 * (23_296 + 307_392 + 663_936 + 884_992 + 590_080)


def test_skewness_sign_follows_where_the_mass_is():
    late = make_net(chain(("c1", "conv", 10, (4,), 1), ("c2", "conv", 10, (4,), 1), ("f", "fc", 1000, (2,), 1)))
    early = make_net(chain(("c1", "conv", 1000, (4,), 1), ("c2", "conv", 10, (4,), 1), ("f", "fc", 10, (2,), 1)))
    assert ralp.parameter_skewness(late) < 0 < ralp.parameter_skewness(early)


def test_argmin_between_convs_is_vetoed_and_moved():
    # a tiny activation between two convs makes the unrestricted argmin fall inside the conv block
    net = make_net(chain(
        ("c1", "conv", 100, (64, 32, 32), 1),
        ("p1", "pool", 0, (1, 1, 1), 0),
        ("c2", "conv", 100, (64, 8, 8), 1),
        ("p2", "pool", 0, (64, 2, 2), 0),
        ("f1", "fc", 100_000, (10,), 1),
        ("f2", "fc", 1000, (10,), 1),
    ))
    p = ralp.profile(net, batch=8)
    assert p.vetoed_split == "p1"
    assert p.split_after == "p2"
    assert not ralp.between_convs(net, net.index(p.split_after))


def test_conv_only_net_is_not_eligible():
    net = make_net(chain(("c1", "conv", 100, (4, 4, 4), 1), ("c2", "conv", 100, (4, 4, 4), 1)))
    p = ralp.profile(net)
    assert not p.eligible and p.split_after is None


@pytest.mark.parametrize("k,eligible", [(-0.5, True), (-50.0, False)])
def test_threshold(alexnetish, k, eligible):
    assert ralp.profile(alexnetish, threshold=k).eligible is eligible
