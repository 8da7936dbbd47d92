"""mtpp: split a neural-network graph across devices for maximum pipeline throughput.

The import package is ``solver``; the command-line tool is ``mtpp``. Data flows one way:
front end -> :class:`Graph` -> solver -> :class:`Plan` -> evaluator / simulator / exporter.
One call plans with any method, joint included: ``from solver.api import Problem, solve``
(not imported here: every ``import solver.x`` runs this file, and the planners behind
:mod:`solver.api` would add about half of this package's import time to each).
"""

from solver.core.cluster import Cluster, load_cluster
from solver.core.cost import evaluate, lower_bound, validate
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.pipeline.plan import Plan

__version__ = "0.1.0"
__all__ = [
    "Cluster",
    "Graph",
    "MtppError",
    "Plan",
    "evaluate",
    "load_cluster",
    "lower_bound",
    "validate",
    "__version__",
]
