"""The torch module each ONNX node came from, and the layers a layer-granular plan cuts between.

torch's exporters record where a node came from in two ways:

- the dynamo exporter (``torch.onnx.export(..., dynamo=True)``) writes the module stack into
  the node's ``metadata_props``: ``pkg.torch.onnx.name_scopes`` (the repr of a list of the
  module paths from the root, then the node's own name, e.g. ``['', 'transformer',
  'transformer.h.0', 'transformer.h.0.attn', 'view_3']``, as torch 2.13 writes it) and
  ``namespace`` (``transformer: GPT2Model/transformer.h.0: GPT2Block/...``);
- the legacy exporter (TorchScript) names the node by its scope:
  ``/transformer/h.0/attn/c_attn/MatMul`` is a MatMul in module ``transformer.h.0.attn.c_attn``.

:func:`onnx_node_modules` reads the module path of every top-level node (``""``: the root
module; None: no information). :func:`module_layout` turns the paths of the cost-graph nodes
(in program order) into *units*: the repeated blocks (``transformer.h.0`` ... ``transformer.h.11``,
the children of the module list with the most numbered children) and the modules around them
(``transformer.wte``, ``transformer.ln_f``, ``lm_head``). A node of a parent module that is in
none of them (glue such as the sum of two embeddings) joins the unit before it in program
order, as ``SplitPoint.BEGINNING`` would place it; graph inputs join the first unit.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.frontends.onnx.common import node_names
from solver.frontends.onnx.load import load_proto

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
NAMESPACE_KEY = "namespace"
# share of the cost nodes that must carry a module path for a layer-granular plan
MIN_KNOWN_SHARE = 0.5


@dataclass(frozen=True)
class ModuleLayout:
    """The units of a model in program order and the unit of every cost-graph node.

    ``blocks`` are the repeated blocks (a subsequence of ``units``), ``container`` the module
    list holding them (``""`` when the model has none: every unit is then a top-level module).
    """

    units: tuple[str, ...]
    node_unit: tuple[int, ...]  # index into units, per cost-graph node
    blocks: tuple[str, ...]
    container: str

    def unit_of(self, node: int) -> str:
        return self.units[self.node_unit[node]]

    @property
    def before_blocks(self) -> tuple[str, ...]:
        """The units before the first repeated block (the embedding side)."""
        if not self.blocks:
            return ()
        return self.units[: self.units.index(self.blocks[0])]

    @property
    def after_blocks(self) -> tuple[str, ...]:
        """The units after the last repeated block (the head side)."""
        if not self.blocks:
            return ()
        return self.units[self.units.index(self.blocks[-1]) + 1 :]


def _scoped_path(names: list[str]) -> str:
    """Module path from a list of name scopes: full paths (each extends the one before) or
    local names (joined with dots)."""
    names = [n for n in names if n]
    if not names:
        return ""
    full = all(b.startswith(a + ".") for a, b in zip(names, names[1:], strict=False))
    return names[-1] if full else ".".join(names)


def dynamo_module(node) -> str | None:
    """The module path the dynamo exporter recorded for ``node``, or None."""
    props = {p.key: p.value for p in node.metadata_props}
    scopes = props.get(NAME_SCOPES_KEY)
    if scopes is not None:
        try:
            parsed = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            parsed = None
        if isinstance(parsed, list) and parsed and all(isinstance(s, str) for s in parsed):
            return _scoped_path(parsed[:-1])  # the last scope names the node itself
    space = props.get(NAMESPACE_KEY)
    if space is None:
        return None
    # "transformer: GPT2Model/transformer.h.0: GPT2Block/.../node_name: target"; the last
    # element names the node itself
    parts = [p.split(":", 1)[0].strip() for p in space.split("/")[:-1]]
    return _scoped_path(parts)


def legacy_module(name: str) -> str | None:
    """The module path in a legacy exporter node name (``/model/layers.3/self_attn/MatMul``
    -> ``model.layers.3.self_attn``; ``/Add`` -> the root ``""``), or None for other names."""
    if not name.startswith("/"):
        return None
    parts = name[1:].split("/")[:-1]
    return ".".join(p for p in parts if p)


def onnx_node_modules(model) -> dict[str, str | None]:
    """Module path of every top-level node of ``model``, keyed by the node names the cost
    graph uses (:func:`solver.frontends.onnx.common.node_names`)."""
    out: dict[str, str | None] = {}
    for name, node in zip(node_names(model), model.graph.node, strict=True):
        path = dynamo_module(node)
        out[name] = legacy_module(node.name) if path is None else path
    return out


def cost_node_modules(model, g: Graph) -> list[str | None]:
    """The module path of each node of the cost graph ``g`` read from ``model`` (graph inputs
    and nodes without information: None)."""
    per_node = onnx_node_modules(model)
    return [per_node.get(name) for name in g.names]


def read_layout(model_path: str | Path, g: Graph) -> ModuleLayout:
    """The units of the cost graph ``g`` read from ``model_path`` (the ONNX file it was read
    from; weights are not loaded); refuses a model without module names in one line."""
    paths = cost_node_modules(load_proto(model_path), g)
    return module_layout(paths, str(model_path))


def _container(paths: Sequence[str]) -> str:
    """The module list whose numbered children are the repeated blocks: the one with the most
    distinct indices (at least 2), the outermost on ties; ``""`` when there is none."""
    indices: dict[str, set[str]] = {}
    for path in set(paths):
        parts = path.split(".")
        for end in range(1, len(parts)):
            if parts[end].isdigit():
                indices.setdefault(".".join(parts[:end]), set()).add(parts[end])
    ranked = sorted(indices.items(), key=lambda kv: (-len(kv[1]), kv[0].count("."), kv[0]))
    return ranked[0][0] if ranked and len(ranked[0][1]) >= 2 else ""


def _unit(path: str, container: str) -> str | None:
    """The unit of a node in module ``path``: its block, or the outermost module holding it
    that does not hold the container; None for glue (a module that holds the container)."""
    parts = path.split(".") if path else []
    if container:
        cparts = container.split(".")
        if parts[: len(cparts)] == cparts and len(parts) > len(cparts):
            return ".".join(parts[: len(cparts) + 1])
        for end in range(1, len(parts) + 1):
            if parts[:end] != cparts[:end]:
                return ".".join(parts[:end])
        return None
    return parts[0] if parts else None


def module_layout(paths: Sequence[str | None], where: str) -> ModuleLayout:
    """Units of the cost-graph nodes whose module paths are ``paths`` (None: unknown), in
    program order; refuses, naming ``where``, a graph without module information."""
    known = [p for p in paths if p is not None]
    if not known or len(known) < MIN_KNOWN_SHARE * len(paths):
        raise MtppError(
            f"{where}: --granularity layer needs module names in the ONNX nodes (the dynamo "
            f"exporter's name scopes or the legacy exporter's /module/path/Op names), and "
            f"{len(known)} of {len(paths)} nodes have one; export the model from torch"
        )
    container = _container(known)
    raw = [None if p is None else _unit(p, container) for p in paths]
    units: list[str] = []
    index: dict[str, int] = {}
    node_unit: list[int] = []
    for u in raw:
        if u is not None and u not in index:
            index[u] = len(units)
            units.append(u)
        node_unit.append(index[u] if u is not None else (node_unit[-1] if node_unit else -1))
    if len(units) < 2:
        raise MtppError(
            f"{where}: --granularity layer found one module ({units[0] if units else 'none'}) "
            "and nothing to cut between; solve without --granularity layer"
        )
    node_unit = [0 if u < 0 else u for u in node_unit]  # glue before any module: first unit
    prefix = f"{container}." if container else ""
    blocks = tuple(u for u in units if container and _is_block(u, prefix))
    return ModuleLayout(tuple(units), tuple(node_unit), blocks, container)


def _is_block(unit: str, prefix: str) -> bool:
    return unit.startswith(prefix) and unit[len(prefix) :].isdigit()


__all__ = [
    "ModuleLayout",
    "cost_node_modules",
    "dynamo_module",
    "legacy_module",
    "module_layout",
    "onnx_node_modules",
    "read_layout",
]
