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
- Quantized operators (int8 / uint8): MatMulInteger, ConvInteger, QLinearConv, QLinearMatMul,
  QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul and QAttention count their multiply-adds
  like the float operator (2 each), plus 2 per output element to rescale (QLinear*, QGemm,
  *ToFloat) and one per element for a bias. Their multiply-adds are the node's *integer FLOPs*
  (:func:`integer_flops`), which a cluster with an integer rate times at that rate.
  DynamicQuantizeLinear 4 per element (min and max, scale, round and clip); QuantizeLinear and
  DequantizeLinear 2 per element; the other QLinear* operators count as their float operator
  plus 2 per output element.
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
    # quantize: scale, round, add the zero point and clip; dequantize: subtract it and scale
    "QuantizeLinear": 2,
    "DequantizeLinear": 2,
    # min and max of the tensor (2), then scale and round-and-clip every element (2)
    "DynamicQuantizeLinear": 4,
}
REQUANTIZE = 2  # per output element of a quantized operator: scale, then the zero point
# onnxruntime's QLinear* element-wise operators: the float operator's FLOPs per output element
QLINEAR_ELEMENTWISE = {
    "QLinearAdd": 1,
    "QLinearMul": 1,
    "QLinearLeakyRelu": 2,
    "QLinearSigmoid": 4,
    "QLinearSoftmax": 5,
    "QLinearConcat": 0,
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
    from onnx import helper  # heavy: onnx (the front end's other modules load it on use too)

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _given(ins: list, i: int) -> bool:
    """Whether optional input ``i`` is present."""
    return len(ins) > i and ins[i] is not None


def _conv_macs(w: Shape, y: Shape) -> int:
    # weight [Cout, Cin/group, k...]: every output element is a dot product of Cin/group * k
    # (groups and dilations change the output shape, which shape inference already applied)
    return numel(y) * int(w[1]) * numel(w[2:])


def conv(node, ins: list, outs: list) -> float:
    bias = numel(outs[0]) if _given(ins, 2) else 0
    return 2.0 * _conv_macs(ins[1], outs[0]) + bias


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


# ---------------------------------------------------------------------- quantized operators
# Each counter below gives the multiply-adds done on integers (x 2); INTEGER_OPS maps an
# operator to it, and OPS adds what the operator does besides (bias, rescaling, softmax).
def conv_integer(node, ins: list, outs: list) -> float:
    """ConvInteger(x, w, x_zero_point, w_zero_point) and QLinearConv(x, x_scale, x_zp, w, ...):
    the multiply-adds of the convolution."""
    w = ins[3] if node.op_type == "QLinearConv" else ins[1]
    return 2.0 * _conv_macs(w, outs[0])


def matmul_integer(node, ins: list, outs: list) -> float:
    """MatMulInteger, QLinearMatMul, MatMulIntegerToFloat, DynamicQuantizeMatMul: A is the
    first input in all of them."""
    return matmul(node, ins, outs)


def qgemm_integer(node, ins: list, outs: list) -> float:
    """QGemm(A, a_scale, a_zp, B, b_scale, b_zp, C, y_scale, y_zp) (onnxruntime contrib)."""
    a = ins[0]
    k = int(a[0] if int(_attr(node, "transA", 0)) else a[1])
    return 2.0 * numel(outs[0]) * k


def qattention_integer(node, ins: list, outs: list) -> float:
    """QAttention's Q, K, V projection: input [B, S, In] times weight [In, 3H] in integers."""
    return 2.0 * numel(ins[0][:-1]) * numel(ins[1])


def contrib_attention(node, ins: list, outs: list) -> float:
    """onnxruntime's Attention / QAttention(input, weight, bias, ...): the Q, K, V projection,
    Q K^T, softmax (5 per score) and the product with V; a past state lengthens the keys."""
    b, s = int(ins[0][0]), int(ins[0][1])
    hidden = int(outs[0][-1])
    heads = int(_attr(node, "num_heads", 1))
    past_at = 8 if node.op_type == "QAttention" else 4
    past = ins[past_at] if _given(ins, past_at) else None  # [2, B, heads, P, head size]
    length = s + (int(past[3]) if past is not None and len(past) == 5 else 0)
    bias = b * s * numel(ins[2]) if _given(ins, 2) else 0
    project = 2.0 * numel(ins[0][:-1]) * numel(ins[1]) + bias
    scores = b * heads * s * length
    return project + 2.0 * scores * (2 * hidden // heads) + 5.0 * scores


INTEGER_OPS: dict[str, Callable] = {
    "MatMulInteger": matmul_integer,
    "ConvInteger": conv_integer,
    "QLinearConv": conv_integer,
    "QLinearMatMul": matmul_integer,
    "QGemm": qgemm_integer,
    "MatMulIntegerToFloat": matmul_integer,
    "DynamicQuantizeMatMul": matmul_integer,
    "QAttention": qattention_integer,
}


def qlinear_conv(node, ins: list, outs: list) -> float:
    bias = numel(outs[0]) if _given(ins, 8) else 0
    return conv_integer(node, ins, outs) + (REQUANTIZE * numel(outs[0])) + bias


def qlinear_matmul(node, ins: list, outs: list) -> float:
    return matmul_integer(node, ins, outs) + REQUANTIZE * numel(outs[0])


def qgemm(node, ins: list, outs: list) -> float:
    bias = numel(outs[0]) if _given(ins, 6) else 0
    return qgemm_integer(node, ins, outs) + REQUANTIZE * numel(outs[0]) + bias


def matmul_integer_to_float(node, ins: list, outs: list) -> float:
    """MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zp, b_zp, bias): rescaled to float."""
    bias = numel(outs[0]) if _given(ins, 6) else 0
    return matmul_integer(node, ins, outs) + REQUANTIZE * numel(outs[0]) + bias


def dynamic_quantize_matmul(node, ins: list, outs: list) -> float:
    """DynamicQuantizeMatMul(A, B, b_scale, b_zp, bias): quantizes A as DynamicQuantizeLinear
    does, multiplies in integers, rescales to float."""
    bias = numel(outs[0]) if _given(ins, 4) else 0
    quantize = PER_ELEMENT_OUT["DynamicQuantizeLinear"] * numel(ins[0])
    return quantize + matmul_integer(node, ins, outs) + REQUANTIZE * numel(outs[0]) + bias


def qlinear_pool(node, ins: list, outs: list) -> float:
    """QLinearAveragePool / QLinearGlobalAveragePool: the float pool, then requantized."""
    if node.op_type == "QLinearGlobalAveragePool":
        work = global_pool(node, ins, outs)
    else:
        work = pool(node, ins, outs)
    return work + REQUANTIZE * numel(outs[0])


def qlinear_elementwise(node, ins: list, outs: list) -> float:
    return float((QLINEAR_ELEMENTWISE[node.op_type] + REQUANTIZE) * numel(outs[0]))


OPS: dict[str, Callable] = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "MatMul": matmul,
    "MatMulInteger": matmul_integer,
    "ConvInteger": conv_integer,
    "QLinearConv": qlinear_conv,
    "QLinearMatMul": qlinear_matmul,
    "QGemm": qgemm,
    "MatMulIntegerToFloat": matmul_integer_to_float,
    "DynamicQuantizeMatMul": dynamic_quantize_matmul,
    "MatMulNBits": matmul,  # contrib, 4-bit weights: A [..., K] is float, B packed
    "QAttention": contrib_attention,
    "QLinearAveragePool": qlinear_pool,
    "QLinearGlobalAveragePool": qlinear_pool,
    **dict.fromkeys(QLINEAR_ELEMENTWISE, qlinear_elementwise),
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
    if op == "Attention" and node.domain == "com.microsoft":  # not the opset-23 Attention
        return contrib_attention(node, ins, outs)
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


# float matrix operators that a runtime runs in integers when both operands come from
# DequantizeLinear (the QDQ format of onnxruntime's static quantization)
DEQUANTIZED_MATRIX_OPS: dict[str, Callable] = {
    "Conv": conv_integer,
    "MatMul": matmul_integer,
    "Gemm": qgemm_integer,
}


def integer_flops(node, ins: list, outs: list, dequantized: bool = False) -> float:
    """The part of :func:`node_flops` done on integers: the multiply-adds of the quantized
    matrix operators in :data:`INTEGER_OPS`, and of a Conv / MatMul / Gemm whose two operands
    are ``dequantized`` (both made by DequantizeLinear); 0 for every other operator."""
    counter = INTEGER_OPS.get(node.op_type)
    if counter is None and dequantized:
        counter = DEQUANTIZED_MATRIX_OPS.get(node.op_type)
    return 0.0 if counter is None else float(counter(node, ins, outs))
