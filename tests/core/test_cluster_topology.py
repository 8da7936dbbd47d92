"""Cluster topology (groups, links, per-device memory and compute): the YAML, the API, the
evaluator and the simulator on such clusters, and the one-line refusals of bad topologies."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from solver.backends.simulate import simulate
from solver.cli import main
from solver.core.cluster import Cluster, Topology, cluster_from_dict, load_cluster, preset_names
from solver.core.cost import _evaluate_on_topology, evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.pipeline.exact.brute import all_assignments, batch_costs
from tests.badinput import assert_refused
from tests.conftest import ROOT, problems, scaled_examples

TINY = ROOT / "examples" / "tiny_transformer.json"
FIELDS = ("io_in", "work", "overflow", "io_out", "f", "peak", "params", "bytes_in", "bytes_out")


# -- presets and backwards compatibility ---------------------------------------------------


def test_flat_presets_are_unchanged_and_every_preset_round_trips():
    ipu = load_cluster("ipu-m2000")
    assert ipu == Cluster(
        name="ipu-m2000",
        devices=4,
        fast_memory=900e6,
        compute=250e12,
        memory_bandwidth=47.5e12,
        link_bandwidth=64e9,
        slow_memory_bandwidth=20e9,
        description=ipu.description,
    )
    assert "topology" not in ipu.to_dict() and ipu.groups == [[0, 1, 2, 3]]
    assert ipu.link(0, 3) == (64e9, 0.0) and ipu.device_capacity(2) is None
    for name in preset_names():
        c = load_cluster(name)
        assert cluster_from_dict(json.loads(json.dumps(c.to_dict())), name) == c


def test_dgx_a100_keeps_its_values_and_gains_one_group():
    c = load_cluster("dgx-a100")
    flat = replace(c, topology=None)
    assert (flat.devices, flat.fast_memory, flat.link_bandwidth) == (8, 80e9, 300e9)
    assert c.groups == [list(range(8))] and c.group_names == ["dgx0"]
    assert c.homogeneous and c.link(0, 7) == (300e9, 0.0)
    assert load_cluster("dgx-a100", devices=16).groups == [list(range(16))]  # -k grows it
    assert load_cluster("dgx-a100", devices=16).homogeneous


def test_two_dgx_servers_preset():
    c = load_cluster("dgx-a100-x2")
    assert c.devices == 16 and not c.homogeneous
    assert c.groups == [list(range(8)), list(range(8, 16))]
    assert c.link(3, 5) == (300e9, 0.0)  # NVLink inside a server
    assert c.link(3, 12) == pytest.approx((25e9, 5e-6))  # one HDR port per GPU: 200 Gb/s
    assert c.link(4, 4) == (math.inf, 0.0)
    assert c.device_memory(15) == 80e9 and c.device_compute(9) == 312e12
    assert c.with_devices(8).homogeneous and c.with_devices(8).groups == [list(range(8))]
    with pytest.raises(MtppError, match=r"--devices 17: cluster 'dgx-a100-x2' has a topology"):
        c.with_devices(17)


def test_ipu_pod16_preset():
    c = load_cluster("ipu-pod16")
    assert c.group_names == ["m2000-0", "m2000-1", "m2000-2", "m2000-3"]
    assert c.groups[2] == [8, 9, 10, 11]
    assert c.link(8, 11) == (64e9, 0.0) and c.link(0, 4) == pytest.approx((32e9, 2e-6))
    assert c.device_memory(0) == 900e6


# -- the YAML and the API --------------------------------------------------------------------

MIXED = {
    "name": "mixed",
    "compute": "1TFLOPS",
    "fast_memory": "10GB",
    "link_bandwidth": "50GB/s",
    "topology": {
        "groups": [
            {"name": "big", "devices": [0, 2]},
            {"name": "small", "devices": [1, 3], "link": {"bandwidth": "20GB/s", "latency": "1us"}},
        ],
        "between": {"bandwidth": "5GB/s", "latency": "10us"},
        "fast_memory": ["20GB", "10GB", "20GB", "10GB"],
        "capacity": ["30GB", None, "30GB", None],
        "compute": ["2TFLOPS", "1TFLOPS", "2TFLOPS", "1TFLOPS"],
    },
}


def test_mixed_cluster_api_and_round_trip():
    c = cluster_from_dict(MIXED, "mixed.yaml")
    assert c.devices == 4  # taken from the groups
    assert c.groups == [[0, 2], [1, 3]] and not c.homogeneous
    assert c.link(0, 2) == (50e9, 0.0)  # no link of its own: the cluster's
    assert c.link(3, 1) == pytest.approx((20e9, 1e-6))
    assert c.link(0, 1) == pytest.approx((5e9, 1e-5))
    assert [c.device_memory(d) for d in range(4)] == [20e9, 10e9, 20e9, 10e9]
    assert [c.device_capacity(d) for d in range(4)] == [30e9, None, 30e9, None]
    assert c.device_compute(2) == 2e12
    assert cluster_from_dict(c.to_dict(), "again") == c
    sub = c.with_devices(3)
    assert sub.groups == [[0, 2], [1]] and sub.topology.compute == (2e12, 1e12, 2e12)
    big = c.with_memory(5e9)  # --memory: every device's capacity, fast memory untouched
    assert [big.device_capacity(d) for d in range(4)] == [5e9] * 4
    assert big.device_memory(0) == 20e9
    with pytest.raises(MtppError, match=r"no device 4; devices are 0..3"):
        c.link(0, 4)
    flat, speedup = c.relaxation()  # the most favourable device and link, for bounds
    assert (flat.fast_memory, flat.capacity, flat.link_bandwidth, speedup) == (
        20e9,
        None,
        50e9,
        2.0,
    )
    assert load_cluster("ipu-m2000").relaxation() == (load_cluster("ipu-m2000"), 1.0)


def test_one_group_with_uniform_values_is_homogeneous_and_differences_are_not():
    flat = Cluster("u", 4, fast_memory=8.0, link_bandwidth=2.0)
    two = Topology(((0, 1), (2, 3)), ("a", "b"), ((2.0, 0.0), (2.0, 0.0)), (2.0, 0.0))
    assert replace(flat, topology=two).homogeneous
    assert not replace(flat, topology=replace(two, between=(1.0, 0.0))).homogeneous
    assert not replace(flat, topology=replace(two, fast_memory=(8.0, 8.0, 8.0, 9.0))).homogeneous
    solo = Topology(((0,), (1, 2, 3)), ("a", "b"), ((7.0, 0.0), (2.0, 0.0)), (2.0, 0.0))
    assert replace(flat, topology=solo).homogeneous  # a one-device group's link is never used


BAD_TOPOLOGIES = [
    (
        {"devices": 4, "topology": {"groups": [{"devices": 2}, {"devices": 10**12}]}},
        r"the groups hold 1000000000002 devices; at most 1024",
    ),
    (
        {"devices": 4, "topology": {"groups": [{"devices": [0, 1]}, {"devices": [1, 2, 3]}]}},
        r"device 1 is listed in groups 'group0' and 'group1'",
    ),
    (
        {"devices": 4, "topology": {"groups": [{"devices": [0, 0, 1, 2]}]}},
        r"device 0 is listed twice",
    ),
    (
        {"devices": 4, "topology": {"groups": [{"devices": [0, 1, 3]}]}},
        r"the groups hold 3 devices but devices is 4 \(device 2 is in no group\)",
    ),
    (
        {"devices": 6, "topology": {"groups": [{"devices": 2}, {"devices": 2}]}, "x": 0},
        r"key 'x'",
    ),
    (
        {"devices": 6, "topology": {"groups": [{"devices": 4}, {"devices": 4}]}},
        r"group 'group1' lists device 6, but devices are 0..5",
    ),
    (
        {"topology": {"groups": [{"devices": 2}, {"devices": 2}]}},
        r"groups 'group0' and 'group1' have no link between them",
    ),
    (
        {
            "topology": {
                "groups": [{"devices": 2}, {"devices": 2}],
                "between": {"bandwidth": "0GB/s"},
            }
        },
        r"topology.between bandwidth must be > 0",
    ),
    (
        {"topology": {"groups": [{"name": "h", "devices": 2, "link": {"bandwidth": -1}}]}},
        r"topology group 'h' link.bandwidth: must be a non-negative quantity, got -1",
    ),
    (
        {"devices": 3, "topology": {"fast_memory": ["1GB", "2GB"]}},
        r"topology.fast_memory lists 2 values but there are 3 devices",
    ),
    (
        {"devices": 2, "topology": {"compute": ["1TFLOPS", 0]}},
        r"topology.compute\[1\] must be > 0",
    ),
    (
        {
            "topology": {
                "groups": [{"devices": 2}, {"devices": [2, 3]}],
                "between": {"bandwidth": 1},
            }
        },
        r"every group a count of devices or every group a list",
    ),
    (
        {"topology": {"groups": [{"name": "a", "devices": 1}, {"name": "a", "devices": 1}]}},
        r"group name 'a' is used twice",
    ),
]


@pytest.mark.parametrize(("data", "match"), BAD_TOPOLOGIES)
def test_bad_topologies_are_one_line_refusals(tmp_path, capsys, data, match):
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert_refused(capsys, ["inspect", TINY, "--cluster", path], match, watch=tmp_path)


def test_cli_refuses_bad_memory_and_devices_beyond_the_topology(tmp_path, capsys):
    for size, match in [("-3GB", r"--memory"), ("0", r"--memory must be a finite size > 0")]:
        assert_refused(capsys, ["inspect", TINY, "--memory", size], match, watch=tmp_path)
    assert_refused(
        capsys,
        ["inspect", TINY, "--cluster", "dgx-a100-x2", "-k", "20"],
        r"--devices 20: cluster 'dgx-a100-x2' has a topology of 16 devices in 2 groups",
        watch=tmp_path,
    )


def test_inspect_shows_the_topology_and_memory_sets_the_capacity(capsys):
    assert main(["inspect", str(TINY), "--cluster", "dgx-a100-x2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    topo = info["cluster"]["topology"]
    assert [g["devices"] for g in topo["groups"]] == [list(range(8)), list(range(8, 16))]
    assert topo["between"] == {"bandwidth": 25e9, "latency": pytest.approx(5e-6)}
    assert main(["inspect", str(TINY), "--cluster", "dgx-a100-x2", "--memory", "40GB"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "2 groups: dgx0 = devices 0-7 (link 300 GB/s)" in text
    assert "between groups 25 GB/s, 5 us" in text
    assert "capacity 37.3 GiB" in text and "fast memory 74.5 GiB" in text


# -- the evaluator on a two-host cluster, by hand --------------------------------------------


def two_hosts() -> tuple[Graph, Cluster]:
    """a -> b, a -> c, b -> d, c -> d; hosts {0, 1} (4 B/s) and {2, 3} (1 B/s between);
    device 1 has 10 bytes of fast memory, device 2 is twice as fast as the reference."""
    g = Graph.build(
        ["a", "b", "c", "d"],
        [1.0, 2.0, 3.0, 4.0],
        [8.0, 4.0, 2.0, 0.0],
        [(0, 1), (0, 2), (1, 3), (2, 3)],
        params=[("w", 12.0, [1])],
    )
    topo = Topology(
        groups=((0, 1), (2, 3)),
        names=("A", "B"),
        links=((4.0, 0.0), (4.0, 0.0)),
        between=(1.0, 0.5),
        fast_memory=(math.inf, 10.0, math.inf, math.inf),
        compute=(1.0, 1.0, 2.0, 1.0),
    )
    c = Cluster("2hosts", 4, compute=1.0, slow_memory_bandwidth=2.0, topology=topo)
    return g, c


def test_two_hosts_by_hand():
    g, c = two_hosts()
    ev = evaluate(g, c, [0, 1, 2, 2], k=3)  # blocks 0, 1, 2 on devices 0, 1, 2
    # block 0 {a} on device 0: work 1; sends a to device 1 (inside host A, 8/4 = 2) and to
    # device 2 (between hosts, 8/1 = 8): two link classes, two sends
    # block 1 {b} on device 1: receives a 8/4 = 2, work 2, params 12 + peak act(b) = 4 + 8
    # over 10 bytes of fast memory: (24 - 10) / 2 = 7; sends b across 4/1 = 4
    # block 2 {c, d} on device 2 (2x fast): receives a 8/1 and b 4/1, work (3 + 4) / 2
    assert ev.io_out.tolist() == [10.0, 4.0, 0.0]
    assert ev.io_in.tolist() == [0.0, 2.0, 12.0]
    assert ev.work.tolist() == [1.0, 2.0, 3.5]
    assert ev.overflow.tolist() == [0.0, 7.0, 0.0]
    assert ev.f.tolist() == [11.0, 15.0, 15.5]
    assert ev.bytes_out.tolist() == [16.0, 4.0, 0.0] and ev.bytes_in.tolist() == [0, 8, 12]
    assert ev.blocks()[2]["device"] == 2
    # swap the last two blocks' devices: block 1 on the fast device 2, block 2 on device 1
    ev = evaluate(g, c, [0, 1, 2, 2], k=3, placement=[0, 2, 1])
    # block 1: a 8/1 in, work 2/2, no overflow (inf memory), b 4/1 out  -> 13
    # block 2: a 8/4 in, b 4/1 in, work 7, peak act(c) = 2 + 8 = 10 fits in 10 bytes -> 13
    assert ev.f.tolist() == [11.0, 13.0, 13.0] and ev.objective == 13.0
    sim = simulate(g, c, [0, 1, 2, 2], requests=30, placement=[0, 2, 1])
    assert sim.period == pytest.approx(13.0, rel=1e-12)
    # first request: block 0 ends at 11; +0.5 (between) block 1 runs 13 -> 24.5; block 2
    # waits for block 1 (+0.5) and runs 13 -> 38
    assert sim.latency_first == pytest.approx(38.0)


def test_placement_and_capacity_checks():
    g, c = two_hosts()
    cap = replace(c, topology=replace(c.topology, capacity=(None, 20.0, None, None)))
    bad = validate(g, cap, [0, 1, 2, 2], k=3)
    assert [v.kind for v in bad] == ["capacity"]
    assert "block 1 on device 1 needs 24 bytes" in bad[0].message
    assert validate(g, cap, [0, 1, 2, 2], k=3, placement=[0, 2, 1]) == []
    for placement, match in [
        ([0, 0, 1], r"two blocks on the same device"),
        ([0, 1, 4], r"block 2 on device 4, but devices are 0..3"),
        ([0, 1], r"one whole device number per block \(3 blocks\)"),
        ([0.0, 1.0, 2.0], r"one whole device number per block"),
    ]:
        with pytest.raises(MtppError, match=match):
            evaluate(g, c, [0, 1, 2, 2], k=3, placement=placement)
    with pytest.raises(MtppError, match=r"the plan has 5 blocks but cluster '2hosts' has 4"):
        evaluate(g, c, [0, 1, 2, 4], k=5)


# -- homogeneous clusters: exactly today's numbers -------------------------------------------


def with_topology(c: Cluster, cut: int) -> Cluster:
    """The same devices split into two groups at ``cut`` with every link equal to c's."""
    lk = (c.link_bandwidth, c.link_latency)
    groups = (tuple(range(cut)), tuple(range(cut, c.devices)))
    groups = tuple(m for m in groups if m)
    names = tuple(f"h{i}" for i in range(len(groups)))
    between = lk if len(groups) > 1 else None
    return replace(c, topology=Topology(groups, names, (lk,) * len(groups), between))


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7), st.integers(0, 2**16), st.integers(0, 3))
def test_homogeneous_topology_gives_exactly_the_flat_numbers(prob, seed, cut):
    g, c = prob
    plans = all_assignments(g, c.devices)
    a = plans[np.random.default_rng(seed).integers(len(plans))]
    t = with_topology(c, min(cut, c.devices))
    assert t.homogeneous
    old, new = evaluate(g, c, a), evaluate(g, t, a)  # the flat cluster is the oracle
    for f in FIELDS:
        assert np.array_equal(getattr(old, f), getattr(new, f)), f
    assert lower_bound(g, t) == lower_bound(g, c)
    assert [v.message for v in validate(g, t, a)] == [v.message for v in validate(g, c, a)]
    # the general (per-device, per-link) code agrees with the old formula up to rounding
    gen = _evaluate_on_topology(g, t, a, c.devices, np.arange(c.devices))
    for f in FIELDS:
        assert np.allclose(getattr(old, f), getattr(gen, f), rtol=1e-12, atol=1e-12), f
    # and both with the brute-force oracle written apart from the evaluator
    f_brute, _ = batch_costs(g, c, a[None, :], c.devices)
    assert np.allclose(new.f, f_brute[0], rtol=1e-9, atol=1e-12)


# -- heterogeneous clusters: a slow reference evaluator, the simulator, the bound -------------


@st.composite
def hetero(draw):
    """A random problem on a random two-host cluster with mixed devices and a placement."""
    g, c = draw(problems(max_nodes=6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k = c.devices
    n_dev = k + int(rng.integers(0, 2))
    cut = int(rng.integers(1, n_dev)) if n_dev > 1 else 1
    groups = tuple(m for m in (tuple(range(cut)), tuple(range(cut, n_dev))) if m)
    links = tuple(
        (float(rng.choice([1.0, 2.0, 4.0])), float(rng.choice([0.0, 0.5]))) for _ in groups
    )
    between = (float(rng.choice([0.5, 1.0])), 0.25) if len(groups) > 1 else None
    memory = tuple(float(rng.choice([math.inf, 3.0, 6.0, 12.0])) for _ in range(n_dev))
    capacity = tuple(
        None if rng.random() < 0.5 else float(rng.integers(6, 16)) for _ in range(n_dev)
    )
    compute = tuple(float(rng.choice([0.5, 1.0, 2.0])) * c.compute for _ in range(n_dev))
    topo = Topology(
        groups,
        tuple(f"h{i}" for i in range(len(groups))),
        links,
        between,
        memory,
        capacity,
        compute,
    )
    cluster = replace(c, devices=n_dev, topology=topo)
    plans = all_assignments(g, k)
    a = plans[int(rng.integers(len(plans)))]
    placement = rng.permutation(n_dev)[:k]
    return g, cluster, k, a, placement


def reference_costs(g: Graph, c: Cluster, a, placement) -> list[float]:
    """f of every block from the definitions, one block and one tensor at a time."""
    f = []
    for b, d in enumerate(placement):
        nodes = {v for v in range(g.n) if a[v] == b}
        cost = sum(g.work[v] for v in nodes) * c.compute / c.device_compute(d)
        for t in range(g.num_tensors):
            p = int(g.t_producer[t])
            readers = {int(a[x]) for x in g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]}
            if a[p] != b and b in readers:
                cost += g.t_size[t] / c.link(placement[a[p]], d)[0]
            if a[p] == b:
                classes = {c.link(d, placement[r]) for r in readers if r != b}
                cost += sum(g.t_size[t] / bw for bw, _ in classes)
        used = {int(g.pair_param[i]) for i in range(len(g.p_users)) if g.p_users[i] in nodes}
        if nodes:
            need = sum(g.p_size[q] for q in used) + max(g.act[v] for v in nodes)
            cost += max(0.0, need - c.device_memory(d)) / c.slow_memory_bandwidth
        f.append(cost)
    return f


def apart_from_the_bottleneck():
    """Found by the property below (a 3-node graph; devices 0 | 1, 2; device 2 at half
    compute; per-device fast memory and capacity; placement [0, 2, 1]), rebuilt with round
    numbers: a -> b, and c on its own.

    Block 0 {a} on device 0: work 4, sends 2 bytes between the groups (1 B/s): f = 6.
    Block 1 {b} on device 2: receives a (2), work 1 at half speed (2), params 5 + act 2 in 6
    bytes of fast memory (1): f = 5. Block 2 {c} on device 1: work 5.6, params 7 in 6.5
    bytes (0.5): f = 6.1, the bottleneck. Request r leaves block 1 at 6 (r + 1) + 0.25 + 5
    and block 2 at 6.1 (r + 1), so block 1 finishes last up to r = 51: the gaps between
    requests leaving the pipeline were 6 over the first 40 requests, while the period is 6.1.
    """
    g = Graph.build(
        ["a", "b", "c"],
        [4.0, 1.0, 5.6],
        [2.0, 0.0, 0.0],
        [(0, 1)],
        params=[("wb", 5.0, [1]), ("wc", 7.0, [2])],
        name="apart",
    )
    topo = Topology(
        groups=((0,), (1, 2)),
        names=("h0", "h1"),
        links=((2.0, 0.0), (4.0, 0.0)),
        between=(1.0, 0.25),
        fast_memory=(math.inf, 6.5, 6.0),
        capacity=(None, 12.0, 10.0),
        compute=(1.0, 1.0, 0.5),
    )
    c = Cluster("two-groups", 3, fast_memory=8.0, compute=1.0, slow_memory_bandwidth=1.0)
    return g, replace(c, topology=topo), 3, np.array([0, 1, 2]), np.array([0, 2, 1])


def test_simulated_period_is_the_bottleneck_even_when_it_finishes_first():
    g, c, k, a, placement = apart_from_the_bottleneck()
    ev = evaluate(g, c, a, k, placement=placement)
    assert ev.f.tolist() == pytest.approx([6.0, 5.0, 6.1], rel=1e-12)
    assert validate(g, c, a, k, placement=placement) == []
    for requests in (3, 10, 40, 53, 200):
        sim = simulate(g, c, a, requests=requests, placement=placement)
        assert sim.period == pytest.approx(6.1, rel=1e-12), requests
    sim = simulate(g, c, a, requests=40, placement=placement)
    assert sim.latency_first == pytest.approx(11.25, rel=1e-12)  # 6 + 0.25 + 5
    assert sim.makespan == pytest.approx(40 * 6 + 5.25, rel=1e-12)  # block 1 is still last


@settings(max_examples=scaled_examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(hetero())
@example(apart_from_the_bottleneck())
def test_heterogeneous_evaluator_simulator_and_definitions_agree(case):
    g, c, k, a, placement = case
    ev = evaluate(g, c, a, k, placement=placement)
    assert np.allclose(ev.f, reference_costs(g, c, a, placement), rtol=1e-12, atol=1e-12)
    pipe = simulate(g, c, a, requests=40, placement=placement)
    assert pipe.period == pytest.approx(ev.objective, rel=1e-9, abs=1e-12)
    over = simulate(g, c, a, requests=40, overlap=True, placement=placement)
    assert over.period <= pipe.period * (1 + 1e-12) + 1e-15
    # one request at a time: the sum of the block costs (link latencies set to 0 here)
    seq = simulate(g, c, a, requests=40, mode="sequential", placement=placement, latency=0.0)
    assert seq.period == pytest.approx(ev.f.sum(), rel=1e-9, abs=1e-12)
    used = ev.params + ev.peak
    caps = [c.device_capacity(d) for d in placement]
    over_cap = any(
        cap is not None and u > cap * (1 + 1e-12) for u, cap in zip(used, caps, strict=True)
    )
    flagged = any(v.kind == "capacity" for v in validate(g, c, a, k, placement=placement))
    assert flagged == over_cap


@settings(max_examples=scaled_examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(hetero())
def test_heterogeneous_lower_bound_holds_for_every_plan_and_placement(case):
    g, c, k, _, _ = case
    best = math.inf
    for a in all_assignments(g, k):
        for placement in itertools.permutations(range(c.devices), k):
            best = min(best, evaluate(g, c, a, k, placement=list(placement)).objective)
    assert lower_bound(g, c, k) <= best * (1 + 1e-9) + 1e-12


def test_plan_on_two_servers_round_trips_through_the_cli(tmp_path, capsys):
    from solver.frontends import load_graph
    from solver.pipeline.plan import read_plan_assignment

    plan = tmp_path / "plan.json"
    argv = ["solve", TINY, "--cluster", "dgx-a100-x2", "--method", "time", "--out", plan]
    assert main([str(x) for x in argv]) == 0
    capsys.readouterr()
    g = load_graph(str(TINY))
    a, data = read_plan_assignment(g, str(plan))
    c = load_cluster("dgx-a100-x2")
    assert cluster_from_dict(data["cluster"], "recorded") == c  # the topology is recorded
    assert main(["evaluate", str(TINY), str(plan), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"] == evaluate(g, c, a, placement=data["placement"]).objective
    assert main(["simulate", str(TINY), str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["period"] == pytest.approx(out["objective"])
    assert main(["evaluate", str(TINY), str(plan), "--memory", "10MB", "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)["violations"]
    assert "capacity is 1e+07 bytes" in bad[0]["message"]
