"""Training costs of ONNX models: the backward factor and the stash of every operator, from the
table of solver.frontends.onnx.backward, on small models with exact expected numbers."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import llama
from solver.cli import main
from solver.cli.common import load_graph_and_cluster
from solver.core.graph import Graph
from solver.frontends import load_graph, native
from solver.frontends.onnx.backward import (
    RULES,
    BackwardCosts,
    OpCall,
    Operand,
    backward_costs,
    rescaled_backward,
)
from tests.frontends.onnx.test_reader import save, vi

F = TensorProto.FLOAT
RNG = np.random.default_rng(21)


def weight(name: str, shape: list[int]) -> onnx.TensorProto:
    """A stored float32 weight of random values (more than one element: a parameter)."""
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def costs_by_name(g: Graph) -> dict[str, tuple[float, float]]:
    """(backward work / forward work, stash bytes) of every node, by name."""
    ratio = np.divide(g.work_backward, g.work, out=np.zeros(g.n), where=g.work > 0)
    return {nm: (float(ratio[i]), float(g.stash[i])) for i, nm in enumerate(g.names)}


def mlp(tmp_path: Path) -> Path:
    """x [4, 8] -> MatMul W1 [8, 16] -> Relu -> MatMul W2 [16, 4] -> Softmax."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["z"], name="mm2"),
        helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=-1),
    ]
    inits = [weight("w1", [8, 16]), weight("w2", [16, 4])]
    return save(tmp_path, nodes, [vi("x", [4, 8])], [vi("y", [4, 4])], inits)


def test_matmul_relu_softmax_follow_the_table(tmp_path):
    g = load_graph(mlp(tmp_path), work="flops", training_costs=True)
    got = costs_by_name(g)
    assert got["input:x"] == (0.0, 0.0)  # a model input has no backward
    # x needs no gradient: only dW1 = x^T dH (1 x the forward), which keeps x (4 x 8 floats)
    assert got["mm1"] == (1.0, 4 * 8 * 4)
    assert got["relu"] == (1.0, 4 * 16 * 4)  # dX = dY [Y > 0] keeps its output
    assert got["mm2"] == (2.0, 0.0)  # dR and dW2; r is already kept by relu (stashed once)
    assert got["softmax"] == (0.8, 4 * 4 * 4)  # 4 FLOPs per element vs 5, keeps its output
    assert np.allclose(g.work_backward[g.index["mm2"]], 2 * g.work[g.index["mm2"]])


def test_inference_graphs_have_no_training_costs(tmp_path):
    path = mlp(tmp_path)
    plain = load_graph(path)
    assert plain.work_backward is None and plain.stash is None
    assert "work_backward" not in native.to_dict(plain)["nodes"][1]
    trained = load_graph(path, training_costs=True)
    assert np.array_equal(plain.work, trained.work)
    assert native.to_dict(plain)["nodes"] == [
        {k: v for k, v in d.items() if k not in ("work_backward", "stash")}
        for d in native.to_dict(trained)["nodes"]
    ]


def test_round_trip_through_native_json(tmp_path):
    g = load_graph(mlp(tmp_path), training_costs=True)
    back = native.from_dict(native.to_dict(g))
    assert np.array_equal(back.work_backward, g.work_backward)
    assert np.array_equal(back.stash, g.stash)
    assert back.stash[g.index["relu"]] == 4 * 16 * 4


def test_no_gradient_through_indices_and_masks(tmp_path):
    """ids -> Greater -> Cast: no gradient (integer and boolean results); Gather of a weight
    table keeps the indices; Mul by the mask: one gradient, the mask kept."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="gather", axis=0),
        helper.make_node("Greater", ["ids", "zero"], ["pos"], name="greater"),
        helper.make_node("Cast", ["pos"], ["mask"], name="cast", to=F),
        helper.make_node("Unsqueeze", ["mask", "axis"], ["mask3"], name="unsqueeze"),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"], name="mul"),
        helper.make_node("ReduceSum", ["masked", "axis"], ["y"], name="sum", keepdims=0),
    ]
    inits = [
        weight("table", [10, 4]),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis"),
    ]
    path = save(tmp_path, nodes, [vi("ids", [2, 3], TensorProto.INT64)], [vi("y", [2, 3])], inits)
    got = costs_by_name(load_graph(path, work="roofline", training_costs=True))
    assert got["greater"] == (0.0, 0.0)
    assert got["cast"] == (0.0, 0.0)  # a float result, but nothing it reads has a gradient
    assert got["gather"] == (1.0, 2 * 3 * 8)  # dY scattered by the int64 indices
    assert got["mul"] == (1.0, 2 * 3 * 4)  # d(emb) = dY mask; the mask needs no gradient
    assert got["sum"] == (1.0, 0.0)


def test_a_tensor_read_by_several_backwards_is_kept_once(tmp_path):
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="add"),
        helper.make_node("MatMul", ["a", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["a", "wk"], ["k"], name="k"),
        helper.make_node("Mul", ["q", "k"], ["y"], name="qk"),
    ]
    inits = [weight("b", [4, 8]), weight("wq", [8, 8]), weight("wk", [8, 8])]
    path = save(tmp_path, nodes, [vi("x", [4, 8])], [vi("y", [4, 8])], inits)
    got = costs_by_name(load_graph(path, work="flops", training_costs=True))
    assert got["q"] == (2.0, 4 * 8 * 4)
    assert got["k"] == (2.0, 0.0)
    assert got["qk"] == (2.0, 2 * 4 * 8 * 4)  # both operands have gradients: both kept


def op(op_type: str, ins: list[Operand], outs: list[Operand]) -> OpCall:
    return OpCall(op_type, tuple(ins), tuple(outs))


def test_unknown_operators_get_the_graph_defaults():
    w = Operand("w", 64.0, True, weight=True)
    calls = [
        op("Input", [], [Operand("x", 32.0, True, producer=0)]),
        op("MyOp", [Operand("x", 32.0, True, producer=0), w], [Operand("y", 16.0, True, 1)]),
        op("Relu", [Operand("y", 16.0, True, 1)], [Operand("r", 16.0, True, 2)]),
    ]
    got = backward_costs(calls)
    assert isinstance(got, BackwardCosts)
    assert got.factor.tolist() == [0.0, 2.0, 1.0]
    assert got.stash.tolist() == [0.0, 16.0, 16.0]
    assert got.unknown_ops == {"MyOp": 1}


def test_einsum_counts_every_operand_and_the_registry_has_one_rule_per_operator():
    a = Operand("a", 40.0, True, producer=0)
    b = Operand("b", 24.0, True, weight=True)
    c = Operand("c", 8.0, True, weight=True)
    calls = [
        op("Input", [], [a]),
        op("Tanh", [a], [Operand("t", 40.0, True, 1)]),
        op("Einsum", [Operand("t", 40.0, True, 1), b, c], [Operand("y", 8.0, True, 2)]),
    ]
    got = backward_costs(calls)
    assert got.factor.tolist() == [0.0, 0.0, 2.0]  # tanh: its input has no gradient
    assert got.stash.tolist() == [0.0, 0.0, 40.0]  # the weights are parameters, not stashed
    assert RULES["Gemm"] is RULES["MatMul"] and RULES["Shape"].factor == 0.0


def test_measured_work_keeps_the_factor_of_the_table():
    g = Graph.build(
        ["a", "b", "c"],
        [1.0, 2.0, 0.0],
        [4.0, 4.0, 4.0],
        np.array([[0, 1], [1, 2]]),
        work_backward=[2.0, 1.0, 0.0],
        stash=[4.0, 0.0, 0.0],
    )
    timed = rescaled_backward(g, g.with_work(np.array([3.0, 5.0, 7.0])))
    assert timed.work_backward.tolist() == [6.0, 2.5, 0.0]
    assert timed.stash.tolist() == [4.0, 0.0, 0.0]
    plain = Graph.build(["a"], [1.0], [4.0], np.zeros((0, 2), dtype=np.int64))
    assert rescaled_backward(plain, plain.with_work(np.array([2.0]))).work_backward is None


def test_a_llama_layer_keeps_the_documented_bytes(tmp_path):
    """docs/training.md: sbh (28 + 10 f / h) + 2 a s^2 b bytes per layer (fp16), plus the
    per-row statistics of each RMSNorm (2 s b bytes twice), the token ids and the final norm."""
    shape = llama.LlamaShape(layers=2, hidden=64, mlp=160, heads=4, kv_heads=4, vocab=128, seq=16)
    g = load_graph(llama.write(shape, tmp_path / "llama.onnx"), training_costs=True)
    s, b, h, f, a = shape.seq, shape.batch, shape.hidden, shape.mlp, shape.heads
    sbh = s * b * h
    layer = sbh * 28 + 10 * s * b * f + 2 * a * s * s * b + 2 * (2 * 2 * s * b)
    final_norm = 6 * sbh + 2 * 2 * s * b
    assert g.stash.sum() == shape.layers * layer + 8 * s * b + final_norm
    matmuls = [i for i, op in enumerate(g.op_types) if op == "MatMul"]
    assert np.allclose(g.work_backward[matmuls], 2 * g.work[matmuls])


def test_the_docs_table_lists_every_rule():
    """Every operator of the table in docs/training.md has the factor of RULES, and back."""
    text = (Path(__file__).parents[3] / "docs" / "training.md").read_text()
    section = text.split("## Backward costs of ONNX operators")[1].split("\n\n**")[0]
    listed: dict[str, float] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("operators", "---"):
            continue
        factor = float(Fraction(cells[1].split()[0]))
        listed.update(dict.fromkeys(cells[0].split(", "), factor))
    assert listed == {op: rule.factor for op, rule in RULES.items()}


def test_a_training_command_reads_the_table_and_an_inference_command_does_not(tmp_path):
    path = str(mlp(tmp_path))
    base = dict(graph=path, cluster=None, devices=None, dim=[], work="roofline", memory=None)
    g, _ = load_graph_and_cluster(argparse.Namespace(**base, schedule="1f1b"))
    assert g.stash is not None and g.stash[g.index["relu"]] == 4 * 16 * 4
    g, _ = load_graph_and_cluster(argparse.Namespace(**base, schedule=None))
    assert g.work_backward is None and g.stash is None


def test_an_operator_without_gradient_stops_it_for_its_consumers():
    x = Operand("x", 32.0, True, producer=0)
    w = Operand("w", 64.0, True, weight=True)
    calls = [
        op("Input", [], [x]),
        op("Mul", [x, w], [Operand("t", 32.0, True, 1)]),  # dW = dT x keeps x
        op("Floor", [Operand("t", 32.0, True, 1)], [Operand("f", 32.0, True, 2)]),
        op("MatMul", [Operand("f", 32.0, True, 2), w], [Operand("y", 16.0, True, 3)]),
    ]
    got = backward_costs(calls)
    # Floor has none, so the product computes dW alone (1 x) and keeps f for it
    assert got.factor.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert got.stash.tolist() == [0.0, 32.0, 0.0, 32.0]


def test_inspect_shows_training_costs_only_when_asked(tmp_path, capsys):
    path = str(mlp(tmp_path))
    assert main(["inspect", path, "--json", "--top", "1"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "work_backward" not in plain and "stash" not in plain["heaviest"][0]
    assert main(["inspect", path, "--json", "--top", "1", "--training-costs"]) == 0
    got = json.loads(capsys.readouterr().out)
    g = load_graph(path, training_costs=True)
    assert got["stash"] == float(g.stash.sum()) == 4 * 8 * 4 + 4 * 16 * 4 + 4 * 4 * 4
    assert got["work_backward"] == pytest.approx(float(g.work_backward.sum()), rel=1e-12)
    top = got["heaviest"][0]
    assert top["stash"] == g.stash[g.index[top["name"]]]
    assert {k: v for k, v in got.items() if k not in ("work_backward", "stash", "heaviest")} == {
        k: v for k, v in plain.items() if k != "heaviest"
    }
