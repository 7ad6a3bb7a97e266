"""Shared fixtures: small hand-made NetSpecs for the pure tests (no torch needed)."""

from __future__ import annotations

import pytest

from layerplan.netspec.spec import LayerSpec, NetSpec, find_boundary


def layer(name, kind, parents=(), params=0, out=(1,), fwd=0, bwd=None, dtype=4):
    n = 1
    for d in out:
        n *= d
    return LayerSpec(name=name, kind=kind, op=kind, parents=tuple(parents), out_shape=tuple(out), params=params,
                     param_bytes=params * dtype, out_bytes=n * dtype, fwd_flops=fwd, bwd_flops=2 * fwd if bwd is None else bwd)


def chain(*specs):
    """Layers in a chain: each reads the previous one."""
    out, prev = [], None
    for name, kind, params, shape, fwd in specs:
        out.append(layer(name, kind, (prev,) if prev else (), params, shape, fwd))
        prev = name
    return out


def make_net(layers, name="t", input_shape=(3, 8, 8), boundary="auto"):
    layers = tuple(layers)
    b = find_boundary(layers) if boundary == "auto" else boundary
    return NetSpec(name=name, input_shape=input_shape, dtype_bytes=4, layers=layers, boundary=b, num_classes=None, source="test")


@pytest.fixture
def alexnetish():
    """The shape of AlexNet: 5 convs, pools, then 3 FC layers with most of the parameters."""
    return make_net(chain(
        ("c1", "conv", 23_296, (64, 55, 55), 70_000_000),
        ("r1", "act", 0, (64, 55, 55), 0),
        ("p1", "pool", 0, (64, 27, 27), 0),
        ("c2", "conv", 307_392, (192, 27, 27), 224_000_000),
        ("p2", "pool", 0, (192, 13, 13), 0),
        ("c3", "conv", 663_936, (384, 13, 13), 112_000_000),
        ("c4", "conv", 884_992, (256, 13, 13), 150_000_000),
        ("c5", "conv", 590_080, (256, 13, 13), 100_000_000),
        ("p5", "pool", 0, (256, 6, 6), 0),
        ("flat", "other", 0, (9216,), 0),
        ("d6", "dropout", 0, (9216,), 0),
        ("f6", "fc", 37_752_832, (4096,), 75_000_000),
        ("f7", "fc", 16_781_312, (4096,), 33_000_000),
        ("f8", "fc", 4_097_000, (1000,), 8_000_000),
    ))


@pytest.fixture(autouse=True, scope="session")
def _private_netspec_cache(tmp_path_factory):
    """The on-disk cache of zoo analyses goes to a per-session directory (never the user's)."""
    import os

    os.environ["LAYERPLAN_CACHE_DIR"] = str(tmp_path_factory.mktemp("netspec-cache"))
    yield
