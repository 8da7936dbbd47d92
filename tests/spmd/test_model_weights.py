"""Planners read no weight values: big external weights stay on disk (load_model(weights=False))
and the plan is the same as with the weights loaded."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from solver.joint import plan_joint
from solver.spmd.model import PLANNING_WEIGHT_BYTES, Unloaded, load_model
from tests.joint.test_planner import two_hosts


def _saved(tmp_path):
    """x[8, 640] @ W1[640, 640] (1.6 MB, external) -> Relu -> @ W2[640, 4] (10 KB, external)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((640, 640)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((640, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 640])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    return path


def test_planners_leave_big_external_weights_on_disk(tmp_path):
    path = _saved(tmp_path)
    assert 640 * 640 * 4 > PLANNING_WEIGHT_BYTES > 640 * 4 * 4
    planned = load_model(path, weights=False)
    assert planned.consts["w1"] == Unloaded((640, 640), np.dtype(np.float32))
    assert isinstance(planned.consts["w2"], np.ndarray)  # small: read (may be a shape constant)
    full = load_model(path)
    assert isinstance(full.consts["w1"], np.ndarray) and full.consts["w1"].shape == (640, 640)
    cluster = two_hosts(between=5e8)
    a = plan_joint(planned, cluster, time_limit=20, workers=1)
    b = plan_joint(full, cluster, time_limit=20, workers=1)
    assert a.objective == b.objective and a.status == b.status
    assert plan_joint(path, cluster, time_limit=20, workers=1).objective == b.objective
