"""The dnn-partitioning benchmark graphs: where their files are, and their proven optima.

The data is not shipped with the package (see ../shared/benchmarks/dnn-partitioning/README.md).
Its folder is, in this order: the ``benchmark_dir:`` key of an experiment config (relative to
the config file), the environment variable ``MTPP_BENCH``, else
``../shared/benchmarks/dnn-partitioning`` beside the project that holds the current folder (the
nearest folder, the current one or a parent, with a ``pyproject.toml``).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "MTPP_BENCH"
DEFAULT_RELATIVE = Path("../shared/benchmarks/dnn-partitioning")

# The optima of the inference graphs at the file's k on the cluster the file states
# (maxFPGAs, maxSizePerFPGA), from the benchmark README: the repository's exact dynamic program,
# confirmed by CP-SAT. key -> (nodes, k, optimal bottleneck). The one table of the project.
KNOWN_OPTIMA: dict[str, tuple[int, int, float]] = {
    "LayerGraphs/bert24_inference": (32, 6, 17.78990625),
    "LayerGraphs/gnmt_inference": (96, 6, 32.910658203125),
    "LayerGraphs/resnet50_inference": (177, 6, 34.2228515625),
    "LayerGraphs/inceptionv3_inference": (326, 6, 52.2016),  # CP-SAT at 1e-4 s: 4 decimals
    "OperatorGraphs/bert_l-3_inference": (235, 3, 27.9185676799125),
    "OperatorGraphs/bert_l-6_inference": (418, 3, 33.989101556140085),
    "OperatorGraphs/bert_l-12_inference": (783, 6, 147.47798444934838),
    "OperatorGraphs/resnet50_inference": (604, 6, 128.0735111041098),
}


def project_root(start: Path | None = None) -> Path | None:
    """The nearest folder (``start`` or a parent) holding a ``pyproject.toml``, if any."""
    start = (start or Path.cwd()).resolve()
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file():
            return d
    return None


def benchmark_dir(configured: str | None = None, config_dir: Path | None = None) -> Path:
    """The dnn-partitioning folder: ``configured`` (relative to ``config_dir``), else
    ``$MTPP_BENCH``, else ../shared/benchmarks/dnn-partitioning beside the current project.

    >>> str(benchmark_dir("/data/dnnpart"))
    '/data/dnnpart'
    """
    if configured:
        p = Path(configured).expanduser()
        return p if p.is_absolute() or config_dir is None else config_dir / p
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    root = project_root() or Path.cwd()
    return (root / DEFAULT_RELATIVE).resolve()


def graph_path(key: str, folder: Path) -> Path:
    """The file of a benchmark graph key such as ``LayerGraphs/bert24_inference``."""
    return folder / "throughput-inputs" / f"{key}.json"


def known_optimum(key: str | None, nodes: int | None, k: int | None) -> float | None:
    """The table's optimum for ``key`` if the instance is the one it was proved for (same node
    count and k); the caller must also make sure the cluster is the one the file states.

    >>> known_optimum("LayerGraphs/bert24_inference", 32, 6)
    17.78990625
    >>> known_optimum("LayerGraphs/bert24_inference", 32, 4) is None
    True
    """
    entry = KNOWN_OPTIMA.get(key or "")
    if entry is None or entry[0] != nodes or entry[1] != k:
        return None
    return entry[2]
