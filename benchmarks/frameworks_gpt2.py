"""Check layer-granular plans on a real torch export: a Hugging Face GPT-2 (random weights,
GPT-2-small shape by default) exported by both torch exporters, planned with k stages, written
in every framework format; the torch ``split_spec`` is applied to the same module with
``torch.distributed.pipelining.pipeline`` and must give one stage per non-empty block and the
model's output.

Needs torch, transformers and onnxscript (not in the project's environment)::

    python3 -m venv /tmp/fw-venv && . /tmp/fw-venv/bin/activate
    pip install torch==2.13.0 transformers onnxscript && pip install -e .
    python benchmarks/frameworks_gpt2.py --out /tmp/fw-gpt2 [--layers 12 --hidden 768 -k 4]

Files go under ``--out`` (never committed). Exit code 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.pipelining import SplitPoint, pipeline
from transformers import GPT2Config, GPT2LMHeadModel

from solver.backends.frameworks import FORMATS, module_stages, write_framework
from solver.core.cluster import load_cluster
from solver.core.errors import MtppError
from solver.frontends.onnx.load import read_model
from solver.frontends.onnx.modules import cost_node_modules, module_layout
from solver.frontends.onnx.reader import load_onnx
from solver.pipeline.granularity import GRANULARITY_KEY, solve_layer_granular
from solver.pipeline.options import SolveOptions


@dataclass(frozen=True)
class ExportCase:
    """One exported ONNX file and the arguments it was traced with."""

    exporter: str
    path: Path


def build_model(layers: int, hidden: int, heads: int, seq: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=layers, n_embd=hidden, n_head=heads, n_positions=max(seq, 64), use_cache=False
    )
    return GPT2LMHeadModel(cfg).eval()


def copy_model(model: GPT2LMHeadModel) -> GPT2LMHeadModel:
    fresh = GPT2LMHeadModel(model.config).eval()
    fresh.load_state_dict(model.state_dict())
    return fresh


def export_both(model, ids, mask, out: Path) -> list[ExportCase]:
    """The dynamo exporter (name scopes in metadata) and the legacy one (scoped node names;
    it needs the attention mask passed: transformers' mask builder uses aten::diff)."""
    cases = []
    for exporter, dynamo in (("dynamo", True), ("legacy", False)):
        path = out / f"gpt2-{exporter}.onnx"
        args = (ids,) if dynamo else (ids, None, mask)
        t0 = time.perf_counter()
        torch.onnx.export(model, args, str(path), dynamo=dynamo, input_names=["input_ids"])
        print(f"{exporter}: exported in {time.perf_counter() - t0:.1f} s -> {path}")
        cases.append(ExportCase(exporter, path))
    return cases


def check_paths(model, paths, layout) -> list[str]:
    """Every module path read from the ONNX file and every unit is a named_modules() name."""
    names = {n for n, _ in model.named_modules()}
    bad = sorted({p for p in paths if p is not None and p not in names})
    bad += [u for u in layout.units if u not in names]
    return bad


def check_split(model, ids, split_spec: dict[str, str], stages: int) -> str | None:
    """pipeline() with the written split_spec on the same module (a fresh copy with the same
    weights: the ONNX exporters leave the traced one unfit for torch.export): stage count and
    output."""
    model = copy_model(model)
    spec = {path: SplitPoint[point] for path, point in split_spec.items()}
    pipe = pipeline(model, mb_args=(ids,), split_spec=spec)
    if pipe.num_stages != stages:
        return f"pipeline() made {pipe.num_stages} stages, the plan has {stages}"
    with torch.no_grad():
        ref = model(ids).logits
        out = pipe(ids)[0]
    err = float((ref - out).abs().max())
    print(f"  pipeline(): {pipe.num_stages} stages, max |output - unsplit| = {err:.2e}")
    return None if err <= 1e-4 else f"output differs by {err}"


def write_all(stages, out: Path, exporter: str) -> list[str]:
    """Every format; a refusal is printed (Megatron refuses a head split over two stages)."""
    errors = []
    for fmt in FORMATS:
        try:
            write_framework(fmt, stages, out / f"{exporter}-{fmt}", exporter, force=True)
        except MtppError as e:
            print(f"  {fmt}: refused: {e}")
            errors.append(f"{fmt} refused")
    megatron = out / f"{exporter}-megatron" / "megatron_layout.txt"
    if megatron.exists():
        layout_line = megatron.read_text().splitlines()[-1]
        print(f"  megatron {layout_line}")
        if layout_line.count("|") + 1 != len(stages.stages):
            errors.append("megatron layout names another number of stages")
    return errors


def check_case(case: ExportCase, model, ids, k: int, seconds: float, out: Path) -> list[str]:
    g = load_onnx(case.path)
    paths = cost_node_modules(read_model(case.path), g)
    layout = module_layout(paths, str(case.path))
    print(f"{case.exporter}: {g.n} nodes, {len(layout.units)} units, blocks {layout.container}.*")
    errors = [f"not a module: {p}" for p in check_paths(model, paths, layout)]
    plan = solve_layer_granular(
        g, layout, load_cluster(None, k), "cpsat", SolveOptions(time_limit=seconds)
    )
    cost = plan.stats[GRANULARITY_KEY]["restriction_cost"]
    print(f"  plan {plan.status} {plan.objective:.4g} s; restriction costs {cost}")
    stages = module_stages(layout, plan.assignment, case.exporter)
    errors += write_all(stages, out, case.exporter)
    spec = json.loads((out / f"{case.exporter}-torch" / "torch_pipeline.json").read_text())
    print(f"  stages {spec['stages']}")
    problem = check_split(model, ids, spec["split_spec"], len(stages.stages))
    return errors + ([problem] if problem else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=60.0)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model = build_model(a.layers, a.hidden, a.heads, a.seq)
    ids = torch.randint(
        0, model.config.vocab_size, (1, a.seq), generator=torch.Generator().manual_seed(1)
    )
    mask = torch.ones_like(ids)
    errors = []
    for case in export_both(model, ids, mask, a.out):
        errors += [
            f"{case.exporter}: {e}" for e in check_case(case, model, ids, a.k, a.time_limit, a.out)
        ]
    for e in errors:
        print("FAIL", e)
    print("all checks passed" if not errors else f"{len(errors)} check(s) failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
