"""The block cover bound: a plan with every block at most T needs more than k blocks.

A block of a plan is *valid at T*: convex (a node on an order path between two of its nodes
is in it: that node's block lies between theirs), ``f(S) <= T`` and, with a hard capacity,
``params(S) + peak(S) <= C``. For any node prices pi (of any sign), let U be an upper bound of
``max pi(S)`` over the valid sets S (the empty set included, so U >= 0). A plan with every
block at most T partitions the nodes into k valid blocks (empty ones allowed), so
``sum_v pi_v = sum_b pi(B_b) <= k U``. Hence ``sum_v pi_v > k U`` proves OPT > T (Farley's
bound of the set-partitioning relaxation; docs/bounds.md, "block cover").

U comes from CP-SAT's proven objective bound on a *pricing model* whose feasible sets include
every valid set: one boolean per coarse node, the io of each tensor whose members are split
(sent when its producer is in, received when a consumer is in), the overflow and the capacity
with every coefficient rounded down and T rounded up, and convexity. A pricing cut short by
the clock still gives a valid U (its bound). The prices come from column generation: a
restricted master LP over known valid sets (GLOP), its duals priced first over the intervals
of a few topological orders (each interval of a topological order is convex; their costs are
computed once per bound), then by the CP-SAT model, which also gives the proof. No order,
block or coarsening is imposed: the master and its columns only choose pi.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import evaluate
from solver.core.graph import Graph, coarse_view

MAX_NODES = 150  # coarse nodes: above it a pricing takes seconds and few probes finish
SCALE_BITS = 40  # every cost in units of (largest block cost) / 2^SCALE_BITS, rounded down
COEFFICIENT_CAP = 2**50  # memory coefficients above it are lowered to it (a relaxation)
PRICE_BITS = 24  # prices in units of (largest |dual|) / 2^PRICE_BITS
GROWN_SEEDS = 10  # sets grown from this many nodes of largest price (and the LP's support)
COLUMNS_PER_ROUND = 40  # interval columns added to the master per round
REDUCED_TOL = 1e-9  # a column enters the master when pi(S) > 1 + this
FIRST_STEP = 1e-3  # the first probe is this far above lo (relative) ...
STEP_GROWTH = 2  # ... and each proof makes the next step this much longer
PROBE_REL_WIDTH = 2e-4  # the probes stop when the interval left is this narrow (relative)
PRICE_SECONDS = 2.0  # one pricing's limit (its bound is valid when cut short)
SMOOTHING = 0.7  # Wentges' weight of the best prices so far ...
MIN_SMOOTHING = 0.05  # ... halved after each pricing that adds no column, then 0


@dataclass(frozen=True)
class BlockCoverBound:
    """The largest T proven (``lo`` when none above it is), the probes made and how many of
    them proved, and the columns the master held at the end."""

    value: float
    probes: int
    proven: int
    columns: int


@dataclass(frozen=True)
class SetCosts:
    """What a node set costs, per coarse node and tensor, for the interval enumeration:
    ``members[t]`` the distinct nodes of tensor t (producer and consumers), ``touch[v]`` the
    tensors v is a member of, ``uses[v]`` the parameters v uses."""

    work: list[float]
    io: list[float]
    members: list[int]
    touch: list[list[int]]
    uses: list[list[int]]
    p_size: list[float]
    act: list[float]
    fast_memory: float
    slow_bandwidth: float


@dataclass(frozen=True)
class Intervals:
    """Feasible intervals of topological orders: ``nodes[r]`` the nodes of row r's interval
    (a convex set), ``cost[r]`` its f; ``prefix`` per order the positions to sum prices."""

    order: np.ndarray  # row -> order index
    start: np.ndarray  # first position in the order
    end: np.ndarray  # one past the last position
    cost: np.ndarray
    orders: list[np.ndarray] = field(default_factory=list)


def set_costs(cg: Graph, cluster: Cluster) -> SetCosts:
    """The per-node and per-tensor data of ``cg``'s set costs (a homogeneous cluster)."""
    B = cluster.link_bandwidth
    touch: list[list[int]] = [[] for _ in range(cg.n)]
    members, io = [], []
    for t in range(cg.num_tensors):
        ends = sorted({int(cg.t_producer[t]), *cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]].tolist()})
        members.append(len(ends))
        io.append(float(cg.t_size[t]) / B if len(ends) > 1 else 0.0)
        for v in ends:
            touch[v].append(t)
    uses: list[list[int]] = [[] for _ in range(cg.n)]
    for q in range(cg.num_params):
        for u in cg.p_users[cg.p_ptr[q] : cg.p_ptr[q + 1]].tolist():
            uses[u].append(q)
    return SetCosts(
        cg.work.astype(float).tolist(),
        io,
        members,
        touch,
        uses,
        cg.p_size.astype(float).tolist(),
        cg.act.astype(float).tolist(),
        float(cluster.fast_memory),
        float(cluster.slow_memory_bandwidth),
    )


def topological_orders(cg: Graph) -> list[np.ndarray]:
    """Two topological orders of the coarse graph: its own numbering (the coarse view numbers
    nodes topologically) and a depth-first one (Kahn's algorithm taking the node enabled
    last); their intervals are convex sets."""
    orders = [np.arange(cg.n)]
    indeg = np.bincount(cg.e_dst, minlength=cg.n).tolist()
    ptr, succ = cg.succ
    stack = [v for v in range(cg.n - 1, -1, -1) if indeg[v] == 0]
    out = []
    while stack:
        v = stack.pop()
        out.append(v)
        for w in reversed(succ[ptr[v] : ptr[v + 1]].tolist()):
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    orders.append(np.array(out, dtype=np.int64))
    return orders


def interval_rows(sc: SetCosts, order: np.ndarray, T: float, deadline: float) -> list[tuple]:
    """(start, end, f) of every interval of ``order`` whose f is at most T (exactly, in
    floating point), walked from each start until work and overflow alone exceed T."""
    n, rows = len(order), []
    seq = order.tolist()
    for i in range(n):
        if time.perf_counter() > deadline:
            break
        inside = [0] * len(sc.members)
        used: dict[int, int] = {}
        work = io = params = peak = 0.0
        for j in range(i, n):
            v = seq[j]
            work += sc.work[v]
            for t in sc.touch[v]:
                c = inside[t] = inside[t] + 1
                if c == 1:
                    io += sc.io[t]
                if c == sc.members[t]:
                    io -= sc.io[t]
            for q in sc.uses[v]:
                if q not in used:
                    used[q] = 1
                    params += sc.p_size[q]
            peak = max(peak, sc.act[v])
            over = max(0.0, params + peak - sc.fast_memory) / sc.slow_bandwidth
            if work + over > T:
                break
            if work + over + io <= T:
                rows.append((i, j + 1, work + over + io))
    return rows


def intervals(cg: Graph, sc: SetCosts, T: float, deadline: float) -> Intervals:
    """The feasible intervals at T of :func:`topological_orders` (an upper end of the
    probes: each probe keeps those of cost at most its T)."""
    orders = topological_orders(cg)
    o, s, e, c = [], [], [], []
    for idx, order in enumerate(orders):
        for start, end, cost in interval_rows(sc, order, T, deadline):
            o.append(idx)
            s.append(start)
            e.append(end)
            c.append(cost)
    as_int = np.array
    return Intervals(
        as_int(o, dtype=np.int64),
        as_int(s, dtype=np.int64),
        as_int(e, dtype=np.int64),
        np.array(c, dtype=float),
        orders,
    )


@dataclass(frozen=True)
class Incidence:
    """Node-tensor and node-parameter pairs with what a set's cost needs, as arrays: the
    local search's delta costs are sums over these pairs. ``anc[v, u]``: u reaches v by
    order edges (u != v); ``desc`` its transpose."""

    nt_node: np.ndarray
    nt_tensor: np.ndarray
    members: np.ndarray
    io: np.ndarray
    np_node: np.ndarray
    np_param: np.ndarray
    p_size: np.ndarray
    work: np.ndarray
    act: np.ndarray
    anc: np.ndarray
    desc: np.ndarray
    fast_memory: float
    slow_bandwidth: float


def incidence(cg: Graph, sc: SetCosts) -> Incidence:
    """The arrays of :class:`Incidence` for ``cg`` (``sc``: its set costs)."""
    nt = [(v, t) for v in range(cg.n) for t in sc.touch[v]]
    pairs = [(v, q) for v in range(cg.n) for q in sc.uses[v]]
    anc = np.zeros((cg.n, cg.n), dtype=bool)
    ptr, pred = cg.pred
    for v in cg.topo_order.tolist():
        for u in pred[ptr[v] : ptr[v + 1]].tolist():
            anc[v] |= anc[u]
            anc[v, u] = True
    node_t = np.array([a for a, _ in nt], dtype=np.int64)
    node_p = np.array([a for a, _ in pairs], dtype=np.int64)
    return Incidence(
        node_t,
        np.array([b for _, b in nt], dtype=np.int64),
        np.array(sc.members, dtype=np.int64),
        np.array(sc.io, dtype=float),
        node_p,
        np.array([b for _, b in pairs], dtype=np.int64),
        np.array(sc.p_size, dtype=float),
        np.array(sc.work, dtype=float),
        np.array(sc.act, dtype=float),
        anc,
        anc.T.copy(),
        sc.fast_memory,
        sc.slow_bandwidth,
    )


@dataclass
class GrowingSet:
    """A convex node set grown one node at a time, with its exact cost terms."""

    inc: Incidence
    inside: np.ndarray
    count: np.ndarray  # per tensor, its members inside
    used: np.ndarray  # per parameter, its users inside
    work: float = 0.0
    io: float = 0.0
    params: float = 0.0
    peak: float = 0.0

    @classmethod
    def empty(cls, inc: Incidence) -> GrowingSet:
        n = len(inc.work)
        return cls(
            inc,
            np.zeros(n, bool),
            np.zeros(len(inc.io), np.int64),
            np.zeros(len(inc.p_size), np.int64),
        )

    def add(self, v: int) -> None:
        inc = self.inc
        self.inside[v] = True
        self.work += inc.work[v]
        ts = inc.nt_tensor[inc.nt_node == v]
        before = (self.count[ts] > 0) & (self.count[ts] < inc.members[ts])
        self.count[ts] += 1
        after = (self.count[ts] > 0) & (self.count[ts] < inc.members[ts])
        self.io += float((inc.io[ts] * (after.astype(float) - before)).sum())
        qs = inc.np_param[inc.np_node == v]
        self.params += float(inc.p_size[qs[self.used[qs] == 0]].sum())
        self.used[qs] += 1
        self.peak = max(self.peak, float(inc.act[v]))

    def cost_with_each(self) -> np.ndarray:
        """f of the set with each node added (the nodes inside: their own f)."""
        inc, n = self.inc, len(self.inc.work)
        c = self.count[inc.nt_tensor]
        m = inc.members[inc.nt_tensor]
        split = (c > 0) & (c < m)
        split_after = (c + 1 > 0) & (c + 1 < m)
        delta = inc.io[inc.nt_tensor] * (split_after.astype(float) - split)
        io = self.io + np.bincount(inc.nt_node, weights=delta, minlength=n)
        fresh = (self.used[inc.np_param] == 0) * inc.p_size[inc.np_param]
        params = self.params + np.bincount(inc.np_node, weights=fresh, minlength=n)
        peak = np.maximum(self.peak, inc.act)
        over = np.maximum(0.0, params + peak - inc.fast_memory) / inc.slow_bandwidth
        return self.work + inc.work + io + over

    def convex_with_each(self) -> np.ndarray:
        """Per node outside: the set with it added is convex (no outside node on a path
        between it and the set)."""
        inc = self.inc
        outside = ~self.inside
        above = inc.anc[self.inside].any(axis=0) & outside  # ancestors of the set, outside
        below = inc.desc[self.inside].any(axis=0) & outside  # descendants of the set, outside
        bad = inc.desc[:, above].any(axis=1) if above.any() else np.zeros(len(outside), bool)
        bad = bad | (inc.anc[:, below].any(axis=1) if below.any() else False)
        return outside & ~bad


def grow(inc: Incidence, pi: np.ndarray, T: float, seed: np.ndarray) -> np.ndarray:
    """Greedy: from the convex set ``seed``, add the node of largest price that keeps the
    set convex and its f at most T, while one of positive price is left."""
    s = GrowingSet.empty(inc)
    for v in seed.tolist():
        s.add(v)
    while True:
        ok = s.convex_with_each() & (s.cost_with_each() <= T) & (pi > 0)
        if not ok.any():
            return np.flatnonzero(s.inside)
        s.add(int(np.argmax(np.where(ok, pi, -np.inf))))


@dataclass(frozen=True)
class Priced:
    """One pricing: the sets CP-SAT found (node arrays) and U, its proven upper bound of the
    largest price of a valid set (None: no bound)."""

    sets: list[np.ndarray]
    upper: int | None


class PricingModel:
    """CP-SAT's model of one block: every valid set at T is feasible in it (costs rounded
    down, T rounded up, convexity along order edges), built once; each probe adds its cap."""

    def __init__(self, cg: Graph, cluster: Cluster):
        from ortools.sat.python import cp_model  # heavy (OR-Tools): only when this bound runs

        self.n = cg.n
        io = cg.t_size / cluster.link_bandwidth
        # no set costs more: all the work, every tensor sent and received, all the overflow
        self.largest = float(cg.work.sum() + 2 * io.sum()) + _overflow_max(cg, cluster)
        self.scale = 2.0**SCALE_BITS / self.largest
        self.m = m = cp_model.CpModel()
        self.x = [m.NewBoolVar(f"x{v}") for v in range(cg.n)]
        self.over, self.over_top = None, 0  # the overflow's variable and largest value
        terms = [(_down(cg.work[v] * self.scale), self.x[v]) for v in range(cg.n)]
        terms += self._io_terms(cg, _down_array(io * self.scale))
        terms += self._memory_terms(cg, cluster)
        self._add_convexity(cg)
        # the booleans' coefficients and the overflow's largest value (``over_top``)
        top = sum(c for c, var in terms if var is not self.over) + self.over_top
        self.cost = m.NewIntVar(0, max(top, 0), "cost")
        m.Add(self.cost == sum(c * var for c, var in terms if c))

    def _io_terms(self, cg: Graph, io_int: np.ndarray) -> list:
        """Per tensor split by the set: sent (producer in, a consumer out) or received."""
        m, x, terms = self.m, self.x, []
        for t in range(cg.num_tensors):
            p = int(cg.t_producer[t])
            cons = sorted(set(cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]].tolist()) - {p})
            if not cons or io_int[t] <= 0:
                continue
            sent, recv = m.NewBoolVar(f"s{t}"), m.NewBoolVar(f"r{t}")
            for c in cons:
                m.Add(sent >= x[p] - x[c])
                m.Add(recv >= x[c] - x[p])
            terms += [(int(io_int[t]), sent), (int(io_int[t]), recv)]
        return terms

    def _memory_terms(self, cg: Graph, cluster: Cluster) -> list:
        """The overflow (and the hard capacity) where they can matter at all."""
        M, C = float(cluster.fast_memory), cluster.capacity
        most = float(cg.p_size.sum() + cg.act.max(initial=0.0))
        over = math.isfinite(M) and most > M
        cap = C is not None and most > C
        if not (over or cap):
            return []
        m, x = self.m, self.x
        use = [m.NewBoolVar(f"u{q}") for q in range(cg.num_params)]
        for q in range(cg.num_params):
            for u in cg.p_users[cg.p_ptr[q] : cg.p_ptr[q + 1]].tolist():
                m.AddImplication(x[u], use[q])
        terms = []
        if over:
            f = self.scale / cluster.slow_memory_bandwidth
            self.over_top = self.cap(self.largest) + 1
            self.over = self._excess(cg, use, f, M * f, "ov", self.over_top)
            terms.append((1, self.over))
        if cap:
            unit = float(C) / 2.0**30
            excess = self._excess(cg, use, 1.0 / unit, float(C) / unit, "cap", 0)
            m.Add(excess == 0)
        return terms

    def _excess(self, cg: Graph, use: list, f: float, limit: float, name: str, most: int):
        """An integer at least max(0, (params + peak) * f - limit) (coefficients rounded
        down and capped at COEFFICIENT_CAP, the limit rounded up: never above it), at most
        ``most``: a set that needs more costs more than every cap anyway."""
        m, x = self.m, self.x
        act = np.minimum(_down_array(cg.act * f), COEFFICIENT_CAP)
        peak = m.NewIntVar(0, int(act.max(initial=0)), f"{name}_peak")
        for v in np.flatnonzero(act > 0).tolist():
            m.Add(peak >= int(act[v]) * x[v])
        p = np.minimum(_down_array(cg.p_size * f), COEFFICIENT_CAP)
        excess = m.NewIntVar(0, most, f"{name}_excess")
        m.Add(
            excess
            >= sum(int(p[q]) * use[q] for q in range(len(use)) if p[q])
            + peak
            - math.ceil(limit * (1 + 1e-12))
        )
        return excess

    def _add_convexity(self, cg: Graph) -> None:
        """after[v]: a node of the set reaches v; before[v]: v reaches one; both force v in."""
        m, x = self.m, self.x
        after = [m.NewBoolVar(f"a{v}") for v in range(cg.n)]
        before = [m.NewBoolVar(f"b{v}") for v in range(cg.n)]
        for u, w in zip(cg.e_src.tolist(), cg.e_dst.tolist(), strict=True):
            m.AddImplication(x[u], after[w])
            m.AddImplication(after[u], after[w])
            m.AddImplication(x[w], before[u])
            m.AddImplication(before[w], before[u])
        for v in range(cg.n):
            m.AddBoolOr([x[v], after[v].Not(), before[v].Not()])

    def cap(self, T: float) -> int:
        """The integer cap of a probe: no valid set at T costs more in the model's units."""
        return math.ceil(T * self.scale * (1 + 1e-12))

    def price(
        self, pi: np.ndarray, T: float, seconds: float, hint: np.ndarray | None = None
    ) -> Priced:
        """max pi(S) over the model's sets of cost at most T: the sets found and CP-SAT's
        proven upper bound (integer prices)."""
        from ortools.sat.python import cp_model  # heavy (OR-Tools): only when this bound runs

        m = self.m.Clone()
        xs = [m.GetBoolVarFromProtoIndex(v.Index()) for v in self.x]
        m.Add(m.GetIntVarFromProtoIndex(self.cost.Index()) <= self.cap(T))
        m.Maximize(sum(int(p) * xv for p, xv in zip(pi.tolist(), xs, strict=True) if p))
        if hint is not None:
            inside = set(hint.tolist())
            for v, xv in enumerate(xs):
                m.AddHint(xv, v in inside)
        found = _collector(cp_model, xs)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, seconds)
        solver.parameters.num_workers = 1
        status = solver.Solve(m, found)
        upper = None
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            upper = _integer_bound(solver.BestObjectiveBound())
        return Priced(found.sets, upper)


def _collector(cp_model, xs: list):
    """A solution callback keeping every set CP-SAT finds (defined here: OR-Tools is loaded
    only when this bound runs)."""

    class Collector(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()
            self.sets: list[np.ndarray] = []

        def on_solution_callback(self) -> None:
            inside = [v for v, xv in enumerate(xs) if self.BooleanValue(xv)]
            self.sets.append(np.array(inside, dtype=np.int64))

    return Collector()


def _integer_bound(value: float) -> int:
    """CP-SAT's bound of an integer objective as an integer, never below it."""
    near = round(value)
    return int(near) if abs(value - near) <= 1e-6 else math.ceil(value)


def _down(value: float) -> int:
    """A cost in model units rounded down (shrunk by 1e-12 first against float error)."""
    return max(0, math.floor(float(value) * (1 - 1e-12)))


def _down_array(values: np.ndarray) -> np.ndarray:
    return np.maximum(0, np.floor(np.asarray(values, dtype=float) * (1 - 1e-12))).astype(np.int64)


def _overflow_max(cg: Graph, cluster: Cluster) -> float:
    if not math.isfinite(cluster.fast_memory):
        return 0.0
    most = float(cg.p_size.sum() + cg.act.max(initial=0.0))
    return max(0.0, most - cluster.fast_memory) / cluster.slow_memory_bandwidth


class Master:
    """The restricted master LP (GLOP): min the number of blocks, every node covered once
    by the columns (valid sets at T), an artificial per node at cost k + 1 keeping it
    feasible. Its duals are the prices; the proof never rests on it."""

    def __init__(self, n: int, k: int):
        from ortools.linear_solver import pywraplp  # heavy (OR-Tools): only when this runs

        self.lp = pywraplp.Solver.CreateSolver("GLOP")
        self.rows = [self.lp.Constraint(1.0, 1.0) for _ in range(n)]
        self.objective = self.lp.Objective()
        self.objective.SetMinimization()
        self.keys: set[bytes] = set()
        self.columns: list[tuple[object, np.ndarray]] = []
        self.optimal = pywraplp.Solver.OPTIMAL
        for row in self.rows:
            var = self.lp.NumVar(0.0, self.lp.infinity(), "")
            row.SetCoefficient(var, 1.0)
            self.objective.SetCoefficient(var, float(k + 1))

    def add(self, nodes: np.ndarray) -> bool:
        """Add the set as a column (False: it is there already)."""
        key = np.sort(nodes).astype(np.int64).tobytes()
        if key in self.keys or len(nodes) == 0:
            return False
        self.keys.add(key)
        var = self.lp.NumVar(0.0, self.lp.infinity(), "")
        self.columns.append((var, nodes))
        for v in nodes.tolist():
            self.rows[v].SetCoefficient(var, 1.0)
        self.objective.SetCoefficient(var, 1.0)
        return True

    def support(self) -> list[np.ndarray]:
        """The columns the last LP solution uses."""
        return [nodes for var, nodes in self.columns if var.solution_value() > 1e-9]

    def solve(self) -> tuple[float, np.ndarray] | None:
        """The LP's value and its duals (None: GLOP did not finish)."""
        if self.lp.Solve() != self.optimal:
            return None
        return self.objective.Value(), np.array([r.dual_value() for r in self.rows])


@dataclass
class CoverSearch:
    """What the probes share: the coarse graph, the intervals, the pricing model and every
    set CP-SAT found (with its exact f, so each probe keeps those valid at its T)."""

    cg: Graph
    cluster: Cluster
    k: int
    ivs: Intervals
    pricing: PricingModel
    inc: Incidence
    proven: np.ndarray | None = None  # the prices of the last proof
    pool: dict[bytes, tuple[np.ndarray, float]] = field(default_factory=dict)

    def proves(self, T: float, deadline: float) -> bool:
        """True only with a proof that no plan has every block at most T: prices pi with
        sum pi > k U (U: CP-SAT's bound of the largest price of a valid set). The prices
        priced are the LP's duals smoothed towards the best proof attempt so far (Wentges):
        the duals alone oscillate and their U stays far above 1."""
        # first the prices of the last proof (they proved a smaller T), or the works (every
        # block's work is at most the most work a valid set holds): often proof enough
        start = self.proven if self.proven is not None else self._work_prices()
        state = _Smoothing(center=start)
        if self._prices_prove(start, T, deadline, state):
            self.proven = start
            return True
        master, keep = self._master(T)
        prefix_of = self._prefix(keep)
        while time.perf_counter() < deadline:
            lp = master.solve()
            if lp is None or lp[0] <= self.k * (1 + 1e-9):
                return False  # the LP itself fits k blocks: no prices can prove T
            pi_lp = lp[1]
            if self._add_intervals(master, keep, prefix_of(pi_lp)):
                continue
            if self._add_grown(master, pi_lp, T):
                continue
            while time.perf_counter() < deadline:
                pi = state.separation(pi_lp)
                pi_int = _integer_prices(pi)
                res = self.pricing.price(pi_int, T, self._seconds(deadline), state.hint)
                if res.upper is not None and int(pi_int.sum()) > self.k * res.upper:
                    self.proven = pi
                    return True
                state.priced(pi, pi_int, res)
                if self._add_found(master, res.sets, pi_lp, T):
                    break  # the master changed: its new duals
                if not state.mispriced():
                    return False  # the duals themselves price nothing above 1: LP optimal
        return False

    def _work_prices(self) -> np.ndarray:
        work = self.cg.work.astype(float)
        return work * (self.k / max(float(work.sum()), 1e-300))

    def _prices_prove(self, pi: np.ndarray, T: float, deadline: float, state) -> bool:
        """One pricing of ``pi`` at T: True when it proves T (``state`` records its ratio)."""
        pi_int = _integer_prices(pi)
        res = self.pricing.price(pi_int, T, self._seconds(deadline))
        state.priced(pi, pi_int, res)
        return res.upper is not None and int(pi_int.sum()) > self.k * res.upper

    def _seconds(self, deadline: float) -> float:
        return min(PRICE_SECONDS, max(0.0, deadline - time.perf_counter()))

    def _master(self, T: float) -> tuple[Master, np.ndarray]:
        """A master with the largest feasible interval from each start of each order and the
        pool's sets valid at T; the interval rows of cost at most T."""
        ivs = self.ivs
        keep = np.flatnonzero(ivs.cost <= T)
        master = Master(self.cg.n, self.k)
        n = self.cg.n
        key = ivs.order[keep] * (n + 1) + ivs.start[keep]
        last = np.flatnonzero(np.append(key[1:] != key[:-1], True))  # rows end in each start
        for r in keep[last].tolist():
            master.add(self._nodes(r))
        for nodes, cost in self.pool.values():
            if cost <= T:
                master.add(nodes)
        return master, keep

    def _nodes(self, r: int) -> np.ndarray:
        ivs = self.ivs
        return ivs.orders[int(ivs.order[r])][int(ivs.start[r]) : int(ivs.end[r])]

    def _prefix(self, keep: np.ndarray):
        """pi -> the price of every kept interval (prefix sums along each order)."""
        ivs = self.ivs
        o, s, e = ivs.order[keep], ivs.start[keep], ivs.end[keep]
        orders = np.stack(ivs.orders)

        def prices(pi: np.ndarray) -> np.ndarray:
            sums = np.zeros((len(orders), orders.shape[1] + 1))
            sums[:, 1:] = np.cumsum(pi[orders], axis=1)
            return sums[o, e] - sums[o, s]

        return prices

    def _add_intervals(self, master: Master, keep: np.ndarray, prices: np.ndarray) -> bool:
        """The intervals of largest price above 1 enter the master (False: none did)."""
        top = np.argsort(-prices, kind="stable")[:COLUMNS_PER_ROUND]
        added = False
        for r in top[prices[top] > 1 + REDUCED_TOL].tolist():
            added |= master.add(self._nodes(int(keep[r])))
        return added

    def _add_grown(self, master: Master, pi: np.ndarray, T: float) -> bool:
        """Sets grown greedily (:func:`grow`) from the master's support and from the nodes
        of largest price enter the master when they price above 1 (False: none did)."""
        seeds = master.support()
        seeds += [np.array([v]) for v in np.argsort(-pi)[:GROWN_SEEDS].tolist()]
        found = [grow(self.inc, pi, T, seed) for seed in seeds]
        return self._add_found(master, found, pi, T)

    def _best_interval(self, keep: np.ndarray, prices: np.ndarray) -> np.ndarray | None:
        if len(keep) == 0:
            return None
        return self._nodes(int(keep[int(np.argmax(prices))]))

    def _add_found(self, master: Master, sets: list[np.ndarray], pi: np.ndarray, T: float) -> bool:
        """CP-SAT's sets of price above 1 that are valid at T (by the evaluator) enter the
        master and the pool (False: none did)."""
        added = False
        for nodes in sets:
            if len(nodes) == 0 or float(pi[nodes].sum()) <= 1 + REDUCED_TOL:
                continue
            key = np.sort(nodes).tobytes()
            if key not in self.pool:
                self.pool[key] = (nodes, set_cost(self.cg, self.cluster, nodes))
            if self.pool[key][1] <= T:
                added |= master.add(nodes)
        return added


@dataclass
class _Smoothing:
    """Wentges' dual smoothing: price ``alpha * center + (1 - alpha) * duals``, the center
    being the prices of the best ratio sum pi / U so far; after a pricing that finds no
    column for the duals, alpha halves, down to the duals alone."""

    alpha: float = SMOOTHING
    center: np.ndarray | None = None
    ratio: float = -math.inf
    hint: np.ndarray | None = None

    def separation(self, duals: np.ndarray) -> np.ndarray:
        if self.center is None or self.alpha <= 0:
            return duals
        return self.alpha * self.center + (1 - self.alpha) * duals

    def priced(self, pi: np.ndarray, pi_int: np.ndarray, res: Priced) -> None:
        if res.sets:
            self.hint = res.sets[-1]
        if res.upper is not None and res.upper > 0:
            ratio = float(pi_int.sum()) / res.upper
            if ratio > self.ratio:
                self.ratio, self.center = ratio, pi

    def mispriced(self) -> bool:
        """After a pricing that added nothing: True while a smaller alpha is left to try."""
        if self.alpha <= 0:
            return False
        self.alpha = self.alpha / 2 if self.alpha > MIN_SMOOTHING else 0.0
        return True


def _integer_prices(pi: np.ndarray) -> np.ndarray:
    """The prices in integers (the proof is on these exactly)."""
    top = max(1e-300, float(np.abs(pi).max()))
    return np.round(pi * (2.0**PRICE_BITS / top)).astype(np.int64)


def set_cost(cg: Graph, cluster: Cluster, nodes: np.ndarray) -> float:
    """f of a node set by the evaluator (the set as block 0 of a two-block plan)."""
    a = np.ones(cg.n, dtype=np.int64)
    a[np.asarray(nodes, dtype=np.int64)] = 0
    return float(evaluate(cg, cluster, a, 2).f[0])


def block_cover_bound(
    g: Graph,
    cluster: Cluster,
    k: int,
    seconds: float,
    lo: float,
    hi: float = math.inf,
) -> BlockCoverBound:
    """Largest T proven in [``lo``, ``hi``] (``lo``, proven by the caller, when none above it
    is): no plan with every block at most T fits k blocks. The probes go FIRST_STEP above
    the best so far, the step growing by STEP_GROWTH after each proof, and bisect below a
    failure; each gets at most half the time left. Homogeneous clusters and at most
    MAX_NODES coarse nodes (``lo`` otherwise)."""
    deadline = time.perf_counter() + seconds
    cg, _ = coarse_view(g)
    if cg.n > MAX_NODES or cg.n <= k or not cluster.homogeneous:
        return BlockCoverBound(lo, 0, 0, 0)
    sc = set_costs(cg, cluster)
    pricing = PricingModel(cg, cluster)
    hi = min(hi, pricing.largest)  # at or above it every convex set is valid: nothing proves
    ivs = intervals(cg, sc, hi, deadline)
    search = CoverSearch(cg, cluster, k, ivs, pricing, incidence(cg, sc))
    best, probes, proven = lo, 0, 0
    step, top = FIRST_STEP, hi
    while top - best > PROBE_REL_WIDTH * top and time.perf_counter() < deadline:
        T = min(best * (1 + step), 0.5 * (best + top)) if best > 0 else 0.5 * (best + top)
        probes += 1
        # half of what is left: a probe that fails leaves time to a smaller one
        if search.proves(T, 0.5 * (time.perf_counter() + deadline)):
            best, proven, step = T, proven + 1, STEP_GROWTH * step
        else:
            top = T
    return BlockCoverBound(best, probes, proven, len(search.pool))
