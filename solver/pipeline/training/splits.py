"""The splits practitioners use, on the graph's layers, priced by the training model.

*Layers.* When node names carry a module path with a layer number (``model.layers.3.mlp``,
``/model/layers.3/MatMul``, ``transformer.h.3.attn``, ``encoder.layer.3``: a part
``layers|layer|h|blocks|block`` followed by ``.N`` or ``_N``), layer i is the nodes numbered i
(numbers renumbered 0..L-1 in increasing order), a node without a number belongs to the
latest layer among its order predecessors, and the nodes before every layer (the embedding)
join layer 0; so the head joins the last layer. Otherwise a layer is a *separator segment*:
the nodes after one separator (a node comparable with all others) up to and including the
next, so every prefix of layers is an ideal. A split gives every stage a run of whole layers.

- ``uniform``: L layers as evenly as possible over p = min(k, L) stages, the extra layers on
  the first stages (Megatron-LM without a layout, torchtitan's layers per stage);
- ``fewer-at-ends``: torchtitan's default: the embedding and the head count as one layer each,
  the L + 2 units are split evenly (extras first), then the first and the last stage give
  their extra unit back: they hold one layer fewer than the others (Megatron's
  ``--decoder-first/last-pipeline-num-layers`` set that way);
- ``by-parameters``: DeepSpeed's ``partition_method="parameters"``: contiguous runs of layers
  with the largest parameter bytes of a stage as small as possible (an exact DP; the first
  such split in layer order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.training import TrainingCost, TrainingSpec, training_cost
from solver.pipeline.dp.separators import separators

LAYER_NAME = re.compile(r"(?:^|[/._])(?:layers|layer|h|blocks|block)[._](\d+)(?=$|[/._])")
SPLITS = ("uniform", "fewer-at-ends", "by-parameters")


@dataclass(frozen=True)
class Layers:
    """The layer of every node (0..count-1) and how it was read."""

    of_node: np.ndarray
    count: int
    source: str  # "module names" or "separators"


@dataclass(frozen=True)
class SplitPlan:
    """A practitioner's split: layers per stage, the plan and its training cost."""

    name: str
    layers_per_stage: tuple[int, ...]
    assignment: np.ndarray
    cost: TrainingCost


def read_layers(g: Graph) -> Layers:
    """The layers of ``g`` (module docstring)."""
    named = [LAYER_NAME.findall(x) for x in g.names]
    if any(named):
        number = np.array([int(m[-1]) if m else -1 for m in named])
        return _named_layers(g, number)
    sep = separators(g)
    if sep is None:
        raise MtppError(
            f"graph {g.name!r}: no layer numbers in its node names and too many nodes to find "
            "its separators; practitioners' splits need layers"
        )
    rank = g.topo_rank
    sep_rank = np.sort(rank[sep])
    unit = np.searchsorted(sep_rank, rank, side="left")  # separator s_j and its gap: unit j
    _, of_node = np.unique(unit, return_inverse=True)
    return Layers(of_node.astype(np.int64), int(of_node.max()) + 1, "separators")


def _named_layers(g: Graph, number: np.ndarray) -> Layers:
    """Layers from the numbers in the names; an unnumbered node takes its predecessors'
    latest layer, the embedding (no numbered predecessor) layer 0."""
    found = np.unique(number[number >= 0])
    layer = np.where(number >= 0, np.searchsorted(found, number), -1)
    ptr, idx = g.pred
    for v in g.topo_order.tolist():
        if number[v] < 0:
            preds = idx[ptr[v] : ptr[v + 1]]
            layer[v] = int(layer[preds].max()) if len(preds) else -1
    return Layers(np.maximum(layer, 0).astype(np.int64), len(found), "module names")


def uniform_counts(layers: int, stages: int) -> list[int]:
    """Layers per stage as even as possible, the extra ones on the first stages."""
    base, extra = divmod(layers, stages)
    return [base + (i < extra) for i in range(stages)]


def fewer_at_ends_counts(layers: int, stages: int) -> list[int]:
    """torchtitan's split with the embedding and the head weighing one layer each."""
    if stages == 1:
        return [layers]
    counts = uniform_counts(layers + 2, stages)
    counts[0] -= 1
    counts[-1] -= 1
    if min(counts) < 0:
        raise MtppError(f"{layers} layers are too few for {stages} stages with fewer at the ends")
    return counts


def by_parameter_counts(weights: np.ndarray, stages: int) -> list[int]:
    """Contiguous runs of layers minimising the largest run's weight (exact DP, O(L^2 p))."""
    L = len(weights)
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    best = np.full((stages + 1, L + 1), np.inf)
    cut = np.zeros((stages + 1, L + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, L + 1):  # every stage holds a layer or more (stages <= L)
            starts = np.arange(s - 1, j)  # the run is layers starts..j-1
            worst = np.maximum(best[s - 1, starts], prefix[j] - prefix[starts])
            r = int(np.argmin(worst))
            best[s, j], cut[s, j] = worst[r], starts[r]
    counts, j = [], L
    for s in range(stages, 0, -1):
        counts.append(j - int(cut[s, j]))
        j = int(cut[s, j])
    return counts[::-1]


def layer_params(g: Graph, layers: Layers) -> np.ndarray:
    """Parameter bytes of each layer (a weight once per layer that uses it)."""
    if not g.num_params:
        return np.zeros(layers.count)
    keys = np.unique(g.pair_param * layers.count + layers.of_node[g.p_users])
    count = layers.count
    return np.bincount(keys % count, weights=g.p_size[keys // count], minlength=count)


def split_plan(
    g: Graph, cluster: Cluster, spec: TrainingSpec, layers: Layers, name: str, counts, k: int
) -> SplitPlan:
    """The plan giving stage s the next ``counts[s]`` layers, priced by the model."""
    stage_of_layer = np.repeat(np.arange(len(counts)), counts)
    assignment = stage_of_layer[layers.of_node]
    cost = training_cost(g, cluster, assignment, spec, k=k)
    return SplitPlan(name, tuple(int(c) for c in counts), assignment, cost)


def practitioner_splits(g: Graph, cluster: Cluster, k: int, spec: TrainingSpec) -> list[SplitPlan]:
    """The three splits of the module docstring on p = min(k, L) stages (a stage of
    fewer-at-ends may hold no layer when L is close to p: its block stays empty)."""
    layers = read_layers(g)
    p = min(k, layers.count)
    counts = {
        "uniform": uniform_counts(layers.count, p),
        "fewer-at-ends": fewer_at_ends_counts(layers.count, p),
        "by-parameters": by_parameter_counts(layer_params(g, layers), p),
    }
    return [split_plan(g, cluster, spec, layers, nm, counts[nm], k) for nm in SPLITS]
