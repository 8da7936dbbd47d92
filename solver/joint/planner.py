"""plan_joint: pipeline stages on sub-meshes, each sharding its operators, with a proven bound.

Search space (``bound_space`` names it): stages are contiguous ranges of the operators in the
model's topological order, cut at the cut points of :func:`solver.joint.segment.cut_points`;
each stage runs on a sub-mesh of :func:`solver.joint.submesh.candidates` (devices taken in
cluster order, disjoint); inside a stage any strategy per operator within the memory limit.

The search is a dynamic programme over stages whose labels are (slowest finished stage, the
current stage's receive time): exact for the bottleneck objective when every tensor goes to the
next stage, and bracketed (a lower and an upper price) for a tensor that skips a stage. It runs
twice per round: with every (segment, sub-mesh) program priced by a heuristic plan (upper: the
best of data parallel, Megatron and propagation that fits) and by a certified lower bound
(least compute, then the exact sharding solver's bound). Segments that the incumbent uses or
that the lower programme's optimum uses are then solved exactly (``solve_sharding(method=
"cpsat")``); once each has had its solve, those that ran out of time unproven are solved again
with twice the time, the largest gap first, until the bound meets the incumbent or time runs
out. Costs are cached by segment signature (repeated identical layers are priced once).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.core.cluster import Cluster, load_cluster
from solver.core.errors import MtppError
from solver.core.options import check_time_limit, checked_memory
from solver.core.result import OPTIMAL, OPTIMALITY_TOL, InvalidBoundError, certify
from solver.core.units import format_bytes
from solver.joint.bound import op_work, split_tuples, universal_bound
from solver.joint.plan import JointPlan, StageSpec, price_stages
from solver.joint.segment import Segment, cut_points, make_segment, tensor_bytes
from solver.joint.submesh import (
    SPACES,
    SubMesh,
    candidates,
    device_order,
    slowest_link,
    stage_limit,
    sub_cluster,
)
from solver.spmd import solve as spmd_solve  # tests replace spmd_solve.solve_sharding
from solver.spmd.model import ShardModel, load_model
from solver.spmd.patterns import data_parallel_plan, megatron_plan
from solver.spmd.program import Planner, evaluate
from solver.spmd.propagate import propagate
from solver.spmd.strategy import Strategy

HEURISTICS = ("dp", "megatron", "propagate")
EXACT_SHARE = 0.25  # most of the time left one exact segment solve may take
EXACT_MIN_SECONDS = 1.0
EXACT_MAX_SECONDS = 30.0
NOTE_SECONDS = 1.0  # at most one progress note per this many seconds while pricing
_clock = time.perf_counter  # the deadline's clock (tests replace it)

__all__ = ["plan_joint", "op_work", "split_tuples", "universal_bound", "weight_floor"]


class _Expired(Exception):
    """The deadline passed during a dynamic programme: its result is not complete."""


@dataclass
class PairCost:
    """The program of one segment on one sub-mesh: upper (a plan that fits) and lower."""

    upper: float = math.inf
    strategies: tuple[Strategy, ...] | None = None  # by operator position in the segment
    lower: float = 0.0
    exact_tried: bool = False
    budget: float = 0.0  # the time limit of the last exact solve
    retry: bool = False  # the last exact solve ran out of time unproven: more time may help
    infeasible: bool = False  # proven: no strategy fits the memory limit
    sources: list[str] = field(default_factory=list)


@dataclass
class _Label:
    worst: float  # slowest finished stage
    recv: float  # the current stage's receive time so far
    state: tuple | None  # the stage (ia, ib, m) this label sits at
    prev: _Label | None


class JointSearch:
    """One joint search: model, cluster, candidates, caches."""

    def __init__(self, sm, cluster: Cluster, memory, space, deadline, progress, workers):
        self.sm, self.cluster, self.memory = sm, cluster, memory
        self.space, self.deadline, self.progress, self.workers = space, deadline, progress, workers
        n = len(sm.ops)
        self.n = n
        self.cuts = [0, n] if space == "sharding" else cut_points(sm)
        self.meshes: list[SubMesh] = candidates(cluster, space)
        self.segments: dict[tuple[int, int], Segment] = {}
        self.costs: dict[tuple, PairCost] = {}
        self.stats = {"exact_solves": 0, "heuristic_pairs": 0, "rounds": 0}
        self._bw: dict[tuple[int, int], float] = {}
        # per device position in cluster order: the fastest and slowest link to any device
        # before / after a sub-mesh (bounds on transfers to stages not yet known)
        self._link_cache: dict = {}
        self._mesh_keys: dict[int, tuple] = {}
        self._pairs: dict[tuple[int, int, int], PairCost] = {}
        self._wholes: dict[tuple, tuple] = {}
        self._noted = -math.inf  # when pricing was last noted on the progress

    # ------------------------------------------------------------------ helpers
    def segment(self, a: int, b: int) -> Segment:
        seg = self.segments.get((a, b))
        if seg is None:
            seg = self.segments[(a, b)] = make_segment(self.sm, a, b)
        return seg

    def mesh_key(self, m: int) -> tuple:
        """What a program's cost depends on besides the segment (equal for alike sub-meshes)."""
        key = self._mesh_keys.get(m)
        if key is None:
            mesh = self.meshes[m]
            sub = sub_cluster(self.cluster, mesh.devices)
            key = (mesh.mesh, sub.compute, sub.memory_bandwidth, self.limit(mesh))
            self._mesh_keys[m] = key
        return key

    def limit(self, m: SubMesh) -> float | None:
        return stage_limit(self.cluster, m.devices, self.memory)

    def time_left(self) -> float:
        return self.deadline - _clock()

    def expired(self) -> bool:
        return self.time_left() <= 0

    def bw(self, i: int, j: int) -> float:
        """Slowest link between sub-meshes i and j."""
        key = (i, j)
        if key not in self._bw:
            a, b = self.meshes[i].devices, self.meshes[j].devices
            self._bw[key] = slowest_link(self.cluster, a, b)
        return self._bw[key]

    def outside_link(self, m: int, before: bool, fastest: bool) -> float:
        """The fastest (or slowest) link between sub-mesh m and a device before (after) it in
        cluster order; inf (fastest) or 0 (slowest)... when there is none."""
        key = (m, before, fastest)
        if key not in self._link_cache:
            order = device_order(self.cluster)
            sm_ = self.meshes[m]
            others = order[: sm_.start] if before else order[sm_.end :]
            if not others:
                val = math.inf if fastest else 0.0
            else:
                a, b = np.meshgrid(np.asarray(others), np.asarray(sm_.devices), indexing="ij")
                bw1, _ = self.cluster.link_arrays(a.ravel(), b.ravel())
                bw2, _ = self.cluster.link_arrays(b.ravel(), a.ravel())
                both = np.concatenate([bw1, bw2])
                val = float(both.max() if fastest else both.min())
            self._link_cache[key] = val
        return self._link_cache[key]

    # ------------------------------------------------------------------ program costs
    def pair(self, a: int, b: int, m: int, force: bool = False) -> PairCost:
        """The cached cost of segment a..b on sub-mesh m (heuristics and lower bound on first
        use). Past the deadline an unpriced pair gets only its least-compute lower cost, not
        cached (``force``: price it anyway, for the first incumbents)."""
        pc = self._pairs.get((a, b, m))
        if pc is None:
            seg = self.segment(a, b)
            key = (seg.signature, self.mesh_key(m))
            pc = self.costs.get(key)
            if pc is None:
                if not force and self.expired():
                    return self._least(seg, m)
                pc = self.costs[key] = self._initial(seg, m)
                self._note_pricing()
            self._pairs[(a, b, m)] = pc
        return pc

    def _note_pricing(self) -> None:
        self.note_pricing(len(self.costs))

    def note_pricing(self, count: int) -> None:
        """Say on the progress how many programs are priced (at most once a second)."""
        now = time.perf_counter()
        if self.progress is not None and now - self._noted >= NOTE_SECONDS:
            self._noted = now
            self.progress.note(f"pricing stage candidates ({count} programs priced)")

    def _whole(self, m: int):
        """The whole model's Planner on sub-mesh m (one per alike sub-meshes) and the prefix
        sums of each operator's least compute there."""
        key = self.mesh_key(m)
        got = self._wholes.get(key)
        if got is None:
            mesh = self.meshes[m]
            planner = Planner(self.sm, mesh.mesh, sub_cluster(self.cluster, mesh.devices))
            least = [
                min(planner.compute_time(i, sh) for sh in planner.candidates(i))
                for i in range(self.n)
            ]
            got = self._wholes[key] = (planner, np.concatenate([[0.0], np.cumsum(least)]))
        return got

    def _planner(self, seg: Segment, m: int):
        """A Planner of the segment that shares the whole model's caches: they are keyed by
        operator signature, so a repeated operator is sharded and priced once per mesh."""
        mesh = self.meshes[m]
        planner = Planner(seg.sm, mesh.mesh, sub_cluster(self.cluster, mesh.devices))
        whole, _ = self._whole(m)
        for cache in ("_cache", "_cands", "_time"):  # a speed-up only: skipped if renamed
            if isinstance(getattr(whole, cache, None), dict) and hasattr(planner, cache):
                setattr(planner, cache, getattr(whole, cache))
        return planner

    def _least(self, seg: Segment, m: int) -> PairCost:
        """Only the certified lower cost: the weight floor, else the least compute."""
        pc = PairCost()
        mesh = self.meshes[m]
        limit = self.limit(mesh)
        if limit is not None and weight_floor(seg, mesh.size) > limit:
            pc.infeasible, pc.lower = True, math.inf
            pc.sources.append("weights alone exceed the limit")
            return pc
        _, least = self._whole(m)
        pc.lower = float(least[seg.end] - least[seg.start])
        pc.sources.append("least compute")
        return pc

    def _initial(self, seg: Segment, m: int) -> PairCost:
        """Both costs of a pair: the lower one and the best heuristic plan that fits."""
        pc = self._least(seg, m)
        if pc.infeasible:
            return pc
        mesh = self.meshes[m]
        limit = self.limit(mesh)
        planner = self._planner(seg, m)
        self.stats["heuristic_pairs"] += 1
        fns = {"dp": data_parallel_plan, "megatron": megatron_plan, "propagate": propagate}
        # on one device every heuristic keeps every operator whole: one is enough
        for name in HEURISTICS[:1] if mesh.size == 1 else HEURISTICS:
            strategies = fns[name](planner, {})
            prog = evaluate(planner, strategies)
            if (limit is None or prog.memory_per_device <= limit) and prog.objective < pc.upper:
                pc.upper = prog.objective
                pc.strategies = tuple(strategies[op.name] for op in seg.sm.ops)
                pc.sources.append(name)
        pc.lower = min(pc.lower, pc.upper)
        return pc

    def refine(self, a: int, b: int, m: int, again: bool = False) -> bool:
        """Solve segment a..b on sub-mesh m exactly; True when something was done. The first
        solve gets a share of the time left; ``again``: a pair whose last solve ran out of
        time unproven is solved with twice that time (at most the time left)."""
        pc = self.pair(a, b, m)
        if pc.infeasible or pc.upper <= pc.lower or pc.exact_tried != again:
            return False
        if again and not pc.retry:
            return False
        left = self.time_left()
        if left < EXACT_MIN_SECONDS:
            self.stats["stopped"] = True  # too little time left for an exact solve
            return False
        if again:
            budget = min(2 * pc.budget, left)
            if budget <= pc.budget:  # no more time than the last solve had: nothing to gain
                return False
        else:
            budget = min(EXACT_MAX_SECONDS, max(EXACT_MIN_SECONDS, EXACT_SHARE * left))
        pc.exact_tried, pc.budget, pc.retry = True, budget, False
        seg, mesh = self.segment(a, b), self.meshes[m]
        limit = self.limit(mesh)
        if self.progress is not None:
            more = f" again ({budget:.0f} s)" if again else ""
            self.progress.note(
                f"exact sharding of ops {a}..{b - 1} on devices {_span(mesh.devices)}{more}"
            )
        self.stats["exact_solves"] += 1
        if again:
            self.stats["exact_retries"] = self.stats.get("exact_retries", 0) + 1
        try:
            res = spmd_solve.solve_sharding(
                seg.sm,
                mesh=mesh.mesh.shape,
                method="cpsat",
                memory=limit,
                time_limit=budget,
                cluster=sub_cluster(self.cluster, mesh.devices),
                workers=self.workers,
            )
        except MtppError as e:
            if str(e).startswith("no sharding plan fits"):  # proven by CP-SAT
                pc.infeasible, pc.lower, pc.upper = True, math.inf, math.inf
                pc.strategies = None
                pc.sources.append("cpsat: proven infeasible")
            else:  # no fitting plan found within the time: more time may find one
                pc.retry = str(e).startswith("no plan that fits")
            return True
        if res.objective < pc.upper:
            pc.upper = res.objective
            pc.strategies = tuple(res.strategies[op.name] for op in seg.sm.ops)
            pc.sources.append("cpsat")
        if res.lower_bound is not None and res.lower_bound > pc.lower:
            pc.lower = min(res.lower_bound, pc.upper)
            pc.sources.append(f"cpsat bound ({res.status})")
        pc.retry = res.status != OPTIMAL and pc.upper > pc.lower and _ran_out(res.stats)
        return True

    def retry(self, pairs) -> bool:
        """Solve again, with twice the time, one of ``pairs`` whose exact solve ran out of
        time unproven: the largest gap (upper - lower) first. True when one was solved."""
        todo: dict[int, tuple[float, tuple[int, int, int]]] = {}
        for a, b, m in pairs:
            pc = self.pair(a, b, m)
            if pc.retry and not pc.infeasible and pc.upper > pc.lower:
                todo.setdefault(id(pc), (pc.upper - pc.lower, (a, b, m)))  # alike pairs once
        for _, abm in sorted(todo.values(), key=lambda g: -g[0]):
            if self.expired():
                break
            if self.refine(*abm, again=True):
                return True
        if todo:  # unproven pairs are left, and too little time to give one more
            self.stats["stopped"] = True
        return False

    # ------------------------------------------------------------------ the DP
    def dp(
        self, upper: bool, cap: float = math.inf, allowed=None, first: bool = False
    ) -> tuple[float, list[tuple[int, int, int]]]:
        """Min over stage sequences of the slowest stage, programs priced ``upper`` or lower.
        Returns (value, stages as (a, b, sub-mesh)); value inf when no sequence exists.
        Labels whose finished stages are already >= ``cap`` are dropped (see docs/joint.md).
        ``allowed``: the sub-mesh indices stages may use (default all). Raises
        :class:`_Expired` when the deadline passes, unless ``first`` (a first incumbent: every
        pair is priced, whatever the time)."""
        cuts, meshes = self.cuts, self.meshes
        nc = len(cuts)
        last = nc - 1
        best = cap
        best_label: _Label | None = None
        labels: dict[tuple[int, int, int], list[_Label]] = {}
        use = range(len(meshes)) if allowed is None else sorted(allowed)

        def prog(ia: int, ib: int, m: int) -> float:
            pc = self.pair(cuts[ia], cuts[ib], m, force=first)
            return pc.upper if upper else pc.lower

        for ib in range(1, nc):
            for m in use:
                if math.isfinite(prog(0, ib, m)):
                    labels[(0, ib, m)] = [_Label(0.0, 0.0, (0, ib, m), None)]
        for ia in range(nc - 1):
            for ib in range(ia + 1, nc):
                if not first and self.expired():
                    raise _Expired
                for m in use:
                    state = (ia, ib, m)
                    here = labels.pop(state, None)
                    if not here:
                        continue
                    p = prog(ia, ib, m)
                    if ib == last:
                        for lab in here:
                            total = max(lab.worst, p + lab.recv)
                            if total < best:
                                best, best_label = total, _Label(total, 0.0, state, lab)
                        continue
                    for ic in range(ib + 1, nc):
                        for m2 in use:
                            if meshes[m2].start < meshes[m].end:
                                continue
                            p2 = prog(ib, ic, m2)
                            if not math.isfinite(p2):
                                continue
                            x, out_s, in_t = self.io(ia, ib, ic, m, m2, upper)
                            for lab in here:
                                worst = max(lab.worst, p + lab.recv + x + out_s)
                                if worst >= best or p2 + x + in_t >= best:
                                    continue
                                _insert(
                                    labels.setdefault((ib, ic, m2), []),
                                    _Label(worst, x + in_t, (ib, ic, m2), lab),
                                )
        if best_label is None:
            return best, []
        path = []
        lab = best_label.prev
        while lab is not None:
            ia, ib, m = lab.state
            path.append((cuts[ia], cuts[ib], m))
            lab = lab.prev
        return best, path[::-1]

    def seeds(self) -> list[list[tuple[int, int, int]]]:
        """The first incumbents, priced whatever the time: the heuristic optimum of the pure
        sharding sub-space (one stage on a whole-cluster mesh) and of the pure pipeline
        sub-space (single devices), the same plans those spaces' own searches start from. A
        joint plan is thus never worse than their first incumbents."""
        if self.space != "joint":  # the space's own first round
            subs = {self.space: range(len(self.meshes))}
        else:
            full = [i for i, m in enumerate(self.meshes) if m.size == self.cluster.devices]
            single = [i for i, m in enumerate(self.meshes) if m.size == 1]
            subs = {"sharding": full, "pipeline": single}
        paths = []
        for what, allowed in subs.items():
            if self.progress is not None:
                sub = f": the pure {what} sub-space" if self.space == "joint" else ""
                self.progress.note(f"first plan{sub}")
            if self.space == "joint" and what == "sharding":  # one stage: no DP needed
                path, best = [], math.inf
                for m in allowed:
                    pc = self.pair(0, self.n, m, force=True)
                    if pc.upper < best:
                        path, best = [(0, self.n, m)], pc.upper
            else:
                _, path = self.dp(upper=True, allowed=allowed, first=True)
            if path:
                paths.append(path)
        return paths

    def io(self, ia, ib, ic, m, m2, upper) -> tuple[float, float, float]:
        """Transfers when stage s = (ia, ib) on m is followed by t = (ib, ic) on m2: x the
        s -> t time (both pay it), out_s what s sends past t, in_t what t receives from
        stages before s (each bracketed: upper or lower price)."""
        key = (ia, ib, ic, m, m2, upper)
        got = self._link_cache.get(key)
        if got is not None:
            return got
        near, far_in_bytes, far_out_bytes, far_out_sends = self.io_bytes(ia, ib, ic)
        ms, mt = self.meshes[m], self.meshes[m2]
        x = near / (min(ms.size, mt.size) * self.bw(m, m2)) if near else 0.0
        far_in = far_out = 0.0
        if far_in_bytes and upper:
            far_in = far_in_bytes / self.outside_link(m2, before=True, fastest=False)
        elif far_in_bytes:
            far_in = far_in_bytes / (mt.size * self.outside_link(m2, before=True, fastest=True))
        if far_out_bytes and upper:
            far_out = far_out_sends / self.outside_link(m, before=False, fastest=False)
        elif far_out_bytes:
            far_out = far_out_bytes / (ms.size * self.outside_link(m, before=False, fastest=True))
        got = self._link_cache[key] = (x, far_out, far_in)
        return got

    def io_bytes(self, ia: int, ib: int, ic: int) -> tuple[float, float, float, float]:
        """Bytes of the transfers in :meth:`io`, whatever the sub-meshes: s -> t, into t from
        before s, out of s past t (each once), and the latter once per later reading interval."""
        key = ("bytes", ia, ib, ic)
        got = self._link_cache.get(key)
        if got is not None:
            return got
        cuts = self.cuts
        a, b, c = cuts[ia], cuts[ib], cuts[ic]
        near = far_in = 0.0
        for t in self.segment(b, c).inputs:
            q = self.sm.producer.get(t)
            if q is None:
                continue
            if q >= a:
                near += tensor_bytes(self.sm, t)
            else:
                far_in += tensor_bytes(self.sm, t)
        far_out = sends = 0.0
        for t in self.segment(a, b).outputs:
            readers = self.reader_intervals(t, c)
            if readers:
                far_out += tensor_bytes(self.sm, t)
                sends += readers * tensor_bytes(self.sm, t)
        got = self._link_cache[key] = (near, far_in, far_out, sends)
        return got

    def reader_intervals(self, t: str, c: int) -> int:
        """How many intervals between consecutive cut points at or after ``c`` read ``t``: at
        most that many later stages receive it."""
        key = ("readers", t, c)
        got = self._link_cache.get(key)
        if got is None:
            readers = {i for i, op in enumerate(self.sm.ops) if i >= c and t in op.node.input}
            got = sum(
                1
                for lo, hi in zip(self.cuts, self.cuts[1:], strict=False)
                if lo >= c and any(lo <= r < hi for r in readers)
            )
            self._link_cache[key] = got
        return got

    def specs(self, path) -> list[StageSpec]:
        out = []
        for a, b, m in path:
            pc = self.pair(a, b, m)
            seg, mesh = self.segment(a, b), self.meshes[m]
            strategies = {op.name: s for op, s in zip(seg.sm.ops, pc.strategies, strict=True)}
            out.append(StageSpec(a, b, mesh.devices, mesh.mesh.shape, strategies))
        return out


def _insert(labels: list[_Label], new: _Label) -> None:
    """Keep the Pareto front of (worst, recv): drop ``new`` if dominated, else the ones it
    dominates."""
    for lab in labels:
        if lab.worst <= new.worst and lab.recv <= new.recv:
            return
    labels[:] = [lab for lab in labels if not (new.worst <= lab.worst and new.recv <= lab.recv)]
    labels.append(new)


def weight_floor(seg: Segment, devices: int) -> float:
    """Bytes per device the segment's weights need at least: each split over every device."""
    sm = seg.sm
    weights = {t for op in sm.ops for t in op.data_inputs if t in sm.consts}
    return sum(tensor_bytes(sm, t) for t in weights) / devices


def _ran_out(stats: dict) -> bool:
    """Whether an unproven exact sharding solve stopped for lack of time (more may prove it),
    not because CP-SAT proved its integer model, re-solved at a finer scale, and rounding
    still leaves a gap (more time changes nothing)."""
    return stats.get("cpsat_status") != "OPTIMAL" or "resolved_with_upper_bound" not in stats


def _span(devices) -> str:
    d = list(devices)
    return f"{d[0]}-{d[-1]}" if len(d) > 1 else str(d[0])


def _fmt_bytes(x: float) -> str:
    return f"{format_bytes(x)} ({x:.0f} bytes)"


def describe_space(search: JointSearch) -> str:
    shapes = [
        "x".join(map(str, shape))
        for shape in sorted({m.mesh.shape for m in search.meshes}, key=lambda s: (math.prod(s), s))
    ]
    n = search.n
    cuts = len(search.cuts) - 2
    if search.space == "sharding":
        return (
            f"one stage holding all {n} operators on all {search.cluster.devices} devices "
            f"(meshes {', '.join(shapes)}), any strategy per operator within the memory limit"
        )
    where = "every position" if cuts == n - 1 else f"{cuts} cut points (fewest crossing tensors)"
    on = (
        "each on one device"
        if search.space == "pipeline"
        else f"each on a host-aligned sub-mesh (sizes/meshes {', '.join(shapes)})"
    )
    return (
        f"pipelines of contiguous operator ranges split at {where} of the topological order, "
        f"{on}, devices taken in cluster order, any strategy per operator within the memory "
        "limit"
    )


def plan_joint(
    model,
    cluster,
    memory=None,
    time_limit: float = 60.0,
    dims: dict[str, int] | None = None,
    space: str = "joint",
    progress=None,
    *,
    workers: int = 0,
    gap: float = 0.0,
) -> JointPlan:
    """The best joint plan found within ``time_limit`` and a lower bound valid over its
    ``space`` (module docstring). ``memory``: bytes or "40GB" per device (default: each
    device's capacity); ``gap``: stop once the relative gap is at most this. Raises
    :class:`MtppError` when no plan of the space fits."""
    t0, clock0 = time.perf_counter(), _clock()  # loading the model counts
    if space not in SPACES:
        raise MtppError(f"space must be one of {', '.join(SPACES)}, got {space!r}")
    check_time_limit(time_limit)
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster)
    memory = checked_memory(memory)
    if progress is not None and not isinstance(model, ShardModel):
        progress.note("loading the model")
    sm = model if isinstance(model, ShardModel) else load_model(model, dims or {}, weights=False)
    search = JointSearch(sm, cluster, memory, space, clock0 + time_limit, progress, workers)
    _check_fits_somewhere(search)
    if progress is not None:
        c = len(search.cuts)
        progress.note(f"pricing {c * (c - 1) // 2} segments x {len(search.meshes)} sub-meshes")
    # the universal bound is valid for every joint plan, so over the space too
    rounds = _Rounds(search, universal_bound(sm, cluster), t0, gap)
    rounds.run()
    if rounds.stages is None:
        raise _no_plan_error(space, cluster, memory, time_limit, rounds.low_value)
    return _finish(search, rounds, model, t0)


class _Rounds:
    """The rounds of one joint search: the incumbent (best objective and its stages), the
    lower bound proven so far, and the lower programme's last value."""

    def __init__(self, search: JointSearch, universal: float, t0: float, gap: float) -> None:
        self.search, self.universal, self.t0, self.gap = search, universal, t0, gap
        self.objective = math.inf
        self.stages: list | None = None
        self.lower = 0.0
        self.low_value = 0.0  # inf once the lower programme proves no plan fits

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def run(self) -> None:
        """The first incumbents, then rounds until the gap closes, nothing is left to refine
        or time runs out; on Ctrl-C (as CP-SAT does) the best plan so far with its bound."""
        search = self.search
        try:
            for path in search.seeds():
                self.offer(path)
            search.stats["first_plan_seconds"] = self.wall()
            self.report(min(self.universal, self.objective))
            while self.one_round():
                pass
        except KeyboardInterrupt:
            if self.stages is None:
                raise
            search.stats["interrupted"] = True

    def offer(self, path) -> None:
        """Re-price a DP path exactly; keep it when it beats the incumbent."""
        search = self.search
        stages, over = price_stages(search.sm, search.cluster, search.specs(path), search.memory)
        if over is not None:  # the pair costs come from plans that fit: a bug
            raise InvalidBoundError(f"a joint plan built from fitting programs: {over}")
        obj = max(s.time for s in stages)
        if obj < self.objective:
            self.objective, self.stages = obj, stages

    def report(self, bound: float) -> None:
        if self.search.progress is not None:
            self.search.progress.update(self.objective, bound, self.wall())

    def one_round(self) -> bool:
        """Both programmes, then exact solves of the pairs they use; False when done."""
        search = self.search
        if search.expired():
            search.stats["stopped"] = True
            return False
        search.stats["rounds"] += 1
        try:
            _, up_path = search.dp(upper=True)
            if up_path:
                self.offer(up_path)
            self.low_value, low_path = search.dp(upper=False, cap=self.objective)
        except _Expired:
            search.stats["stopped"] = True
            return False
        best = self.objective
        self.lower = max(self.lower, min(self.low_value, best), min(self.universal, best))
        self.report(self.lower)
        if self.stages is not None and best - self.lower <= max(self.gap, OPTIMALITY_TOL) * best:
            return False
        if not low_path and self.stages is None:
            return False  # no plan of the space fits
        return self.refine(list(dict.fromkeys([*up_path, *low_path])))

    def refine(self, pairs) -> bool:
        """Solve exactly the pairs not solved yet; when every pair had its solve, give more
        time to one that ran out unproven. True when something was solved."""
        search = self.search
        did = False
        for a, b, m in pairs:
            if search.expired():
                break
            did = search.refine(a, b, m) or did
        return did or search.retry(pairs)


def _no_plan_error(space: str, cluster: Cluster, memory, time_limit: float, low) -> MtppError:
    """Why no joint plan was found: proven (the lower programme is inf) or out of time."""
    limit = _limit_text(cluster, memory)
    if math.isinf(low):
        return MtppError(
            f"proven: no joint plan of the {space} space fits the memory limit ({limit}): "
            "every stage candidate needs more; raise --memory"
        )
    return MtppError(
        f"no joint plan found within {time_limit:g} s"
        + (f" that fits the memory limit ({limit})" if limit else "")
        + "; raise --time-limit"
        + (" or --memory" if limit else "")
    )


def _finish(search: JointSearch, rounds: _Rounds, model, t0: float) -> JointPlan:
    """The incumbent with its certified bound and status (OPTIMAL only when the bound meets
    it) and the search's counts."""
    verdict = certify("joint", rounds.objective, [rounds.lower, rounds.universal], proven=True)
    search.stats.update(
        cut_points=len(search.cuts),
        sub_meshes=len(search.meshes),
        priced_pairs=len(search.costs),
        segments=len(search.segments),
    )
    sm = search.sm
    return JointPlan(
        getattr(getattr(sm.model, "graph", None), "name", "") or "model",
        search.cluster,
        search.memory,
        rounds.stages,
        verdict.status,
        verdict.lower_bound,
        describe_space(search),
        min(rounds.universal, rounds.objective),
        search.space,
        time.perf_counter() - t0,
        search.stats,
        model_path=None if isinstance(model, ShardModel) else str(model),  # for mtpp simulate
    )


def _limit_text(cluster: Cluster, memory) -> str | None:
    """The memory limit in words; None when there is none."""
    if memory is not None:
        return f"{_fmt_bytes(memory)} per device"
    _, capacity, _ = cluster.device_arrays()
    if np.isinf(capacity).all():
        return None
    return "each device's capacity"


def _check_fits_somewhere(search: JointSearch) -> None:
    """Refuse at once (one line) an operator whose weights alone exceed the limit on every
    candidate sub-mesh, naming it and the memory it needs."""
    sm = search.sm
    if not search.meshes:
        raise MtppError("no candidate sub-mesh on this cluster")
    for op in sm.ops:
        weights = {t for t in op.data_inputs if t in sm.consts}
        total = sum(tensor_bytes(sm, t) for t in weights)
        need = {m.size: total / m.size for m in search.meshes}
        limits = [(search.limit(m), m.size) for m in search.meshes]
        if all(lim is not None and need[size] > lim for lim, size in limits):
            size = max(m.size for m in search.meshes)
            lim = max(lim for lim, _ in limits)
            raise MtppError(
                f"operator {op.name!r} ({op.op_type}) fits on no stage of the {search.space} "
                f"space: its weights alone need {_fmt_bytes(need[size])} per device even split "
                f"over {size} device(s), above the memory limit of {_fmt_bytes(lim)}; raise "
                "--memory"
                + (" or allow sharding (space joint)" if search.space == "pipeline" else "")
            )
