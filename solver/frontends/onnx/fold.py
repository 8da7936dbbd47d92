"""Constant folding: evaluate the nodes whose inputs are known values (``onnx.reference``).

One evaluator, two uses:

- shape inference (:func:`fold_constants`): shape arithmetic that onnx cannot propagate
  (through ``Where``, for example) is evaluated on the light copy of the model and the results
  become initializers, so inference can run again; only small values are made
  (``LIGHT_LIMIT`` elements) and stored weights are never read;
- the sharding planner (:func:`fold_values`): every static node (weights included) becomes a
  constant with its value, so a transformer export's shape arithmetic and weight preprocessing
  are plain constants.

Nothing is evaluated whose result could be huge: a node whose output size depends on input
*values* (``ConstantOfShape``, ``Expand``, ``Range``, ...) is folded only when that size is known
to be small enough first, so huge ``--dim`` values never allocate.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from solver.frontends.onnx.common import CONTROL_FLOW, node_tensors, subgraph_inputs
from solver.frontends.onnx.flops import numel
from solver.frontends.onnx.load import LIGHT_LIMIT

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

VALUE_LIMIT = 1 << 26  # elements: a larger value-sized constant stays an operator of the planner


@dataclass(frozen=True)
class FoldPolicy:
    """What a folding pass may evaluate."""

    limit: int | None  # the most elements of any value made; None: any size bounded by inputs
    sized_limit: int  # the most elements a value-sized op (SIZE_FROM_VALUES) may make
    control_flow: bool  # evaluate If/Loop/Scan whose bodies read nothing from outside


FOR_INFERENCE = FoldPolicy(LIGHT_LIMIT, LIGHT_LIMIT, control_flow=False)
FOR_PLANNER = FoldPolicy(None, VALUE_LIMIT, control_flow=True)


@dataclass
class Folded:
    """The outcome of one folding pass over a node list."""

    values: dict[str, np.ndarray]  # every known value: the given ones and the new ones
    nodes: list[int]  # positions of the nodes evaluated (they are constants now)
    new: list[str]  # names of the values made, in node order


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


def _small_enough(node, feeds: dict, ins: list[str], shapes, policy: FoldPolicy) -> bool:
    """Whether evaluating ``node`` is known to stay within the policy's sizes."""
    cap = policy.limit
    if node.op_type in SIZE_FROM_VALUES:
        cap = policy.sized_limit if cap is None else min(cap, policy.sized_limit)
    if cap is None:  # outputs bounded by inputs already in memory
        return True
    known = [shapes.get(o, (None, 0))[0] for o in node.output if o]
    if known and all(s is not None for s in known):
        return all(numel(s) <= cap for s in known)
    if node.op_type in SIZE_FROM_VALUES:
        size = _predicted_size(node.op_type, feeds, ins)
        return size is not None and size <= cap
    # any other op: outputs are bounded by its (small) inputs
    return True


def _shaped(shape) -> np.ndarray:
    """An array of the given shape that allocates one byte (every element is the same)."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), tuple(shape), (0,) * len(shape))


def _stored_weight(t, policy: FoldPolicy) -> bool:
    """A tensor attribute the pass must not read: external data, or over the policy's limit."""
    from onnx import TensorProto  # heavy: onnx

    if t.data_location == TensorProto.EXTERNAL:
        return True
    return policy.limit is not None and numel(t.dims) > policy.limit


def _feeds(node, shapes, values: dict, policy: FoldPolicy) -> dict | None:
    """The inputs to evaluate ``node`` on, or None when it is not static (or too large)."""
    ins = [x for x in node.input if x]
    op = node.op_type
    if op.startswith("Random") or not any(node.output):
        return None
    if op in CONTROL_FLOW and (not policy.control_flow or subgraph_inputs(node)):
        return None
    if any(_stored_weight(t, policy) for t in node_tensors(node)):
        return None
    if op in ("Shape", "Size"):
        if not ins:
            return None
        shape = shapes.get(ins[0], (None, 0))[0]
        if shape is None and ins[0] in values:
            shape = np.shape(values[ins[0]])
        return None if shape is None else {ins[0]: _shaped(shape)}
    if not all(x in values for x in ins):
        return None
    feeds = {x: values[x] for x in ins}
    return feeds if _small_enough(node, feeds, ins, shapes, policy) else None


def fold_nodes(nodes, shapes, values: dict, policy: FoldPolicy) -> Folded:
    """One pass over ``nodes`` in order: every node whose inputs are known values (``values``,
    or the shape of a known tensor for Shape/Size) is evaluated when ``policy`` allows."""
    values = dict(values)
    done: list[int] = []
    new: list[str] = []
    for i, node in enumerate(nodes):
        feeds = _feeds(node, shapes, values, policy)
        if feeds is None:
            continue
        res = run_node(node, [feeds.get(x) if x else None for x in node.input])
        if res is None or (policy.limit is not None and any(r.size > policy.limit for r in res)):
            continue
        for o, r in zip(node.output, res, strict=False):
            if o:
                values[o] = r
                new.append(o)
        done.append(i)
    return Folded(values, done, new)


def fold_constants(light, shapes):
    """Evaluate small nodes of the light copy whose inputs are known values (Shape/Size of
    known shapes included) and replace them by initializers; None when nothing new folds."""
    import onnx  # heavy: onnx
    from onnx import numpy_helper

    g = light.graph
    values = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    folded = fold_nodes(g.node, shapes, values, FOR_INFERENCE)
    if not folded.nodes:
        return None
    done = set(folded.nodes)
    out = onnx.ModelProto()
    out.CopyFrom(light)
    del out.graph.node[:]
    out.graph.node.extend(n for i, n in enumerate(g.node) if i not in done)
    out.graph.initializer.extend(numpy_helper.from_array(folded.values[o], o) for o in folded.new)
    return out


def fold_values(nodes, shapes, values: dict) -> Folded:
    """Every static node of ``nodes`` (the planner's view): Constant, Shape/Size of a known
    shape, and any node whose inputs are all known ``values`` (weights included), within
    ``VALUE_LIMIT`` for value-sized ops."""
    return fold_nodes(nodes, shapes, values, FOR_PLANNER)


_EVALUATORS: dict = {}
_CACHED_KEY_BYTES = 4096


def run_node(node, inputs: list) -> list[np.ndarray] | None:
    """One ONNX node evaluated with onnx's reference implementation on ``inputs`` (by input
    position, None for an absent one); None when the evaluator cannot run it. Evaluators are
    cached by operator and attributes, so the same op in every layer is built once."""
    from onnx import helper, numpy_helper  # heavy: onnx
    from onnx.reference import ReferenceEvaluator

    value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
    if node.op_type == "Constant" and value is not None:  # a stored tensor: no evaluator
        return [numpy_helper.to_array(value)]
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    one = helper.make_node(node.op_type, names, [f"o{k}" for k in range(len(node.output))])
    one.attribute.extend(node.attribute)
    one.domain = node.domain
    key = one.SerializeToString()
    feeds = {nm: x for nm, x in zip(names, inputs, strict=True) if nm}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ev = _EVALUATORS.get(key)
            if ev is None:
                ev = ReferenceEvaluator(one)
                if len(key) <= _CACHED_KEY_BYTES:  # never keep a copy of a stored tensor
                    _EVALUATORS[key] = ev
            return [np.asarray(r) for r in ev.run(None, feeds)]
        except Exception:  # an op the reference evaluator cannot run: not folded
            return None
