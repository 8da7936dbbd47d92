"""Training-aware operator sharding (``mtpp shard --training``): the backward's compute and
collectives, the gradient synchronisation (AllReduce or ZeRO-1), the training memory, the
classic data-parallel / Megatron trade-off, and the exact optimum against brute force."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.cli import main
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.result import OPTIMAL
from solver.spmd.exact import ExactOptions, min_memory, solve_exact
from solver.spmd.lagrange import lagrange
from solver.spmd.mesh import make_mesh
from solver.spmd.model import from_proto
from solver.spmd.program import Planner, evaluate
from solver.spmd.solve import solve_sharding
from solver.spmd.training import (
    TrainingSpec,
    choose_gradient_sync,
    gradient_layout,
    without_partial,
)
from tests.badinput import assert_refused
from tests.spmd.test_exact import brute_force, random_model

# compute-bound devices, a 10 GB/s link without latency: communication is bytes / bandwidth
CL4 = Cluster(
    name="t4", devices=4, compute=1e12, link_bandwidth=1e10, memory_bandwidth=1e15, link_latency=0
)
TRAIN = TrainingSpec()
DP = {"fc1": ((4, 1), (1, 1)), "relu": ((4, 1),), "fc2": ((4, 1), (1, 1))}
MEGATRON = {"fc1": ((1, 1), (1, 4)), "relu": ((1, 4),), "fc2": ((1, 4), (4, 1))}


def mlp2(batch: int, d: int, h: int, first: bool = False, seed: int = 0):
    """x [batch, d] -> MatMul w1 [d, h] -> Relu -> MatMul w2 [h, d] -> y (random weights);
    ``first``: a MatMul by w0 [d, d] before them, so that their input needs a gradient."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    names = (["w0"] if first else []) + ["w1", "w2"]
    shapes = {"w0": (d, d), "w1": (d, h), "w2": (h, d)}
    for w in names:
        value = (rng.standard_normal(shapes[w]) / np.sqrt(shapes[w][0])).astype(np.float32)
        inits.append(numpy_helper.from_array(value, w))
    if first:
        nodes.append(helper.make_node("MatMul", ["x", "w0"], ["x0"], name="fc0"))
        x = "x0"
    nodes += [
        helper.make_node("MatMul", [x, "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _planner(model, cluster=CL4, mesh=None, training=TRAIN) -> Planner:
    sm = from_proto(model, {})
    return Planner(sm, make_mesh(mesh or (cluster.devices,), cluster), cluster, training)


def _allreduce(nbytes: float, n: int = 4, bw: float = 1e10) -> float:
    return 2 * (n - 1) / n * nbytes / bw


# ---------------------------------------------------------------------- the trade-off
def test_large_batch_small_weights_is_data_parallel_large_weights_is_megatron():
    """Alpa's classic: the 2-layer MLP on 4 devices trains data parallel when the batch is
    large and the weights small, Megatron-style (column then row parallel) when the weights
    are large; both proven optimal. Inference of the large-weight MLP stays data parallel: the
    gradient synchronisation is what moves the optimum."""
    wide_batch = from_proto(mlp2(batch=4096, d=64, h=256), {})
    res = solve_sharding(wide_batch, cluster=CL4, method="cpsat", training=TRAIN, workers=1)
    assert res.status == OPTIMAL
    assert res.strategies == DP
    big_weights = from_proto(mlp2(batch=16, d=1024, h=4096), {})
    res = solve_sharding(big_weights, cluster=CL4, method="cpsat", training=TRAIN, workers=1)
    assert res.status == OPTIMAL
    assert res.strategies == MEGATRON
    inference = solve_sharding(big_weights, cluster=CL4, method="cpsat", workers=1)
    assert inference.strategies == DP


def test_data_parallel_and_megatron_costs_term_by_term():
    """The data-parallel plan pays one AllReduce per weight gradient and no backward
    redistribution; Megatron's pair pays one AllReduce forward (the row-parallel output) and
    one backward (the column-parallel input's gradient), no weight synchronisation. Backward
    compute is the table's: 1 x forward per MatMul operand that needs a gradient, 1 x for the
    Relu."""
    batch, d, h = 16, 64, 256
    pl = _planner(mlp2(batch, d, h, first=True))
    rep = {"fc0": ((1, 1), (1, 1))}
    dp = evaluate(pl, {**DP, "fc0": ((4, 1), (1, 1))})
    tr = dp.training
    assert tr.sync_time == pytest.approx(
        [_allreduce(4 * d * d), _allreduce(4 * d * h), 0.0, _allreduce(4 * h * d)]
    )
    assert tr.backward_comm == [0.0] * 4
    assert tr.backward_compute == pytest.approx(  # fc0's input x needs no gradient: 1 x
        [dp.compute[0], 2 * dp.compute[1], dp.compute[2], 2 * dp.compute[3]]
    )
    meg = evaluate(pl, {**MEGATRON, **rep}).training
    assert meg.sync_time == [0.0] * 4
    act = 4 * batch * d
    assert meg.backward_comm == pytest.approx([0.0, _allreduce(act), 0.0, 0.0])
    out = evaluate(pl, {**MEGATRON, **rep})  # reduced forward, its transpose backward
    assert out.output_comm + out.training.output_backward == pytest.approx(_allreduce(act))
    no_grad = evaluate(_planner(mlp2(batch, d, h)), MEGATRON).training
    assert no_grad.backward_comm == [0.0] * 3  # x needs no gradient: no backward AllReduce


def test_the_backward_of_an_allgather_is_a_reduce_scatter_and_of_an_allreduce_nothing():
    """A batch-split producer gathered for a column-parallel MatMul: the forward AllGathers,
    the backward ReduceScatters the partial gradient back to the batch split. A row-parallel
    output reduced by AllReduce for a replicated consumer needs nothing backward."""
    pl = _planner(mlp2(16, 64, 256, first=True))
    prog = evaluate(pl, {**MEGATRON, "fc0": ((4, 1), (1, 1))})
    assert prog.redists[(1, 0)].collectives == ["AllGather"]
    grad = gradient_layout(prog.shardings[1], 0)
    back = pl.redistribution(grad, without_partial(prog.shardings[0].out_layouts[0]), "x0")
    assert back.collectives == ["ReduceScatter"]
    gathered = prog.redists[(1, 0)].time
    assert prog.training.backward_comm[1] == pytest.approx(gathered + back.time)
    assert back.time == pytest.approx(gathered)  # the transpose sends the same bytes
    # the row-parallel output's AllReduce: its gradient is whole on every device
    out = prog.shardings[3].out_layouts[0]
    assert out.partial and not without_partial(out).partial
    reduced = pl.redistribution(out, without_partial(out), "y")
    assert reduced.collectives == ["AllReduce"]


# ---------------------------------------------------------------------- memory
def test_training_memory_weights_state_zero1_and_stash():
    """Replicated weights cost 4 x their bytes (weights, gradients, Adam's two moments);
    data parallel shards the optimizer state with ZeRO-1 where the limit needs it (2 + 2/4 of
    the bytes), AllReduce (4 x) where it fits; every output stays alive for the backward."""
    batch, d, h = 16, 64, 256
    pl = _planner(mlp2(batch, d, h))
    wbytes = 4 * (d * h + h * d)
    rep = evaluate(pl, {"fc1": ((1, 1), (1, 1)), "relu": ((1, 1),), "fc2": ((1, 1), (1, 1))})
    assert rep.weight_memory == 4 * wbytes
    acts = 4 * (batch * h * 2 + batch * d)  # h, r and y kept until the backward
    assert rep.peak_activation_memory == acts
    dp = evaluate(pl, DP)
    assert dp.weight_memory == pytest.approx(2.5 * wbytes)
    free = choose_gradient_sync(pl, dp, None)
    assert free.training.zero1 == frozenset()
    assert free.weight_memory == pytest.approx(4 * wbytes)
    one = 1.5 * 4 * d * h  # AllReduce for one weight: its 2 bytes of state per byte, whole
    tight = dp.peak_activation_memory + 2.5 * wbytes + one
    mixed = choose_gradient_sync(pl, dp, tight)
    assert mixed.training.zero1 == frozenset({"w2"})  # equal savings: w1 first gets AllReduce
    assert mixed.memory_per_device == pytest.approx(tight)
    spec = TrainingSpec(optimizer_state=8)
    assert evaluate(_planner(mlp2(batch, d, h), training=spec), DP).weight_memory == (
        pytest.approx((2 + 6 / 4) * wbytes)
    )


def test_a_memory_limit_turns_on_zero1_before_it_moves_the_optimum():
    """At batch 512 the unlimited optimum is a hybrid (2-way data parallel x 2-way Megatron)
    with AllReduce gradients; at the least memory any plan needs it stays the optimum, its
    weights' optimizer state now sharded (ZeRO-1), proven optimal and within the limit."""
    sm = from_proto(mlp2(batch=512, d=64, h=256), {})
    free = solve_sharding(sm, cluster=CL4, method="cpsat", training=TRAIN, workers=1)
    assert free.status == OPTIMAL
    assert free.strategies["fc1"] == ((2, 1), (1, 2))
    assert free.program.training.zero1 == frozenset()
    least = evaluate(free.planner, free.strategies).memory_per_device
    assert least < free.program.memory_per_device
    res = solve_sharding(sm, cluster=CL4, method="cpsat", training=TRAIN, memory=least, workers=1)
    assert res.status == OPTIMAL
    assert res.strategies == free.strategies
    assert res.objective == pytest.approx(free.objective)
    assert res.program.training.zero1 == frozenset({"w1", "w2"})
    assert res.program.memory_per_device == pytest.approx(least)
    with pytest.raises(MtppError, match="no sharding plan fits"):
        solve_sharding(sm, cluster=CL4, method="cpsat", training=TRAIN, memory=least - 1)


# ---------------------------------------------------------------------- exact vs brute force
@pytest.mark.parametrize("seed, mesh", [(0, None), (7, None), (15, (2, 2)), (24, None)])
def test_training_optimum_equals_brute_force(seed, mesh):
    """Over every strategy combination of a small random graph, in training: CP-SAT's plan is
    the cheapest (without a limit and under one that excludes the unlimited optima), OPTIMAL,
    its bound never above it, nor the Lagrangian bound; the heuristics' bounds hold; a limit
    below every plan's need is refused with exactly the least memory brute force finds."""
    model = random_model(seed)
    pl = _planner(model, mesh=mesh)
    objs, mems, _ = brute_force(pl)
    assert len(objs) > 20
    optima = objs <= objs.min() * (1 + 1e-12)
    tight = float(mems[optima].min()) - 1
    if tight < mems.min():
        tight = float(np.quantile(mems, 0.2))
    for limit in (None, tight):
        best = float((objs[mems <= limit] if limit is not None else objs).min())
        res = solve_sharding(
            pl.sm, mesh=mesh, cluster=CL4, method="cpsat", memory=limit, time_limit=20,
            workers=1, training=TRAIN,
        )  # fmt: skip
        assert res.status == OPTIMAL, res.stats
        assert res.objective == pytest.approx(best, rel=1e-9, abs=1e-18)
        assert best * (1 - 1e-6) <= res.lower_bound <= best * (1 + 1e-12)
        assert limit is None or res.program.memory_per_device <= limit
        exact = solve_exact(pl, limit, {}, [], ExactOptions(time_limit=20, workers=1))
        assert exact.cpsat_status == "OPTIMAL"  # CP-SAT alone, its memory model included
        assert evaluate(pl, exact.strategies).objective == pytest.approx(best, rel=1e-9)
        lag = lagrange(pl, limit, {}, 5.0)  # prices every output's bytes with the weights
        assert lag.lower_bound <= best * (1 + 1e-12)
        assert lag.objective >= best * (1 - 1e-12)
        for method in ("propagate", "dp", "megatron"):
            try:
                h = solve_sharding(
                    pl.sm, mesh=mesh, cluster=CL4, method=method, memory=limit, training=TRAIN
                )
            except MtppError as e:
                assert "plan needs" in str(e)
                continue
            assert h.objective >= best * (1 - 1e-12)
            assert h.lower_bound <= best * (1 + 1e-12)
    least = float(mems.min())
    with pytest.raises(MtppError, match="no sharding plan fits") as info:
        solve_sharding(
            pl.sm, mesh=mesh, cluster=CL4, method="cpsat", memory=least - 1, training=TRAIN
        )
    need = int(re.search(r"any plan needs is .*?\((\d+) bytes\)", str(info.value)).group(1))
    assert need == least
    lean = min_memory(pl, {}, 20, workers=1)  # CP-SAT's memory model, minimised
    assert lean.lower <= least <= lean.upper
    assert lean.upper == pytest.approx(least)


# ---------------------------------------------------------------------- the command
def test_cli_training_json_and_table(tmp_path, capsys):
    """--training adds the training section (forward, backward, gradient synchronisation of
    every weight with its mode) and the objective is their sum."""
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp2(batch=16, d=64, h=256), path)
    base = ["shard", str(path), "--devices", "4", "--method", "dp", "--training"]
    assert main([*base, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    tr = plan["training"]
    assert tr["optimizer_state"] == 4
    assert {s["weight"] for s in tr["gradient_sync"]} == {"w1", "w2"}
    assert {s["mode"] for s in tr["gradient_sync"]} == {"allreduce"}
    total = (
        tr["forward_time"]
        + tr["backward_compute_time"]
        + tr["backward_communication_time"]
        + tr["gradient_sync_time"]
    )
    assert plan["objective"] == pytest.approx(total)
    assert plan["objective"] == pytest.approx(plan["compute_time"] + plan["communication_time"])
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "gradient sync: 2 AllReduce, 0 ZeRO-1" in out


def test_cli_refuses_bad_training_options(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp2(batch=16, d=64, h=256), path)
    base = ["shard", str(path), "--devices", "4"]
    assert_refused(capsys, [*base, "--optimizer-state", "4"], "--optimizer-state needs --training")
    assert_refused(
        capsys,
        [*base, "--training", "--optimizer-state", "0"],
        "the optimizer state factor must be a number > 0, got 0.0",
    )
