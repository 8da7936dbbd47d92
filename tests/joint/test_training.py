"""Joint training plans (docs/training.md, "Joint training plans"): the dynamic programme over
(cut, sub-mesh, strategy) against brute force, the bound, the memory with in-flight
microbatches, the gradient flow across stages, the plan JSON and the command line."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.result import OPTIMAL
from solver.core.training import TrainingSpec
from solver.joint import training as jt
from solver.joint.plan import StageSpec
from solver.joint.segment import make_segment
from solver.joint.submesh import candidates, transfer_time
from solver.spmd.model import from_proto
from solver.spmd.program import Planner, evaluate
from solver.spmd.training import TrainingSpec as ShardTraining
from solver.spmd.training import gradient_flow
from tests.cli_runner import run
from tests.joint.test_planner import tiny_model, two_hosts


def chain_model(batch: int = 4, width: int = 6, seed: int = 0):
    """x -> MatMul(w1) -> Relu -> MatMul(w2) -> y, random weights."""
    rng = np.random.default_rng(seed)

    def w(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["y"], name="mm2"),
    ]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])],
        initializer=[w("w1", [width, width]), w("w2", [width, width])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def flat_two(**kw) -> Cluster:
    return Cluster("flat-two", 2, compute=2e9, memory_bandwidth=4e9, link_bandwidth=1e8, **kw)


@pytest.fixture(autouse=True)
def every_combination(monkeypatch):
    """Price every strategy combination of every segment (the tiny models' pairs are small)."""
    monkeypatch.setattr(jt, "EVERY_COMBINATION_UP_TO", 10_000)


# ---------------------------------------------------------------------- brute force
def _stage_options(sm, cluster, a, b, mesh, state):
    """Every strategy combination of ops a..b-1 on ``mesh``, priced for training."""
    seg = make_segment(sm, a, b)
    planner = jt.training_planner(
        seg, cluster, mesh.devices, mesh.mesh.shape, state, gradient_flow(sm)
    )
    cands = [planner.candidates(i) for i in range(b - a)]
    return [
        jt.price_option(planner, {op.name: s.strategy for op, s in zip(seg.sm.ops, c, strict=True)})
        for c in itertools.product(*cands)
    ]


def _transfers_by_hand(sm, cluster, bounds, meshes):
    """The rule of docs/joint.md: B / (min(|S|, |T|) bw) on both sides, per tensor and pair."""
    segs = [make_segment(sm, a, b) for a, b in bounds]
    io = [0.0] * len(segs)
    for j, seg in enumerate(segs):
        for t in seg.inputs:
            for i in range(j):
                if t in segs[i].outputs:
                    nbytes = math.prod(sm.shapes[t]) * sm.itemsize(t)
                    dt = transfer_time(nbytes, cluster, meshes[i].devices, meshes[j].devices)
                    io[i] += dt
                    io[j] += dt
    return io


def brute_force(sm, cluster, spec: TrainingSpec, memory=None, space="joint") -> float:
    """The least T over every cut, sequence of disjoint sub-meshes in cluster order and strategy
    per operator: T = sum t + (m - 1) max t + max sync, t = program + 2 io, each stage within
    its memory with its in-flight count."""
    n = len(sm.ops)
    meshes = candidates(cluster, space)
    cache: dict = {}
    best = math.inf
    for k in range(1, n + 1):
        for inner in itertools.combinations(range(1, n), k - 1):
            bounds = list(itertools.pairwise([0, *inner, n]))
            for seq in itertools.product(meshes, repeat=k):
                if any(y.start < x.end for x, y in itertools.pairwise(seq)):
                    continue
                io = _transfers_by_hand(sm, cluster, bounds, seq)
                inflight = [
                    spec.microbatches if spec.schedule == "gpipe" else min(spec.microbatches, k - i)
                    for i in range(k)
                ]
                per_stage = []
                for i, ((a, b), mesh) in enumerate(zip(bounds, seq, strict=True)):
                    key = (a, b, mesh)
                    if key not in cache:
                        cache[key] = _stage_options(sm, cluster, a, b, mesh, spec.optimizer_state)
                    per_stage.append(
                        [
                            o
                            for o in cache[key]
                            if memory is None or o.base + inflight[i] * o.stash <= memory
                        ]
                    )
                for choice in itertools.product(*per_stage):
                    t = [o.time + 2 * x for o, x in zip(choice, io, strict=True)]
                    a_, b_ = spec.time_weights
                    T = a_ * sum(t) + b_ * max(t) + max(o.sync for o in choice)
                    best = min(best, T)
    return best


CASES = [
    ("gpipe", 4, None),
    ("1f1b", 4, None),
    ("1f1b", 1, None),
    ("1f1b", 4, "binding"),
    ("gpipe", 2, "binding"),
]


@pytest.mark.parametrize(("schedule", "m", "memory"), CASES)
@pytest.mark.parametrize("cluster", ["two-hosts", "flat-two"])
def test_dp_equals_brute_force_on_a_chain(schedule, m, memory, cluster):
    sm = from_proto(chain_model(), {})
    c = two_hosts() if cluster == "two-hosts" else flat_two()
    spec = TrainingSpec(schedule, m, optimizer_state=4.0)
    limit = None
    if memory == "binding":
        free = jt.plan_joint_training(sm, c, spec, time_limit=120)
        # 90% of the unconstrained optimum's largest stage memory: that plan no longer fits
        limit = 0.9 * max(r.memory for r in free.training.stages)
    want = brute_force(sm, c, spec, limit)
    if math.isinf(want):
        with pytest.raises(MtppError, match="proven: no joint training plan"):
            jt.plan_joint_training(sm, c, spec, memory=limit, time_limit=120)
        return
    plan = jt.plan_joint_training(sm, c, spec, memory=limit, time_limit=120)
    assert plan.objective == pytest.approx(want, rel=1e-9)
    assert plan.status == OPTIMAL
    assert 0 < plan.universal_bound <= want * (1 + 1e-12)
    assert plan.stats["every_combination"] is True
    if limit is not None:
        assert all(r.memory <= limit * (1 + 1e-12) for r in plan.training.stages)
        assert plan.objective > free.objective  # the memory moved the optimum


def test_binding_memory_moves_the_optimum_and_too_little_is_proven_infeasible():
    sm = from_proto(chain_model(), {})
    c = two_hosts()
    spec = TrainingSpec("1f1b", 4)
    free = jt.plan_joint_training(sm, c, spec, time_limit=120)
    limit = 0.9 * max(r.memory for r in free.training.stages)
    tight = jt.plan_joint_training(sm, c, spec, memory=limit, time_limit=120)
    assert tight.objective > free.objective
    assert tight.objective == pytest.approx(brute_force(sm, c, spec, limit), rel=1e-9)
    with pytest.raises(MtppError, match=r"^proven: no joint training plan of the joint space"):
        jt.plan_joint_training(sm, c, spec, memory=16, time_limit=60)


def test_a_skip_connection_is_bracketed_and_the_bound_holds():
    """mm1's output skips a stage when there are three: the plan is re-priced exactly, the bound
    is below the brute-force optimum, OPTIMAL only when they meet."""
    sm = from_proto(tiny_model(), {})
    c = flat_two()
    spec = TrainingSpec("1f1b", 3)
    want = brute_force(sm, c, spec)
    plan = jt.plan_joint_training(sm, c, spec, time_limit=120)
    assert plan.objective >= want * (1 - 1e-9)
    assert plan.lower_bound <= want * (1 + 1e-9)
    assert plan.universal_bound <= want * (1 + 1e-12)
    if plan.status == OPTIMAL:
        assert plan.objective == pytest.approx(want, rel=1e-9)


def test_heuristic_pairs_give_a_valid_bound_and_no_claim(monkeypatch):
    """Without enumeration: the heuristics' plan is above the optimum, the least-compute bound
    below it, and the status is OPTIMAL only if they meet."""
    monkeypatch.setattr(jt, "EVERY_COMBINATION_UP_TO", 0)
    sm = from_proto(chain_model(), {})
    c = two_hosts()
    spec = TrainingSpec("1f1b", 4)
    want = brute_force(sm, c, spec)
    plan = jt.plan_joint_training(sm, c, spec, time_limit=120)
    assert plan.stats["every_combination"] is False
    assert plan.objective >= want * (1 - 1e-9)
    assert plan.lower_bound <= want * (1 + 1e-9)
    assert plan.status != OPTIMAL or plan.objective == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------------- the cost of a plan
def test_universal_training_bound_by_hand():
    """One MatMul x[4, 6] @ w[6, 6] on 2 flat devices: its forward is memory-bound, 1 x its
    bytes over the bandwidth; the backward 1 x more (w has a gradient, x does not); the sum term
    is the least over splits (x split by rows, 2 devices: half the FLOPs, w whole), the spread
    term the least p x time."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])
    w = numpy_helper.from_array(
        np.random.default_rng(3).standard_normal((6, 6)).astype(np.float32), "w"
    )
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "one", [x], [y], [w]
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sm = from_proto(m, {})
    c = Cluster("flat-two", 2, compute=1e9, memory_bandwidth=1e12, link_bandwidth=1e8)
    flops = 2 * 4 * 6 * 6  # memory is fast: compute-bound
    spec = TrainingSpec("1f1b", 4)
    want = 1 * (2 * flops / 2 / 1e9) + 3 * (2 * flops / 1e9) / 2  # (1 + beta) = 2
    assert jt.universal_training_bound(sm, c, spec.time_weights) == pytest.approx(want)
    plan = jt.plan_joint_training(sm, c, spec, time_limit=60)
    assert plan.universal_bound <= plan.objective


def test_price_of_a_two_stage_plan_by_hand():
    """T = sum t + (m - 1) max t + max sync, t = program + 2 io; memory with the 1F1B counts;
    a data-parallel stage synchronises its weight gradients."""
    sm = from_proto(chain_model(), {})
    c = two_hosts()
    spec = TrainingSpec("1f1b", 4, optimizer_state=4.0)
    seg0, seg1 = make_segment(sm, 0, 2), make_segment(sm, 2, 3)
    flow = gradient_flow(sm)
    p0 = jt.training_planner(seg0, c, (0, 1), (2,), 4.0, flow)
    p1 = jt.training_planner(seg1, c, (2, 3), (2,), 4.0, flow)
    s0 = {op.name: p0.candidates(i)[-1].strategy for i, op in enumerate(seg0.sm.ops)}
    s1 = {op.name: p1.candidates(0)[-1].strategy for op in seg1.sm.ops}
    specs = [StageSpec(0, 2, (0, 1), (2,), s0), StageSpec(2, 3, (2, 3), (2,), s1)]
    priced = jt.price_training_stages(sm, c, specs, None, spec)
    stages, tr = priced.stages, priced.training
    assert priced.over is None
    o0, o1 = jt.price_option(p0, s0), jt.price_option(p1, s1)
    x = 4 * 6 * 4 / (2 * 2e7)  # h2 (4 x 6 float32) over the link between the hosts
    t = [o0.time + 2 * x, o1.time + 2 * x]
    assert [r.time for r in tr.stages] == pytest.approx(t, rel=1e-12)
    assert tr.iteration_time == pytest.approx(sum(t) + 3 * max(t) + max(o0.sync, o1.sync))
    assert [r.inflight for r in tr.stages] == [2.0, 1.0]
    assert tr.stages[0].memory == pytest.approx(o0.base + 2 * o0.stash)
    assert tr.stages[1].memory == pytest.approx(o1.base + o1.stash)
    assert stages[0].io_out == pytest.approx(x) and stages[1].io_in == pytest.approx(x)
    # a data-parallel MatMul on 2 devices holds its weight gradient as partial sums: it syncs
    sync_free = {op.name: p1.candidates(0)[0].strategy for op in seg1.sm.ops}  # replicated
    assert jt.price_option(p1, sync_free).sync == 0.0


def test_a_stage_computes_the_gradient_of_what_it_receives():
    """mm2 in a stage of its own still computes dX (its input comes from mm1's weights): its
    backward equals the whole model's for that operator (2 x forward, not 1 x)."""
    sm = from_proto(chain_model(), {})
    c = flat_two()
    seg = make_segment(sm, 2, 3)
    planner = jt.training_planner(seg, c, (0,), (1,), 4.0, gradient_flow(sm))
    whole = Planner(sm, planner.mesh, planner.cluster, ShardTraining(4.0))
    sh = planner.candidates(0)[0]
    assert planner.backward_compute(0, sh) == pytest.approx(whole.backward_compute(2, sh))
    assert planner.backward_compute(0, sh) == pytest.approx(2 * planner.compute_time(0, sh))
    alone = Planner(seg.sm, planner.mesh, planner.cluster, ShardTraining(4.0))
    assert alone.backward_compute(0, sh) == pytest.approx(planner.compute_time(0, sh))


def test_one_stage_on_one_device_is_the_sharding_training_program():
    """A one-stage plan on one device: T = m t + sync, t = the training program of
    ``mtpp shard --training`` (no transfers)."""
    sm = from_proto(chain_model(), {})
    c = flat_two()
    spec = TrainingSpec("gpipe", 3)
    seg = make_segment(sm, 0, 3)
    planner = jt.training_planner(seg, c, (0,), (1,), 4.0, gradient_flow(sm))
    chosen = {op.name: planner.candidates(i)[0].strategy for i, op in enumerate(sm.ops)}
    tr = jt.price_training_stages(sm, c, [StageSpec(0, 3, (0,), (1,), chosen)], None, spec).training
    prog = evaluate(Planner(sm, planner.mesh, planner.cluster, ShardTraining(4.0)), chosen)
    assert tr.iteration_time == pytest.approx(3 * prog.objective)
    forward = evaluate(Planner(sm, planner.mesh, planner.cluster), chosen)
    base = prog.weight_memory + forward.peak_activation_memory
    assert tr.stages[0].memory == pytest.approx(base + 3 * tr.stages[0].stash)
    # the stash is the backward table's: MatMul keeps x (w1 has a gradient) and h2, Relu h2
    assert tr.stages[0].stash == pytest.approx(2 * 4 * 6 * 4)


# ---------------------------------------------------------------------- the command line
@pytest.fixture
def chain_path(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(), path)
    return path


def test_cli_solve_joint_training_json_and_plan_file(chain_path, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, stdout, err = run(
        capsys,
        "solve",
        chain_path,
        "--method",
        "joint",
        "--cluster",
        "dgx-a100-x2",
        "--schedule",
        "1f1b",
        "--microbatches",
        "4",
        "--json",
        "--quiet",
        "--out",
        out,
    )
    assert code == 0, err
    data = json.loads(stdout)
    assert data["objective_kind"] == "iteration_time"
    assert data["objective"] == data["training"]["iteration_time"]
    assert data["training"]["schedule"] == "1f1b" and data["training"]["microbatches"] == 4
    assert len(data["training"]["stages"]) == len(data["stages"])
    assert data["lower_bound"] <= data["objective"]
    saved = json.loads(out.read_text())
    assert saved["objective"] == data["objective"]
    for command in ("evaluate", "simulate"):  # tests/cli/test_joint_training_evaluate_*.py
        code, _, err = run(capsys, command, chain_path, out)
        assert code == 0, err


def test_cli_solve_joint_training_table(chain_path, capsys):
    code, stdout, err = run(
        capsys,
        "solve",
        chain_path,
        "--method",
        "joint",
        "--cluster",
        "dgx-a100-x2",
        "--schedule",
        "gpipe",
        "--microbatches",
        "2",
        "--quiet",
    )
    assert code == 0, err
    text = " ".join(stdout.split())
    assert "objective (iteration time T, gpipe, m = 2)" in text
    assert "in flight 2" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--schedule", "interleaved", "--microbatches", "4", "--virtual-stages", "2"],
            "mtpp: error: --schedule interleaved does not apply to --method joint yet; use gpipe "
            "or 1f1b\n",
        ),
        (
            ["--schedule", "interleaved", "--microbatches", "4"],
            "mtpp: error: --schedule interleaved does not apply to --method joint yet; use gpipe "
            "or 1f1b\n",
        ),
        (
            ["--microbatches", "4"],
            "mtpp: error: --microbatches applies to training plans; add --schedule "
            "gpipe|1f1b|interleaved\n",
        ),
        (
            ["--schedule", "1f1b", "--microbatches", "0"],
            "mtpp: error: the number of microbatches must be from 1 to 1,000,000, got 0\n",
        ),
    ],
)
def test_cli_joint_training_refusals(chain_path, args, message, capsys):
    code, _, err = run(capsys, "solve", chain_path, "--method", "joint", "--quiet", *args)
    assert code == 2
    assert err == message


def test_cli_joint_training_without_a_fitting_plan(chain_path, capsys):
    code, _, err = run(
        capsys,
        "solve",
        chain_path,
        "--method",
        "joint",
        "--cluster",
        "dgx-a100-x2",
        "--schedule",
        "1f1b",
        "--microbatches",
        "4",
        "--memory",
        "100B",
        "--quiet",
    )
    assert code == 2
    assert err.startswith("mtpp: error: ")
    assert err.count("\n") == 1 and "no joint training plan" in err


def test_cut_stride_keeps_every_kth_inner_cut_and_names_it_in_the_space():
    assert jt.thinned([0, 1, 2, 3, 4, 5, 6], 2) == [0, 1, 3, 5, 6]  # counted from the last
    assert jt.thinned([0, 1, 2, 3, 4, 5, 6], 1) == [0, 1, 2, 3, 4, 5, 6]
    assert jt.thinned([0, 1, 2, 3], 5) == [0, 2, 3]
    with pytest.raises(MtppError, match=r"^the cut stride must be a whole number >= 1, got 0$"):
        jt.thinned([0, 1, 2], 0)
    sm = from_proto(chain_model(), {})
    plan = jt.plan_joint_training(sm, flat_two(), TrainingSpec("1f1b", 2), cut_stride=2)
    assert "only one in every 2 such positions" in plan.bound_space
    assert {len(s.ops) for s in plan.stages} <= {1, 2, 3}


def test_the_time_limit_stops_the_upper_programme_with_the_first_plan(monkeypatch):
    """An upper programme stopped at its deadline keeps the first plan and says so; the plan
    is not below the optimum and the bound not above it."""
    sm = from_proto(chain_model(), {})
    c, spec = two_hosts(), TrainingSpec("1f1b", 4, optimizer_state=4.0)
    want = brute_force(sm, c, spec, None)
    monkeypatch.setattr(jt, "UPPER_SHARE", 0.0)  # the upper programme's deadline is now
    plan = jt.plan_joint_training(sm, c, spec, time_limit=120)
    assert plan.stats["upper_stopped"].startswith("the time limit stopped the upper programme")
    assert plan.objective >= want * (1 - 1e-9) and plan.lower_bound <= want * (1 + 1e-9)
