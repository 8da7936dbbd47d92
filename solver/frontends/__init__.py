"""Front ends (files -> :class:`~solver.core.graph.Graph`) and the cluster a graph file implies."""

from __future__ import annotations

import os
from pathlib import Path

from solver.core.cluster import Cluster, cluster_from_dict, load_cluster
from solver.core.errors import MtppError
from solver.core.files import check_regular_file, parse_json, read_head, read_text
from solver.core.graph import Graph
from solver.frontends import dnnpart, native
from solver.frontends.onnx.reader import load_onnx

GRAPH_FORMATS = "an ONNX model (.onnx), an mtpp graph JSON, or a dnn-partitioning JSON"


# The first byte of a serialised onnx.ModelProto: the tag of one of its fields (field number << 3
# | wire type), in the order protobuf writes them; ir_version (0x08) comes first in every model
# the onnx package saves. No JSON text starts with any of these bytes.
ONNX_FIRST_BYTES = frozenset(
    {0x08, 0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA, 0xD2}
)


def is_onnx_file(path: str | Path) -> bool:
    """Whether a graph file holds an ONNX model, read from its first bytes (not its name):
    text starting with ``{`` or ``[`` is a graph JSON, a protobuf field tag an ONNX model. A
    path with no file behind it has no content: its name decides, so that a command refuses
    what it would refuse for that kind of file before it says the file is missing."""
    if not os.path.lexists(path):
        return Path(path).suffix.lower() == ".onnx"
    head = _head(path)
    return bool(head) and head[0] in ONNX_FIRST_BYTES


def _head(path: str | Path) -> bytes:
    """The file's first bytes past a UTF-8 byte-order mark and white space."""
    return read_head(path, 64, "file").lstrip(b"\xef\xbb\xbf \t\r\n")


def load_graph(path: str | Path, **onnx_options) -> Graph:
    """Load a graph file of any supported format, the format read from the file's content.

    ``onnx_options`` go to the ONNX front end (dims, work model, cluster for roofline times).
    """
    path = Path(path)
    if not path.exists():
        raise MtppError(f"{path}: no such file")
    if is_onnx_file(path):
        check_regular_file(path, "model file")  # no size limit: weights may be large
        return load_onnx(path, **onnx_options)
    text = read_text(path, "graph file")  # the size limit before the content
    head = text.lstrip()[:16]
    if not head:
        raise MtppError(f"{path}: empty file; expected {GRAPH_FORMATS}")
    if head[:1] not in ("{", "["):
        raise MtppError(
            f"{path}: neither an ONNX model nor a graph JSON (it starts with {head!r}); "
            f"expected {GRAPH_FORMATS}"
        )
    data = parse_json(text, path)
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
