"""Proofs that items cannot be packed into k bins: the engine of the bin-packing bounds.

An item has a ``size`` (it adds to the bin's load) and an ``act`` (the bin's peak is at least
the largest ``act`` among its items); a bin holds items whose loads plus peak stay within the
capacity. :func:`cannot_pack` returns True only with a proof that no packing into ``k`` bins
exists. Every step is a relaxation, so a proof for the relaxed items is a proof for the real:

- sizes, acts and the capacity are measured in integer units of ``delta``, items rounded
  DOWN and the capacity rounded down (a real packing stays a packing after rounding);
- items too small to matter become *fluid*: only their total volume must fit in the free
  space of all bins (splitting an item only makes packing easier), with one unit of rounding
  slack per bin;
- typed items with nearly equal sizes share a type whose size is the smallest member's.

The check is the volume bound first (instant), then an aggregated CP-SAT model with one
integer count per (bin, type), bins sorted by load; only CP-SAT's INFEASIBLE counts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.sat import new_solver

UNITS = 2**20  # capacity in integer units: rounding loses < (items per bin) / 2^20 of a bin
MAX_TYPES = 40  # coarser type grouping (still rounding down) above this many distinct types
FLUID = 1e-3  # items below this fraction of the capacity (size and act) are fluid
LO_PROBE_SECONDS = 0.1  # smallest_capacity's probe just above a proven bound (probe_lo)


@dataclass(frozen=True)
class Packing:
    """Item types for a capacity: counts, integer sizes and acts, fluid volume, units."""

    count: np.ndarray
    size: np.ndarray
    act: np.ndarray
    fluid: int  # total fluid volume in units, rounded down
    cap: int  # capacity in units, rounded down
    delta: float


def types_for(size: np.ndarray, act: np.ndarray, cap: float) -> Packing | None:
    """Group items into types for capacity ``cap``; None when one item alone cannot fit."""
    size = np.asarray(size, dtype=float)
    act = np.asarray(act, dtype=float)
    if cap < 0 or (len(size) and float((size + act).max()) > cap):
        return None  # an item alone does not fit (and every unit count below stays <= 2^20)
    delta = max(cap, 1e-300) / UNITS
    cap_u = int(math.floor(cap / delta))
    big = (size >= FLUID * cap) | (act >= FLUID * cap)
    fluid = int(math.floor(float(size[~big].sum()) / delta))
    s_u = np.floor(size[big] / delta).astype(np.int64)
    a_u = np.floor(act[big] / delta).astype(np.int64)
    if len(s_u) and int((s_u + a_u).max()) > cap_u:
        return None
    grid = 1
    while True:
        keys = np.stack([s_u // grid, a_u // grid], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        if len(uniq) <= MAX_TYPES:
            break
        grid *= 2
    inv = inv.reshape(-1)
    t = len(uniq)
    count = np.bincount(inv, minlength=t)
    ts = np.full(t, np.iinfo(np.int64).max)
    ta = np.full(t, np.iinfo(np.int64).max)
    np.minimum.at(ts, inv, s_u)
    np.minimum.at(ta, inv, a_u)
    return Packing(count, ts, ta, fluid, cap_u, delta)


def volume_excess(p: Packing, k: int) -> bool:
    """The volume bound: typed sizes + fluid exceed k bins (minus one unit of slack per bin)."""
    peak = int(p.act.max()) if len(p.act) else 0
    need = int((p.count * p.size).sum()) + p.fluid + peak
    return need > k * p.cap + k


def cannot_pack(
    size: np.ndarray,
    act: np.ndarray,
    cap: float,
    k: int,
    time_limit: float = 1.0,
    workers: int = 1,
) -> bool:
    """True only when it is proven that the items do not fit into ``k`` bins of ``cap``."""
    p = types_for(size, act, cap)
    if p is None:
        return True
    if volume_excess(p, k):
        return True
    if len(p.count) == 0 or time_limit <= 0:
        return False
    return _cpsat_infeasible(p, k, time_limit, workers)


def import_cpsat() -> None:
    """Load OR-Tools' CP-SAT now (a caller that times its own work loads it first)."""
    # imported here: OR-Tools' cp_model pulls in pandas (about a second of start-up), and
    # most bound runs stop before any packing needs CP-SAT
    import ortools.sat.python.cp_model  # noqa: F401


def _cpsat_infeasible(p: Packing, k: int, time_limit: float, workers: int) -> bool:
    """CP-SAT on counts n[b, t]: per bin load + max act of present types <= cap; the free
    space of all bins holds the fluid volume (one unit of slack per bin for its rounding)."""
    # imported here: OR-Tools' cp_model pulls in pandas (about a second of start-up), and
    # most bound runs stop before any packing needs CP-SAT
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    T, cap = len(p.count), p.cap
    counts = []  # counts[b][t]: items of type t in bin b
    free = []
    prev = None
    for _ in range(k):
        n = [m.new_int_var(0, int(min(p.count[t], cap // max(1, p.size[t]))), "") for t in range(T)]
        peak = m.new_int_var(0, cap, "")
        for t in range(T):
            if p.act[t] > 0:
                y = m.new_bool_var("")
                m.add(n[t] <= int(p.count[t]) * y)
                m.add(peak >= int(p.act[t]) * y)
        used = m.new_int_var(0, cap, "")
        m.add(used == sum(int(p.size[t]) * n[t] for t in range(T)) + peak)
        if prev is not None:
            m.add(prev >= used)  # bins sorted by use: breaks the symmetry of identical bins
        prev = used
        free.append(cap - used)
        counts.append(n)
    for t in range(T):
        m.add(sum(counts[b][t] for b in range(k)) == int(p.count[t]))
    m.add(sum(free) + k >= p.fluid)
    solver = new_solver(time_limit, {"num_workers": workers})
    return solver.solve(m) == cp_model.INFEASIBLE


def smallest_capacity(
    size: np.ndarray,
    act: np.ndarray,
    k: int,
    lo: float,
    hi: float,
    time_limit: float = 5.0,
    rel_tol: float = 1e-5,
    probe_lo: bool = False,
) -> float:
    """The largest capacity in [lo, hi] proven too small for ``k`` bins (``lo`` if none).

    Bisection; every probe is a proof or is treated as feasible, so the result is always a
    capacity at which no packing exists (or ``lo`` itself, which the caller vouches for).
    ``probe_lo``: first try just above ``lo`` with a short probe, and stop there when it
    proves nothing (a packing at ``lo`` leaves nothing above it to prove; used when ``lo``
    is already a proven bound, so a search that cannot pass it costs no more time).
    """
    t_end = time.perf_counter() + time_limit
    best = lo
    if not hi > lo:
        return lo
    if cannot_pack(size, act, hi, k, 0.0):
        return hi
    if probe_lo:
        just_above = lo * (1 + rel_tol) if lo > 0 else rel_tol * hi
        probe = min(time_limit / 4, LO_PROBE_SECONDS)
        if just_above >= hi or not cannot_pack(size, act, just_above, k, probe):
            return lo
        best = just_above
    while hi - best > rel_tol * max(hi, 1e-300):
        left = t_end - time.perf_counter()
        if left <= 0:
            break
        mid = 0.5 * (best + hi)
        probe = min(left, max(0.05, time_limit / 8))
        if cannot_pack(size, act, mid, k, probe):
            best = mid
        else:
            hi = mid
    return best
