"""mtpp run --backend torch: the plan's split of the user's torch module, one process per rank
(solver.backends.torch_run), checked against the unsplit module and timed beside the
simulator's prediction."""

from __future__ import annotations

import argparse
from pathlib import Path

from solver.backends.frameworks import SHARD_PLAN_FORMAT, DTensorPlan, dtensor_plan, module_stages
from solver.backends.torch_run import (
    Comparison,
    SimulatedStep,
    TorchRunOptions,
    TorchRunResult,
    require_torch,
    run_pipeline_torch,
    run_tensor_parallel_torch,
    simulated_step,
)
from solver.cli.common import console, parse_dims, print_json
from solver.cli.plan_files import JOINT, command_plan, load_pipeline_plan
from solver.core.errors import MtppError
from solver.core.files import parse_json, read_text
from solver.core.text import esc
from solver.core.training import TrainingSpec
from solver.frontends import is_onnx_file
from solver.frontends.onnx.modules import read_layout
from solver.frontends.onnx.reader import load_onnx
from solver.pipeline.plan import read_plan_training

DEFAULT_MICROBATCHES = 4


def cmd_run_torch(args: argparse.Namespace) -> int:
    """Run the plan in torch.distributed; exit 1 when an output or gradient differs."""
    _check_request(args)
    require_torch()
    shard = _shard_plan(args.plan)
    if shard is not None:
        return _run_sharded(args, shard)
    plan = command_plan(args, "run")
    if plan.kind == JOINT:
        raise MtppError(
            f"{plan.path}: --backend torch runs a layer-granular pipeline plan (mtpp solve "
            "--granularity layer) or an operator-sharding plan (mtpp shard --out DIR: "
            "DIR/plan.json), not a joint plan"
        )
    p = load_pipeline_plan(args, plan)
    stages = module_stages(read_layout(args.graph, p.graph), p.assignment, plan.path)
    opts = _options(args, read_plan_training(p.data, plan.path), plan.path)
    result = run_pipeline_torch(args.graph, args.module, stages, opts)
    measured = load_onnx(
        args.graph,
        dims=parse_dims(args),
        work="measured",
        memory_ok=args.memory_ok,
        training_costs=opts.train,
    )
    sim = simulated_step(measured, p.assignment, result.link_bandwidth, opts)
    names = [list(s) for s in stages.stages]
    return _report(args, result, sim, names, "node times measured here in onnxruntime")


def _check_request(args: argparse.Namespace) -> None:
    """The torch back end's own options, before anything is read."""
    if args.module is None:
        raise MtppError(
            "--backend torch needs --module FILE.py:FACTORY, a function that builds the torch "
            "module that was exported to MODEL.onnx"
        )
    if args.requests is not None:
        raise MtppError("--requests applies to --backend onnx; use --microbatches with torch")
    if not is_onnx_file(args.graph):
        raise MtppError(f"{args.graph}: run needs the ONNX model (.onnx) the plan was made for")
    if args.microbatches is not None and not 1 <= args.microbatches <= 1024:
        raise MtppError(f"--microbatches must be from 1 to 1024, got {args.microbatches}")


def _shard_plan(path: str) -> dict | None:
    """The content of an operator-sharding plan (mtpp shard's plan.json), or None."""
    if not path.lower().endswith(".json") or not Path(path).is_file():
        return None
    try:
        data = parse_json(read_text(path, "plan file"), path)
    except MtppError:
        return None
    return data if isinstance(data, dict) and data.get("format") == SHARD_PLAN_FORMAT else None


def _options(args: argparse.Namespace, spec: TrainingSpec | None, path: str) -> TorchRunOptions:
    """Training with the plan's schedule and microbatches (a training plan), with --schedule,
    or inference (GPipe forward)."""
    dims = parse_dims(args)
    if spec is None:
        m = args.microbatches or DEFAULT_MICROBATCHES
        train = args.schedule is not None
        return TorchRunOptions(m, train, args.schedule or "gpipe", seed=args.seed, dims=dims)
    if spec.schedule not in ("gpipe", "1f1b"):
        raise MtppError(
            f"{path}: a training plan for the {spec.schedule} schedule; --backend torch runs "
            "gpipe and 1f1b"
        )
    for option, given, planned in (
        ("--schedule", args.schedule, spec.schedule),
        ("--microbatches", args.microbatches, spec.microbatches),
    ):
        if given is not None and given != planned:
            raise MtppError(
                f"{option} {given} differs from the training plan's {planned} ({path}); drop "
                f"{option}"
            )
    return TorchRunOptions(spec.microbatches, True, spec.schedule, seed=args.seed, dims=dims)


def _run_sharded(args: argparse.Namespace, data: dict) -> int:
    """An operator-sharding plan in its DTensor form, with parallelize_module."""
    plan: DTensorPlan = dtensor_plan(args.graph, data, args.plan)
    if not plan.parallelize_plan:
        raise MtppError(
            f"{args.plan}: no module of the plan maps onto a DTensor style (mtpp export "
            "--format dtensor lists why); nothing to run in parallel"
        )
    if args.schedule not in (None, "gpipe"):
        raise MtppError("--schedule 1f1b applies to pipeline plans; drop it")
    opts = TorchRunOptions(
        args.microbatches or DEFAULT_MICROBATCHES,
        args.schedule is not None,  # a training step: forward and backward per microbatch
        seed=args.seed,
        dims=parse_dims(args),
    )
    result = run_tensor_parallel_torch(args.graph, args.module, plan, plan.ranks, opts)
    objective = float(data.get("objective") or 0.0)  # the plan's time of one microbatch
    sim = SimulatedStep(objective * opts.microbatches, objective, None)
    return _report(args, result, sim, [], "the plan's own estimate on its cluster")


def _report(args, result: TorchRunResult, sim: SimulatedStep, stages, basis: str) -> int:
    if args.json:
        print_json(_record(args, result, sim, stages, basis))
    else:
        _print(result, sim, stages, basis)
    return 0 if result.ok else 1


def _record(args, result: TorchRunResult, sim: SimulatedStep, stages, basis: str) -> dict:
    """The JSON object of mtpp run --backend torch."""
    return {
        "backend": "torch",
        "kind": result.kind,
        "graph": Path(args.graph).name,
        "ranks": result.ranks,
        "stages": stages,
        "microbatches": result.microbatches,
        "training": {"schedule": result.schedule} if result.train else None,
        "inputs": result.input_shapes,
        "outputs": _comparison(result.outputs),
        "gradients": None if result.gradients is None else _comparison(result.gradients),
        "ok": result.ok,
        "measured": {
            "step_seconds": result.step_seconds,
            "per_microbatch": result.per_microbatch,
        },
        "simulated": {
            "step_seconds": sim.step_seconds,
            "per_microbatch": sim.per_microbatch,
            "period": sim.period,
            "basis": basis,
        },
        "link_bandwidth": result.link_bandwidth,
    }


def _comparison(c: Comparison) -> dict:
    return {"max_abs_diff": c.max_abs_diff, "where": c.where, "tolerance": c.tolerance, "ok": c.ok}


def _print(result: TorchRunResult, sim: SimulatedStep, stages, basis: str) -> None:
    con = console()
    what = "stage" if stages else "tensor-parallel"
    mode = "one training step" if result.train else "inference"
    if result.train and result.schedule:
        mode += f" ({result.schedule})"
    shapes = ", ".join(esc(f"{x} {v}") for x, v in result.input_shapes.items())
    con.print(
        f"[bold]torch run[/bold] (gloo, CPU): {result.ranks} {what} processes, "
        f"{result.microbatches} microbatches of {shapes}; {mode}"
    )
    for i, units in enumerate(stages):
        con.print(esc(f"  stage {i}: {', '.join(units)}"))
    checks = [("outputs", result.outputs)]
    if result.gradients is not None:
        checks.append(("gradients", result.gradients))
    for name, c in checks:
        status = "[green]OK[/green]" if c.ok else "[red]MISMATCH[/red]"
        con.print(
            f"{name}: max |split - unsplit| {c.max_abs_diff:.3g} ({esc(c.where)}), tolerance "
            f"{c.tolerance:.3g}: {status}"
        )
    link = f"gloo {result.link_bandwidth / 1e6:.4g} MB/s as the link, " if result.ranks > 1 else ""
    con.print(
        f"time per microbatch: measured {1e3 * result.per_microbatch:.4g} ms (step "
        f"{1e3 * result.step_seconds:.4g} ms), simulated {1e3 * sim.per_microbatch:.4g} ms "
        f"(step {1e3 * sim.step_seconds:.4g} ms; {link}{basis})"
    )
