"""mtpp evaluate, simulate and export of a joint training plan file (mtpp solve MODEL.onnx
--method joint --schedule S --microbatches M --out PLAN): the numbers re-priced equal the
solve's, the schedule simulated (makespan vs T by the documented relation, peak in-flight
counts), the stage models exported with the training settings, a tampered file refused."""

from __future__ import annotations

import json
import math

import onnx
import pytest

from solver.cli import main
from tests.cli_runner import run
from tests.joint.test_planner import tiny_model

M = 3  # microbatches
TRAINING_KEYS = ("forward", "backward", "time", "sync", "base_bytes", "stash_bytes", "inflight")


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """The tiny model (a skip connection, random weights) solved for GPipe and 1F1B on two DGX
    hosts: {schedule: (model path, plan path, the plan's content)}."""
    folder = tmp_path_factory.mktemp("joint_training")
    model = folder / "tiny.onnx"
    onnx.save(tiny_model(), model)
    out = {}
    for schedule in ("gpipe", "1f1b"):
        plan = folder / f"{schedule}.json"
        argv = ["solve", model, "--method", "joint", "--cluster", "dgx-a100-x2", "--schedule"]
        argv += [schedule, "--microbatches", M, "--time-limit", 20, "--quiet", "--out", plan]
        assert main([str(a) for a in argv]) == 0
        out[schedule] = (model, plan, json.loads(plan.read_text()))
    return out


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_evaluate_reprices_every_stage_to_the_solves_numbers(solved, schedule, capsys):
    model, plan, data = solved[schedule]
    assert len(data["stages"]) >= 2  # a pipeline: in-flight counts differ by stage under 1F1B
    code, stdout, err = run(capsys, "evaluate", model, plan, "--json")
    assert code == 0, err
    got = json.loads(stdout)
    assert got["objective"] == pytest.approx(data["objective"], rel=1e-12)
    assert got["status"] == data["status"] and got["valid"] is True
    assert got["training"]["iteration_time"] == pytest.approx(
        data["training"]["iteration_time"], rel=1e-12
    )
    for new, old in zip(got["training"]["stages"], data["training"]["stages"], strict=True):
        for key in (*TRAINING_KEYS, "memory_bytes"):
            assert new[key] == pytest.approx(old[key], rel=1e-12), key
    code, stdout, err = run(capsys, "evaluate", model, plan)
    assert code == 0, err
    text = " ".join(stdout.split())
    assert "evaluation of a joint training plan" in text
    assert f"objective (iteration time T, {schedule}, m = {M})" in text
    assert "every stage re-priced for training (F, B, sync, memory, T)" in text
    assert "stage 1: F " in text and " in flight " in text


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_simulate_runs_the_schedule_next_to_t(solved, schedule, tmp_path, capsys):
    model, plan, data = solved[schedule]
    chart = tmp_path / "gantt.png"
    code, stdout, err = run(capsys, "simulate", model, plan, "--json", "--gantt", chart)
    assert code == 0, err
    sim = json.loads(stdout)
    p, T = len(data["stages"]), data["objective"]
    assert sim["iteration_time"] == pytest.approx(T, rel=1e-12)
    inflight = [M] * p if schedule == "gpipe" else [min(M, p - i) for i in range(p)]
    assert [s["inflight_simulated"] for s in sim["stages"]] == inflight
    assert [s["inflight_model"] for s in sim["stages"]] == inflight
    rows = data["training"]["stages"]
    for s, row in zip(sim["stages"], rows, strict=True):
        assert s["memory_simulated_bytes"] == pytest.approx(row["memory_bytes"], rel=1e-12)
    # the documented relation: the sync after each stage's last backward, stage 0 last
    span, pipe = sim["makespan"], sim["pipeline_makespan"]
    syncs = [r["sync"] for r in rows]
    assert span == pytest.approx(max(s["sync_end"] for s in sim["stages"]), rel=1e-12)
    assert pipe + syncs[0] * (1 - 1e-12) <= span <= (pipe + max(syncs)) * (1 + 1e-12)
    rel = sim["relation"]
    assert rel["lower"] * (1 - 1e-9) <= span <= rel["upper"] * (1 + 1e-9)
    F = [r["forward"] for r in rows]
    B = [r["backward"] for r in rows]
    if schedule == "gpipe":  # the pipeline exactly, and never below T without the sync
        exact = sum(F) + (M - 1) * max(F) + sum(B) + (M - 1) * max(B)
        assert pipe == pytest.approx(exact, rel=1e-12)
        assert exact >= (T - max(syncs)) * (1 - 1e-12)
    else:
        assert pipe <= (M + p - 1) * max(f + b for f, b in zip(F, B, strict=True)) * (1 + 1e-12)
    assert sim["makespan_over_iteration_time"] == pytest.approx(span / T)
    assert chart.stat().st_size > 1000
    code, stdout, err = run(capsys, "simulate", model, plan)
    assert code == 0, err
    text = " ".join(stdout.split())
    assert f"training schedule: joint plan of tiny, {p} stages, {schedule}, m = {M}" in text
    assert "makespan / T" in text and "then the gradient sync; proven here: makespan >=" in text


def test_simulate_refuses_requests_for_a_joint_training_plan(solved, capsys):
    model, plan, _ = solved["1f1b"]
    code, _, err = run(capsys, "simulate", model, plan, "--requests", "5")
    assert (code, err) == (
        2,
        "mtpp: error: --requests does not apply to a joint training plan; drop it\n",
    )


def test_export_writes_the_stage_models_with_the_training_settings(solved, tmp_path, capsys):
    model, plan, data = solved["1f1b"]
    out = tmp_path / "export"
    code, stdout, err = run(capsys, "export", model, plan, "--out", out, "--verify")
    assert code == 0, err
    assert "a training plan (1f1b, m = 3" in " ".join(stdout.split())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["training"] == data["training"]
    for i, row in enumerate(manifest["stages"]):
        assert row["training"] == data["training"]["stages"][i]
        stage = onnx.load(str(out / row["folder"] / "annotated.onnx"))
        assert [n.name for n in stage.graph.node] == data["stages"][i]["ops"]
        assert (out / row["folder"] / "strategies.yaml").is_file()
    assert manifest["verify"]["ok"] is True  # the forward chain computes the model
    assert json.loads((out / "plan.json").read_text()) == data
    assert "Trained with 1f1b, m = 3 microbatches" in (out / "README.txt").read_text()
    before = (out / "manifest.json").read_text()
    code, _, err = run(capsys, "export", model, plan, "--out", out)
    assert code == 2 and err.count("\n") == 1 and "pass --force to replace it" in err
    assert (out / "manifest.json").read_text() == before  # nothing overwritten
    code, _, err = run(capsys, "export", model, plan, "--out", out, "--force")
    assert code == 0, err


def _tampered(data: dict, change) -> dict:
    copy = json.loads(json.dumps(data))
    change(copy)
    return copy


def _scale_stage_terms(d: dict) -> None:
    """F up and B down by the same amount: t, memory and T still add up; only the model can
    tell."""
    row = d["training"]["stages"][0]
    row["forward"], row["backward"] = row["forward"] * 1.5, row["backward"] - row["forward"] * 0.5


TAMPERED = [
    (
        lambda d: d["training"]["stages"][0].update(
            forward=d["training"]["stages"][0]["forward"] * 2
        ),
        "training: stage 0: time {t0!r} is not F + B",
    ),
    (_scale_stage_terms, "training: stage 0: forward is"),
    (
        lambda d: d.update(objective=d["objective"] / 2),
        "objective {half!r} is not the iteration time T",
    ),
    (lambda d: d["training"].update(microbatches=M + 1), "training: iteration_time"),
    (
        lambda d: d["training"].update(schedule="interleaved"),
        "training: schedule 'interleaved' is not one of gpipe, 1f1b",
    ),
    (lambda d: d["training"].update(optimizer_state=8), "stage 0: memory_per_device is"),
]


@pytest.mark.parametrize(("change", "message"), TAMPERED)
@pytest.mark.parametrize("command", ["evaluate", "simulate", "export"])
def test_a_tampered_plan_file_is_refused_in_one_line(
    solved, change, message, command, tmp_path, capsys
):
    model, _, data = solved["1f1b"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_tampered(data, change)))
    t0 = data["training"]["stages"][0]["time"]
    expected = message.format(t0=t0, half=data["objective"] / 2)
    extra = ["--out", tmp_path / "out"] if command == "export" else []
    code, stdout, err = run(capsys, command, model, bad, *extra)
    assert code == 2 and stdout == ""
    assert err.startswith(f"mtpp: error: {bad}: {expected}"), err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_tighter_memory_limit_is_refused_naming_the_stage(solved, capsys):
    model, plan, data = solved["gpipe"]
    most = max(r["memory_bytes"] for r in data["training"]["stages"])
    code, _, err = run(capsys, "evaluate", model, plan, "--memory", f"{math.floor(most) - 1}B")
    assert code == 2 and err.count("\n") == 1
    assert "bytes per device >" in err and err.startswith(f"mtpp: error: {plan}: stage ")


def test_a_higher_memory_limit_keeps_only_the_universal_bound(solved, tmp_path, capsys):
    """A plan solved under a limit L (here the file states L = 2 x its largest stage memory):
    --memory below L keeps the file's bound and status; above L more plans fit, so only the
    universal bound stands."""
    model, _, data = solved["gpipe"]
    most = max(r["memory_bytes"] for r in data["training"]["stages"])
    limited = json.loads(json.dumps(data))
    limited["memory_limit"] = 2 * most
    plan = tmp_path / "limited.json"
    plan.write_text(json.dumps(limited))
    code, stdout, err = run(capsys, "evaluate", model, plan, "--json", "--memory", f"{1.5 * most}B")
    assert code == 0, err
    kept = json.loads(stdout)
    assert kept["lower_bound"] == data["lower_bound"] and kept["status_source"] == "claimed"
    code, stdout, err = run(capsys, "evaluate", model, plan, "--json", "--memory", f"{4 * most}B")
    assert code == 0, err
    dropped = json.loads(stdout)
    assert dropped["lower_bound"] == data["universal_bound"] != data["lower_bound"]
    assert dropped["status"] != "OPTIMAL" and dropped["status_source"] == "recomputed"
    assert dropped["claimed_status"] == data["status"]
    assert dropped["bound_space"].startswith("every joint plan (the universal bound")
