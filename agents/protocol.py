"""The one definition of the messages that agents and the server exchange over the websocket.

Both sides import this module: the agent builds messages with it, the server validates every
incoming frame with `parse_agent_message` before it stores anything.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

VERSION = 1
MAX_FRAME_BYTES = 256 * 1024
MAX_LOG_LINES = 500
MAX_LOG_LINE_CHARS = 4096

Percent = Annotated[float, Field(ge=0, le=100)]
NonNegative = Annotated[float, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class ProtocolError(ValueError):
    """A frame that breaks the protocol; `code` goes into the error frame sent back."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuInfo(Strict):
    index: Annotated[int, Field(ge=0, lt=256)]
    uuid: Name
    name: Name
    pci_bus_id: Annotated[str, Field(max_length=64)] = ""
    memory_total_mib: Annotated[int, Field(gt=0)]
    numa_node: int | None = None
    power_limit_w: NonNegative | None = None


class TopoDevice(Strict):
    name: Name
    cpu_affinity: str | None = None
    numa_affinity: str | None = None


class TopoNic(Strict):
    name: Name
    device: Name


class TopoLink(Strict):
    a: Name
    b: Name
    link: Annotated[str, Field(min_length=1, max_length=16)]


class Topology(Strict):
    """Same shape as `python -m agents.topo --json` for a matrix, plus P2P status per mode (r, w, n...)."""

    gpus: list[TopoDevice]
    nics: list[TopoNic] = []
    links: list[TopoLink]
    p2p: dict[str, list[TopoLink]] = {}


class Hello(Strict):
    type: Literal["hello"]
    v: Literal[1]
    agent_version: Name
    hostname: Name
    boot_id: Annotated[str, Field(min_length=8, max_length=64)]
    interval_s: Annotated[float, Field(gt=0, le=3600)]
    gpu_source: Literal["nvml", "sim"]
    simulated: bool
    driver_version: str = ""
    cuda_version: str = ""
    gpus: Annotated[list[GpuInfo], Field(max_length=64)]
    topology: Topology | None = None


class GpuProcess(Strict):
    pid: Annotated[int, Field(ge=0)]
    name: Annotated[str, Field(max_length=256)] = ""
    used_mib: NonNegative = 0


class GpuSample(Strict):
    index: Annotated[int, Field(ge=0, lt=256)]
    util_gpu: Percent
    util_mem: Percent
    mem_used_mib: NonNegative
    mem_free_mib: NonNegative
    temp_c: Annotated[float, Field(ge=-50, le=200)]
    power_w: NonNegative
    power_limit_w: NonNegative | None = None
    sm_clock_mhz: NonNegative | None = None
    mem_clock_mhz: NonNegative | None = None
    throttle_reasons: Annotated[int, Field(ge=0)] = 0
    ecc_corrected: Annotated[int, Field(ge=0)] | None = None
    ecc_uncorrected: Annotated[int, Field(ge=0)] | None = None
    xids: Annotated[list[int], Field(max_length=64)] = []
    processes: Annotated[list[GpuProcess], Field(max_length=256)] = []


class Samples(Strict):
    type: Literal["samples"]
    v: Literal[1]
    seq: Annotated[int, Field(ge=1)]
    t: Annotated[float, Field(gt=0)]
    gpus: Annotated[list[GpuSample], Field(min_length=1, max_length=64)]


class LogTail(Strict):
    type: Literal["logs"]
    v: Literal[1]
    seq: Annotated[int, Field(ge=1)]
    t: Annotated[float, Field(gt=0)]
    source: Name
    lines: Annotated[
        list[Annotated[str, Field(max_length=MAX_LOG_LINE_CHARS)]], Field(min_length=1, max_length=MAX_LOG_LINES)
    ]


AgentMessage = Annotated[Hello | Samples | LogTail, Field(discriminator="type")]


class _AgentFrame(BaseModel):
    message: AgentMessage


SEQUENCED = (Samples, LogTail)


def parse_agent_message(raw: str | bytes) -> Hello | Samples | LogTail:
    """Validate one frame from an agent; raise ProtocolError saying exactly what is wrong."""
    if len(raw) > MAX_FRAME_BYTES:
        raise ProtocolError("too_large", f"frame of {len(raw)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("bad_json", f"frame is not JSON: {exc}") from None
    _check_envelope(data)
    try:
        return _AgentFrame(message=data).message
    except ValidationError as exc:
        raise ProtocolError("invalid", _describe(exc)) from None


def _check_envelope(data: object) -> None:
    if not isinstance(data, dict):
        raise ProtocolError("invalid", "frame must be a JSON object")
    kind = data.get("type")
    if kind not in ("hello", "samples", "logs"):
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}")
    if data.get("v") != VERSION:
        raise ProtocolError("bad_version", f"protocol version {data.get('v')!r} not supported (server speaks {VERSION})")


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"][2:]) or "message"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def ack(seq: int) -> str:
    return json.dumps({"type": "ack", "v": VERSION, "seq": seq})


def welcome(node: str, last_seq: int) -> str:
    """The answer to hello: which node the token names and the highest sequence number already stored."""
    return json.dumps({"type": "welcome", "v": VERSION, "node": node, "last_seq": last_seq})


def error(code: str, message: str) -> str:
    return json.dumps({"type": "error", "v": VERSION, "code": code, "message": message})


def dump(message: Strict) -> str:
    return message.model_dump_json(exclude_defaults=False)
