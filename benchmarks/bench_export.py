"""Export of Llama-shaped models larger than memory (issue 11, item 5): peak memory, time, disk.

    python benchmarks/bench_export.py [--cases 7b:4,70b:16] [--out-dir /tmp/mtpp-bench-export]

For each preset:k, builds the model with sparse external weights (models/llama.py: full size,
no block written), makes a plan (``mtpp solve -m time``), then runs ``mtpp export`` in a child
process and reports its wall time and peak resident memory (``ru_maxrss`` of that child alone,
read through ``RUSAGE_CHILDREN`` in a wrapper process), the apparent size and the disk blocks of
the output folder, and whether every stage model and the annotated model pass
``onnx.checker.check_model`` by path. A markdown table goes to stdout. One case at a time (the
machine is shared); the generated models are kept in --out-dir for the next run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))

import llama  # noqa: E402

WRAP = (
    "import json, resource, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "wall = time.perf_counter() - t0\n"
    "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
    "print(json.dumps({'code': p.returncode, 'wall': wall, 'maxrss': rss, 'err': p.stderr}))\n"
)


def measured(argv: list[str]) -> dict:
    """Exit code, wall seconds and peak RSS (bytes) of one command, alone in its wrapper."""
    out = subprocess.run([sys.executable, "-c", WRAP, *argv], capture_output=True, text=True)
    return json.loads(out.stdout)


def run_case(preset: str, k: int, out_dir: Path) -> dict:
    import onnx

    model = out_dir / f"llama{preset}.onnx"
    if not model.exists():
        llama.write(llama.LlamaShape(**llama.PRESETS[preset]), model)
    plan = out_dir / f"llama{preset}-k{k}.json"
    mtpp = [sys.executable, "-m", "solver.cli"]
    if not plan.exists():
        argv = [*mtpp, "solve", str(model), "-m", "time", "-k", str(k), "--out", str(plan), "-q"]
        subprocess.run(argv, check=True, capture_output=True)
    folder = out_dir / f"llama{preset}-k{k}-sharded"
    shutil.rmtree(folder, ignore_errors=True)
    res = measured([*mtpp, "export", str(model), str(plan), "-k", str(k), "--out", str(folder)])
    if res["code"] != 0:
        raise SystemExit(f"export of {preset} at k={k} failed: {res['err'].strip()}")
    valid = True
    for p in sorted(folder.glob("*.onnx")):
        try:
            onnx.checker.check_model(str(p))
        except onnx.checker.ValidationError:
            valid = False
    data = model.with_name(model.name + ".data")
    files = list(folder.iterdir())
    return {
        "model": f"llama-{preset}",
        "k": k,
        "weights_gb": data.stat().st_size / 1e9,
        "wall_s": res["wall"],
        "peak_mb": res["maxrss"] / 1e6,
        "out_apparent_gb": sum(p.stat().st_size for p in files) / 1e9,
        "out_disk_mb": sum(p.stat().st_blocks * 512 for p in files) / 1e6,
        "stage_files": len(list(folder.glob("stage*.onnx"))),
        "checker_ok": valid,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="7b:4", help="preset:k,... (default 7b:4)")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/mtpp-bench-export"))
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    cols = ["model", "k", "weights_gb", "wall_s", "peak_mb", "out_apparent_gb", "out_disk_mb"]
    cols += ["stage_files", "checker_ok"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for case in args.cases.split(","):
        preset, k = case.split(":")
        t0 = time.perf_counter()
        row = run_case(preset, int(k), args.out_dir)
        cells = [f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        print("| " + " | ".join(cells) + " |", flush=True)
        print(f"  ({time.perf_counter() - t0:.1f} s with model build and plan)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
