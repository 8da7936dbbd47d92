"""Reports of an experiment: proven optima per instance, ratios and gaps, results.csv,
summary.md and the PNG plots.

The "exact optimum" of an instance (graph, cluster, k) comes only from a proof: an OPTIMAL
record, the benchmark file's known optimum (at the file's k on the cluster the file states), or
a plan whose objective meets another record's certified lower bound. The report says when the
only proof comes from the method being compared.

Joint runs (pipeline vs sharding vs joint plans) get their own table and plot
(joint_vs_spaces.png): each space's bound holds over that space only, so no joint record proves
an optimum; the bound valid for every joint plan (``universal_bound``) is the instance's bound.

Training runs (the ``training:`` key) get a table of each practitioners' split's ratio to the
certified optimum of its instance (graph, cluster, k, schedule, microbatches, virtual stages,
state factor, memory limit) and a plot of it against the microbatches (training_splits.png).

One path for every kind of run: each record carries the result contract (status, objective,
lower bound), and :data:`RECORD_KINDS` says, per kind (the ``kind`` of the run's description),
what names its instance, which of its bound and status hold over the whole instance, whether a
plan meeting another record's bound proves the optimum, and its section and plot.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from solver.core.files import atomic_file
from solver.core.result import ERROR, FEASIBLE, OPTIMAL, OPTIMALITY_TOL
from solver.experiments import benchdata


# ---------------------------------------------------------------------- kinds of records
@dataclass(frozen=True)
class Scope:
    """What of a record holds over its whole instance: the bound (None: none does) and
    whether its OPTIMAL status does."""

    bound: float | None
    status_holds: bool


@dataclass(frozen=True)
class RecordKind:
    """How the reports read the records of one kind of run."""

    instance: tuple[str, ...]  # the record fields that name an instance (with the kind)
    scope: Callable[[dict], Scope]  # what of a record holds over the whole instance
    bounds_prove: bool  # a plan that meets another record's bound proves the optimum
    section: Callable[[list[dict]], str] | None = None  # its part of summary.md (pipeline:
    # the summary itself, see write_reports)
    plot: Callable[[list[dict], Path], None] | None = None


def record_kind(r: dict) -> str:
    """The kind of a run's record: pipeline (no ``kind``), shard, joint or training."""
    return r.get("kind") or "pipeline"


def is_shard(r: dict) -> bool:
    """A record of an operator-sharding run (the experiment's ``shard:`` key)."""
    return record_kind(r) == "shard"


def is_joint(r: dict) -> bool:
    """A record of a joint-plan run (the experiment's ``joint:`` key)."""
    return record_kind(r) == "joint"


def _whole_scope(r: dict) -> Scope:
    """A pipeline plan: its bound and status speak of every plan of the instance."""
    return Scope(r.get("lower_bound"), True)


def _shard_scope(r: dict) -> Scope:
    """A sharding run with a strategy file solved a restricted problem: its plan is a plan of
    the instance, but its bound and OPTIMAL status hold for the restricted problem only."""
    if (r.get("options") or {}).get("config"):
        return Scope(None, False)
    return Scope(r.get("lower_bound"), True)


def _joint_scope(r: dict) -> Scope:
    """Each space's bound and OPTIMAL hold over that space only: of the instance (every joint
    plan) only the universal bound is known."""
    return Scope(r.get("universal_bound"), False)


# ---------------------------------------------------------------------- exact optima
def _instance(r: dict) -> tuple:
    """The instance of a record: pipeline (graph, cluster, k); shard (model, cluster, mesh,
    memory limit); joint (model, cluster with all its devices, memory limit); training (graph,
    cluster, k, schedule, microbatches, virtual stages, state factor, memory limit)."""
    kind = record_kind(r)
    return (kind, *(r.get(name) for name in RECORD_KINDS[kind].instance))


def _known(r: dict) -> float | None:
    """The benchmark file's optimum, only for its own graph at its k on its own cluster."""
    src = r.get("source") or {}
    if "dnnpart" not in src or r.get("cluster_spec") != "file":
        return None
    return benchdata.known_optimum(src["dnnpart"], r.get("nodes"), r.get("k"))


def _feasible(r: dict) -> bool:
    return r.get("status") in (OPTIMAL, FEASIBLE) and r.get("objective") is not None


def prove_optimum(recs: list[dict], optimal_only: bool = False) -> dict:
    """The proven optimum of one instance from its records: value (or None), the proofs (each
    the set of methods it rests on), their descriptions, and conflicts (proofs that disagree).
    ``optimal_only``: only OPTIMAL records prove (sharding runs); bounds still flag conflicts."""
    tol = OPTIMALITY_TOL
    feas = [r for r in recs if _feasible(r)]
    bounds = [r for r in recs if r.get("lower_bound") is not None and r.get("status") != ERROR]
    optimal = [r for r in feas if r["status"] == OPTIMAL]
    known = next((k for k in map(_known, recs) if k is not None), None)
    conflicts = []
    best = min(feas, key=lambda r: r["objective"], default=None)
    top = max(bounds, key=lambda r: r["lower_bound"], default=None)
    if best and top and top["lower_bound"] > best["objective"] * (1 + tol):
        conflicts.append(
            f"{top['method']}'s lower bound {top['lower_bound']:.10g} exceeds "
            f"{best['method']}'s objective {best['objective']:.10g}"
        )
    values = [(r["objective"], r["method"]) for r in optimal]
    if known is not None:
        values.append((known, "the benchmark's known optimum"))
    for v, who in values:
        if best and best["objective"] < v * (1 - tol):
            conflicts.append(f"{best['method']} found {best['objective']:.10g} < {who} {v:.10g}")
        if top and top["lower_bound"] > v * (1 + tol):
            conflicts.append(f"{top['method']}'s bound {top['lower_bound']:.10g} > {who} {v:.10g}")
    # each proof is the set of methods whose claims it rests on (plans are re-evaluated, bounds
    # and OPTIMAL statuses are claims); a row's method is checked independently when some
    # proof does not rest on it
    proof = {"value": None, "proofs": [], "kinds": [], "conflicts": conflicts}
    if conflicts:
        return proof
    if optimal:
        proof["value"] = min(r["objective"] for r in optimal)
        proof["proofs"] += [{name} for name in {r["method_name"] for r in optimal}]
        proof["kinds"].append("OPTIMAL: " + ", ".join(sorted({r["method"] for r in optimal})))
    if known is not None:
        proof["value"] = proof["value"] if proof["value"] is not None else known
        proof["proofs"].append(set())
        proof["kinds"].append("known optimum of the benchmark file")
    if not optimal_only and best and top and top["lower_bound"] >= best["objective"] * (1 - tol):
        # a plan whose objective meets a certified lower bound is optimal; the plan itself is
        # checked by the evaluator, so the proof rests on the bound's method alone
        rests_on = {top["method_name"]}
        if not any(p <= rests_on for p in proof["proofs"]):  # only when it is new evidence
            if proof["value"] is None:
                proof["value"] = best["objective"]
            proof["proofs"].append(rests_on)
            proof["kinds"].append(f"bound of {top['method']} meets plan of {best['method']}")
    return proof


def _evidence(r: dict) -> dict:
    """What a record proves about its instance: its plan, and of its bound and OPTIMAL status
    what holds over the whole instance (:attr:`RecordKind.scope`)."""
    scope = RECORD_KINDS[record_kind(r)].scope(r)
    status = r.get("status")
    if status == OPTIMAL and not scope.status_holds:
        status = FEASIBLE
    return dict(r, lower_bound=scope.bound, status=status)


def enrich(records: list[dict]) -> list[dict]:
    """Add gap to the best proven bound, the proven optimum, its source, and the ratio."""
    by_inst: dict[tuple, list[dict]] = {}
    for r in records:
        by_inst.setdefault(_instance(r), []).append(_evidence(r))
    proofs = {
        key: prove_optimum(recs, not RECORD_KINDS[key[0]].bounds_prove)
        for key, recs in by_inst.items()
    }
    out = []
    for r in records:
        key = _instance(r)
        proof = proofs[key]
        bounds = [x["lower_bound"] for x in by_inst[key] if x.get("lower_bound") is not None]
        best_lb = max(bounds, default=None)
        obj = r.get("objective") if _feasible(r) else None
        row = dict(r)
        row["best_bound"] = best_lb
        row["gap_to_best_bound"] = (
            (obj - best_lb) / obj if obj and best_lb is not None and obj > 0 else None
        )
        exact = proof["value"]
        row["exact_optimum"] = exact
        row["ratio_to_exact"] = obj / exact if obj and exact else None
        row["exact_source"] = (
            "; ".join(proof["kinds"])
            if exact is not None
            else ("CONFLICT: " + "; ".join(proof["conflicts"]) if proof["conflicts"] else None)
        )
        row["exact_self_only"] = exact is not None and all(
            r.get("method_name") in p for p in proof["proofs"]
        )
        out.append(row)
    return out


SPLITS = ("uniform", "fewer-at-ends", "by-parameters")  # solver.pipeline.training.splits.SPLITS
TRAINING_SETTING = ("schedule", "microbatches", "virtual_stages", "optimizer_state")

CSV_COLUMNS = [
    "graph",
    "nodes",
    "k",
    "cluster",
    "method",
    "seed",
    "repeat",
    "objective",
    "lower_bound",
    "gap_to_best_bound",
    "exact_optimum",
    "ratio_to_exact",
    "exact_source",
    "exact_self_only",
    "wall_seconds",
    "status",
    "error",
    "id",
    "mesh",
    "memory",
    "space",
    "gap",
    "universal_bound",
    "sim_period",
    "sim_disagrees",
    *TRAINING_SETTING,
]


def write_reports(records: list[dict], out: Path, name: str = "experiment") -> None:
    """results.csv, summary.md and the PNG plots (each written atomically)."""
    rows = enrich(records)
    with atomic_file(out / "results.csv", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c) for c in CSV_COLUMNS})
    by_kind = {kind: [r for r in rows if record_kind(r) == kind] for kind in RECORD_KINDS}
    pipeline = by_kind.pop("pipeline")
    others = {kind: part for kind, part in by_kind.items() if part}
    # the pipeline summary is the page (also for an experiment without runs)
    text = summary_markdown(pipeline, name) if pipeline or not others else f"# {name}\n"
    for kind, part in others.items():
        text += "\n" + RECORD_KINDS[kind].section(part)
        if RECORD_KINDS[kind].plot is not None:
            RECORD_KINDS[kind].plot(part, out)
    with atomic_file(out / "summary.md") as fh:
        fh.write(text)
    plot_results(pipeline, out)


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def summary_markdown(rows: list[dict], name: str) -> str:
    """The heuristic-versus-exact table: geometric-mean ratio to the proven optimum per method
    and k, with how many instances it covers and how many of those only the method itself
    proved, the mean wall time, the statuses, and any conflicting proofs."""
    methods = sorted({r["method"] for r in rows})
    ks = sorted({r["k"] for r in rows if r.get("k") is not None})
    lines = [
        f"# {name}: heuristics against the exact optimum",
        "",
        "Geometric-mean ratio of each method's objective to the proven optimum (1.0000 is "
        "optimal), over the instances with one; n = instances. 'self' counts the instances "
        "whose optimum only this method proved: a ratio of 1.0 there is not independent "
        "evidence.",
        "",
    ]
    lines.append("| method | " + " | ".join(f"k={k}" for k in ks) + " | all | mean wall s |")
    lines.append("|---|" + "---|" * (len(ks) + 2))
    for m in methods:
        cells = []
        for k in ks + [None]:
            sel = [
                r
                for r in rows
                if r["method"] == m and (k is None or r.get("k") == k) and r.get("ratio_to_exact")
            ]
            gm = geomean([r["ratio_to_exact"] for r in sel])
            own = sum(1 for r in sel if r["exact_self_only"])
            note = f", {own} self" if own else ""
            cells.append(f"{gm:.4f} (n={len(sel)}{note})" if gm else "-")
        walls = [r["wall_seconds"] for r in rows if r["method"] == m and r.get("wall_seconds")]
        cells.append(f"{sum(walls) / len(walls):.2f}" if walls else "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    status: dict[str, dict[str, int]] = {}
    for r in rows:
        status.setdefault(r["method"], {}).setdefault(r["status"], 0)
        status[r["method"]][r["status"]] += 1
    lines += ["", "| method | statuses |", "|---|---|"]
    for m in methods:
        lines.append(
            f"| {m} | " + ", ".join(f"{s} {c}" for s, c in sorted(status[m].items())) + " |"
        )
    insts = {_instance(r): r for r in rows}
    proven = sum(1 for r in insts.values() if r["exact_optimum"] is not None)
    lines += ["", f"Instances (graph, cluster, k): {len(insts)}; with a proven optimum: {proven}."]
    lines += _conflict_lines(rows, lambda r: f"{r['graph']} on {r.get('cluster')}, k={r.get('k')}")
    return "\n".join(lines) + "\n"


def shard_markdown(rows: list[dict]) -> str:
    """The operator-sharding table: per method, the geometric-mean ratio to the optimum cpsat
    proved (OPTIMAL records only) by mesh and overall, the mean wall time and the statuses."""
    methods = sorted({r["method"] for r in rows})
    meshes = sorted({r["mesh"] for r in rows}, key=lambda m: (len(m), m))
    lines = [
        "## Operator-level sharding against the exact optimum",
        "",
        "Geometric-mean ratio of each method's modelled step time to the optimum proven by an "
        "OPTIMAL cpsat run on the same model, cluster, mesh and memory limit; n = instances. "
        "'self' counts the instances only this method proved. A heuristic plan over the "
        "memory limit is an ERROR (see results.csv).",
        "",
        "| method | "
        + " | ".join(f"mesh {m}" for m in meshes)
        + " | all | mean wall s | statuses |",
        "|---|" + "---|" * (len(meshes) + 3),
    ]
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        cells = []
        for mesh in meshes + [None]:
            sel = [
                r for r in mine if (mesh is None or r["mesh"] == mesh) and r.get("ratio_to_exact")
            ]
            gm = geomean([r["ratio_to_exact"] for r in sel])
            own = sum(1 for r in sel if r["exact_self_only"])
            note = f", {own} self" if own else ""
            cells.append(f"{gm:.4f} (n={len(sel)}{note})" if gm else "-")
        walls = [r["wall_seconds"] for r in mine if r.get("wall_seconds")]
        cells.append(f"{sum(walls) / len(walls):.2f}" if walls else "-")
        counts: dict[str, int] = {}
        for r in mine:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        cells.append(", ".join(f"{s} {c}" for s, c in sorted(counts.items())))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    insts = {_instance(r): r for r in rows}
    proven = sum(1 for r in insts.values() if r["exact_optimum"] is not None)
    lines += [
        "",
        f"Instances (model, cluster, mesh, memory): {len(insts)}; with a proven optimum: {proven}.",
    ]
    lines += _conflict_lines(
        rows, lambda r: f"{r['graph']} on mesh {r['mesh']}, memory {r.get('memory')}"
    )
    return "\n".join(lines) + "\n"


JOINT_ORDER = ("pipeline", "sharding", "joint")
SAME = 1e-9  # relative: two objectives closer than this are equal (a tie)


def _joint_groups(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """Joint records by (graph, cluster, memory), then by space, in the order of the runs."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        key = (r["graph"], r.get("cluster"), r.get("memory"))
        groups.setdefault(key, {})[r["space"]] = r
    return groups


def _obj(r: dict | None) -> float | None:
    return r["objective"] if r is not None and _feasible(r) else None


def _stages_text(r: dict) -> str:
    """A plan's stages as 'devices (mesh)': ``d0-3 (2x2) | d4-7 (4)``."""
    parts = []
    for st in r.get("stages") or []:
        d = st["devices"]
        span = f"d{d[0]}" if len(d) == 1 else f"d{d[0]}-{d[-1]}"
        if len(d) > 1 and list(d) != list(range(d[0], d[-1] + 1)):
            span = "d" + ",".join(map(str, d))
        parts.append(f"{span} ({st['mesh']})")
    return " \\| ".join(parts) or "-"


def _sim_text(r: dict) -> str:
    if r.get("sim_period") is None:
        return "-"
    obj = r["objective"]
    if r.get("sim_disagrees"):
        return f"DISAGREES: {r['sim_period']:.6g} s ({(r['sim_period'] - obj) / obj:+.2e})"
    return "agrees" + ("" if r.get("sim_valid", True) else " (violations)")


def joint_wins(rows: list[dict]) -> list[dict]:
    """The instances where the joint plan is strictly faster than both the pure pipeline and
    the pure sharding plan (beyond ties) and the simulator agrees with all three objectives:
    graph, cluster, memory, the objectives and the speed-up over the better of the other two."""
    wins = []
    for (graph, cluster, memory), by in _joint_groups(rows).items():
        j = _obj(by.get("joint"))
        others = [(_obj(by.get(s)), by.get(s)) for s in ("pipeline", "sharding") if s in by]
        if j is None or len(others) < 2:
            continue
        best_other = min((o for o, _ in others if o is not None), default=None)
        checked = all(not x.get("sim_disagrees") for x in by.values() if _obj(x) is not None)
        if (best_other is None or j < best_other * (1 - SAME)) and checked:
            wins.append(
                {
                    "graph": graph,
                    "cluster": cluster,
                    "memory": memory,
                    "joint": j,
                    "best_other": best_other,
                    "speedup": None if best_other is None else best_other / j,
                }
            )
    return wins


def joint_markdown(rows: list[dict]) -> str:
    """The pipeline vs sharding vs joint table: per model, cluster and memory limit, each
    space's objective with its ratio to the best and its gap to its own bound (the space that
    bound covers is listed below), the winner, the bound valid for every joint plan, then the
    plans' stages and the joint simulator's check of each."""
    groups = _joint_groups(rows)
    spaces = [s for s in JOINT_ORDER if any(s in by for by in groups.values())]
    lines = _joint_table(groups, spaces)
    lines += _bound_coverage(rows, spaces)
    lines += _wins_section(rows, groups, spaces)
    return "\n".join(lines) + "\n"


def _joint_table(groups: dict[tuple, dict[str, dict]], spaces: list[str]) -> list[str]:
    """The heading, the table of the spaces' periods (one row per model, cluster and memory
    limit) and the footnotes of the runs without a plan."""
    lines = [
        "## Pipeline vs sharding vs joint plans",
        "",
        "The same cost model (sharded programs on sub-meshes plus transfers over the real links) "
        "searched over three spaces on all the devices of the cluster: pure pipeline (every "
        "stage on one device), pure sharding (one stage on all devices) and joint (stages on "
        "sub-meshes). Each cell: period in seconds (one request per period), its ratio to the "
        "best of the row, and its gap to the lower bound of its own space (which plans each "
        "bound covers is listed below the table). 'universal bound': valid for every joint "
        "plan, with the best plan's gap to it.",
        "",
        "| model | weights | cluster | memory | "
        + " | ".join(spaces)
        + " | best | joint vs best other | universal bound |",
        "|---|---|---|---|" + "---|" * (len(spaces) + 3),
    ]
    errors: list[str] = []
    for (graph, cluster, memory), by in groups.items():
        objs = {s: _obj(by.get(s)) for s in spaces}
        best = min((v for v in objs.values() if v is not None), default=None)
        cells = [_space_cell(graph, s, by.get(s), objs[s], best, errors) for s in spaces]
        if best is None:
            win = "-"
        else:
            win = " = ".join(
                s for s in spaces if objs[s] is not None and objs[s] <= best * (1 + SAME)
            )
        weights = next((r.get("weight_bytes") for r in by.values() if r.get("weight_bytes")), None)
        w_text = "-" if weights is None else f"{weights / 1e6:.3g} MB"
        lines.append(
            f"| {graph} | {w_text} | {cluster} | {memory or 'device capacity'} | "
            + " | ".join(cells)
            + f" | {win} | {_joint_vs_others(objs, by, spaces)} | {_universal_text(by, best)} |"
        )
    if errors:
        lines += ["", *errors]
    return lines


def _space_cell(
    graph: str, space: str, r: dict | None, obj: float | None, best: float | None, errors: list
) -> str:
    """One space's cell of the joint table; a run without a plan gets a footnote in
    ``errors``."""
    if r is None:
        return "-"
    if obj is None:
        errors.append(f"[{len(errors) + 1}] {graph}, {space}: {r.get('error') or r['status']}")
        return f"{r['status']} [{len(errors)}]"
    gap = r.get("gap")
    gap_text = f"gap {gap:.1%}" if gap is not None else "no bound"
    return f"{obj:.4g} (x{obj / best:.3f}, {gap_text})"


def _joint_vs_others(objs: dict[str, float | None], by: dict[str, dict], spaces: list) -> str:
    """The joint plan against the better of the pure spaces: a speed-up, equal, or the only
    plan that fits."""
    others = [objs[s] for s in spaces if s != "joint" and objs[s] is not None]
    if objs.get("joint") is not None and others:
        ratio = min(others) / objs["joint"]
        if abs(ratio - 1) <= SAME:
            return "equal"
        return f"{ratio:.3f}x " + ("faster" if ratio > 1 else "slower")
    if objs.get("joint") is not None and any(s in by for s in spaces if s != "joint"):
        return "only joint fits"
    return "-"


def _universal_text(by: dict[str, dict], best: float | None) -> str:
    """The bound valid for every joint plan of the row, with the best plan's gap to it."""
    ubs = [r["universal_bound"] for r in by.values() if r.get("universal_bound") is not None]
    ub = max(ubs, default=None)
    if ub is None:
        return "-"
    return f"{ub:.4g}" + (f" (best {(best - ub) / best:.1%} above)" if best else "")


def _bound_coverage(rows: list[dict], spaces: list[str]) -> list[str]:
    """Which plans each space's bound covers, one sentence per space and kind of bound."""
    lines = ["", "Which plans each space's bound covers:", ""]
    for s in spaces:
        sentences = sorted(
            {r["bound_space"] for r in rows if r["space"] == s and r.get("bound_space")}
        )
        for sentence in sentences:
            lines.append(f"- {s}: {sentence}")
    return lines


def _wins_section(
    rows: list[dict], groups: dict[tuple, dict[str, dict]], spaces: list[str]
) -> list[str]:
    """How often the joint plan beats both pure spaces (with the simulator agreeing), then
    every plan's stages and simulated period."""
    wins = joint_wins(rows)
    listed = "; ".join(
        f"{w['graph']} on {w['cluster']}, memory {w['memory'] or 'capacity'}: "
        + (f"{w['speedup']:.3f}x" if w["speedup"] else "the only plan")
        for w in wins
    )
    lines = [
        "",
        f"Joint strictly faster than both pure pipeline and pure sharding, the simulator "
        f"agreeing with every plan of the row: {len(wins)} of {len(groups)} rows"
        + (f" ({listed})." if wins else "."),
        "",
        "| model | cluster | memory | space | status | stages: devices (mesh) | simulated period |",
        "|---|---|---|---|---|---|---|",
    ]
    for (graph, cluster, memory), by in groups.items():
        for s in spaces:
            r = by.get(s)
            if r is None or _obj(r) is None:
                continue
            lines.append(
                f"| {graph} | {cluster} | {memory or 'device capacity'} | {s} | {r['status']} | "
                f"{_stages_text(r)} | {_sim_text(r)} |"
            )
    return lines


JOINT_COLORS = {"pipeline": "tab:blue", "sharding": "tab:orange", "joint": "tab:green"}


def plot_joint(rows: list[dict], out: Path) -> None:
    """joint_vs_spaces.png: objective per model size (weight bytes) of each space, one panel
    per cluster and memory limit; each space's lower bound dashed, the universal bound
    dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.get("cluster"), r.get("memory") or "") for r in rows})
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    for ax, (cluster, memory) in zip(axes[0], panels, strict=False):
        mine = [r for r in rows if (r.get("cluster"), r.get("memory") or "") == (cluster, memory)]
        _joint_panel(ax, mine)
        ax.set_title(f"{cluster}, memory {memory or 'capacity'}", fontsize=9)
        if ax.get_lines():
            ax.legend(fontsize=7)
    _save_figure(fig, out / "joint_vs_spaces.png")


def _joint_panel(ax, mine: list[dict]) -> None:
    """One panel of joint_vs_spaces.png: each space's objective per model size with its
    lower bound dashed, the universal bound dotted, each model named above its highest point."""
    for s in JOINT_ORDER:
        pts = sorted(
            (r["weight_bytes"] / 1e6, r["objective"], r.get("lower_bound"))
            for r in mine
            if r["space"] == s and _feasible(r) and r.get("weight_bytes")
        )
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], "o-", color=JOINT_COLORS[s], label=s, markersize=4)
        lb = [(p[0], p[2]) for p in pts if p[2] is not None]
        if lb:
            ax.plot(
                *zip(*lb, strict=True),
                "--",
                color=JOINT_COLORS[s],
                linewidth=1,
                label=f"{s} bound",
            )
    ub: dict[float, float] = {}
    for r in mine:
        if r.get("universal_bound") is not None and r.get("weight_bytes"):
            x = r["weight_bytes"] / 1e6
            ub[x] = max(ub.get(x, 0.0), r["universal_bound"])
    if ub:
        ax.plot(
            *zip(*sorted(ub.items()), strict=True),
            ":",
            color="black",
            linewidth=1,
            label="universal bound",
        )
    tops: dict[tuple, float] = {}  # each model's name above its highest point
    for r in mine:
        if _feasible(r) and r.get("weight_bytes"):
            key = (r["weight_bytes"] / 1e6, r["graph"])
            tops[key] = max(tops.get(key, 0.0), r["objective"])
    for (x, graph), y in tops.items():
        ax.annotate(
            graph, (x, y), xytext=(0, 4), textcoords="offset points", fontsize=6, ha="center"
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model weights (MB)")
    ax.set_ylabel("period (s)")


def _conflict_lines(rows: list[dict], instance) -> list[str]:
    """The report lines listing instances whose proofs disagree (``instance(r)`` names one)."""
    conflicts = sorted(
        {
            f"- {instance(r)}: {r['exact_source']}"
            for r in rows
            if (r.get("exact_source") or "").startswith("CONFLICT")
        }
    )
    if not conflicts:
        return []
    return ["", "Proofs that disagree (no optimum is used for these instances):", "", *conflicts]


def _save_figure(fig, path: Path) -> None:
    """Save a matplotlib figure atomically (temporary file, then rename) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with atomic_file(path, "wb") as fh:
            fig.savefig(fh, dpi=110, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)


def plot_results(rows: list[dict], out: Path) -> None:
    """ratio_by_method.png (ratio to exact by method and k) and time_vs_size.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = sorted({r["method"] for r in rows})
    ks = sorted({r["k"] for r in rows if r.get("k") is not None})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(ks))
    for j, k in enumerate(ks):
        vals = [
            geomean(
                [
                    r["ratio_to_exact"]
                    for r in rows
                    if r["method"] == m and r.get("k") == k and r.get("ratio_to_exact")
                ]
            )
            or float("nan")
            for m in methods
        ]
        ax.bar([i + j * width for i in range(len(methods))], vals, width, label=f"k={k}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(methods))], methods, rotation=30)
    ax.set_ylabel("objective / exact optimum (geo. mean)")
    if ks:
        ax.legend(fontsize=8)
    _save_figure(fig, out / "ratio_by_method.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        pts = [
            (r["nodes"], r["wall_seconds"])
            for r in rows
            if r["method"] == m and r.get("nodes") and r.get("wall_seconds")
        ]
        if pts:
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(xs, ys, "o-", label=m, markersize=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("wall seconds")
    if any(ax.get_lines()):
        ax.legend(fontsize=8)
    _save_figure(fig, out / "time_vs_size.png")


def is_training(r: dict) -> bool:
    """A record of a training-plan run (the experiment's ``training:`` key)."""
    return record_kind(r) == "training"


@dataclass(frozen=True)
class SplitRatio:
    """A practitioners' split's T over the certified optimum: exact (``low == high``) when
    the optimum is proven, else the interval [T / best plan, T / best bound] the optimum's
    position allows (``high`` None without a bound); ``fits`` False when the split breaks the
    memory."""

    low: float | None
    high: float | None
    fits: bool

    def text(self) -> str:
        if not self.fits:
            return "does not fit"
        if self.low is None:
            return "-"
        if self.high is None:
            return f">= {self.low:.3f}"
        if self.high <= self.low * (1 + 1e-9):
            return f"{self.low:.3f}"
        return f"{self.low:.3f}-{self.high:.3f}"


def split_ratio(row: dict, name: str) -> SplitRatio | None:
    """The ratio of split ``name`` in a row of :func:`training_instances` (None: no such
    split)."""
    split = (row.get("splits") or {}).get(name)
    if split is None:
        return None
    t = split["iteration_time"]
    if t is None:
        return SplitRatio(None, None, fits=False)
    exact = row.get("exact_optimum")
    if exact:
        return SplitRatio(t / exact, t / exact, fits=True)
    best = (row.get("_best") or {}).get("objective")
    bound = row.get("best_bound")
    return SplitRatio(
        t / best if best else None, t / bound if bound and bound > 0 else None, fits=True
    )


def training_markdown(rows: list[dict]) -> str:
    """The training table: per instance (graph, cluster, k, schedule, microbatches, virtual
    stages, state factor, memory) the best plan's T, its status and the certified optimum,
    and each practitioners' split's ratio to the optimum."""
    lines = [
        "## Training plans: the practitioners' splits against the certified optimum",
        "",
        "Iteration time T of the best plan found (its method and status), the optimum when a "
        "proof gives it, and the ratio of each practitioners' split (docs/training.md: "
        "uniform layers, fewer layers at the ends, DeepSpeed's by-parameters) to it. Without "
        "a proven optimum the ratio lies between T(split) / best T and T(split) / best bound; "
        "both ends are shown. 'does not fit': the split breaks the memory.",
        "",
        "| graph | cluster | k | schedule | m | v | state | memory | best T (method, status) "
        "| optimum | " + " | ".join(SPLITS) + " |",
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(SPLITS),
    ]
    for row in training_instances(rows):
        best = row.get("_best")
        best_text = (
            "no plan"
            if best is None
            else f"{best['objective']:.6g} s ({best['method']}, {best['status']})"
        )
        exact = row.get("exact_optimum")
        ratios = [split_ratio(row, s) for s in SPLITS]
        lines.append(
            f"| {row['graph']} | {row.get('cluster')} | {row.get('k')} | {row['schedule']} "
            f"| {row['microbatches']} | {row['virtual_stages']} | {row['optimizer_state']:g} "
            f"| {row.get('memory') or 'capacity'} | {best_text} "
            f"| {'-' if exact is None else f'{exact:.6g} s'} | "
            + " | ".join("-" if x is None else x.text() for x in ratios)
            + " |"
        )
    lines += _conflict_lines(rows, lambda r: f"{r['graph']}, {r['schedule']} m={r['microbatches']}")
    return "\n".join(lines) + "\n"


def training_instances(rows: list[dict]) -> list[dict]:
    """One enriched row per training instance, in the order of the runs: the record of its
    best plan (or its first record), with ``_best`` that record (None: no plan)."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(_instance(r), []).append(r)
    out = []
    for recs in by.values():
        feas = [r for r in recs if _feasible(r)]
        best = min(feas, key=lambda r: r["objective"], default=None)
        out.append(dict(best or recs[0], _best=best))
    return out


def plot_training(rows: list[dict], out: Path) -> None:
    """training_splits.png: each split's ratio to the optimum against the microbatches, one
    panel per schedule and memory limit (an interval drawn as an error bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    insts = training_instances(rows)
    panels = sorted({(r["schedule"], r.get("memory") or "") for r in insts})
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    for ax, (schedule, memory) in zip(axes[0], panels, strict=False):
        mine = [r for r in insts if (r["schedule"], r.get("memory") or "") == (schedule, memory)]
        for name in SPLITS:
            pts = sorted(
                (r["microbatches"], x.low, x.high if x.high is not None else x.low)
                for r in mine
                if (x := split_ratio(r, name)) is not None and x.fits and x.low is not None
            )
            if pts:
                xs, lows, highs = zip(*pts, strict=True)
                ax.errorbar(
                    xs,
                    lows,
                    yerr=[[0] * len(lows), [h - lo for lo, h in zip(lows, highs, strict=True)]],
                    fmt="o-",
                    capsize=3,
                    markersize=4,
                    label=name,
                )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("microbatches m")
        ax.set_ylabel("T(split) / optimum")
        ax.set_title(f"{schedule}, memory {memory or 'capacity'}", fontsize=9)
        if ax.get_lines():
            ax.legend(fontsize=7)
    _save_figure(fig, out / "training_splits.png")


# the kinds of records, in the order of their sections in summary.md
RECORD_KINDS = {
    "pipeline": RecordKind(("graph_key", "cluster_key", "k"), _whole_scope, True),
    "shard": RecordKind(
        ("graph_key", "cluster_key", "mesh", "memory_bytes"), _shard_scope, False, shard_markdown
    ),
    "joint": RecordKind(
        ("graph_key", "cluster_key", "memory_bytes"),
        _joint_scope,
        False,
        joint_markdown,
        plot_joint,
    ),
    "training": RecordKind(
        ("graph_key", "cluster_key", "k", *TRAINING_SETTING, "memory_bytes"),
        _whole_scope,
        True,
        training_markdown,
        plot_training,
    ),
}
