"""The mtpp command: JSON output, tables, exit codes and one-line errors."""

import io
import json
from pathlib import Path

import pytest

from solver.cli import main
from solver.pipeline.plan import OPTIMAL
from tests.cli_runner import run
from tests.conftest import bench_path

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


# ------------------------------------------------------------------ tables at 80 columns
def test_block_table_cells_have_one_unit_per_column(toy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    code, out, _ = run(capsys, "solve", toy, "-q", "--out", plan)
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:2] == ["block", "nodes"])
    assert lines[head - 1].split() == ["work", "io", "in", "io", "out", "overflow", "f(S)"] + [
        "params",
        "peak",
    ]
    assert lines[head].split() == ["block", "nodes"] + ["s"] * 5 + ["B", "B"]
    # {a, b} | {c}: work 3 and 3, one byte each way over 1 B/s, w stored twice, peak 1 + 1 B
    assert lines[head + 2].split() == ["0", "*", "2", "3.000", "0", "1.000", "0", "4.000"] + [
        "10",
        "2",
    ]
    assert lines[head + 3].split() == ["1", "1", "3.000", "1.000", "0", "0", "4.000", "10", "2"]


def test_column_unit_picks_the_unit_of_the_largest_value():
    from solver.cli.common import BYTE_UNITS, TIME_UNITS, ColumnUnit

    u = ColumnUnit([2.5e-5, 1.2e-6, float("nan")], TIME_UNITS)
    cells = (u.name, u.cell(2.5e-5), u.cell(1.2e-6), u.cell(4e-9))
    assert cells == ("us", "25.00", "1.20", "<0.01")
    b = ColumnUnit([3 * 2**30, 512 * 2**20], BYTE_UNITS)
    assert (b.name, b.cell(3 * 2**30), b.cell(512 * 2**20)) == ("GiB", "3.000", "0.500")
    assert ColumnUnit([0.0, 0.0], TIME_UNITS).cell(0.0) == "0"
    assert ColumnUnit([1500.0], TIME_UNITS).cell(1500.0) == "1500"


LONG = "/model/decoder/layers.{i}/self_attention/query_key_value/MatMul_output_0_long_suffix"


@pytest.fixture
def long_names(tmp_path):
    """A graph with long node, op type and graph names, random costs, and a plan for it."""
    import numpy as np

    rng = np.random.default_rng(7)
    names = [LONG.format(i=i) for i in range(14)]
    g = {
        "format": "mtpp-graph",
        "version": 1,
        "name": "graph-" + "n" * 100,
        "cluster": {"devices": 5, "link_bandwidth": "1GB/s", "fast_memory": "4MiB"},
        "nodes": [
            {
                "name": n,
                "work": float(rng.uniform(1e-4, 1e-2)),
                "sizeout": int(rng.integers(1, 10**6)),
                "op_type": "AVeryLongCustomOperatorTypeName" * 2,
            }
            for n in names
        ],
        "edges": [[names[i], names[i + 1]] for i in range(len(names) - 1)],
        "params": [
            {"name": f"w{i}", "bytes": int(rng.integers(1, 10**7)), "users": [n]}
            for i, n in enumerate(names)
        ],
    }
    p = tmp_path / "long.json"
    p.write_text(json.dumps(g))
    return p


def fits_80(text: str) -> None:
    lines = text.splitlines()
    assert lines and max(len(x) for x in lines) <= 80, max(lines, key=len)
    assert "…" not in text  # names wrap, they are not cut


def test_tables_fit_80_columns_in_a_pipe(long_names, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    plan = tmp_path / "plan.json"
    for argv in (
        ["inspect", long_names],
        ["solve", long_names, "-q", "--out", plan],
        ["solve", long_names, "-q", "-m", "poprt"],
        ["evaluate", long_names, plan],
        ["simulate", long_names, plan],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 0 and err == "", (argv, err)
        fits_80(out)
        if argv[0] == "inspect":  # node names are shown whole, folded in their column
            lines = out.splitlines()
            head = next(i for i, x in enumerate(lines) if x.split()[:2] == ["node", "op"])
            a, b = lines[head].index("node"), lines[head].index(" op ") + 1
            column = "".join(x[a:b].strip() for x in lines[head + 2 :])
            shown = [i for i in range(14) if LONG.format(i=i) in column]
            assert len(shown) == 10, column  # the ten heaviest


def test_tables_fit_a_recorded_80_column_console(long_names, tmp_path, capsys):
    from collections import Counter

    from rich.console import Console

    from solver.backends.simulate import simulate
    from solver.cli.inspect_graph import print_inspect
    from solver.cli.simulate import print_simulation
    from solver.cli.solve import print_plan as _print_plan
    from solver.frontends import load_graph, resolve_cluster
    from solver.pipeline.options import SolveOptions
    from solver.pipeline.registry import solve

    g = load_graph(str(long_names))
    cluster = resolve_cluster(g, None, None)
    plan = solve(g, cluster, "time", SolveOptions())
    con = Console(width=80, record=True, file=io.StringIO())
    _print_plan(plan, con=con)
    code, out, _ = run(capsys, "inspect", long_names, "--json")
    print_inspect(con, g, cluster, json.loads(out), Counter(g.op_types))
    sim = simulate(g, cluster, plan.assignment, requests=10)
    args = type("A", (), {"requests": 10, "mode": "pipelined", "overlap": False, "gantt": None})
    print_simulation(con, sim, g.name, cluster, args)
    text = con.export_text()
    fits_80(text)
    assert "graph-" + "n" * 20 in text and "device" in text and "heaviest" in text


def test_cluster_line_wraps_between_items_not_inside_a_value(capsys):
    """At 80 columns rich used to split "link 16 GB/s" into "16" and "GB/s" on two lines."""
    assert main(["solve", "examples/tiny_transformer.json", "-q", "-m", "time"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("cluster "))
    text = lines[start] + " " + lines[start + 1].strip()
    assert lines[start].endswith(",") and lines[start + 1].startswith("  ")
    assert "link 16 GB/s" in text and "compute 1 TFLOPS" in text
    assert all(len(x) <= 80 for x in lines)


def test_solve_names_the_binding_bound_and_the_tie_break(capsys):
    """The printed plan says which bound proves it and what the tie-break stage changed."""
    example = Path(__file__).resolve().parents[2] / "examples" / "tiny_transformer.json"
    assert main(["solve", str(example), "-q"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "binding lower bound: chain io" in out
    assert "tie-break at the same bottleneck: transferred 10 MiB -> 8 MiB" in out
    assert main(["solve", str(example), "-q", "--set", "tie_break=false"]) == 0
    assert "tie-break skipped (tie_break=false)" in capsys.readouterr().out
