"""Joint plans (issue 14 item 3): topology-aware meshes, segments, sub-meshes, the planner
against brute force, plan files, the CLI and its refusals."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from solver.cli import main
from solver.core.cluster import Cluster, Topology, load_cluster
from solver.core.errors import MtppError
from solver.core.result import OPTIMAL
from solver.joint import JointPlan, load_joint_plan, plan_joint
from solver.joint.plan import StageSpec, price_stages, save_joint_plan
from solver.joint.segment import crossing, cut_points, make_segment
from solver.joint.submesh import candidates, sub_cluster
from solver.spmd.mesh import Mesh, make_mesh, mesh_on
from solver.spmd.model import from_proto
from solver.spmd.patterns import megatron_plan
from solver.spmd.program import Planner, evaluate
from tests.badinput import assert_refused


def two_hosts(per_host: int = 2, inside: float = 1e9, between: float = 2e7, **kw) -> Cluster:
    """Two groups of ``per_host`` devices: a fast link inside, a slow one between."""
    n = 2 * per_host
    topo = Topology(
        groups=(tuple(range(per_host)), tuple(range(per_host, n))),
        names=("h0", "h1"),
        links=((inside, 0.0), (inside, 0.0)),
        between=(between, 1e-6),
    )
    return Cluster(
        "two-hosts",
        n,
        compute=kw.pop("compute", 2e9),
        memory_bandwidth=kw.pop("memory_bandwidth", 4e9),
        link_bandwidth=inside,
        topology=topo,
        **kw,
    )


def tiny_model(seed: int = 1):
    """mm1 -> relu -> mm2 -> add(mm2, mm1) -> mm3: a skip connection that may jump a stage;
    random weights."""
    rng = np.random.default_rng(seed)

    def w(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="mm2"),
        helper.make_node("Add", ["h3", "h1"], ["h4"], name="add"),
        helper.make_node("MatMul", ["h4", "w3"], ["y"], name="mm3"),
    ]
    g = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        initializer=[w("w1", [8, 16]), w("w2", [16, 16]), w("w3", [16, 16])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


# ---------------------------------------------------------------------- meshes
def test_mesh_on_prices_each_axis_at_its_slowest_link():
    c = load_cluster("dgx-a100-x2")
    m = make_mesh((2, 8), c)
    assert m.bandwidth == (25e9, 300e9)
    assert m.latency[0] == pytest.approx(5e-6) and m.latency[1] == 0.0
    assert make_mesh((16,), c).bandwidth == (25e9,)
    # an axis joining some devices inside a server and some across is refused (one line)
    for shape in ((8, 2), (4, 2, 2)):
        with pytest.raises(MtppError, match="does not fit the groups"):
            make_mesh(shape, c)
    assert mesh_on(c, [4, 5, 6, 7], (4,)).bandwidth == (300e9,)
    assert mesh_on(c, [6, 7, 8, 9], (2, 2)).bandwidth == (25e9, 300e9)
    assert mesh_on(c, [6, 7, 8, 9], (4,)).bandwidth == (25e9,)
    # a flat cluster: every axis the cluster's own link, as before topologies
    flat = Cluster("f", 8, link_bandwidth=3e9, link_latency=2e-6)
    assert make_mesh((2, 4), flat) == Mesh((2, 4), (3e9, 3e9), (2e-6, 2e-6))
    with pytest.raises(MtppError, match="listed twice"):
        mesh_on(c, [1, 1], (2,))


def test_shard_cli_prices_the_mesh_on_the_topology(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    argv = ["shard", path, "--cluster", "dgx-a100-x2", "--mesh", "2x8", "--json"]
    assert main([str(a) for a in argv]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mesh"]["bandwidth"] == [25e9, 300e9]


# ---------------------------------------------------------------------- segments
def test_segment_inputs_outputs_and_whole_model_cost():
    sm = from_proto(tiny_model(), {})
    seg = make_segment(sm, 1, 3)  # relu, mm2
    assert seg.ops == ("relu", "mm2")
    assert seg.inputs == ("h1",)
    assert seg.outputs == ("h3",)
    assert make_segment(sm, 0, 2).outputs == ("h1", "h2")  # h1 is read by add later
    assert make_segment(sm, 3, 4).inputs == ("h3", "h1")
    assert [len(x) for x in crossing(sm)] == [0, 1, 2, 2, 1, 1]
    # the whole model as one segment costs what the model costs
    c = two_hosts()
    whole = make_segment(sm, 0, len(sm.ops))
    mesh = make_mesh((4,), c)
    strategies = megatron_plan(Planner(sm, mesh, c), {})
    assert strategies["mm1"] == ((1, 1), (1, 4))  # a column split: not a trivial plan
    a = evaluate(Planner(sm, mesh, c), strategies)
    b = evaluate(Planner(whole.sm, mesh, c), strategies)
    assert a.objective == b.objective and a.memory_per_device == b.memory_per_device


def test_repeated_layers_give_equal_segments():
    from solver.frontends.onnx.modelgen import transformer

    m, _ = transformer(layers=3, hidden=32, heads=2, seq=8, vocab=50)
    sm = from_proto(m, {})
    cuts = cut_points(sm)
    assert len(cuts) < len(sm.ops)  # a 3-layer model is cut at its layer boundaries only
    sigs = [make_segment(sm, a, b).signature for a, b in itertools.pairwise(cuts)]
    # the three layers' attention halves and MLP halves are alike, the rest differ
    assert len(set(sigs)) == len(sigs) - 4
    starts = {sig: i for i, sig in enumerate(sigs)}
    assert sorted(starts.values()) != list(range(len(sigs)))


# ---------------------------------------------------------------------- sub-meshes
def test_candidate_sub_meshes_of_two_hosts():
    c = two_hosts()
    got = [(m.devices, m.mesh.shape) for m in candidates(c)]
    assert got == [
        ((0,), (1,)),
        ((0, 1), (2,)),
        ((0, 1, 2, 3), (2, 2)),
        ((0, 1, 2, 3), (4,)),
        ((1,), (1,)),
        ((2,), (1,)),
        ((2, 3), (2,)),
        ((3,), (1,)),
    ]
    assert [m.devices for m in candidates(c, "pipeline")] == [(0,), (1,), (2,), (3,)]
    assert [m.mesh.shape for m in candidates(c, "sharding")] == [(2, 2), (4,)]
    whole = candidates(c, "sharding")[0]
    assert whole.mesh.bandwidth == (2e7, 1e9)


def test_sub_cluster_runs_at_the_slowest_device_in_the_smallest_memory():
    base = two_hosts()
    topo = Topology(
        base.topology.groups,
        base.topology.names,
        base.topology.links,
        base.topology.between,
        capacity=(4e6, 1e6, None, 8e6),
        compute=(2e9, 1e9, 4e9, 4e9),
    )
    c = Cluster("het", 4, compute=2e9, link_bandwidth=1e9, topology=topo)
    sub = sub_cluster(c, (0, 1))
    assert sub.devices == 2 and sub.compute == 1e9 and sub.capacity == 1e6
    assert sub_cluster(c, (2, 3)).capacity == 8e6 and sub_cluster(c, (2, 3)).compute == 4e9
    assert mesh_on(sub, range(2), (2,)) == mesh_on(c, (0, 1), (2,))
    cross = sub_cluster(c, (1, 2))
    assert mesh_on(cross, range(2), (2,)).bandwidth == (2e7,)


# ---------------------------------------------------------------------- brute force
def _least_program(sm, a, b, sub_mesh, cluster, limit):
    """Brute force: the fastest program of ops a..b-1 on the sub-mesh over every strategy
    combination that fits ``limit`` (inf when none does)."""
    seg = make_segment(sm, a, b)
    planner = Planner(seg.sm, sub_mesh.mesh, sub_cluster(cluster, sub_mesh.devices))
    best = math.inf
    names = [op.name for op in seg.sm.ops]
    for combo in itertools.product(*(planner.candidates(i) for i in range(len(names)))):
        prog = evaluate(planner, {n: sh.strategy for n, sh in zip(names, combo, strict=True)})
        if limit is None or prog.memory_per_device <= limit:
            best = min(best, prog.objective)
    return best


def _transfer(sm, cluster, t, src, dst):
    """The rule of docs/joint.md, by hand."""
    nbytes = math.prod(sm.shapes[t]) * sm.itemsize(t)
    bw = min(cluster.link(a, b)[0] for a in src for b in dst)
    return nbytes / (min(len(src), len(dst)) * bw)


def brute_force(sm, cluster, limit, space="joint"):
    n = len(sm.ops)
    meshes = candidates(cluster, space)
    cache = {}
    best = math.inf
    for k in range(1, n + 1):
        for inner in itertools.combinations(range(1, n), k - 1):
            cuts = [0, *inner, n]
            segs = list(itertools.pairwise(cuts))
            for assign in itertools.product(range(len(meshes)), repeat=k):
                ms = [meshes[i] for i in assign]
                if any(y.start < x.end for x, y in itertools.pairwise(ms)):
                    continue
                times = []
                for (a, b), m in zip(segs, ms, strict=True):
                    key = (a, b, m.devices, m.mesh.shape)
                    if key not in cache:
                        cache[key] = _least_program(sm, a, b, m, cluster, limit)
                    times.append(cache[key])
                stage_of = {t: s for s, (a, b) in enumerate(segs) for t in sm.ops[a].outputs}
                stage_of = {}
                for s, (a, b) in enumerate(segs):
                    for op in sm.ops[a:b]:
                        for t in op.outputs:
                            stage_of[t] = s
                for s, (a, b) in enumerate(segs):
                    for t in make_segment(sm, a, b).inputs:
                        if t in stage_of:
                            dt = _transfer(sm, cluster, t, ms[stage_of[t]].devices, ms[s].devices)
                            times[s] += dt
                            times[stage_of[t]] += dt
                best = min(best, max(times))
    return best


@pytest.mark.parametrize("limit", [None, 800.0])
def test_plan_joint_equals_brute_force(limit):
    sm = from_proto(tiny_model(), {})
    cluster = two_hosts(between=5e8)
    opt = brute_force(sm, cluster, limit)
    plan = plan_joint(sm, cluster, memory=limit, time_limit=30, workers=1)
    if limit is None:
        assert len(plan.stages) >= 2  # the instance is not won by one stage
    else:  # the limit binds: the unconstrained optimum does not fit
        assert opt > brute_force(sm, cluster, None) * 1.5
    assert plan.objective == pytest.approx(opt, rel=1e-9)
    assert plan.lower_bound <= opt * (1 + 1e-9)
    assert plan.universal_bound <= opt * (1 + 1e-9)
    assert plan.status == OPTIMAL and plan.gap <= 1e-6
    assert "every position" in plan.bound_space
    # the plan's own numbers are the cost function's
    specs = []
    pos = 0
    for st in plan.stages:
        specs.append(StageSpec(pos, pos + len(st.ops), st.devices, st.mesh.shape, st.strategies))
        pos += len(st.ops)
    again, over = price_stages(sm, cluster, specs, limit)
    assert over is None
    assert [s.time for s in again] == [s.time for s in plan.stages]
    if limit is not None:
        assert all(s.memory_per_device <= limit for s in plan.stages)


@pytest.mark.parametrize("space", ["pipeline", "sharding"])
def test_restricted_spaces_equal_brute_force(space):
    sm = from_proto(tiny_model(), {})
    cluster = two_hosts(between=5e8)
    opt = brute_force(sm, cluster, None, space)
    plan = plan_joint(sm, cluster, time_limit=30, space=space, workers=1)
    assert plan.objective == pytest.approx(opt, rel=1e-9)
    assert plan.status == OPTIMAL
    if space == "pipeline":
        assert all(len(s.devices) == 1 for s in plan.stages)
    else:
        assert len(plan.stages) == 1 and len(plan.stages[0].devices) == 4
    joint = plan_joint(sm, cluster, time_limit=30, workers=1)
    assert joint.objective <= plan.objective * (1 + 1e-9)


# ---------------------------------------------------------------------- plan files
@pytest.fixture(scope="module")
def small_plan():
    sm = from_proto(tiny_model(), {})
    return sm, plan_joint(sm, two_hosts(between=5e8), time_limit=30, workers=1)


def test_plan_round_trip_and_tampering(small_plan, tmp_path):
    sm, plan = small_plan
    path = tmp_path / "plan.json"
    save_joint_plan(plan, path)
    data = json.loads(path.read_text())
    assert data["format"] == "mtpp-joint-plan" and data["method"] == "joint"
    assert data["objective"] == plan.objective and data["devices"] == 4
    assert data["stages"][0]["time"] == plan.stages[0].time
    back = load_joint_plan(path, sm)
    assert isinstance(back, JointPlan)
    assert back.to_dict() == {**plan.to_dict(), "wall_seconds": back.wall_seconds}
    assert back.stages[0].strategies == plan.stages[0].strategies
    # a time that does not add up is caught from the file alone
    fast = min(range(len(plan.stages)), key=lambda i: plan.stages[i].time)  # not the bottleneck
    st = data["stages"][fast]
    st["program_time"] *= 0.5
    path.write_text(json.dumps(data))
    with pytest.raises(MtppError, match=f"stage {fast}: time .* is not program_time"):
        load_joint_plan(path)
    # a changed number that adds up is caught when the model is given
    st["time"] = st["program_time"] + st["io_in"] + st["io_out"]
    path.write_text(json.dumps(data))
    load_joint_plan(path)  # without the model: only the file's own consistency
    with pytest.raises(MtppError, match="program_time is .* in the file but the model gives"):
        load_joint_plan(path, sm)
    data = json.loads(json.dumps(plan.to_dict()))
    data["stages"][-1]["memory_per_device"] = 1.0
    path.write_text(json.dumps(data))
    with pytest.raises(MtppError, match="memory_per_device is 1.0 in the file but the model"):
        load_joint_plan(path, sm)
    # another strategy (every operator replicated) prices differently
    data = json.loads(json.dumps(plan.to_dict()))
    stage = next(st for st in data["stages"] if len(st["devices"]) > 1)
    assert any(x != 1 for v in stage["strategies"].values() for dims in v for x in dims)
    for op, value in stage["strategies"].items():
        stage["strategies"][op] = [[1] * len(dims) for dims in value]
    path.write_text(json.dumps(data))
    with pytest.raises(MtppError, match="in the file but the model gives"):
        load_joint_plan(path, sm)


def _first_stage_only(d: dict) -> None:
    d["stages"] = d["stages"][:1]
    d["objective"] = d["stages"][0]["time"]


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.update(format="mtpp-plan"), "not a joint plan"),
        (lambda d: d.update(objective=1.0), "not the slowest stage"),
        (lambda d: d.update(lower_bound=1.0), "exceeds the objective"),
        (lambda d: d.update(status="BEST"), "unknown status"),
        (lambda d: d["stages"][0].update(devices=[0, 0]), "used twice"),
        (lambda d: d["stages"][0]["mesh"].update(shape=[3]), "must multiply"),
        (lambda d: d["stages"][0]["mesh"].update(latency="x"), "one number per axis"),
        (lambda d: d["stages"][0].update(ops=d["stages"][0]["ops"][1:]), "in order"),
        (_first_stage_only, "stop before operator"),
        (lambda d: d["stages"][0]["mesh"].update(bandwidth=[1.0]), "links are not"),
    ],
)
def test_bad_plan_files_are_refused(small_plan, tmp_path, edit, match):
    sm, plan = small_plan
    data = json.loads(json.dumps(plan.to_dict()))
    edit(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MtppError, match=match):
        load_joint_plan(path, sm)


# ---------------------------------------------------------------------- acceptance
def test_embedding_larger_than_memory_on_two_dgx(tmp_path, capsys):
    """Issue 14: pure pipeline refused naming the Gather; pure sharding works; joint at
    least as fast, certified within 1%."""
    from solver.frontends.onnx.modelgen import transformer

    m, _ = transformer(layers=1, hidden=16, heads=2, seq=4, vocab=16384, seed=3)
    path = tmp_path / "emb.onnx"
    onnx.save(m, path)
    emb = 16384 * 16 * 4  # bytes of the token embedding
    memory = "200KB"
    assert emb > 200e3
    argv = ["solve", path, "--method", "cpsat", "--cluster", "dgx-a100-x2", "--memory", memory]
    assert_refused(capsys, [*argv, "-q", "--time-limit", "5"], r"Gather", watch=tmp_path)
    with pytest.raises(MtppError, match=r"'Gather_\d+' \(Gather\) fits on no stage"):
        plan_joint(path, "dgx-a100-x2", memory=memory, space="pipeline", time_limit=10)
    # limits for a loaded machine: both finish once proven (about 10 s each here)
    shard = plan_joint(path, "dgx-a100-x2", memory=memory, space="sharding", time_limit=60)
    joint = plan_joint(path, "dgx-a100-x2", memory=memory, time_limit=60)
    for plan in (shard, joint):
        assert all(s.memory_per_device <= 200e3 for s in plan.stages)
        assert plan.gap <= 0.01
    assert len(shard.stages) == 1 and len(shard.stages[0].devices) == 16
    assert joint.objective <= shard.objective * (1 + 1e-9)
    gather = next(op for op in from_proto(m, {}).ops if op.op_type == "Gather")
    home = next(s for s in joint.stages if gather.name in s.ops)
    assert len(home.devices) * 200e3 >= emb  # the table is split over enough devices


def test_transformer_on_two_hosts_of_four():
    """Joint is never worse than pure pipeline or pure sharding (both are in its space)."""
    from solver.frontends.onnx.modelgen import transformer

    topo = Topology(
        ((0, 1, 2, 3), (4, 5, 6, 7)), ("a", "b"), ((300e9, 0.0), (300e9, 0.0)), (25e9, 5e-6)
    )
    c = Cluster(
        "2x4", 8, compute=312e12, memory_bandwidth=2e12, link_bandwidth=300e9, topology=topo
    )
    m, _ = transformer(layers=2, hidden=64, heads=2, seq=16, vocab=100, batch=2, seed=5)
    sm = from_proto(m, {})
    plans = {
        s: plan_joint(sm, c, time_limit=40, space=s, workers=1)
        for s in ("pipeline", "sharding", "joint")
    }
    assert all(p.status == OPTIMAL for p in plans.values()), {s: p.gap for s, p in plans.items()}
    best_other = min(plans["pipeline"].objective, plans["sharding"].objective)
    assert plans["joint"].objective <= best_other * (1 + 1e-9)
    for p in plans.values():  # valid for every plan: below each space's proven optimum
        assert p.universal_bound <= p.lower_bound * (1 + 1e-9)


# ---------------------------------------------------------------------- CLI
def test_cli_joint_table_json_and_out(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    out = tmp_path / "plan.json"
    argv = ["solve", path, "--method", "joint", "--cluster", "dgx-a100", "--devices", "4"]
    assert main([str(a) for a in [*argv, "-q", "--time-limit", "20"]]) == 0
    text = capsys.readouterr().out
    assert "optimal over joint space" in text and "the bound covers" in text
    assert "stage" in text and "io in" in text
    assert (
        main([str(a) for a in [*argv, "-q", "--json", "--out", out, "--set", "space=pipeline"]])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["space"] == "pipeline" and data["status"] == OPTIMAL
    assert data["plan_file"] == str(out)
    assert all(len(s["devices"]) == 1 for s in data["stages"])
    back = load_joint_plan(out, path)
    assert back.objective == data["objective"]


def test_cli_joint_on_one_device(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    argv = ["solve", path, "--method", "joint", "--cluster", "dgx-a100", "-k", "1", "-q", "--json"]
    assert main([str(a) for a in argv]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == OPTIMAL and data["devices"] == 1
    assert [s["devices"] for s in data["stages"]] == [[0]]


def test_cli_joint_bad_input(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    graph = tmp_path / "g.json"
    graph.write_text("{}")
    base = ["solve", path, "--method", "joint", "-q", "--cluster", "dgx-a100", "-k", "4"]
    assert_refused(capsys, ["solve", graph, "--method", "joint"], "needs the ONNX model", tmp_path)
    assert_refused(capsys, [*base, "--memory", "100B"], r"'mm\d?' \(MatMul\) fits on no", tmp_path)
    # the weights fit split over 4 devices, but no program of any stage does (CP-SAT proves it)
    assert_refused(capsys, [*base, "--memory", "300B"], "proven: no joint plan", tmp_path)
    assert_refused(capsys, [*base, "--set", "space=ring"], "space=ring: use one of", tmp_path)
    assert_refused(capsys, [*base, "--set", "population=3"], "takes only --set space", tmp_path)
    assert_refused(capsys, [*base, "--time-limit", "-1"], "--time-limit", tmp_path)
    assert_refused(capsys, [*base, "--work", "flops"], "--work does not apply", tmp_path)
    assert_refused(capsys, [*base, "--out", path], "--out", tmp_path)


def test_old_universal_bound_assumption_holds_for_todays_rules():
    """The old bound assumed an operator split over p devices does at least 1/p of its
    one-device work on each. It holds for every operator of these models under today's rules
    and FLOP conventions (so the old bound was valid), but nothing enforced it: the new bound
    does not use it. With it, the new bound is the larger of the old total and the heaviest
    operator's least time."""
    from solver.frontends.onnx.modelgen import resnet, transformer
    from solver.joint.planner import op_work, universal_bound

    c = Cluster("c", 8, compute=1e12, memory_bandwidth=1e11)
    for m in (
        transformer(layers=1, hidden=32, heads=2, seq=8, vocab=64, batch=2)[0],
        resnet(stages=2, width=8)[0],
    ):
        sm = from_proto(m, {})
        one = Planner(sm, Mesh((1,), (1e9,), (0.0,)), c)
        work = [one.compute_time(i, one.candidates(i)[0]) for i in range(len(sm.ops))]
        least = []
        for i, t1 in enumerate(work):
            w = op_work(sm, one.specs[i], i, 8)
            t = np.maximum(w[:, 1] / 1e12, w[:, 2] / 1e11)
            assert (w[:, 0] * t).min() >= t1 * (1 - 1e-12), sm.ops[i].op_type
            least.append(t.min())
        assert universal_bound(sm, c) == pytest.approx(max(sum(work) / 8, max(least)), rel=1e-12)


def test_split_tuples_are_the_candidates_of_every_mesh_size():
    """Every split any stage of <= k devices can run is enumerated, and nothing else."""
    from solver.frontends.onnx.modelgen import transformer
    from solver.joint.planner import split_tuples
    from solver.spmd.rules import candidates as rule_candidates
    from solver.spmd.rules import op_spec

    sm = from_proto(transformer(layers=1, hidden=24, heads=2, seq=6, vocab=30, batch=2)[0], {})
    for op in sm.ops:
        spec = op_spec(op, sm)
        for k in (1, 4, 6, 12):
            want = {s for d in range(1, k + 1) for s in rule_candidates(spec, d)}
            assert set(split_tuples(spec, k)) == want, (op.op_type, k)
            assert len(split_tuples(spec, k)) == len(want)


def test_op_work_prices_every_sharding_as_the_planner():
    """Each (devices, FLOPs, bytes) row gives Planner.compute_time, on every mesh size."""
    from solver.joint.planner import op_work

    sm = from_proto(tiny_model(), {})
    for d in (1, 2, 3, 4):
        c = Cluster("c", d, compute=3e9, memory_bandwidth=5e9)
        pl = Planner(sm, Mesh((d,), (1e9,), (0.0,)), c)
        for i in range(len(sm.ops)):
            rows = op_work(sm, pl.specs[i], i, 4)
            for sh in pl.candidates(i):
                p = math.prod(sh.loop_splits)
                hit = rows[(rows[:, 0] == p) & (rows[:, 1] == sh.local_flops)]
                times = np.maximum(hit[:, 1] / 3e9, hit[:, 2] / 5e9)
                assert pl.compute_time(i, sh) in times.tolist()


def _factorizations(n: int) -> list[tuple[int, ...]]:
    """(n,) and every ordered tuple of factors >= 2 whose product is n."""
    out = {(n,)}
    for f in range(2, n):
        if n % f == 0:
            out |= {(f, *rest) for rest in _factorizations(n // f)}
    return sorted(out)


def _disjoint_sequences(devices: tuple[int, ...], count: int):
    """Every sequence of ``count`` disjoint non-empty device sets (any order, idle allowed)."""
    if count == 0:
        yield ()
        return
    for r in range(1, len(devices) + 1):
        for first in itertools.combinations(devices, r):
            rest = tuple(d for d in devices if d not in first)
            for tail in _disjoint_sequences(rest, count - 1):
                yield (first, *tail)


def every_joint_plan_period(sm, cluster) -> float:
    """Brute force over every joint plan, not only the planner's space: contiguous stages on
    any disjoint device sets in any order, any mesh shape, any strategies; transfers by the
    rule written out by hand. Returns the least period."""
    n = len(sm.ops)
    programs: dict = {}

    def program(a, b, devs):
        sub = sub_cluster(cluster, devs)
        best = math.inf
        for shape in _factorizations(len(devs)):
            mesh = mesh_on(cluster, devs, shape)
            key = (a, b, sub.compute, mesh)
            if key not in programs:
                planner = Planner(make_segment(sm, a, b).sm, mesh, sub)
                names = [op.name for op in planner.sm.ops]
                combos = itertools.product(*(planner.candidates(i) for i in range(b - a)))
                programs[key] = min(
                    evaluate(
                        planner, dict(zip(names, [sh.strategy for sh in c], strict=True))
                    ).objective
                    for c in combos
                )
            best = min(best, programs[key])
        return best

    best = math.inf
    for k in range(1, n + 1):
        for inner in itertools.combinations(range(1, n), k - 1):
            segs = list(itertools.pairwise([0, *inner, n]))
            for sets in _disjoint_sequences(tuple(range(cluster.devices)), k):
                times = [program(a, b, devs) for (a, b), devs in zip(segs, sets, strict=True)]
                stage_of = {
                    t: s for s, (a, b) in enumerate(segs) for op in sm.ops[a:b] for t in op.outputs
                }
                for s, (a, b) in enumerate(segs):
                    for t in make_segment(sm, a, b).inputs:
                        if t in stage_of:
                            dt = _transfer(sm, cluster, t, sets[stage_of[t]], sets[s])
                            times[s] += dt
                            times[stage_of[t]] += dt
                best = min(best, max(times))
    return best


@pytest.mark.parametrize(
    "compute, memory_bandwidth, expected",
    [
        (None, 4e9, None),  # memory-bound
        ((2e9, 2e9, 8e9, 8e9), 1e12, None),  # compute-bound, mixed devices
        # one fast device: 1312 FLOPs (256 + 16 + 512 + 16 + 512) over the 11 GFLOP/s of all
        ((8e9, 1e9, 1e9, 1e9), 1e12, 1312 / 11e9),
    ],
)
def test_universal_bound_is_below_every_joint_plan(compute, memory_bandwidth, expected):
    """On a tiny model and two hosts (of equal or mixed devices), no joint plan on any devices,
    meshes and strategies beats the universal bound, and the planner's plan is one of them."""
    from solver.joint.planner import universal_bound

    sm = from_proto(tiny_model(), {})
    topo = Topology(
        groups=((0, 1), (2, 3)),
        names=("h0", "h1"),
        links=((1e9, 0.0), (1e9, 0.0)),
        between=(5e8, 1e-6),
        compute=compute,
    )
    cluster = Cluster(
        "mixed",
        4,
        compute=2e9,
        memory_bandwidth=memory_bandwidth,
        link_bandwidth=1e9,
        topology=topo,
    )
    least = every_joint_plan_period(sm, cluster)
    bound = universal_bound(sm, cluster)
    assert 0 < bound <= least * (1 + 1e-12)
    if expected is not None:
        assert bound == pytest.approx(expected, rel=1e-9)
    plan = plan_joint(sm, cluster, time_limit=30, workers=1)
    assert least <= plan.objective * (1 + 1e-9)
    assert plan.universal_bound == pytest.approx(bound, rel=1e-12)


def test_universal_bound_by_hand():
    """x[1,64] @ w[64,64] -> Softmax over 64 on 8 devices of 1 GFLOP/s and 1 GB/s (bytes of
    float32). One device: the MatMul moves (64 + 4096 + 64) * 4 = 16896 B (16896 ns; 8192
    FLOPs take less), the Softmax 512 B (512 ns; 320 FLOPs). Shared by 8 devices: 17408 / 8 =
    2176 ns. The MatMul split k=2, j=4 (or k=4, j=2) moves (32 + 512 + 16) * 4 = 2240 B, its
    least on <= 8 devices (k=8 or j=8: 2336 B): 2240 ns, so the bound is 2240 ns. The old
    bound said 2176 ns (it split the heaviest operator's one-device time over all devices)."""
    from solver.joint.planner import universal_bound

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Softmax", ["h"], ["y"], name="sm", axis=-1),
        ],
        "hand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        initializer=[w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sm = from_proto(m, {})
    c = Cluster("c", 8, compute=1e9, memory_bandwidth=1e9)
    assert universal_bound(sm, c) == pytest.approx(2240e-9, rel=1e-12)
    assert universal_bound(sm, Cluster("c", 2, compute=1e9, memory_bandwidth=1e9)) == (
        pytest.approx(17408e-9 / 2, rel=1e-12)  # on 2 devices the total binds
    )


def test_plan_from_python_names_its_model_for_simulate(tmp_path, capsys):
    """plan_joint given a path records it: mtpp simulate then takes the saved plan alone."""
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    plan = plan_joint(str(path), two_hosts(between=5e8), time_limit=20, workers=1)
    assert plan.model_path == str(path)
    out = tmp_path / "plan.json"
    save_joint_plan(plan, out)
    assert json.loads(out.read_text())["model"]["path"] == str(path)
    assert main(["simulate", str(out), "--requests", "20", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["valid"] and sim["period"] == pytest.approx(plan.objective, rel=1e-12)
    # from a loaded model there is no file to name: simulate asks for it
    bare = plan_joint(from_proto(tiny_model(), {}), two_hosts(between=5e8), time_limit=20)
    assert bare.model_path is None
    save_joint_plan(bare, tmp_path / "bare.json")
    assert_refused(capsys, ["simulate", str(tmp_path / "bare.json")], "names no model", tmp_path)


# ---------------------------------------------------------------------- time limit and seeds
def _two_by_four_transformer():
    """A random-weight 2-layer transformer on two hosts of four devices (slow link between)."""
    from solver.frontends.onnx.modelgen import transformer

    topo = Topology(
        ((0, 1, 2, 3), (4, 5, 6, 7)), ("a", "b"), ((300e9, 0.0), (300e9, 0.0)), (25e9, 5e-6)
    )
    c = Cluster(
        "2x4", 8, compute=312e12, memory_bandwidth=2e12, link_bandwidth=300e9, topology=topo
    )
    m, _ = transformer(layers=2, hidden=64, heads=2, seq=16, vocab=100, batch=2, seed=7)
    return from_proto(m, {}), c


def test_joint_stopped_after_its_first_plans_is_no_worse_than_either_sub_space(monkeypatch):
    """The clock runs out right after the first incumbents: joint still holds the better of
    the pure pipeline and pure sharding plans, exactly what those searches hold then."""
    from solver.core.result import FEASIBLE
    from solver.joint import planner

    now = [0.0]
    monkeypatch.setattr(planner, "_clock", lambda: now[0])
    seeds = planner.JointSearch.seeds

    def seeds_then_stop(self):
        out = seeds(self)
        now[0] += 1e6  # the deadline passes right after the first incumbents
        return out

    monkeypatch.setattr(planner.JointSearch, "seeds", seeds_then_stop)
    sm, c = _two_by_four_transformer()
    plans = {s: plan_joint(sm, c, time_limit=30, space=s) for s in ("pipeline", "sharding")}
    joint = plan_joint(sm, c, time_limit=30, space="joint")
    assert joint.stats["rounds"] == 0 and joint.stats["exact_solves"] == 0
    assert joint.objective == min(p.objective for p in plans.values())
    assert plans["pipeline"].objective != plans["sharding"].objective  # a real choice
    best_sub = min(plans, key=lambda s: plans[s].objective)
    if best_sub == "pipeline":
        assert all(len(s.devices) == 1 for s in joint.stages)
    else:
        assert len(joint.stages) == 1 and len(joint.stages[0].devices) == 8
    # the bound of a stopped search is still valid: the universal one
    assert joint.status == FEASIBLE
    assert joint.lower_bound == joint.universal_bound <= joint.objective


def test_joint_with_a_tiny_budget_is_no_worse_than_either_sub_space():
    sm, c = _two_by_four_transformer()
    plans = {
        s: plan_joint(sm, c, time_limit=0.3, space=s, workers=1)
        for s in ("pipeline", "sharding", "joint")
    }
    assert plans["joint"].objective <= plans["pipeline"].objective
    assert plans["joint"].objective <= plans["sharding"].objective
    for p in plans.values():
        assert p.lower_bound <= p.objective and p.stats["exact_solves"] == 0


def test_search_stops_at_its_deadline_and_gives_exact_solves_only_the_time_left(monkeypatch):
    """A clock that advances with every look: pricing stops at the deadline, each exact solve
    gets at most the time left, and the search returns once the deadline has passed."""
    from solver.joint import planner
    from solver.spmd import solve as solve_mod

    now = [0.0]

    def clock():
        now[0] += 0.002  # every look at the clock costs 2 ms of fake time
        return now[0]

    monkeypatch.setattr(planner, "_clock", clock)
    real = solve_mod.solve_sharding
    asked = []

    def recording(*args, time_limit, **kw):
        asked.append((time_limit, deadline[0] - now[0]))
        now[0] += time_limit  # the solve uses its whole budget
        return real(*args, time_limit=time_limit, **kw)

    monkeypatch.setattr(solve_mod, "solve_sharding", recording)
    deadline = [0.0]
    search_init = planner.JointSearch.__init__

    def init(self, *args):
        search_init(self, *args)
        deadline[0] = self.deadline

    monkeypatch.setattr(planner.JointSearch, "__init__", init)
    sm, c = _two_by_four_transformer()
    plan = plan_joint(sm, c, time_limit=12, space="joint", workers=1)
    assert asked, "no exact solve ran: the test checks nothing"
    for budget, left in asked:
        assert 0 < budget <= left
    assert plan.stats["stopped"] and plan.status != OPTIMAL
    assert plan.lower_bound <= plan.objective
    assert now[0] - deadline[0] < 1.0  # at most a few looks at the clock past it, no more work


def test_progress_names_every_long_phase(monkeypatch):
    from solver.joint import planner

    notes = []

    class Recorder:
        def note(self, text):
            notes.append(text)

        def update(self, objective, bound, elapsed=None):
            notes.append(("update", objective, bound))

    monkeypatch.setattr(planner, "NOTE_SECONDS", 0.0)
    sm, c = _two_by_four_transformer()
    plan_joint(sm, c, time_limit=0.3, space="joint", progress=Recorder())
    texts = [n for n in notes if isinstance(n, str)]
    assert texts.index("first plan: the pure sharding sub-space") < texts.index(
        "first plan: the pure pipeline sub-space"
    )
    assert any(t.startswith("pricing stage candidates (") for t in texts)
    first_update = next(n for n in notes if isinstance(n, tuple))
    assert math.isfinite(first_update[1]) and first_update[2] <= first_update[1]


def test_an_exact_solve_that_ran_out_of_time_is_retried_with_more(monkeypatch):
    """Every pair's first exact solve returns its plan unproven (as if CP-SAT ran out of
    time); the second, with twice the time, proves it. The search retries instead of stopping
    with a gap, and ends OPTIMAL at the brute-force optimum."""
    import dataclasses

    from solver.core.result import FEASIBLE
    from solver.spmd import solve as solve_mod

    real = solve_mod.solve_sharding
    calls: dict[tuple, list[float]] = {}

    def unproven_first(model, *args, time_limit, cluster, **kw):
        key = (id(model), kw["mesh"], cluster.compute)
        calls.setdefault(key, []).append(time_limit)
        res = real(model, *args, time_limit=time_limit, cluster=cluster, **kw)
        if len(calls[key]) > 1:
            return res
        stats = {**res.stats, "cpsat_status": "FEASIBLE", "stopped": "time limit"}
        return dataclasses.replace(res, status=FEASIBLE, lower_bound=0.0, stats=stats)

    monkeypatch.setattr(solve_mod, "solve_sharding", unproven_first)
    sm = from_proto(tiny_model(), {})
    cluster = two_hosts(between=5e8)
    plan = plan_joint(sm, cluster, time_limit=60, workers=1)
    retried = [b for b in calls.values() if len(b) > 1]
    assert retried, "no exact solve was retried: the test checks nothing"
    assert plan.stats["exact_retries"] == len(retried)
    for budgets in retried:
        assert budgets[1] == pytest.approx(2 * budgets[0], rel=1e-9)  # doubled, time was left
        assert len(budgets) == 2  # proven the second time: never a third
    assert plan.status == OPTIMAL and plan.gap <= 1e-6
    assert plan.objective == pytest.approx(brute_force(sm, cluster, None), rel=1e-9)
    assert not plan.stats.get("stopped")


def test_without_retries_the_unproven_solves_leave_a_gap(monkeypatch):
    """The control of the test above: the same unproven first solves, never retried (every
    retry refused), leave the search FEASIBLE with a gap, so the retries are what closes it."""
    import dataclasses

    from solver.core.result import FEASIBLE
    from solver.joint import planner
    from solver.spmd import solve as solve_mod

    real = solve_mod.solve_sharding

    def unproven(model, *args, **kw):
        res = real(model, *args, **kw)
        stats = {**res.stats, "cpsat_status": "FEASIBLE"}
        return dataclasses.replace(res, status=FEASIBLE, lower_bound=0.0, stats=stats)

    monkeypatch.setattr(solve_mod, "solve_sharding", unproven)
    monkeypatch.setattr(planner.JointSearch, "retry", lambda self, pairs: False)
    plan = plan_joint(from_proto(tiny_model(), {}), two_hosts(between=5e8), time_limit=60)
    assert plan.stats["exact_solves"] > 0
    assert plan.status == FEASIBLE and plan.gap > 1e-3


def test_only_solves_stopped_by_time_are_retried():
    """CP-SAT stopped by its time limit (or before building): retried. CP-SAT optimal in its
    integer model and already re-solved at a finer scale: only rounding is left, not retried."""
    from solver.joint.planner import _ran_out

    assert _ran_out({"cpsat_status": "FEASIBLE"})
    assert _ran_out({"cpsat_status": "NOT_BUILT"})
    assert _ran_out({"cpsat_status": "OPTIMAL"})  # the finer re-solve had no time to run
    assert not _ran_out({"cpsat_status": "OPTIMAL", "resolved_with_upper_bound": 1e-5})
