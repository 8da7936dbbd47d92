"""Shared bits of the benchmark scripts: where the dnn-partitioning graphs are, known optima.

The data folder is ``$MTPP_BENCH``, else ../shared/benchmarks/dnn-partitioning beside the
project (see :mod:`solver.experiments.benchdata`); the known optima are the package's one table.
"""

from __future__ import annotations

from pathlib import Path

from solver.experiments.benchdata import KNOWN_OPTIMA, benchmark_dir, graph_path
from solver.frontends import load_graph, resolve_cluster

KNOWN = {key: opt for key, (_, _, opt) in KNOWN_OPTIMA.items()}  # optimum at the file's k
TRAINING = [
    "LayerGraphs/bert24_training",
    "LayerGraphs/gnmt_training",
    "LayerGraphs/resnet50_training",
    "LayerGraphs/inceptionv3_training",
    "OperatorGraphs/bert_l-3_training",
    "OperatorGraphs/bert_l-6_training",
    "OperatorGraphs/bert_L-12_training",
    "OperatorGraphs/resnet50_training",
]


INFERENCE = list(KNOWN)
GRAPHS = [*INFERENCE, *TRAINING]  # the 16 throughput graphs of dnn-partitioning


def path(key: str) -> Path:
    return graph_path(key, benchmark_dir())


def file_devices(key: str) -> int:
    """The k a benchmark graph's file states (``maxFPGAs``), as ``mtpp solve`` reads it."""
    return resolve_cluster(load_graph(path(key))).devices
