"""Measured node times: run the model in onnxruntime with profiling and read per-node kernels.

Graph optimisations are disabled so that every kernel keeps its ONNX node name; one thread, a
warm-up run, then the mean over ``runs``. Times of view and static ONNX nodes are added to the
cost node they were folded into. External weights are read by onnxruntime from the model's
folder, never by Python; a run that would not fit in the available memory (weights as
onnxruntime holds them, plus the activation peak) is refused first, unless ``memory_ok``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from solver.core.errors import MtppError, first_line
from solver.core.graph import Graph
from solver.core.units import format_bytes
from solver.frontends.onnx.common import node_names
from solver.frontends.onnx.ort import (
    activation_peak,
    check_memory,
    random_inputs,
    session,
    weight_bytes,
    weights_detail,
)

__all__ = ["measured_work", "random_inputs"]


def measured_work(
    path: Path, model, g: Graph, runs: int = 5, memory_ok: bool = False
) -> np.ndarray:
    """Seconds per cost node from an onnxruntime profile of this machine.

    ``memory_ok`` skips the memory check (the caller already checked, or was told to run).
    """
    import onnx  # heavy: onnx
    import onnxruntime as ort

    if not memory_ok:
        acts, (stored, held) = activation_peak(g), weight_bytes(model)
        check_memory(
            acts + held,
            "--work measured: running the model at these dims",
            f"activations {format_bytes(acts)} + {weights_detail(stored, held)}",
            "use smaller --dim values or --work roofline",
        )
    named = onnx.ModelProto()
    named.CopyFrom(model)
    for node, name in zip(named.graph.node, node_names(model), strict=True):
        node.name = name
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "prof")
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = session(named, Path(path).parent, so, what=f"run {path} to measure node times")
        feeds = random_inputs(named)
        try:
            for _ in range(runs + 1):
                sess.run(None, feeds)
        except Exception as e:  # onnxruntime raises its own exception types
            raise MtppError(
                f"onnxruntime failed running {path} to measure node times: {first_line(e)}"
            ) from None
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
