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
from solver.cluster import Cluster, Topology, load_cluster
from solver.errors import MtppError
from solver.joint import JointPlan, load_joint_plan, plan_joint
from solver.joint.plan import StageSpec, price_stages, save_joint_plan
from solver.joint.segment import crossing, cut_points, make_segment
from solver.joint.submesh import candidates, sub_cluster
from solver.plan import OPTIMAL
from solver.sharding.mesh import Mesh, make_mesh, mesh_on
from solver.sharding.model import from_proto
from solver.sharding.patterns import megatron_plan
from solver.sharding.program import Planner, evaluate

from .badinput import assert_refused


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
    assert make_mesh((8, 2), c).bandwidth == (25e9, 300e9)  # axis 0 pairs cross the hosts
    assert make_mesh((16,), c).bandwidth == (25e9,)
    assert make_mesh((4, 2, 2), c).bandwidth == (25e9, 300e9, 300e9)
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
    from solver.modelgen import transformer

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
    from solver.modelgen import transformer

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
    from solver.modelgen import transformer

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


def test_universal_bound_assumption_holds_on_a_transformer():
    """An operator split over p devices does at least 1/p of its one-device work on each: the
    universal bound rests on it."""
    from solver.joint.planner import universal_bound
    from solver.modelgen import transformer

    m, _ = transformer(layers=1, hidden=32, heads=2, seq=8, vocab=64, batch=2)
    sm = from_proto(m, {})
    c = Cluster("c", 8, compute=1e12, memory_bandwidth=1e11)
    one = Planner(sm, Mesh((1,), (1e9,), (0.0,)), c)
    for p in (2, 4, 8):
        pl = Planner(sm, Mesh((p,), (1e9,), (0.0,)), c)
        for i in range(len(sm.ops)):
            least = min(pl.compute_time(i, sh) for sh in pl.candidates(i))
            assert least >= one.compute_time(i, one.candidates(i)[0]) / p * (1 - 1e-12)
    work = sum(one.compute_time(i, one.candidates(i)[0]) for i in range(len(sm.ops)))
    assert universal_bound(sm, c) == pytest.approx(work / 8)
