"""The backward of a training sharding plan on emulated devices (``mtpp shard --training
--verify``): weight gradients from the split program against float64 central differences of
the whole model on onnxruntime, with random weights, inputs, output gradients and directions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import sharding_examples as examples
from solver.backends import spmd_execute
from solver.cli import main
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.spmd.model import from_proto
from solver.spmd.solve import solve_sharding
from solver.spmd.training import TrainingSpec
from tests.spmd.test_training_sharding import DP, MEGATRON, mlp2

CL4 = Cluster(
    name="t4", devices=4, compute=1e12, link_bandwidth=1e10, memory_bandwidth=1e15, link_latency=0
)


def _check(model, method="cpsat", config=None, mesh=None):
    res = solve_sharding(
        from_proto(model, {}), cluster=CL4, mesh=mesh, method=method, config=config,
        training=TrainingSpec(), workers=1, time_limit=20,
    )  # fmt: skip
    return spmd_execute.verify_backward(res.planner, res.program, seed=3)


@pytest.mark.parametrize(
    "config",
    [
        {**DP, "fc0": [[4, 1], [1, 1]]},  # gradient AllReduce of every weight
        {**MEGATRON, "fc0": [[1, 1], [1, 1]]},  # the backward AllReduce of fc1's input
        {**MEGATRON, "fc0": [[4, 1], [1, 1]]},  # AllGather forward, ReduceScatter backward
        {"fc0": [[2, 1], [1, 2]], "fc1": [[1, 2], [2, 2]], "fc2": [[2, 2], [2, 1]]},  # mixed
    ],
)
def test_backward_of_pinned_plans_matches_numerical_gradients(config):
    report = _check(mlp2(16, 32, 64, first=True), method="propagate", config=config)
    assert report["ok"], report
    assert report["weights"] == 3
    assert report["max_rel_error"] < spmd_execute.GRADIENT_TOLERANCE


@pytest.mark.parametrize("mesh", [None, (2, 2)])
def test_backward_of_gemm_with_bias_under_every_method(mesh):
    """Gemm (transB, bias) layers: the bias is added on one partial-sum device, its gradient
    taken there only; the exact plan and the heuristics all check."""
    model = examples.mlp(seed=1, batch=16, sizes=(16, 32, 32, 8))
    for method in ("cpsat", "dp", "megatron"):
        report = _check(model, method=method, mesh=mesh)
        assert report["ok"], (method, report)
        assert report["weights"] == 6
    split_k = {"fc1": [[1, 4], [1, 4], [1]]}  # contraction split: partial sums, bias once
    report = _check(model, method="propagate", config=split_k)
    assert report["ok"], report


def test_a_missing_gradient_reduction_fails(monkeypatch):
    """Verification can fail: with the partial sums of every gradient ignored, data-parallel
    replicas of a weight gradient disagree."""
    monkeypatch.setattr(
        spmd_execute,
        "gradient_layout",
        lambda sh, k: sh.in_layouts[k],
    )
    report = _check(mlp2(16, 32, 64), method="dp")
    assert not report["ok"]
    assert "replica that differs" in report["error"]


def test_a_wrong_local_gradient_fails(monkeypatch):
    """A MatMul whose weight gradient is off by 1% is caught against the numerical one."""
    real = spmd_execute._matmul_vjp

    def off(a, b, g):
        ga, gb = real(a, b, g)
        return [ga, 1.01 * gb]

    monkeypatch.setattr(spmd_execute, "_matmul_vjp", off)
    report = _check(mlp2(16, 32, 64), method="megatron")
    assert not report["ok"]
    assert report["error"].startswith("the gradient of 'w")


def test_operators_without_an_emulated_backward_are_refused():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "soft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(MtppError) as info:
        _check(model, method="dp")
    assert str(info.value) == (
        "--verify --training runs the backward of MatMul, Gemm, Add, Sub, Mul, Relu, Tanh, "
        "Sigmoid, Identity only; node 'softmax' is a Softmax: verify without --training"
    )


def test_cli_training_verify(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp2(16, 32, 64, first=True), path)
    argv = ["shard", str(path), "--devices", "4", "--method", "cpsat", "--training", "--verify"]
    assert main([*argv, "--workers", "1", "--time-limit", "20"]) == 0
    out = capsys.readouterr().out
    assert "verify backward: ok, 3 weight gradients against numerical ones" in out
