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

from solver.backends.simulate import DeviceProgram, Simulation, check_simulation_size
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
    does not fit the model (:func:`solver.joint.stages.check_stages`) or a run that is too large."""
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
