"""Front ends (files -> :class:`~solver.core.graph.Graph`) and the cluster a graph file implies."""

from __future__ import annotations

from pathlib import Path

from solver.core.cluster import Cluster, cluster_from_dict, load_cluster
from solver.core.errors import MtppError
from solver.core.files import check_regular_file, parse_json, read_text
from solver.core.graph import Graph
from solver.frontends import dnnpart, native
from solver.frontends.onnx.reader import load_onnx

GRAPH_FORMATS = "an ONNX model (.onnx), an mtpp graph JSON, or a dnn-partitioning JSON"


def load_graph(path: str | Path, **onnx_options) -> Graph:
    """Load a graph file of any supported format (chosen by suffix and content).

    ``onnx_options`` go to the ONNX front end (dims, work model, cluster for roofline times).
    """
    path = Path(path)
    if not path.exists():
        raise MtppError(f"{path}: no such file")
    if path.suffix.lower() == ".onnx":
        check_regular_file(path, "model file")  # no size limit: weights may be large
        return load_onnx(path, **onnx_options)
    text = read_text(path, "graph file")
    try:
        data = parse_json(text, path)
    except MtppError:
        looks_json = text.lstrip()[:1] in ("{", "[")
        if path.suffix.lower() != ".json" and not looks_json:  # say what we expected
            raise MtppError(
                f"{path}: unknown graph file type {path.suffix or '(no suffix)'!r}; expected "
                f"{GRAPH_FORMATS}"
            ) from None
        raise
    if native.looks_like(data):
        return native.from_dict(data, str(path))
    if dnnpart.looks_like(data):
        return dnnpart.from_dict(data, path.stem, str(path))
    raise MtppError(f"{path}: unknown graph format; expected {GRAPH_FORMATS}")


def resolve_cluster(g: Graph, spec: str | None = None, devices: int | None = None) -> Cluster:
    """The cluster to use: ``spec`` (preset or YAML) if given, else what the graph file states,
    else the default preset; ``devices`` overrides k in every case."""
    if spec is not None:
        return load_cluster(spec, devices)
    hint = g.hints.get("cluster")
    if hint:
        return cluster_from_dict(dict(hint), f"cluster stated by graph {g.name!r}").with_devices(
            devices
        )
    return load_cluster(None, devices)
