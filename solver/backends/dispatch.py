"""One dispatch point for what a plan becomes: evaluate, simulate or export a plan of any kind.

A plan comes in three kinds (``loaded.kind``):

- ``"pipeline"`` (:class:`PipelinePlan`): blocks of a cost graph on devices, the plan of
  ``mtpp solve`` (also a manual sharding);
- ``"spmd"`` (:class:`SpmdPlan`): one strategy per operator on one mesh, the plan of
  ``mtpp shard``;
- ``"joint"`` (:class:`JointPlanFiles`): pipeline stages, each an SPMD program on its devices.

A pipeline plan with ``training`` set is a training plan (docs/training.md): it is priced
with the training model and simulated under its schedule; so is a joint plan with
``plan.training`` set (a joint training plan, docs/backends.md).

Each command is a dict ``{kind: function}``: :data:`EVALUATE`, :data:`SIMULATE`,
:data:`EXPORT`; :func:`evaluate`, :func:`simulate` and :func:`export` look the plan's kind up
there and call the back end of that kind. A kind a command has no back end for (a sharded
plan has no simulator) is refused in one line. The functions return what the back end
returns, wrapped in a record that names the kind (:class:`Evaluated`, :class:`Simulated`,
:class:`Exported`), so a caller prints per kind from one call.

This is the one path of ``mtpp evaluate``, ``mtpp simulate`` and ``mtpp export``: the
command line reads the plan file and builds the loaded plan (it knows the options), calls
the function here, and prints the record it gets back. This module does not print and knows
no option names besides those a joint or training plan refuses.
It is imported by the command line only: ``backends/__init__`` stays empty, since every import
of a back end module (a spawned stage process of ``mtpp run`` too) runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from solver.backends.evaluate_plan import PlanEvaluation, evaluate_plan
from solver.backends.export import export_plan
from solver.backends.export_joint import export_joint
from solver.backends.export_spmd import write_out
from solver.backends.frameworks import export_framework
from solver.backends.schedule import TrainingSimulation, simulate_training_plan
from solver.backends.simulate import Simulation
from solver.backends.simulate import simulate as simulate_pipeline
from solver.backends.simulate_joint import simulate_joint, simulate_joint_training
from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.files import check_output_dir
from solver.core.graph import Graph
from solver.core.result import INVALID
from solver.core.training import TrainingSpec
from solver.spmd.model import ShardModel
from solver.spmd.program import Planner
from solver.spmd.program import evaluate as evaluate_program

PIPELINE, SPMD, JOINT = "pipeline", "spmd", "joint"
KINDS = (PIPELINE, SPMD, JOINT)
ONNX = "onnx"  # the export format of stage models; the others: solver.backends.frameworks


# ---------------------------------------------------------------------- loaded plans
@dataclass
class PipelinePlan:
    """A pipeline plan with what its back ends read."""

    kind: ClassVar[str] = PIPELINE
    graph: Graph
    cluster: Cluster
    assignment: np.ndarray  # block of every node
    placement: np.ndarray | None = None  # device of every block; None: block b on device b
    model_path: str | Path | None = None  # the ONNX model the graph came from (export needs it)
    stage: np.ndarray | None = None  # pipeline stage of every node (export); None: its block
    data: dict = field(default_factory=dict)  # the plan file's content: method, claims
    claims_apply: bool = False  # the file was made for this cluster (by content): a
    # consistent OPTIMAL claim may stand for the status (evaluate)
    training: TrainingSpec | None = None  # a training plan's schedule (None: inference)
    plan_path: str | Path | None = None  # the plan file (framework exports name it)


@dataclass
class SpmdPlan:
    """A sharded plan: the model on its mesh (``planner``) and a strategy per operator."""

    kind: ClassVar[str] = SPMD
    planner: Planner
    strategies: dict  # operator name -> strategy
    record: dict  # the plan as data (``mtpp shard --json``), written as ``plan.json``


@dataclass
class JointPlanFiles:
    """A joint plan checked against its model (``sm`` as :func:`solver.spmd.load_model` read
    it from ``model_path``)."""

    kind: ClassVar[str] = JOINT
    plan: Any  # solver.joint.plan.JointPlan
    sm: ShardModel
    model_path: str | Path
    plan_path: str | Path | None = None  # the plan file, copied as is by export
    claimed_status: str | None = None  # the file's status (None: the plan's)
    claims_apply: bool = True  # False: the file's bound and status were dropped (--memory
    # above the limit the plan was solved under)

    @property
    def cluster(self) -> Cluster:
        return self.plan.cluster


LoadedPlan = PipelinePlan | SpmdPlan | JointPlanFiles


# ---------------------------------------------------------------------- options and results
@dataclass(frozen=True)
class SimulateOptions:
    """``mtpp simulate``'s knobs; a joint plan takes only ``requests``."""

    requests: int = 100
    mode: str = "pipelined"
    overlap: bool = False
    latency: float | None = None


@dataclass(frozen=True)
class ExportOptions:
    """Where and how to export; ``inputs`` are files the output folder must not replace."""

    out_dir: str | Path
    dims: dict[str, int] | None = None
    verify: bool = False
    tolerance: float | None = None
    seed: int = 0
    force: bool = False
    inputs: tuple[Path, ...] = ()
    verify_memory_ok: bool = False
    format: str = ONNX  # a pipeline plan: also a framework's form (solver.backends.frameworks)


@dataclass
class Evaluated:
    """A plan priced again from its inputs, with the status that follows."""

    kind: str
    objective: float  # seconds per request (the period); a training plan: T
    violations: list[str]  # empty: the plan is valid
    detail: Any  # PlanEvaluation (pipeline), Program (spmd), JointSimulation (joint),
    # JointTraining (joint training: the recomputed training terms)
    plan: Any = None  # the plan with its evaluated status (INVALID when it has violations)
    claim: dict = field(default_factory=dict)  # what the file claims, checked (claimed_status,
    # "claim" in words when checked against recomputed numbers, "used" for the status)

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def claim_refused(self) -> bool:
        """The file claims what the recomputed numbers contradict."""
        return self.claim.get("claim", "").startswith("invalid")


@dataclass
class Simulated:
    """A simulation: ``sim`` for every kind but a training plan's, ``detail`` the kind's own
    record."""

    kind: str
    sim: Simulation | None  # None: a training plan (its schedule is in ``detail``)
    detail: Any  # Simulation (pipeline), TrainingSimulation (training), JointSimulation (joint),
    # JointTrainingSimulation (joint training)

    @property
    def valid(self) -> bool:
        return self.detail.valid


@dataclass
class Exported:
    """An export: ``report`` is what the folder's own summary file holds (``stages.json``,
    ``manifest.json``; a sharded plan: its ``plan.json``)."""

    kind: str
    out_dir: Path
    report: dict


# ---------------------------------------------------------------------- evaluate
def _evaluate_pipeline(p: PipelinePlan) -> Evaluated:
    """Priced again, the bound recomputed, the file's claims checked
    (:func:`solver.backends.evaluate_plan.evaluate_plan`)."""
    ev: PlanEvaluation = evaluate_plan(
        p.graph, p.cluster, p.assignment, p.placement, p.data, p.claims_apply, p.training
    )
    violations = [str(v) for v in ev.violations]
    return Evaluated(PIPELINE, ev.plan.objective, violations, ev, ev.plan, ev.claim)


def _evaluate_spmd(p: SpmdPlan) -> Evaluated:
    program = evaluate_program(p.planner, p.strategies)
    return Evaluated(SPMD, program.objective, [], program)


def _evaluate_joint(p: JointPlanFiles) -> Evaluated:
    """Every stage priced again (the loader refuses a number that differs) and checked against
    the memory limit. The bound is the file's (stated over its space): checked against the
    objective, not recomputed; the status is the file's unless a stage does not fit."""
    if p.plan.training is not None:
        return _evaluate_joint_training(p)
    js = simulate_joint(p.plan, p.sm, requests=2)
    violations = list(js.sim.violations)
    plan = replace(p.plan, status=INVALID) if violations else p.plan
    claimed = p.claimed_status or p.plan.status
    claim = {"claimed_status": claimed, "used": not violations and p.claims_apply}
    return Evaluated(JOINT, p.plan.objective, violations, js, plan, claim)


def _evaluate_joint_training(p: JointPlanFiles) -> Evaluated:
    """A joint training plan: the loader priced every stage again with the training cost
    function (:func:`solver.joint.plan_check.check_training_plan`), refused a number that
    differs and a stage over its memory limit, so the plan is valid; T and the training terms
    are the recomputed ones. The bound and the status are the file's, checked against T
    (unless ``--memory`` raised the limit: then the universal bound, never OPTIMAL)."""
    plan = p.plan
    claimed = p.claimed_status or plan.status
    claim = {"claimed_status": claimed, "used": p.claims_apply}
    return Evaluated(JOINT, plan.objective, [], plan.training, plan, claim)


EVALUATE: dict[str, Callable[[Any], Evaluated]] = {
    PIPELINE: _evaluate_pipeline,
    SPMD: _evaluate_spmd,
    JOINT: _evaluate_joint,
}


def evaluate(loaded: LoadedPlan) -> Evaluated:
    """Price ``loaded`` again from its inputs, by its kind."""
    return _back_end(EVALUATE, "evaluate", loaded)(loaded)


# ---------------------------------------------------------------------- simulate
def _simulate_pipeline(p: PipelinePlan, options: SimulateOptions) -> Simulated:
    if p.training is not None:
        return _simulate_training(p, options)
    sim = simulate_pipeline(
        p.graph,
        p.cluster,
        p.assignment,
        requests=options.requests,
        mode=options.mode,
        overlap=options.overlap,
        latency=options.latency,
        placement=p.placement,
    )
    return Simulated(PIPELINE, sim, sim)


def _simulate_training(p: PipelinePlan, options: SimulateOptions) -> Simulated:
    """A training plan's schedule run once (its microbatches are the requests)."""
    refuse_options(options, "a training plan", requests=True)
    ts: TrainingSimulation = simulate_training_plan(
        p.graph, p.cluster, p.assignment, p.training, placement=p.placement
    )
    return Simulated(PIPELINE, None, ts)


def _simulate_joint(p: JointPlanFiles, options: SimulateOptions) -> Simulated:
    if p.plan.training is not None:  # its schedule run once (its microbatches are the requests)
        refuse_options(options, "a joint training plan", requests=True)
        return Simulated(JOINT, None, simulate_joint_training(p.plan))
    refuse_options(options, "a joint plan")
    js = simulate_joint(p.plan, p.sm, requests=options.requests)
    return Simulated(JOINT, js.sim, js)


def refuse_options(options: SimulateOptions, what: str, requests: bool = False) -> None:
    """Refuse the pipeline simulation's options (``requests`` too, when asked) that ``what``
    does not take, given a value other than the default."""
    defaults = SimulateOptions() if requests else SimulateOptions(requests=options.requests)
    for option, name in SIMULATION_OPTIONS:
        if getattr(options, name) != getattr(defaults, name):
            raise MtppError(f"{option} does not apply to {what}; drop it")


SIMULATION_OPTIONS = (
    ("--requests", "requests"),
    ("--mode", "mode"),
    ("--overlap", "overlap"),
    ("--latency", "latency"),
)


SIMULATE: dict[str, Callable[[Any, SimulateOptions], Simulated]] = {
    PIPELINE: _simulate_pipeline,
    JOINT: _simulate_joint,
}


def simulate(loaded: LoadedPlan, options: SimulateOptions | None = None) -> Simulated:
    """Push requests through ``loaded`` on its cluster (discrete events), by its kind."""
    return _back_end(SIMULATE, "simulate", loaded)(loaded, options or SimulateOptions())


# ---------------------------------------------------------------------- export
def _export_pipeline(p: PipelinePlan, o: ExportOptions) -> Exported:
    if p.model_path is None:
        raise MtppError("export needs the ONNX model the plan's graph was imported from")
    if o.format != ONNX:
        return _export_framework(p, o)
    report = export_plan(
        p.model_path,
        p.graph,
        p.assignment,
        o.out_dir,
        dims=o.dims,
        stage=p.stage,
        verify=o.verify,
        tolerance=o.tolerance,
        seed=o.seed,
        force=o.force,
        inputs=list(o.inputs),
        verify_memory_ok=o.verify_memory_ok,
        placement=p.placement,
    )
    return Exported(PIPELINE, Path(o.out_dir), report)


def _export_framework(p: PipelinePlan, o: ExportOptions) -> Exported:
    """The stages of a plan that cuts only between modules, in a framework's form; the
    report is what ``mtpp export --format FMT --json`` prints."""
    rep = export_framework(
        o.format, p.model_path, p.graph, p.assignment, o.out_dir, p.plan_path, o.force
    )
    report = {"format": rep.format, "out": str(rep.out_dir), "files": list(rep.files)}
    return Exported(PIPELINE, Path(o.out_dir), report)


def _export_spmd(p: SpmdPlan, o: ExportOptions) -> Exported:
    """``strategies.yaml``, ``plan.json`` and ``annotated.onnx`` (verify: ``mtpp shard
    --verify``, before the plan is written, by the caller)."""
    check_output_dir(o.out_dir, list(o.inputs), force=o.force, what="--out")
    write_out(o.out_dir, p.planner.sm, p.strategies, p.record)
    return Exported(SPMD, Path(o.out_dir), p.record)


def _export_joint(p: JointPlanFiles, o: ExportOptions) -> Exported:
    if o.format != ONNX:
        raise MtppError(f"a joint plan is exported as ONNX stage models, not {o.format}")
    manifest = export_joint(
        p.plan,
        p.model_path,
        o.out_dir,
        plan_path=p.plan_path,
        dims=o.dims,
        verify=o.verify,
        tolerance=o.tolerance,
        seed=o.seed,
        force=o.force,
        inputs=list(o.inputs),
        verify_memory_ok=o.verify_memory_ok,
    )
    return Exported(JOINT, Path(o.out_dir), manifest)


EXPORT: dict[str, Callable[[Any, ExportOptions], Exported]] = {
    PIPELINE: _export_pipeline,
    SPMD: _export_spmd,
    JOINT: _export_joint,
}


def export(loaded: LoadedPlan, options: ExportOptions) -> Exported:
    """Write ``loaded`` as files into ``options.out_dir``, by its kind."""
    return _back_end(EXPORT, "export", loaded)(loaded, options)


def _back_end(table: dict[str, Callable], command: str, loaded: LoadedPlan) -> Callable:
    """The function of ``table`` for the plan's kind; a kind without one is refused."""
    fn = table.get(loaded.kind)
    if fn is None:
        takes = " or ".join(k for k in KINDS if k in table)
        raise MtppError(f"mtpp {command} takes {takes} plans, not {loaded.kind} plans")
    return fn
