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

from solver.core.errors import MtppError
from solver.core.training import TrainingCost, TrainingSpec


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


def gantt_chart(run: ScheduleRun, path: str, title: str | None = None) -> None:
    """A PNG Gantt chart of the schedule: one row per stage, forwards light, backwards dark,
    each bar labelled with its microbatch (and ``.chunk`` when interleaved)."""
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
    ax.set_yticks(range(p), [f"stage {i}" for i in range(p)])
    ax.invert_yaxis()
    ax.legend(
        handles=[
            Patch(color=colours["F"], label="forward"),
            Patch(color=colours["B"], label="backward"),
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
