"""The options of a pipeline solve: the shared ones (:class:`SolveOptions`), each method's own
(:data:`METHOD_OPTIONS`, checked with the list of valid keys), and the memory a method's tables
would take, refused before allocating when it exceeds :func:`memory_budget`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.options import check_search_options
from solver.core.progress import NULL_PROGRESS, NullProgress, Progress
from solver.core.training import TrainingSpec
from solver.core.units import format_bytes
from solver.pipeline.heuristics.slicing import slice_table_bytes


@dataclass(frozen=True)
class Incumbent:
    """A valid plan known before the search: its objective and assignment (original graph;
    None with an infinite objective when no quick plan fits)."""

    objective: float
    assignment: np.ndarray | None
    seconds: float


@dataclass
class SolveOptions:
    """Options shared by the methods; ``extra`` holds method-specific ones.

    With ``progress`` the methods that report progress (cpsat, slicegraph) tell ``reporter``
    each step and each new incumbent with its bound (the command line passes its live line)."""

    time_limit: float = 60.0
    workers: int = 0
    seed: int = 0
    gap: float = 0.0
    progress: bool = False
    extra: dict = field(default_factory=dict)
    reporter: Progress = NULL_PROGRESS
    # a certified lower bound of this very problem (set by solve): cpsat stops at a plan meeting it
    certified_bound: float | None = None
    # the warm-start plan solve found before the bounds (cpsat starts from it)
    incumbent: Incumbent | None = None
    # seconds solve spent before the method (bounds, warm start): the tie-break's yardstick
    spent_before: float = 0.0
    # a training plan (schedule, microbatches, ...; objective the iteration time T); None:
    # inference, the bottleneck max f (docs/training.md)
    training: TrainingSpec | None = None

    def watcher(self) -> Progress:
        """Where a method reports its progress: ``reporter`` with ``progress``, else nobody
        (always :data:`NULL_PROGRESS` itself then, also for a copied or unpickled null one, so
        that a method can skip work only a watcher needs)."""
        if not self.progress or isinstance(self.reporter, NullProgress):
            return NULL_PROGRESS
        return self.reporter


# ---------------------------------------------------------------- option checking


@dataclass(frozen=True)
class OptionSpec:
    """One method option: its type, the values it accepts, and how to say so."""

    kind: type
    ok: Callable[[Any], bool] = lambda v: True
    rule: str = ""

    def describe(self) -> str:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        base = names.get(self.kind, "a JSON object")
        return f"{base} {self.rule}".strip()


def _int(lo: int, hi: int | None = None) -> OptionSpec:
    rule = f">= {lo}" if hi is None else f"in {lo}..{hi}"
    return OptionSpec(int, lambda v: v >= lo and (hi is None or v <= hi), rule)


def _frac(lo_open: bool, hi_open: bool) -> OptionSpec:
    rule = f"in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}"
    return OptionSpec(
        float,
        lambda v: (v > 0 if lo_open else v >= 0) and (v < 1 if hi_open else v <= 1),
        rule,
    )


METHOD_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    "cpsat": {
        "cpsat_params": OptionSpec(dict),
        "tie_break": OptionSpec(bool),
        "tie_break_seconds": OptionSpec(float, lambda v: v >= 0, ">= 0"),
    },
    "slicegraph": {
        "population": _int(2, 100_000),
        "generations": _int(0),
        "elite": _frac(True, False),
        "mutants": _frac(False, True),
        "bias": _frac(False, False),
    },
    "poprt": {
        "optimal_perf": OptionSpec(bool),
        "keep_per_step": _int(1),
        "keep_best": _int(1),
    },
    "manual": {"sharding": OptionSpec(str)},
    "idealdp": {"max_ideals": _int(1, 10_000_000)},
    "time": {},
    "params": {},
    "uniform": {},
    "brute": {},
}
# CP-SAT parameters the solver sets itself for soundness or for --time-limit
RESERVED_CPSAT = {
    "presolve_inclusion_work_limit": "it guards against google/or-tools#5293 (wrong optima)",
    "max_time_in_seconds": "use --time-limit",
    "relative_gap_limit": "use --gap",
    "num_workers": "use --workers",
    "random_seed": "use --seed",
    "log_search_progress": "CP-SAT's log would mix with mtpp's output on stdout",
    "log_to_stdout": "CP-SAT's log would mix with mtpp's output on stdout",
}


def _type_ok(kind: type, v: Any) -> bool:
    if kind is bool:
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if kind is float:
        return isinstance(v, (int, float)) and math.isfinite(v)
    return isinstance(v, kind)


def check_method_options(method: str, extra: dict) -> dict:
    """The options of ``method`` checked against :data:`METHOD_OPTIONS` (floats as float).

    Raises :class:`MtppError` naming an unknown key (with the valid ones) or a wrong value.
    """
    specs = METHOD_OPTIONS.get(method, {})
    out = {}
    for key, value in extra.items():
        spec = specs.get(key)
        if spec is None:
            valid = f"valid: {', '.join(specs)}" if specs else "it takes no options"
            raise MtppError(f"unknown option {key!r} for {method}; {valid}")
        if not _type_ok(spec.kind, value) or not spec.ok(value):
            raise MtppError(
                f"option {key!r} for {method} must be {spec.describe()}, got {value!r}"[:300]
            )
        out[key] = float(value) if spec.kind is float else value
    if "cpsat_params" in out:
        _check_cpsat_params(out["cpsat_params"])
    return out


def _check_cpsat_params(params: dict) -> None:
    from ortools.sat.python import cp_model  # heavy: ortools (pulls pandas)

    probe = cp_model.CpSolver().parameters
    for key, value in params.items():
        if key in RESERVED_CPSAT:
            raise MtppError(f"cpsat_params: {key!r} cannot be set here; {RESERVED_CPSAT[key]}")
        try:
            setattr(probe, key, value)
        except AttributeError:
            raise MtppError(f"cpsat_params: {key!r} is not a CP-SAT parameter") from None
        except (TypeError, ValueError):
            raise MtppError(
                f"cpsat_params: {value!r} is not a valid value for {key!r}"[:300]
            ) from None


def check_solve_options(opts: SolveOptions) -> None:
    """Refuse a time limit, gap, seed or worker count no method can honour (the one check:
    :func:`solver.core.options.check_search_options`)."""
    check_search_options(opts.time_limit, opts.gap, opts.seed, opts.workers)


def memory_budget() -> int:
    """Bytes one solve may allocate: half of this machine's physical memory (8 GiB if unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def estimate_bytes(method: str, g: Graph, k: int, extra: dict) -> int:
    """Rough peak bytes ``method`` allocates on coarse graph ``g`` with k blocks (its largest
    tables: the slicing DP, BRKGA's population, CP-SAT's variables, the ideal DP)."""
    n = g.n
    if method in ("time", "params", "uniform", "poprt", "manual", "brute"):
        return 64 * n  # linear in n (brute checks its own k^n)
    need = slice_table_bytes(n, k)  # quick_assignment / every decode
    if method == "slicegraph":
        need += 24 * int(extra.get("population", 20)) * n
    elif method == "cpsat":
        need += 400 * 2 * (n + g.num_tensors + g.num_params) * k  # Python and C++ per variable
    elif method == "idealdp":
        cap = int(extra.get("max_ideals", 50_000))
        need += cap * (16 * (k + 1) + 2 * n)
    return need


def check_memory(method: str, g: Graph, k: int, extra: dict) -> None:
    """Refuse a run whose tables (:func:`estimate_bytes`) exceed :func:`memory_budget`."""
    need, budget = estimate_bytes(method, g, k, extra), memory_budget()
    if need > budget:
        raise MtppError(
            f"{method} on {g.n:,} nodes and {k:,} blocks would need about {format_bytes(need)} "
            f"of memory (the limit is {format_bytes(budget)}, half of this machine's); use fewer "
            "devices (--devices) or a linear-time method (time, params, uniform)"
        )
