"""mtpp's exact solver side by side with the published dynamic program of dnn-partitioning.

    python benchmarks/bench_vs_dp.py --dp /path/to/dp --json vs_dp.json
    MTPP_DP=/path/to/dp python benchmarks/bench_vs_dp.py --only bert --ks 8
    python benchmarks/bench_vs_dp.py --dp-from vs_dp.json   # reuse the DP times of an earlier run
    python benchmarks/bench_vs_dp.py --table-from vs_dp.json  # print a saved run again

The 16 throughput graphs at k in {the file's k, 2, 4, 8}, one instance at a time (the DP is
single-threaded, CP-SAT uses every core). The DP is the repository's ``throughput-dp/dp.cpp``
(msr-fiddle/dnn-partitioning), compiled with ``g++ -O2 -std=c++17``; it reads k from the file, so
it gets a copy with ``maxFPGAs = k`` and ``maxCPUs = 0`` (accelerators only, as mtpp plans). Its
time is the process's wall time; it has no answer past ``--dp-timeout`` (Inception-v3). On an
instance no plan fits, its table holds 1e30 and its backtrack stops with "computed max load !=
max load from DP": that is read as infeasible.

mtpp runs as ``mtpp solve GRAPH -k K --time-limit 60 --json`` in a subprocess: "wall" includes
start-up, "solve" is the plan's ``wall_seconds`` and the stages come from its stats. The DP and
mtpp must agree on the optimum (relative 1e-6) or both say infeasible; mtpp must say OPTIMAL.
CPU seconds (user + system of the child) are recorded too: on a loaded machine they are the
better measure (the single-threaded DP's stay near its idle wall time; mtpp's are never below
its idle wall time, so a ratio of CPU seconds errs against mtpp).
Without ``--dp`` / ``$MTPP_DP`` only mtpp runs (the table says so).

Bytecode: the package's modules are compiled first, as an installed package has them (pip
writes them at install, Python at the first import), and mtpp runs without
``PYTHONDONTWRITEBYTECODE``; with that variable set (as on the development machine) every
changed module would be compiled again in every run, 0.1-0.2 s of start-up no user pays.
``--no-compile`` measures as before.
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common import GRAPHS, file_devices, path

import solver
from solver.experiments.benchdata import known_optimum

AGREE_RTOL = 1e-6
DP_INFEASIBLE_MARK = "computed max load != max load from DP"  # its table holds 1e30
MTPP_INFEASIBLE_MARK = "proven: no valid plan"
TARGET_SECONDS = 2.0  # every instance proven within this, or within the DP's time above it
TARGET_RATIO = 3.0  # geometric mean of DP time / mtpp time where the DP needs > RATIO_FLOOR
RATIO_FLOOR = 0.05
INCEPTION_TARGET = 5.0
TINY_TARGET = 0.5
TINY_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny_transformer.json"


@dataclass
class ProcessRun:
    """One child process: its wall and CPU seconds, exit code, output."""

    wall: float
    cpu: float
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str


@dataclass
class DpRun:
    """The DP on one instance: ``status`` is optimal, infeasible, timeout, error or not run."""

    status: str
    wall: float = math.nan
    cpu: float = math.nan
    objective: float | None = None
    note: str = ""


@dataclass
class Stages:
    """Where mtpp's time went, in seconds (from the plan's stats; NaN when not reported)."""

    startup: float = math.nan  # process wall - solve: imports, reading the graph, output
    bound: float = math.nan  # the certified-bound phase (includes the ideals DP when it runs)
    chain_dp: float = math.nan  # the exact DP over ideals (the separator chain's, or all)
    warm_start: float = math.nan
    build: float = math.nan  # building the CP-SAT model
    search: float = math.nan  # the rest of the method's time: the CP-SAT search
    tie_break: float = math.nan
    how: str = ""  # what proved the plan


@dataclass
class MtppRun:
    """``mtpp solve`` on one instance."""

    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, TIMEOUT, ERROR
    wall: float = math.nan
    cpu: float = math.nan
    solve: float = math.nan
    objective: float | None = None
    lower_bound: float | None = None
    binding: str = ""
    stages: Stages = field(default_factory=Stages)
    stats: dict = field(default_factory=dict)
    note: str = ""


@dataclass
class Instance:
    """One graph at one k, both solvers, and whether they agree."""

    key: str
    k: int
    file_k: bool
    dp: DpRun
    mtpp: MtppRun
    agree: str = "-"
    known: float | None = None


CHILD_ENV: dict[str, str] = {}  # the children's environment (compile_modules); empty: ours


def run_process(cmd: list[str], timeout: float, stdin_path: Path | None = None) -> ProcessRun:
    """Run ``cmd`` to the end or ``timeout``; wall and CPU seconds of the child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL  # noqa: SIM115
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=CHILD_ENV or None,
        )
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = None, _text(e.stdout), _text(e.stderr)
    finally:
        if stdin_path:
            stdin.close()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return ProcessRun(wall, cpu, code, out, err)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def run_dp(binary: Path, key: str, k: int, timeout: float) -> DpRun:
    """The published DP on ``key`` with ``maxFPGAs = k`` and no CPU."""
    data = json.loads(path(key).read_text())
    data["maxFPGAs"], data["maxCPUs"] = k, 0
    with tempfile.TemporaryDirectory(prefix="bench_vs_dp-") as tmp:
        src = Path(tmp) / "instance.json"
        src.write_text(json.dumps(data))
        proc = run_process([str(binary)], timeout, stdin_path=src)
    if proc.returncode is None:
        return DpRun("timeout", proc.wall, proc.cpu, note=f"no answer in {timeout:g} s")
    if DP_INFEASIBLE_MARK in proc.stdout:
        return DpRun("infeasible", proc.wall, proc.cpu)
    try:
        objective = float(json.loads(proc.stdout)["maxLoad"])
    except (ValueError, KeyError, TypeError):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        return DpRun("error", proc.wall, proc.cpu, note=" ".join(tail))
    return DpRun("optimal", proc.wall, proc.cpu, objective)


MTPP_COMMAND: list[str] = []  # --mtpp, when given


def compile_modules() -> str:
    """Compile the modules of the ``solver`` package this Python imports (the default mtpp's)
    and let the children write bytecode for the modules they still miss (another ``--mtpp``
    tree: its first runs); the line the run prints (module docstring)."""
    package = Path(solver.__file__).resolve().parent
    ok = compileall.compile_dir(package, quiet=1)
    CHILD_ENV.update(os.environ)
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    state = "compiled" if ok else "compiled with errors"
    return f"bytecode: {package} {state}; mtpp runs without PYTHONDONTWRITEBYTECODE"


def mtpp_command() -> list[str]:
    """``--mtpp``, else the installed ``mtpp`` beside this Python, else ``python -m solver.cli``."""
    if MTPP_COMMAND:
        return MTPP_COMMAND
    exe = Path(sys.executable).parent / "mtpp"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("mtpp")
    return [found] if found else [sys.executable, "-m", "solver.cli"]


def run_mtpp(graph: Path, k: int | None, time_limit: float) -> MtppRun:
    """``mtpp solve GRAPH [-k K] --time-limit T --json -q`` as a subprocess."""
    cmd = [*mtpp_command(), "solve", str(graph), "--time-limit", f"{time_limit:g}", "--json", "-q"]
    if k is not None:
        cmd += ["-k", str(k)]
    proc = run_process(cmd, time_limit * 3 + 60)
    if proc.returncode is None:
        return MtppRun("TIMEOUT", proc.wall, proc.cpu, note="killed past 3x the time limit")
    if proc.returncode != 0:
        status = "INFEASIBLE" if MTPP_INFEASIBLE_MARK in proc.stderr else "ERROR"
        note = " ".join(proc.stderr.strip().splitlines()[-1:])
        return MtppRun(status, proc.wall, proc.cpu, note=note)
    plan = json.loads(proc.stdout)
    stats = plan.get("stats", {})
    solve = float(plan.get("wall_seconds", math.nan))
    return MtppRun(
        status=str(plan.get("status")),
        wall=proc.wall,
        cpu=proc.cpu,
        solve=solve,
        objective=plan.get("objective"),
        lower_bound=plan.get("lower_bound"),
        binding=str(stats.get("bound", {}).get("binding", "")),
        stages=stages_of(stats, solve, proc.wall),
        stats=stats,
    )


def stages_of(stats: dict, solve: float, wall: float) -> Stages:
    """The stage breakdown of one plan's stats (missing stages stay NaN)."""
    s = Stages(startup=wall - solve)
    s.bound = _seconds(stats.get("bound", {}).get("certified", {}))
    s.chain_dp = _seconds(stats.get("chain_dp", stats.get("ideals_dp", {})))
    s.warm_start = float(stats.get("warm_start_seconds", math.nan))
    s.build = float(stats.get("build_seconds", math.nan))
    s.tie_break = _seconds(stats.get("tie_break", {}))
    if "cpsat_status" in stats:
        spent = [s.bound, s.warm_start, s.build, s.tie_break]
        s.search = max(0.0, solve - sum(x for x in spent if not math.isnan(x)))
    s.how = how_proved(stats)
    return s


def _seconds(part: dict) -> float:
    return float(part.get("seconds", math.nan)) if isinstance(part, dict) else math.nan


def how_proved(stats: dict) -> str:
    """A few words on what settled the instance."""
    if "ideals_dp" in stats:  # the DP over all ideals (training graphs), not the chain's
        return "ideals DP (free nodes priced), no search"
    if "proof" in stats and "stopped" in stats:  # the DP ran only for the exact tie-break
        return "met bound: " + str(stats["stopped"]).split(":")[0] + "; tie-break by the chain DP"
    if "proof" in stats:
        return f"{stats.get('bound_source', 'proof')} DP, no search"
    if "stopped" in stats:
        return "met bound: " + str(stats["stopped"]).split(":")[0]
    if "cpsat_status" in stats:
        return f"CP-SAT {stats['cpsat_status']}"
    return ""


def agreement(dp: DpRun, mtpp: MtppRun) -> str:
    """yes / NO / not proven (the DP's value, no proof) / - (the DP has no answer)."""
    if dp.status == "infeasible" or mtpp.status == "INFEASIBLE":
        return "yes" if dp.status == "infeasible" and mtpp.status == "INFEASIBLE" else "NO"
    if dp.objective is None:
        return "-"
    if mtpp.objective is None:
        return "NO"
    if not math.isclose(dp.objective, mtpp.objective, rel_tol=AGREE_RTOL):
        return "NO"
    return "yes" if mtpp.status == "OPTIMAL" else "not proven"


@dataclass(frozen=True)
class Case:
    """A graph at one k, and whether that k is the one its file states."""

    key: str
    k: int
    file_k: bool


def instances(only: str | None, ks: list[int]) -> list[Case]:
    """Every graph at its file's k and at ``ks``, duplicates dropped."""
    runs = []
    for key in GRAPHS:
        if only and only.lower() not in key.lower():
            continue
        own = file_devices(key)
        runs.append(Case(key, own, True))
        runs += [Case(key, k, False) for k in ks if k != own]
    return runs


def measure(args: argparse.Namespace, dp_binary: Path | None, reuse: dict) -> list[Instance]:
    """Run every instance, one at a time, printing its row as it finishes."""
    out = []
    for case in instances(args.only, args.ks):
        if (case.key, case.k) in reuse:
            dp = reuse[(case.key, case.k)]
        elif dp_binary is not None:
            dp = run_dp(dp_binary, case.key, case.k, args.dp_timeout)
        else:
            dp = DpRun("not run")
        mt = run_mtpp(path(case.key), case.k, args.time_limit)
        inst = Instance(case.key, case.k, case.file_k, dp, mt, agreement(dp, mt))
        inst.known = known_optimum(case.key, _nodes(case.key), case.k) if case.file_k else None
        if inst.known is not None and not _matches_known(inst.known, mt.objective):
            inst.agree += " (not the known optimum)"
        print(row(inst), flush=True)
        out.append(inst)
        if args.json:  # after every instance: a long run that stops keeps what it measured
            save(args.json, out, [])
    return out


def save(file: Path, insts: list[Instance], lines: list[str]) -> None:
    """The records and summary lines as JSON (NaN where a time is missing)."""
    records = {"instances": [asdict(i) for i in insts], "summary": lines}
    file.write_text(json.dumps(records, indent=1, default=str))


def _nodes(key: str) -> int:
    return len(json.loads(path(key).read_text())["nodes"])


def _matches_known(known: float, objective: float | None) -> bool:
    # the table's Inception value is CP-SAT's at a 1e-4 resolution: 4 decimals
    return objective is not None and math.isclose(known, objective, rel_tol=1e-6, abs_tol=1e-4)


HEADER = (
    "| graph | k | DP s | mtpp wall s | mtpp solve s | mtpp CPU s | DP/mtpp | mtpp status | "
    "agree | objective | bound s | ideals DP s | warm s | build s | search s | tie-break s | "
    "start-up s | how |"
)


def row(inst: Instance) -> str:
    """One Markdown row."""
    dp, mt, st = inst.dp, inst.mtpp, inst.mtpp.stages
    dp_s = _fmt(dp.wall) if dp.status in ("optimal", "infeasible") else dp.status
    if dp.status == "timeout":
        dp_s = f"> {dp.wall:.0f}"
    k = f"{inst.k} (file)" if inst.file_k else str(inst.k)
    obj = "-" if mt.objective is None else f"{mt.objective:.10g}"
    cells = [
        inst.key,
        k,
        dp_s,
        _fmt(mt.wall),
        _fmt(mt.solve),
        _fmt(mt.cpu),
        _fmt(ratio(inst), 2),
        mt.status,
        inst.agree,
        obj,
        _fmt(st.bound),
        _fmt(st.chain_dp),
        _fmt(st.warm_start),
        _fmt(st.build),
        _fmt(st.search),
        _fmt(st.tie_break),
        _fmt(st.startup),
        st.how or mt.note,
    ]
    return "| " + " | ".join(cells) + " |"


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def ratio(inst: Instance) -> float:
    """DP wall / mtpp wall; NaN where the DP has no time."""
    if inst.dp.status not in ("optimal", "infeasible"):
        return math.nan
    return inst.dp.wall / inst.mtpp.wall


def tiny_row(time_limit: float) -> str:
    """The README's first command, ``mtpp solve examples/tiny_transformer.json``."""
    mt = run_mtpp(TINY_EXAMPLE, None, time_limit)
    verdict = "met" if mt.solve <= TINY_TARGET else "NOT met"
    return (
        f"- `mtpp solve examples/tiny_transformer.json`: {mt.status}, solve {_fmt(mt.solve)} s "
        f"(target <= {TINY_TARGET:g} s: {verdict}), process wall {_fmt(mt.wall)} s, "
        f"bound {_fmt(mt.stages.bound)} s, {mt.stages.how}"
    )


def proven(inst: Instance) -> bool:
    """mtpp proved the instance: OPTIMAL, or infeasible with a proof."""
    return inst.mtpp.status in ("OPTIMAL", "INFEASIBLE")


def within_target(inst: Instance, seconds: float, dp_seconds: float) -> bool:
    """Proven in at most 2 s, or in at most the DP's time where the DP needs more."""
    if not proven(inst):
        return False
    dp_time = dp_seconds if inst.dp.status in ("optimal", "infeasible", "timeout") else 0.0
    return seconds <= max(TARGET_SECONDS, dp_time)


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def summary(insts: list[Instance], dp_ran: bool) -> list[str]:
    """The lines the targets need, on the process wall time and on the reported solve time."""
    lines = [
        f"- instances: {len(insts)}; mtpp proved {sum(proven(i) for i in insts)}; "
        f"agree with the DP: {sum(i.agree.startswith('yes') for i in insts)}, "
        f"disagree: {sum(i.agree.startswith('NO') for i in insts)}, "
        f"same value, not proven: {sum(i.agree.startswith('not proven') for i in insts)}, "
        f"DP without an answer: {sum(i.agree.startswith('-') for i in insts)}"
    ]
    for view in VIEWS:
        lines += _timing_lines(insts, view, dp_ran)
    return lines


@dataclass(frozen=True)
class TimingView:
    """One way to time both solvers: process wall, mtpp's own solve time, or CPU seconds."""

    label: str
    mtpp: Callable[[Instance], float]
    dp: Callable[[Instance], float]


VIEWS = [
    TimingView("wall", lambda i: i.mtpp.wall, lambda i: i.dp.wall),
    TimingView(
        "solve",
        lambda i: i.mtpp.wall if math.isnan(i.mtpp.solve) else i.mtpp.solve,
        lambda i: i.dp.wall,
    ),
    TimingView("cpu", lambda i: i.mtpp.cpu, lambda i: i.dp.cpu),
    # the DP's CPU seconds stay near its idle time: the view to read when the DP's times come
    # from another, differently loaded run (--dp-from)
    TimingView(
        "solve vs DP cpu",
        lambda i: i.mtpp.wall if math.isnan(i.mtpp.solve) else i.mtpp.solve,
        lambda i: i.dp.cpu,
    ),
]


def _timing_lines(insts: list[Instance], view: TimingView, dp_ran: bool) -> list[str]:
    """Target lines for one way of timing both solvers."""
    label, time_of, dp_of = view.label, view.mtpp, view.dp
    late = [i for i in insts if not within_target(i, time_of(i), dp_of(i))]
    slowest = max(insts, key=time_of)
    lines = [
        f"- [{label}] every instance proven in <= {TARGET_SECONDS:g} s or <= the DP's time: "
        f"{'met' if not late else 'NOT met'} ({len(late)} late"
        + (": " + ", ".join(f"{i.key} k={i.k} {time_of(i):.2f} s" for i in late) if late else "")
        + ")",
        f"- [{label}] median mtpp {statistics.median(map(time_of, insts)):.2f} s; slowest "
        f"{slowest.key} k={slowest.k}: {time_of(slowest):.2f} s (DP {_fmt(dp_of(slowest))} s)",
    ]
    inception = [i for i in insts if "inception" in i.key and i.dp.status != "optimal"]
    if inception:
        worst = max(map(time_of, inception))
        lines.append(
            f"- [{label}] Inception where the DP has no answer ({len(inception)} instances): "
            f"slowest {worst:.2f} s (target <= {INCEPTION_TARGET:g} s: "
            f"{'met' if worst <= INCEPTION_TARGET else 'NOT met'})"
        )
    if dp_ran:
        timed = [i for i in insts if i.dp.status == "optimal" and i.dp.wall > RATIO_FLOOR]
        gm = geomean([dp_of(i) / time_of(i) for i in timed])
        lines.append(
            f"- [{label}] geometric mean of DP time / mtpp time where the DP needs > "
            f"{RATIO_FLOOR:g} s ({len(timed)} instances): {gm:.2f}x (target >= {TARGET_RATIO:g}x: "
            f"{'met' if gm >= TARGET_RATIO else 'NOT met'})"
        )
    return lines


def load_dp_runs(file: Path) -> dict[tuple[str, int], DpRun]:
    """The DP results of an earlier ``--json`` file, by (graph, k)."""
    records = json.loads(file.read_text())["instances"]
    return {(r["key"], r["k"]): DpRun(**r["dp"]) for r in records if r["dp"]["status"] != "not run"}


def load_instances(file: Path) -> list[Instance]:
    """The records of an earlier ``--json`` file (agreement judged again)."""
    out = []
    for r in json.loads(file.read_text())["instances"]:
        mt = dict(r["mtpp"])
        mt["stages"] = Stages(**mt["stages"])
        inst = Instance(r["key"], r["k"], r["file_k"], DpRun(**r["dp"]), MtppRun(**mt))
        inst.agree, inst.known = agreement(inst.dp, inst.mtpp), r.get("known")
        out.append(inst)
    return out


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--dp",
        type=Path,
        default=os.environ.get("MTPP_DP"),
        help="the compiled DP binary (default $MTPP_DP; without it only mtpp runs)",
    )
    ap.add_argument(
        "--dp-from", type=Path, default=None, help="reuse the DP results of an earlier --json file"
    )
    ap.add_argument("--dp-timeout", type=float, default=120.0)
    ap.add_argument("--time-limit", type=float, default=60.0, help="mtpp's --time-limit")
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    ap.add_argument("--only", default=None, help="substring filter on graph keys")
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny_transformer row")
    ap.add_argument(
        "--no-compile",
        action="store_true",
        help="measure without compiling the modules first (see the top of this file)",
    )
    ap.add_argument("--json", type=Path, default=None, help="save every record here")
    ap.add_argument(
        "--table-from",
        type=Path,
        default=None,
        help="print the table and summary of an earlier --json file; runs nothing",
    )
    ap.add_argument(
        "--mtpp",
        default=None,
        help="the command that runs mtpp, e.g. 'env PYTHONPATH=/tmp/head python -m solver.cli' "
        "to measure an exported commit, run from outside a checkout (python -m puts the "
        "current folder first on the path) (default: the mtpp beside this Python)",
    )
    args = ap.parse_args(argv)
    if args.dp is not None and not Path(args.dp).is_file():
        ap.exit(2, f"bench_vs_dp: --dp {args.dp}: no such file; compile dp.cpp first\n")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table_from:
        return print_saved(args.table_from)
    if args.mtpp:
        MTPP_COMMAND[:] = shlex.split(args.mtpp)
    reuse = load_dp_runs(args.dp_from) if args.dp_from else {}
    dp_ran = args.dp is not None or bool(reuse)
    print(f"start: {load_average()}; mtpp: {' '.join(mtpp_command())}")
    if not args.no_compile:
        print(compile_modules())
    if not dp_ran:
        print("no DP binary (--dp or $MTPP_DP): mtpp only, no agreement or ratio")
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    insts = measure(args, Path(args.dp) if args.dp else None, reuse)
    lines = summary(insts, dp_ran) if insts else []
    if not args.no_tiny:
        lines.append(tiny_row(args.time_limit))
    lines.append(f"- end: {load_average()}")
    print("\n" + "\n".join(lines))
    if args.json:
        save(args.json, insts, lines)
    return 0 if all(not i.agree.startswith("NO") for i in insts) else 1


def print_saved(file: Path) -> int:
    """The table and summary of a saved run (its tiny_transformer and load lines as saved)."""
    insts = load_instances(file)
    saved = json.loads(file.read_text()).get("summary", [])
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    print("\n".join(row(i) for i in insts))
    dp_ran = any(i.dp.status != "not run" for i in insts)
    kept = [ln for ln in saved if ln.startswith(("- `mtpp solve", "- end"))]
    print("\n" + "\n".join(summary(insts, dp_ran) + kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
