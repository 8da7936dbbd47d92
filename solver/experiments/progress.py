"""Progress of an experiment sweep on stderr: runs done / total, failures, elapsed time and
the estimated time left (rich); one plain line per run when stderr is not a terminal."""

from __future__ import annotations

import sys
import time

from solver.core.text import esc


def _clock(seconds: float) -> str:
    """Seconds as H:MM:SS."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class SweepProgress:
    """Context manager: a progress bar of finished runs with the failure count and the time
    left; silent when disabled. ``done`` runs were finished before (a resumed sweep): they
    count as done but not in the time estimate."""

    def __init__(self, enabled: bool, total: int, done: int = 0):
        self.enabled = enabled and sys.stderr is not None
        self.total, self.done, self.failed = total, done, 0
        self._start_done = done
        self._t0 = time.perf_counter()

    def eta(self) -> float | None:
        """Seconds left at the rate of the runs finished in this session (None before one)."""
        new = self.done - self._start_done
        if new <= 0:
            return None
        return (time.perf_counter() - self._t0) / new * (self.total - self.done)

    def _fields(self) -> dict:
        eta = self.eta()
        return {
            "failed": f"{self.failed} failed" if self.failed else "",
            "eta": f"{_clock(eta)} left" if eta is not None else "-:--:-- left",
        }

    def __enter__(self) -> SweepProgress:
        self._t0 = time.perf_counter()
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._console = Console(stderr=True, highlight=False)
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("[red]{task.fields[failed]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                console=self._console,
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(
                "runs", total=self.total, completed=self.done, **self._fields()
            )
        return self

    def advance(self, text: str, failed: bool = False) -> None:
        """One more run finished (``failed``: it ended in ERROR); ``text`` says which."""
        self.done += 1
        self.failed += bool(failed)
        if self.enabled:
            fields = self._fields()
            self._bar.update(self._task, advance=1, description=esc(text[:60]), **fields)
            if not self._console.is_terminal:
                extra = f", {fields['failed']}" if fields["failed"] else ""
                self._console.print(
                    f"[{self.done}/{self.total}{extra}, {fields['eta']}] {esc(text)}"
                )

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.__exit__(*exc)
