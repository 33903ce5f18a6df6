"""The one definition of the messages that agents and the server exchange over the websocket.

Both sides import this module: the agent builds messages with it, the server validates every
incoming frame with `parse_agent_message` before it stores anything.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

VERSION = 1
# Websocket close codes the server uses (the agent stops on the first two, reconnects on the last).
CLOSE_UNAUTHORIZED = 4401  # unknown or revoked token
CLOSE_REPLACED = 4409  # another connection with this node's token took over
CLOSE_RETRY = 1013  # try again later: the server could not store a frame; reconnect and replay
MAX_FRAME_BYTES = 256 * 1024
# The longest a server may ask an agent to stay away (a "busy" error's retry_after_s).
MAX_RETRY_AFTER_S = 600.0
MAX_LOG_LINES = 500
MAX_LOG_LINE_CHARS = 4096
INT64_MAX = 2**63 - 1  # what both databases hold in a BIGINT; no integer on the wire may exceed it
MAX_GPU_MEMORY_MIB = 2**24  # 16 TiB per GPU; the column is a 32-bit integer

Percent = Annotated[float, Field(ge=0, le=100)]
NonNegative = Annotated[float, Field(ge=0)]
MAX_NAME_CHARS = 200  # a name (device, GPU, host, log source...); the database columns hold as much
MAX_LINK_CHARS = 16  # a topology label: NV18, SYS, PHB; a P2P status: OK, NS, CNS
MAX_VERSION_CHARS = 64  # a driver or CUDA version
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
Seq = Annotated[int, Field(ge=1, le=INT64_MAX)]
Counter = Annotated[int, Field(ge=0, le=INT64_MAX)]
Pid = Annotated[int, Field(ge=0, le=2**31 - 1)]
Mib = Annotated[float, Field(ge=0, le=MAX_GPU_MEMORY_MIB)]
# Seconds since the epoch, up to 2100: any such time converts to a date. How far from its own clock it
# accepts a time is the server's rule (dashboard.ingest.check_time).
Timestamp = Annotated[float, Field(gt=0, le=4_102_444_800)]


class ProtocolError(ValueError):
    """A frame that breaks the protocol; `code` goes into the error frame sent back."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Strict(BaseModel):
    # No NaN or Infinity anywhere: they cannot be compared, and browsers cannot parse them as JSON.
    # Frames off the wire are validated strictly (parse_*): `true` or "1" is not the integer 1, 1.5 is
    # not an integer; only an integer may stand for a float. Code building a message may still pass 1 for 1.0.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GpuInfo(Strict):
    index: Annotated[int, Field(ge=0, lt=256)]
    uuid: Name
    name: Name
    pci_bus_id: Annotated[str, Field(max_length=64)] = ""
    memory_total_mib: Annotated[int, Field(gt=0, le=MAX_GPU_MEMORY_MIB)]
    numa_node: Annotated[int, Field(ge=-1, le=65535)] | None = None
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
    link: Annotated[str, Field(min_length=1, max_length=MAX_LINK_CHARS)]


class Topology(Strict):
    """Same shape as `python -m agents.topo --json` for a matrix, plus P2P status per mode (r, w, n...)."""

    gpus: list[TopoDevice]
    nics: list[TopoNic] = []
    links: list[TopoLink]
    p2p: dict[str, list[TopoLink]] = {}


# ---------------------------------------------------------------- models on the node (issue #14, 1.7)

MAX_NODE_MODELS = 32
MAX_MODEL_FIELD = 200
MAX_MODEL_CONFIG_CHARS = 4096  # 32 x 4 KiB stays well inside MAX_FRAME_BYTES with the rest of a hello


class LocalModel(Strict):
    """A model found in one of the agent's --model-dir folders: a Hugging Face checkpoint folder (`config` holds
    the config.json keys the planner reads, as JSON) or a GGUF file (header metadata only)."""

    path: Annotated[str, Field(min_length=1, max_length=1024)]
    name: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_FIELD)]
    format: Literal["hf", "gguf"]
    architecture: Annotated[str, Field(max_length=MAX_MODEL_FIELD)] = ""
    quantization: Annotated[str, Field(max_length=MAX_MODEL_FIELD)] = ""
    size_bytes: Counter = 0
    size_label: Annotated[str, Field(max_length=MAX_MODEL_FIELD)] = ""
    config: Annotated[str, Field(max_length=MAX_MODEL_CONFIG_CHARS)] = ""


# ---------------------------------------------------------------- inference engines on the node (issue #14)

MAX_NODE_ENGINES = 8
# A release as the engines print it: 0.7.3, 0.6.4.post1, 0.8.3rc2.dev224+g49c0d11ec, llama.cpp's b4567, Ollama's 0.5.7.
ENGINE_VERSION = r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$"
EngineName = Literal["vllm", "sglang", "llama.cpp", "ollama"]


class EngineVersion(Strict):
    """An inference engine the agent can launch (found where its adapter looks) and its version; `version`
    None: installed, but the version could not be read (`detail` says why)."""

    backend: EngineName
    version: Annotated[str, Field(pattern=ENGINE_VERSION)] | None = None
    detail: Annotated[str, Field(max_length=MAX_MODEL_FIELD)] = ""


class Envelope(Strict):
    """What every frame carries first: `type` (narrowed to one Literal by each message) and the version."""

    type: str
    v: Annotated[int, Field(ge=VERSION, le=VERSION)]  # not Literal[1]: that takes `true` even when strict


class Sequenced(Envelope):
    """An agent frame the server acknowledges: `seq` orders it (replays after a reconnect), `t` is when it was made."""

    seq: Seq
    t: Timestamp


InventoryDigest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # SHA-256, lower-case hex


class Hello(Envelope):
    """Who the agent is and what its node has. Full: `gpus` (and the topology and models), the inventory.
    Digest-only (issue #13, a reconnect wave): no inventory, only `inventory_digest`, the digest a welcome of
    this server gave for the inventory the agent sent before; the server compares it with the stored one and
    answers `full_hello_required` when they differ. A full hello may not carry a digest: the server computes it."""

    type: Literal["hello"]
    agent_version: Name
    hostname: Name
    boot_id: Annotated[str, Field(min_length=8, max_length=64)]
    interval_s: Annotated[float, Field(gt=0, le=3600)]
    gpu_source: Literal["nvml", "sim"]
    simulated: bool
    driver_version: Annotated[str, Field(max_length=MAX_VERSION_CHARS)] = ""
    cuda_version: Annotated[str, Field(max_length=MAX_VERSION_CHARS)] = ""
    gpus: Annotated[list[GpuInfo], Field(max_length=64)] | None = None
    topology: Topology | None = None
    models: Annotated[list[LocalModel], Field(max_length=MAX_NODE_MODELS)] = []
    # Older agents send no `engines`: the node then reports no engine version.
    engines: Annotated[list[EngineVersion], Field(max_length=MAX_NODE_ENGINES)] = []
    inventory_digest: InventoryDigest | None = None

    @model_validator(mode="after")
    def _inventory_or_digest(self) -> Hello:
        if self.inventory_digest is None and self.gpus is None:
            raise ValueError("a hello needs either gpus (the inventory) or inventory_digest (digest-only)")
        if self.inventory_digest is not None and (self.gpus is not None or self.topology or self.models):
            raise ValueError(
                "inventory_digest is only for a digest-only hello: no gpus, topology or models with it"
            )
        return self

    @model_validator(mode="after")
    def _one_entry_per_engine(self) -> Hello:
        names = [e.backend for e in self.engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engines lists a backend twice: {names}")
        return self

    @property
    def digest_only(self) -> bool:
        return self.inventory_digest is not None

    def inventory(self) -> tuple:
        """What the inventory digest covers, comparable (the agent: did it change since its last welcome?)."""
        return (self.gpus, self.topology, self.models)

    def without_inventory(self, digest: str) -> Hello:
        """This hello as a digest-only one."""
        return self.model_copy(
            update={"gpus": None, "topology": None, "models": [], "inventory_digest": digest}
        )


def inventory_digest(hello: Hello) -> str:
    """The digest of a full hello's inventory (GPUs, topology, models), as the server stores and welcomes it."""
    inventory = {
        "gpus": [g.model_dump() for g in hello.gpus or []],
        "topology": hello.topology.model_dump() if hello.topology else None,
        "models": [m.model_dump() for m in hello.models],
    }
    return hashlib.sha256(json.dumps(inventory, sort_keys=True).encode()).hexdigest()


class GpuProcess(Strict):
    pid: Pid
    name: Annotated[str, Field(max_length=256)] = ""
    used_mib: Mib = 0


class GpuReading(Strict):
    """One GPU's readings at one instant, inside a `samples` frame."""

    index: Annotated[int, Field(ge=0, lt=256)]
    util_gpu: Percent
    util_mem: Percent
    mem_used_mib: Mib
    mem_free_mib: Mib
    temp_c: Annotated[float, Field(ge=-50, le=200)]
    power_w: NonNegative
    power_limit_w: NonNegative | None = None
    sm_clock_mhz: NonNegative | None = None
    mem_clock_mhz: NonNegative | None = None
    throttle_reasons: Counter = 0  # a bit mask (NVML's is 64 bits wide; the bits it defines are the low ones)
    ecc_corrected: Counter | None = None
    ecc_uncorrected: Counter | None = None
    xids: Annotated[list[Annotated[int, Field(ge=0, le=2**32 - 1)]], Field(max_length=64)] = []
    processes: Annotated[list[GpuProcess], Field(max_length=256)] = []


class Samples(Sequenced):
    type: Literal["samples"]
    gpus: Annotated[list[GpuReading], Field(min_length=1, max_length=64)]


class LogTail(Sequenced):
    type: Literal["logs"]
    source: Name
    lines: Annotated[
        list[Annotated[str, Field(max_length=MAX_LOG_LINE_CHARS)]],
        Field(min_length=1, max_length=MAX_LOG_LINES),
    ]


DeploymentId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
# The states an agent can report for a server it supervises. The dashboard's DeploymentState
# (dashboard.choices) holds all of these plus two only the server decides: planned and stopping.
ReportedState = Literal["launching", "loading", "ready", "serving", "stopped", "failed"]


class DeploymentStatus(Sequenced):
    """The agent's word on one supervised inference server: a state change or loading progress."""

    type: Literal["deployment"]
    deployment: DeploymentId
    state: ReportedState
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    pid: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    exit_code: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    progress: Annotated[float, Field(ge=0, le=1)] | None = None
    detail: Annotated[str, Field(max_length=4000)] = ""
    # multi-node head (node_rank 0): the port its rendezvous listens on, for the other nodes' launches
    dist_port: Annotated[int, Field(ge=1, le=65535)] | None = None


class ServerCounters(Strict):
    """Cumulative counters and gauges scraped from one inference server (names are backend-neutral)."""

    generation_tokens_total: NonNegative | None = None
    prompt_tokens_total: NonNegative | None = None
    requests_running: NonNegative | None = None
    requests_waiting: NonNegative | None = None
    kv_cache_usage: Annotated[float, Field(ge=0, le=1)] | None = None
    ttft_seconds_sum: NonNegative | None = None
    ttft_seconds_count: NonNegative | None = None
    itl_seconds_sum: NonNegative | None = None
    itl_seconds_count: NonNegative | None = None
    steps_total: NonNegative | None = None
    requests_finished_total: NonNegative | None = None
    # Ollama: how long the most overdue loaded model has been past its unload time (`ollama ps` "Stopping...")
    unload_overdue_s: NonNegative | None = None


class Metrics(Sequenced):
    type: Literal["metrics"]
    deployment: DeploymentId
    counters: ServerCounters


# ---- canary probes: is an idle server still able to generate? -----------------------------------------
class Probe(Sequenced):
    """One canary probe: the agent sent an idle deployment a tiny completion. Its tokens and its request are
    not in the deployment's counters (the agent takes them out), so tokens/s and request counts exclude it.
    When it failed, `health_*` say what the health endpoint answered meanwhile (status None: nothing)."""

    type: Literal["probe"]
    deployment: DeploymentId
    ok: bool
    elapsed_s: Annotated[float, Field(ge=0, le=3600)]
    timeout_s: Annotated[float, Field(gt=0, le=600)]
    idle_s: Annotated[float, Field(ge=0, le=10**9)] = 0.0  # how long it had served nothing before
    tokens: Annotated[int, Field(ge=0, le=4096)] = 0
    error: Annotated[str, Field(max_length=500)] = ""
    health_status: Annotated[int, Field(ge=100, le=599)] | None = None
    health_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    health_body: Annotated[str, Field(max_length=500)] = ""


# ---- asking a deployment's server through its agent ("Try it" and "Measure" on the deployment page) ----
# A browser cannot reach a node's loopback port, so the server sends `ask` to the agent, which sends the
# prompt to the server it supervises and answers with `answer` frames (not sequenced: nothing is replayed).
RequestId = Annotated[str, Field(pattern=r"^[a-f0-9]{32}$")]
MAX_ASK_STREAMS = 64


class Measurement(Strict):
    """A short load test's result: decode tokens/s per stream (mean) and in total, TTFT and ITL means."""

    streams: Annotated[int, Field(ge=1, le=MAX_ASK_STREAMS)]
    completed: Annotated[int, Field(ge=0, le=MAX_ASK_STREAMS)]
    tokens: Counter
    seconds: Annotated[float, Field(ge=0, le=3600)]
    tok_s_per_stream: NonNegative | None = None
    tok_s_total: NonNegative | None = None
    ttft_s: NonNegative | None = None
    itl_s: NonNegative | None = None


class Answer(Envelope):
    """Part of an answer to `ask`: text as it streams (one stream), or the measurement when done."""

    type: Literal["answer"]
    deployment: DeploymentId
    request: RequestId
    text: Annotated[str, Field(max_length=16_000)] = ""
    done: bool = False
    error: Annotated[str, Field(max_length=2000)] = ""
    measurement: Measurement | None = None


Report = DeploymentStatus | Metrics | Probe  # what an agent says about one deployment
AgentMessage = Annotated[
    Hello | Samples | LogTail | DeploymentStatus | Metrics | Probe | Answer, Field(discriminator="type")
]
AGENT_TYPES = ("hello", "samples", "logs", "deployment", "metrics", "probe", "answer")


AGENT_FRAME = TypeAdapter(AgentMessage)


# ---- server -> agent ---------------------------------------------------------------------------------
Backend = Literal["vllm", "sglang", "llama.cpp", "ollama", "llama-cpp-python", "simulated"]
EnvName = Literal[
    "CUDA_DEVICE_ORDER",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "OLLAMA_NUM_PARALLEL",
    "OLLAMA_CONTEXT_LENGTH",
    "VLLM_LOGGING_LEVEL",
    "OMP_NUM_THREADS",
]
SafeText = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:/+=,@-]{1,512}$")]
HostAddress = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")]


class LaunchOptions(Strict):
    """Everything a backend adapter may turn into argv. No free-form argv ever crosses the wire."""

    tp: Annotated[int, Field(ge=1, le=64)] = 1
    pp: Annotated[int, Field(ge=1, le=64)] = 1
    max_model_len: Annotated[int, Field(ge=16, le=10_000_000)] | None = None
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    dtype: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,16}$")] | None = None
    kv_cache_dtype: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,16}$")] | None = None
    tensor_split: list[Annotated[float, Field(ge=0)]] | None = None
    n_gpu_layers: Annotated[int, Field(ge=-1, le=10_000)] | None = None
    parallel: Annotated[int, Field(ge=1, le=4096)] | None = None
    served_model_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")] | None = None
    disable_custom_all_reduce: bool = False
    enforce_eager: bool = False
    threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    # simulated backend only: tokens/s to generate at, and how to misbehave
    sim_tokens_per_s: Annotated[float, Field(gt=0, le=100_000)] | None = None
    sim_fault: Literal["none", "nccl-init-hang", "stall", "crash", "idle-hang"] = "none"
    # multi-node plans: one launch per node. Rank 0 (the head) serves the API and picks the rendezvous
    # port when master_port is None; every other rank joins master_addr:master_port and serves no API.
    nnodes: Annotated[int, Field(ge=1, le=64)] = 1
    node_rank: Annotated[int, Field(ge=0, lt=64)] = 0
    master_addr: HostAddress | None = None
    master_port: Annotated[int, Field(ge=1, le=65535)] | None = None

    @model_validator(mode="after")
    def _ranks_add_up(self) -> LaunchOptions:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be below nnodes {self.nnodes}")
        if self.nnodes > 1 and self.master_addr is None:
            raise ValueError("a multi-node launch needs master_addr (the head node's address)")
        if self.node_rank > 0 and self.master_port is None:
            raise ValueError(
                "a launch for a node other than the head needs master_port (the head's rendezvous port)"
            )
        return self

    @property
    def is_head(self) -> bool:
        return self.node_rank == 0


class Launch(Envelope):
    type: Literal["launch"]
    deployment: DeploymentId
    backend: Backend
    model: SafeText
    gpus: Annotated[list[Annotated[int, Field(ge=0, lt=256)]], Field(max_length=64)]
    options: LaunchOptions = LaunchOptions()
    env: dict[EnvName, SafeText] = {}


class Stop(Envelope):
    type: Literal["stop"]
    deployment: DeploymentId


class Restart(Envelope):
    type: Literal["restart"]
    deployment: DeploymentId
    # Restart with this launch instead of the running one (the server changed it: a fault injected into a
    # simulated deployment, or cleared). None: the launch the agent already runs.
    launch: Launch | None = None

    @model_validator(mode="after")
    def _same_deployment(self) -> Restart:
        if self.launch is not None and self.launch.deployment != self.deployment:
            raise ValueError(f"the launch is for {self.launch.deployment}, not {self.deployment}")
        return self


class CanarySettings(Strict):
    """When the agent probes a deployment: after `idle_s` serving nothing, a completion of `max_tokens` tokens
    that must answer within `timeout_s`, repeated every `interval_s` while it stays idle."""

    enabled: bool = True
    idle_s: Annotated[float, Field(ge=0.1, le=86_400)] = 30.0
    interval_s: Annotated[float, Field(ge=0.1, le=86_400)] = 60.0
    timeout_s: Annotated[float, Field(ge=0.1, le=600)] = 10.0
    max_tokens: Annotated[int, Field(ge=1, le=4)] = 2


class Canary(Envelope):
    """The canary settings of one deployment (sent after its launch, and whenever the operator changes them).
    An agent that never got one probes with the defaults."""

    type: Literal["canary"]
    deployment: DeploymentId
    canary: CanarySettings = CanarySettings()


class Ask(Envelope):
    """Send a prompt to a deployment's server: one stream ("Try it", the text streams back in `answer`
    frames), or `streams` at once as a short load test ("Measure", one `answer` with the measurement)."""

    type: Literal["ask"]
    deployment: DeploymentId
    request: RequestId
    prompt: Annotated[str, Field(min_length=1, max_length=4000)]
    max_tokens: Annotated[int, Field(ge=1, le=2048)] = 128
    streams: Annotated[int, Field(ge=1, le=MAX_ASK_STREAMS)] = 1
    measure: bool = False


Command = Launch | Stop | Restart | Canary | Ask
ServerCommand = Annotated[Command, Field(discriminator="type")]
COMMAND_TYPES = ("launch", "stop", "restart", "canary", "ask")


SERVER_FRAME = TypeAdapter(ServerCommand)


def parse_server_command(raw: str | bytes) -> Command:
    """Validate a command from the server on the agent side; refuses extra argv, unknown env, odd names."""
    try:
        return SERVER_FRAME.validate_json(raw, strict=True)
    except ValidationError as exc:
        data = _load_json(raw, "command")
        if not isinstance(data, dict) or data.get("type") not in COMMAND_TYPES:
            shown = _shown(data.get("type") if isinstance(data, dict) else data)
            raise ProtocolError("unknown_type", f"unknown command {shown}") from None
        raise ProtocolError("invalid", _describe(exc)) from None


def parse_agent_message(raw: str | bytes) -> Hello | Samples | LogTail | Report | Answer:
    """Validate one frame from an agent; raise ProtocolError saying exactly what is wrong."""
    size = frame_bytes(raw)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError("too_large", f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        return AGENT_FRAME.validate_json(raw, strict=True)
    except ValidationError as exc:  # say what is wrong: not JSON, not a frame we know, or which field
        _check_envelope(_load_json(raw, "frame"))
        raise ProtocolError("invalid", _describe(exc)) from None


def _load_json(raw: str | bytes, what: str) -> object:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("bad_json", f"{what} is not JSON: {exc}") from None
    except RecursionError:  # the decoder recurses once per level of nesting
        raise ProtocolError("bad_json", f"{what} is nested too deeply") from None


def frame_bytes(raw: str | bytes) -> int:
    """The frame's size on the wire: UTF-8 bytes, not characters (a character can take up to 4)."""
    return len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))


def _check_envelope(data: object) -> None:
    if not isinstance(data, dict):
        raise ProtocolError("invalid", "frame must be a JSON object")
    kind = data.get("type")
    if kind not in AGENT_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {_shown(kind)}")
    if type(data.get("v")) is not int or data["v"] != VERSION:
        raise ProtocolError(
            "bad_version", f"protocol version {_shown(data.get('v'))} not supported (server speaks {VERSION})"
        )


def _shown(value: object) -> str:
    """A value from a frame, for an error message: short, and never the repr of a deep structure."""
    if isinstance(value, str | int | float | bool) or value is None:
        return repr(value)[:80]
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"


def _describe(exc: ValidationError) -> str:
    """The first error, where it is: `seq: Input should be a valid integer` (strict: `true` and "1" are not 1)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"][1:]) or "message"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def ack(seq: int) -> str:
    return json.dumps({"type": "ack", "v": VERSION, "seq": seq})


def welcome(node: str, last_seq: int, digest: str = "") -> str:
    """The answer to hello: which node the token names and the highest sequence number already stored, and the
    stored inventory's digest (an agent whose inventory has not changed since may send a digest-only hello)."""
    frame = {"type": "welcome", "v": VERSION, "node": node, "last_seq": last_seq}
    if digest:
        frame["inventory_digest"] = digest
    return json.dumps(frame)


def welcomed_digest(reply: dict) -> str | None:
    """The inventory digest a welcome carries, if it is one (an older server sends none)."""
    digest = reply.get("inventory_digest")
    if isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        return digest
    return None


def error(code: str, message: str, seq: int | None = None) -> str:
    """An error frame; `seq` names the sequenced frame it is about when there is one (`store_refused`: the
    server will never store that frame, so the agent stops sending it)."""
    frame = {"type": "error", "v": VERSION, "code": code, "message": message}
    if seq is not None:
        frame["seq"] = seq
    return json.dumps(frame)


def busy(message: str, retry_after_s: float) -> str:
    """The server cannot take this agent now: it should connect again after `retry_after_s` seconds, which the
    server chooses to spread a reconnect wave over the time it needs."""
    wait = round(min(max(retry_after_s, 0.0), MAX_RETRY_AFTER_S), 2)
    return json.dumps(
        {"type": "error", "v": VERSION, "code": "busy", "message": message, "retry_after_s": wait}
    )


def retry_after(reply: dict) -> float | None:
    """The delay a server's error reply asks for (`retry_after_s`, seconds), or None if it names none.
    A value that is not a number from 0 to MAX_RETRY_AFTER_S is a ProtocolError, never obeyed."""
    if "retry_after_s" not in reply:
        return None
    wait = reply["retry_after_s"]
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= MAX_RETRY_AFTER_S:
        raise ProtocolError(
            "bad_retry_after",
            f"retry_after_s must be a number of seconds from 0 to {MAX_RETRY_AFTER_S:.0f}, got {_shown(wait)}",
        )
    return float(wait)


def dump(message: Strict) -> str:
    return message.model_dump_json(exclude_defaults=False)


def dump_hello(hello: Hello) -> str:
    """A hello as sent: a full one without the digest field (servers before digest-only hellos refuse any
    field they do not know), a digest-only one without the inventory fields; `engines` only when it lists
    one, so an agent that found no engine still speaks to a server from before engine versions."""
    left_out = {"gpus", "topology", "models"} if hello.digest_only else {"inventory_digest"}
    return hello.model_dump_json(exclude=left_out | (set() if hello.engines else {"engines"}))
