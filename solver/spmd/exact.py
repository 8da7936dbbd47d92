"""Exact operator-level sharding: one strategy per operator chosen by OR-Tools CP-SAT.

Model (the cost of :func:`solver.spmd.program.evaluate`, term by term):

- ``x[v, s]``: operator v runs candidate s; exactly one per operator. Candidates that place
  every input and output identically (equal canonical layouts) are one choice.
- unary time: local compute, plus the reduction of a model output left as partial sums.
- edge u -> v (tensor t): the redistribution time c(a, b) between u's output layout class a
  and v's input layout class b. ``pairs`` encoding: a Boolean ``z >= y_u[a] + y_v[b] - 1`` only
  for pairs that cost time or memory; ``cuts`` encoding: an integer ``e >= sum_b c(a, b)
  y_v[b] - sum_{a' != a} D(a, a') y_u[a']`` per class a (and symmetrically per b), with
  ``D(a, a') = max_b (c(a, b) - c(a', b))^+``: exact at every 0/1 point, no pair variables.
  An edge whose end has one class is a unary cost of the other end.
- memory per device (with a limit): ``W + live(v) + copies(v) <= limit`` at every step v of the
  topological order, as evaluate counts it: W the local weight shards (a weight used by several
  operators counts once per distinct layout), live(v) the local outputs alive at v, copies(v)
  the redistributed inputs and model-input shards of v.

Honest numbers, as the pipeline solver (solver/pipeline/exact/cpsat.py): every time is scaled by S
and
rounded DOWN, every byte count is divided by a power of two and rounded DOWN (the limit too),
so the integer model is a relaxation. CP-SAT's bound divided by S (plus the exact cost of the
operators with one choice) is a valid lower bound; its plans are re-evaluated by ``evaluate``.
Every coefficient stays below 2^30 and the presolve step of google/or-tools#5293 is off.

Building the model prices every pair of layout classes on every edge, which can take longer than
the whole time limit on a large mesh: with a ``deadline`` it stops between two redistribution
redistributions (a few milliseconds) and raises :class:`DeadlineReached`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from solver.core.sat import MAX_COEF, new_solver, search_params
from solver.spmd.program import Planner, evaluate, last_uses
from solver.spmd.redistribute import local_bytes
from solver.spmd.rules import OpSharding, Strategy

NOT_BUILT = "NOT_BUILT"  # ExactResult.cpsat_status when the deadline passed while building
TARGET_RANGE = 1e15  # the largest plan cost, scaled, stays below this (doubles are exact to 9e15)


@dataclass
class ExactOptions:
    """Solver knobs; ``on_progress(objective, bound, elapsed)`` in seconds of program time."""

    time_limit: float = 60.0
    workers: int = 0
    seed: int = 0
    gap: float = 0.0
    log: bool = False
    encoding: str = "cuts"
    on_progress: object = None
    params: dict = field(default_factory=dict)
    # pairs of operator indices made to choose the same strategy: a restricted problem, so
    # its bound is no bound of the real one (solver/spmd/windows.py reads plans only)
    same_choice: tuple = ()


@dataclass
class ExactResult:
    """CP-SAT's best strategies (None if none found), its valid lower bound, and stats."""

    strategies: dict[str, Strategy] | None
    lower_bound: float
    cpsat_status: str
    stats: dict


@dataclass
class _StepBytes:
    """The bytes held at one step besides the weights: ``terms`` (bytes, literal, its upper
    bound) + ``const``, at most ``most``."""

    terms: list
    const: int
    most: int


class DeadlineReached(Exception):
    """The deadline passed while building a model: no model, no bound from it."""


def _check(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise DeadlineReached


class ShardModel:
    """The CP-SAT model of one sharding problem; ``objective`` is "time" or "memory".
    Raises :class:`DeadlineReached` once ``time.perf_counter()`` passes ``deadline``."""

    def __init__(
        self,
        planner: Planner,
        limit: float | None,
        pins: dict[str, Strategy],
        objective: str = "time",
        encoding: str = "cuts",
        upper: float | None = None,
        build: bool = True,
        deadline: float | None = None,
    ) -> None:
        self.pl, self.sm = planner, planner.sm
        self.deadline = deadline
        self.pruned = 0
        self.aux: list = []  # (variable, its value as a function of the choice per operator)
        self.upper = upper if upper is not None and upper > 0 else math.inf
        self.limit = limit if limit is not None and math.isfinite(limit) else None
        self.objective = objective
        self.encoding = encoding
        self.m = cp_model.CpModel()
        self.memory = objective == "memory" or self.limit is not None
        self._structure()
        self._choices(pins)
        if self.limit is not None:
            self._prune()
        self.infeasible = any(not c for c in self.cands)
        if self.infeasible:  # some operator has no choice within the limit
            return
        self._collect_costs()
        if not build:  # the data only (solver/spmd/lagrange.py)
            return
        self._scale()
        self._variables()
        self._edges()
        if self.memory:
            self._memory()
        self._objective()

    # ------------------------------------------------------------------ data
    def _structure(self) -> None:
        """Uses of every weight, and the activations alive at each step (as evaluate counts)."""
        sm = self.sm
        n = len(sm.ops)
        # weights: per constant data input, its uses and the local bytes of each choice
        uses = defaultdict(list)
        for v, op in enumerate(sm.ops):
            for k, t in enumerate(op.data_inputs):
                if t in sm.consts:
                    uses[t].append((v, k))
        self.weights = uses
        # activations alive at each step, as evaluate's _memory counts them
        last = last_uses(self.pl)
        self.live: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (producer, pos)
        for u, op in enumerate(sm.ops):
            for pos, t in enumerate(op.outputs):
                for v in range(u, min(n - 1, max(u, last.get(t, -1))) + 1):
                    self.live[v].append((u, pos))

    def _choices(self, pins: dict[str, Strategy]) -> None:
        """Candidates per operator (pins: the one configured), duplicates merged."""
        pl = self.pl
        self.cands: list[list[OpSharding]] = []
        for i, op in enumerate(self.sm.ops):
            _check(self.deadline)
            if op.name in pins:
                self.cands.append([pl.sharding(i, pins[op.name])])
                continue
            best: dict[tuple, OpSharding] = {}
            for sh in pl.candidates(i):
                k = pl.choice_key(i, sh)
                if k not in best or pl.unary_time(i, sh) < pl.unary_time(i, best[k]):
                    best[k] = sh
            self.cands.append(list(best.values()))

    def floors(self) -> tuple[dict, dict, list[float]]:
        """Least bytes of each weight and of each output over the current choices, and the
        least live activation bytes at each step (a lower bound for every plan)."""
        sm = self.sm
        wmin = {}
        for t, us in self.weights.items():
            wmin[t] = min(self.weight_bytes(v, k, sh) for v, k in us for sh in self.cands[v])
        out_min = {}
        for u, op in enumerate(sm.ops):
            for pos, t in enumerate(op.outputs):
                out_min[(u, pos)] = min(
                    local_bytes(sh.out_layouts[pos], sm.itemsize(t)) for sh in self.cands[u]
                )
        steps = [sum(out_min[x] for x in self.live[v]) for v in range(len(sm.ops))]
        return wmin, out_min, steps

    def weight_bytes(self, v: int, k: int, sh: OpSharding) -> float:
        """The bytes per device of weight input k of operator v under ``sh`` (in training with
        its gradient and optimizer state)."""
        t = self.sm.ops[v].data_inputs[k]
        return self.pl.weight_class_bytes(self.pl.weight_class(v, k, sh), t)

    def _prune(self) -> None:
        """Drop the choices no plan within the memory limit can make (exact: for each, a lower
        bound on the memory of every plan making it exceeds the limit): every other weight at
        its smallest shard, and the activation peak at least the least one at any step."""
        sm, limit = self.sm, self.limit
        wmin, out_min, steps = self.floors()
        total_w, peak_min = sum(wmin.values()), max(steps, default=0.0)
        dropped = 0
        for v, op in enumerate(sm.ops):
            _check(self.deadline)
            own = [
                t for t in set(op.data_inputs) if t in self.weights and len(self.weights[t]) == 1
            ]
            keep = []
            for sh in self.cands[v]:
                w = total_w + sum(
                    self.weight_bytes(v, k, sh) - wmin[t]
                    for k, t in enumerate(op.data_inputs)
                    if t in own
                )
                act = steps[v] + sum(
                    local_bytes(sh.out_layouts[pos], sm.itemsize(t)) - out_min[(v, pos)]
                    for pos, t in enumerate(op.outputs)
                )
                if w + max(peak_min, act) <= limit:
                    keep.append(sh)
            dropped += len(self.cands[v]) - len(keep)
            self.cands[v] = keep
        self.pruned = dropped

    def _collect_costs(self) -> None:
        """Unary times, edge matrices over layout classes, weights, and live activations."""
        pl, sm = self.pl, self.sm
        n = len(sm.ops)
        self.unary = [[pl.unary_time(i, sh) for sh in self.cands[i]] for i in range(n)]
        outputs = set(sm.outputs)
        for i, op in enumerate(sm.ops):
            for pos, t in enumerate(op.outputs):
                if t in outputs:
                    for s, sh in enumerate(self.cands[i]):
                        r = pl.output_reduction(sh.out_layouts[pos], t)
                        self.unary[i][s] += pl.output_time(r, sh.out_layouts[pos], t)
        # bytes each operator's choices add at its own step (model-input copies)
        self.step_unary = [[0.0] * len(self.cands[i]) for i in range(n)]
        for v, op in enumerate(sm.ops):
            for k, t in enumerate(op.data_inputs):
                if t in sm.consts or sm.producer.get(t) is not None:
                    continue
                for s, sh in enumerate(self.cands[v]):
                    self.step_unary[v][s] += local_bytes(sh.in_layouts[k], sm.itemsize(t))
        # edges: classes of each end and the (time, copy bytes) matrix between them
        self.edges = []
        self.edges_into: list[list] = [[] for _ in range(n)]  # (u, a_of, b_of, copy bytes)
        cache: dict = {}
        for v in range(n):
            for u, pos, k in pl.in_edges[v]:
                t = sm.ops[u].outputs[pos]
                src = [pl.out_class(u, pos, sh) for sh in self.cands[u]]
                dst = [pl.in_class(v, k, sh) for sh in self.cands[v]]
                a_cls = list(dict.fromkeys(src))
                b_cls = list(dict.fromkeys(dst))
                key = (tuple(a_cls), tuple(b_cls), sm.itemsize(t))
                if key not in cache:
                    time_m, mem_m = [], []
                    for a in a_cls:
                        trow, mrow = [], []
                        for b in b_cls:
                            _check(self.deadline)
                            cost = pl.class_edge_cost(a, b, t)
                            trow.append(cost.time)
                            mrow.append(cost.copy_bytes)
                        time_m.append(trow)
                        mem_m.append(mrow)
                    cache[key] = (time_m, mem_m)
                time_m, mem_m = cache[key]
                ia = {c: j for j, c in enumerate(a_cls)}
                ib = {c: j for j, c in enumerate(b_cls)}
                a_of, b_of = [ia[c] for c in src], [ib[c] for c in dst]
                self.edges.append((u, v, a_of, b_of, time_m, mem_m))
                self.edges_into[v].append((u, a_of, b_of, mem_m))

    def _scale(self) -> None:
        """Time scale S and memory unit (powers of two), every coefficient below 2^30.

        A time term above the upper bound (a plan that fits) is capped there: the model stays
        a relaxation (its costs only go down), and a plan using a capped term costs at least
        that plan anyway, so S can be much finer."""
        up = self.upper
        total = sum(min(max(c), up) for c in self.unary)
        biggest = max((min(max(c), up) for c in self.unary), default=0.0)
        for _u, _v, _a, _b, tm, _mm in self.edges:
            worst = min(max(max(row) for row in tm), up)
            total += worst
            biggest = max(biggest, worst)
        self.S = TARGET_RANGE / total if total > 0 else 1.0
        if biggest > 0:
            self.S = min(self.S, (MAX_COEF - 1) / biggest)
        big = 1.0
        if self.memory:
            big = max(big, self.limit or 0.0)
            for us in self.weights.values():
                for v, k in us:
                    for sh in self.cands[v]:
                        big = max(big, self.weight_bytes(v, k, sh))
            for u, op in enumerate(self.sm.ops):
                for pos, t in enumerate(op.outputs):
                    for sh in self.cands[u]:
                        big = max(big, local_bytes(sh.out_layouts[pos], self.sm.itemsize(t)))
            big = max(big, max((max(r) for r in self.step_unary if r), default=0.0))
            for e in self.edges:
                big = max(big, max(max(row) for row in e[5]))
        self.unit = 2.0 ** max(0, math.ceil(math.log2(big / (MAX_COEF - 1))))

    def t_int(self, seconds: float) -> int:
        return int(math.floor(min(seconds, self.upper) * self.S))

    def b_int(self, nbytes: float) -> int:
        return int(math.floor(nbytes / self.unit))

    # ------------------------------------------------------------------ variables
    def _variables(self) -> None:
        self.x: list[list] = []
        self.const_time = 0.0
        self.obj_terms: list[tuple[int, object]] = []
        for i, cs in enumerate(self.cands):
            if len(cs) == 1:
                self.x.append([1])
                self.const_time += self.unary[i][0] if self.objective == "time" else 0.0
                continue
            xs = [self.m.NewBoolVar(f"x{i}_{s}") for s in range(len(cs))]
            self.m.AddExactlyOne(xs)
            self.x.append(xs)
            if self.objective == "time":
                self.obj_terms += [
                    (self.t_int(c), x) for c, x in zip(self.unary[i], xs, strict=True)
                ]

    def _members(self, v: int, cls: list[int], c: int) -> list:
        """The choices of operator v (at least two) in layout class c: their sum is 0 or 1."""
        return [self.x[v][s] for s, k in enumerate(cls) if k == c]

    def _edges(self) -> None:
        """Edge time in the objective; edge copy bytes at the consumer's step (for memory)."""
        n = len(self.sm.ops)
        self.step_terms: list[list[tuple[int, object, int]]] = [[] for _ in range(n)]
        self.step_const = [0.0] * n
        timed = self.objective == "time"
        memo: dict = {}
        for u, v, a_of, b_of, tm, mm in self.edges:
            _check(self.deadline)
            na, nb = len(tm), len(tm[0])
            if na == 1:  # a unary cost of v (a constant when v has one choice)
                for s, b in enumerate(b_of):
                    self._unary_add(v, s, tm[0][b], v, mm[0][b])
                continue
            if nb == 1:  # a unary cost of u
                for s, a in enumerate(a_of):
                    self._unary_add(u, s, tm[a][0], v, mm[a][0])
                continue
            ya = [self._members(u, a_of, a) for a in range(na)]
            yb = [self._members(v, b_of, b) for b in range(nb)]
            mats = []
            if timed:
                mats.append(("time", [[self.t_int(c) for c in row] for row in tm]))
            if self.memory:
                mats.append(("memory", [[self.b_int(c) for c in row] for row in mm]))
            for what, c in mats:
                top = max(max(row) for row in c)
                if top <= 0:
                    continue
                ends = (u, v, a_of, b_of)
                if self.encoding == "pairs":
                    terms = self._pairs(ya, yb, c, ends)
                else:
                    key = (id(tm), what)
                    if key not in memo:
                        memo[key] = _cut_rows(c)
                    terms = self._cuts(ya, yb, top, memo[key], c, ends)
                if what == "time":
                    self.obj_terms += [(k, x) for k, x, _ in terms]
                else:
                    self.step_terms[v] += terms

    def _unary_add(self, w: int, s: int, seconds: float, step: int, nbytes: float) -> None:
        if self.objective == "time" and seconds:
            if len(self.cands[w]) == 1:
                self.const_time += seconds
            else:
                self.obj_terms.append((self.t_int(seconds), self.x[w][s]))
        if self.memory and nbytes:
            if len(self.cands[w]) == 1:
                self.step_const[step] += nbytes
            else:
                self.step_terms[step].append((self.b_int(nbytes), self.x[w][s], 1))

    def _pairs(self, ya, yb, c, ends) -> list[tuple[int, object, int]]:
        """A Boolean per costly pair of classes, ``z >= y_a + y_b - 1``."""
        u, v, a_of, b_of = ends
        out = []
        for a, row in enumerate(c):
            for b, k in enumerate(row):
                if k > 0:
                    z = self.m.NewBoolVar("")
                    self.m.Add(z >= cp_model.LinearExpr.Sum([*ya[a], *yb[b]]) - 1)
                    out.append((k, z, 1))
                    self.aux.append(
                        (z, lambda ch, a=a, b=b: int(a_of[ch[u]] == a and b_of[ch[v]] == b))
                    )
        return out

    def _cuts(self, ya, yb, top: int, rows, c, ends) -> list[tuple[int, object, int]]:
        """One integer ``e`` bounded below by a cut per class of either end (exact at 0/1)."""
        u, v, a_of, b_of = ends
        e = self.m.NewIntVar(0, top, "")
        self.aux.append((e, lambda ch: c[a_of[ch[u]]][b_of[ch[v]]]))
        for _side, coef in rows:
            xs, ks = [], []
            for end, j, k in coef:
                members = (ya if end == "a" else yb)[j]
                xs += members
                ks += [k] * len(members)
            self.m.Add(cp_model.LinearExpr.WeightedSum(xs, ks) <= e)
        return [(1, e, top)]

    def _memory(self) -> None:
        """W + live activations + copies <= limit at every step (or <= the minimised peak)."""
        cap = self.b_int(self.limit) if self.limit is not None else None
        self._weights()
        top = sum(k for k, _ in self.w_terms if k > 0) + self.w_const
        if cap is not None:
            top = min(top, cap)
        self.W = self.m.NewIntVar(0, max(top, 0), "weights")
        self.m.Add(sum(k * x for k, x in self.w_terms) + self.w_const == self.W)
        if self.pl.training is not None:
            steps = self._kept_steps()
        else:
            steps = [self._step_bytes(v) for v in range(len(self.sm.ops))]
        most = max((st.most for st in steps), default=0)
        self.peak = self.m.NewIntVar(0, top + most, "memory")
        for st in steps:
            if self.objective == "time" and top + st.most <= cap:
                continue  # this step fits whatever is chosen
            expr = self.W + sum(k * x for k, x, _ in st.terms) + st.const
            if self.objective == "memory":
                self.m.Add(self.peak >= expr)
            if cap is not None:
                self.m.Add(expr <= cap)

    def _weights(self) -> None:
        """The weight bytes W as ``w_terms`` (bytes, literal) + ``w_const``: one term per
        layout class of a weight read by several operators (a literal implied by every choice
        that reads it so), per choice of its only reader, none for a single class."""
        w_terms: list[tuple[int, object]] = []
        w_const = 0
        for t, us in self.weights.items():
            _check(self.deadline)
            classes: dict = {}
            for v, k in us:
                for s, sh in enumerate(self.cands[v]):
                    lay = self.pl.weight_class(v, k, sh)
                    classes.setdefault(lay, []).append(self.x[v][s])
            if len(classes) == 1:
                w_const += self.b_int(self.pl.weight_class_bytes(next(iter(classes)), t))
                continue
            if len(us) == 1:
                v, k = us[0]
                w_terms += [
                    (self.b_int(self.weight_bytes(v, k, sh)), self.x[v][s])
                    for s, sh in enumerate(self.cands[v])
                ]
                continue
            for lay, xs in classes.items():
                fixed = [x for x in xs if isinstance(x, int)]
                nbytes = self.b_int(self.pl.weight_class_bytes(lay, t))
                if fixed:
                    w_const += nbytes
                    continue
                y = self.m.NewBoolVar("")
                for x in xs:
                    self.m.AddImplication(x, y)
                w_terms.append((nbytes, y))
                chosen = {(v, s) for v, k in us for s, sh in enumerate(self.cands[v])
                          if self.pl.weight_class(v, k, sh) == lay}  # fmt: skip
                self.aux.append((y, lambda ch, ch0=chosen: int(any(ch[v] == s for v, s in ch0))))
        self.w_terms, self.w_const = w_terms, w_const

    def _kept_steps(self) -> list[_StepBytes]:
        """Training: every output is kept until the backward, so step v holds the outputs of
        operators 0 .. v; an integer ``acc_v = acc_(v-1) + outputs of v`` carries them (n
        terms in all, not one per output and step), beside each step's copies."""
        out: list[_StepBytes] = []
        acc, acc_top, acc_const = None, 0, 0
        sizes_of: list[list[int]] = []
        for v in range(len(self.sm.ops)):
            copies = self._step_bytes(v, live=False)
            sizes = [self.b_int(self.pl.output_bytes(v, sh)) for sh in self.cands[v]]
            sizes_of.append(sizes)
            if len(sizes) == 1:
                acc_const += sizes[0]
            elif max(sizes) > 0:
                top = acc_top + max(sizes)
                nxt = self.m.NewIntVar(0, top, "")
                added = sum(k * x for k, x in zip(sizes, self.x[v], strict=True))
                self.m.Add(nxt == (acc if acc is not None else 0) + added)
                acc, acc_top = nxt, top
                self.aux.append((nxt, lambda ch, v=v: _kept_up_to(sizes_of, ch, v)))
            terms = copies.terms + ([(1, acc, acc_top)] if acc is not None else [])
            const = copies.const + acc_const
            out.append(_StepBytes(terms, const, copies.most + acc_top + acc_const))
        return out

    def _step_bytes(self, v: int, live: bool = True) -> _StepBytes:
        """The bytes held at step ``v`` besides the weights: its copies and outputs, and the
        activations alive across it (with ``live``; else its copies only)."""
        _check(self.deadline)
        sm = self.sm
        terms = list(self.step_terms[v])
        const = self.b_int(self.step_const[v])
        for s, b in enumerate(self.step_unary[v]):
            if b and len(self.cands[v]) == 1:
                const += self.b_int(b)
            elif b:
                terms.append((self.b_int(b), self.x[v][s], 1))
        for u, pos in self.live[v] if live else ():
            t = sm.ops[u].outputs[pos]
            sizes = [
                self.b_int(local_bytes(sh.out_layouts[pos], sm.itemsize(t))) for sh in self.cands[u]
            ]
            if len(sizes) == 1:
                const += sizes[0]
            else:
                terms += [(k, x, 1) for k, x in zip(sizes, self.x[u], strict=True)]
        most = sum(k * ub for k, _, ub in terms if k > 0) + const
        return _StepBytes(terms, const, most)

    def _objective(self) -> None:
        if self.objective == "memory":
            self.m.Minimize(self.peak)
        else:
            self.m.Minimize(sum(k * x for k, x in self.obj_terms if k))

    # ------------------------------------------------------------------ hints and reading
    def choice_of(self, strategies: dict[str, Strategy]) -> list[int] | None:
        """Candidate index per operator for a complete plan, None if one is not a choice."""
        out = []
        for i, op in enumerate(self.sm.ops):
            k = self.pl.choice_key(i, self.pl.sharding(i, strategies[op.name]))
            idx = next(
                (s for s, sh in enumerate(self.cands[i]) if self.pl.choice_key(i, sh) == k), None
            )
            if idx is None:
                return None
            out.append(idx)
        return out

    def add_hint(self, choice: list[int]) -> None:
        """Hint every variable (choices, pair and weight indicators, edge costs, W)."""
        value = {}
        for i, s in enumerate(choice):
            if len(self.cands[i]) > 1:
                for j, x in enumerate(self.x[i]):
                    self.m.AddHint(x, j == s)
                    value[x.Index()] = int(j == s)
        for var, fn in self.aux:
            value[var.Index()] = int(fn(choice))
            self.m.AddHint(var, value[var.Index()])
        if self.memory and self.objective == "time":
            w = self.w_const + sum(
                k * (x if isinstance(x, int) else value[x.Index()]) for k, x in self.w_terms
            )
            self.m.AddHint(self.W, w)

    def tie(self, a: int, b: int) -> None:
        """Operators a and b (with the same candidate strategies) choose the same strategy."""
        where = {sh.strategy: s for s, sh in enumerate(self.cands[a])}
        for s, sh in enumerate(self.cands[b]):
            mate = where.get(sh.strategy)
            xb = self.x[b][s]
            if mate is None:
                if not isinstance(xb, int):
                    self.m.Add(xb == 0)
                continue
            xa = self.x[a][mate]
            if isinstance(xa, int) and isinstance(xb, int):
                continue
            self.m.Add(xa == xb)

    def read(self, solver: cp_model.CpSolver) -> dict[str, Strategy]:
        out = {}
        for i, op in enumerate(self.sm.ops):
            if len(self.cands[i]) == 1:
                s = 0
            else:
                s = next(j for j, x in enumerate(self.x[i]) if solver.BooleanValue(x))
            out[op.name] = self.cands[i][s].strategy
        return out

    def size(self) -> dict:
        p = self.m.Proto()
        return {
            "choices": sum(len(c) for c in self.cands),
            "pruned_by_memory": self.pruned,
            "operators_with_a_choice": sum(len(c) > 1 for c in self.cands),
            "variables": len(p.variables),
            "constraints": len(p.constraints),
        }


def _kept_up_to(sizes_of: list[list[int]], choice: list[int], v: int) -> int:
    """The outputs' bytes (units) operators 0 .. v with a choice hold under ``choice``."""
    return sum(sizes_of[u][choice[u]] for u in range(v + 1) if len(sizes_of[u]) > 1)


def _cut_rows(c: list[list[int]]) -> list:
    """The cuts of one cost matrix c[a][b]: for each source class a,
    ``e >= sum_b c[a][b] y_b - sum_{a' != a} D(a, a') y_a'`` with
    ``D(a, a') = max_b (c[a][b] - c[a'][b])^+`` (valid: when a' is chosen the right side is at
    most c[a'][b] for the chosen b), and the same for each destination class b."""
    na, nb = len(c), len(c[0])
    rows = []
    for a in range(na):
        coef = [("b", b, c[a][b]) for b in range(nb) if c[a][b]]
        if not coef:
            continue
        for a2 in range(na):
            if a2 != a:
                d = max(max(c[a][b] - c[a2][b] for b in range(nb)), 0)
                if d:
                    coef.append(("a", a2, -d))
        rows.append(("a", coef))
    for b in range(nb):
        coef = [("a", a, c[a][b]) for a in range(na) if c[a][b]]
        if not coef:
            continue
        for b2 in range(nb):
            if b2 != b:
                d = max(max(c[a][b] - c[a][b2] for a in range(na)), 0)
                if d:
                    coef.append(("b", b2, -d))
        rows.append(("b", coef))
    return rows


class _Callback(cp_model.CpSolverSolutionCallback):
    def __init__(self, fn, scale: float, const: float, start: float) -> None:
        super().__init__()
        self.fn, self.scale, self.const, self.start = fn, scale, const, start
        self.best = math.inf

    def on_solution_callback(self) -> None:
        self.best = self.const + self.ObjectiveValue() / self.scale
        if self.fn:
            bound = self.const + self.BestObjectiveBound() / self.scale
            self.fn(self.best, bound, time.perf_counter() - self.start)


def _solver(opts: ExactOptions, time_limit: float) -> cp_model.CpSolver:
    params = search_params(opts.workers, opts.seed, opts.gap, opts.log)
    return new_solver(max(0.01, time_limit), {**params, **opts.params})


def solve_exact(
    planner: Planner,
    limit: float | None,
    pins: dict[str, Strategy],
    hints: list[dict[str, Strategy]],
    options: ExactOptions | None = None,
    upper: float | None = None,
) -> ExactResult:
    """Minimise the program's time over all strategy combinations (pins fixed) under the
    per-device memory ``limit``; ``hints`` are complete plans (the best first) for the warm
    start, ``upper`` the time of a plan known to fit. The bound is valid whatever CP-SAT's
    status. Building stops at the time limit: then no plan, no bound (-inf) and the status
    "NOT_BUILT"."""
    opts = options or ExactOptions()
    t0 = time.perf_counter()
    try:
        model = ShardModel(
            planner, limit, pins, "time", opts.encoding, upper, deadline=t0 + opts.time_limit
        )
    except DeadlineReached:
        stats = {
            "cpsat_status": NOT_BUILT,
            "note": f"the time limit passed while building the CP-SAT model "
            f"({time.perf_counter() - t0:.3g} s)",
            "build_seconds": round(time.perf_counter() - t0, 3),
        }
        return ExactResult(None, -math.inf, NOT_BUILT, stats)
    if model.infeasible:
        stats = {"cpsat_status": "not run", "note": "an operator has no choice within the limit"}
        return ExactResult(None, math.inf, "INFEASIBLE", stats)
    for a, b in opts.same_choice:
        model.tie(a, b)
    for h in hints:
        choice = model.choice_of(h)
        if choice is not None:
            model.add_hint(choice)
            break
    build = time.perf_counter() - t0
    # CP-SAT's presolve looks at the clock coarsely: keep a second in hand
    solver = _solver(opts, opts.time_limit - build - 1.0)
    cb = _Callback(opts.on_progress, model.S, model.const_time, t0)
    if opts.on_progress:
        solver.best_bound_callback = lambda b: opts.on_progress(
            cb.best, model.const_time + b / model.S, time.perf_counter() - t0
        )
    status = solver.Solve(model.m, cb)
    stats = {
        **model.size(),
        "cpsat_status": solver.StatusName(status),
        "encoding": opts.encoding,
        "build_seconds": round(build, 3),
        "solve_seconds": round(solver.WallTime(), 3),
        "scale": model.S,
        "memory_unit_bytes": model.unit,
        "workers": solver.parameters.num_workers,
    }
    if status == cp_model.INFEASIBLE:
        return ExactResult(None, math.inf, "INFEASIBLE", stats)
    bound = model.const_time + solver.BestObjectiveBound() / model.S
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    strategies = model.read(solver) if found else None
    return ExactResult(strategies, bound, solver.StatusName(status), stats)


@dataclass
class LeastMemory:
    """Every plan needs at least ``lower`` bytes per device; the leanest plan found
    (``strategies``, None if none) needs ``upper`` (inf if none): equal when that plan is
    proven the leanest."""

    lower: float
    upper: float
    strategies: dict[str, Strategy] | None

    @property
    def exact(self) -> bool:
        return self.upper <= self.lower * (1 + 1e-12)


def min_memory(
    planner: Planner, pins: dict[str, Strategy], time_limit: float, workers: int = 0
) -> LeastMemory:
    """A lower bound on the memory per device every plan needs (CP-SAT's bound on its memory
    model, bytes rounded down) and the leanest plan it found, priced by ``evaluate``; lower 0
    and no plan when building the model takes the whole ``time_limit``."""
    t0 = time.perf_counter()
    try:
        model = ShardModel(planner, None, pins, "memory", "pairs", deadline=t0 + time_limit)
    except DeadlineReached:
        return LeastMemory(0.0, math.inf, None)
    left = time_limit - (time.perf_counter() - t0)
    solver = _solver(ExactOptions(workers=workers), left)
    status = solver.Solve(model.m)
    lower = solver.BestObjectiveBound() * model.unit
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return LeastMemory(lower, math.inf, None)
    strategies = model.read(solver)
    return LeastMemory(lower, evaluate(planner, strategies).memory_per_device, strategies)
