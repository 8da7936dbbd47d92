"""ONNX front end: FLOP formulas, parameter detection, shapes, external data, bad files."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.errors import MtppError
from solver.io import load_graph

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
F = TensorProto.FLOAT


def save(tmp_path: Path, nodes, inputs, outputs, inits=(), opset=17, name="m.onnx", **kw):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kw)
    # outputs declared without a shape get the inferred one (the checker wants a shape)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    inferred.update({v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output})
    for out in model.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in inferred:
            out.CopyFrom(inferred[out.name])
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, shape, value=0.5, dtype=np.float32):
    return numpy_helper.from_array(np.full(shape, value, dtype=dtype), name)


def one_node_flops(tmp_path, node, inputs, inits=(), opset=17) -> float:
    path = save(tmp_path, [node], inputs, [vi(node.output[0], None)], inits, opset=opset)
    g = load_graph(path)
    i = g.names.index(node.name)
    return float(g.flops[i])


# ---------------------------------------------------------------- FLOP formulas, by hand
def test_conv_groups_dilation_bias(tmp_path):
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], name="c", group=2, dilations=[2, 2], pads=[2, 2, 2, 2]
    )
    # x [1, 4, 8, 8], w [6, 2, 3, 3] (groups 2), dilation 2 with pad 2 keeps 8x8
    fl = one_node_flops(
        tmp_path, node, [vi("x", [1, 4, 8, 8])], [init("w", [6, 2, 3, 3]), init("b", [6])]
    )
    out = 1 * 6 * 8 * 8
    assert fl == 2 * out * 2 * 9 + out


def test_conv_transpose(tmp_path):
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="ct", strides=[2, 2])
    fl = one_node_flops(tmp_path, node, [vi("x", [1, 3, 5, 5])], [init("w", [3, 4, 3, 3])])
    assert fl == 2 * (3 * 5 * 5) * 4 * 9


def test_matmul_batched_broadcast(tmp_path):
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    fl = one_node_flops(tmp_path, node, [vi("a", [2, 3, 4, 5]), vi("b", [5, 7])])
    assert fl == 2 * (2 * 3 * 4 * 7) * 5


def test_gemm_trans_and_bias(tmp_path):
    node = helper.make_node("Gemm", ["a", "w", "c"], ["y"], name="gm", transA=1, transB=1)
    fl = one_node_flops(tmp_path, node, [vi("a", [6, 2])], [init("w", [3, 6]), init("c", [3])])
    assert fl == 2 * (2 * 3) * 6 + 2 * 3


def test_einsum_contraction_and_ellipsis(tmp_path):
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="es", equation="...ij,...jk->...ik")
    fl = one_node_flops(tmp_path, node, [vi("a", [2, 3, 4]), vi("b", [2, 4, 5])])
    assert fl == 2 * (2 * 3 * 4 * 5)
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="outer", equation="i,j->ij")
    assert one_node_flops(tmp_path, node, [vi("a", [3]), vi("b", [4])]) == 12


def test_attention_opset23(tmp_path):
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att")
    fl = one_node_flops(
        tmp_path,
        node,
        [vi("q", [1, 2, 8, 16]), vi("k", [1, 2, 10, 16]), vi("v", [1, 2, 10, 16])],
        opset=23,
    )
    assert fl == 2 * 2 * 8 * 10 * (16 + 16) + 5 * 2 * 8 * 10


@pytest.mark.parametrize(
    "op, attrs, extra_inits, per_elem",
    [
        ("LayerNormalization", {"axis": -1}, [("s", [8]), ("bb", [8])], 8),
        ("BatchNormalization", {}, [("s", [3]), ("bb", [3]), ("mu", [3]), ("var", [3])], 2),
        ("InstanceNormalization", {}, [("s", [3]), ("bb", [3])], 8),
        ("Softmax", {"axis": -1}, [], 5),
        ("Relu", {}, [], 1),
        ("Sigmoid", {}, [], 4),
    ],
)
def test_per_element_ops(tmp_path, op, attrs, extra_inits, per_elem):
    names = ["x"] + [n for n, _ in extra_inits]
    node = helper.make_node(op, names, ["y"], name="op", **attrs)
    fl = one_node_flops(
        tmp_path, node, [vi("x", [2, 3, 4, 8])], [init(n, s) for n, s in extra_inits]
    )
    assert fl == per_elem * 2 * 3 * 4 * 8


def test_elementwise_broadcast_counts_output(tmp_path):
    node = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    assert one_node_flops(tmp_path, node, [vi("a", [4, 5]), vi("b", [5])]) == 20
    node = helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum")
    assert one_node_flops(tmp_path, node, [vi("a", [4]), vi("b", [4]), vi("c", [4])]) == 8


def test_pooling_resize_reduce(tmp_path):
    node = helper.make_node("MaxPool", ["x"], ["y"], name="mp", kernel_shape=[3, 3], strides=[2, 2])
    assert one_node_flops(tmp_path, node, [vi("x", [1, 2, 9, 9])]) == (2 * 4 * 4) * 9
    node = helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")
    assert one_node_flops(tmp_path, node, [vi("x", [1, 2, 9, 9])]) == 2 * 81
    node = helper.make_node("ReduceMean", ["x"], ["y"], name="rm", keepdims=0)
    assert one_node_flops(tmp_path, node, [vi("x", [3, 7])]) == 21
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], name="rs", mode="linear")
    fl = one_node_flops(tmp_path, node, [vi("x", [1, 1, 4, 4])], [init("sc", [4], 1.0)])
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc")
    fl = one_node_flops(tmp_path, node, [vi("x", [1, 1, 4, 4])], [scales])
    assert fl == (8 * 8) * 2 * 4


def test_unknown_op_warns_once_and_counts_zero(tmp_path):
    node = helper.make_node("Det", ["x"], ["y"], name="det")
    with pytest.warns(UserWarning, match="FLOPs unknown for Det x1"):
        assert one_node_flops(tmp_path, node, [vi("x", [3, 3])]) == 0


# ---------------------------------------------------------------- parameters
def test_three_parameter_storage_styles_and_shared_entity(tmp_path):
    const_w = helper.make_node(
        "Constant", [], ["cw"], name="k", value=numpy_helper.from_array(np.ones((4, 4), np.float32))
    )
    shape = numpy_helper.from_array(np.array([4, 4], np.int64), "shp")
    cos = helper.make_node(
        "ConstantOfShape",
        ["shp"],
        ["sw"],
        name="cos",
        value=numpy_helper.from_array(np.array([0.1], np.float32)),
    )
    nodes = [
        const_w,
        cos,
        helper.make_node("MatMul", ["x", "iw"], ["a"], name="m1"),  # initializer
        helper.make_node("MatMul", ["a", "cw"], ["b"], name="m2"),  # Constant node
        helper.make_node("MatMul", ["b", "sw"], ["c"], name="m3"),  # ConstantOfShape
        helper.make_node("MatMul", ["c", "iw"], ["d"], name="m4"),  # iw shared with m1
        helper.make_node("Reshape", ["d", "rs"], ["e"], name="r"),  # shape-only constant
        helper.make_node("Relu", ["e"], ["y"], name="relu"),
    ]
    path = save(
        tmp_path,
        nodes,
        [vi("x", [2, 4])],
        [vi("y", [8])],
        [init("iw", [4, 4]), shape, numpy_helper.from_array(np.array([8], np.int64), "rs")],
    )
    g = load_graph(path)
    sizes = {g.p_names[p]: g.p_size[p] for p in range(g.num_params)}
    assert sizes == {"iw": 64.0, "cw": 64.0, "sw": 64.0}
    iw = g.p_names.index("iw")
    users = {g.names[u] for u in g.p_users[g.p_ptr[iw] : g.p_ptr[iw + 1]]}
    assert users == {"m1", "m4"}
    # constants and views are folded away; the model input is a source node
    assert set(g.names) == {"input:x", "m1", "m2", "m3", "m4", "relu"}
    # the reshape is a view: relu reads m4's output directly
    edges = set(zip(*(e.tolist() for e in g.data_edges), strict=True))
    assert (g.names.index("m4"), g.names.index("relu")) in edges
    assert g.sizeout[g.names.index("m4")] == 2 * 4 * 4


def test_scalars_indices_and_masks_are_not_weights(tmp_path):
    nodes = [
        helper.make_node("Mul", ["x", "half"], ["a"], name="scale"),  # float scalar
        helper.make_node("Gather", ["x", "idx"], ["b"], name="pick", axis=1),  # int64 indices
        helper.make_node("Where", ["mask", "b", "zero"], ["y"], name="where"),  # bool mask
    ]
    inits = [
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array([0, 2], np.int64), "idx"),
        numpy_helper.from_array(np.array([True, False]), "mask"),
        numpy_helper.from_array(np.zeros(2, np.float32), "zero"),
    ]
    path = save(tmp_path, nodes, [vi("x", [1, 4])], [vi("y", [1, 2]), vi("a", [1, 4])], inits)
    g = load_graph(path)
    assert list(g.p_names) == ["zero"] and g.param_bytes_total == 8


def test_tied_embedding_stored_transposed_is_counted_once(tmp_path):
    """The legacy torch exporter folds a tied LM head into a transposed copy of the table."""
    table = np.random.default_rng(0).standard_normal((100, 64)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h"], name="embed"),
        helper.make_node("MatMul", ["h", "head"], ["logits"], name="lm_head"),
    ]
    inits = [
        numpy_helper.from_array(table, "emb"),
        numpy_helper.from_array(np.ascontiguousarray(table.T), "head"),
    ]
    path = save(
        tmp_path, nodes, [vi("ids", [1, 8], TensorProto.INT64)], [vi("logits", [1, 8, 100])], inits
    )
    g = load_graph(path)
    assert g.param_bytes_total == table.nbytes
    users = {g.names[u] for u in g.p_users}
    assert users == {"embed", "lm_head"}
    # a different matrix of the same shape is a separate weight
    inits[1] = numpy_helper.from_array(np.ascontiguousarray(table.T) + 1, "head")
    path = save(
        tmp_path,
        nodes,
        [vi("ids", [1, 8], TensorProto.INT64)],
        [vi("logits", [1, 8, 100])],
        inits,
        name="untied.onnx",
    )
    assert load_graph(path).param_bytes_total == 2 * table.nbytes


def test_external_data_sizes_without_reading_weights(tmp_path):
    w = numpy_helper.from_array(np.ones((256, 256), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [vi("x", [1, 256])],
        [vi("y", [1, 256])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ext.onnx"
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    (tmp_path / "weights.bin").write_bytes(b"")  # the bytes are gone: sizes must come from dims
    g = load_graph(path)
    assert g.param_bytes_total == 256 * 256 * 4


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../x.bin"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    w.ClearField("float_data")
    path = save(
        tmp_path,
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", [1, 4])],
        [vi("y", [1, 4])],
        [w],
    )
    with pytest.raises(MtppError, match="outside the model's folder"):
        load_graph(path)


# ---------------------------------------------------------------- shapes and dims
def test_dims_fixed_from_option_and_batch_default(tmp_path):
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    path = save(
        tmp_path, [node], [vi("x", ["batch", "seq", 8])], [vi("y", None)], [init("w", [8, 8])]
    )
    with pytest.raises(MtppError, match=r"unknown input dimensions: x axis 1 \('seq'\).*--dim"):
        load_graph(path)
    g = load_graph(path, dims={"seq": 5})
    assert g.flops[g.names.index("mm")] == 2 * 5 * 8 * 8
    with pytest.raises(MtppError, match="--dim nope"):
        load_graph(path, dims={"seq": 5, "nope": 3})


def test_control_flow_is_one_opaque_node(tmp_path):
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", [4])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    path = save(tmp_path, nodes, [vi("x", [4])], [vi("y", [4])], [zero])
    with pytest.warns(UserWarning, match="treated as one opaque node"):
        g = load_graph(path)
    b = g.names.index("branch")
    preds = {g.names[u] for u, v in zip(*g.data_edges, strict=True) if v == b}
    assert preds == {"gt", "input:x"}  # the body reads x from the outer scope


# ---------------------------------------------------------------- bad files
def test_not_onnx_and_truncated(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_text("hello, I am not a model")
    with pytest.raises(MtppError, match="not a valid ONNX model"):
        load_graph(bad)
    good = LIGHT / "light_squeezenet.onnx"
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(MtppError, match="not a valid ONNX model"):
        load_graph(trunc)


def test_checker_rejection(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    path = save(tmp_path, [node], [vi("x", [2])], [vi("y", [2])])
    model = onnx.load(str(path))
    model.graph.node[0].input[0] = "missing"  # reads a tensor nothing defines
    onnx.save(model, str(path))
    with pytest.raises(MtppError, match="checker rejects"):
        load_graph(path)


# ---------------------------------------------------------------- the model zoo in the wheel
ZOO_PARAMS = {
    "light_bvlc_alexnet": 60_965_224,
    "light_vgg19": 143_667_240,
    # 25,557,032 trainable + 53,120 BatchNorm running statistics (torchvision's ResNet-50);
    # the file keeps 25,608,360 of them in ConstantOfShape nodes and 1,792 in initializers
    "light_resnet50": 25_610_152,
    "light_inception_v1": 6_998_552,
}


@pytest.mark.parametrize("name", list(ZOO_PARAMS))
def test_model_zoo_parameters_exact(name):
    g = load_graph(LIGHT / f"{name}.onnx")
    assert g.param_bytes_total == 4 * ZOO_PARAMS[name]


def test_vgg19_macs_match_hand_count():
    g = load_graph(LIGHT / "light_vgg19.onnx")
    conv = [(3, 64), (64, 64), (64, 128), (128, 128)] + [(128, 256)] + [(256, 256)] * 3
    conv += [(256, 512)] + [(512, 512)] * 3 + [(512, 512)] * 4
    sizes = [224] * 2 + [112] * 2 + [56] * 4 + [28] * 4 + [14] * 4
    macs = sum(s * s * ci * co * 9 for (ci, co), s in zip(conv, sizes, strict=True))
    macs += 25088 * 4096 + 4096 * 4096 + 4096 * 1000
    assert macs == pytest.approx(19.63e9, rel=1e-3)
    got = sum(g.flops[i] for i, op in enumerate(g.op_types) if op in ("Conv", "Gemm")) / 2
    assert got == pytest.approx(macs, rel=0.01)


def test_every_zoo_model_imports_and_solves():
    from solver.cluster import load_cluster
    from solver.methods import SolveOptions, solve

    for path in sorted(LIGHT.glob("*.onnx")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no unknown ops in the zoo
            g = load_graph(path)
        assert g.flops.sum() > 0 and g.param_bytes_total > 0
        plan = solve(
            g, load_cluster("ipu-pod", devices=4), "slicegraph", SolveOptions(time_limit=2)
        )
        assert plan.objective >= plan.lower_bound


def test_measured_work_profiles_this_machine():
    g = load_graph(
        Path(__file__).resolve().parents[1] / "models/small/resnet.onnx", work="measured"
    )
    assert g.hints["work_model"] == "measured"
    convs = [i for i, op in enumerate(g.op_types) if op == "Conv"]
    assert all(g.work[i] > 0 for i in convs)  # every conv kernel was timed
    assert g.work[[i for i, op in enumerate(g.op_types) if op == "Input"]].sum() == 0
