"""netspec.analyze: torch module → NetSpec (meta device, torch.fx, FlopCounterMode)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from layerplan.errors import ModelError, SpecError  # noqa: E402
from layerplan.netspec import zoo  # noqa: E402
from layerplan.netspec.analyze import BATCH, analyze  # noqa: E402
from layerplan.netspec.spec import NetSpec  # noqa: E402


def meta_zoo(name, **kw):
    with torch.device("meta"):
        return zoo.build(name, **kw)


@pytest.fixture(scope="module")
def alexnet():
    m, shape = meta_zoo("alexnet")
    return analyze(m, shape, name="alexnet")


@pytest.fixture(scope="module")
def resnet50():
    m, shape = meta_zoo("resnet50")
    return analyze(m, shape, name="resnet50")


def global_flops(module, shape):
    """Forward and backward FLOPs per sample of a plain training step (input needs no grad),
    from FlopCounterMode's attribution-free 'Global' total, on the real (not stand-in) layers."""
    module.train()
    x = torch.empty((BATCH, *shape), device="meta")
    with FlopCounterMode(display=False) as fc:
        out = module(x)
        fwd = fc.get_total_flops()
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.sum() for o in outs).backward()
        bwd = fc.get_total_flops() - fwd
    return fwd // BATCH, bwd // BATCH


# ---- golden numbers ---------------------------------------------------------------------------
def test_alexnet_params_golden(alexnet):
    assert alexnet.total_params == 61_100_840
    assert alexnet.conv_params == 2_469_696
    assert alexnet.fc_params == 58_631_144
    assert alexnet.param_bytes == 4 * 61_100_840
    assert alexnet.boundary == "flatten"
    assert alexnet.num_classes == 1000


def test_alexnet_flops_golden(alexnet):
    # 2 FLOPs per multiply-add: 714M MACs forward, of which the three FC layers 58.6M.
    assert alexnet.fwd_flops == pytest.approx(1.43e9, rel=0.02)
    fc_fwd = sum(layer.fwd_flops for layer in alexnet.fc_layers)
    assert fc_fwd == pytest.approx(0.117e9, rel=0.02)
    assert fc_fwd == 2 * (9216 * 4096 + 4096 * 4096 + 4096 * 1000)
    conv1 = alexnet.layer("features.0")
    assert conv1.fwd_flops == 2 * 64 * 3 * 11 * 11 * 55 * 55


def test_backward_is_twice_forward_where_inputs_need_grads(alexnet):
    weighted = [layer for layer in alexnet.layers if layer.kind in ("conv", "fc")]
    first, rest = weighted[0], weighted[1:]
    assert first.bwd_input_flops == 0  # nothing before the first conv needs a gradient
    assert first.bwd_weight_flops == first.fwd_flops
    assert first.bwd_flops == first.fwd_flops
    for layer in rest:
        assert layer.bwd_input_flops == layer.fwd_flops, layer.name
        assert layer.bwd_weight_flops == layer.fwd_flops, layer.name
        assert layer.bwd_flops == 2 * layer.fwd_flops, layer.name
    for layer in alexnet.layers:
        assert layer.bwd_flops == layer.bwd_input_flops + layer.bwd_weight_flops


@pytest.mark.parametrize("name", ["resnet_cifar", "resnet50", "googlenet", "inception_v3_aux"])
def test_per_layer_flops_add_up_to_a_real_training_step(name):
    """Per-layer attribution (private input clones, stand-ins for norm/activation layers) loses and
    double-counts nothing: the sums equal the counter's global totals for the real module."""
    m, shape = meta_zoo(name)
    net = analyze(m, shape, name=name)
    assert (net.fwd_flops, net.bwd_flops) == global_flops(m, shape)


def test_layer_sizes_and_shapes(alexnet):
    for layer in alexnet.layers:
        n = 1
        for d in layer.out_shape:
            n *= d
        assert layer.out_bytes == 4 * n
        assert layer.param_bytes == 4 * layer.params
    assert alexnet.layer("features.12").out_shape == (256, 6, 6)
    assert alexnet.layer("flatten").out_shape == (9216,)
    assert alexnet.boundary_bytes == 9216 * 4
    assert alexnet.layers[0].parents == ()
    kinds = {layer.name: layer.kind for layer in alexnet.layers}
    assert kinds["features.0"] == "conv" and kinds["features.1"] == "act" and kinds["features.2"] == "pool"
    assert kinds["classifier.0"] == "dropout" and kinds["classifier.1"] == "fc" and kinds["flatten"] == "other"


# ---- the DAG ----------------------------------------------------------------------------------
def test_resnet_residual_adds_have_two_parents(resnet50):
    adds = [layer for layer in resnet50.layers if layer.op == "add"]
    assert len(adds) == 16
    assert all(layer.kind == "merge" and len(layer.parents) == 2 for layer in adds)
    # the shared ReLU of a bottleneck is one layer per call
    assert {"layer1.0.relu", "layer1.0.relu_1", "layer1.0.relu_2"} <= {layer.name for layer in resnet50.layers}
    assert resnet50.boundary == "flatten"
    assert resnet50.fc_params == 2048 * 1000 + 1000
    assert resnet50.total_params == 25_557_032


@pytest.mark.parametrize("name, blocks", [("googlenet", 9), ("inception_v3", 11)])
def test_inception_concats_have_many_parents(name, blocks):
    m, shape = meta_zoo(name)
    net = analyze(m, shape, name=name)
    cats = [layer for layer in net.layers if layer.op == "cat"]
    assert cats and all(layer.kind == "merge" for layer in cats)
    # one concat of 3 or 4 branches per Inception block (Inception-v3's 7b/7c add inner 2-way ones)
    assert sum(len(layer.parents) >= 3 for layer in cats) == blocks
    assert max(len(layer.parents) for layer in cats) == 4


class Functional(nn.Module):
    """A module called twice, a functional linear on a parameter, size()/view() plumbing."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.act = nn.ReLU()
        self.w = nn.Parameter(torch.randn(5, 12))

    def forward(self, x):
        x = self.act(self.conv(x))
        x = self.act(self.conv(x))
        x = x.flatten(1)
        x = x.view(x.size(0), -1)
        return torch.nn.functional.linear(x, self.w)


def test_shared_modules_functional_ops_and_skipped_nodes():
    net = analyze(Functional(), (3, 2, 2), name="functional")
    names = [layer.name for layer in net.layers]
    assert names == ["conv", "act", "conv_1", "act_1", "flatten", "view", "linear"]
    conv, conv_1 = net.layer("conv"), net.layer("conv_1")
    assert conv.params == 12 and conv_1.params == 0  # one Conv2d, its parameters counted once
    assert conv.fwd_flops == conv_1.fwd_flops == 2 * 3 * 3 * 4
    assert conv.bwd_input_flops == 0 and conv_1.bwd_input_flops == conv_1.fwd_flops
    linear = net.layer("linear")
    assert (linear.kind, linear.params, linear.fwd_flops) == ("fc", 60, 2 * 12 * 5)
    assert net.layer("view").parents == ("flatten",)  # x.size(0) is no layer but keeps the chain
    assert net.total_params == 72 and net.num_classes == 5
    assert net.boundary == "view"


class ShapeBranch(nn.Module):
    """Python control flow on a shape: torch.fx cannot trace it, the meta run can."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.scale = nn.Parameter(torch.ones(8))
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        if x.shape[-1] > 4:
            x = self.relu(self.stem(x))
        x = self.body(x) * self.scale.view(1, -1, 1, 1)
        return self.fc(x.flatten(1))


def test_hooks_fallback_when_fx_cannot_trace():
    with pytest.raises(Exception):
        torch.fx.symbolic_trace(ShapeBranch())
    m = ShapeBranch()
    net = analyze(m, (3, 8, 8), name="branchy")
    assert [layer.name for layer in net.layers] == ["stem", "relu", "body.0", "body.1", "fc"]
    assert all(layer.parents == ((net.layers[i - 1].name,) if i else ()) for i, layer in enumerate(net.layers))
    assert net.total_params == sum(p.numel() for p in m.parameters())
    assert net.boundary == "body.1"
    with torch.device("meta"):
        mm = ShapeBranch()
    assert (net.fwd_flops, net.bwd_flops) == global_flops(mm, (3, 8, 8))


# ---- behaviour --------------------------------------------------------------------------------
def test_real_module_is_left_untouched():
    m = zoo.build("debug")[0].eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    net = analyze(m, (3, 8, 8), name="debug")
    assert not m.training and all(not sub.training for sub in m.modules())
    assert all(p.device.type == "cpu" for p in m.parameters())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert net.total_params == sum(p.numel() for p in m.parameters())


def test_frozen_parameters_are_not_trainable():
    m = zoo.build("debug")[0]
    for p in m.conv1.parameters():
        p.requires_grad_(False)
    net = analyze(m, (3, 8, 8), name="debug")
    assert net.layer("conv1").params == 0 and net.layer("conv1").bwd_flops == 0
    assert net.layer("conv2").bwd_input_flops == 0  # nothing before conv2 is trained any more


def test_json_round_trip_is_exact(resnet50, tmp_path):
    assert NetSpec.from_json(resnet50.to_json()) == resnet50
    path = tmp_path / "r50.json"
    resnet50.save(path)
    assert NetSpec.load(path) == resnet50


def test_num_classes_given_or_inferred():
    m, shape = meta_zoo("debug", num_classes=7)
    assert analyze(m, shape, name="d").num_classes == 7
    assert analyze(m, shape, name="d", num_classes=3).num_classes == 3


def test_float64_model():
    m = zoo.build("debug")[0].double()
    net = analyze(m, (3, 8, 8), name="d64")
    assert net.dtype_bytes == 8 and net.layer("conv1").param_bytes == 8 * net.layer("conv1").params


# ---- errors -----------------------------------------------------------------------------------
def test_rejected_input_shape_is_a_one_line_model_error():
    with pytest.raises(ModelError) as e:
        analyze(zoo.build("debug")[0], (3, 32, 32), name="debug")
    msg = str(e.value)
    assert msg.startswith("model debug rejects input shape (3, 32, 32): RuntimeError: ") and "\n" not in msg


@pytest.mark.parametrize("shape", [(), (3, 0, 8), (3, -1), "3x8x8", (3.0, 8, 8)])
def test_bad_input_shape_argument(shape):
    with pytest.raises(ModelError, match="input shape must be positive integers"):
        analyze(zoo.build("debug")[0], shape, name="debug")


def test_not_a_module():
    with pytest.raises(ModelError, match="expected a torch.nn.Module, got function"):
        analyze(lambda x: x, (3, 8, 8), name="f")


class ReturnsNone(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        self.conv(x)
        return None


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        y = self.conv(x)
        return y if y.sum() > 0 else -y


class NoBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x).sum()


class NoLayers(nn.Module):
    def forward(self, x):
        return x


def test_output_must_hold_a_tensor():
    with pytest.raises(ModelError, match="returns NoneType, not a tensor"):
        analyze(ReturnsNone(), (3, 4, 4), name="none")


def test_untraceable_and_unrunnable_model():
    with pytest.raises(ModelError) as e:
        analyze(DataDependent(), (3, 4, 4), name="dd")
    msg = str(e.value)
    assert "torch.fx cannot trace it" in msg and "meta device" in msg and "\n" not in msg


def test_batch_check():
    with pytest.raises(ModelError, match="batch as the first dimension"):
        analyze(NoBatch(), (8,), name="nobatch")
    net = analyze(NoBatch(), (8,), name="nobatch", batch_check=False)
    assert net.layer("fc").params == 18


def test_model_without_layers():
    with pytest.raises(ModelError, match="has no layers"):
        analyze(NoLayers(), (3, 4, 4), name="empty")


def test_buffer_bytes_are_the_models_non_parameter_state():
    m, shape = meta_zoo("resnet_cifar")
    net = analyze(m, shape, name="resnet_cifar")
    assert net.buffer_bytes == sum(b.numel() * b.element_size() for b in m.buffers()) > 0  # BatchNorm statistics
    assert NetSpec.from_json(net.to_json()).buffer_bytes == net.buffer_bytes
    floats = sum(b.numel() * b.element_size() for b in m.buffers() if b.dtype.is_floating_point)
    assert net.buffer_bytes_by_dtype == (floats, net.buffer_bytes - floats)  # one DDP broadcast each: float, int64
    assert NetSpec.from_json(net.to_json()).buffer_bytes_by_dtype == net.buffer_bytes_by_dtype
    old = net.to_dict()
    del old["buffer_bytes"], old["buffer_bytes_by_dtype"]  # a spec written before buffers were counted
    assert NetSpec.from_dict(old).buffer_bytes == 0
    bad = net.to_dict() | {"buffer_bytes_by_dtype": [1, 2]}
    with pytest.raises(SpecError, match="summing to buffer_bytes"):
        NetSpec.from_dict(bad)
    m, shape = meta_zoo("alexnet_cifar")
    assert analyze(m, shape, name="alexnet_cifar").buffer_bytes == 0
