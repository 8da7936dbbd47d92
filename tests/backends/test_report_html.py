"""The HTML report's page (solver.backends.report_html): one stage-table row per block of the
plan, bars drawn to scale, every name escaped, the bound ladder as the plan records it, and
the timelines of the inference simulator and of the training schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html.parser import HTMLParser

import numpy as np
import pytest

from solver.backends.plan_report import (
    GanttRow,
    PipelineView,
    bound_ladder,
    graph_view,
    pipeline_report,
    sequence_runs,
    timeline_gantt,
)
from solver.backends.report_html import BAND_COLUMNS, BAR_WIDTH, Report, render_html
from solver.backends.simulate import simulate
from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.core.training import TrainingSpec
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import make_plan
from solver.pipeline.registry import solve

ODD_NAMES = ('<script>alert("x")</script>', "a&b", "q'uote>", "&lt;already escaped&gt;")


@dataclass(eq=False)
class Element:
    """A start tag, its attributes and the text inside it (nested text included)."""

    tag: str
    attrs: dict
    text: str = ""


@dataclass
class Page(HTMLParser):
    """Every element of a page, in document order, with its text."""

    elements: list[Element] = field(default_factory=list)
    open: list[Element] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(convert_charrefs=True)

    def handle_starttag(self, tag, attrs):
        el = Element(tag, dict(attrs))
        self.elements.append(el)
        if tag not in ("meta", "br", "img", "input", "link"):
            self.open.append(el)

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop().tag == tag:
                break

    def handle_data(self, data):
        for el in self.open:
            el.text += data

    def find(self, tag: str, **attrs) -> list[Element]:
        """Elements of ``tag`` whose attributes include ``attrs`` (class: one of its words)."""
        out = []
        for el in self.elements:
            if el.tag != tag:
                continue
            ok = True
            for key, want in attrs.items():
                key = key.rstrip("_").replace("_", "-")
                have = el.attrs.get(key)
                ok &= want in (have or "").split() if key == "class" else have == want
            if ok:
                out.append(el)
        return out


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def odd_graph(seed: int = 5) -> Graph:
    """Twelve nodes (a chain with side branches), random costs, names that need escaping."""
    rng = np.random.default_rng(seed)
    n = 12
    names = [f"v{i}" for i in range(n)]
    for i, odd in enumerate(ODD_NAMES):
        names[2 + 3 * i] = odd
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, 5), (3, 8), (6, 11)]
    params = [(f"w{i}", float(rng.uniform(1e6, 4e6)), [i]) for i in range(n)]
    return Graph.build(
        names,
        rng.uniform(1e-4, 1e-3, n),
        rng.uniform(1e5, 1e6, n),
        edges,
        params=params,
        name="<graph & co>",
    )


CLUSTER = Cluster(name="toy", devices=3, fast_memory=1e8, capacity=4e7, link_bandwidth=1e9)


@pytest.fixture(scope="module")
def inference():
    """A plan of the odd graph (its certified bounds included), its JSON, simulation and page."""
    return inference_case()


def inference_case():
    """(plan JSON, simulation, report, page) of the odd graph's plan on :data:`CLUSTER`."""
    g = odd_graph()
    plan = solve(g, CLUSTER, "time", SolveOptions(time_limit=5.0))
    data = plan.to_dict()
    order = [int(v) for v in g.topo_order]
    rows = tuple(GanttRow(b, b, f"stage {b}") for b in range(plan.k) if data["blocks"][b]["nodes"])
    sim = simulate(g, CLUSTER, plan.assignment, requests=6, keep_timeline=6)
    view = PipelineView(
        data=data,
        title=f"plan of {g.name}",
        blocks=data["blocks"],
        names=[g.names[v] for v in order],
        stages=[int(plan.assignment[v]) for v in order],
        capacities=[CLUSTER.device_capacity(d) for d in range(plan.k)],
        graph=graph_view(g, plan.assignment),
        gantt=timeline_gantt(sim.timeline, rows, "the first 6 requests"),
    )
    report = pipeline_report(view)
    return data, sim, report, render_html(report)


def test_the_stage_table_has_one_row_per_block_of_the_plan(inference):
    data, _, _, text = inference
    page = parse(text)
    assert len(page.find("table", id="stage-table")) == 1
    rows = page.find("tr", class_="stage")
    assert [int(r.attrs["data-stage"]) for r in rows] == [b["block"] for b in data["blocks"]]
    for row, block in zip(rows, data["blocks"], strict=True):
        cells = _cells_of(page, row)
        assert int(cells[2].text) == block["nodes"]  # stage, device, nodes, ...
    slowest = [r for r in rows if "bottleneck" in r.attrs["class"].split()]
    assert [int(r.attrs["data-stage"]) for r in slowest] == [data["bottleneck_block"]]


def _cells_of(page: Page, row: Element) -> list[Element]:
    """The td elements that follow ``row`` up to the next tr."""
    start = next(i for i, el in enumerate(page.elements) if el is row) + 1
    out = []
    for el in page.elements[start:]:
        if el.tag == "tr":
            break
        if el.tag == "td":
            out.append(el)
    return out


def test_time_and_memory_bars_are_drawn_to_scale(inference):
    data, _, _, text = inference
    page = parse(text)
    blocks = data["blocks"]
    longest = max(b["f"] for b in blocks)
    time = page.find("rect", class_="seg", data_panel="time")
    assert len(time) == 4 * len(blocks)  # io in, work, overflow, io out
    for seg in time:
        value, width = float(seg.attrs["data-value"]), float(seg.attrs["width"])
        assert width == pytest.approx(BAR_WIDTH * value / longest, rel=1e-12, abs=1e-12)
    for b in blocks:  # the parts of a stage add up to its f
        mine = [s for s in time if int(s.attrs["data-stage"]) == b["block"]]
        assert math.fsum(float(s.attrs["width"]) for s in mine) == pytest.approx(
            BAR_WIDTH * b["f"] / longest, rel=1e-9
        )
        names = [s.attrs["data-part"] for s in mine]
        assert names == ["io in", "work", "overflow", "io out"]
    memory = page.find("rect", class_="seg", data_panel="memory")
    scale = max([b["param_bytes"] + b["peak_bytes"] for b in blocks] + [CLUSTER.capacity])
    for seg in memory:
        value, width = float(seg.attrs["data-value"]), float(seg.attrs["width"])
        assert width == pytest.approx(BAR_WIDTH * value / scale, rel=1e-12, abs=1e-12)
    assert len(page.find("line", class_="capacity")) == len(blocks)


def test_names_from_the_plan_are_escaped(inference):
    _, _, _, text = inference
    page = parse(text)
    assert "<script>" not in text and "a&b" not in text
    assert not page.find("script")  # the page runs nothing
    titles = [el.text for el in page.find("title")]
    for name in ODD_NAMES:  # each name reads back exactly, in the graph's node titles
        assert any(t.startswith(f"{name} (stage ") for t in titles), name
    assert page.find("h1")[0].text.startswith("plan of <graph & co>")


def test_the_bound_ladder_is_the_plans(inference):
    data, _, report, text = inference
    page = parse(text)
    bound = data["stats"]["bound"]
    computed = bound["certified"]["bounds"]
    rungs = page.find("rect", class_="rung")
    assert len(rungs) == len(computed) + 1  # and the objective
    binding = [r for r in rungs if r.attrs["data-binding"] == "true"]
    assert len(binding) == 1
    assert binding[0].text.startswith(f"{bound['binding']}: ")
    assert float(binding[0].attrs["width"]) > 0
    table = page.find("table", id="bound-table")[0].text
    for name in [*computed, *bound["certified"].get("skipped", {})]:
        assert name in table
    assert report.ladder.objective == data["objective"]
    assert max(r.value for r in report.ladder.rungs) <= data["objective"]


def test_the_gantt_chart_is_the_simulators_timeline(inference):
    data, sim, _, text = inference
    page = parse(text)
    bars = page.find("rect", class_="bar")
    busy = [(d, kind, s, e) for d, _, kind, s, e in sim.timeline if e > s]
    assert len(bars) == len(busy)
    assert sorted(b.attrs["data-kind"] for b in bars) == sorted(kind for _, kind, _, _ in busy)
    end = max(e for *_, e in busy)
    for bar, (_, _, s, e) in zip(bars, busy, strict=True):
        assert float(bar.attrs["width"]) == pytest.approx(880.0 * (e - s) / end, rel=1e-9)


def test_the_sequence_strip_and_the_graph_colour_every_node_by_its_block(inference):
    data, _, report, text = inference
    page = parse(text)
    runs = page.find("rect", class_="run")
    assert sum(r.count for r in report.sequence) == data["graph"]["nodes"]
    assert len(runs) == len(report.sequence)
    nodes = page.find("circle", class_="node")
    assert sorted(int(c.attrs["data-stage"]) for c in nodes) == sorted(data["assignment"].values())


def test_sequence_runs_merge_consecutive_nodes_of_one_stage():
    runs = sequence_runs(["a", "b", "c", "d", "e"], [0, 0, 1, 0, 0])
    assert [(r.stage, r.count, r.first, r.last) for r in runs] == [
        (0, 2, "a", "b"),
        (1, 1, "c", "c"),
        (0, 2, "d", "e"),
    ]


def test_a_training_plan_shows_its_schedule_microbatch_by_microbatch():
    g = odd_graph(seed=9)
    a = np.repeat(np.arange(3), 4)[np.argsort(np.asarray(g.topo_order))]
    spec = TrainingSpec("1f1b", microbatches=5)
    roomy = Cluster(name="roomy", devices=3, fast_memory=1e8, link_bandwidth=1e9)
    plan = make_plan(g, roomy, a, "given", training=spec)
    data = plan.to_dict()
    view = PipelineView(data, "training", data["blocks"], list(g.names), a.tolist(), [None] * 3)
    report = pipeline_report(view)
    page = parse(render_html(report))
    assert report.kind == "training"
    rows = page.find("tr", class_="stage")
    assert [int(r.attrs["data-stage"]) for r in rows] == [
        s["block"] for s in data["training"]["stages"]
    ]
    bars = page.find("rect", class_="bar")
    assert len(bars) == 2 * 5 * 3  # a forward and a backward of every microbatch on every stage
    assert sorted(b.attrs["data-kind"] for b in bars) == ["B"] * 15 + ["F"] * 15
    time = page.find("rect", class_="seg", data_panel="time")
    longest = max(s["time"] for s in data["training"]["stages"])
    for seg in time:
        assert float(seg.attrs["width"]) == pytest.approx(
            BAR_WIDTH * float(seg.attrs["data-value"]) / longest, rel=1e-12, abs=1e-12
        )


def test_a_report_without_parts_leaves_their_sections_out():
    page = parse(render_html(Report("empty <plan>", "pipeline", "-", ())))
    assert not page.find("table", id="stage-table")
    assert not page.find("svg")
    assert page.find("title")[0].text == "empty <plan>"


def test_a_long_graph_is_drawn_in_bands_joined_by_stubs():
    n = 150  # a chain: depth 0..149, bands of BAND_COLUMNS columns
    g = Graph.build(
        [f"v{i}" for i in range(n)], np.ones(n), np.ones(n), [(i, i + 1) for i in range(n - 1)]
    )
    stage = np.arange(n) * 3 // n
    page = parse(render_html(Report("chain", "pipeline", "-", (), graph=graph_view(g, stage))))
    ys = sorted({float(c.attrs["cy"]) for c in page.find("circle", class_="node")})
    assert len(ys) == math.ceil(n / BAND_COLUMNS)
    stubs = [p for p in page.find("path") if p.attrs.get("stroke-dasharray")]
    assert len(stubs) == len(ys) - 1  # the chain edges from one band's end to the next's start
    cut = page.find("line", class_="cut") + [
        p for p in page.find("path") if "cut" in p.attrs.get("class", "").split()
    ]
    assert len(cut) == 2  # the two edges between the three stages


def test_a_bound_found_before_the_others_were_tried_binds_and_is_not_listed_as_skipped():
    data = {
        "objective": 2.0,
        "lower_bound": 1.9,
        "stats": {
            "bound": {
                "binding": "ideals",
                "value": 1.9,
                "certified": {
                    "binding": "chain",
                    "bounds": {"universal": 1.0, "chain": 1.5},
                    "skipped": {"ideals": "not needed", "weights": "not needed"},
                },
            }
        },
    }
    ladder = bound_ladder(data)
    assert [(r.name, r.value, r.binding) for r in ladder.rungs] == [
        ("universal", 1.0, False),
        ("chain", 1.5, False),
        ("ideals", 1.9, True),
    ]
    assert [s.label for s in ladder.skipped] == ["weights"]
