import pytest

from layerplan import units
from layerplan.errors import UnitError


@pytest.mark.parametrize("text,expected", [
    ("10Gbit", 1.25e9), ("10Gbps", 1.25e9), ("10 Gbit/s", 1.25e9), ("100Mbit", 12.5e6), ("2.6Gbit", 2.6e9 / 8),
    ("336GB/s", 336e9), ("1.25GB/s", 1.25e9), ("1GiB/s", 2**30), (1e9, 1e9),
])
def test_bandwidth(text, expected):
    assert units.parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("12GiB", 12 * 2**30), ("12GB", 12e9), ("488.8 MB", 488.8e6), ("512", 512), ("4KiB", 4096), (0, 0),
])
def test_bytes(text, expected):
    assert units.parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("6.1TFLOPS", 6.1e12), ("268.8 GFLOP/s", 268.8e9), ("1.5e12", 1.5e12), (3e9, 3e9),
])
def test_flops(text, expected):
    assert units.parse_flops(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("50us", 50e-6), ("2ms", 2e-3), ("1.5s", 1.5), ("10min", 600), ("0", 0)])
def test_seconds(text, expected):
    assert units.parse_seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("fn,text", [
    (units.parse_bandwidth, "10Gbat"), (units.parse_bandwidth, "fast"), (units.parse_bandwidth, "-1Gbit"),
    (units.parse_bandwidth, "0Gbit"), (units.parse_bytes, "12Gib"), (units.parse_bytes, "12XB"),
    (units.parse_flops, "6.1TB"), (units.parse_seconds, "5 parsecs"), (units.parse_bytes, True), (units.parse_bytes, None),
])
def test_bad_units_raise_unit_error(fn, text):
    with pytest.raises(UnitError):
        fn(text)


def test_format_round_trip():
    assert units.format_bandwidth(1.25e9) == "10 Gbit/s"
    assert units.format_bytes(2**30, binary=True) == "1 GiB"
    assert units.format_bytes(488.8e6) == "488.8 MB"
    assert units.format_flops(1.43e9) == "1.43 GFLOP"
    assert units.format_seconds(0.0015) == "1.5 ms"
    assert units.parse_bandwidth(units.format_bandwidth(3.3e8).replace(" ", "")) == pytest.approx(3.3e8)
