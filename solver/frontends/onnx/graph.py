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
from dataclasses import dataclass, field, replace

import numpy as np

from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.frontends.onnx.backward import FLOATING, OpCall, Operand, backward_costs
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


class _Tensors:
    """What the build knows of each tensor: its shape and element type (``shapes``) and the
    view aliases (a view's output -> the tensor it aliases)."""

    def __init__(self, shapes) -> None:
        self.shapes = shapes
        self.alias: dict[str, str] = {}

    def real(self, t: str) -> str:
        """The tensor ``t`` stands for once views are looked through."""
        while t in self.alias:
            t = self.alias[t]
        return t

    def shape(self, t: str):
        return self.shapes.get(t, (None, 0))[0]

    def known(self, t: str) -> bool:
        return self.shape(t) is not None

    def nbytes(self, t: str) -> float:
        shape, et = self.shapes.get(t, (None, 1))
        return 0.0 if shape is None else numel(shape) * dtype_bytes(et)


@dataclass
class _Nodes:
    """Stage 1: every ONNX node classified as static (folded away), a view (aliased) or a cost
    node; cost nodes are numbered, model inputs first (``input:NAME``)."""

    graph_inputs: list[str]
    static: set[str]  # tensors computed from stored constants (or from known shapes) only
    # the stored constants each static tensor is computed from (a transposed tied weight is
    # the weight itself); Shape/Size outputs derive from shapes only and have no roots
    roots: dict[str, frozenset[str]]
    cost_names: list[str]
    op_types: list[str]
    producer: dict[str, int]  # tensor -> the cost node that makes it
    node_of_cost: list[int]  # cost node -> its ONNX node (-1: a model input)
    members: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    control: list[str] = field(default_factory=list)
    pending_static: list[int] = field(default_factory=list)  # attached to a consumer later
    missing: list[str] = field(default_factory=list)  # tensors without a known shape

    @property
    def n(self) -> int:
        return len(self.cost_names)

    def cost_range(self) -> range:
        """The cost nodes made from ONNX nodes (model inputs excluded)."""
        return range(len(self.graph_inputs), self.n)


@dataclass
class _Costs:
    """Stage 2: per cost node FLOPs and bytes, the edges, and one tensor per used output."""

    flops: np.ndarray
    int_flops: np.ndarray  # the part of flops done on integers (quantized matrix operators)
    out_bytes: np.ndarray
    act: np.ndarray
    moved: np.ndarray
    edges: list[tuple[int, int]] = field(default_factory=list)
    tensor_of: dict[str, int] = field(default_factory=dict)
    t_prod: list[int] = field(default_factory=list)
    t_size: list[float] = field(default_factory=list)
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (tensor, consumer)
    param_users: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    unknown_ops: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @classmethod
    def empty(cls, n: int) -> _Costs:
        return cls(*(np.zeros(n) for _ in range(5)))

    def new_tensor(self, t: str, idx: int, size: float) -> None:
        self.tensor_of[t] = len(self.t_prod)
        self.t_prod.append(idx)
        self.t_size.append(size)


def build_cost_graph(
    model, shapes, *, name: str, work: str, cluster, training: bool = False
) -> Graph:
    """Fold the ONNX graph into a :class:`Graph` (see the module docstring). With
    ``training``, every node also gets its backward work and stash from the operator table of
    :mod:`solver.frontends.onnx.backward` (without it the graph is exactly as before).

    Raises :class:`ShapesUnknown` when a tensor the cost graph needs has no known shape.
    """
    g = model.graph
    onnx_names = node_names(model)
    read = {o.name for o in g.output}
    for node in g.node:
        read.update(_reads(node))
    tensors = _Tensors(shapes)
    nodes = _classify_nodes(g, onnx_names, read, tensors)
    _check_shapes(g, nodes, read, tensors)
    costs = _tensors_and_edges(g, nodes, read, tensors)
    _attach_static(g, nodes, costs.param_users, onnx_names)
    params = _parameters(model, nodes, costs, tensors)
    times = work_times(work, costs.flops, costs.moved, cluster, costs.int_flops)
    hints = _hints(g, nodes, costs, onnx_names, tensors, work)
    backward = backward_costs(_op_calls(g, nodes, read, tensors)) if training else None
    if backward is not None and backward.unknown_ops:
        hints["backward_unknown_ops"] = backward.unknown_ops
    graph = Graph.build(
        nodes.cost_names,
        times,
        costs.out_bytes,
        np.asarray(costs.edges, dtype=np.int64).reshape(-1, 2),
        params=params,
        act=costs.act,
        name=name,
        flops=costs.flops,
        op_types=nodes.op_types,
        hints=hints,
        work_backward=None if backward is None else backward.factor * times,
        stash=None if backward is None else backward.stash,
    )
    return with_tensors(graph, np.asarray(costs.t_prod), np.asarray(costs.t_size), costs.pairs)


def _classify_nodes(g, onnx_names: list[str], read: set[str], tensors: _Tensors) -> _Nodes:
    """Stage 1: classify every ONNX node (in order) as static, a view, or a cost node."""
    inits = [t.name for t in g.initializer] + [s.values.name for s in g.sparse_initializer]
    graph_inputs = [i.name for i in g.input if i.name not in set(inits)]
    nodes = _Nodes(
        graph_inputs,
        static=set(inits),
        roots={t: frozenset([t]) for t in inits},
        cost_names=[f"input:{x}" for x in graph_inputs],
        op_types=["Input"] * len(graph_inputs),
        producer={x: i for i, x in enumerate(graph_inputs)},
        node_of_cost=[-1] * len(graph_inputs),
    )
    for i, node in enumerate(g.node):
        ins = [x for x in _reads(node) if x]
        if _is_static(node, ins, nodes.static, tensors):
            _add_static(nodes, i, node, ins)
            continue
        op = node.op_type
        data_ins = [x for j, x in enumerate(node.input) if x and j not in SHAPE_INPUTS.get(op, ())]
        data_ins = [x for x in data_ins if x not in nodes.static]
        used_outs = [o for o in node.output if o in read]
        if (
            op in VIEW_OPS
            and len(data_ins) == 1
            and len(used_outs) >= 1
            and (op != "Dropout" or len(used_outs) == 1)
        ):
            tensors.alias[used_outs[0]] = data_ins[0]
            src = tensors.real(data_ins[0])
            if src in nodes.producer:
                nodes.members[nodes.producer[src]].append(onnx_names[i])
            continue
        _add_cost_node(nodes, i, node, onnx_names[i], used_outs, tensors)
    return nodes


def _is_static(node, ins: list[str], static: set[str], tensors: _Tensors) -> bool:
    """Whether ``node`` computes from stored constants (or known shapes) only."""
    op = node.op_type
    if op == "Constant":
        return True
    if op not in CONTROL_FLOW and not op.startswith("Random") and all(x in static for x in ins):
        return True
    return op in ("Shape", "Size") and bool(ins) and tensors.known(tensors.real(ins[0]))


def _add_static(nodes: _Nodes, i: int, node, ins: list[str]) -> None:
    """Record the static ONNX node ``i``: its outputs are static, rooted in what it reads."""
    op = node.op_type
    outs = [o for o in node.output if o]
    nodes.static.update(outs)
    if op in ("Constant", "ConstantOfShape"):  # stored data: the node is the weight
        src = frozenset(outs)
    elif op in ("Shape", "Size"):
        src = frozenset()
    else:
        src = frozenset().union(*(nodes.roots.get(x, frozenset()) for x in ins))
    for o in outs:
        nodes.roots[o] = src
    nodes.pending_static.append(i)


def _add_cost_node(
    nodes: _Nodes, i: int, node, onnx_name: str, used_outs: list[str], tensors: _Tensors
) -> None:
    """Number the ONNX node ``i`` as the next cost node, producer of its used outputs."""
    op = node.op_type
    for o in used_outs:
        if not tensors.known(o):
            nodes.missing.append(f"{o} (output of {op} {onnx_name!r})")
    idx = nodes.n
    nodes.cost_names.append(onnx_name)
    nodes.op_types.append(op)
    nodes.node_of_cost.append(i)
    nodes.members[idx].append(onnx_name)
    for o in used_outs:
        nodes.producer[o] = idx
    if op in CONTROL_FLOW:
        nodes.control.append(onnx_name)


def _check_shapes(g, nodes: _Nodes, read: set[str], tensors: _Tensors) -> None:
    """Raise :class:`ShapesUnknown` naming every tensor the cost graph needs without a shape:
    outputs of cost nodes, model inputs that are read, constants read as data."""
    missing = list(nodes.missing)
    for x in nodes.graph_inputs:
        if x in read and not tensors.known(x):
            missing.append(f"{x} (model input)")
    for idx in nodes.cost_range():  # weights read as data
        node = g.node[nodes.node_of_cost[idx]]
        shape_only = SHAPE_INPUTS.get(node.op_type, ())
        for j, x in enumerate(_reads(node)):
            if x and x in nodes.static and j not in shape_only and not tensors.known(x):
                missing.append(f"{x} (a constant read by {nodes.cost_names[idx]!r})")
    if missing:
        raise ShapesUnknown(missing)


def _tensors_and_edges(g, nodes: _Nodes, read: set[str], tensors: _Tensors) -> _Costs:
    """Stage 2: tensors (one per used output), edges, parameters read, bytes and FLOPs."""
    costs = _Costs.empty(nodes.n)
    made_by = {o: node.op_type for node in g.node for o in node.output}
    for k, x in enumerate(nodes.graph_inputs):
        costs.out_bytes[k] = costs.act[k] = tensors.nbytes(x)
        costs.new_tensor(x, k, tensors.nbytes(x))
    for idx in nodes.cost_range():
        node = g.node[nodes.node_of_cost[idx]]
        _read_inputs(costs, idx, node, nodes, tensors)
        outs = [o for o in node.output if o in read]
        for o in outs:
            costs.new_tensor(o, idx, tensors.nbytes(o))
        costs.out_bytes[idx] = sum(tensors.nbytes(o) for o in outs)
        costs.moved[idx] += costs.out_bytes[idx]
        costs.act[idx] += costs.out_bytes[idx]
        _count_flops(costs, idx, node, tensors, made_by)
    return costs


def _read_inputs(costs: _Costs, idx: int, node, nodes: _Nodes, tensors: _Tensors) -> None:
    """What cost node ``idx`` reads: the parameters behind static inputs (shape-like inputs
    are not weights), an edge and a tensor read per produced input, and their bytes."""
    shape_only = SHAPE_INPUTS.get(node.op_type, ())
    seen_in: set[str] = set()
    for j, x in enumerate(_reads(node)):
        if not x:
            continue
        src = x if x in nodes.static else tensors.real(x)
        if src in nodes.static:
            if j not in shape_only:
                for r in nodes.roots.get(src, ()):
                    costs.param_users[r].add(idx)
                costs.moved[idx] += tensors.nbytes(src)
            continue
        if src not in nodes.producer:
            raise MtppError(f"node {nodes.cost_names[idx]!r} reads {x!r}, which nothing produces")
        costs.edges.append((nodes.producer[src], idx))
        costs.pairs.append((costs.tensor_of[src], idx))
        costs.moved[idx] += tensors.nbytes(src)
        if src not in seen_in:
            seen_in.add(src)
            costs.act[idx] += tensors.nbytes(src)


def _count_flops(costs: _Costs, idx: int, node, tensors: _Tensors, made_by: dict) -> None:
    """FLOPs of cost node ``idx`` (0 and counted as unknown when its operator has no rule),
    and the integer part of them."""
    # a view's output has its own shape (a Reshape feeding a Gemm): never the alias source's
    in_shapes = [
        (tensors.shape(x) or tensors.shape(tensors.real(x))) if x else None for x in node.input
    ]
    out_shapes = [tensors.shape(o) for o in node.output]
    try:
        fl = node_flops(node, in_shapes, out_shapes)
    except (TypeError, IndexError, ValueError, ZeroDivisionError):
        fl = None
    if fl is None:
        costs.unknown_ops[node.op_type] += 1
        fl = 0.0
    costs.flops[idx] = fl
    if fl:
        dequantized = all(made_by.get(x) == "DequantizeLinear" for x in node.input[:2])
        costs.int_flops[idx] = integer_flops(node, in_shapes, out_shapes, dequantized)


def _op_calls(g, nodes: _Nodes, read: set[str], tensors: _Tensors) -> list[OpCall]:
    """Every cost node as the backward table sees it (model inputs first, then the ONNX
    nodes in order): its operands by position, shape-like inputs left out."""

    def operand(t: str, producer: int = -1, weight: bool = False) -> Operand:
        shape, et = tensors.shapes.get(t, (None, 0))
        floating = int(et) in FLOATING
        return Operand(t, tensors.nbytes(t), floating, producer, weight and floating)

    calls = [OpCall("Input", (), (operand(x, k),)) for k, x in enumerate(nodes.graph_inputs)]
    for idx in nodes.cost_range():
        node = g.node[nodes.node_of_cost[idx]]
        shape_only = SHAPE_INPUTS.get(node.op_type, ())
        ins = []
        for j, x in enumerate(node.input):
            src = x if x in nodes.static else tensors.real(x)
            if not x or j in shape_only:
                ins.append(Operand("", 0.0, False))
            elif src in nodes.static:
                roots = nodes.roots.get(src, ())
                ins.append(operand(src, weight=any(is_weight(r, tensors.shapes) for r in roots)))
            else:
                ins.append(operand(src, nodes.producer.get(src, -1)))
        outs = tuple(operand(o, idx) for o in node.output if o in read)
        calls.append(OpCall(node.op_type, tuple(ins), outs))
    return calls


def _attach_static(g, nodes: _Nodes, param_users: dict, onnx_names: list[str]) -> None:
    """Stage 3: each static ONNX node belongs to the first cost node that reads what it
    computed (or, through its roots, what it was computed from)."""
    first_reader: dict[str, int] = {}
    for x, users in param_users.items():
        first_reader[x] = min(users)
    for x, r in nodes.roots.items():  # a static node belongs where its roots are read
        for root in r:
            if root in first_reader and x not in first_reader:
                first_reader[x] = first_reader[root]
    for i in nodes.pending_static:
        outs = [o for o in g.node[i].output if o]
        owner = min((first_reader[o] for o in outs if o in first_reader), default=None)
        if owner is not None:
            nodes.members[owner].append(onnx_names[i])


def _parameters(model, nodes: _Nodes, costs: _Costs, tensors: _Tensors) -> list:
    """Stage 4: the parameter entities (name, bytes, users): every stored weight read as data
    (tied copies counted once), then the weights inside control-flow bodies."""
    shapes = tensors.shapes
    same = tied_copies(model, [x for x in costs.param_users if is_weight(x, shapes)])
    merged: dict[str, set[int]] = defaultdict(set)
    for x, users in costs.param_users.items():
        merged[same.get(x, x)] |= users
    params = [
        (x, tensors.nbytes(x), sorted(users)) for x, users in merged.items() if is_weight(x, shapes)
    ]
    for idx in nodes.cost_range():
        node = model.graph.node[nodes.node_of_cost[idx]]
        if node.op_type in CONTROL_FLOW:
            for pname, pbytes in body_weights(node, nodes.cost_names[idx]):
                params.append((pname, pbytes, [idx]))
    return params


def _hints(g, nodes: _Nodes, costs: _Costs, onnx_names, tensors: _Tensors, work: str) -> dict:
    """Stage 5: what the cost graph records of the model (and warns about: operators without
    a FLOPs rule, control flow)."""
    hints = {
        "format": "onnx",
        "onnx_nodes": len(g.node),
        "static_nodes": [onnx_names[i] for i in nodes.pending_static],
        "members": {nodes.cost_names[i]: m for i, m in nodes.members.items()},
        "graph_outputs": [tensors.real(o.name) for o in g.output],
        "work_model": work,
    }
    if costs.int_flops.any():
        hints["integer_flops"] = float(costs.int_flops.sum())
    if costs.unknown_ops:
        listed = ", ".join(f"{op} x{c}" for op, c in sorted(costs.unknown_ops.items()))
        # stacklevel 3: the warning names build_cost_graph's caller
        warnings.warn(f"FLOPs unknown for {listed}; counted as 0", stacklevel=3)
        hints["unknown_ops"] = dict(costs.unknown_ops)
    control = nodes.control
    if control:
        warnings.warn(
            f"control flow ({', '.join(control[:3])}{'...' if len(control) > 3 else ''}): each "
            "If/Loop/Scan body is treated as one opaque node with 0 FLOPs",
            stacklevel=3,
        )
        hints["control_flow"] = control
    return hints


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
    from onnx import TensorProto, helper, numpy_helper  # heavy: onnx

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
    from onnx import TensorProto as T  # heavy: onnx

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
