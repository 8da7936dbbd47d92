"""Quantized ONNX models: FLOPs and bytes of the integer and (de)quantize operators, and the
integer rate of a cluster that states one (``int8_compute``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from solver.core.cluster import Cluster, cluster_from_dict
from solver.core.errors import MtppError
from solver.frontends import load_graph
from solver.frontends.onnx.modelgen import save, vit

F, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8
RNG = np.random.default_rng(7)
SCALE = np.float32(0.05)


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name, values):
    return numpy_helper.from_array(np.asarray(values), name)


def ints(name, shape, dtype=np.int8):
    """Random integer weights of ``dtype`` (never constant ones)."""
    lo = 0 if dtype == np.uint8 else -8
    return const(name, RNG.integers(lo, 8, shape).astype(dtype))


def floats(name, shape):
    return const(name, RNG.standard_normal(shape).astype(np.float32))


def one_node(tmp_path, node, inputs, inits, out_shape, out_type=F, cluster=None):
    """Import a one-node model; the graph and the index of that node."""
    graph = helper.make_graph([node], "g", inputs, [vi("y", out_shape, out_type)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unknown operator would warn
        g = load_graph(path, work="flops", cluster=cluster)
    return g, g.names.index(node.name)


# ---------------------------------------------------------------- one operator each
def q_params(prefix: str, zero_type=np.uint8) -> list:
    return [const(f"{prefix}_s", SCALE), const(f"{prefix}_z", zero_type(3))]


CASES = {
    # A [2, 3, 4] x B [4, 5]: 2 x 30 outputs x K=4 multiply-adds, all on integers
    "MatMulInteger": (
        helper.make_node("MatMulInteger", ["a", "b", "a_z"], ["y"], name="n"),
        [vi("a", [2, 3, 4], U8)],
        [ints("b", [4, 5]), const("a_z", np.uint8(3))],
        ([2, 3, 5], TensorProto.INT32),
        240,
        240,
    ),
    # x [1, 3, 5, 5] * w [4, 3, 3, 3], pads 1: 100 outputs x 27; zero points are no bias
    "ConvInteger": (
        helper.make_node("ConvInteger", ["x", "w", "x_z", "w_z"], ["y"], name="n", pads=[1] * 4),
        [vi("x", [1, 3, 5, 5], U8)],
        [ints("w", [4, 3, 3, 3]), const("x_z", np.uint8(3)), const("w_z", np.int8(0))],
        ([1, 4, 5, 5], TensorProto.INT32),
        5400,
        5400,
    ),
    # the same convolution, + 100 for the bias, + 2 x 100 to requantize the outputs
    "QLinearConv": (
        helper.make_node(
            "QLinearConv",
            ["x", "x_s", "x_z", "w", "w_s", "w_z", "y_s", "y_z", "bias"],
            ["y"],
            name="n",
            pads=[1] * 4,
        ),
        [vi("x", [1, 3, 5, 5], U8)],
        [*q_params("x"), ints("w", [4, 3, 3, 3]), *q_params("w", np.int8), *q_params("y")]
        + [const("bias", RNG.integers(-9, 9, 4).astype(np.int32))],
        ([1, 4, 5, 5], U8),
        5400 + 100 + 200,
        5400,
    ),
    # [3, 4] x [4, 5]: 2 x 15 x 4, + 2 x 15 to requantize
    "QLinearMatMul": (
        helper.make_node(
            "QLinearMatMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"], name="n"
        ),
        [vi("a", [3, 4], U8)],
        [*q_params("a"), ints("b", [4, 5]), *q_params("b", np.int8), *q_params("y")],
        ([3, 5], U8),
        120 + 30,
        120,
    ),
    # min/max, scale, round-and-clip: 4 per element of [2, 8]
    "DynamicQuantizeLinear": (
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="n"),
        [vi("x", [2, 8])],
        [],
        ([2, 8], U8),
        64,
        0,
    ),
    "QuantizeLinear": (
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["y"], name="n"),
        [vi("x", [2, 8])],
        q_params("x"),
        ([2, 8], U8),
        32,
        0,
    ),
    "DequantizeLinear": (
        helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["y"], name="n"),
        [vi("x", [2, 8], I8)],
        q_params("x", np.int8),
        ([2, 8], F),
        32,
        0,
    ),
    # onnxruntime contrib: A [3, 4] x B^T with B [5, 4]: 120, bias 15, requantize 30
    "QGemm": (
        helper.make_node(
            "QGemm",
            ["a", "a_s", "a_z", "b", "b_s", "b_z", "c", "y_s", "y_z"],
            ["y"],
            name="n",
            domain="com.microsoft",
            transB=1,
        ),
        [vi("a", [3, 4], U8)],
        [*q_params("a"), ints("b", [5, 4]), *q_params("b", np.int8)]
        + [const("c", RNG.integers(-9, 9, 5).astype(np.int32)), *q_params("y")],
        ([3, 5], U8),
        120 + 15 + 30,
        120,
    ),
    # input [1, 4, 8] x weight [8, 24] (Q, K, V; 2 heads of 4): projection 2 x 4 x 8 x 24 on
    # integers, bias 4 x 24, scores 2 heads x 4 x 4 = 32: 2 x 32 x (4 + 4) and softmax 5 x 32
    "QAttention": (
        helper.make_node(
            "QAttention",
            ["x", "w", "bias", "x_s", "w_s", "", "x_z", "w_z"],
            ["y"],
            name="n",
            domain="com.microsoft",
            num_heads=2,
        ),
        [vi("x", [1, 4, 8], U8)],
        [ints("w", [8, 24], np.uint8), floats("bias", [24]), const("x_s", SCALE)]
        + [const("w_s", SCALE), const("x_z", np.uint8(3)), const("w_z", np.uint8(2))],
        ([1, 4, 8], F),
        1536 + 96 + 512 + 160,
        1536,
    ),
    # the float contrib Attention of the same sizes: the same count, none of it integer
    "Attention (com.microsoft)": (
        helper.make_node(
            "Attention", ["x", "w", "bias"], ["y"], name="n", domain="com.microsoft", num_heads=2
        ),
        [vi("x", [1, 4, 8])],
        [floats("w", [8, 24]), floats("bias", [24])],
        ([1, 4, 8], F),
        1536 + 96 + 512 + 160,
        0,
    ),
    # quantize A [3, 4] (4 x 12), [3, 4] x [4, 5] in integers (120), rescale 30, bias 15
    "DynamicQuantizeMatMul": (
        helper.make_node(
            "DynamicQuantizeMatMul",
            ["a", "b", "b_s", "b_z", "bias"],
            ["y"],
            name="n",
            domain="com.microsoft",
        ),
        [vi("a", [3, 4])],
        [ints("b", [4, 5]), const("b_s", [SCALE]), const("b_z", np.zeros(1, np.int8))]
        + [floats("bias", [5])],
        ([3, 5], F),
        48 + 120 + 30 + 15,
        120,
    ),
    "MatMulIntegerToFloat": (
        helper.make_node(
            "MatMulIntegerToFloat",
            ["a", "b", "a_s", "b_s"],
            ["y"],
            name="n",
            domain="com.microsoft",
        ),
        [vi("a", [3, 4], U8)],
        [ints("b", [4, 5]), const("a_s", SCALE), const("b_s", [SCALE])],
        ([3, 5], F),
        120 + 30,
        120,
    ),
    # 4-bit weights, float A [2, 16] x B [16, 8] packed as [8, 1 block, 8 bytes]: as MatMul
    "MatMulNBits": (
        helper.make_node(
            "MatMulNBits",
            ["a", "b", "b_s"],
            ["y"],
            name="n",
            domain="com.microsoft",
            K=16,
            N=8,
            bits=4,
            block_size=16,
        ),
        [vi("a", [2, 16])],
        [ints("b", [8, 1, 8], np.uint8), const("b_s", np.full(8, SCALE))],
        ([2, 8], F),
        2 * 2 * 8 * 16,
        0,
    ),
}


@pytest.mark.parametrize("op", list(CASES))
def test_quantized_operator_flops_and_integer_share(tmp_path, op):
    node, inputs, inits, (out_shape, out_type), total, integer = CASES[op]
    g, i = one_node(tmp_path, node, inputs, inits, out_shape, out_type)
    assert g.flops[i] == total
    assert g.hints.get("integer_flops", 0.0) == integer


def test_integer_bytes_come_from_the_element_type(tmp_path):
    node, inputs, inits, (out_shape, out_type), _, _ = CASES["QLinearMatMul"]
    g, i = one_node(tmp_path, node, inputs, inits, out_shape, out_type)
    assert g.sizeout[i] == 3 * 5  # uint8 output: one byte each
    assert g.param_bytes_total == 4 * 5  # the int8 weight, one byte each (scalars are not)


# ---------------------------------------------------------------- the integer rate
def test_integer_work_takes_the_int8_rate(tmp_path):
    node, inputs, inits, (out_shape, out_type), total, integer = CASES["QLinearConv"]
    flat = Cluster("flat", 2, compute=1e9, memory_bandwidth=1e30)
    fast = Cluster("int8", 2, compute=1e9, memory_bandwidth=1e30, int8_compute=4e9)
    g, i = one_node(tmp_path, node, inputs, inits, out_shape, out_type, cluster=flat)
    assert g.work[i] == total / 1e9
    g, i = one_node(tmp_path, node, inputs, inits, out_shape, out_type, cluster=fast)
    assert g.work[i] == (total - integer) / 1e9 + integer / 4e9


def test_float_operators_ignore_the_int8_rate(tmp_path):
    node, inputs, inits, (out_shape, out_type), total, _ = CASES["Attention (com.microsoft)"]
    fast = Cluster("int8", 2, compute=1e9, memory_bandwidth=1e30, int8_compute=4e9)
    g, i = one_node(tmp_path, node, inputs, inits, out_shape, out_type, cluster=fast)
    assert g.work[i] == total / 1e9


def test_int8_compute_in_a_cluster_file():
    c = cluster_from_dict({"devices": 2, "compute": "312TFLOPS", "int8_compute": "624TOPS"}, "a")
    assert c.int8_compute == 624e12
    assert "int8 compute 624 TOPS" in c.summary()
    assert cluster_from_dict(c.to_dict(), "again") == c
    assert "int8_compute" not in cluster_from_dict({"devices": 2}, "b").to_dict()
    with pytest.raises(MtppError, match="int8_compute must be > 0"):
        cluster_from_dict({"int8_compute": 0}, "c")
    with pytest.raises(MtppError, match="int8_compute: unknown unit 'GB'"):
        cluster_from_dict({"int8_compute": "5GB"}, "d")


# ---------------------------------------------------------------- whole quantized models
class Images(CalibrationDataReader):
    """Four random images for static quantization's calibration."""

    def __init__(self, image: int):
        rng = np.random.default_rng(0)
        shape = (1, 3, image, image)
        self.batches = iter(
            [{"image": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
        )

    def get_next(self):
        return next(self.batches, None)


VIT = dict(image=32, patch=8, layers=2, hidden=128, heads=4, classes=10)


@pytest.fixture(scope="module")
def float_vit(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vit") / "vit.onnx"
    save(vit(**VIT)[0], path)
    return path


def quantized(float_vit: Path, how: str) -> Path:
    out = float_vit.with_name(f"vit-{how}.onnx")
    if how == "dynamic":
        quantize_dynamic(float_vit, out, weight_type=QuantType.QInt8)
    else:
        fmt = QuantFormat.QOperator if how == "qoperator" else QuantFormat.QDQ
        quantize_static(float_vit, out, Images(VIT["image"]), quant_format=fmt)
    return out


# multiply-adds (x 2) of the ViT above: 17 tokens of width 128, MLP 512, 2 layers, 4 heads
TOKENS, WIDTH, MLP, LAYERS = 17, 128, 512, 2
LINEAR = LAYERS * 2 * TOKENS * WIDTH * (3 * WIDTH + WIDTH + 2 * MLP) + 2 * WIDTH * 10
PATCHES = 2 * WIDTH * 16 * (3 * 8 * 8)
SCORES = LAYERS * 2 * (2 * 4 * TOKENS * TOKENS * WIDTH // 4)  # Q K^T and times V


@pytest.mark.parametrize(
    "how, ops, integer",
    [  # dynamic quantization leaves the attention's activation products in float
        ("dynamic", {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"}, LINEAR + PATCHES),
        ("qoperator", {"QLinearConv", "QLinearMatMul", "QLinearAdd"}, LINEAR + PATCHES + SCORES),
        ("qdq", {"QuantizeLinear", "DequantizeLinear", "MatMul"}, LINEAR + PATCHES + SCORES),
    ],
)
def test_quantized_vit_costs_about_what_the_float_one_does(float_vit, how, ops, integer):
    path = quantized(float_vit, how)
    assert ops <= {n.op_type for n in onnx.load(str(path)).graph.node}
    g = load_graph(float_vit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gq = load_graph(path)
    assert not [w for w in caught if "FLOPs unknown" in str(w.message)]
    assert "unknown_ops" not in gq.hints
    assert abs(gq.flops.sum() / g.flops.sum() - 1) < 0.10
    assert gq.hints["integer_flops"] == integer  # the quantized multiply-adds, exactly
    assert gq.param_bytes_total < 0.3 * g.param_bytes_total  # int8 weights


def test_quantized_vit_is_faster_on_a_cluster_with_an_integer_rate(float_vit):
    path = quantized(float_vit, "dynamic")
    base = dict(devices=2, compute="100TFLOPS", memory_bandwidth="inf")
    slow = load_graph(path, work="flops", cluster=cluster_from_dict(base, "a"))
    fast = load_graph(
        path, work="flops", cluster=cluster_from_dict({**base, "int8_compute": "400TOPS"}, "b")
    )
    integer = fast.hints["integer_flops"]
    assert slow.work.sum() == pytest.approx(slow.flops.sum() / 100e12, rel=1e-12)
    expected = (fast.flops.sum() - integer) / 100e12 + integer / 400e12
    assert fast.work.sum() == pytest.approx(expected, rel=1e-12)
    assert fast.work.sum() < 0.5 * slow.work.sum()
