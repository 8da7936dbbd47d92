"""The coarse graph's numbering: core.graph.condensation_order against networkx.

coarsen_labels numbers the strongly connected components of the quotient graph in the order
networkx's ``topological_sort(condensation(G))`` gives; the hand-written version (no networkx
import at start-up) must reproduce it exactly, or plans found on the coarse graph would change.
"""

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.core.graph import condensation_order


def networkx_order(n: int, src: list[int], dst: list[int]) -> np.ndarray:
    d = nx.DiGraph()
    d.add_nodes_from(range(n))
    d.add_edges_from(zip(src, dst, strict=True))
    cond = nx.condensation(d)
    pos = {c: i for i, c in enumerate(nx.topological_sort(cond))}
    out = np.empty(n, dtype=np.int64)
    for c, data in cond.nodes(data=True):
        for x in data["members"]:
            out[x] = pos[c]
    return out


@st.composite
def digraphs(draw):
    n = draw(st.integers(1, 14))
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] != e[1]),
            max_size=3 * n,
        )
    )
    return n, [u for u, _ in edges], [v for _, v in edges]


@settings(max_examples=400, deadline=None)
@given(digraphs())
def test_the_order_is_networkx_order(graph):
    n, src, dst = graph
    assert condensation_order(n, src, dst).tolist() == networkx_order(n, src, dst).tolist()


def test_components_share_a_position_in_topological_order():
    # 0 -> 1 -> 2 -> 0 is one component; 3 feeds it, 4 reads it; 5 stands alone
    src, dst = [0, 1, 2, 3, 2, 1], [1, 2, 0, 0, 4, 1]
    src, dst = src[:-1], dst[:-1]
    pos = condensation_order(6, src, dst)
    assert pos[0] == pos[1] == pos[2]
    assert pos[3] < pos[0] < pos[4]
    assert sorted(set(pos.tolist())) == list(range(4))
    assert pos.tolist() == networkx_order(6, src, dst).tolist()


def test_a_large_random_dag_with_cycles_matches_networkx():
    rng = np.random.default_rng(7)
    n = 3000
    src = rng.integers(0, n, 9000).tolist()
    dst = [min(n - 1, s + int(rng.integers(1, 40))) for s in src]
    back = rng.integers(0, n, 40).tolist()  # a few back edges close cycles
    src += [min(n - 1, b + 5) for b in back]
    dst += back
    keep = [i for i in range(len(src)) if src[i] != dst[i]]
    src, dst = [src[i] for i in keep], [dst[i] for i in keep]
    assert condensation_order(n, src, dst).tolist() == networkx_order(n, src, dst).tolist()
