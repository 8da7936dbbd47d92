"""An ONNX model as the sharding planner sees it: operators in topological order, every tensor
with a static shape and element type, weights and folded constants with their values.

Constant, Shape-of-a-known-shape and all-constant subgraphs are evaluated here (onnx's reference
evaluator), so a transformer export's shape arithmetic becomes plain constants.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from solver.errors import MtppError, first_line
from solver.io.onnx_common import SHAPE_INPUTS  # shared with the cost graph


@dataclass
class Op:
    """One ONNX node to shard; ``data`` are the positions in ``node.input`` a strategy covers."""

    index: int
    name: str
    op_type: str
    node: object
    data: list[int]
    node_index: int = -1
    # an If/Loop/Scan's outer-scope inputs: tensors its bodies read from the enclosing graph,
    # needed whole (replicated) on every device, covered by no strategy
    outer: list[str] = field(default_factory=list)

    @property
    def data_inputs(self) -> list[str]:
        return [self.node.input[i] for i in self.data]

    @property
    def reads(self) -> list[str]:
        """Every tensor the op reads: its inputs (data and shape), then its outer-scope ones."""
        ins = [t for t in self.node.input if t]
        return ins + [t for t in self.outer if t not in ins]

    @property
    def outputs(self) -> list[str]:
        return [t for t in self.node.output if t]


@dataclass
class ShardModel:
    """Operators, tensor shapes and types, static values; inputs and outputs of the graph."""

    model: object
    ops: list[Op]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    consts: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]
    source: object = None  # the model as given (dims not fixed), for annotated.onnx
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)

    def itemsize(self, t: str) -> int:
        return int(self.dtypes[t].itemsize)

    def op_by_name(self, name: str) -> Op | None:
        return next((o for o in self.ops if o.name == name), None)


def load_model(path: str | Path, dims: dict[str, int] | None = None) -> ShardModel:
    """Read an ONNX file, fix dynamic dims, infer shapes, fold constants."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.is_file():
        raise MtppError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, TypeError, OSError) as e:
        raise MtppError(f"{path}: not a valid ONNX model ({e})") from None
    if not model.graph.node:
        raise MtppError(f"{path}: not a valid ONNX model (no graph nodes)")
    from solver.io.onnx_load import check_external_paths

    check_external_paths(model, path.parent)  # inspect's check: inside the folder, long enough
    _load_present_external(model, path.parent)
    return from_proto(model, dims or {}, str(path))


@dataclass(frozen=True)
class Unloaded:
    """A weight stored outside the model whose bytes are absent: shape and type only."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _load_present_external(model, base: Path) -> None:
    """Load external weights whose files exist inside the model's folder; leave the rest
    (:func:`load_model` has already refused unsafe, missing or short ones)."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    from solver.io.onnx_common import external_info

    for t in model.graph.initializer:
        if not uses_external_data(t):
            continue
        loc = external_info(t).get("location", "")
        f = (base / loc).resolve()
        if loc and base.resolve() in f.parents and f.is_file():
            load_external_data_for_tensor(t, str(base))
            t.data_location = 0
            del t.external_data[:]


def from_proto(model, dims: dict[str, int], where: str = "model") -> ShardModel:
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    from solver.io.onnx_common import CONTROL_FLOW, subgraph_inputs
    from solver.io.onnx_import import fix_dims
    from solver.sharding.config import attributes_to_metadata

    source = model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    attributes_to_metadata(model)
    unloaded = {}
    for init in list(model.graph.initializer):
        if uses_external_data(init):  # bytes absent: plan from its shape, as a typed input
            dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
            unloaded[init.name] = Unloaded(tuple(int(d) for d in init.dims), dt)
            model.graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
            model.graph.initializer.remove(init)
    fix_dims(model, dims)
    try:
        onnx.checker.check_model(model)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        first = first_line(e, "invalid model")
        raise MtppError(f"{where}: the ONNX checker rejects the model: {first}") from None
    g = inferred.graph
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dtypes[vi.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    consts: dict[str, np.ndarray] = dict(unloaded)
    for init in g.initializer:
        consts[init.name] = numpy_helper.to_array(init)
    init_names = set(consts)
    inputs = [i.name for i in g.input if i.name not in init_names]
    ops: list[Op] = []
    for i, node in enumerate(g.node):
        outer = subgraph_inputs(node) if node.op_type in CONTROL_FLOW else []
        if not outer and _fold(node, consts, shapes):  # a body reading outer names stays
            continue
        name = node.name or f"{node.op_type}_{i}"
        skip = SHAPE_INPUTS.get(node.op_type, set())
        data = [k for k, t in enumerate(node.input) if t and k not in skip]
        ops.append(Op(len(ops), name, node.op_type, node, data, i, outer))
    for name, arr in consts.items():
        shapes[name] = tuple(arr.shape)
        dtypes[name] = arr.dtype
    for op in ops:
        for t in [*op.data_inputs, *op.outer, *op.outputs]:
            if t not in shapes:
                raise MtppError(
                    f"{where}: tensor {t!r} of node {op.name!r} has no static shape; fix the "
                    "dynamic input dims with --dim NAME=VALUE"
                )
    names = [o.name for o in ops]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise MtppError(f"{where}: two nodes are named {dup!r}; node names must be unique")
    sm = ShardModel(
        inferred, ops, shapes, dtypes, consts, inputs, [o.name for o in g.output], source
    )
    for op in ops:
        for t in op.outputs:
            sm.producer[t] = op.index
        for t in [*op.data_inputs, *(x for x in op.outer if x not in op.data_inputs)]:
            sm.consumers.setdefault(t, []).append(op.index)
    return sm


def _fold(node, consts: dict, shapes: dict) -> bool:
    """Evaluate a static node into ``consts``; True when it was folded."""
    from onnx import numpy_helper

    if node.op_type == "Constant":
        attr = node.attribute[0]
        if attr.name == "value":
            consts[node.output[0]] = numpy_helper.to_array(attr.t)
            return True
    elif node.op_type == "Shape" and node.input[0] in shapes:
        shp = np.array(shapes[node.input[0]], dtype=np.int64)
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        end = next((a.i for a in node.attribute if a.name == "end"), None)
        consts[node.output[0]] = shp[start:end]
        return True
    ins = [t for t in node.input if t]
    if not ins or any(t not in consts or isinstance(consts[t], Unloaded) for t in ins):
        return False
    out = run_node(node, [consts.get(t) if t else None for t in node.input])
    for t, v in zip(node.output, out, strict=False):
        if t:
            consts[t] = np.asarray(v)
    return True


_EVALUATORS: dict = {}


def run_node(node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """One ONNX node evaluated with onnx's reference implementation (evaluators cached)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    key = (node.SerializeToString(), tuple(names))
    ev = _EVALUATORS.get(key)
    if ev is None:
        n2 = helper.make_node(node.op_type, names, [f"o{k}" for k in range(len(node.output))])
        n2.attribute.extend(node.attribute)
        n2.domain = node.domain
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ev = _EVALUATORS[key] = ReferenceEvaluator(n2)
    feeds = {nm: x for nm, x in zip(names, inputs, strict=True) if nm}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ev.run(None, feeds)
