"""The experiment config: its schema (pydantic, strict), the checks that name the key to fix,
where each graph and cluster comes from, and the cross product as run descriptions with ids.

Paths in the config are resolved beside the config file, then in the current folder; the
dnn-partitioning data folder is the ``benchmark_dir:`` key, else ``$MTPP_BENCH``, else
../shared/benchmarks/dnn-partitioning beside the current project
(:mod:`solver.experiments.benchdata`). A run id hashes everything that defines the run: the
graph source (and file content), dims, work model, builder parameters, the cluster (an inline
cluster by its content), k, the method and its options, time limit, seed and repeat.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from solver.core.cluster import PRESET_DIR, cluster_from_dict, load_cluster
from solver.core.errors import MtppError
from solver.core.files import read_yaml
from solver.core.training import TrainingSpec
from solver.core.units import parse_memory
from solver.experiments import benchdata
from solver.frontends.onnx.modelgen import BUILDERS, check_params
from solver.pipeline.options import check_method_options
from solver.pipeline.registry import METHODS

MAX_RUNS = 1_000_000  # a larger cross product is refused before anything is allocated
MAX_LAYERED = 1_000_000  # nodes of a generated layered DAG

Count = Annotated[int, Field(strict=True, ge=1)]
Seconds = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


def warn(message: str) -> None:
    """One warning line on stderr."""
    print(f"mtpp: warning: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the config schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GraphSpec(_Strict):
    """One graph: exactly one of the source keys."""

    dnnpart: str | None = None  # e.g. LayerGraphs/bert24_inference (in the benchmark folder)
    onnx: str | None = None  # a path, relative to the config's folder or the current folder
    json_file: str | None = Field(default=None, alias="json")
    zoo: str | None = None  # a model-zoo network shipped in the onnx wheel, e.g. resnet50
    # a solver.frontends.onnx.modelgen kind: transformer, decoder, resnet, ...
    generate: str | None = None
    layered: Annotated[int, Field(strict=True, ge=1, le=MAX_LAYERED)] | None = None
    params: dict[str, int | float] = {}  # builder parameters for generate / layered
    dims: dict[str, Count] = {}
    work: Literal["roofline", "flops", "measured"] = "roofline"
    name: str | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one_source(self):
        keys = [k for k in SOURCES if getattr(self, k) is not None]
        if len(keys) != 1:
            raise ValueError("give exactly one of dnnpart, onnx, json, zoo, generate, layered")
        return self

    def source(self) -> dict:
        """The source key and its value, e.g. ``{"onnx": "models/x.onnx"}``."""
        key = next(k for k in SOURCES if getattr(self, k) is not None)
        return {"json" if key == "json_file" else key: getattr(self, key)}


SOURCES = ("dnnpart", "onnx", "json_file", "zoo", "generate", "layered")


class MethodSpec(_Strict):
    name: str
    time_limit: Seconds | None = None
    options: dict[str, Any] = {}
    label: str | None = None
    cpus: Annotated[int, Field(strict=True, ge=1, le=1024)] | None = None  # per run (CP-SAT)


SHARD_METHODS = ("propagate", "dp", "megatron", "cpsat")  # solver.spmd.solve.METHODS
ShardMethodName = Literal["propagate", "dp", "megatron", "cpsat"]


class ShardMethodSpec(_Strict):
    """One operator-sharding method; ``config``: a strategy YAML fixed in the run (propagate
    starts from it), or a mapping graph name -> strategy YAML (node names differ between model
    families): the method then runs on the graphs it names only. Its default label is
    ``shard-<name>``, apart from the pipeline methods."""

    name: ShardMethodName
    time_limit: Seconds | None = None
    config: str | dict[str, str] | None = None
    label: str | None = None
    cpus: Annotated[int, Field(strict=True, ge=1, le=1024)] | None = None

    def as_method(self) -> MethodSpec:
        """The spec as the runners see it (label and cpus by label)."""
        label = self.label or f"shard-{self.name}"
        return MethodSpec(name=self.name, time_limit=self.time_limit, label=label, cpus=self.cpus)


class ShardSpec(_Strict):
    """Operator-level sharding of the config's ONNX graphs: meshes x memory limits x methods.
    A memory limit of null is the cluster's device capacity."""

    meshes: list[Annotated[str, Field(min_length=1)] | Count] = Field(min_length=1)
    memory: list[Annotated[str, Field(min_length=1)] | int | float | None] = [None]
    methods: list[ShardMethodName | ShardMethodSpec] = Field(min_length=1)

    def method_specs(self) -> list[ShardMethodSpec]:
        return [ShardMethodSpec(name=m) if isinstance(m, str) else m for m in self.methods]


JOINT_SPACES = ("pipeline", "sharding", "joint")  # solver.joint.submesh.SPACES
JointSpaceName = Literal["pipeline", "sharding", "joint"]


class JointSpec(_Strict):
    """Pipeline vs sharding vs joint plans (:func:`solver.joint.plan_joint`) of the config's
    ONNX graphs on each cluster's devices: memory limits x spaces. A memory limit of null is
    each device's capacity. Each run's plan is checked by the joint simulator."""

    spaces: list[JointSpaceName] = Field(default=list(JOINT_SPACES), min_length=1)
    memory: list[Annotated[str, Field(min_length=1)] | int | float | None] = [None]
    time_limit: Seconds | None = None
    requests: Annotated[int, Field(strict=True, ge=2, le=10_000)] = 20  # simulated requests
    cpus: Annotated[int, Field(strict=True, ge=1, le=1024)] | None = None

    def method_specs(self) -> list[MethodSpec]:
        """One method per space, labelled ``space-<name>`` (apart from the pipeline methods)."""
        return [
            MethodSpec(
                name=f"joint-{s}", time_limit=self.time_limit, label=joint_label(s), cpus=self.cpus
            )
            for s in self.spaces
        ]


def joint_label(space: str) -> str:
    """The method label of a joint run in ``space``."""
    return f"space-{space}"


ScheduleName = Literal["gpipe", "1f1b", "interleaved"]  # solver.core.training.SCHEDULES


class TrainingSweep(_Strict):
    """Training plans (docs/training.md) of the config's graphs: schedules x microbatches x
    virtual stages x optimizer-state factors x memory limits x methods. Virtual stages other
    than 1 apply to the interleaved schedule only (the other schedules run with 1). A memory
    limit of null is the cluster's capacity. Each run solves with its pipeline method under
    the schedule and prices the practitioners' splits (uniform, fewer-at-ends, by-parameters)
    beside it; their labels are ``train-<method>``."""

    schedules: list[ScheduleName] = Field(default=["1f1b"], min_length=1)
    microbatches: list[Count] = Field(default=[8], min_length=1)
    virtual_stages: list[Count] = [1]
    optimizer_state: list[Annotated[float, Field(strict=False, gt=0, allow_inf_nan=False)]] = [4.0]
    memory: list[Annotated[str, Field(min_length=1)] | int | float | None] = [None]
    methods: list[str | MethodSpec] = Field(default=["cpsat"], min_length=1)

    def method_specs(self) -> list[MethodSpec]:
        """The pipeline methods of the sweep, labelled ``train-<name>`` unless given a label."""
        specs = [MethodSpec(name=m) if isinstance(m, str) else m for m in self.methods]
        return [m.model_copy(update={"label": m.label or training_label(m.name)}) for m in specs]

    def settings(self) -> list[dict]:
        """Every (schedule, microbatches, virtual stages, optimizer state) of the sweep."""
        out = []
        for schedule in self.schedules:
            chunks = self.virtual_stages if schedule == "interleaved" else [1]
            for v in dict.fromkeys(chunks):
                for m in self.microbatches:
                    for state in self.optimizer_state:
                        out.append(
                            {
                                "schedule": schedule,
                                "microbatches": m,
                                "virtual_stages": v,
                                "optimizer_state": float(state),
                            }
                        )
        return out


def training_label(method: str) -> str:
    """The method label of a training run of pipeline method ``method``."""
    return f"train-{method}"


class ExperimentConfig(_Strict):
    name: str = "experiment"
    graphs: list[GraphSpec] = Field(min_length=1)
    clusters: list[str | dict[str, Any]] = ["file"]
    devices: list[Count | None] = [None]  # None: the graph file's k (or the cluster's)
    methods: list[str | MethodSpec] = []  # pipeline partitioning methods
    shard: ShardSpec | None = None  # operator-level sharding runs (solver.spmd)
    joint: JointSpec | None = None  # pipeline vs sharding vs joint plans (solver.joint)
    training: TrainingSweep | None = None  # training plans and the practitioners' splits
    time_limit: Seconds = 60.0
    seeds: list[Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]] = [0]
    repeats: Count = 1
    benchmark_dir: str | None = None  # the dnn-partitioning folder, relative to this file
    backend: Literal["local", "ray"] | None = None  # the command line's --backend wins
    address: Annotated[str, Field(min_length=1)] | None = None  # a Ray cluster to join

    @model_validator(mode="after")
    def _some_methods(self):
        if not self.methods and self.shard is None and self.joint is None and not self.training:
            raise ValueError(
                "give 'methods' (pipeline partitioning), 'shard', 'joint' or 'training' (or "
                "several)"
            )
        return self

    def pipeline_specs(self) -> list[MethodSpec]:
        """The pipeline partitioning methods."""
        return [MethodSpec(name=m) if isinstance(m, str) else m for m in self.methods]

    def method_specs(self) -> list[MethodSpec]:
        """Every method by its label: the pipeline ones, the sharding ones, the joint spaces,
        the training ones."""
        shard = [m.as_method() for m in self.shard.method_specs()] if self.shard else []
        joint = self.joint.method_specs() if self.joint else []
        training = self.training.method_specs() if self.training else []
        return self.pipeline_specs() + shard + joint + training

    def size(self) -> int:
        """How many runs the cross product has (sharding runs: every graph counted)."""
        pipeline = (
            len(self.graphs)
            * len(self.clusters)
            * len(self.devices)
            * len(self.methods)
            * len(self.seeds)
            * self.repeats
        )
        per_graph = len(self.graphs) * len(self.clusters) * len(self.seeds)
        if self.shard is not None:
            sh = self.shard
            pipeline += per_graph * len(sh.meshes) * len(sh.memory) * len(sh.methods)
        if self.joint is not None:
            pipeline += per_graph * len(self.joint.memory) * len(self.joint.spaces)
        if self.training is not None:
            tr = self.training
            per_setting = len(self.devices) * len(tr.memory) * len(tr.methods)
            pipeline += per_graph * per_setting * len(tr.settings())
        return pipeline


_TYPE_TAGS = {
    *("str", "int", "float", "bool", "dict", "list", "none"),
    *("GraphSpec", "MethodSpec", "ShardMethodSpec"),
}


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


def _duplicates(items: list, what: str) -> None:
    """Refuse a list with the same entry twice: its runs would share an id."""
    seen: dict[str, int] = {}
    for i, x in enumerate(items):
        key = json.dumps(x, sort_keys=True, default=str)
        if key in seen:
            raise MtppError(f"key '{what}.{i}': the same as {what}.{seen[key]}; remove one")
        seen[key] = i


def load_config(path: str | Path) -> tuple[ExperimentConfig, Path]:
    """Read and validate an experiment YAML; every problem names the key to fix."""
    path = Path(path)
    data = read_yaml(path, "experiment config")
    if not isinstance(data, dict):
        raise MtppError(f"{path}: an experiment config is a mapping (graphs, methods, ...)")
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as e:
        raise MtppError(f"{path}: {validation_message(e)}") from None
    if cfg.address is not None and cfg.backend != "ray":
        raise MtppError(f"{path}: key 'address': joins a Ray cluster; give it with 'backend: ray'")
    n = cfg.size()
    if n > MAX_RUNS:
        raise MtppError(
            f"{path}: the cross product has {n:,} runs (graphs x clusters x devices x methods x "
            f"seeds x repeats); at most {MAX_RUNS:,} are allowed: shrink a list or 'repeats'"
        )
    base = path.parent
    bench = benchdata.benchmark_dir(cfg.benchmark_dir, base)
    try:
        _duplicates([gs.model_dump(exclude={"name"}) for gs in cfg.graphs], "graphs")
        _duplicates(list(cfg.clusters), "clusters")
        _duplicates(list(cfg.devices), "devices")
        _duplicates(list(cfg.seeds), "seeds")
        _duplicates([m.label or m.name for m in cfg.pipeline_specs()], "methods")
    except MtppError as e:
        raise MtppError(f"{path}: {e}") from None
    for i, gs in enumerate(cfg.graphs):
        try:
            graph_source(gs, base, bench)
            check_builder_params(gs)
        except MtppError as e:
            raise MtppError(f"{path}: key 'graphs.{i}': {e}") from None
    for i, c in enumerate(cfg.clusters):
        try:
            if isinstance(c, dict):
                cluster_from_dict(c, f"clusters.{i}")
            elif c != "file":  # 'file': the cluster each graph file states
                load_cluster(cluster_ref(c, base))
        except MtppError as e:
            raise MtppError(f"{path}: key 'clusters.{i}': {e}") from None
    for i, m in enumerate(cfg.pipeline_specs()):
        if m.name not in METHODS:
            raise MtppError(
                f"{path}: key 'methods.{i}': unknown method {m.name!r}; choose one of "
                f"{', '.join(METHODS)}"
            )
        try:
            check_method_options(m.name, m.options)
        except MtppError as e:
            raise MtppError(f"{path}: key 'methods.{i}.options': {e}") from None
    if cfg.shard is not None:
        check_shard(cfg, base, bench, path)
    if cfg.joint is not None:
        check_joint(cfg, path)
    if cfg.training is not None:
        check_training(cfg, path)
    return cfg, base


SHARD_SOURCES = ("onnx", "zoo", "generate")  # graphs that are ONNX models


def check_shard(cfg: ExperimentConfig, base: Path, bench: Path, path: Path) -> None:
    """The ``shard:`` key: an ONNX graph to shard, meshes, memory sizes, config files."""
    sh = cfg.shard
    if not any(getattr(gs, k) is not None for gs in cfg.graphs for k in SHARD_SOURCES):
        raise MtppError(
            f"{path}: key 'shard': shards ONNX models; give a graph with onnx, zoo or generate"
        )
    for i, m in enumerate(sh.meshes):
        mesh_shape(m, f"{path}: key 'shard.meshes.{i}'")
    for i, m in enumerate(sh.memory):
        if m is not None:
            parse_memory(m, f"{path}: key 'shard.memory.{i}'")
    try:
        _duplicates([mesh_shape(m, "") for m in sh.meshes], "shard.meshes")
        _duplicates([_memory_bytes(m) for m in sh.memory], "shard.memory")
    except MtppError as e:
        raise MtppError(f"{path}: {e}") from None
    try:
        _duplicates([m.label or m.name for m in cfg.method_specs()], "methods")
    except MtppError as e:
        raise MtppError(f"{path}: {e} (a sharding method takes a 'label:')") from None
    names = [graph_source(gs, base, bench).label for gs in cfg.graphs if _is_onnx(gs)]
    for i, m in enumerate(sh.method_specs()):
        if m.config is None:
            continue
        where = f"{path}: key 'shard.methods.{i}.config'"
        files = m.config if isinstance(m.config, dict) else {None: m.config}
        if not files:
            raise MtppError(f"{where}: name a strategy file, or map graph names to them")
        for graph, val in files.items():
            if graph is not None and graph not in names:
                raise MtppError(
                    f"{where}: no ONNX graph named {graph!r} in 'graphs'; the graphs to shard "
                    f"are {', '.join(map(repr, names))}"
                )
            try:
                shard_config(val, base)
            except MtppError as e:
                key = where if graph is None else f"{where[:-1]}.{graph}'"
                raise MtppError(f"{key}: {e}") from None


def _is_onnx(gs: GraphSpec) -> bool:
    return any(getattr(gs, k) is not None for k in SHARD_SOURCES)


def method_config(ms: ShardMethodSpec, graph: str, base: Path) -> dict | None:
    """The run options of sharding method ``ms`` on the graph labelled ``graph``: the
    strategies of its config file (none without one), None when its config maps graph names
    to files and does not name this graph (the method does not run on it)."""
    if ms.config is None:
        return {}
    if isinstance(ms.config, dict):
        if graph not in ms.config:
            return None
        return {"config": shard_config(ms.config[graph], base)}
    return {"config": shard_config(ms.config, base)}


def check_joint(cfg: ExperimentConfig, path: Path) -> None:
    """The ``joint:`` key: an ONNX graph to plan, memory sizes, spaces listed once."""
    js = cfg.joint
    if not any(getattr(gs, k) is not None for gs in cfg.graphs for k in SHARD_SOURCES):
        raise MtppError(
            f"{path}: key 'joint': plans ONNX models; give a graph with onnx, zoo or generate"
        )
    for i, m in enumerate(js.memory):
        if m is not None:
            parse_memory(m, f"{path}: key 'joint.memory.{i}'")
    try:
        _duplicates([_memory_bytes(m) for m in js.memory], "joint.memory")
        _duplicates(list(js.spaces), "joint.spaces")
        _duplicates([m.label or m.name for m in cfg.method_specs()], "methods")
    except MtppError as e:
        raise MtppError(f"{path}: {e}") from None


def check_training(cfg: ExperimentConfig, path: Path) -> None:
    """The ``training:`` key: every setting a valid schedule, memory sizes and methods known,
    nothing listed twice."""
    tr = cfg.training
    for setting in tr.settings():
        try:
            TrainingSpec(**setting)
        except MtppError as e:
            raise MtppError(f"{path}: key 'training': {e}") from None
    for i, m in enumerate(tr.memory):
        if m is not None:
            parse_memory(m, f"{path}: key 'training.memory.{i}'")
    for i, m in enumerate(tr.method_specs()):
        if m.name not in METHODS:
            raise MtppError(
                f"{path}: key 'training.methods.{i}': unknown method {m.name!r}; choose one of "
                f"{', '.join(METHODS)}"
            )
        try:
            check_method_options(m.name, m.options)
        except MtppError as e:
            raise MtppError(f"{path}: key 'training.methods.{i}.options': {e}") from None
    try:
        for key in ("schedules", "microbatches", "virtual_stages", "optimizer_state"):
            _duplicates(list(getattr(tr, key)), f"training.{key}")
        _duplicates([_memory_bytes(m) for m in tr.memory], "training.memory")
        _duplicates([m.label or m.name for m in cfg.method_specs()], "methods")
    except MtppError as e:
        raise MtppError(f"{path}: {e}") from None


def mesh_shape(mesh: str | int, where: str) -> tuple[int, ...]:
    """``"2x4"`` (or 8) -> (2, 4) (or (8,)); anything else is refused naming ``where``."""
    try:
        shape = tuple(int(x) for x in str(mesh).lower().split("x"))
    except ValueError:
        raise MtppError(f"{where}: write a mesh as sizes joined by 'x', e.g. 2x4") from None
    if any(s < 1 for s in shape) or math.prod(shape) > 1_000_000:
        raise MtppError(f"{where}: every mesh axis must be >= 1 (at most 1,000,000 devices)")
    return shape


def _memory_bytes(m: str | int | float | None) -> float | None:
    return None if m is None else parse_memory(m, "memory")


def shard_config(val: str, base: Path) -> dict:
    """A strategy YAML (node name -> strategy), read on the driver so that it is part of the
    run id and travels with the run to any backend; node names are checked by the run."""
    data = read_yaml(_find(val, base), "strategy file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MtppError(f"{val}: write one 'node name: [[2, 1], [1, 4]]' per line")
    return {str(k): v for k, v in data.items()}


def check_builder_params(gs: GraphSpec) -> None:
    """Builder parameters of a generated graph: known keys, sensible sizes (before building)."""
    if gs.generate is not None:
        check_params(gs.generate, gs.params)
    elif gs.layered is not None:
        for key, value in gs.params.items():
            if key == "skip":
                if not 0 <= value <= 1:
                    raise MtppError(f"layered: params.skip must be in [0, 1], got {value}")
            elif key in ("width", "seed"):
                if not isinstance(value, int) or value < (1 if key == "width" else 0):
                    raise MtppError(f"layered: params.{key} must be a whole number >= 1")
            else:
                raise MtppError(f"layered: unknown parameter {key!r}; valid: width, skip, seed")
    elif gs.params:
        raise MtppError("params are for generate and layered graphs only")


def cluster_ref(c: str, base: Path) -> str:
    """A cluster entry as load_cluster takes it: a preset name, or a YAML path resolved beside
    the config first, then in the current folder."""
    if not Path(c).suffix and (PRESET_DIR / f"{c}.yaml").exists():
        return c
    return str(base / c) if (base / c).exists() else c


def _find(val: str, base: Path) -> Path:
    for cand in (base / val, Path(val)):
        if cand.exists():
            return cand
    raise MtppError(f"{val}: no such file (looked beside the config and in the current folder)")


class GraphSource(NamedTuple):
    """A graph spec's display label and its file (None for a generated graph until built)."""

    label: str
    path: Path | None


def graph_source(gs: GraphSpec, base: Path, bench: Path) -> GraphSource:
    """The label and file of a graph spec; generated graphs have no file until built."""
    if gs.dnnpart is not None:
        p = benchdata.graph_path(gs.dnnpart, bench)
        if not p.is_file():
            raise MtppError(
                f"dnn-partitioning graph {gs.dnnpart!r} not found at {p}; set the benchmark "
                f"folder with 'benchmark_dir:' in the config or ${benchdata.ENV_VAR}"
            )
        return GraphSource(gs.name or gs.dnnpart, p)
    if gs.zoo is not None:
        import onnx  # heavy: onnx (the zoo models ship in its wheel)

        p = Path(onnx.__file__).parent / "backend/test/data/light" / f"light_{gs.zoo}.onnx"
        if not p.exists():
            raise MtppError(f"zoo model {gs.zoo!r} is not in the onnx wheel (light_{gs.zoo}.onnx)")
        return GraphSource(gs.name or gs.zoo, p)
    for key in ("onnx", "json_file"):
        val = getattr(gs, key)
        if val is not None:
            return GraphSource(gs.name or Path(val).stem, _find(val, base))
    if gs.generate is not None:
        if gs.generate not in BUILDERS:
            raise MtppError(
                f"generate: unknown model {gs.generate!r}; choose one of {', '.join(BUILDERS)}"
            )
        label = gs.name or gs.generate + "".join(f"-{k}{v}" for k, v in sorted(gs.params.items()))
        return GraphSource(label, None)
    label = gs.name or f"layered-{gs.layered}" + "".join(
        f"-{k}{v}" for k, v in sorted(gs.params.items())
    )
    return GraphSource(label, None)


# ---------------------------------------------------------------------- run ids
_HASHES: dict[tuple, str] = {}


def file_digest(path: Path) -> str:
    """SHA-1 of a file's content (cached by path, size and modification time)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha1()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def digest(data: object, n: int = 16) -> str:
    """A short SHA-1 of JSON data (keys sorted): run ids and graph keys."""
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:n]


def graph_identity(gs: GraphSpec, path: Path | None) -> dict:
    """What defines a graph instance: its source (and the file's content), dims, work, params.
    The display name is not part of it."""
    ident = {"source": gs.source(), "dims": gs.dims, "work": gs.work, "params": gs.params}
    if path is not None:
        ident["content"] = file_digest(path)
    return ident


def cluster_identity(c: str | dict, base: Path) -> tuple[str, dict]:
    """(display name, identity) of a cluster entry: an inline one by its content, a YAML file
    by its content, a preset or 'file' by its name."""
    if isinstance(c, dict):
        ident = {"inline": c}
        return str(c.get("name") or f"inline-{digest(c, 6)}"), ident
    ref = cluster_ref(c, base)
    ident = {"name": c}
    if Path(ref).is_file():
        ident["content"] = file_digest(Path(ref))
    return c, ident


def expand(cfg: ExperimentConfig, base: Path) -> list[dict]:
    """The cross product of the config as run descriptions with ids that cannot collide."""
    bench = benchdata.benchmark_dir(cfg.benchmark_dir, base)
    graphs = []
    for gs in cfg.graphs:
        label, path = graph_source(gs, base, bench)
        graphs.append((label, graph_identity(gs, path)))
    labels = [label for label, _ in graphs]
    clusters = [cluster_identity(c, base) for c in cfg.clusters]
    runs = []
    for gi, (label, g_ident) in enumerate(graphs):
        if labels.count(label) > 1:  # two graphs shown under one name: tell them apart
            label = f"{label}#{gi}"
        g_key = digest(g_ident)
        for ci, (c_name, c_ident) in enumerate(clusters):
            c_key = digest(c_ident)
            for k in cfg.devices:
                for ms in cfg.pipeline_specs():
                    tl = ms.time_limit or cfg.time_limit
                    for seed in cfg.seeds:
                        for rep in range(cfg.repeats):
                            ident = {
                                "graph": g_ident,
                                "cluster": c_ident,
                                "devices": k,
                                "method": ms.name,
                                "options": ms.options,
                                "time_limit": tl,
                                "seed": seed,
                                "repeat": rep,
                            }
                            runs.append(
                                {
                                    "id": digest(ident),
                                    "graph": label,
                                    "graph_key": g_key,
                                    "source": g_ident["source"],
                                    "graph_index": gi,
                                    "cluster_index": ci,
                                    "cluster": c_name,
                                    "cluster_key": c_key,
                                    "cluster_spec": "inline" if "inline" in c_ident else c_name,
                                    "devices": k,
                                    "method": ms.label or ms.name,
                                    "method_name": ms.name,
                                    "options": ms.options,
                                    "time_limit": tl,
                                    "seed": seed,
                                    "repeat": rep,
                                }
                            )
    if cfg.shard is not None:
        runs += _expand_shard(cfg, base, graphs, labels, clusters)
    if cfg.joint is not None:
        runs += _expand_joint(cfg, graphs, labels, clusters)
    if cfg.training is not None:
        runs += _expand_training(cfg, graphs, labels, clusters)
    return runs


def _run_header(
    kind: str, ident: dict, label: str, g_ident: dict, gi: int, ci: int, c_name: str, c_ident: dict
) -> dict:
    """The fields every sharding or joint run record starts with: its id, graph and cluster."""
    return {
        "id": digest(ident),
        "kind": kind,
        "graph": label,
        "graph_key": digest(g_ident),
        "source": g_ident["source"],
        "graph_index": gi,
        "cluster_index": ci,
        "cluster": c_name,
        "cluster_key": digest(c_ident),
        "cluster_spec": "inline" if "inline" in c_ident else c_name,
    }


def _expand_shard(cfg, base: Path, graphs: list, labels: list, clusters: list) -> list[dict]:
    """The sharding runs: ONNX graphs x clusters x meshes x memory limits x methods x seeds."""
    sh = cfg.shard
    runs = []
    for gi, (label, g_ident) in enumerate(graphs):
        gs = cfg.graphs[gi]
        if not _is_onnx(gs):
            continue
        name = label  # the name a config mapping uses
        if labels.count(label) > 1:
            label = f"{label}#{gi}"
        for ci, (c_name, c_ident) in enumerate(clusters):
            for mesh in sh.meshes:
                shape = mesh_shape(mesh, "shard.meshes")
                for mem in sh.memory:
                    mem_bytes = _memory_bytes(mem)
                    for ms in sh.method_specs():
                        tl = ms.time_limit or cfg.time_limit
                        options = method_config(ms, name, base)
                        if options is None:
                            continue
                        for seed in cfg.seeds:
                            ident = {
                                "kind": "shard",
                                "graph": g_ident,
                                "cluster": c_ident,
                                "mesh": list(shape),
                                "memory": mem_bytes,
                                "method": ms.name,
                                "options": options,
                                "time_limit": tl,
                                "seed": seed,
                            }
                            runs.append(
                                {
                                    **_run_header(
                                        "shard", ident, label, g_ident, gi, ci, c_name, c_ident
                                    ),
                                    "devices": math.prod(shape),
                                    "mesh": "x".join(map(str, shape)),
                                    "mesh_shape": list(shape),
                                    "memory": None if mem is None else str(mem),
                                    "memory_bytes": mem_bytes,
                                    "method": ms.as_method().label,
                                    "method_name": ms.name,
                                    "options": options,
                                    "time_limit": tl,
                                    "seed": seed,
                                    "repeat": 0,
                                }
                            )
    return runs


def _expand_joint(cfg, graphs: list, labels: list, clusters: list) -> list[dict]:
    """The joint runs: ONNX graphs x clusters x memory limits x spaces x seeds."""
    js = cfg.joint
    runs = []
    for gi, (label, g_ident) in enumerate(graphs):
        gs = cfg.graphs[gi]
        if not any(getattr(gs, k) is not None for k in SHARD_SOURCES):
            continue
        if labels.count(label) > 1:
            label = f"{label}#{gi}"
        for ci, (c_name, c_ident) in enumerate(clusters):
            for mem in js.memory:
                mem_bytes = _memory_bytes(mem)
                for space in js.spaces:
                    tl = js.time_limit or cfg.time_limit
                    for seed in cfg.seeds:
                        ident = {
                            "kind": "joint",
                            "graph": g_ident,
                            "cluster": c_ident,
                            "memory": mem_bytes,
                            "space": space,
                            "time_limit": tl,
                            "requests": js.requests,
                            "seed": seed,
                        }
                        runs.append(
                            {
                                **_run_header(
                                    "joint", ident, label, g_ident, gi, ci, c_name, c_ident
                                ),
                                "devices": None,
                                "memory": None if mem is None else str(mem),
                                "memory_bytes": mem_bytes,
                                "space": space,
                                "method": joint_label(space),
                                "method_name": f"joint-{space}",
                                "options": {},
                                "requests": js.requests,
                                "time_limit": tl,
                                "seed": seed,
                                "repeat": 0,
                            }
                        )
    return runs


def _expand_training(cfg, graphs: list, labels: list, clusters: list) -> list[dict]:
    """The training runs: graphs x clusters x devices x settings x memory limits x methods x
    seeds."""
    tr = cfg.training
    runs = []
    for gi, (label, g_ident) in enumerate(graphs):
        if labels.count(label) > 1:
            label = f"{label}#{gi}"
        for ci, (c_name, c_ident) in enumerate(clusters):
            for k, setting, mem, ms, seed in itertools.product(
                cfg.devices, tr.settings(), tr.memory, tr.method_specs(), cfg.seeds
            ):
                tl = ms.time_limit or cfg.time_limit
                mem_bytes = _memory_bytes(mem)
                ident = {
                    "kind": "training",
                    "graph": g_ident,
                    "cluster": c_ident,
                    "devices": k,
                    **setting,
                    "memory": mem_bytes,
                    "method": ms.name,
                    "options": ms.options,
                    "time_limit": tl,
                    "seed": seed,
                }
                runs.append(
                    {
                        **_run_header("training", ident, label, g_ident, gi, ci, c_name, c_ident),
                        "devices": k,
                        **setting,
                        "memory": None if mem is None else str(mem),
                        "memory_bytes": mem_bytes,
                        "method": ms.label,
                        "method_name": ms.name,
                        "options": ms.options,
                        "time_limit": tl,
                        "seed": seed,
                        "repeat": 0,
                    }
                )
    return runs
