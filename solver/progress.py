"""Progress of long solves on stderr: incumbent, bound, gap and elapsed time (rich)."""

from __future__ import annotations

import math
import sys
import time


class SolveProgress:
    """Context manager showing one live status line on stderr; silent when disabled."""

    def __init__(self, enabled: bool, title: str):
        from solver.cli.common import esc

        self.enabled = enabled and sys.stderr is not None
        self.title = esc(title)  # holds a graph name: printed through rich
        self.best = math.inf
        self.bound = -math.inf
        self._status = None
        self._last = 0.0

    def __enter__(self) -> SolveProgress:
        if self.enabled:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
            self._status = self._console.status(f"{self.title}: starting")
            self._status.__enter__()
            self._t0 = self._last = time.perf_counter()
        return self

    def note(self, text: str) -> None:
        """Say which step runs now (a warm start, building a model) before any incumbent; when
        stderr is not a terminal, as a plain line at most every 5 s (quick runs stay silent)."""
        if self._status is not None:
            self._status.update(f"{self.title}: {text}")
            now = time.perf_counter()
            if not self._console.is_terminal and now - self._last > 5:
                self._console.print(f"{self.title}: {text} (elapsed {now - self._t0:.1f}s)")
                self._last = now

    def update(self, objective: float, bound: float, elapsed: float) -> None:
        if not self.enabled:
            return
        if objective < self.best:
            self.best = objective
        if bound > self.bound:
            self.bound = bound
        gap = (
            (self.best - self.bound) / self.best
            if math.isfinite(self.best) and self.best
            else math.nan
        )
        text = (
            f"{self.title}: incumbent {self.best:.6g}  bound {self.bound:.6g}  "
            f"gap {100 * gap:.3g}%  elapsed {elapsed:.1f}s"
        )
        if self._status is not None:
            self._status.update(text)
        now = time.perf_counter()
        if not self._console.is_terminal and now - self._last > 5 and math.isfinite(self.best):
            self._console.print(text)  # a log line now and then when stderr is not a terminal
            self._last = now

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


class RunProgress:
    """A progress bar of finished runs on stderr (rich); a plain line per run when stderr is
    not a terminal; silent when disabled."""

    def __init__(self, enabled: bool, total: int, done: int = 0):
        self.enabled = enabled and sys.stderr is not None
        self.total, self.done = total, done

    def __enter__(self) -> RunProgress:
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
                TimeElapsedColumn(),
                console=self._console,
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("runs", total=self.total, completed=self.done)
        return self

    def advance(self, text: str) -> None:
        self.done += 1
        if self.enabled:
            self._bar.update(self._task, advance=1, description=text[:60])
            if not self._console.is_terminal:
                self._console.print(f"[{self.done}/{self.total}] {text}")

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.__exit__(*exc)
