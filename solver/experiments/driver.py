"""YAML experiments: heuristics against the exact optimum, over graphs x clusters x k x methods.

    mtpp experiment configs/experiments/smoke.yaml --output results/smoke --jobs 2 [--resume]
    mtpp experiment configs/experiments/smoke.yaml --output results/smoke --backend ray

The config is validated (pydantic, strict: unknown keys, wrong types, booleans where numbers
belong, NaN or infinite limits are refused with the path of the key; missing files, unknown
methods, options or presets, absurd sizes are reported) before any run starts or any file is
written (:mod:`solver.experiments.config`). Paths in the config are resolved beside the config
file, then in the current folder; the dnn-partitioning data folder is the ``benchmark_dir:``
key, else ``$MTPP_BENCH``, else ../shared/benchmarks/dnn-partitioning beside the current
project (:mod:`solver.experiments.benchdata`).

Two backends run the same runs (:mod:`solver.experiments.runs`) and write the same records:
``local``, a process pool on this machine (:mod:`solver.experiments.local`), and ``ray``
(:mod:`solver.experiments.ray_backend`), one Ray task per run on a local Ray instance or an
existing cluster. Either way the driver (this process) writes every finished run at once and
atomically to ``runs/<id>.json`` (and appends it to ``results.jsonl``) with its plan in
``plans/<id>.json`` (:mod:`solver.experiments.store`); workers never write into the results
folder. Ctrl-C cancels the queued runs, stops the running ones, records every finished one and
writes the reports; ``--resume`` skips what is recorded (by either backend) and redoes a run
whose record is torn. A run id hashes everything that defines the run: the graph source (and
file content), dims, work model, builder parameters, the cluster (an inline cluster by its
content), k, the method and its options, time limit, seed and repeat.

An optional ``shard:`` key (meshes, memory limits, methods propagate/dp/megatron/cpsat, a
strategy ``config:`` per method, or a mapping graph name -> strategy file, the method then
running on the graphs it names only) adds operator-level sharding runs of the config's ONNX graphs
(:func:`solver.spmd.solve.solve_sharding`), recorded like the pipeline runs; a plan over the
memory limit is an ERROR record with the memory it needs.

An optional ``joint:`` key (memory limits, spaces pipeline/sharding/joint, a time limit)
adds joint-plan runs of the config's ONNX graphs on all the devices of each cluster
(:func:`solver.joint.plan_joint`): the same cost model over three search spaces, each record
with its objective, bound and the space the bound covers, the bound valid for every joint
plan, the stages, and the period the joint simulator measures for the plan.

The reports and the proofs of exact optima are in :mod:`solver.experiments.reports`.

Cores: on the local backend each run gets ``max(1, cores // jobs)`` CP-SAT workers (or the
method's ``cpus:``), so ``--jobs`` runs together never ask for more threads than the machine
has; on Ray a run asks for the method's ``cpus:`` (CP-SAT: the cores of the largest node, at
most 8; other methods: 1) and gets that many CP-SAT workers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from solver.core.errors import MtppError
from solver.core.result import ERROR
from solver.experiments import benchdata
from solver.experiments.config import ExperimentConfig, expand, graph_source, load_config, warn
from solver.experiments.local import SweepEnd, run_pool
from solver.experiments.progress import SweepProgress
from solver.experiments.ray_backend import RaySweep, require_ray
from solver.experiments.reports import (  # noqa: F401  (re-exported: the reports' API)
    CSV_COLUMNS,
    enrich,
    geomean,
    prove_optimum,
    summary_markdown,
    write_reports,
)
from solver.experiments.store import check_output, load_done, record, repair_log, sigint_deferred

BACKENDS = ("local", "ray")
WARN_RUNS = 2_000  # a larger sweep is run, with a warning


class ExperimentInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the finished runs are recorded and the reports written."""

    def __init__(self, recorded: int, total: int, output: Path):
        super().__init__(f"{recorded} of {total} runs recorded in {output}")
        self.recorded, self.total, self.output = recorded, total, output


# ---------------------------------------------------------------------- the runner
def choose_backend(
    cfg: ExperimentConfig, backend: str | None, address: str | None, jobs: int | None
) -> tuple[str, str | None]:
    """The backend and Ray address: the command line's, else the config's, else local. Refuses
    options that belong to the other backend, and Ray when it is not installed."""
    name = backend or cfg.backend or "local"
    if name not in BACKENDS:
        raise MtppError(f"--backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if address is None and (backend is None or backend == cfg.backend):
        address = cfg.address
    if name == "local" and address is not None:
        raise MtppError("--address joins a Ray cluster: use it with --backend ray")
    if name == "ray":
        if jobs is not None:
            raise MtppError(
                "--jobs is for the local backend; on Ray each run asks for its CPUs "
                "(a method's 'cpus:' in the config) and Ray runs as many as fit"
            )
        require_ray()
    return name, address


def run_experiment(
    config: str | Path,
    output: str | Path,
    jobs: int | None = None,
    resume: bool = False,
    progress: bool = True,
    backend: str | None = None,
    address: str | None = None,
) -> list[dict]:
    """Run (or resume) an experiment on the local process pool or on Ray and write its
    reports; returns every record.

    Raises :class:`ExperimentInterrupted` on Ctrl-C, after recording what finished."""
    cfg, base = load_config(config)
    backend, address = choose_backend(cfg, backend, address, jobs)
    bench = benchdata.benchmark_dir(cfg.benchmark_dir, base)
    out = Path(output)
    files = [graph_source(gs, base, bench).path for gs in cfg.graphs]
    check_output(out, [Path(config), *[f for f in files if f is not None]], resume)
    jobs = 1 if jobs is None else jobs
    runs = _expand_with_warnings(cfg, base, backend, jobs)
    sweep = RaySweep(cfg, base, bench, address) if backend == "ray" else None
    with sweep or contextlib.nullcontext():
        if sweep is not None:
            sweep.check_cpus()  # before anything is written
        (out / "runs").mkdir(parents=True, exist_ok=True)
        done = load_done(out)
        todo = [r for r in runs if r["id"] not in done]
        repair_log(out, done, {r["id"] for r in todo})
        with SweepProgress(progress, total=len(runs), done=len(runs) - len(todo)) as bar:
            finish = _finisher(out, done, bar)
            if sweep is not None:
                end = SweepEnd(interrupted=sweep.run(todo, out, finish), broken=False)
            else:
                end = run_pool(cfg, base, bench, out, todo, jobs, done, finish)
        records = [_current(done[r["id"]], r) for r in runs if r["id"] in done]
        with sigint_deferred():
            write_reports(records, out, cfg.name)
    if end.interrupted:
        raise ExperimentInterrupted(len(records), len(runs), out)
    if end.broken:
        raise MtppError(
            f"a worker process died (killed, or out of memory?); {len(records)} of {len(runs)} "
            f"runs are recorded in {out}; run again with --resume (and fewer --jobs) to continue"
        )
    return records


def _expand_with_warnings(cfg: ExperimentConfig, base: Path, backend: str, jobs: int) -> list[dict]:
    """The runs of the config, warning first about more local jobs than cores, then about a
    very large sweep."""
    cores = os.cpu_count() or 1
    if backend == "local" and jobs > cores:
        warn(f"--jobs {jobs} is more than the {cores} cores of this machine; runs will be slower")
    runs = expand(cfg, base)
    if len(runs) > WARN_RUNS:
        warn(f"{len(runs):,} runs in this experiment; this may take a long time")
    return runs


def _finisher(out: Path, done: dict[str, dict], bar: SweepProgress) -> Callable[[dict, dict], None]:
    """What a backend calls with each finished run: record it in ``out`` (Ctrl-C held back)
    and in ``done``, and advance the progress bar."""

    def finish(r: dict, rec: dict) -> None:
        with sigint_deferred():
            done[r["id"]] = record(out, rec)
        bar.advance(
            f"{r['graph']} k={rec.get('k')} {r['method']}: {rec['status']}",
            failed=rec["status"] == ERROR,
        )

    return finish


def _current(rec: dict, desc: dict) -> dict:
    """A stored record with today's display names (labels are not part of the run id)."""
    cluster = desc["cluster"]
    if cluster == "file" and rec.get("cluster_name"):  # the cluster the graph file states
        cluster = f"file:{rec['cluster_name']}"
    return dict(rec, graph=desc["graph"], method=desc["method"], cluster=cluster)
