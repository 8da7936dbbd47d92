"""What a pipeline solve loads: in a fresh process, a solve the DP proves imports neither
OR-Tools' CP-SAT (nor pandas, which it pulls in) nor the SPMD and joint planners, and the
process's own run (``python -m solver.cli``, which freezes the collector) writes the same plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from solver.frontends import native

REPO = Path(__file__).resolve().parents[2]
NOT_LOADED = ("pandas", "ortools.sat", "solver.joint", "solver.spmd", "rich")
IN_FRESH_PROCESS = """
import contextlib, io, json, sys
from solver.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
plan = json.loads(out.getvalue())
print(json.dumps({"code": code, "plan": plan, "modules": sorted(sys.modules)}))
"""


def training_shaped(seed: int = 0, layers: int = 5) -> dict:
    """A forward chain, the backward chain after it, and each layer's activations sent to its
    backward node without an order edge (what a training graph has): the DP over ideals
    proves its plans. Random costs."""
    rng = np.random.default_rng(seed)
    fwd = [f"f{i}" for i in range(layers)]
    bwd = [f"b{i}" for i in range(layers)]
    nodes = [
        {"name": v, "work": float(rng.uniform(1.0, 5.0)), "sizeout": int(rng.integers(1, 64) << 10)}
        for v in fwd + bwd
    ]
    edges = [[fwd[i], fwd[i + 1]] for i in range(layers - 1)] + [[fwd[-1], bwd[-1]]]
    edges += [[bwd[i + 1], bwd[i]] for i in range(layers - 1)]
    edges += [{"from": fwd[i], "to": bwd[i], "ordered": False} for i in range(layers - 1)]
    graph = {"format": native.FORMAT, "version": 1, "name": "train", "nodes": nodes}
    return graph | {"edges": edges, "cluster": {"devices": 3, "link_bandwidth": "1MB/s"}}


def fresh_solve(tmp_path: Path, *flags: str, graph: Path | None = None) -> dict:
    path = graph
    if path is None:
        path = tmp_path / "train.json"
        path.write_text(json.dumps(training_shaped()))
    argv = ["solve", str(path), *flags, "--json", "-q"]
    proc = subprocess.run(
        [sys.executable, "-c", IN_FRESH_PROCESS, *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout)


def test_a_solve_the_dp_proves_loads_no_cpsat_no_sharding_and_no_joint_planner(tmp_path):
    run = fresh_solve(tmp_path)
    assert run["code"] == 0
    plan = run["plan"]
    assert plan["status"] == "OPTIMAL" and "ideals_dp" in plan["stats"]  # proven by the DP
    loaded = [m for m in run["modules"] if any(m == n or m.startswith(n + ".") for n in NOT_LOADED)]
    assert loaded == []
    assert "solver.pipeline.registry" in run["modules"]  # the check looks at the right process


def test_a_solve_whose_warm_start_meets_the_bound_loads_no_cpsat(tmp_path):
    """The README's first command: the warm start meets the certified bound, and the chain DP
    (not CP-SAT) breaks the tie, so OR-Tools' CP-SAT and pandas are never loaded."""
    run = fresh_solve(tmp_path, graph=REPO / "examples" / "tiny_transformer.json")
    stats = run["plan"]["stats"]
    assert run["plan"]["status"] == "OPTIMAL"
    assert stats["stopped"].startswith("the warm start met the certified bound")
    assert stats["tie_break"]["summary"].endswith("exact DP)")
    loaded = [m for m in run["modules"] if any(m == n or m.startswith(n + ".") for n in NOT_LOADED)]
    assert loaded == []


def test_the_processs_own_run_writes_the_plan_it_prints(tmp_path):
    expected = fresh_solve(tmp_path)["plan"]
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [sys.executable, "-m", "solver.cli", "solve", str(tmp_path / "train.json")]
        + ["--json", "-q", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    written = json.loads(out.read_text())
    assert printed["objective"] == written["objective"] == expected["objective"]
    assert written["assignment"] == expected["assignment"]
    assert printed["plan_file"] == str(out)
