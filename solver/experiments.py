"""YAML experiments: heuristics against the exact optimum, over graphs x clusters x k x methods.

    mtpp experiment configs/experiments/smoke.yaml --output results/smoke --jobs 2 [--resume]

The config is validated (pydantic: unknown keys and wrong types are refused with the path of the
key; missing files, unknown methods or presets, negative limits are reported) before any run
starts. Runs execute in parallel processes; every finished run is written atomically to
``runs/<id>.json`` (and appended to ``results.jsonl``) with its plan in ``plans/<id>.json``, so
killing the runner loses no finished result and ``--resume`` skips what is recorded.

Cores: each run gets ``max(1, cores // jobs)`` CP-SAT workers, so ``--jobs`` runs together never
ask for more threads than the machine has.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from solver.errors import MtppError
from solver.files import read_yaml, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
DNNPART = Path(os.environ.get("MTPP_BENCH", ROOT.parent / "shared/benchmarks/dnn-partitioning"))
DNNPART_KNOWN = {  # optimum at the file's k (the benchmark README)
    "LayerGraphs/bert24_inference": 17.78990625,
    "LayerGraphs/gnmt_inference": 32.910658203125,
    "LayerGraphs/resnet50_inference": 34.2228515625,
    "LayerGraphs/inceptionv3_inference": 52.2016,
    "OperatorGraphs/bert_l-3_inference": 27.9185676799125,
    "OperatorGraphs/bert_l-6_inference": 33.989101556140085,
    "OperatorGraphs/bert_l-12_inference": 147.47798444934838,
    "OperatorGraphs/resnet50_inference": 128.0735111041098,
}


# ---------------------------------------------------------------------- the config schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GraphSpec(_Strict):
    """One graph: exactly one of the source keys."""

    dnnpart: str | None = None  # e.g. LayerGraphs/bert24_inference (in ../shared/benchmarks)
    onnx: str | None = None  # a path, relative to the config's folder or the project
    json_file: str | None = Field(default=None, alias="json")
    zoo: str | None = None  # a model-zoo network shipped in the onnx wheel, e.g. resnet50
    generate: str | None = None  # a models/build.py kind: transformer, decoder, resnet, ...
    layered: int | None = Field(default=None, gt=0)  # a generated layered DAG with N nodes
    params: dict[str, int] = {}  # builder parameters for generate / layered
    dims: dict[str, int] = {}
    work: Literal["roofline", "flops", "measured"] = "roofline"
    name: str | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _one_source(self):
        keys = [
            k
            for k in ("dnnpart", "onnx", "json_file", "zoo", "generate", "layered")
            if getattr(self, k) is not None
        ]
        if len(keys) != 1:
            raise ValueError("give exactly one of dnnpart, onnx, json, zoo, generate, layered")
        return self


class MethodSpec(_Strict):
    name: str
    time_limit: float | None = Field(default=None, gt=0)
    options: dict[str, Any] = {}
    label: str | None = None


class ExperimentConfig(_Strict):
    name: str = "experiment"
    graphs: list[GraphSpec] = Field(min_length=1)
    clusters: list[str | dict[str, Any]] = ["file"]
    devices: list[int | None] = [None]  # None: the graph file's k (or the cluster's)
    methods: list[str | MethodSpec] = Field(min_length=1)
    time_limit: float = Field(default=60.0, gt=0)
    seeds: list[int] = [0]
    repeats: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _devices_positive(self):
        for k in self.devices:
            if k is not None and k < 1:
                raise ValueError(f"devices: {k} is not a device count (use >= 1)")
        return self


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "GraphSpec", "MethodSpec"}


def validation_message(e: ValidationError) -> str:
    """The most specific pydantic error as 'key a.b.c: message'. For a union field (a method
    given as a name or as a mapping) the deepest error is the helpful one; type tags that
    pydantic puts into the path of union branches are dropped."""
    err = max(e.errors(), key=lambda x: len(x["loc"]))
    parts = [
        str(x)
        for x in err["loc"]
        if not (isinstance(x, str) and (x in _TYPE_TAGS or "[" in x or "-" in x))
    ]
    return f"key {'.'.join(parts) or '(top level)'!r}: {err['msg']}"


def load_config(path: str | Path) -> tuple[ExperimentConfig, Path]:
    """Read and validate an experiment YAML; every problem names the key to fix."""
    from solver.cluster import cluster_from_dict, load_cluster
    from solver.methods import METHODS

    path = Path(path)
    data = read_yaml(path, "experiment config")
    if not isinstance(data, dict):
        raise MtppError(f"{path}: an experiment config is a mapping (graphs, methods, ...)")
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as e:
        raise MtppError(f"{path}: {validation_message(e)}") from None
    base = path.parent
    for i, gs in enumerate(cfg.graphs):
        try:
            graph_source(gs, base)
        except MtppError as e:
            raise MtppError(f"{path}: key 'graphs.{i}': {e}") from None
    for i, c in enumerate(cfg.clusters):
        try:
            if isinstance(c, dict):
                cluster_from_dict(c, f"clusters.{i}")
            elif c != "file":  # 'file': the cluster each graph file states
                load_cluster(c)
        except MtppError as e:
            raise MtppError(f"{path}: key 'clusters.{i}': {e}") from None
    for i, m in enumerate(cfg.methods):
        name = m if isinstance(m, str) else m.name
        if name not in METHODS:
            raise MtppError(
                f"{path}: key 'methods.{i}': unknown method {name!r}; choose one of "
                f"{', '.join(METHODS)}"
            )
    return cfg, base


def graph_source(gs: GraphSpec, base: Path) -> tuple[str, Path | None]:
    """(label, file) of a graph spec; generated graphs have no file until built."""
    if gs.dnnpart is not None:
        p = DNNPART / "throughput-inputs" / f"{gs.dnnpart}.json"
        if not p.exists():
            raise MtppError(f"dnn-partitioning graph {gs.dnnpart!r} not found at {p}")
        return gs.name or gs.dnnpart, p
    if gs.zoo is not None:
        import onnx

        p = Path(onnx.__file__).parent / "backend/test/data/light" / f"light_{gs.zoo}.onnx"
        if not p.exists():
            raise MtppError(f"zoo model {gs.zoo!r} is not in the onnx wheel (light_{gs.zoo}.onnx)")
        return gs.name or gs.zoo, p
    for key in ("onnx", "json_file"):
        val = getattr(gs, key)
        if val is not None:
            for cand in (base / val, ROOT / val, Path(val)):
                if cand.exists():
                    return gs.name or Path(val).stem, cand
            raise MtppError(f"{val}: no such file (looked beside the config and in the project)")
    if gs.generate is not None:
        kinds = ("transformer", "decoder", "resnet", "inception", "unet")
        if gs.generate not in kinds:
            raise MtppError(f"generate: unknown model {gs.generate!r}; choose one of {kinds}")
        label = gs.name or gs.generate + "".join(f"-{k}{v}" for k, v in sorted(gs.params.items()))
        return label, None
    return gs.name or f"layered-{gs.layered}", None


# ---------------------------------------------------------------------- runs
def expand(cfg: ExperimentConfig, base: Path) -> list[dict]:
    """The cross product of the config as run descriptions with stable ids."""
    runs = []
    for gi, gs in enumerate(cfg.graphs):
        label, _ = graph_source(gs, base)
        for ci, cl in enumerate(cfg.clusters):
            for k in cfg.devices:
                for m in cfg.methods:
                    ms = MethodSpec(name=m) if isinstance(m, str) else m
                    for seed in cfg.seeds:
                        for rep in range(cfg.repeats):
                            desc = {
                                "graph": label,
                                "graph_index": gi,
                                "cluster_index": ci,
                                "cluster": cl if isinstance(cl, str) else cl.get("name", "inline"),
                                "devices": k,
                                "method": ms.label or ms.name,
                                "method_name": ms.name,
                                "options": ms.options,
                                "time_limit": ms.time_limit or cfg.time_limit,
                                "seed": seed,
                                "repeat": rep,
                            }
                            key = json.dumps(
                                {x: desc[x] for x in desc if x != "graph_index"}, sort_keys=True
                            )
                            desc["id"] = hashlib.sha1(key.encode()).hexdigest()[:12]
                            runs.append(desc)
    return runs


def _materialise(gs: GraphSpec, base: Path, out: Path) -> Path:
    """The file of a graph spec, building generated models into ``out/models`` once."""
    label, path = graph_source(gs, base)
    if path is not None:
        return path
    target = out / "models" / (label.replace("/", "_") + (".onnx" if gs.generate else ".json"))
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name("." + target.name + f".{os.getpid()}")
    if gs.generate:
        import importlib.util
        import sys

        spec = importlib.util.spec_from_file_location("mtpp_models_build", ROOT / "models/build.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        model, _ = mod.BUILDERS[gs.generate](**gs.params)
        mod.save(model, tmp)
    else:
        from solver.io.native import to_dict
        from solver.workloads import layered_dag

        write_json_atomic(tmp, to_dict(layered_dag(int(gs.layered), **gs.params)))
    os.replace(tmp, target)
    return target


def _execute(desc: dict, gs_data: dict, cluster_spec, base: str, out: str, workers: int) -> dict:
    """One run in a worker process: load, solve, evaluate, save the plan."""
    from solver.cluster import cluster_from_dict
    from solver.io import load_graph, resolve_cluster
    from solver.methods import SolveOptions, solve
    from solver.plan import save_plan

    gs = GraphSpec.model_validate(gs_data)
    out_p = Path(out)
    t0 = time.perf_counter()
    rec = dict(desc)
    try:
        path = _materialise(gs, Path(base), out_p)
        kw = {}
        if path.suffix == ".onnx":
            named = isinstance(cluster_spec, str) and cluster_spec != "file"
            kw = {"dims": gs.dims, "work": gs.work, "cluster": cluster_spec if named else None}
        g = load_graph(path, **kw)
        if isinstance(cluster_spec, dict):
            cluster = cluster_from_dict(cluster_spec, "inline cluster")
            cluster = cluster.with_devices(desc["devices"])
        else:  # "file": what the graph file states, else the default preset
            spec = None if cluster_spec == "file" else cluster_spec
            cluster = resolve_cluster(g, spec, desc["devices"])
        opts = SolveOptions(
            time_limit=desc["time_limit"],
            workers=workers,
            seed=desc["seed"],
            extra=dict(desc["options"]),
        )
        plan = solve(g, cluster, desc["method_name"], opts)
        rec.update(nodes=g.n, k=cluster.devices, cluster=cluster.name)
        if plan is None:
            rec.update(status="INFEASIBLE", objective=None, lower_bound=None)
        else:
            save_plan(plan, out_p / "plans" / f"{desc['id']}.json")
            rec.update(status=plan.status, objective=plan.objective, lower_bound=plan.lower_bound)
        known = DNNPART_KNOWN.get(gs.dnnpart or "") if desc["devices"] is None else None
        rec["known_optimum"] = known
    except MtppError as e:
        rec.update(status="ERROR", error=str(e), objective=None, lower_bound=None)
    rec["wall_seconds"] = time.perf_counter() - t0
    return rec


def run_experiment(
    config: str | Path,
    output: str | Path,
    jobs: int = 1,
    resume: bool = False,
    progress: bool = True,
) -> list[dict]:
    """Run (or resume) an experiment and write its reports; returns every record."""
    cfg, base = load_config(config)
    out = Path(output)
    runs = expand(cfg, base)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    done = {p.stem: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}
    if not resume and done:
        raise MtppError(
            f"{out} already holds {len(done)} results; pass --resume to continue "
            "it, or choose another --output"
        )
    todo = [r for r in runs if r["id"] not in done]
    cores = os.cpu_count() or 1
    workers = max(1, cores // max(1, jobs))
    from solver.progress import RunProgress

    with (
        RunProgress(progress, total=len(runs), done=len(runs) - len(todo)) as bar,
        ProcessPoolExecutor(max_workers=max(1, jobs)) as pool,
    ):
        pending = {}
        for r in todo:
            gs = cfg.graphs[r["graph_index"]]
            cl = cfg.clusters[r["cluster_index"]]
            fut = pool.submit(
                _execute, r, gs.model_dump(by_alias=True), cl, str(base), str(out), workers
            )
            pending[fut] = r
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                r = pending.pop(fut)
                try:
                    rec = fut.result()
                except Exception as e:  # a crash in one run must not lose the others
                    rec = dict(
                        r,
                        status="ERROR",
                        error=f"{type(e).__name__}: {e}",
                        objective=None,
                        lower_bound=None,
                    )
                write_json_atomic(out / "runs" / f"{r['id']}.json", rec)
                with open(out / "results.jsonl", "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                done[r["id"]] = rec
                bar.advance(f"{rec['graph']} k={rec.get('k')} {rec['method']}: {rec['status']}")
    records = [done[r["id"]] for r in runs if r["id"] in done]
    write_reports(records, out, cfg.name)
    return records


# ---------------------------------------------------------------------- reports
def _instance(r: dict) -> tuple:
    return (r["graph"], r.get("cluster"), r.get("k"))


def enrich(records: list[dict]) -> list[dict]:
    """Add gap to the best proven bound and ratio to the exact optimum where known."""
    best_lb: dict[tuple, float] = {}
    exact: dict[tuple, float] = {}
    for r in records:
        key = _instance(r)
        if r.get("lower_bound") is not None:
            best_lb[key] = max(best_lb.get(key, -math.inf), r["lower_bound"])
        if r.get("status") == "OPTIMAL" and r.get("objective") is not None:
            exact[key] = min(exact.get(key, math.inf), r["objective"])
        if r.get("known_optimum"):
            exact.setdefault(key, r["known_optimum"])
    out = []
    for r in records:
        key = _instance(r)
        obj = r.get("objective")
        row = dict(r)
        row["best_bound"] = best_lb.get(key)
        row["gap_to_best_bound"] = (
            (obj - best_lb[key]) / obj if obj and key in best_lb and obj > 0 else None
        )
        row["exact_optimum"] = exact.get(key)
        row["ratio_to_exact"] = obj / exact[key] if obj and exact.get(key) else None
        out.append(row)
    return out


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
    "wall_seconds",
    "status",
    "error",
]


def write_reports(records: list[dict], out: Path, name: str = "experiment") -> None:
    """results.csv, summary.md and the PNG plots (each written atomically)."""
    rows = enrich(records)
    tmp = out / ".results.csv.tmp"
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c) for c in CSV_COLUMNS})
    os.replace(tmp, out / "results.csv")
    text = summary_markdown(rows, name)
    (out / ".summary.md.tmp").write_text(text)
    os.replace(out / ".summary.md.tmp", out / "summary.md")
    plot_results(rows, out)


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def summary_markdown(rows: list[dict], name: str) -> str:
    """The heuristic-versus-exact table: geometric-mean ratio to the exact optimum per method
    and k, with how many instances it covers, and the mean wall time."""
    methods = sorted({r["method"] for r in rows})
    ks = sorted({r["k"] for r in rows if r.get("k") is not None})
    lines = [
        f"# {name}: heuristics against the exact optimum",
        "",
        "Geometric-mean ratio of each method's objective to the exact optimum (1.0000 is "
        "optimal), over the instances with a known optimum; n = instances.",
        "",
    ]
    lines.append("| method | " + " | ".join(f"k={k}" for k in ks) + " | all | mean wall s |")
    lines.append("|---|" + "---|" * (len(ks) + 2))
    for m in methods:
        cells = []
        for k in ks + [None]:
            sel = [
                r["ratio_to_exact"]
                for r in rows
                if r["method"] == m and (k is None or r.get("k") == k) and r.get("ratio_to_exact")
            ]
            gm = geomean(sel)
            cells.append(f"{gm:.4f} (n={len(sel)})" if gm else "-")
        walls = [r["wall_seconds"] for r in rows if r["method"] == m and r.get("wall_seconds")]
        cells.append(f"{sum(walls) / len(walls):.2f}" if walls else "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    status = {}
    for r in rows:
        status.setdefault(r["method"], {}).setdefault(r["status"], 0)
        status[r["method"]][r["status"]] += 1
    lines += ["", "| method | statuses |", "|---|---|"]
    for m in methods:
        lines.append(
            f"| {m} | " + ", ".join(f"{s} {c}" for s, c in sorted(status[m].items())) + " |"
        )
    return "\n".join(lines) + "\n"


def _save_figure(fig, path: Path) -> None:
    """Save a matplotlib figure atomically (temporary file, then rename) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
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
    ax.legend(fontsize=8)
    _save_figure(fig, out / "time_vs_size.png")
