"""Measured node times: run the model in onnxruntime with profiling and read per-node kernels.

Graph optimisations are disabled so that every kernel keeps its ONNX node name; one thread, a
warm-up run, then the mean over ``runs``. Times of view and static ONNX nodes are added to the
cost node they were folded into.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from solver.errors import MtppError
from solver.graph import Graph


def random_inputs(model, shapes_by_name: dict[str, tuple[int, ...]] | None = None, seed: int = 0):
    """Seeded random feeds for every real graph input, with dims as fixed in ``model``."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if shapes_by_name and inp.name in shapes_by_name:
            shape = list(shapes_by_name[inp.name])
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if np.issubdtype(dt, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            feeds[inp.name] = rng.random(shape) < 0.5
        else:  # ids and masks: small non-negative integers are valid for embeddings
            feeds[inp.name] = rng.integers(0, 2, shape).astype(dt)
    return feeds


def measured_work(path: Path, model, g: Graph, runs: int = 5) -> np.ndarray:
    """Seconds per cost node from an onnxruntime profile of this machine."""
    import onnx
    import onnxruntime as ort

    from solver.io.onnx_import import _node_names

    named = onnx.ModelProto()
    named.CopyFrom(model)
    for node, name in zip(named.graph.node, _node_names(model), strict=True):
        node.name = name
    with tempfile.TemporaryDirectory() as tmp:
        tmp_model = Path(tmp) / "model.onnx"
        # keep external data where it is: point the copy at the original folder
        for t in named.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = str((path.parent / e.value).resolve())
        onnx.save(named, str(tmp_model))
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "prof")
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        try:
            sess = ort.InferenceSession(str(tmp_model), so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise MtppError(f"onnxruntime cannot run {path} to measure node times: {e}") from None
        feeds = random_inputs(named)
        for _ in range(runs + 1):
            sess.run(None, feeds)
        prof = sess.end_profiling()
        events = json.loads(Path(prof).read_text())
        os.unlink(prof)
    per_node: dict[str, list[float]] = defaultdict(list)
    for ev in events:
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            per_node[ev["name"][: -len("_kernel_time")]].append(ev["dur"] * 1e-6)
    mean = {k: float(np.mean(v[len(v) // (runs + 1) :])) for k, v in per_node.items()}
    work = np.zeros(g.n)
    for i, cname in enumerate(g.names):
        for onnx_name in g.hints["members"].get(cname, []):
            work[i] += mean.get(onnx_name, 0.0)
    return work
