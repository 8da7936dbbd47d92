"""What every command shares: argument groups, loading graphs and plans, console and JSON."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from solver.core.errors import MtppError

# CONTROL_CHARS and esc live in solver.core.text (both progress bars use them); kept importable here
from solver.core.text import CONTROL_CHARS as CONTROL_CHARS
from solver.core.text import esc as esc


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs keep their line breaks (examples stay as written), and a long
    unindented line (a paragraph) is wrapped to the help width instead of running off screen."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        lines = []
        for line in text.splitlines():
            if len(line) > width and not line.startswith(" "):
                lines += textwrap.wrap(
                    line,
                    width,
                    initial_indent=indent,
                    subsequent_indent=indent,
                    break_on_hyphens=False,
                )
            else:
                lines.append(indent + line)
        return "\n".join(lines)


def formatter(prog: str) -> argparse.HelpFormatter:
    return _HelpFormatter(prog, max_help_position=32, width=100)


MAX_DIM = 2**31 - 1  # an ONNX dimension is an int64, but ORT and numpy shapes stop far below


def devices_arg(text: str) -> int:
    """argparse type of ``--devices``: a whole number from 1 to :data:`MAX_DEVICES`."""
    from solver.core.cluster import MAX_DEVICES

    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of devices, got {text!r}"
        ) from None
    if not 1 <= k <= MAX_DEVICES:
        raise argparse.ArgumentTypeError(
            f"--devices must be >= 1 and at most {MAX_DEVICES}, got {text}"
        )
    return k


def add_graph_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("graph and cluster")
    g.add_argument(
        "--cluster",
        metavar="PRESET|FILE",
        help="cluster preset name (ipu-m2000, ipu-pod, ipu-pod16, dgx-a100, dgx-a100-x2) or a "
        "cluster YAML file; "
        "default: the cluster a plan records (a cluster given with such a plan must agree with "
        "it), else what the graph file states, else the ipu-pod preset",
    )
    g.add_argument(
        "--devices",
        "-k",
        type=devices_arg,
        metavar="K",
        help="number of devices k (overrides the cluster)",
    )
    g.add_argument(
        "--memory",
        metavar="SIZE",
        help="hard memory capacity C of every device, e.g. 40GB (overrides the cluster's "
        "capacity for every method; fast memory M, which prices streaming, is unchanged)",
    )
    g.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="ONNX only: fix a dynamic input dimension, e.g. --dim batch=8 (repeatable)",
    )
    g.add_argument(
        "--work",
        choices=["roofline", "flops", "measured"],
        default="roofline",
        help="ONNX only: node time model (default roofline on the cluster)",
    )


def add_model_and_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", metavar="MODEL.onnx", help="the ONNX model the plan was made for")
    p.add_argument(
        "plan",
        metavar="PLAN",
        help="pipeline plan (mtpp solve --out) or manual-sharding YAML, whatever its file name",
    )


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


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


def load_graph_and_cluster(args: argparse.Namespace, default=None):
    """The graph and the cluster: ``--cluster`` if given, else ``default`` (the cluster a plan
    records; for an ONNX model also its roofline), else what the graph file states, else the
    default preset; ``--devices`` and ``--memory`` applied."""
    from solver.frontends import load_graph, resolve_cluster

    dims = parse_dims(args)
    spec = args.cluster if args.cluster is not None or default is None else default
    options = {}
    if Path(args.graph).suffix.lower() == ".onnx":
        options = {
            "dims": dims,
            "work": args.work,
            "cluster": spec,
            "devices": args.devices,
            "memory_ok": getattr(args, "memory_ok", False),  # mtpp run --memory-ok
        }
    g = load_graph(args.graph, **options)
    if args.cluster is None and default is not None:
        cluster = default.with_devices(args.devices)
    else:
        cluster = resolve_cluster(g, args.cluster, args.devices)
    return g, cluster.with_memory(memory_arg(args))


def memory_arg(args: argparse.Namespace) -> float | None:
    """``--memory SIZE`` in bytes (None when absent): a finite size > 0, e.g. 40GB."""
    from solver.core.units import parse_memory

    text = getattr(args, "memory", None)
    return None if text is None else parse_memory(text)


PLAIN_WIDTH = 80  # columns of tables written to a pipe or a file


def console():
    """The console of stdout: a terminal's own width; in a pipe or a file 80 columns (or
    ``$COLUMNS`` when it is set), whatever the size of a terminal elsewhere on the session."""
    import os

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
    from solver.core.files import json_safe

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
        if p.suffix.lower() == ".onnx" and p.is_file():
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
    from solver.frontends.onnx.common import external_locations

    return sorted({model.parent / loc for loc in external_locations(m)})
