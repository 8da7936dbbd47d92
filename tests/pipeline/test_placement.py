"""Pipeline solvers on heterogeneous clusters: the placement of blocks on devices
(solver.pipeline.placement), the CP-SAT model that chooses it with the blocks, the brute-force
oracle
over all plans and placements, the heuristics' plans, plan files and the simulator."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.backends.simulate import simulate
from solver.core.cluster import Cluster, Topology
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.pipeline.exact.brute import all_assignments, brute_force
from solver.pipeline.exact.cpsat import CpsatOptions, solve_cpsat
from solver.pipeline.options import SolveOptions
from solver.pipeline.placement import best_placement, device_classes, planning_cluster
from solver.pipeline.plan import (
    ALL_PLACEMENTS,
    OPTIMAL,
    make_plan,
    read_plan_assignment,
    read_plan_placement,
    save_plan,
)
from solver.pipeline.registry import certified_bound, solve
from tests.conftest import scaled_examples

CP = CpsatOptions(time_limit=20.0, workers=2, tie_break=False)


def random_graph(rng: np.random.Generator, n: int, params: bool = True) -> Graph:
    """A random DAG with random work, tensor sizes, shared parameters and activations."""
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.45]
    edges += [(i, i + 1) for i in range(n - 1) if (i, i + 1) not in edges and rng.random() < 0.6]
    ps = []
    if params:
        for q in range(int(rng.integers(1, 4))):
            users = rng.choice(n, size=int(rng.integers(1, 3)), replace=False)
            ps.append((f"p{q}", float(rng.integers(1, 8)), users.tolist()))
    return Graph.build(
        [f"v{i}" for i in range(n)],
        rng.random(n) * 4 + 0.5,
        rng.integers(0, 5, n).astype(float),
        edges,
        params=ps,
        act=rng.integers(0, 3, n).astype(float),
        name="random",
    )


def random_cluster(rng: np.random.Generator, devices: int) -> Cluster:
    """Two groups with a fast link inside and a slow one between; mixed memory, capacity and
    compute per device."""
    cut = int(rng.integers(1, devices))
    groups = (tuple(range(cut)), tuple(range(cut, devices)))
    topo = Topology(
        groups,
        ("h0", "h1"),
        ((float(rng.choice([2.0, 4.0])), 0.0), (float(rng.choice([2.0, 4.0])), 0.0)),
        (float(rng.choice([0.5, 1.0])), 0.1),
        fast_memory=tuple(float(rng.choice([4.0, 8.0, math.inf])) for _ in range(devices)),
        capacity=tuple(
            None if rng.random() < 0.5 else float(rng.integers(8, 20)) for _ in range(devices)
        ),
        compute=tuple(float(rng.choice([1.0, 2.0])) for _ in range(devices)),
    )
    return Cluster("mixed", devices, compute=1.0, slow_memory_bandwidth=2.0, topology=topo)


def brute_over_placements(g: Graph, c: Cluster) -> float:
    """The optimum by evaluating every plan on every placement with solver.core.cost (slow)."""
    _, capacity, _ = c.device_arrays()
    best = math.inf
    for a in all_assignments(g, c.devices):
        for perm in itertools.permutations(range(c.devices)):
            if not validate(g, c, a, placement=list(perm)):
                best = min(best, evaluate(g, c, a, placement=list(perm)).objective)
    return best


# -- the placement of given blocks -----------------------------------------------------------


@settings(max_examples=scaled_examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(3, 4))
def test_best_placement_is_the_best_permutation(seed, devices):
    rng = np.random.default_rng(seed)
    g = random_graph(rng, int(rng.integers(4, 8)))
    c = random_cluster(rng, devices)
    plans = all_assignments(g, devices)
    a = plans[int(rng.integers(len(plans)))]
    best = math.inf
    for perm in itertools.permutations(range(devices)):
        if not validate(g, c, a, placement=list(perm)):
            best = min(best, evaluate(g, c, a, placement=list(perm)).objective)
    p = best_placement(g, c, a)
    assert p.exact
    if math.isinf(best):
        assert p.devices is None and p.objective == math.inf
        return
    assert validate(g, c, a, placement=p.devices) == []
    assert p.objective == evaluate(g, c, a, placement=p.devices).objective
    assert p.objective == pytest.approx(best, rel=1e-12)
    # the local search alone (no exact search) returns a valid placement too
    q = best_placement(g, c, a, exact_limit=0)
    assert q.objective >= best * (1 - 1e-12)
    if q.exact:  # the pruning alone proved it (nothing left to enumerate)
        assert q.objective == pytest.approx(best, rel=1e-12)
    assert q.devices is None or validate(g, c, a, placement=q.devices) == []


def test_device_classes_and_planning_view():
    topo = Topology(
        ((0, 1, 2), (3, 4)),
        ("a", "b"),
        ((4.0, 0.0), (4.0, 0.0)),
        (1.0, 0.0),
        fast_memory=(8.0, 16.0, 8.0, 8.0, 8.0),
        capacity=(10.0, 20.0, 10.0, 10.0, 10.0),
    )
    c = Cluster("c", 5, topology=topo)
    cl = device_classes(c)
    assert cl.devices == ((0, 2), (1,), (3, 4))
    assert cl.count.tolist() == [2, 1, 2] and cl.group.tolist() == [0, 0, 1]
    small, big = planning_cluster(c), planning_cluster(c, biggest=True)
    assert small.homogeneous and (small.fast_memory, small.capacity) == (8.0, 10.0)
    assert (big.fast_memory, big.capacity) == (16.0, 20.0)


# -- heavier stages on the bigger devices -------------------------------------------------


def heavy_light_chain() -> tuple[Graph, Cluster]:
    """A chain of 8 layers, 4 with 12-byte weights and 4 with 2-byte weights, interleaved;
    4 devices with 8 bytes of fast memory, two of which (1 and 3) have 16."""
    sizes = [12.0, 2.0, 12.0, 2.0, 2.0, 12.0, 2.0, 12.0]
    g = Graph.build(
        [f"l{i}" for i in range(8)],
        [1.0] * 8,
        [1.0] * 8,
        [(i, i + 1) for i in range(7)],
        params=[(f"w{i}", s, [i]) for i, s in enumerate(sizes)],
        name="chain",
    )
    topo = Topology(((0, 1, 2, 3),), ("h",), ((4.0, 0.0),), fast_memory=(8.0, 16.0, 8.0, 16.0))
    c = Cluster(
        "big2", 4, compute=1.0, link_bandwidth=4.0, slow_memory_bandwidth=1.0, topology=topo
    )
    return g, c


def test_exact_plan_puts_the_heavier_stages_on_the_big_devices():
    g, c = heavy_light_chain()
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=20.0, workers=2))
    brute = brute_force(g, c)
    assert plan.status == OPTIMAL and brute.status == OPTIMAL
    assert plan.objective == pytest.approx(brute.objective, rel=1e-9)
    assert plan.objective == pytest.approx(brute_over_placements(g, c), rel=1e-9)
    ev = plan.evaluation
    used = [b for b in range(plan.k) if ev.nodes[b]]
    heavy = sorted(used, key=lambda b: -ev.params[b])[:2]
    assert sorted(int(plan.placement[b]) for b in heavy) == [1, 3]
    assert min(ev.params[b] for b in heavy) > max(ev.params[b] for b in used if b not in heavy)
    # identity placement would be strictly worse: the placement matters here
    assert plan.objective < evaluate(g, c, plan.assignment).objective
    assert plan.stats["bound_scope"] == ALL_PLACEMENTS


# -- CP-SAT with placement equals brute force over plans x placements ------------------------


@settings(max_examples=scaled_examples(15), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_cpsat_with_placement_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    devices = int(rng.integers(3, 5))
    g = random_graph(rng, int(rng.integers(6, 9)) if devices == 3 else int(rng.integers(6, 8)))
    c = random_cluster(rng, devices)
    brute = brute_force(g, c)
    plan = solve_cpsat(g, c, None, CP)
    if brute is None:
        assert plan is None
        return
    assert plan is not None and plan.placement is not None
    assert validate(g, c, plan.assignment, placement=plan.placement) == []
    assert plan.objective == evaluate(g, c, plan.assignment, placement=plan.placement).objective
    assert plan.lower_bound <= brute.objective * (1 + 1e-9) + 1e-12
    assert plan.status == OPTIMAL
    assert plan.objective == pytest.approx(brute.objective, rel=1e-6, abs=1e-9)
    # and with the heuristic warm start (its placement as the hint)
    warm = solve(g, c, "cpsat", SolveOptions(time_limit=20.0, workers=2, seed=1))
    assert warm.status == OPTIMAL
    assert warm.objective == pytest.approx(brute.objective, rel=1e-6, abs=1e-9)
    assert warm.lower_bound <= brute.objective * (1 + 1e-9) + 1e-12
    # the certified bounds, computed on the relaxed cluster, hold for every placement too
    assert certified_bound(g, c, 1.0).value <= brute.objective * (1 + 1e-9) + 1e-12


def test_brute_force_oracle_agrees_with_the_evaluator_over_placements():
    rng = np.random.default_rng(7)
    for _ in range(3):
        g = random_graph(rng, 5)
        c = random_cluster(rng, 3)
        brute = brute_force(g, c)
        expect = brute_over_placements(g, c)
        if brute is None:
            assert math.isinf(expect)
        else:
            assert brute.objective == pytest.approx(expect, rel=1e-12)
            assert brute.lower_bound == pytest.approx(brute.objective, rel=1e-9)


# -- every heuristic's plan is valid per device and priced by the evaluator ------------------


@pytest.mark.parametrize("method", ["slicegraph", "poprt", "time", "params", "uniform", "idealdp"])
def test_heuristic_plans_on_mixed_clusters_are_valid_and_priced_by_the_evaluator(method):
    rng = np.random.default_rng(11)
    for _ in range(4):
        g = random_graph(rng, 7)
        c = random_cluster(rng, 4)
        try:
            plan = solve(g, c, method, SolveOptions(time_limit=5.0, workers=1))
        except MtppError as e:  # only when no plan of theirs fits any placement
            assert (
                brute_force(g, c) is None or "fits no placement" in str(e) or "capacity" in str(e)
            )
            continue
        if plan is None:
            continue
        assert plan.placement is not None
        assert validate(g, c, plan.assignment, placement=plan.placement) == []
        assert plan.objective == evaluate(g, c, plan.assignment, placement=plan.placement).objective
        assert lower_bound(g, c) <= plan.lower_bound <= plan.objective
        assert plan.lower_bound <= brute_force(g, c).objective * (1 + 1e-9)


def test_certify_places_a_plan_over_a_small_device_instead_of_refusing():
    from solver.pipeline.registry import certified_bound, certify

    g, c = heavy_light_chain()
    c = replace(c, topology=replace(c.topology, capacity=(20.0, 40.0, 20.0, 40.0)))
    a = np.array([0, 0, 0, 1, 1, 2, 3, 3])  # block 0 holds 26 bytes of weights
    plan = make_plan(g, c, a, "given", check=False)  # identity: block 0 on a small device
    assert [v.kind for v in validate(g, c, a)] == ["capacity"]
    placed = certify(g, c, plan, certified_bound(g, c, 1.0))
    assert int(placed.placement[0]) in (1, 3)
    assert validate(g, c, a, placement=placed.placement) == []
    assert placed.objective == best_placement(g, c, a).objective
    tight = replace(c, topology=replace(c.topology, capacity=(1.0, 1.0, 1.0, 13.0)))
    with pytest.raises(MtppError, match=r"fits no placement of its blocks on the devices"):
        certify(
            g, tight, make_plan(g, tight, a, "given", check=False), certified_bound(g, tight, 1.0)
        )
    with pytest.raises(
        MtppError, match=r"time found no plan of 'chain' within the device capacity"
    ):
        solve(g, tight, "time", SolveOptions(time_limit=5.0))


# -- plan files and the simulator ------------------------------------------------------------


def test_plan_json_round_trips_the_placement_and_simulate_uses_its_links(tmp_path):
    g, c = heavy_light_chain()
    plan = solve(g, c, "cpsat", SolveOptions(time_limit=20.0, workers=2))
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    a, data = read_plan_assignment(g, path)
    dev = read_plan_placement(data, path, c)
    assert dev.tolist() == plan.placement.tolist() == data["placement"]
    again = make_plan(g, c, a, "again", placement=dev)
    assert again.objective == plan.objective
    sim = simulate(g, c, a, requests=30, placement=dev)
    assert sim.period == pytest.approx(plan.objective, rel=1e-9)
    # old plan files (no placement) read as None: block b on device b
    del data["placement"]
    assert read_plan_placement(data, path, c) is None
    for bad, match in [
        ([0, 1, 2], r"lists 3 devices but the cluster has 4"),
        ([0, 1, 1, 2], r"two blocks on the same device"),
        ([0, 1, 2, 9], r"names device 9, but devices are 0..3"),
        ([0, 1, 2, True], r"one whole device number per block"),
        ("0123", r"one whole device number per block"),
    ]:
        with pytest.raises(MtppError, match=match):
            read_plan_placement({"placement": bad}, "p.json", c)


def test_simulated_period_follows_the_placement_on_two_groups():
    """A 2-block split across two groups: the simulator's period is the evaluator's objective
    for each placement, and the link between the groups costs what the evaluator says."""
    g = Graph.build(["a", "b"], [1.0, 1.0], [8.0, 0.0], [(0, 1)])
    topo = Topology(((0, 1), (2,)), ("h0", "h1"), ((8.0, 0.0), (8.0, 0.0)), (1.0, 0.0))
    c = Cluster("two", 3, compute=1.0, link_bandwidth=8.0, topology=topo)
    same = evaluate(g, c, [0, 1], k=3, placement=[0, 1, 2])  # a on 0, b on 1: inside
    across = evaluate(g, c, [0, 1], k=3, placement=[0, 2, 1])  # b on device 2: between
    assert same.objective == 2.0 and across.objective == 9.0
    for dev, ev in ((np.array([0, 1, 2]), same), (np.array([0, 2, 1]), across)):
        sim = simulate(g, c, np.array([0, 1]), requests=20, placement=dev[:2])
        assert sim.period == pytest.approx(ev.objective, rel=1e-12)
    p = best_placement(g, c, np.array([0, 1]), k=2)
    assert p.objective == 2.0 and sorted(p.devices.tolist()) == [0, 1]
    assert json.loads(json.dumps(p.devices.tolist())) == p.devices.tolist()


def test_cli_solve_writes_the_placement_on_two_servers_and_none_on_one(tmp_path, capsys):
    from solver.cli import main
    from solver.core.cluster import load_cluster
    from solver.frontends import load_graph
    from tests.conftest import ROOT

    tiny = str(ROOT / "examples" / "tiny_transformer.json")
    out = tmp_path / "plan.json"
    argv = ["solve", tiny, "--cluster", "dgx-a100-x2", "-m", "cpsat", "--time-limit", "20"]
    assert main([*argv, "--workers", "2", "--out", str(out), "--json", "-q"]) == 0
    d = json.loads(capsys.readouterr().out)
    g, c = load_graph(tiny), load_cluster("dgx-a100-x2")
    a, data = read_plan_assignment(g, out)
    assert data["placement"] == d["placement"] and sorted(d["placement"]) == list(range(16))
    assert [b["device"] for b in d["blocks"]] == d["placement"]
    assert d["objective"] == evaluate(g, c, a, placement=d["placement"]).objective
    assert d["stats"]["bound_scope"] == ALL_PLACEMENTS
    assert d["lower_bound"] <= d["objective"]
    argv = ["solve", tiny, "--cluster", "dgx-a100", "-m", "time", "--json", "-q"]
    assert main(argv) == 0
    assert "placement" not in json.loads(capsys.readouterr().out)


# -- heuristics that plan against a device sequence (issue 14 item 2) ------------------------


def one_host(rng: np.random.Generator, devices: int) -> Cluster:
    """One group (one link) with mixed fast memory, capacity and compute per device."""
    topo = Topology(
        (tuple(range(devices)),),
        ("h",),
        ((float(rng.choice([1.0, 3.0])), 0.0),),
        fast_memory=tuple(float(rng.choice([4.0, 8.0, math.inf])) for _ in range(devices)),
        capacity=tuple(
            None if rng.random() < 0.5 else float(rng.integers(8, 20)) for _ in range(devices)
        ),
        compute=tuple(float(rng.choice([1.0, 2.0])) for _ in range(devices)),
    )
    return Cluster("host", devices, compute=1.0, slow_memory_bandwidth=2.0, topology=topo)


def best_slicing_by_brute_force(g: Graph, c: Cluster, order: np.ndarray, seq) -> float:
    """The least evaluator objective over every slicing of ``order`` into len(seq) ordered
    (possibly empty) blocks, block b on seq[b]."""
    k, best = len(seq), math.inf
    for cuts in itertools.combinations_with_replacement(range(g.n + 1), k - 1):
        ends = [0, *cuts, g.n]
        a = np.empty(g.n, dtype=np.int64)
        for b in range(k):
            a[order[ends[b] : ends[b + 1]]] = b
        if not validate(g, c, a, k=k, placement=seq):
            best = min(best, evaluate(g, c, a, k=k, placement=seq).objective)
    return best


@settings(max_examples=scaled_examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_slicing_on_a_device_sequence_is_exact_against_brute_force(seed):
    from solver.pipeline.heuristics.orders import priority_order
    from solver.pipeline.heuristics.slicing import slice_order

    rng = np.random.default_rng(seed)
    g = random_graph(rng, int(rng.integers(3, 8)))
    c = one_host(rng, 4)
    seq = rng.permutation(4)[: int(rng.integers(2, 5))]
    order = priority_order(g, rng.random(g.n))
    val, a = slice_order(g, c, order, devices=seq)
    want = best_slicing_by_brute_force(g, c, order, seq)
    if math.isinf(want):
        assert a is None and math.isinf(val)
        return
    assert validate(g, c, a, k=len(seq), placement=seq) == []
    assert val == evaluate(g, c, a, k=len(seq), placement=seq).objective
    assert val == pytest.approx(want, rel=1e-9)
    # the cheap rejection agrees: nothing at most just below the optimum, the optimum at it
    assert slice_order(g, c, order, devices=seq, upper=want * (1 - 1e-6))[1] is None
    assert slice_order(g, c, order, devices=seq, upper=want)[0] == pytest.approx(want)


def test_scaled_linear_partition_is_exact_against_brute_force():
    from solver.pipeline.heuristics.slicing import linear_partition

    rng = np.random.default_rng(5)
    for _ in range(30):
        w = rng.integers(0, 9, int(rng.integers(1, 8))).astype(float)
        scale = rng.choice([1.0, 2.0, 3.0], 3)
        parts = linear_partition(w, 3, scale)
        assert np.all(np.diff(parts) >= 0)
        got = max(w[parts == j].sum() / scale[j] for j in range(3))
        want = min(
            max(w[e[j] : e[j + 1]].sum() / scale[j] for j in range(3))
            for cuts in itertools.combinations_with_replacement(range(len(w) + 1), 2)
            for e in [(0, *cuts, len(w))]
        )
        assert got == pytest.approx(want, rel=1e-9)


def chain_with_weights(n: int, work: float = 1.0) -> Graph:
    """A chain of n nodes, equal work, each with its own 10-byte weight, 1-byte tensors."""
    return Graph.build(
        [f"v{i}" for i in range(n)],
        [work] * n,
        [1.0] * n,
        [(i, i + 1) for i in range(n - 1)],
        params=[(f"p{i}", 10.0, [i]) for i in range(n)],
        name="chain",
    )


def per_device(plan, values: np.ndarray) -> dict[int, float]:
    return {int(d): float(values[b]) for b, d in enumerate(plan.placement)}


def test_params_baseline_gives_twice_the_bytes_to_devices_with_twice_the_memory():
    g = chain_with_weights(60)  # 600 bytes of weights
    topo = Topology(((0, 1, 2, 3),), ("h",), ((1e6, 0.0),), capacity=(200, 400, 200, 400))
    c = Cluster("mem", 4, compute=1.0, link_bandwidth=1e6, topology=topo)
    plan = solve(g, c, "params", SolveOptions(time_limit=5.0, workers=1))
    ev = evaluate(g, c, plan.assignment, placement=plan.placement)
    held = per_device(plan, ev.params)
    assert sum(held.values()) == 600
    # shares 1:2:1:2 of 600 bytes in 10-byte steps: 100 and 200, give or take one weight
    assert all(abs(held[d] - 100) <= 10 for d in (0, 2))
    assert all(abs(held[d] - 200) <= 10 for d in (1, 3))
    assert plan.stats["planned_on"] == "device sequence"
    assert validate(g, c, plan.assignment, placement=plan.placement) == []


def test_time_baseline_gives_the_fast_devices_proportionally_more_work():
    g = chain_with_weights(60)
    topo = Topology(((0, 1, 2, 3),), ("h",), ((1e6, 0.0),), compute=(1.0, 1.0, 2.0, 2.0))
    c = Cluster("speed", 4, compute=1.0, link_bandwidth=1e6, topology=topo)
    plan = solve(g, c, "time", SolveOptions(time_limit=5.0, workers=1))
    ref = np.bincount(plan.assignment, weights=g.work, minlength=4)  # reference seconds
    work = per_device(plan, ref)
    assert all(abs(work[d] - 10) <= 1 for d in (0, 1))  # 60 s of work in shares 1:1:2:2
    assert all(abs(work[d] - 20) <= 1 for d in (2, 3))
    ev = evaluate(g, c, plan.assignment, placement=plan.placement)
    assert plan.objective == ev.objective
    assert plan.objective <= 10.0 + 1e-3 + 1e-9  # every device busy about 10 s
    # uniform stays by operator count: 15 operators on every device
    uni = solve(g, c, "uniform", SolveOptions(time_limit=5.0, workers=1))
    assert np.bincount(uni.assignment, minlength=4).tolist() == [15] * 4


def test_slicegraph_on_devices_is_never_worse_than_the_flat_view_and_sometimes_better():
    from solver.pipeline.runners import run_slicegraph
    from solver.pipeline.topology import flat_then_place

    rng = np.random.default_rng(3)
    opts = SolveOptions(time_limit=5.0, workers=1)
    better = 0
    for _ in range(8):
        g = random_graph(rng, 9)
        c = random_cluster(rng, 4) if rng.random() < 0.5 else one_host(rng, 4)
        try:
            flat = flat_then_place(run_slicegraph, g, c, 4, opts)
        except MtppError:
            flat = None
        plan = run_slicegraph.on_devices(g, c, opts) if flat is not None else None
        if flat is None or plan is None:
            continue
        assert validate(g, c, plan.assignment, placement=plan.placement) == []
        assert plan.objective == evaluate(g, c, plan.assignment, placement=plan.placement).objective
        assert plan.objective <= flat.objective
        better += plan.objective < flat.objective * (1 - 1e-9)
    assert better >= 1


@pytest.mark.parametrize("method", ["slicegraph", "poprt", "params"])
def test_plans_that_only_a_proportional_split_fits_are_found(method):
    """600 weight bytes on devices of capacity 120, 320, 120, 320: an equal split (150 each)
    fits no placement, so the flat view is refused; planning against the devices is not."""
    from solver.pipeline.registry import METHODS
    from solver.pipeline.topology import flat_then_place

    g = chain_with_weights(60)
    topo = Topology(((0, 1, 2, 3),), ("h",), ((1e6, 0.0),), capacity=(120, 320, 120, 320))
    c = Cluster("mem", 4, compute=1.0, link_bandwidth=1e6, topology=topo)
    opts = SolveOptions(time_limit=5.0, workers=1)
    with pytest.raises(MtppError, match="no placement of them"):
        flat_then_place(METHODS[method], g, c, 4, opts)
    plan = solve(g, c, method, opts)
    assert validate(g, c, plan.assignment, placement=plan.placement) == []
    assert plan.objective == evaluate(g, c, plan.assignment, placement=plan.placement).objective
    held = per_device(plan, evaluate(g, c, plan.assignment, placement=plan.placement).params)
    assert min(held[1], held[3]) > max(held[0], held[2])  # the big devices hold more
    if method == "slicegraph":  # 11 + 19 + 11 + 19 nodes: the small devices are full
        assert plan.objective == pytest.approx(19.0, rel=1e-5)


# -- plans inside one group (issue: the best plan may stay on one host) ----------------------


def two_hosts_slow_between(rng: np.random.Generator, fast_second: bool = True):
    """A random-work chain of 8 nodes and 2 hosts of 2 devices: fast link inside, a link
    between so slow (1 byte: 1000 s) that every plan crossing hosts is worse than every plan
    inside one; host 1 computes twice as fast when ``fast_second``."""
    g = Graph.build(
        [f"v{i}" for i in range(8)],
        rng.random(8) * 4 + 0.5,
        np.ones(8),
        [(i, i + 1) for i in range(7)],
        params=[(f"p{i}", float(rng.integers(1, 5)), [i]) for i in range(8)],
        name="chain",
    )
    second = 2.0 if fast_second else 1.0
    topo = Topology(
        ((0, 1), (2, 3)),
        ("h0", "h1"),
        ((10.0, 0.0), (10.0, 0.0)),
        (1e-3, 0.0),
        compute=(1.0, 1.0, second, second),
    )
    return g, Cluster("two-hosts", 4, compute=1.0, link_bandwidth=10.0, topology=topo)


def crosses_groups(plan, c: Cluster) -> bool:
    used = np.unique(plan.assignment)
    hosts = {int(c._group_of[plan.placement[b]]) for b in used}
    return len(hosts) > 1


def test_group_clusters_are_the_distinct_groups_with_their_inside_link():
    from solver.pipeline.placement import group_clusters

    _, c = two_hosts_slow_between(np.random.default_rng(0))
    gcs = group_clusters(c)
    assert [gc.devices.tolist() for gc in gcs] == [[0, 1], [2, 3]]
    assert [gc.cluster.homogeneous for gc in gcs] == [True, False]  # h1: compute 2 != 1
    assert gcs[1].cluster.device_compute(0) == 2.0 and gcs[0].cluster.link_bandwidth == 10.0
    _, alike = two_hosts_slow_between(np.random.default_rng(0), fast_second=False)
    assert [gc.devices.tolist() for gc in group_clusters(alike)] == [[0, 1]]  # one run
    assert group_clusters(c.with_devices(2)) == []  # one group


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fast_second", [True, False])
def test_every_method_plans_inside_one_group_when_the_link_between_is_slow(seed, fast_second):
    g, c = two_hosts_slow_between(np.random.default_rng(seed), fast_second)
    oracle = brute_force(g, c)
    assert not crosses_groups(oracle, c) and oracle.objective < 1000
    opts = SolveOptions(time_limit=2.0, workers=1)
    for method in ("slicegraph", "poprt", "time", "params", "uniform", "idealdp", "cpsat"):
        plan = solve(g, c, method, opts)
        assert not crosses_groups(plan, c), method
        assert plan.objective == pytest.approx(
            evaluate(g, c, plan.assignment, placement=plan.placement).objective, rel=1e-12
        )
        assert plan.objective >= oracle.objective * (1 - 1e-9), method
        if method in ("slicegraph", "idealdp", "cpsat"):  # exact on a chain inside one host
            assert plan.objective == pytest.approx(oracle.objective, rel=1e-9), method
        if fast_second:  # the faster host wins
            assert set(plan.placement[np.unique(plan.assignment)].tolist()) <= {2, 3}, method


@pytest.mark.parametrize("method", ["time", "params", "uniform", "poprt"])
def test_the_one_group_plan_is_the_method_run_on_that_group_alone(method):
    from solver.pipeline.placement import group_clusters

    g, c = two_hosts_slow_between(np.random.default_rng(3))
    opts = SolveOptions(time_limit=2.0, workers=1)
    alone = [solve(g, gc.cluster, method, opts).objective for gc in group_clusters(c)]
    assert solve(g, c, method, opts).objective == pytest.approx(min(alone), rel=1e-12)


def test_without_the_slow_link_the_whole_cluster_plan_still_wins():
    g, c = two_hosts_slow_between(np.random.default_rng(4), fast_second=False)
    fast = replace(c, topology=replace(c.topology, between=(5.0, 0.0)))
    oracle = brute_force(g, fast)
    plan = solve(g, fast, "slicegraph", SolveOptions(time_limit=2.0, workers=1))
    assert crosses_groups(oracle, fast)  # the check can fail: 4 devices beat 2 here
    assert crosses_groups(plan, fast)
    assert plan.objective == pytest.approx(oracle.objective, rel=1e-9)


@pytest.mark.parametrize("method", ["uniform", "slicegraph", "idealdp"])
def test_a_group_of_one_fast_device_takes_the_whole_graph(method):
    g, _ = two_hosts_slow_between(np.random.default_rng(5))
    topo = Topology(
        ((0, 1, 2), (3,)), ("h0", "h1"), ((10.0, 0.0), (1.0, 0.0)), (1e-3, 0.0),
        compute=(1.0, 1.0, 1.0, 10.0),
    )  # fmt: skip
    c = Cluster("one-fast", 4, compute=1.0, link_bandwidth=10.0, topology=topo)
    plan = solve(g, c, method, SolveOptions(time_limit=2.0, workers=1))
    assert np.unique(plan.assignment).size == 1 and plan.placement[plan.assignment[0]] == 3
    assert plan.objective == pytest.approx(brute_force(g, c).objective, rel=1e-9)
    if method == "uniform":  # slicegraph's device sequences may leave blocks empty as well
        assert plan.stats["planned_on"] == "one group alone (one-fast/h1, 1 blocks)"
