"""The Ray backend of ``mtpp experiment``: every run is a Ray task asking for its CPUs.

Without an address a local Ray instance is started (all the machine's cores, no dashboard,
quiet logs, no usage statistics) and stopped at the end; with one, the driver joins that
cluster. A Ray session already running in this process (a notebook, the tests) is used as it is.

Workers may be other machines, so they get no paths: each graph file (with the external data
of an ONNX model) and each cluster YAML file is read once on the driver and put into Ray's
object store as bytes; a task writes them into its own temporary folder, runs
:func:`solver.experiments.runs.solve_run` there and returns the record and the plan. The driver
writes every record and plan (atomically, at once), exactly as with the local backend.

A run that raises, outlives ``TIMEOUT_FACTOR * time_limit + TIMEOUT_GRACE`` seconds, or
whose worker is lost (after one retry by Ray) is recorded as failed with its reason; the sweep
goes on. Ctrl-C cancels every Ray task, records what finished and raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from solver.core.errors import MtppError
from solver.experiments import runs
from solver.experiments.config import cluster_ref, warn
from solver.experiments.store import sigint_deferred
from solver.frontends import is_onnx_file
from solver.frontends.onnx.common import external_locations

INSTALL_HINT = 'pip install "mtpp[ray]" (or pip install ".[ray]" in a clone of mtpp)'
CPSAT_MAX_CPUS = 8  # CP-SAT's default portfolio; more workers rarely help on these models
TIMEOUT_FACTOR = 2.0  # a run is stopped after factor * its time limit + grace seconds
TIMEOUT_GRACE = 120.0  # loading a large model or measuring work comes on top of the solve
POLL_SECONDS = 1.0  # how often the driver looks at time-outs and free CPUs
TASK_RETRIES = 1  # Ray re-runs a task once when its worker process or node is lost
CANCEL_SECONDS = 10.0  # how long Ctrl-C keeps cancelling tasks that have not stopped yet


def require_ray():
    """The ``ray`` module, or a one-line error saying how to install the optional extra."""
    try:
        import ray
    except ImportError:
        raise MtppError(f"--backend ray needs Ray, an optional extra: {INSTALL_HINT}") from None
    return ray


def probe_address(address: str) -> None:
    """Refuse an address that is malformed or where nothing listens, before Ray would retry
    the connection for minutes. 'auto' (the cluster started on this machine) is Ray's to find."""
    if address == "auto":
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MtppError(
            f"--address {address!r}: give HOST:PORT of the Ray head node (e.g. 10.0.0.1:6379), "
            "ray://HOST:10001, or 'auto'"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise MtppError(
            f"cannot reach the Ray head node at {address} ({e.strerror or e}); start it there "
            "with 'ray start --head', or fix --address"
        ) from None


# ---------------------------------------------------------------------- shipping files
def file_bundle(path: Path) -> dict:
    """A graph or cluster file as ``{"main": name, "files": {relative name: bytes}}``: the
    file itself and, for an ONNX model, the external data files beside it that it names."""
    path = Path(path)
    files = {path.name: path.read_bytes()}
    if is_onnx_file(path):
        for loc in _external_locations(path):
            target = (path.parent / loc).resolve()
            inside = path.parent.resolve() in target.parents
            if inside and target.is_file() and loc not in files:
                files[loc] = target.read_bytes()  # else the worker's checks report it
    return {"main": path.name, "files": files}


def _external_locations(path: Path) -> list[str]:
    """The relative locations of an ONNX model's external data (weights are not read)."""
    import onnx  # heavy: onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # a broken model: the worker's loader says what is wrong with it
        return []
    return [loc for loc in external_locations(model) if not os.path.isabs(loc)]


def unpack(bundle: dict, folder: Path) -> Path:
    """Write a :func:`file_bundle` into ``folder``; the path of its main file."""
    root = folder.resolve()
    for name, data in bundle["files"].items():
        target = (root / name).resolve()
        if root not in target.parents:
            raise MtppError(f"{name}: a shipped file must stay inside its folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root / bundle["main"]


def run_task(
    fn: Callable, desc: dict, gs_data: dict, graph: dict, cluster, cluster_file, workers: int
) -> dict:
    """The body of one Ray task, on a worker: the shipped files into a private temporary
    folder, ``fn`` (:func:`solver.experiments.runs.solve_run`) on them, the folder removed."""
    with tempfile.TemporaryDirectory(prefix="mtpp-run-") as tmp:
        path = unpack(graph, Path(tmp) / "graph")
        if cluster_file is not None:
            cluster = str(unpack(cluster_file, Path(tmp) / "cluster"))
        return fn(desc, gs_data, str(path), cluster, workers)


def _reason(e: BaseException) -> str:
    """One line saying why a Ray task failed: the exception it raised, or what Ray lost."""
    ray = require_ray()
    cause = getattr(e, "cause", None) if isinstance(e, ray.exceptions.RayTaskError) else None
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    lost = (
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.NodeDiedError,
        ray.exceptions.ObjectLostError,
        ray.exceptions.OwnerDiedError,
    )
    text = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, lost):
        return f"Ray worker lost ({type(e).__name__}): {text}"
    return f"{type(e).__name__}: {text}"


def _wait(refs: list, timeout: float) -> list:
    """The finished ones among ``refs`` (at least one, unless ``timeout`` passes first)."""
    ray = require_ray()
    ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
    if ready:  # take every other one that is ready too
        more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = list(dict.fromkeys([*ready, *more]))
    return ready


# ---------------------------------------------------------------------- the session
class RaySweep:
    """Context manager: a Ray session (started, joined, or the running one) that runs the
    sweep's tasks; see the module docstring."""

    def __init__(self, cfg, base: Path, bench: Path, address: str | None):
        self.cfg, self.base, self.bench, self.address = cfg, base, bench, address
        self._owned = False

    def __enter__(self) -> RaySweep:
        ray = require_ray()
        if self.address:
            probe_address(self.address)
        if ray.is_initialized():
            return self
        kw = {
            "include_dashboard": False,
            "logging_level": logging.ERROR,
            "log_to_driver": False,
        }
        where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
        try:
            if self.address:
                ray.init(address=self.address, **kw)
            else:  # our own instance: no usage statistics sent home unless the user asks
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(address="local", num_cpus=os.cpu_count() or 1, **kw)
        except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise MtppError(f"cannot start or join {where}: {first}") from None
        self._owned = True
        return self

    def __exit__(self, *exc) -> None:
        if self._owned:
            require_ray().shutdown()

    # ------------------------------------------------------------------ CPUs per run
    def node_cpus(self) -> int:
        """The CPUs of the largest live node: more than this, a task can never be placed."""
        nodes = [n for n in require_ray().nodes() if n.get("Alive")]
        return int(max((n.get("Resources", {}).get("CPU", 0) for n in nodes), default=0))

    def cpus_by_method(self) -> dict[str, int]:
        """CPUs each run asks for, by method label: the config's ``cpus:``, else for CP-SAT
        the largest node's cores (at most CPSAT_MAX_CPUS), else 1."""
        biggest = max(1, self.node_cpus())
        out = {}
        for m in self.cfg.method_specs():
            default = min(CPSAT_MAX_CPUS, biggest) if m.name == "cpsat" else 1
            out[m.label or m.name] = m.cpus or default
        return out

    def check_cpus(self) -> None:
        """Refuse a method asking for more CPUs than any node of the cluster has."""
        biggest = self.node_cpus()
        for i, m in enumerate(self.cfg.method_specs()):
            if m.cpus is not None and m.cpus > biggest:
                raise MtppError(
                    f"key 'methods.{i}.cpus': {m.cpus} CPUs per run, but the largest Ray node "
                    f"has {biggest}; such a task could never start"
                )

    # ------------------------------------------------------------------ running
    def _inputs(self, todo: list[dict], out: Path, finish) -> tuple[dict, dict]:
        """Object refs of every graph and cluster file the runs need (read once, on the
        driver). A graph that cannot be built fails its runs here, as on the local backend."""
        ray = require_ray()
        graphs: dict[int, object] = {}
        clusters: dict[int, object] = {}
        for gi in sorted({r["graph_index"] for r in todo}):
            try:
                path = runs.materialise(self.cfg.graphs[gi], self.base, self.bench, out)
                graphs[gi] = ray.put(file_bundle(path))
            except MtppError as e:
                graphs[gi] = e
            except OSError as e:
                graphs[gi] = MtppError(f"cannot read the graph file: {e}")
        for ci in sorted({r["cluster_index"] for r in todo}):
            c = self.cfg.clusters[ci]
            if isinstance(c, str) and c != "file":
                ref = cluster_ref(c, self.base)
                if Path(ref).is_file():
                    clusters[ci] = ray.put(file_bundle(Path(ref)))
        for r in todo:
            if isinstance(graphs[r["graph_index"]], MtppError):
                finish(r, runs.failed(r, str(graphs[r["graph_index"]]), 0.0))
        return graphs, clusters

    def run(self, todo: list[dict], out: Path, finish: Callable[[dict, dict], None]) -> bool:
        """Run ``todo`` as Ray tasks, handing every record to ``finish`` as it arrives.
        Returns True when Ctrl-C stopped the sweep (tasks cancelled, finished ones recorded)."""
        ray = require_ray()
        graphs, clusters = self._inputs(todo, out, finish)
        queue = [r for r in todo if not isinstance(graphs[r["graph_index"]], MtppError)]
        tasks = _Tasks(self, queue, graphs, clusters, finish)
        try:
            tasks.submit()
            while tasks.pending:
                for ref in _wait(list(tasks.pending), POLL_SECONDS):
                    tasks.collect(ref)
                tasks.time_out()
                self._stop(tasks.stopping)
                tasks.submit()
            self._cancel(tasks.stopping)
        except KeyboardInterrupt:
            with sigint_deferred():
                refs = list(tasks.pending)
                ready = ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else []
                for ref in ready:  # finished while we were interrupted: keep them
                    tasks.collect(ref)
                self._cancel({**tasks.pending, **tasks.stopping})
            return True
        except BaseException:
            self._cancel({**tasks.pending, **tasks.stopping})
            raise
        return False

    @staticmethod
    def _stop(stopping: dict) -> None:
        """Cancel the timed-out tasks again (a cancel can be lost while a task is placed on a
        worker); forget those that reported back."""
        if not stopping:
            return
        ray = require_ray()
        refs = list(stopping)
        for ref in ray.wait(refs, num_returns=len(refs), timeout=0)[0]:
            del stopping[ref]
        for ref in stopping:
            with contextlib.suppress(Exception):  # finished, or its node is gone
                ray.cancel(ref, force=True)

    @staticmethod
    def _cancel(pending: dict) -> None:
        """Stop every pending task (queued or running) without waiting for its result. A
        cancel can be lost while a task is being placed on a worker, so it is repeated until
        every task reports back (cancelled or finished), for at most CANCEL_SECONDS."""
        ray = require_ray()
        refs = list(pending)
        pending.clear()
        deadline = time.monotonic() + CANCEL_SECONDS
        while refs:
            for ref in refs:
                with contextlib.suppress(Exception):  # finished, or its node is gone
                    ray.cancel(ref, force=True)
            ready, refs = ray.wait(refs, num_returns=len(refs), timeout=0.5)
            if refs and time.monotonic() > deadline:
                warn(f"{len(refs)} Ray task(s) did not stop when cancelled; they run to the end")
                return


# ---------------------------------------------------------------------- the tasks of one sweep
def _limit(r: dict) -> float:
    """Seconds after which the run's task is stopped."""
    return TIMEOUT_FACTOR * r["time_limit"] + TIMEOUT_GRACE


@dataclass
class _Submitted:
    """A run whose Ray task is submitted, and when it times out (time.monotonic)."""

    run: dict
    deadline: float


class _Tasks:
    """The Ray tasks of one sweep, on the driver: the queued runs, the submitted ones (by
    object ref) and the timed-out ones, cancelled until they report back."""

    def __init__(self, sweep: RaySweep, queue: list[dict], graphs: dict, clusters: dict, finish):
        self.sweep, self.queue, self.graphs, self.clusters = sweep, queue, graphs, clusters
        self.finish = finish
        self.cpus = sweep.cpus_by_method()
        self.fn = runs.solve_run  # looked up now: a test may replace it
        self.task = require_ray().remote(run_task)
        self.pending: dict[object, _Submitted] = {}
        self.stopping: dict[object, dict] = {}

    def submit(self) -> None:
        """Submit while the cluster has free CPUs (so a submitted task starts soon and its
        time-out counts from about its start); always at least one task."""
        cpus = self.cpus
        total = require_ray().cluster_resources().get("CPU", 0)
        used = sum(cpus[t.run["method"]] for t in self.pending.values())
        used += sum(cpus[r["method"]] for r in self.stopping.values())
        while self.queue and (not self.pending or used + cpus[self.queue[0]["method"]] <= total):
            r = self.queue.pop(0)
            n = cpus[r["method"]]
            ref = self.task.options(num_cpus=n, max_retries=TASK_RETRIES).remote(
                self.fn,
                r,
                self.sweep.cfg.graphs[r["graph_index"]].model_dump(by_alias=True),
                self.graphs[r["graph_index"]],
                self._cluster_spec(r),
                self.clusters.get(r["cluster_index"]),
                n,
            )
            self.pending[ref] = _Submitted(r, time.monotonic() + _limit(r))
            used += n

    def _cluster_spec(self, r: dict):
        """The run's cluster as the task takes it: inline, "file", or a preset or YAML path."""
        c = self.sweep.cfg.clusters[r["cluster_index"]]
        return c if isinstance(c, dict) or c == "file" else cluster_ref(c, self.sweep.base)

    def collect(self, ref) -> None:
        """Record a finished task; it stays pending until its result is in hand, so that
        Ctrl-C meanwhile still finds it."""
        r = self.pending[ref].run
        try:
            rec = require_ray().get(ref)
        except Exception as e:  # the run raised, or Ray lost its worker
            rec = runs.failed(r, _reason(e))
        del self.pending[ref]
        self.finish(r, rec)

    def time_out(self) -> None:
        """Record the tasks past their deadline as failed; they are cancelled from now on."""
        now = time.monotonic()
        for ref, t in list(self.pending.items()):
            if now > t.deadline:
                del self.pending[ref]
                self.stopping[ref] = t.run
                limit = _limit(t.run)
                self.finish(
                    t.run, runs.failed(t.run, f"timed out: stopped after {limit:g} s", limit)
                )
