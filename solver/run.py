"""A real pipelined run of a plan on this machine: one process per stage, joined by queues.

Each stage process holds one onnxruntime session with one thread. Stages form a chain: a
request's tensors travel from stage to stage through bounded multiprocessing queues, and every
stage forwards the tensors later stages still need. The driver measures throughput (requests
per second over the steady part of the run) and the latency of a request alone in the
pipeline, and runs the unsplit model in one process with the same total number of threads for
comparison. The simulator's prediction uses node times measured on this machine
(``--work measured``) and the queue bandwidth measured here as the link bandwidth.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_STOP = None


def _stage_worker(path: str, outputs: list[str], keep_after: list[str], q_in, q_out) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    needs = [i.name for i in sess.get_inputs()]
    keep = set(keep_after)
    while True:
        item = q_in.get()
        if item is _STOP:
            q_out.put(_STOP)
            return
        rid, env = item
        outs = sess.run(outputs, {x: env[x] for x in needs})
        env.update(zip(outputs, outs, strict=True))
        q_out.put((rid, {x: v for x, v in env.items() if x in keep}))


@dataclass
class RunResult:
    stages: int
    requests: int
    throughput: float
    latency: float
    unsplit_throughput: float
    unsplit_latency: float
    queue_bandwidth: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def queue_bandwidth(megabytes: int = 8, repeats: int = 5) -> float:
    """Bytes per second through a multiprocessing queue between two processes."""
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_echo, args=(q_in, q_out), daemon=True)
    p.start()
    data = np.zeros(megabytes * 2**20, np.uint8)
    q_in.put(data[:10])
    q_out.get()
    t0 = time.perf_counter()
    for _ in range(repeats):
        q_in.put(data)
        q_out.get()
    dt = time.perf_counter() - t0
    q_in.put(_STOP)
    p.join(5)
    return 2 * repeats * data.nbytes / dt  # there and back


def _echo(q_in, q_out) -> None:
    while True:
        item = q_in.get()
        if item is _STOP:
            return
        q_out.put(item[:1])


def run_pipeline(
    model_path: Path, folder: Path, report: dict, requests: int = 50, seed: int = 0
) -> RunResult:
    """Run the exported stages of ``report`` (from :func:`export_plan`) as a process chain."""
    import onnx
    import onnxruntime as ort

    from solver.io.onnx_profile import random_inputs

    stages = [st for st in report["stages"] if st["file"]]
    model = onnx.load(str(model_path), load_external_data=False)
    feeds = random_inputs(model, seed=seed)
    outputs = report["graph_outputs"]
    keep = []  # after stage i: what stages i+1.. or the model outputs still need
    for i in range(len(stages)):
        later = {x for st in stages[i + 1 :] for x in st["inputs"]} | set(outputs)
        keep.append(sorted(later))
    ctx = mp.get_context("spawn")
    queues = [ctx.Queue(maxsize=4) for _ in range(len(stages) + 1)]
    procs = [
        ctx.Process(
            target=_stage_worker,
            daemon=True,
            args=(str(folder / st["file"]), st["outputs"], keep[i], queues[i], queues[i + 1]),
        )
        for i, st in enumerate(stages)
    ]
    for p in procs:
        p.start()
    try:
        # warm-up and unloaded latency: one request alone in the pipeline, a few times
        lat = []
        for r in range(6):
            t0 = time.perf_counter()
            queues[0].put((r, dict(feeds)))
            queues[-1].get()
            if r:
                lat.append(time.perf_counter() - t0)
        # throughput: keep the pipeline full (bounded queues throttle the driver)
        done = []
        import threading

        def collect() -> None:
            for _ in range(requests):
                queues[-1].get()
                done.append(time.perf_counter())

        th = threading.Thread(target=collect)
        th.start()
        for r in range(requests):
            queues[0].put((r, dict(feeds)))
        th.join()
        queues[0].put(_STOP)
        queues[-1].get()
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    half = len(done) // 2
    thr = (len(done) - 1 - half) / (done[-1] - done[half]) if len(done) > 2 else float("nan")
    # the unsplit model: one process, as many threads as there are stages
    so = ort.SessionOptions()
    so.intra_op_num_threads = len(stages)
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(requests):
        sess.run(None, feeds)
    single = (time.perf_counter() - t0) / requests
    return RunResult(
        stages=len(stages),
        requests=requests,
        throughput=thr,
        latency=float(np.median(lat)),
        unsplit_throughput=1.0 / single,
        unsplit_latency=single,
        queue_bandwidth=queue_bandwidth(),
    )


def run_plan(
    model_path: str | Path, g, assignment, dims=None, requests: int = 50, seed: int = 0
) -> RunResult:
    """Export the plan into a temporary folder and run it (see :func:`run_pipeline`)."""
    from solver.io.onnx_export import export_plan

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stages"
        report = export_plan(model_path, g, assignment, out, dims=dims)
        return run_pipeline(Path(model_path), out, report, requests=requests, seed=seed)
