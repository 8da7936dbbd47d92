"""Progress of long solves on stderr (rich); experiment sweeps have solver/experiments/progress.py.

A solve shows its incumbent, bound, gap, elapsed time and time limit. On a terminal that is
one live line redrawn in place. Otherwise (a pipe, a log file, a CI job) it is plain lines:
none in the first :data:`FIRST_LINE_DELAY` seconds, so that a quick run stays silent and a
command that fails quickly still prints exactly one line on stderr; then one at once, one on
each better incumbent (at most one per :data:`MIN_LINE_GAP`), and one every
:data:`LINE_INTERVAL` seconds while nothing improves.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable

from solver.core.text import CONTROL_CHARS
from solver.core.units import format_time

FIRST_LINE_DELAY = 2.0  # seconds of silence before the first plain line
MIN_LINE_GAP = 1.0  # seconds between two plain lines, also for improvements
LINE_INTERVAL = 5.0  # seconds between plain lines while nothing improves
TICK = 0.25  # seconds between two checks of the clock by the background thread


def _seconds(x: float) -> str:
    """A duration of the search, to a tenth of a second."""
    return f"{x:.1f} s" if x < 100 else f"{x:.0f} s"


class SolveProgress:
    """Context manager showing a solve's progress on stderr; silent when disabled. A
    :class:`solver.core.progress.Progress`: planners report to it through ``note`` and ``update``.

    ``note(text)`` names the step that runs now (a warm start, a model build);
    ``update(objective, bound)`` feeds an incumbent and a proven bound in seconds (the best of
    each is kept, so a callback may pass ``inf`` or ``-inf`` for "none yet"). It is thread
    safe: CP-SAT calls it from its workers. ``console`` and ``clock`` are for tests.
    """

    def __init__(
        self,
        enabled: bool,
        title: str,
        time_limit: float | None = None,
        *,
        console=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.enabled = enabled and (console is not None or sys.stderr is not None)
        self.title = CONTROL_CHARS.sub("?", title)  # holds a graph name: printed as plain text
        self.time_limit = time_limit
        self.best = math.inf
        self.bound = -math.inf
        self.stage: str | None = None
        self.printed = 0  # plain lines printed so far
        self._console = console
        self._clock = clock
        self._lock = threading.RLock()
        self._t0 = clock()
        self._last: float | None = None  # when the last plain line was printed
        self._changed = False  # something changed since the last plain line
        self._improved = False  # the incumbent improved since the last plain line
        self._live = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ context
    def __enter__(self) -> SolveProgress:
        if not self.enabled:
            return self
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        self._t0 = self._clock()
        if self._console.is_terminal:
            from rich.live import Live
            from rich.spinner import Spinner

            self._spinner = Spinner("dots")
            # stdout is left alone: with --json it holds the JSON object and nothing else
            self._live = Live(
                console=self._console,
                transient=True,
                refresh_per_second=4,
                redirect_stdout=False,
                redirect_stderr=False,
                get_renderable=self._render,
            )
            self._live.__enter__()
        elif self._clock is time.monotonic:  # a fake clock is driven by tick() in tests
            self._ticker = threading.Thread(target=self._tick_loop, daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self.enabled:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._live is not None:
            self._live.__exit__(exc_type, *exc)
            return
        with self._lock:
            # the last state, unless nothing was printed yet (a quick run stays silent)
            if exc_type is None and self._last is not None and self._changed:
                self._print()

    # ------------------------------------------------------------------ feeding
    def note(self, text: str) -> None:
        """Name the step that runs now (shown until the next incumbent or bound)."""
        if not self.enabled:
            return
        with self._lock:
            self.stage = CONTROL_CHARS.sub("?", text)
            self._changed = True
            self._poll()

    def update(self, objective: float, bound: float, elapsed: float | None = None) -> None:
        """A new incumbent objective and proven bound in seconds (``inf`` / ``-inf``: none).
        ``elapsed`` is ignored: the time shown is measured from the start of this progress,
        which covers the warm start too."""
        if not self.enabled:
            return
        with self._lock:
            if objective < self.best:  # False for NaN
                self.best = objective
                self._improved = self._changed = True
            if bound > self.bound:
                self.bound = bound
                self._changed = True
            self.stage = None
            self._poll()

    def tick(self) -> None:
        """Look at the clock: print a plain line when one is due (the background thread
        calls this a few times a second; tests with a fake clock call it directly)."""
        if self.enabled:
            with self._lock:
                self._poll()

    # ------------------------------------------------------------------ showing
    def elapsed(self) -> float:
        return self._clock() - self._t0

    def gap(self) -> float | None:
        """(incumbent - bound) / incumbent, or None without both; never negative."""
        if not (math.isfinite(self.best) and math.isfinite(self.bound)) or self.best <= 0:
            return None
        return max(0.0, (self.best - self.bound) / self.best)

    def line(self) -> str:
        """The current state in one line of plain text."""
        parts = []
        if self.stage:
            parts.append(self.stage)
        if math.isfinite(self.best):
            parts.append(f"incumbent {format_time(self.best)}")
            if math.isfinite(self.bound):
                parts.append(f"bound {format_time(self.bound)}")
                gap = self.gap()
                if self.bound > self.best * (1 + 1e-9) + 1e-15:
                    parts.append("gap - (the bound exceeds the incumbent: please report this)")
                elif gap is not None:
                    parts.append(f"gap {100 * gap:.3g}%")
        elif not self.stage:
            parts.append("starting")
        when = _seconds(self.elapsed())
        if self.time_limit is not None and math.isfinite(self.time_limit):
            when += f" of {self.time_limit:g} s"
        parts.append(f"({when})")
        return f"{self.title}: " + "  ".join(parts)

    def _render(self):
        from rich.text import Text

        with self._lock:
            self._spinner.update(text=Text(self.line(), no_wrap=True, overflow="ellipsis"))
        return self._spinner

    def _poll(self) -> None:
        """Print a plain line when one is due (called with the lock held)."""
        if self._live is not None:
            return  # the live line redraws itself
        now = self._clock()
        if now - self._t0 < FIRST_LINE_DELAY:
            return
        if self._last is None:
            due = True
        elif self._improved:
            due = now - self._last >= MIN_LINE_GAP
        else:
            due = now - self._last >= LINE_INTERVAL
        if due:
            self._print()

    def _print(self) -> None:
        self._console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
        self._last = self._clock()
        self._changed = self._improved = False
        self.printed += 1

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK):
            self.tick()
