"""Certificates on graphs that are not chains: encoder-decoders, diffusion U-Nets, an
Inception-style network and a transformer with parallel experts.

    python benchmarks/bench_nonchain.py [--models t5-small,unet] [--k 8,16] [--time-limit 60]
        [--cluster ipu-pod|dgx-a100] [--torch-python /tmp/nc-venv/bin/python]
        [--out-dir /tmp/nonchain]

Builds each model with ``models/export_hf.py`` (random weights, legacy torch exporter unless
the model needs the dynamo one; built once into ``--out-dir``, never committed) with the
``--torch-python`` interpreter (default: this one), which needs torch, transformers,
onnxscript and diffusers; a model it cannot build is skipped with the builder's message.
Then runs ``mtpp solve MODEL -k K --cluster C --time-limit T --json`` for every k, one at a
time (the ONNX model timed by the roofline of that cluster, as the command line does), and
prints one Markdown row per case: the cluster, status, objective, bound, the binding bound,
gap, wall seconds, the 1-minute load average before each case (the machine may be shared:
say how loaded), the solve's peak resident memory (MB), and, when the gap is open, the
structure the bounds could not price (the entries of ``stats.bound.certified.unpriced``,
heaviest first, "; "-separated).
``--spine-seconds S`` adds a column: the spine bound (docs/bounds.md) computed alone in this
process with S seconds and the plan's cost as its target, from no other bound: what the
relaxation proves when the solve's share of the bound time is too short on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from solver.core.cluster import load_cluster
from solver.frontends import load_graph, resolve_cluster
from solver.pipeline.bounds.spine import spine_bound

ROOT = Path(__file__).resolve().parents[1]

# name -> export_hf arguments (shapes from the models' configs, reduced where noted)
MODELS = {
    "t5-small": ["t5", "--layers", "6", "--hidden", "512", "--heads", "8", "--seq", "64"],
    "t5-base": ["t5", "--layers", "12", "--hidden", "768", "--heads", "12", "--seq", "64"],
    "bart-base": ["bart", "--layers", "6", "--hidden", "768", "--heads", "12", "--seq", "64"],
    # Whisper-small's layers and width, 128 audio positions (1500 in the real model); its
    # convolution front needs the dynamo exporter (aten::diff has no opset-17 export)
    "whisper-small": [
        "whisper",
        "--exporter",
        "dynamo",
        "--layers",
        "12",
        "--hidden",
        "768",
        "--heads",
        "12",
        "--image",
        "128",
        "--seq",
        "64",
    ],
    # diffusers UNet2DConditionModel (export_hf's two-level block layout), width 64
    "unet": ["unet", "--layers", "2", "--hidden", "64", "--heads", "8", "--image", "16"]
    + ["--seq", "16"],
    # Stable Diffusion 1.5's block layout (4 levels, 2 layers per block), width 64 (320 in
    # the real model), latent 32 x 32, 77 text tokens
    "unet-sd": ["unet-sd", "--layers", "2", "--hidden", "64", "--heads", "8", "--image", "32"]
    + ["--seq", "77"],
    # Inception-v3-like: three stages of 3 mixed blocks (four parallel branches each, 1x7 / 7x1
    # and 1x3 / 3x1 factorised ones), two grid reductions, Inception-v3's widths (192 after the
    # stem, 768 and 2304 in the later stages), 70 x 70 pixels (35 x 35 in the first stage)
    "inception": ["inception", "--layers", "3", "--hidden", "192", "--image", "70"],
    # a 6-layer transformer (d 512, 8 heads, 64 tokens) whose feed-forward is 8 parallel
    # experts (width 1024) behind a top-2 softmax router
    "moe-parallel": ["moe-parallel", "--layers", "6", "--hidden", "512", "--heads", "8"]
    + ["--experts", "8", "--top-k", "2", "--seq", "64"],
}
CLUSTERS = ("ipu-pod", "dgx-a100")


def build(name: str, out_dir: Path, python: str) -> Path | str:
    """The model's ONNX file (built once), or the reason it could not be built."""
    path = out_dir / f"{name}.onnx"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [python, str(ROOT / "models" / "export_hf.py"), *MODELS[name], "--out", str(path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not path.exists():
        lines = (r.stderr or r.stdout).strip().splitlines() or ["no output"]
        return f"not built ({lines[-1]})"
    return path


def solve(path: Path, k: int, time_limit: float, cluster: str) -> dict:
    """``mtpp solve`` on one case: its JSON, with the wall seconds and the load before it."""
    load = os.getloadavg()[0]
    cmd = [sys.executable, "-m", "solver.cli", "solve", str(path), "-k", str(k)]
    cmd += ["--cluster", cluster, "--time-limit", str(time_limit), "--json", "--quiet"]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=path.parent)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        stdout.seek(0)
        stderr.seek(0)
        text, errors = stdout.read().decode(), stderr.read().decode()
    if proc.returncode != 0:
        return {"error": (errors.strip().splitlines() or ["?"])[-1], "load": load}
    out = json.loads(text)
    # ru_maxrss is in KiB on Linux: the peak resident memory of this one solve
    out.update(wall=wall, load=load, peak_mb=usage.ru_maxrss / 1024)
    return out


def spine_alone(path: Path, k: int, target: float, seconds: float, cluster: str) -> str:
    """The spine bound of the case alone (its better kind), with its seconds, on the graph
    the command line solves (timed by the cluster's roofline)."""
    t0 = time.perf_counter()
    known = load_cluster(cluster, k)
    g = load_graph(path, cluster=known, devices=k)
    res = spine_bound(g, resolve_cluster(g, cluster, k), k, seconds, target)
    value = max(res.chain_io, res.work_io_chain)
    return f"{value * 1e6:.4g} us ({time.perf_counter() - t0:.1f} s)"


def row(name: str, cluster: str, k: int, r: dict, spine: str | None = None) -> str:
    if "error" in r:
        blank = "| " * 5
        return f"| {name} | {cluster} | {k} | error: {r['error']} {blank}| {r['load']:.1f} | | |"
    bound = (r.get("stats") or {}).get("bound") or {}
    binding = bound.get("binding") if isinstance(bound, dict) else None
    gap = r.get("gap")
    cells = [
        name,
        cluster,
        str(k),
        r.get("status"),
        f"{r['objective'] * 1e6:.4g} us",
        f"{(r.get('lower_bound') or 0.0) * 1e6:.4g} us",
        binding or "-",
        "-" if gap is None else f"{100 * gap:.1f}%",
        f"{r['wall']:.1f}",
        f"{r['load']:.1f}",
        f"{r['peak_mb']:.0f}",
    ]
    certified = bound.get("certified") if isinstance(bound, dict) else None
    unpriced = (certified or {}).get("unpriced") or []
    cells.append("; ".join(unpriced) if unpriced and r.get("status") != "OPTIMAL" else "-")
    if spine is not None:
        cells.append(spine)
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="t5-small,unet", help=f"comma-separated: {list(MODELS)}")
    ap.add_argument("--k", default="8,16", help="comma-separated device counts")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--cluster", default="ipu-pod", help=f"cluster preset: {', '.join(CLUSTERS)}")
    ap.add_argument("--torch-python", default=sys.executable, help="builds the models")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/nonchain"))
    ap.add_argument("--spine-seconds", type=float, default=0.0, help="see above (0: no column)")
    args = ap.parse_args()
    names = args.models.split(",")
    unknown = [x for x in names if x not in MODELS]
    if unknown:
        print(f"unknown model {unknown[0]!r}: choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    if args.cluster not in CLUSTERS:
        print(
            f"unknown cluster {args.cluster!r}: choose from {', '.join(CLUSTERS)}", file=sys.stderr
        )
        return 2
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    cols = [
        "model",
        "cluster",
        "k",
        "status",
        "objective",
        "bound",
        "binding",
        "gap",
        "wall s",
        "load",
        "peak MB",
    ]
    cols += ["not priced (heaviest first)"]
    cols += ["spine alone"] if args.spine_seconds > 0 else []
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for name in names:
        path = build(name, args.out_dir, args.torch_python)
        if isinstance(path, str):
            print(f"| {name} | | skipped: {path} |", flush=True)
            continue
        for k in (int(x) for x in args.k.split(",")):
            r = solve(path, k, args.time_limit, args.cluster)
            spine = None
            if args.spine_seconds > 0 and "error" not in r:
                spine = spine_alone(path, k, r["objective"], args.spine_seconds, args.cluster)
            print(row(name, args.cluster, k, r, spine), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
