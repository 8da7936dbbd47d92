"""The cluster: k devices with fast memory, optional hard capacity, compute and bandwidths.

Presets live in ``configs/clusters/*.yaml`` (shipped inside the package as ``solver/presets``).
A YAML file or preset is validated with pydantic; quantities accept readable units. Numbers are
taken strictly: ``devices: true`` or ``devices: 2.7`` is refused, not coerced.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from solver.errors import MtppError
from solver.files import read_yaml, validation_message
from solver.units import format_bytes, format_rate, format_time, parse_quantity

PRESET_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_PRESET = "ipu-pod"
# The most devices (pipeline stages) a cluster may have. Real pipelines use a few to a few
# dozen stages (an IPU-POD256 has 256 IPUs); the solvers keep arrays of nodes x devices, so a
# typo such as 100000 would exhaust memory instead of giving a useful plan.
MAX_DEVICES = 1024
MAX_NAME_CHARS = 1000  # as for node names (solver.graph.MAX_NAME_CHARS)


@dataclass(frozen=True)
class Cluster:
    """k devices; every quantity in base units (bytes, FLOP/s, bytes/s, seconds).

    ``fast_memory`` is M (SRAM / HBM; what does not fit streams at ``slow_memory_bandwidth``,
    B_mem); ``capacity`` is the optional hard limit C; ``link_bandwidth`` is B.

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
        for f in ("compute", "memory_bandwidth", "link_bandwidth", "slow_memory_bandwidth"):
            v = getattr(self, f)
            if not v > 0:  # also refuses NaN
                raise MtppError(f"cluster {self.name!r}: {f} must be > 0, got {v}")
        for f in ("fast_memory", "capacity"):
            v = getattr(self, f)
            if v is not None and not v >= 0:
                raise MtppError(f"cluster {self.name!r}: {f} must be >= 0, got {v}")
        if not 0 <= self.link_latency < math.inf:
            raise MtppError(
                f"cluster {self.name!r}: link_latency must be finite and >= 0, "
                f"got {self.link_latency}"
            )

    def with_devices(self, k: int | None) -> Cluster:
        """The same cluster with ``k`` devices (unchanged when ``k`` is None)."""
        if k is None:
            return self
        n = _whole(k)
        if n is None or not 1 <= n <= MAX_DEVICES:
            raise MtppError(f"--devices must be >= 1 and at most {MAX_DEVICES}, got {k!r:.40}")
        return replace(self, devices=n)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key, val in d.items():
            if isinstance(val, float) and math.isinf(val):
                d[key] = "inf"
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
        )


def _whole(x: object) -> int | None:
    """``x`` as an int if it is a whole-number type (numpy integers too, not bools)."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


class ClusterConfig(BaseModel):
    """The YAML schema of a cluster file; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")

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

    def to_cluster(self, default_name: str, where: str = "cluster") -> Cluster:
        def q(field: str, kind: str) -> float:
            return parse_quantity(getattr(self, field), kind, f"{where}: {field}")

        return Cluster(
            name=self.name or default_name,
            devices=self.devices,
            fast_memory=q("fast_memory", "bytes"),
            capacity=None if self.capacity is None else q("capacity", "bytes"),
            compute=q("compute", "flops"),
            memory_bandwidth=q("memory_bandwidth", "bandwidth"),
            link_bandwidth=q("link_bandwidth", "bandwidth"),
            slow_memory_bandwidth=q("slow_memory_bandwidth", "bandwidth"),
            link_latency=q("link_latency", "time"),
            description=self.description,
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
