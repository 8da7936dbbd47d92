"""Configured strategies: a YAML ``node name: [[2, 1], [1, 4]]`` or an ONNX node annotation
``mtpp_strategy = "((2, 1), (1, 4))"``; validated against the model with one clear message.

The annotation is read from the node's ``metadata_props`` (what ``annotated.onnx`` carries: the
ONNX checker and onnxruntime refuse unknown attributes on standard operators) or from a string
attribute of that name, which the loader moves into ``metadata_props`` before checking.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from solver.core.errors import MtppError
from solver.core.files import read_yaml
from solver.spmd.model import ShardModel
from solver.spmd.strategy import ATTRIBUTE, Strategy, fmt_strategy, parse_strategy

__all__ = ["annotate", "dump_yaml", "from_attributes", "read_config"]


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


def annotate(model, strategies: dict[str, Strategy], names: dict[str, int]) -> None:
    """Write each node's strategy into its ``metadata_props`` (``names``: node name -> index)."""
    for name, s in strategies.items():
        node = model.graph.node[names[name]]
        for e in list(node.metadata_props):
            if e.key == ATTRIBUTE:
                node.metadata_props.remove(e)
        e = node.metadata_props.add()
        e.key, e.value = ATTRIBUTE, fmt_strategy(s)


def dump_yaml(strategies: dict[str, Strategy]) -> str:
    """One ``"name": [[2, 1], [1, 4]]`` line per node, in the given order."""
    lines = ["# mtpp shard strategies: node name -> one split list per data input"]
    for name, s in strategies.items():
        lines.append(f"{json.dumps(name)}: {json.dumps([list(x) for x in s])}")
    return "\n".join(lines) + "\n"
