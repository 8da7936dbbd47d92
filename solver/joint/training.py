"""Joint training plans: pipeline stages on sub-meshes that shard their operators, trained with
a pipeline schedule (docs/training.md, "Joint training plans").

A stage (a segment of operators on a sub-mesh, one strategy per operator) runs per microbatch
the sharded program's forward and backward (``solver.spmd`` with a training spec: backward
compute, the backward's collectives) plus its transfers twice (forward, and the gradients
back); once per iteration it synchronises its weight gradients over the axes that hold them as
partial sums (the sub-mesh's data axis). With t_i its time per microbatch and y_i its
synchronisation, for GPipe and 1F1B

    T = sum_i t_i + (m - 1) max_i t_i + max_i y_i,
    memory_i = base_i + (inflight_i - 1) stash_i <= the stage's limit,

base_i the sharded program's training memory with one microbatch in flight (weights with their
gradients and optimizer state, every activation its backward reads, the copies), stash_i the
activations one more microbatch keeps, inflight_i as ``core.training`` (m; min(m, p - i)).

The search is the joint planner's space (cut points, host-aligned sub-meshes in cluster order)
and an exact dynamic programme over stages built from the last one (so each stage knows how
many follow it, hence its in-flight count) with Pareto labels (sum of the finished stages'
times, their largest, the largest synchronisation, the current stage's time less what it
receives). It runs twice: on upper prices (strategies that exist: every combination of a small
segment, else data parallel, Megatron and propagation) and on lower prices (every combination,
else each operator's least forward + backward compute, no synchronisation, memory floors), the
transfers that skip a stage bracketed as in the inference planner. The upper plan is re-priced
exactly; OPTIMAL only when the lower programme meets it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster, load_cluster
from solver.core.errors import MtppError
from solver.core.options import check_time_limit, checked_memory
from solver.core.result import InvalidBoundError, certify
from solver.core.training import CAPACITY_SLACK, TrainingSpec
from solver.frontends.onnx.backward import RULES, kept_positions
from solver.joint.bound import training_work, universal_training_bound
from solver.joint.plan import (
    JointPlan,
    JointTraining,
    Stage,
    StageSpec,
    TrainingStage,
    stage_transfers,
)
from solver.joint.planner import JointSearch, describe_space
from solver.joint.segment import Segment, make_segment, tensor_bytes
from solver.joint.submesh import SPACES, stage_limit, sub_cluster
from solver.joint.training_bound import STAGE_SUM, StageSumPricer
from solver.spmd.mesh import mesh_on
from solver.spmd.model import ShardModel, load_model
from solver.spmd.patterns import data_parallel_plan, megatron_plan
from solver.spmd.program import Planner, evaluate
from solver.spmd.redistribute import local_bytes
from solver.spmd.strategy import Strategy
from solver.spmd.training import GradientFlow, gradient_flow
from solver.spmd.training import TrainingSpec as ShardTraining

JOINT_SCHEDULES = ("gpipe", "1f1b")
# a pair (segment, sub-mesh) with at most this many strategy combinations is enumerated
EVERY_COMBINATION_UP_TO = 256
# a big pair's upper plans (Megatron's plan runs propagation for the operators it does not
# place; propagation alone costs as much again and, on the Llama shape, gave no better plan)
HEURISTICS = {"dp": data_parallel_plan, "megatron": megatron_plan}
BOUND_SHARE = 0.4  # of the time limit: the stage-sum bound's interval solves take at most this
PRICING_SHARE = 0.75  # of the time left: the upper programme prices big pairs until then
UPPER_SHARE = 0.85  # of the time left: the upper programme stops then (the first plan stands)
_clock = time.perf_counter  # the deadline's clock (tests may replace it)


class _Expired(Exception):
    """The deadline passed during the lower programme: its value is not a bound."""


@dataclass(frozen=True)
class StageOption:
    """A segment on a sub-mesh with one strategy per operator, priced for training (or a lower
    bound on every such choice when ``strategies`` is None)."""

    strategies: tuple[Strategy, ...] | None
    forward: float  # the forward program per microbatch (its part of ``time``)
    time: float  # forward + backward program per microbatch, without the gradient sync
    sync: float  # the gradient synchronisation, once per iteration
    base: float  # bytes per device: weights with their training state + the forward's peak
    stash: float  # bytes per device each microbatch in flight keeps for its backward

    def memory(self, inflight: float) -> float:
        return self.base + inflight * self.stash

    def dominates(self, other: StageOption) -> bool:
        return (
            self.time <= other.time
            and self.sync <= other.sync
            and self.base <= other.base
            and self.stash <= other.stash
        )


@dataclass(frozen=True)
class LabelState:
    """Where a label of the training programme sits: its stage's segment (cut indices), its
    sub-mesh, and its count key (the stages from it to the end, for 1F1B's in-flight count)."""

    start: int
    end: int
    mesh: int
    count_key: int


@dataclass
class _Label:
    total: float  # sum of the times of the stages after this one
    worst: float  # the largest of them
    sync: float  # the largest synchronisation of this stage and those after it
    partial: float  # this stage's time less what it receives
    state: LabelState
    option: StageOption
    next: _Label | None


# ---------------------------------------------------------------------- pricing one stage
def segment_flow(whole: GradientFlow, seg: Segment) -> GradientFlow:
    """The gradient flow of a segment as part of the whole model: its inputs computed from
    weights carry gradients (the sub-model alone would take them for model inputs)."""
    return whole.part(seg.start, seg.end)


def training_planner(seg: Segment, cluster: Cluster, devices, shape, state: float, flow):
    """The sharding planner of a segment on a sub-mesh, pricing training (``flow``: the
    whole model's gradient flow)."""
    mesh = mesh_on(cluster, devices, shape)
    planner = Planner(seg.sm, mesh, sub_cluster(cluster, devices), ShardTraining(state))
    planner.flow = segment_flow(flow, seg)
    return planner


def forward_planner(planner: Planner) -> Planner:
    """The inference planner of the same segment and mesh (the forward's activation peak),
    sharing the caches that do not depend on training."""
    fwd = Planner(planner.sm, planner.mesh, planner.cluster)
    fwd.share_caches(planner)
    return fwd


def price_option(planner: Planner, strategies: dict[str, Strategy], fwd: Planner | None = None):
    """One choice of strategies priced for training: the program's time per microbatch
    (forward, backward and their collectives; the gradient sync apart), the weights with their
    training state (ZeRO-1 for every synchronised weight: the same time in the ring model, the
    least memory), the forward's activation peak and the stash of the backward table."""
    prog = evaluate(planner, strategies)
    sync = math.fsum(prog.training.sync_time)
    peak = evaluate(fwd or forward_planner(planner), strategies).peak_activation_memory
    names = tuple(strategies[op.name] for op in planner.sm.ops)
    forward = prog.objective - prog.training.total
    stash = stash_bytes(planner, prog.shardings)
    base = prog.weight_memory + peak
    return StageOption(names, forward, prog.objective - sync, sync, base, stash)


def stash_bytes(planner: Planner, shardings) -> float:
    """Bytes per device one microbatch keeps for the backward: the tensors the backward table
    keeps (activations only, each once), in the layout their operator reads or writes them."""
    return math.fsum(stash_per_op(planner, shardings))


def stash_per_op(planner: Planner, shardings) -> np.ndarray:
    """:func:`stash_bytes` by operator: each kept tensor counted at its first keeper."""
    sm, flow = planner.sm, planner.flow
    kept: set[str] = set()
    out = np.zeros(len(sm.ops))
    for v, op in enumerate(sm.ops):
        if not flow.has_backward[v]:
            continue
        rule = RULES.get(op.op_type)
        sh = shardings[v]
        items = []
        if rule is None or rule.output:
            items += list(zip(op.outputs, sh.out_layouts, strict=True))
        if rule is not None:
            inputs = list(op.node.input)
            present = [bool(t) for t in inputs]
            needs = [t in flow.needs_grad for t in inputs]
            for j in kept_positions(rule, present, needs):
                t = inputs[j]
                lay = sh.in_layouts[op.data.index(j)] if j in op.data else None
                items.append((t, lay))
        for t, lay in items:
            if t in kept or t in sm.consts:
                continue
            kept.add(t)
            out[v] += tensor_bytes(sm, t) if lay is None else local_bytes(lay, sm.itemsize(t))
    return out


def _pareto(options: list[StageOption]) -> list[StageOption]:
    out: list[StageOption] = []
    for o in sorted(options, key=lambda o: (o.time, o.sync, o.base, o.stash)):
        if not any(p.dominates(o) for p in out):
            out.append(o)
    return out


def every_combination(planner: Planner) -> list[StageOption]:
    """Every strategy combination of the planner's segment priced (the Pareto set): exact."""
    ops = planner.sm.ops
    fwd = forward_planner(planner)
    cands = [planner.candidates(i) for i in range(len(ops))]
    return _pareto(
        [
            price_option(
                planner, {op.name: sh.strategy for op, sh in zip(ops, c, strict=True)}, fwd
            )
            for c in itertools.product(*cands)
        ]
    )


def heuristic_options(planner: Planner, devices: int, extra=()) -> list[StageOption]:
    """The plans of data parallel and Megatron (one on one device) and the ``extra`` plans
    (strategy dicts: the stage-sum bound's interval optima put together), priced."""
    fwd = forward_planner(planner)
    names = list(HEURISTICS) if devices > 1 else list(HEURISTICS)[:1]
    plans = [HEURISTICS[n](planner, {}) for n in names]
    plans += [p for p in extra if p not in plans]
    return _pareto([price_option(planner, p, fwd) for p in plans])


@dataclass(frozen=True)
class WholePrices:
    """Per operator of the whole model on one sub-mesh, as prefix sums: the least forward +
    backward compute over its shardings, the weight bytes (with their training state) it reads
    first and the backward table's stash it keeps first (whole tensors), and its number of
    shardings. A segment's lower option comes from differences of these."""

    least: np.ndarray
    weights: np.ndarray
    stash: np.ndarray
    shardings: np.ndarray

    def lower(self, a: int, b: int, devices: int) -> StageOption:
        """A lower bound on every strategy of ops a..b-1 (docs/training.md): the least compute,
        no synchronisation, the weights and the stash split over every device."""
        time = float(self.least[b] - self.least[a])
        weights = float(self.weights[b] - self.weights[a]) / devices
        return StageOption(
            None, 0.0, time, 0.0, weights, float(self.stash[b] - self.stash[a]) / devices
        )

    def at_most(self, a: int, b: int, combinations: int) -> bool:
        """Whether ops a..b-1 have at most ``combinations`` strategy combinations."""
        if combinations < 1:
            return False
        return float(np.log(self.shardings[a:b]).sum()) <= math.log(combinations) + 1e-9


def whole_prices(planner: Planner, state: float) -> WholePrices:
    """:class:`WholePrices` of the whole model's training planner on one sub-mesh."""
    sm = planner.sm
    n = len(sm.ops)
    least, weights, shardings = np.zeros(n), np.zeros(n), np.zeros(n)
    seen: set[str] = set()
    for i, op in enumerate(sm.ops):
        cands = planner.candidates(i)
        shardings[i] = len(cands)
        least[i] = min(
            planner.compute_time(i, sh) + planner.backward_compute(i, sh) for sh in cands
        )
        for t in op.data_inputs:
            if t in sm.consts and t not in seen:
                seen.add(t)
                weights[i] += tensor_bytes(sm, t) * (state if t in planner.flow.trainable else 1.0)
    whole = [planner.candidates(i)[0] for i in range(n)]  # replicated first: whole tensors
    stash = stash_per_op(planner, whole)
    return WholePrices(
        *(np.concatenate([[0.0], np.cumsum(x)]) for x in (least, weights, stash)), shardings
    )


# ---------------------------------------------------------------------- the exact cost
@dataclass(frozen=True)
class PricedTraining:
    """A joint training plan priced: its stages, its training terms, and ``over`` naming the
    first stage above its memory limit (None: the plan fits)."""

    stages: list[Stage]
    training: JointTraining
    over: str | None


def price_training_stages(
    sm, cluster: Cluster, specs: list[StageSpec], memory, spec: TrainingSpec
) -> PricedTraining:
    """The stages of ``specs`` priced as a training plan under ``spec`` (the one cost
    function: the planner, the brute-force tests)."""
    flow = gradient_flow(sm)
    segs = [make_segment(sm, sp.start, sp.end) for sp in specs]
    options = [
        price_option(
            training_planner(seg, cluster, sp.devices, sp.shape, spec.optimizer_state, flow),
            sp.strategies,
        )
        for seg, sp in zip(segs, specs, strict=True)
    ]
    io_in, io_out = stage_transfers(sm, cluster, specs, segs)
    inflight = spec.inflight(len(specs))
    stages, rows, over = [], [], None
    for i, (seg, sp, o) in enumerate(zip(segs, specs, options, strict=True)):
        io = io_in[i] + io_out[i]
        mem, limit = o.memory(float(inflight[i])), stage_limit(cluster, sp.devices, memory)
        if over is None and limit is not None and mem > limit * (1 + CAPACITY_SLACK):
            over = f"stage {i} needs {mem:.0f} bytes per device > {limit:.0f}"
        mesh = mesh_on(cluster, sp.devices, sp.shape)
        strategies = dict(sp.strategies)
        stages.append(
            Stage(
                i,
                tuple(sp.devices),
                mesh,
                seg.ops,
                seg.inputs,
                seg.outputs,
                strategies,
                o.time,
                io_in[i],
                io_out[i],
                mem,
            )
        )
        rows.append(
            TrainingStage(
                o.forward + io,
                o.time - o.forward + io,
                o.time + 2 * io,
                o.sync,
                o.base,
                o.stash,
                float(inflight[i]),
                mem,
                limit,
            )
        )
    T = _iteration_time(spec, [r.time for r in rows], [r.sync for r in rows])
    training = JointTraining(spec.schedule, spec.microbatches, spec.optimizer_state, T, tuple(rows))
    return PricedTraining(stages, training, over)


def _iteration_time(spec: TrainingSpec, times, syncs) -> float:
    a, b = spec.time_weights
    return a * math.fsum(times) + b * max(times) + max(syncs)


# ---------------------------------------------------------------------- the search
class TrainingSearch:
    """The joint space of :class:`JointSearch` (cut points, sub-meshes, transfers) priced for
    training, and the dynamic programme over stages. A pair (segment, sub-mesh) with at most
    ``EVERY_COMBINATION_UP_TO`` strategy combinations is priced by all of them (upper = lower,
    exact); a bigger one gets its lower option from :class:`WholePrices` at once and its
    heuristic plans only when the programme needs them."""

    def __init__(self, search: JointSearch, spec: TrainingSpec):
        self.search, self.spec = search, spec
        self.flow = gradient_flow(search.sm)
        self.wholes: dict[tuple, WholePrices] = {}
        self.planners: dict[tuple, Planner] = {}  # the whole model's, per sub-mesh key
        self.cache: dict[tuple, list[StageOption]] = {}  # by (exact?, signature, mesh)
        self.exact = True  # every pair the lower programme used was priced exactly
        self.pricing_deadline = math.inf  # then big pairs not priced yet are left out (upper)
        self.stats: dict = {}
        self._fitting: dict[tuple, list[StageOption]] = {}
        # (start cut, end cut, sub-mesh) -> plans of the segment from its intervals' optima
        self.interval_plans = lambda ia, ib, m: ()
        # the operators before a cut: their least time and device-seconds (prefix sums)
        work = self.work = training_work(search.sm, search.cluster)
        self.prefix_least = np.concatenate([[0.0], np.cumsum(work.least)])
        self.prefix_spread = np.concatenate([[0.0], np.cumsum(work.spread)])

    def whole(self, m: int) -> WholePrices:
        s = self.search
        key = s.mesh_key(m)
        got = self.wholes.get(key)
        if got is None:
            mesh = s.meshes[m]
            sub = sub_cluster(s.cluster, mesh.devices)
            planner = Planner(s.sm, mesh.mesh, sub, ShardTraining(self.spec.optimizer_state))
            got = self.wholes[key] = whole_prices(planner, self.spec.optimizer_state)
            self.planners[key] = planner
        return got

    def small(self, ia: int, ib: int, m: int) -> bool:
        s = self.search
        return self.whole(m).at_most(s.cuts[ia], s.cuts[ib], EVERY_COMBINATION_UP_TO)

    def options(self, ia: int, ib: int, m: int, upper: bool) -> list[StageOption]:
        """The pair's options: exact for a small pair; else its heuristic plans (upper) or its
        lower option."""
        s = self.search
        a, b = s.cuts[ia], s.cuts[ib]
        small = self.small(ia, ib, m)
        if not upper and not small:
            self.exact = False
            return [self.whole(m).lower(a, b, s.meshes[m].size)]
        seg = s.segment(a, b)
        grads = tuple(t in self.flow.needs_grad for t in seg.inputs)
        key = (small, seg.signature, grads, s.mesh_key(m))
        got = self.cache.get(key)
        if got is None and not small and _clock() > self.pricing_deadline:
            self.stats["unpriced_pairs"] = self.stats.get("unpriced_pairs", 0) + 1
            return []  # out of pricing time: left out of the upper programme
        if got is None:
            mesh = s.meshes[m]
            state = self.spec.optimizer_state
            planner = training_planner(
                seg, s.cluster, mesh.devices, mesh.mesh.shape, state, self.flow
            )
            planner.share_caches(self.planners[s.mesh_key(m)])
            got = (
                every_combination(planner)
                if small
                else heuristic_options(planner, mesh.size, self.interval_plans(ia, ib, m))
            )
            self.cache[key] = got
            s.note_pricing(len(self.cache))
        return got

    def count(self, qkey: int) -> float:
        """The in-flight count of a stage with ``qkey`` stages from it to the end."""
        return float(self.spec.microbatches if self.spec.schedule == "gpipe" else qkey)

    def next_key(self, qkey: int) -> int:
        if self.spec.schedule == "gpipe":
            return 0
        return min(qkey + 1, self.spec.microbatches)

    def fitting(self, ia, ib, m, qkey, upper: bool) -> list[StageOption]:
        """The options of a pair that fit its memory limit with ``qkey``'s in-flight count."""
        key = (ia, ib, m, qkey, upper)
        got = self._fitting.get(key)
        if got is None:
            got = self._fitting[key] = self._fit(ia, ib, m, qkey, upper)
            if upper and not got and not self.small(ia, ib, m) and _clock() > self.pricing_deadline:
                del self._fitting[key]  # left out for lack of time, not proven empty
        return got

    def _fit(self, ia, ib, m, qkey, upper: bool) -> list[StageOption]:
        limit = self.search.limit(self.search.meshes[m])
        c = self.count(qkey)
        opts = self.options(ia, ib, m, upper)
        if limit is None:
            return opts
        return [o for o in opts if o.memory(c) <= limit * (1 + CAPACITY_SLACK)]

    def dp(self, upper: bool, cap: float = math.inf, deadline: float = math.inf):
        """The least T below ``cap`` over the space (upper or lower prices), stages built from
        the last one with Pareto labels. Returns (value, path of (start, end, sub-mesh,
        option)); ``cap`` and an empty path when no plan is below ``cap``."""
        s = self.search
        last = len(s.cuts) - 1
        first_key = 0 if self.spec.schedule == "gpipe" else 1
        labels: dict[LabelState, list[_Label]] = {}
        best: list = [cap, None]
        for ia in range(last):
            for m in range(len(s.meshes)):
                low = self.least_time(ia, last, m, first_key, upper)
                st = LabelState(ia, last, m, first_key)
                if low is None or self.at_least(st, 0.0, 0.0, low, 0.0) >= best[0]:
                    continue  # no option of this pair fits, or none can beat ``best``
                for o in self.fitting(ia, last, m, first_key, upper):
                    lab = _Label(0.0, 0.0, o.sync, o.time, st, o, None)
                    self._add(labels, lab, best)
        for ib in range(last - 1, 0, -1):
            for state in [st for st in labels if st.start == ib]:
                if _clock() > deadline:  # per state: a row of a 7B model takes many seconds
                    raise _Expired
                self._extend(state, labels.pop(state), labels, best, upper)
        return best[0], _path(best[1], s)

    def least_time(self, ia, ib, m, qkey, upper: bool) -> float | None:
        """A lower bound on the program time of every option of the pair that fits (None: none
        fits), from its lower options (without pricing a big pair's heuristics)."""
        del upper  # the same bound serves both programmes
        return min((o.time for o in self.fitting(ia, ib, m, qkey, False)), default=None)

    def _extend(self, state: LabelState, here: list[_Label], labels, best, upper: bool) -> None:
        """Every stage before ``state``'s, on a sub-mesh earlier in cluster order; a big pair's
        heuristics are priced only when its lower option could beat ``best``."""
        s = self.search
        ib, ic, m2 = state.start, state.end, state.mesh
        key = self.next_key(state.count_key)
        for ia in range(ib):
            for m in range(len(s.meshes)):
                if s.meshes[m].end > s.meshes[m2].start:
                    continue
                low = self.least_time(ia, ib, m, key, upper)
                if low is None:
                    continue
                x, out_r, in_s = s.io(ia, ib, ic, m, m2, upper)
                times = [lab.partial + 2 * (x + in_s) for lab in here]
                least = low + 2 * (x + out_r)
                st = LabelState(ia, ib, m, key)
                if all(
                    self.at_least(st, lab.total + t, max(lab.worst, t), least, lab.sync) >= best[0]
                    for lab, t in zip(here, times, strict=True)
                ):
                    continue
                opts = self.fitting(ia, ib, m, key, upper)
                for lab, t in zip(here, times, strict=True):
                    total, worst = lab.total + t, max(lab.worst, t)
                    for o in opts:
                        partial = o.time + 2 * (x + out_r)
                        new = _Label(
                            total, worst, max(lab.sync, o.sync), partial, st, o, lab
                        )
                        self._add(labels, new, best)

    def at_least(self, state: LabelState, total, worst, partial, sync) -> float:
        """A lower bound on T of every plan completing a label at ``state``: its stages, and
        the stages before it, which hold the operators before its segment on the devices
        before its sub-mesh (d of them): their times sum to at least the operators' least
        times and their device-seconds over d, and the largest is at least the latter
        (docs/training.md, "The universal training bound"; inf when d = 0 and some are left)."""
        a, b = self.spec.time_weights
        ia, m = state.start, state.mesh
        before = self.search.cuts[ia]
        sum_before = max_before = 0.0
        if before:
            d = self.search.meshes[m].start
            if d == 0:
                return math.inf
            spread = float(self.prefix_spread[before]) / d
            sum_before = max(float(self.prefix_least[before]), spread)
            max_before = spread
        return a * (total + partial + sum_before) + b * max(worst, partial, max_before) + sync

    def _add(self, labels, lab: _Label, best: list) -> None:
        """Keep ``lab`` unless its T can only reach ``best`` or another label dominates it; a
        first stage (start 0) completes a plan."""
        value = self.at_least(lab.state, lab.total, lab.worst, lab.partial, lab.sync)
        if value >= best[0]:
            return
        if lab.state.start == 0:
            best[0], best[1] = value, lab
            return
        here = labels.setdefault(lab.state, [])
        for o in here:
            if (
                o.total <= lab.total
                and o.worst <= lab.worst
                and o.sync <= lab.sync
                and o.partial <= lab.partial
            ):
                return
        here[:] = [
            o
            for o in here
            if not (
                lab.total <= o.total
                and lab.worst <= o.worst
                and lab.sync <= o.sync
                and lab.partial <= o.partial
            )
        ]
        here.append(lab)


def _path(lab: _Label | None, search: JointSearch) -> list[tuple[int, int, int, StageOption]]:
    out = []
    while lab is not None:
        ia, ib, m = lab.state.start, lab.state.end, lab.state.mesh
        out.append((search.cuts[ia], search.cuts[ib], m, lab.option))
        lab = lab.next
    return out


# ---------------------------------------------------------------------- the planner
def check_training_spec(spec: TrainingSpec) -> None:
    """Refuse (one line) a schedule the joint training planner does not model."""
    if spec.schedule not in JOINT_SCHEDULES:
        raise MtppError(
            f"--schedule {spec.schedule} does not apply to --method joint yet; use gpipe or 1f1b"
        )


def plan_joint_training(
    model,
    cluster,
    spec: TrainingSpec,
    memory=None,
    time_limit: float = 60.0,
    dims: dict[str, int] | None = None,
    space: str = "joint",
    progress=None,
    *,
    cut_stride: int = 1,
) -> JointPlan:
    """The least-T joint training plan of the ``space`` (module docstring) with its bound.
    ``cut_stride`` k > 1 keeps every k-th inner cut point only (a smaller space, stated in
    ``bound_space``: in a Llama-shaped model 2 keeps the layer boundaries). Raises
    :class:`MtppError` when no plan of the space fits the memory."""
    t0 = time.perf_counter()
    check_training_spec(spec)
    if space not in SPACES:
        raise MtppError(f"space must be one of {', '.join(SPACES)}, got {space!r}")
    check_time_limit(time_limit)
    cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    memory = checked_memory(memory)
    if progress is not None and not isinstance(model, ShardModel):
        progress.note("loading the model")
    sm = model if isinstance(model, ShardModel) else load_model(model, dims or {}, weights=False)
    deadline = _clock() - (time.perf_counter() - t0) + time_limit
    search = JointSearch(sm, cluster, memory, space, deadline, progress, 0)
    search.cuts = thinned(search.cuts, cut_stride)
    ts = TrainingSearch(search, spec)
    if progress is not None:
        progress.note("stage-sum bound: exact sharding of each cut interval")
    stage_sum = StageSumPricer(ts)
    stage_sum.price_all(_clock() + BOUND_SHARE * (deadline - _clock()), _clock)
    ts.interval_plans = stage_sum.segment_plans
    ts.pricing_deadline = _clock() + PRICING_SHARE * (deadline - _clock())
    upper_deadline = _clock() + UPPER_SHARE * (deadline - _clock())
    incumbent = _upper_plan(ts, _first_plan(ts, progress), progress, upper_deadline)
    if incumbent is None:
        raise _no_plan(space, ts, memory)
    T = incumbent.training.iteration_time
    universal = min(T, universal_training_bound(sm, cluster, spec.time_weights, ts.work))
    lower, stats = _lower_bound(ts, T, deadline, progress)
    bounds = {
        "universal training bound": universal,
        "lower programme": lower,
        STAGE_SUM: stage_sum.bound(T).value,
    }
    stats.update(bounds=bounds, bound=max(bounds, key=bounds.get), stage_sum=stage_sum.stats)
    plan = _finish(ts, incumbent, list(bounds.values()), stats, model, t0, cut_stride)
    plan.universal_bound = universal
    return plan


@dataclass(frozen=True)
class _Incumbent:
    """A plan of the space, priced exactly."""

    stages: list[Stage]
    training: JointTraining


def thinned(cuts: list[int], stride: int) -> list[int]:
    """The first and last cut points and every ``stride``-th inner one, counted from the last
    inner one (so that in a model of repeated layers with a head the kept ones are aligned to
    the layers' ends)."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise MtppError(f"the cut stride must be a whole number >= 1, got {stride!r}")
    inner = cuts[1:-1]
    kept = [c for i, c in enumerate(inner) if (len(inner) - 1 - i) % stride == 0]
    return [cuts[0], *kept, cuts[-1]] if len(cuts) > 1 else list(cuts)


def _first_plan(ts: TrainingSearch, progress) -> _Incumbent | None:
    """The best tiled plan: for each sub-mesh shape, as many stages as its sub-meshes tile the
    cluster (or cut intervals allow), on them in order, the cut points shared out evenly, each
    stage with its fastest priced option that fits. Its T caps the programmes."""
    if progress is not None:
        progress.note("first plans: even splits on tiled sub-meshes")
    best = None
    for path in _tiled_paths(ts):
        got = _priced(ts, path)
        if got is not None and (best is None or got.training.iteration_time < best_t(best)):
            best = got
    if progress is not None and best is not None:
        progress.update(best_t(best), -math.inf)  # no bound yet
    return best


def best_t(inc: _Incumbent) -> float:
    return inc.training.iteration_time


def _tiled_paths(ts: TrainingSearch):
    """The paths of :func:`_first_plan` (each stage as (start, end, sub-mesh, option))."""
    s = ts.search
    intervals = len(s.cuts) - 1
    for shape in sorted({(m.size, m.mesh.shape) for m in s.meshes}):
        tiles, end = [], 0
        for i, m in sorted(enumerate(s.meshes), key=lambda im: im[1].start):
            if (m.size, m.mesh.shape) == shape and m.start >= end:
                tiles.append(i)
                end = m.end
        p = min(len(tiles), intervals)
        bounds = [j * intervals // p for j in range(p + 1)]
        path = []
        for i in range(p):
            qkey = 0 if ts.spec.schedule == "gpipe" else min(p - i, ts.spec.microbatches)
            opts = ts.fitting(bounds[i], bounds[i + 1], tiles[i], qkey, True)
            if not opts:
                break
            o = min(opts, key=lambda o: (o.time, o.sync))
            path.append((s.cuts[bounds[i]], s.cuts[bounds[i + 1]], tiles[i], o))
        if len(path) == p:
            yield path


def _priced(ts: TrainingSearch, path) -> _Incumbent | None:
    """A path priced exactly (None when a stage is over its memory limit)."""
    s = ts.search
    specs = [
        StageSpec(
            a,
            b,
            s.meshes[m].devices,
            s.meshes[m].mesh.shape,
            {op.name: st for op, st in zip(s.segment(a, b).sm.ops, o.strategies, strict=True)},
        )
        for a, b, m, o in path
    ]
    priced = price_training_stages(s.sm, s.cluster, specs, s.memory, ts.spec)
    return None if priced.over is not None else _Incumbent(priced.stages, priced.training)


def _upper_plan(
    ts: TrainingSearch, first: _Incumbent | None, progress, deadline: float
) -> _Incumbent | None:
    """The upper programme's plan below the first plan's T, re-priced exactly (else the first
    plan, also when ``deadline`` stops the programme); None when no plan fits."""
    if progress is not None:
        progress.note("pricing stages for training (upper programme)")
    cap = math.inf if first is None else best_t(first)
    try:
        value, path = ts.dp(upper=True, cap=cap, deadline=deadline)
    except _Expired:
        if first is None:  # nothing found, nothing proven
            raise MtppError(
                "no joint training plan found within the time limit; raise --time-limit"
            ) from None
        ts.stats["upper_stopped"] = "the time limit stopped the upper programme: the first plan"
        return first
    if not path:
        return first
    got = _priced(ts, path)
    if got is None or best_t(got) > value * (1 + 1e-9) + 1e-15:
        raise InvalidBoundError("a joint training plan re-priced above its programme's value")
    if progress is not None:
        progress.update(best_t(got), -math.inf)  # no bound yet
    return got


def _lower_bound(ts: TrainingSearch, upper: float, deadline: float, progress):
    """The lower programme's value (a bound over the space), capped by the incumbent; 0 when
    the deadline stops it."""
    if progress is not None:
        progress.note("lower programme")
    stats: dict = {}
    try:
        value, _ = ts.dp(upper=False, cap=upper, deadline=deadline)
    except _Expired:
        stats["stopped"] = True
        value = 0.0
    stats.update(ts.stats, every_combination=ts.exact, priced_pairs=len(ts.cache))
    return min(value, upper), stats


def _no_plan(space: str, ts: TrainingSearch, memory) -> MtppError:
    s = ts.spec
    where = f"{memory:.0f} bytes per device" if memory is not None else "each device's capacity"
    if ts.exact:
        return MtppError(
            f"proven: no joint training plan of the {space} space fits the memory ({where}) "
            f"with {s.schedule}, m = {s.microbatches}; raise --memory or use fewer microbatches"
        )
    return MtppError(
        f"no joint training plan of the {space} space found that fits the memory ({where}) "
        f"with {s.schedule}, m = {s.microbatches}; raise --memory or use fewer microbatches"
    )


def _finish(
    ts: TrainingSearch, inc: _Incumbent, bounds: list[float], stats, model, t0, stride
) -> JointPlan:
    s = ts.search
    stages, training = inc.stages, inc.training
    T = training.iteration_time
    verdict = certify("joint training", T, bounds, proven=True)
    stats.update(cut_points=len(s.cuts), sub_meshes=len(s.meshes), segments=len(s.segments))
    if stride != 1:
        stats["cut_stride"] = stride  # the status names the restricted space
    kept = "" if stride == 1 else f" (only one in every {stride} such positions)"
    space = (
        describe_space(s)
        + kept
        + (
            f"; trained with {ts.spec.schedule}, m = {ts.spec.microbatches}, every stage's "
            "synchronised weights with ZeRO-1's memory"
        )
    )
    return JointPlan(
        getattr(getattr(s.sm.model, "graph", None), "name", "") or "model",
        s.cluster,
        s.memory,
        stages,
        verdict.status,
        verdict.lower_bound,
        space,
        None,
        s.space,
        time.perf_counter() - t0,
        stats,
        model_path=None if isinstance(model, ShardModel) else str(model),
        training=training,
    )


def training_lines(plan: JointPlan) -> list[str]:
    """A joint training plan's schedule and per-stage training terms in words (none for an
    inference plan)."""
    tr = plan.training
    if tr is None:
        return []
    out = [
        f"training: {tr.schedule}, m = {tr.microbatches}, optimizer state "
        f"x{tr.optimizer_state:g}; T = sum t + (m - 1) max t + max sync; solve time "
        f"{plan.wall_seconds:.2f} s; per stage (seconds per microbatch, bytes per device):"
    ]
    for i, r in enumerate(tr.stages):
        cap = "no limit" if r.capacity is None else f"{r.capacity:.4g}"
        out.append(
            f"  stage {i}: F {r.forward:.4g}  B {r.backward:.4g}  t {r.time:.4g}  sync "
            f"{r.sync:.4g}  in flight {r.inflight:g}  memory {r.memory:.4g} / {cap}"
        )
    return out


__all__ = [
    "StageOption",
    "TrainingSearch",
    "check_training_spec",
    "plan_joint_training",
    "price_option",
    "WholePrices",
    "every_combination",
    "heuristic_options",
    "PricedTraining",
    "price_training_stages",
    "training_lines",
    "universal_training_bound",
]
