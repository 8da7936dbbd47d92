"""Operator-level sharding: mesh and layouts, operator rules, propagation, program cost."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import sharding_examples as examples
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.spmd.config import from_attributes
from solver.spmd.mesh import Layout, Mesh, canonical, parse_mesh, same_placement
from solver.spmd.model import from_proto
from solver.spmd.program import Planner, evaluate
from solver.spmd.propagate import propagate
from solver.spmd.rules import StrategyError
from solver.spmd.strategy import fmt_strategy, parse_strategy

CLUSTER = Cluster(name="t", devices=8, compute=1e12, link_bandwidth=1e9, memory_bandwidth=1e12)


def planner(model, devices=8, mesh=None, cluster=CLUSTER):
    sm = from_proto(model, {})
    shape = mesh or (devices,)
    m = Mesh(shape, (cluster.link_bandwidth,) * len(shape), (0.0,) * len(shape))
    return Planner(sm, m, cluster)


# ---------------------------------------------------------------------- mesh and layouts
def test_seed_matmul_layout_example():
    """((2, 1), (1, 4)) on 8 devices: devices 0-3 hold X0, 4-7 X1; 0 and 4 hold W0, ..."""
    pl = planner(examples.ffn())
    sh = pl.sharding(0, ((2, 1), (1, 4)))
    x, w = sh.in_layouts
    assert sh.device_matrix == (2, 1, 4)
    assert x.device_matrix == w.device_matrix == (2, 1, 4)
    assert x.tensor_map == [2, 1] and w.tensor_map == [1, 0]
    x_part = [x.block(d)[0].start // 32 for d in range(8)]
    assert x_part == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(x.block(d)[1] == slice(0, 64) for d in range(8))  # X's columns are whole
    w_part = [w.block(d)[1].start // 16 for d in range(8)]
    assert w_part == [0, 1, 2, 3, 0, 1, 2, 3]
    assert x.local_shape == (32, 64) and w.local_shape == (64, 16)
    y = sh.out_layouts[0]
    assert y.tensor_map == [2, 0] and y.partial == () and y.local_shape == (32, 16)
    assert sh.local_flops == 2 * 32 * 16 * 64


def test_parse_mesh_and_group_links():
    assert parse_mesh(None, 8) == (8,)
    assert parse_mesh("2x4", 8) == (2, 4)
    with pytest.raises(MtppError, match="multiplies to 6 devices but --devices is 8"):
        parse_mesh("2x3", 8)
    with pytest.raises(MtppError, match="--mesh"):
        parse_mesh("2xa", 8)
    mesh = Mesh((2, 4), (1e9, 1e11), (1e-6, 1e-7))
    assert mesh.group_link((2, 4), 0) == (1e9, 1e-6)  # devices 0 and 4: across mesh axis 0
    assert mesh.group_link((2, 4), 1) == (1e11, 1e-7)
    assert mesh.group_link((8,), 0) == (1e9, 1e-6)  # spans both: the slower axis
    assert mesh.group_link((4, 2), 1) == (1e11, 1e-7)  # devices 0, 1: inside a row


def test_canonical_forms_agree_across_device_matrices():
    a = Layout((64, 64), (2, 1, 4), ((0,), (2,)))
    b = Layout((64, 64), (2, 4), ((0,), (1,)))
    c = Layout((64, 64), (8,), ((0,), ()))
    d = Layout((64, 64), (2, 4), ((0, 1), ()))
    assert same_placement(a, b) and canonical(a) == canonical(b)
    assert same_placement(c, d)
    assert not same_placement(b, d)
    with pytest.raises(ValueError):
        Layout((6, 4), (4,), ((0,), ()))  # 6 rows do not split 4 ways


# ---------------------------------------------------------------------- rules
def test_add_broadcast_bias_and_matmul_partial_sums():
    pl = planner(examples.ffn())
    add = pl.sharding(1, ((2, 4), (4,)))
    assert add.in_layouts[1].tensor_map == [0] and add.in_layouts[1].local_shape == (16,)
    mm = pl.sharding(3, ((2, 4), (4, 1)))
    out = mm.out_layouts[0]
    assert out.partial == (1,) and out.local_shape == (32, 64)
    assert out.to_dict()["partial"] == [1]  # seed convention: axes counted from the right


@pytest.mark.parametrize(
    "strategy, message",
    [
        (((2, 1),), "has 1 tuple\\(s\\) but the node has 2 data input"),
        (((3, 1), (1, 1)), "does not divide"),
        (((2, 2), (4, 1)), "must agree"),
        (((2, 1, 1), (1, 4)), "rank 2"),
        (((16, 1), (1, 1)), "does not divide the 8 devices|does not divide"),
    ],
)
def test_bad_strategies_name_the_problem(strategy, message):
    pl = planner(examples.ffn())
    with pytest.raises(StrategyError, match=message):
        pl.sharding(0, strategy)


def _single(op, inputs, outputs, inits=(), **attrs):
    node = helper.make_node(
        op,
        [i.name for i in inputs] + [t.name for t in inits],
        [o.name for o in outputs],
        name="n",
        **attrs,
    )
    g = helper.make_graph([node], "g", list(inputs), list(outputs), list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_softmax_axis_and_layernorm_axes_cannot_split():
    m = _single("Softmax", [_vi("x", [8, 16])], [_vi("y", [8, 16])], axis=-1)
    pl = planner(m)
    assert pl.sharding(0, ((8, 1),)).out_layouts[0].local_shape == (1, 16)
    with pytest.raises(StrategyError, match="cannot be split"):
        pl.sharding(0, ((1, 2),))
    # every candidate keeps the softmax axis whole
    assert all(c.strategy[0][1] == 1 for c in pl.candidates(0))


def test_reshape_layout_follows_the_view():
    shape = numpy_helper.from_array(np.array([2, 4, 4, 8], dtype=np.int64), "s")
    m = _single("Reshape", [_vi("x", [2, 4, 32])], [_vi("y", [2, 4, 4, 8])], [shape])
    pl = planner(m)
    sh = pl.sharding(0, ((2, 1, 4),))
    assert sh.out_layouts[0].local_shape == (1, 4, 1, 8)  # heads split 4, head dim whole
    with pytest.raises(StrategyError):
        pl.sharding(0, ((1, 1, 8),))  # 8 does not divide the 4 heads


def test_gather_vocabulary_split_is_a_partial_sum_and_batch_split_is_free():
    pl = planner(examples.transformer(layers=1))
    embed = pl.sm.op_by_name("embed").index
    vocab = pl.sharding(embed, ((8, 1), (1, 1)))
    assert vocab.out_layouts[0].partial and vocab.out_layouts[0].local_shape == (2, 16, 32)
    batch = pl.sharding(embed, ((1, 1), (2, 1)))
    assert not batch.out_layouts[0].partial and batch.out_layouts[0].local_shape == (1, 16, 32)


def test_unknown_operator_runs_replicated_only():
    m = _single(
        "TopK",
        [_vi("x", [8, 16])],
        [_vi("v", [8, 2]), _vi("i", [8, 2], TensorProto.INT64)],
        [numpy_helper.from_array(np.array([2], dtype=np.int64), "k")],
        axis=-1,
    )
    pl = planner(m)
    assert pl.replicated_ops == ["TopK"]
    assert [c.strategy for c in pl.candidates(0)] == [((1, 1),)]


def test_parse_strategy_forms():
    assert parse_strategy("((2, 1), (1, 4))", "w") == ((2, 1), (1, 4))
    assert parse_strategy([[2, 4], [4]], "w") == ((2, 4), (4,))
    assert parse_strategy("((2, 4), (4))", "w") == ((2, 4), (4,))  # the seed's IR notation
    assert parse_strategy("((2, 4))", "w") == ((2, 4),)
    assert parse_strategy([2, 4], "w") == ((2, 4),)
    assert parse_strategy("((4))", "w") == ((4,),)
    with pytest.raises(MtppError, match="not a strategy"):
        parse_strategy("((2, 1)", "w")
    with pytest.raises(MtppError, match=">= 1"):
        parse_strategy([[0, 1]], "w")


# ---------------------------------------------------------------------- propagation
def test_seed_ffn_propagation_matches_the_seed():
    pl = planner(examples.ffn())
    st = propagate(pl, {"dense1.matmul": ((2, 1), (1, 4))})
    assert {k: fmt_strategy(v) for k, v in st.items()} == {
        "dense1.matmul": "((2, 1), (1, 4))",
        "dense1.add": "((2, 4), (4))",
        "relu": "((2, 4))",
        "dense2.matmul": "((2, 4), (4, 1))",
        "dense2.add": "((2, 4), (4))",
    }
    prog = evaluate(pl, st)
    reds = prog.all_redists()
    assert len(reds) == 1 and reds[0][0] == "dense2.add"
    (step,) = reds[0][1].steps
    # the seed prints AllReduce + StridedSlice; ReduceScatter moves half the bytes
    assert step.kind == "ReduceScatter" and step.before.device_matrix[step.axis] == 4
    local = 32 * 64 * 4  # the partial [32, 64] float32 block of each device
    assert step.bytes_per_device == pytest.approx(3 / 4 * local)
    assert step.time == pytest.approx(3 / 4 * local / 1e9)
    assert prog.collectives() == {"ReduceScatter": 1}


def test_unconfigured_model_is_data_parallel():
    pl = planner(examples.mlp())
    st = propagate(pl, {})
    assert st == {
        "fc0": ((8, 1), (1, 1), (1,)),
        "relu0": ((8, 1),),
        "fc1": ((8, 1), (1, 1), (1,)),
        "relu1": ((8, 1),),
        "fc2": ((8, 1), (1, 1), (1,)),
    }
    assert evaluate(pl, st).comm_bytes_per_device == 0


def test_conflicting_configured_strategies_are_joined_by_a_redistribution():
    pl = planner(examples.ffn())
    conf = {"dense1.matmul": ((2, 1), (1, 4)), "relu": ((1, 8),)}
    st = propagate(pl, conf)
    assert st["dense1.matmul"] == ((2, 1), (1, 4)) and st["relu"] == ((1, 8),)
    prog = evaluate(pl, st)
    # dense1.add sits between the two configured operators: whatever it picks, data moves
    names = [n for n, _ in prog.all_redists()]
    assert {"dense1.add", "relu"} & set(names)
    assert prog.comm_bytes_per_device > 0


def test_node_annotation_configures_like_yaml():
    m = examples.ffn()
    m.graph.node[0].attribute.append(helper.make_attribute("mtpp_strategy", "((2, 1), (1, 4))"))
    sm = from_proto(m, {})
    assert from_attributes(sm) == {"dense1.matmul": ((2, 1), (1, 4))}


# ---------------------------------------------------------------------- cost
def test_program_cost_is_the_sum_of_compute_and_collectives():
    pl = planner(examples.ffn())
    st = propagate(pl, {"dense1.matmul": ((2, 1), (1, 4))})
    prog = evaluate(pl, st)
    mm = pl.sharding(0, ((2, 1), (1, 4)))
    moved = (32 * 64 + 64 * 16 + 32 * 16) * 4
    assert prog.compute[0] == pytest.approx(max(2 * 32 * 16 * 64 / 1e12, moved / 1e12))
    assert mm.local_flops == 2 * 32 * 16 * 64
    assert prog.objective == pytest.approx(sum(prog.compute) + 3 / 4 * 32 * 64 * 4 / 1e9)
    # weights: W1 [64, 16], b1 [16], W2 [16, 64], b2 [16] per device, float32
    assert prog.weight_memory == (64 * 16 + 16 + 16 * 64 + 16) * 4
    # activation peak: at dense2.add the partial [32, 64] input is live plus its
    # reduce-scattered copy [32, 16] and the output [32, 16]
    assert prog.peak_activation_memory == (32 * 64 + 32 * 16 + 32 * 16) * 4


def test_partial_model_output_is_reduced_and_priced():
    m = examples.ffn()
    m.graph.node.pop()  # drop dense2.add: the output is the second MatMul's partial sums
    m.graph.output[0].name = "dense2.matmul_out"
    pl = planner(m)
    st = propagate(pl, {"dense2.matmul": ((2, 4), (4, 1))})
    prog = evaluate(pl, st)
    (r,) = prog.output_redists.values()
    assert [s.kind for s in r.steps] == ["ReduceScatter"]
    assert not r.dst.partial
    assert prog.objective == pytest.approx(sum(prog.compute) + sum(prog.comm) + r.time)


def test_mesh_axis_bandwidth_prices_collectives():
    fast = Mesh((2, 4), (1e9, 1e12), (0.0, 0.0))
    slow = Mesh((2, 4), (1e12, 1e9), (0.0, 0.0))
    sm = from_proto(examples.ffn(), {})
    st = {
        "dense1.matmul": ((2, 1), (1, 4)),
        "dense1.add": ((2, 4), (4,)),
        "relu": ((2, 4),),
        "dense2.matmul": ((2, 4), (4, 1)),
        "dense2.add": ((2, 4), (4,)),
    }
    t_fast = evaluate(Planner(sm, fast, CLUSTER), st).output_comm + sum(
        evaluate(Planner(sm, fast, CLUSTER), st).comm
    )
    t_slow = sum(evaluate(Planner(sm, slow, CLUSTER), st).comm)
    # the reduce-scatter runs in groups of 4 along mesh axis 1
    assert t_fast == pytest.approx(3 / 4 * 32 * 64 * 4 / 1e12)
    assert t_slow == pytest.approx(3 / 4 * 32 * 64 * 4 / 1e9)
    assert math.isclose(t_slow / t_fast, 1000)
