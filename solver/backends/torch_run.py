"""``mtpp run --backend torch``: the plan run in PyTorch, one process per rank, joined by gloo.

A layer-granular pipeline plan (:mod:`solver.pipeline.granularity`) runs as its
``split_spec`` with ``torch.distributed.pipelining.pipeline()`` and a schedule (GPipe, or 1F1B
for training): inference pushes the microbatches forward; ``train`` runs one training step
(mean squared error of the first output against seeded random targets) after a warm-up step.
An operator-sharding plan's DTensor form (:func:`solver.backends.frameworks.dtensor_plan`) runs
with ``parallelize_module`` on a 1-D mesh of every rank. The module comes from the user's
``FILE.py:FACTORY`` and takes the ONNX model's inputs, in order, as positional arguments; the
driver builds it once, and every rank loads the same weights.

The outputs (and, for training, every parameter's gradient, summed over the ranks that hold
it, tied parameters included) are checked against the unsplit module on the same microbatches:
at most ``TOLERANCE x max(1, max |reference|)`` apart. The measured time per microbatch (the
median timed step over the microbatches) stands beside the simulator's prediction: the plan
simulated with node times measured here and the gloo bandwidth measured between two ranks as
the link.

torch is imported inside the functions: it is the heavy optional dependency of the ``torch``
extra (``pip install "mtpp[torch]"``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from solver.backends.schedule import simulate_training
from solver.backends.simulate import simulate
from solver.backends.torch_stage import (
    PIPELINE,
    TENSOR_PARALLEL,
    RankReport,
    RankTask,
    flat_tensors,
    load_factory,
    mse_loss,
    one_line,
    rank_main,
)
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.training import TrainingSpec, training_cost
from solver.frontends.onnx.ort import random_inputs
from solver.frontends.onnx.shapes import fix_dims

TOLERANCE = 1e-4  # outputs and gradients: at most this x max(1, max |reference|) apart
RUN_SECONDS = 900.0  # the ranks together may take this long before they are stopped
TORCH_MISSING = '--backend torch needs PyTorch, which is not installed: pip install "mtpp[torch]"'
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class TorchRunOptions:
    """How to run: microbatches, training or inference, schedule, timed steps, seed."""

    microbatches: int = 4
    train: bool = False
    schedule: str = "gpipe"
    repeats: int = 3
    seed: int = 0
    dims: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    """The largest difference from the unsplit module, where it is, and the allowed one."""

    max_abs_diff: float
    where: str
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance


@dataclass(frozen=True)
class TorchRunResult:
    """What a torch run measured and checked."""

    kind: str  # PIPELINE or TENSOR_PARALLEL
    ranks: int
    microbatches: int
    train: bool
    schedule: str
    step_seconds: float  # median timed step
    link_bandwidth: float  # bytes/s of a gloo send between two ranks (0: one rank)
    outputs: Comparison
    gradients: Comparison | None  # training only
    input_shapes: dict[str, list[int]]  # one microbatch

    @property
    def per_microbatch(self) -> float:
        return self.step_seconds / self.microbatches

    @property
    def ok(self) -> bool:
        return self.outputs.ok and (self.gradients is None or self.gradients.ok)


@dataclass(frozen=True)
class Reference:
    """The unsplit module's run: microbatches (ONNX input order), targets, outputs, grads."""

    input_names: list[str]
    microbatches: list[list]
    targets: list
    outputs: list  # output tensors, the microbatches concatenated
    grads: dict  # canonical parameter name -> gradient (training)
    canonical: dict  # every parameter name (tied ones too) -> its canonical name


def require_torch() -> None:
    """Refuse in one line when torch is not installed."""
    try:
        import torch  # noqa: F401  heavy: torch (the torch extra)
    except ImportError:
        raise MtppError(TORCH_MISSING) from None


def check_options(opts: TorchRunOptions) -> None:
    if opts.schedule not in SCHEDULES:
        raise MtppError(f"--schedule {opts.schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if not 1 <= opts.microbatches <= 1024:
        raise MtppError(f"--microbatches must be from 1 to 1024, got {opts.microbatches}")
    if opts.seed < 0:
        raise MtppError(f"--seed must be >= 0, got {opts.seed}")


def build_module(factory_spec: str, paths: list[str]):
    """The module of ``FILE.py:FACTORY``, checked to hold every module path of the plan."""
    import torch  # heavy: torch (the torch extra)

    try:
        factory = load_factory(factory_spec)
    except ValueError as e:
        raise MtppError(str(e)) from None
    try:
        module = factory()
    except Exception as e:  # noqa: BLE001 - the user's factory may raise anything
        raise MtppError(f"--module {factory_spec}: the factory failed: {one_line(e)}") from None
    if not isinstance(module, torch.nn.Module):
        raise MtppError(
            f"--module {factory_spec}: the factory returned {type(module).__name__}, not a "
            "torch.nn.Module"
        )
    names = {n for n, _ in module.named_modules()}
    missing = [p for p in paths if p not in names]
    if missing:
        raise MtppError(
            f"--module {factory_spec}: the module has no submodule {missing[0]} (the plan's "
            "module paths come from the model that was exported to ONNX; build the same model)"
        )
    return module.eval()


def run_pipeline_torch(
    model_path: str | Path, factory_spec: str, stages, opts: TorchRunOptions
) -> TorchRunResult:
    """Run ``stages`` (:class:`solver.backends.frameworks.ModuleStages`) as a pipeline, one
    process per stage."""
    require_torch()
    check_options(opts)
    module = build_module(factory_spec, [u for s in stages.stages for u in s])
    ref = reference_run(module, model_path, opts)
    task = RankTask(
        kind=PIPELINE,
        factory=factory_spec,
        folder="",
        world=len(stages.stages),
        microbatches=opts.microbatches,
        train=opts.train,
        schedule=opts.schedule,
        repeats=opts.repeats,
        threads=1,
        split_spec=stages.split_spec,
        parallelize_plan={},
        input_layouts={},
        output_layouts={},
    )
    return run_ranks(task, module, ref, opts)


def run_tensor_parallel_torch(
    model_path: str | Path, factory_spec: str, plan, ranks: int, opts: TorchRunOptions
) -> TorchRunResult:
    """Run a DTensor plan (:class:`solver.backends.frameworks.DTensorPlan`) with
    ``parallelize_module`` on ``ranks`` processes."""
    require_torch()
    check_options(opts)
    module = build_module(factory_spec, list(plan.parallelize_plan))
    ref = reference_run(module, model_path, opts)
    task = RankTask(
        kind=TENSOR_PARALLEL,
        factory=factory_spec,
        folder="",
        world=ranks,
        microbatches=opts.microbatches,
        train=opts.train,
        schedule="",
        repeats=opts.repeats,
        threads=1,
        split_spec={},
        parallelize_plan=dict(plan.parallelize_plan),
        input_layouts=dict(plan.input_layouts),
        output_layouts=dict(plan.output_layouts),
    )
    return run_ranks(task, module, ref, opts)


def microbatch_inputs(model_path: str | Path, opts: TorchRunOptions):
    """Seeded random microbatches shaped as the ONNX model's inputs (``opts.dims`` fix its
    dynamic dims): a list of tensors per microbatch, and the input names."""
    import onnx  # heavy: onnx
    import torch  # heavy: torch (the torch extra)

    model = onnx.load(str(model_path), load_external_data=False)
    fix_dims(model, dict(opts.dims))
    batches = [random_inputs(model, seed=opts.seed + i) for i in range(opts.microbatches)]
    names = list(batches[0])
    return [[torch.from_numpy(b[n]) for n in names] for b in batches], names


def reference_run(module, model_path: str | Path, opts: TorchRunOptions) -> Reference:
    """The unsplit module on every microbatch; for training also the gradients of the mean
    of the microbatches' losses (what the schedules accumulate)."""
    import torch  # heavy: torch (the torch extra)

    microbatches, names = microbatch_inputs(model_path, opts)
    gen = torch.Generator().manual_seed(opts.seed)
    outs, targets = [], []
    module.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(opts.train):
        for mb in microbatches:
            out = module(*mb)
            if opts.train:
                first = flat_tensors(out)[0]
                target = torch.randn(first.shape, generator=gen, dtype=first.dtype)
                (mse_loss(out, target) / opts.microbatches).backward()
                targets.append(target)
            outs.append([t.detach() for t in flat_tensors(out)])
    outputs = [torch.cat([o[j] for o in outs]) for j in range(len(outs[0]))]
    canonical, grads = {}, {}
    seen: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        canonical[name] = seen.setdefault(id(p), name)
        if p.grad is not None and canonical[name] == name:
            grads[name] = p.grad.detach().clone()
    module.zero_grad(set_to_none=True)
    return Reference(names, microbatches, targets, outputs, grads, canonical)


def run_ranks(task: RankTask, module, ref: Reference, opts: TorchRunOptions) -> TorchRunResult:
    """Start one process per rank, wait for them, and check what they computed."""
    import torch  # heavy: torch (the torch extra)

    with tempfile.TemporaryDirectory(prefix="mtpp-torch-run-") as tmp:
        folder = Path(tmp)
        task = replace(task, folder=str(folder))
        torch.save(module.state_dict(), folder / "weights.pt")
        torch.save({"microbatches": ref.microbatches, "targets": ref.targets}, folder / "inputs.pt")
        _start_and_wait(task)
        reports = [RankReport(**_read_json(folder / f"rank{r}.json")) for r in range(task.world)]
        outputs = compare_outputs(torch.load(folder / "outputs.pt"), ref.outputs)
        gradients = None
        if task.train:
            # pipeline stages hold disjoint parameters; tensor-parallel ranks gather them whole
            holders = range(task.world) if task.kind == PIPELINE else range(1)
            stage_grads = [torch.load(folder / f"grads{r}.pt") for r in holders]
            gradients = compare_grads(stage_grads, ref)
    return TorchRunResult(
        kind=task.kind,
        ranks=task.world,
        microbatches=task.microbatches,
        train=task.train,
        schedule=task.schedule,
        step_seconds=statistics.median(reports[0].step_seconds),
        link_bandwidth=reports[0].link_bandwidth,
        outputs=outputs,
        gradients=gradients,
        input_shapes={
            n: list(t.shape) for n, t in zip(ref.input_names, ref.microbatches[0], strict=True)
        },
    )


def _start_and_wait(task: RankTask) -> None:
    """Spawn the ranks; a rank that fails stops all of them, with its error in one line."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, task), daemon=True) for r in range(task.world)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + RUN_SECONDS
        while any(p.is_alive() for p in procs):
            failed = next((r for r, p in enumerate(procs) if p.exitcode not in (None, 0)), None)
            if failed is not None:
                raise MtppError(_rank_failure(task, failed, procs[failed].exitcode))
            if time.monotonic() > deadline:
                raise MtppError(f"the torch run took more than {RUN_SECONDS:g} s; stopped it")
            time.sleep(0.05)
        failed = next((r for r, p in enumerate(procs) if p.exitcode != 0), None)
        if failed is not None:
            raise MtppError(_rank_failure(task, failed, procs[failed].exitcode))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            if p.pid is not None:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()


def _rank_failure(task: RankTask, rank: int, exitcode: int | None) -> str:
    what = f"stage {rank}" if task.kind == PIPELINE else f"rank {rank}"
    err = Path(task.folder) / f"rank{rank}.err"
    detail = err.read_text().strip() if err.is_file() else f"exit code {exitcode}"
    return f"torch run: {what} failed: {detail}"


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def compare_outputs(got: list, want: list) -> Comparison:
    """The largest difference over the output tensors (a missing or misshapen one: inf)."""
    if len(got) != len(want):
        return Comparison(float("inf"), f"{len(got)} outputs, the unsplit module {len(want)}", 0)
    worst, where, scale = 0.0, "", 1.0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        scale = max(scale, float(w.abs().max()) if w.numel() else 0.0)
        if tuple(g.shape) != tuple(w.shape):
            return Comparison(float("inf"), f"output {i} shape {list(g.shape)}", TOLERANCE)
        diff = float((g.float() - w.float()).abs().max()) if w.numel() else 0.0
        if diff >= worst:
            worst, where = diff, f"output {i}"
    return Comparison(worst, where, TOLERANCE * scale)


def compare_grads(stage_grads: list[dict], ref: Reference) -> Comparison:
    """Every parameter's gradient summed over the ranks that hold it (a tied parameter on two
    stages gets both shares) against the unsplit module's."""
    total: dict = {}
    for grads in stage_grads:
        for name, g in grads.items():
            key = ref.canonical.get(name, name)
            total[key] = total[key] + g if key in total else g
    worst, where, scale = 0.0, "", 1.0
    for name, want in ref.grads.items():
        scale = max(scale, float(want.abs().max()))
        got = total.get(name)
        if got is None or tuple(got.shape) != tuple(want.shape):
            return Comparison(float("inf"), f"gradient of {name} missing", TOLERANCE)
        diff = float((got - want).abs().max())
        if diff >= worst:
            worst, where = diff, f"gradient of {name}"
    return Comparison(worst, where, TOLERANCE * scale)


# ---------------------------------------------------------------------- the simulator's side
@dataclass(frozen=True)
class SimulatedStep:
    """The simulator's time for the same step: per microbatch and the whole step (seconds)."""

    step_seconds: float
    per_microbatch: float
    period: float | None  # steady-state seconds per microbatch (inference)


def simulated_step(
    measured: Graph, assignment: np.ndarray, bandwidth: float, opts: TorchRunOptions
) -> SimulatedStep:
    """The plan simulated here: node times measured on this machine, alike processes, the
    gloo bandwidth as the link (1 TB/s for a single stage, which sends nothing)."""
    devices = int(np.max(assignment)) + 1
    here = Cluster("this-machine", devices, link_bandwidth=bandwidth if bandwidth > 0 else 1e12)
    m = opts.microbatches
    if opts.train:
        cost = training_cost(measured, here, assignment, TrainingSpec(opts.schedule, m))
        run = simulate_training(cost)
        return SimulatedStep(run.makespan, run.makespan / m, None)
    sim = simulate(measured, here, assignment, requests=m)
    return SimulatedStep(sim.makespan, sim.makespan / m, sim.period)


__all__ = [
    "Comparison",
    "SimulatedStep",
    "TORCH_MISSING",
    "TorchRunOptions",
    "TorchRunResult",
    "require_torch",
    "run_pipeline_torch",
    "run_tensor_parallel_torch",
    "simulated_step",
]
