"""The certified lower bound of a problem: every bound computed, the largest one reported."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from solver.core.cluster import Cluster
from solver.core.cost import lower_bound
from solver.core.graph import Graph, coarse_view
from solver.core.result import meets_target
from solver.pipeline.bounds.boundary_io import MAX_NODES as BOUNDARY_IO_MAX_NODES
from solver.pipeline.bounds.boundary_io import boundary_io, boundary_io_bound
from solver.pipeline.bounds.chain import chain_bound, work_chain_bound
from solver.pipeline.bounds.chain_io import chain_io_bound
from solver.pipeline.bounds.decision import decision_bound, decision_io_bound, work_packing_bound
from solver.pipeline.bounds.forced_io import MAX_NODES as FORCED_IO_MAX_NODES
from solver.pipeline.bounds.forced_io import forced_io
from solver.pipeline.bounds.io_density import MAX_NODES as IO_DENSITY_MAX_NODES
from solver.pipeline.bounds.io_density import (
    MU_GRID,
    io_density,
    io_density_bound,
    singleton_density,
)
from solver.pipeline.bounds.items import items
from solver.pipeline.bounds.node_block import node_block_bound
from solver.pipeline.bounds.packing import import_cpsat
from solver.pipeline.bounds.pair_block import pair_block_bound
from solver.pipeline.bounds.spine import removed_scopes, spine_bound
from solver.pipeline.bounds.weights import capacity_infeasible, weights_bound
from solver.pipeline.dp.chain_ideals import ideal_chain

# share of the time limit each CP-SAT packing bound may spend; the chains without io are
# instant and the chains with io take the rest
SHARES = {"weights": 0.1, "decision": 0.15, "work packing": 0.1}
IO_CHAIN_SHARE = 0.05  # each io chain's share when it runs before the DP (with a target)
IO_CHAIN_MIN_SECONDS = 1.0  # ... and each one's least time otherwise
NODE_BLOCK_SHARE = 0.1  # the node-block cuts' share of the time limit ...
NODE_BLOCK_MIN_SECONDS = 1.0  # ... and their least time (a few cuts of milliseconds each)
PAIR_BLOCK_SHARE = 0.6  # the pair-block search's share of the time limit ...
PAIR_BLOCK_MIN_SECONDS = 1.0  # ... and its least time (a cut per node, then cached pair cuts)
DECISION_IO_SHARE = 0.3  # the decision bound with forced io: its share of the time limit ...
DECISION_IO_MIN_SECONDS = 0.5  # ... and its least time (the hulls, then instant volume probes;
# the hulls of a 10,000-node layered DAG take 2 s at load 12, 0.5 s for 3,000 nodes)
IO_DENSITY_SHARE = 0.2  # the io density's cuts: their share of the time limit ...
IO_DENSITY_MIN_SECONDS = 0.5  # ... and their least time (14 cuts per node, 400 nodes at most)
# with few blocks a block's io is a small share of its work: on the dnn-partitioning graphs
# at k = 2-6 and the layered DAGs at k = 4 it never bound, and it cost up to 0.8 s
IO_DENSITY_MIN_K = 8
IO_DENSITY_FIRST_WEIGHTS = 2  # the work weights tried first (all of them only if these prove)
BOUNDARY_IO_SHARE = 0.1  # the boundary io cuts' share of the time limit ...
BOUNDARY_IO_MIN_SECONDS = 0.5  # ... and their least time (k - 1 max-flows per probe)
SPINE_SHARE = 0.4  # the spine relaxations' share of the time limit ...
SPINE_MIN_SECONDS = 1.0  # ... and their least time (a few probes of the io chain program)
IDEALS_SHARE = 0.8  # the exact DP over the ideals of the separator chain goes first ...
IDEALS_MIN_SECONDS = 3.0  # ... when the bounds have at least this long (else it goes last);
# the graphs it runs on: IDEALS_MIN_NODES in solver.pipeline.dp.chain_ideals


@dataclass(frozen=True)
class BoundReport:
    """A lower bound no plan can beat, the bound that gives it, and every bound's value.

    ``value`` is ``inf`` only when it is proven that no plan meets the hard capacity.
    ``skipped``: the bounds not computed, each with the reason (a bound that met the incumbent
    makes the rest unnecessary; a packing bound that proves nothing above the best one so far
    is not reported as a value of its own). ``unpriced``: what the spine relaxation removed
    to prove its bound, the module scopes with their share of the work, heaviest first (e.g.
    "/inner/decoder/embed_tokens 4.9%"): structure no bound priced (empty when it removed
    nothing or did not run), so a user knows why a gap stays open.
    """

    value: float
    binding: str
    bounds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)
    unpriced: tuple[str, ...] = ()

    @property
    def infeasible(self) -> bool:
        """True when no plan exists (the weights cannot fit under the capacity C)."""
        return math.isinf(self.value)

    def to_dict(self) -> dict:
        out = {
            "value": self.value,
            "binding": self.binding,
            "bounds": dict(self.bounds),
            "seconds": self.seconds,
        }
        if self.skipped:
            out["skipped"] = dict(self.skipped)
        if self.unpriced:
            out["unpriced"] = list(self.unpriced)
        return out


@dataclass
class _BoundRun:
    """The bounds computed so far, the clock, and the incumbent they try to meet."""

    t0: float
    time_limit: float
    target: float | None
    vals: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    unpriced: tuple[str, ...] = ()

    @property
    def best(self) -> float:
        return max(self.vals.values(), default=0.0)

    def left(self) -> float:
        return max(0.0, self.time_limit - (time.perf_counter() - self.t0))

    def met(self) -> bool:
        """True when the best bound meets the incumbent
        (:func:`solver.core.result.meets_target`)."""
        return meets_target(self.target, self.best)

    def skip_rest(self, names: tuple[str, ...]) -> None:
        name = max(self.vals, key=lambda x: self.vals[x])
        for rest in names:
            if rest not in self.vals:
                self.skipped.setdefault(rest, f"not needed: {name} meets the incumbent")

    def packing(self, name: str, value: float) -> None:
        """A packing bound searched above the best so far: its value only when it proved more."""
        if value > self.best:
            self.vals[name] = value
        else:
            self.skipped[name] = f"proved nothing above {self.best:.10g}"

    def report(self) -> BoundReport:
        vals = {key: float(v) for key, v in self.vals.items()}
        name = max(vals, key=lambda x: vals[x])
        return BoundReport(
            vals[name],
            name,
            vals,
            time.perf_counter() - self.t0,
            dict(self.skipped),
            self.unpriced,
        )


ORDER = (  # the bounds a met incumbent skips, in the order they run
    "chain io",
    "work io chain",
    "node block",
    "ideals",
    "decision io",
    "boundary io",
    "io density",
    "spine chain io",
    "spine work io chain",
    "pair block",
    "weights",
    "decision",
    "work packing",
)


# where cpsat pauses the bounds to test for two chains: the spine relaxations and the pair block
# are what the two-chain bound supersedes on an encoder-decoder
TWO_CHAIN_PAUSE = "spine chain io"


def certified_lower_bound(
    g: Graph,
    cluster: Cluster,
    time_limit: float = 5.0,
    k: int | None = None,
    ideals: bool = True,
    target: float | None = None,
) -> BoundReport:
    """Every bound of docs/bounds.md for ``g`` on ``cluster`` with k blocks (default: its
    devices); the value is their maximum, so it holds for every valid plan. When the exact DP
    over the ideals (``ideals``) proves the optimum, the other relaxations are not computed:
    none can be larger.

    Cheapest first: the universal bound and the chains (milliseconds), the chains with io,
    then the CP-SAT packings, each searched only above the best bound so far. ``target``, the
    objective of a known valid plan (the incumbent; it fits the capacity, so the capacity
    check is skipped): the bounds stop as soon as the best one meets it (the rest are listed
    in ``skipped``), and the packings search no higher than it."""
    return BoundSearch(g, cluster, time_limit, k, ideals, target).run()


class BoundSearch:
    """The stages of :func:`certified_lower_bound`, which may pause before a named stage
    (:meth:`run` with ``until``) and go on later (:meth:`resume`) with a better target and
    the bounds found meanwhile (cpsat runs the two-chain relaxation of an encoder-decoder
    before the spine relaxations and the pair block: it often closes the gap they only
    narrow). The paused seconds do not count against the bounds' time limit."""

    def __init__(
        self,
        g: Graph,
        cluster: Cluster,
        time_limit: float = 5.0,
        k: int | None = None,
        ideals: bool = True,
        target: float | None = None,
    ):
        t0 = time.perf_counter()
        self.g, self.cluster = g, cluster
        self.k = cluster.devices if k is None else int(k)
        self.it = items(g)
        self.state = _BoundRun(t0, time_limit, target)
        self.done = False
        self.paused: BoundReport | None = None
        self.outside = 0.0  # seconds of bounds added while paused (they count in the report)
        # a finite target is the cost of a plan that fits: no proof of infeasibility can exist
        known_plan = target is not None and math.isfinite(target)
        if not known_plan and capacity_infeasible(
            self.it, cluster, self.k, min(1.0, 0.1 * time_limit)
        ):
            self.infeasible = BoundReport(
                math.inf, "capacity", {"capacity": math.inf}, time.perf_counter() - t0
            )
            return
        self.infeasible = None
        self.state.vals["universal"] = float(lower_bound(g, cluster, self.k))
        self.state.vals["chain"] = chain_bound(g, self.it, cluster, self.k)
        self.state.vals["work chain"] = work_chain_bound(g, self.it, self.k)
        self.stages = self._stages(ideals, time_limit, target is not None)

    def _stages(self, ideals: bool, time_limit: float, early_io: bool) -> list:
        """(name, stage) in the order they run. The DP goes first with most of the time when
        there is enough of it (it is the only bound that can be exact); with a short budget
        (evaluate's) the relaxations go first. With an incumbent (``early_io``) the io chains
        go before it: they are cheap and often meet it."""
        run, g, it, cluster, k = self.state, self.g, self.it, self.cluster, self.k
        first = ideals and time_limit >= IDEALS_MIN_SECONDS
        first_share = IDEALS_SHARE * time_limit
        return [
            ("chain io", lambda: early_io and _io_chains(run, g, it, cluster, k, first)),
            ("node block", lambda: early_io and _node_block(run, g, cluster)),
            ("ideals", lambda: first and _ideals(run, g, cluster, k, first_share, small=True)),
            ("chain io", lambda: not early_io and _io_chains(run, g, it, cluster, k)),
            ("node block", lambda: not early_io and _node_block(run, g, cluster)),
            ("volume windows", lambda: _volume_windows(run, g, it, cluster, k)),
            ("decision io", lambda: _decision_io(run, g, it, cluster, k)),
            ("boundary io", lambda: _boundary_io(run, g, cluster, k)),
            ("io density", lambda: _io_density(run, g, it, cluster, k)),
            (TWO_CHAIN_PAUSE, lambda: _spine(run, g, cluster, k)),
            ("pair block", lambda: _pair_block(run, g, cluster, k)),
            ("weights", lambda: _packings(run, it, cluster, k)),
            ("ideals", lambda: ideals and not first and _ideals(run, g, cluster, k, run.left())),
        ]

    def run(self, until: str | None = None) -> BoundReport:
        """The stages not run yet, up to the one named ``until`` (not included; None: all);
        the report of every bound so far."""
        if self.infeasible is not None:
            return self.infeasible
        run = self.state
        while not self.done and self.stages and self.stages[0][0] != until:
            if run.met():
                run.skip_rest(ORDER)
                self.done = True
                break
            _, stage = self.stages.pop(0)
            if stage() is _EXACT:
                self.done = True
        self.done = self.done or not self.stages
        rep = run.report()
        self.paused = replace(rep, seconds=rep.seconds + self.outside)
        return self.paused

    def quick_pair_block(self, seconds: float, target: float | None) -> BoundReport:
        """The pair block within ``seconds`` and up to ``target`` (the incumbent now), at the
        pause (it stays in the stages: :meth:`resume` runs it again with its full time while
        the gap is open; the pause goes on after it). Where it proves the incumbent it does so
        in a fraction of a second (BART-base at k = 16: 0.14 s at load 7); where it cannot (the
        encoder-decoders at k = 8) the two chains go first."""
        if self.infeasible is not None or self.paused is None:
            return self.run(until=TWO_CHAIN_PAUSE)
        self._unpause()
        self.state.target = target
        if not self.done and not self.state.met():
            _pair_block(self.state, self.g, self.cluster, self.k, seconds)
        return self.run(until=TWO_CHAIN_PAUSE)

    def resume(self, rep: BoundReport, target: float | None) -> BoundReport:
        """The rest of the stages after a pause, with ``rep`` (the paused report with the
        bounds found meanwhile, their seconds included) and ``target`` (the incumbent now)."""
        if self.infeasible is not None or self.paused is None:
            return self.run()
        self._unpause()
        self.outside += rep.seconds - self.paused.seconds
        run = self.state
        run.vals.update(rep.bounds)
        run.skipped.update(rep.skipped)
        run.unpriced = rep.unpriced
        run.target = target
        return self.run()

    def _unpause(self) -> None:
        """The clock moved on as if the pause had not happened (the bounds' time left)."""
        run = self.state
        run.t0 = time.perf_counter() - (self.paused.seconds - self.outside)


_EXACT = object()  # a stage's answer when it proved the optimum: no other bound is larger


def _ideals(
    run: _BoundRun, g: Graph, cluster: Cluster, k: int, seconds: float, small: bool = False
):
    # with an incumbent and most of the time (``small``: the DP goes first) the gap is open
    # here (the cheap bounds did not meet it): the DP is worth its time on small graphs too,
    # and a proof spares the CP-SAT search. With a short budget small graphs keep the
    # relaxations alone (a DP cut short by the clock would make the bound depend on timing)
    small = small and run.target is not None
    dp = ideal_chain(g, cluster, k, run.best, seconds, small=small, upper=run.target)
    if dp is not None and dp.lower > 0:
        run.vals["ideals"] = dp.lower
        if dp.optimal:  # the exact optimum: no other bound can be larger
            return _EXACT
    return None


def _io_chains(
    run: _BoundRun, g: Graph, it, cluster: Cluster, k: int, dp_next: bool = False
) -> None:
    """The io chains refine the io-free chains (valid starting points); they share what is
    left (with memory only when memory binds at all: otherwise the work chain is the one to
    refine). Both are fast: a greedy bin count per probe. ``dp_next``: the DP over the ideals
    follows with most of the time, so each gets at most IO_CHAIN_SHARE of it."""
    chain, target = run.vals["chain"], run.target

    def seconds() -> float:
        left = run.left() / 2
        if dp_next:
            return min(left, IO_CHAIN_SHARE * run.time_limit)
        # they converge in milliseconds on most graphs: a floor keeps a loaded machine from
        # cutting them short (the bound would then depend on the clock)
        return max(left, IO_CHAIN_MIN_SECONDS)

    run.vals["chain io"] = (
        chain_io_bound(g, it, cluster, k, chain, seconds(), target=target, windows=False)
        if chain > 0
        else 0.0
    )
    if run.met():
        return
    run.vals["work io chain"] = chain_io_bound(
        g, it, cluster, k, run.vals["work chain"], seconds(), False, target=target, windows=False
    )


def _volume_windows(run: _BoundRun, g: Graph, it, cluster: Cluster, k: int) -> None:
    """The io chains again with their gaps' volume windows (docs/bounds.md, "volume
    windows"), from the values the plain programs proved. A stage of its own, after the node
    block and the DP over ideals: those close most of the graphs that prove (the
    dnn-partitioning set), where the windows would cost a second search for nothing."""
    for name, memory in (("chain io", True), ("work io chain", False)):
        lo = run.vals.get(name, 0.0)
        if run.met() or lo <= 0:
            continue
        seconds = max(run.left() / 2, IO_CHAIN_MIN_SECONDS)
        value = chain_io_bound(
            g,
            it,
            cluster,
            k,
            lo,
            seconds,
            memory,
            target=run.target,
            floor=run.best,
            plain_proven=True,
        )
        run.vals[name] = max(lo, value)


def _node_block(run: _BoundRun, g: Graph, cluster: Cluster) -> None:
    """The cheapest block around each node (one min cut per node that could raise the
    bound). With an incumbent only nodes above the best bound so far are cut and a value
    that proves nothing more is listed in ``skipped``; without one it is its own bound."""
    if not cluster.homogeneous:
        run.skipped["node block"] = "devices or links differ (see the topology bound)"
        return
    fast = run.target is not None
    seconds = max(min(run.left() / 2, NODE_BLOCK_SHARE * run.time_limit), NODE_BLOCK_MIN_SECONDS)
    res = node_block_bound(g, cluster, seconds, run.best if fast else 0.0, run.target)
    if fast:
        run.packing("node block", res.value)
    else:
        run.vals["node block"] = res.value


def _pair_block(
    run: _BoundRun, g: Graph, cluster: Cluster, k: int, seconds: float | None = None
) -> None:
    """k + 1 nodes no two of which fit in one block (docs/bounds.md, "pair block"): with an
    incumbent searched above the best bound so far and first just below the incumbent (a
    value that proves nothing more is listed in ``skipped``); without one, on its own.
    ``seconds``: its time (default: most of what is left)."""
    if not cluster.homogeneous:
        run.skipped["pair block"] = "devices or links differ (see the topology bound)"
        return
    fast = run.target is not None
    # most of what is left: it ends at once where it cannot help (nothing just above the best)
    if seconds is None:
        share = min(0.75 * run.left(), PAIR_BLOCK_SHARE * run.time_limit)
        seconds = max(share, PAIR_BLOCK_MIN_SECONDS)
    floor = run.best if fast else 0.0
    res = pair_block_bound(g, cluster, k, seconds, floor, run.target)
    if fast:
        run.packing("pair block", res.value)
    else:
        run.vals["pair block"] = res.value


def _decision_io(run: _BoundRun, g: Graph, it, cluster: Cluster, k: int) -> None:
    """The decision bound with the io every plan under T must pay (docs/bounds.md, "decision
    io"): with an incumbent searched above the best bound so far and below it (a value that
    proves nothing more is listed in ``skipped``); without one, above the universal bound."""
    seconds = max(min(run.left() / 2, DECISION_IO_SHARE * run.time_limit), DECISION_IO_MIN_SECONDS)
    start = time.perf_counter()
    fio = forced_io(coarse_view(g)[0], cluster, start + seconds)
    if fio is None:
        run.skipped["decision io"] = (
            f"more than {FORCED_IO_MAX_NODES:,} coarse nodes, or hulls over {seconds:.3g} s"
        )
        return
    seconds = max(0.0, seconds - (time.perf_counter() - start))
    fast = run.target is not None
    lo = run.best if fast else run.vals["universal"]
    value = decision_io_bound(it, fio, cluster, k, seconds, lo, run.target if fast else math.inf)
    if fast:
        run.packing("decision io", value)
    else:
        run.vals["decision io"] = value


def _boundary_io(run: _BoundRun, g: Graph, cluster: Cluster, k: int) -> None:
    """The work plus the least io of each boundary between blocks (docs/bounds.md, "boundary
    io"): with an incumbent searched above the best bound so far and below it (a value that
    proves nothing more is listed in ``skipped``); without one, above the universal bound."""
    if k < 2 or not cluster.homogeneous:
        return  # not a bound of these problems (as the exact DP where it does not apply)
    seconds = max(min(run.left() / 2, BOUNDARY_IO_SHARE * run.time_limit), BOUNDARY_IO_MIN_SECONDS)
    end = time.perf_counter() + seconds
    bio = boundary_io(coarse_view(g)[0], cluster, end)
    if bio is None:
        run.skipped["boundary io"] = (
            f"more than {BOUNDARY_IO_MAX_NODES:,} coarse nodes, a data edge that is not an order"
            f" edge, or reachability over {seconds:.3g} s"
        )
        return
    fast = run.target is not None
    lo = run.best if fast else run.vals["universal"]
    hi = run.target if fast else math.inf
    value = boundary_io_bound(bio, k, max(0.0, end - time.perf_counter()), lo, hi)
    if fast:
        run.packing("boundary io", value)
    else:
        run.vals["boundary io"] = value


def _io_density(run: _BoundRun, g: Graph, it, cluster: Cluster, k: int) -> None:
    """The decision bound with each node's share of its block's io (docs/bounds.md, "io
    density"): graphs of at most IO_DENSITY_MAX_NODES coarse nodes and at least
    IO_DENSITY_MIN_K blocks; searched as the decision io bound."""
    cg = coarse_view(g)[0]
    if k < IO_DENSITY_MIN_K or not cluster.homogeneous:
        return  # not a bound of these problems (as the exact DP where it does not apply)
    if cg.n > IO_DENSITY_MAX_NODES:
        run.skipped["io density"] = f"more than {IO_DENSITY_MAX_NODES:,} coarse nodes"
        return
    seconds = max(min(run.left() / 2, IO_DENSITY_SHARE * run.time_limit), IO_DENSITY_MIN_SECONDS)
    end = time.perf_counter() + seconds
    fast = run.target is not None
    lo = run.best if fast else run.vals["universal"]
    hi = run.target if fast else math.inf
    value = lo
    # with every node's cut at its upper end ({v} alone) nothing above lo: no cut can prove it
    upper = io_density_bound(it, singleton_density(cg, cluster), cluster, k, seconds, lo, hi)
    # the likeliest weights first: when they prove nothing the rest is not cut (the graphs
    # whose io is not spread over every block pay 2 n cuts)
    for mus in (MU_GRID[:IO_DENSITY_FIRST_WEIGHTS], MU_GRID) if upper > lo else ():
        dens = io_density(cg, cluster, end, mus)
        left = max(0.0, end - time.perf_counter())
        value = io_density_bound(it, dens, cluster, k, left, lo, hi)
        if value <= lo or not dens.complete:
            break
    if fast:
        run.packing("io density", value)
    else:
        run.vals["io density"] = value


def _spine(run: _BoundRun, g: Graph, cluster: Cluster, k: int) -> None:
    """The io chains on the spine relaxations (docs/bounds.md, "spine"): the nodes that keep
    the graph from being a chain removed, the tensors they carried kept. Each starts from the
    best bound so far; with an incumbent a value that proves nothing more is listed in
    ``skipped``, without one each is its own bound."""
    seconds = max(min(run.left() / 2, SPINE_SHARE * run.time_limit), SPINE_MIN_SECONDS)
    res = spine_bound(g, cluster, k, seconds, run.target, run.best)
    if res.spine is not None:
        run.unpriced = tuple(removed_scopes(coarse_view(g)[0], res.spine))
    for name, value in (
        ("spine chain io", res.chain_io),
        ("spine work io chain", res.work_io_chain),
    ):
        if run.target is not None:
            run.packing(name, value)
        else:
            run.vals[name] = value


def _packings(run: _BoundRun, it, cluster: Cluster, k: int) -> None:
    """The CP-SAT packings, each with its share of the time. With an incumbent, each is
    searched only above the best bound so far and below the incumbent (no bound exceeds a
    plan's cost); without one, each on its own (every bound's own value is reported)."""
    fast = run.target is not None
    hi = run.target if fast else math.inf
    # the packings' CP-SAT (OR-Tools, which pulls in pandas) is loaded here, once: loading
    # modules is start-up, not the bounds' time (the CP-SAT search's loading is not counted
    # either)
    loading = time.perf_counter()
    import_cpsat()
    run.t0 += time.perf_counter() - loading
    for name, fn in (
        ("weights", lambda t, lo: weights_bound(it, cluster, k, t)),
        ("decision", lambda t, lo: decision_bound(it, cluster, k, t, lo, hi)),
        ("work packing", lambda t, lo: work_packing_bound(it, k, t, lo, hi)),
    ):
        if run.met():
            return
        if fast and name == "work packing" and math.isinf(cluster.fast_memory):
            run.skipped[name] = "the same as decision without a fast-memory limit"
            continue
        seconds = min(SHARES[name] * run.time_limit, run.left())
        if name == "weights" or not fast:
            run.vals[name] = fn(seconds, 0.0)
        else:
            run.packing(name, fn(seconds, run.best))
