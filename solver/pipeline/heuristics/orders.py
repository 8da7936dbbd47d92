"""Topological orders to slice: priority (random-key) orders, depth-first and breadth-first."""

from __future__ import annotations

import heapq

import numpy as np

from solver.core.graph import Graph


def priority_order(g: Graph, keys: np.ndarray) -> np.ndarray:
    """The topological order that always takes the ready node with the smallest key.

    This is the BRKGA decoder of SliceGraph: a vector of random keys becomes an order.
    """
    ptr, idx = g.succ
    indeg = np.bincount(g.e_dst, minlength=g.n).tolist()
    kl = np.asarray(keys, dtype=np.float64).tolist()
    ready = [(kl[v], v) for v in range(g.n) if indeg[v] == 0]
    heapq.heapify(ready)
    ptr_l, idx_l = ptr.tolist(), idx.tolist()
    out = []
    while ready:
        _, v = heapq.heappop(ready)
        out.append(v)
        for j in range(ptr_l[v], ptr_l[v + 1]):
            w = idx_l[j]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(ready, (kl[w], w))
    return np.asarray(out, dtype=np.int64)


def depth_first_order(g: Graph) -> np.ndarray:
    """A topological order that finishes a branch before starting the next (Kahn with a stack).

    Keeping branches together tends to cut fewer tensors than the breadth-first order.
    """
    ptr, idx = g.succ
    indeg = np.bincount(g.e_dst, minlength=g.n).tolist()
    stack = [v for v in range(g.n - 1, -1, -1) if indeg[v] == 0]
    ptr_l, idx_l = ptr.tolist(), idx.tolist()
    out = []
    while stack:
        v = stack.pop()
        out.append(v)
        for j in range(ptr_l[v + 1] - 1, ptr_l[v] - 1, -1):
            w = idx_l[j]
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    return np.asarray(out, dtype=np.int64)
