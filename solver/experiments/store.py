"""The results folder of an experiment: which folder may be used, the runs it has recorded,
``results.jsonl`` kept in agreement with ``runs/``, and one finished run written at once and
atomically (``runs/<id>.json``, its plan in ``plans/<id>.json``, one line of results.jsonl),
with Ctrl-C held back meanwhile. Only the driver writes here; workers never do.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path

from solver.core.errors import MtppError
from solver.core.files import check_output_dir, write_json_atomic
from solver.experiments.config import warn


def check_output(out: Path, inputs: list[Path], resume: bool) -> None:
    """Refuse an output folder that is an input, holds one, is the current folder or a parent;
    a non-empty folder only with --resume, and only if it is an experiment's folder."""
    check_output_dir(out, inputs, force=True, what="--output")
    if out.is_dir() and any(out.iterdir()):
        if not resume:
            raise MtppError(
                f"{out}: folder exists and is not empty; pass --resume to continue the "
                "experiment in it, or choose another --output"
            )
        if not (out / "runs").is_dir() and not (out / "results.jsonl").is_file():
            raise MtppError(
                f"{out}: not an experiment's results folder (no runs/ or results.jsonl); "
                "choose another --output"
            )


def load_done(out: Path) -> dict[str, dict]:
    """The recorded runs (runs/<id>.json); an unreadable record is dropped with a warning, so
    that its run is done again."""
    done = {}
    for p in sorted((out / "runs").glob("*.json")):
        try:
            rec = json.loads(p.read_text())
            if not isinstance(rec, dict) or rec.get("id") != p.stem or "status" not in rec:
                raise ValueError("not a run record")
        except (OSError, ValueError) as e:
            reason = "empty" if p.stat().st_size == 0 else f"{type(e).__name__}"
            warn(f"{p}: unreadable record ({reason}); that run is done again")
            continue
        done[p.stem] = rec
    return done


def repair_log(out: Path, done: dict[str, dict], redo: set[str]) -> None:
    """Make results.jsonl agree with runs/: drop torn lines (Ctrl-C while appending) and the
    lines of runs about to be done again, add recorded runs it misses; keep every other line."""
    log = out / "results.jsonl"
    kept, seen, torn, dropped = [], set(), 0, 0
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            try:
                rid = json.loads(line)["id"]
            except (ValueError, KeyError, TypeError):
                torn += 1
                continue
            if rid in redo or rid in seen:
                dropped += 1
                continue
            seen.add(rid)
            kept.append(line)
    if torn:
        warn(f"{log}: dropped {torn} torn line(s); it lists the recorded runs again")
    missing = [i for i in sorted(done) if i not in seen]
    if not (torn or dropped or missing):
        return
    tmp = log.with_name(".results.jsonl.tmp")
    with open(tmp, "w") as fh:
        for line in kept + [json.dumps(done[i]) for i in missing]:
            fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, log)


def record(out: Path, rec: dict) -> dict:
    """Write one finished run: its plan (``_plan``, taken out of the record) and runs/<id>.json
    atomically, then one line of results.jsonl. Returns the record as written."""
    rec = dict(rec)
    plan = rec.pop("_plan", None)
    if plan is not None:
        write_json_atomic(out / "plans" / f"{rec['id']}.json", plan)
    write_json_atomic(out / "runs" / f"{rec['id']}.json", rec)
    with open(out / "results.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return rec


@contextlib.contextmanager
def sigint_deferred():
    """Hold Ctrl-C back while a record is written, so that no record is half written."""
    main = threading.current_thread() is threading.main_thread()
    if not main or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
