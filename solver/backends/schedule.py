"""Simulation of a training plan's pipeline schedule, microbatch by microbatch, and its Gantt chart.

Stage i runs its tasks in the schedule's order, each as early as its stage is free and its
input is ready (docs/training.md):

- GPipe: the m forwards, then the m backwards;
- 1F1B: w_i = min(m, p - i - 1) warm-up forwards, then one forward and one backward
  alternately, then the remaining backwards (Megatron-LM, PipeDream-flush);
- interleaved 1F1B (v chunks per stage; Megatron's order, m a multiple of p): chunk c of rank
  i is virtual stage c p + i; forwards go in groups of p microbatches through chunk 0, 1, ...,
  backwards through chunk v - 1, v - 2, ...; (p - i - 1) * 2 + (v - 1) * p warm-up forwards
  (all of them when m = p), as ``forward_backward_pipelining_with_interleaving`` in
  megatron/core/pipeline_parallel/schedules.py.

A forward of microbatch j on (virtual) stage s takes F_s (F_i / v for a chunk) and needs the
forward of j on s - 1; a backward takes B_s and needs the backward of j on s + 1 (on the last
stage, its own forward). Transfers are inside F_i and B_i, as in the model (the stage is busy
while it sends and receives). A microbatch is in flight on a stage from the start of its
forward to the end of its backward there; at equal times a backward's end comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.training import TrainingCost, TrainingSpec, training_cost


@dataclass(frozen=True)
class Task:
    """One forward ("F") or backward ("B") of a microbatch on a stage (chunk: interleaved)."""

    stage: int
    microbatch: int
    kind: str
    chunk: int
    start: float
    end: float


@dataclass(frozen=True)
class StageRun:
    """A stage's busy time, its most microbatches in flight (in whole-stage stashes: a chunk
    of an interleaved stage counts 1/v) and its peak memory (None without memory terms)."""

    stage: int
    busy: float
    peak_inflight: float
    peak_memory: float | None


@dataclass(frozen=True)
class ScheduleRun:
    """The simulated schedule: makespan, every task, every stage."""

    spec: TrainingSpec
    makespan: float
    tasks: tuple[Task, ...]
    stages: tuple[StageRun, ...]

    def to_dict(self) -> dict:
        return {
            "schedule": self.spec.schedule,
            "microbatches": self.spec.microbatches,
            "virtual_stages": self.spec.virtual_stages,
            "makespan": self.makespan,
            "stages": [
                {
                    "stage": s.stage,
                    "busy": s.busy,
                    "peak_inflight": s.peak_inflight,
                    "peak_memory_bytes": s.peak_memory,
                }
                for s in self.stages
            ],
        }


@dataclass(frozen=True)
class _Step:
    """A task in a stage's order, before it is timed."""

    kind: str
    microbatch: int
    chunk: int


def stage_order(spec: TrainingSpec, p: int, i: int) -> list[_Step]:
    """The order of stage i's tasks (module docstring)."""
    m, v = spec.microbatches, spec.virtual_stages
    if spec.schedule == "gpipe":
        return [_Step("F", j, 0) for j in range(m)] + [_Step("B", j, 0) for j in range(m)]
    if spec.schedule == "1f1b" or v == 1:
        forwards = [_Step("F", j, 0) for j in range(m)]
        backwards = [_Step("B", j, 0) for j in range(m)]
        warm = min(m, p - i - 1)
    else:
        if m % p:
            raise MtppError(
                f"the interleaved schedule needs the microbatches ({m}) to be a multiple of "
                f"the stages ({p})"
            )
        units = range(m * v)
        forwards = [_Step("F", _unit_microbatch(u, p, v), (u // p) % v) for u in units]
        backwards = [_Step("B", _unit_microbatch(u, p, v), v - 1 - (u // p) % v) for u in units]
        warm = m * v if m == p else min(m * v, (p - i - 1) * 2 + (v - 1) * p)
    order = forwards[:warm]
    for s in range(len(forwards) - warm):
        order += [forwards[warm + s], backwards[s]]
    return order + backwards[len(forwards) - warm :]


def _unit_microbatch(u: int, p: int, v: int) -> int:
    """Microbatch of the u-th forward (or backward) unit of an interleaved rank."""
    return (u // (p * v)) * p + u % p


def simulate_schedule(
    forward: np.ndarray,
    backward: np.ndarray,
    spec: TrainingSpec,
    static: np.ndarray | None = None,
    stash: np.ndarray | None = None,
) -> ScheduleRun:
    """Run the schedule on stages with these forward and backward times; with ``static``
    (state * params + peak) and ``stash`` bytes per stage, also the peak memory."""
    F = np.asarray(forward, dtype=float)
    B = np.asarray(backward, dtype=float)
    p = len(F)
    if p == 0:
        return ScheduleRun(spec, 0.0, (), ())
    tasks = _timed(F, B, spec, [stage_order(spec, p, i) for i in range(p)])
    stages = []
    for i in range(p):
        mine = [t for t in tasks if t.stage == i]
        peak = _peak_inflight(mine) / spec.virtual_stages
        memory = None if static is None or stash is None else float(static[i] + peak * stash[i])
        stages.append(StageRun(i, sum(t.end - t.start for t in mine), peak, memory))
    makespan = max(t.end for t in tasks)
    return ScheduleRun(spec, makespan, tuple(tasks), tuple(stages))


def simulate_training(cost: TrainingCost) -> ScheduleRun:
    """The schedule of a priced training plan (its stages' F, B and memory terms)."""
    st = cost.stages
    return simulate_schedule(
        np.array([s.forward for s in st]),
        np.array([s.backward for s in st]),
        cost.spec,
        static=np.array([s.memory - s.inflight * s.stash for s in st]),
        stash=np.array([s.stash for s in st]),
    )


@dataclass(frozen=True)
class StageCheck:
    """One stage, the model next to the simulation: in-flight microbatches and memory (bytes)."""

    stage: int
    block: int
    busy_fraction: float  # busy time / makespan
    inflight_model: float
    inflight_simulated: float
    memory_model: float
    memory_simulated: float | None
    capacity: float | None

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "block": self.block,
            "busy_fraction": self.busy_fraction,
            "inflight_model": self.inflight_model,
            "inflight_simulated": self.inflight_simulated,
            "memory_model_bytes": self.memory_model,
            "memory_simulated_bytes": self.memory_simulated,
            "capacity_bytes": self.capacity,
        }


@dataclass(frozen=True)
class MakespanRelation:
    """How the simulated makespan relates to the model's T (docs/training.md, "How the
    makespan relates to T"): the bounds that hold for this plan and the rule in words."""

    lower: float  # makespan >= this, every schedule: max(sum t_i, max_s sum_{i<s} t_i / v + m t_s)
    upper: float | None  # makespan <= this (1F1B: (m + p - 1) max t; GPipe: its exact value)
    exact: float | None  # GPipe: (sum F + (m - 1) max F) + (sum B + (m - 1) max B)
    rule: str

    def to_dict(self) -> dict:
        return {"lower": self.lower, "upper": self.upper, "exact": self.exact, "rule": self.rule}


class MakespanRatio:
    """The ratio of a simulated makespan to the model's iteration time T, for every
    simulation record that has both (pipeline and joint training plans)."""

    makespan: float
    iteration_time: float

    @property
    def ratio(self) -> float | None:
        """makespan / T (None for T = 0)."""
        return self.makespan / self.iteration_time if self.iteration_time > 0 else None


@dataclass(frozen=True)
class TrainingSimulation(MakespanRatio):
    """A training plan's schedule simulated, next to its model: makespan vs T, each stage's
    simulated peak in-flight count and memory vs the model's."""

    graph: str
    cost: TrainingCost
    run: ScheduleRun
    stages: tuple[StageCheck, ...]
    relation: MakespanRelation

    @property
    def makespan(self) -> float:
        return self.run.makespan

    @property
    def iteration_time(self) -> float:
        return self.cost.iteration_time

    @property
    def valid(self) -> bool:
        return self.cost.valid

    def to_dict(self) -> dict:
        return self.run.to_dict() | {
            "graph": self.graph,
            "iteration_time": self.iteration_time,
            "makespan_over_iteration_time": self.ratio,
            "relation": self.relation.to_dict(),
            "valid": self.valid,
            "violations": list(self.cost.violations),
            "stages": [s.to_dict() for s in self.stages],
        }


MAKESPAN_RULES = {
    "gpipe": "GPipe: makespan = (sum F + (m - 1) max F) + (sum B + (m - 1) max B) >= T, equal "
    "when one stage has both the largest F and the largest B",
    "1f1b": "1F1B: makespan <= (m + p - 1) max t, = T when every stage has the same t; "
    "otherwise T may be above or below it",
    "interleaved": "interleaved: makespan = T when all F_i are equal and all B_i are equal "
    "(tested); makespan >= the lower bound always; otherwise T is a model",
}


def simulate_training_plan(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    spec: TrainingSpec,
    placement: np.ndarray | None = None,
) -> TrainingSimulation:
    """Price the plan with the training model, run its schedule and compare the two."""
    cost = training_cost(g, cluster, assignment, spec, placement=placement)
    run = simulate_training(cost)
    span = run.makespan if run.makespan > 0 else 1.0
    stages = tuple(
        StageCheck(
            stage=s.stage,
            block=s.block,
            busy_fraction=r.busy / span,
            inflight_model=s.inflight,
            inflight_simulated=r.peak_inflight,
            memory_model=s.memory,
            memory_simulated=r.peak_memory,
            capacity=s.capacity,
        )
        for s, r in zip(cost.stages, run.stages, strict=True)
    )
    return TrainingSimulation(g.name, cost, run, stages, makespan_relation(cost))


def makespan_relation(cost: TrainingCost) -> MakespanRelation:
    """The bounds on the makespan that docs/training.md proves, for this plan."""
    spec = cost.spec
    F = np.array([s.forward for s in cost.stages])
    B = np.array([s.backward for s in cost.stages])
    t = F + B
    if not len(t):
        return MakespanRelation(0.0, 0.0, None, MAKESPAN_RULES[spec.schedule])
    m, v = spec.microbatches, spec.virtual_stages
    before = np.concatenate([[0.0], np.cumsum(t)[:-1]]) / v
    lower = max(float(t.sum()), float((before + m * t).max()))
    exact = upper = None
    if spec.schedule == "gpipe":
        exact = float(F.sum() + (m - 1) * F.max() + B.sum() + (m - 1) * B.max())
        upper = exact
    elif spec.schedule == "1f1b":
        upper = float((m + len(t) - 1) * t.max())
    return MakespanRelation(lower, upper, exact, MAKESPAN_RULES[spec.schedule])


def _timed(F, B, spec: TrainingSpec, orders: list[list[_Step]]) -> list[Task]:
    """Every task as early as its stage and its input allow, in each stage's order."""
    p, v = len(F), spec.virtual_stages
    last = p * v - 1
    done: dict[tuple[str, int, int], float] = {}  # (kind, virtual stage, microbatch) -> end
    free = [0.0] * p
    pos = [0] * p
    out: list[Task] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                step = orders[i][pos[i]]
                s = step.chunk * p + i
                need = ("F", s - 1, step.microbatch) if step.kind == "F" else None
                if step.kind == "B":
                    need = ("F", s, step.microbatch) if s == last else ("B", s + 1, step.microbatch)
                if need is not None and need[1] >= 0 and need not in done:
                    break
                ready = done[need] if need is not None and need[1] >= 0 else 0.0
                start = max(free[i], ready)
                end = start + (F[i] if step.kind == "F" else B[i]) / v
                done[(step.kind, s, step.microbatch)] = end
                free[i] = end
                out.append(Task(i, step.microbatch, step.kind, step.chunk, start, end))
                pos[i] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise MtppError("the schedule deadlocks: no stage can run its next task")
    return out


def _peak_inflight(tasks: list[Task]) -> int:
    """Most (microbatch, chunk) pairs between their forward's start and backward's end."""
    events = [(t.start, 1) if t.kind == "F" else (t.end, -1) for t in tasks]
    events.sort(key=lambda e: (e[0], e[1]))  # at equal times the end (-1) first
    alive = peak = 0
    for _, step in events:
        alive += step
        peak = max(peak, alive)
    return peak


def gantt_chart(
    run: ScheduleRun, path: str, title: str | None = None, syncs: list | None = None
) -> None:
    """A PNG Gantt chart of the schedule: one row per stage, forwards light, backwards dark,
    each bar labelled with its microbatch (and ``.chunk`` when interleaved); ``syncs``: per
    stage the (start, end) of its gradient synchronisation (a joint training plan), drawn
    after its backwards."""
    import matplotlib  # heavy: matplotlib (imported only to draw)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib
    from matplotlib.patches import Patch  # heavy: matplotlib

    p = len(run.stages)
    fig, ax = plt.subplots(figsize=(min(24, 4 + len(run.tasks) / (2 * max(p, 1))), 1 + 0.6 * p))
    colours = {"F": "#9ecae1", "B": "#3182bd"}
    for t in run.tasks:
        ax.barh(t.stage, t.end - t.start, left=t.start, color=colours[t.kind], edgecolor="white")
        if t.end - t.start > run.makespan / 80:
            label = f"{t.microbatch}" + (f".{t.chunk}" if run.spec.virtual_stages > 1 else "")
            ax.text((t.start + t.end) / 2, t.stage, label, ha="center", va="center", fontsize=7)
    for i, (start, end) in enumerate(syncs or []):
        ax.barh(i, end - start, left=start, color="#fd8d3c", edgecolor="white")
    ax.set_yticks(range(p), [f"stage {i}" for i in range(p)])
    ax.invert_yaxis()
    ax.legend(
        handles=[
            Patch(color=colours["F"], label="forward"),
            Patch(color=colours["B"], label="backward"),
            *([Patch(color="#fd8d3c", label="gradient sync")] if syncs else []),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
    )
    ax.set_xlabel("seconds")
    ax.set_title(
        title or f"{run.spec.schedule}, m = {run.spec.microbatches}: makespan {run.makespan:.6g} s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
