"""Discrete-event simulation of a joint plan: pipeline stages, each an SPMD program on its
own devices, handling requests one after another (``mtpp simulate joint.json``).

Stage s handles request r once the stages it receives from have sent r (plus the link's
latency), once stage s-1 has handled r, and once it has finished r-1 itself. For each request
it receives its inputs, runs its sharded program (every operator's local compute and the
collectives that redistribute its inputs, then the reduction of outputs left as partial sums)
and sends its outputs. Everything is rebuilt here from the model, the cluster and the
strategies, not read from the plan's numbers:

- the program: :func:`solver.spmd.evaluate` on the stage's sub-model and mesh
  (:func:`solver.joint.stages.stage_programs`);
- a transfer of B bytes from stage s (devices S) to stage t (devices T) costs
  ``B / (min(|S|, |T|) * bw)`` on both sides, ``bw`` the slowest ``cluster.link`` between a
  device of S and one of T, and arrives after the largest latency of those links; a tensor
  read by two later stages is sent twice; model inputs and outputs move free.

A joint training plan (``plan.training``) runs its schedule instead:
:func:`simulate_joint_training` (below, "Joint training plans").

The machinery of :mod:`solver.backends.simulate` is reused: a
:class:`~solver.backends.simulate.DeviceProgram`
per stage, its :class:`~solver.backends.simulate.Simulation` record (per device: every device of a
stage shows that stage's phases) and its Gantt chart. Its event loop is not: that one walks
the pipeline graph's blocks and its transfer rule; this one walks stages. The simulated
period equals the plan's objective, max stage time, and the first request's latency the sum
of the stage times plus the link latencies on its way; a stage whose recorded time differs
from the simulated one is reported as a violation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from solver.backends.schedule import (
    MAKESPAN_RULES,
    MakespanRatio,
    MakespanRelation,
    ScheduleRun,
    makespan_relation,
    simulate_schedule,
)
from solver.backends.simulate import DeviceProgram, Simulation, check_simulation_size
from solver.core.errors import MtppError
from solver.core.training import TrainingSpec
from solver.joint.plan import JointTraining, TrainingStage
from solver.joint.stages import StageProgram, stage_programs
from solver.joint.submesh import stage_limit
from solver.spmd.model import ShardModel

AGREE = 1e-9  # relative difference between a recorded and a simulated time still "equal"


@dataclass(frozen=True)
class Transfer:
    """A tensor sent from one stage to another."""

    seconds: float  # busy time on each side
    latency: float  # the largest latency of the links between the two stages


def transfer(plan, sm: ShardModel, src, dst, tensor: str) -> Transfer:
    """``tensor`` from stage ``src`` to stage ``dst``."""
    links = [plan.cluster.link(int(a), int(b)) for a in src.devices for b in dst.devices]
    bw = min(x[0] for x in links)
    lat = max(x[1] for x in links)
    size = float(math.prod(sm.shapes[tensor]) * sm.itemsize(tensor))
    return Transfer(size / (min(len(src.devices), len(dst.devices)) * bw), lat)


@dataclass
class StagePrograms:
    """Every stage as a :class:`DeviceProgram`, and the tensor names its integer ids stand for."""

    programs: list[DeviceProgram]
    names: list[str]


def stage_device_programs(plan, sm: ShardModel, programs: list[StageProgram]) -> StagePrograms:
    """Per stage: messages in (one per tensor and sending stage), its operators' compute plus
    input redistributions, the output reduction, and messages out (one per receiving stage)."""
    made_by = {}
    for pos, p in enumerate(programs):
        for op in p.sm.ops:
            for t in op.outputs:
                made_by[t] = pos
    names: list[str] = []
    tid: dict[str, int] = {}
    progs = [DeviceProgram() for _ in programs]
    for pos, p in enumerate(programs):
        prog = progs[pos]
        for v in range(len(p.program.names)):
            prog.ops.append((v, p.program.compute[v] + p.program.comm[v]))
        if p.program.output_comm:
            prog.ops.append((len(p.program.names), p.program.output_comm))
        for t in dict.fromkeys(p.stage.inputs):
            src = made_by.get(t)
            if src is None:  # a model input: it arrives free, as in the sharding cost model
                continue
            sent = transfer(plan, sm, programs[src].stage, p.stage, t)
            i = tid.setdefault(t, len(names))
            if i == len(names):
                names.append(t)
            prog.recv.append((i, sent.seconds))
            progs[src].send.append((i, sent.seconds))
            prog.senders.add(src)
            prog.latency[src] = max(prog.latency.get(src, 0.0), sent.latency)
    return StagePrograms(progs, names)


@dataclass
class JointSimulation:
    """The pipeline's period, latency and utilisation (``sim``) and every stage's parts."""

    sim: Simulation
    stages: list[dict] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.sim.valid

    def to_dict(self) -> dict:
        out = self.sim.to_dict()
        out["stages"] = self.stages
        return out


def simulate_joint(
    plan,
    sm: ShardModel,
    requests: int = 100,
    keep_timeline: int = 3,
    programs: list[StageProgram] | None = None,
) -> JointSimulation:
    """Push ``requests`` requests through the stages of ``plan`` (``sm``: the model as
    :func:`solver.spmd.load_model` reads it). All requests wait at time 0 to measure the
    steady-state period; latency is then measured releasing one request per period, as
    :func:`solver.backends.simulate.simulate` does. Raises :class:`MtppError` for a plan that
    does not fit the model (:func:`solver.joint.stages.check_stages`), a run that is too large,
    or a training plan (its schedule runs in :func:`simulate_joint_training`)."""
    if plan.training is not None:
        raise MtppError(
            "a joint training plan runs microbatches under its schedule, not requests: "
            "simulate it with mtpp simulate MODEL.onnx PLAN [--gantt FILE.png]"
        )
    check_simulation_size(len(plan.stages), int(requests))
    if programs is None:
        programs = stage_programs(plan, sm)
    progs = stage_device_programs(plan, sm, programs).programs
    R = max(1, int(requests))
    first = _run(progs, R, 0.0, keep_timeline)
    finish, begin = first.finish, first.begin
    half = R // 2
    if half < R - 1:
        period = float((finish[-1] - finish[half]) / (R - 1 - half))
    else:
        period = float(finish[-1])
    latency_mean = float(np.mean(finish - begin))
    if R > 1 and period > 0:
        paced = _run(progs, R, period, 0)
        latency_mean = float(np.mean(paced.finish - paced.begin))
    makespan = float(finish[-1])
    dev = _PerDevice.of(plan.cluster.devices, programs, first)
    report = _stage_rows(plan, programs, progs)
    sim = Simulation(
        mode="pipelined",
        overlap=False,
        requests=R,
        period=period,
        throughput=1.0 / period if period > 0 else math.inf,
        latency_first=float(finish[0] - begin[0]),
        latency_mean=latency_mean,
        makespan=makespan,
        busy=dev.busy / makespan if makespan > 0 else dev.busy,
        idle=1.0 - (dev.busy / makespan if makespan > 0 else dev.busy),
        peak_memory=dev.memory,
        activation_peak=dev.activations,
        valid=not report.violations,
        violations=report.violations,
        timeline=dev.timeline,
    )
    return JointSimulation(sim, report.rows)


@dataclass
class _Pass:
    """One pass of the event loop, per request r: when it left the pipeline (``finish[r]``)
    and when it began (``begin[r]``); per stage its busy time; the phases kept."""

    finish: np.ndarray
    begin: np.ndarray
    busy: np.ndarray
    timeline: list[tuple[int, int, str, float, float]]  # (stage position, r, kind, start, end)


@dataclass
class _PerDevice:
    """A pass seen per device: every device of a stage shows that stage."""

    busy: np.ndarray
    memory: np.ndarray
    activations: np.ndarray
    timeline: list[tuple[int, int, str, float, float]]

    @classmethod
    def of(cls, k: int, programs: list[StageProgram], first: _Pass) -> _PerDevice:
        out = cls(np.zeros(k), np.zeros(k), np.zeros(k), [])
        for pos, p in enumerate(programs):
            for d in p.stage.devices:
                out.busy[int(d)] = first.busy[pos]
                out.memory[int(d)] = p.program.memory_per_device
                out.activations[int(d)] = p.program.peak_activation_memory
        for pos, r, kind, s, e in first.timeline:
            out.timeline += [(int(d), r, kind, s, e) for d in programs[pos].stage.devices]
        return out


def _run(progs: list[DeviceProgram], R: int, interval: float, keep_timeline: int) -> _Pass:
    """The event loop: stage ``i`` starts request ``r`` when its senders' messages arrived,
    stage i-1 sent r, it sent r-1 itself, and r was released (``r * interval``)."""
    n = len(progs)
    start = np.zeros((n, R))
    send_end = np.zeros((n, R))
    busy = np.zeros(n)
    timeline = []
    for r in range(R):
        for i, p in enumerate(progs):
            ready = max((send_end[j, r] + p.latency[j] for j in p.senders), default=0.0)
            ready = max(ready, r * interval, send_end[i - 1, r] if i else 0.0)
            t0 = max(ready, send_end[i, r - 1] if r else 0.0)
            t1 = t0 + p.t_recv
            t2 = t1 + p.t_compute
            send_end[i, r] = t2 + p.t_send
            start[i, r] = t0
            busy[i] += p.cycle
            if r < keep_timeline:
                phases = [("recv", t0, t1), ("compute", t1, t2), ("send", t2, send_end[i, r])]
                timeline += [(i, r, kind, s, e) for kind, s, e in phases if e > s]
    begin = np.maximum(start.min(axis=0), np.arange(R) * interval)
    return _Pass(send_end.max(axis=0), begin, busy, timeline)


@dataclass
class _StageReport:
    """The JSON rows of the stages and every violation found."""

    rows: list[dict]
    violations: list[str]


def _stage_rows(plan, programs, progs) -> _StageReport:
    """Per stage: devices, simulated parts and time, the plan's recorded time, collectives,
    redistributions and memory; and every disagreement or memory excess as a violation."""
    rows, bad = [], []
    for p, dp in zip(programs, progs, strict=True):
        st, prog = p.stage, p.program
        recorded = float(st.time)
        simulated = dp.cycle
        agree = math.isclose(recorded, simulated, rel_tol=AGREE, abs_tol=1e-15)
        if not agree:
            bad.append(
                f"stage {st.index}: the plan records {recorded:.9g} s but its program and "
                f"transfers take {simulated:.9g} s"
            )
        limit = stage_limit(plan.cluster, st.devices, plan.memory_limit)
        if limit is not None and prog.memory_per_device > limit:
            bad.append(
                f"stage {st.index}: {prog.memory_per_device:.6g} bytes per device exceed the "
                f"limit {limit:.6g}"
            )
        rows.append(
            {
                "stage": st.index,
                "devices": [int(d) for d in st.devices],
                "mesh": list(st.mesh.shape),
                "ops": len(prog.names),
                "recv": dp.t_recv,
                "program": dp.t_compute,
                "send": dp.t_send,
                "time": simulated,
                "recorded_time": recorded,
                "agrees": agree,
                "compute": math.fsum(prog.compute),
                "communication": math.fsum(prog.comm) + prog.output_comm,
                "collectives": prog.collectives(),
                "redistributions": [
                    {
                        "consumer": consumer,
                        "collectives": list(r.collectives),
                        "bytes_per_device": r.bytes_per_device,
                        "time": r.time,
                    }
                    for consumer, r in prog.all_redists()
                ],
                "memory_per_device": prog.memory_per_device,
            }
        )
    return _StageReport(rows, bad)


# ---------------------------------------------------------------------- joint training plans
JOINT_SYNC_RULE = (
    "then every stage synchronises its gradients once, when its last backward ends (stages "
    "on disjoint devices, at the same time): makespan = max_i (end_i + sync_i), between the "
    "pipeline's makespan + sync_0 (stage 0 ends last) and the pipeline's makespan + max sync "
    "(T counts max sync after the pipeline); makespan = T when every stage has the same F, B "
    "and sync (1F1B: the same t and sync)"
)


@dataclass(frozen=True)
class JointStageRun:
    """One stage of a simulated joint training plan: its model terms next to the run's."""

    stage: int
    devices: tuple[int, ...]
    forward: float
    backward: float
    sync: float
    busy_fraction: float  # forwards, backwards and the sync / makespan
    pipeline_end: float  # its last backward ends
    sync_end: float  # its gradient synchronisation ends
    inflight_model: float
    inflight_simulated: float
    memory_model: float
    memory_simulated: float
    capacity: float | None

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "devices": list(self.devices),
            "forward": self.forward,
            "backward": self.backward,
            "sync": self.sync,
            "busy_fraction": self.busy_fraction,
            "pipeline_end": self.pipeline_end,
            "sync_end": self.sync_end,
            "inflight_model": self.inflight_model,
            "inflight_simulated": self.inflight_simulated,
            "memory_model_bytes": self.memory_model,
            "memory_simulated_bytes": self.memory_simulated,
            "capacity_bytes": self.capacity,
        }


@dataclass(frozen=True)
class JointMakespanRelation:
    """How the simulated makespan relates to T for this plan: the pipeline part by the
    schedule's rule (``pipeline``, against T - max sync), then the gradient sync."""

    pipeline: MakespanRelation
    lower: float  # makespan >= this: the pipeline's bound (GPipe: its exact value) + sync_0
    upper: float | None  # makespan <= this: the pipeline's upper bound + max sync (1F1B, GPipe)
    rule: str

    def to_dict(self) -> dict:
        return {
            "pipeline": self.pipeline.to_dict(),
            "lower": self.lower,
            "upper": self.upper,
            "rule": self.rule,
        }


@dataclass(frozen=True)
class JointTrainingSimulation(MakespanRatio):
    """A joint training plan's schedule run once: makespan vs T, every stage's peak in-flight
    count and memory vs the plan's, and violations (a stage over its capacity)."""

    model: str
    training: JointTraining
    run: ScheduleRun  # the forwards and backwards (the sync is in ``stages``)
    pipeline_makespan: float
    makespan: float
    stages: tuple[JointStageRun, ...]
    relation: JointMakespanRelation
    violations: tuple[str, ...]

    @property
    def iteration_time(self) -> float:
        return self.training.iteration_time

    @property
    def valid(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict:
        return self.run.to_dict() | {
            "model": self.model,
            "iteration_time": self.iteration_time,
            "pipeline_makespan": self.pipeline_makespan,
            "makespan": self.makespan,
            "makespan_over_iteration_time": self.ratio,
            "relation": self.relation.to_dict(),
            "valid": self.valid,
            "violations": list(self.violations),
            "stages": [s.to_dict() for s in self.stages],
        }


@dataclass(frozen=True)
class _ScheduleTimes:
    """What :func:`solver.backends.schedule.makespan_relation` reads of a priced plan: the
    spec and each stage's ``forward`` and ``backward``."""

    spec: TrainingSpec
    stages: tuple[TrainingStage, ...]


def simulate_joint_training(plan) -> JointTrainingSimulation:
    """Run a joint training plan's schedule (docs/backends.md, "Joint training plans"): each
    stage's F and B per microbatch (its transfers inside, as the model has them) in the
    schedule's order, then each stage's gradient sync once."""
    devices = [tuple(int(d) for d in st.devices) for st in plan.stages]
    return simulate_training_stages(plan.training, devices, plan.model_name)


def simulate_training_stages(
    training: JointTraining, devices: list[tuple[int, ...]], model: str = "model"
) -> JointTrainingSimulation:
    """:func:`simulate_joint_training` on the training terms alone (one tuple of devices per
    stage)."""
    rows = training.stages
    spec = TrainingSpec(training.schedule, training.microbatches, 1, training.optimizer_state)
    run = simulate_schedule(
        np.array([r.forward for r in rows]),
        np.array([r.backward for r in rows]),
        spec,
        static=np.array([r.base for r in rows]),
        stash=np.array([r.stash for r in rows]),
    )
    ends = [max(t.end for t in run.tasks if t.stage == i) for i in range(len(rows))]
    makespan = max(end + r.sync for end, r in zip(ends, rows, strict=True))
    span = makespan if makespan > 0 else 1.0
    stages = tuple(
        JointStageRun(
            stage=i,
            devices=devices[i],
            forward=r.forward,
            backward=r.backward,
            sync=r.sync,
            busy_fraction=(s.busy + r.sync) / span,
            pipeline_end=ends[i],
            sync_end=ends[i] + r.sync,
            inflight_model=r.inflight,
            inflight_simulated=s.peak_inflight,
            memory_model=r.memory,
            memory_simulated=float(s.peak_memory),
            capacity=r.capacity,
        )
        for i, (r, s) in enumerate(zip(rows, run.stages, strict=True))
    )
    relation = joint_makespan_relation(spec, rows)
    over = tuple(
        f"stage {s.stage}: {s.memory_simulated:.6g} bytes per device in the run exceed its "
        f"capacity {s.capacity:.6g}"
        for s in stages
        if s.capacity is not None and s.memory_simulated > s.capacity * (1 + 1e-12)
    )
    return JointTrainingSimulation(
        model, training, run, run.makespan, makespan, stages, relation, over
    )


def joint_makespan_relation(spec: TrainingSpec, rows) -> JointMakespanRelation:
    """The bounds on a joint training plan's makespan that docs/backends.md states: the
    schedule's bounds on the pipeline (docs/training.md, "How the makespan relates to T"),
    plus sync_0 below and max sync above."""
    pipeline = makespan_relation(_ScheduleTimes(spec, tuple(rows)))
    first = pipeline.exact if pipeline.exact is not None else pipeline.lower
    most = max(r.sync for r in rows)
    upper = None if pipeline.upper is None else pipeline.upper + most
    rule = f"{MAKESPAN_RULES[spec.schedule]} (the pipeline, vs T - max sync); {JOINT_SYNC_RULE}"
    return JointMakespanRelation(pipeline, first + rows[0].sync, upper, rule)
