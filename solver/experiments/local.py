"""The local backend of ``mtpp experiment``: a process pool on this machine, one run per task.

Each run gets ``max(1, cores // jobs)`` CP-SAT workers (or the method's ``cpus:``), so ``--jobs``
runs together never ask for more threads than the machine has. Workers ignore Ctrl-C: the
driver cancels the queued runs, terminates the running ones and records every finished one.
A worker that dies (killed, out of memory) ends the sweep with what was recorded.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from solver.core.errors import MtppError
from solver.experiments import runs
from solver.experiments.config import ExperimentConfig, GraphSpec, cluster_ref
from solver.experiments.store import sigint_deferred


@dataclass(frozen=True)
class SweepEnd:
    """How a sweep ended: stopped by Ctrl-C (finished runs recorded), or a worker died."""

    interrupted: bool
    broken: bool


def _execute(
    desc: dict, gs_data: dict, cluster_spec, base: str, bench: str, out: str, workers: int
) -> dict:
    """One run in a local worker process: the graph file (generated models are built into
    ``out/models`` once), then :func:`solver.experiments.runs.solve_run` (looked up
    at call time: a test may replace it)."""
    gs = GraphSpec.model_validate(gs_data)
    t0 = time.perf_counter()
    try:
        path = runs.materialise(gs, Path(base), Path(bench), Path(out))
    except MtppError as e:
        return runs.failed(desc, str(e), time.perf_counter() - t0)
    named = isinstance(cluster_spec, str) and cluster_spec != "file"
    cluster = cluster_ref(cluster_spec, Path(base)) if named else cluster_spec
    return runs.solve_run(desc, gs_data, str(path), cluster, workers)


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which records what finished and stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel queued runs and end the running ones without waiting for them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def run_pool(
    cfg: ExperimentConfig,
    base: Path,
    bench: Path,
    out: Path,
    todo: list[dict],
    jobs: int,
    done: dict[str, dict],
    finish: Callable[[dict, dict], None],
) -> SweepEnd:
    """The local backend: ``todo`` on a pool of ``jobs`` processes; every result goes to
    ``finish``. Returns whether Ctrl-C stopped it or a worker died."""
    cores = os.cpu_count() or 1
    specs = {m.label or m.name: m for m in cfg.method_specs()}
    interrupted = broken = False
    procs = max(1, min(jobs, len(todo)))
    pool = ProcessPoolExecutor(max_workers=procs, initializer=_ignore_sigint)
    pending: dict[Future, dict] = {}

    def collect(fut: Future, r: dict) -> None:
        try:
            rec = fut.result()
        except BrokenProcessPool:
            raise  # a worker died (killed, out of memory): no run is to blame for sure
        except Exception as e:  # a crash in one run must not lose the others
            rec = runs.failed(r, f"{type(e).__name__}: {e}")
        finish(r, rec)

    try:
        for r in todo:
            gs = cfg.graphs[r["graph_index"]]
            cl = cfg.clusters[r["cluster_index"]]
            workers = specs[r["method"]].cpus or max(1, cores // max(1, jobs))
            args = (r, gs.model_dump(by_alias=True), cl, str(base), str(bench), str(out))
            pending[pool.submit(_execute, *args, workers)] = r
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                collect(fut, pending[fut])
                del pending[fut]
    except KeyboardInterrupt:
        interrupted = True
        with sigint_deferred():
            for fut in pending:
                fut.cancel()
            for fut, r in list(pending.items()):
                ok = fut.done() and not fut.cancelled() and fut.exception() is None
                if ok and r["id"] not in done:
                    collect(fut, r)  # finished while we were interrupted: keep it
            _stop_pool(pool)
    except BrokenProcessPool:
        broken = True
        _stop_pool(pool)
    except BaseException:
        _stop_pool(pool)
        raise
    else:
        pool.shutdown(wait=True)
    return SweepEnd(interrupted=interrupted, broken=broken)
