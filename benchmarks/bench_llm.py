"""Certified lower bounds on Llama-shaped decoders (issue 11): new bounds vs the universal one.

    python benchmarks/bench_llm.py [--time-limit 20] [--bound-time 10] [--cases 7b:ipu-pod:16,...]

Builds the Llama-2 7B / 70B shapes with sparse external weights (models/llama.py, never
written: seconds and no disk), imports them, and for each (model, cluster, k) prints the
universal bound (solver.core.cost.lower_bound), the certified bound (solver.pipeline.bounds) with
the bound
that binds, SliceGraph's objective within --time-limit, and both gaps, as a markdown table.
Gap = (objective - bound) / objective. Runs one case at a time (the machine is shared).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))

import llama  # noqa: E402

from solver.core.cost import lower_bound  # noqa: E402
from solver.frontends import load_graph, resolve_cluster  # noqa: E402
from solver.pipeline.bounds import certified_lower_bound  # noqa: E402
from solver.pipeline.options import SolveOptions  # noqa: E402
from solver.pipeline.registry import solve  # noqa: E402

CASES = "7b:ipu-pod:4,7b:ipu-pod:16,7b:ipu-pod:64,70b:ipu-pod:16,70b:ipu-pod:64,70b:dgx-a100:8"


def model_path(preset: str, out_dir: Path) -> Path:
    """The generated model of a preset (built once; the weight file is a sparse hole)."""
    path = out_dir / f"llama{preset}.onnx"
    if not path.exists():
        llama.write(llama.LlamaShape(**llama.PRESETS[preset]), path)
    return path


def run_case(preset: str, cluster_name: str, k: int, args) -> dict:
    path = model_path(preset, args.out_dir)
    g = load_graph(path, cluster=cluster_name, devices=k)
    c = resolve_cluster(g, cluster_name, k)
    universal = lower_bound(g, c)
    rep = certified_lower_bound(g, c, time_limit=args.bound_time)
    t0 = time.perf_counter()
    plan = solve(g, c, "slicegraph", SolveOptions(time_limit=args.time_limit, workers=1))
    wall = time.perf_counter() - t0
    obj = plan.objective if plan is not None else float("nan")
    return {
        "case": f"{preset} {cluster_name} k={k}",
        "nodes": g.n,
        "objective": obj,
        "universal": universal,
        "certified": rep.value,
        "binding": rep.binding,
        "bound_s": rep.seconds,
        "solve_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--time-limit", type=float, default=20.0, help="SliceGraph seconds")
    ap.add_argument("--bound-time", type=float, default=10.0, help="certified bound seconds")
    ap.add_argument("--cases", default=CASES, help="preset:cluster:k,... (default: issue 11's)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "models" / "generated")
    args = ap.parse_args(argv)
    print(
        "| case | nodes | SliceGraph objective | universal bound | gap | certified bound "
        "| binding | gap | bound s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        preset, cluster_name, k = case.split(":")
        r = run_case(preset, cluster_name, int(k), args)
        obj = r["objective"]
        print(
            f"| {r['case']} | {r['nodes']} | {obj * 1e3:.6g} ms | {r['universal'] * 1e3:.6g} ms "
            f"| {(obj - r['universal']) / obj:.2%} | {r['certified'] * 1e3:.6g} ms "
            f"| {r['binding']} | {(obj - r['certified']) / obj:.2%} | {r['bound_s']:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
