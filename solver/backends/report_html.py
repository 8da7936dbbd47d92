"""A plan as one self-contained HTML page (``mtpp report PLAN [MODEL] --html FILE``).

The page holds everything inline (CSS and SVG, no script, no network): the plan's facts, the
stage table, per-stage bars of time (io in, work, overflow, io out; forward and backward for
training plans) and memory, the graph (or the operator sequence) coloured by stage, the bound
ladder (each certified bound the plan records, the one that binds, its distance to the
objective) and the schedule's Gantt chart (the simulator's timeline for inference, the
training schedule's microbatches for training plans). A sharded (SPMD) plan shows its mesh and
its operator table with strategies instead of stages.

This module builds the page from typed records (:class:`Report` and its parts): pure string
building, every name from a plan escaped; it never prints and never reads files. The records
are read from a plan by :mod:`solver.backends.plan_report`.
"""

from __future__ import annotations

import colorsys
import html
import math
from dataclasses import dataclass, field

from solver import __version__
from solver.core.units import format_bytes, format_time

# ---------------------------------------------------------------------- records


@dataclass(frozen=True)
class Fact:
    """One labelled value in the plan's summary."""

    label: str
    value: str


@dataclass(frozen=True)
class Part:
    """One piece of a stacked bar: a named quantity (seconds or bytes)."""

    name: str
    value: float


@dataclass(frozen=True)
class StageRow:
    """One row of the stage table and of the per-stage bars (one block of the plan)."""

    stage: int
    device: str
    nodes: int
    time_parts: tuple[Part, ...]  # add up to the stage's time
    memory_parts: tuple[Part, ...]  # add up to the stage's memory per device
    capacity: float | None  # memory the stage may use per device (None: no limit)
    bottleneck: bool = False


@dataclass(frozen=True)
class Rung:
    """A lower bound on the objective; ``scope`` says which plans it covers."""

    name: str
    value: float
    binding: bool
    scope: str = "every plan"


@dataclass(frozen=True)
class Ladder:
    """The bounds a plan records, against its objective."""

    objective: float
    rungs: tuple[Rung, ...]
    skipped: tuple[Fact, ...] = ()  # bounds not computed, and why


@dataclass(frozen=True)
class SequenceRun:
    """Consecutive operators (in topological order) of one stage."""

    stage: int
    count: int
    first: str
    last: str


@dataclass(frozen=True)
class GraphNode:
    """A node of the drawn graph: its stage and its place (column = depth, row in column)."""

    name: str
    stage: int
    column: int
    row: int


@dataclass(frozen=True)
class GraphEdge:
    """An edge of the drawn graph, by node positions in :attr:`GraphView.nodes`."""

    source: int
    target: int


@dataclass(frozen=True)
class GraphView:
    """The graph drawn by depth; ``hidden`` nodes are too many to draw (the strip shows all)."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    hidden: int = 0


@dataclass(frozen=True)
class GanttBar:
    """One busy interval of a row (a device or a stage)."""

    row: int
    stage: int  # colours the bar
    kind: str  # recv | compute | send (inference); F | B (training)
    label: str
    start: float
    end: float


@dataclass(frozen=True)
class Gantt:
    """A timeline: rows top to bottom, bars, the kinds in legend order."""

    title: str
    rows: tuple[str, ...]
    bars: tuple[GanttBar, ...]
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class OperatorRow:
    """One operator of a sharded plan."""

    name: str
    op_type: str
    strategy: str
    local_shape: str
    compute: float
    communication: float


@dataclass(frozen=True)
class MeshView:
    """The device mesh of a sharded plan (or a stage of a joint plan)."""

    shape: tuple[int, ...]
    devices: tuple[int, ...]
    bandwidth: tuple[float, ...]


@dataclass(frozen=True)
class Report:
    """Everything the page shows; empty parts are left out of the page."""

    title: str
    kind: str  # pipeline | training | joint | spmd
    status: str
    facts: tuple[Fact, ...]
    stages: tuple[StageRow, ...] = ()
    ladder: Ladder | None = None
    sequence: tuple[SequenceRun, ...] = ()
    graph: GraphView | None = None
    gantt: Gantt | None = None
    operators: tuple[OperatorRow, ...] = ()
    mesh: MeshView | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------- colours and text
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
TRANSFER_COLOURS = {"recv": "#9aa5b1", "send": "#5f6b7a"}
KIND_NAMES = {
    "recv": "receive",
    "compute": "compute",
    "send": "send",
    "F": "forward",
    "B": "backward",
}


def stage_colour(stage: int) -> str:
    """The colour of a stage: ten distinct ones, then hues a golden angle apart."""
    if stage < len(PALETTE):
        return PALETTE[stage]
    hue = (stage * 0.381966) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, 0.55, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def darker(colour: str, share: float = 0.35) -> str:
    """``colour`` mixed with black (``share`` of black)."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c * (1 - share)):02x}" for c in rgb)


def esc(text: object) -> str:
    """Text from a plan made safe inside HTML or SVG (element text and quoted attributes)."""
    return html.escape(str(text), quote=True)


def num(x: float) -> str:
    """A coordinate in SVG: short, finite."""
    return f"{x:.2f}".rstrip("0").rstrip(".") if math.isfinite(x) else "0"


def exact(x: float) -> str:
    """A number written back exactly (the shortest repr of the float)."""
    return repr(float(x))


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.3g}%" if whole > 0 else "-"


def shown_time(x: float | None) -> str:
    return "-" if x is None else format_time(x)


def shown_bytes(x: float | None) -> str:
    return "-" if x is None else format_bytes(x)


# ---------------------------------------------------------------------- the page
CSS = """
:root { --ink: #1f2933; --muted: #616e7c; --line: #d9e2ec; --card: #ffffff; --bg: #f5f7fa; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { background: #243b53; color: #fff; padding: 18px 28px; }
header h1 { margin: 0; font-size: 22px; font-weight: 600; overflow-wrap: anywhere; }
header .sub { color: #bcccdc; margin-top: 4px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
  font-weight: 600; margin-left: 8px; vertical-align: 3px; background: #829ab1; color: #fff; }
.badge.OPTIMAL { background: #3f9142; } .badge.FEASIBLE { background: #de911d; }
.badge.INVALID, .badge.ERROR, .badge.INFEASIBLE { background: #ba2525; }
main { padding: 18px 28px 40px; max-width: 1240px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 14px 18px; margin-bottom: 16px; }
section h2 { font-size: 16px; margin: 0 0 10px; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 8px; }
.fact { border-left: 3px solid #829ab1; padding: 2px 10px; }
.fact .label { color: var(--muted); font-size: 12px; }
.fact .value { font-weight: 600; overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: right;
  white-space: nowrap; }
th { color: var(--muted); font-weight: 600; font-size: 12px; }
td.name, th.name { text-align: left; overflow-wrap: anywhere; white-space: normal; }
tr.bottleneck td { background: #fff3c4; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px;
  vertical-align: -1px; margin-right: 6px; }
figure { margin: 0; }
figcaption { color: var(--muted); font-size: 12px; margin-top: 6px; }
svg { display: block; width: 100%; height: auto; }
svg.opbar { display: inline-block; width: 170px; }
svg text { font: 11px system-ui, -apple-system, "DejaVu Sans", sans-serif; fill: var(--ink); }
svg .muted { fill: var(--muted); }
svg text.on { fill: #fff; font-weight: 600; }
.notes { color: var(--muted); }
footer { color: var(--muted); font-size: 12px; padding: 0 28px 24px; }
"""


def render_html(report: Report) -> str:
    """The whole page for ``report``: one string, no external resource."""
    sections = [
        _facts_section(report),
        _stage_section(report),
        _bars_section(report),
        _graph_section(report),
        _ladder_section(report),
        _gantt_section(report),
        _mesh_section(report),
        _operator_section(report),
        _notes_section(report),
    ]
    badge = f'<span class="badge {esc(report.status)}">{esc(report.status)}</span>'
    badge = "" if report.status == "-" else badge
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(report.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<header><h1>{esc(report.title)}{badge}</h1>"
        f'<div class="sub">{esc(_kind_words(report.kind))}</div></header>\n<main>\n'
        + "".join(s for s in sections if s)
        + f"</main>\n<footer>written by mtpp {esc(__version__)}; self-contained: no script, "
        "no network</footer>\n</body>\n</html>\n"
    )


def _kind_words(kind: str) -> str:
    return {
        "pipeline": "pipeline plan (inference): blocks of operators on devices",
        "training": "pipeline plan (training): stages run microbatches forward and backward",
        "joint": "joint plan: pipeline stages, each sharded on its sub-mesh",
        "spmd": "sharded (SPMD) plan: one strategy per operator on one mesh",
    }.get(kind, kind)


def _section(ident: str, title: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{esc(title)}</h2>\n{body}</section>\n'


def _facts_section(report: Report) -> str:
    cells = "".join(
        f'<div class="fact"><div class="label">{esc(f.label)}</div>'
        f'<div class="value">{esc(f.value)}</div></div>'
        for f in report.facts
    )
    return _section("summary", "Summary", f'<div class="facts">{cells}</div>\n')


def _stage_section(report: Report) -> str:
    rows = report.stages
    if not rows:
        return ""
    time_names = [p.name for p in rows[0].time_parts]
    memory_names = [p.name for p in rows[0].memory_parts] if len(rows[0].memory_parts) > 1 else []
    head = "".join(f"<th>{esc(n)}</th>" for n in ["nodes", *time_names, "time"])
    head += "".join(f"<th>{esc(n)}</th>" for n in [*memory_names, "memory", "capacity"])
    body = []
    for r in rows:
        cells = [str(r.nodes)]
        cells += [format_time(p.value) for p in r.time_parts]
        cells.append(format_time(_total(r.time_parts)))
        cells += [format_bytes(p.value) for p in r.memory_parts] if memory_names else []
        cells += [format_bytes(_total(r.memory_parts)), shown_bytes(r.capacity)]
        swatch = f'<span class="swatch" style="background:{stage_colour(r.stage)}"></span>'
        mark = " (slowest)" if r.bottleneck else ""
        body.append(
            f'<tr class="stage{" bottleneck" if r.bottleneck else ""}" data-stage="{r.stage}">'
            f'<td class="name">{swatch}{r.stage}{mark}</td><td>{esc(r.device)}</td>'
            + "".join(f"<td>{esc(c)}</td>" for c in cells)
            + "</tr>\n"
        )
    table = (
        f'<table id="stage-table"><thead><tr><th class="name">stage</th><th>device</th>{head}'
        f"</tr></thead>\n<tbody>\n{''.join(body)}</tbody></table>\n"
    )
    return _section("stages", "Stages", table)


def _total(parts: tuple[Part, ...]) -> float:
    return math.fsum(p.value for p in parts)


BAR_WIDTH = 400.0  # pixels of the longest bar in each of the two panels
TIME_TITLES = {"training": "time per microbatch", "pipeline": "time per request"}
TIME_TITLES["joint"] = TIME_TITLES["pipeline"]


def _bars_section(report: Report) -> str:
    rows = report.stages
    if not rows:
        return ""
    time_scale = max((_total(r.time_parts) for r in rows), default=0.0)
    memory_scale = max(
        [_total(r.memory_parts) for r in rows] + [r.capacity or 0.0 for r in rows], default=0.0
    )
    row_h, top, left = 26, 34, 70
    height = top + row_h * len(rows) + 40
    out = [
        f'<svg id="stage-bars" viewBox="0 0 1060 {height}" role="img" '
        'aria-label="per-stage time and memory">',
        f'<text x="{left}" y="16" font-weight="600">{TIME_TITLES.get(report.kind, "time")} (scale: '
        f"{esc(format_time(time_scale))})</text>",
        f'<text x="{left + BAR_WIDTH + 90}" y="16" font-weight="600">memory per device '
        f"(scale: {esc(format_bytes(memory_scale))})</text>",
    ]
    for i, r in enumerate(rows):
        y = top + i * row_h
        out.append(f'<text x="8" y="{y + 14}">stage {r.stage}</text>')
        out += _stacked_bar(r, r.time_parts, "time", left, y, time_scale)
        out += _stacked_bar(r, r.memory_parts, "memory", left + BAR_WIDTH + 90, y, memory_scale)
        if r.capacity is not None and memory_scale > 0:
            x = left + BAR_WIDTH + 90 + BAR_WIDTH * r.capacity / memory_scale
            out.append(
                f'<line class="capacity" x1="{num(x)}" x2="{num(x)}" y1="{y - 2}" '
                f'y2="{y + 20}" stroke="#ba2525" stroke-width="2"><title>capacity '
                f"{esc(format_bytes(r.capacity))}</title></line>"
            )
    out.append(_bar_legend(rows[0], left, top + row_h * len(rows) + 14))
    out.append("</svg>")
    caption = (
        "Bars are drawn to scale within each panel; "
        + (
            "the slowest stage's time counts once per microbatch. "
            if report.kind == "training"
            else "the slowest stage sets the period. "
        )
        + "Red lines mark the memory a stage may use per device."
    )
    return _section("costs", "Per-stage costs", _figure("\n".join(out), caption))


PART_SHADES = (0.0, 0.35, -0.45, 0.6)  # shades of the stage colour: 1st, 2nd, ... own part
TRANSFER_PARTS = {"io in": "recv", "io out": "send"}  # drawn in the timeline's transfer colours


def _shade(colour: str, index: int) -> str:
    share = PART_SHADES[index % len(PART_SHADES)]
    if share >= 0:
        return darker(colour, share)
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c + (255 - c) * -share):02x}" for c in rgb)


def _part_colours(parts: tuple[Part, ...], colour: str) -> list[str]:
    """Transfers in grey, the stage's own parts in shades of its colour (the first in it)."""
    out, own = [], 0
    for p in parts:
        if p.name in TRANSFER_PARTS:
            out.append(TRANSFER_COLOURS[TRANSFER_PARTS[p.name]])
        else:
            out.append(_shade(colour, own))
            own += 1
    return out


def _stacked_bar(
    row: StageRow, parts: tuple[Part, ...], panel: str, x0: float, y: float, scale: float
) -> list[str]:
    out, x = [], x0
    out.append(
        f'<rect x="{x0}" y="{y}" width="{BAR_WIDTH}" height="18" fill="#f0f4f8" rx="2"></rect>'
    )
    colours = _part_colours(parts, stage_colour(row.stage))
    for p, fill in zip(parts, colours, strict=True):
        w = BAR_WIDTH * p.value / scale if scale > 0 else 0.0
        out.append(
            f'<rect class="seg" data-panel="{panel}" data-stage="{row.stage}" '
            f'data-part="{esc(p.name)}" data-value="{exact(p.value)}" x="{num(x)}" y="{y}" '
            f'width="{exact(w)}" height="18" fill="{fill}">'
            f"<title>stage {row.stage} {esc(p.name)}: {esc(_value_text(panel, p.value))}"
            "</title></rect>"
        )
        x += w
    total = _value_text(panel, _total(parts))
    out.append(f'<text x="{num(x + 5)}" y="{y + 13}" class="muted">{esc(total)}</text>')
    return out


def _value_text(panel: str, value: float) -> str:
    return format_time(value) if panel == "time" else format_bytes(value)


def _bar_legend(row: StageRow, left: float, y: float) -> str:
    """The parts' names under each panel (stage 0's colour stands for every stage's)."""
    items = []
    for x, parts in ((left, row.time_parts), (left + BAR_WIDTH + 90, row.memory_parts)):
        for p, fill in zip(parts, _part_colours(parts, PALETTE[0]), strict=True):
            items.append(
                f'<rect x="{num(x)}" y="{y - 9}" width="11" height="11" fill="{fill}"></rect>'
                f'<text x="{num(x + 15)}" y="{y}">{esc(p.name)}</text>'
            )
            x += 26 + 6.5 * len(p.name)
    return "".join(items)


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}\n<figcaption>{esc(caption)}</figcaption></figure>\n"


# ---------------------------------------------------------------------- graph and sequence
def _graph_section(report: Report) -> str:
    if not report.sequence and report.graph is None:
        return ""
    parts = []
    if report.sequence:
        parts.append(_sequence_svg(report.sequence))
    if report.graph is not None:
        parts.append(_graph_svg(report.graph))
    caption = (
        "Top: every operator in topological order, coloured by its stage (runs of one stage "
        "merged). "
        + (
            "Below: the graph, left to right by depth; dark edges cross stages (their tensors "
            "are sent), arcs skip columns."
            if report.graph is not None
            else ""
        )
    )
    legend = _stage_legend(sorted({r.stage for r in report.sequence}))
    return _section("graph", "The graph by stage", legend + _figure("\n".join(parts), caption))


def _stage_legend(stages: list[int]) -> str:
    return (
        "<div>"
        + " ".join(
            f'<span class="swatch" style="background:{stage_colour(s)}"></span>stage {s}&nbsp;'
            for s in stages
        )
        + "</div>\n"
    )


def _sequence_svg(runs: tuple[SequenceRun, ...]) -> str:
    total = sum(r.count for r in runs) or 1
    width, x = 1040.0, 10.0
    out = ['<svg id="sequence-strip" viewBox="0 0 1060 58" role="img" aria-label="operators">']
    for r in runs:
        w = width * r.count / total
        what = esc(r.first if r.count == 1 else f"{r.first} ... {r.last}")
        out.append(
            f'<rect class="run" data-stage="{r.stage}" x="{num(x)}" y="8" width="{exact(w)}" '
            f'height="30" fill="{stage_colour(r.stage)}"><title>stage {r.stage}: {r.count} '
            f"operator{'s' if r.count > 1 else ''}, {what}</title></rect>"
        )
        if w > 28:
            out.append(f'<text x="{num(x + 4)}" y="27" class="on">{r.stage}</text>')
        x += w
    out.append('<text x="10" y="53" class="muted">first operator</text>')
    out.append(f'<text x="1050" y="53" class="muted" text-anchor="end">last ({total})</text>')
    out.append("</svg>")
    return "\n".join(out)


@dataclass(frozen=True)
class _Layout:
    """Where the graph's nodes go: columns of depth, wrapped into bands of ``band`` columns
    stacked top to bottom; ``top`` is the headroom of the arcs above each band's first row."""

    dx: float
    dy: float
    radius: float
    top: float
    band: int
    band_height: float

    def at(self, n: GraphNode) -> tuple[float, float]:
        band, column = divmod(n.column, self.band)
        return 20 + self.dx * (column + 0.5), (
            band * self.band_height + self.top + self.dy * (n.row + 0.5)
        )

    def same_band(self, a: GraphNode, b: GraphNode) -> bool:
        return a.column // self.band == b.column // self.band


def _arc(span: int) -> float:
    """Height of the arc of an edge that skips ``span`` columns along a row."""
    return min(ARC_MOST, 6 + 4 * math.log2(span)) if span > 1 else 0.0


ARC_MOST = 40.0  # pixels: the highest arc of an edge that skips columns along a row
BAND_COLUMNS = 64  # columns of depth per band of the drawing


def _graph_layout(view: GraphView) -> _Layout:
    columns = max((n.column for n in view.nodes), default=0) + 1
    rows = max((n.row for n in view.nodes), default=0) + 1
    band = min(columns, BAND_COLUMNS)
    dx = 1020.0 / band
    dy = max(8.0, min(36.0, 400.0 / rows))
    arcs = [
        _arc(abs(b.column - a.column))
        for a, b in ((view.nodes[e.source], view.nodes[e.target]) for e in view.edges)
        if a.row == b.row == 0 and a.column // band == b.column // band
    ]
    top = 10 + max(arcs, default=0.0)
    radius = max(2.5, min(7.0, min(dx, dy) / 3))
    return _Layout(dx, dy, radius, top, band, top + dy * rows + 14)


def _graph_svg(view: GraphView) -> str:
    layout = _graph_layout(view)
    bands = max((n.column for n in view.nodes), default=0) // layout.band + 1
    width, height = 40 + layout.dx * layout.band, layout.band_height * bands
    out = [
        f'<svg id="graph-figure" viewBox="0 0 {num(width)} {num(height)}" role="img" '
        'aria-label="graph coloured by stage">'
    ]
    out += [_edge_svg(view, e, layout) for e in view.edges]
    for n in view.nodes:
        x, y = layout.at(n)
        out.append(
            f'<circle class="node" data-stage="{n.stage}" cx="{num(x)}" cy="{num(y)}" '
            f'r="{num(layout.radius)}" fill="{stage_colour(n.stage)}" stroke="#fff" '
            f'stroke-width="1"><title>{esc(n.name)} (stage {n.stage})</title></circle>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _edge_svg(view: GraphView, e: GraphEdge, layout: _Layout) -> str:
    """An edge: straight, an arc above the row when it skips columns along one row, or two
    dashed stubs when it continues in a later band; dark when it crosses stages (its tensor is
    sent)."""
    a, b = view.nodes[e.source], view.nodes[e.target]
    (x1, y1), (x2, y2) = layout.at(a), layout.at(b)
    cut = a.stage != b.stage
    style = 'stroke="#52606d" stroke-width="1.4"' if cut else 'stroke="#bcccdc" stroke-width="1"'
    kind = f'class="edge{" cut" if cut else ""}"'
    if not layout.same_band(a, b):
        stub = 0.6 * layout.dx
        return (
            f'<path {kind} d="M{num(x1)},{num(y1)} h{num(stub)} M{num(x2 - stub)},{num(y2)} '
            f'h{num(stub)}" fill="none" stroke-dasharray="2,2" {style}></path>'
        )
    lift = _arc(abs(b.column - a.column)) if a.row == b.row else 0.0
    if lift:
        mid = (x1 + x2) / 2
        return (
            f'<path {kind} d="M{num(x1)},{num(y1)} Q{num(mid)},{num(y1 - 2 * lift)} '
            f'{num(x2)},{num(y2)}" fill="none" {style}></path>'
        )
    return (
        f'<line {kind} x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" {style}></line>'
    )


# ---------------------------------------------------------------------- bound ladder
def _ladder_section(report: Report) -> str:
    ladder = report.ladder
    if ladder is None:
        return ""
    objective = ladder.objective
    rungs = sorted(ladder.rungs, key=lambda r: r.value)
    scale = max([objective, *(r.value for r in rungs)]) or 1.0
    row_h, left, width = 24, 250, 560.0
    height = 20 + row_h * (len(rungs) + 1) + 10
    out = [f'<svg id="bound-ladder" viewBox="0 0 1060 {height}" role="img" aria-label="bounds">']
    for i, r in enumerate([*rungs, Rung("objective (the plan)", objective, False, "")]):
        y = 14 + i * row_h
        is_objective = i == len(rungs)
        fill = "#243b53" if is_objective else ("#3f9142" if r.binding else "#9fb3c8")
        w = width * r.value / scale
        gap = "" if is_objective else f", {percent(objective - r.value, objective)} below"
        label = r.name + (" (binds)" if r.binding else "")
        weight = ' font-weight="600"' if r.binding or is_objective else ""
        out.append(
            f'<text x="{left - 8}" y="{y + 13}" text-anchor="end"{weight}>{esc(label)}</text>'
            f'<rect class="rung" data-binding="{str(r.binding).lower()}" x="{left}" y="{y}" '
            f'width="{exact(w)}" height="17" fill="{fill}" rx="2"><title>{esc(r.name)}: '
            f"{esc(format_time(r.value))} ({esc(r.scope)})</title></rect>"
            f'<text x="{num(left + w + 6)}" y="{y + 13}" class="muted">'
            f"{esc(format_time(r.value) + gap)}</text>"
        )
    out.append("</svg>")
    table = _ladder_table(ladder, rungs)
    caption = (
        "Each bar is a certified lower bound on the objective (seconds per request, or per "
        "iteration for training plans), drawn to scale; the binding one is green."
    )
    return _section("bounds", "Bound ladder", _figure("\n".join(out), caption) + table)


def _ladder_table(ladder: Ladder, rungs: list[Rung]) -> str:
    rows = "".join(
        f'<tr><td class="name">{esc(r.name)}{" (binds)" if r.binding else ""}</td>'
        f"<td>{esc(format_time(r.value))}</td>"
        f"<td>{esc(percent(ladder.objective - r.value, ladder.objective))}</td>"
        f'<td class="name">{esc(r.scope)}</td></tr>'
        for r in reversed(rungs)
    )
    rows += "".join(
        f'<tr class="skipped"><td class="name">{esc(s.label)}</td><td>-</td><td>-</td>'
        f'<td class="name">not computed: {esc(s.value)}</td></tr>'
        for s in ladder.skipped
    )
    return (
        '<table id="bound-table"><thead><tr><th class="name">bound</th><th>value</th>'
        '<th>below the objective</th><th class="name">covers</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>\n"
    )


# ---------------------------------------------------------------------- Gantt chart
def _gantt_section(report: Report) -> str:
    g = report.gantt
    if g is None:
        return ""
    end = max((b.end for b in g.bars), default=0.0) or 1.0
    row_h, left, width = 26, 150, 880.0
    height = 20 + row_h * len(g.rows) + 44
    out = [f'<svg id="gantt" viewBox="0 0 1060 {height}" role="img" aria-label="timeline">']
    for i, name in enumerate(g.rows):
        out.append(f'<text x="8" y="{20 + i * row_h + 14}">{esc(name)}</text>')
    for b in g.bars:
        x, w = left + width * b.start / end, width * (b.end - b.start) / end
        y = 20 + b.row * row_h
        out.append(
            f'<rect class="bar" data-kind="{esc(b.kind)}" x="{num(x)}" y="{y}" width="{exact(w)}" '
            f'height="20" fill="{_kind_colour(b.kind, b.stage)}" stroke="#fff" '
            f'stroke-width="0.5"><title>{esc(KIND_NAMES.get(b.kind, b.kind))} {esc(b.label)}: '
            f"{esc(format_time(b.start))} to {esc(format_time(b.end))}</title></rect>"
        )
        if w > 7 * len(b.label) + 4 and b.kind not in TRANSFER_COLOURS:
            out.append(
                f'<text x="{num(x + w / 2)}" y="{y + 14}" text-anchor="middle" class="on">'
                f"{esc(b.label)}</text>"
            )
    axis_y = 20 + row_h * len(g.rows) + 12
    out += _time_axis(left, width, end, axis_y)
    out.append(_gantt_legend(g.kinds, left, axis_y + 26))
    out.append("</svg>")
    return _section("schedule", "Schedule", _figure("\n".join(out), g.title))


def _kind_colour(kind: str, stage: int) -> str:
    if kind in TRANSFER_COLOURS:
        return TRANSFER_COLOURS[kind]
    return darker(stage_colour(stage)) if kind == "B" else stage_colour(stage)


def _time_axis(left: float, width: float, end: float, y: float) -> list[str]:
    out = [f'<line x1="{left}" x2="{left + width}" y1="{y - 8}" y2="{y - 8}" stroke="#9fb3c8">']
    out[0] += "</line>"
    for i in range(6):
        x = left + width * i / 5
        out.append(
            f'<text x="{num(x)}" y="{y + 4}" text-anchor="middle" class="muted">'
            f"{esc(format_time(end * i / 5))}</text>"
        )
    return out


def _gantt_legend(kinds: tuple[str, ...], left: float, y: float) -> str:
    items, x = [], left
    for kind in kinds:
        colour = _kind_colour(kind, 0) if kind in TRANSFER_COLOURS or kind == "B" else PALETTE[0]
        name = KIND_NAMES.get(kind, kind)
        items.append(
            f'<rect x="{num(x)}" y="{y - 9}" width="11" height="11" fill="{colour}"></rect>'
            f'<text x="{num(x + 15)}" y="{y}">{esc(name)}</text>'
        )
        x += 30 + 7 * len(name)
    items.append(f'<text x="{num(x + 10)}" y="{y}" class="muted">(stage colours as above)</text>')
    return "".join(items)


# ---------------------------------------------------------------------- sharded plans
def _mesh_section(report: Report) -> str:
    mesh = report.mesh
    if mesh is None:
        return ""
    cols = mesh.shape[-1] if mesh.shape else 1
    rows = max(1, len(mesh.devices) // max(cols, 1))
    cell = 44
    out = [
        f'<svg id="mesh-figure" viewBox="0 0 {20 + cell * cols} {20 + cell * rows}" '
        f'style="max-width:{20 + cell * cols}px" role="img" aria-label="mesh">'
    ]
    for i, d in enumerate(mesh.devices):
        x, y = 10 + cell * (i % cols), 10 + cell * (i // cols)
        out.append(
            f'<rect x="{x}" y="{y}" width="{cell - 6}" height="{cell - 6}" rx="4" '
            f'fill="{PALETTE[0]}"></rect><text x="{x + (cell - 6) / 2}" y="{y + 24}" '
            f'text-anchor="middle" class="on">{d}</text>'
        )
    out.append("</svg>")
    bandwidth = ", ".join(f"{b / 1e9:.3g} GB/s" for b in mesh.bandwidth)
    caption = (
        f"mesh {' x '.join(map(str, mesh.shape))} of {len(mesh.devices)} devices; link "
        f"bandwidth per mesh axis: {bandwidth or '-'}"
    )
    return _section("mesh", "Mesh", _figure("\n".join(out), caption))


def _operator_section(report: Report) -> str:
    ops = report.operators
    if not ops:
        return ""
    scale = max((o.compute + o.communication for o in ops), default=0.0) or 1.0
    body = []
    for o in ops:
        wc, wm = 160 * o.compute / scale, 160 * o.communication / scale
        bar = (
            '<svg class="opbar" width="170" height="12" viewBox="0 0 170 12">'
            f'<rect x="0" y="1" width="{exact(wc)}" height="10" fill="{PALETTE[0]}"></rect>'
            f'<rect x="{num(wc)}" y="1" width="{exact(wm)}" height="10" fill="{PALETTE[3]}"></rect>'
            "</svg>"
        )
        body.append(
            f'<tr class="operator"><td class="name">{esc(o.name)}</td><td class="name">'
            f'{esc(o.op_type)}</td><td class="name"><code>{esc(o.strategy)}</code></td>'
            f"<td>{esc(o.local_shape)}</td><td>{esc(format_time(o.compute))}</td>"
            f"<td>{esc(format_time(o.communication) if o.communication else '-')}</td>"
            f"<td>{bar}</td></tr>\n"
        )
    table = (
        '<table id="operator-table"><thead><tr><th class="name">operator</th>'
        '<th class="name">op</th><th class="name">strategy</th><th>local output shape</th>'
        "<th>compute</th><th>communication</th>"
        f'<th><span class="swatch" style="background:{PALETTE[0]}"></span>compute '
        f'<span class="swatch" style="background:{PALETTE[3]}"></span>communication</th>'
        "</tr></thead>"
        f"\n<tbody>\n{''.join(body)}</tbody></table>\n"
    )
    return _section("operators", "Operators", table)


def _notes_section(report: Report) -> str:
    if not report.notes:
        return ""
    items = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    return _section("notes", "Notes", f'<ul class="notes">{items}</ul>\n')
