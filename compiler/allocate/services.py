"""SERVICES.yaml: the models to serve on one cluster, each with its SLA, rate and priority.

::

    services:
      - name: detector              # 1-64 characters from [A-Za-z0-9._-]: it names OUTDIR/<name>/
        model: models/yolo.onnx     # relative to this file's folder
        shape: {images: [1, 3, 320, 320]}   # optional: pins dynamic input dimensions
        sla_ms: 300                 # latency per request, at most
        rate_ips: 2                 # optional: requests per second it must sustain
        priority: 2                 # optional weight of its utility (default 1)
        min_devices: 1              # optional bounds on the devices it is given
        max_devices: 3

Unknown keys are errors, as in cluster.yaml; every problem is one line naming the file and the key path
(compiler/cluster/messages.py renders the schema's errors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ..cluster.messages import parse
from ..cluster.schema import DEVICE_NAME, MAX_FIGURE, MIN_POSITIVE
from ..cluster.yamlio import MAX_BYTES, read_yaml
from ..errors import UserError
from ..units import MiB

__all__ = ["Service", "load_services", "WHAT"]

WHAT = "services file"
# A services file lists a handful of models; anything far larger is a wrong file (yamlio refuses it unread).
MAX_BYTES.setdefault(WHAT, 1 * MiB)

_Positive = Annotated[float, Field(allow_inf_nan=False, ge=MIN_POSITIVE, le=MAX_FIGURE)]
# Bounds that keep the solver's integer values (SCALE x priority x utility, solve.py) far inside int64.
_Priority = Annotated[float, Field(allow_inf_nan=False, ge=1e-3, le=1e3, description="a number from 0.001 to 1000")]
_Rate = Annotated[float, Field(allow_inf_nan=False, ge=1e-3, le=1e6,
                               description="a number of requests per second from 0.001 to 1e6")]
_Count = Annotated[int, Field(ge=1, description="a positive integer")]
_Dim = Annotated[int, Field(ge=1, description="a positive integer")]
_Name = Annotated[str, Field(pattern=DEVICE_NAME.pattern,
                             description="1-64 characters from [A-Za-z0-9._-] starting with a letter or digit")]
_Path = Annotated[str, Field(pattern=r"\S", description="a path to an ONNX model")]
_Dims = Annotated[list[_Dim], Field(min_length=1, description="a non-empty list of positive integers")]


class _Doc(BaseModel):
    # As cluster.yaml: strict types, unknown keys refused.
    model_config = ConfigDict(strict=True, extra="forbid", regex_engine="python-re", frozen=True)


class ServiceDoc(_Doc):
    name: _Name
    model: _Path
    shape: dict[str, _Dims] | None = None
    sla_ms: _Positive
    rate_ips: _Rate | None = None
    priority: _Priority = 1.0
    min_devices: _Count | None = None
    max_devices: _Count | None = None

    @staticmethod
    def message_label(raw: Any) -> str | None:
        """A service with a valid name is called by it in messages: "service 'ocr': sla_ms ..."."""
        name = raw.get("name") if isinstance(raw, dict) else None
        return f"service {name!r}" if isinstance(name, str) and DEVICE_NAME.match(name) else None


class ServicesDoc(_Doc):
    services: Annotated[list[ServiceDoc], Field(min_length=1, description="a non-empty list of services")]


@dataclass(frozen=True)
class Service:
    name: str
    model: Path  # resolved against the services file's folder
    shapes: dict[str, tuple[int, ...]]
    sla_ms: float
    rate_ips: float | None
    priority: float
    min_devices: int
    max_devices: int | None  # None: no bound but the cluster's size


def load_services(path: str | Path) -> tuple[Service, ...]:
    """The services a SERVICES.yaml lists, in file order; any problem is one UserError naming the file."""
    p = Path(path)
    shown = str(p)
    data = read_yaml(p, WHAT)
    if data is None:
        raise UserError(f"{WHAT} is empty (expected key: services)", path=shown)
    doc = parse(ServicesDoc, data, shown, root=WHAT)
    out, seen = [], set()
    for sv in doc.services:
        where = f"service {sv.name!r}"
        if sv.name in seen:
            raise UserError(f"duplicate service name {sv.name!r}", path=shown)
        seen.add(sv.name)
        if sv.min_devices is not None and sv.max_devices is not None and sv.min_devices > sv.max_devices:
            raise UserError(f"{where}: min_devices {sv.min_devices} is more than max_devices {sv.max_devices}",
                            path=shown)
        out.append(Service(sv.name, p.parent / sv.model, {k: tuple(v) for k, v in (sv.shape or {}).items()},
                           sv.sla_ms, sv.rate_ips, sv.priority, sv.min_devices or 1, sv.max_devices))
    return tuple(out)
