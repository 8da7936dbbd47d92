"""Cost-graph formats: the dnn-partitioning importer and native JSON errors."""

import json
import math

import numpy as np
import pytest

from solver.core.cluster import load_cluster
from solver.core.cost import evaluate
from solver.core.errors import MtppError
from solver.core.files import read_yaml
from solver.core.units import parse_quantity
from solver.frontends import load_graph, resolve_cluster
from tests.conftest import bench_path

LAYER_COUNTS = {  # nodes, edges, k
    "LayerGraphs/bert24_inference": (32, 55, 6),
    "LayerGraphs/gnmt_inference": (96, 122, 6),
    "LayerGraphs/resnet50_inference": (177, 193, 6),
    "LayerGraphs/inceptionv3_inference": (326, 363, 6),
    "LayerGraphs/bert24_training": (64, 110, 6),
    "LayerGraphs/gnmt_training": (192, 244, 6),
}


@pytest.mark.parametrize("key", list(LAYER_COUNTS))
def test_layergraph_counts_and_values(key):
    path = bench_path(key)
    raw = json.loads(path.read_text())
    g = load_graph(path)
    n, m, k = LAYER_COUNTS[key]
    assert (g.n, len(g.data_edges[0])) == (n, m)
    c = resolve_cluster(g)
    assert c.devices == k and c.capacity == raw["maxSizePerFPGA"]
    assert c.fast_memory == float("inf")
    by_name = {nd["name"]: nd for nd in raw["nodes"]}
    ids = {nd["id"]: nd["name"] for nd in raw["nodes"]}
    cost = {}
    for e in raw["edges"]:
        cost[ids[e["sourceId"]]] = e["cost"]
    for i, name in enumerate(g.names):
        nd = by_name[name]
        assert g.work[i] == nd["fpgaLatency"]
        # io time of the node's output equals the file's edge cost
        assert g.sizeout[i] / c.link_bandwidth == pytest.approx(cost.get(name, 0.0), rel=1e-12)
    assert g.param_bytes_total == pytest.approx(sum(nd["size"] for nd in raw["nodes"]))
    if "training" in key:
        assert g.m < len(g.data_edges[0])  # backward edges do not order blocks
        assert len(g.groups) == n // 2


def test_their_cost_model_on_a_two_block_split():
    path = bench_path("LayerGraphs/bert24_inference")
    raw = json.loads(path.read_text())
    g = load_graph(path)
    c = resolve_cluster(g)
    a = np.zeros(g.n, dtype=int)
    a[g.topo_order[g.n // 2 :]] = 1
    ev = evaluate(g, c, a)
    # recompute their load by hand: latency + cost once per sender + once per receiving device
    ids = {nd["id"]: g.index[nd["name"]] for nd in raw["nodes"]}
    load = [0.0, 0.0]
    for nd in raw["nodes"]:
        load[a[ids[nd["id"]]]] += nd["fpgaLatency"]
    sent, recv = set(), set()
    for e in raw["edges"]:
        u, v = ids[e["sourceId"]], ids[e["destId"]]
        if a[u] != a[v]:
            if u not in sent:
                load[a[u]] += e["cost"]
                sent.add(u)
            if (u, a[v]) not in recv:
                load[a[v]] += e["cost"]
                recv.add((u, a[v]))
    assert ev.f[:2].tolist() == pytest.approx(load, rel=1e-12)
    assert ev.f[2:].tolist() == [0.0] * (c.devices - 2)


def write(tmp_path, text, name="g.json"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "unknown graph format"),
        ('{"format": "mtpp-graph", "nodes": []}', "key 'nodes'"),
        ('{"format": "mtpp-graph", "nodes": [{"name": "a"}]}', "key 'nodes.0.work'"),
        (
            '{"format": "mtpp-graph", "nodes": [{"name": "a", "work": 1}], "edges": [["a", "b"]]}',
            "unknown node 'b'",
        ),
        ('{"format": "mtpp-graph", "nodes": [{"name": "a", "work": -1}]}', "greater than or equal"),
        (
            '{"format": "mtpp-graph", "nodes": [{"name": "a", "work": 1},'
            ' {"name": "b", "work": 1}], "edges": [["a", "b"], ["b", "a"]]}',
            "cycle",
        ),
        ('{"format": "mtpp-graph", "nodes": [{"name": "a", "work": 1, "colour": 2}]}', "colour"),
    ],
)
def test_bad_native_files(tmp_path, text, match):
    with pytest.raises(MtppError, match=match):
        load_graph(write(tmp_path, text))


def test_unknown_file_type(tmp_path):
    """The kind comes from the content: protobuf bytes are read as ONNX whatever the name."""
    p = tmp_path / "model.pb"
    p.write_bytes(b"\x08\x01binary")
    with pytest.raises(MtppError, match="not a valid ONNX model"):
        load_graph(p)
    p = tmp_path / "model.yaml"
    p.write_text("nodes: []")
    with pytest.raises(MtppError, match="neither an ONNX model nor a graph JSON"):
        load_graph(p)


def test_missing_file(tmp_path):
    with pytest.raises(MtppError, match="no such file"):
        load_graph(tmp_path / "nope.json")


def test_units_and_presets():
    assert parse_quantity("900MiB", "bytes") == 900 * 2**20
    assert parse_quantity("64GB/s", "bandwidth") == 64e9
    assert parse_quantity("250TFLOPS", "flops") == 250e12
    assert parse_quantity("1.5ms", "time") == 1.5e-3
    with pytest.raises(MtppError, match="unknown unit 'parsecs'"):
        parse_quantity("3parsecs", "bytes")
    c = load_cluster("ipu-m2000")
    assert c.devices == 4 and c.fast_memory == 900e6 and c.link_bandwidth == 64e9
    assert load_cluster(None, devices=7).devices == 7
    assert load_cluster("dgx-a100").devices == 8
    with pytest.raises(MtppError, match="no such file or preset"):
        load_cluster("tpu-v9")


def test_bad_cluster_yaml(tmp_path):
    p = write(tmp_path, "devices: 2\nfast_memry: 1GB\n", "c.yaml")
    with pytest.raises(MtppError, match="fast_memry"):
        load_cluster(p)
    p = write(tmp_path, "devices: 2\nlink_bandwidth: fast\n", "c.yaml")
    with pytest.raises(MtppError, match="link_bandwidth: cannot read 'fast'"):
        load_cluster(p)


@pytest.mark.parametrize(
    "value, kind, expected",
    [
        ("900MiB", "bytes", 900 * 2**20),
        (" 2 GB ", "bytes", 2e9),
        (1024, "bytes", 1024.0),
        ("inf", "bytes", math.inf),
        (math.inf, "bytes", math.inf),
        ("100Gbit/s", "bandwidth", 12.5e9),
        ("0s", "time", 0.0),
    ],
)
def test_quantities_read(value, kind, expected):
    assert parse_quantity(value, kind) == expected


@pytest.mark.parametrize(
    "value, match",
    [
        ("1e999GB", "'1e999GB' is too large; write 'inf' for unlimited"),
        ("-3GB", "must be a non-negative quantity, got '-3GB'"),
        ("nan", "cannot read 'nan'"),
        (math.nan, "must be a non-negative quantity, got nan"),
        (True, "expected a quantity in B .*, got True"),
        (None, "expected a quantity in B .*, got None"),
        (10**400, "the number is too large"),
        ("1" + " " * 200 + "x", "a quantity of 202 characters"),
        ("3 parsecs", "unknown unit 'parsecs'"),
    ],
)
def test_quantities_refused(value, match):
    with pytest.raises(MtppError, match=match):
        parse_quantity(value, "bytes", "fast_memory")


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    """A merge (<<) may be overridden by an explicit key; two explicit keys may not."""
    p = write(tmp_path, "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 5\n", "m.yaml")
    assert read_yaml(p) == {"base": {"x": 1, "y": 2}, "other": {"x": 5, "y": 2}}
    p = write(tmp_path, "other:\n  x: 1\n  y: 2\n  x: 5\n", "d.yaml")
    with pytest.raises(MtppError, match="duplicate key 'x' at line 4 column 3"):
        read_yaml(p)


def test_dnn_partitioning_flags_and_classes(tmp_path):
    """0/1 and booleans are both read as isBackwardNode; colour classes may be ints or names."""
    d = {
        "maxFPGAs": 3,
        "nodes": [
            {"id": 10, "name": "f", "fpgaLatency": 1, "isBackwardNode": 0, "colorClass": "L"},
            {"id": 11, "name": "b", "fpgaLatency": 2, "isBackwardNode": True, "colorClass": "L"},
            {"id": 12, "name": "x", "fpgaLatency": 3, "isBackwardNode": 1},
        ],
        "edges": [{"sourceId": 10, "destId": 11, "cost": 1.0}],
    }
    g = load_graph(write(tmp_path, json.dumps(d)))
    assert g.work.tolist() == [1.0, 2.0, 3.0] and g.m == 0  # the only edge is backward
    assert [m.tolist() for m in g.groups] == [[0, 1]]
    assert resolve_cluster(g).devices == 3
