"""ONNX front end on real models (issue 3's acceptance numbers).

    python benchmarks/bench_onnx.py            # model zoo from the onnx wheel + BERT/GPT-2 exports

The BERT-base / GPT-2 rows need torch and transformers (see models/export_hf.py); without them
those rows are skipped. Exports are written to models/generated/ (not committed).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import onnx

from solver.frontends import load_graph

ROOT = Path(__file__).resolve().parents[1]
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def bert_analytic_flops(layers: int, hidden: int, seq: int) -> float:
    """Matrix-multiply FLOPs of BERT: QKV, scores, context, output, FFN (x2), plus the pooler."""
    return layers * (24 * seq * hidden**2 + 4 * seq**2 * hidden) + 2 * hidden**2


def gpt2_analytic_flops(layers: int, hidden: int, seq: int, vocab: int) -> float:
    return layers * (24 * seq * hidden**2 + 4 * seq**2 * hidden) + 2 * seq * hidden * vocab


def timed_load(path: Path):
    t = time.perf_counter()
    g = load_graph(path)
    return g, time.perf_counter() - t


def main() -> int:
    load_graph(LIGHT / "light_squeezenet.onnx")  # warm-up: library imports are not import time
    print("| model | nodes (cost graph) | parameters | GFLOPs | reference | import s |")
    print("|---|---|---|---|---|---|")
    for path in sorted(LIGHT.glob("*.onnx")):
        g, dt = timed_load(path)
        print(
            f"| {path.stem} | {g.n} | {int(g.param_bytes_total // 4):,} | "
            f"{g.flops.sum() / 1e9:.3f} | - | {dt:.2f} |"
        )
    gen = ROOT / "models" / "generated"
    for kind, exporter in (
        ("bert", "legacy"),
        ("bert", "dynamo"),
        ("gpt2", "legacy"),
        ("gpt2", "dynamo"),
    ):
        out = gen / f"{kind}-{exporter}.onnx"
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "models" / "export_hf.py"),
                kind,
                "--exporter",
                exporter,
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            print(f"| {kind}-{exporter} | skipped: {proc.stderr.strip().splitlines()[-1]} |")
            continue
        torch_params = int(proc.stdout.strip().split(": ")[-1].split()[0])
        g, dt = timed_load(out)
        ref = (
            bert_analytic_flops(12, 768, 128)
            if kind == "bert"
            else gpt2_analytic_flops(12, 768, 128, 50257)
        )
        print(
            f"| {kind}-base ({exporter} exporter), seq 128 | {g.n} | "
            f"{int(g.param_bytes_total // 4):,} (torch: {torch_params:,}) | "
            f"{g.flops.sum() / 1e9:.3f} | analytic {ref / 1e9:.3f} "
            f"({100 * (g.flops.sum() / ref - 1):+.2f}%) | {dt:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
