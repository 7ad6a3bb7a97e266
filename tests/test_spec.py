import json

import pytest

from conftest import chain, layer, make_net
from layerplan.errors import SpecError
from layerplan.netspec.spec import LayerSpec, NetSpec, find_boundary


def test_boundary_after_last_pool_and_flatten(alexnetish):
    net = alexnetish
    assert net.boundary == "flat"  # after the last conv, moved over pool and flatten, not over dropout
    assert [lay.name for lay in net.fc_layers] == ["d6", "f6", "f7", "f8"]
    assert net.conv_params == 23_296 + 307_392 + 663_936 + 884_992 + 590_080
    assert net.fc_params == 37_752_832 + 16_781_312 + 4_097_000
    assert net.boundary_bytes == 9216 * 4


def test_no_boundary_without_fc():
    net = make_net(chain(("c1", "conv", 10, (4, 4, 4), 100), ("p", "pool", 0, (4, 1, 1), 0), ("f", "other", 0, (4,), 0)))
    assert net.boundary is None
    assert net.fc_layers == ()
    assert net.conv_params == net.total_params


def test_no_boundary_without_conv():
    net = make_net(chain(("f1", "fc", 10, (4,), 100), ("f2", "fc", 10, (4,), 100)))
    assert net.boundary is None


def test_boundary_respects_dag_cuts():
    # a residual block at the end of the conv phase: the cut must come after the merge
    layers = [
        layer("c1", "conv", (), 10, (4, 4, 4), 100),
        layer("c2", "conv", ("c1",), 10, (4, 4, 4), 100),
        layer("add", "merge", ("c1", "c2"), 0, (4, 4, 4), 0),
        layer("pool", "pool", ("add",), 0, (4,), 0),
        layer("fc", "fc", ("pool",), 20, (5,), 40),
    ]
    assert find_boundary(layers) == "pool"
    net = make_net(layers)
    assert not net.cut_is_single(1)  # c1 feeds the add past c2
    assert net.cut_is_single(2)


def test_json_round_trip_exact(alexnetish):
    again = NetSpec.from_json(alexnetish.to_json())
    assert again == alexnetish
    assert json.loads(again.to_json()) == json.loads(alexnetish.to_json())


def test_strict_loading_unknown_and_missing_keys(alexnetish):
    d = alexnetish.to_dict()
    d["extra"] = 1
    with pytest.raises(SpecError, match="unknown key"):
        NetSpec.from_dict(d)
    d = alexnetish.to_dict()
    del d["layers"][0]["fwd_flops"]
    with pytest.raises(SpecError, match="missing key"):
        NetSpec.from_dict(d)
    with pytest.raises(SpecError, match="not valid JSON"):
        NetSpec.from_json("{nope")


@pytest.mark.parametrize("bad", [
    dict(kind="laser"), dict(params=-1), dict(fwd_flops=1.5), dict(name=""), dict(out_shape=(-1,)),
])
def test_layer_validation(bad):
    kw = dict(name="x", kind="conv", op="Conv2d", parents=(), out_shape=(1,), params=0, param_bytes=0, out_bytes=4,
              fwd_flops=0, bwd_flops=0)
    kw.update(bad)
    with pytest.raises(SpecError):
        LayerSpec(**kw)


def test_net_validation_order_and_duplicates():
    a = layer("a", "conv", (), 1)
    b = layer("b", "fc", ("a",), 1)
    with pytest.raises(SpecError, match="topological"):
        NetSpec(name="n", input_shape=(1,), dtype_bytes=4, layers=(b, a), boundary=None)
    with pytest.raises(SpecError, match="twice"):
        NetSpec(name="n", input_shape=(1,), dtype_bytes=4, layers=(a, a), boundary=None)
    with pytest.raises(SpecError, match="boundary"):
        NetSpec(name="n", input_shape=(1,), dtype_bytes=4, layers=(a, b), boundary="zz")


def test_a_second_output_in_the_head_blocks_the_cut():
    # Inception's auxiliary classifier: a layer nobody reads is a network output the loss needs
    layers = [
        layer("c1", "conv", (), 10, (4, 4, 4), 100),
        layer("aux", "fc", ("c1",), 10, (3,), 10),
        layer("c2", "conv", ("c1",), 10, (4, 1, 1), 100),
        layer("flat", "other", ("c2",), 0, (4,), 0),
        layer("fc", "fc", ("flat",), 20, (5,), 40),
    ]
    assert find_boundary(layers) is None
    assert find_boundary([x for x in layers if x.name != "aux"]) == "flat"


def test_single_cuts_in_one_pass_agree_with_the_definition():
    import random

    from layerplan.netspec.spec import single_cut, single_cuts

    rng = random.Random(0)
    for trial in range(300):
        n = rng.randint(1, 14)
        layers = []
        for i in range(n):
            if i == 0 or rng.random() < 0.08:
                parents = ()  # reads the network input
            else:
                parents = tuple(sorted({f"l{rng.randrange(i)}" for _ in range(rng.choice((1, 1, 1, 2, 3)))}))
            layers.append(layer(f"l{i}", rng.choice(("conv", "fc", "act", "merge")), parents))
        layers = tuple(layers)
        assert single_cuts(layers) == tuple(single_cut(layers, i) for i in range(n)), (trial, layers)
        net = make_net(layers, boundary=None)
        assert all(net.cut_is_single(i) == single_cut(layers, i) for i in range(n))
