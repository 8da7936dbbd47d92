"""Solve progress on stderr: plain lines when not a terminal (timed by a fake clock), a live
line on a terminal, silence when quick, with -q, or disabled; --json keeps stdout pure."""

import io
import json

import pytest
from rich.console import Console

from solver.cli import main
from solver.cli.progress import FIRST_LINE_DELAY, SolveProgress
from solver.pipeline.plan import FEASIBLE
from tests.conftest import bench_path


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain(width: int = 200) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=width), buf


def lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


def test_plain_lines_follow_the_search():
    con, buf = plain()
    clock = Clock()
    with SolveProgress(True, "cpsat g", 60, console=con, clock=clock) as prog:
        prog.note("warm start (slicing topological orders)")
        clock.now += 0.3
        prog.update(10.0, 5.0, elapsed=123.0)  # the warm-start plan; elapsed is ignored
        assert lines(buf) == []  # nothing in the first seconds
        clock.now = 100 + FIRST_LINE_DELAY
        prog.tick()
        assert lines(buf) == ["cpsat g: incumbent 10 s  bound 5 s  gap 50%  (2.0 s of 60 s)"]
        clock.now += 0.5
        prog.update(9.0, float("-inf"))  # better, but too soon after the last line
        assert len(lines(buf)) == 1
        clock.now += 0.5
        prog.tick()  # one second after the last line: the improvement is printed
        assert lines(buf)[-1] == "cpsat g: incumbent 9 s  bound 5 s  gap 44.4%  (3.0 s of 60 s)"
        clock.now += 4.0
        prog.update(9.5, 4.0)  # neither better: nothing changes, nothing due
        prog.tick()
        assert len(lines(buf)) == 2
        clock.now += 1.0
        prog.tick()  # five seconds without news: a line that shows the time
        assert lines(buf)[-1] == "cpsat g: incumbent 9 s  bound 5 s  gap 44.4%  (8.0 s of 60 s)"
        clock.now += 0.5
        prog.update(float("inf"), 6.0)  # a better bound only: waits for the interval
        assert len(lines(buf)) == 3
        clock.now += 0.5
    # the exit prints the state that was not shown yet
    assert lines(buf)[-1] == "cpsat g: incumbent 9 s  bound 6 s  gap 33.3%  (9.0 s of 60 s)"
    assert len(lines(buf)) == 4 and prog.printed == 4
    assert (prog.best, prog.bound) == (9.0, 6.0)


def test_a_quick_run_prints_nothing():
    con, buf = plain()
    clock = Clock()
    with SolveProgress(True, "cpsat g", 60, console=con, clock=clock) as prog:
        prog.note("warm start")
        for i in range(10):
            clock.now += 0.15
            prog.update(3.0 - 0.1 * i, 1.0)
            prog.tick()
    assert buf.getvalue() == "" and prog.printed == 0


def test_steps_before_an_incumbent_and_no_time_limit():
    con, buf = plain()
    clock = Clock()
    with SolveProgress(True, "shard m.onnx", console=con, clock=clock) as prog:
        clock.now += FIRST_LINE_DELAY
        prog.tick()
        clock.now += 6
        prog.note("building the CP-SAT model")
        clock.now += 100
        prog.tick()
    assert lines(buf) == [
        "shard m.onnx: starting  (2.0 s)",
        "shard m.onnx: building the CP-SAT model  (8.0 s)",
        "shard m.onnx: building the CP-SAT model  (108 s)",
    ]


def test_no_final_line_when_the_solve_fails():
    con, buf = plain()
    clock = Clock()
    prog = SolveProgress(True, "cpsat g", 60, console=con, clock=clock)
    with pytest.raises(RuntimeError), prog:
        clock.now += FIRST_LINE_DELAY
        prog.update(4.0, 1.0)
        clock.now += 0.5
        prog.update(3.0, 1.0)  # pending
        raise RuntimeError("boom")
    assert len(lines(buf)) == 1 and "incumbent 4 s" in lines(buf)[0]


def test_a_bound_above_the_incumbent_is_said():
    con, buf = plain()
    clock = Clock()
    with SolveProgress(True, "cpsat g", 60, console=con, clock=clock) as prog:
        clock.now += FIRST_LINE_DELAY
        prog.update(1.0, 2.0)
    assert "the bound exceeds the incumbent" in buf.getvalue()
    assert prog.gap() == 0.0


def test_names_are_printed_literally_on_one_line():
    con, buf = plain(width=40)
    clock = Clock()
    title = "cpsat [red]g[/]\x1b[31m" + "x" * 60
    with SolveProgress(True, title, 5, console=con, clock=clock) as prog:
        clock.now += FIRST_LINE_DELAY
        prog.update(0.0125, 0.01)
    (line,) = lines(buf)  # a long line is not wrapped: one line per event in a log
    assert line.startswith("cpsat [red]g[/]?[31mxxx") and "\x1b" not in line
    assert line.endswith("incumbent 12.5 ms  bound 10 ms  gap 20%  (2.0 s of 5 s)")


def test_disabled_prints_nothing():
    con, buf = plain()
    clock = Clock()
    with SolveProgress(False, "cpsat g", 60, console=con, clock=clock) as prog:
        clock.now += 10
        prog.note("x")
        prog.update(1.0, 0.5)
        prog.tick()
    assert buf.getvalue() == "" and prog.best == float("inf")


def test_terminal_gets_a_live_line_that_clears():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=100)
    clock = Clock()
    with SolveProgress(True, "cpsat g", 60, console=con, clock=clock) as prog:
        clock.now += 1.25
        prog.update(2.0, 1.0)
        assert prog._live is not None
        prog._live.refresh()
        assert prog.printed == 0  # no plain lines on a terminal
    out = buf.getvalue()
    assert "cpsat g: incumbent 2 s  bound 1 s  gap 50%  (1.2 s of 60 s)" in out
    assert "\x1b[2K" in out  # the transient line is erased at the end


# ------------------------------------------------------------------ through the CLI
SLOW = "OperatorGraphs/bert_L-12_training"  # CP-SAT does not prove it within a few seconds


def test_json_keeps_stdout_pure_and_progress_on_stderr(capsys):
    path = bench_path(SLOW)
    argv = ["solve", str(path), "--time-limit", "3.5", "--workers", "1", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    d = json.loads(out)  # stdout is exactly one JSON object
    assert d["status"] == FEASIBLE
    got = err.splitlines()
    assert got and all(x.startswith("cpsat bert_L-12_training: ") for x in got), err
    assert any("incumbent" in x and "bound" in x and "gap" in x for x in got), err
    # the first line comes after the delay, and shows a plan found by the warm start or CP-SAT
    first = float(got[0].rsplit("(", 1)[1].split()[0])
    assert first >= FIRST_LINE_DELAY


def test_quiet_prints_nothing_on_stderr(capsys):
    path = bench_path(SLOW)
    argv = ["solve", str(path), "--time-limit", "3", "--workers", "1", "-q", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["objective"] > 0
