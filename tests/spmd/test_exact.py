"""Exact operator-level sharding (CP-SAT) against brute force, and the patterns it must find."""

from __future__ import annotations

import itertools
import json
import math
import re
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import sharding_examples as examples
from solver.cli import main
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.result import FEASIBLE, OPTIMAL
from solver.spmd.lagrange import lagrange
from solver.spmd.mesh import make_mesh
from solver.spmd.model import from_proto
from solver.spmd.patterns import data_parallel_plan, megatron_roles
from solver.spmd.program import Planner, evaluate
from solver.spmd.solve import solve_sharding
from tests.badinput import assert_refused

# compute-bound devices (FLOPs, not bytes touched, set an operator's time), a slow link
CL4 = Cluster(
    name="t4", devices=4, compute=1e12, link_bandwidth=1e9, memory_bandwidth=1e15, link_latency=0
)
CL4_LAT = Cluster(
    name="t4lat",
    devices=4,
    compute=1e12,
    link_bandwidth=1e9,
    memory_bandwidth=1e13,
    link_latency=2e-7,
)


# ---------------------------------------------------------------------- brute force
def random_model(seed: int):
    """A small random DAG of MatMul (by a random weight), Relu, Add, Transpose, Softmax and
    MatMul of two activations, on 2-D tensors; every unconsumed tensor is an output."""
    rng = np.random.default_rng(seed)
    dims = [4, 8]
    shapes = {"x": (int(rng.choice(dims)), int(rng.choice(dims)))}
    nodes, inits, used = [], [], set()
    for i in range(int(rng.integers(3, 5))):
        names = list(shapes)
        t = names[int(rng.integers(len(names)))] if rng.random() < 0.4 else names[-1]
        r, c = shapes[t]
        kind = rng.choice(["matmul", "matmul", "relu", "add", "transpose", "softmax", "mm2"])
        out = f"t{i}"
        if kind == "matmul":
            n = int(rng.choice(dims))
            w = rng.standard_normal((c, n)).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [t, f"w{i}"], [out], name=f"mm{i}"))
            shapes[out] = (r, n)
        elif kind == "add" and any(s == (r, c) and o != t for o, s in shapes.items()):
            o = next(o for o, s in shapes.items() if s == (r, c) and o != t)
            nodes.append(helper.make_node("Add", [t, o], [out], name=f"add{i}"))
            used.add(o)
            shapes[out] = (r, c)
        elif kind == "transpose":
            nodes.append(helper.make_node("Transpose", [t], [out], name=f"tr{i}", perm=[1, 0]))
            shapes[out] = (c, r)
        elif kind == "softmax":
            nodes.append(helper.make_node("Softmax", [t], [out], name=f"sm{i}", axis=-1))
            shapes[out] = (r, c)
        elif kind == "mm2" and any(s[0] == c for s in shapes.values()):
            o = next(o for o, s in shapes.items() if s[0] == c)
            nodes.append(helper.make_node("MatMul", [t, o], [out], name=f"mmx{i}"))
            used.add(o)
            shapes[out] = (r, shapes[o][1])
        else:
            nodes.append(helper.make_node("Relu", [t], [out], name=f"relu{i}"))
            shapes[out] = (r, c)
        used.add(t)
    outs = [t for t in shapes if t not in used and t != "x"]
    graph = helper.make_graph(
        nodes,
        f"random{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shapes["x"]))],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shapes[t])) for t in outs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def brute_force(pl: Planner) -> tuple[np.ndarray, np.ndarray, list]:
    """(objective, memory per device, strategies) of every strategy combination."""
    sm = pl.sm
    lists = [pl.candidates(i) for i in range(len(sm.ops))]
    objs, mems, plans = [], [], []
    for combo in itertools.product(*lists):
        s = {op.name: sh.strategy for op, sh in zip(sm.ops, combo, strict=True)}
        prog = evaluate(pl, s)
        objs.append(prog.objective)
        mems.append(prog.memory_per_device)
        plans.append(s)
    return np.array(objs), np.array(mems), plans


def _planner(model, cluster, mesh=None):
    sm = from_proto(model, {})
    return Planner(sm, make_mesh(mesh or (cluster.devices,), cluster), cluster)


@pytest.mark.parametrize("encoding", ["cuts", "pairs"])
@pytest.mark.parametrize(
    "seed, cluster, mesh",
    [
        (0, CL4, None),
        (7, CL4_LAT, None),
        (15, CL4, (2, 2)),
        (16, CL4_LAT, (2, 2)),
        (17, CL4, None),
        (24, CL4_LAT, None),
    ],
)
def test_brute_force_equals_the_cpsat_optimum(seed, cluster, mesh, encoding):
    """Over every strategy combination of a small random graph: CP-SAT's objective is the least
    one (without a limit, and under a limit that excludes every unlimited optimum when some plan
    can do with less memory), it says OPTIMAL, and its bound is never above the optimum; so is
    the Lagrangian bound. A limit no plan meets is refused with the least memory any plan needs,
    which brute force confirms."""
    model = random_model(seed)
    pl = _planner(model, cluster, mesh)
    objs, mems, _ = brute_force(pl)
    assert len(objs) > 20  # a real choice
    sm = pl.sm
    optima = objs <= objs.min() * (1 + 1e-12)
    tight = float(mems[optima].min()) - 1
    if tight < mems.min():
        tight = float(np.quantile(mems, 0.2))
    for limit in (None, tight):
        ok = objs[mems <= limit] if limit is not None else objs
        best = float(ok.min())
        res = solve_sharding(
            sm, mesh=mesh, cluster=cluster, method="cpsat", memory=limit, time_limit=20,
            encoding=encoding, workers=1,
        )  # fmt: skip
        assert res.status == OPTIMAL, res.stats
        assert res.objective == pytest.approx(best, rel=1e-9, abs=1e-18)
        assert res.lower_bound <= best * (1 + 1e-12)
        assert res.lower_bound >= best * (1 - 1e-6)
        assert limit is None or res.program.memory_per_device <= limit
        lag = lagrange(pl, limit, {}, 5.0)
        assert lag.lower_bound <= best * (1 + 1e-12)
        assert lag.objective >= best * (1 - 1e-12)
        if limit is None:  # variable elimination is exact without a memory limit
            assert lag.objective == pytest.approx(best, rel=1e-12)
            assert lag.lower_bound == pytest.approx(best, rel=1e-9)
        for method in ("propagate", "dp", "megatron"):
            try:
                h = solve_sharding(sm, mesh=mesh, cluster=cluster, method=method, memory=limit)
            except MtppError as e:
                assert "plan needs" in str(e)
                continue
            assert h.objective >= best * (1 - 1e-12)
            assert h.lower_bound <= best * (1 + 1e-12)
    least = float(mems.min())
    with pytest.raises(MtppError, match="no sharding plan fits") as info:
        solve_sharding(sm, mesh=mesh, cluster=cluster, method="cpsat", memory=least - 1)
    need = int(re.search(r"any plan needs is .*?\((\d+) bytes\)", str(info.value)).group(1))
    assert need == least  # bytes are exact here (unit 1): the bound is the true minimum


# ---------------------------------------------------------------------- the 2-layer MLP
MLP = dict(batch=16, sizes=(32, 128, 16))


def _names(plan: dict) -> dict:
    return {k: [list(x) for x in v] for k, v in plan.items()}


def test_mlp_without_a_limit_is_data_parallel_with_no_communication():
    """Without a memory limit the optimum is data parallel and communicates nothing.

    By hand: on compute-bound devices an operator's time is its local FLOPs / compute, and the
    local FLOPs of any strategy are at least 1/4 of the operator's (4 devices), so the sum of
    FLOPs / (4 x compute) bounds every plan; communication is never negative. Data parallel
    splits the batch of every operator 4 ways, inputs arrive free in any layout, the weights
    are replicated, and each operator's output is exactly the layout its consumer wants (the
    output may stay split), so it meets the bound with no communication. Brute force over the
    1000 combinations shows no other plan does."""
    pl = _planner(examples.mlp(**MLP), CL4)
    objs, _, plans = brute_force(pl)
    res = solve_sharding(pl.sm, cluster=CL4, method="cpsat", time_limit=20)
    assert res.status == OPTIMAL
    assert res.program.collectives() == {} and res.program.comm_bytes_per_device == 0
    assert _names(res.strategies) == _names(data_parallel_plan(pl, {}))
    assert res.strategies["fc0"] == ((4, 1), (1, 1), (1,))
    assert res.objective == pytest.approx(float(objs.min()), rel=1e-12)
    assert int((objs <= objs.min() * (1 + 1e-12)).sum()) == 1  # the optimum is unique
    assert res.objective == pytest.approx(res.lower_bound, rel=1e-6)


def test_mlp_under_a_limit_is_megatron_with_one_reduce_scatter():
    """With a limit that forbids holding either weight whole or half, the optimum is Megatron's:
    fc0 split by columns (its output features), fc1 by rows (its contraction), and one
    ReduceScatter of the output's partial sums (outputs may stay sharded).

    By hand (x: 16x32, W0: 128x32, h: 16x128, W1: 16x128, y: 16x16, fp32, 4 devices): each
    weight must be cut 4 ways, so fc0 splits (k0, j0) and fc1 (k1, j1) with k*j = 4; compute is
    the same for all of them. If k0 > 1, h holds partial sums that must be reduced before the
    Relu: at least 1/2 x 8 KiB of h, more than the 768 bytes below. So fc0 is a column split
    (j0 = 4) and each device holds 16x32 of h. fc1 (k1, j1) = (4, 1) reads exactly that and
    leaves y as partial sums: one ReduceScatter of the 1 KiB partial y, 3/4 x 1 KiB = 768 bytes.
    (2, 2) needs an AllGather over 2 of h (2 KiB) plus a ReduceScatter over 2 (256 B); (1, 4)
    an AllGather of all of h (6 KiB); an AllReduce instead of the ReduceScatter sends twice as
    much. Brute force confirms the limit excludes every plan holding a weight half or whole
    and that the optimum is unique."""
    pl = _planner(examples.mlp(**MLP), CL4)
    megatron = megatron_plan_of(pl)
    limit = evaluate(pl, megatron).memory_per_device
    objs, mems, plans = brute_force(pl)
    fitting = [s for s, m in zip(plans, mems, strict=True) if m <= limit]
    assert 0 < len(fitting) < len(plans)
    for s in fitting:  # every plan that fits cuts both weights 4 ways
        assert math.prod(s["fc0"][1]) == 4 and math.prod(s["fc1"][1]) == 4
    res = solve_sharding(pl.sm, cluster=CL4, method="cpsat", memory=limit, time_limit=20)
    assert res.status == OPTIMAL
    assert res.strategies["fc0"] == ((1, 1), (4, 1), (4,))  # W0 is [out, in] (transB)
    assert res.strategies["fc1"] == ((1, 4), (1, 4), (1,))
    assert _names(res.strategies) == _names(megatron)
    assert res.program.collectives() == {"ReduceScatter": 1}
    assert res.program.comm_bytes_per_device == 768
    fit = objs[mems <= limit]
    assert res.objective == pytest.approx(float(fit.min()), rel=1e-12)
    assert int((fit <= fit.min() * (1 + 1e-12)).sum()) == 1


def megatron_plan_of(pl: Planner) -> dict:
    from solver.spmd.patterns import megatron_plan

    return megatron_plan(pl, {})


def test_megatron_roles_alternate_in_a_transformer():
    pl = _planner(examples.transformer(layers=2), CL4)
    roles = {pl.sm.ops[v].name: r for v, r in megatron_roles(pl).items()}
    for i in range(2):
        for t in ("q", "k", "v", "ffn1"):
            assert roles[f"l{i}.{t}.matmul"] == "column"
        for t in ("o", "ffn2"):
            assert roles[f"l{i}.{t}.matmul"] == "row"
    assert len(roles) == 12  # scores and context multiply activations: not weight MatMuls


# ---------------------------------------------------------------------- a transformer layer
def test_transformer_layer_under_a_limit_is_megatron_and_verifies(tmp_path, capsys):
    """One encoder layer on 4 devices under the memory of the Megatron plan: the Megatron
    pattern (Q, K, V and the first FFN projection by columns, the attention output and the
    second projection by rows) is an exact optimum, its partial sums are reduced by
    ReduceScatter (then AllGather: sequence parallelism, cheaper here than AllReduce), and
    --verify runs it against onnxruntime.

    It is AN optimum, not the only one: gathering the attention context (AllGather over 4 of a
    quarter, 3/4 of the bytes) and splitting the output projection by columns sends exactly
    what the row split's ReduceScatter sends (3/4 of the partial sums), so the ring formulas
    tie them. The test therefore pins the Megatron strategies of the six weight MatMuls, solves
    the rest exactly, and checks that the pinned optimum costs what the free optimum costs."""
    model = examples.transformer(layers=1, batch=2, seq=16, hidden=32, heads=4, vocab=64)
    onnx.save(model, tmp_path / "t.onnx")
    (tmp_path / "c.yaml").write_text(
        "name: t4\ndevices: 4\ncompute: 1TFLOPS\nmemory_bandwidth: 1000TB/s\n"
        "link_bandwidth: 1GB/s\nfast_memory: 1GB\nslow_memory_bandwidth: 1GB/s\n"
    )
    pl = _planner(model, CL4)
    limit = evaluate(pl, megatron_plan_of(pl)).memory_per_device
    free = solve_sharding(pl.sm, cluster=CL4, method="cpsat", memory=limit, time_limit=30)
    assert free.status == OPTIMAL
    col, row = [[1, 1, 1], [1, 4]], [[1, 1, 4], [4, 1]]
    pins = {f"l0.{t}.matmul": col for t in ("q", "k", "v", "ffn1")}
    pins |= {f"l0.{t}.matmul": row for t in ("o", "ffn2")}
    (tmp_path / "megatron.yaml").write_text(json.dumps(pins))
    argv = ["shard", str(tmp_path / "t.onnx"), "-k", "4", "--cluster", str(tmp_path / "c.yaml")]
    argv += ["--method", "cpsat", "--memory", f"{limit:.0f}B", "--time-limit", "30"]
    argv += ["--config", str(tmp_path / "megatron.yaml")]
    assert main([*argv, "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == OPTIMAL and out["verify"]["ok"]
    assert out["objective"] == pytest.approx(free.objective, rel=1e-9)
    assert out["max_memory_per_device"] <= limit
    for name, strategy in pins.items():
        assert out["strategies"][name] == strategy
    reductions = [r for r in out["redistributions"] if r["from"]["partial"]]
    assert len(reductions) == 2
    for r in reductions:
        ops = [o["op"] for o in r["ops"]]
        assert ops in (["AllReduce"], ["ReduceScatter"], ["ReduceScatter", "AllGather"])
    assert out["lower_bound"] <= out["objective"]
    # under the limit the free optimum splits every weight MatMul 4 ways, Q/K/V/FFN1 by columns
    for t in ("q", "k", "v", "ffn1"):
        assert free.strategies[f"l0.{t}.matmul"] == ((1, 1, 1), (1, 4))
    assert free.strategies["l0.ffn2.matmul"] == ((1, 1, 4), (4, 1))


# ---------------------------------------------------------------------- the command
@pytest.fixture
def mlp_file(tmp_path):
    onnx.save(examples.mlp(**MLP), tmp_path / "mlp.onnx")
    return tmp_path


def test_cli_methods_and_json_fields(mlp_file, capsys):
    base = ["shard", str(mlp_file / "mlp.onnx"), "-k", "4", "--json"]
    got = {}
    for method in ("propagate", "dp", "megatron", "cpsat"):
        assert main([*base, "--method", method, "--time-limit", "20"]) == 0
        got[method] = json.loads(capsys.readouterr().out)
    assert got["cpsat"]["status"] == OPTIMAL and got["dp"]["status"] == FEASIBLE
    for method, out in got.items():
        assert out["method"] == method
        assert out["objective"] >= got["cpsat"]["objective"] * (1 - 1e-12)
        assert 0 <= out["lower_bound"] <= got["cpsat"]["objective"] * (1 + 1e-12)
    assert got["megatron"]["collectives"] == {"ReduceScatter": 1}
    assert got["cpsat"]["gap"] <= 1e-6
    assert "warm_starts" in got["cpsat"]["stats"]


def test_cli_help_documents_the_methods(capsys):
    with pytest.raises(SystemExit):
        main(["shard", "--help"])
    out = capsys.readouterr().out
    for method in ("propagate", "dp", "megatron", "cpsat", "--time-limit"):
        assert method in out


def test_cli_impossible_memory_is_one_line_with_the_least_memory(mlp_file, capsys):
    argv = ["shard", str(mlp_file / "mlp.onnx"), "-k", "4", "--method", "cpsat"]
    assert_refused(
        capsys,
        [*argv, "--memory", "1KiB"],
        r"no sharding plan fits the memory limit of 1 KiB \(1024 bytes\) per device; the least "
        r"memory any plan needs is .* \(\d+ bytes\); raise --memory",
        watch=mlp_file,
    )


@pytest.mark.parametrize(
    "args, match",
    [
        (["--time-limit", "0"], "--time-limit must be a positive"),
        (["--time-limit", "nan"], "--time-limit must be a positive"),
        (["--workers", "-1"], "--workers must be >= 0"),
        (["--workers", "100000"], "--workers must be >= 0 and at most 1024, got 100000"),
        # CP-SAT's seed is 32-bit: a larger one was an internal error once CP-SAT ran
        (["--method", "cpsat", "--seed", str(2**40)], r"--seed must be >= 0 and at most 2147"),
        (["--seed", "-1"], r"--seed must be >= 0 and at most 2147483647, got -1"),
        # as in mtpp solve: 'inf' was taken as no limit, 0 as a limit no plan meets
        (["--memory", "inf"], r"--memory must be a finite size > 0, e\.g\. --memory 40GB"),
        (["--memory", "0"], r"--memory must be a finite size > 0, .*got '0'"),
        (["--method", "dp", "--memory", "1KiB"], "the dp plan needs .* per device"),
        (["--method", "megatron", "--memory", "1KiB"], "the megatron plan needs"),
    ],
)
def test_cli_bad_input(mlp_file, capsys, args, match):
    argv = ["shard", str(mlp_file / "mlp.onnx"), "-k", "4", *args]
    assert_refused(capsys, argv, match, watch=mlp_file)


def test_library_refuses_a_seed_cpsat_cannot_take():
    """solve_sharding checks its options itself (CP-SAT raised a TypeError on a 41-bit seed)."""
    pl = _planner(random_model(0), CL4)
    with pytest.raises(MtppError, match=r"--seed must be >= 0 and at most 2147483647"):
        solve_sharding(pl.sm, cluster=CL4, method="cpsat", memory=639, seed=2**40)


def test_pins_are_kept_by_every_method(mlp_file):
    pin = {"fc1": [[2, 2], [1, 2], [1]]}
    for method in ("propagate", "dp", "megatron", "cpsat"):
        res = solve_sharding(
            mlp_file / "mlp.onnx", devices=4, method=method, config=pin, time_limit=20
        )
        assert res.strategies["fc1"] == ((2, 2), (1, 2), (1,))
        assert res.configured == {"fc1": ((2, 2), (1, 2), (1,))}


def test_decoder_layer_cpsat_plan_verifies(tmp_path, capsys):
    """A GPT-shaped layer (causal mask, final LayerNorm, LM head) under a limit that forbids
    replicating the weights: the exact plan fits and the sharded program computes the model."""
    model = examples.transformer(layers=1, batch=2, seq=16, hidden=32, heads=4, vocab=64,
                                 decoder=True)  # fmt: skip
    onnx.save(model, tmp_path / "d.onnx")
    pl = _planner(model, CL4)
    dp = evaluate(pl, data_parallel_plan(pl, {}))
    limit = int(dp.memory_per_device * 0.6)
    argv = ["shard", str(tmp_path / "d.onnx"), "-k", "4", "--method", "cpsat", "--json"]
    assert main([*argv, "--memory", f"{limit}B", "--time-limit", "30", "--verify"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verify"]["ok"] and out["max_memory_per_device"] <= limit
    assert out["status"] in (OPTIMAL, FEASIBLE) and out["lower_bound"] <= out["objective"]


def test_propagation_reaches_a_component_without_configured_operators():
    """Two independent branches, one configured: the other still gets strategies (it used to
    be skipped when the configured operators filled the queue first)."""
    pl = _planner(random_model(7), CL4)
    from solver.spmd.propagate import propagate

    first = pl.sm.ops[-1].name
    s = propagate(pl, {first: pl.candidates(len(pl.sm.ops) - 1)[1].strategy})
    assert set(s) == {op.name for op in pl.sm.ops}


def test_lagrangian_bound_and_segments_on_a_two_layer_transformer():
    """The Lagrangian bound never exceeds the proven optimum and its plans never beat it; the
    layer boundaries (one live activation) cut the order into segments for mixing plans."""
    from solver.spmd.lagrange import segments

    model = examples.transformer(layers=2, batch=2, seq=16, hidden=32, heads=4, vocab=64)
    pl = _planner(model, CL4)
    ends = {pl.sm.ops[seg.stop - 1].name for seg in segments(pl)}
    assert {"embed", "l0.residual2", "l1.residual2"} <= ends
    dp = evaluate(pl, data_parallel_plan(pl, {}))
    limit = 0.5 * dp.memory_per_device
    exact = solve_sharding(pl.sm, cluster=CL4, method="cpsat", memory=limit, time_limit=8)
    lag = lagrange(pl, limit, {}, 5.0)
    # each bound is below every plan within the limit, the other method's included
    assert lag.lower_bound <= exact.objective * (1 + 1e-12)
    assert exact.lower_bound <= lag.objective * (1 + 1e-12)
    assert exact.lower_bound <= exact.objective
    assert lag.strategies is not None
    assert evaluate(pl, lag.strategies).memory_per_device <= limit


# ---------------------------------------------------------------------- weight-budget bound
def _combos(model):
    return itertools.product(*[range(len(c)) for c in model.cands])


def _need_of(needs, combo) -> float:
    """The activation peak that ``needs`` says the choices ``combo`` force: the largest of
    its choices', its pairs' and the floor."""
    return max(
        [float(a[combo[i]]) for i, a in needs.unary.items()]
        + [float(m[combo[u], combo[v]]) for (u, v), m in needs.pairs.items()]
        + [needs.floor]
    )


def _plan_of(pl, model, combo) -> dict:
    return {
        o.name: model.cands[i][s].strategy
        for i, (o, s) in enumerate(zip(pl.sm.ops, combo, strict=True))
    }


def _bytes_of(mem, combo) -> float:
    """The bytes a StepMemory's terms add up to for one choice per operator."""
    total = mem.const + sum(float(b[combo[i]]) for i, b in mem.unary.items())
    return total + sum(float(m[combo[u], combo[v]]) for (u, v), m in mem.pairs.items())


@pytest.mark.parametrize(
    "seed, cluster, mesh", [(0, CL4, None), (7, CL4_LAT, None), (15, CL4, (2, 2)), (24, CL4, None)]
)
def test_weight_budget_bound_is_exact_on_its_relaxation(seed, cluster, mesh):
    """Variable elimination with a level axis (budget_bound) is the exact minimum of its
    relaxation (weights W' plus the outputs alive and the copies made at one step within the
    limit): brute force over every choice agrees; its plan is one of those minimisers; the
    step's bytes are never above a plan's memory; and the bound is never above the best plan
    within the limit (a valid bound), whatever the step."""
    from solver.spmd.budget import budget_bound, step_memory
    from solver.spmd.exact import ShardModel
    from solver.spmd.lagrange import _Problem

    pl = _planner(random_model(seed), cluster, mesh)
    objs, mems, _ = brute_force(pl)
    times, checked = {}, 0
    for q in (0.1, 0.3, 0.6):
        limit = float(np.quantile(mems, q))
        model = ShardModel(pl, limit, {}, "time", build=False)
        if model.infeasible:
            continue
        prob = _Problem(model)
        best = float(objs[mems <= limit].min())
        for step in range(len(pl.sm.ops)):
            mem = step_memory(model, step).with_weights(prob)
            out = budget_bound(prob, limit, step_memory(model, step), time.perf_counter() + 30)
            if out is None:  # the least bytes at this step already exceed the limit
                assert mem.least() > limit
                continue
            assert out.value <= best * (1 + 1e-12)
            relaxed, exact = math.inf, True
            for combo in _combos(model):
                plan = _plan_of(pl, model, combo)
                key = tuple(plan.values())
                if key not in times:
                    p = evaluate(pl, plan)
                    times[key] = (p.objective, p.memory_per_device)
                nbytes = _bytes_of(mem, combo)
                assert nbytes <= times[key][1] * (1 + 1e-12)  # the step never holds more
                if nbytes - mem.least() <= out.budget:
                    relaxed = min(relaxed, times[key][0])
            excess = [b - b.min() for b in mem.unary.values()]
            excess += [m - m.min() for m in mem.pairs.values()]
            exact = all(np.all(e % out.unit == 0) for e in excess)
            if exact:  # rounding lost nothing
                assert out.value == pytest.approx(relaxed, rel=1e-9)
            else:
                assert out.value <= relaxed * (1 + 1e-12)
            choice = out.tables.choice(out.tables.best_level())
            plan = evaluate(pl, _plan_of(pl, model, choice))
            assert plan.objective == pytest.approx(out.value, rel=1e-9)
            checked += 1
    assert checked >= 4


@pytest.mark.parametrize(
    "seed, cluster, mesh", [(0, CL4, None), (15, CL4, (2, 2)), (24, CL4, None)]
)
def test_activation_needs_and_the_peak_bound_against_brute_force(seed, cluster, mesh):
    """Every choice and pair of choices needs at most the activation peak of every plan making
    it (brute force over every plan); the activation-peak bound equals the brute-force minimum
    of its relaxation (min over c of the least time with W' within c units and no need above
    the limit - least W' - c units) and is never above the best plan within the limit."""
    from solver.spmd.budget import activation_needs, peak_bound
    from solver.spmd.exact import ShardModel
    from solver.spmd.lagrange import _Problem

    pl = _planner(random_model(seed), cluster, mesh)
    objs, mems, _ = brute_force(pl)
    model = ShardModel(pl, None, {}, "time", build=False)
    prob = _Problem(model)
    needs = activation_needs(model, prob)
    rows = []
    for combo in _combos(model):
        p = evaluate(pl, _plan_of(pl, model, combo))
        need = _need_of(needs, combo)
        assert need <= p.peak_activation_memory * (1 + 1e-12)
        rows.append((combo, p.objective, p.memory_per_device, need))
    assert any(r[3] > needs.floor for r in rows)  # some choice needs more than the floor
    wmin = prob.wconst + sum(float(w.min()) for w in prob.wbytes)
    solved = 0
    for q in (0.1, 0.3, 0.6):
        limit = float(np.quantile(mems, q))
        out = peak_bound(prob, limit, needs, time.perf_counter() + 30)
        if out is None:
            continue
        best = float(objs[mems <= limit].min())
        assert out.value <= best * (1 + 1e-12) and out.complete
        relaxed = math.inf
        for combo, t, _m, need in rows:
            level = sum(
                int((w[s] - w.min()) // out.unit) for w, s in zip(prob.wbytes, combo, strict=True)
            )
            top = math.floor((limit - wmin - needs.floor) / out.unit)
            if level <= min(top, math.floor((limit - wmin - need) / out.unit)):
                relaxed = min(relaxed, t)
        if all(np.all((w - w.min()) % out.unit == 0) for w in prob.wbytes):
            assert out.value == pytest.approx(relaxed, rel=1e-9)
        else:
            assert out.value <= relaxed * (1 + 1e-12)
        solved += 1
    assert solved >= 2


@pytest.mark.parametrize(
    "seed, cluster, mesh", [(0, CL4, None), (15, CL4, (2, 2)), (24, CL4, None), (7, CL4_LAT, None)]
)
def test_peak_bound_with_exact_weights_against_brute_force(seed, cluster, mesh):
    """The activation-peak bound with W' exact in bytes (a Lagrangian bound per peak value Q)
    is never above the best plan within the limit nor above the brute-force minimum of its
    relaxation: min over Q of the least time with no need above Q and W' <= limit - Q."""
    from solver.spmd.budget import activation_needs, peak_dual_bound, peak_values
    from solver.spmd.exact import ShardModel
    from solver.spmd.lagrange import _Problem

    pl = _planner(random_model(seed), cluster, mesh)
    objs, mems, _ = brute_force(pl)
    model = ShardModel(pl, None, {}, "time", build=False)
    prob = _Problem(model)
    needs = activation_needs(model, prob)
    rows = []
    for combo in _combos(model):
        need = _need_of(needs, combo)
        w = prob.wconst + sum(float(prob.wbytes[i][c]) for i, c in enumerate(combo))
        rows.append((evaluate(pl, _plan_of(pl, model, combo)).objective, need, w))
    checked = 0
    for q in (0.0, 0.1, 0.3, 0.6):
        limit = float(np.quantile(mems, q))
        out = peak_dual_bound(prob, limit, needs, time.perf_counter() + 30, most=10**6)
        assert out is not None
        best = float(objs[mems <= limit].min())
        assert out.value <= best * (1 + 1e-12)
        relaxed = min(
            (t for t, need, w in rows for v in peak_values(prob, limit, needs)
             if need <= v and w <= limit - v),
            default=math.inf,
        )  # fmt: skip
        assert out.value <= relaxed * (1 + 1e-12)
        checked += out.value > -math.inf
    assert checked == 4


@pytest.mark.parametrize(
    "seed, cluster, mesh", [(0, CL4, None), (7, CL4_LAT, None), (15, CL4, (2, 2))]
)
def test_least_memory_interval_holds_the_brute_force_minimum(seed, cluster, mesh):
    """Variable elimination's least memory: its lower end is below every plan's memory, its
    upper end is the memory of a plan it returns, and brute force's minimum lies between."""
    from solver.spmd.lagrange import least_memory_plan

    pl = _planner(random_model(seed), cluster, mesh)
    _objs, mems, _ = brute_force(pl)
    lean = least_memory_plan(pl, {}, 30.0)
    assert lean.lower <= mems.min() * (1 + 1e-12)
    assert lean.upper >= mems.min()
    assert evaluate(pl, lean.strategies).memory_per_device == lean.upper
    assert lean.exact == (lean.upper == mems.min() and lean.lower >= mems.min() * (1 - 1e-12))


@pytest.mark.parametrize("layers", [1, 2])
def test_a_limit_below_the_least_memory_is_refused_with_the_smallest_that_works(layers):
    """Asked for less memory than any plan needs, cpsat refuses in one line with the least
    memory per device any plan needs, exactly; a plan exists at that limit and one byte less
    is refused with the same number (a transformer: attention, FFN, layer norms)."""
    model = examples.transformer(layers=layers, batch=2, seq=16, hidden=32, heads=4, vocab=64)
    sm = from_proto(model, {})
    pattern = (
        r"^no sharding plan fits the memory limit of .* per device; the least memory any plan "
        r"needs is .* \((\d+) bytes\); raise --memory$"
    )
    with pytest.raises(MtppError) as info:
        solve_sharding(sm, cluster=CL4, method="cpsat", memory=1000, time_limit=20)
    least = int(re.match(pattern, str(info.value)).group(1))
    res = solve_sharding(sm, cluster=CL4, method="cpsat", memory=least, time_limit=20)
    assert res.program.memory_per_device == least
    with pytest.raises(MtppError) as below:
        solve_sharding(sm, cluster=CL4, method="cpsat", memory=least - 1, time_limit=20)
    assert int(re.match(pattern, str(below.value)).group(1)) == least


def test_budget_bound_proves_the_optimum_of_a_transformer_under_a_tight_limit():
    """On a 4-layer transformer under a limit that data parallel exceeds, the weight-budget
    bound's plan fits and meets the bound: OPTIMAL without CP-SAT (which, before this bound,
    stopped at 1.138e-4 s with an 8% gap after 20 s; the optimum is 1.052e-4 s)."""
    model = examples.transformer(layers=4, batch=4, seq=16, hidden=64, heads=4, vocab=64)
    pl = _planner(model, CL4)
    dp = evaluate(pl, data_parallel_plan(pl, {}))
    limit = 0.45 * dp.memory_per_device
    res = solve_sharding(pl.sm, cluster=CL4, method="cpsat", memory=limit, time_limit=20)
    assert res.status == OPTIMAL
    assert res.stats["proof"] == "weight budget bound", res.stats
    assert res.program.memory_per_device <= limit
    assert dp.memory_per_device > limit and res.objective > dp.objective  # the limit binds
    assert res.stats["budget_lower_bound"] == pytest.approx(res.objective, rel=1e-9)
    assert res.lower_bound <= res.objective


# ---------------------------------------------------------------------- time limit, mixed devices
@pytest.mark.parametrize("time_limit", [0.5, 1.5])
def test_cpsat_returns_within_a_time_limit_its_model_cannot_be_built_in(time_limit):
    """A 2-layer transformer on a 4x4 mesh: the Lagrangian data and the CP-SAT model (pricing
    every pair of layout classes) take over 2 s to build, the limit is less. The solver stops
    building, keeps the best warm start (a complete plan, re-evaluated) with the least-compute
    bound, FEASIBLE (at 1.5 s it stops inside the CP-SAT model, at 0.5 s before it)."""
    from solver.spmd.exact import NOT_BUILT
    from solver.spmd.plan import compute_bound

    model = examples.transformer(layers=2, batch=16, seq=32, hidden=64, heads=4, vocab=64)
    # a link bandwidth no other test uses: the redistribution caches start cold
    cl = Cluster(
        name="t16",
        devices=16,
        compute=1e12,
        link_bandwidth=1.2345e9 + time_limit,
        memory_bandwidth=1e15,
    )
    sm = from_proto(model, {})
    t = time.perf_counter()
    res = solve_sharding(sm, cluster=cl, mesh=(4, 4), method="cpsat", time_limit=time_limit)
    wall = time.perf_counter() - t
    assert wall < time_limit + 1.0, (
        res.stats
    )  # the stated slack: one heuristic plan, one evaluation
    assert res.status == FEASIBLE
    assert res.stats["cpsat_status"] == NOT_BUILT and "time limit" in res.stats["stopped"]
    assert set(res.strategies) == {op.name for op in sm.ops}
    assert evaluate(res.planner, res.strategies).objective == res.objective
    least = compute_bound(res.planner, {})
    assert res.lower_bound == max(least, res.stats.get("lagrange_lower_bound", least))
    assert 0 < res.lower_bound <= res.objective
    for name, value in res.stats["warm_starts"].items():  # every warm start kept is no better
        assert value is None or value >= res.objective, name


def test_model_building_and_lagrange_stop_at_their_deadline():
    """A deadline already passed: the model raises DeadlineReached, solve_exact reports
    NOT_BUILT with no bound, lagrange gives up (None), min_memory claims nothing."""
    from solver.spmd.exact import (
        NOT_BUILT,
        DeadlineReached,
        ExactOptions,
        ShardModel,
        min_memory,
        solve_exact,
    )

    pl = _planner(examples.mlp(**MLP), CL4)
    with pytest.raises(DeadlineReached):
        ShardModel(pl, None, {}, deadline=0.0)
    res = solve_exact(pl, None, {}, [], ExactOptions(time_limit=0.0))
    assert res.cpsat_status == NOT_BUILT and res.strategies is None
    assert res.lower_bound == -math.inf
    assert lagrange(pl, None, {}, 0.0) is None
    empty = min_memory(pl, {}, 0.0)
    assert (empty.lower, empty.upper, empty.strategies) == (0.0, math.inf, None)
    # with time, the same model builds and CP-SAT proves the optimum
    full = solve_exact(pl, None, {}, [], ExactOptions(time_limit=10))
    assert full.cpsat_status == "OPTIMAL" and full.lower_bound > 0


def test_mixed_devices_are_priced_at_the_slowest_and_fit_the_smallest():
    """One SPMD program on devices that differ runs in lockstep: every method prices it with
    the slowest device's compute and limits it to the smallest capacity."""
    from solver.core.cluster import Topology

    def flat(compute, capacity=None):
        return Cluster(
            name="flat", devices=4, compute=compute, link_bandwidth=1e9, memory_bandwidth=1e15,
            capacity=capacity,
        )  # fmt: skip

    topo = Topology(
        groups=((0, 1, 2, 3),),
        names=("host",),
        links=((1e9, 0.0),),
        compute=(1e12, 2e12, 2.5e11, 1e12),
        capacity=(8e6, 4e6, 8e6, None),
    )
    mixed = Cluster(
        name="mixed", devices=4, compute=1e12, link_bandwidth=1e9, memory_bandwidth=1e15,
        topology=topo,
    )  # fmt: skip
    sm = from_proto(examples.mlp(**MLP), {})
    for method in ("dp", "megatron", "cpsat"):
        got = solve_sharding(sm, cluster=mixed, method=method, time_limit=10)
        slow = solve_sharding(sm, cluster=flat(2.5e11, 4e6), method=method, time_limit=10)
        fast = solve_sharding(sm, cluster=flat(1e12, 4e6), method=method, time_limit=10)
        assert got.memory_limit == 4e6, method
        assert got.objective == pytest.approx(slow.objective, rel=1e-12), method
        assert got.objective > fast.objective, method
        assert got.program.compute == pytest.approx(slow.program.compute, rel=1e-12)
        assert got.planner.cluster.name == "mixed"


# ---------------------------------------------------------------------- exact windows
def _two_relus():
    """x -> Relu -> Relu -> MatMul(w): two operators with the same candidates."""
    w = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu0"),
            helper.make_node("Relu", ["a"], ["b"], name="relu1"),
            helper.make_node("MatMul", ["b", "w"], ["y"], name="mm"),
        ],
        "two_relus",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("share, pin", [(None, None), (0.6, None), (None, ((1, 4),))])
def test_tied_operators_choose_alike_and_the_tied_optimum_matches_brute_force(share, pin):
    """same_choice makes two operators take the same strategy (a pin on one carries over to
    the other); CP-SAT's optimum of that restricted problem equals brute force's over the
    plans where they agree (within the limit, with the pin)."""
    from solver.spmd.exact import ExactOptions, solve_exact

    pl = _planner(_two_relus(), CL4_LAT)
    objs, mems, plans = brute_force(pl)
    limit = None if share is None else share * mems.max() + (1 - share) * mems.min()
    pins = {} if pin is None else {"relu0": pin}
    alike = [
        k
        for k, p in enumerate(plans)
        if p["relu0"] == p["relu1"]
        and (limit is None or mems[k] <= limit)
        and (pin is None or p["relu0"] == pin)
    ]
    opts = ExactOptions(time_limit=20, same_choice=((0, 1),))
    res = solve_exact(pl, limit, pins, [], opts)
    assert res.cpsat_status == "OPTIMAL"
    assert res.strategies["relu0"] == res.strategies["relu1"]
    assert evaluate(pl, res.strategies).objective == pytest.approx(objs[alike].min(), rel=1e-9)
    if pin is not None:
        assert res.strategies["relu1"] == pin
        assert objs[alike].min() > objs.min()  # the tie binds


def test_repeating_window_is_in_the_middle_of_the_longest_repeating_run():
    from solver.spmd.windows import repeating_window

    assert repeating_window(list("EABABABABF")) == range(3, 7)
    assert repeating_window(list("EAAAAAF")) == range(2, 4)
    assert repeating_window(list("ABCDE")) is None


def test_window_search_at_the_least_memory_fits_and_never_beats_the_bound():
    """On a 4-layer transformer at exactly the least memory any plan needs, the exact windows
    start from the leanest plan, keep every plan within the limit, make no plan slower, and
    stay above the activation-peak bound (a valid bound of the real problem)."""
    from solver.spmd.lagrange import least_memory_plan
    from solver.spmd.windows import window_search

    model = examples.transformer(layers=4, batch=4, seq=16, hidden=64, heads=4, vocab=64)
    pl = _planner(model, CL4)
    lean = least_memory_plan(pl, {}, 30.0)
    assert lean.exact
    start = evaluate(pl, lean.strategies)
    found = window_search(pl, lean.upper, {}, lean.strategies, time.perf_counter() + 20)
    assert found.program.memory_per_device <= lean.upper
    assert found.program.objective <= start.objective
    assert evaluate(pl, found.strategies).objective == found.program.objective
    bound = lagrange(pl, lean.upper, {}, 20.0).lower_bound
    assert bound <= found.program.objective * (1 + 1e-12)
    assert found.improved >= 1 and found.program.objective < start.objective


def test_a_transformer_at_exactly_its_least_memory_is_solved_optimal():
    """At the least memory any plan needs (every plan that fits is a leanest plan) the plan
    meets the bound: OPTIMAL, and the plan fits exactly."""
    from solver.spmd.lagrange import least_memory_plan

    model = examples.transformer(layers=4, batch=4, seq=16, hidden=64, heads=4, vocab=64)
    pl = _planner(model, CL4)
    lean = least_memory_plan(pl, {}, 30.0)
    res = solve_sharding(pl.sm, cluster=CL4, method="cpsat", memory=lean.upper, time_limit=30)
    assert res.status == OPTIMAL, res.stats
    assert res.program.memory_per_device <= lean.upper
    assert res.objective < evaluate(pl, lean.strategies).objective
