"""One ONNX front end: the cost graph (``mtpp solve``) and the sharding planner (``mtpp shard``)
read a model through the same loading, shape inference, folding and onnxruntime run, so every
model one reads the other reads too."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.cli import main
from solver.frontends import load_graph
from solver.frontends.onnx.fold import fold_values
from solver.frontends.onnx.shapes import static_model
from solver.spmd.model import from_proto, load_model

F = TensorProto.FLOAT
I64 = TensorProto.INT64
PATCHES, WIDTH = 4, 8


def _i64(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=np.int64), name)


def vit_embeddings(batch: int | str = 2, seed: int = 3) -> onnx.ModelProto:
    """The embeddings of a ViT as torch's legacy exporter writes them: the class token
    ``cls_token.expand(batch, -1, -1)`` is Expanded to a shape computed by
    Shape -> Gather -> Unsqueeze -> Concat, with each -1 replaced through Equal/Where and a
    ConstantOfShape of ones; then Concat with the patches, the position embedding, a MatMul.
    onnx's data propagation stops at ConstantOfShape, so inference alone leaves the shape of
    the Expand and everything after it unknown."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.standard_normal((1, 1, WIDTH)).astype(np.float32), "cls"),
        numpy_helper.from_array(
            rng.standard_normal((1, PATCHES + 1, WIDTH)).astype(np.float32), "pos"
        ),
        numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w"),
    ]
    n = helper.make_node
    ones = helper.make_tensor("one", I64, [1], [1])
    nodes = [
        n("Shape", ["x"], ["/emb/Shape_output_0"], name="/emb/Shape"),
        n("Gather", ["/emb/Shape_output_0", "zero"], ["batch"], name="/emb/Gather", axis=0),
        n("Unsqueeze", ["batch", "axes0"], ["batch1"], name="/emb/Unsqueeze"),
        n("Concat", ["batch1", "minus1", "minus1"], ["wanted"], name="/emb/Concat", axis=0),
        n("ConstantOfShape", ["three"], ["ones"], name="/emb/ConstantOfShape", value=ones),
        n("Mul", ["ones", "minus1"], ["negs"], name="/emb/Mul"),
        n("Equal", ["wanted", "negs"], ["is_minus1"], name="/emb/Equal"),
        n("Where", ["is_minus1", "ones", "wanted"], ["target"], name="/emb/Where"),
        n("Expand", ["cls", "target"], ["cls_tokens"], name="/emb/Expand"),
        n("Concat", ["cls_tokens", "x"], ["tokens"], name="/emb/Concat_1", axis=1),
        n("Add", ["tokens", "pos"], ["hidden"], name="/emb/Add"),
        n("MatMul", ["hidden", "w"], ["y"], name="/proj/MatMul"),
    ]
    small = [_i64("zero", 0), _i64("axes0", [0]), _i64("minus1", [-1]), _i64("three", [3])]
    graph = helper.make_graph(
        nodes,
        "vit_embeddings",
        [helper.make_tensor_value_info("x", F, [batch, PATCHES, WIDTH])],
        [helper.make_tensor_value_info("y", F, [batch, PATCHES + 1, WIDTH])],
        weights + small,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_onnx_inference_alone_leaves_the_class_token_shape_unknown():
    """The premise: strict onnx inference with data propagation (what the planner used to
    rely on) cannot give the Concat its shape."""
    inferred = onnx.shape_inference.infer_shapes(vit_embeddings(), data_prop=True)
    known = {
        v.name
        for v in inferred.graph.value_info
        if all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
        and v.type.tensor_type.HasField("shape")
    }
    assert "/emb/Shape_output_0" in known and "tokens" not in known


def test_front_end_gives_every_tensor_a_static_shape():
    static = static_model(vit_embeddings(), {}, where="vit")
    assert static.note is None  # folding suffices: no onnxruntime run
    assert static.shapes["tokens"] == ((2, PATCHES + 1, WIDTH), F)
    assert static.shapes["y"] == ((2, PATCHES + 1, WIDTH), F)
    assert static.unknown([n for node in static.model.graph.node for n in node.output]) == []


def test_planner_folding_expands_the_class_token_to_its_value():
    model = vit_embeddings()
    static = static_model(model, {}, where="vit")
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    folded = fold_values(model.graph.node, static.shapes, weights)
    assert folded.values["target"].tolist() == [2, 1, 1]
    np.testing.assert_array_equal(
        folded.values["cls_tokens"], np.broadcast_to(weights["cls"], (2, 1, WIDTH))
    )
    kept = [model.graph.node[i].name for i in range(len(model.graph.node))]
    kept = [k for i, k in enumerate(kept) if i not in folded.nodes]
    assert kept == ["/emb/Concat_1", "/emb/Add", "/proj/MatMul"]


@pytest.mark.parametrize("batch, dims, want", [(2, {}, 2), ("batch", {"batch": 3}, 3)])
def test_shard_model_reads_the_class_token_pattern(batch, dims, want):
    sm = from_proto(vit_embeddings(batch), dims)
    assert [op.name for op in sm.ops] == ["/emb/Concat_1", "/emb/Add", "/proj/MatMul"]
    assert sm.shapes["tokens"] == (want, PATCHES + 1, WIDTH)
    assert sm.consts["cls_tokens"].shape == (want, 1, WIDTH)
    assert sm.inputs == ["x"] and sm.outputs == ["y"]


@pytest.mark.parametrize("method", ["dp", "megatron", "cpsat"])
def test_shard_and_solve_read_the_class_token_model(tmp_path, capsys, method):
    path = tmp_path / "vit.onnx"
    onnx.save(vit_embeddings(batch="batch"), path)
    argv = ["shard", str(path), "-k", "2", "--dim", "batch=2", "--method", method]
    assert main([*argv, "--verify", "--json", "--time-limit", "20", "--workers", "1"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["verify"]["ok"] and plan["verify"]["max_abs_diff"] < 1e-4
    # the cost graph reads the same shapes: the MatMul makes [2, 5, 8] floats
    g = load_graph(path, dims={"batch": 2})
    assert g.sizeout[g.node("/proj/MatMul")] == 2 * (PATCHES + 1) * WIDTH * 4


def test_shard_verify_fails_on_a_wrong_class_token():
    """The verification above can fail: a plan run on a model whose class token differs from
    the reference's (the sharded program reads the planner's folded value) is caught."""
    from solver.backends.verify import verify
    from solver.spmd.solve import solve_sharding

    res = solve_sharding(from_proto(vit_embeddings(), {}), devices=2, method="dp")
    assert verify(res.planner, res.program, seed=0)["ok"]
    res.planner.sm.consts["cls_tokens"] = res.planner.sm.consts["cls_tokens"] + 1.0
    out = verify(res.planner, res.program, seed=0)
    assert not out["ok"] and out["error"].startswith("output 'y': max abs diff")


def loop_model(read_scan: bool = True) -> onnx.ModelProto:
    """A Loop whose scan output's shape only a run gives ([3, 4]: 3 trips), read by a Relu
    (or, without ``read_scan``, read by nobody: the planner still needs every output of an
    operator it runs)."""
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(4)
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "bw"], ["v_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["v_out"], ["scan"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", F, [4])],
        [vi("cond_out", TensorProto.BOOL, []), vi("v_out", F, [4]), vi("scan", F, [4])],
        initializer=[numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bw")],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "yes", "x"], ["v", "all"], name="loop", body=body),
        helper.make_node("Neg", ["v"], ["n"], name="neg"),
    ]
    outputs = [vi("n", F, [4])]
    if read_scan:
        nodes.append(helper.make_node("Relu", ["all"], ["r"], name="relu"))
        outputs.append(vi("r", F, ["k", 4]))
    inits = [_i64("trips", 3), numpy_helper.from_array(np.array(True), "yes")]
    graph = helper.make_graph(nodes, "g", [vi("x", F, [4])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("read_scan, unknown", [(True, "2 tensor(s)"), (False, "1 tensor(s)")])
def test_shard_takes_shapes_only_a_run_gives_and_says_so(tmp_path, capsys, read_scan, unknown):
    with pytest.warns(UserWarning, match="come from one onnxruntime run"):
        sm = from_proto(loop_model(read_scan), {})
    assert sm.shapes["all"] == (3, 4)
    path = tmp_path / "loop.onnx"
    onnx.save(loop_model(read_scan), path)
    assert main(["shard", str(path), "-k", "2", "--verify", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verify"]["ok"]
    assert f"mtpp: warning: shapes of {unknown} that inference left unknown (first: all)" in (
        captured.err
    )


def test_load_model_and_solve_refuse_the_same_broken_model(tmp_path):
    """One checker: a node reading a tensor nothing defines is refused by both front ends
    with the same message."""
    from solver.core.errors import MtppError

    model = vit_embeddings()
    model.graph.node[-1].input[1] = "nothing"
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    messages = []
    for read in (load_model, load_graph):
        with pytest.raises(MtppError, match="the ONNX checker rejects the model") as info:
            read(path)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def int8_matmul() -> onnx.ModelProto:
    """``x @ W`` as onnxruntime's dynamic quantization writes it: x quantized at run time
    (DynamicQuantizeLinear), an int8 weight with its scale and zero point, MatMulInteger,
    Cast back to float and one Mul by the product of the scales; then a Relu."""
    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, (16, 8)).astype(np.int8)
    inits = [
        numpy_helper.from_array(w, "w_quantized"),
        numpy_helper.from_array(np.array(0.02, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "w_zero_point"),
    ]
    n = helper.make_node
    nodes = [
        n("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zp"], name="quantize"),
        n("Mul", ["x_scale", "w_scale"], ["scales"], name="scales"),
        n("MatMulInteger", ["xq", "w_quantized", "x_zp", "w_zero_point"], ["acc"], name="mm"),
        n("Cast", ["acc"], ["acc_f"], name="cast", to=F),
        n("Mul", ["acc_f", "scales"], ["h"], name="rescale"),
        n("Relu", ["h"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "int8",
        [helper.make_tensor_value_info("x", F, [4, 16])],
        [helper.make_tensor_value_info("y", F, [4, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("method", ["dp", "megatron", "propagate"])
def test_integer_operators_without_a_rule_run_replicated(tmp_path, capsys, method):
    path = tmp_path / "int8.onnx"
    onnx.save(int8_matmul(), path)
    assert main(["shard", str(path), "-k", "2", "--method", method, "--verify", "--json"]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert plan["verify"]["ok"]
    assert plan["replicated_op_types"] == ["DynamicQuantizeLinear", "MatMulInteger"]
    assert plan["strategies"]["mm"] == [[1, 1], [1, 1], [], []]
    assert "no sharding rule for DynamicQuantizeLinear, MatMulInteger; they run replicated" in (
        captured.err
    )
