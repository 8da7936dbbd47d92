"""ONNX front end: a real model in, a faithful cost graph out.

The steps, each in its own module:

1. :mod:`solver.frontends.onnx.load` reads the protobuf *without* external weight bytes (sizes come
   from dims and types, so a 10 GB model is inspected in bounded memory), checks external data
   by path and ``stat`` only, and runs the ONNX checker;
2. :mod:`solver.frontends.onnx.shapes` fixes dynamic input dims from ``--dim NAME=VALUE`` and infers
   every shape (onnx with data propagation, constant folding from :mod:`solver.frontends.onnx.fold`,
   onnxruntime's symbolic inference);
3. when tensors the cost graph needs are still unknown (control flow, data-dependent shapes),
   one onnxruntime run at the fixed dims reads them (:mod:`solver.frontends.onnx.ort`), and the user
   is told (steps 1-3 are :func:`solver.frontends.onnx.shapes.read_static`, through which the
   sharding planner reads models too);
4. :mod:`solver.frontends.onnx.graph` folds the model into cost-graph nodes, one tensor per output;
5. ``--work measured`` times every node in onnxruntime (:mod:`solver.frontends.onnx.profile`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from solver.core.cluster import Cluster, load_cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.frontends.onnx import profile  # the module: tests replace profile.measured_work
from solver.frontends.onnx.backward import rescaled_backward
from solver.frontends.onnx.graph import ShapesUnknown, build_cost_graph
from solver.frontends.onnx.load import check_external_paths, read_model
from solver.frontends.onnx.shapes import fix_dims, infer_shapes, read_static, with_run


def load_onnx(
    path: str | Path,
    dims: dict[str, int] | None = None,
    work: str = "roofline",
    cluster: str | Cluster | None = None,
    devices: int | None = None,
    memory_ok: bool = False,
    training_costs: bool = False,
) -> Graph:
    """Read an ONNX file into a cost graph. ``cluster`` (preset, YAML or a :class:`Cluster`,
    such as the one a plan records) sets the roofline; ``memory_ok`` lets ``work="measured"``
    run past its memory estimate; ``training_costs`` gives every node its backward work and
    stash from the operator table (:mod:`solver.frontends.onnx.backward`)."""
    path = Path(path)
    if work not in ("roofline", "flops", "measured"):
        raise MtppError(f"--work {work!r}: choose roofline, flops or measured")
    # the shapes the cost graph needs: the model runs only for those inference left unknown
    loaded = read_static(path, dict(dims or {}), complete=False)
    if isinstance(cluster, Cluster):
        cl = cluster.with_devices(devices)
    else:
        cl = load_cluster(cluster, devices)
    cost_work = "roofline" if work == "measured" else work
    try:
        g = build_cost_graph(
            loaded.model,
            loaded.shapes,
            name=path.stem,
            work=cost_work,
            cluster=cl,
            training=training_costs,
        )
    except ShapesUnknown as e:
        loaded = with_run(loaded, e.tensors)
        warnings.warn(loaded.note, stacklevel=2)
        g = build_cost_graph(
            loaded.model,
            loaded.shapes,
            name=path.stem,
            work=cost_work,
            cluster=cl,
            training=training_costs,
        )
    g.hints["dims"] = loaded.fixed
    g.hints["roofline_cluster"] = cl.name
    if loaded.note:
        g.hints["shapes_from_run"] = loaded.note
    if work == "measured":
        g = rescaled_backward(
            g, g.with_work(profile.measured_work(path, loaded.model, g, memory_ok=memory_ok))
        )
        g.hints["work_model"] = "measured"
    return g


__all__ = [
    "build_cost_graph",
    "check_external_paths",
    "fix_dims",
    "infer_shapes",
    "load_onnx",
    "read_model",
]
