"""Every command takes GRAPH PLAN [--cluster] for every kind of plan, whatever the plan file is
called: the kind is read from the content, and a --cluster given beside a plan that records
its cluster is accepted when it is that cluster by content and refused (exit 2, one line
naming both clusters) when it is not."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import onnx
import pytest
import yaml

from solver.cli import main
from solver.cli.plan_files import cluster_difference
from solver.core.cluster import Cluster, Topology, load_cluster
from solver.frontends.onnx.modelgen import transformer
from tests.badinput import assert_refused
from tests.cli_runner import run_cli

PIPELINE_NAMES = ["plan.json", "plan.txt", "plan", "plan.yaml"]  # a pipeline plan in each
JOINT_NAMES = ["joint.plan", "joint.json", "joint", "joint.yaml"]  # a joint plan in each


def two_hosts() -> Cluster:
    """Two hosts of two devices: a fast link inside each, a slow one between them."""
    return Cluster(
        name="two-hosts",
        devices=4,
        link_bandwidth=100e9,
        topology=Topology(
            groups=((0, 1), (2, 3)),
            names=("a", "b"),
            links=((100e9, 1e-6), (100e9, 1e-6)),
            between=(10e9, 5e-6),
        ),
    )


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A random-weight transformer, a pipeline plan of it on 4 devices of dgx-a100 and a
    joint plan of it on two hosts (both written by mtpp solve --out), each copied under every
    name of PIPELINE_NAMES / JOINT_NAMES, and cluster files that agree with each by content
    under another name."""
    d = tmp_path_factory.mktemp("plan_kinds")
    m, _ = transformer(layers=2, hidden=32, heads=2, seq=8, vocab=50, batch=2, seed=3)
    model = d / "t.onnx"
    onnx.save(m, model)
    (d / "two-hosts.yaml").write_text(yaml.safe_dump(two_hosts().to_dict()))
    solve = ["solve", model, "-q", "--json"]
    argv = [*solve, "-m", "time", "--cluster", "dgx-a100", "-k", "4", "--out", d / "p.out"]
    assert main([str(a) for a in argv]) == 0
    argv = [*solve, "--method", "joint", "--cluster", d / "two-hosts.yaml", "--workers", "1"]
    assert main([str(a) for a in [*argv, "--time-limit", "5", "--out", d / "j.out"]]) == 0
    for names, source in ((PIPELINE_NAMES, "p.out"), (JOINT_NAMES, "j.out")):
        for name in names:
            shutil.copy(d / source, d / name)
    for plan, renamed in (("p.out", "same-as-pipeline.yaml"), ("j.out", "same-as-joint.yaml")):
        recorded = json.loads((d / plan).read_text())["cluster"]
        (d / renamed).write_text(yaml.safe_dump({**recorded, "name": "renamed"}))
    return d


def agreeing_clusters(d, kind: str) -> list[list[str]]:
    """--cluster options that name the plan's own cluster (by preset or file, or by content
    under another name)."""
    if kind == "pipeline":
        return [
            [],
            ["--cluster", "dgx-a100", "-k", "4"],
            ["--cluster", d / "same-as-pipeline.yaml"],
        ]
    return [[], ["--cluster", d / "two-hosts.yaml"], ["--cluster", d / "same-as-joint.yaml"]]


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_pipeline_plan_under_any_name_with_or_without_its_cluster(plans, name, capsys):
    d = plans
    saved = json.loads((d / "p.out").read_text())
    for i, extra in enumerate(agreeing_clusters(d, "pipeline")):
        code, out, err = run_cli(capsys, ["evaluate", d / "t.onnx", d / name, *extra, "--json"])
        e = json.loads(out)
        # priced on the plan's cluster (for the ONNX roofline too): the file's claim holds
        assert (code, err) == (0, "") and e["claim"] == "consistent", (extra, e["claim"])
        assert e["objective"] == pytest.approx(saved["objective"], rel=1e-12)
        code, out, _ = run_cli(
            capsys, ["simulate", d / "t.onnx", d / name, *extra, "--requests", "20", "--json"]
        )
        s = json.loads(out)
        assert code == 0 and s["valid"] and s["cluster"]["devices"] == 4
        assert s["period"] == pytest.approx(saved["objective"], rel=1e-9)
        folder = d / f"export-{name}-{i}"
        code, out, _ = run_cli(capsys, ["export", d / "t.onnx", d / name, *extra, "-o", folder])
        assert code == 0 and (folder / "annotated.onnx").is_file()
        assert len(list(folder.glob("stage*.onnx"))) == len(set(saved["assignment"].values()))


@pytest.mark.parametrize("name", JOINT_NAMES)
def test_joint_plan_under_any_name_with_or_without_its_cluster(plans, name, capsys):
    d = plans
    saved = json.loads((d / "j.out").read_text())
    for i, extra in enumerate([*agreeing_clusters(d, "joint"), ["-k", "4"]]):
        code, out, err = run_cli(capsys, ["evaluate", d / "t.onnx", d / name, *extra, "--json"])
        e = json.loads(out)
        assert (code, err) == (0, "") and e["repriced"] and e["valid"], extra
        assert e["objective"] == pytest.approx(saved["objective"], rel=1e-12)
        for argv in (["simulate", d / "t.onnx", d / name], ["simulate", d / name]):
            code, out, _ = run_cli(capsys, [*argv, *extra, "--requests", "20", "--json"])
            s = json.loads(out)
            assert code == 0 and s["valid"] and len(s["stages"]) == len(saved["stages"])
            assert s["period"] == pytest.approx(saved["objective"], rel=1e-9)
        folder = d / f"export-{name}-{i}"
        code, out, _ = run_cli(capsys, ["export", d / "t.onnx", d / name, *extra, "-o", folder])
        assert code == 0 and (folder / "manifest.json").is_file()
        assert len(list(folder.glob("stage_*"))) == len(saved["stages"])


@pytest.mark.parametrize("command", ["evaluate", "simulate", "export", "run"])
def test_a_disagreeing_cluster_is_refused_naming_both(plans, command, capsys):
    d = plans
    out = ["-o", d / "never"] if command == "export" else []
    argv = [command, d / "t.onnx", d / "plan.txt", "--cluster", "ipu-pod", "-k", "4", *out]
    assert_refused(
        capsys,
        argv,
        r"plan.txt: made for cluster 'dgx-a100' \(4 devices\), but --cluster ipu-pod "
        r"--devices 4 gives cluster 'ipu-pod' \(4 devices\), which differs in fast_memory: "
        r"858 MiB given, 74.5 GiB in the plan; drop --cluster to use the plan's cluster, or "
        r"solve again for this one$",
        watch=d,
    )
    if command == "run":
        return
    argv = [command, d / "t.onnx", d / "joint.plan", "--cluster", "dgx-a100", *out]
    assert_refused(
        capsys,
        argv,
        r"joint.plan: made for cluster 'two-hosts' \(4 devices\), but --cluster dgx-a100 "
        r"gives cluster 'dgx-a100' \(8 devices\), which differs in devices: 8 given, 4 in the "
        r"plan; drop --cluster",
        watch=d,
    )
    argv = [command, d / "t.onnx", d / "joint", "-k", "2", *out]
    assert_refused(capsys, argv, r"differs in devices: 2 given, 4 in the plan; drop --devices", d)


def test_pipeline_plan_memory_must_agree_too(plans, capsys):
    d = plans
    argv = ["simulate", d / "t.onnx", d / "plan", "--cluster", "dgx-a100", "-k", "4"]
    assert_refused(
        capsys, [*argv, "--memory", "1GB"], r"capacity: 954 MiB given, none in the plan", d
    )
    # without --cluster, --devices and --memory re-price the plan on what they say
    code, out, _ = run_cli(capsys, ["evaluate", d / "t.onnx", d / "plan", "-k", "5", "--json"])
    e = json.loads(out)
    assert code == 0 and e["devices"] == 5 and e["claim"].startswith("not applicable")


def test_run_takes_a_pipeline_plan_under_any_name_and_refuses_a_joint_one(plans, capsys):
    d = plans
    argv = ["run", d / "t.onnx", d / "plan", "--cluster", "dgx-a100", "-k", "4"]
    code, out, err = run_cli(capsys, [*argv, "--requests", "3", "--json"])
    assert code == 0, err
    assert json.loads(out)["stages"] == len(
        set(json.loads((d / "p.out").read_text())["assignment"].values())
    )
    assert_refused(
        capsys,
        ["run", d / "t.onnx", d / "joint.yaml"],
        r"joint.yaml: a joint plan, and this command takes pipeline plans; check a joint plan "
        r"with mtpp evaluate, mtpp simulate or mtpp export --verify$",
        watch=d,
    )


def test_manual_sharding_under_any_name(plans, tmp_path, capsys):
    """A manual-sharding YAML is recognised by its content too (here named .txt), and a
    pipeline plan given alone is asked for its graph."""
    d = plans
    code, out, _ = run_cli(capsys, ["export", d / "t.onnx", d / "plan", "-o", tmp_path / "x"])
    assert code == 0
    sharding = tmp_path / "points.txt"
    shutil.copy(tmp_path / "x" / "sharding.yaml", sharding)
    dgx = ["--cluster", "dgx-a100", "-k", "4", "--json"]
    code, out, err = run_cli(capsys, ["evaluate", d / "t.onnx", sharding, *dgx])
    manual = json.loads(out)
    assert code == 0 and manual["method"] == "manual"
    code, out, _ = run_cli(capsys, ["evaluate", d / "t.onnx", d / "plan", *dgx])
    assert manual["objective"] == pytest.approx(json.loads(out)["objective"], rel=1e-12)
    assert_refused(
        capsys,
        ["simulate", d / "plan.txt"],
        r"plan.txt is a pipeline plan, which does not name its graph file; give the graph "
        r"first: mtpp simulate GRAPH .*plan.txt$",
        watch=d,
    )


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"format": "mtpp-graph", "nodes": []}', r"a 'mtpp-graph' file is not a plan; expected"),
        ('{"nodes": []}', r"not a plan; expected a plan: a JSON with \"format\": \"mtpp-plan\""),
        ("just: words\n", r"not a plan; expected .* or a manual-sharding YAML"),
        ("{", r"not valid JSON"),
        ("- {node: nope, device: 0}\n", r"thing.plan: no node named 'nope' in graph 't'$"),
        ("- {device: 0}\n", r"thing.plan: entry 0 needs 'node' and 'device'"),
    ],
)
def test_a_file_that_is_no_plan_is_refused_naming_what_is_expected(
    plans, content, match, tmp_path, capsys
):
    bad = tmp_path / "thing.plan"
    bad.write_text(content)
    for command in ("evaluate", "simulate"):
        assert_refused(capsys, [command, plans / "t.onnx", bad], match, watch=tmp_path)


def test_a_different_integer_rate_is_named_in_its_unit():
    recorded = load_cluster("dgx-a100")
    given = replace(recorded, int8_compute=312e12)
    assert cluster_difference(given, recorded) == (
        "int8_compute: 312 TOPS given, 624 TOPS in the plan"
    )
    assert cluster_difference(replace(recorded, int8_compute=None), recorded) == (
        "int8_compute: none given, 624 TOPS in the plan"
    )
    assert cluster_difference(replace(recorded, name="renamed"), recorded) is None
