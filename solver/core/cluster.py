"""The cluster: k devices with fast memory, optional hard capacity, compute and bandwidths.

Presets live in ``configs/clusters/*.yaml`` (shipped inside the package as ``solver/presets``).
A YAML file or preset is validated with pydantic; quantities accept readable units. Numbers are
taken strictly: ``devices: true`` or ``devices: 2.7`` is refused, not coerced.

An optional :class:`Topology` groups the devices into hosts (or boards) with one link inside
each group and one between groups, and may give every device its own fast memory, capacity
and compute (docs/clusters.md). Without one, every device and every link is alike, as before.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from solver.core.errors import MtppError
from solver.core.files import read_yaml, validation_message
from solver.core.units import format_bytes, format_rate, format_time, parse_quantity

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"
DEFAULT_PRESET = "ipu-pod"
# The most devices (pipeline stages) a cluster may have. Real pipelines use a few to a few
# dozen stages (an IPU-POD256 has 256 IPUs); the solvers keep arrays of nodes x devices, so a
# typo such as 100000 would exhaust memory instead of giving a useful plan.
MAX_DEVICES = 1024
MAX_NAME_CHARS = 1000  # as for node names (solver.core.graph.MAX_NAME_CHARS)
# Slower rates or longer latencies are typing mistakes (1e-300 B/s, 1e300 s), and they make
# times whose sums overflow or swallow every other term (a period of 0 after 1e300 s latency).
MIN_RATE = 1e-6  # bytes/s or FLOP/s (toy clusters in tests use 0.5 B/s)
MAX_LATENCY = 1e9  # seconds (31 years)


Link = tuple[float, float]  # (bandwidth in bytes/s, latency in seconds)


@dataclass(frozen=True)
class Topology:
    """Devices grouped into hosts: ``groups[i]`` are the device ids of group i (every device
    in exactly one group), ``links[i]`` its inside link, ``between`` the link joining devices
    of two groups (None with one group). ``fast_memory``, ``capacity`` and ``compute`` are
    optional per-device values (None: every device has the cluster's own value)."""

    groups: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    links: tuple[Link, ...]
    between: Link | None = None
    fast_memory: tuple[float, ...] | None = None
    capacity: tuple[float | None, ...] | None = None
    compute: tuple[float, ...] | None = None

    def check(self, where: str, devices: int) -> None:
        """Raise :class:`MtppError` naming what to fix when the topology does not add up."""
        if not self.groups:
            raise MtppError(f"{where}: topology.groups is empty; list at least one group")
        if not (len(self.names) == len(self.links) == len(self.groups)):
            raise MtppError(f"{where}: every group needs a name and a link")
        if len(set(self.names)) != len(self.names):
            dup = next(n for n in self.names if self.names.count(n) > 1)
            raise MtppError(f"{where}: group name {dup!r} is used twice; names must differ")
        owner: dict[int, str] = {}
        for name, members in zip(self.names, self.groups, strict=True):
            if not members:
                raise MtppError(f"{where}: group {name!r} has no devices")
            for d in members:
                if not 0 <= d < devices:
                    raise MtppError(
                        f"{where}: group {name!r} lists device {d}, but devices are "
                        f"0..{devices - 1} (devices: {devices})"
                    )
                if d in owner:
                    other = "twice" if owner[d] == name else f"in groups {owner[d]!r} and"
                    raise MtppError(
                        f"{where}: device {d} is listed {other} {name!r}; list every device in "
                        "exactly one group"
                    )
                owner[d] = name
        if len(owner) != devices:
            missing = next(d for d in range(devices) if d not in owner)
            raise MtppError(
                f"{where}: the groups hold {len(owner)} devices but devices is {devices} "
                f"(device {missing} is in no group); make the groups add up to devices"
            )
        if len(self.groups) > 1 and self.between is None:
            raise MtppError(
                f"{where}: groups {self.names[0]!r} and {self.names[1]!r} have no link between "
                "them; set topology.between: {bandwidth: ..., latency: ...}"
            )
        links = list(zip(self.names, self.links, strict=True))
        if self.between is not None:
            links.append(("between", self.between))
        for name, (bw, lat) in links:
            what = "topology.between" if name == "between" else f"group {name!r}: link"
            if not bw > 0:  # also refuses NaN
                raise MtppError(f"{where}: {what} bandwidth must be > 0, got {bw}")
            if bw < MIN_RATE:
                raise MtppError(
                    f"{where}: {what} bandwidth must be at least {MIN_RATE:g} B/s, got {bw:g}"
                )
            if not 0 <= lat < math.inf:
                raise MtppError(f"{where}: {what} latency must be finite and >= 0, got {lat}")
            if lat > MAX_LATENCY:
                raise MtppError(
                    f"{where}: {what} latency must be at most {MAX_LATENCY:g} s, got {lat:g}"
                )
        for key, ok, rule in (
            ("fast_memory", lambda v: v >= 0, ">= 0"),
            ("capacity", lambda v: v is None or 0 <= v < math.inf, ">= 0 and finite, or null"),
            ("compute", lambda v: MIN_RATE <= v < math.inf, "> 0 and finite, at least 1e-06 FLOPS"),
        ):
            values = getattr(self, key)
            if values is None:
                continue
            if len(values) != devices:
                raise MtppError(
                    f"{where}: topology.{key} lists {len(values)} values but there are "
                    f"{devices} devices; give one value per device"
                )
            for d, v in enumerate(values):
                if not ok(v):
                    raise MtppError(f"{where}: topology.{key}[{d}] must be {rule}, got {v}")

    def prefix(self, k: int) -> Topology:
        """The topology of devices 0..k-1 only (groups left empty are dropped)."""
        kept = [
            (n, tuple(d for d in m if d < k), link)
            for n, m, link in zip(self.names, self.groups, self.links, strict=True)
        ]
        kept = [x for x in kept if x[1]]

        def cut(values):
            return None if values is None else values[:k]

        return Topology(
            groups=tuple(m for _, m, _ in kept),
            names=tuple(n for n, _, _ in kept),
            links=tuple(link for _, _, link in kept),
            between=self.between if len(kept) > 1 else None,
            fast_memory=cut(self.fast_memory),
            capacity=cut(self.capacity),
            compute=cut(self.compute),
        )

    def to_dict(self) -> dict:
        """The YAML form (``topology:`` of a cluster file); round trips through the schema."""

        def num(x: float | None) -> float | str | None:
            return "inf" if x is not None and math.isinf(x) else x

        def link(lk: Link) -> dict:
            return {"bandwidth": num(lk[0]), "latency": num(lk[1])}

        d: dict = {
            "groups": [
                {"name": n, "devices": list(m), "link": link(lk)}
                for n, m, lk in zip(self.names, self.groups, self.links, strict=True)
            ],
            "between": None if self.between is None else link(self.between),
        }
        for key in ("fast_memory", "capacity", "compute"):
            values = getattr(self, key)
            if values is not None:
                d[key] = [num(v) for v in values]
        return d


@dataclass(frozen=True)
class Cluster:
    """k devices; every quantity in base units (bytes, FLOP/s, bytes/s, seconds).

    ``fast_memory`` is M (SRAM / HBM; what does not fit streams at ``slow_memory_bandwidth``,
    B_mem); ``capacity`` is the optional hard limit C; ``link_bandwidth`` is B; ``compute`` is
    the reference device whose seconds ``work(v)`` counts; ``int8_compute`` (optional) is its
    integer rate, which the ONNX importer uses for quantized multiply-adds. With a
    ``topology`` these are the defaults: ask :meth:`device_memory`, :meth:`device_compute`,
    :meth:`link` and friends.

    >>> c = Cluster(name="toy", devices=2, fast_memory=1e6, link_bandwidth=1e9)
    >>> c.devices, c.capacity
    (2, None)
    """

    name: str
    devices: int
    fast_memory: float = math.inf
    capacity: float | None = None
    compute: float = 1e12
    memory_bandwidth: float = 1e12
    link_bandwidth: float = 1e9
    slow_memory_bandwidth: float = 1e9
    link_latency: float = 0.0
    description: str = ""
    topology: Topology | None = None
    int8_compute: float | None = None

    def __post_init__(self) -> None:
        devices = _whole(self.devices)
        if devices is None:
            raise MtppError(f"cluster {self.name!r}: devices must be a whole number")
        object.__setattr__(self, "devices", devices)  # a numpy integer becomes an int
        if not 1 <= self.devices <= MAX_DEVICES:
            raise MtppError(
                f"cluster {self.name!r}: devices must be >= 1 and at most {MAX_DEVICES}, "
                f"got {self.devices}"
            )
        rates = ("compute", "memory_bandwidth", "link_bandwidth", "slow_memory_bandwidth")
        for f in rates + (("int8_compute",) if self.int8_compute is not None else ()):
            v = getattr(self, f)
            if not v > 0:  # also refuses NaN
                raise MtppError(f"cluster {self.name!r}: {f} must be > 0, got {v}")
            if v < MIN_RATE:
                unit = "B/s" if f.endswith("bandwidth") else "FLOPS"
                raise MtppError(
                    f"cluster {self.name!r}: {f} must be at least {MIN_RATE:g} {unit}, got {v:g}"
                )
        for f in ("fast_memory", "capacity"):
            v = getattr(self, f)
            if v is not None and not v >= 0:
                raise MtppError(f"cluster {self.name!r}: {f} must be >= 0, got {v}")
        if not 0 <= self.link_latency < math.inf:
            raise MtppError(
                f"cluster {self.name!r}: link_latency must be finite and >= 0, "
                f"got {self.link_latency}"
            )
        if self.link_latency > MAX_LATENCY:
            raise MtppError(
                f"cluster {self.name!r}: link_latency must be at most {MAX_LATENCY:g} s, "
                f"got {self.link_latency:g}"
            )
        if self.topology is not None:
            self.topology.check(f"cluster {self.name!r}", self.devices)

    # -- the topology API: pure and cheap; flat clusters answer with their scalars ----------

    @property
    def groups(self) -> list[list[int]]:
        """Device ids per group (host or board); a cluster without topology is one group."""
        if self.topology is None:
            return [list(range(self.devices))]
        return [list(m) for m in self.topology.groups]

    @property
    def group_names(self) -> list[str]:
        return [self.name] if self.topology is None else list(self.topology.names)

    def device_memory(self, d: int) -> float:
        """Fast memory M of device ``d`` in bytes."""
        return float(self._memory[self._device(d)])

    def device_capacity(self, d: int) -> float | None:
        """Hard capacity C of device ``d`` in bytes (None: no hard limit)."""
        c = float(self._capacity[self._device(d)])
        return None if math.isinf(c) else c

    def device_compute(self, d: int) -> float:
        """Compute of device ``d`` in FLOP/s; work(v) takes ``work * compute / this`` there."""
        return float(self._compute[self._device(d)])

    def link(self, d1: int, d2: int) -> Link:
        """(bandwidth, latency) of the link from device ``d1`` to ``d2``: the group's own link
        inside a group, ``topology.between`` across groups, (inf, 0) from a device to itself."""
        d1, d2 = self._device(d1), self._device(d2)
        if d1 == d2:
            return (math.inf, 0.0)
        bw, lat = self.link_arrays(np.array([d1]), np.array([d2]))
        return (float(bw[0]), float(lat[0]))

    def link_arrays(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`link` for distinct device pairs (src[i] != dst[i])."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        if self.topology is None:
            shape = np.broadcast_shapes(src.shape, dst.shape)
            return np.full(shape, self.link_bandwidth), np.full(shape, self.link_latency)
        gs, gd = self._group_of[src], self._group_of[dst]
        between = self.topology.between or (math.inf, 0.0)
        links = np.array(self.topology.links, dtype=float).reshape(-1, 2)
        same = gs == gd
        bw = np.where(same, links[gs, 0], between[0])
        lat = np.where(same, links[gs, 1], between[1])
        return bw, lat

    def device_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per device: fast memory, capacity (inf for none) and compute, as float arrays."""
        return self._memory, self._capacity, self._compute

    @property
    def homogeneous(self) -> bool:
        """True when every device and every link equals the cluster's scalar fields: then the
        evaluator, simulator and solvers behave exactly as on a cluster without topology."""
        return self._homogeneous

    def relaxation(self) -> tuple[Cluster, float]:
        """A flat cluster at least as good as every device and link of this one (largest fast
        memory and capacity, fastest link) and the largest device speed-up over ``compute``.

        Every plan costs at least as much here, on any placement, as on that flat cluster
        with every work divided by the speed-up: a bound computed there holds here.
        """
        if self.homogeneous:
            return self, 1.0
        memory, capacity, compute = self.device_arrays()
        t = self.topology
        links = [lk for lk, m in zip(t.links, t.groups, strict=True) if len(m) > 1]
        if len(t.groups) > 1:
            links.append(t.between)
        flat = Cluster(
            f"{self.name} (relaxed)",
            self.devices,
            fast_memory=float(memory.max()),
            capacity=None if math.isinf(capacity.max()) else float(capacity.max()),
            compute=self.compute,
            memory_bandwidth=self.memory_bandwidth,
            link_bandwidth=max((bw for bw, _ in links), default=self.link_bandwidth),
            slow_memory_bandwidth=self.slow_memory_bandwidth,
            link_latency=min((lat for _, lat in links), default=self.link_latency),
            int8_compute=self.int8_compute,
        )
        return flat, float(compute.max() / self.compute)

    def _device(self, d: int) -> int:
        i = _whole(d)
        if i is None or not 0 <= i < self.devices:
            raise MtppError(
                f"cluster {self.name!r}: no device {d!r}; devices are 0..{self.devices - 1}"
            )
        return i

    @cached_property
    def _group_of(self) -> np.ndarray:
        out = np.zeros(self.devices, dtype=np.int64)
        for i, members in enumerate(self.groups):
            out[list(members)] = i
        return out

    @cached_property
    def _memory(self) -> np.ndarray:
        t = self.topology
        if t is None or t.fast_memory is None:
            return np.full(self.devices, float(self.fast_memory))
        return np.array(t.fast_memory, dtype=float)

    @cached_property
    def _capacity(self) -> np.ndarray:
        t = self.topology
        if t is None or t.capacity is None:
            cap = math.inf if self.capacity is None else float(self.capacity)
            return np.full(self.devices, cap)
        return np.array([math.inf if c is None else c for c in t.capacity], dtype=float)

    @cached_property
    def _compute(self) -> np.ndarray:
        t = self.topology
        if t is None or t.compute is None:
            return np.full(self.devices, float(self.compute))
        return np.array(t.compute, dtype=float)

    @cached_property
    def _homogeneous(self) -> bool:
        t = self.topology
        if t is None:
            return True
        cap = math.inf if self.capacity is None else self.capacity
        if not (
            np.all(self._memory == self.fast_memory)
            and np.all(self._capacity == cap)
            and np.all(self._compute == self.compute)
        ):
            return False
        own = (self.link_bandwidth, self.link_latency)
        used = [lk for lk, m in zip(t.links, t.groups, strict=True) if len(m) > 1]
        if len(t.groups) > 1:
            used.append(t.between)
        return all(lk == own for lk in used)

    def with_devices(self, k: int | None) -> Cluster:
        """The same cluster with ``k`` devices (unchanged when ``k`` is None).

        With a topology, fewer devices keep devices 0..k-1 (their groups, links and values);
        more devices are possible only for one group of alike devices, which grows.
        """
        if k is None:
            return self
        n = _whole(k)
        if n is None or not 1 <= n <= MAX_DEVICES:
            raise MtppError(f"--devices must be >= 1 and at most {MAX_DEVICES}, got {k!r:.40}")
        t = self.topology
        if t is None or n == self.devices:
            return replace(self, devices=n) if n != self.devices else self
        if n < self.devices:
            return replace(self, devices=n, topology=t.prefix(n))
        if len(t.groups) == 1 and self.homogeneous:
            grown = Topology((tuple(range(n)),), t.names, t.links)
            return replace(self, devices=n, topology=grown)
        raise MtppError(
            f"--devices {n}: cluster {self.name!r} has a topology of {self.devices} devices in "
            f"{len(t.groups)} groups; use at most {self.devices} devices or write a cluster "
            "file with more"
        )

    def with_memory(self, size: float | None) -> Cluster:
        """Every device's hard capacity C set to ``size`` bytes (``--memory``); fast memory M
        is left alone (it prices streaming, C decides what fits). None: unchanged."""
        if size is None:
            return self
        t = self.topology
        if t is not None and t.capacity is not None:
            t = replace(t, capacity=None)
        return replace(self, capacity=float(size), topology=t)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "topology"}
        if self.int8_compute is None:
            del d["int8_compute"]
        for key, val in d.items():
            if isinstance(val, float) and math.isinf(val):
                d[key] = "inf"
        if self.topology is not None:
            d["topology"] = self.topology.to_dict()
        return d

    def summary(self) -> str:
        """One line naming the cluster and its key figures."""
        cap = "none" if self.capacity is None else format_bytes(self.capacity)
        return (
            f"{self.name}: {self.devices} devices, fast memory {format_bytes(self.fast_memory)}, "
            f"capacity {cap}, link {format_rate(self.link_bandwidth, 'B/s')}, "
            f"slow memory {format_rate(self.slow_memory_bandwidth, 'B/s')}, "
            f"compute {format_rate(self.compute, 'FLOPS')}"
            + (f", link latency {format_time(self.link_latency)}" if self.link_latency else "")
            + (
                f", int8 compute {format_rate(self.int8_compute, 'OPS')}"
                if self.int8_compute is not None
                else ""
            )
            + self.topology_summary()
        )

    def topology_summary(self) -> str:
        """The groups, their links and any per-device values, as text ("" without topology)."""
        t = self.topology
        if t is None:
            return ""

        def link(lk: Link) -> str:
            lat = f", {format_time(lk[1])}" if lk[1] else ""
            return f"{format_rate(lk[0], 'B/s')}{lat}"

        parts = [
            f"{n} = devices {_ranges(m)} (link {link(lk)})"
            for n, m, lk in zip(t.names, t.groups, t.links, strict=True)
        ]
        text = f"; {len(t.groups)} group{'s' if len(t.groups) > 1 else ''}: " + "; ".join(parts)
        if t.between is not None:
            text += f"; between groups {link(t.between)}"
        if t.fast_memory is not None:
            text += "; fast memory per device " + ", ".join(format_bytes(x) for x in t.fast_memory)
        if t.capacity is not None:
            text += "; capacity per device " + ", ".join(
                "none" if x is None else format_bytes(x) for x in t.capacity
            )
        if t.compute is not None:
            text += "; compute per device " + ", ".join(format_rate(x, "FLOPS") for x in t.compute)
        return text


def _ranges(ids: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2, 5"``."""
    out: list[str] = []
    run: list[int] = []
    for d in list(ids) + [None]:
        if run and (d is None or d != run[-1] + 1):
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        if d is not None:
            run.append(d)
    return ", ".join(out)


def _whole(x: object) -> int | None:
    """``x`` as an int if it is a whole-number type (numpy integers too, not bools)."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


# The schemas below are built on their first validation (defer_build), as the front ends' are:
# a solve whose cluster comes with the graph never validates a cluster file, and building the
# four models at import took about 20 ms of every process's start-up.


class LinkConfig(BaseModel):
    """A link in YAML: ``{bandwidth: 25GB/s, latency: 5us}``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    bandwidth: Any
    latency: Any = 0.0

    def link(self, where: str) -> Link:
        return (
            parse_quantity(self.bandwidth, "bandwidth", f"{where}.bandwidth"),
            parse_quantity(self.latency, "time", f"{where}.latency"),
        )


class GroupConfig(BaseModel):
    """One host or board: a count of devices (numbered on from the previous group) or their
    ids, an optional name, and its inside link (default: the cluster's link)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: StrictStr | None = Field(default=None, max_length=MAX_NAME_CHARS)
    devices: StrictInt | list[StrictInt] = Field(union_mode="left_to_right")
    link: LinkConfig | None = None


class TopologyConfig(BaseModel):
    """``topology:`` of a cluster file: groups, the link between them, per-device values."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    groups: list[GroupConfig] | None = Field(default=None, max_length=MAX_DEVICES)
    between: LinkConfig | None = None
    fast_memory: list[Any] | None = Field(default=None, max_length=MAX_DEVICES)
    capacity: list[Any] | None = Field(default=None, max_length=MAX_DEVICES)
    compute: list[Any] | None = Field(default=None, max_length=MAX_DEVICES)

    def devices(self) -> int | None:
        """How many devices the groups hold (None without groups)."""
        if not self.groups:
            return None
        return sum(g.devices if isinstance(g.devices, int) else len(g.devices) for g in self.groups)

    def check_counts(self, where: str) -> None:
        """Refuse an empty group list and a group of no devices (or a negative count) before
        the devices are added up, so the message names the group at fault."""
        if self.groups is None:
            return
        if not self.groups:
            raise MtppError(
                f"{where}: topology.groups is empty; list at least one group, or drop topology:"
            )
        for i, gc in enumerate(self.groups):
            n = gc.devices if isinstance(gc.devices, int) else len(gc.devices)
            if n < 1:
                name = gc.name if gc.name is not None else f"group{i}"
                raise MtppError(
                    f"{where}: topology.groups: group {name!r} must hold >= 1 devices, got "
                    f"{gc.devices}"
                )

    def to_topology(self, devices: int, default_link: Link, where: str) -> Topology:
        w = f"{where}: topology"
        groups: list[tuple[int, ...]] = []
        names: list[str] = []
        links: list[Link] = []
        counts = [isinstance(g.devices, int) for g in self.groups or []]
        if any(counts) and not all(counts):
            raise MtppError(
                f"{w}.groups: give every group a count of devices or every group a list of "
                "device ids, not a mix"
            )
        start = 0
        for i, gc in enumerate(self.groups or [GroupConfig(devices=devices)]):
            name = gc.name if gc.name is not None else f"group{i}"
            if isinstance(gc.devices, int):
                if gc.devices < 1:
                    raise MtppError(f"{w}.groups: group {name!r} must hold >= 1 devices")
                members = tuple(range(start, start + gc.devices))
                start += gc.devices
            else:
                members = tuple(gc.devices)
            groups.append(members)
            names.append(name)
            links.append(
                default_link if gc.link is None else gc.link.link(f"{w} group {name!r} link")
            )

        def per_device(key: str, kind: str, nullable: bool = False):
            values = getattr(self, key)
            if values is None:
                return None
            return tuple(
                None if nullable and v is None else parse_quantity(v, kind, f"{w}.{key}[{d}]")
                for d, v in enumerate(values)
            )

        return Topology(
            groups=tuple(groups),
            names=tuple(names),
            links=tuple(links),
            between=None if self.between is None else self.between.link(f"{w}.between"),
            fast_memory=per_device("fast_memory", "bytes"),
            capacity=per_device("capacity", "bytes", nullable=True),
            compute=per_device("compute", "flops"),
        )


class ClusterConfig(BaseModel):
    """The YAML schema of a cluster file; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: StrictStr | None = Field(default=None, max_length=MAX_NAME_CHARS)
    description: StrictStr = Field(default="", max_length=10_000)
    devices: StrictInt = Field(default=4, ge=1, le=MAX_DEVICES)
    # quantities: a number in base units or a string with a unit; parse_quantity checks them
    fast_memory: Any = "inf"
    capacity: Any = None
    compute: Any = 1e12
    memory_bandwidth: Any = 1e12
    link_bandwidth: Any = 1e9
    slow_memory_bandwidth: Any = 1e9
    link_latency: Any = 0.0
    int8_compute: Any = None  # integer rate of quantized multiply-adds ("624TOPS"); None: compute
    topology: TopologyConfig | None = None

    def to_cluster(self, default_name: str, where: str = "cluster") -> Cluster:
        def q(field: str, kind: str) -> float:
            return parse_quantity(getattr(self, field), kind, f"{where}: {field}")

        devices, topology = self.devices, None
        if self.topology is not None:
            self.topology.check_counts(where)
            held = self.topology.devices()
            if held is not None and held > MAX_DEVICES:  # before building any list of ids
                raise MtppError(f"{where}: the groups hold {held} devices; at most {MAX_DEVICES}")
            if held is not None and "devices" not in self.model_fields_set:
                devices = held  # the groups say how many devices there are
            if not 1 <= devices <= MAX_DEVICES:
                raise MtppError(
                    f"{where}: the groups hold {devices} devices; at most {MAX_DEVICES}"
                )
            default_link = (q("link_bandwidth", "bandwidth"), q("link_latency", "time"))
            topology = self.topology.to_topology(devices, default_link, where)
        return Cluster(
            name=self.name or default_name,
            devices=devices,
            fast_memory=q("fast_memory", "bytes"),
            capacity=None if self.capacity is None else q("capacity", "bytes"),
            compute=q("compute", "flops"),
            memory_bandwidth=q("memory_bandwidth", "bandwidth"),
            link_bandwidth=q("link_bandwidth", "bandwidth"),
            slow_memory_bandwidth=q("slow_memory_bandwidth", "bandwidth"),
            link_latency=q("link_latency", "time"),
            description=self.description,
            topology=topology,
            int8_compute=None if self.int8_compute is None else q("int8_compute", "flops"),
        )


def preset_names() -> list[str]:
    """Names of the shipped cluster presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def cluster_from_dict(data: object, where: str) -> Cluster:
    """Validate a mapping (from YAML or an experiment config) into a :class:`Cluster`."""
    if not isinstance(data, dict):
        raise MtppError(f"{where}: a cluster must be a mapping of keys to values")
    try:
        cfg = ClusterConfig.model_validate(data)
    except ValidationError as e:
        raise MtppError(validation_message(e, where, data)) from None
    return cfg.to_cluster(Path(where).stem, where)


def load_cluster(spec: str | Path | None = None, devices: int | None = None) -> Cluster:
    """A preset name or a YAML file path -> :class:`Cluster`; ``devices`` overrides k.

    >>> load_cluster("ipu-m2000").devices
    4
    >>> load_cluster(None, devices=8).name
    'ipu-pod'
    """
    spec = DEFAULT_PRESET if spec is None else str(spec)
    path = Path(spec)
    if not path.suffix and (PRESET_DIR / f"{spec}.yaml").exists():
        path = PRESET_DIR / f"{spec}.yaml"
    elif not path.exists():
        raise MtppError(
            f"cluster {spec!r}: no such file or preset; presets are {', '.join(preset_names())}"
        )
    data = read_yaml(path, "cluster file")
    return cluster_from_dict(data, str(path)).with_devices(devices)
