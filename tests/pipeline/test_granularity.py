"""Module paths from torch-exported ONNX (both exporters' forms) and layer-granular plans:
the restricted optimum is the best plan cutting only between modules (brute force over the
units), never below the operator-level optimum, and its price is certified."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.errors import MtppError
from solver.frontends.onnx.load import read_model
from solver.frontends.onnx.modules import (
    cost_node_modules,
    dynamo_module,
    legacy_module,
    module_layout,
    onnx_node_modules,
)
from solver.frontends.onnx.reader import load_onnx
from solver.pipeline import registry
from solver.pipeline.granularity import (
    GRANULARITY_KEY,
    restrict_to_layers,
    solve_layer_granular,
)
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import OPTIMAL

HIDDEN = (64, 64, 64, 64, 64)  # widths: embed -> layers.0 .. layers.3 (two equal MatMuls each)
FAST_LINKS = 1e13  # bytes/s: cutting inside a layer pays off


def _node(op, ins, out, module, style, i):
    """An ONNX node in module ``module`` named as the legacy exporter names it, or carrying
    the dynamo exporter's metadata (full-path or local name scopes)."""
    if style == "legacy":
        name = f"/{module.replace('.', '/')}/{op}" if module else f"/{op}"
        return helper.make_node(op, ins, [out], name=name)
    node = helper.make_node(op, ins, [out], name=f"node_{op}_{i}")
    parts = module.split(".") if module else []
    if style == "dynamo":
        scopes = ["", *(".".join(parts[: j + 1]) for j in range(len(parts))), f"{op.lower()}_{i}"]
        helper.set_metadata_props(node, {"pkg.torch.onnx.name_scopes": repr(scopes)})
    elif style == "namespace":
        chain = [f"{'.'.join(parts[: j + 1])}: Mod{j}" for j in range(len(parts))]
        helper.set_metadata_props(node, {"namespace": "/".join([*chain, f"node_{i}: aten.op"])})
    return node


def layered_model(style: str, rng_seed: int = 0):
    """embed (MatMul) -> root Add (glue) -> layers.0..3 (fc MatMul, proj MatMul) -> head MatMul."""
    rng = np.random.default_rng(rng_seed)
    inits, nodes = [], []

    def weight(name, shape):
        arr = rng.standard_normal(shape).astype(np.float32)
        inits.append(numpy_helper.from_array(arr, name))
        return name

    nodes.append(_node("MatMul", ["x", weight("We", (8, HIDDEN[0]))], "e", "embed", style, 0))
    nodes.append(_node("Add", ["e", weight("pos", (HIDDEN[0],))], "h0", "", style, 1))
    h = "h0"
    for layer in range(4):
        w = weight(f"W{layer}", (HIDDEN[layer], HIDDEN[layer + 1]))
        mod = f"layers.{layer}"
        nodes.append(_node("MatMul", [h, w], f"m{layer}", f"{mod}.fc", style, 2 + 2 * layer))
        w2 = weight(f"V{layer}", (HIDDEN[layer + 1], HIDDEN[layer + 1]))
        nodes.append(
            _node("MatMul", [f"m{layer}", w2], f"h{layer + 1}", f"{mod}.proj", style, 3 + 2 * layer)
        )
        h = f"h{layer + 1}"
    nodes.append(_node("MatMul", [h, weight("Wh", (HIDDEN[4], 8))], "y", "head", style, 10))
    graph = helper.make_graph(
        nodes,
        "layered",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 8])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _load(tmp_path, style):
    path = tmp_path / f"{style}.onnx"
    save(layered_model(style), str(path))
    g = load_onnx(path)
    return g, cost_node_modules(read_model(path), g)


UNITS = ("embed", "layers.0", "layers.1", "layers.2", "layers.3", "head")


# ---------------------------------------------------------------------- reading module paths
def test_legacy_names_give_module_paths():
    assert (
        legacy_module("/model/layers.3/self_attn/q_proj/MatMul")
        == "model.layers.3.self_attn.q_proj"
    )
    assert legacy_module("/Add") == ""
    assert legacy_module("MatMul_12") is None


def test_dynamo_metadata_gives_module_paths():
    full = _node("MatMul", ["a", "b"], "c", "transformer.h.0.attn", "dynamo", 0)
    assert dynamo_module(full) == "transformer.h.0.attn"
    local = helper.make_node("Relu", ["a"], ["b"], name="n")
    helper.set_metadata_props(
        local, {"pkg.torch.onnx.name_scopes": "['', 'h', '0', 'mlp', 'relu_3']"}
    )
    assert dynamo_module(local) == "h.0.mlp"
    spaced = _node("Relu", ["a"], "b", "model.layers.2", "namespace", 7)
    assert dynamo_module(spaced) == "model.layers.2"
    assert dynamo_module(helper.make_node("Relu", ["a"], ["b"], name="/x/Relu")) is None


@pytest.mark.parametrize("style", ["legacy", "dynamo", "namespace"])
def test_units_of_both_exporters_agree(tmp_path, style):
    g, paths = _load(tmp_path, style)
    per_node = onnx_node_modules(layered_model(style))
    assert list(per_node.values())[:3] == ["embed", "", "layers.0.fc"]
    layout = module_layout(paths, "m.onnx")
    assert layout.units == UNITS
    assert layout.blocks == UNITS[1:5] and layout.container == "layers"
    assert layout.before_blocks == ("embed",) and layout.after_blocks == ("head",)
    names = dict(zip(g.names, (layout.unit_of(i) for i in range(g.n)), strict=True))
    assert names["input:x"] == "embed"  # graph inputs join the first unit
    glue = [n for n in g.names if paths[g.index[n]] == ""]
    assert len(glue) == 1 and names[glue[0]] == "embed"  # root glue joins the unit before it


def test_graph_without_module_names_is_refused_in_one_line(tmp_path):
    model = layered_model("legacy")
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    path = tmp_path / "plain.onnx"
    save(model, str(path))
    g = load_onnx(path)
    with pytest.raises(MtppError) as e:
        module_layout(cost_node_modules(read_model(path), g), "plain.onnx")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (
        "plain.onnx: --granularity layer needs module names in the ONNX nodes (the dynamo "
        "exporter's name scopes or the legacy exporter's /module/path/Op names), and 0 of 12 "
        "nodes have one; export the model from torch"
    )


# ---------------------------------------------------------------------- layer-granular plans
def _unit_brute_force(g, layout, cluster):
    """The best plan that gives every unit one block: enumerate block per unit."""
    best = None
    node_unit = np.asarray(layout.node_unit)
    for blocks in itertools.product(range(cluster.devices), repeat=len(layout.units)):
        a = np.asarray(blocks)[node_unit]
        if validate(g, cluster, a):
            continue
        f = evaluate(g, cluster, a).objective
        best = f if best is None else min(best, f)
    return best


@pytest.mark.parametrize("k", [2, 3])
def test_layer_optimum_is_best_module_cut_and_above_operator_optimum(tmp_path, k):
    g, paths = _load(tmp_path, "legacy")
    layout = module_layout(paths, "m.onnx")
    cluster = Cluster("c", k, link_bandwidth=FAST_LINKS)
    oracle = _unit_brute_force(g, layout, cluster)
    layer = registry.solve(restrict_to_layers(g, layout), cluster, "brute")
    operator = registry.solve(g, cluster, "brute")
    assert layer.objective == pytest.approx(oracle, rel=1e-12)
    assert layer.objective >= operator.objective - 1e-15
    blocks_per_unit = {
        u: {int(b) for b, v in zip(layer.assignment, layout.node_unit, strict=True) if v == i}
        for i, u in enumerate(layout.units)
    }
    assert all(len(b) == 1 for b in blocks_per_unit.values())


@pytest.mark.parametrize("method", ["idealdp", "cpsat"])
def test_solve_layer_granular_certifies_the_price(tmp_path, method):
    g, paths = _load(tmp_path, "dynamo")
    layout = module_layout(paths, "m.onnx")
    cluster = Cluster("c", 3, link_bandwidth=FAST_LINKS)
    plan = solve_layer_granular(g, layout, cluster, method, SolveOptions(time_limit=20))
    oracle = _unit_brute_force(g, layout, cluster)
    operator = registry.solve(g, cluster, "brute").objective
    assert plan.status == OPTIMAL
    assert plan.objective == pytest.approx(oracle, rel=1e-9)
    rec = plan.stats[GRANULARITY_KEY]
    assert rec["units"] == list(UNITS)
    cost = rec["restriction_cost"]
    assert cost["operator_status"] == OPTIMAL
    assert cost["operator_objective"] == pytest.approx(operator, rel=1e-9)
    assert oracle - operator > 0.1 * operator  # the restriction costs something here
    assert cost["at_least"] == pytest.approx(oracle - operator, abs=1e-6 * oracle)
    assert cost["at_most"] == pytest.approx(oracle - operator, abs=1e-6 * oracle)
    assert cost["at_least"] <= cost["at_most"]
    assert plan.fingerprint == g.fingerprint  # the plan reads back on the plain graph


def test_restriction_keeps_existing_groups(tmp_path):
    g, paths = _load(tmp_path, "legacy")
    layout = module_layout(paths, "m.onnx")
    restricted = restrict_to_layers(g, layout)
    assert len(set(restricted.group.tolist())) == len(UNITS)
    assert len(restricted.groups) == len(UNITS) - 1  # the head is one node: no group
    assert restricted.names == g.names and restricted.fingerprint == g.fingerprint
