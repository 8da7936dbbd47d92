"""From an ONNX graph with known shapes to the cost graph the solvers use.

- *static* nodes (all inputs constant, Shape/Size of known shapes, Constant, ConstantOfShape of
  a constant shape) are folded away; a static tensor feeding a real node as data is a
  **parameter entity** of its consumers (one entity per stored tensor, however many users),
  while shape-like inputs (a Reshape's shape, Slice starts, ...) are not weights;
- *view* nodes (Identity, Dropout, Reshape, Squeeze, Unsqueeze, Flatten) alias their input:
  consumers read the producer's tensor directly, so views cost no io and add no variables;
- every other node is a cost node with FLOPs, a work time and **one tensor per output** (a
  Split whose halves go to different blocks sends each half once, not both); model inputs
  become zero-work source nodes (``input:NAME``) so that their io is counted;
- weights stored inside control-flow bodies (If branches, Loop and Scan bodies) are parameters
  of the control-flow node.
Every ONNX node is recorded under the cost node it was folded into (``hints['members']``),
which the exporter uses to place it.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import replace

import numpy as np

from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.frontends.onnx.common import (
    CONTROL_FLOW,
    SHAPE_INPUTS,
    dtype_bytes,
    node_names,
    node_tensors,
    subgraph_inputs,
    subgraphs,
)
from solver.frontends.onnx.flops import integer_flops, node_flops, numel
from solver.frontends.onnx.load import LIGHT_LIMIT

VIEW_OPS = {"Identity", "Dropout", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}


class ShapesUnknown(MtppError):
    """Tensors the cost graph needs have no known shape; ``tensors`` names them."""

    def __init__(self, tensors: list[str]):
        self.tensors = tensors
        super().__init__(
            f"could not infer the shapes of {len(tensors)} tensor(s), first: {tensors[0]}; "
            "fix more input dims with --dim, or simplify the model (e.g. onnxsim)"
        )


def _reads(node) -> list[str]:
    """Tensors a node reads, by input position ('' for an absent optional input), then what
    its control-flow bodies read from outside."""
    ins = list(node.input)
    if node.op_type in CONTROL_FLOW:
        ins += [x for x in subgraph_inputs(node) if x not in ins]
    return ins


def build_cost_graph(model, shapes, *, name: str, work: str, cluster) -> Graph:
    """Fold the ONNX graph into a :class:`Graph` (see the module docstring).

    Raises :class:`ShapesUnknown` when a tensor the cost graph needs has no known shape.
    """
    g = model.graph
    onnx_names = node_names(model)
    read = {o.name for o in g.output}
    for node in g.node:
        read.update(_reads(node))
    inits = [t.name for t in g.initializer] + [s.values.name for s in g.sparse_initializer]
    graph_inputs = [i.name for i in g.input if i.name not in set(inits)]
    static: set[str] = set(inits)
    # the stored constants each static tensor is computed from (a transposed tied weight is
    # the weight itself); Shape/Size outputs derive from shapes only and have no roots
    roots: dict[str, frozenset[str]] = {t: frozenset([t]) for t in inits}
    alias: dict[str, str] = {}  # view output -> tensor it aliases

    def real(t: str) -> str:
        while t in alias:
            t = alias[t]
        return t

    def known(t: str) -> bool:
        return shapes.get(t, (None, 0))[0] is not None

    def nbytes(t: str) -> float:
        shape, et = shapes.get(t, (None, 1))
        return 0.0 if shape is None else numel(shape) * dtype_bytes(et)

    # ---- 1. classify every ONNX node: static, view, or a cost node
    cost_names: list[str] = [f"input:{x}" for x in graph_inputs]
    op_types: list[str] = ["Input"] * len(graph_inputs)
    producer: dict[str, int] = {x: i for i, x in enumerate(graph_inputs)}
    members: dict[int, list[str]] = defaultdict(list)
    node_of_cost: list[int] = [-1] * len(graph_inputs)
    control: list[str] = []
    pending_static: list[int] = []  # static ONNX nodes, attached to a consumer later
    missing: list[str] = []

    for i, node in enumerate(g.node):
        ins = [x for x in _reads(node) if x]
        op = node.op_type
        is_static = op == "Constant" or (
            op not in CONTROL_FLOW and not op.startswith("Random") and all(x in static for x in ins)
        )
        if op in ("Shape", "Size") and ins and known(real(ins[0])):
            is_static = True
        if is_static:
            outs_i = [o for o in node.output if o]
            static.update(outs_i)
            if op in ("Constant", "ConstantOfShape"):  # stored data: the node is the weight
                src = frozenset(outs_i)
            elif op in ("Shape", "Size"):
                src = frozenset()
            else:
                src = frozenset().union(*(roots.get(x, frozenset()) for x in ins))
            for o in outs_i:
                roots[o] = src
            pending_static.append(i)
            continue
        data_ins = [x for j, x in enumerate(node.input) if x and j not in SHAPE_INPUTS.get(op, ())]
        data_ins = [x for x in data_ins if x not in static]
        used_outs = [o for o in node.output if o in read]
        if (
            op in VIEW_OPS
            and len(data_ins) == 1
            and len(used_outs) >= 1
            and (op != "Dropout" or len(used_outs) == 1)
        ):
            alias[used_outs[0]] = data_ins[0]
            src = real(data_ins[0])
            if src in producer:
                members[producer[src]].append(onnx_names[i])
            continue
        for o in used_outs:
            if not known(o):
                missing.append(f"{o} (output of {op} {onnx_names[i]!r})")
        idx = len(cost_names)
        cost_names.append(onnx_names[i])
        op_types.append(op)
        node_of_cost.append(i)
        members[idx].append(onnx_names[i])
        for o in used_outs:
            producer[o] = idx
        if op in CONTROL_FLOW:
            control.append(onnx_names[i])
    for x in graph_inputs:
        if x in read and not known(x):
            missing.append(f"{x} (model input)")
    for idx in range(len(graph_inputs), len(cost_names)):  # weights read as data
        node = g.node[node_of_cost[idx]]
        shape_only = SHAPE_INPUTS.get(node.op_type, ())
        for j, x in enumerate(_reads(node)):
            if x and x in static and j not in shape_only and not known(x):
                missing.append(f"{x} (a constant read by {cost_names[idx]!r})")
    if missing:
        raise ShapesUnknown(missing)

    # ---- 2. tensors (one per used output), edges, parameters, FLOPs
    n = len(cost_names)
    flops = np.zeros(n)
    int_flops = np.zeros(n)  # the part of flops done on integers (quantized matrix operators)
    made_by = {o: node.op_type for node in g.node for o in node.output}
    out_bytes = np.zeros(n)
    act = np.zeros(n)
    moved = np.zeros(n)
    edges: list[tuple[int, int]] = []
    tensor_of: dict[str, int] = {}
    t_prod: list[int] = []
    t_size: list[float] = []
    pairs: list[tuple[int, int]] = []  # (tensor, consumer)

    def new_tensor(t: str, idx: int) -> None:
        tensor_of[t] = len(t_prod)
        t_prod.append(idx)
        t_size.append(nbytes(t))

    param_users: dict[str, set[int]] = defaultdict(set)
    unknown_ops: dict[str, int] = defaultdict(int)
    for k, x in enumerate(graph_inputs):
        out_bytes[k] = act[k] = nbytes(x)
        new_tensor(x, k)
    for idx in range(len(graph_inputs), n):
        node = g.node[node_of_cost[idx]]
        op = node.op_type
        shape_only = SHAPE_INPUTS.get(op, ())
        seen_in: set[str] = set()
        for j, x in enumerate(_reads(node)):
            if not x:
                continue
            src = x if x in static else real(x)
            if src in static:
                if j not in shape_only:
                    for r in roots.get(src, ()):
                        param_users[r].add(idx)
                    moved[idx] += nbytes(src)
                continue
            if src not in producer:
                raise MtppError(f"node {cost_names[idx]!r} reads {x!r}, which nothing produces")
            edges.append((producer[src], idx))
            pairs.append((tensor_of[src], idx))
            moved[idx] += nbytes(src)
            if src not in seen_in:
                seen_in.add(src)
                act[idx] += nbytes(src)
        outs = [o for o in node.output if o in read]
        for o in outs:
            new_tensor(o, idx)
        out_bytes[idx] = sum(nbytes(o) for o in outs)
        moved[idx] += out_bytes[idx]
        act[idx] += out_bytes[idx]
        # a view's output has its own shape (a Reshape feeding a Gemm): never the alias source's
        in_shapes = [
            (shapes.get(x, (None, 0))[0] or shapes.get(real(x), (None, 0))[0]) if x else None
            for x in node.input
        ]
        out_shapes = [shapes.get(o, (None, 0))[0] for o in node.output]
        try:
            fl = node_flops(node, in_shapes, out_shapes)
        except (TypeError, IndexError, ValueError, ZeroDivisionError):
            fl = None
        if fl is None:
            unknown_ops[op] += 1
            fl = 0.0
        flops[idx] = fl
        if fl:
            dequantized = all(made_by.get(x) == "DequantizeLinear" for x in node.input[:2])
            int_flops[idx] = integer_flops(node, in_shapes, out_shapes, dequantized)

    # static ONNX nodes belong to the first cost node that reads what they computed
    first_reader: dict[str, int] = {}
    for x, users in param_users.items():
        first_reader[x] = min(users)
    for x, r in roots.items():  # a static node belongs where its roots are read
        for root in r:
            if root in first_reader and x not in first_reader:
                first_reader[x] = first_reader[root]
    for i in pending_static:
        outs = [o for o in g.node[i].output if o]
        owner = min((first_reader[o] for o in outs if o in first_reader), default=None)
        if owner is not None:
            members[owner].append(onnx_names[i])

    same = tied_copies(model, [x for x in param_users if is_weight(x, shapes)])
    merged: dict[str, set[int]] = defaultdict(set)
    for x, users in param_users.items():
        merged[same.get(x, x)] |= users
    params = [(x, nbytes(x), sorted(users)) for x, users in merged.items() if is_weight(x, shapes)]
    for idx in range(len(graph_inputs), n):
        node = g.node[node_of_cost[idx]]
        if node.op_type in CONTROL_FLOW:
            for pname, pbytes in body_weights(node, cost_names[idx]):
                params.append((pname, pbytes, [idx]))
    work_arr = work_times(work, flops, moved, cluster, int_flops)
    hints = {
        "format": "onnx",
        "onnx_nodes": len(g.node),
        "static_nodes": [onnx_names[i] for i in pending_static],
        "members": {cost_names[i]: m for i, m in members.items()},
        "graph_outputs": [real(o.name) for o in g.output],
        "work_model": work,
    }
    if int_flops.any():
        hints["integer_flops"] = float(int_flops.sum())
    if unknown_ops:
        listed = ", ".join(f"{op} x{c}" for op, c in sorted(unknown_ops.items()))
        warnings.warn(f"FLOPs unknown for {listed}; counted as 0", stacklevel=2)
        hints["unknown_ops"] = dict(unknown_ops)
    if control:
        warnings.warn(
            f"control flow ({', '.join(control[:3])}{'...' if len(control) > 3 else ''}): each "
            "If/Loop/Scan body is treated as one opaque node with 0 FLOPs",
            stacklevel=2,
        )
        hints["control_flow"] = control
    graph = Graph.build(
        cost_names,
        work_arr,
        out_bytes,
        np.asarray(edges, dtype=np.int64).reshape(-1, 2),
        params=params,
        act=act,
        name=name,
        flops=flops,
        op_types=op_types,
        hints=hints,
    )
    return with_tensors(graph, np.asarray(t_prod), np.asarray(t_size), pairs)


def with_tensors(g: Graph, producer: np.ndarray, size: np.ndarray, pairs) -> Graph:
    """``g`` with its one-tensor-per-node replaced by the given tensors: ``producer[t]`` and
    ``size[t]`` per tensor, ``pairs`` the (tensor, consumer node) reads. Sizes per node must add
    up to ``g.sizeout`` (checked)."""
    pr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    pr = np.unique(pr, axis=0) if len(pr) else pr  # sorted by tensor, then consumer
    nt = len(producer)
    ptr = np.zeros(nt + 1, dtype=np.int64)
    np.cumsum(np.bincount(pr[:, 0], minlength=nt), out=ptr[1:])
    out = replace(
        g,
        t_producer=np.asarray(producer, dtype=np.int64),
        t_size=np.asarray(size, dtype=np.float64),
        t_ptr=ptr,
        t_cons=pr[:, 1].copy(),
    )
    assert np.allclose(out.sizeout, g.t_size), "tensor sizes do not add up to node outputs"
    return out


def body_weights(node, owner: str) -> list[tuple[str, float]]:
    """Weights stored inside a control-flow node's bodies (initializers, sparse initializers
    and Constant values, nested bodies included), as (``owner/name``, bytes)."""
    out: list[tuple[str, float]] = []
    seen: set[str] = set()

    def add(label: str, dims, elem_type: int) -> None:
        if not is_weight_type(elem_type) or numel(dims) <= 1:
            return
        pname = f"{owner}/{label}"
        while pname in seen:
            pname += "'"
        seen.add(pname)
        out.append((pname, numel(dims) * dtype_bytes(elem_type)))

    def walk(graph) -> None:
        for t in graph.initializer:
            add(t.name, t.dims, t.data_type)
        for s in graph.sparse_initializer:
            add(s.values.name, s.dims, s.values.data_type)
        for n in graph.node:
            if n.op_type == "Constant":
                for t in node_tensors(n):
                    add(n.output[0] if n.output else t.name, t.dims, t.data_type)
                    break
            for sub in subgraphs(n):
                walk(sub)

    for sub in subgraphs(node):
        walk(sub)
    return out


def tied_copies(model, names: list[str]) -> dict[str, str]:
    """Map stored copies of a tied weight to the weight they copy, so it is counted once.

    Tied weights are embedding tables shared with an output projection; the legacy torch
    exporter folds the projection's ``Transpose(table)`` into a second initializer. So each
    2-D table read by a Gather is compared with the weights of its shape or transposed shape:
    a cheap key (the first values of a row and a column) finds candidates, and a full
    comparison decides. External weights are never read, and so never merged.
    """
    from onnx import TensorProto, helper, numpy_helper

    wanted = set(names)
    tables = {n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input}
    mats = {
        t.name: t
        for t in model.graph.initializer
        if t.name in wanted
        and len(t.dims) == 2
        and t.data_location != TensorProto.EXTERNAL
        and numel(t.dims) > LIGHT_LIMIT
    }
    arrays: dict[str, np.ndarray] = {}

    def arr(name: str) -> np.ndarray:
        if name not in arrays:
            t = mats[name]
            if t.raw_data:  # one copy of the stored bytes, then views
                dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
                arrays[name] = np.frombuffer(t.raw_data, dtype=dt).reshape(tuple(t.dims))
            else:
                arrays[name] = numpy_helper.to_array(t)
        return arrays[name]

    out: dict[str, str] = {}
    for table in sorted(tables & set(mats)):
        shape = tuple(mats[table].dims)
        for other, t in mats.items():
            dims = tuple(t.dims)
            if other == table or other in out or dims not in (shape, shape[::-1]):
                continue
            a, b = arr(table), arr(other)
            same = a if dims == shape else a.T
            if (
                np.array_equal(b[0, :16], same[0, :16])
                and np.array_equal(b[:16, 0], same[:16, 0])
                and np.array_equal(b, same)
            ):
                out[other] = table
    return out


def is_weight_type(elem_type: int) -> bool:
    """Floating point or 8/4-bit quantized element types: the types weights are stored in."""
    from onnx import TensorProto as T

    names = (
        "FLOAT",
        "FLOAT16",
        "BFLOAT16",
        "DOUBLE",
        "INT8",
        "UINT8",
        "INT4",
        "UINT4",
        "FLOAT8E4M3FN",
        "FLOAT8E5M2",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2FNUZ",
        "FLOAT4E2M1",
    )
    return int(elem_type) in {getattr(T, nm) for nm in names if hasattr(T, nm)}


def is_weight(name: str, shapes) -> bool:
    """A stored constant is a weight when it is floating point (or 8/4-bit quantized) and not a
    scalar: integer indices, boolean masks, shapes and scalar hyper-parameters are not."""
    shape, et = shapes.get(name, (None, 0))
    if shape is None or numel(shape) <= 1:
        return False
    return is_weight_type(et)


def work_times(
    model: str, flops: np.ndarray, moved: np.ndarray, cluster, integer: np.ndarray | None = None
) -> np.ndarray:
    """Per-node seconds: roofline max(compute time, bytes moved / memory bandwidth), or the
    compute-bound compute time (``flops``). The compute time is FLOPs / compute; when the
    cluster states an ``int8_compute``, the ``integer`` part of each node's FLOPs (quantized
    multiply-adds) takes integer FLOPs / int8_compute instead."""
    rate = getattr(cluster, "int8_compute", None)
    if integer is None or rate is None or not integer.any():
        compute = flops / cluster.compute
    else:
        compute = (flops - integer) / cluster.compute + integer / rate
    if model == "roofline":
        return np.maximum(compute, moved / cluster.memory_bandwidth)
    if model == "flops":
        return compute
    raise ValueError(model)
