"""A contiguous range of a ShardModel's operators as a model of its own (one pipeline stage).

``make_segment(sm, start, end)`` keeps ``sm.ops[start:end]`` with their tensors; the stage's
inputs (tensors it reads that earlier stages or the model give it) become the sub-model's
inputs and what later stages or the model read becomes its outputs, so the sharding planner
prices the stage exactly as it prices a whole model (inputs arrive free, outputs may stay
split). ``signature`` is equal for two segments that the sharding cost model cannot tell
apart (repeated identical layers), so their costs are computed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from solver.spmd.model import Op, ShardModel, Unloaded


@dataclass(frozen=True, eq=False)
class Segment:
    """Operators ``start..end-1`` of the parent model as a :class:`ShardModel` of their own."""

    start: int
    end: int
    sm: ShardModel
    inputs: tuple[str, ...]  # tensors received: model inputs or outputs of earlier stages
    outputs: tuple[str, ...]  # tensors sent on: read by later stages, or model outputs
    signature: tuple

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.sm.ops)


def tensor_bytes(sm: ShardModel, t: str) -> float:
    """Bytes of the whole tensor ``t``."""
    return float(math.prod(sm.shapes[t]) * sm.itemsize(t))


def _reads(op: Op) -> list[str]:
    """Every tensor the node reads: data and shape inputs in input order, then the outer-scope
    tensors its subgraph bodies read (If/Loop/Scan)."""
    return op.reads


def make_segment(sm: ShardModel, start: int, end: int) -> Segment:
    """The sub-model of operators ``start..end-1`` (topological order of ``sm``)."""
    if not 0 <= start < end <= len(sm.ops):
        raise ValueError(f"bad segment {start}..{end} of {len(sm.ops)} operators")
    ops = [replace(op, index=j) for j, op in enumerate(sm.ops[start:end])]
    inside = {t for op in ops for t in op.outputs}
    inputs: list[str] = []
    for op in ops:
        for t in _reads(op):
            if t not in inside and t not in sm.consts and t not in inputs:
                inputs.append(t)
    read_later = {t for op in sm.ops[end:] for t in _reads(op)}
    model_outputs = set(sm.outputs)
    outputs = [t for op in ops for t in op.outputs if t in read_later or t in model_outputs]
    sub = ShardModel(
        sm.model,
        ops,
        sm.shapes,
        sm.dtypes,
        sm.consts,
        inputs,
        outputs,
        sm.source,
    )
    for op in ops:
        for t in op.outputs:
            sub.producer[t] = op.index
        for t in op.data_inputs:
            sub.consumers.setdefault(t, []).append(op.index)
    return Segment(start, end, sub, tuple(inputs), tuple(outputs), _signature(sub))


def _signature(sub: ShardModel) -> tuple:
    """What the sharding cost of the segment depends on: operator types, attributes, shapes,
    types, small constant values and the wiring, with tensor names replaced by positions."""
    weights: dict[str, int] = {}
    out = []
    for op in sub.ops:
        wiring = []
        for k, t in enumerate(op.node.input):
            if not t:
                wiring.append(("",))
            elif t in sub.producer:
                u = sub.producer[t]
                wiring.append(("op", u, sub.ops[u].outputs.index(t)))
            elif t in sub.consts and k in op.data:
                wiring.append(("w", weights.setdefault(t, len(weights))))
            elif t in sub.consts:
                value = sub.consts[t]
                if isinstance(value, Unloaded):
                    wiring.append(("c", value.shape, str(value.dtype)))
                else:
                    a = np.asarray(value)
                    wiring.append(("c", a.shape, str(a.dtype), a.tobytes()))
            else:
                wiring.append(("in", sub.inputs.index(t)))
            if t:
                wiring[-1] += (sub.shapes.get(t), str(sub.dtypes.get(t)))
        attrs = tuple(a.SerializeToString() for a in op.node.attribute)
        outs = tuple((sub.shapes.get(t), str(sub.dtypes.get(t))) for t in op.outputs)
        out.append((op.op_type, op.node.domain, tuple(op.data), tuple(wiring), outs, attrs))
    sent = tuple((sub.producer[t], sub.ops[sub.producer[t]].outputs.index(t)) for t in sub.outputs)
    return (tuple(out), sent, len(sub.inputs))


def crossing(sm: ShardModel) -> list[list[str]]:
    """For every position p (0..n), the non-constant tensors produced before p and read at or
    after p (or model outputs): what a cut at p sends from one stage to the next."""
    n = len(sm.ops)
    last: dict[str, int] = {}
    for i, op in enumerate(sm.ops):
        for t in _reads(op):
            last[t] = i
    for t in sm.outputs:
        if t in sm.producer:
            last[t] = n
    out: list[list[str]] = [[] for _ in range(n + 1)]
    for i, op in enumerate(sm.ops):
        for t in op.outputs:
            for p in range(i + 1, last.get(t, i) + 1):
                out[p].append(t)
    return out


ALL_POSITIONS_UP_TO = 16  # a model with at most this many operators is cut at every position


def cut_points(sm: ShardModel, every: bool | None = None) -> list[int]:
    """Positions where stages may begin or end: 0, n, and every inner position of a small
    model; in a bigger one the positions where the fewest tensors cross (counted, then the
    fewest bytes among those: the layer boundaries of repeated layers, so that every layer
    yields the same segments)."""
    n = len(sm.ops)
    if every is None:
        every = n <= ALL_POSITIONS_UP_TO
    if every or n <= 1:
        return list(range(n + 1))
    cross = crossing(sm)
    counts = [len(cross[p]) for p in range(1, n)]
    least = min(counts)
    return [0] + [p for p in range(1, n) if len(cross[p]) == least] + [n]
