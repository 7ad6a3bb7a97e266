"""netspec.load: MODEL strings → (NetSpec, factory), and one readable error per bad MODEL."""

from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")

from layerplan.errors import LayerplanError, ModelError, SpecError  # noqa: E402
from layerplan.netspec.load import build_module, resolve_model  # noqa: E402
from layerplan.netspec.spec import NetSpec  # noqa: E402

MODELS = '''
import torch
import torch.nn as nn


class Small(nn.Module):
    input_shape = (1, 12, 12)

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 10 * 10, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


def small(num_classes=10):
    return Small(num_classes)


def no_args():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def sized(input_size):
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * (input_size - 2) ** 2, 5))


def with_shape():
    return no_args()


with_shape.input_shape = (3, 8, 8)


def gray():
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 3))


gray.input_shape = (1, 8, 8)


def raises():
    raise ValueError("no weights for you\\nsecond line")


def not_a_module():
    return {"conv": 1}


class ReturnsDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        self.conv(x)
        return {"note": "no tensor here"}


def returns_dict():
    return ReturnsDict()


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        y = self.conv(x)
        if y.mean() > 0:
            return y
        return -y


def data_dependent():
    return DataDependent()


def cpu_only():
    m = no_args()
    if next(m.parameters()).device.type == "meta":
        raise RuntimeError("this factory insists on real tensors")
    return m


not_callable = 42
'''


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


def one_line_error(spec, exc=ModelError, **kw):
    with pytest.raises(LayerplanError) as e:
        resolve_model(spec, **kw)
    assert type(e.value) is exc, (type(e.value), e.value)
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# ---- the kinds of MODEL -------------------------------------------------------------------------
def test_zoo_name_and_factory():
    net, factory = resolve_model("debug")
    assert net.name == "debug" and net.boundary == "flatten" and net.input_shape == (3, 8, 8)
    assert "fast tests" in net.source
    module = factory()
    assert isinstance(module, torch.nn.Module)
    assert all(p.device.type == "cpu" for p in module.parameters())
    assert module(torch.randn(2, 3, 8, 8)).shape == (2, 10)
    assert factory() is not module  # a fresh module per call


def test_analyses_are_cached():
    a = resolve_model("lenet5", num_classes=7)
    assert resolve_model("lenet5", num_classes=7) is a
    assert resolve_model("lenet5")[0].num_classes == 10


def test_zoo_overrides():
    net, factory = resolve_model("debug", input_size=12, num_classes=3)
    assert net.input_shape == (3, 12, 12) and net.num_classes == 3
    assert factory()(torch.randn(2, 3, 12, 12)).shape == (2, 3)


def test_file_factory_with_input_shape_attribute_and_num_classes(models):
    net, factory = resolve_model(f"{models}:small", num_classes=4)
    assert net.input_shape == (1, 12, 12) and net.num_classes == 4
    assert net.source == f"{models}:small"
    assert net.total_params == 4 * 9 + 4 + 400 * 4 + 4
    assert factory()(torch.randn(2, 1, 12, 12)).shape == (2, 4)


def test_file_factory_input_size(models):
    net, _ = resolve_model(f"{models}:no_args", input_size=8)
    assert net.input_shape == (3, 8, 8)
    net, factory = resolve_model(f"{models}:sized", input_size=10)
    assert net.input_shape == (3, 10, 10) and net.layers[-1].params == 4 * 64 * 5 + 5
    assert factory()(torch.randn(2, 3, 10, 10)).shape == (2, 5)
    assert resolve_model(f"{models}:with_shape")[0].input_shape == (3, 8, 8)
    # the channels of an input_shape attribute are kept when --input-size changes the size
    assert resolve_model(f"{models}:gray", input_size=14)[0].input_shape == (1, 14, 14)


def test_factory_that_cannot_run_on_meta_is_built_on_the_cpu(models):
    net, _ = resolve_model(f"{models}:cpu_only", input_size=8)
    assert net.total_params == 4 * 27 + 4 + 144 * 5 + 5


def test_package_module_factory(models, monkeypatch):
    monkeypatch.syspath_prepend(str(models.parent))
    net, factory = resolve_model("models:small")
    assert net.input_shape == (1, 12, 12)
    assert isinstance(build_module("models:small"), torch.nn.Module)


def test_netspec_json(tmp_path):
    net, _ = resolve_model("debug")
    path = tmp_path / "debug.json"
    net.save(path)
    loaded, factory = resolve_model(str(path))
    assert loaded == net and factory is None
    assert resolve_model(str(path), input_size=8, num_classes=10)[0] == net
    assert "cannot change it" in one_line_error(str(path), input_size=16)
    assert "cannot change it" in one_line_error(str(path), num_classes=5)
    with pytest.raises(ModelError, match="has no code"):
        build_module(str(path))


# ---- errors -------------------------------------------------------------------------------------
def test_unknown_name_lists_close_matches():
    msg = one_line_error("alexnt")
    assert "unknown model 'alexnt'" in msg and "alexnet" in msg and "layerplan zoo" in msg


def test_missing_file(tmp_path):
    assert "not found" in one_line_error(f"{tmp_path}/nope.py:make")
    assert "name the factory" in one_line_error(f"{tmp_path}/nope.py")


def test_module_not_importable():
    assert "cannot import module 'no_such_package_xyz.models'" in one_line_error("no_such_package_xyz.models:make")


def test_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import torch\nraise ImportError('missing dependency')\n")
    assert "importing" in one_line_error(f"{bad}:make") and "ImportError: missing dependency" in one_line_error(
        f"{bad}:make")


def test_missing_attribute(models):
    msg = one_line_error(f"{models}:smal")
    assert "has no attribute 'smal'" in msg and "small" in msg


def test_attribute_not_callable(models):
    assert "not a callable" in one_line_error(f"{models}:not_callable")


def test_factory_raises(models):
    msg = one_line_error(f"{models}:raises", input_size=8)
    assert "the factory raised ValueError: no weights for you" in msg


def test_factory_returns_no_module(models):
    assert "returned dict, not a torch.nn.Module" in one_line_error(f"{models}:not_a_module", input_size=8)


def test_num_classes_for_a_factory_without_that_parameter(models):
    assert "num_classes parameter" in one_line_error(f"{models}:no_args", input_size=8, num_classes=3)


def test_input_shape_unknown(models):
    assert "pass --input-size" in one_line_error(f"{models}:no_args")


def test_wrong_input_shape(models):
    msg = one_line_error(f"{models}:no_args", input_size=12)
    assert msg.startswith(f"model {models}:no_args rejects input shape (3, 12, 12): RuntimeError")


def test_zoo_input_size_too_small():
    assert "needs --input-size of at least 32" in one_line_error("vgg16_cifar", input_size=8)


def test_model_fx_and_hooks_cannot_analyse(models):
    assert "not a tensor" in one_line_error(f"{models}:returns_dict", input_size=4)
    msg = one_line_error(f"{models}:data_dependent", input_size=4)
    assert "torch.fx cannot trace it" in msg and "meta device" in msg


def test_bad_override_values():
    assert "--input-size must be a positive integer" in one_line_error("debug", input_size=0)
    assert "--num-classes must be a positive integer" in one_line_error("debug", num_classes=-1)
    assert "MODEL must be" in one_line_error("  ")


def test_malformed_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    assert "not valid JSON" in one_line_error(str(path), exc=SpecError)
    assert "not found" in one_line_error(str(tmp_path / "missing.json"), exc=SpecError)


def test_json_with_unknown_key(tmp_path):
    net, _ = resolve_model("debug")
    data = json.loads(net.to_json())
    data["layers"][0]["colour"] = "blue"
    path = tmp_path / "extra.json"
    path.write_text(json.dumps(data))
    assert "unknown key(s) 'colour'" in one_line_error(str(path), exc=SpecError)
    data = json.loads(net.to_json())
    data["speed"] = 1
    path.write_text(json.dumps(data))
    assert "unknown key(s) 'speed'" in one_line_error(str(path), exc=SpecError)


def test_saved_spec_matches_a_fresh_analysis(tmp_path):
    net, _ = resolve_model("resnet_cifar")
    path = tmp_path / "r20.json"
    path.write_text(net.to_json())
    assert NetSpec.load(path) == net


def test_file_is_imported_once_and_the_factory_called_once_for_the_analysis(tmp_path):
    counter = tmp_path / "count.py"
    counter.write_text(textwrap.dedent('''
        import torch.nn as nn
        IMPORTS = []
        IMPORTS.append(1)
        CALLS = []
        def make():
            CALLS.append(len(IMPORTS))
            return nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
        make.input_shape = (3, 2, 2)
    '''))
    net, factory = resolve_model(f"{counter}:make")
    assert resolve_model(f"{counter}:make") == (net, factory)
    assert net.total_params == 26
    calls = factory.args[0].func.__globals__["CALLS"]
    assert calls == [1]
    assert factory()(torch.randn(2, 3, 2, 2)).shape == (2, 2)
    assert calls == [1, 1]


def test_zoo_analyses_are_cached_on_disk_and_rebuild_the_module(tmp_path, monkeypatch):
    from layerplan.netspec import load

    monkeypatch.setenv("LAYERPLAN_CACHE_DIR", str(tmp_path))
    load._resolve_cached.cache_clear()
    net, _ = load.resolve_model("debug", num_classes=7)
    assert len(list(tmp_path.glob("debug-*.json"))) == 1
    load._resolve_cached.cache_clear()

    def no_analysis(*a, **k):
        raise AssertionError("analysed again")

    monkeypatch.setattr(load, "_analyse", no_analysis)
    again, factory = load.resolve_model("debug", num_classes=7)
    assert again == net
    assert sum(p.numel() for p in factory().parameters()) == net.total_params
    load._resolve_cached.cache_clear()
    monkeypatch.setenv("LAYERPLAN_NO_CACHE", "1")
    with pytest.raises(AssertionError, match="analysed again"):
        load.resolve_model("debug", num_classes=7)
    load._resolve_cached.cache_clear()


def test_a_corrupt_cache_entry_is_analysed_again(tmp_path, monkeypatch):
    from layerplan.netspec import load

    monkeypatch.setenv("LAYERPLAN_CACHE_DIR", str(tmp_path))
    load._resolve_cached.cache_clear()
    net, _ = load.resolve_model("debug")
    (entry,) = tmp_path.glob("debug-*.json")
    entry.write_text("{not json")
    load._resolve_cached.cache_clear()
    assert load.resolve_model("debug")[0] == net
    load._resolve_cached.cache_clear()
