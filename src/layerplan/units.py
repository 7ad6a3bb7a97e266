"""Human units at the edge, SI inside.

Everything inside layerplan is bytes, bytes/s, FLOP, FLOP/s and seconds. This module is the one
place that parses what a person writes ("10Gbit", "6.1TFLOPS", "12GiB", "50us") and formats
numbers back. Decimal prefixes are powers of 1000 and binary prefixes (Ki, Mi, Gi) powers of 1024;
they are never mixed silently. Link rates are bits per second unless written with a byte unit
("1.25GB/s").
"""

from __future__ import annotations

import math
import re

from layerplan.errors import UnitError

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}

_NUMBER = r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-z/µ]*)\s*$")


def _split(text: str | float | int, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"{what}: expected a number or a quantity with a unit, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text), ""
    if not isinstance(text, str):
        raise UnitError(f"{what}: expected a number or a string like '10Gbit', got {type(text).__name__}")
    m = _QUANTITY.match(text)
    if not m:
        raise UnitError(f"{what}: cannot read {text!r} as a quantity (examples: 10Gbit, 12GiB, 6.1TFLOPS)")
    return float(m.group(1)), m.group(2)


def _prefix(unit: str, base: str, text: str, what: str) -> float:
    """Scale factor of ``unit`` = prefix + ``base`` (e.g. "Gi" + "B")."""
    if not unit.endswith(base):
        raise UnitError(f"{what}: unknown unit in {text!r}")
    prefix = unit[: len(unit) - len(base)]
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    raise UnitError(f"{what}: unknown prefix {prefix!r} in {text!r} (use k, M, G, T or Ki, Mi, Gi, Ti)")


def _positive(value: float, text: object, what: str, allow_zero: bool = False) -> float:
    if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not allow_zero):
        raise UnitError(f"{what}: must be {'non-negative' if allow_zero else 'positive'}, got {text!r}")
    return value


def parse_bytes(text: str | float | int, what: str = "size") -> float:
    """'12GiB' -> 12·2^30, '4.2 GB' -> 4.2e9, '512' -> 512 (bytes)."""
    value, unit = _split(text, what)
    if unit == "":
        return _positive(value, text, what, allow_zero=True)
    if unit.endswith("bit") or unit.endswith("b") and not unit.endswith("B"):
        raise UnitError(f"{what}: {text!r} is in bits; write a size in bytes (B, KiB, MB, GiB ...)")
    return _positive(value * _prefix(unit, "B", str(text), what), text, what, allow_zero=True)


def parse_bandwidth(text: str | float | int, what: str = "bandwidth") -> float:
    """A link rate in bytes/s. '10Gbit', '10Gbps', '10Gbit/s' are bits per second; '1.25GB/s'
    and '336GB/s' are bytes per second; a bare number is bytes per second."""
    value, unit = _split(text, what)
    if unit == "":
        return _positive(value, text, what)
    u = unit
    for suffix in ("bit/s", "bps", "bit", "b/s"):
        if u.endswith(suffix) and not u.endswith("B/s"):
            scale = _prefix(u[: len(u) - len(suffix)] + "x", "x", str(text), what)
            return _positive(value * scale / 8.0, text, what)
    for suffix in ("B/s", "Bps"):
        if u.endswith(suffix):
            scale = _prefix(u[: len(u) - len(suffix)] + "x", "x", str(text), what)
            return _positive(value * scale, text, what)
    raise UnitError(f"{what}: unknown unit in {text!r} (examples: 10Gbit, 100Mbit/s, 336GB/s)")


def parse_flops(text: str | float | int, what: str = "compute speed") -> float:
    """A compute rate in FLOP/s: '6.1TFLOPS', '268.8 GFLOP/s', '1.5e12'."""
    value, unit = _split(text, what)
    if unit == "":
        return _positive(value, text, what)
    for suffix in ("FLOP/s", "FLOPS", "FLOPs", "flops", "flop/s"):
        if unit.endswith(suffix):
            scale = _prefix(unit[: len(unit) - len(suffix)] + "x", "x", str(text), what)
            return _positive(value * scale, text, what)
    raise UnitError(f"{what}: unknown unit in {text!r} (examples: 6.1TFLOPS, 268.8GFLOP/s)")


_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}


def parse_seconds(text: str | float | int, what: str = "time") -> float:
    """'50us' -> 5e-5, '2ms', '1.5s', '10min'; a bare number is seconds."""
    value, unit = _split(text, what)
    if unit == "":
        return _positive(value, text, what, allow_zero=True)
    if unit not in _TIME:
        raise UnitError(f"{what}: unknown time unit in {text!r} (use s, ms, us, ns, min, h)")
    return _positive(value * _TIME[unit], text, what, allow_zero=True)


def _scaled(value: float, steps: list[tuple[float, str]], digits: int) -> str:
    for scale, name in steps:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {name}"
    scale, name = steps[-1]
    return f"{value / scale:.{digits}g} {name}"


def format_bytes(n: float, binary: bool = False, digits: int = 4) -> str:
    """1.5e9 -> '1.5 GB'; with binary=True, 2**30 -> '1 GiB'."""
    if binary:
        steps = [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")]
    else:
        steps = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B")]
    return _scaled(n, steps, digits)


def format_bandwidth(bytes_per_s: float, digits: int = 4) -> str:
    """Bytes/s -> bits/s text: 1.25e9 -> '10 Gbit/s'."""
    return _scaled(bytes_per_s * 8.0, [(1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s"), (1.0, "bit/s")], digits)


def format_flops(flop: float, digits: int = 4) -> str:
    """A FLOP count: 1.43e9 -> '1.43 GFLOP'."""
    return _scaled(flop, [(1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP"), (1.0, "FLOP")], digits)


def format_flops_rate(flops_per_s: float, digits: int = 4) -> str:
    return format_flops(flops_per_s, digits) + "/s"


def format_seconds(s: float, digits: int = 4) -> str:
    if s >= 1.0 or s == 0:
        return f"{s:.{digits}g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.{digits}g} ms"
    return f"{s * 1e6:.{digits}g} µs"


def format_count(n: float) -> str:
    """12345678 -> '12.35M' (parameters, samples)."""
    return _scaled(n, [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")], 4).strip()
