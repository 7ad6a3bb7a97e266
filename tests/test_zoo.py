"""netspec.zoo: every network builds, traces, analyses, and has the boundary it should."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from layerplan.errors import ModelError  # noqa: E402
from layerplan.netspec import zoo  # noqa: E402
from layerplan.netspec.analyze import analyze  # noqa: E402

# name: (total parameters, boundary layer). Torchvision numbers are the published ones; the others
# follow from the layer sizes in zoo.py (see each class docstring).
EXPECTED = {
    "debug": (2_642, "flatten"),
    "lenet5": (61_706, "flatten"),
    "yan_mnist": (633_830, "flatten"),
    "nin": (966_986, None),
    "resnet_cifar": (269_722, "flatten"),
    "alexnet_cifar": (28_711_754, "flatten"),
    "vgg16_cifar": (33_638_218, "flatten"),
    "alexnet": (61_100_840, "flatten"),
    "caffenet": (62_378_344, "flatten"),
    "overfeat": (145_920_872, "flatten"),
    "vgg11": (132_863_336, "flatten"),
    "vgg16": (138_357_544, "flatten"),
    "vgg19": (143_667_240, "flatten"),
    "googlenet": (6_624_904, "flatten"),
    "inception_v3": (23_834_568, "avgpool"),
    "inception_v3_aux": (27_161_264, None),  # two outputs (aux logits mid-network): no single cut
    "resnet50": (25_557_032, "flatten"),
    "resnet152": (60_192_808, "flatten"),
    "yan_imagenet22k": (153_936_624, "flatten"),
}


def meta_build(name, **kw):
    with torch.device("meta"):
        return zoo.build(name, **kw)


def analysed(name, **kw):
    m, shape = meta_build(name, **kw)
    return analyze(m, shape, name=name, source=zoo.ZOO[name].source)


def test_registry_is_complete_and_frozen():
    assert set(zoo.ZOO) == set(EXPECTED)
    e = zoo.ZOO["alexnet"]
    assert (e.default_input_size, e.default_num_classes, e.in_channels) == (224, 1000, 3)
    assert zoo.ZOO["inception_v3"].default_input_size == 299
    assert zoo.ZOO["lenet5"].input_shape() == (1, 32, 32)
    assert all(e.source and e.name == name for name, e in zoo.ZOO.items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.default_input_size = 1


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_net_traces_analyses_and_splits_where_expected(name):
    m, shape = meta_build(name)
    torch.fx.symbolic_trace(m)  # the runtime cuts modules with fx: every zoo net must trace
    net = analyze(m, shape, name=name)
    params, boundary = EXPECTED[name]
    assert net.total_params == params
    assert net.boundary == boundary
    assert net.num_classes == zoo.ZOO[name].default_num_classes
    assert net.input_shape == zoo.ZOO[name].input_shape()
    if boundary is not None:
        assert all(layer.kind != "fc" for layer in net.conv_layers)
        assert net.fc_layers[-1].kind == "fc" and net.cut_is_single(net.boundary_index)
    assert not any(layer.op in ("Softmax", "softmax", "LogSoftmax") for layer in net.layers)


def test_vgg16_cifar_golden_and_num_classes_override():
    net = analysed("vgg16_cifar")
    assert (net.conv_params, net.fc_params) == (14_714_688, 18_923_530)
    hundred = analysed("vgg16_cifar", num_classes=100)
    assert hundred.layers[-1].params == 4096 * 100 + 100
    assert net.layers[-1].params == 4096 * 10 + 10
    assert hundred.num_classes == 100


def test_alexnet_cifar_flops_and_input_override():
    net = analysed("alexnet_cifar")
    assert net.fwd_flops + net.bwd_flops == pytest.approx(1.21e9, rel=0.01)  # EMULATION.md, CPU speed table
    big = analysed("alexnet_cifar", input_size=64)
    assert big.input_shape == (3, 64, 64)
    assert big.layer("flatten").out_shape == (256 * 7 * 7,)


def test_yan_nets_connection_counts():
    # "connections" = multiply-adds per image = forward FLOPs / 2
    assert analysed("yan_mnist").fwd_flops // 2 == 2_495_500
    imagenet = analysed("yan_imagenet22k")
    assert imagenet.fwd_flops // 2 > 2_000_000_000
    assert imagenet.num_classes == 22_000
    assert imagenet.fc_params / imagenet.total_params > 0.9
    assert sum(layer.kind == "conv" for layer in imagenet.layers) == 5
    assert sum(layer.kind == "fc" for layer in imagenet.layers) == 2


def test_resnet20_and_nin_shapes():
    r20 = analysed("resnet_cifar")
    assert sum(layer.kind == "conv" for layer in r20.layers) == 19
    assert r20.fc_layers[-1].params == 64 * 10 + 10
    nin = analysed("nin")
    assert not any(layer.kind == "fc" for layer in nin.layers) and nin.fc_params == 0


def test_caffenet_groups_reproduce_caffe():
    assert sum(p.numel() for p in zoo.CaffeNet(groups=2).parameters()) == 60_965_224
    with pytest.raises(ModelError, match="groups must be 1 or 2"):
        zoo.CaffeNet(groups=3)


def test_build_gives_a_real_cpu_module_that_runs():
    for name in ("debug", "lenet5", "resnet_cifar"):
        m, shape = zoo.build(name)
        assert all(p.device.type == "cpu" for p in m.parameters())
        out = m(torch.randn(2, *shape))
        assert out.shape == (2, zoo.ZOO[name].default_num_classes)
    m, shape = zoo.build("debug", num_classes=3, input_size=12)
    assert shape == (3, 12, 12) and m(torch.randn(2, *shape)).shape == (2, 3)


@pytest.mark.parametrize("name, size, minimum", [("debug", 1, 2), ("vgg16_cifar", 16, 32), ("alexnet", 32, 63),
                                                 ("lenet5", 28, 32), ("inception_v3", 64, 75)])
def test_impossible_input_size(name, size, minimum):
    with pytest.raises(ModelError, match=f"needs --input-size of at least {minimum} \\(got {size}\\)"):
        meta_build(name, input_size=size)


def test_bad_overrides_and_unknown_names():
    with pytest.raises(ModelError, match="--num-classes must be a positive integer"):
        zoo.build("debug", num_classes=0)
    with pytest.raises(ModelError, match="--input-size must be a positive integer"):
        zoo.build("debug", input_size=-3)
    with pytest.raises(ModelError, match="did you mean .*vgg16"):
        zoo.build("vgg61")
