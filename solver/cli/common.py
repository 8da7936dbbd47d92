"""What every command shares: loading graphs and clusters, the console, tables and JSON
(the argument groups are in :mod:`solver.cli.parsers`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

from solver import frontends  # called as frontends.load_graph: tests patch it there
from solver.core.cluster import Cluster, load_cluster
from solver.core.errors import MtppError
from solver.core.files import json_safe
from solver.core.graph import Graph
from solver.core.text import CONTROL_CHARS as CONTROL_CHARS  # lives in core.text; kept
from solver.core.text import esc as esc  # importable here
from solver.core.units import parse_memory
from solver.frontends import is_onnx_file
from solver.frontends.onnx.common import external_locations

MAX_DIM = 2**31 - 1  # an ONNX dimension is an int64, but ORT and numpy shapes stop far below


def parse_dims(args: argparse.Namespace) -> dict[str, int]:
    """``--dim NAME=VALUE`` options as a mapping; VALUE a whole number from 1 to MAX_DIM."""
    dims: dict[str, int] = {}
    for item in args.dim:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise MtppError(f"--dim {item!r}: write NAME=VALUE, e.g. --dim batch=8")
        if name in dims:
            raise MtppError(f"--dim {item!r}: dimension {name!r} is given twice")
        if not re.fullmatch(r"\s*\+?\d{1,12}\s*", value):
            raise MtppError(f"--dim {item!r}: VALUE must be a whole number, e.g. --dim {name}=8")
        dims[name] = int(value)
        if not 1 <= dims[name] <= MAX_DIM:
            raise MtppError(f"--dim {item!r}: VALUE must be between 1 and {MAX_DIM}")
    return dims


def load_graph_and_cluster(
    args: argparse.Namespace, known: Cluster | None = None
) -> tuple[Graph, Cluster]:
    """The graph and the cluster: ``known`` if given (the cluster a plan records, or
    ``--cluster`` already read and checked against it; for an ONNX model also its roofline),
    else ``--cluster``, else what the graph file states, else the default preset; ``--devices``
    and ``--memory`` applied. A cluster file is read once."""
    dims = parse_dims(args)
    onnx = is_onnx_file(args.graph)
    if known is None and args.cluster is not None and onnx:
        known = load_cluster(args.cluster, args.devices)  # the roofline's and the command's
    options = {}
    if onnx:
        options = {
            "dims": dims,
            "work": args.work,
            "cluster": known,
            "devices": args.devices,
            "memory_ok": getattr(args, "memory_ok", False),  # mtpp run --memory-ok
            # training plans read each operator's backward work and stash (docs/training.md)
            "training_costs": getattr(args, "schedule", None) is not None
            or getattr(args, "training_costs", False),
        }
    g = frontends.load_graph(args.graph, **options)
    if known is not None:
        cluster = known.with_devices(args.devices)
    else:
        cluster = frontends.resolve_cluster(g, args.cluster, args.devices)
    return g, cluster.with_memory(memory_arg(args))


def memory_arg(args: argparse.Namespace) -> float | None:
    """``--memory SIZE`` in bytes (None when absent): a finite size > 0, e.g. 40GB."""
    text = getattr(args, "memory", None)
    return None if text is None else parse_memory(text)


PLAIN_WIDTH = 80  # columns of tables written to a pipe or a file


def console():
    """The console of stdout: a terminal's own width; in a pipe or a file 80 columns (or
    ``$COLUMNS`` when it is set), whatever the size of a terminal elsewhere on the session."""
    from rich.console import Console

    con = Console(highlight=False)
    if not con.is_terminal:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) >= 20 else PLAIN_WIDTH
        con = Console(highlight=False, width=width)
    return con


def print_list_line(con, text: str, sep: str = ", ") -> None:
    """Print a comma-separated line (a cluster summary) wrapped only after a separator, so that
    a value and its unit ("16 GB/s") never land on two lines; continuation lines are indented.
    ``text`` is printed literally (no markup)."""
    from rich.text import Text

    lines, line = [], ""
    for part in text.split(sep):
        piece = part if not line else sep + part
        if line and len(line) + len(piece.rstrip()) + len(sep.rstrip()) > con.width:
            lines.append(line + sep.rstrip())
            line = "  " + part
        else:
            line += piece
    lines.append(line)
    for x in lines:  # an item wider than the console (a long name) is folded by rich
        con.print(Text(x), soft_wrap=len(x) <= con.width)


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.6g}"


TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))
BYTE_UNITS = (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10), ("B", 1.0))


class ColumnUnit:
    """One unit for a group of table columns, so that cells are bare numbers with the unit in
    the header (narrow tables): the largest unit in which the largest value is at least 1,
    with the decimals that give that value four significant digits.

    >>> u = ColumnUnit([0.0091, 0.0003, 0.0], TIME_UNITS)
    >>> u.name, u.cell(0.0091), u.cell(0.0003), u.cell(0.0), u.cell(1e-9)
    ('ms', '9.100', '0.300', '0', '<0.001')
    >>> u = ColumnUnit([5e29, 2.0], TIME_UNITS)
    >>> u.cell(5e29), u.cell(2.0)
    ('5e+29', '~0')
    """

    def __init__(self, values, units: tuple[tuple[str, float], ...]):
        finite = [abs(float(v)) for v in values if math.isfinite(v)]
        top = max(finite, default=0.0)
        self.name, self.scale = next(((n, s) for n, s in units if top >= s), units[-1])
        if top == 0:
            self.name, self.scale = units[0] if units[0][0] == "s" else units[-1]
        digits = math.floor(math.log10(top / self.scale)) if top else 0
        self.decimals = max(0, 3 - digits)
        self.top = top
        self.exponent = digits >= 7  # 1.234e+12: a fixed-point cell would be wider than a row
        if self.name == "B" and all(v.is_integer() for v in finite):
            self.decimals = 0  # whole bytes

    def cell(self, x: float) -> str:
        if not math.isfinite(x):
            return str(x)
        if x == 0:
            return "0"
        if self.exponent:  # values a million times below the column's largest are noise here
            return "~0" if abs(x) < self.top * 1e-6 else f"{x / self.scale:.4g}"
        text = f"{x / self.scale:.{self.decimals}f}"
        if float(text) == 0:
            return f"<{10.0**-self.decimals:.{self.decimals}f}"
        return text


def print_json(obj: dict) -> None:
    """Print one JSON object; NaN and infinities become null (JSON has neither)."""
    sys.stdout.write(json.dumps(json_safe(obj), indent=1, allow_nan=False))
    sys.stdout.write("\n")


def input_paths(args: argparse.Namespace) -> list[Path]:
    """Every file the command reads: the graph or model, plan, sharding points, a strategy
    config, a cluster YAML, and an ONNX model's external-data files. An output path must be
    none of them."""
    keys = ("graph", "model", "plan", "sharding", "config")
    paths = [Path(p) for p in (getattr(args, k, None) for k in keys) if p]
    cluster = getattr(args, "cluster", None)
    if cluster and Path(cluster).is_file():
        paths.append(Path(cluster))
    for p in list(paths):
        if p.is_file() and is_onnx_file(p):
            paths += _external_data_files(p)
    return paths


def _external_data_files(model: Path) -> list[Path]:
    """The external-data files an ONNX model names (none when it cannot be parsed: the loader
    reports that with its own message later)."""
    try:
        import onnx

        m = onnx.load(str(model), load_external_data=False)
    except Exception:  # noqa: BLE001 -- any unreadable model: the loader will say why
        return []
    return sorted({model.parent / loc for loc in external_locations(m)})
