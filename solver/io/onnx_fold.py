"""Constant folding for shape inference: evaluate small nodes whose inputs are known values.

Shape arithmetic that onnx cannot propagate (through ``Where``, for example) is evaluated with
``onnx.reference`` and the results become initializers, so inference can run again. Nothing is
evaluated whose result could be large: a node whose output size depends on input *values*
(``ConstantOfShape``, ``Expand``, ``Range``, ...) is folded only when that size is known to be
small first, so huge ``--dim`` values never allocate.
"""

from __future__ import annotations

import math

import numpy as np

from solver.io.onnx_common import CONTROL_FLOW
from solver.io.onnx_flops import numel
from solver.io.onnx_load import LIGHT_LIMIT

# ops whose output size comes from input values, not input sizes
SIZE_FROM_VALUES = {
    "ConstantOfShape",
    "Expand",
    "Tile",
    "Range",
    "Resize",
    "Upsample",
    "Pad",
    "OneHot",
    "CenterCropPad",
    "Col2Im",
    "RandomNormal",
    "RandomUniform",
    "EyeLike",
}


def _predicted_size(op: str, feeds: dict, ins: list[str]) -> int | None:
    """Elements a value-sized op would produce, from its input values; None when unknown."""
    try:
        if op == "ConstantOfShape":
            return numel(np.asarray(feeds[ins[0]]).reshape(-1).tolist())
        if op == "Range":
            start, limit, delta = (float(np.asarray(feeds[x]).reshape(-1)[0]) for x in ins[:3])
            return max(0, math.ceil((limit - start) / delta)) if delta else None
        if op == "Tile":
            shape, reps = np.shape(feeds[ins[0]]), np.asarray(feeds[ins[1]]).reshape(-1).tolist()
            return numel([int(s) * int(r) for s, r in zip(shape, reps, strict=True)])
        if op == "Expand":
            shape, target = np.shape(feeds[ins[0]]), np.asarray(feeds[ins[1]]).reshape(-1).tolist()
            rank = max(len(shape), len(target))
            a = [1] * (rank - len(shape)) + [int(s) for s in shape]
            b = [1] * (rank - len(target)) + [int(s) for s in target]
            return numel([max(x, y) for x, y in zip(a, b, strict=True)])
    except (IndexError, KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return None


def _small_enough(node, feeds: dict, ins: list[str], shapes) -> bool:
    """Whether evaluating ``node`` is known to produce at most ``LIGHT_LIMIT`` elements."""
    known = [shapes.get(o, (None, 0))[0] for o in node.output if o]
    if known and all(s is not None for s in known):
        return all(numel(s) <= LIGHT_LIMIT for s in known)
    if node.op_type in SIZE_FROM_VALUES:
        size = _predicted_size(node.op_type, feeds, ins)
        return size is not None and size <= LIGHT_LIMIT
    # any other op: outputs are bounded by its (small) inputs
    return True


def _shaped(shape) -> np.ndarray:
    """An array of the given shape that allocates one byte (every element is the same)."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), tuple(shape), (0,) * len(shape))


def fold_constants(light, shapes):
    """Evaluate small nodes whose inputs are known values (Shape/Size of known shapes
    included) and replace them by initializers; None when nothing new folds."""
    import onnx
    from onnx import AttributeProto, TensorProto, numpy_helper
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
        if any(
            a.type == AttributeProto.TENSOR
            and (a.t.data_location == TensorProto.EXTERNAL or numel(a.t.dims) > LIGHT_LIMIT)
            for a in node.attribute
        ):
            continue  # a stored weight, never read here
        feeds = {}
        if op in ("Shape", "Size"):
            shape = shapes.get(ins[0], (None, 0))[0] if ins else None
            if shape is None:
                continue
            feeds = {ins[0]: _shaped(shape)}
        elif all(x in values for x in ins):
            feeds = {x: values[x] for x in ins}
            if not _small_enough(node, feeds, ins, shapes):
                continue
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
    out = onnx.ModelProto()
    out.CopyFrom(light)
    del out.graph.node[:]
    out.graph.node.extend(n for i, n in enumerate(g.node) if i not in folded)
    out.graph.initializer.extend(new_inits)
    return out
