"""Joint plans: pipeline stages, each on a sub-mesh sharding its operators; JSON in and out.

A :class:`JointPlan` is what ``plan_joint`` returns and ``mtpp solve --method joint --out``
writes (format ``mtpp-joint-plan``). :func:`price_stages` is the one cost function of a joint
plan (each stage's sharded program on its mesh + transfers between stages, docs/joint.md);
the planner, :func:`load_joint_plan` and the tests all use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from solver.core.cluster import Cluster, cluster_from_dict
from solver.core.errors import MtppError
from solver.core.files import read_json, write_json_atomic
from solver.core.result import STATUSES, claim_problem, relative_gap
from solver.core.training import TrainingSpec
from solver.joint.segment import make_segment, tensor_bytes
from solver.joint.submesh import stage_limit, sub_cluster, transfer_time
from solver.spmd.mesh import Mesh, mesh_on
from solver.spmd.model import ShardModel, load_model
from solver.spmd.program import Planner, evaluate
from solver.spmd.strategy import Strategy

JOINT_FORMAT = "mtpp-joint-plan"
JOINT_VERSION = 1
CHECK_TOL = 1e-9  # relative: a number in a plan file that differs more was changed
TRAINING_SCHEDULES = ("gpipe", "1f1b")  # the schedules of joint training plans


@dataclass
class Stage:
    """One pipeline stage: its devices and mesh, its operators and their strategies, its cost."""

    index: int
    devices: tuple[int, ...]  # cluster device ids, row-major over mesh.shape
    mesh: Mesh
    ops: tuple[str, ...]  # operator (ONNX node) names, topological order
    inputs: tuple[str, ...]  # tensors received (model inputs or from earlier stages)
    outputs: tuple[str, ...]  # tensors sent on (to later stages or model outputs)
    strategies: dict[str, Strategy]
    program_time: float  # the sharded program's objective on its mesh (s)
    io_in: float  # seconds receiving its inputs over the real links
    io_out: float  # seconds sending its outputs
    memory_per_device: float  # bytes
    collectives: dict[str, int] = field(default_factory=dict)

    @property
    def time(self) -> float:
        return self.program_time + self.io_in + self.io_out

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "devices": list(self.devices),
            "mesh": {
                "shape": list(self.mesh.shape),
                "bandwidth": list(self.mesh.bandwidth),
                "latency": list(self.mesh.latency),
            },
            "ops": list(self.ops),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "strategies": {k: [list(x) for x in v] for k, v in self.strategies.items()},
            "time": self.time,
            "program_time": self.program_time,
            "io_in": self.io_in,
            "io_out": self.io_out,
            "memory_per_device": self.memory_per_device,
            "collectives": dict(self.collectives),
        }


@dataclass(frozen=True)
class TrainingStage:
    """The training terms of one stage of a joint training plan (seconds, bytes per device):
    per microbatch ``forward`` = forward program + io in + io out, ``backward`` = backward
    program + the same io again (the gradients cross back), ``time`` = t_i = their sum; the
    gradient synchronisation ``sync`` once per iteration; ``memory`` = ``base`` (the weights with
    their training state and one microbatch's peak) + ``inflight`` x ``stash``."""

    forward: float
    backward: float
    time: float
    sync: float
    base: float
    stash: float
    inflight: float
    memory: float
    capacity: float | None

    def to_dict(self) -> dict:
        return {
            "forward": self.forward,
            "backward": self.backward,
            "time": self.time,
            "sync": self.sync,
            "base_bytes": self.base,
            "stash_bytes": self.stash,
            "inflight": self.inflight,
            "memory_bytes": self.memory,
            "capacity_bytes": self.capacity,
        }


@dataclass(frozen=True)
class JointTraining:
    """A joint training plan's schedule and cost: T = a sum t_i + b max t_i + max sync_i
    (docs/training.md, "Joint training plans")."""

    schedule: str
    microbatches: int
    optimizer_state: float
    iteration_time: float
    stages: tuple[TrainingStage, ...]

    @property
    def label(self) -> str:
        return f"iteration time T, {self.schedule}, m = {self.microbatches}"

    @property
    def max_stage_time(self) -> float:
        return max(s.time for s in self.stages)

    def to_dict(self) -> dict:
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "optimizer_state": self.optimizer_state,
            "iteration_time": self.iteration_time,
            "max_stage_time": self.max_stage_time,
            "max_sync": max(s.sync for s in self.stages),
            "stages": [s.to_dict() for s in self.stages],
        }


@dataclass
class JointPlan:
    """Stages in pipeline order; objective = the slowest stage's time (the period)."""

    kind: ClassVar[str] = "joint"  # a solver.core.result.Result of the joint planner
    model_name: str
    cluster: Cluster
    memory_limit: float | None
    stages: list[Stage]
    status: str  # OPTIMAL only with a proof over bound_space
    lower_bound: float | None  # valid over bound_space
    bound_space: str  # one sentence: which plans the bound covers
    universal_bound: float | None  # valid for every joint plan
    space: str  # "joint" | "pipeline" | "sharding"
    wall_seconds: float
    stats: dict = field(default_factory=dict)
    model_path: str | None = None
    # a training plan (solver.joint.training): T, the schedule and each stage's training terms
    training: JointTraining | None = None

    @property
    def objective(self) -> float:
        """The period (the slowest stage's time); a training plan's iteration time T."""
        if self.training is not None:
            return self.training.iteration_time
        return max(s.time for s in self.stages)

    @property
    def objective_label(self) -> str:
        """What the objective is, in words."""
        if self.training is not None:
            return self.training.label
        return "slowest stage"

    @property
    def throughput(self) -> float | None:
        return 1.0 / self.objective if self.objective > 0 else None

    @property
    def latency(self) -> float:
        return sum(s.time for s in self.stages)

    @property
    def gap(self) -> float | None:
        """(objective - lower bound) / objective, None without a bound."""
        return relative_gap(self.objective, self.lower_bound)

    def to_dict(self) -> dict:
        return {
            "format": JOINT_FORMAT,
            "version": JOINT_VERSION,
            "model": {"name": self.model_name, "path": self.model_path},
            "cluster": self.cluster.to_dict(),
            "devices": self.cluster.devices,
            "method": "joint",
            "space": self.space,
            "status": self.status,
            "objective": self.objective,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "bound_space": self.bound_space,
            "universal_bound": self.universal_bound,
            "throughput": self.throughput,
            "latency": self.latency,
            "memory_limit": self.memory_limit,
            "wall_seconds": self.wall_seconds,
            "stats": self.stats,
            "stages": [s.to_dict() for s in self.stages],
            **(
                {"objective_kind": "iteration_time", "training": self.training.to_dict()}
                if self.training is not None
                else {}
            ),
        }


def save_joint_plan(plan: JointPlan, path: str | Path) -> None:
    """Write the plan's JSON atomically (a temporary name renamed into place)."""
    write_json_atomic(path, plan.to_dict())


# ---------------------------------------------------------------------- the cost function
@dataclass(frozen=True)
class StageSpec:
    """What defines a stage: its operator range, devices, mesh shape and strategies."""

    start: int
    end: int
    devices: tuple[int, ...]
    shape: tuple[int, ...]
    strategies: dict[str, Strategy]


def price_stages(sm, cluster: Cluster, specs: list[StageSpec], memory: float | None):
    """The stages of ``specs`` priced: each program by the sharding cost function on its
    sub-mesh (slowest compute of its devices), transfers by the rule of docs/joint.md.
    Returns ``(stages, over)`` where ``over`` names the first stage over its memory limit."""
    segs = [make_segment(sm, sp.start, sp.end) for sp in specs]
    io_in, io_out = stage_transfers(sm, cluster, specs, segs)
    stages, over = [], None
    for i, (seg, sp) in enumerate(zip(segs, specs, strict=True)):
        sub = sub_cluster(cluster, sp.devices)
        mesh = mesh_on(cluster, sp.devices, sp.shape)
        prog = evaluate(Planner(seg.sm, mesh, sub), sp.strategies)
        limit = stage_limit(cluster, sp.devices, memory)
        if over is None and limit is not None and prog.memory_per_device > limit:
            over = f"stage {i} needs {prog.memory_per_device:.0f} bytes per device > {limit:.0f}"
        stages.append(
            Stage(
                i,
                tuple(sp.devices),
                mesh,
                seg.ops,
                seg.inputs,
                seg.outputs,
                dict(sp.strategies),
                prog.objective,
                io_in[i],
                io_out[i],
                prog.memory_per_device,
                prog.collectives(),
            )
        )
    return stages, over


def stage_transfers(sm, cluster: Cluster, specs, segs) -> tuple[list[float], list[float]]:
    """Each stage's receive and send time (the rule of docs/joint.md, once per direction): a
    segment's input made by an earlier stage crosses from that stage's devices; a model input
    arrives free."""
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


# ---------------------------------------------------------------------- reading
def _strategy(value, where: str) -> Strategy:
    if not isinstance(value, list) or not all(
        isinstance(x, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
        for x in value
    ):
        raise MtppError(f"{where}: a strategy must be a list of lists of whole numbers")
    return tuple(tuple(x) for x in value)


def _number(data: dict, key: str, where: str, optional: bool = False) -> float | None:
    v = data.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise MtppError(f"{where}: {key!r} must be a finite number, got {str(v)[:40]!r}")
    return float(v)


def load_joint_plan(path: str | Path, model=None) -> JointPlan:
    """Read a joint plan written by ``mtpp solve --method joint --out``. Given ``model`` (an
    ONNX path or a ShardModel), every stage is priced again and a number that differs from
    the file's (a tampered plan) is refused with one line, as is a plan that does not cover
    the model's operators in order."""
    return joint_plan_from_data(read_json(path, "joint plan"), str(path), model)


def joint_plan_from_data(data: object, where: str, model=None) -> JointPlan:
    """:func:`load_joint_plan` on the parsed content ``data`` of the plan file ``where``
    (named in errors)."""
    if not isinstance(data, dict) or data.get("format") != JOINT_FORMAT:
        raise MtppError(f"{where}: not a joint plan (format {JOINT_FORMAT!r} expected)")
    if data.get("version") != JOINT_VERSION:
        raise MtppError(f"{where}: joint plan version {data.get('version')!r} is not supported")
    cluster = cluster_from_dict(data.get("cluster"), f"{where}: cluster")
    raw = data.get("stages")
    if not isinstance(raw, list) or not raw:
        raise MtppError(f"{where}: 'stages' must be a non-empty list")
    used: set[int] = set()
    stages = [
        _stage_from_dict(st, i, cluster, used, f"{where}: stage {i}") for i, st in enumerate(raw)
    ]
    if data.get("status") not in STATUSES:
        raise MtppError(f"{where}: unknown status {str(data.get('status'))[:40]!r}")
    plan = _plan_from_dict(data, cluster, stages, where)
    if "training" in data:
        plan.training = training_from_dict(data["training"], stages, f"{where}: training")
    objective = _number(data, "objective", where)
    what = "the slowest stage's time" if plan.training is None else "the iteration time T"
    why = claim_problem(
        plan.objective,
        plan.status,
        plan.lower_bound,
        objective,
        objective_differs=f"objective {{claimed!r}} is not {what}",
    )
    if why is not None:
        raise MtppError(f"{where}: {why}")
    if model is not None:
        check_against_model(plan, model, where)
    return plan


# the numbers of a training stage in its file, in TrainingStage's order
TRAINING_STAGE_KEYS = (
    "forward",
    "backward",
    "time",
    "sync",
    "base_bytes",
    "stash_bytes",
    "inflight",
    "memory_bytes",
)


def training_from_dict(raw: object, stages: list[Stage], where: str) -> JointTraining:
    """The ``training`` section of a joint training plan file: its schedule and a row per
    stage, each checked for what holds by construction (t = F + B = program + 2 io, memory =
    base + in flight x stash with the schedule's in-flight count, the stage's memory, and T
    = sum t + (m - 1) max t + max sync), so a changed number is refused in one line."""
    if not isinstance(raw, dict):
        raise MtppError(f"{where}: must be a mapping")
    schedule = raw.get("schedule")
    if schedule not in TRAINING_SCHEDULES:
        raise MtppError(
            f"{where}: schedule {str(schedule)[:40]!r} is not one of "
            + ", ".join(TRAINING_SCHEDULES)
        )
    try:
        spec = TrainingSpec(schedule, raw.get("microbatches"), 1, raw.get("optimizer_state"))
    except MtppError as e:
        raise MtppError(f"{where}: {e}") from None
    rows = raw.get("stages")
    if not isinstance(rows, list) or len(rows) != len(stages):
        raise MtppError(f"{where}: 'stages' must list one row per stage ({len(stages)})")
    inflight = spec.inflight(len(stages))
    out = tuple(
        _training_stage(row, st, float(inflight[i]), f"{where}: stage {i}")
        for i, (row, st) in enumerate(zip(rows, stages, strict=True))
    )
    a, b = spec.time_weights
    times = [r.time for r in out]
    T = a * math.fsum(times) + b * max(times) + max(r.sync for r in out)
    claimed = _number(raw, "iteration_time", where)
    if differs(claimed, T):
        raise MtppError(
            f"{where}: iteration_time {claimed!r} is not sum t + (m - 1) max t + max sync ({T!r})"
        )
    return JointTraining(schedule, spec.microbatches, float(spec.optimizer_state), T, out)


def _training_stage(row: object, st: Stage, inflight: float, w: str) -> TrainingStage:
    """One stage's row of the training section, checked against itself and its stage."""
    if not isinstance(row, dict):
        raise MtppError(f"{w}: must be a mapping")
    values = [_number(row, key, w) for key in TRAINING_STAGE_KEYS]
    r = TrainingStage(*values, _number(row, "capacity_bytes", w, optional=True))
    io = st.io_in + st.io_out
    checks = (
        ("time", r.time, r.forward + r.backward, "F + B"),
        ("time", r.time, st.program_time + 2 * io, "program_time + 2 (io_in + io_out)"),
        ("inflight", r.inflight, inflight, "the schedule's in-flight count"),
        ("memory_bytes", r.memory, r.base + r.inflight * r.stash, "base + inflight x stash"),
        ("memory_bytes", r.memory, st.memory_per_device, "the stage's memory_per_device"),
    )
    for key, value, expected, what in checks:
        if differs(value, expected):
            raise MtppError(f"{w}: {key} {value!r} is not {what} ({expected!r})")
    return r


def differs(a: float, b: float) -> bool:
    """Whether two numbers of a plan file differ by more than rounding (:data:`CHECK_TOL`)."""
    return abs(a - b) > CHECK_TOL * max(abs(a), abs(b)) + 1e-15


def _plan_from_dict(data: dict, cluster: Cluster, stages: list[Stage], where: str) -> JointPlan:
    model_info = data.get("model") if isinstance(data.get("model"), dict) else {}
    return JointPlan(
        str(model_info.get("name", "model")),
        cluster,
        _number(data, "memory_limit", where, optional=True),
        stages,
        data["status"],
        _number(data, "lower_bound", where, optional=True),
        str(data.get("bound_space", "")),
        _number(data, "universal_bound", where, optional=True),
        str(data.get("space", "joint")),
        _number(data, "wall_seconds", where, optional=True) or 0.0,
        data.get("stats") if isinstance(data.get("stats"), dict) else {},
        model_info.get("path") if isinstance(model_info.get("path"), str) else None,
    )


def _stage_from_dict(st, i: int, cluster: Cluster, used: set[int], w: str) -> Stage:
    """Stage ``i`` of a plan file (``w`` names it in messages); ``used``: the devices of the
    stages before it (this one's are added)."""
    if not isinstance(st, dict):
        raise MtppError(f"{w}: must be a mapping")
    devices = _stage_devices(st.get("devices"), cluster, used, w)
    mesh = _stage_mesh(st.get("mesh"), len(devices), w)
    names = [k for k in ("ops", "inputs", "outputs") if not isinstance(st.get(k), list)]
    if names or not isinstance(st.get("strategies"), dict):
        raise MtppError(f"{w}: 'ops', 'inputs', 'outputs' and 'strategies' are required")
    strategies = {
        str(k): _strategy(v, f"{w}: strategy of {k!r}") for k, v in st["strategies"].items()
    }
    stage = Stage(
        i,
        tuple(devices),
        mesh,
        tuple(map(str, st["ops"])),
        tuple(map(str, st["inputs"])),
        tuple(map(str, st["outputs"])),
        strategies,
        _number(st, "program_time", w),
        _number(st, "io_in", w),
        _number(st, "io_out", w),
        _number(st, "memory_per_device", w),
        dict(st.get("collectives") or {}),
    )
    claimed = _number(st, "time", w)
    if abs(claimed - stage.time) > CHECK_TOL * abs(stage.time):
        raise MtppError(f"{w}: time {claimed!r} is not program_time + io_in + io_out")
    return stage


def _stage_devices(devices, cluster: Cluster, used: set[int], w: str) -> list[int]:
    """A stage's device ids: valid, distinct, and on no earlier stage (added to ``used``)."""
    if (
        not isinstance(devices, list)
        or not devices
        or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < cluster.devices
            for d in devices
        )
    ):
        raise MtppError(f"{w}: 'devices' must list device ids 0..{cluster.devices - 1}")
    if used & set(devices) or len(set(devices)) != len(devices):
        raise MtppError(f"{w}: a device is used twice; stages run on disjoint devices")
    used |= set(devices)
    return devices


def _stage_mesh(m, devices: int, w: str) -> Mesh:
    """A stage's mesh: a shape that multiplies to its devices, one bandwidth and latency per
    axis."""
    if not isinstance(m, dict):
        raise MtppError(f"{w}: 'mesh' must be a mapping")
    shape, bw, lat = m.get("shape"), m.get("bandwidth"), m.get("latency")
    if (
        not isinstance(shape, list)
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in shape)
        or math.prod(shape) != devices
    ):
        raise MtppError(f"{w}: mesh shape {shape!r} must multiply to {devices} devices")
    if not all(
        isinstance(v, list)
        and len(v) == len(shape)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        for v in (bw, lat)
    ):
        raise MtppError(f"{w}: mesh bandwidth and latency need one number per axis")
    return Mesh(tuple(shape), tuple(map(float, bw)), tuple(map(float, lat)))


def check_against_model(plan: JointPlan, model, where: str = "plan") -> None:
    """Price every stage of an inference plan again on ``model``; refuse a plan whose stages
    do not cover the model's operators in order, or whose numbers differ from the recomputed
    ones. A training plan is priced by the training cost function:
    :func:`solver.joint.plan_check.check_joint_plan` checks both kinds."""
    if plan.training is not None:
        raise MtppError(
            f"{where}: a joint training plan; check it with "
            "solver.joint.plan_check.check_joint_plan"
        )
    sm = model if isinstance(model, ShardModel) else load_model(model, weights=False)
    specs = stage_specs(plan, sm, where)
    try:
        fresh, over = price_stages(sm, plan.cluster, specs, plan.memory_limit)
    except MtppError as e:
        raise MtppError(f"{where}: {e}") from None
    if over is not None:
        raise MtppError(f"{where}: {over}")
    compare_stages(plan.stages, fresh, where)


def stage_specs(plan: JointPlan, sm: ShardModel, where: str) -> list[StageSpec]:
    """What defines each stage of ``plan`` on the model ``sm``; refused in one line when the
    stages do not hold the model's operators in order, miss a strategy, or state mesh links
    that are not the cluster's."""
    names = [op.name for op in sm.ops]
    specs, pos = [], 0
    for st in plan.stages:
        n = len(st.ops)
        if n == 0 or list(st.ops) != names[pos : pos + n]:
            raise MtppError(
                f"{where}: stage {st.index} does not hold the model's next operators in order "
                f"(expected from {names[pos] if pos < len(names) else 'nothing'!r})"
            )
        missing = [o for o in st.ops if o not in st.strategies]
        if missing:
            raise MtppError(f"{where}: stage {st.index}: no strategy for operator {missing[0]!r}")
        specs.append(StageSpec(pos, pos + n, st.devices, st.mesh.shape, st.strategies))
        pos += n
        mesh = mesh_on(plan.cluster, st.devices, st.mesh.shape)
        if not _close(mesh.bandwidth, st.mesh.bandwidth) or not _close(
            mesh.latency, st.mesh.latency
        ):
            raise MtppError(f"{where}: stage {st.index}: the mesh's links are not the cluster's")
    if pos != len(names):
        raise MtppError(f"{where}: the stages stop before operator {names[pos]!r}")
    return specs


def compare_stages(stages: list[Stage], fresh: list[Stage], where: str) -> None:
    """Refuse (one line) a stage of a plan file whose priced numbers, inputs or outputs
    differ from the same stage priced again (``fresh``)."""
    for old, new in zip(stages, fresh, strict=True):
        for key in ("program_time", "io_in", "io_out", "memory_per_device"):
            a, b = getattr(old, key), getattr(new, key)
            if differs(a, b):
                raise MtppError(
                    f"{where}: stage {old.index}: {key} is {a!r} in the file but the model "
                    f"gives {b!r}"
                )
        if old.inputs != new.inputs or old.outputs != new.outputs:
            raise MtppError(f"{where}: stage {old.index}: inputs or outputs differ from the model")


def _close(a, b) -> bool:
    return len(a) == len(b) and all(
        x == y or abs(x - y) <= CHECK_TOL * max(abs(x), abs(y)) for x, y in zip(a, b, strict=True)
    )
