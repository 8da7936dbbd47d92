"""Training costs of ONNX operators: each cost node's backward work and its stash.

A training plan (docs/training.md) reads two per-node quantities the forward graph does not
have: ``work_backward`` (seconds of the node's backward) and ``stash`` (bytes the node keeps
per in-flight microbatch until its backward runs). For an ONNX model they come from the
table :data:`RULES`, one entry per operator kind (docs/training.md, "Backward costs of ONNX
operators", lists it with the reasons):

- **factor**: the backward's work as a multiple of the forward's (the node's forward work,
  whatever the work model: roofline, FLOPs or measured, is scaled by it). For the bilinear
  operators (MatMul, Gemm, Conv, ConvTranspose, Einsum, Mul) the factor is *one per operand
  that needs a gradient*: Y = A B has dA = dY B^T and dB = A^T dY, each a product of the forward's
  size (Narayanan et al. SC'21, "backward = 2 x forward"; Kaplan et al. 2020, 6 N FLOPs per
  token for training = 2 N forward + 4 N backward), so x W costs 2 x the forward and a product
  whose activation operand needs no gradient (the first layer on a model input) 1 x. For
  element-wise operators, normalisations and softmax the factor is the backward's FLOPs per
  element (counted below, in the conventions of :mod:`solver.frontends.onnx.flops`) over the
  forward's; data movement moves the same bytes back (1 x).
- **stash**: which tensors the backward reads. ``inputs`` names input positions (kept when
  they are activations: stored weights are parameters, counted once as such, and stored
  constants are not per microbatch), ``output`` keeps the node's outputs (ReLU, sigmoid, tanh,
  exp, softmax keep their output, as PyTorch's autograd saves ``result``). A bilinear
  operator keeps each activation operand whose *other* operand needs a gradient (dB needs A).

Rules that apply to every node, before the table:

- a node needs a backward only when a gradient flows through it: one of its inputs is a
  stored floating-point weight, or is made by a node that needs one, and one of its outputs is
  floating point. Model inputs, shape arithmetic (Shape, Gather of indices, Cast to integers),
  comparisons, operators without a gradient (Floor, ArgMax: their consumers get none either)
  and constant-folding leftovers (masks, rotary tables computed from positions)
  get 0 and stash nothing;
- a tensor is stashed once, by the first node (in model order) whose backward reads it (the
  three projections of attention read one activation, which is kept once);
- operators without a rule get the graph's defaults (2 x work, the output bytes) and are
  reported in the graph's hints (``backward_unknown_ops``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from solver.core.graph import Graph

# TensorProto element types that carry gradients: FLOAT, FLOAT16, DOUBLE, BFLOAT16, the four
# FLOAT8 types and FLOAT4E2M1 (onnx.proto's numbering; numbers, so that onnx is not imported)
FLOATING = frozenset({1, 10, 11, 16, 17, 18, 19, 20, 23})

DEFAULT_FACTOR = 2.0  # the graph's default (core.graph.Graph.backward_work) for unknown ops


@dataclass(frozen=True)
class Operand:
    """One input or output of a cost node, as the table sees it: ``tensor`` is the tensor's
    name once views are looked through ('' for an absent optional input), ``producer`` the
    cost node that makes it (-1 for a stored constant or weight), ``weight`` whether it is a
    stored floating-point weight (a parameter, so it has a gradient)."""

    tensor: str
    nbytes: float
    floating: bool
    producer: int = -1
    weight: bool = False


@dataclass(frozen=True)
class OpCall:
    """A cost node: its operator and its operands by ONNX position (``outputs``: the used
    ones). Model inputs are ``OpCall("Input", (), (their tensor,))``."""

    op_type: str
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]


@dataclass(frozen=True)
class BackwardRule:
    """One table entry: ``factor`` (backward work / forward work; with ``per_operand`` the
    factor counts once for each of the operands at ``operands`` that needs a gradient),
    the stashed ``inputs`` (positions; None: every input) and ``output``, and ``why``."""

    factor: float
    inputs: tuple[int, ...] | None = ()
    output: bool = False
    per_operand: bool = False
    operands: tuple[int, ...] | None = (0, 1)
    why: str = ""


@dataclass
class BackwardCosts:
    """Per cost node: ``factor`` (backward work = factor x forward work) and ``stash``
    (bytes per in-flight microbatch); ``unknown_ops`` counts operators without a rule."""

    factor: np.ndarray
    stash: np.ndarray
    unknown_ops: dict[str, int] = field(default_factory=dict)


RULES: dict[str, BackwardRule] = {}


def register(ops: tuple[str, ...], rule: BackwardRule) -> None:
    """Give every operator in ``ops`` the rule ``rule``."""
    for op in ops:
        RULES[op] = rule


# ---- the table (docs/training.md lists it; forward FLOPs per element from flops.py)
NO_GRADIENT = BackwardRule(0.0, why="no gradient: integer, boolean or shape results")
register(
    (
        "Input",
        "Shape",
        "Size",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
        "Not",
        "BitShift",
        "IsNaN",
        "IsInf",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "ArgMax",
        "ArgMin",
        "NonZero",
        "Range",
        "ConstantOfShape",
        "OneHot",
        "EyeLike",
        "Unique",
        "NonMaxSuppression",
        "Hardmax",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "MatMulInteger",
        "ConvInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QAttention",
        "DynamicQuantizeLinear",
    ),
    NO_GRADIENT,
)
register(
    ("MatMul", "Gemm", "Conv", "ConvTranspose", "MatMulNBits"),
    BackwardRule(1.0, per_operand=True, why="dA = dY B^T, dB = A^T dY: one product each"),
)
register(
    ("Einsum",),
    BackwardRule(1.0, per_operand=True, operands=None, why="one contraction per operand"),
)
register(
    ("Attention",),
    BackwardRule(
        2.5, inputs=(0, 1, 2), output=True, why="FlashAttention-2: backward 2.5 x forward"
    ),
)
register(
    ("RNN", "GRU", "LSTM"),
    BackwardRule(2.0, inputs=(0,), output=True, why="input and weight gradients per step"),
)
# element-wise arithmetic (forward 1 per element)
register(
    ("Add", "Sub", "Neg", "Sum", "Mean", "Identity"),
    BackwardRule(1.0, why="the gradient passes through (summed over broadcast dims)"),
)
register(("Mul",), BackwardRule(1.0, per_operand=True, why="dA = dY B, dB = dY A"))
register(("Div",), BackwardRule(3.0, inputs=(0, 1), why="dA = dY / B, dB = -dA A / B"))
register(("Pow",), BackwardRule(3.0, inputs=(0, 1), why="dA = dY B A^(B-1)"))
register(("Max", "Min"), BackwardRule(2.0, inputs=(0, 1), why="a mask per operand"))
register(("Reciprocal",), BackwardRule(2.0, output=True, why="dX = -dY Y^2"))
register(("Abs",), BackwardRule(2.0, inputs=(0,), why="dX = dY sign(X)"))
register(("Where",), BackwardRule(2.0, inputs=(0,), why="dY selected into both branches"))
# activations
register(("Relu",), BackwardRule(1.0, output=True, why="dX = dY [Y > 0] (forward 1)"))
register(
    ("LeakyRelu", "Clip", "ThresholdedRelu"),
    BackwardRule(1.0, inputs=(0,), why="a select per element, as the forward"),
)
register(("PRelu",), BackwardRule(2.0, inputs=(0,), why="dX and the slope's gradient"))
register(("Sigmoid", "Tanh"), BackwardRule(0.75, output=True, why="dY Y (1 - Y): 3 vs 4"))
register(("Exp",), BackwardRule(0.25, output=True, why="dX = dY Y: 1 vs 4"))
register(("Sqrt",), BackwardRule(0.5, output=True, why="dX = dY / (2 Y): 2 vs 4"))
register(("Log",), BackwardRule(0.25, inputs=(0,), why="dX = dY / X: 1 vs 4"))
register(
    (
        "Erf",
        "Sin",
        "Cos",
        "Tan",
        "Softplus",
        "Softsign",
        "Elu",
        "Selu",
        "Celu",
        "HardSigmoid",
        "HardSwish",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
    ),
    BackwardRule(1.0, inputs=(0,), why="the derivative is one expression like the forward"),
)
register(
    ("Gelu", "Swish", "Mish"),
    BackwardRule(1.5, inputs=(0,), why="recomputes the gate, then its derivative"),
)
# normalisations and softmax: backward FLOPs per element / forward FLOPs per element
register(
    ("Softmax",),
    BackwardRule(0.8, output=True, why="Y (dY - sum(dY Y)): 4 per element vs 5"),
)
register(
    ("LogSoftmax",),
    BackwardRule(1.4, output=True, why="dY - exp(Y) sum(dY): 7 vs 5"),
)
register(
    (
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "MeanVarianceNormalization",
    ),
    BackwardRule(13 / 8, inputs=(0,), why="x-hat again 2, dgamma 2, dbeta 1, dX 8: 13 vs 8"),
)
register(
    ("RMSNormalization", "SimplifiedLayerNormalization"),
    BackwardRule(1.5, inputs=(0,), why="x-hat again 1, dgamma 2, dX 6: 9 vs 6"),
)
register(
    ("SkipLayerNormalization",),
    BackwardRule(13 / 9, inputs=(0, 1), why="the layer norm's 13 (the skip passes) vs 9"),
)
register(
    ("BatchNormalization",),
    BackwardRule(6.5, inputs=(0,), why="the layer norm's 13 vs the inference forward's 2"),
)
register(("LRN",), BackwardRule(2.0, inputs=(0,), output=True, why="the window sum again"))
# reductions (forward 1 per input element)
register(
    ("ReduceSum", "ReduceMean", "CumSum", "ReduceLogSum"),
    BackwardRule(1.0, why="dY broadcast back over the reduced dims"),
)
register(
    ("ReduceMax", "ReduceMin"),
    BackwardRule(1.0, inputs=(0,), output=True, why="dY routed to the extreme"),
)
register(
    ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceProd"),
    BackwardRule(2.0, inputs=(0,), output=True, why="dY times the derivative per element"),
)
register(
    ("ReduceLogSumExp",),
    BackwardRule(6.0, inputs=(0,), output=True, why="dY exp(X - Y): 6 vs 1"),
)
# pooling and resampling
register(
    ("MaxPool", "GlobalMaxPool", "LpPool", "GlobalLpPool"),
    BackwardRule(1.0, inputs=(0,), why="dY scattered to the window's maximum"),
)
register(
    ("AveragePool", "GlobalAveragePool", "Resize", "Upsample"),
    BackwardRule(1.0, why="the adjoint spreads dY over the window"),
)
# data movement: the gradient moves the same bytes back
register(
    (
        "Transpose",
        "Concat",
        "Split",
        "Slice",
        "Expand",
        "Tile",
        "Pad",
        "Cast",
        "CastLike",
        "DepthToSpace",
        "SpaceToDepth",
        "Trilu",
        "ReverseSequence",
        "CenterCropPad",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "QuantizeLinear",
        "DequantizeLinear",
    ),
    BackwardRule(1.0, why="the gradient moves the same bytes back"),
)
register(
    ("Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Scatter", "Compress"),
    BackwardRule(1.0, inputs=(1,), why="dY scattered (gathered) by the stored indices"),
)
register(("TopK", "Dropout"), BackwardRule(1.0, output=True, why="dY routed by the indices"))


def backward_costs(calls: list[OpCall]) -> BackwardCosts:
    """The factor and the stash of every cost node (``calls`` in model order, so every
    producer comes before its consumers)."""
    n = len(calls)
    factor, stash = np.zeros(n), np.zeros(n)
    grad = np.zeros(n, dtype=bool)
    stashed: set[str] = set()
    unknown: dict[str, int] = defaultdict(int)
    for i, call in enumerate(calls):
        rule = RULES.get(call.op_type)
        # an operator without a gradient (Floor, ArgMax, ...) also stops it for its consumers
        grad[i] = rule is not NO_GRADIENT and _needs_backward(call, grad)
        if not grad[i]:
            continue
        if rule is None:
            unknown[call.op_type] += 1
            factor[i] = DEFAULT_FACTOR
            kept = list(call.outputs)
        else:
            factor[i] = rule.factor * _operands_with_gradient(call, rule, grad)
            kept = _kept(call, rule, grad)
        for t in kept:
            if t.tensor and t.tensor not in stashed:
                stashed.add(t.tensor)
                stash[i] += t.nbytes
    return BackwardCosts(factor, stash, dict(unknown))


def _has_gradient(t: Operand, grad: np.ndarray) -> bool:
    """Whether a gradient is computed for ``t``: a weight, or made by a node with a backward."""
    return t.floating and (t.weight or (t.producer >= 0 and bool(grad[t.producer])))


def _needs_backward(call: OpCall, grad: np.ndarray) -> bool:
    """A gradient flows through the node: into a floating output, out to an input that has
    one (the first rule of the module docstring)."""
    floating_out = any(t.floating for t in call.outputs)
    return floating_out and any(_has_gradient(t, grad) for t in call.inputs)


def _operands_with_gradient(call: OpCall, rule: BackwardRule, grad: np.ndarray) -> int:
    """1, or for a per-operand rule the number of its operands that need a gradient."""
    if not rule.per_operand:
        return 1
    present = [bool(t.tensor) for t in call.inputs]
    return sum(_has_gradient(call.inputs[j], grad) for j in _positions(present, rule.operands))


def _kept(call: OpCall, rule: BackwardRule, grad: np.ndarray) -> list[Operand]:
    """The tensors the backward of ``call`` reads: activations only (``producer`` >= 0)."""
    present = [bool(t.tensor) for t in call.inputs]
    needs = [_has_gradient(t, grad) for t in call.inputs]
    kept = [call.inputs[j] for j in kept_positions(rule, present, needs)]
    kept = [t for t in kept if t.producer >= 0]
    return kept + (list(call.outputs) if rule.output else [])


def kept_positions(rule: BackwardRule, present, needs_gradient) -> list[int]:
    """The input positions whose tensors the backward of a node under ``rule`` reads (the
    stash rule; the sharding planner's stash uses it too): ``present[j]``, the node has input
    j; ``needs_gradient[j]``, that input needs a gradient. A per-operand rule keeps an operand
    when another of its operands needs a gradient (dB = A^T dY keeps A), any other rule its
    ``inputs``."""
    if rule.per_operand:
        ops = _positions(present, rule.operands)
        return [j for j in ops if any(needs_gradient[o] for o in ops if o != j)]
    return _positions(present, rule.inputs)


def _positions(present, positions: tuple[int, ...] | None) -> list[int]:
    """The given input positions that the node has (None: all of them)."""
    wanted = range(len(present)) if positions is None else positions
    return [j for j in wanted if j < len(present) and present[j]]


def rescaled_backward(table_graph: Graph, timed: Graph) -> Graph:
    """``timed`` (the graph of ``table_graph`` with other work, e.g. measured) with each
    node's backward work at the factor the table gave it (``table_graph``'s backward work /
    its work; a node of zero work there keeps 0). Unchanged when there are no training
    costs."""
    if table_graph.work_backward is None:
        return timed
    before = table_graph.work
    factor = np.divide(
        table_graph.work_backward, before, out=np.zeros_like(before), where=before > 0
    )
    return replace(timed, work_backward=factor * timed.work)
