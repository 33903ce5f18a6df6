"""What every backend adapter is, and the checks the agent makes before it starts anything.

The server only ever sends structured `Launch` commands; the agent alone turns them into an argv.
Nothing here trusts the server: the executable comes from the adapter (never from the command), model
paths must resolve inside the directories this agent was configured with, model names must be plain
names, and the GPU layout must add up. A refusal raises `LaunchRefused` before any process exists.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from agents import metrics
from agents.protocol import Launch, LaunchOptions, ServerCounters

LOOPBACK = "127.0.0.1"
# A model name for backends that take names (Ollama tags, the simulated backend): path-like segments
# that each start with a letter or digit, so a name can never be read as a flag, "..", or an absolute path.
MODEL_NAME = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*(:[A-Za-z0-9][A-Za-z0-9_.-]*)?$"
)
MAX_MODEL_NAME = 200


class LaunchRefused(ValueError):
    """The agent will not start this launch; `reason` says what is wrong, for the operator."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Adapter(ABC):
    """One inference backend: how to start it, where it answers, and how to read its log."""

    name: ClassVar[str]
    executable_name: ClassVar[str]  # looked up on the agent's PATH; "" = this Python (sys.executable)
    module: ClassVar[str] = ""  # with executable_name "": the module this Python runs (`python -m module`)
    model_is_path: ClassVar[bool] = True
    model_must_be_file: ClassVar[bool] = False
    needs_gpu_per_rank: ClassVar[bool] = False  # tp * pp must equal the number of GPUs (over all nodes)
    multi_node: ClassVar[bool] = False  # can run one launch per node (nnodes > 1)
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str | None] = "/metrics"
    canary_path: ClassVar[str] = "/v1/completions"  # OpenAI-compatible: every backend here serves it

    def executable(self) -> str:
        if not self.executable_name:
            if self.module:
                require_module(self.name, self.module)
            return sys.executable
        found = shutil.which(self.executable_name)
        if found is None:
            raise LaunchRefused(
                f"{self.name}: executable {self.executable_name!r} is not installed on this "
                f"node (not found on the agent's PATH)"
            )
        return found

    def check(self, launch: Launch) -> None:
        """Backend-specific layout checks; raise LaunchRefused."""
        o = launch.options
        if o.nnodes > 1 and not self.multi_node:
            raise LaunchRefused(
                f"{self.name}: this agent cannot launch {self.name} across nodes (nnodes {o.nnodes}); "
                f"only vLLM, SGLang and the simulated backend run one launch per node"
            )
        if self.needs_gpu_per_rank and o.tp * o.pp != o.nnodes * len(launch.gpus):
            nodes = f" on each of {o.nnodes} nodes" if o.nnodes > 1 else ""
            raise LaunchRefused(
                f"{self.name}: tp {o.tp} x pp {o.pp} = {o.tp * o.pp} ranks, but the launch names "
                f"{len(launch.gpus)} GPUs {launch.gpus}{nodes}; each rank needs exactly one GPU"
            )

    def serves_api(self, launch: Launch) -> bool:
        """Only the head of a multi-node launch answers HTTP; the other nodes run ranks and nothing else."""
        return launch.options.is_head

    @abstractmethod
    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        """The server's command line for this launch (never run through a shell)."""

    def env(self, launch: Launch, port: int, host: str = LOOPBACK) -> dict[str, str]:
        """The variables this launch sets on top of the agent's own environment."""
        return {**gpu_env(launch.gpus), **launch.env}

    def health_url(self, port: int, host: str = LOOPBACK) -> str:
        return f"http://{url_host(host)}:{port}{self.health_path}"

    def metrics_url(self, port: int, host: str = LOOPBACK) -> str | None:
        return f"http://{url_host(host)}:{port}{self.metrics_path}" if self.metrics_path else None

    def canary_request(self, launch: Launch, port: int, host: str = LOOPBACK) -> tuple[str, str]:
        """Where a canary probe's completion goes, and the model name its body must carry."""
        model = launch.options.served_model_name or launch.model
        return f"http://{url_host(host)}:{port}{self.canary_path}", model

    def counters(self, body: str) -> ServerCounters:
        """Turn a metrics response into counters (Prometheus text exposition unless overridden)."""
        return metrics.counters_from_exposition(body)

    def loading_progress(self, line: str) -> float | None:
        """Weight-loading progress (0..1) that this log line shows, or None."""
        return None

    def load_request(self, launch: Launch, port: int, host: str = LOOPBACK) -> tuple[str, dict] | None:
        """A request that loads the model once the server answers (URL, JSON body), for servers that start empty."""
        return None


class RankedServerAdapter(Adapter):
    """A server that runs one GPU per tensor/pipeline rank and spans nodes (vLLM, SGLang): argv from tables.

    A subclass names its command, its flags for the launch options, and how a non-head rank finds the head.
    """

    needs_gpu_per_rank = True
    multi_node = True
    command: ClassVar[tuple[str, ...]]  # between the executable and the model path
    parallel_flags: ClassVar[tuple[str, str]]  # the tensor- and pipeline-parallel size flags
    always: ClassVar[tuple[str, ...]] = ()  # flags every launch gets
    valued_flags: ClassVar[dict[str, str]]  # LaunchOptions field -> `--flag value`, when the option is set
    switch_flags: ClassVar[dict[str, str]]  # boolean LaunchOptions field -> `--flag`, when it is true

    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        o = launch.options
        tp_flag, pp_flag = self.parallel_flags
        argv = [
            self.executable(),
            *self.command,
            launch.model,
            "--host",
            host,
            "--port",
            str(port),
            tp_flag,
            str(o.tp),
            pp_flag,
            str(o.pp),
            *self.always,
        ]
        argv += valued_options({flag: getattr(o, field) for field, flag in self.valued_flags.items()})
        argv += flag_options({flag: getattr(o, field) for field, flag in self.switch_flags.items()})
        return argv + self.node_flags(launch)

    def node_flags(self, launch: Launch) -> list[str]:
        o = launch.options
        if o.nnodes == 1:
            return []
        return ["--nnodes", str(o.nnodes), "--node-rank", str(o.node_rank), *self.rendezvous_flags(o)]

    @abstractmethod
    def rendezvous_flags(self, options: LaunchOptions) -> list[str]:
        """How the ranks of a multi-node launch find the head (nnodes > 1 only)."""


def require_module(backend: str, module: str) -> None:
    """Refuse a launch whose server module is not installed (the simulation ships separately)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (agents.sim) is missing
        found = False
    if not found:
        raise LaunchRefused(
            f"{backend}: module {module!r} is not installed on this node; it ships in "
            f"layercake-agent-sim (demos and tests, not GPU nodes)"
        )


def gpu_env(gpus: list[int]) -> dict[str, str]:
    # NVML numbers GPUs in PCI bus order, CUDA fastest-first unless told otherwise: without
    # CUDA_DEVICE_ORDER the plan's GPU 1 could be another card. "-1" hides every GPU (CPU only).
    visible = ",".join(str(g) for g in gpus) if gpus else "-1"
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": visible}


def url_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine."""
    if host in ("", "0.0.0.0"):
        return LOOPBACK
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def admit(adapter: Adapter, launch: Launch, model_dirs: list[Path]) -> Launch:
    """Check a launch against this node's rules; return it with `model` replaced by what argv may carry."""
    split = launch.options.tensor_split
    if split is not None and len(split) != len(launch.gpus):
        raise LaunchRefused(
            f"tensor_split has {len(split)} entries {split} but the launch names "
            f"{len(launch.gpus)} GPUs {launch.gpus}; give one share per GPU"
        )
    if len(set(launch.gpus)) != len(launch.gpus):
        raise LaunchRefused(f"GPU list {launch.gpus} names a GPU twice")
    adapter.check(launch)
    model = (
        resolve_model_path(launch.model, model_dirs, adapter)
        if adapter.model_is_path
        else check_model_name(launch.model, adapter.name)
    )
    adapter.executable()
    return launch.model_copy(update={"model": model})


def check_model_name(name: str, backend: str) -> str:
    if len(name) > MAX_MODEL_NAME or not MODEL_NAME.fullmatch(name) or ".." in name.split("/"):
        raise LaunchRefused(
            f"{backend}: model name {name!r} is not a plain model name "
            f"(letters, digits, '._-', '/'-separated parts, optional ':tag')"
        )
    return name


def resolve_model_path(model: str, model_dirs: list[Path], adapter: Adapter) -> str:
    """The model's real path (symlinks followed) if it lies under one of the configured model directories."""
    if not model_dirs:
        raise LaunchRefused(
            f"{adapter.name}: this agent has no model directories configured, so it serves no "
            f"model paths (start it with --model-dir DIR)"
        )
    roots = [d.resolve() for d in model_dirs]
    candidates = [Path(model)] if Path(model).is_absolute() else [root / model for root in roots]
    for candidate in candidates:
        real = candidate.resolve()
        if any(real.is_relative_to(root) for root in roots) and real.exists():
            return str(_check_kind(real, model, adapter))
    inside = [c for c in candidates if any(c.resolve().is_relative_to(r) for r in roots)]
    where = ", ".join(str(r) for r in roots)
    if not inside:
        raise LaunchRefused(
            f"{adapter.name}: model path {model!r} resolves to {candidates[0].resolve()}, which is "
            f"outside the allowed model directories ({where})"
        )
    raise LaunchRefused(
        f"{adapter.name}: model path {model!r} does not exist under the allowed model directories ({where})"
    )


def _check_kind(real: Path, model: str, adapter: Adapter) -> Path:
    if adapter.model_must_be_file and not real.is_file():
        raise LaunchRefused(
            f"{adapter.name}: model {model!r} must be a model file (e.g. .gguf), not a directory"
        )
    return real


def number(value: float) -> str:
    """A float as argv text without noise: 1.0 -> "1", 0.9 -> "0.9"."""
    return f"{value:g}"


def valued_options(options: dict[str, object]) -> list[str]:
    """`--flag value` for every option that is set."""
    argv: list[str] = []
    for flag, value in options.items():
        if value is not None:
            argv += [flag, number(value) if isinstance(value, float) else str(value)]
    return argv


def flag_options(options: dict[str, bool]) -> list[str]:
    return [flag for flag, on in options.items() if on]
