"""The exact solver: the Max-Throughput Partitioning Problem as an OR-Tools CP-SAT model.

Build the model, solve, read the solution, in that order (as the CP-SAT samples do).

Model (on the coarse graph where co-location groups and the cycles they create are merged):

- block of node v in order encoding: ``le[v,b] = [block(v) <= b]`` (monotone in b), and
  ``x[v,b] = le[v,b] - le[v,b-1]``; an order edge (u, v) is ``le[v,b] => le[u,b]``.
- io, linearised: ``o[t,b] >= x[p,b] - x[c,b]`` (tensor t sent by block b) and
  ``i[t,b] >= x[c,b] - x[p,b]`` (received by b), per consumer c; when c must come after p the
  stronger order forms ``o >= x[p,b] - le[c,b]`` and ``i >= x[c,b] + le[p,b-1] - 1`` are used.
- memory: ``use[q,b] >= x[u,b]`` per parameter q and user u; ``peak[b] >= act(v) x[v,b]``;
  capacity ``sum_q bytes(q) use[q,b] + peak[b] <= C``; overflow
  ``ov[b] >= (sum_q bytes(q) use[q,b] + peak[b] - M) / B_mem`` (and ``ov[b] >= 0``).
- ``T >= f(b)`` for every block; minimise T. Redundant cuts: the work of blocks 0..b is at most
  (b+1) T and of blocks b..k-1 at most (k-b) T, and with overflow modelled work plus charged
  parameter costs at most (b+1) (T + M S / B_mem); empty blocks come last (symmetry breaking).
- A heuristic plan is the hint and ``T <= its cost`` an upper bound; node domains are then
  narrowed by the work and the parameter bytes of ancestors and descendants (every plan at
  most that cost keeps its nodes inside; proof in :meth:`_Model._blocks_needed`). On LLMs whose
  weights overflow SRAM this is what makes the model small: the Llama-2-70B shape at k = 64
  goes from 1.09 M variables (14 s to build, no branch in 60 s) to 82 k (3 s, searching
  after 4-15 s). ``x`` has no variable of its own (see :meth:`_Model._add_variables`), the
  hint is complete (CP-SAT starts from it) and big models get one presolve pass.
- ``CpsatOptions.stop_at``, a certified lower bound of the same problem (from
  :mod:`solver.pipeline.bounds`), ends the first stage early: no search when the warm start meets
  it,
  and the solution callback stops CP-SAT at the first incumbent that meets it. "Meets" is
  decided on the plan re-evaluated in floating point (:func:`meets_bound`), never on the
  rounded integer objective (that only pre-filters); the certified bound is then the proof.
- After the bottleneck, :mod:`solver.pipeline.exact.tiebreak` picks, among plans no worse, the least
  transferred bytes and then the lowest latency (``--set tie_break=false`` skips it).

Integers: every time is multiplied by a scale S (the largest with every coefficient below 2^30
and the total cost below 1e12) and rounded DOWN, so
for every plan the integer block cost is at most S times the real one. CP-SAT's proven bound
divided by S is therefore a valid lower bound of the real problem, with no correction; the gap
it leaves is at most (terms per block) / S, usually far below the 1e-6 optimality tolerance.
When it is not (S is capped by 2^30 / the largest coefficient, e.g. M / B_mem on LLM-sized
graphs), a CP-SAT proof still shows: the plan is reported OPTIMAL "within the resolution"
(terms per block) / S, stated in ``stats["optimal_within"]``, provided objective - bound is
at most that and that is at most 0.1% of the objective; otherwise FEASIBLE with the gap. Plans cut
off by ``T <= UB`` have an integer cost above UB >= the bound, so the bound stays valid for them.
The reported objective is always re-evaluated in floating point by :mod:`solver.core.cost`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, lower_bound, own_param_bytes, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.core.result import ALL_PLACEMENTS, FEASIBLE, OPTIMAL, OPTIMALITY_TOL, WARM_START_MET
from solver.core.sat import MAX_COEF, new_solver, search_params
from solver.pipeline.exact.tiebreak import (
    TIE_BREAK_MIN_SECONDS,
    TIE_BREAK_SHARE,
    tie_break,
    tie_break_budget,
)
from solver.pipeline.placement import (
    _classes_of,
    _devices_of,
    best_placement,
    device_classes,
    group_links,
)
from solver.pipeline.plan import Plan, make_plan

TARGET_RANGE = 1e12  # total cost scaled to at most this many integer units
BUILD_SHARE = 0.8  # share of the time limit the model build may take before it gives up ...
# ... when a heuristic plan is at hand: CP-SAT's presolve then takes about as long again before
# the first branch, so a build past this share leaves no search (10,000-node layered DAG at
# k = 16: 17-31 s to build, 0 branches, 52-66 s in all against --time-limit 60); the
# warm-start plan is returned instead, within the limit
HINTED_BUILD_SHARE = 0.4
BIG_MODEL_VARS = 50_000  # above this, one presolve pass (search starts 3x sooner, same result)
NO_PROBING_VARS = 50_000  # above this, presolve does not probe (the search starts at all)


@dataclass
class CpsatOptions:
    time_limit: float = 60.0
    workers: int = 0
    seed: int = 0
    gap: float = 0.0
    tie_break: bool = True  # at the same bottleneck, less transfer then lower latency
    tie_break_seconds: float | None = None  # the user's budget for it (default: tie_break_budget)
    spent_before: float = 0.0  # seconds the caller spent on this solve before (bounds, warm start)
    log: bool = False
    on_progress: object = None  # callable(objective, bound, elapsed) in real units
    params: dict = field(default_factory=dict)  # extra CP-SAT parameters
    # a proven lower bound (seconds) of this very problem: stop once a valid plan meets it
    stop_at: float | None = None


STOPPED_WARM = WARM_START_MET
STOPPED_INCUMBENT = "incumbent met the certified bound"


def meets_bound(objective: float, bound: float | None) -> bool:
    """True when a re-evaluated ``objective`` is within OPTIMALITY_TOL of the proven lower
    ``bound`` (then no plan is better beyond the tolerance and make_plan keeps OPTIMAL)."""
    if bound is None or not math.isfinite(bound):
        return False
    return objective <= bound * (1 + OPTIMALITY_TOL)


class _BuildTimeout(Exception):
    """The time limit passed while the model was being built."""


CLOSURE_MAX_NODES = 20_000  # ancestor bitsets take n^2 / 16 bytes: skip the narrowing above
CLOCK_EVERY = 1024  # nodes or tensors between two looks at the clock while building


class _Model:
    """The CP-SAT model of one coarse graph, with its variables kept for hints and reading.

    Built in named steps, one per constraint family, in the order the CP-SAT samples use:
    scale, domains, variables, order, io, memory, objective, cuts, symmetry. Every step checks
    the clock and raises :class:`_BuildTimeout` past ``deadline``.
    """

    def __init__(
        self,
        g: Graph,
        cluster: Cluster,
        upper: np.ndarray | None,
        deadline: float = math.inf,
        upper_cost: float | None = None,
    ):
        self.g, self.cluster = g, cluster
        self.k = cluster.devices
        self.deadline = deadline
        # a cluster whose devices or links differ: the model also chooses each block's device
        # class (see _add_placement); upper_cost is then the hint's real cost on its placement
        self.placed = not cluster.homogeneous
        self.upper_cost = upper_cost
        self.m = cp_model.CpModel()
        self._choose_scale()
        self.mass_first, self.mass_last, self.mf = self._masses()
        self._narrow_domains(upper)
        self._add_variables()
        self._add_order()
        self._add_io()
        self._add_memory()
        self._add_objective()
        self._add_cuts()
        self._add_symmetry()
        self._minimize()
        self.resolution = self._rounding_error() / self.S

    def _minimize(self) -> None:
        """The objective: the bottleneck T."""
        self.m.Minimize(self.T)

    def _rounding_error(self) -> int:
        """Integer units by which rounding down can make a block's modelled cost lower than S
        times its real cost, at worst: under one unit per rounded term (work, io, and for the
        overflow each parameter, the peak, and M rounded up)."""
        per_block = np.bincount([b for _, b in self.use], minlength=self.k)
        worst = 0
        for b in range(self.k):
            err = self.placed_terms[b] if self.placed else len(self.terms[b])
            if self.use_over:
                err += int(per_block[b]) + 2
            worst = max(worst, err)
        return worst

    def _tick(self, i: int = 0) -> None:
        """Raise :class:`_BuildTimeout` when the deadline passed (looks every CLOCK_EVERY)."""
        if i % CLOCK_EVERY == 0 and time.perf_counter() > self.deadline:
            raise _BuildTimeout

    def _choose_scale(self) -> None:
        """Which memory terms can matter, the time scale S and the memory unit (round down:
        integer costs never exceed S * real costs, so the proven bound stays valid)."""
        self.M_plan = self.cluster.fast_memory  # the M of the counting arguments (_masses)
        if self.placed:
            self._choose_scale_placed()
            return
        g, cluster, k = self.g, self.cluster, self.k
        B, M, Bm = cluster.link_bandwidth, cluster.fast_memory, cluster.slow_memory_bandwidth
        cap = cluster.capacity
        mem_total = g.param_bytes_total + float(g.act.max())
        self.use_cap = cap is not None and mem_total > cap
        self.use_over = math.isfinite(M) and mem_total > M
        self.use_mem = self.use_cap or self.use_over
        io = g.t_size / B
        total = float(g.work.sum() + 2 * io.sum())
        biggest = float(max(g.work.max(), io.max(initial=0.0)))
        if self.use_over:
            total += (mem_total - min(M, mem_total)) / Bm * k
            biggest = max(biggest, float(g.p_size.max(initial=0.0) + g.act.max()) / Bm, M / Bm)
        S = TARGET_RANGE / total if total > 0 else 1.0
        if biggest > 0:
            S = min(S, MAX_COEF / biggest)
        self.S = S
        # memory in units of 2^j bytes, rounded down (a laxer model: the bound stays valid)
        big_mem = float(max(g.p_size.max(initial=0.0), g.act.max(), cap or 0.0))
        self.mem_unit = 2.0 ** max(0, math.ceil(math.log2(max(big_mem, 1.0) / MAX_COEF)))
        self.w_int = np.floor(g.work * S).astype(np.int64)
        self.io_int = np.floor(io * S).astype(np.int64)

    def _choose_scale_placed(self) -> None:
        """:meth:`_choose_scale` on a heterogeneous cluster: S from the slowest device and
        link; ``w_int`` is the work on the fastest device and ``M_plan`` the largest fast
        memory (every block costs at least that, whatever its device: the cuts and the domain
        narrowing stay valid); ``io_int`` the io on the slowest link (0: no io anywhere)."""
        g, cluster, k = self.g, self.cluster, self.k
        self.classes = cl = device_classes(cluster)
        self.link_bw, self.link_cls = group_links(cluster)
        Bm = cluster.slow_memory_bandwidth
        speed = cl.compute / cluster.compute
        bw_lo = float(self.link_bw.min())
        mem_total = g.param_bytes_total + float(g.act.max())
        self.use_cap = bool(np.any(cl.capacity < mem_total))
        self.use_over = bool(np.any(np.isfinite(cl.memory) & (cl.memory < mem_total)))
        self.use_mem = self.use_cap or self.use_over
        io_lo = g.t_size / bw_lo
        total = float(g.work.sum() / speed.min() + 2 * io_lo.sum())
        biggest = float(max(g.work.max() / speed.min(), io_lo.max(initial=0.0)))
        finite_m = cl.memory[np.isfinite(cl.memory)]
        if self.use_over:
            m_lo = float(finite_m.min())
            total += (mem_total - min(m_lo, mem_total)) / Bm * k
            top = float(g.p_size.max(initial=0.0) + g.act.max()) / Bm
            biggest = max(biggest, top, float(finite_m.max()) / Bm)
            self.M_plan = float(cl.memory.max())
        S = TARGET_RANGE / total if total > 0 else 1.0
        if biggest > 0:
            S = min(S, MAX_COEF / biggest)
        self.S = S
        caps = cl.capacity[np.isfinite(cl.capacity)]
        big_mem = float(max(g.p_size.max(initial=0.0), g.act.max(), caps.max(initial=0.0)))
        self.mem_unit = 2.0 ** max(0, math.ceil(math.log2(max(big_mem, 1.0) / MAX_COEF)))
        self.w_int = np.floor(g.work * S / speed.max()).astype(np.int64)
        self.io_int = np.floor(io_lo * S).astype(np.int64)
        # per class: work coefficients; the largest any block can cost (T's domain)
        self.w_class = [np.floor(g.work * S / s).astype(np.int64) for s in speed.tolist()]
        self.max_f = int(max(w.sum() for w in self.w_class) + 2 * self.io_int.sum())

    def _narrow_domains(self, upper: np.ndarray | None) -> None:
        """Blocks each node can take in a plan no worse than ``upper`` (see :meth:`_masses`):
        the hint's integer cost U bounds what the blocks before and after every node hold;
        order edges then propagate lo and hi."""
        g = self.g
        self.ub_int = self.hint_int = None
        if upper is not None:
            # every plan as good as the hint in real numbers has an integer cost at most
            # floor(S * its cost): keep them all (the tie-break picks among them)
            if self.placed:  # the hint's real cost on its placement, given by the caller
                real = float(self.upper_cost) * (1 + 1e-12)
                self.ub_int = math.floor(self.S * real)
            else:
                real = evaluate(g, self.cluster, upper).objective * (1 + 1e-12)
                self.hint_int = int(self.block_costs_int(upper).max())
                self.ub_int = max(self.hint_int, math.floor(self.S * real))
        self._set_windows(self.ub_int)

    def _set_windows(self, block_cap: int | None) -> None:
        """lo[v]..hi[v], the blocks node v can take when no block's integer cost exceeds
        ``block_cap`` (None: no cap), then along the order edges."""
        g, k, n = self.g, self.k, self.g.n
        lo = np.zeros(n, dtype=np.int64)
        hi = np.full(n, k - 1, dtype=np.int64)
        if block_cap is not None and block_cap > 0 and n <= CLOSURE_MAX_NODES:
            need_before, need_after = self._blocks_needed(block_cap)
            lo = np.maximum(0, need_before - 1)
            hi = np.minimum(k - 1, k - need_after)
        self._tick()
        # an order edge (u, v) needs block(u) <= block(v): propagate the bounds along edges
        ptr, idx = g.pred
        for i, v in enumerate(g.topo_order.tolist()):
            self._tick(i)
            for u in idx[ptr[v] : ptr[v + 1]].tolist():
                lo[v] = max(lo[v], lo[u])
        ptr, idx = g.succ
        for i, u in enumerate(g.topo_order[::-1].tolist()):
            self._tick(i)
            for v in idx[ptr[u] : ptr[u + 1]].tolist():
                hi[u] = min(hi[u], hi[v])
        if np.any(lo > hi):  # cannot happen with a valid hint; keep the model sound anyway
            lo = np.minimum(lo, hi)
        self.lo, self.hi = lo, hi

    def _masses(self) -> tuple[np.ndarray, np.ndarray, int | None]:
        """Per-node integer overflow coefficients for counting arguments: each parameter's
        coef charged to one user (``first``: its first user in topological order, for
        prefixes; ``last``: its last, for suffixes), and Mf; zeros and None without overflow.
        A set of blocks holding node u uses every parameter charged to u."""
        g = self.g
        first = np.zeros(g.n, dtype=np.int64)
        last = np.zeros(g.n, dtype=np.int64)
        if not self.use_over or math.isinf(self.M_plan):  # a device that never overflows
            return first, last, None
        f = self.S / self.cluster.slow_memory_bandwidth  # the same numbers as _add_memory
        coef = np.floor(g.p_size * f).astype(np.int64)
        rank = g.topo_rank
        for q in range(g.num_params):
            users = g.p_users[g.p_ptr[q] : g.p_ptr[q + 1]]
            if len(users):
                r = rank[users]
                first[users[np.argmin(r)]] += int(coef[q])
                last[users[np.argmax(r)]] += int(coef[q])
        return first, last, int(math.ceil(self.M_plan * f))

    def _blocks_needed(self, ub: int) -> tuple[np.ndarray, np.ndarray]:
        """Least number of blocks that must hold each node with its ancestors (``before``) and
        with its descendants (``after``) in every plan of integer cost at most ``ub``.

        Proof. Let A be a node with its ancestors; in a plan of cost <= ub where the node is in
        block j - 1, blocks 0..j-1 hold A, so j * ub >= work(A) (integer work, rounded down).
        With overflow modelled, each block's cost is at least its work plus
        ov_b >= sum of coef(q) over its parameters - Mf (coef = floor(bytes * S / B_mem),
        Mf = ceil(M * S / B_mem)); every parameter charged to a node of A is used by a block
        < j, so j * ub >= work(A) + coef(A) - j * Mf, i.e. j >= (work(A) + coef(A)) / (ub + Mf).
        The same holds for the blocks from the node's block to the last with its descendants.
        No plan of cost <= ub is cut off, so the narrowed model keeps the proven bound valid.
        """
        first, last, mf = self.mass_first, self.mass_last, self.mf
        w = self._cut_work()
        anc, desc = _closure_sums(self.g, [w, first], [w, last])
        aw, ap = anc[0] + w, anc[1] + first
        dw, dp = desc[0] + w, desc[1] + last
        before = -(-aw // ub)
        after = -(-dw // ub)
        if mf is not None:
            den = ub + int(mf)
            before = np.maximum(before, -(-(aw + ap) // den))
            after = np.maximum(after, -(-(dw + dp) // den))
        return before, after

    def _add_variables(self) -> None:
        """Block of every node in order encoding: le[v][b] = [block(v) <= b], monotone in b,
        and x[v][b] = le[v][b] - le[v][b-1]: a constant outside the node's window, a literal at
        its ends and a linear expression inside (no variable of its own: the model is about a
        quarter smaller and CP-SAT's presolve faster; see :meth:`_is_literal`)."""
        m, k, lo, hi = self.m, self.k, self.lo, self.hi
        self.TRUE = TRUE = m.NewConstant(1)
        self.FALSE = FALSE = m.NewConstant(0)
        self.le = le = [[None] * k for _ in range(self.g.n)]
        self.x = x = [[None] * k for _ in range(self.g.n)]
        for v in range(self.g.n):
            self._tick(v)
            for b in range(k):
                if b < lo[v]:
                    le[v][b] = FALSE
                elif b >= hi[v]:
                    le[v][b] = TRUE
                else:
                    le[v][b] = m.NewBoolVar(f"le_{v}_{b}")
            for b in range(1, k):
                if lo[v] < b <= hi[v] and b - 1 >= lo[v]:
                    m.AddImplication(le[v][b - 1], le[v][b])
            for b in range(k):
                if b < lo[v] or b > hi[v]:
                    x[v][b] = FALSE
                elif lo[v] == hi[v]:
                    x[v][b] = TRUE
                elif b == lo[v]:
                    x[v][b] = le[v][b]  # le[v][b-1] is false
                elif b == hi[v]:
                    x[v][b] = ~le[v][b - 1]  # le[v][b] is true
                else:  # an expression, not a variable: one Boolean per (node, block) less
                    x[v][b] = le[v][b] - le[v][b - 1]

    def _is_literal(self, v: int, b: int) -> bool:
        """True when x[v][b] is a constant or a literal (not an expression inside the window),
        so that it can be used in implications."""
        return not self.lo[v] < b < self.hi[v]

    def _add_order(self) -> None:
        """Order edges block(u) <= block(v) as le[v][b] => le[u][b]. After propagation
        lo[u] <= lo[v] and hi[u] <= hi[v]: outside [lo[v], hi[u]) the constants imply it."""
        g, le, lo, hi = self.g, self.le, self.lo, self.hi
        for i, (u, v) in enumerate(zip(g.e_src.tolist(), g.e_dst.tolist(), strict=True)):
            self._tick(i)
            for b in range(lo[v], hi[u]):
                self.m.AddImplication(le[v][b], le[u][b])

    def _add_io(self) -> None:
        """Work and io terms of every block: o[t,b] (tensor t sent by b) and i[t,b] (received
        by b), linearised per consumer, with the stronger forms along order edges."""
        g, m, x, le, lo, hi = self.g, self.m, self.x, self.le, self.lo, self.hi
        ordered = set(zip(g.e_src.tolist(), g.e_dst.tolist(), strict=True))
        self.terms = [[] for _ in range(self.k)]  # (coef, var) per block
        for v in range(g.n):
            for b in range(lo[v], hi[v] + 1):
                if self.w_int[v] and not self.placed:  # placed: per class, _add_placement
                    self.terms[b].append((int(self.w_int[v]), x[v][b]))
        self.send: dict[tuple[int, int], object] = {}
        self.recv: dict[tuple[int, int], object] = {}
        for t in range(g.num_tensors):
            self._tick(t)
            c_io = int(self.io_int[t])
            if c_io == 0:
                continue
            p = int(g.t_producer[t])
            cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]].tolist()
            if not cons:
                continue
            for b in range(lo[p], hi[p] + 1):
                ob = m.NewBoolVar(f"o_{t}_{b}")
                for c in cons:
                    if (p, c) in ordered:
                        m.Add(ob >= x[p][b] - le[c][b])
                    else:
                        m.Add(ob >= x[p][b] - x[c][b])
                self.send[t, b] = ob
                self.terms[b].append((c_io, ob))
            blocks = sorted({b for c in cons for b in range(lo[c], hi[c] + 1)})
            for b in blocks:
                ib = m.NewBoolVar(f"i_{t}_{b}")
                for c in cons:
                    if not lo[c] <= b <= hi[c]:
                        continue
                    if (p, c) in ordered:
                        if b >= 1:
                            m.Add(ib >= x[c][b] + le[p][b - 1] - 1)
                    else:
                        m.Add(ib >= x[c][b] - x[p][b])
                self.recv[t, b] = ib
                self.terms[b].append((c_io, ib))

    def _add_memory(self) -> None:
        """Parameters used per block, the peak working set, the hard capacity and the overflow
        ov[b] >= (params + peak - M) / B_mem (only the terms that can matter)."""
        g, m, k, x, lo, hi = self.g, self.m, self.k, self.x, self.lo, self.hi
        self.use: dict[tuple[int, int], object] = {}
        self.peak_b: list = [None] * k
        self.peak_t: list = [None] * k
        self.ov: list = [None] * k
        self.ov_hi: list[int] = []
        if not self.use_mem:
            return
        cap, M = self.cluster.capacity, self.M_plan
        self._p_bytes = np.floor(g.p_size / self.mem_unit).astype(np.int64)
        self._act_b = act_b = np.floor(g.act / self.mem_unit).astype(np.int64)
        f = self.S / self.cluster.slow_memory_bandwidth
        self._act_t = act_t = np.floor(g.act * f).astype(np.int64)
        self._coef_ov = coef = np.floor(g.p_size * f).astype(np.int64)
        self._mf_ov = int(math.ceil(M * f)) if self.use_over and not self.placed else 0
        for q in range(g.num_params):
            self._tick(q)
            users = g.p_users[g.p_ptr[q] : g.p_ptr[q + 1]].tolist()
            for b in sorted({b for u in users for b in range(lo[u], hi[u] + 1)}):
                uq = m.NewBoolVar(f"use_{q}_{b}")
                for u in users:
                    if lo[u] <= b <= hi[u]:
                        if self._is_literal(u, b):
                            m.AddImplication(x[u][b], uq)
                        else:
                            m.Add(uq >= x[u][b])
                self.use[q, b] = uq
        self.by_block = by_block = [[] for _ in range(k)]
        for (q, b), var in self.use.items():
            by_block[b].append((q, var))
        for b in range(k):
            self._tick()
            members = np.flatnonzero((lo <= b) & (b <= hi)).tolist()
            pk = m.NewIntVar(0, int(act_b.max()), f"peak_{b}")
            for v in members:
                if act_b[v] > 0:
                    m.Add(pk >= int(act_b[v]) * x[v][b])
            self.peak_b[b] = pk
            if self.use_cap and not self.placed:  # placed: per device class
                self._add_capacity(b, cap)
            if self.use_over:
                pt = m.NewIntVar(0, int(act_t.max()), f"peakt_{b}")
                for v in members:
                    if act_t[v] > 0:
                        m.Add(pt >= int(act_t[v]) * x[v][b])
                self.peak_t[b] = pt
                if self.placed:  # the overflow depends on the device class: _add_placement
                    continue
                hi_ov = int(coef.sum() + act_t.max())
                ov = m.NewIntVar(0, hi_ov, f"ov_{b}")
                self.ov_hi.append(hi_ov)
                over_terms = [(int(coef[q]), var) for q, var in by_block[b]]
                m.Add(ov >= _wsum(over_terms) + pt - self._mf_ov)
                self.ov[b] = ov
                self.terms[b].append((1, ov))

    def _add_capacity(self, b: int, cap: float) -> None:
        """Block b's parameters and peak fit the capacity (in memory units)."""
        pterms = [(int(self._p_bytes[q]), var) for q, var in self.by_block[b]]
        self.m.Add(_wsum(pterms) + self.peak_b[b] <= int(math.floor(cap / self.mem_unit)))

    def _cut_work(self) -> np.ndarray:
        """Per node: integer time every block holding it costs at least (cuts, narrowing)."""
        return self.w_int

    def _add_objective(self) -> None:
        """T >= f(b) for every block, S * (universal bound) <= T <= the hint's cost."""
        m = self.m
        max_f = int(self.w_int.sum() + 2 * self.io_int.sum())
        max_f += sum(self.ov_hi)
        if self.placed:
            max_f = self.max_f + self._placed_overflow_max()
        self.T = T = m.NewIntVar(0, max(1, max_f, self.ub_int or 0), "T")
        if self.placed:
            self._add_placement()
        else:
            for b in range(self.k):
                m.Add(_wsum(self.terms[b]) <= T)
        # T >= S * (universal bound) keeps every plan's integer cost <= S * its real cost
        # (clamped to the hint's integer cost, which rounding can put a few units lower)
        lb_int = int(math.floor(lower_bound(self.g, self.cluster) * self.S * (1 - 1e-12)))
        if self.hint_int is not None:
            lb_int = min(lb_int, self.hint_int)
        if self.ub_int is not None:
            lb_int = min(lb_int, self.ub_int)
        if lb_int > 0:
            m.Add(lb_int <= T)
        if self.ub_int is not None:
            m.Add(self.ub_int >= T)

    def _placed_overflow_max(self) -> int:
        """The largest overflow term of any block on any class (T's domain, placed model)."""
        if not self.use_over:
            return 0
        return int(self._coef_ov.sum() + self._act_t.max())

    def _add_placement(self) -> None:
        """The device choice on a heterogeneous cluster (docs/clusters.md, "What the solvers
        do"): y[b][c] = block b runs on a device of class c (one class per block, at most as
        many blocks as the class has devices); ng[v][h] = node v's block runs in group h. For
        every (block, class) pair, enforced by y[b][c], the block's cost on that class is at
        most T: work scaled by the class's compute, overflow against its fast memory, each
        received tensor at the link from the producer's group, each sent tensor once per
        link class among its readers' groups (inside the group, between groups), and the
        class's capacity. Every term is the evaluator's, rounded down: exact up to rounding,
        so the proven bound holds for every plan and placement."""
        self._add_class_choice()
        # per (block, group): receive and send terms, shared by the classes of the group
        io_terms = [[[] for _ in range(len(self.cluster.groups))] for _ in range(self.k)]
        self._add_receive_terms(io_terms)
        self._add_send_terms(io_terms)
        self._add_class_costs(io_terms)

    def _add_class_choice(self) -> None:
        """y[b][c]: block b runs on a device of class c (exactly one class per block, at most
        as many blocks as the class has devices); gy[b][h]: block b runs in group h."""
        m, k, cl = self.m, self.k, self.classes
        C, H = len(cl), len(self.cluster.groups)
        self.y = [[m.NewBoolVar(f"y_{b}_{c}") for c in range(C)] for b in range(k)]
        for b in range(k):
            m.AddExactlyOne(self.y[b])
        for c in range(C):
            m.Add(sum(self.y[b][c] for b in range(k)) <= int(cl.count[c]))
        in_group = [[c for c in range(C) if cl.group[c] == h] for h in range(H)]
        self.gy = [[sum(self.y[b][c] for c in in_group[h]) for h in range(H)] for b in range(k)]
        self.ng: dict[int, list] = {}

    def _group_of(self, v: int) -> list:
        """ng[v][h]: exactly the group of v's block's device (one row per node, made when a
        term first needs it)."""
        if v not in self.ng:
            m, H = self.m, len(self.cluster.groups)
            row = [m.NewBoolVar(f"ng_{v}_{h}") for h in range(H)]
            m.AddExactlyOne(row)
            for b in range(self.lo[v], self.hi[v] + 1):
                for h in range(H):
                    m.Add(row[h] >= self.x[v][b] + self.gy[b][h] - 1)
            self.ng[v] = row
        return self.ng[v]

    def _add_receive_terms(self, io_terms: list) -> None:
        """Each received tensor at the link from its producer's group: the cheaper link's
        cost always, the difference when the dearer link carries it (``io_terms[b][h]``)."""
        g, m, S = self.g, self.m, self.S
        H, bw = len(self.cluster.groups), self.link_bw
        for (t, b), ib in self.recv.items():
            self._tick(t)
            size, p = float(g.t_size[t]), int(g.t_producer[t])
            for h in range(H):
                if H == 1:
                    io_terms[b][h].append((int(math.floor(size / bw[h, h] * S)), ib))
                    continue
                a_in = int(math.floor(size / bw[h, h] * S))
                a_bt = int(math.floor(size / bw[1 - h if h == 0 else 0, h] * S))
                lo_c, extra = min(a_in, a_bt), abs(a_in - a_bt)
                if lo_c:
                    io_terms[b][h].append((lo_c, ib))
                if extra:  # z = the receive happens over the dearer of the two links
                    z = m.NewBoolVar(f"rz_{t}_{b}_{h}")
                    ng_p = self._group_of(p)[h]
                    if a_bt > a_in:
                        m.Add(z >= ib - ng_p)  # the producer is in another group
                    else:
                        m.Add(z >= ib + ng_p - 1)  # the producer is in this group
                    io_terms[b][h].append((extra, z))

    def _add_send_terms(self, io_terms: list) -> None:
        """Each sent tensor once per link class among its readers' groups: inside the group,
        between groups (``io_terms[b][h]``)."""
        g, m, x, S = self.g, self.m, self.x, self.S
        H, bw, lcls = len(self.cluster.groups), self.link_bw, self.link_cls
        ordered = set(zip(g.e_src.tolist(), g.e_dst.tolist(), strict=True))
        for (t, b), ob in self.send.items():
            self._tick(t)
            size, p = float(g.t_size[t]), int(g.t_producer[t])
            cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]].tolist()
            for h in range(H):
                a_in = int(math.floor(size / bw[h, h] * S))
                other = [j for j in range(H) if j != h]
                if not other or lcls[h, h] == lcls[h, other[0]]:  # one link class: one send
                    if a_in:
                        io_terms[b][h].append((a_in, ob))
                    continue
                a_bt = int(math.floor(size / bw[h, other[0]] * S))
                s_in = m.NewBoolVar(f"si_{t}_{b}_{h}")
                s_bt = m.NewBoolVar(f"sb_{t}_{b}_{h}")
                for c in cons:
                    away = x[p][b] - le_or_x(self, p, c, b, ordered)
                    ng_c = self._group_of(c)[h]
                    m.Add(s_in >= away + ng_c - 1)  # a reader in another block of group h
                    m.Add(s_bt >= away - ng_c)  # a reader in another group
                for coef, var in ((a_in, s_in), (a_bt, s_bt)):
                    if coef:
                        io_terms[b][h].append((coef, var))

    def _add_class_costs(self, io_terms: list) -> None:
        """The enforced cost (work scaled by the class's compute, overflow against its fast
        memory, the group's io terms) and capacity of every (block, class)."""
        g, m, cl, x, lo, hi = self.g, self.m, self.classes, self.x, self.lo, self.hi
        self.placed_terms = [0] * self.k
        self.ov_class: dict[tuple[int, int], object] = {}
        f_ov = self.S / self.cluster.slow_memory_bandwidth
        for b in range(self.k):
            self._tick()
            members = [v for v in range(g.n) if lo[v] <= b <= hi[v]]
            for c in range(len(cl)):
                h = int(cl.group[c])
                wc = self.w_class[c]
                terms = [(int(wc[v]), x[v][b]) for v in members if wc[v]] + io_terms[b][h]
                rounded = len(terms)
                M_c = float(cl.memory[c])
                if self.use_over and math.isfinite(M_c):
                    ov = m.NewIntVar(0, self._placed_overflow_max(), f"ovc_{b}_{c}")
                    over = [(int(self._coef_ov[q]), var) for q, var in self.by_block[b]]
                    mf_c = int(math.ceil(M_c * f_ov))
                    m.Add(ov >= _wsum(over) + self.peak_t[b] - mf_c)
                    self.ov_class[b, c] = ov
                    terms.append((1, ov))
                    rounded += len(over) + 2
                self.placed_terms[b] = max(self.placed_terms[b], rounded)
                self._bound_class_cost(b, c, terms, io_terms[b][h])
                cap_c = float(cl.capacity[c])
                if self.use_mem and math.isfinite(cap_c):
                    self._add_class_capacity(b, c, cap_c)

    def _bound_class_cost(self, b: int, c: int, terms: list, io: list) -> None:
        """Block b's cost on class c (``terms``; ``io``: its io terms among them) is at
        most T when the block runs there."""
        self.m.Add(_wsum(terms) <= self.T).OnlyEnforceIf(self.y[b][c])

    def _add_class_capacity(self, b: int, c: int, cap_c: float) -> None:
        """Block b's parameters and peak fit class c's capacity when it runs there."""
        pterms = [(int(self._p_bytes[q]), var) for q, var in self.by_block[b]]
        limit = int(math.floor(cap_c / self.mem_unit))
        self.m.Add(_wsum(pterms) + self.peak_b[b] <= limit).OnlyEnforceIf(self.y[b][c])

    def read_placement(self, value) -> np.ndarray:
        """The device of every block in a solution (``value(var)``): each class's devices in
        block order (devices of one class are interchangeable)."""
        seq = np.array(
            [
                next(c for c in range(len(self.classes)) if value(self.y[b][c]))
                for b in range(self.k)
            ]
        )
        return _devices_of(self.classes, seq)

    def add_placement_hint(self, a: np.ndarray, devices: np.ndarray) -> None:
        """Hint the placement variables with the values of plan ``a`` (coarse) on
        ``devices``; CP-SAT completes the auxiliary ones."""
        m, cl = self.m, self.classes
        seq = _classes_of(cl, devices)
        for b in range(self.k):
            for c in range(len(cl)):
                m.AddHint(self.y[b][c], int(seq[b] == c))
        for v, row in self.ng.items():
            h = int(cl.group[seq[a[v]]])
            for j, var in enumerate(row):
                m.AddHint(var, int(j == h))

    def _add_cuts(self) -> None:
        """Redundant cuts (constants folded): the work of blocks 0..b is at most (b+1) T, of
        b+1..k-1 at most (k-1-b) T; with overflow modelled also work + charged parameter
        costs <= (b+1) (T + Mf) and (k-1-b) (T + Mf) (the argument of :meth:`_blocks_needed`)."""
        m, k, T, le, lo, hi = self.m, self.k, self.T, self.le, self.lo, self.hi
        w = self._cut_work()
        weights = [(w, w, 0)]
        if self.mf is not None:
            mf = int(self.mf)
            weights.append((w + self.mass_first, w + self.mass_last, mf))
        for b in range(k - 1):
            self._tick()
            done = hi <= b  # le[v][b] is TRUE: in blocks 0..b
            free = np.flatnonzero((lo <= b) & (b < hi))
            for wf, wl, extra in weights:
                pre = [(int(wf[v]), le[v][b]) for v in free.tolist() if wf[v]]
                before = int(wf[done].sum())
                m.Add(_wsum(pre) + before <= (b + 1) * T + (b + 1) * extra)
                pre_l = [(int(wl[v]), le[v][b]) for v in free.tolist() if wl[v]]
                after = int(wl[~done].sum())
                m.Add(after - _wsum(pre_l) <= (k - 1 - b) * T + (k - 1 - b) * extra)

    def _add_symmetry(self) -> None:
        """Symmetry breaking: used[b] = block b is non-empty; empty blocks come last."""
        m, k, x, lo, hi = self.m, self.k, self.x, self.lo, self.hi
        self.used = []
        for b in range(k):
            self._tick()
            ub = m.NewBoolVar(f"used_{b}")
            members = [x[v][b] for v in range(self.g.n) if lo[v] <= b <= hi[v]]
            if members:
                m.AddMaxEquality(ub, members)
            else:
                m.Add(ub == 0)
            self.used.append(ub)
        self._order_used()

    def _order_used(self) -> None:
        """Empty blocks come last: used[b + 1] => used[b]."""
        for b in range(self.k - 1):
            self.m.AddImplication(self.used[b + 1], self.used[b])

    # ------------------------------------------------------------------ helpers
    def size(self) -> dict:
        """Variables and constraints of the built model (for stats and benchmarks)."""
        proto = self.m.Proto()
        return {
            "model_variables": len(proto.variables),
            "model_constraints": len(proto.constraints),
            "model_window": round(float(np.mean(self.hi - self.lo + 1)), 2),
        }

    def block_costs_int(self, a: np.ndarray) -> np.ndarray:
        """Integer block costs of a plan on this coarse graph (for the upper bound)."""
        g, k = self.g, self.k
        a = np.asarray(a)
        w = np.bincount(a, weights=self.w_int, minlength=k).astype(np.int64)
        io = self.block_io_int(a)
        ov = np.zeros(k, dtype=np.int64)
        if self.use_over:
            f = self.S / self.cluster.slow_memory_bandwidth
            coef = np.floor(self.g.p_size * f).astype(np.int64)
            for b in range(k):
                qs = np.unique(g.pair_param[a[g.p_users] == b])
                members = a == b
                pt_ = int(np.floor(g.act[members] * f).max()) if members.any() else 0
                ov[b] = max(
                    0, int(coef[qs].sum()) + pt_ - int(math.ceil(self.cluster.fast_memory * f))
                )
        return w + io + ov

    def block_io_int(self, a: np.ndarray) -> np.ndarray:
        """Integer io terms (received plus sent tensors) of every block of plan ``a``."""
        g, k = self.g, self.k
        io_bytes_in = np.zeros(k, dtype=np.int64)
        io_bytes_out = np.zeros(k, dtype=np.int64)
        pt = g.pair_tensor
        cross = a[g.t_cons] != a[g.t_producer][pt]
        if cross.any():
            keys = np.unique(pt[cross] * k + a[g.t_cons][cross])
            np.add.at(io_bytes_in, keys % k, self.io_int[keys // k])
            sent = np.unique(pt[cross])
            np.add.at(io_bytes_out, a[g.t_producer][sent], self.io_int[sent])
        return io_bytes_in + io_bytes_out

    def add_hint(self, a: np.ndarray) -> None:
        """Hint every decision and auxiliary variable with the values of plan ``a``."""
        m, k, g = self.m, self.k, self.g
        const = {id(self.TRUE), id(self.FALSE)}  # identity: IntVar == builds an expression
        for v in range(g.n):
            for b in range(k):
                if id(self.le[v][b]) not in const:
                    m.AddHint(self.le[v][b], int(a[v] <= b))
        for (t, b), var in self.send.items():
            p = g.t_producer[t]
            cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
            m.AddHint(var, int(a[p] == b and bool(np.any(a[cons] != b))))
        for (t, b), var in self.recv.items():
            p = g.t_producer[t]
            cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
            m.AddHint(var, int(a[p] != b and bool(np.any(a[cons] == b))))
        for (q, b), var in self.use.items():
            users = g.p_users[g.p_ptr[q] : g.p_ptr[q + 1]]
            m.AddHint(var, int(bool(np.any(a[users] == b))))
        for b in range(k):
            m.AddHint(self.used[b], int(bool(np.any(a == b))))
        # a complete hint: CP-SAT then starts from it as a solution (an incomplete one was
        # not used on the 70B at k = 64, which searched without any incumbent)
        for b in range(k):
            members = a == b
            if self.peak_b[b] is not None:
                m.AddHint(self.peak_b[b], int(self._act_b[members].max(initial=0)))
            if self.peak_t[b] is not None:
                pt = int(self._act_t[members].max(initial=0))
                m.AddHint(self.peak_t[b], pt)
                qs = np.unique(g.pair_param[members[g.p_users]])
                if self.ov[b] is not None:
                    ov = max(0, int(self._coef_ov[qs].sum()) + pt - self._mf_ov)
                    m.AddHint(self.ov[b], ov)
        self._hint_objective(a)

    def _hint_objective(self, a: np.ndarray) -> None:
        """Hint T with plan ``a``'s bottleneck (placed: the hint's, CP-SAT completes the
        per-class terms)."""
        if self.placed:
            if self.ub_int is not None:
                self.m.AddHint(self.T, self.ub_int)
            return
        self.m.AddHint(self.T, int(self.block_costs_int(a).max()))

    def read(self, solver: cp_model.CpSolver) -> np.ndarray:
        """The block of every coarse node in the solver's solution."""
        return self.read_values(solver.Value)

    def read_values(self, value) -> np.ndarray:
        """The block of every coarse node, from ``value(var)`` (a solver's or a callback's):
        the first block b of its window with le[v][b] true."""
        a = np.empty(self.g.n, dtype=np.int64)
        le = self.le
        for v, (lo, hi) in enumerate(zip(self.lo.tolist(), self.hi.tolist(), strict=True)):
            a[v] = next((b for b in range(lo, hi) if value(le[v][b])), hi)
        return a


def le_or_x(model: _Model, p: int, c: int, b: int, ordered: set) -> object:
    """The term of consumer c in "tensor of p leaves block b": le[c][b] when c cannot come
    before p (an order edge), else x[c][b] (as in :meth:`_Model._add_io`)."""
    return model.le[c][b] if (p, c) in ordered else model.x[c][b]


def _wsum(pairs: list[tuple[int, object]]):
    """sum(c * v) built by CP-SAT in one call (Python's sum is slow on long expressions)."""
    if not pairs:
        return 0
    coefs, lits = zip(*pairs, strict=True)
    return cp_model.LinearExpr.WeightedSum(list(lits), list(coefs))


def _closure_sums(
    g: Graph, anc_weights: list[np.ndarray], desc_weights: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Sums of each weight vector over the strict ancestors (rows of the first result) and
    over the strict descendants (rows of the second) of every node.

    Uses bitsets over a topological order (Python ints as bitsets: exact and fast enough for
    thousands of nodes; networkx would build explicit sets per node).
    """
    order = g.topo_order.tolist()
    nbytes = (g.n + 7) // 8

    def sums(ptr: np.ndarray, idx: np.ndarray, seq: list[int], weights: list[np.ndarray]):
        reach = [0] * g.n
        for v in seq:
            bits = 0
            for u in idx[ptr[v] : ptr[v + 1]].tolist():
                bits |= reach[u] | (1 << u)
            reach[v] = bits
        W = np.stack([np.asarray(x, dtype=np.int64) for x in weights])
        out = np.empty((len(weights), g.n), dtype=np.int64)
        for v, bits in enumerate(reach):  # the weight of the set bits, unpacked in C
            flags = np.unpackbits(
                np.frombuffer(bits.to_bytes(nbytes, "little"), np.uint8), bitorder="little"
            )[: g.n].astype(bool)
            out[:, v] = W[:, flags].sum(axis=1)
        return out

    ptr, idx = g.pred
    sptr, sidx = g.succ
    return sums(ptr, idx, order, anc_weights), sums(sptr, sidx, order[::-1], desc_weights)


@dataclass
class _Placed:
    """A plan of the original graph: the block of every node and, on a cluster whose devices
    or links differ, the device of every block (None: block b on device b)."""

    blocks: np.ndarray
    devices: np.ndarray | None = None


@dataclass
class _WarmStart:
    """The caller's hint as the model reads it. ``plan``: on the original graph (None: no
    hint, or no placement of it fits); ``coarse``: the same blocks on the coarse graph,
    compacted to 0..j-1 (the model puts empty blocks last); on a cluster whose devices or links
    differ ``plan.devices`` is its best placement and ``cost`` its objective there."""

    plan: _Placed | None = None
    coarse: np.ndarray | None = None
    cost: float | None = None


@dataclass
class _SearchOutcome:
    """What the CP-SAT search left: its status (UNKNOWN when the warm start met the certified
    bound and nothing was searched), the bound it proved in integer units, the plan the
    callback stopped at (None: none), the solver (to read its solution), its worker count, the
    seconds the model took to build and the statistics so far."""

    status: int
    bound_int: float
    met: _Placed | None
    solver: cp_model.CpSolver
    workers: int
    build_seconds: float
    stats: dict


class _Progress(cp_model.CpSolverSolutionCallback):
    """Reports each incumbent (``fn``) and, given ``stop``, stops the search at the first
    incumbent that meets the certified bound (kept in ``met``)."""

    def __init__(self, scale: float, start: float, fn, stop=None):
        super().__init__()
        self.scale, self.start, self.fn, self.stop = scale, start, fn, stop
        self.best = math.inf
        self.met: _Placed | None = None

    def on_solution_callback(self) -> None:
        self.best = self.ObjectiveValue() / self.scale
        if self.stop is not None and self.met is None:
            self.met = self.stop(self.ObjectiveValue(), self.Value)
            if self.met is not None:
                self.StopSearch()
        if self.fn:
            self.fn(
                self.best, self.BestObjectiveBound() / self.scale, time.perf_counter() - self.start
            )


def solve_cpsat(
    g: Graph, cluster: Cluster, hint: np.ndarray | None = None, options: CpsatOptions | None = None
) -> Plan | None:
    """Solve exactly (or to a certified gap within the time limit).

    ``hint`` is a valid plan (assignment of the original graph) used as warm start and upper
    bound. Returns None when the problem is proven infeasible or no plan was found in time;
    raises :class:`MtppError` with the reason when a single node or group cannot fit.
    With ``options.stop_at`` the search is skipped or stopped once a plan meets that bound
    (``stats["stopped"]`` says which); the caller's certified bound is then the proof.
    """
    opts = options or CpsatOptions()
    t0 = time.perf_counter()
    cg, labels = coarse_view(g)
    _check_single_fits(g, cg, labels, cluster)
    tie = opts.tie_break and cluster.homogeneous  # the tie-break does not model the placement
    warm = _warm_start(g, cluster, cg, labels, hint)
    warm_met = warm.plan is not None and _plan_meets(g, cluster, warm.plan, opts.stop_at)
    if warm_met and not tie:  # nothing left for CP-SAT to do: not even the model is built
        return _warm_met_plan(g, cluster, warm.plan, opts, t0, cg.n)
    try:
        model = _build(cg, cluster, warm, opts, t0)
    except _BuildTimeout:
        if warm_met:
            return _warm_met_plan(g, cluster, warm.plan, opts, t0, cg.n)
        return _timed_out(g, cluster, warm.plan, opts, t0, cg.n)
    build_s = time.perf_counter() - t0
    search = _search(model, g, labels, cluster, opts, t0, build_s, tie, warm_met)
    if search.status == cp_model.INFEASIBLE:
        return None
    chosen = _read(model, search, g, labels, cluster, warm, warm_met, opts)
    if model.placed:
        search.stats["bound_scope"] = ALL_PLACEMENTS
        search.stats["device_classes"] = len(model.classes)
    # the bound and status are this first stage's; the tie-break only picks among plans
    # whose re-evaluated bottleneck is at most this plan's
    chosen.blocks = _tie_break_stage(model, search, g, labels, cluster, chosen.blocks, opts, t0)
    return _to_plan(g, cluster, model, search, chosen, time.perf_counter() - t0)


def _warm_start(
    g: Graph, cluster: Cluster, cg: Graph, labels: np.ndarray, hint: np.ndarray | None
) -> _WarmStart:
    """The hint on the coarse graph with used blocks compacted to 0..j-1, and on a cluster
    whose devices or links differ on its best placement (none when no placement fits)."""
    if hint is None:
        return _WarmStart()
    hint = np.asarray(hint)
    coarse = np.empty(cg.n, dtype=np.int64)
    coarse[labels] = hint
    coarse = np.searchsorted(np.unique(coarse), coarse)
    if cluster.homogeneous:
        return _WarmStart(_Placed(hint), coarse)
    compact = coarse[labels]
    best = best_placement(g, cluster, compact)
    if best.devices is None:
        return _WarmStart()
    return _WarmStart(_Placed(compact, best.devices), coarse, best.objective)


def _build(cg: Graph, cluster: Cluster, warm: _WarmStart, opts: CpsatOptions, t0: float) -> _Model:
    """The model of the coarse graph, hinted with the warm start. The build may take most of
    the limit (BUILD_SHARE; :class:`_BuildTimeout` past it), or HINTED_BUILD_SHARE of it when
    there is a warm-start plan to fall back on; CP-SAT then gets what is left."""
    share = BUILD_SHARE if warm.plan is None else HINTED_BUILD_SHARE
    deadline = t0 + share * opts.time_limit
    model = _Model(cg, cluster, warm.coarse, deadline=deadline, upper_cost=warm.cost)
    if warm.coarse is not None:
        model.add_hint(warm.coarse)
        if model.placed:
            model.add_placement_hint(warm.coarse, warm.plan.devices)
    return model


def _search(
    model: _Model,
    g: Graph,
    labels: np.ndarray,
    cluster: Cluster,
    opts: CpsatOptions,
    t0: float,
    build_s: float,
    tie: bool,
    warm_met: bool,
) -> _SearchOutcome:
    """CP-SAT on the model (none when the warm start met the certified bound: only the
    tie-break runs), stopped at the first incumbent that meets ``opts.stop_at``."""
    # CP-SAT's presolve checks the clock coarsely and overruns on big models by about the time
    # it took to build them: reserve that too, so the whole solve keeps --time-limit
    search_s = max(0.01, opts.time_limit - 2 * build_s)
    params = search_params(opts.workers, opts.seed, opts.gap, opts.log)
    size = model.size()
    if size["model_variables"] > BIG_MODEL_VARS:
        # measured on Llama shapes: the first presolve pass does the work, the next ones
        # cost 10-20 s more before the first branch and change neither plan nor bound
        params["max_presolve_iterations"] = 1
    if size["model_variables"] > NO_PROBING_VARS:
        # presolve's probing is most of presolve on big models: on a 1,000-node layered DAG
        # at k = 64 (66 k variables) CP-SAT was still presolving after 45 s (no branch, no
        # solution); without probing the search starts after 24 s and improves the hint
        params["cp_model_probing_level"] = 0
    solver = new_solver(
        search_s * (1 - TIE_BREAK_SHARE) if tie else search_s,
        {**params, **opts.params},
    )
    stop = _stopper(model, g, labels, cluster, opts.stop_at)
    cb = _Progress(model.S, t0, opts.on_progress, stop)
    if opts.on_progress:
        solver.best_bound_callback = lambda bnd: opts.on_progress(
            cb.best, bnd / model.S, time.perf_counter() - t0
        )
    if warm_met:  # the warm start is the first stage's plan; only the tie-break runs
        status, bound_int = cp_model.UNKNOWN, 0
    else:
        status = solver.Solve(model.m, cb)
        bound_int = solver.BestObjectiveBound()
    workers = solver.parameters.num_workers
    stats = {
        "cpsat_status": "NOT_SOLVED" if warm_met else solver.StatusName(status),
        "coarse_nodes": model.g.n,
        "build_seconds": round(build_s, 3),
        "scale": model.S,
        "branches": 0 if warm_met else solver.NumBranches(),
        "conflicts": 0 if warm_met else solver.NumConflicts(),
        "workers": workers,
        "memory_modelled": model.use_mem,
        **size,
    }
    return _SearchOutcome(status, bound_int, cb.met, solver, workers, build_s, stats)


def _read(
    model: _Model,
    search: _SearchOutcome,
    g: Graph,
    labels: np.ndarray,
    cluster: Cluster,
    warm: _WarmStart,
    warm_met: bool,
    opts: CpsatOptions,
) -> _Placed:
    """The first stage's plan: the warm start when it met the bound, the callback's plan when
    it stopped the search (checked and re-evaluated), the warm start when CP-SAT found none,
    else CP-SAT's solution unless the warm start is really better or the solution breaks the
    real capacity (memory is modelled in rounded-down units, costs in rounded-down integers)."""
    stats = search.stats
    if warm_met:
        stats["stopped"] = STOPPED_WARM
        return _Placed(warm.plan.blocks, warm.plan.devices)
    if search.met is not None:
        stats["stopped"] = STOPPED_INCUMBENT
        return search.met
    if search.status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if warm.plan is None:
            raise MtppError(
                f"no plan found within the time limit ({opts.time_limit:g} s) and no heuristic "
                "plan fits either; raise --time-limit"
            )
        return _Placed(warm.plan.blocks, warm.plan.devices)
    a = model.read(search.solver)[labels]
    dev = model.read_placement(search.solver.Value) if model.placed else None
    if warm.plan is not None:
        mine = evaluate(g, cluster, a, placement=dev).objective
        hint = warm.plan
        worse = evaluate(g, cluster, hint.blocks, placement=hint.devices).objective < mine
        if worse or validate(g, cluster, a, placement=dev):
            stats["kept_hint"] = True
            return _Placed(hint.blocks, hint.devices)
    return _Placed(a, dev)


def _tie_break_stage(
    model: _Model,
    search: _SearchOutcome,
    g: Graph,
    labels: np.ndarray,
    cluster: Cluster,
    a: np.ndarray,
    opts: CpsatOptions,
    t0: float,
) -> np.ndarray:
    """Among the plans no worse than ``a``, the least transfer then the lowest latency
    (:mod:`solver.pipeline.exact.tiebreak`), within its share of the time left; the plan's
    blocks, and what happened in ``stats["tie_break"]``."""
    stats = search.stats
    if not opts.tie_break:
        stats["tie_break"] = {"summary": "tie-break skipped (tie_break=false)"}
        return a
    if model.placed:
        stats["tie_break"] = {"summary": "tie-break skipped: it does not model the placement"}
        return a
    left = opts.time_limit - (time.perf_counter() - t0) - search.build_seconds
    main = opts.spent_before + time.perf_counter() - t0
    budget = tie_break_budget(left, main, opts.tie_break_seconds)
    if not budget > TIE_BREAK_MIN_SECONDS / 2:
        stats["tie_break"] = {"summary": "tie-break skipped: no time left"}
        return a
    ca = np.empty(model.g.n, dtype=np.int64)
    ca[labels] = a
    ca = np.searchsorted(np.unique(ca), ca)  # compact, as the hint (same costs)
    params = {"num_workers": search.workers, "random_seed": opts.seed, **opts.params}
    a, stats["tie_break"] = tie_break(model, g, labels, cluster, ca, budget, params)
    return a


def _to_plan(
    g: Graph,
    cluster: Cluster,
    model: _Model,
    search: _SearchOutcome,
    chosen: _Placed,
    wall: float,
) -> Plan:
    """The plan with the bound CP-SAT proved (whatever the status: also when the time ran
    out), in integer units divided by the scale: it bounds the real problem (every cost
    rounded down). make_plan certifies: OPTIMAL only when the bound meets the plan, within
    the model's rounding resolution when CP-SAT proved its optimum (core.result.certify)."""
    stats = search.stats
    stats["cpsat_bound_int"] = search.bound_int
    stats["cpsat_lower_bound"] = search.bound_int / model.S
    lb = max(lower_bound(g, cluster), search.bound_int / model.S)
    stats["resolution"] = model.resolution
    # CP-SAT's proof covers the rounded model: its plan is optimal within the rounding error
    proven = search.status == cp_model.OPTIMAL
    return make_plan(
        g,
        cluster,
        chosen.blocks,
        "cpsat",
        lower_bound=lb,
        status=OPTIMAL,
        wall_seconds=wall,
        stats=stats,
        resolution=model.resolution if proven else 0.0,
        placement=chosen.devices,
    )


def _plan_meets(g: Graph, cluster: Cluster, plan: _Placed, bound: float | None) -> bool:
    """True when ``plan`` is valid and its re-evaluated objective meets the proven lower
    ``bound`` (:func:`meets_bound`)."""
    if bound is None or not math.isfinite(bound):
        return False
    if validate(g, cluster, plan.blocks, placement=plan.devices):
        return False
    return meets_bound(evaluate(g, cluster, plan.blocks, placement=plan.devices).objective, bound)


def _stopper(model: _Model, g: Graph, labels: np.ndarray, cluster: Cluster, bound: float | None):
    """The solution callback's test: ``check(objective_int, value)`` returns the incumbent
    when it meets ``bound``, else None; None without a bound.

    Integer costs are at most S times the real ones, so an incumbent whose integer objective
    is above S * bound * (1 + tol) cannot meet the bound: skipped without reading it (a
    generous margin, as the real re-evaluated plan decides)."""
    if bound is None or not math.isfinite(bound):
        return None
    ceiling = model.S * bound * (1 + OPTIMALITY_TOL) * (1 + 1e-9) + 1

    def check(objective_int: float, value) -> _Placed | None:
        if objective_int > ceiling:
            return None
        a = model.read_values(value)[labels]
        dev = model.read_placement(value) if model.placed else None
        plan = _Placed(a, dev)
        return plan if _plan_meets(g, cluster, plan, bound) else None

    return check


def _warm_met_plan(
    g: Graph, cluster: Cluster, warm: _Placed, opts: CpsatOptions, t0: float, coarse_nodes: int
) -> Plan:
    """The warm-start plan, which meets ``opts.stop_at``: FEASIBLE with the universal bound
    here (the caller's certified bound proves it optimal; the search is skipped)."""
    stats = {
        "cpsat_status": "NOT_SOLVED",
        "stopped": STOPPED_WARM,
        "coarse_nodes": coarse_nodes,
        "tie_break": {
            "summary": "tie-break skipped (tie_break=false)"
            if not opts.tie_break
            else "tie-break skipped: it does not model the placement"
        },
    }
    return _hint_plan(g, cluster, warm, t0, stats)


def _timed_out(
    g: Graph,
    cluster: Cluster,
    warm: _Placed | None,
    opts: CpsatOptions,
    t0: float,
    coarse_nodes: int,
) -> Plan:
    """The warm-start plan with the universal bound, when the build passed its share of the
    limit (HINTED_BUILD_SHARE: with a warm start at hand)."""
    if warm is None:
        raise MtppError(
            f"no plan found within the time limit ({opts.time_limit:g} s): building the CP-SAT "
            "model took it all and no heuristic plan fits; raise --time-limit"
        )
    stats = {
        "cpsat_status": "NOT_SOLVED",
        "note": f"building the CP-SAT model took more than {HINTED_BUILD_SHARE:.0%} of the "
        "time limit, which leaves no time to search: warm-start plan",
        "coarse_nodes": coarse_nodes,
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    return _hint_plan(g, cluster, warm, t0, stats)


def _hint_plan(g: Graph, cluster: Cluster, warm: _Placed, t0: float, stats: dict) -> Plan:
    """The warm-start plan without a search: FEASIBLE with the universal bound; certify adds
    the certified one."""
    return make_plan(
        g,
        cluster,
        warm.blocks,
        "cpsat",
        lower_bound=lower_bound(g, cluster),
        status=FEASIBLE,
        wall_seconds=time.perf_counter() - t0,
        stats=stats,
        placement=warm.devices,
    )


def _check_single_fits(g: Graph, cg: Graph, labels: np.ndarray, cluster: Cluster) -> None:
    """Name the node or co-location group that alone exceeds the hard capacity (of the
    largest device, when devices differ)."""
    capacity = float(cluster.device_arrays()[1].max())
    if math.isinf(capacity):
        return
    need = own_param_bytes(cg) + cg.act
    bad = np.flatnonzero(need > capacity * (1 + 1e-12))
    if len(bad):
        v = int(bad[0])
        members = np.flatnonzero(labels == v)
        what = (
            f"node {g.names[members[0]]!r}"
            if len(members) == 1
            else f"the co-location group of {len(members)} nodes containing {g.names[members[0]]!r}"
        )
        raise MtppError(
            f"{what} needs {need[v]:.6g} bytes (params + peak) but each device holds at most "
            f"{capacity:.6g} bytes: no plan can fit; raise the capacity or drop it"
        )
