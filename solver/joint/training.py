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

from solver.core.cluster import Cluster, load_cluster
from solver.core.errors import MtppError
from solver.core.options import check_time_limit, checked_memory
from solver.core.result import InvalidBoundError, certify
from solver.core.training import CAPACITY_SLACK, TrainingSpec
from solver.joint.plan import (
    JointPlan,
    JointTraining,
    Stage,
    StageSpec,
    TrainingStage,
)
from solver.joint.planner import JointSearch, describe_space
from solver.joint.segment import Segment, make_segment, tensor_bytes
from solver.joint.submesh import SPACES, stage_limit, sub_cluster, transfer_time
from solver.spmd.mesh import mesh_on
from solver.spmd.model import ShardModel, load_model
from solver.spmd.patterns import data_parallel_plan, megatron_plan
from solver.spmd.program import Planner, evaluate
from solver.spmd.propagate import propagate
from solver.spmd.strategy import Strategy
from solver.spmd.training import GradientFlow, gradient_flow
from solver.spmd.training import TrainingSpec as ShardTraining

JOINT_SCHEDULES = ("gpipe", "1f1b")
EVERY_COMBINATION_UP_TO = (
    256  # a segment with at most this many strategy combinations is enumerated
)
HEURISTICS = {"dp": data_parallel_plan, "megatron": megatron_plan, "propagate": propagate}
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
    base: float  # bytes per device with one microbatch in flight
    stash: float  # bytes per device each further microbatch in flight keeps

    def memory(self, inflight: float) -> float:
        return self.base + (inflight - 1.0) * self.stash

    def dominates(self, other: StageOption) -> bool:
        return (
            self.time <= other.time
            and self.sync <= other.sync
            and self.base <= other.base
            and self.stash <= other.stash
        )


@dataclass
class TrainingPair:
    """The options of one (segment, sub-mesh): ``upper`` real choices, ``lower`` bounds (each
    real choice is dominated by one of them); ``exact`` when both are every combination."""

    upper: list[StageOption]
    lower: list[StageOption]
    exact: bool
    sources: list[str]


@dataclass
class _Label:
    total: float  # sum of the times of the stages after this one
    worst: float  # the largest of them
    sync: float  # the largest synchronisation of this stage and those after it
    partial: float  # this stage's time less what it receives
    state: tuple[int, int, int, int]  # (cut index of start, of end, sub-mesh, count key)
    option: StageOption
    next: _Label | None


# ---------------------------------------------------------------------- pricing one stage
def segment_flow(whole: GradientFlow, seg: Segment) -> GradientFlow:
    """The gradient flow of a segment as part of the whole model: its inputs computed from
    weights carry gradients (the sub-model alone would take them for model inputs)."""
    return GradientFlow(whole.trainable, whole.needs_grad, whole.has_backward[seg.start : seg.end])


def training_planner(seg: Segment, cluster: Cluster, devices, shape, state: float, flow):
    """The sharding planner of a segment on a sub-mesh, pricing training (``flow``: the
    whole model's gradient flow)."""
    mesh = mesh_on(cluster, devices, shape)
    planner = Planner(seg.sm, mesh, sub_cluster(cluster, devices), ShardTraining(state))
    planner.flow = segment_flow(flow, seg)
    return planner


def price_option(planner: Planner, strategies: dict[str, Strategy]) -> StageOption:
    """One choice of strategies priced for training (ZeRO-1 memory for every synchronised
    weight: the same time in the ring model, the least memory)."""
    prog = evaluate(planner, strategies)
    sync = math.fsum(prog.training.sync_time)
    stash = math.fsum(planner.output_bytes(i, sh) for i, sh in enumerate(prog.shardings))
    names = tuple(strategies[op.name] for op in planner.sm.ops)
    forward = prog.objective - prog.training.total
    return StageOption(names, forward, prog.objective - sync, sync, prog.memory_per_device, stash)


def _pareto(options: list[StageOption]) -> list[StageOption]:
    out: list[StageOption] = []
    for o in sorted(options, key=lambda o: (o.time, o.sync, o.base, o.stash)):
        if not any(p.dominates(o) for p in out):
            out.append(o)
    return out


def price_pair(planner: Planner, seg: Segment, devices: int, state: float) -> TrainingPair:
    """Every combination of a small segment (upper = lower, exact), else the heuristics'
    plans (upper) and each operator's least compute with memory floors (lower)."""
    n = len(seg.sm.ops)
    cands = [planner.candidates(i) for i in range(n)]
    if math.prod(len(c) for c in cands) <= EVERY_COMBINATION_UP_TO:
        opts = [
            price_option(
                planner, {op.name: sh.strategy for op, sh in zip(seg.sm.ops, combo, strict=True)}
            )
            for combo in itertools.product(*cands)
        ]
        opts = _pareto(opts)
        return TrainingPair(opts, opts, True, ["every combination"])
    upper, sources = [], []
    for name, fn in HEURISTICS.items() if devices > 1 else list(HEURISTICS.items())[:1]:
        upper.append(price_option(planner, fn(planner, {})))
        sources.append(name)
    least = sum(
        min(planner.compute_time(i, sh) + planner.backward_compute(i, sh) for sh in cands[i])
        for i in range(n)
    )
    weights, stash = memory_floors(seg, planner.flow, devices, state)
    lower = StageOption(None, 0.0, least, 0.0, weights + stash, stash)
    return TrainingPair(_pareto(upper), [lower], False, [*sources, "least compute"])


def memory_floors(seg: Segment, flow: GradientFlow, devices: int, state: float):
    """Bytes per device no strategy goes below (docs/training.md): each weight split over
    every device (a trainable one with ``state`` bytes of training state per byte, ZeRO-1
    included), and each operator output (kept for the backward) likewise."""
    sm = seg.sm
    weights = {t for op in sm.ops for t in op.data_inputs if t in sm.consts}
    w = sum(tensor_bytes(sm, t) * (state if t in flow.trainable else 1.0) for t in weights)
    outs = sum(tensor_bytes(sm, t) for op in sm.ops for t in op.outputs)
    return w / devices, outs / devices


# ---------------------------------------------------------------------- the exact cost
def price_training_stages(sm, cluster: Cluster, specs: list[StageSpec], memory, spec):
    """The stages of ``specs`` priced as a training plan under ``spec`` (the one cost
    function: the planner, the brute-force tests). Returns (stages, training, over) with
    ``over`` naming the first stage above its memory limit (None: the plan fits)."""
    flow = gradient_flow(sm)
    segs = [make_segment(sm, sp.start, sp.end) for sp in specs]
    options = [
        price_option(
            training_planner(seg, cluster, sp.devices, sp.shape, spec.optimizer_state, flow),
            sp.strategies,
        )
        for seg, sp in zip(segs, specs, strict=True)
    ]
    io_in, io_out = _transfers(sm, cluster, specs, segs)
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
    return stages, training, over


def _transfers(sm, cluster, specs, segs) -> tuple[list[float], list[float]]:
    """Each stage's receive and send time (the rule of docs/joint.md, once per direction)."""
    stage_of = {t: i for i, seg in enumerate(segs) for t in seg.outputs}
    io_in, io_out = [0.0] * len(specs), [0.0] * len(specs)
    for j, seg in enumerate(segs):
        for x in seg.inputs:
            i = stage_of.get(x)
            if i is None:
                continue
            dt = transfer_time(tensor_bytes(sm, x), cluster, specs[i].devices, specs[j].devices)
            io_in[j] += dt
            io_out[i] += dt
    return io_in, io_out


def _iteration_time(spec: TrainingSpec, times, syncs) -> float:
    a, b = spec.time_weights
    return a * math.fsum(times) + b * max(times) + max(syncs)


# ---------------------------------------------------------------------- the search
class TrainingSearch:
    """The joint space of :class:`JointSearch` (cut points, sub-meshes, transfers) priced for
    training, and the dynamic programme over stages."""

    def __init__(self, search: JointSearch, spec: TrainingSpec):
        self.search, self.spec = search, spec
        self.flow = gradient_flow(search.sm)
        self.pairs: dict[tuple[int, int, int], TrainingPair] = {}
        self.cache: dict[tuple, TrainingPair] = {}
        self.exact = True  # every pair priced by every combination

    def pair(self, ia: int, ib: int, m: int) -> TrainingPair:
        key = (ia, ib, m)
        got = self.pairs.get(key)
        if got is None:
            s = self.search
            seg = s.segment(s.cuts[ia], s.cuts[ib])
            grads = tuple(t in self.flow.needs_grad for t in seg.inputs)
            ckey = (seg.signature, grads, s.mesh_key(m))
            got = self.cache.get(ckey)
            if got is None:
                mesh = s.meshes[m]
                planner = training_planner(
                    seg,
                    s.cluster,
                    mesh.devices,
                    mesh.mesh.shape,
                    self.spec.optimizer_state,
                    self.flow,
                )
                got = self.cache[ckey] = price_pair(
                    planner, seg, mesh.size, self.spec.optimizer_state
                )
                self.exact = self.exact and got.exact
                s.note_pricing(len(self.cache))
            self.pairs[key] = got
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
        pc = self.pair(ia, ib, m)
        limit = self.search.limit(self.search.meshes[m])
        c = self.count(qkey)
        opts = pc.upper if upper else pc.lower
        if limit is None:
            return opts
        return [o for o in opts if o.memory(c) <= limit * (1 + CAPACITY_SLACK)]

    def dp(self, upper: bool, cap: float = math.inf, deadline: float = math.inf):
        """The least T over the space (upper or lower prices), stages built from the last one
        with Pareto labels. Returns (value, path of (start, end, sub-mesh, option)); labels
        whose T is already >= ``cap`` are dropped (value ``cap``: none below it)."""
        s = self.search
        last = len(s.cuts) - 1
        first_key = 0 if self.spec.schedule == "gpipe" else 1
        labels: dict[tuple, list[_Label]] = {}
        best: list = [cap, None]
        for ia in range(last):
            for m in range(len(s.meshes)):
                for o in self.fitting(ia, last, m, first_key, upper):
                    lab = _Label(0.0, 0.0, o.sync, o.time, (ia, last, m, first_key), o, None)
                    self._add(labels, lab, best)
        for ib in range(last - 1, 0, -1):
            if _clock() > deadline:
                raise _Expired
            for state in [st for st in labels if st[0] == ib]:
                self._extend(state, labels.pop(state), labels, best, upper)
        return best[0], _path(best[1], s)

    def _extend(self, state, here: list[_Label], labels, best, upper: bool) -> None:
        """Every stage before ``state``'s, on a sub-mesh earlier in cluster order."""
        s = self.search
        ib, ic, m2, qkey = state
        key = self.next_key(qkey)
        for ia in range(ib):
            for m in range(len(s.meshes)):
                if s.meshes[m].end > s.meshes[m2].start:
                    continue
                opts = self.fitting(ia, ib, m, key, upper)
                if not opts:
                    continue
                x, out_r, in_s = s.io(ia, ib, ic, m, m2, upper)
                for lab in here:
                    t = lab.partial + 2 * (x + in_s)
                    total, worst = lab.total + t, max(lab.worst, t)
                    for o in opts:
                        partial = o.time + 2 * (x + out_r)
                        new = _Label(
                            total, worst, max(lab.sync, o.sync), partial, (ia, ib, m, key), o, lab
                        )
                        self._add(labels, new, best)

    def _add(self, labels, lab: _Label, best: list) -> None:
        """Keep ``lab`` unless its T can only reach ``best`` or another label dominates it; a
        first stage (start 0) completes a plan."""
        a, b = self.spec.time_weights
        value = a * (lab.total + lab.partial) + b * max(lab.worst, lab.partial) + lab.sync
        if value >= best[0]:
            return
        if lab.state[0] == 0:
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
        ia, ib, m, _ = lab.state
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
) -> JointPlan:
    """The least-T joint training plan of the ``space`` (module docstring) with its bound.
    Raises :class:`MtppError` when no plan of the space fits the memory."""
    t0 = time.perf_counter()
    check_training_spec(spec)
    if space not in SPACES:
        raise MtppError(f"space must be one of {', '.join(SPACES)}, got {space!r}")
    check_time_limit(time_limit)
    cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    memory = checked_memory(memory)
    if progress is not None and not isinstance(model, ShardModel):
        progress.note("loading the model")
    sm = model if isinstance(model, ShardModel) else load_model(model, dims or {})
    deadline = _clock() - (time.perf_counter() - t0) + time_limit
    search = JointSearch(sm, cluster, memory, space, deadline, progress, 0)
    ts = TrainingSearch(search, spec)
    incumbent = _upper_plan(ts, progress)
    if incumbent is None:
        raise _no_plan(space, ts, memory)
    stages, training = incumbent
    lower, stats = _lower_bound(ts, training.iteration_time, deadline, progress)
    return _finish(ts, stages, training, lower, stats, model, t0)


def _upper_plan(ts: TrainingSearch, progress):
    """The upper programme's plan re-priced exactly, or None when no plan fits."""
    if progress is not None:
        progress.note("pricing stages for training (upper programme)")
    value, path = ts.dp(upper=True)
    if not path:
        return None
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
    stages, training, over = price_training_stages(s.sm, s.cluster, specs, s.memory, ts.spec)
    if over is not None or training.iteration_time > value * (1 + 1e-9) + 1e-15:
        raise InvalidBoundError(f"a joint training plan re-priced above its programme: {over}")
    if progress is not None:
        progress.update(training.iteration_time, None, None)
    return stages, training


def _lower_bound(ts: TrainingSearch, upper: float, deadline: float, progress):
    """The lower programme's value (a bound over the space), capped by the incumbent; 0 when
    the deadline stops it."""
    if progress is not None:
        progress.note("lower programme")
    stats = {"every_combination": ts.exact, "priced_pairs": len(ts.cache)}
    try:
        value, _ = ts.dp(upper=False, cap=upper, deadline=deadline)
    except _Expired:
        stats["stopped"] = True
        return 0.0, stats
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


def _finish(ts: TrainingSearch, stages, training, lower, stats, model, t0) -> JointPlan:
    s = ts.search
    T = training.iteration_time
    verdict = certify("joint training", T, [lower], proven=True)
    stats.update(cut_points=len(s.cuts), sub_meshes=len(s.meshes), segments=len(s.segments))
    space = describe_space(s) + (
        f"; trained with {ts.spec.schedule}, m = {ts.spec.microbatches}, every stage's "
        "synchronised weights with ZeRO-1's memory"
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
    "TrainingPair",
    "TrainingSearch",
    "check_training_spec",
    "memory_floors",
    "plan_joint_training",
    "price_option",
    "price_pair",
    "price_training_stages",
    "training_lines",
]
