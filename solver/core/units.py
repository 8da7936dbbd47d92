"""Readable units for YAML and the CLI: "900MiB", "64GB/s", "250TFLOPS", "1.5ms".

Written by hand because the well-known unit libraries (pint, humanfriendly) either pull in a
large dependency for four suffix tables or do not know FLOP/s; the grammar here is tiny.
"""

from __future__ import annotations

import math
import re

from solver.core.errors import MtppError

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}

_NUM = r"(?P<num>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*"
_RE = re.compile(_NUM + r"(?P<unit>.*?)\s*$")

KIND_UNITS = {
    "bytes": "B (e.g. 900MiB, 16GB)",
    "bandwidth": "B/s (e.g. 64GB/s)",
    "flops": "FLOPS (e.g. 250TFLOPS)",
    "time": "s (e.g. 1.5ms)",
}


def _split(text: str) -> tuple[float, str]:
    m = _RE.match(text.strip())
    if not m:
        raise ValueError
    return float(m.group("num")), m.group("unit")


def _scale(unit: str, base: str) -> float | None:
    """Multiplier for ``<prefix><base>`` (decimal or binary prefix); None if it does not match."""
    if not unit.endswith(base):
        return None
    prefix = unit[: len(unit) - len(base)]
    if prefix in _BIN:
        return _BIN[prefix]
    if prefix in _PREFIX:
        return _PREFIX[prefix]
    return None


MAX_QUANTITY_CHARS = 100  # longer strings are not quantities (and would slow the regex)


def parse_quantity(value: object, kind: str, what: str = "value") -> float:
    """Parse a number or a string with a unit into base units (bytes, bytes/s, FLOP/s, s).

    ``kind`` is one of "bytes", "bandwidth", "flops", "time". Plain numbers are taken as base
    units; "inf" (or a YAML ``.inf``) means unlimited. Booleans, NaN, negative values and
    numbers that overflow a float ("1e999GB") are refused.

    >>> parse_quantity("900MiB", "bytes")
    943718400.0
    >>> parse_quantity("64GB/s", "bandwidth")
    64000000000.0
    """
    units = KIND_UNITS[kind]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        shown = repr(value) if len(repr(value)) <= 40 else f"a {type(value).__name__}"
        raise MtppError(f"{what}: expected a quantity in {units}, got {shown}")
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_QUANTITY_CHARS:
            raise MtppError(f"{what}: a quantity of {len(text)} characters; write e.g. {units}")
        if text.lower() in ("inf", "infinity", "unlimited"):
            return math.inf
        try:
            num, unit = _split(text)
        except ValueError:
            raise MtppError(
                f"{what}: cannot read {value!r}; write a number with a unit in {units}"
            ) from None
        scale = _unit_scale(unit, kind)
        if scale is None:
            raise MtppError(f"{what}: unknown unit {unit!r} in {value!r}; use {units}")
        out = num * scale
        if math.isinf(out):
            raise MtppError(f"{what}: {value!r} is too large; write 'inf' for unlimited")
    else:
        try:
            out = float(value)
        except OverflowError:
            raise MtppError(f"{what}: the number is too large; write 'inf' for unlimited") from None
    if math.isnan(out) or out < 0:
        raise MtppError(f"{what}: must be a non-negative quantity, got {value!r}")
    return out


def parse_memory(value: object, what: str = "--memory") -> float:
    """A device memory limit in bytes: a finite size > 0 (``--memory`` of every command).

    >>> parse_memory("40GB")
    40000000000.0
    """
    size = parse_quantity(value, "bytes", what)
    if not 0 < size < math.inf:
        raise MtppError(f"{what} must be a finite size > 0, e.g. {what} 40GB, got {value!r}")
    return size


def _unit_scale(unit: str, kind: str) -> float | None:
    if unit == "":
        return 1.0
    if kind == "bytes":
        return _scale(unit, "B")
    if kind == "bandwidth":
        for base, mult in (("B/s", 1.0), ("Bps", 1.0), ("bit/s", 0.125), ("bps", 0.125)):
            s = _scale(unit, base)
            if s is not None:
                return s * mult
        return None
    if kind == "flops":
        for base in ("FLOPS", "FLOP/s", "flops", "flop/s", "OPS", "OP/s"):  # OPS: integer rates
            s = _scale(unit, base)
            if s is not None:
                return s
        return None
    if kind == "time":
        return _TIME.get(unit)
    raise ValueError(kind)


def format_bytes(x: float) -> str:
    """Human-readable bytes with binary prefixes ("1.5 GiB")."""
    if not math.isfinite(x):
        return "inf"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def format_rate(x: float, unit: str) -> str:
    """Human-readable rate with decimal prefixes ("64 GB/s", "250 TFLOPS")."""
    if not math.isfinite(x):
        return "inf"
    for p, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {p}{unit}"
    return f"{x:.4g} {unit}"


def format_time(x: float) -> str:
    """Human-readable seconds ("1.23 ms")."""
    if not math.isfinite(x):
        return "inf"
    ax = abs(x)
    if ax >= 1 or ax == 0:
        return f"{x:.6g} s"
    if ax >= 1e-3:
        return f"{x * 1e3:.4g} ms"
    if ax >= 1e-6:
        return f"{x * 1e6:.4g} us"
    return f"{x * 1e9:.4g} ns"
