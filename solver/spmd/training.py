"""The training cost of a sharded program (``mtpp shard --training``, docs/training.md,
"Training-aware operator sharding"): each operator's backward with the forward's splits, the
collectives its gradients need, the gradient synchronisation of the weights and the training
memory.

Everything here is a pure function of (model, strategy per operator); :class:`GradientFlow`
says which tensors carry a gradient, :func:`gradient_layout` where an input's gradient lies
when the backward of its consumer leaves it, and :func:`state_factor` how many bytes of
training state a weight shard costs.

The rules:
- backward compute = factor x the forward compute of every operator a gradient flows
  through, the factor from the table the pipeline side uses
  (:data:`solver.frontends.onnx.backward.RULES`, docs/training.md "Backward costs of ONNX
  operators"): a matrix product 1 per operand that needs a gradient (2 for x W, 1 for the
  first layer on a model input), Relu 1, Softmax 4/5, ...;
- the gradient of data input k of an operator lies on the operator's device matrix in the
  input's own layout, with partial sums over every split loop that does not index the input
  (the transpose of the forward: a loop the forward sums over the input's copies);
- an activation's gradient is redistributed from there to its producer's output layout
  (partial sums dropped: the gradient of a partial-sum output is the whole gradient on every
  device), and the backward reads each input in the layout its forward read it, so an input
  redistribution of the forward is run again (Megatron's sequence parallelism re-gathers too);
- a trainable weight whose gradient holds partial sums is synchronised: AllReduce of its
  gradient, or ZeRO-1 (ReduceScatter of the gradient, the optimizer state sharded over the
  group, AllGather of the updated weights), which in the ring model costs the same time;
- training memory = weight shards x (2 + optimizer share / group with ZeRO-1) + every
  operator's outputs (kept until its backward) + the redistributed copies at each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from solver.core.errors import MtppError
from solver.frontends.onnx.backward import DEFAULT_FACTOR, RULES
from solver.spmd.mesh import Layout
from solver.spmd.model import Op, ShardModel, Unloaded
from solver.spmd.rules import OpSharding

WEIGHT_AND_GRADIENT = 2.0  # bytes of weight and gradient per byte of weights (never sharded)


@dataclass(frozen=True)
class TrainingSpec:
    """``optimizer_state``: bytes of training state per byte of weights (weights, gradients
    and optimizer state; 4 = fp32 Adam, as the pipeline side's ``--optimizer-state``).
    ``sync_weight``: how many times the gradient synchronisation counts in the objective (its
    time in the program is scaled by it; 1 = one step of ``mtpp shard --training``; the joint
    training planner's stage-sum bound solves with the weight a pipeline stage's sync has in
    its iteration time, docs/training.md)."""

    optimizer_state: float = 4.0
    sync_weight: float = 1.0

    def __post_init__(self) -> None:
        s = self.optimizer_state
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise MtppError(f"the optimizer state factor must be a number > 0, got {s!r}")
        w = self.sync_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise MtppError(f"the gradient sync weight must be a number >= 0, got {w!r}")

    @property
    def sharded_share(self) -> float:
        """The bytes per weight byte ZeRO-1 shards: the optimizer state proper."""
        return max(0.0, self.optimizer_state - WEIGHT_AND_GRADIENT)

    def state_factor(self, group: int) -> float:
        """Bytes of training state per byte of a weight shard whose gradient is synchronised
        over ``group`` devices with ZeRO-1 (group 1: no synchronisation, nothing sharded)."""
        return self.optimizer_state - self.sharded_share + self.sharded_share / group


@dataclass
class GradientFlow:
    """Which tensors of the model carry a gradient: the trainable weights (float initializers
    with more than one element) and every float tensor computed from one."""

    trainable: frozenset[str]
    needs_grad: frozenset[str]
    has_backward: tuple[bool, ...]  # per operator: a data input needs a gradient, and an
    # output is floating point (the gradient flows through it)

    def part(self, start: int, end: int) -> GradientFlow:
        """The flow of operators start..end-1 as part of the whole model: the tensors they
        receive that were computed from weights still carry gradients."""
        return GradientFlow(self.trainable, self.needs_grad, self.has_backward[start:end])


def gradient_flow(sm: ShardModel) -> GradientFlow:
    """The trainable weights and the tensors and operators the backward reaches."""
    inits = {t.name for t in sm.model.graph.initializer}
    trainable = set()
    for t, value in sm.consts.items():
        loaded = t in inits or isinstance(value, Unloaded)
        shape = sm.shapes.get(t, ())
        if loaded and np.issubdtype(sm.dtypes[t], np.floating) and math.prod(shape) > 1:
            trainable.add(t)
    needs = set(trainable)
    backward = []
    for op in sm.ops:
        floating = [t for t in op.outputs if np.issubdtype(sm.dtypes[t], np.floating)]
        reached = bool(floating) and any(t in needs for t in op.data_inputs)
        backward.append(reached)
        if reached:
            needs.update(floating)
    return GradientFlow(frozenset(trainable), frozenset(needs), tuple(backward))


def backward_factor(op: Op, needs_grad: frozenset[str]) -> float:
    """The backward's compute over the forward's for operator ``op`` (the table's factor, per
    operand that needs a gradient for the matrix operators; 2 for an operator not in it)."""
    rule = RULES.get(op.op_type)
    if rule is None:
        return DEFAULT_FACTOR
    if not rule.per_operand:
        return rule.factor
    inputs = list(op.node.input)
    positions = range(len(inputs)) if rule.operands is None else rule.operands
    return rule.factor * sum(j < len(inputs) and inputs[j] in needs_grad for j in positions)


def gradient_axes(sh: OpSharding, k: int) -> tuple[int, ...]:
    """The device-matrix axes over which the gradient of data input ``k`` holds partial sums:
    the split loops that index no dim of the input."""
    used = {a for axes in sh.in_layouts[k].dims for a in axes}
    return tuple(a for a, n in enumerate(sh.loop_splits) if n > 1 and a not in used)


def gradient_layout(sh: OpSharding, k: int) -> Layout:
    """Where the backward leaves the gradient of data input ``k``: the input's layout with
    partial sums over :func:`gradient_axes`."""
    lay = sh.in_layouts[k]
    return Layout(lay.shape, lay.device_matrix, lay.dims, gradient_axes(sh, k))


def without_partial(lay: Layout) -> Layout:
    """The same placement with its partial sums summed: where an output's gradient lies."""
    return Layout(lay.shape, lay.device_matrix, lay.dims) if lay.partial else lay


def group_size(lay: Layout) -> int:
    """The devices that hold partial sums of one block of ``lay``."""
    return math.prod(lay.device_matrix[a] for a in lay.partial)


@dataclass(frozen=True)
class InputClass:
    """What an edge's cost depends on at its consumer's end in training: the input's layout
    (canonical), its gradient's (None: no gradient crosses the edge) and whether the
    consumer's backward reads the input again."""

    layout: Layout
    gradient: Layout | None
    backward: bool


@dataclass(frozen=True)
class WeightClass:
    """A weight's copy as memory sees it in training: its layout (canonical) and the devices
    its gradient is synchronised over (ZeRO-1 shards the optimizer state over them)."""

    layout: Layout
    group: int


@dataclass
class TrainingCosts:
    """The training terms of one program, per operator (seconds), the backward of the model
    outputs' reductions, and the gradient synchronisations: ``sync[(v, k)]`` for weight input
    k of operator v (its time and group), ``zero1``: the weights whose optimizer state is
    sharded (ZeRO-1); the others AllReduce."""

    backward_compute: list[float]
    backward_comm: list[float]
    sync_time: list[float]
    sync: dict[tuple[int, int], WeightSync] = field(default_factory=dict)
    zero1: frozenset[str] = frozenset()
    output_backward: float = 0.0  # the model outputs' gradients back to their producers

    @property
    def total(self) -> float:
        return (
            math.fsum(self.backward_compute)
            + math.fsum(self.backward_comm)
            + math.fsum(self.sync_time)
            + self.output_backward
        )


@dataclass(frozen=True)
class WeightSync:
    """The gradient synchronisation of one weight read by one operator."""

    tensor: str
    group: int
    time: float
    bytes_per_device: float


def zero1_savings(planner, program) -> dict[str, float]:
    """Bytes per device ZeRO-1 saves on each synchronised weight (its optimizer state over
    the group), each distinct copy of a weight counted once, as the program's memory does."""
    share = planner.training.sharded_share
    seen: set = set()
    saved: dict[str, float] = {}
    for (v, k), sync in program.training.sync.items():
        cls = planner.weight_class(v, k, program.shardings[v])
        if (sync.tensor, cls) in seen:
            continue
        seen.add((sync.tensor, cls))
        nbytes = planner.weight_class_bytes(cls, sync.tensor) / planner.training.state_factor(
            cls.group
        )
        saved[sync.tensor] = saved.get(sync.tensor, 0.0) + nbytes * share * (1 - 1 / cls.group)
    return saved


def choose_gradient_sync(planner, program, limit: float | None):
    """The program with AllReduce for every weight gradient while it fits ``limit``, ZeRO-1
    kept for the weights that save the most until it does (the time is the same either way;
    evaluate prices every synchronised weight at ZeRO-1's memory, the least)."""
    tr = program.training
    saved = zero1_savings(planner, program)
    zero1 = set(tr.zero1)
    weights = program.weight_memory
    for t in sorted(zero1, key=lambda t: (saved.get(t, 0.0), t)):  # the least saving first
        gain = saved.get(t, 0.0)
        if limit is None or weights + gain + program.peak_activation_memory <= limit:
            zero1.discard(t)
            weights += gain
    return replace(program, weight_memory=weights, training=replace(tr, zero1=frozenset(zero1)))
