"""Discrete-event simulation of a plan: requests flowing through the pipeline of devices.

Each device handles requests in order, one phase after another for each request: it receives
the tensors it reads from other devices (one message per tensor, serialised), runs its
operators in topological order (streaming parameters that do not fit in fast memory), and
sends every tensor some other device reads (once, even when several devices read it). A
transfer costs ``bytes / B`` on the sending device and again on the receiving one (store and
forward through the link), exactly as f(S) counts it; a message can be received ``latency``
seconds after it was sent.

Modes:

- ``pipelined`` (default): devices work on different requests at once; request r+1 enters as
  soon as the first devices are free. The steady-state period is then max f(S), measured
  as the slowest device's rate of finishing requests (:func:`steady_period`), not as the
  gaps between requests leaving the pipeline, which lag behind it while a faster device that
  runs apart from the bottleneck (no transfer between them) still finishes last.
- ``sequential``: plain sharding (seed 001): one request at a time, one device busy at a time.
- ``overlap=True``: each device has separate receive, compute and send engines, so transfers
  overlap compute; the period is max over devices of the slowest engine, never slower.

Training graphs carry data-only edges from later devices back to earlier ones (the backward
pass). Devices are ordered by the forward edges, and a transfer against that order is taken to
be available within the same request's cycle (as in a 1F1B schedule, where the backward
activations of request r meet the forward pass of a later request); its transfer time is still
paid on both devices.

On a cluster with a topology (docs/clusters.md), block b runs on device ``placement[b]``
(default b): its operators take ``work * compute / compute_d``, it streams what exceeds that
device's fast memory, a message takes the bandwidth and latency of the link between the two
devices, and a tensor read on several devices is sent once per distinct link class (bandwidth,
latency) among the links to them, the rule of :mod:`solver.core.cost`.

Everything the simulator needs is rebuilt here from the graph and the cluster's per-pair
:meth:`~solver.core.cluster.Cluster.link`, node by node and tensor by tensor, independently of
:mod:`solver.core.cost`; the test suite checks that the simulated period equals the evaluator's
objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cost import check_assignment, check_placement, validate
from solver.core.errors import MtppError
from solver.core.files import atomic_file
from solver.core.graph import Graph

# devices x requests steps of one simulated pass: 32 bytes of arrays and ~8 us (two passes)
# each on a 2-core test machine, so this bounds a run to ~64 MB and ~20 s
MAX_EVENTS = 2_000_000


def check_simulation_size(devices: int, requests: int) -> None:
    """Refuse a simulation too large to allocate or finish, before allocating anything."""
    if requests < 1:
        raise MtppError(f"--requests must be >= 1, got {requests}")
    events = devices * requests
    if events > MAX_EVENTS:
        raise MtppError(
            f"--requests {requests} on {devices} device{'s' if devices != 1 else ''} means "
            f"{events:,} simulation steps "
            f"(about {32 * events / 2**20:,.0f} MiB); at most {MAX_EVENTS:,}: use --requests "
            f"<= {max(1, MAX_EVENTS // max(1, devices)):,} (the period settles after a few "
            "hundred requests)"
        )


MAX_LATENCY = 1e9  # seconds (31 years): above it the sums over requests overflow to inf


def check_latency(latency: float | None) -> None:
    """A link latency must be a finite number of seconds from 0 to :data:`MAX_LATENCY`."""
    if latency is not None and not (math.isfinite(latency) and 0 <= latency <= MAX_LATENCY):
        raise MtppError(
            f"--latency must be a finite number of seconds >= 0, got {latency} (the largest "
            f"accepted is {MAX_LATENCY:g})"
        )


@dataclass
class DeviceProgram:
    """What one device does for every request: messages in, ops, messages out."""

    recv: list[tuple[int, float]] = field(default_factory=list)  # (tensor, seconds)
    ops: list[tuple[int, float]] = field(default_factory=list)  # (node, seconds)
    send: list[tuple[int, float]] = field(default_factory=list)  # (tensor, seconds)
    stream: float = 0.0  # seconds streaming parameters from slow memory
    params: float = 0.0  # resident parameter bytes
    senders: set[int] = field(default_factory=set)  # devices it receives from
    latency: dict[int, float] = field(default_factory=dict)  # sender -> link latency

    @property
    def t_recv(self) -> float:
        return sum(s for _, s in self.recv)

    @property
    def t_compute(self) -> float:
        return sum(s for _, s in self.ops) + self.stream

    @property
    def t_send(self) -> float:
        return sum(s for _, s in self.send)

    @property
    def cycle(self) -> float:
        return self.t_recv + self.t_compute + self.t_send


@dataclass
class Simulation:
    """The outcome: period, throughput, latency, per-device utilisation and memory."""

    mode: str
    overlap: bool
    requests: int
    period: float
    throughput: float
    latency_first: float
    latency_mean: float
    makespan: float
    busy: np.ndarray
    idle: np.ndarray
    peak_memory: np.ndarray
    activation_peak: np.ndarray
    valid: bool
    violations: list[str]
    timeline: list[tuple[int, int, str, float, float]]  # (device, request, kind, start, end)

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "overlap": self.overlap,
            "requests": self.requests,
            "period": self.period,
            "throughput": self.throughput,
            "latency_first": self.latency_first,
            "latency_mean": self.latency_mean,
            "makespan": self.makespan,
            "busy_fraction": self.busy.tolist(),
            "idle_fraction": self.idle.tolist(),
            "peak_memory_bytes": self.peak_memory.tolist(),
            "activation_peak_bytes": self.activation_peak.tolist(),
            "valid": self.valid,
            "violations": self.violations,
        }


def device_programs(
    g: Graph, cluster: Cluster, a: np.ndarray, k: int, placement: np.ndarray | None = None
) -> list[DeviceProgram]:
    """Per block (pipeline stage): incoming and outgoing messages, ops in topological order,
    streaming time, on the device ``placement[b]`` (default b) and its links."""
    uniform = placement is None  # a homogeneous cluster: the cluster's own scalars
    dev = list(range(k)) if uniform else [int(x) for x in placement]

    def link(b1: int, b2: int) -> tuple[float, float]:
        if uniform:
            return (cluster.link_bandwidth, cluster.link_latency)
        return cluster.link(dev[b1], dev[b2])

    progs = [DeviceProgram() for _ in range(k)]
    for v in g.topo_order.tolist():
        b = int(a[v])
        w = float(g.work[v])
        if not uniform and cluster.device_compute(dev[b]) != cluster.compute:
            w = w * cluster.compute / cluster.device_compute(dev[b])
        progs[b].ops.append((v, w))
    for t in range(g.num_tensors):
        p = int(g.t_producer[t])
        src = int(a[p])
        readers = sorted({int(a[c]) for c in g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]} - {src})
        size = float(g.t_size[t])
        for bw, _ in sorted({link(src, d) for d in readers}):  # one send per link class
            progs[src].send.append((t, size / bw))
        for d in readers:
            bw, lat = link(src, d)
            progs[d].recv.append((t, size / bw))
            progs[d].senders.add(src)
            progs[d].latency[src] = lat
    for b, prog in enumerate(progs):
        members = np.flatnonzero(a == b)
        if not len(members):
            continue
        used = np.unique(g.pair_param[np.isin(g.p_users, members)])
        prog.params = float(g.p_size[used].sum())
        peak = float(g.act[members].max())
        memory = cluster.fast_memory if uniform else cluster.device_memory(dev[b])
        if math.isfinite(memory):
            excess = prog.params + peak - memory
            prog.stream = max(0.0, excess) / cluster.slow_memory_bandwidth
    return progs


def liveness_peak(g: Graph, a: np.ndarray, d: int, prog: DeviceProgram) -> float:
    """Largest bytes of live activations on device d during one request: a tensor lives from
    its arrival or production until its last local reader ran, or until it was sent."""
    local = [v for v, _ in prog.ops]
    step = {v: i + 1 for i, v in enumerate(local)}  # op i runs at step i + 1; receives at 0
    last_step = len(local) + 1  # the send phase
    end: dict[int, int] = {}
    begin: dict[int, int] = {}
    size: dict[int, float] = {}
    for t, _ in prog.recv:
        begin[t] = 0
        size[t] = float(g.t_size[t])
    sent = {t for t, _ in prog.send}
    for t in range(g.num_tensors):
        p = int(g.t_producer[t])
        if a[p] == d:
            begin[t] = step[p]
            size[t] = float(g.t_size[t])
            if t in sent:
                end[t] = last_step
    for t in list(begin):
        readers = [step[c] for c in g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]].tolist() if a[c] == d]
        if readers:
            end[t] = max(end.get(t, 0), max(readers))
        end.setdefault(t, begin[t])
    delta = np.zeros(last_step + 2)
    for t, b in begin.items():
        delta[b] += size[t]
        delta[end[t] + 1] -= size[t]
    return float(np.cumsum(delta).max()) if len(delta) else 0.0


def simulate(
    g: Graph,
    cluster: Cluster,
    assignment: np.ndarray,
    requests: int = 100,
    mode: str = "pipelined",
    overlap: bool = False,
    latency: float | None = None,
    keep_timeline: int = 3,
    placement: object = None,
) -> Simulation:
    """Push ``requests`` requests through the plan and measure it (see the module docstring).

    ``placement[b]`` is the device running block b (default b); ``latency``, when given,
    replaces the latency of every link. All requests are available at time 0 to measure the
    steady-state period (throughput); latency is then measured by releasing request r at
    r x period, the fastest rate the pipeline sustains without a growing queue. Raises
    :class:`MtppError` for a latency that is not a finite non-negative number, a bad
    placement, or a run beyond :data:`MAX_EVENTS` steps.
    """
    check_latency(latency)
    k = cluster.devices if placement is None else len(np.asarray(placement).reshape(-1))
    check_simulation_size(k, int(requests))
    dev = check_placement(cluster, k, placement)
    args = (g, cluster, assignment, requests, mode, overlap, latency)
    run = _run(*args, keep_timeline, 0.0, dev)
    if run.requests > 1 and run.period > 0:
        paced = _run(*args, 0, run.period, dev)
        run.latency_mean = paced.latency_mean
    return run


def _run(g, cluster, assignment, requests, mode, overlap, latency, keep_timeline, interval, dev):
    """One pass of ``requests`` requests, request r released at ``r * interval``."""
    if mode not in ("pipelined", "sequential"):
        raise ValueError(mode)
    k = cluster.devices if dev is None else len(dev)
    a = check_assignment(g, assignment, k)
    progs = device_programs(g, cluster, a, k, dev)
    order = _device_order(progs, k)
    R = max(1, int(requests))
    clock = _Clock.empty(k, R)
    seq_free = 0.0  # sequential mode: when the previous request left the whole pipeline
    for r in range(R):
        for d in order:
            p = progs[d]
            ready = clock.ready(p, r, interval, latency)
            if mode == "sequential":
                ready = max(ready, seq_free)
            if overlap:
                phases = clock.overlapped(d, r, p, ready)
            else:
                t0 = max(ready, clock.send_end[d, r - 1] if r else 0.0)
                if mode == "sequential":
                    before = order[: order.index(d)]
                    t0 = max(t0, max((clock.send_end[x, r] for x in before), default=seq_free))
                phases = clock.serial(d, r, p, t0)
            clock.busy[d] += max(p.t_recv, p.t_compute, p.t_send) if overlap else p.cycle
            if r < keep_timeline:
                clock.timeline += [(d, r, kind, s, e) for kind, s, e in phases if e > s]
        if mode == "sequential":
            seq_free = float(clock.send_end[:, r].max())
    return _measured(g, cluster, a, dev, progs, clock, mode, overlap, interval)


Phase = tuple[str, float, float]  # (recv | compute | send, start, end)


@dataclass
class _Clock:
    """Per device d and request r (``[d, r]``): when d started r and when it finished
    receiving, computing and sending it (its outputs are then on the link); per device its
    busy time; the phases kept for the Gantt chart."""

    start: np.ndarray
    recv_end: np.ndarray
    comp_end: np.ndarray
    send_end: np.ndarray
    busy: np.ndarray
    timeline: list[tuple[int, int, str, float, float]] = field(default_factory=list)

    @classmethod
    def empty(cls, k: int, R: int) -> _Clock:
        return cls(*(np.zeros((k, R)) for _ in range(4)), busy=np.zeros(k))

    def ready(self, p: DeviceProgram, r: int, interval: float, latency: float | None) -> float:
        """When request r is released and every sender's part of it has arrived."""
        arrived = max(
            (
                self.send_end[s, r] + (p.latency[s] if latency is None else latency)
                for s in p.senders
            ),
            default=r * interval,
        )
        return max(arrived, r * interval)

    def overlapped(self, d: int, r: int, p: DeviceProgram, ready: float) -> list[Phase]:
        """Receive, compute and send engines of their own: each takes request r once it has
        finished r - 1 and the engine before it has finished r."""
        t0 = max(ready, self.recv_end[d, r - 1] if r else 0.0)
        self.recv_end[d, r] = t0 + p.t_recv
        c0 = max(self.recv_end[d, r], self.comp_end[d, r - 1] if r else 0.0)
        self.comp_end[d, r] = c0 + p.t_compute
        s0 = max(self.comp_end[d, r], self.send_end[d, r - 1] if r else 0.0)
        self.send_end[d, r] = s0 + p.t_send
        self.start[d, r] = t0
        return [
            ("recv", t0, self.recv_end[d, r]),
            ("compute", c0, self.comp_end[d, r]),
            ("send", s0, self.send_end[d, r]),
        ]

    def serial(self, d: int, r: int, p: DeviceProgram, t0: float) -> list[Phase]:
        """Receive, compute and send one after the other from ``t0``."""
        self.start[d, r] = t0
        self.recv_end[d, r] = t0 + p.t_recv
        self.comp_end[d, r] = self.recv_end[d, r] + p.t_compute
        self.send_end[d, r] = self.comp_end[d, r] + p.t_send
        return [
            ("recv", t0, self.recv_end[d, r]),
            ("compute", self.recv_end[d, r], self.comp_end[d, r]),
            ("send", self.comp_end[d, r], self.send_end[d, r]),
        ]


def _measured(g, cluster, a, dev, progs, clock: _Clock, mode, overlap, interval) -> Simulation:
    """The run's period, latencies, utilisation, memory and violations."""
    k, R = clock.send_end.shape
    finish = clock.send_end.max(axis=0)  # when each request left the pipeline
    begin = np.maximum(clock.start.min(axis=0), np.arange(R) * interval)
    period = steady_period([clock.recv_end, clock.comp_end, clock.send_end], R)
    makespan = float(finish[-1])
    busy = clock.busy
    bad = validate(g, cluster, a, k, placement=dev)
    act_peak = np.array([liveness_peak(g, a, d, progs[d]) for d in range(k)])
    return Simulation(
        mode=mode,
        overlap=overlap,
        requests=R,
        period=float(period),
        throughput=1.0 / period if period > 0 else math.inf,
        latency_first=float(finish[0] - begin[0]),
        latency_mean=float(np.mean(finish - begin)),
        makespan=makespan,
        busy=busy / makespan if makespan > 0 else busy,
        idle=1.0 - (busy / makespan if makespan > 0 else busy),
        peak_memory=np.array([p.params for p in progs]) + act_peak,
        activation_peak=act_peak,
        valid=not bad,
        violations=[str(v) for v in bad],
        timeline=clock.timeline,
    )


def steady_period(ends: list[np.ndarray], R: int) -> float:
    """The steady-state period: the largest rate, over the second half of the requests, at
    which any one engine (device, or with ``overlap`` its receive, compute or send engine)
    finishes requests; ``ends[i][d, r]`` is when engine kind i of device d finished request r.

    The gaps between requests leaving the pipeline would not do: a device that runs apart
    from a slower one (no transfer between them) can finish every request later than it for
    dozens of requests, so the last device to finish sets a smaller rate until it is
    overtaken. An engine never finishes two requests closer than its own busy time per
    request, and no engine's finish times grow faster than the largest busy time (they are
    longest paths in a graph whose only cycles are the engines' own queues, so a convex
    function of r of slope at most that), so this is the bottleneck's busy time for any
    number of requests (``tests/test_simulate.py``). With one or two requests: when the
    last one finished.
    """
    half = R // 2
    if half >= R - 1:
        return float(max(float(e[:, -1].max(initial=0.0)) for e in ends))
    return float(max(float((e[:, -1] - e[:, half]).max(initial=0.0)) for e in ends)) / (
        R - 1 - half
    )


def _device_order(progs: list[DeviceProgram], k: int) -> list[int]:
    """Devices in an order where every sender comes before its receivers (plan blocks are
    numbered that way; data-only edges of training graphs may point backwards, and then the
    block order is kept)."""
    order, seen = [], set()

    def visit(d: int, stack: set[int]) -> None:
        if d in seen or d in stack:
            return
        stack.add(d)
        for s in sorted(progs[d].senders):
            visit(s, stack)
        stack.discard(d)
        seen.add(d)
        order.append(d)

    for d in range(k):
        visit(d, set())
    return order


def draw_gantt(sim: Simulation, k: int, path: str | Path, title: str = "") -> None:
    """Devices as rows; receive, compute and send bars of the first requests (matplotlib),
    written atomically in the format the suffix names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"recv": "#4c72b0", "compute": "#55a868", "send": "#c44e52"}
    fig, ax = plt.subplots(figsize=(10, 0.6 * k + 1.5))
    for d, r, kind, s, e in sim.timeline:
        ax.barh(d, e - s, left=s, color=colors[kind], edgecolor="white", linewidth=0.5)
        if kind == "compute" and e - s > 0:
            ax.text(
                s + (e - s) / 2, d, f"r{r}", ha="center", va="center", fontsize=7, color="white"
            )
    ax.set_yticks(range(k), [f"device {d}" for d in range(k)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), loc="upper right", fontsize=8)
    # a graph name is text, not mathtext: "$" in it must not break the drawing
    ax.set_title(title or f"{sim.mode} pipeline, period {sim.period:.4g} s", parse_math=False)
    fig.tight_layout()
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    try:  # written beside the target and renamed: an interrupted save leaves the old file
        with atomic_file(path, "wb") as fh:
            try:
                fig.savefig(fh, dpi=120, format=fmt)
            except (OSError, RuntimeError, ValueError) as e:  # a backend missing for fmt
                reason = " ".join(str(e).split())[:300]
                raise MtppError(f"{path}: cannot write the Gantt chart ({reason})") from None
    finally:
        plt.close(fig)
