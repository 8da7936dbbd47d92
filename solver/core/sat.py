"""What every CP-SAT model of the project shares (the block assignment, its tie-break, the
sharding model and the bin-packing bound): the coefficient ceiling and one way to make a solver.

OR-Tools 9.15 keeps linear activities in a 32-bit int in its ProcessAtMostOneAndLinear presolve
step and then certifies wrong optima (google/or-tools#5293; tests/test_exact.py keeps a 7-node
case that showed it). Every model keeps its coefficients below :data:`MAX_COEF`, and every
solver made by :func:`new_solver` has that presolve step switched off (the issue reports it is
often faster without it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

MAX_COEF = 2**30


def new_solver(time_limit: float, params: dict | None = None) -> cp_model.CpSolver:
    """A CP-SAT solver that stops after ``time_limit`` seconds, with the guard against
    google/or-tools#5293, then ``params`` (CP-SAT parameter name -> value) set in order."""
    from ortools.sat.python import cp_model  # heavy: ortools pulls pandas (about a second)

    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = time_limit
    p.presolve_inclusion_work_limit = 0
    for key, val in (params or {}).items():
        setattr(p, key, val)
    return solver


def search_params(workers: int, seed: int, gap: float = 0.0, log: bool = False) -> dict:
    """The CP-SAT parameters of the search options a user gives: ``workers`` (0: every core),
    ``seed``, ``gap`` (0: prove optimality) and ``log`` (CP-SAT's own search log)."""
    params = {
        "num_workers": workers or os.cpu_count() or 1,
        "random_seed": seed,
        "log_search_progress": log,
    }
    if gap > 0:
        params["relative_gap_limit"] = gap
    return params
