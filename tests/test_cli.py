"""The mtpp command: JSON output, tables, exit codes and one-line errors."""

import json

import pytest

from solver.cli import main
from solver.plan import OPTIMAL

from .conftest import bench_path

GRAPH = {
    "format": "mtpp-graph",
    "version": 1,
    "name": "toy",
    "cluster": {"devices": 2, "link_bandwidth": "1B/s"},
    "nodes": [
        {"name": "a", "work": 1.0, "sizeout": 1},
        {"name": "b", "work": 2.0, "sizeout": 1},
        {"name": "c", "work": 3.0, "sizeout": 1},
    ],
    "edges": [["a", "b"], ["b", "c"]],
    "params": [{"name": "w", "bytes": 10, "users": ["a", "c"]}],
}


@pytest.fixture
def toy(tmp_path):
    p = tmp_path / "toy.json"
    p.write_text(json.dumps(GRAPH))
    return p


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_json(toy, capsys):
    code, out, err = run(capsys, "inspect", toy, "--json")
    assert code == 0
    d = json.loads(out)
    assert d["nodes"] == 3 and d["edges"] == 2 and d["param_bytes"] == 10
    assert d["work"] == 6.0 and d["cluster"]["devices"] == 2


def test_inspect_table_names_cluster(toy, capsys):
    code, out, _ = run(capsys, "inspect", toy)
    assert code == 0 and "toy" in out and "cluster" in out


def test_solve_then_evaluate_round_trip(toy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    code, out, _ = run(capsys, "solve", toy, "--method", "cpsat", "--out", plan, "--json")
    assert code == 0
    d = json.loads(out)
    # best: {a, b} | {c}: max(3 + 1, 1 + 3) = 4
    assert d["status"] == OPTIMAL and d["objective"] == pytest.approx(4.0)
    code, out, _ = run(capsys, "evaluate", toy, plan, "--json")
    e = json.loads(out)
    assert code == 0 and e["valid"] and e["objective"] == pytest.approx(4.0)
    assert [b["f"] for b in e["blocks"]] == pytest.approx([4.0, 4.0])


def test_brute_and_heuristics_from_cli(toy, capsys):
    for method in ("brute", "slicegraph", "time", "params", "uniform"):
        code, out, _ = run(capsys, "solve", toy, "-m", method, "--json")
        assert code == 0, method
        assert json.loads(out)["objective"] >= 4.0 - 1e-9


def test_dnn_partitioning_file_solves(capsys):
    path = bench_path("LayerGraphs/bert24_inference")
    code, out, _ = run(capsys, "solve", path, "--json", "--time-limit", "30")
    d = json.loads(out)
    assert code == 0 and d["status"] == OPTIMAL
    assert d["objective"] == pytest.approx(17.78990625, rel=1e-6)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["inspect", "missing.json"], "no such file"),
        (["solve", "{toy}", "--time-limit", "-1"], "--time-limit must be a finite number > 0"),
        (["solve", "{toy}", "--cluster", "nonexistent"], "no such file or preset"),
        (["solve", "{toy}", "--devices", "0"], "--devices must be >= 1"),
        (["inspect", "{toy}", "--dim", "batch"], "write NAME=VALUE"),
        (["evaluate", "{toy}", "{bad}"], "not valid JSON"),
        (["evaluate", "{toy}", "{other}"], "names 1 node"),
    ],
)
def test_errors_exit_2_with_one_line(argv, match, toy, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(
            {"format": "mtpp-plan", "version": 1, "assignment": {"a": 0, "b": 0, "c": 0, "zz": 1}}
        )
    )
    argv = [a.format(toy=toy, bad=bad, other=other) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert match in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_plan_for_other_graph_is_refused(toy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    run(capsys, "solve", toy, "-m", "time", "--out", plan)
    g2 = dict(GRAPH, edges=[["a", "c"], ["b", "c"]])
    other = tmp_path / "toy2.json"
    other.write_text(json.dumps(g2))
    code, _, err = run(capsys, "evaluate", other, plan)
    assert code == 2 and "made for a graph with other edges" in err


def test_invalid_plan_reported(toy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    run(capsys, "solve", toy, "-m", "time", "--out", plan)
    d = json.loads(plan.read_text())
    d["assignment"] = {"a": 1, "b": 0, "c": 1}
    plan.write_text(json.dumps(d))
    code, out, _ = run(capsys, "evaluate", toy, plan, "--json")
    e = json.loads(out)
    assert code == 1 and not e["valid"] and e["violations"][0]["kind"] == "order"


def test_help_has_examples(capsys):
    try:
        code = main(["solve", "--help"])
    except SystemExit as ex:  # argparse exits; the top-level guard may return the code
        code = ex.code
    out = capsys.readouterr().out
    assert code == 0 and "examples:" in out and "--time-limit" in out


def test_infeasible_capacity_message(tmp_path, capsys):
    g = dict(
        GRAPH,
        cluster={"devices": 2, "capacity": "15B"},
        params=[{"name": f"w{i}", "bytes": 10, "users": [n]} for i, n in enumerate("abc")],
    )
    p = tmp_path / "tight.json"
    p.write_text(json.dumps(g))
    code, out, err = run(capsys, "solve", p)
    assert code == 2 and "proven: no valid plan" in err and "--devices" in err
    code, out, err = run(capsys, "solve", p, "--devices", "3", "--json")
    assert code == 0 and json.loads(out)["status"] == OPTIMAL


def test_poprt_prints_sharding_nodes(toy, capsys):
    code, out, _ = run(capsys, "solve", toy, "-m", "poprt", "--optimal-perf")
    assert code == 0 and "Sharding nodes:" in out


def test_manual_yaml_solve_and_evaluate(toy, tmp_path, capsys):
    shard = tmp_path / "shard.yaml"
    shard.write_text("- {node: b, device: 0, stage: 0}\n")
    code, out, _ = run(capsys, "evaluate", toy, shard, "--json")
    e = json.loads(out)
    assert code == 0 and e["valid"] and e["objective"] == pytest.approx(4.0)  # {a, b} | {c}
    code, out, _ = run(capsys, "solve", toy, "-m", "manual", "--sharding", shard, "--json")
    assert code == 0 and json.loads(out)["objective"] == pytest.approx(4.0)
    code, _, err = run(capsys, "solve", toy, "-m", "manual")
    assert code == 2 and "needs --sharding" in err
    code, _, err = run(capsys, "solve", toy, "-m", "slicegraph", "--set", "population")
    assert code == 2 and "KEY=VALUE" in err


def test_simulate_cli(toy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    run(capsys, "solve", toy, "--out", plan, "-q")
    png = tmp_path / "g.png"
    code, out, _ = run(capsys, "simulate", toy, plan, "--json", "--gantt", png, "--requests", "50")
    d = json.loads(out)
    assert code == 0 and d["valid"] and d["period"] == pytest.approx(4.0)
    assert png.stat().st_size > 1000
    code, out, _ = run(capsys, "simulate", toy, plan, "--json", "--mode", "sequential")
    assert json.loads(out)["period"] == pytest.approx(8.0)  # one device busy at a time: 4 + 4
    code, _, err = run(capsys, "simulate", toy, plan, "--requests", "0")
    assert code == 2 and "--requests must be >= 1" in err
