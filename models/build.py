"""Benchmark ONNX models built directly with onnx.helper: no download and no torch needed.

    python models/build.py transformer --layers 4 --hidden 256 --out models/generated/enc.onnx
    python models/build.py decoder --layers 2 --hidden 128
    python models/build.py resnet --stages 4 --width 32
    python models/build.py inception --blocks 3 --width 32
    python models/build.py unet --depth 3 --width 16
    python models/build.py vit --layers 12 --hidden 192 --heads 3 --patch 16
    python models/build.py all --out-dir models/generated     # every model, default sizes

    # BERT-large, its weights streamed to models/generated/bert.onnx.data as they are made
    python models/build.py transformer --layers 24 --hidden 1024 --heads 16 --seq 128 \
        --out models/generated/bert.onnx --external-weights

Sizes are checked before anything is allocated: a build that would not fit in the memory
available now (MemAvailable) is refused with one line and exit code 2. In memory, a build peaks
at about six times the weights (the model, then onnx.save serializing it); with
--external-weights each tensor is written to OUT.data as soon as it is drawn, so the build holds
one tensor at a time (BERT-large above: 0.12 GB of peak RSS instead of 6.7 GB). Models over
1.5 GB get their weights in OUT.data either way (one protobuf holds at most 2 GB).

Every model has random (seeded) weights, runs in onnxruntime, and reports its exact parameter
count, which the tests compare with what the importer finds. Small variants are checked in
under models/small/; larger ones are generated (models/generated/ is not committed).

The builders live in the package (:mod:`solver.frontends.onnx.modelgen`, which ``generate:`` graphs
of
experiment configs use); this script is their command line.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from solver.core.errors import MtppError
from solver.core.units import format_bytes
from solver.frontends.onnx.modelgen import (  # noqa: F401 (Builder: for the tests)
    BUILDERS,
    SMALL,
    Builder,
    ExternalWeights,
    check_params,
    estimate_size,
    save,
)


def check_disk(out: Path, weight_bytes: int) -> None:
    """Refuse weights that would not fit on the disk of ``out``'s folder."""
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if weight_bytes > free:
        raise MtppError(
            f"{out}: the weights take about {format_bytes(weight_bytes)}, more than the "
            f"{format_bytes(free)} free on that disk"
        )


def build_one(kind: str, kw: dict, out: Path, external: bool) -> None:
    """Check, build and save one model; weights streamed to OUT.data when ``external``."""
    check_params(kind, kw, external)
    check_disk(out, 4 * estimate_size(kind, kw).weight_floats)
    sink = ExternalWeights(out.with_name(out.name + ".data")) if external else None
    try:
        model, n = BUILDERS[kind](**kw, external=sink)
        save(model, out, sink)
    finally:
        if sink is not None:
            sink.discard()  # an unfinished file; nothing once save has committed it
    where = f", weights in {sink.path}" if sink is not None else ""
    print(f"{out}: {n} parameters, {len(model.graph.node)} nodes{where}")


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
        "patch",
        "seed",
    ):
        ap.add_argument(f"--{opt}", type=int)
    ap.add_argument(
        "--external-weights",
        action="store_true",
        help="stream the weights to OUT.data as they are made (small peak memory)",
    )
    args = ap.parse_args(argv)
    if args.kind == "small":  # the checked-in variants, always in one file each
        for kind, kw in SMALL.items():
            model, n = BUILDERS[kind](**kw)
            save(model, Path(__file__).parent / "small" / f"{kind}.onnx")
            print(f"{Path(__file__).parent / 'small' / f'{kind}.onnx'}: {n} parameters")
        return 0
    skip = ("kind", "out", "out_dir", "external_weights")
    kw = {k: v for k, v in vars(args).items() if v is not None and k not in skip}
    try:
        if args.kind == "all":
            for kind in BUILDERS:
                build_one(kind, {}, args.out_dir / f"{kind}.onnx", args.external_weights)
        else:
            out = args.out or args.out_dir / f"{args.kind}.onnx"
            build_one(args.kind, kw, out, args.external_weights)
    except MtppError as e:
        print(f"build.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
