"""A strategy: one split list per data input of an operator, ``((2, 1), (1, 4))``; how it is
written (the seed's notation, :func:`fmt_strategy`), read back (:func:`parse_strategy`) and
carried on an ONNX node (the ``mtpp_strategy`` annotation, :data:`ATTRIBUTE`).

A leaf module: the model loader, the rules, the program and the configuration files all use it.
"""

from __future__ import annotations

import ast

from solver.core.errors import MtppError

ATTRIBUTE = "mtpp_strategy"
Strategy = tuple[tuple[int, ...], ...]


def parse_strategy(value: object, where: str) -> Strategy:
    """``[[2, 1], [1, 4]]`` (list, tuple, or their text) -> ``((2, 1), (1, 4))``.

    The seed's notation is accepted: ``((2, 4))`` (Python reads a flat tuple) is one input's
    splits, ``((4))`` one rank-1 input.
    """
    if isinstance(value, (bytes, str)):
        text = value.decode() if isinstance(value, bytes) else value
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            raise MtppError(f"{where}: {text!r} is not a strategy like [[2, 1], [1, 4]]") from None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [[value]]  # the seed's ((4)) of one rank-1 input
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(n, int) and not isinstance(n, bool) for n in value)
    ):
        value = [value]  # the seed's ((2, 4)) of one input reads as a flat tuple
    if not isinstance(value, (list, tuple)):
        raise MtppError(f"{where}: a strategy is a list of lists like [[2, 1], [1, 4]]")
    out = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            item = (item,)
        if not isinstance(item, (list, tuple)) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in item
        ):
            raise MtppError(f"{where}: each input's split must be a list of integers, got {item!r}")
        if any(n < 1 for n in item):
            raise MtppError(f"{where}: splits must be >= 1, got {list(item)}")
        out.append(tuple(int(n) for n in item))
    return tuple(out)


def fmt_strategy(s: Strategy) -> str:
    """The seed's notation: ``((2, 4), (4))``. One rank-0 input is ``((),)``: ``(())`` would
    read back as no input at all."""
    if len(s) == 1 and not s[0]:
        return "((),)"
    return "(" + ", ".join("(" + ", ".join(map(str, x)) + ")" for x in s) + ")"


def attributes_to_metadata(model) -> None:
    """Move string attributes ``mtpp_strategy`` into the node's ``metadata_props``."""
    from onnx import helper  # heavy: onnx (the callers have a loaded ModelProto)

    for node in model.graph.node:
        for a in list(node.attribute):
            if a.name == ATTRIBUTE:
                val = helper.get_attribute_value(a)
                e = node.metadata_props.add()
                e.key, e.value = ATTRIBUTE, val.decode() if isinstance(val, bytes) else str(val)
                node.attribute.remove(a)
