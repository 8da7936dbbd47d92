"""Small facts about ONNX protobufs that every step of the ONNX front end needs.

Node names, element sizes, the control-flow operators and what their bodies read, and a walk
over every stored tensor of a model (graph, subgraphs and model functions). No step imports
another step through this module, so the front end has no import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

CONTROL_FLOW = {"If", "Loop", "Scan"}

_DTYPE_BYTES: dict[int, float] = {}

# Inputs that carry shapes, axes, indices or scalars of an op, never weights or sharded data:
# the cost graph prices them as no data, and the sharding planner gives them no split.
SHAPE_INPUTS = {
    "Reshape": {1},
    "Expand": {1},
    "Tile": {1},
    "ConstantOfShape": {0},
    "Slice": {1, 2, 3, 4},
    "Unsqueeze": {1},
    "Squeeze": {1},
    "Pad": {1, 2, 3},
    "Resize": {1, 2, 3},
    "Upsample": {1},
    "TopK": {1},
    "Range": {0, 1, 2},
    "OneHot": {1, 2},
    "Split": {1},
    "CumSum": {1},
    "Clip": {1, 2},
    "Trilu": {1},
    "Dropout": {1, 2},
    "ReduceSum": {1},
    "ReduceMean": {1},
    "ReduceMax": {1},
    "ReduceMin": {1},
    "ReduceProd": {1},
    "ReduceL1": {1},
    "ReduceL2": {1},
    "ReduceLogSum": {1},
    "ReduceLogSumExp": {1},
    "ReduceSumSquare": {1},
    "NonMaxSuppression": {2, 3, 4},
    "CenterCropPad": {1},
}


def dtype_bytes(elem_type: int) -> float:
    """Bytes per element of an ONNX tensor element type (4-bit types count 0.5)."""
    if not _DTYPE_BYTES:
        from onnx import TensorProto, helper  # heavy: onnx

        for name, code in TensorProto.DataType.items():
            if code == 0:
                continue
            try:
                _DTYPE_BYTES[code] = float(np.dtype(helper.tensor_dtype_to_np_dtype(code)).itemsize)
            except (KeyError, TypeError, ValueError):
                _DTYPE_BYTES[code] = 1.0
            if "4" in name and ("INT4" in name or "FLOAT4" in name):
                _DTYPE_BYTES[code] = 0.5
        _DTYPE_BYTES[TensorProto.STRING] = 8.0
    return _DTYPE_BYTES.get(int(elem_type), 4.0)


def dense_bytes(t) -> int:
    """Bytes of a TensorProto's data stored densely (elements x element size), from its dims
    alone: what its external file holds when no ``length`` is given."""
    return math.ceil(math.prod(int(d) for d in t.dims) * dtype_bytes(t.data_type))


def external_info(t) -> dict[str, str]:
    """The ``external_data`` entries of a TensorProto: location, offset, length, ..."""
    return {e.key: e.value for e in t.external_data}


def node_names(model) -> list[str]:
    """Unique names for every top-level node (ONNX allows empty and repeated names)."""
    seen: dict[str, int] = {}
    names = []
    for i, node in enumerate(model.graph.node):
        base = node.name or f"{node.op_type}_{i}"
        if base in seen:
            seen[base] += 1
            base = f"{base}#{seen[base]}"
        else:
            seen[base] = 0
        names.append(base)
    return names


def subgraphs(node) -> Iterator:
    """The body graphs held in a node's attributes (If branches, Loop and Scan bodies)."""
    from onnx import AttributeProto  # heavy: onnx

    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def subgraph_inputs(node) -> list[str]:
    """Outer-scope tensors read by the body graphs of a control-flow node."""

    def walk(graph, defined: set[str]) -> set[str]:
        local = set(defined) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
        local |= {s.values.name for s in graph.sparse_initializer}
        outer: set[str] = set()
        for n in graph.node:
            for x in n.input:
                if x and x not in local:
                    outer.add(x)
            for sub in subgraphs(n):
                outer |= walk(sub, local)
            local.update(o for o in n.output if o)
        return outer

    out: set[str] = set()
    for sub in subgraphs(node):
        out |= walk(sub, set())
    return sorted(out)


def node_tensors(node) -> Iterator:
    """TensorProtos stored in a node's attributes (a Constant's value, sparse values included),
    not descending into subgraphs."""
    from onnx import AttributeProto  # heavy: onnx

    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            yield a.t
        elif a.type == AttributeProto.TENSORS:
            yield from a.tensors
        elif a.type == AttributeProto.SPARSE_TENSOR:
            yield a.sparse_tensor.values
            yield a.sparse_tensor.indices
        elif a.type == AttributeProto.SPARSE_TENSORS:
            for s in a.sparse_tensors:
                yield s.values
                yield s.indices


def graph_tensors(graph) -> Iterator:
    """Every TensorProto of a graph: initializers, sparse initializers and tensors in node
    attributes, subgraphs included."""
    yield from graph.initializer
    for s in graph.sparse_initializer:
        yield s.values
        yield s.indices
    for node in graph.node:
        yield from node_tensors(node)
        for sub in subgraphs(node):
            yield from graph_tensors(sub)


def model_tensors(model) -> Iterator:
    """Every TensorProto of a model: the main graph and the bodies of its model functions."""
    yield from graph_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            yield from node_tensors(node)
            for sub in subgraphs(node):
                yield from graph_tensors(sub)


def external_locations(model) -> list[str]:
    """The distinct ``location`` of every tensor ``model`` keeps in external data, in order of
    first use (from the protos: the weights are not read)."""
    from onnx import TensorProto  # heavy: onnx

    locs: dict[str, None] = {}
    for t in model_tensors(model):
        if t.data_location == TensorProto.EXTERNAL:
            loc = external_info(t).get("location", "")
            if loc:
                locs[loc] = None
    return list(locs)
