"""ONNX front end: a real model in, a faithful cost graph out.

Steps (each a function below):

1. :func:`read_model` loads the protobuf *without* external weight bytes (sizes come from dims
   and types, so a 10 GB model is inspected in bounded memory), refuses external-data paths
   outside the model's folder, and runs the ONNX checker.
2. :func:`fix_dims` fixes dynamic input dimensions from ``--dim NAME=VALUE`` (batch-like dims
   default to 1) and lists the ones still unknown.
3. :func:`infer_shapes` runs onnx shape inference with data propagation, then onnxruntime's
   symbolic shape inference for what onnx leaves unresolved (transformer exports need it).
4. :func:`build_cost_graph` folds the model into cost-graph nodes:
   - *static* nodes (all inputs constant, Shape/Size of known shapes, Constant,
     ConstantOfShape of a constant shape) are evaluated away; a static tensor feeding a real
     node as data is a **parameter entity** of its consumers (one entity per tensor, however
     many users), while shape-like inputs (a Reshape's shape, Slice starts, ...) are not weights;
   - *view* nodes (Identity, Dropout, Reshape, Squeeze, Unsqueeze, Flatten) alias their input:
     consumers read the producer's tensor directly, so views cost no io and add no variables;
   - every other node is a cost-graph node with FLOPs, output bytes and a work time; model
     inputs become zero-work source nodes (``input:NAME``) so that their io is counted.
   Every ONNX node is recorded under the cost node it was folded into (``hints['members']``),
   which the exporter uses to place it.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from solver.errors import MtppError
from solver.graph import Graph
from solver.io.onnx_flops import node_flops, numel

VIEW_OPS = {"Identity", "Dropout", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
CONTROL_FLOW = {"If", "Loop", "Scan"}
# inputs that carry shapes, axes, indices or scalars of the op, never weights
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
BATCH_LIKE = re.compile(r"(^|_)(batch|bs|n|b)(_|$)|batch", re.IGNORECASE)

_DTYPE_BYTES: dict[int, float] = {}


def dtype_bytes(elem_type: int) -> float:
    """Bytes per element of an ONNX tensor element type (4-bit types count 0.5)."""
    if not _DTYPE_BYTES:
        from onnx import TensorProto, helper

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


# ---------------------------------------------------------------------- 1. reading
def read_model(path: str | Path):
    """Load an ONNX model without external weight bytes; refuse unsafe external paths."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, TypeError) as e:
        raise MtppError(
            f"{path}: not a valid ONNX model (truncated or not protobuf: {e})"
        ) from None
    except OSError as e:
        raise MtppError(f"{path}: cannot read ({e})") from None
    if not model.graph.node or model.ir_version <= 0:
        raise MtppError(f"{path}: not a valid ONNX model (no graph nodes or no IR version)")
    check_external_paths(model, path.parent)
    try:
        onnx.checker.check_model(light_copy(model))
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
        raise MtppError(f"{path}: the ONNX checker rejects the model: {first}") from None
    return model


LIGHT_LIMIT = 4096  # initializers with more elements are handed to checker/inference as inputs


def light_copy(model):
    """The model without its big weights: every initializer over ``LIGHT_LIMIT`` elements (or
    stored externally) becomes a typed graph input. The checker and shape inference serialise
    the whole model, so this turns seconds into milliseconds on a 400 MB export; small
    initializers (shape vectors) stay, so data propagation still works."""
    import onnx
    from onnx import TensorProto, helper

    light = onnx.ModelProto()
    for fld in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, fld, getattr(model, fld))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name = src.name
    dst.node.extend(src.node)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.value_info.extend(src.value_info)
    declared = {i.name for i in src.input}
    for t in src.initializer:
        if numel(t.dims) > LIGHT_LIMIT or t.data_location == TensorProto.EXTERNAL:
            if t.name not in declared:
                dst.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            dst.initializer.append(t)
    return light


def _all_tensors(model):
    """Every TensorProto of the model: initializers and Constant values, subgraphs included."""
    from onnx import AttributeProto

    def walk(graph):
        yield from graph.initializer
        for node in graph.node:
            for a in node.attribute:
                if a.type == AttributeProto.TENSOR:
                    yield a.t
                elif a.type == AttributeProto.GRAPH:
                    yield from walk(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        yield from walk(sub)

    yield from walk(model.graph)


def check_external_paths(model, base: Path) -> None:
    """Refuse external-data locations that are absolute or leave the model's folder.

    A model naming ``/etc/passwd`` or ``../../secret`` as its weight file would make a loader
    read (or an exporter overwrite) files outside the model; that is a known attack.
    """
    from onnx import TensorProto

    base = base.resolve()
    for t in _all_tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        target = (base / loc).resolve()
        if not loc or os.path.isabs(loc) or (base != target and base not in target.parents):
            raise MtppError(
                f"tensor {t.name!r} keeps its data at {loc!r}, outside the model's folder; "
                "refusing to follow it (external data must live beside the model)"
            )


# ---------------------------------------------------------------------- 2. dims
def _batch_like(axis: int, name: str) -> bool:
    """Dims that default to 1: named like a batch, or an unnamed/anonymous leading dim."""
    if name and BATCH_LIKE.search(name):
        return True
    return axis == 0 and (not name or name.startswith("unk"))


def fix_dims(model, dims: dict[str, int]) -> list[str]:
    """Fix dynamic input dims in place; return what was set (for reporting).

    A dim is fixed by its symbolic name (``--dim seq=128``) or by ``INPUT:AXIS``; unnamed or
    batch-like dims on axis 0 default to 1. Raises listing every dim that stays unknown.
    """
    inits = {t.name for t in model.graph.initializer}
    used: set[str] = set()
    unknown: list[str] = []
    set_: list[str] = []
    for inp in model.graph.input:
        if inp.name in inits or not inp.type.HasField("tensor_type"):
            continue
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            unknown.append(f"{inp.name} (no shape at all)")
            continue
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            name = d.dim_param if d.HasField("dim_param") else ""
            key = f"{inp.name}:{axis}"
            if name and name in dims:
                val = dims[name]
                used.add(name)
            elif key in dims:
                val = dims[key]
                used.add(key)
            elif _batch_like(axis, name):
                val = 1
            else:
                unknown.append(f"{inp.name} axis {axis}" + (f" ({name!r})" if name else ""))
                continue
            d.Clear()
            d.dim_value = int(val)
            set_.append(f"{name or key}={val}")
    extra = sorted(set(dims) - used)
    if extra:
        raise MtppError(
            f"--dim {extra[0]}: no dynamic input dimension has that name; give a symbolic dim "
            "name from the model or INPUT:AXIS"
        )
    if unknown:
        hint = ", ".join(unknown[:6]) + (" ..." if len(unknown) > 6 else "")
        raise MtppError(
            f"unknown input dimensions: {hint}; fix them with --dim NAME=VALUE (for a named dim) "
            "or --dim INPUT:AXIS=VALUE"
        )
    return set_


# ---------------------------------------------------------------------- 3. shapes
def _shape_map(model) -> dict[str, tuple[tuple[int, ...] | None, int]]:
    """Tensor name -> (shape or None when not fully known, element type)."""
    out: dict[str, tuple[tuple[int, ...] | None, int]] = {}

    def add(vi) -> None:
        if not vi.type.HasField("tensor_type"):
            return
        tt = vi.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            if all(d >= 0 for d in dims):
                shape = tuple(dims)
        old = out.get(vi.name)
        if old is None or (old[0] is None and shape is not None):
            out[vi.name] = (shape, tt.elem_type)

    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        add(vi)
    for t in g.initializer:
        out[t.name] = (tuple(int(d) for d in t.dims), t.data_type)
    return out


def infer_shapes(model) -> dict[str, tuple[tuple[int, ...] | None, int]]:
    """Shapes of every tensor: onnx inference with data propagation; where that leaves tensors
    unresolved, fold small constant subgraphs (shape arithmetic onnx cannot propagate, e.g.
    through Where) and infer again; onnxruntime's symbolic inference is the last resort."""
    light = light_copy(model)
    inferred, shapes = _onnx_infer(light)
    for _ in range(4):
        if not _missing(inferred, shapes):
            return shapes
        folded = _fold_constants(light, shapes)
        if folded is None:
            break
        light = folded
        inferred, more = _onnx_infer(light)
        for name, val in more.items():
            if shapes.get(name, (None, 0))[0] is None:
                shapes[name] = val
    if _missing(inferred, shapes):
        try:
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            # it may write scratch files into the working directory: give it a private one
            with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
                warnings.simplefilter("ignore")
                here = os.getcwd()
                os.chdir(tmp)
                try:
                    sym = SymbolicShapeInference.infer_shapes(inferred, auto_merge=True)
                finally:
                    os.chdir(here)
            if sym is not None:
                for name, val in _shape_map(sym).items():
                    if shapes.get(name, (None, 0))[0] is None:
                        shapes[name] = val
        except Exception:  # symbolic inference is best effort; what stays unknown is reported
            pass
    return shapes


def _onnx_infer(light):
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception as e:  # onnx raises several internal types here
        raise MtppError(f"onnx shape inference failed: {str(e).splitlines()[0]}") from None
    return inferred, _shape_map(inferred)


def _fold_constants(light, shapes):
    """Evaluate small nodes whose inputs are known values (Shape/Size of known shapes
    included) and replace them by initializers; None when nothing new folds."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = light.graph
    values = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    folded, new_inits = set(), []
    for i, node in enumerate(g.node):
        ins = [x for x in node.input if x]
        outs = [o for o in node.output if o]
        op = node.op_type
        if op in CONTROL_FLOW or op.startswith("Random") or not outs:
            continue
        feeds = {}
        if op in ("Shape", "Size"):
            shape = shapes.get(ins[0], (None, 0))[0] if ins else None
            if shape is None or numel(shape) > 1 << 24:
                continue
            feeds = {ins[0]: np.empty(shape, np.uint8)}
        elif all(x in values for x in ins):
            feeds = {x: values[x] for x in ins}
        else:
            continue
        try:
            res = ReferenceEvaluator(node).run(None, feeds)
        except Exception:  # an op the reference evaluator cannot run: leave it to inference
            continue
        if any(np.asarray(r).size > LIGHT_LIMIT for r in res):
            continue
        for o, r in zip(node.output, res, strict=False):
            if o:
                values[o] = np.asarray(r)
                new_inits.append(numpy_helper.from_array(np.asarray(r), o))
        folded.add(i)
    if not folded:
        return None
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(light)
    del out.graph.node[:]
    out.graph.node.extend(n for i, n in enumerate(g.node) if i not in folded)
    out.graph.initializer.extend(new_inits)
    return out


def _missing(model, shapes) -> list[str]:
    """Tensors someone reads (or the model outputs) whose shape is still unknown."""
    g = model.graph
    read = {x for node in g.node for x in node.input if x} | {o.name for o in g.output}
    out = []
    for node in g.node:
        for o in node.output:
            if o and o in read and shapes.get(o, (None, 0))[0] is None:
                out.append(o)
    return out


# ---------------------------------------------------------------------- 4. the cost graph
def _node_names(model) -> list[str]:
    """Unique names for every node (ONNX allows empty and repeated names)."""
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


def _subgraph_inputs(node) -> list[str]:
    """Outer-scope tensors read by the body graphs of a control-flow node."""
    from onnx import AttributeProto

    def walk(graph, defined: set[str]) -> set[str]:
        local = set(defined) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
        outer: set[str] = set()
        for n in graph.node:
            for x in n.input:
                if x and x not in local:
                    outer.add(x)
            for a in n.attribute:
                if a.type == AttributeProto.GRAPH:
                    outer |= walk(a.g, local)
                elif a.type == AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        outer |= walk(sub, local)
            local.update(o for o in n.output if o)
        return outer

    out: set[str] = set()
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            out |= walk(a.g, set())
        elif a.type == AttributeProto.GRAPHS:
            for sub in a.graphs:
                out |= walk(sub, set())
    return sorted(out)


def build_cost_graph(model, shapes, *, name: str, work: str, cluster) -> Graph:
    """Fold the ONNX graph into a :class:`Graph` (see the module docstring)."""
    g = model.graph
    onnx_names = _node_names(model)
    read = {x for node in g.node for x in node.input if x} | {o.name for o in g.output}
    for node in g.node:
        if node.op_type in CONTROL_FLOW:
            read.update(_subgraph_inputs(node))
    inits = {t.name for t in g.initializer}
    graph_inputs = [i.name for i in g.input if i.name not in inits]
    static: set[str] = set(inits)
    # the stored constants each static tensor is computed from (a transposed tied weight is
    # the weight itself); Shape/Size outputs derive from shapes only and have no roots
    roots: dict[str, frozenset[str]] = {t: frozenset([t]) for t in inits}
    alias: dict[str, str] = {}  # view output -> tensor it aliases

    def real(t: str) -> str:
        while t in alias:
            t = alias[t]
        return t

    def nbytes(t: str) -> float:
        shape, et = shapes.get(t, (None, 1))
        return 0.0 if shape is None else numel(shape) * dtype_bytes(et)

    # names of cost nodes and where each tensor comes from
    cost_names: list[str] = [f"input:{x}" for x in graph_inputs]
    op_types: list[str] = ["Input"] * len(graph_inputs)
    producer: dict[str, int] = {x: i for i, x in enumerate(graph_inputs)}
    members: dict[int, list[str]] = defaultdict(list)
    node_of_cost: list[int] = [-1] * len(graph_inputs)
    unknown_ops: dict[str, int] = defaultdict(int)
    control: list[str] = []
    pending_static: list[int] = []  # static ONNX nodes, attached to a consumer later
    missing: list[str] = []

    for i, node in enumerate(g.node):
        ins = [x for x in node.input if x]
        op = node.op_type
        if op in CONTROL_FLOW:
            ins = ins + [x for x in _subgraph_inputs(node) if x not in ins]
        is_static = op == "Constant" or (
            op not in CONTROL_FLOW and not op.startswith("Random") and all(x in static for x in ins)
        )
        if op in ("Shape", "Size") and ins and shapes.get(real(ins[0]), (None, 0))[0] is not None:
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
            if shapes.get(o, (None, 0))[0] is None:
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
    if missing:
        raise MtppError(
            f"could not infer the shapes of {len(missing)} tensor(s), first: {missing[0]}; "
            "fix more input dims with --dim, or simplify the model (e.g. onnxsim)"
        )

    n = len(cost_names)
    flops = np.zeros(n)
    out_bytes = np.zeros(n)
    moved = np.zeros(n)
    edges: list[tuple[int, int]] = []
    param_users: dict[str, set[int]] = defaultdict(set)
    for k, x in enumerate(graph_inputs):
        out_bytes[k] = nbytes(x)
    for idx in range(len(graph_inputs), n):
        node = g.node[node_of_cost[idx]]
        op = node.op_type
        shape_only = SHAPE_INPUTS.get(op, ())
        ins = list(node.input)
        if op in CONTROL_FLOW:
            ins = ins + [x for x in _subgraph_inputs(node) if x not in ins]
        for j, x in enumerate(ins):
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
            moved[idx] += nbytes(src)
        outs = [o for o in node.output if o in read]
        out_bytes[idx] = sum(nbytes(o) for o in outs)
        moved[idx] += out_bytes[idx]
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

    same = tied_copies(model, [x for x in param_users if _is_weight(x, shapes)])
    merged: dict[str, set[int]] = defaultdict(set)
    for x, users in param_users.items():
        merged[same.get(x, x)] |= users
    params = [(x, nbytes(x), sorted(users)) for x, users in merged.items() if _is_weight(x, shapes)]
    work_arr = _work(work, flops, moved, cluster)
    hints = {
        "format": "onnx",
        "onnx_nodes": len(g.node),
        "static_nodes": [onnx_names[i] for i in pending_static],
        "members": {cost_names[i]: m for i, m in members.items()},
        "graph_outputs": [real(o.name) for o in g.output],
        "work_model": work,
    }
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
    return Graph.build(
        cost_names,
        work_arr,
        out_bytes,
        np.asarray(edges, dtype=np.int64).reshape(-1, 2),
        params=params,
        name=name,
        flops=flops,
        op_types=op_types,
        hints=hints,
    )


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


def _is_weight(name: str, shapes) -> bool:
    """A stored constant is a weight when it is floating point (or 8/4-bit quantized) and not a
    scalar: integer indices, boolean masks, shapes and scalar hyper-parameters are not."""
    from onnx import TensorProto as T

    shape, et = shapes.get(name, (None, 0))
    if shape is None or numel(shape) <= 1:
        return False
    weight_types = {
        T.FLOAT,
        T.FLOAT16,
        T.BFLOAT16,
        T.DOUBLE,
        T.INT8,
        T.UINT8,
        getattr(T, "INT4", -1),
        getattr(T, "UINT4", -1),
        getattr(T, "FLOAT8E4M3FN", -1),
        getattr(T, "FLOAT8E5M2", -1),
        getattr(T, "FLOAT8E4M3FNUZ", -1),
        getattr(T, "FLOAT8E5M2FNUZ", -1),
        getattr(T, "FLOAT4E2M1", -1),
    }
    return int(et) in weight_types


def _work(model: str, flops: np.ndarray, moved: np.ndarray, cluster) -> np.ndarray:
    """Per-node seconds: roofline max(FLOPs / compute, bytes moved / memory bandwidth), or
    compute-bound FLOPs / compute (``flops``)."""
    if model == "roofline":
        return np.maximum(flops / cluster.compute, moved / cluster.memory_bandwidth)
    if model == "flops":
        return flops / cluster.compute
    raise ValueError(model)


def load_onnx(
    path: str | Path,
    dims: dict[str, int] | None = None,
    work: str = "roofline",
    cluster: str | None = None,
    devices: int | None = None,
) -> Graph:
    """Read an ONNX file into a cost graph. ``cluster`` (preset or YAML) sets the roofline."""
    from solver.cluster import load_cluster

    path = Path(path)
    if work not in ("roofline", "flops", "measured"):
        raise MtppError(f"--work {work!r}: choose roofline, flops or measured")
    model = read_model(path)
    fixed = fix_dims(model, dict(dims or {}))
    shapes = infer_shapes(model)
    cl = load_cluster(cluster, devices)
    g = build_cost_graph(
        model, shapes, name=path.stem, work="roofline" if work == "measured" else work, cluster=cl
    )
    g.hints["dims"] = fixed
    g.hints["roofline_cluster"] = cl.name
    if work == "measured":
        from solver.io.onnx_profile import measured_work

        g = g.with_work(measured_work(path, model, g))
        g.hints["work_model"] = "measured"
    return g


__all__ = ["build_cost_graph", "fix_dims", "infer_shapes", "load_onnx", "read_model"]
