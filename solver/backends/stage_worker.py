"""The code a spawned process of :mod:`solver.backends.run` runs: one pipeline stage, or the
echo that measures the queue bandwidth.

Kept apart from :mod:`solver.backends.run` so that a spawned process imports only this small
module (the run module imports the exporter, and with it onnx), not the exporter.
"""

from __future__ import annotations

import signal

STOP = "mtpp-stop"  # the end-of-run marker (compared by type: items are tuples or arrays)


def one_line(e: BaseException) -> str:
    """An exception as one short line (onnxruntime messages span several)."""
    text = " ".join(str(e).split()) or "no message"
    return f"{type(e).__name__}: {text[:400]}"


def stage_worker(
    index: int, path: str, outputs: list[str], keep_after: list[str], q_in, q_out, q_err
) -> None:
    """One stage: read a request, run the session, forward what later stages need.

    Ctrl-C reaches the whole process group; the driver decides what to do, so the stage ignores
    SIGINT. Any failure goes back to the driver as one line on ``q_err``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import onnxruntime as ort  # heavy: onnxruntime, only in the stage process

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        needs = [i.name for i in sess.get_inputs()]
        keep = set(keep_after)
        while True:
            item = q_in.get()
            if isinstance(item, str):
                q_out.put(STOP)
                return
            rid, env = item
            outs = sess.run(outputs, {x: env[x] for x in needs})
            env.update(zip(outputs, outs, strict=True))
            q_out.put((rid, {x: v for x, v in env.items() if x in keep}))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the driver
        q_err.put((index, one_line(e)))
        q_err.close()
        q_err.join_thread()


def echo(q_in, q_out) -> None:
    """Send back the first element of every array received, until the end-of-run marker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        item = q_in.get()
        if isinstance(item, str):
            q_out.put(STOP)
            return
        q_out.put(item[:1])
