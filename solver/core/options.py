"""The search options every planner takes (time limit, seed, workers, memory), checked once.

Two wordings stay, as users and tests know them: the pipeline methods say "--seed must be an
integer in 0..N" (:func:`check_search_options`), the SPMD planner "--seed must be >= 0 and at
most N" (:func:`check_spmd_options`). The joint planner's checks are :func:`check_time_limit`
and :func:`checked_memory`.
"""

from __future__ import annotations

import math
from typing import Any

from solver.core.errors import MtppError
from solver.core.units import parse_memory

MAX_SEED = 2**31 - 1  # CP-SAT's random_seed is a 32-bit int
MAX_WORKERS = 1024


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_search_options(time_limit: Any, gap: Any, seed: Any, workers: Any) -> None:
    """Refuse a time limit, gap, seed or worker count no pipeline method can honour."""
    if not _number(time_limit) or time_limit <= 0:
        raise MtppError(f"--time-limit must be a finite number > 0 seconds, got {time_limit}")
    if not _number(gap) or not 0 <= gap < 1:
        raise MtppError(f"--gap must be a finite number in [0, 1), got {gap}")
    if not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise MtppError(f"--seed must be an integer in 0..{MAX_SEED}, got {seed}")
    if not isinstance(workers, int) or not 0 <= workers <= MAX_WORKERS:
        raise MtppError(f"--workers must be an integer in 0..{MAX_WORKERS}, got {workers}")


def check_spmd_options(time_limit: float, workers: int, seed: int) -> None:
    """Refuse a time limit, worker count or seed CP-SAT cannot take (its seed is 32-bit)."""
    if not math.isfinite(time_limit) or time_limit <= 0:
        raise MtppError(f"--time-limit must be a positive number of seconds, got {time_limit}")
    if not 0 <= workers <= MAX_WORKERS:
        raise MtppError(f"--workers must be >= 0 and at most {MAX_WORKERS}, got {workers}")
    if not 0 <= seed <= MAX_SEED:
        raise MtppError(f"--seed must be >= 0 and at most {MAX_SEED}, got {seed}")


def check_time_limit(time_limit: Any) -> None:
    """Refuse a time limit that is not a positive finite number (the joint planner's check)."""
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise MtppError(f"--time-limit must be a positive number of seconds, got {time_limit}")


def checked_memory(memory: Any) -> float | int | None:
    """A per-device memory limit in bytes: None (each device's capacity), a number, or a size
    such as "40GB" (parsed); a number that is not finite and > 0 is refused."""
    if memory is not None and not isinstance(memory, (int, float)):
        return parse_memory(memory)
    if memory is not None and not (0 < memory < math.inf):
        raise MtppError(f"--memory must be a finite size > 0, got {memory!r}")
    return memory
