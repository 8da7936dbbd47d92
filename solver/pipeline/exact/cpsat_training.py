"""The exact training plan as a CP-SAT model: least iteration time T under per-stage memory.

The inference model of :mod:`solver.pipeline.exact.cpsat` (order encoding, io, parameters
used, peak, overflow, placement on device classes) with its named steps replaced where
training differs (docs/training.md, "The CP-SAT model for T"):

- stage time ``t[b] >= f(b) + backward work(b) + io(b)``: the io terms of f once more (the
  gradients cross the same cuts back); on a cluster whose devices differ, per device class
  enforced by the class literal (backward work scaled by the class's compute, io on its links);
- objective ``A * sum_b t[b] + B * Tmax`` with ``Tmax >= t[b]``, integers A = v a, B = v b
  for T = a sum + b max (GPipe, 1F1B: 1 and m - 1; interleaved: 1 and m v - 1);
- empty blocks come FIRST (``used[b] => used[b + 1]``): every plan renumbers so, and a used
  block b is then the (k - b)-th stage from the end, so its in-flight count is a constant
  under GPipe (m) and 1F1B (min(m, k - b)) and the memory
  ``state * params + peak + inflight * stash <= C`` is linear; interleaved's count also
  depends on p: one Boolean ``is_p[r]`` per p, the memory posted per (block, r) under it;
- the cuts and the domain narrowing of the inference model with the stage time (work +
  backward work) in place of the work and Tmax in place of T; with a known T (``upper``), a
  plan no worse has Tmax <= (upper - a W2) / b (every stage costs at least its work), the
  cap the narrowing uses (none when b = 0), and the objective is cut at upper.

Integers: every time term is S times the real one rounded down and memory is in units
rounded down (a laxer model), so every plan's integer objective is at most S v T and CP-SAT's
proven bound divided by S v is a lower bound on the real T of every plan, with nothing to
subtract. The plan CP-SAT returns is re-priced by :func:`training_cost`; one that breaks the
real capacity (rounded-down memory) is never returned. ``resolution`` bounds how far the
rounded objective of a plan can fall below its real one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from solver.core.cluster import Cluster
from solver.core.cost import lower_bound
from solver.core.graph import Graph, coarse_view
from solver.core.progress import NULL_PROGRESS, Progress
from solver.core.result import OPTIMALITY_TOL, optimal_within
from solver.core.sat import MAX_COEF, new_solver, search_params
from solver.core.training import (
    TrainingCost,
    TrainingSpec,
    training_cost,
    training_lower_bound,
)
from solver.pipeline.exact.cpsat import (
    BIG_MODEL_VARS,
    BUILD_SHARE,
    TARGET_RANGE,
    _BuildTimeout,
    _Model,
    _wsum,
)
from solver.pipeline.placement import best_placement, device_classes

BOUND_SAFETY = 1e-12  # relative: the bound is reported this much low (float division)
NOT_SOLVED = "NOT_SOLVED"
HINT_SLACK = 2  # integer units: a real stage time rounded up, plus one for float error


@dataclass(frozen=True)
class TrainingCpsatResult:
    """What the CP-SAT training solve found and proved (times in seconds).

    ``assignment``: on the original graph, empty blocks first (None: no valid plan found);
    ``placement``: device of every block on a cluster whose devices differ (None: block b on
    device b); ``iteration_time``: T re-priced by :func:`training_cost` (inf: none);
    ``lower``: a proven lower bound on T over every plan of at most k blocks and every
    placement; ``optimal``: CP-SAT proved its integer optimum and T meets ``lower`` within
    the 1e-6 tolerance or the rounding ``resolution``; ``infeasible``: proven, no plan fits."""

    assignment: np.ndarray | None
    placement: np.ndarray | None
    iteration_time: float
    lower: float
    optimal: bool
    resolution: float
    infeasible: bool
    status: str
    seconds: float
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _Weights:
    """T = (A * sum t + B * max t) / divisor, with A, B and divisor whole numbers."""

    A: int
    B: int
    divisor: int

    @staticmethod
    def of(spec: TrainingSpec) -> _Weights:
        m, v = spec.microbatches, spec.virtual_stages
        if spec.schedule == "interleaved":
            return _Weights(1, m * v - 1, v)
        return _Weights(1, m - 1, 1)


@dataclass
class _Pick:
    """A priced plan of the original graph (blocks, devices of the blocks, its cost)."""

    blocks: np.ndarray
    devices: np.ndarray | None
    cost: TrainingCost

    @property
    def T(self) -> float:
        return self.cost.iteration_time if self.cost.valid else math.inf


class _TrainingModel(_Model):
    """The inference model with the training steps (module docstring)."""

    def __init__(self, g: Graph, cluster: Cluster, spec: TrainingSpec, upper: float, deadline):
        self.spec, self.w = spec, _Weights.of(spec)
        self.upper_T = upper
        self.caps: list[tuple[int, int | None, float]] = []  # (block, class or None, bytes)
        self.class_extra = [0] * cluster.devices  # training terms per block beyond f's
        super().__init__(g, cluster, None, deadline=deadline)
        self._add_training_memory()
        self.resolution = self._objective_error() / (self.S * self.w.divisor)

    # ------------------------------------------------------------------ scale
    def _choose_scale(self) -> None:
        """The inference scale's memory decisions, then S from the training range: the
        objective of any plan stays below TARGET_RANGE and every coefficient below MAX_COEF."""
        super()._choose_scale()
        g, cluster, spec = self.g, self.cluster, self.spec
        self.speed = (
            device_classes(cluster).compute / cluster.compute if self.placed else np.ones(1)
        )
        lo_s, hi_s = float(self.speed.min()), float(self.speed.max())
        io_lo = g.t_size / (float(self.link_bw.min()) if self.placed else cluster.link_bandwidth)
        total = float((g.work.sum() + g.backward_work.sum()) / lo_s + 4 * io_lo.sum())
        biggest = float(max(g.work.max(), g.backward_work.max()) / lo_s)
        biggest = max(biggest, float(io_lo.max(initial=0.0)))
        if self.use_over:
            Bm, M = cluster.slow_memory_bandwidth, self._smallest_fast_memory()
            mem_total = g.param_bytes_total + float(g.act.max())
            total += (mem_total - min(M, mem_total)) / Bm * self.k
            top = float(g.p_size.max(initial=0.0) + g.act.max()) / Bm
            biggest = max(biggest, top, self._largest_fast_memory() / Bm)
        S = TARGET_RANGE / (total * (self.w.A + self.w.B)) if total > 0 else 1.0
        self.S = S = min(S, MAX_COEF / biggest) if biggest > 0 else S
        self.w_int = np.floor(g.work * S / hi_s).astype(np.int64)
        self.wb_int = np.floor(g.backward_work * S / hi_s).astype(np.int64)
        self.io_int = np.floor(io_lo * S).astype(np.int64)
        if self.placed:
            self.w_class = [np.floor(g.work * S / s).astype(np.int64) for s in self.speed]
            self.wb_class = [np.floor(g.backward_work * S / s).astype(np.int64) for s in self.speed]
            self.max_f = int(max(w.sum() for w in self.w_class) + 2 * self.io_int.sum())
        self._choose_memory_unit(spec)

    def _smallest_fast_memory(self) -> float:
        if not self.placed:
            return self.cluster.fast_memory
        mem = self.classes.memory
        return float(mem[np.isfinite(mem)].min())

    def _largest_fast_memory(self) -> float:
        if not self.placed:
            return self.cluster.fast_memory
        mem = self.classes.memory
        return float(mem[np.isfinite(mem)].max())

    def _choose_memory_unit(self, spec: TrainingSpec) -> None:
        """Whether the training memory can break a capacity, and its unit (2^j bytes, every
        coefficient below MAX_COEF)."""
        g = self.g
        most = max(float(spec.inflight(r).max()) for r in range(1, self.k + 1))
        need = spec.optimizer_state * g.param_bytes_total + float(g.act.max())
        need += most * float(g.stash_bytes.sum())
        caps = self.classes.capacity if self.placed else np.array([self.cluster.capacity or np.inf])
        self.use_cap = bool(np.any(caps < need))
        self.use_mem = self.use_cap or self.use_over
        big = max(
            spec.optimizer_state * float(g.p_size.max(initial=0.0)),
            float(g.act.max()),
            most * float(g.stash_bytes.max(initial=0.0)),
            float(caps[np.isfinite(caps)].max(initial=0.0)),
        )
        # 2^j bytes, j < 0 too: small memories keep their fractions (a plan the rounded-down
        # model accepts breaks the real capacity by at most a unit per term)
        self.mem_unit = 2.0 ** math.ceil(math.log2(max(big, 1e-30) / MAX_COEF))

    # ------------------------------------------------------------------ domains and cuts
    def _cut_work(self) -> np.ndarray:
        """A stage costs at least the work and the backward work of its nodes."""
        return self.w_int + self.wb_int

    def _narrow_domains(self, upper: np.ndarray | None) -> None:
        """With a known T (``upper_T``): the objective cap and the largest stage time of a plan
        no worse, (upper - a W2) / b, which narrows the blocks each node can take."""
        self.hint_int = self.ub_int = self.obj_cap = None
        U = self.upper_T
        if math.isfinite(U):
            # the caps are relaxed by HINT_SLACK units per stage time: still every plan with
            # T <= upper, and room for the hint's stage times rounded up (placed models)
            spare = HINT_SLACK * (self.w.A * self.k + self.w.B)
            self.obj_cap = math.floor(self.S * self.w.divisor * U * (1 + 1e-12)) + spare
            if self.w.B > 0:
                a, b = self.spec.time_weights
                w2 = float(self.g.work.sum() + self.g.backward_work.sum()) / float(self.speed.max())
                longest = max(0.0, (U - a * w2) / b) + 1e-9 * U / b
                self.ub_int = math.floor(self.S * longest) + HINT_SLACK
        self._set_windows(self.ub_int)

    def _order_used(self) -> None:
        """Empty blocks come first: used[b] => used[b + 1] (a used block's position from the
        end is then k - b)."""
        for b in range(self.k - 1):
            self.m.AddImplication(self.used[b], self.used[b + 1])

    # ------------------------------------------------------------------ objective
    def _add_objective(self) -> None:
        """t[b] >= the stage time of block b, Tmax >= t[b], the objective's cap."""
        m, k = self.m, self.k
        hi = self._largest_stage_int()
        self.t = [m.NewIntVar(0, hi, f"t_{b}") for b in range(k)]
        cap = hi if self.ub_int is None else min(hi, self.ub_int)
        self.T = Tmax = m.NewIntVar(0, max(1, cap), "Tmax")
        if self.placed:
            self._add_placement()  # t[b] per class: _bound_class_cost
        else:
            io = self._io_by_block()
            for b in range(k):
                terms = self.terms[b] + self._backward_terms(b, self.wb_int) + io[b]
                self.class_extra[b] = len(terms) - len(self.terms[b])
                m.Add(_wsum(terms) <= self.t[b])
        for b in range(k):
            m.Add(self.t[b] <= Tmax)
        if self.obj_cap is not None:
            m.Add(self._objective() <= self.obj_cap)
        self._add_known_bounds(hi)

    def _add_known_bounds(self, hi: int) -> None:
        """Tmax >= S * (the universal bound on max f) and the objective variable >= S v *
        (the memory-free training bound), rounded down: both are variables above the plan's
        terms, so every plan keeps a value at most S v T (as the inference model's T)."""
        g, cluster, m, w = self.g, self.cluster, self.m, self.w
        low = 1 - 1e-12
        t_low = math.floor(lower_bound(g, cluster) * self.S * low)
        if t_low > 0:
            m.Add(min(t_low, self.ub_int if self.ub_int is not None else t_low) <= self.T)
        real = training_lower_bound(g, cluster, self.k, self.spec)
        obj_low = math.floor(real * self.S * w.divisor * low)
        if self.obj_cap is not None:
            obj_low = min(obj_low, self.obj_cap)
        top = (w.A * self.k + w.B) * hi
        self.obj_low = max(0, obj_low)
        self.obj = m.NewIntVar(self.obj_low, max(top, obj_low, 1), "objective")
        m.Add(self.obj >= self._objective())

    def _largest_stage_int(self) -> int:
        w = self.w_class if self.placed else [self.w_int]
        wb = self.wb_class if self.placed else [self.wb_int]
        work = max(int(a.sum() + b.sum()) for a, b in zip(w, wb, strict=True))
        over = self._placed_overflow_max() if self.placed else sum(self.ov_hi)
        return max(1, work + 4 * int(self.io_int.sum()) + int(over))

    def _io_by_block(self) -> list[list]:
        io = [[] for _ in range(self.k)]
        for table in (self.send, self.recv):
            for (t, b), var in table.items():
                io[b].append((int(self.io_int[t]), var))
        return io

    def _backward_terms(self, b: int, wb: np.ndarray) -> list:
        lo, hi, x = self.lo, self.hi, self.x
        return [(int(wb[v]), x[v][b]) for v in range(self.g.n) if lo[v] <= b <= hi[v] and wb[v]]

    def _bound_class_cost(self, b: int, c: int, terms: list, io: list) -> None:
        """On class c: f's terms, the backward work at the class's compute, the io again."""
        extra = self._backward_terms(b, self.wb_class[c]) + list(io)
        self.class_extra[b] = max(self.class_extra[b], len(extra))
        self.m.Add(_wsum(terms + extra) <= self.t[b]).OnlyEnforceIf(self.y[b][c])

    def _objective(self):
        return self.w.A * sum(self.t) + self.w.B * self.T

    def _minimize(self) -> None:
        self.m.Minimize(self.obj)

    def _objective_error(self) -> int:
        """Integer units by which a plan's objective can fall below S v T: the rounded terms
        of every block (in the sum) and of the worst block (in the max)."""
        per_block = np.bincount([b for _, b in self.use], minlength=self.k)
        err = []
        for b in range(self.k):
            e = (self.placed_terms[b] if self.placed else len(self.terms[b])) + self.class_extra[b]
            err.append(e + (int(per_block[b]) + 2 if self.use_over else 0))
        return self.w.A * sum(err) + self.w.B * max(err)

    # ------------------------------------------------------------------ memory
    def _add_capacity(self, b: int, cap: float) -> None:
        self.caps.append((b, None, cap))  # posted by _add_training_memory

    def _add_class_capacity(self, b: int, c: int, cap_c: float) -> None:
        self.caps.append((b, c, cap_c))

    def _add_training_memory(self) -> None:
        """state * params + peak + inflight * stash <= capacity for every used block (and
        class), the in-flight count fixed by the block's position from the end (and p)."""
        if not self.caps:
            return
        g, m, unit = self.g, self.m, self.mem_unit
        state = np.floor(self.spec.optimizer_state * g.p_size / unit).astype(np.int64)
        stash = g.stash_bytes
        cases = self._inflight_cases()
        for b, c, cap in self.caps:
            self._tick()
            static = [(int(state[q]), var) for q, var in self.by_block[b] if state[q]]
            static.append((1, self.peak_b[b]))
            limit = int(math.floor(cap / unit))
            members = [v for v in range(g.n) if self.lo[v] <= b <= self.hi[v] and stash[v]]
            for inflight, when in cases[b]:
                coef = np.floor(inflight * stash / unit).astype(np.int64)
                kept = [(int(coef[v]), self.x[v][b]) for v in members if coef[v]]
                ct = m.Add(_wsum(static + kept) <= limit)
                cond = when + ([] if c is None else [self.y[b][c]])
                if cond:
                    ct.OnlyEnforceIf(cond)

    def _inflight_cases(self) -> list[list[tuple[float, list]]]:
        """Per block: (in-flight stashes, literals under which it holds). Block b, when used,
        is stage b - (k - p) of p (empty blocks first), k - b stages from the end."""
        spec, k = self.spec, self.k
        if spec.schedule != "interleaved" or spec.virtual_stages == 1:
            counts = spec.inflight(k)  # stage i of k is k - i from the end, as block i
            return [[(float(counts[b]), [])] for b in range(k)]
        self.is_p = [self.m.NewBoolVar(f"is_p_{r}") for r in range(k + 1)]
        self.m.AddExactlyOne(self.is_p[1:])
        self.m.Add(self.is_p[0] == 0)
        self.m.Add(sum(self.used) == sum(r * self.is_p[r] for r in range(1, k + 1)))
        return [
            [(float(spec.inflight(r)[b - (k - r)]), [self.is_p[r]]) for r in range(k - b, k + 1)]
            for b in range(k)
        ]

    # ------------------------------------------------------------------ hint
    def _hint_objective(self, a: np.ndarray) -> None:
        """Stage times and Tmax of plan ``a`` (homogeneous; placed: hint_stage_times),
        and its number of stages."""
        if hasattr(self, "is_p"):
            p = len(np.unique(a))
            for r, var in enumerate(self.is_p):
                self.m.AddHint(var, int(r == p))
        if self.placed:
            return  # hint_stage_times, once the placement is known
        t = self.block_costs_int(a) + self.block_io_int(a)
        t = t + np.bincount(a, weights=self.wb_int, minlength=self.k).astype(np.int64)
        self._hint_times(t)

    def _hint_times(self, t: np.ndarray) -> None:
        for b in range(self.k):
            self.m.AddHint(self.t[b], int(t[b]))
        self.m.AddHint(self.T, int(t.max()))
        value = self.w.A * int(t.sum()) + self.w.B * int(t.max())
        self.m.AddHint(self.obj, max(value, self.obj_low))

    def hint_stage_times(self, cost: TrainingCost) -> None:
        """Placed models: the hint's stage times (seconds, on its placement) rounded up,
        one unit more for float error; they are at least the rounded-down terms."""
        t = np.zeros(self.k, dtype=np.int64)
        for s in cost.stages:
            t[s.block] = math.ceil(s.time * self.S) + HINT_SLACK - 1
        self._hint_times(t)


# ---------------------------------------------------------------------- the solve
def solve_training_cpsat(
    g: Graph,
    cluster: Cluster,
    spec: TrainingSpec,
    *,
    time_limit: float,
    hint: np.ndarray | None = None,
    upper: float = math.inf,
    workers: int = 0,
    seed: int = 0,
    progress: Progress = NULL_PROGRESS,
) -> TrainingCpsatResult:
    """The plan of least T over every plan of at most ``cluster.devices`` blocks (and every
    placement), each stage within its training memory, with CP-SAT's proof or, past
    ``time_limit``, the best plan found and a proven lower bound. ``hint``: a plan of ``g``
    (warm start; ignored unless valid); ``upper``: T of a known valid plan (cuts the
    objective; the bound stays valid for every plan)."""
    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    warm = _warm_pick(g, cluster, spec, cg, labels, hint)
    upper = min(upper, warm.T) if warm is not None else upper
    try:
        model = _build(cg, cluster, spec, upper, warm, labels, t0 + BUILD_SHARE * time_limit)
    except _BuildTimeout:
        return _unsolved(g, cluster, spec, warm, t0)
    build_s = time.perf_counter() - t0
    search = _search(model, g, labels, spec, time_limit - 2 * build_s, workers, seed, progress, t0)
    return _result(model, search, warm, upper, build_s, t0)


def _warm_pick(g, cluster, spec, cg, labels, hint) -> _Pick | None:
    """The hint with its used blocks last, in order (empty blocks first), on its best
    placement when devices differ; None when absent or invalid."""
    if hint is None:
        return None
    k = cluster.devices
    coarse = np.empty(cg.n, dtype=np.int64)
    coarse[labels] = np.asarray(hint)
    used = np.unique(coarse)
    shifted = (np.searchsorted(used, coarse) + k - len(used))[labels]
    devices = None
    if not cluster.homogeneous:
        devices = best_placement(g, cluster, shifted, k).devices
        if devices is None:
            return None
    cost = training_cost(g, cluster, shifted, spec, k=k, placement=devices)
    return _Pick(shifted, devices, cost) if cost.valid else None


def _build(cg, cluster, spec, upper, warm: _Pick | None, labels, deadline) -> _TrainingModel:
    model = _TrainingModel(cg, cluster, spec, upper, deadline)
    if warm is not None:
        coarse = np.empty(cg.n, dtype=np.int64)
        coarse[labels] = warm.blocks
        model.add_hint(coarse)
        if model.placed:
            model.add_placement_hint(coarse, warm.devices)
            model.hint_stage_times(warm.cost)
    return model


@dataclass
class _Search:
    """CP-SAT's status, proven bound (integer units), the best valid plan its incumbents
    gave (re-priced) and its statistics."""

    status: int
    bound_int: float
    best: _Pick | None
    stats: dict


class _Incumbents(cp_model.CpSolverSolutionCallback):
    """Re-prices every incumbent, keeps the best valid one and reports it."""

    def __init__(self, model: _TrainingModel, g, labels, spec, progress: Progress, t0: float):
        super().__init__()
        self.model, self.g, self.labels, self.spec = model, g, labels, spec
        self.progress, self.t0 = progress, t0
        self.best: _Pick | None = None

    def on_solution_callback(self) -> None:
        model = self.model
        a = model.read_values(self.Value)[self.labels]
        dev = model.read_placement(self.Value) if model.placed else None
        cost = training_cost(self.g, model.cluster, a, self.spec, k=model.k, placement=dev)
        pick = _Pick(a, dev, cost)
        if self.best is None or pick.T < self.best.T:
            self.best = pick
        scale = model.S * model.w.divisor
        self.progress.update(
            self.best.T, self.BestObjectiveBound() / scale, time.perf_counter() - self.t0
        )


def _search(model, g, labels, spec, seconds, workers, seed, progress, t0) -> _Search:
    params = search_params(workers, seed)
    size = model.size()
    if size["model_variables"] > BIG_MODEL_VARS:
        params["max_presolve_iterations"] = 1  # as the inference model (cpsat._search)
    solver = new_solver(max(0.01, seconds), params)
    cb = _Incumbents(model, g, labels, spec, progress, t0)
    status = solver.Solve(model.m, cb)
    stats = {
        "cpsat_status": solver.StatusName(status),
        "coarse_nodes": model.g.n,
        "scale": model.S,
        "branches": solver.NumBranches(),
        "conflicts": solver.NumConflicts(),
        "workers": solver.parameters.num_workers,
        "memory_modelled": model.use_mem,
        **size,
    }
    return _Search(status, solver.BestObjectiveBound(), cb.best, stats)


def _result(model: _TrainingModel, search: _Search, warm, upper: float, build_s, t0):
    """The better of the incumbents and the hint, the bound (CP-SAT's, or ``upper`` when
    lower: plans cut off by it are worse than a known one) and the verdict."""
    infeasible = search.status == cp_model.INFEASIBLE and not math.isfinite(upper)
    cpsat_lower = search.bound_int / (model.S * model.w.divisor)
    if search.status == cp_model.INFEASIBLE:
        cpsat_lower = math.inf  # no plan with T <= upper other than those known
    lower = min(cpsat_lower, upper) * (1 - BOUND_SAFETY)
    picks = [p for p in (search.best, warm) if p is not None and p.cost.valid]
    pick = min(picks, key=lambda p: p.T) if picks else None
    T = pick.T if pick is not None else math.inf
    proven = search.status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    optimal = pick is not None and proven and _meets(T, lower, model.resolution)
    stats = {
        **search.stats,
        "build_seconds": round(build_s, 3),
        "cpsat_lower_bound": cpsat_lower,
        "resolution": model.resolution,
        "kept_hint": pick is not None and pick is warm,
    }
    return TrainingCpsatResult(
        assignment=None if pick is None else pick.blocks,
        placement=None if pick is None else pick.devices,
        iteration_time=T,
        lower=math.inf if infeasible else lower,
        optimal=optimal,
        resolution=model.resolution,
        infeasible=infeasible,
        status=search.stats["cpsat_status"],
        seconds=time.perf_counter() - t0,
        stats=stats,
    )


def _meets(T: float, lower: float, resolution: float) -> bool:
    """T meets the proven bound within the tolerance or the model's rounding resolution."""
    return lower * (1 + OPTIMALITY_TOL) >= T or optimal_within(T, lower, resolution)


def _unsolved(g, cluster, spec, warm: _Pick | None, t0) -> TrainingCpsatResult:
    """The time limit passed while the model was built: the hint and the memory-free bound."""
    lower = training_lower_bound(g, cluster, cluster.devices, spec)
    return TrainingCpsatResult(
        assignment=None if warm is None else warm.blocks,
        placement=None if warm is None else warm.devices,
        iteration_time=math.inf if warm is None else warm.T,
        lower=lower,
        optimal=False,
        resolution=0.0,
        infeasible=False,
        status=NOT_SOLVED,
        seconds=time.perf_counter() - t0,
        stats={"note": "the time limit passed while building the CP-SAT model"},
    )
