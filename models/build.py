"""Benchmark ONNX models built directly with onnx.helper: no download and no torch needed.

    python models/build.py transformer --layers 4 --hidden 256 --out models/generated/enc.onnx
    python models/build.py decoder --layers 2 --hidden 128
    python models/build.py resnet --stages 4 --width 32
    python models/build.py inception --blocks 3 --width 32
    python models/build.py unet --depth 3 --width 16
    python models/build.py all --out-dir models/generated     # every model, default sizes

Every model has random (seeded) weights, runs in onnxruntime, and reports its exact parameter
count, which the tests compare with what the importer finds. Small variants are checked in
under models/small/; larger ones are generated (models/generated/ is not committed).

The builders live in the package (:mod:`solver.modelgen`, which ``generate:`` graphs of
experiment configs use); this script is their command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from solver.errors import MtppError
from solver.modelgen import BUILDERS, SMALL, Builder, check_params, save  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("kind", choices=[*BUILDERS, "all", "small"])
    ap.add_argument("--out", type=Path, help="output .onnx (default models/generated/KIND.onnx)")
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "generated")
    for opt in (
        "layers",
        "hidden",
        "heads",
        "ffn",
        "seq",
        "vocab",
        "batch",
        "stages",
        "blocks",
        "width",
        "image",
        "classes",
        "depth",
        "seed",
    ):
        ap.add_argument(f"--{opt}", type=int)
    args = ap.parse_args(argv)
    if args.kind in ("all", "small"):
        out_dir = Path(__file__).parent / "small" if args.kind == "small" else args.out_dir
        for kind, kw in SMALL.items() if args.kind == "small" else ((k, {}) for k in BUILDERS):
            model, n = BUILDERS[kind](**kw)
            save(model, out_dir / f"{kind}.onnx")
            print(f"{out_dir / f'{kind}.onnx'}: {n} parameters")
        return 0
    kw = {
        k: v for k, v in vars(args).items() if v is not None and k not in ("kind", "out", "out_dir")
    }
    try:
        check_params(args.kind, kw)
    except MtppError as e:
        ap.error(str(e))
    model, n = BUILDERS[args.kind](**kw)
    out = args.out or args.out_dir / f"{args.kind}.onnx"
    save(model, out)
    print(f"{out}: {n} parameters, {len(model.graph.node)} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
