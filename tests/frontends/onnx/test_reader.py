"""ONNX front end: FLOP formulas, parameter detection, shapes, external data, bad files."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.core.errors import MtppError
from solver.frontends import load_graph

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


def ext_tensor(name, dims, location, offset=None, length=None, dtype=F):
    """A TensorProto whose data is external (nothing is stored or written)."""
    t = TensorProto(name=name, data_type=dtype, dims=dims)
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    if offset is not None:
        t.external_data.add(key="offset", value=str(offset))
    if length is not None:
        t.external_data.add(key="length", value=str(length))
    return t


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
    """A 16 GiB weight in a sparse file: sizes come from dims and a stat, the bytes are never
    read (reading them would take far more time and memory than this test allows)."""
    import resource
    import time

    w = ext_tensor("w", [65536, 65536], "weights.bin", length=4 * 65536**2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [vi("x", [1, 65536])],
        [vi("y", [1, 65536])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path))
    with open(tmp_path / "weights.bin", "wb") as f:
        f.truncate(4 * 65536**2)  # sparse: no disk, no bytes
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    g = load_graph(path)
    assert time.perf_counter() - t < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 2**20  # KiB: < 1 GiB
    assert g.param_bytes_total == 4 * 65536**2


def test_external_facts_from_the_protos():
    """Sizes and locations of external tensors come from dims and entries alone; a tensor in a
    node attribute counts, and each location is listed once, in order of first use."""
    from solver.frontends.onnx.common import dense_bytes, external_info, external_locations

    w = ext_tensor("w", [3, 5], "a.bin", offset=64, length=60)
    h = ext_tensor("h", [7], "b.bin", dtype=TensorProto.FLOAT16)
    assert dense_bytes(w) == 60 and dense_bytes(h) == 14
    assert dense_bytes(ext_tensor("q", [3], "c.bin", dtype=TensorProto.INT4)) == 2  # 1.5 up
    assert external_info(w) == {"location": "a.bin", "offset": "64", "length": "60"}
    const = helper.make_node("Constant", [], ["c"], value=ext_tensor("k", [2], "c.bin"))
    graph = helper.make_graph(
        [const, helper.make_node("Add", ["w", "c"], ["y"])], "g", [], [vi("y", [3, 5])], [w, h]
    )
    model = helper.make_model(graph)
    model.graph.initializer.append(ext_tensor("w2", [1], "a.bin", offset=128))
    assert external_locations(model) == ["a.bin", "b.bin", "c.bin"]


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
    with pytest.raises(MtppError, match="neither an ONNX model nor a graph JSON"):
        load_graph(bad)
    good = LIGHT / "light_squeezenet.onnx"
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(MtppError, match="not a valid ONNX model"):
        load_graph(trunc)


def test_the_format_is_read_from_the_content_not_the_name(tmp_path):
    """An ONNX model under another suffix is read as ONNX; a graph JSON named .onnx as JSON."""
    good = LIGHT / "light_squeezenet.onnx"
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(good.read_bytes())
    assert load_graph(renamed).n == load_graph(good).n
    text = tmp_path / "graph.onnx"
    text.write_text('{"format": "mtpp-graph", "nodes": [{"name": "a", "work": 1}]}')
    assert load_graph(text).names == ("a",)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(MtppError, match="empty file"):
        load_graph(empty)


def test_shape_inference_failure_without_a_message_is_one_line(tmp_path, monkeypatch):
    """onnx may raise with an empty message: still a one-line error, not an IndexError."""
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    path = save(tmp_path, [node], [vi("x", [2])], [vi("y", [2])])

    def fail(*args, **kwargs):
        raise RuntimeError("")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fail)
    with pytest.raises(MtppError, match=r"^onnx shape inference failed: RuntimeError$"):
        load_graph(path)


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
    from solver.core.cluster import load_cluster
    from solver.pipeline.options import SolveOptions
    from solver.pipeline.registry import solve

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
        Path(__file__).resolve().parents[3] / "models/small/resnet.onnx", work="measured"
    )
    assert g.hints["work_model"] == "measured"
    convs = [i for i, op in enumerate(g.op_types) if op == "Conv"]
    assert all(g.work[i] > 0 for i in convs)  # every conv kernel was timed
    assert g.work[[i for i, op in enumerate(g.op_types) if op == "Input"]].sum() == 0


# ---------------------------------------------------------------- external data, checked by stat
def ext_model(tmp_path, file_bytes: int | None, offset=None, length=None) -> Path:
    """A MatMul reading a 4x4 float weight kept in ``w.bin`` (``file_bytes`` long, or absent)."""
    w = ext_tensor("w", [4, 4], "w.bin", offset, length)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [vi("x", [1, 4])],
        [vi("y", [1, 4])],
        [w],
    )
    path = tmp_path / "ext.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    if file_bytes is not None:
        (tmp_path / "w.bin").write_bytes(bytes(file_bytes))
    return path


@pytest.mark.parametrize(
    "file_bytes, offset, length, match",
    [
        (None, None, None, r"tensor 'w': its external data file 'w.bin' is missing"),
        (63, None, None, r"tensor 'w': external data file 'w.bin' is too short \(63 bytes.*0..64"),
        (100, 40, 64, r"'w.bin' is too short \(100 bytes, the tensor needs bytes 40..104\)"),
        (64, 65, None, r"tensor 'w': external data offset 65 is past the end of 'w.bin'"),
        (64, "x", None, r"tensor 'w': external data offset/length are not integers"),
    ],
)
def test_broken_external_data_is_refused(tmp_path, capsys, file_bytes, offset, length, match):
    from tests.badinput import assert_refused

    path = ext_model(tmp_path, file_bytes, offset, length)
    with pytest.raises(MtppError, match=match):
        load_graph(path)
    assert_refused(capsys, ["inspect", path], match, watch=tmp_path)


def test_external_data_exactly_filling_the_file_is_accepted(tmp_path):
    assert load_graph(ext_model(tmp_path, 104, 40, 64)).param_bytes_total == 64
    assert load_graph(ext_model(tmp_path, 64)).param_bytes_total == 64


def _if_node(name, then_nodes, then_out, else_nodes, else_out, then_inits=(), else_inits=()):
    then_g = helper.make_graph(then_nodes, "then", [], [then_out], initializer=list(then_inits))
    else_g = helper.make_graph(else_nodes, "else", [], [else_out], initializer=list(else_inits))
    return helper.make_node("If", ["c"], ["y"], name=name, then_branch=then_g, else_branch=else_g)


def _outside_constant():
    t = ext_tensor("cw", [4, 4], "../outside.bin")
    return [helper.make_node("Constant", [], ["cw"], name="k", value=t)], [], {}


def _outside_sparse():
    values = ext_tensor("sw", [2], "../outside.bin")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "sw_idx")
    return [], [], {"sparse_initializer": [helper.make_sparse_tensor(values, indices, [4, 4])]}


def _outside_subgraph():
    body_w = ext_tensor("bw", [4], "sub/../../outside.bin")
    node = _if_node(
        "branch",
        [helper.make_node("Add", ["x1", "bw"], ["t"])],
        vi("t", [4]),
        [helper.make_node("Neg", ["x1"], ["e"])],
        vi("e", [4]),
        then_inits=[body_w],
    )
    return [helper.make_node("Flatten", ["x"], ["x1"], axis=0), node], [], {}


def _outside_function():
    t = ext_tensor("fw", [4], "/etc/passwd")
    fn = helper.make_function(
        "local",
        "AddW",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["fw"], value=t),
            helper.make_node("Add", ["a", "fw"], ["b"]),
        ],
        [helper.make_opsetid("", 17)],
    )
    return [helper.make_node("AddW", ["x"], ["y"], domain="local")], [fn], {}


@pytest.mark.parametrize(
    "where", [_outside_constant, _outside_sparse, _outside_subgraph, _outside_function]
)
def test_external_paths_are_checked_everywhere(tmp_path, capsys, where):
    """Constant values, sparse initializers, control-flow bodies and model functions."""
    from tests.badinput import assert_refused

    (tmp_path / "outside.bin").write_bytes(bytes(64))
    folder = tmp_path / "model"
    folder.mkdir()
    nodes, functions, extra = where()
    graph = helper.make_graph(
        nodes or [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [vi("x", [1, 4])],
        [vi("y", None)],
        **extra,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=functions)
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    with pytest.raises(MtppError, match="outside the model's folder"):
        load_graph(path)
    assert_refused(capsys, ["inspect", path], "outside the model's folder", watch=tmp_path)


# ---------------------------------------------------------------- one tensor per output
def test_multi_output_operator_sends_only_what_is_read(tmp_path):
    """Split's halves go to different consumers: a block reading one half receives only it."""
    from solver.core.cluster import Cluster
    from solver.core.cost import evaluate

    nodes = [
        helper.make_node("Relu", ["x"], ["x0"], name="pre"),
        helper.make_node("Split", ["x0", "sizes"], ["a", "b"], name="split", axis=1),
        helper.make_node("Relu", ["a"], ["ra"], name="ra"),
        helper.make_node("Neg", ["b"], ["nb"], name="nb"),
    ]
    sizes = numpy_helper.from_array(np.array([2, 6], np.int64), "sizes")
    path = save(tmp_path, nodes, [vi("x", [1, 8])], [vi("ra", [1, 2]), vi("nb", [1, 6])], [sizes])
    g = load_graph(path)
    split = g.node("split")
    mine = np.flatnonzero(g.t_producer == split)
    assert sorted(g.t_size[mine].tolist()) == [8.0, 24.0]  # its own tensor per output
    assert g.sizeout[split] == 32
    assert g.act[g.node("ra")] == 8 + 8  # reads only its half
    a = np.zeros(g.n, dtype=np.int64)
    a[g.node("ra")] = 1
    ev = evaluate(g, Cluster("c", 2, link_bandwidth=1.0), a)
    assert ev.bytes_in.tolist() == [0.0, 8.0] and ev.bytes_out.tolist() == [8.0, 0.0]
    a[g.node("ra")], a[g.node("nb")] = 0, 1
    assert evaluate(g, Cluster("c", 2, link_bandwidth=1.0), a).bytes_in.tolist() == [0.0, 24.0]


# ---------------------------------------------------------------- shapes from one run
def test_top_level_if_with_unresolvable_shapes_runs_once_and_counts_branch_weights(tmp_path):
    """Branches of different output sizes leave the If's output unknown to inference: one
    onnxruntime run at the fixed dims reads it; weights inside both branches are counted."""
    rng = np.random.default_rng(1)
    then_w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "tw")
    else_w = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32))
    node = _if_node(
        "branch",
        [helper.make_node("MatMul", ["x", "tw"], ["t"])],
        vi("t", [1, 4]),
        [
            helper.make_node("Constant", [], ["ew"], value=else_w),
            helper.make_node("MatMul", ["x", "ew"], ["e"]),
        ],
        vi("e", [1, 8]),
        then_inits=[then_w],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Abs", ["s"], ["s1"], name="abs"),
        helper.make_node("Less", ["s1", "minus"], ["c"], name="lt"),  # always false
        node,
        helper.make_node("Relu", ["y"], ["z"], name="head"),
    ]
    inits = [numpy_helper.from_array(np.array(-1.0, np.float32), "minus")]
    graph = helper.make_graph(nodes, "g", [vi("x", [1, 4])], [vi("z", [1, "n"])], inits)
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.warns(UserWarning, match="come from one onnxruntime run"):
        g = load_graph(path)
    assert "y (output of If 'branch')" in g.hints["shapes_from_run"]
    sizes = {g.p_names[p]: g.p_size[p] for p in range(g.num_params)}
    assert sizes == {"branch/tw": 64.0, "branch/ew": 128.0}  # both branches are stored
    assert g.sizeout[g.node("branch")] == 32  # the else branch ran: [1, 8] floats
    assert g.flops[g.node("head")] == 8


def test_loop_scan_output_shape_from_a_run_and_body_weight(tmp_path):
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "bw"], ["v_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["v_out"], ["scan"]),
        ],
        "body",
        [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("v_in", [4])],
        [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [4]), vi("scan", [4])],
        initializer=[numpy_helper.from_array(np.arange(4, dtype=np.float32), "bw")],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "yes", "x"], ["v", "all"], name="loop", body=body),
        helper.make_node("Relu", ["all"], ["r"], name="relu"),
        helper.make_node("Neg", ["v"], ["n"], name="neg"),
    ]
    inits = [
        numpy_helper.from_array(np.array(3, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "yes"),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", [4])], [vi("r", ["k", 4]), vi("n", [4])], inits)
    path = tmp_path / "loop.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.warns(UserWarning, match="come from one onnxruntime run"):
        g = load_graph(path)
    loop = g.node("loop")
    assert sorted(g.t_size[g.t_producer == loop].tolist()) == [16.0, 48.0]  # v [4], all [3, 4]
    assert g.flops[g.node("relu")] == 12
    assert list(g.p_names) == ["loop/bw"] and g.param_bytes_total == 16
    # the same for callers that need every shape (the exporter's stage boundaries)
    from solver.frontends.onnx.shapes import complete_shapes, infer_shapes

    model = onnx.load(str(path))
    assert infer_shapes(model)["all"][0] is None
    shapes, note = complete_shapes(model, tmp_path)
    assert shapes["all"] == ((3, 4), TensorProto.FLOAT) and "onnxruntime run" in note


# ---------------------------------------------------------------- huge dims, measured work
def batch_model(tmp_path, external=False) -> Path:
    """x [batch, 64] -> MatMul(random W) -> Relu -> Reshape to a shape computed from Shape(x)."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "zero"], ["b"], name="pick", axis=0),
        helper.make_node("Concat", ["b", "m1"], ["target"], name="cat", axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"], name="rs"),
        helper.make_node("Sigmoid", ["y"], ["z"], name="sig"),
    ]
    inits = [
        w,
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "m1"),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", ["batch", 64])], [vi("z", ["batch", 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "batch.onnx"
    if external:
        onnx.save(
            model, str(path), save_as_external_data=True, location="batch.data", size_threshold=0
        )
    else:
        onnx.save(model, str(path))
    return path


def test_huge_dims_import_as_numbers_and_measured_refuses(tmp_path, capsys):
    import resource

    from tests.badinput import assert_refused

    path = batch_model(tmp_path)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g = load_graph(path, dims={"batch": 10**9})
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 2**19  # KiB: < 512 MiB
    assert g.sizeout[g.node("relu")] == 10**9 * 64 * 4
    assert g.flops[g.node("mm")] == 2 * 10**9 * 64 * 64
    with pytest.raises(MtppError, match=r"--work measured: running the model .* needs about"):
        load_graph(path, dims={"batch": 10**9}, work="measured")
    argv = ["inspect", path, "--dim", "batch=1000000000", "--work", "measured"]
    assert_refused(capsys, argv, r"needs about .* memory .* use smaller --dim", watch=tmp_path)


def test_measured_work_on_external_data_model(tmp_path, monkeypatch):
    path = batch_model(tmp_path, external=True)
    stored = onnx.load(str(path), load_external_data=False).graph.initializer
    assert [t.data_location for t in stored] == [TensorProto.EXTERNAL] * 3
    monkeypatch.chdir(tmp_path.parent)  # the data is found beside the model, not in the cwd
    g = load_graph(path, dims={"batch": 32}, work="measured")
    assert g.hints["work_model"] == "measured"
    assert g.work[g.node("mm")] > 0 and g.work[g.node("sig")] > 0
    assert g.param_bytes_total == 64 * 64 * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.data", "batch.onnx"]


def test_external_constant_and_sparse_initializer_are_weights(tmp_path):
    """A Constant whose value is external data, and a sparse initializer (dense size: what a
    runtime holds), are weights of their readers; the external file is only stat'ed."""
    (tmp_path / "c.bin").write_bytes(bytes(64))
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "sv")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "sv_idx")
    nodes = [
        helper.make_node("Constant", [], ["cw"], name="k", value=ext_tensor("cw", [4, 4], "c.bin")),
        helper.make_node("MatMul", ["x", "cw"], ["h"], name="m1"),
        helper.make_node("MatMul", ["h", "sv"], ["y"], name="m2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [vi("x", [1, 4])],
        [vi("y", [1, 4])],
        sparse_initializer=[helper.make_sparse_tensor(values, indices, [4, 4])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    g = load_graph(path)
    sizes = {g.p_names[p]: g.p_size[p] for p in range(g.num_params)}
    assert sizes == {"cw": 64.0, "sv": 64.0}
    users = {g.p_names[p]: g.names[g.p_users[p]] for p in range(g.num_params)}
    assert users == {"cw": "m1", "sv": "m2"}


# ---------------------------------------------------------------- weights as onnxruntime holds them
def half_and_float_model(tmp_path) -> Path:
    """fp16 x @ W16 (64x64 fp16: 8 KiB stored) -> Cast -> @ W32 (64x64 fp32: 16 KiB), with
    random weights; onnxruntime's CPU provider holds W16 as fp32 (16 KiB)."""
    rng = np.random.default_rng(3)
    w16 = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float16), "w16")
    w32 = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w32")
    nodes = [
        helper.make_node("MatMul", ["x", "w16"], ["h"], name="mm16"),
        helper.make_node("Cast", ["h"], ["hf"], name="cast", to=F),
        helper.make_node("MatMul", ["hf", "w32"], ["y"], name="mm32"),
    ]
    return save(
        tmp_path, nodes, [vi("x", [1, 64], TensorProto.FLOAT16)], [vi("y", [1, 64])], [w16, w32]
    )


def test_weight_bytes_count_fp16_twice(tmp_path):
    from solver.frontends.onnx.ort import held_bytes, tensor_bytes, weight_bytes, weights_detail

    model = onnx.load(str(half_and_float_model(tmp_path)))
    by_name = {t.name: t for t in model.graph.initializer}
    assert [tensor_bytes(by_name[x]) for x in ("w16", "w32")] == [8192, 16384]
    assert [held_bytes(by_name[x]) for x in ("w16", "w32")] == [16384, 16384]
    assert weight_bytes(model) == (24576.0, 32768.0)
    assert weights_detail(24576.0, 32768.0) == "weights 32 KiB, fp16 held as fp32, of 24 KiB stored"
    assert weights_detail(100.0, 100.0) == "weights 100 B"


def test_measured_work_counts_held_weights_and_memory_ok_skips_the_check(tmp_path, monkeypatch):
    """Memory for the stored weights but not for fp16 held as fp32: refused (the old estimate,
    weights as stored, would have run); with memory_ok the profile runs."""
    from solver.frontends.onnx.ort import activation_peak

    path = half_and_float_model(tmp_path)
    g = load_graph(path)
    assert g.param_bytes_total == 24576
    acts = activation_peak(g)
    monkeypatch.setattr("solver.frontends.onnx.ort.available_memory", lambda: int(acts + 28672))
    with pytest.raises(
        MtppError,
        match=r"^--work measured: running the model at these dims needs about .* \(activations "
        r".* \+ weights 32 KiB, fp16 held as fp32, of 24 KiB stored\) but .* use smaller --dim",
    ):
        load_graph(path, work="measured")
    g = load_graph(path, work="measured", memory_ok=True)
    assert g.hints["work_model"] == "measured"
    assert g.work[g.node("mm16")] > 0 and g.work[g.node("mm32")] > 0
