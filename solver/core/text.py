"""Text from users (node, model and file names) made safe to print, and device lists as ranges."""

from __future__ import annotations

import re

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def esc(name: object) -> str:
    r"""A user-provided name made safe to print through rich: markup escaped, control
    characters shown as ``?`` (a node called ``[red]`` or holding an escape code prints as is).

    >>> print(esc("[red]x\x1b"))
    \[red]x?
    """
    from rich.markup import escape  # heavy: rich (only the printing commands need it)

    return escape(CONTROL_CHARS.sub("?", str(name)))


def device_ranges(devices: list[int]) -> str:
    """Device numbers as ranges, for tables and reports.

    >>> device_ranges([0, 1, 2, 3, 6])
    '0-3,6'
    """
    runs: list[list[int]] = []
    for d in devices:
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
