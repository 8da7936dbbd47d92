"""The exact solver (CP-SAT) on Llama-shaped decoders (issue 11 item 2): size, memory, branches.

    python benchmarks/bench_llm_exact.py [--time-limit 60] [--cases 7b:16,7b:64,70b:64]
        [--cluster ipu-pod] [--workers 2] [--params cpsat|model]

Builds the Llama-2 7B / 70B shapes with sparse external weights (models/llama.py: the weight
file is a hole, never written nor read) and runs one case per child process, so that the peak
resident memory (``ru_maxrss``) is that case's alone. Prints one Markdown row per case: model
size (CP-SAT variables and constraints; none when the exact DP over the separator chain proved
the optimum and no CP-SAT model was built), build seconds, branches, status, objective, bound,
the binding bound ("ideals" when the DP's proof is the method's), gap, the tie-break's effect on
the transferred bytes, wall seconds and peak memory.
``--params model`` only builds the model (no search): its size and memory.
Runs one case at a time (the machine is shared); say how loaded it was (``uptime``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = "7b:16,7b:64,70b:64"


def model_path(preset: str, out_dir: Path) -> Path:
    """The generated model of a preset (built once; its weight file is a sparse hole)."""
    path = out_dir / f"llama{preset}.onnx"
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(ROOT / "models" / "llama.py"), "--preset", preset, "--out", path],
            check=True,
        )
    return path


CHILD = r"""
import json, resource, sys, time
from solver.frontends import load_graph, resolve_cluster
from solver.pipeline.options import SolveOptions
from solver.pipeline.registry import solve

path, cluster, k, limit, workers, mode = sys.argv[1:7]
k, limit, workers = int(k), float(limit), int(workers)
g = load_graph(path, cluster=cluster, devices=k)
c = resolve_cluster(g, cluster, k)
out = {"nodes": g.n}
if mode == "model":
    from solver.pipeline.exact.cpsat import _Model
    from solver.core.graph import coarse_view
    from solver.pipeline.runners import quick_assignment
    cg, labels = coarse_view(g)
    _, hint = quick_assignment(g, c)
    ch = hint[__import__("numpy").unique(labels, return_index=True)[1]]
    t0 = time.perf_counter()
    m = _Model(cg, c, ch)
    proto = m.m.Proto()  # (m.size() where it exists; earlier versions lack it)
    out.update(model_variables=len(proto.variables), model_constraints=len(proto.constraints),
               build_seconds=round(time.perf_counter() - t0, 2))
else:
    t0 = time.perf_counter()
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=limit, workers=workers))
    out["wall"] = round(time.perf_counter() - t0, 1)
    st = plan.stats
    out.update(status=plan.status, objective=plan.objective, bound=plan.lower_bound,
               gap=plan.gap, **{key: st.get(key) for key in (
                   "build_seconds", "branches", "model_variables", "model_constraints",
                   "cpsat_status", "warm_start_seconds", "tie_break")})
    # a proof the exact method took from the ideals DP is named as such (stats["proof"])
    out["binding"] = st.get("bound_source") or (st.get("bound") or {}).get("binding")
    out["dp_seconds"] = (st.get("chain_dp") or {}).get("seconds")
out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps(out))
"""


def run_case(path: Path, cluster: str, k: int, args) -> dict:
    """One case in a fresh process: its JSON summary, or the error it printed."""
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT)))
    cmd = [sys.executable, "-c", CHILD, str(path), cluster, str(k)]
    cmd += [str(args.time_limit), str(args.workers), args.params]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=path.parent)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--cases", default=CASES, help="comma-separated PRESET:K")
    ap.add_argument("--cluster", default="ipu-pod")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--params", choices=["cpsat", "model"], default="cpsat")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/llm"))
    args = ap.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    cols = ["case", "nodes", "variables", "constraints", "build s", "branches", "status"]
    cols += ["objective", "bound", "binding bound", "gap", "tie-break", "wall s", "peak MB"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for case in args.cases.split(","):
        preset, k = case.split(":")
        r = run_case(model_path(preset, args.out_dir), args.cluster, int(k), args)
        if "error" in r:
            print(f"| {preset} k={k} | error: {r['error']} |", flush=True)
            continue
        gap = r.get("gap")
        tb = r.get("tie_break") or {}
        row = [
            f"{preset} k={k}",
            r.get("nodes"),
            r.get("model_variables"),
            r.get("model_constraints"),
            r.get("build_seconds"),
            r.get("branches"),
            r.get("status"),
            r.get("objective"),
            r.get("bound"),
            r.get("binding"),
            None if gap is None else f"{100 * gap:.3g}%",
            tb.get("summary") if isinstance(tb, dict) else tb,
            r.get("wall"),
            r.get("peak_mb"),
        ]
        print("| " + " | ".join(fmt(x) for x in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
