"""An ONNX model as the sharding planner sees it: operators in topological order, every tensor
with a static shape and element type, weights and folded constants with their values.

The model is read by the ONNX front end the cost graph uses (:mod:`solver.frontends.onnx.shapes`:
checker, dims, shapes from inference, folding and one onnxruntime run where those fail), and
its static nodes (Constant, Shape of a known shape, all-constant subgraphs) are evaluated by
:func:`solver.frontends.onnx.fold.fold_values`, so a transformer export's shape arithmetic becomes
plain constants.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from solver.core.errors import MtppError
from solver.frontends.onnx.common import CONTROL_FLOW, SHAPE_INPUTS, external_info, subgraph_inputs
from solver.frontends.onnx.fold import fold_values
from solver.frontends.onnx.load import load_proto
from solver.frontends.onnx.shapes import StaticModel, static_model, with_run
from solver.spmd.strategy import attributes_to_metadata


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


PLANNING_WEIGHT_BYTES = 2**20  # a planner reads no weight values: external weights larger
# than this stay on disk, planned from their shape (smaller ones may be shape constants to fold)


def load_model(
    path: str | Path, dims: dict[str, int] | None = None, *, weights: bool = True
) -> ShardModel:
    """Read an ONNX file (external data checked, present external weights loaded) and make
    it a :class:`ShardModel` (:func:`from_proto`). ``weights=False`` is for planners: external
    weights over :data:`PLANNING_WEIGHT_BYTES` are not read (a 7B model's 13 GB stay on disk)
    and are planned from their shape, as absent ones are (:class:`Unloaded`)."""
    path = Path(path)
    if not path.is_file():
        raise MtppError(f"{path}: no such ONNX file")
    model = load_proto(path)
    _load_present_external(model, path.parent, math.inf if weights else PLANNING_WEIGHT_BYTES)
    return from_proto(model, dims or {}, str(path), folder=path.parent)


@dataclass(frozen=True)
class Unloaded:
    """A weight stored outside the model whose bytes are absent: shape and type only."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _load_present_external(model, base: Path, largest: float) -> None:
    """Load external weights of at most ``largest`` bytes whose files exist inside the
    model's folder; leave the rest (:func:`load_model` has already refused unsafe, missing or
    short ones)."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data
    from onnx.helper import tensor_dtype_to_np_dtype

    for t in model.graph.initializer:
        if not uses_external_data(t):
            continue
        loc = external_info(t).get("location", "")
        f = (base / loc).resolve()
        size = math.prod(int(d) for d in t.dims) * tensor_dtype_to_np_dtype(t.data_type).itemsize
        if size > largest:
            continue
        if loc and base.resolve() in f.parents and f.is_file():
            load_external_data_for_tensor(t, str(base))
            t.data_location = 0
            del t.external_data[:]


def from_proto(model, dims: dict[str, int], where: str = "model", folder=None) -> ShardModel:
    """The planner's view of ``model`` (left unchanged): the front end's static model
    (:func:`solver.frontends.onnx.shapes.static_model`), its static nodes folded into constants,
    every
    other node an :class:`Op`. Weights whose external bytes are absent are planned from their
    shape (:class:`Unloaded`); other external data, if a run needs it, is read from
    ``folder``."""
    import onnx

    source = model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    attributes_to_metadata(model)  # before the checker, which refuses unknown attributes
    unloaded = _absent_weights_as_inputs(model)
    static = static_model(model, dims, where=where, folder=folder)
    if static.note:
        warnings.warn(static.note, stacklevel=2)
    g = static.model.graph
    folded = fold_values(g.node, static.shapes, _stored_values(g))
    consts: dict[str, np.ndarray] = {**unloaded, **folded.values}
    ops = _operators(g, set(folded.nodes), where)
    static = _complete(static, ops, consts, where)
    shapes, dtypes = _shapes_and_types(static, consts)
    inputs = [i.name for i in g.input if i.name not in consts]
    sm = ShardModel(
        static.model, ops, shapes, dtypes, consts, inputs, [o.name for o in g.output], source
    )
    for op in ops:
        for t in op.outputs:
            sm.producer[t] = op.index
        for t in [*op.data_inputs, *(x for x in op.outer if x not in op.data_inputs)]:
            sm.consumers.setdefault(t, []).append(op.index)
    return sm


def _absent_weights_as_inputs(model) -> dict[str, Unloaded]:
    """Turn every initializer whose external bytes are absent into a typed graph input (in
    place); return their shapes and types."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    unloaded = {}
    for init in list(model.graph.initializer):
        if uses_external_data(init):
            dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
            unloaded[init.name] = Unloaded(tuple(int(d) for d in init.dims), dt)
            model.graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
            model.graph.initializer.remove(init)
    return unloaded


def _stored_values(graph) -> dict[str, np.ndarray]:
    """The value of every initializer (their bytes are in memory: absent ones were removed)."""
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in graph.initializer}


def _operators(graph, folded: set[int], where: str) -> list[Op]:
    """Every node not folded, as an :class:`Op` (node names must be unique)."""
    ops: list[Op] = []
    for i, node in enumerate(graph.node):
        if i in folded:
            continue
        outer = subgraph_inputs(node) if node.op_type in CONTROL_FLOW else []
        name = node.name or f"{node.op_type}_{i}"
        skip = SHAPE_INPUTS.get(node.op_type, set())
        data = [k for k, t in enumerate(node.input) if t and k not in skip]
        ops.append(Op(len(ops), name, node.op_type, node, data, i, outer))
    names = [o.name for o in ops]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise MtppError(f"{where}: two nodes are named {dup!r}; node names must be unique")
    return ops


def _complete(static: StaticModel, ops: list[Op], consts: dict, where: str) -> StaticModel:
    """``static`` with a shape for every tensor an operator reads or makes: one onnxruntime
    run for outputs nobody reads (the front end ran it for every tensor read), if needed."""
    tensors = [t for op in ops for t in (*op.data_inputs, *op.outer, *op.outputs)]
    left = [t for t in static.unknown(tensors) if t not in consts]
    if left and static.note is None:
        static = with_run(static, left)
        warnings.warn(static.note, stacklevel=3)
        left = [t for t in static.unknown(left) if t not in consts]
    if left:
        op = next(o for o in ops if left[0] in (*o.data_inputs, *o.outer, *o.outputs))
        raise MtppError(
            f"{where}: tensor {left[0]!r} of node {op.name!r} has no static shape, even after "
            "one onnxruntime run (a sequence or a map?); mtpp shard needs tensors"
        )
    return static


def _shapes_and_types(static: StaticModel, consts: dict):
    """Tensor name -> shape and -> numpy dtype, for every tensor of known shape and every
    constant."""
    import onnx

    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    for name, (shape, elem) in static.shapes.items():
        if elem:
            dtypes[name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        if shape is not None:
            shapes[name] = tuple(int(d) for d in shape)
    for name, arr in consts.items():
        shapes[name] = tuple(arr.shape)
        dtypes[name] = arr.dtype
    return shapes, dtypes
