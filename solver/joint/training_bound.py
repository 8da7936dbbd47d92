"""The stage-sum training bound: a lower bound on T over every joint training plan of a space
(cut points, sub-meshes), from exact sharding solves of each cut interval (docs/training.md,
"The stage-sum training bound").

T = a sum_i t_i + b max_i t_i + max_i y_i with the stages on disjoint devices (sum d_i <= k):
the weights w_i = d_i / k sum to at most 1, so max_i y_i >= sum_i w_i y_i and max_i t_i >=
sum_i w_i t_i. For a plan whose largest stage time is at least lo and any theta in [0, 1],
b max t >= theta b lo + (1 - theta) b sum_i w_i t_i, hence

    T >= theta b lo + sum_i (a + (1 - theta) b w_i) (t_i + mu_i y_i),   mu_i = w_i / (a + b w_i)

(the weight of y_i is w_i >= (a + (1 - theta) b w_i) mu_i), a sum of per-stage terms. A stage's
t_i is at least its program time (the transfers only add), and its program time + mu y_i at
least the sum over the stage's cut intervals of the least (program time + mu sync) of each
interval alone on the stage's sub-mesh, its outputs not reduced (the redistributions between
intervals, the reductions of the stage's outputs and their transposes are never negative):
the exact sharding solver's proven bound on the interval with ``sync_weight = mu`` and no
memory limit (memory is dropped: a relaxation). Two solves per (interval signature, sub-mesh
kind): mu = 0 (a lower bound on the stage's t_i alone) and mu = w / (a + b w); identical layers
are solved once.

The largest stage time is bracketed: every plan whose largest t lies in [lo, hi) has only
stages whose mu = 0 bound is below hi, so its T is at least the largest over theta of theta b
lo + a shortest path over (cut point, next free device in cluster order) through such stages.
A branch and bound over the brackets (the lowest split in halves until it is ``STEP`` narrow)
gives the least of these over every plan: a plan's largest t is at least its largest
interval's least time, and above the incumbent's T / b no plan beats it. A pair whose memory
floor (``WholePrices``) exceeds its limit at the least in-flight count is left out.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from solver.core.training import CAPACITY_SLACK
from solver.joint.segment import Segment
from solver.joint.submesh import sub_cluster
from solver.spmd.plan import SearchOptions, compute_bound
from solver.spmd.program import Planner
from solver.spmd.solve import exact_search
from solver.spmd.strategy import Strategy
from solver.spmd.training import TrainingSpec as ShardTraining

STAGE_SUM = "stage-sum training bound"
SOLVE_MAX_SECONDS = 60.0  # at most this long for one interval's exact sharding solve
SOLVE_MIN_SECONDS = 1.0  # a solve gets at least this long while the bound's time lasts
SOLVE_SKIP_SECONDS = 0.1  # with less than this left, an interval keeps its least own time
STEP = 1e-4  # the branch and bound over the largest stage time stops at brackets this narrow
THETAS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the mixes of the largest stage time's two bounds


@dataclass(frozen=True)
class IntervalBound:
    """A lower bound on (program time + mu sync) of one cut interval on one sub-mesh kind, and
    how it was proven."""

    value: float
    source: str  # "exact" (the solver's proven optimum), "solver bound", "least own time"
    strategies: tuple[Strategy, ...] | None = None  # the solver's plan, by operator position


@dataclass
class StageSumBound:
    """The bound's value over the space (inf: no plan fits the memory floors) and its counts."""

    value: float
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StageArrays:
    """Per sub-mesh, indexed [start cut, end cut]: a lower bound on the stage's time alone
    (``time``, inf where its memory floor does not fit) and on t + mu y (``term``)."""

    time: list[np.ndarray]
    term: list[np.ndarray]


def interval_model(seg: Segment):
    """The interval's sub-model with no outputs: its outputs' reductions (and their
    transposes) are not charged, so its cost is a lower bound on its share of any stage."""
    return replace(seg.sm, outputs=[])


def interval_bound(planner: Planner, seconds: float) -> IntervalBound:
    """The least (program time + mu sync) of ``planner``'s interval without a memory limit:
    the exact sharding search's proven bound, or the least own time per operator when there
    is no time for it."""
    least = compute_bound(planner, {})
    if seconds < SOLVE_SKIP_SECONDS:
        return IntervalBound(least, "least own time")
    res = exact_search(planner, {}, None, least, time.perf_counter(), SearchOptions(seconds))
    plan = tuple(res.strategies[op.name] for op in planner.sm.ops)
    if res.lower_bound is None:
        return IntervalBound(least, "least own time", plan)
    exact = res.status == "OPTIMAL"
    return IntervalBound(max(least, res.lower_bound), "exact" if exact else "solver bound", plan)


class StageSumPricer:
    """The interval bounds of one training search (cached by interval signature, gradient
    flow at its inputs, sub-mesh kind and sync weight) and the bound over its space."""

    def __init__(self, ts) -> None:
        self.ts = ts  # a solver.joint.training.TrainingSearch
        self.search = ts.search
        self.k = self.search.cluster.devices
        self.bounds: dict[tuple, IntervalBound] = {}
        self.stats: dict = {"interval_solves": 0, "sources": {}}

    def share(self, m: int) -> float:
        """w = the devices of sub-mesh m over all of them."""
        return self.search.meshes[m].size / self.k

    def mu(self, m: int) -> float:
        """The sync weight of a stage on sub-mesh m: w / (a + b w)."""
        a, b = self.ts.spec.time_weights
        return self.share(m) / (a + b * self.share(m))

    def interval_key(self, j: int, m: int, weighted: bool) -> tuple:
        s = self.search
        seg = s.segment(s.cuts[j], s.cuts[j + 1])
        grads = tuple(t in self.ts.flow.needs_grad for t in seg.inputs)
        return (seg.signature, grads, s.mesh_key(m), self.mu(m) if weighted else 0.0)

    def planner(self, j: int, m: int, mu: float) -> Planner:
        """The interval's training planner on sub-mesh m with sync weight ``mu``."""
        s, ts = self.search, self.ts
        seg = s.segment(s.cuts[j], s.cuts[j + 1])
        mesh = s.meshes[m]
        spec = ShardTraining(ts.spec.optimizer_state, sync_weight=mu)
        planner = Planner(
            interval_model(seg), mesh.mesh, sub_cluster(s.cluster, mesh.devices), spec
        )
        planner.flow = ts.flow.part(seg.start, seg.end)
        ts.whole(m)
        planner.share_caches(ts.planners[s.mesh_key(m)])
        return planner

    def price_all(self, deadline: float, clock=time.perf_counter) -> None:
        """Every (interval, sub-mesh kind, sync weight) bound, the smallest meshes and
        intervals first (the slowest solves last, with the time the others left), each solve
        with a fair share of the time left until ``deadline``."""
        s = self.search
        todo: dict[tuple, tuple[int, int, bool]] = {}
        for m in range(len(s.meshes)):
            for j in range(len(s.cuts) - 1):
                for weighted in (False, True):
                    todo.setdefault(self.interval_key(j, m, weighted), (j, m, weighted))
        order = sorted(
            todo.items(),
            key=lambda kv: (s.meshes[kv[1][1]].size, s.cuts[kv[1][0] + 1] - s.cuts[kv[1][0]]),
        )
        t0 = clock()
        for n, (key, (j, m, weighted)) in enumerate(order):
            left = deadline - clock()
            # a fair share of the time left, but at least SOLVE_MIN_SECONDS while any is left:
            # most intervals are small and proven in a fraction of it, leaving the rest to others
            share = left / (len(order) - n)
            seconds = min(SOLVE_MAX_SECONDS, max(share, min(SOLVE_MIN_SECONDS, left)))
            got = interval_bound(self.planner(j, m, self.mu(m) if weighted else 0.0), seconds)
            unweighted = self.bounds.get(self.interval_key(j, m, False))
            if weighted and unweighted is not None and unweighted.value > got.value:
                # the least of program + mu sync never falls as mu grows: mu = 0's bound holds
                got = IntervalBound(unweighted.value, unweighted.source, got.strategies)
            self.bounds[key] = got
            self.stats["interval_solves"] += got.source != "least own time"
            sources = self.stats["sources"]
            sources[got.source] = sources.get(got.source, 0) + 1
        self.stats["solve_seconds"] = clock() - t0

    def segment_plans(self, ia: int, ib: int, m: int) -> list[dict[str, Strategy]]:
        """Plans of the segment from cut ia to ib on sub-mesh m: its intervals' solver plans
        put together (one per sync weight solved), for the upper programme."""
        s = self.search
        ops = s.segment(s.cuts[ia], s.cuts[ib]).sm.ops
        out = []
        for weighted in (False, True):
            chosen: list[Strategy] = []
            for j in range(ia, ib):
                got = self.bounds.get(self.interval_key(j, m, weighted))
                if got is None or got.strategies is None:
                    break
                chosen.extend(got.strategies)
            if len(chosen) == len(ops):
                plan = {op.name: st for op, st in zip(ops, chosen, strict=True)}
                if plan not in out:
                    out.append(plan)
        return out

    def arrays(self) -> StageArrays:
        """The stage bounds of every (start cut, end cut, sub-mesh) from the interval bounds'
        prefix sums."""
        s = self.search
        last = len(s.cuts) - 1
        times, terms = [], []
        for m in range(len(s.meshes)):
            pre = {}
            for weighted in (False, True):
                vals = [self.bounds[self.interval_key(j, m, weighted)].value for j in range(last)]
                pre[weighted] = np.concatenate([[0.0], np.cumsum(vals)])
            time_m = pre[False][None, :] - pre[False][:, None]
            for ia in range(last):
                for ib in range(ia + 1, last + 1):
                    if not self.fits_floor(ia, ib, m):
                        time_m[ia, ib] = math.inf
            times.append(time_m)
            terms.append(pre[True][None, :] - pre[True][:, None])
        return StageArrays(times, terms)

    def fits_floor(self, ia: int, ib: int, m: int) -> bool:
        """Whether the pair's memory floor fits its limit at the least in-flight count."""
        s, ts = self.search, self.ts
        limit = s.limit(s.meshes[m])
        if limit is None:
            return True
        first_key = 0 if ts.spec.schedule == "gpipe" else 1
        low = ts.whole(m).lower(s.cuts[ia], s.cuts[ib], s.meshes[m].size)
        return low.memory(ts.count(first_key)) <= limit * (1 + CAPACITY_SLACK)

    def bound(self, cap: float) -> StageSumBound:
        """The least over the largest stage time tau of the bracket bounds (module docstring),
        capped by ``cap`` (a plan's T): branch and bound over brackets [lo, hi) of tau, the
        lowest split in halves until it is ``STEP`` narrow."""
        arr = self.arrays()
        _, b = self.ts.spec.time_weights
        last = len(self.search.cuts) - 1
        lo = max(min(float(t[j, j + 1]) for t in arr.time) for j in range(last))
        hi = cap / b if b > 0 else math.inf
        if not lo < hi:
            return StageSumBound(cap, self.stats)
        heap = [(self.bracket(arr, lo, hi), lo, hi)]
        paths = 1
        while heap[0][0] < cap and heap[0][2] - heap[0][1] > STEP * heap[0][2]:
            _, lo, hi = heapq.heappop(heap)
            mid = 0.5 * (lo + hi)
            for x, y in ((lo, mid), (mid, hi)):
                heapq.heappush(heap, (self.bracket(arr, x, y), x, y))
            paths += 2
        self.stats["brackets"] = paths
        return StageSumBound(min(cap, heap[0][0]), self.stats)

    def bracket(self, arr: StageArrays, lo: float, hi: float) -> float:
        """A lower bound on T of every plan whose largest stage time is in [lo, hi): the
        largest over theta in ``THETAS`` of theta b lo + the least sum over its stages of
        (a + (1 - theta) b w) x their term, through stages whose time bound is below hi."""
        a, b = self.ts.spec.time_weights
        w = [self.share(m) for m in range(len(self.search.meshes))]
        return max(
            theta * b * lo + self.shortest_path(arr, hi, [a + (1 - theta) * b * x for x in w])
            for theta in THETAS
        )

    def shortest_path(self, arr: StageArrays, top: float, factors: list[float]) -> float:
        """The least sum of factor x term over the plans of the space whose stages' time
        bounds are below ``top``: stages in order, each on a sub-mesh starting at or after the
        previous one's end (best[j, p]: cut intervals < j covered within positions < p)."""
        s = self.search
        last = len(s.cuts) - 1
        best = np.full((last + 1, self.k + 1), math.inf)
        best[0, :] = 0.0
        for ib in range(1, last + 1):
            for m, mesh in enumerate(s.meshes):
                ok = arr.time[m][:ib, ib] < top
                if not ok.any():
                    continue
                vals = best[:ib, mesh.start][ok] + factors[m] * arr.term[m][:ib, ib][ok]
                best[ib, mesh.end] = min(best[ib, mesh.end], float(vals.min()))
            best[ib] = np.minimum.accumulate(best[ib])
        return float(best[last, -1])
