"""A real pipelined run of a plan on this machine: one process per stage, joined by queues.

Each stage process holds one onnxruntime session with one thread. Stages form a chain: a
request's tensors travel from stage to stage through bounded multiprocessing queues, and every
stage forwards the tensors later stages still need. The driver measures throughput (requests
per second over the steady part of the run) and the latency of a request alone in the
pipeline, and runs the unsplit model in one process with the same total number of threads for
comparison. The simulator's prediction uses node times measured on this machine
(``--work measured``) and the queue bandwidth measured here as the link bandwidth.

Whatever happens (a stage that raises or crashes, Ctrl-C, SIGTERM), the driver stops every
process it started, closes its queues (so no semaphore stays in ``/dev/shm``) and removes its
temporary folder; a failing stage ends the run with that stage's error on one line.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solver.backends.export import check_estimate, export_plan
from solver.backends.stage_worker import STOP, echo, one_line, stage_worker
from solver.core.errors import MtppError
from solver.frontends.onnx.ort import random_inputs
from solver.frontends.onnx.shapes import fix_dims

MAX_REQUESTS = 1_000_000  # a run pushes every request through real processes: beyond this, refuse
STALL_SECONDS = 300.0  # no request finished for this long while none failed: give up
_POLL = 0.05  # seconds between liveness checks while waiting on a queue


def check_requests(requests: int) -> None:
    """Refuse a request count that cannot make a useful run, before anything is allocated."""
    if requests < 3:
        raise MtppError(f"--requests must be >= 3, got {requests}")
    if requests > MAX_REQUESTS:
        raise MtppError(
            f"--requests {requests} is more than this machine can push through real processes "
            f"in a sensible time; use at most {MAX_REQUESTS:,}"
        )


@dataclass
class RunResult:
    stages: int
    requests: int
    throughput: float
    latency: float
    unsplit_throughput: float
    unsplit_latency: float
    queue_bandwidth: float
    input_shapes: dict[str, list[int]]  # the shapes fed, dynamic dims fixed by ``dims``

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def queue_bandwidth(megabytes: int = 8, repeats: int = 5) -> float:
    """Bytes per second through a multiprocessing queue between two processes."""
    ctx = mp.get_context("spawn")
    q_in, q_out, q_err = ctx.Queue(), ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=echo, args=(q_in, q_out), daemon=True)
    procs = _Processes([p], [q_in, q_out], q_err, ["queue echo"])
    with procs:
        data = np.zeros(megabytes * 2**20, np.uint8)
        procs.put(0, data[:10])
        procs.get()
        t0 = time.perf_counter()
        for _ in range(repeats):
            procs.put(0, data)
            procs.get()
        dt = time.perf_counter() - t0
        procs.stop()
    return 2 * repeats * data.nbytes / dt  # there and back


class _Processes:
    """Child processes joined by queues, with waits that notice a dead child.

    Used as a context manager: leaving it (normally, on an error, on Ctrl-C) terminates and
    then kills every child still alive, drains and closes every queue, and drops them so that
    their named semaphores are unlinked.
    """

    def __init__(self, procs: list, queues: list, errors, names: list[str]):
        self.procs, self.queues, self.errors, self.names = procs, queues, errors, names
        self.last_progress = time.monotonic()
        self.feeder_error: BaseException | None = None
        self.closing = False
        for q in queues:  # a failed background send becomes our error, not a printed trace
            q._on_queue_feeder_error = self._feeder_failed

    def _feeder_failed(self, e: BaseException, obj) -> None:
        if self.feeder_error is None and not self.closing:
            self.feeder_error = e

    def __enter__(self) -> _Processes:
        try:
            with _sigint_blocked():  # a child inherits the mask: no Ctrl-C while it imports
                for p in self.procs:
                    p.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check(self) -> None:
        """Raise the first failure a child reported, or the death of a silent child."""
        if self.feeder_error is not None:
            raise MtppError(f"sending a request failed: {one_line(self.feeder_error)}")
        try:
            index, message = self.errors.get_nowait()
        except queue.Empty:
            pass
        else:
            raise MtppError(f"{self.names[index]} failed: {message}")
        for i, p in enumerate(self.procs):
            if p.exitcode is not None and p.exitcode != 0:
                try:  # the error may still be on its way
                    index, message = self.errors.get(timeout=0.5)
                except queue.Empty:
                    raise MtppError(f"{self.names[i]} died ({_exit_reason(p.exitcode)})") from None
                raise MtppError(f"{self.names[index]} failed: {message}")
        if time.monotonic() - self.last_progress > STALL_SECONDS:
            raise MtppError(
                f"no request finished in {STALL_SECONDS:g} s and no stage failed; gave up"
            )

    def put(self, i: int, item) -> None:
        """Put on queue ``i``, waiting while it is full but never on a dead pipeline."""
        while True:
            self.check()
            try:
                self.queues[i].put(item, timeout=_POLL)
                return
            except queue.Full:
                continue

    def try_put(self, i: int, item) -> bool:
        try:
            self.queues[i].put_nowait(item)
            return True
        except queue.Full:
            return False

    def get(self, timeout: float | None = None):
        """The next item of the last queue; with ``timeout``, None when nothing came."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            self.check()
            try:
                item = self.queues[-1].get(timeout=_POLL)
            except queue.Empty:
                if end is not None and time.monotonic() >= end:
                    return None
                continue
            self.last_progress = time.monotonic()
            return item

    def stop(self) -> None:
        """Send the stop marker down the chain and wait until it comes out (bounded)."""
        self.put(0, STOP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if isinstance(self.get(timeout=1.0), str):
                break
        for p in self.procs:
            p.join(5)

    def close(self) -> None:
        """Stop every child (terminate, then kill), then end every queue's feeder thread.

        A feeder may be blocked writing into a full pipe whose reader died; closing our read
        end makes that write fail at once (the failure is dropped), so joining it cannot hang
        and the queues' semaphores are released with them.
        """
        self.closing = True
        with _no_interrupts():  # a second Ctrl-C must not cut the cleanup short (bounded)
            self._close()

    def _close(self) -> None:
        self.procs = [p for p in self.procs if p.pid is not None]  # the started ones
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        for q in [*self.queues, self.errors]:
            with contextlib.suppress(OSError):
                q._reader.close()
            q.close()
            _join_feeder(q)
        self.procs, self.queues, self.errors = [], [], None


def _join_feeder(q, timeout: float = 5.0) -> None:
    """End a closed queue's feeder thread without waiting forever.

    A Ctrl-C that lands inside ``Condition.notify`` of ``Queue.put`` leaves a stale waiter at
    the head of the condition (CPython's ``Condition`` is not interrupt-safe), so the close
    marker's single ``notify`` wakes nobody and ``join_thread`` would wait forever (seen once
    in about six Ctrl-Cs of ``mtpp run``). Wake every waiter until the thread ends; give up on
    it after ``timeout`` (a daemon thread cannot keep the process alive).
    """
    thread = getattr(q, "_thread", None)
    deadline = time.monotonic() + timeout
    while thread is not None and thread.is_alive() and time.monotonic() < deadline:
        with q._notempty:
            q._notempty.notify_all()
        thread.join(0.1)
    if thread is not None and thread.is_alive():
        q.cancel_join_thread()
    else:
        q.join_thread()


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Ignore SIGINT while inside (main thread only); it is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT while inside (main thread only): a Ctrl-C that arrives meanwhile is
    delivered when it is unblocked. A child started inside inherits the blocked signal across
    exec, so a stage still importing when Ctrl-C reaches the process group does not die with a
    traceback; once running it ignores SIGINT, and the driver stops it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while inside, so the same cleanup runs as for Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_pipeline(
    model_path: Path,
    folder: Path,
    report: dict,
    requests: int = 50,
    seed: int = 0,
    dims: dict[str, int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Run the exported stages of ``report`` (from :func:`export_plan`) as a process chain.

    ``dims`` fixes the model's dynamic input dims for the random inputs, as in the export;
    ``progress(n)`` is called after each of the ``requests`` timed requests finished.
    """
    import onnx  # heavy: onnx

    check_requests(requests)
    stages = [st for st in report["stages"] if st["file"]]
    model = onnx.load(str(model_path), load_external_data=False)
    fix_dims(model, dict(dims or {}))
    feeds = random_inputs(model, seed=seed)
    pipe = _stage_chain(folder, stages, report["graph_outputs"])
    with _sigterm_as_interrupt(), pipe:
        timed = _pipelined(pipe, feeds, requests, 4 * len(stages) + 4, progress)
        pipe.stop()
    single = _unsplit_seconds(model_path, feeds, requests, threads=len(stages))
    return RunResult(
        stages=len(stages),
        requests=requests,
        throughput=timed.throughput,
        latency=float(np.median(timed.latencies)),
        unsplit_throughput=1.0 / single,
        unsplit_latency=single,
        queue_bandwidth=queue_bandwidth(),
        input_shapes={x: list(v.shape) for x, v in feeds.items()},
    )


def _stage_chain(folder: Path, stages: list[dict], outputs: list[str]) -> _Processes:
    """One spawned process per stage (not started yet), joined by queues: bounded queues
    between stages; the last one is unbounded and the driver keeps at most a window of
    requests in flight, so no put can wait forever on a live pipeline."""
    keep = []  # after stage i: what stages i+1.. or the model outputs still need
    for i in range(len(stages)):
        later = {x for st in stages[i + 1 :] for x in st["inputs"]} | set(outputs)
        keep.append(sorted(later))
    ctx = mp.get_context("spawn")
    queues = [ctx.Queue(maxsize=4) for _ in stages] + [ctx.Queue()]
    errors = ctx.Queue()
    procs = [
        ctx.Process(
            target=stage_worker,
            daemon=True,
            args=(
                i,
                str(folder / st["file"]),
                st["outputs"],
                keep[i],
                queues[i],
                queues[i + 1],
                errors,
            ),
        )
        for i, st in enumerate(stages)
    ]
    names = [f"stage {st['stage']} ({st['file']})" for st in stages]
    return _Processes(procs, queues, errors, names)  # it owns them: closing it releases them


@dataclass
class _Timed:
    """What the driver measured on the running pipeline."""

    latencies: list[float]  # seconds of a request alone in the pipeline (warm-up dropped)
    finished: list[float]  # perf_counter time each timed request came out

    @property
    def throughput(self) -> float:
        """Requests per second over the second half of the run (the steady part)."""
        done = self.finished
        half = len(done) // 2
        return (len(done) - 1 - half) / (done[-1] - done[half]) if len(done) > 2 else math.nan


def _pipelined(pipe: _Processes, feeds: dict, requests: int, window: int, progress) -> _Timed:
    """Warm-up and unloaded latency (one request alone, a few times), then ``requests``
    requests with the pipeline kept full, at most ``window`` in flight."""
    lat = []
    for r in range(6):
        t0 = time.perf_counter()
        pipe.put(0, (r, feeds))
        pipe.get()
        if r:
            lat.append(time.perf_counter() - t0)
    done: list[float] = []
    sent = 0
    while len(done) < requests:
        if sent < requests and sent - len(done) < window and pipe.try_put(0, (sent, feeds)):
            sent += 1
            continue
        if pipe.get(timeout=_POLL) is not None:
            done.append(time.perf_counter())
            if progress is not None:
                progress(len(done))
    return _Timed(lat, done)


def _unsplit_seconds(model_path: Path, feeds: dict, requests: int, threads: int) -> float:
    """Seconds per request of the unsplit model: one process, ``threads`` threads."""
    import onnxruntime as ort  # heavy: onnxruntime

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        t0 = time.perf_counter()
        for _ in range(requests):
            sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types
        raise MtppError(f"{model_path}: the unsplit model failed: {one_line(e)}") from None
    return (time.perf_counter() - t0) / requests


def run_plan(
    model_path: str | Path,
    g,
    assignment,
    dims=None,
    requests: int = 50,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    memory_ok: bool = False,
    placement=None,
) -> RunResult:
    """Export the plan into a temporary folder and run it (see :func:`run_pipeline`); the
    folder is removed however the run ends. ``placement`` (the device of each block) goes to
    :func:`solver.backends.export.export_plan`; here every stage is one alike process.

    Before anything is written, the memory the run needs (every stage's weights and
    activations at once, then the unsplit model; :func:`solver.backends.export.memory_estimate`)
    is checked against the memory available, unless ``memory_ok``. Weights in external data
    are copied into the folder (holes skipped) so that every stage session finds them.
    """
    def fits(estimate: dict) -> None:
        if not memory_ok:
            check_estimate(
                estimate,
                "run",
                "run (every stage process at once, then the unsplit model)",
                "pass --memory-ok to run it anyway, or run on a machine with more memory",
            )

    check_requests(requests)
    with _sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="mtpp-run-") as tmp:
        out = Path(tmp) / "stages"
        report = export_plan(
            model_path, g, assignment, out, dims=dims, before_write=fits, placement=placement
        )
        return run_pipeline(
            Path(model_path),
            out,
            report,
            requests=requests,
            seed=seed,
            dims=dims,
            progress=progress,
        )
