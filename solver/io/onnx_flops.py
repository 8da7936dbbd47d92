"""FLOPs of one ONNX operator from its attributes and inferred shapes (a multiply-add = 2 FLOPs).

Conventions (documented in docs/onnx.md):

- Conv / ConvTranspose / MatMul / Gemm / Einsum / Attention: 2 per multiply-add, plus one per
  output element for a bias (Gemm: one more per element when C is given).
- Normalisations per element: BatchNormalization 2 (inference: scale and shift),
  LayerNormalization 8, InstanceNormalization 8, GroupNormalization 8,
  LRN (size + 3) per element; Softmax / LogSoftmax 5 per element.
- Pooling: one per window element and output element; global pooling one per input element.
- Reductions: one per input element. Element-wise arithmetic: one per output element
  (variadic Sum/Max/Min/Mean: (inputs - 1) per element); transcendental activations a few
  (table below). Data movement (Reshape, Transpose, Gather, Concat, Slice, Cast, ...) is 0.
- Unknown operators count 0 and are reported once by the importer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Shape = Sequence[int]


def numel(shape: Shape | None) -> int:
    """Number of elements of a fully known shape (1 for a scalar)."""
    if shape is None:
        return 0
    return int(math.prod(int(d) for d in shape))


# element-wise: FLOPs per output element
ELEMENTWISE = {
    "Add": 1,
    "Sub": 1,
    "Mul": 1,
    "Div": 1,
    "Pow": 1,
    "Mod": 1,
    "Neg": 1,
    "Abs": 1,
    "Reciprocal": 1,
    "Floor": 1,
    "Ceil": 1,
    "Round": 1,
    "Sign": 1,
    "Relu": 1,
    "LeakyRelu": 2,
    "PRelu": 2,
    "Clip": 2,
    "Max": 1,
    "Min": 1,
    "Equal": 1,
    "Less": 1,
    "Greater": 1,
    "LessOrEqual": 1,
    "GreaterOrEqual": 1,
    "And": 1,
    "Or": 1,
    "Xor": 1,
    "Not": 1,
    "Where": 1,
    "BitShift": 1,
    "Sqrt": 4,
    "Exp": 4,
    "Log": 4,
    "Sin": 4,
    "Cos": 4,
    "Tan": 4,
    "Erf": 4,
    "Sigmoid": 4,
    "HardSigmoid": 3,
    "Tanh": 4,
    "Softplus": 4,
    "Softsign": 3,
    "Elu": 4,
    "Selu": 4,
    "Celu": 4,
    "ThresholdedRelu": 1,
    "HardSwish": 4,
    "Gelu": 8,
    "Mish": 8,
    "Swish": 5,
    "IsNaN": 1,
    "IsInf": 1,
    "Asin": 4,
    "Acos": 4,
    "Atan": 4,
    "Sinh": 4,
    "Cosh": 4,
    "Asinh": 4,
    "Acosh": 4,
    "Atanh": 4,
}
VARIADIC = {"Sum", "Mean", "Max", "Min"}
REDUCE = {
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ArgMax",
    "ArgMin",
    "CumSum",
}
PER_ELEMENT_OUT = {
    "BatchNormalization": 2,
    "LayerNormalization": 8,
    "InstanceNormalization": 8,
    "GroupNormalization": 8,
    "Softmax": 5,
    "LogSoftmax": 5,
    "Hardmax": 2,
    "MeanVarianceNormalization": 8,
    "SimplifiedLayerNormalization": 6,
    "RMSNormalization": 6,
    "SkipLayerNormalization": 9,
}
ZERO = {
    "Reshape",
    "Transpose",
    "Gather",
    "GatherElements",
    "GatherND",
    "Concat",
    "Split",
    "Slice",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Identity",
    "Dropout",
    "Cast",
    "CastLike",
    "Expand",
    "Tile",
    "Pad",
    "Shape",
    "Size",
    "Constant",
    "ConstantOfShape",
    "ScatterND",
    "ScatterElements",
    "Scatter",
    "DepthToSpace",
    "SpaceToDepth",
    "Range",
    "NonZero",
    "OneHot",
    "Trilu",
    "EyeLike",
    "Compress",
    "ReverseSequence",
    "QuantizeLinear",
    "DequantizeLinear",
    "TopK",
    "Unique",
    "Optional",
    "OptionalGetElement",
    "OptionalHasElement",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceInsert",
    "SequenceLength",
    "SplitToSequence",
    "ConcatFromSequence",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "NonMaxSuppression",
    "CenterCropPad",
    # control flow: the importer treats each body as one opaque node and says so
    "If",
    "Loop",
    "Scan",
}


def _attr(node, name: str, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def conv(node, ins: list, outs: list) -> float:
    w, y = ins[1], outs[0]
    # weight [Cout, Cin/group, k...]: every output element is a dot product of Cin/group * k
    # (groups and dilations change the output shape, which shape inference already applied)
    macs = numel(y) * int(w[1]) * numel(w[2:])
    bias = numel(y) if len(ins) > 2 and ins[2] is not None else 0
    return 2.0 * macs + bias


def conv_transpose(node, ins: list, outs: list) -> float:
    x, w = ins[0], ins[1]
    # weight [Cin, Cout/group, k...]: every input element meets Cout/group * k weights
    macs = numel(x) * int(w[1]) * numel(w[2:])
    bias = numel(outs[0]) if len(ins) > 2 and ins[2] is not None else 0
    return 2.0 * macs + bias


def matmul(node, ins: list, outs: list) -> float:
    # A [..., M, K] x B [..., K, N] (broadcast batch; 1-D operands allowed): K MACs per output
    return 2.0 * numel(outs[0]) * int(ins[0][-1])


def gemm(node, ins: list, outs: list) -> float:
    a = ins[0]
    trans_a = int(_attr(node, "transA", 0))
    k = int(a[0] if trans_a else a[1])
    extra = numel(outs[0]) if len(ins) > 2 and ins[2] is not None else 0
    return 2.0 * numel(outs[0]) * k + extra


def _labels(term: str, rank: int) -> list[str]:
    """Index labels of one einsum operand; ellipsis dims get labels aligned from the right."""
    if "..." not in term:
        return list(term)
    pre, post = term.split("...")
    n = rank - len(pre) - len(post)
    return list(pre) + [f".{n - 1 - i}" for i in range(n)] + list(post)


def einsum(node, ins: list, outs: list) -> float:
    eq = _attr(node, "equation", b"")
    eq = (eq.decode() if isinstance(eq, bytes) else str(eq)).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    size: dict[str, int] = {}
    for term, shape in zip(terms, ins, strict=False):
        for lab, d in zip(_labels(term, len(shape)), shape, strict=True):
            size[lab] = max(size.get(lab, 1), int(d))
    if arrow:
        out = set(_labels(rhs, len(outs[0])))
    else:  # implicit output: labels that appear once, plus the ellipsis
        letters = [c for c in lhs if c.isalpha()]
        out = {c for c in letters if letters.count(c) == 1} | {x for x in size if x[0] == "."}
    summed = any(lab not in out for lab in size)
    return float(numel(list(size.values())) * max(1, len(terms) - 1) * (2 if summed else 1))


def attention(node, ins: list, outs: list) -> float:
    """ONNX Attention (opset 23): Q K^T, softmax, times V."""
    q, k, v = ins[0], ins[1], ins[2]
    if len(q) == 4:  # [B, H, S, D]
        b, h, s, d = (int(x) for x in q)
        length = int(k[2])
        dv = int(v[3])
    else:  # [B, S, H*D] with q_num_heads
        heads = int(_attr(node, "q_num_heads", 1))
        b, s = int(q[0]), int(q[1])
        h, d = heads, int(q[2]) // heads
        length = int(k[1])
        kv_heads = int(_attr(node, "kv_num_heads", heads))
        dv = int(v[2]) // kv_heads
    return 2.0 * b * h * s * length * (d + dv) + 5.0 * b * h * s * length


def pool(node, ins: list, outs: list) -> float:
    k = _attr(node, "kernel_shape", [])
    return float(numel(outs[0]) * max(1, numel(k)))


def global_pool(node, ins: list, outs: list) -> float:
    return float(numel(ins[0]))


def resize(node, ins: list, outs: list) -> float:
    mode = _attr(node, "mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    spatial = max(0, len(outs[0]) - 2)
    per = {"nearest": 0, "linear": 2 * 2**spatial, "cubic": 2 * 4**spatial}.get(mode, 0)
    return float(numel(outs[0]) * per)


def lrn(node, ins: list, outs: list) -> float:
    return float(numel(outs[0]) * (int(_attr(node, "size", 1)) + 3))


def rnn_like(node, ins: list, outs: list) -> float:
    """RNN/GRU/LSTM: gates x (input + hidden) x hidden per step and direction."""
    x, w = ins[0], ins[1]  # X [S, B, I], W [D, G*H, I]
    seq, batch = int(x[0]), int(x[1])
    directions, gh, inp = int(w[0]), int(w[1]), int(w[2])
    hidden = int(_attr(node, "hidden_size", 1))
    return 2.0 * seq * batch * directions * gh * (inp + hidden)


OPS: dict[str, Callable] = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "MatMul": matmul,
    "MatMulInteger": matmul,
    "Gemm": gemm,
    "Einsum": einsum,
    "Attention": attention,
    "MaxPool": pool,
    "AveragePool": pool,
    "LpPool": pool,
    "GlobalAveragePool": global_pool,
    "GlobalMaxPool": global_pool,
    "GlobalLpPool": global_pool,
    "Resize": resize,
    "Upsample": resize,
    "LRN": lrn,
    "RNN": rnn_like,
    "GRU": rnn_like,
    "LSTM": rnn_like,
}


def node_flops(node, ins: list, outs: list) -> float | None:
    """FLOPs of ``node`` given input and output shapes (None entries for absent inputs).

    Returns None for an operator this table does not know (the caller counts it as 0 and
    warns once).
    """
    op = node.op_type
    if op in OPS:
        return float(OPS[op](node, ins, outs))
    if op in VARIADIC and len([s for s in ins if s is not None]) != 1:
        n_in = len([s for s in ins if s is not None])
        return float(max(1, n_in - 1) * numel(outs[0]))
    if op in ELEMENTWISE:
        return float(ELEMENTWISE[op] * numel(outs[0]))
    if op in REDUCE:
        return float(numel(ins[0]))
    if op in PER_ELEMENT_OUT:
        return float(PER_ELEMENT_OUT[op] * numel(outs[0]))
    if op in ZERO:
        return 0.0
    return None
