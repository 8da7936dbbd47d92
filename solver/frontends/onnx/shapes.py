"""Dims and shapes: fix dynamic input dims, then find the shape of every tensor.

Shapes come from onnx inference with data propagation; where that leaves tensors unknown,
small constant subgraphs are folded and inference runs again; then onnxruntime's symbolic
inference; and when tensors someone reads are still unknown (control flow, data-dependent
shapes), one onnxruntime run at the fixed dims reads the shape of every intermediate tensor.
Sizes are plain numbers throughout: nothing here allocates in proportion to the dims.

:func:`read_static` and :func:`static_model` are the one entry point of the ONNX front end: the
cost graph (:mod:`solver.frontends.onnx.reader`) and the sharding planner (:mod:`solver.spmd.model`)
both read a model through them, so both accept the same models.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from solver.core.errors import MtppError, first_line
from solver.frontends.onnx.common import CONTROL_FLOW, model_tensors, subgraph_inputs
from solver.frontends.onnx.fold import fold_constants
from solver.frontends.onnx.load import check_model, light_copy, read_model
from solver.frontends.onnx.ort import run_shapes

BATCH_LIKE = re.compile(r"(^|_)(batch|bs|n|b)(_|$)|batch", re.IGNORECASE)

Shapes = dict[str, tuple[tuple[int, ...] | None, int]]


@dataclass
class StaticModel:
    """A model with its dynamic dims fixed and the shape of its tensors, as the front end
    found them (inference, folding, and one onnxruntime run where those fail)."""

    model: object  # the ModelProto, dims fixed; external weights stay unread
    shapes: Shapes  # tensor name -> (shape, or None while unknown; element type)
    fixed: list[str]  # the dims set, for reporting ("seq=128")
    folder: Path | None  # the folder of its external data (None: every weight is inline)
    note: str | None = None  # where shapes from an onnxruntime run came from, for the user

    def unknown(self, tensors) -> list[str]:
        """Those of ``tensors`` whose shape is still unknown, in order, each once."""
        return [t for t in dict.fromkeys(tensors) if self.shapes.get(t, (None, 0))[0] is None]


def read_static(path: str | Path, dims: dict[str, int], *, complete: bool = True) -> StaticModel:
    """Read an ONNX file (:func:`solver.frontends.onnx.load.read_model`), fix its dims and find its
    shapes (:func:`static_model`)."""
    path = Path(path)
    return _static(read_model(path), dims, path.parent, complete)


def static_model(
    model, dims: dict[str, int], *, where: str, folder=None, complete: bool = True
) -> StaticModel:
    """The front end on a model in memory: the ONNX checker (refusals name ``where``), dims
    fixed in place (:func:`fix_dims`), every shape inferred (:func:`infer_shapes`); with
    ``complete``, one onnxruntime run when tensors someone reads are still unknown (external
    data read from ``folder``). Without it the caller asks :func:`with_run` for what it needs."""
    check_model(model, where)
    return _static(model, dims, folder, complete)


def _static(model, dims: dict[str, int], folder, complete: bool) -> StaticModel:
    fixed = fix_dims(model, dict(dims))
    out = StaticModel(model, infer_shapes(model), fixed, None if folder is None else Path(folder))
    left = missing(model, out.shapes) if complete else []
    return with_run(out, left) if left else out


def with_run(sm: StaticModel, tensors: list[str]) -> StaticModel:
    """``sm`` with the shapes of one onnxruntime run added (:func:`run_for_shapes`) because
    ``tensors`` are unknown; the record says so in ``note``. Refuses when the run cannot
    give them."""
    note = run_for_shapes(sm.model, sm.folder, sm.shapes, tensors)
    return replace(sm, note=note)


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


def shape_map(model) -> Shapes:
    """Tensor name -> (shape or None when not fully known, element type)."""
    out: Shapes = {}

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
    for s in g.sparse_initializer:
        out[s.values.name] = (tuple(int(d) for d in s.dims), s.values.data_type)
    return out


def _fill(shapes: Shapes, more: Shapes) -> None:
    """Add what ``more`` knows and ``shapes`` does not."""
    for name, val in more.items():
        if name not in shapes or (val[0] is not None and shapes[name][0] is None):
            shapes[name] = val


def infer_shapes(model) -> Shapes:
    """Shapes of every tensor from onnx inference, folding and symbolic inference (see the
    module docstring); tensors none of them resolves stay None (see :func:`run_for_shapes`)."""
    light = light_copy(model)
    inferred, shapes = _onnx_infer(light)
    for _ in range(4):
        if not missing(inferred, shapes):
            return shapes
        folded = fold_constants(light, shapes)
        if folded is None:
            break
        light = folded
        inferred, more = _onnx_infer(light)
        _fill(shapes, more)
    if missing(inferred, shapes):
        _fill(shapes, _symbolic(inferred))
    return shapes


def complete_shapes(model, folder=None) -> tuple[Shapes, str | None]:
    """:func:`infer_shapes`, then one onnxruntime run (:func:`run_for_shapes`) when tensors
    someone reads are still unknown; returns the shapes and the run's note (or None). For
    callers that need every shape, such as the exporter's stage boundaries."""
    shapes = infer_shapes(model)
    left = missing(model, shapes)
    return shapes, (run_for_shapes(model, folder, shapes, left) if left else None)


def run_for_shapes(model, folder, shapes: Shapes, left: list[str]) -> str:
    """Fill ``shapes`` from one onnxruntime run of ``model`` at its fixed dims (external data
    read from ``folder``); ``left`` names the tensors inference could not resolve. Returns the
    line that tells the user where the shapes came from."""
    from onnx import TensorProto  # heavy: onnx

    head = f"could not infer the shapes of {len(left)} tensor(s), first: {left[0]}"
    if folder is None and any(
        t.data_location == TensorProto.EXTERNAL for t in model_tensors(model)
    ):
        raise MtppError(f"{head}; the model's external data folder is unknown, so it cannot run")
    try:
        ran = run_shapes(model, folder, shapes)
    except MtppError as e:
        raise MtppError(f"{head}; and {str(e)[0].lower()}{str(e)[1:]}") from None
    for name, val in ran.items():
        if shapes.get(name, (None, 0))[0] is None:
            shapes[name] = val
    return (
        f"shapes of {len(left)} tensor(s) that inference left unknown (first: {left[0]}) come "
        "from one onnxruntime run on random inputs at the fixed dims; data-dependent shapes "
        "may differ for other inputs"
    )


def _onnx_infer(light):
    import onnx  # heavy: onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception as e:  # onnx raises several internal types here
        raise MtppError(f"onnx shape inference failed: {first_line(e)}") from None
    return inferred, shape_map(inferred)


def _symbolic(inferred) -> Shapes:
    """onnxruntime's symbolic shape inference, best effort (what stays unknown is handled by
    the caller)."""
    try:
        # heavy: onnxruntime
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
    except Exception:  # symbolic inference is best effort
        return {}
    return {} if sym is None else shape_map(sym)


def missing(model, shapes: Shapes) -> list[str]:
    """Tensors someone reads (or the model outputs) whose shape is still unknown."""
    g = model.graph
    read = {x for node in g.node for x in node.input if x} | {o.name for o in g.output}
    for node in g.node:
        if node.op_type in CONTROL_FLOW:
            read.update(subgraph_inputs(node))
    out = []
    for node in g.node:
        for o in node.output:
            if o and o in read and shapes.get(o, (None, 0))[0] is None:
                out.append(o)
    return out
