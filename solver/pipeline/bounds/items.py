"""What every plan must place: per node its work, its peak and the weights charged to it.

Bounds run on the coarse view (co-location groups merged; every valid plan keeps them
together). Each parameter is *charged* to one of its users (the first); the block holding that
user stores the parameter, so for every block S of every plan ``params(S) >= charged(S)``.
Charging each parameter once is what makes the weights indivisible items of a packing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.core.graph import Graph, coarse_view


@dataclass(frozen=True)
class Items:
    """Per coarse node: work (s), charged parameter bytes, act (bytes, the node's working set)."""

    work: np.ndarray
    charged: np.ndarray
    act: np.ndarray


def items(g: Graph) -> Items:
    """The packing items of ``g`` (one per node of its coarse view)."""
    cg, _ = coarse_view(g)
    charged = np.zeros(cg.n)
    if cg.num_params:
        first_user = cg.p_users[cg.p_ptr[:-1]]
        np.add.at(charged, first_user, cg.p_size)
    return Items(cg.work.astype(float), charged, cg.act.astype(float))
