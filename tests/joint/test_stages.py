"""Checks of a joint plan (issue 14 item 4): the pipeline simulation of its stages and the
export of one folder per stage, verified numerically through the chain."""

from __future__ import annotations

import json
import math

import onnx
import pytest

from solver.backends.simulate_joint import simulate_joint
from solver.backends.verify import verify_chain
from solver.cli import main
from solver.core.cluster import Cluster, Topology
from solver.core.errors import MtppError
from solver.core.result import FEASIBLE
from solver.frontends.onnx.modelgen import transformer
from solver.joint.plan import JointPlan, StageSpec, price_stages, save_joint_plan
from solver.joint.segment import make_segment, tensor_bytes
from solver.joint.stages import check_stages, stage_programs
from solver.joint.submesh import sub_cluster
from solver.spmd.model import load_model
from solver.spmd.solve import solve_sharding
from tests.badinput import assert_refused

INSIDE, BETWEEN = 100e9, 10e9  # bytes/s inside a group of 4 and between the two groups
LATENCY = 5e-6  # seconds on the link between the groups


def two_groups(latency: float = LATENCY) -> Cluster:
    """Two hosts of 4 devices: a fast link inside each, a slow one between them (latency
    ``latency``, a fifth of it inside a host)."""
    return Cluster(
        name="two-hosts",
        devices=8,
        link_bandwidth=INSIDE,
        topology=Topology(
            groups=((0, 1, 2, 3), (4, 5, 6, 7)),
            names=("a", "b"),
            links=((INSIDE, latency / 5), (INSIDE, latency / 5)),
            between=(BETWEEN, latency),
        ),
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A 2-layer transformer (hidden 64) with random weights, and its sharding model."""
    m, _ = transformer(layers=2, hidden=64, heads=4, seq=16, vocab=100, batch=2, seed=7)
    path = tmp_path_factory.mktemp("joint") / "t.onnx"
    onnx.save(m, path)
    return path, load_model(path)


def build_plan(sm, cluster, cuts, path=None, shapes=None) -> JointPlan:
    """A hand-built joint plan: ``cuts`` = [(start, end, devices)], each stage's strategies
    from Megatron on its own sub-model and devices (mesh ``shapes[i]``, default 1-D), priced
    by the joint cost function."""
    specs = []
    for i, (a, b, devs) in enumerate(cuts):
        shape = shapes[i] if shapes else (len(devs),)
        seg = make_segment(sm, a, b)
        res = solve_sharding(
            seg.sm,
            devices=len(devs),
            mesh="x".join(map(str, shape)),
            method="megatron",
            cluster=sub_cluster(cluster, devs),
        )
        specs.append(StageSpec(a, b, tuple(devs), shape, res.strategies))
    stages, over = price_stages(sm, cluster, specs, None)
    assert over is None
    return JointPlan(
        "t", cluster, None, stages, FEASIBLE, None, "", None, "joint", 0.0, model_path=path
    )


def halves(sm):
    n = len(sm.ops)
    return [(0, n // 2, (0, 1, 2, 3)), (n // 2, n, (4, 5, 6, 7))]


def thirds(sm):
    n = len(sm.ops)
    return [(0, n // 3, (0, 1, 2, 3)), (n // 3, 2 * n // 3, (4, 5)), (2 * n // 3, n, (6, 7))]


# ---------------------------------------------------------------------- simulation
@pytest.mark.parametrize("cut", [halves, thirds])
def test_period_is_the_objective_and_latency_the_sum_of_stage_times(model, cut):
    _, sm = model
    plan = build_plan(sm, two_groups(latency=0.0), cut(sm))
    js = simulate_joint(plan, sm, requests=40)
    assert js.valid, js.sim.violations
    assert js.sim.period == pytest.approx(plan.objective, rel=1e-12)
    assert js.sim.latency_first == pytest.approx(plan.latency, rel=1e-12)
    for row, st in zip(js.stages, plan.stages, strict=True):
        assert row["agrees"] and row["time"] == pytest.approx(st.time, rel=1e-12)
        assert row["recv"] == pytest.approx(st.io_in, rel=1e-12)
        assert row["send"] == pytest.approx(st.io_out, rel=1e-12)
        assert row["collectives"] == st.collectives and sum(st.collectives.values()) > 0


def test_transfers_follow_the_link_rule_and_latency_delays_each_hop(model):
    """Stage 1 receives its inputs over the slow link, 4 devices on each side: B / (4 * bw)
    per tensor, paid by both; each hop between hosts adds the link's latency to the first
    request's latency but nothing to the period."""
    _, sm = model
    plan = build_plan(sm, two_groups(), halves(sm))
    s0, s1 = plan.stages
    expected = sum(tensor_bytes(sm, t) for t in s1.inputs if t in s0.outputs) / (4 * BETWEEN)
    assert expected > 0
    js = simulate_joint(plan, sm, requests=40)
    assert js.stages[1]["recv"] == pytest.approx(expected, rel=1e-12)
    assert js.stages[0]["send"] == pytest.approx(expected, rel=1e-12)
    assert js.sim.period == pytest.approx(plan.objective, rel=1e-12)
    assert js.sim.latency_first == pytest.approx(plan.latency + LATENCY, rel=1e-12)
    # every device of a stage shows its stage's phases; busy fraction of the bottleneck ~ 1
    slow = max(range(2), key=lambda i: plan.stages[i].time)
    assert js.sim.busy[plan.stages[slow].devices[0]] > 0.95
    assert {d for d, *_ in js.sim.timeline} == set(range(8))


def test_a_bottleneck_in_the_middle_sets_the_period(model):
    """Stage 1 on a single device is the slowest: the period is its time, not the others'."""
    _, sm = model
    n = len(sm.ops)
    cuts = [(0, n // 3, (0, 1, 2, 3)), (n // 3, 2 * n // 3, (4,)), (2 * n // 3, n, (6, 7))]
    plan = build_plan(sm, two_groups(latency=0.0), cuts)
    times = [st.time for st in plan.stages]
    assert max(times) == times[1] and len(set(times)) == 3
    js = simulate_joint(plan, sm, requests=60)
    assert js.sim.period == pytest.approx(times[1], rel=1e-12)


def test_one_stage_on_a_two_host_mesh_simulates_and_verifies(model):
    """Pure sharding as a joint plan: one stage on a 2x4 mesh over both hosts (axis 0 on the
    slow link); no transfers, the period is the program's time, and the program verifies."""
    _, sm = model
    plan = build_plan(sm, two_groups(), [(0, len(sm.ops), tuple(range(8)))], shapes=[(2, 4)])
    (st,) = plan.stages
    assert st.mesh.bandwidth == (BETWEEN, INSIDE) and st.io_in == st.io_out == 0
    js = simulate_joint(plan, sm, requests=10)
    assert js.valid and js.sim.period == pytest.approx(st.program_time, rel=1e-12)
    assert js.sim.latency_first == pytest.approx(st.program_time, rel=1e-12)
    assert sum(st.collectives.values()) > 0
    v = verify_chain(plan, sm, stage_programs(plan, sm), seed=2)
    assert v["ok"], v["failure"]


def test_a_recorded_number_that_differs_is_a_violation(model):
    _, sm = model
    plan = build_plan(sm, two_groups(), halves(sm))
    plan.stages[1].program_time *= 1.5
    js = simulate_joint(plan, sm, requests=5)
    assert not js.valid
    assert js.sim.violations[0].startswith("stage 1: the plan records")


def test_stage_submodels_price_like_the_planner_segments(model):
    """The stage cut from the ONNX file by tensor names prices exactly as the planner's
    operator-range segment (two independent ways to the same sub-model)."""
    _, sm = model
    plan = build_plan(sm, two_groups(), thirds(sm))
    for p, st in zip(stage_programs(plan, sm), plan.stages, strict=True):
        assert p.program.objective == pytest.approx(st.program_time, rel=1e-12)
        assert p.program.memory_per_device == pytest.approx(st.memory_per_device, rel=1e-12)
        assert [op.name for op in p.sm.ops] == list(st.ops)


def test_plans_that_do_not_fit_the_model_are_refused(model):
    _, sm = model
    plan = build_plan(sm, two_groups(), halves(sm))
    plan.stages[1].devices = (3, 4, 5, 6)
    with pytest.raises(MtppError, match="device 3 is in stage 0 and stage 1"):
        check_stages(plan, sm)
    plan = build_plan(sm, two_groups(), halves(sm))
    st = plan.stages[1]
    st.ops = (*st.ops[:-1], "no-such-op")
    with pytest.raises(MtppError, match="no operator named 'no-such-op'"):
        check_stages(plan, sm)
    plan = build_plan(sm, two_groups(), halves(sm))
    plan.stages[0].ops, plan.stages[1].ops = plan.stages[1].ops, plan.stages[0].ops
    plan.stages[0].strategies, plan.stages[1].strategies = (
        plan.stages[1].strategies,
        plan.stages[0].strategies,
    )
    with pytest.raises(MtppError, match="from the later stage"):
        check_stages(plan, sm)


# ---------------------------------------------------------------------- verification
def _drop_a_reduction(program) -> str:
    """Replace one redistribution that sums partial sums by a plain slice (a wrong program)."""
    from solver.spmd.mesh import Layout
    from solver.spmd.redistribute import Redistribution, Step

    for key, r in program.redists.items():
        if r.steps and r.src.partial:
            plain = Layout(r.src.shape, r.src.device_matrix, r.src.dims)
            step = Step("Slice", None, plain, r.dst, 0.0, 0.0)
            program.redists[key] = Redistribution(r.src, r.dst, (step,))
            return program.names[key[0]]
    raise AssertionError("no reduction to drop")


def test_verify_passes_then_fails_on_a_wrong_stage(model):
    _, sm = model
    plan = build_plan(sm, two_groups(), thirds(sm))
    programs = stage_programs(plan, sm)
    good = verify_chain(plan, sm, programs, seed=1)
    assert good["ok"] and good["failure"] is None, good["failure"]
    assert 0 < good["max_abs_diff"] < 1e-4
    assert [row["stage"] for row in good["stages"]] == [0, 1, 2]
    _drop_a_reduction(programs[1].program)
    bad = verify_chain(plan, sm, programs, seed=1)
    assert not bad["ok"]
    assert bad["failure"].startswith("stage 1, tensor ")
    assert bad["stages"][0]["outputs"] and all(
        c["ok"] for c in bad["stages"][0]["outputs"].values()
    )
    (out,) = bad["outputs"].values()
    assert not out["ok"] and out["max_abs_diff"] > 1e-3


# ---------------------------------------------------------------------- the commands
@pytest.fixture
def files(model, tmp_path):
    """The model and a saved joint plan of it (stages on the two hosts)."""
    path, sm = model
    plan = build_plan(sm, two_groups(), thirds(sm), path=str(path))
    save_joint_plan(plan, tmp_path / "joint.json")
    return path, tmp_path / "joint.json", plan


def test_cli_simulate_a_joint_plan_alone_and_with_its_model(files, capsys, tmp_path):
    path, jp, plan = files
    assert main(["simulate", str(jp), "--requests", "30", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["period"] == pytest.approx(plan.objective, rel=1e-12)
    assert [s["stage"] for s in out["stages"]] == [0, 1, 2]
    assert out["stages"][0]["collectives"] == plan.stages[0].collectives
    gantt = tmp_path / "g.png"
    assert main(["simulate", str(path), str(jp), "--gantt", str(gantt)]) == 0
    text = capsys.readouterr().out
    assert "period" in text and "stage 2 collectives" in text
    assert gantt.stat().st_size > 1000


def test_cli_export_verify_round_trips(files, capsys, tmp_path):
    from solver.spmd.config import from_attributes, read_config

    path, jp, plan = files
    out = tmp_path / "stages"
    code = main(["export", str(path), "--plan", str(jp), "--out", str(out), "--verify", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["verify"]["ok"]
    assert (out / "plan.json").read_bytes() == jp.read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["folder"] for s in manifest["stages"]] == ["stage_0", "stage_1", "stage_2"]
    for st in plan.stages:
        folder = out / f"stage_{st.index}"
        sub = load_model(folder / "annotated.onnx")
        assert [op.name for op in sub.ops] == list(st.ops)
        assert sub.inputs == list(st.inputs) and sub.outputs == list(st.outputs)
        assert from_attributes(sub) == st.strategies
        assert read_config(folder / "strategies.yaml", sub) == st.strategies
        shard = json.loads((folder / "plan.json").read_text())
        assert shard["objective"] == pytest.approx(st.program_time, rel=1e-12)
        assert shard["devices"] == list(st.devices)


def test_cli_export_verify_fails_naming_the_stage(files, capsys, tmp_path, monkeypatch):
    import solver.backends.export_joint as jx

    path, jp, _ = files
    real = jx._written_programs

    def wrong(plan, folder):
        programs = real(plan, folder)
        _drop_a_reduction(programs[2].program)
        return programs

    monkeypatch.setattr(jx, "_written_programs", wrong)
    out = tmp_path / "stages"
    capsys.readouterr()
    code = main(["export", str(path), str(jp), "--out", str(out), "--verify"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith("mtpp: verify failed: stage 2, tensor ")
    assert "MISMATCH" in captured.out


def _edited(jp, tmp_path, edit) -> str:
    data = json.loads(jp.read_text())
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    return str(bad)


def test_cli_refuses_plans_that_do_not_fit(files, capsys, tmp_path):
    path, jp, _ = files

    def overlap(d):
        d["stages"][1]["devices"] = [3, 5]

    def unknown(d):
        st = d["stages"][1]
        st["strategies"]["nope"] = st["strategies"].pop(st["ops"][0])
        st["ops"][0] = "nope"

    def swapped(d):
        a, b = d["stages"][0], d["stages"][1]
        for key in ("ops", "strategies"):
            a[key], b[key] = b[key], a[key]

    def tampered(d):  # consistent in itself, but not what the model gives
        st = d["stages"][2]
        st["program_time"] += 1e-8
        st["time"] += 1e-8
        d["objective"] = max(x["time"] for x in d["stages"])
        d["latency"] = sum(x["time"] for x in d["stages"])

    cases = [
        (overlap, "a device is used twice"),
        (unknown, "no operator named 'nope'"),
        (swapped, "from the later stage"),
        (tampered, "stage 2: program_time"),
    ]
    for edit, match in cases:
        bad = _edited(jp, tmp_path, edit)
        assert_refused(capsys, ["simulate", str(path), bad], match, watch=tmp_path)
        out = tmp_path / "o"
        argv = ["export", str(path), bad, "--out", str(out), "--verify"]
        assert_refused(capsys, argv, match, watch=tmp_path)
        assert not out.exists()


def test_cli_bad_options_and_outputs(files, capsys, tmp_path):
    path, jp, _ = files
    refused = [
        (["simulate", str(jp), "--overlap"], "--overlap does not apply to a joint plan"),
        (["simulate", str(jp), "--mode", "sequential"], "--mode does not apply"),
        (
            ["simulate", str(jp), "--cluster", "dgx-a100"],
            r"made for cluster 'two-hosts' \(8 devices\), but --cluster dgx-a100 gives cluster "
            r"'dgx-a100' \(8 devices\), which differs in fast_memory",
        ),
        (["simulate", str(path)], "name the PLAN"),
        (["export", str(path), "--out", str(tmp_path / "o")], "name the plan"),
        (
            ["export", str(path), str(jp), "--plan", str(path), "--out", str(tmp_path / "o")],
            "give the plan once",
        ),
        (["export", str(path), str(jp), "--out", str(path.parent)], "holds the input"),
        (["export", str(path), str(jp), "--out", str(tmp_path)], "holds the input"),
    ]
    for argv, match in refused:
        assert_refused(capsys, argv, match, watch=tmp_path)
    moved = _edited(jp, tmp_path, lambda d: d["model"].update(path="gone/t.onnx"))
    assert_refused(capsys, ["simulate", moved], "does not exist; give it", watch=tmp_path)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    argv = ["export", str(path), str(jp), "--out", str(full)]
    assert_refused(capsys, argv, "not empty", watch=tmp_path)
    assert main([*argv, "--force"]) == 0
    assert not (full / "keep.txt").exists() and (full / "stage_0" / "annotated.onnx").is_file()
    assert math.isfinite(json.loads((full / "manifest.json").read_text())["weight_bytes_copied"])


def test_solve_joint_then_simulate_then_export_verify(model, capsys, tmp_path):
    """End to end through the commands: mtpp solve --method joint writes the plan, mtpp
    simulate (the plan alone: it names its model) agrees with its objective, and mtpp export
    --verify proves the chain."""
    import yaml

    path, _ = model
    cluster = tmp_path / "two-hosts.yaml"
    cluster.write_text(yaml.safe_dump(two_groups().to_dict()))
    jp = tmp_path / "plan.json"
    argv = ["solve", str(path), "--method", "joint", "--cluster", str(cluster)]
    assert main([*argv, "--time-limit", "10", "--out", str(jp), "-q", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(jp), "--requests", "40", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["valid"] and sim["period"] == pytest.approx(plan["objective"], rel=1e-12)
    assert len(sim["stages"]) == len(plan["stages"])
    out = tmp_path / "stages"
    code = main(["export", str(path), "--plan", str(jp), "--out", str(out), "--verify", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["verify"]["ok"], report["verify"]["failure"]
    assert len(report["stages"]) == len(plan["stages"])


def test_export_keeps_external_weights_by_reference(model, capsys, tmp_path):
    """A model whose weights live in an external file: each stage's weights are copied by byte
    range into its own annotated.onnx.data (the ONNX file holds none), and the chain verifies
    from those files."""
    path, sm = model
    ext = tmp_path / "ext"
    ext.mkdir()
    m = onnx.load(path)
    onnx.save(
        m, ext / "t.onnx", save_as_external_data=True, location="t.onnx.data", size_threshold=0
    )
    plan = build_plan(sm, two_groups(), halves(sm))
    jp = tmp_path / "joint.json"
    save_joint_plan(plan, jp)
    out = tmp_path / "stages"
    code = main(["export", str(ext / "t.onnx"), str(jp), "--out", str(out), "--verify", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["verify"]["ok"]
    weights = (ext / "t.onnx.data").stat().st_size
    copied = 0
    for st in plan.stages:
        folder = out / f"stage_{st.index}"
        assert (folder / "annotated.onnx").stat().st_size < weights / 10
        copied += (folder / "annotated.onnx.data").stat().st_size
        inits = onnx.load(folder / "annotated.onnx", load_external_data=False).graph.initializer
        big = [t for t in inits if t.data_location == onnx.TensorProto.EXTERNAL]
        assert big and all(
            {e.key: e.value for e in t.external_data}["location"] == "annotated.onnx.data"
            for t in big
        )
    assert report["weight_bytes_copied"] >= weights * 0.9  # every weight, in one stage or two
    assert copied >= report["weight_bytes_copied"]


def test_verify_refuses_beyond_available_memory_unless_told(files, capsys, tmp_path, monkeypatch):
    path, jp, _ = files
    monkeypatch.setattr("solver.frontends.onnx.ort.available_memory", lambda: 1 << 10)
    out = tmp_path / "stages"
    argv = ["export", str(path), str(jp), "--out", str(out), "--verify"]
    assert_refused(capsys, argv, r"--verify .* needs about .* --verify-memory-ok", watch=tmp_path)
    assert not out.exists()
    assert main([*argv, "--verify-memory-ok"]) == 0
    assert "needed about" in capsys.readouterr().out
    argv = ["export", str(path), str(jp), "--out", str(tmp_path / "o"), "--verify-memory-ok"]
    assert_refused(capsys, argv, "only applies with --verify", watch=tmp_path)
