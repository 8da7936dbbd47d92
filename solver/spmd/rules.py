"""Operator rules: which sharding strategies an operator accepts and what they produce.

Every rule describes its operator as *loops* (like einsum indices): each dimension of each data
input and output is tied to one loop, or to none (a broadcast or unsplittable dimension). A
strategy splits loops; the operator's device matrix is the loop splits in loop order, followed by
a replication axis when they use fewer than all devices (MindSpore's convention). A loop in
``partial`` that appears in no output (a contraction: MatMul's k, Conv's input channels, a
ReduceSum axis, a Gather's vocabulary) leaves partial sums; a loop in ``fixed`` is never split
(Softmax's axis, a Concat axis, pooling windows).

One small function per operator class builds the loop description; operators without a rule
run replicated.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from solver.core.errors import MtppError
from solver.frontends.onnx.flops import node_flops
from solver.spmd.mesh import Layout
from solver.spmd.model import Op, ShardModel
from solver.spmd.strategy import Strategy


class StrategyError(MtppError):
    """A strategy the operator cannot run (wrong arity, a split that does not divide)."""


@dataclass(frozen=True)
class Spec:
    """An operator as loops; ``kind`` selects any special local semantics in execution."""

    kind: str
    loops: tuple[int, ...]
    ins: tuple[tuple[int | None, ...], ...]
    outs: tuple[tuple[int | None, ...], ...]
    fixed: frozenset[int] = frozenset()
    partial: frozenset[int] = frozenset()


@dataclass(frozen=True)
class OpSharding:
    """One operator under one strategy: its device matrix, the layout each data input must have,
    the layouts of its outputs, and the FLOPs one device runs."""

    strategy: Strategy
    loop_splits: tuple[int, ...]
    device_matrix: tuple[int, ...]
    in_layouts: tuple[Layout, ...]
    out_layouts: tuple[Layout, ...]
    local_flops: float
    kind: str


# ---------------------------------------------------------------------- helpers
def _attr(node, name: str, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _broadcast_map(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int | None, ...]:
    """Input dims aligned to output dims from the right; broadcast (size-1) dims get None."""
    off = len(out) - len(shape)
    return tuple(None if (s == 1 and out[off + d] != 1) else off + d for d, s in enumerate(shape))


def _identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


# ---------------------------------------------------------------------- rules
def elementwise(op: Op, sm: ShardModel) -> Spec:
    """Element-wise ops with broadcasting, activations, Cast, Where, Identity."""
    out = sm.shapes[op.outputs[0]]
    ins = tuple(_broadcast_map(sm.shapes[t], out) for t in op.data_inputs)
    return Spec("elementwise", out, ins, (_identity(len(out)),) * len(op.outputs))


def along_axis(op: Op, sm: ShardModel) -> Spec:
    """Softmax / LogSoftmax / Hardmax: element-wise except the normalised axis (not linear)."""
    out = sm.shapes[op.outputs[0]]
    axis = _axis(int(_attr(op.node, "axis", -1)), len(out))
    return Spec(
        "elementwise", out, (_identity(len(out)),), (_identity(len(out)),), frozenset({axis})
    )


def layernorm(op: Op, sm: ShardModel) -> Spec:
    """LayerNormalization: statistics over dims from ``axis`` on, which are never split."""
    x = sm.shapes[op.data_inputs[0]]
    axis = _axis(int(_attr(op.node, "axis", -1)), len(x))
    ins = tuple(_broadcast_map(sm.shapes[t], x) for t in op.data_inputs)
    outs = [_identity(len(x))]
    for t in op.outputs[1:]:
        outs.append(tuple(d if d < axis else None for d in range(len(sm.shapes[t]))))
    return Spec("elementwise", x, ins, tuple(outs), frozenset(range(axis, len(x))))


def batchnorm(op: Op, sm: ShardModel) -> Spec | None:
    """BatchNormalization (inference): per-channel scale and shift, every dim splits; the four
    per-channel parameters follow the channel split."""
    if len(op.outputs) != 1:
        return None
    x = sm.shapes[op.data_inputs[0]]
    ins = (_identity(len(x)), *[(1,)] * (len(op.data) - 1))
    return Spec("elementwise", x, ins, (_identity(len(x)),))


def reduce(op: Op, sm: ShardModel) -> Spec:
    """Reduce* along axes: a split reduced axis leaves partial sums (ReduceSum, ReduceMean),
    other reductions are not linear and keep their axes whole."""
    x = sm.shapes[op.data_inputs[0]]
    axes = _attr(op.node, "axes", None)
    if axes is None and len(op.node.input) > 1 and op.node.input[1]:
        axes = sm.consts[op.node.input[1]].tolist()
    if axes is None or len(axes) == 0:
        axes = list(range(len(x))) if not _attr(op.node, "noop_with_empty_axes", 0) else []
    axes = {_axis(int(a), len(x)) for a in axes}
    keep = int(_attr(op.node, "keepdims", 1))
    out = tuple(None if d in axes else d for d in range(len(x)) if keep or d not in axes)
    linear = op.op_type in ("ReduceSum", "ReduceMean")
    kind = "reducemean" if op.op_type == "ReduceMean" else "elementwise"
    return Spec(
        kind,
        x,
        (_identity(len(x)),),
        (out,),
        frozenset() if linear else frozenset(axes),
        frozenset(axes) if linear else frozenset(),
    )


def matmul(op: Op, sm: ShardModel) -> Spec | None:
    """MatMul: loops (batch..., i, k, j); a split k leaves partial sums."""
    a, b = (sm.shapes[t] for t in op.data_inputs)
    if len(a) < 2 or len(b) < 2:
        return None
    out = sm.shapes[op.outputs[0]]
    nb = len(out) - 2
    loops = (*out[:nb], a[-2], a[-1], b[-1])
    i, k, j = nb, nb + 1, nb + 2
    ina = (*_broadcast_map(a[:-2], out[:nb]), i, k)
    inb = (*_broadcast_map(b[:-2], out[:nb]), k, j)
    return Spec("plain", loops, (ina, inb), ((*range(nb), i, j),), partial=frozenset({k}))


def gemm(op: Op, sm: ShardModel) -> Spec:
    """Gemm: loops (i, k, j); the bias C is added once (on the first partial-sum device)."""
    a = sm.shapes[op.data_inputs[0]]
    b = sm.shapes[op.data_inputs[1]]
    ta, tb = int(_attr(op.node, "transA", 0)), int(_attr(op.node, "transB", 0))
    m, k = (a[1], a[0]) if ta else (a[0], a[1])
    n = b[0] if tb else b[1]
    ins = [(1, 0) if ta else (0, 1), (2, 1) if tb else (1, 2)]
    if len(op.data) > 2:
        c = sm.shapes[op.data_inputs[2]]
        ins.append(tuple(None if x is None else (0, 2)[x] for x in _broadcast_map(c, (m, n))))
    return Spec("bias_once", (m, k, n), tuple(ins), ((0, 2),), partial=frozenset({1}))


def conv(op: Op, sm: ShardModel) -> Spec:
    """Conv: batch and output channels split freely, input channels as a contraction (group 1);
    spatial dims stay whole."""
    x = sm.shapes[op.data_inputs[0]]
    w = sm.shapes[op.data_inputs[1]]
    ns = len(x) - 2
    spatial = tuple(range(3, 3 + ns))
    loops = (x[0], w[0], x[1], *x[2:])
    fixed = frozenset(spatial)
    if int(_attr(op.node, "group", 1)) != 1:
        ins = [(0, None, *spatial), (None,) * len(w)]
        if len(op.data) > 2:
            ins.append((None,))
        return Spec("plain", loops, tuple(ins), ((0, *[None] * (ns + 1)),), fixed)
    ins = [(0, 2, *spatial), (1, 2, *[None] * ns)]
    if len(op.data) > 2:
        ins.append((1,))
    return Spec("bias_once", loops, tuple(ins), ((0, 1, *[None] * ns),), fixed, frozenset({2}))


def pool(op: Op, sm: ShardModel) -> Spec:
    """Pooling (windowed or global): batch and channels split, spatial dims whole."""
    x = sm.shapes[op.data_inputs[0]]
    ns = len(x) - 2
    return Spec(
        "plain",
        x,
        ((0, 1, *range(2, 2 + ns)),),
        tuple((0, 1, *[None] * ns) for _ in op.outputs),
        frozenset(range(2, 2 + ns)),
    )


def reshape(op: Op, sm: ShardModel) -> Spec:
    """Reshape / Flatten / Squeeze / Unsqueeze: the layout follows the view where a split sits on
    the leading dim of a group of dims whose products match; other dims of the group stay whole."""
    x = sm.shapes[op.data_inputs[0]]
    y = sm.shapes[op.outputs[0]]
    xi = [d for d, s in enumerate(x) if s != 1]
    yi = [d for d, s in enumerate(y) if s != 1]
    out: list[int | None] = [None] * len(y)
    fixed = set()
    i = j = 0
    while i < len(xi) and j < len(yi):
        gi, gj = [xi[i]], [yi[j]]
        pi, pj = x[xi[i]], y[yi[j]]
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(xi[i])
                pi *= x[xi[i]]
            else:
                j += 1
                gj.append(yi[j])
                pj *= y[yi[j]]
        out[gj[0]] = gi[0]
        fixed.update(gi[1:])
        i += 1
        j += 1
    return Spec("reshape", x, (_identity(len(x)),), (tuple(out),), frozenset(fixed))


def transpose(op: Op, sm: ShardModel) -> Spec:
    """Transpose: output dim k is input dim perm[k]."""
    x = sm.shapes[op.data_inputs[0]]
    perm = _attr(op.node, "perm", None) or list(reversed(range(len(x))))
    return Spec("plain", x, (_identity(len(x)),), (tuple(int(p) for p in perm),))


def concat(op: Op, sm: ShardModel) -> Spec:
    """Concat: every dim but the concatenation axis splits alike."""
    out = sm.shapes[op.outputs[0]]
    axis = _axis(int(_attr(op.node, "axis", 0)), len(out))
    m = tuple(None if d == axis else d for d in range(len(out)))
    return Spec("plain", out, (m,) * len(op.data), (m,))


def split(op: Op, sm: ShardModel) -> Spec:
    """Split: every dim but the split axis splits alike."""
    x = sm.shapes[op.data_inputs[0]]
    axis = _axis(int(_attr(op.node, "axis", 0)), len(x))
    m = tuple(None if d == axis else d for d in range(len(x)))
    return Spec("plain", x, (m,), (m,) * len(op.outputs))


def slice_(op: Op, sm: ShardModel) -> Spec | None:
    """Slice: the sliced axes stay whole, the others split."""
    x = sm.shapes[op.data_inputs[0]]
    node = op.node
    if any(t and t not in sm.consts for t in node.input[1:]):
        return None
    if len(node.input) > 3 and node.input[3]:
        axes = {_axis(int(a), len(x)) for a in sm.consts[node.input[3]].tolist()}
    else:
        axes = set(range(len(sm.consts[node.input[1]])))
    m = tuple(None if d in axes else d for d in range(len(x)))
    return Spec("plain", x, (m,), (m,))


def gather(op: Op, sm: ShardModel) -> Spec:
    """Gather: split the indices (batch) freely; a split gathered axis (vocabulary) is a masked
    local lookup whose partial results are summed."""
    data, idx = (sm.shapes[t] for t in op.data_inputs)
    axis = _axis(int(_attr(op.node, "axis", 0)), len(data))
    rd = len(data)
    loops = (*data, *idx)
    ins = (_identity(rd), tuple(range(rd, rd + len(idx))))
    out = (*range(axis), *range(rd, rd + len(idx)), *range(axis + 1, rd))
    return Spec("gather", loops, ins, (out,), partial=frozenset({axis}))


RULES = {
    **dict.fromkeys(
        [
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Relu",
            "Gelu",
            "Erf",
            "Tanh",
            "Sigmoid",
            "Exp",
            "Log",
            "Sqrt",
            "Neg",
            "Abs",
            "Reciprocal",
            "LeakyRelu",
            "Elu",
            "Selu",
            "Softplus",
            "HardSigmoid",
            "HardSwish",
            "Clip",
            "Cast",
            "Where",
            "Identity",
            "Equal",
            "Less",
            "Greater",
            "Not",
            "And",
            "Or",
            "Max",
            "Min",
            "Sum",
            "Mean",
            "Floor",
            "Ceil",
            "Sign",
            "Sin",
            "Cos",
            "Mish",
        ],
        elementwise,
    ),
    **dict.fromkeys(["Softmax", "LogSoftmax", "Hardmax"], along_axis),
    "LayerNormalization": layernorm,
    "BatchNormalization": batchnorm,
    **dict.fromkeys(
        ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"], reduce
    ),
    "MatMul": matmul,
    "Gemm": gemm,
    "Conv": conv,
    **dict.fromkeys(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"], pool),
    **dict.fromkeys(["Reshape", "Flatten", "Squeeze", "Unsqueeze"], reshape),
    "Transpose": transpose,
    "Concat": concat,
    "Split": split,
    "Slice": slice_,
    "Gather": gather,
}


def replicated_spec(op: Op, sm: ShardModel) -> Spec:
    """Any other operator: every tensor whole on every device."""
    ins = tuple((None,) * len(sm.shapes[t]) for t in op.data_inputs)
    outs = tuple((None,) * len(sm.shapes[t]) for t in op.outputs)
    return Spec("replicated", (), ins, outs)


def op_spec(op: Op, sm: ShardModel) -> Spec:
    """The loop description of ``op`` (replicated when no rule applies)."""
    rule = RULES.get(op.op_type)
    if op.op_type == "Dropout" and len(op.outputs) == 1:
        rule = elementwise
    spec = rule(op, sm) if rule is not None and not op.node.domain else None
    return spec if spec is not None else replicated_spec(op, sm)


# ---------------------------------------------------------------------- strategies
def loops_of(spec: Spec, strategy: Strategy, op: Op, devices: int) -> tuple[int, ...]:
    """Loop splits from a strategy; raises :class:`StrategyError` naming the problem."""
    where = f"node {op.name!r} ({op.op_type})"
    if len(strategy) != len(spec.ins):
        raise StrategyError(
            f"{where}: the strategy has {len(strategy)} tuple(s) but the node has "
            f"{len(spec.ins)} data input(s); give one tuple per input, weights included"
        )
    splits: list[int | None] = [None] * len(spec.loops)
    for i, (dims, s) in enumerate(zip(spec.ins, strategy, strict=True)):
        if len(s) != len(dims):
            raise StrategyError(
                f"{where}: input {i} has rank {len(dims)} but its strategy {list(s)} has "
                f"{len(s)} entries"
            )
        for d, (loop, n) in enumerate(zip(dims, s, strict=True)):
            if not isinstance(n, int) or n < 1:
                raise StrategyError(f"{where}: input {i} dim {d}: a split must be an integer >= 1")
            if loop is None or loop in spec.fixed:
                if n != 1:
                    raise StrategyError(
                        f"{where}: input {i} dim {d} cannot be split by this operator; use 1"
                    )
                continue
            if splits[loop] is None:
                splits[loop] = n
            elif splits[loop] != n:
                raise StrategyError(
                    f"{where}: input {i} dim {d} is split {n} but the matching dim of another "
                    f"input is split {splits[loop]}; they must agree"
                )
    out = tuple(1 if s is None else s for s in splits)
    for size, n in zip(spec.loops, out, strict=True):
        if size % n:
            raise StrategyError(f"{where}: a split of {n} does not divide the dim of size {size}")
    if devices % math.prod(out):
        raise StrategyError(
            f"{where}: the strategy uses {math.prod(out)} devices, which does not divide the "
            f"{devices} devices"
        )
    return out


def strategy_of(spec: Spec, splits: tuple[int, ...]) -> Strategy:
    return tuple(tuple(1 if loop is None else splits[loop] for loop in dims) for dims in spec.ins)


def shard(op: Op, sm: ShardModel, spec: Spec, strategy: Strategy, devices: int) -> OpSharding:
    """Apply a strategy: device matrix, input and output layouts, local FLOPs."""
    splits = loops_of(spec, strategy, op, devices)
    rep = devices // math.prod(splits)
    dm = (*splits, rep) if rep > 1 else splits
    if not dm:
        dm = (devices,)

    def layout(shape, dims, partial=()) -> Layout:
        try:
            return Layout(
                tuple(shape),
                dm,
                tuple(() if lp is None or not spec.loops else (lp,) for lp in dims),
                partial,
            )
        except ValueError:
            raise StrategyError(
                f"node {op.name!r} ({op.op_type}): strategy {[list(s) for s in strategy]} gives "
                f"an output shape {tuple(shape)} its splits do not divide"
            ) from None

    ins = tuple(
        layout(sm.shapes[t], dims) for t, dims in zip(op.data_inputs, spec.ins, strict=True)
    )
    partial = tuple(sorted(lp for lp in spec.partial if splits[lp] > 1))
    outs = tuple(
        layout(sm.shapes[t], dims, partial) for t, dims in zip(op.outputs, spec.outs, strict=True)
    )
    local_in: list = [None] * len(op.node.input)
    for k, t in enumerate(op.node.input):
        if t:
            local_in[k] = sm.shapes.get(t, ())
    for k, lay in zip(op.data, ins, strict=True):
        local_in[k] = lay.local_shape
    flops = node_flops(op.node, local_in, [o.local_shape for o in outs])
    strategy = tuple(tuple(s) for s in strategy)
    return OpSharding(strategy, splits, dm, ins, outs, float(flops or 0), spec.kind)


def candidates(spec: Spec, devices: int) -> list[tuple[int, ...]]:
    """Every loop split (each a divisor of its loop and of the devices, product dividing the
    devices); the all-ones split first."""
    options = []
    for lp, size in enumerate(spec.loops):
        if lp in spec.fixed:
            options.append([1])
        else:
            options.append([n for n in range(1, devices + 1) if devices % n == 0 and size % n == 0])
    out = [c for c in itertools.product(*options) if devices % math.prod(c) == 0]
    return out


def data_parallel(spec: Spec, devices: int) -> tuple[int, ...] | None:
    """Split the loop of the first output's leading dim across all devices, if it can be."""
    if not spec.outs or not spec.outs[0]:
        return None
    lp = spec.outs[0][0]
    if lp is None or lp in spec.fixed or spec.loops[lp] % devices:
        return None
    return tuple(devices if i == lp else 1 for i in range(len(spec.loops)))
