"""What a planner tells whoever watches it: the step it runs now and each new incumbent with
its proven bound. The command line's live line (:class:`solver.cli.progress.SolveProgress`) is
one such watcher; :data:`NULL_PROGRESS` is the one that ignores everything (the default)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives a planner's progress (seconds; ``inf`` / ``-inf``: no incumbent / no bound)."""

    def note(self, text: str) -> None:
        """Name the step that runs now."""

    def update(self, objective: float, bound: float, elapsed: float | None = None) -> None:
        """A new incumbent ``objective`` and proven ``bound``, ``elapsed`` seconds in."""


class NullProgress:
    """A :class:`Progress` that does nothing (usable as a context manager, like SolveProgress)."""

    def note(self, text: str) -> None:
        pass

    def update(self, objective: float, bound: float, elapsed: float | None = None) -> None:
        pass

    def __enter__(self) -> NullProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


NULL_PROGRESS = NullProgress()
