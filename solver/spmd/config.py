"""Configured strategies: a YAML ``node name: [[2, 1], [1, 4]]`` or an ONNX node annotation
``mtpp_strategy = "((2, 1), (1, 4))"``; validated against the model with one clear message.

The annotation is read from the node's ``metadata_props`` (what ``annotated.onnx`` carries: the
ONNX checker and onnxruntime refuse unknown attributes on standard operators) or from a string
attribute of that name, which the loader moves into ``metadata_props`` before checking.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path
from typing import TYPE_CHECKING

from solver.core.errors import MtppError
from solver.core.files import read_yaml

if TYPE_CHECKING:  # annotations only: the model module imports this one to read annotations
    from solver.spmd.model import ShardModel

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


def _node(sm: ShardModel, name: str, where: str):
    op = sm.op_by_name(name)
    if op is None:
        close = difflib.get_close_matches(name, [o.name for o in sm.ops], n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise MtppError(f"{where}: no node named {name!r} in the model{hint}")
    return op


def read_config(path: str | Path, sm: ShardModel) -> dict[str, Strategy]:
    """The YAML file's strategies, by node name (unknown names refused with suggestions)."""
    data = read_yaml(path, "strategy file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MtppError(f"{path}: write one 'node name: [[2, 1], [1, 4]]' per line")
    out = {}
    for name, value in data.items():
        _node(sm, str(name), str(path))
        out[str(name)] = parse_strategy(value, f"{path}: node {name!r}")
    return out


def from_attributes(sm: ShardModel) -> dict[str, Strategy]:
    """Strategies the model's nodes carry as an ``mtpp_strategy`` annotation."""
    out = {}
    for op in sm.ops:
        for e in op.node.metadata_props:
            if e.key == ATTRIBUTE:
                out[op.name] = parse_strategy(e.value, f"node {op.name!r} {ATTRIBUTE}")
    return out


def attributes_to_metadata(model) -> None:
    """Move string attributes ``mtpp_strategy`` into the node's ``metadata_props``."""
    from onnx import helper

    for node in model.graph.node:
        for a in list(node.attribute):
            if a.name == ATTRIBUTE:
                val = helper.get_attribute_value(a)
                e = node.metadata_props.add()
                e.key, e.value = ATTRIBUTE, val.decode() if isinstance(val, bytes) else str(val)
                node.attribute.remove(a)


def annotate(model, strategies: dict[str, Strategy], names: dict[str, int]) -> None:
    """Write each node's strategy into its ``metadata_props`` (``names``: node name -> index)."""
    from solver.spmd.program import fmt_strategy

    for name, s in strategies.items():
        node = model.graph.node[names[name]]
        for e in list(node.metadata_props):
            if e.key == ATTRIBUTE:
                node.metadata_props.remove(e)
        e = node.metadata_props.add()
        e.key, e.value = ATTRIBUTE, fmt_strategy(s)


def dump_yaml(strategies: dict[str, Strategy]) -> str:
    """One ``"name": [[2, 1], [1, 4]]`` line per node, in the given order."""
    import json

    lines = ["# mtpp shard strategies: node name -> one split list per data input"]
    for name, s in strategies.items():
        lines.append(f"{json.dumps(name)}: {json.dumps([list(x) for x in s])}")
    return "\n".join(lines) + "\n"
