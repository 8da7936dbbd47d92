"""Text from users (node, model and file names) made safe to print."""

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
