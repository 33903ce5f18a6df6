"""Classify an inference server's log as healthy, hang or failure, and say why and what to do.

One implementation, two uses: ``scan_log`` / ``python -m agents.logscan FILE`` judge a whole log read
as "everything printed up to now"; ``LogScanner`` runs inside the node agent on live log tails
(``feed`` new lines, ask for a ``verdict`` whenever needed). ``scan_log`` is a ``LogScanner`` fed once.

How a verdict is reached
* Signatures are data. ``RULES`` is a table of named regexes; each says what the line means, what an
  operator should do, the verdict it implies (hang, failure or none), whether it is a root cause or
  only a consequence (a process that died), which phase it indicates and whether it shows progress.
* Failures stick. Hang evidence holds until progress shows again (tokens generated, the engine going
  idle, a phase marker), because a stall that resumes is over.
* The earliest root cause decides between hang and failure: a worker that the NCCL watchdog aborted
  after a collective timed out is a hang, not a crash. Consequences alone (EngineDeadError, a worker
  traceback) mean failure.
* Stats lines (vLLM "Avg prompt throughput ...", SGLang "Decode batch ..." / "Prefill batch ...") are
  judged per engine: decoding (generation >= MIN_DECODE_RATE), prefill (prompt > 0 but little
  generation: healthy, never a stall), idle (nothing running or waiting: healthy) or stalled.
  Two stalled lines in a row from one engine are a hang.
* Tracebacks. One that an engine or worker module logs at ERROR is a failure whenever it comes; one from
  any other module counts only while the server starts (``startup_only``), even when the log ends before
  the exception line, and its frames say the phase (distributed init, weight loading, warm-up). One from
  the API server's request handling (serving_*.py, api_server.py, ...) is a bad request, never a failure.
* Kernel Xid lines pasted with the log are failures with the meaning from ``agents.xids`` (the table the
  NVML path uses too); the informational ones (63, 64, 92) are not.
* Silence. ``PHASES`` gives each phase the longest stretch without progress it may have. The time
  without progress is measured from the last progress line to the newest timestamp in the log, plus
  ``silent_for`` (how long nothing has been printed at all). Heartbeats (health/status polls, vLLM's
  "Waiting for core engine", Ollama's unload retries) are printed but are not progress.

Silence allowances (seconds; None = any silence is normal)
  starting   1200  process launched, engine not yet reporting a stage (it may be loading silently)
  loading    1200  weight loading; large checkpoints on network storage print nothing for minutes
  nccl-init   300  communicator setup takes seconds; silence after channel setup / "Init COMPLETE" is
                   the PCIe-without-P2P hang, caught here well before the 600 s NCCL watchdog
  warmup      900  memory profiling, torch.compile and CUDA-graph capture (compile can take minutes)
  serving      60  requests in flight per the last stats line; vLLM logs every 5-10 s and SGLang every
                   40 decode steps while busy (vLLM V1 stops logging once throughput is zero). Only
                   judged when a stats line reported requests: llama.cpp and Ollama print nothing
                   between a request's start and end, so their busy silence is left to the metrics.
  stopping    120  an Ollama runner being unloaded (waits for the runner to exit and VRAM to free)
  idle, stopped, unknown: None
"""

from __future__ import annotations

import argparse
import calendar
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

from agents import xids

HEALTHY, HANG, FAILURE = "healthy", "hang", "failure"
BACKENDS = ("vllm", "sglang", "llamacpp", "ollama", "nccl")
# Below this rate an interval is not decode progress: a request's first token comes out of its prefill,
# so a handful of tokens per interval is what a prefill alone produces.
MIN_DECODE_RATE = 1.0
MAX_TEXT = 400
STARTUP_ONLY_BLOCKED = ("idle", "serving")

P2P_ADVICE = (
    "On PCIe links without working peer-to-peer set NCCL_P2P_DISABLE=1 (or a lower NCCL_P2P_LEVEL), add "
    "--disable-custom-all-reduce for vLLM, check that ACS/IOMMU are off (nvidia-smi topo -m), or re-plan "
    "with a pipeline/layer split instead of tensor parallelism across that link."
)
NCCL_ERROR_ADVICE = (
    "Run with NCCL_DEBUG=INFO to see the failing transport; in containers give /dev/shm room (--ipc=host or "
    "--shm-size), try NCCL_SHM_DISABLE=1 or NCCL_P2P_DISABLE=1, and make sure every rank uses the same "
    "NCCL version and can reach the others."
)
STACKS_ADVICE = "Capture the stuck processes' stacks with py-spy dump before restarting."


@dataclass(frozen=True)
class Finding:
    signature: str
    line: int
    text: str
    meaning: str
    advice: str


@dataclass
class Verdict:
    verdict: str
    backend: str
    phase: str
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "backend": self.backend,
            "phase": self.phase,
            "findings": [asdict(f) for f in self.findings],
        }


@dataclass(frozen=True)
class Phase:
    allowance: float | None
    meaning: str = ""
    advice: str = ""


PHASES: dict[str, Phase] = {
    "unknown": Phase(None),
    "starting": Phase(
        1200,
        "The server started but its engine has reported no loading, NCCL or warm-up progress for {secs} s "
        "(allowed {allow} s); only heartbeats or nothing were printed.",
        "Check that the GPUs are free (no stale processes in nvidia-smi), that the model path is reachable "
        "and that the engine process is alive; restart with VLLM_LOGGING_LEVEL=DEBUG and NCCL_DEBUG=INFO to "
        "see where it stops. " + STACKS_ADVICE,
    ),
    "loading": Phase(
        1200,
        "Weight loading has shown no progress for {secs} s (allowed {allow} s).",
        "Check storage throughput and that the model files are complete (network filesystem or download "
        "stalls); if the process does no disk or network I/O while loading, it is stuck. " + STACKS_ADVICE,
    ),
    "nccl-init": Phase(
        300,
        "The log stopped inside NCCL/distributed initialisation {secs} s ago (allowed {allow} s): the "
        "first collectives after channel setup are not completing, the classic tensor-parallel hang on "
        "links without working peer-to-peer.",
        P2P_ADVICE,
    ),
    "warmup": Phase(
        900,
        "Warm-up (memory profiling, compilation, CUDA-graph capture) has shown no progress for {secs} s "
        "(allowed {allow} s).",
        "Warm-up runs the first forward passes and collectives: with GPUs pinned at 100 % it is the NCCL "
        "hang ("
        + P2P_ADVICE
        + ") Otherwise try --enforce-eager to skip compilation and graph capture. "
        + STACKS_ADVICE,
    ),
    "serving": Phase(
        60,
        "{in_flight} request(s) are in flight but nothing has shown token progress for {secs} s (allowed "
        "{allow} s); vLLM V1 stops printing stats when throughput is zero, SGLang prints only when decode "
        "steps run.",
        "The engine is stalled: GPUs pinned near 100 % mean a rank spins in NCCL, 0 % with full memory a "
        "deadlock. " + STACKS_ADVICE + " Then restart the deployment. " + P2P_ADVICE,
    ),
    "idle": Phase(None),
    "stopping": Phase(
        120,
        "The model has been unloading for {secs} s without finishing (allowed {allow} s); Ollama keeps a "
        "runner in 'Stopping' while a request still holds it.",
        "Find the stuck request (ollama ps, the client side) and cancel it, or restart the Ollama service "
        "to free the GPU.",
    ),
    "stopped": Phase(None),
}


@dataclass(frozen=True)
class Rule:
    """A named signature. ``pattern`` None: raised by the stats/silence logic, not by a regex."""

    name: str
    pattern: re.Pattern[str] | None
    meaning: str = ""
    advice: str = ""
    verdict: str | None = None
    root: bool = True  # a cause; False: a consequence (the process died, the cause is elsewhere)
    phase: str | None = None
    progress: bool = False
    backends: tuple[str, ...] = ()  # empty: applies to every backend
    repeat: int = 1  # occurrences from one process before it counts...
    busy_confirms: bool = False  # ...or one occurrence while requests are in flight
    startup_only: bool = False  # ignored once the server is idle or serving
    enrich: Callable[[dict[str, str | None]], dict[str, str]] | None = None  # more values for the texts


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


VLLM, SGLANG, LLAMACPP, OLLAMA = ("vllm",), ("sglang",), ("llamacpp",), ("ollama",)
# vLLM's engine and worker modules: a traceback they log is the engine's own failure, whenever it comes.
ENGINE_MODULES = (
    "core|engine|llm_engine|async_llm_engine|multiproc_worker_utils|multiproc_executor|worker_base|"
    "gpu_worker|worker"
)
# The API server's request handling: a traceback there is one bad request; the server keeps serving.
API_MODULES = r"serving_\w+|api_server|api_router|launcher|chat_utils|protocol|logger"
FRAME = r'File "[^"]*", line \d+, in '


def _xid_values(values: dict[str, str | None]) -> dict[str, str]:
    meaning, advice = xids.describe(int(values["code"] or 0))
    return {"xid_meaning": meaning, "xid_advice": advice[0].upper() + advice[1:]}


# Order matters only for phases: the first matching rule that names a phase sets it.
RULES: tuple[Rule, ...] = (
    # failures: causes
    Rule(
        "cuda-oom",
        _rx(
            r"CUDA out of memory|CUDA error: out of memory|cudaMalloc failed: out of memory|"
            r"torch\.OutOfMemoryError|unable to allocate CUDA\d* buffer"
        ),
        "A GPU ran out of memory: the model or its KV cache did not fit where it was placed.",
        "Free the GPU of other processes, or make the model fit: lower --gpu-memory-utilization or "
        "--max-model-len (vLLM), offload fewer layers (llama.cpp -ngl, Ollama num_gpu), use a smaller "
        "quantisation, or spread the model over more GPUs.",
        FAILURE,
    ),
    Rule(
        "cuda-error",
        _rx(r"CUDA error: (?!out of memory)(?P<error>.+)"),
        "A CUDA call failed ({error}); the GPU context is poisoned and the process cannot continue.",
        "Restart the deployment. If it recurs, disable the feature in use when it failed (speculative "
        "decoding, custom kernels, a quantisation) and check the node for XID errors (dmesg) that point at "
        "hardware.",
        FAILURE,
    ),
    Rule(
        "nccl-comm-init-error",
        _rx(r"\bERROR\b.*ncclCommInitRank|ncclCommInitRank.*\bfailed\b"),
        "Creating the NCCL communicator (ncclCommInitRank) raised an error: the worker died during NCCL "
        "initialisation, usually with 'unhandled system error'.",
        NCCL_ERROR_ADVICE,
        FAILURE,
        phase="nccl-init",
    ),
    Rule(
        "nccl-error",
        _rx(
            r"NCCL error|DistBackendError|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
            r"ncclInvalidUsage|ncclRemoteError"
        ),
        "An NCCL call failed (an error, not a timeout): a rank could not set up or use its channel to the "
        "others, so the process group is broken.",
        NCCL_ERROR_ADVICE,
        FAILURE,
    ),
    Rule(
        "ggml-assert",
        _rx(r"GGML_ASSERT\((?P<cond>.*)\) failed"),
        "llama.cpp hit an internal assertion ({cond}) and aborted; the server process is gone.",
        "Restart it. If the same assertion returns, this option/model combination is not supported by the "
        "build: update llama.cpp, and with --split-mode tensor or row switch to --split-mode layer.",
        FAILURE,
        phase="stopped",
        backends=LLAMACPP + OLLAMA,
    ),
    Rule(
        "no-kv-cache-room",
        _rx(r"# GPU blocks: 0\b|GPU KV cache size: 0 tokens|No available memory for the cache blocks"),
        "No GPU memory is left for the KV cache once the weights are loaded (0 blocks): the server cannot "
        "hold a single request and fails at startup, even when its traceback comes later or on stderr.",
        "Give the KV cache room: raise --gpu-memory-utilization, lower --max-model-len or --max-num-seqs, use a "
        "smaller quantisation, free the GPU of other processes, or spread the model over more GPUs.",
        FAILURE,
        backends=VLLM,
    ),
    Rule(
        "unsupported-architecture",
        _rx(
            r"Error in inspecting model architecture '(?P<arch>[^']+)'|"
            r"Model architectures? \[(?P<archs>[^\]]*)\] (?:are|is) not supported"
        ),
        "The server cannot run this model's architecture ({architecture}): it is not supported by this version, "
        "or its model code failed to import (a missing or mismatched package; the traceback says which).",
        "Check the model's architectures in config.json against the server's supported models; upgrade the "
        "server, fix the import error shown in the traceback, or choose another backend.",
        FAILURE,
        phase="stopped",
        enrich=lambda values: {"architecture": values.get("arch") or values.get("archs") or "unknown"},
    ),
    Rule(
        "ray-placement-group-refused",
        _rx(r"ValueError: The number of required GPUs exceeds the total number of available GPUs"),
        "The Ray cluster has fewer GPUs than the plan needs (tensor x pipeline parallel); the engine refused to "
        "start.",
        "Check `ray status`: start the missing nodes (each with its GPUs), or lower tensor/pipeline parallelism "
        "to the GPUs the cluster has.",
        FAILURE,
        phase="stopped",
    ),
    Rule(
        "kernel-xid",
        _rx(
            r"NVRM: Xid \((?P<pci>[^)]*)\): (?!(?:"
            + "|".join(map(str, sorted(xids.INFORMATIONAL)))
            + r")\b)(?P<code>\d+)"
        ),
        "The NVIDIA driver reported Xid {code} on the GPU at {pci}: {xid_meaning}.",
        "{xid_advice}.",
        FAILURE,
        enrich=_xid_values,
    ),
    Rule(
        "worker-method-error",
        _rx(r"Error executing method '?(?P<method>\w+)'?\. This might cause deadlock"),
        "A worker raised an exception in {method}. The other ranks wait for it in a collective, so the engine "
        "hangs (the deadlock the line warns of) rather than exiting.",
        "The worker's traceback after this line (or the error before it) names the cause: in init_device it is "
        "GPU or NCCL/Gloo setup (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, reachability of the other nodes), in "
        "load_model the weights or memory. Fix it and restart the deployment.",
        FAILURE,
        backends=VLLM,
    ),
    Rule(
        "host-oom-kill",
        _rx(r"Out of memory: Killed process|\boom-kill\b"),
        "The kernel's OOM killer killed the process: the node ran out of system RAM (not GPU memory).",
        "Reduce host memory use (fewer processes, less CPU offload or swap space) or raise the container's "
        "memory limit.",
        FAILURE,
        phase="stopped",
    ),
    # hangs: causes
    Rule(
        "nccl-collective-timeout",
        _rx(
            r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
            r"OpType=(?P<op>\w+).*?ran for (?P<ms>\d+) milliseconds"
        ),
        "NCCL collective {op} #{seq} did not finish within the watchdog timeout (ran {ms} ms): a rank "
        "stopped taking part. A low sequence number means the first collectives never completed "
        "(transport/P2P problem at startup); a high one means a rank got stuck while serving.",
        P2P_ADVICE + " Then restart the deployment.",
        HANG,
    ),
    Rule(
        "nccl-heartbeat-timeout",
        _rx(r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds"),
        "PyTorch's NCCL heartbeat monitor found the watchdog thread stuck: a collective or CUDA call is "
        "blocked.",
        STACKS_ADVICE + " " + P2P_ADVICE,
        HANG,
    ),
    Rule(
        "vllm-shm-broadcast-timeout",
        _rx(r"No available (?:shared memory broadcast )?block found in 60 second"),
        "vLLM's shared-memory broadcast between engine and workers waited 60 s, repeatedly or while "
        "requests were in flight: a worker is stuck, usually in a collective. Once during warm-up or "
        "compilation is normal.",
        STACKS_ADVICE + " " + P2P_ADVICE,
        HANG,
        backends=VLLM,
        repeat=2,
        busy_confirms=True,
    ),
    Rule(
        "vllm-worker-response-timeout",
        _rx(r'shm_broadcast\.py", line \d+, in acquire_read|RPC call to \w+ timed out'),
        "The vLLM engine gave up waiting for its workers (shared-memory read or RPC timed out): the "
        "workers hung, and the crash that follows is a consequence.",
        "Treat it as a worker/collective hang. " + P2P_ADVICE,
        HANG,
        backends=VLLM,
    ),
    Rule(
        "sglang-watchdog-timeout",
        _rx(r"[Ww]atchdog timeout \(self\.watchdog_timeout=(?P<secs>[\d.]+)"),
        "SGLang's scheduler watchdog saw no forward progress for {secs} s and is taking the server down: "
        "a forward pass or collective is stuck.",
        "Use --soft-watchdog-timeout to get py-spy stacks of the stuck ranks and check GPU utilisation; "
        + P2P_ADVICE,
        HANG,
        backends=SGLANG,
    ),
    Rule(
        "sglang-health-check-failed",
        _rx(r"Health check failed\. Server couldn't get a response from detokenizer for last (?P<secs>\d+)"),
        "SGLang's health check got no response from the detokenizer for {secs} s: the scheduler produces "
        "no output.",
        STACKS_ADVICE + " Check GPU utilisation, then restart the server.",
        HANG,
        backends=SGLANG,
    ),
    Rule(
        "ray-placement-group-waiting",
        _rx(r"Waiting for creating a placement group of specs for (?P<secs>[7-9]\d|[1-9]\d{2,}) seconds"),
        "Ray has waited {secs} s for a placement group it cannot create: the GPUs the plan needs are not in "
        "the Ray cluster (a node never joined, or its GPUs are taken). vLLM repeats this line with a growing "
        "count (10, 30, 70, 150 s ...); it is not progress, the startup hangs here.",
        "Run `ray status`: check that every node joined with its GPUs and that VLLM_HOST_IP matches the address "
        "Ray uses on each node; or lower tensor/pipeline parallelism to the GPUs present.",
        HANG,
        phase="starting",
    ),
    Rule(
        "ray-placement-group-too-small",
        _rx(r"(?<!ValueError: )The number of required GPUs exceeds the total number of available GPUs"),
        "The Ray cluster has fewer GPUs than the plan needs; vLLM waits for more to join instead of failing, "
        "so the startup hangs until a node brings them.",
        "Check `ray status` and start the missing nodes, or lower tensor/pipeline parallelism to the GPUs the "
        "cluster has.",
        HANG,
        phase="starting",
    ),
    Rule(
        "ollama-request-timeout",
        _rx(
            r'\[GIN\][^|]*\|\s*5\d\d\s*\|\s*(?P<took>\d+h\d+m[\d.]+s|[1-5]\dm[\d.]+s)\s*\|[^"]*'
            r'POST\s+"/(?:api/(?:chat|generate)|v1/(?:chat/)?completions)"'
        ),
        # ten minutes at least: a request that waited for a model load ends after OLLAMA_LOAD_TIMEOUT (5 min),
        # which is ollama-load-timeout's finding
        "A chat/generate request ended with a server error after {took}: it hung, it was not served.",
        "The runner stopped generating: look for a stuck runner in `ollama ps` and GPU utilisation, restart "
        "the Ollama service, and check the model fits in VRAM (partial CPU offload can crawl).",
        HANG,
        backends=OLLAMA,
    ),
    Rule(
        "ollama-load-timeout",
        _rx(r"timed out waiting for llama runner to start(?: - progress (?P<progress>[\d.]+))?"),
        "Ollama's runner did not finish loading within OLLAMA_LOAD_TIMEOUT (progress {progress}).",
        "Check disk speed and free GPU and host memory; raise OLLAMA_LOAD_TIMEOUT for very large models "
        "or offload fewer layers to the GPU (num_gpu).",
        HANG,
        backends=OLLAMA,
    ),
    # failures: consequences (the process died; the cause is printed elsewhere)
    Rule(
        "vllm-engine-dead",
        _rx(r"EngineDeadError|EngineCore encountered a fatal error|Engine core proc \S+ died unexpectedly"),
        "vLLM's engine core is dead; the API server can only return errors.",
        "Restart the deployment; the cause is the first error the EngineCore printed before this line.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=VLLM,
    ),
    Rule(
        "vllm-engine-start-failed",
        _rx(r"EngineCore failed to start|Engine process failed to start|Engine core initialization failed"),
        "vLLM's engine failed during startup.",
        "Fix the first exception printed above this line (memory, NCCL, model files or options) and restart.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=VLLM,
    ),
    Rule(
        "vllm-worker-exception",
        _rx(r"Exception in worker (?P<worker>\S+) while processing method (?P<method>\w+)"),
        "vLLM worker {worker} raised an exception in {method}; the engine cannot continue.",
        "Read the exception at the end of the worker's traceback: in init_device it is GPU or NCCL setup, "
        "in load_model the weights or memory. Fix it and restart.",
        FAILURE,
        root=False,
        backends=VLLM,
    ),
    Rule(
        "vllm-worker-died",
        _rx(r"Worker (?:proc )?\S+(?: pid \d+)? died(?:, exit code: (?P<code>-?\d+)| unexpectedly)"),
        "A vLLM worker process died (exit code {code}; -6 is SIGABRT, which the NCCL watchdog sends after "
        "a collective timeout).",
        "Look for a collective timeout, CUDA or out-of-memory error around this line: that is the cause. "
        "Restart the deployment.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=VLLM,
    ),
    Rule(
        "vllm-fatal-signal",
        _rx(r"Got fatal signal from worker processes"),
        "A vLLM worker process died and the engine is shutting down.",
        "The worker's error just above this line is the cause; fix it and restart the deployment.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=VLLM,
    ),
    Rule(
        "engine-traceback",
        _rx(
            rf"(?:ERROR|CRITICAL)\b.*?\b(?:{ENGINE_MODULES})\.py:\d+\]\s+(?:Traceback \(most recent|File \")"
        ),
        "The engine or a worker process logged a Python traceback: it raised an exception and stopped.",
        "The last line of the traceback names the error; fix that (memory, NCCL, model files or options) "
        "and restart the deployment.",
        FAILURE,
        root=False,
        backends=VLLM,
    ),
    Rule(
        "startup-traceback",
        _rx(
            rf"(?:ERROR|CRITICAL)\b.*?\b(?!(?:{ENGINE_MODULES}|{API_MODULES})\.py)\w+\.py:\d+\]\s+"
            r"(?:Traceback \(most recent|File \")"
        ),
        "A Python traceback was logged at ERROR level while the server was starting: a part of it raised, even "
        "if the log ends before the exception line.",
        "Read the frames: distributed init means NCCL/Gloo setup, load_model the weights, capture the CUDA "
        "graphs; fix what the last lines say and restart the deployment.",
        FAILURE,
        root=False,
        startup_only=True,
    ),
    Rule(
        "sglang-child-failed",
        _rx(r"Received sigquit from a child proces"),
        "An SGLang child process (scheduler or detokenizer) failed and the launcher is shutting down.",
        "The child's error above this line (a watchdog timeout or an exception) is the cause; fix it and "
        "restart.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=SGLANG,
    ),
    Rule(
        "sglang-process-exception",
        _rx(r"(?:Scheduler|TokenizerManager|DetokenizerManager) hit an exception"),
        "An SGLang server process raised an exception and the server is going down.",
        "Read the traceback that follows for the cause, fix it and restart the server.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=SGLANG,
    ),
    Rule(
        "nccl-process-taken-down",
        _rx(r"taking the entire process down|Process group watchdog thread terminated with exception"),
        "PyTorch aborted the process after NCCL work failed or timed out.",
        "Fix the collective that failed or timed out (the watchdog line says which) and restart.",
        FAILURE,
        root=False,
        phase="stopped",
    ),
    Rule(
        "llamacpp-load-failed",
        _rx(r"error loading model|failed to load model"),
        "llama.cpp could not load the model; the server or runner exits.",
        "The reason is on the same or the previous line (memory, a missing or unsupported file); fix it "
        "and retry.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=LLAMACPP + OLLAMA,
    ),
    Rule(
        "ollama-runner-panic",
        _rx(r"(?:^|\|\s*)panic: |llama runner (?:process has )?terminated"),
        "Ollama's runner process panicked or terminated; the model is not loaded.",
        "The error just before the panic is the cause (often out of memory while loading); fix it and "
        "retry the request.",
        FAILURE,
        root=False,
        phase="stopped",
        backends=OLLAMA,
    ),
    Rule(
        "process-aborted",
        _rx(r"core dumped|Segmentation fault|Fatal Python error"),
        "The process crashed (abort, segmentation fault or fatal interpreter error).",
        "The error printed just before the crash is the cause; restart and, if it repeats, report it with "
        "that line.",
        FAILURE,
        root=False,
        phase="stopped",
    ),
    Rule(
        "process-killed",
        _rx(r"^\s*Killed\s*$"),
        "The process was killed with SIGKILL (by the OOM killer, a supervisor or an operator).",
        "Check dmesg for 'Out of memory: Killed process' and the supervisor's logs; the lines above say "
        "what went wrong first.",
        FAILURE,
        root=False,
        phase="stopped",
    ),
    # phase markers and progress
    Rule(
        "engine-launch",
        _rx(
            r"vLLM API server version|Initializing (?:a V1 |an )?LLM engine|non-default args:|"
            r"server_args=ServerArgs\(|^build: \d+|system_info:"
        ),
        phase="starting",
        progress=True,
    ),
    Rule("vllm-waiting-for-engine", _rx(r"Waiting for \d+ core engine proc\(s\) to start"), phase="starting"),
    Rule(
        "nccl-setup",
        _rx(
            r"NCCL INFO|Found nccl from library|vLLM is using nccl==|generating GPU P2P access cache|"
            r"world_size=\d+ rank=\d+|Init torch distributed begin"
        ),
        phase="nccl-init",
        progress=True,
        startup_only=True,
    ),
    # phases read from traceback frames (the deepest frame seen last decides)
    Rule(
        "frame-distributed-init",
        _rx(
            FRAME + r"(?:init_device|init_worker_distributed_environment|init_distributed_environment|"
            r"ensure_model_parallel_initialized|initialize_model_parallel|init_process_group|all_reduce)\b|"
            r"_run_workers\(\"init_device\"\)"
        ),
        phase="nccl-init",
        startup_only=True,
    ),
    Rule(
        "frame-weight-loading",
        _rx(FRAME + r"(?:load_model|get_model|load_weights|_load_weights|download_weights)\b"),
        phase="loading",
        startup_only=True,
    ),
    Rule(
        "frame-warmup",
        _rx(
            FRAME
            + r"(?:capture_model|_dummy_run|profile_run|determine_available_memory|compile_or_warm_up_model|"
            r"determine_num_available_blocks|_initialize_kv_caches|capture|get_kv_cache_configs?|"
            r"check_enough_kv_cache_memory)\b"
        ),
        phase="warmup",
        startup_only=True,
    ),
    Rule(
        "warmup-progress",
        _rx(
            r"Loading weights took|Model loading took|Memory profiling takes|# GPU blocks:|GPU KV cache size|"
            r"Available KV cache memory|Maximum concurrency for|Capturing cudagraphs|Capturing CUDA graph|"
            r"Graph capturing finished|Compiling a graph|torch\.compile takes|Dynamo bytecode transform|"
            r"Load weight end|Memory pool end|Capture cuda graph|warming up the model|llama_context:|"
            r"llama_kv_cache|Capturing a cudagraph|Warming up \d+/\d+ for shape|Compiling a graph for|"
            r"Cache the graph of shape|Directly load the compiled graph|Start compiling|Compilation finished|"
            r"Profiling CUDA graph memory|Estimated CUDA graph memory"
        ),
        phase="warmup",
        progress=True,
    ),
    Rule(
        "weights-loading",
        _rx(
            r"Starting to load model|Loading model weights|Loading weights(?! took)|Using model weights format|"
            r"Loading safetensors checkpoint shards|Load weight begin|llama_model_load|llm_load_print_meta|"
            r"llm_load_tensors|load_tensors:|starting llama server|loading model\b"
        ),
        phase="loading",
        progress=True,
    ),
    Rule(
        "server-ready",
        _rx(
            r"init engine \(profile, create kv cache, warmup model\) took|Starting vLLM API server|"
            r"Available routes are|Application startup complete|Uvicorn running on|server is listening on|"
            r"The server is fired up and ready to roll|llama runner started in|Listening on \S+ \(version|"
            r"all slots are idle"
        ),
        phase="idle",
        progress=True,
    ),
    Rule(
        "llamacpp-slot-busy",
        _rx(r"processing task|prompt processing progress|new prompt, n_ctx_slot|prompt done, n_tokens"),
        phase="serving",
        progress=True,
        backends=LLAMACPP + OLLAMA,
    ),
    Rule(
        "llamacpp-progress",
        _rx(r"print_timing|stop processing|done request|\beval time ="),
        progress=True,
        backends=LLAMACPP + OLLAMA,
    ),
    Rule(
        "ollama-request-done",
        _rx(r'\[GIN\][^|]*\|\s*2\d\d\s*\|[^"]*POST\s+"/(?:api/(?:chat|generate|embed|embeddings)|v1/\S+)"'),
        phase="idle",
        progress=True,
        backends=OLLAMA,
    ),
    Rule(
        "ollama-unloading",
        _rx(
            r"runner expired event received|timer expired, expiring to unload|got lock to unload|"
            r"stopping llama server|waiting for llama server to exit"
        ),
        phase="stopping",
        progress=True,
        backends=OLLAMA,
    ),
    Rule(
        "ollama-unload-retry",
        _rx(r"expired event with positive ref count"),
        phase="stopping",
        backends=OLLAMA,
    ),
    Rule(
        "ollama-unloaded",
        _rx(
            r"llama server stopped|runner released|sending an unloaded event|unload completed|ignoring unload"
        ),
        phase="idle",
        progress=True,
        backends=OLLAMA,
    ),
    Rule(
        "server-shutdown",
        _rx(
            r"Shutting down|Killing local vLLM worker processes|Application shutdown complete|"
            r"Finished server process|Received SIGTERM"
        ),
        phase="stopped",
    ),
    Rule(
        "status-poll",
        _rx(
            r'\b(?:GET|HEAD)\s+"?/(?:api/ps|api/tags|api/version|health\w*|metrics|v1/models|slots|ping)?[?"\s]'
        ),
    ),
)

STALL = Rule(
    "stalled-zero-generation",
    None,
    "{running} request(s) running and {waiting} waiting, yet generation stayed below 1 token/s with no "
    "prompt processing on consecutive stats lines: the engine is not producing tokens.",
    PHASES["serving"].advice,
    HANG,
)
NO_PROGRESS = {
    name: Rule(f"no-progress-{name}", None, phase.meaning, phase.advice, HANG)
    for name, phase in PHASES.items()
    if phase.allowance is not None
}

# Highest priority first: Ollama embeds llama.cpp, vLLM and SGLang print NCCL lines.
BACKEND_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ollama", _rx(r"\bollama\b|\[GIN\]|llama runner", re.I)),
    (
        "sglang",
        _rx(r"\bsglang\b|Decode batch|Prefill batch|#running-req|\bTP\d+\]|watchdog_timeout|sigquit", re.I),
    ),
    (
        "vllm",
        _rx(
            r"vllm|EngineCore|APIServer pid|Avg prompt throughput|custom_all_reduce|shm_broadcast|core_client\.py|"
            r"gpu_model_runner\.py|default_loader\.py|\(Worker_\w+ pid=\d+\)",
            re.I,
        ),
    ),
    (
        "llamacpp",
        _rx(r"llama-server|llama\.cpp|GGML_ASSERT|\bggml_|\bslot\s+\w+:|\bsrv\s+\w+:|llama_model_load"),
    ),
    ("nccl", _rx(r"NCCL|c10d::|torch\.distributed")),
)

STATS_FORMATS: tuple[re.Pattern[str], ...] = (
    _rx(
        r"(?:Engine (?P<engine>\d+): )?Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation "
        r"throughput: (?P<gen>[\d.]+) tokens/s, Running: (?P<running>\d+) reqs(?:, Swapped: (?P<swapped>\d+) "
        r"reqs)?(?:, (?:Pending|Waiting): (?P<waiting>\d+) reqs)?"
    ),
    _rx(
        r"(?:(?P<engine>(?:DP\d+ )?TP\d+)\] )?Decode batch[.,].*?#running-req: (?P<running>\d+).*?"
        r"gen throughput \(token/s\): (?P<gen>[\d.]+)(?:.*?#queue-req: (?P<waiting>\d+))?"
    ),
    # SGLang prefill lines carry a token count, not a rate: only "> 0" is used.
    _rx(
        r"(?:(?P<engine>(?:DP\d+ )?TP\d+)\] )?Prefill batch[.,].*?#new-seq: (?P<new>\d+).*?"
        r"#new-token: (?P<prompt>\d+).*?#running-req: (?P<running>\d+)(?:.*?#queue-req: (?P<waiting>\d+))?"
    ),
)

_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {m: i for i, m in enumerate(_MONTH_NAMES, start=1)}
_CLOCK = r"(?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d(?:\.\d+)?)"
TIME_FORMATS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("iso", _rx(r"(?P<Y>\d{4})-(?P<m>\d\d)-(?P<d>\d\d)[T ]" + _CLOCK)),
    ("gin", _rx(r"(?P<Y>\d{4})/(?P<m>\d\d)/(?P<d>\d\d) - " + _CLOCK)),
    ("syslog", _rx(r"\b(?P<b>" + "|".join(_MONTHS) + r") +(?P<d>\d{1,2}) " + _CLOCK)),
    ("month-day", _rx(r"\b(?P<m>\d\d)-(?P<d>\d\d) " + _CLOCK)),  # vLLM: no year
)
_ANSI = _rx(r"\x1b?\[[0-9;]*m")
_SOURCE = _rx(r"\((?P<proc>[^()]*?pid=\d+)\)|\b(?P<rank>(?:DP\d+ )?TP\d+)\]|^(?P<host>[\w.-]+:\d+:\d+) \[")

Stamp = tuple[str, float]  # (time format, seconds): only stamps of one format are compared
Where = tuple[int, str]  # (line number, text)


@dataclass(frozen=True)
class Stats:
    engine: str
    prompt: float
    gen: float
    running: int
    waiting: int

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting

    def kind(self) -> str:
        if self.gen >= MIN_DECODE_RATE:
            return "decoding"
        if self.prompt > 0:
            return "prefill"
        return "idle" if self.in_flight == 0 else "stalled"


def parse_stats(line: str) -> Stats | None:
    """The periodic throughput line of vLLM or SGLang, or None."""
    for fmt in STATS_FORMATS:
        if match := fmt.search(line):
            g = {k: v or "0" for k, v in match.groupdict().items()}
            return Stats(
                engine=match.group("engine") or "",
                prompt=float(g.get("prompt", "0")),
                gen=float(g.get("gen", "0")),
                running=int(g["running"]) + int(g.get("new", "0")),
                waiting=int(g.get("waiting", "0")) + int(g.get("swapped", "0")),
            )
    return None


def parse_timestamp(line: str) -> Stamp | None:
    """The line's own (earliest) timestamp, as seconds in its format's clock."""
    found = [(m.start(), name, m) for name, rx in TIME_FORMATS if (m := rx.search(line))]
    if not found:
        return None
    _, name, match = min(found, key=lambda item: item[0])
    g = match.groupdict()
    month = _MONTHS[g["b"]] if g.get("b") else int(g["m"])
    day, hour, minute, second = int(g["d"]), int(g["H"]), int(g["M"]), float(g["S"])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    year = int(g.get("Y") or 2000)  # a leap year, so 02-29 parses
    return name, calendar.timegm((year, month, day, hour, minute, 0, 0, 0, 0)) + second


def _clean(raw: str) -> str:
    return _ANSI.sub("", raw).rstrip()


def _source(line: str) -> str:
    match = _SOURCE.search(line)
    return next((v for v in match.groupdict().values() if v), "") if match else ""


def _fill(template: str, values: dict[str, str | None]) -> str:
    return template.format_map({k: ("unknown" if v is None else v) for k, v in values.items()})


@dataclass
class _Evidence:
    finding: Finding
    verdict: str
    root: bool
    seq: int


@dataclass
class _Engine:
    in_flight: int = 0
    streak: int = 0
    first_stalled: Where | None = None


@dataclass
class _Pending:
    first: Where
    values: dict[str, str | None]
    counts: dict[str, int] = field(default_factory=dict)


def _check_backend(backend: str) -> str | None:
    if backend == "auto":
        return None
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use auto or one of {', '.join(BACKENDS)}")
    return backend


def _check_silent_for(silent_for: float) -> float:
    if not isinstance(silent_for, int | float) or not math.isfinite(silent_for) or silent_for < 0:
        raise ValueError(f"silent_for must be a finite number of seconds >= 0, got {silent_for!r}")
    return float(silent_for)


class LogScanner:
    """Incremental classifier: feed lines as they are printed, ask for a verdict at any time."""

    def __init__(self, backend: str = "auto") -> None:
        self._forced = _check_backend(backend)
        self._rules = [
            r for r in RULES if not (self._forced and r.backends and self._forced not in r.backends)
        ]
        self._detected: set[str] = set()
        self._line_no = 0
        self._last_line: Where = (0, "")
        self._phase = "unknown"
        self._engines: dict[str, _Engine] = {}
        self._failures: list[_Evidence] = []
        self._hangs: list[_Evidence] = []
        self._pending: dict[str, _Pending] = {}
        self._latest: dict[str, float] = {}
        self._progress_at: Stamp | None = None
        self._progress_line: Where | None = None
        self._seq = 0
        self._new: list[Finding] = []

    @property
    def backend(self) -> str:
        if self._forced:
            return self._forced
        return next((name for name, _ in BACKEND_MARKERS if name in self._detected), "unknown")

    @property
    def phase(self) -> str:
        return self._phase

    def feed(self, lines: Iterable[str]) -> list[Finding]:
        """Scan new lines; returns the findings they raised (each finding is reported once)."""
        self._new = []
        for chunk in lines:
            for raw in chunk.splitlines() or [chunk]:
                self._scan_line(raw)
        return self._new

    def verdict(self, silent_for: float = 0.0) -> Verdict:
        """The verdict now, given that nothing has been printed for ``silent_for`` seconds."""
        evidence = [*self._failures, *self._hangs]
        if stall := self._stall_evidence(_check_silent_for(silent_for)):
            evidence.append(stall)
        kind = _decide(evidence)
        ordered = sorted(evidence, key=lambda e: (not (e.root and e.verdict == kind), e.finding.line, e.seq))
        return Verdict(kind, self.backend, self._phase, [e.finding for e in ordered])

    def _scan_line(self, raw: str) -> None:
        self._line_no += 1
        here = (self._line_no, _clean(raw))
        self._last_line = here
        self._detect_backend(here[1])
        stamp = parse_timestamp(here[1])
        if stamp:
            self._latest[stamp[0]] = max(stamp[1], self._latest.get(stamp[0], stamp[1]))
        if stats := parse_stats(here[1]):
            self._on_stats(stats, stamp, here)
        else:
            self._on_rules(here, stamp)
        if stamp and self._progress_at is None:  # the earliest dated moment since the last progress
            self._progress_at, self._progress_line = stamp, self._progress_line or here
        if stamp and (stall := self._stall_evidence(0.0)):
            self._add(self._hangs, stall)

    def _detect_backend(self, text: str) -> None:
        if not self._forced:
            self._detected.update(name for name, rx in BACKEND_MARKERS if rx.search(text))

    def _on_rules(self, here: Where, stamp: Stamp | None) -> None:
        matches = [
            (r, m) for r in self._rules if r.pattern and (m := r.pattern.search(here[1])) and self._usable(r)
        ]
        if any(rule.progress for rule, _ in matches):
            self._progressed(stamp, here, clears=True)
        elif not matches and self._phase != "serving":  # unknown output is a sign of life, except while
            self._progressed(stamp, here, clears=False)  # serving, where only tokens count
        for rule, match in matches:
            if rule.verdict:
                self._on_signature(rule, match.groupdict(), here)
        phase = next((rule.phase for rule, _ in matches if rule.phase), None)
        self._phase = phase or self._phase

    def _usable(self, rule: Rule) -> bool:
        return not (rule.startup_only and self._phase in STARTUP_ONLY_BLOCKED)

    def _on_signature(self, rule: Rule, values: dict[str, str | None], here: Where) -> None:
        if rule.enrich is not None:
            values = {**values, **rule.enrich(values)}
        if rule.verdict == FAILURE:
            if not _named(self._failures, rule.name):
                self._record(self._failures, rule, values, here)
        elif not _named(self._hangs, rule.name):
            first = self._confirmation(rule, values, here)
            if first:
                self._record(self._hangs, rule, first[1], first[0])

    def _confirmation(self, rule: Rule, values: dict, here: Where) -> tuple[Where, dict] | None:
        """Where a hang signature counts from, once it has repeated or met busy requests; else None."""
        if rule.repeat <= 1:
            return here, values
        pending = self._pending.setdefault(rule.name, _Pending(here, values))
        source = _source(here[1])
        pending.counts[source] = pending.counts.get(source, 0) + 1
        if pending.counts[source] >= rule.repeat or (rule.busy_confirms and self._busy()):
            del self._pending[rule.name]
            return pending.first, pending.values
        return None

    def _confirm_pending_while_busy(self) -> None:
        for name, pending in list(self._pending.items()):
            rule = RULES_BY_NAME[name]
            if rule.busy_confirms and not _named(self._hangs, name):
                del self._pending[name]
                self._record(self._hangs, rule, pending.values, pending.first)

    def _on_stats(self, stats: Stats, stamp: Stamp | None, here: Where) -> None:
        engine = self._engines.setdefault(stats.engine, _Engine())
        engine.in_flight = stats.in_flight
        kind = stats.kind()
        self._phase = "serving" if self._in_flight() else "idle"
        if kind == "stalled":
            self._on_stalled(engine, stats, here)
        else:
            engine.streak, engine.first_stalled = 0, None
        if kind in ("decoding", "idle"):
            self._progressed(stamp, here, clears=True)
        elif kind == "prefill":  # the engine steps, but this is no proof that decoding recovered
            self._progressed(stamp, here, clears=False)
        if kind in ("stalled", "prefill"):
            self._confirm_pending_while_busy()

    def _on_stalled(self, engine: _Engine, stats: Stats, here: Where) -> None:
        engine.streak += 1
        engine.first_stalled = engine.first_stalled or here
        if engine.streak >= 2 and not _named(self._hangs, STALL.name):
            values = {"running": str(stats.running), "waiting": str(stats.waiting)}
            self._record(self._hangs, STALL, values, engine.first_stalled)

    def _progressed(self, stamp: Stamp | None, here: Where, clears: bool) -> None:
        self._progress_at, self._progress_line = stamp, here
        if clears:
            self._hangs.clear()
            self._pending.clear()

    def _in_flight(self) -> int:
        return sum(engine.in_flight for engine in self._engines.values())

    def _busy(self) -> bool:
        return self._phase == "serving" and self._in_flight() > 0

    def _allowance(self) -> float | None:
        if self._phase == "serving" and not self._in_flight():
            return None
        return PHASES[self._phase].allowance

    def _waited(self) -> float:
        if self._progress_at is None:
            return 0.0
        fmt, since = self._progress_at
        return max(0.0, self._latest.get(fmt, since) - since)

    def _stall_evidence(self, silent_for: float) -> _Evidence | None:
        allowance = self._allowance()
        if allowance is None or self._hangs or self._failures:
            return None
        waited = self._waited() + silent_for
        if waited <= allowance:
            return None
        values = {"secs": f"{waited:.0f}", "allow": f"{allowance:.0f}", "in_flight": str(self._in_flight())}
        where = self._progress_line or self._last_line
        return _evidence(NO_PROGRESS[self._phase], values, where, self._seq + 1)

    def _record(self, target: list[_Evidence], rule: Rule, values: dict, where: Where) -> None:
        self._add(target, _evidence(rule, values, where, self._seq + 1))

    def _add(self, target: list[_Evidence], evidence: _Evidence) -> None:
        self._seq = evidence.seq
        target.append(evidence)
        self._new.append(evidence.finding)


RULES_BY_NAME = {rule.name: rule for rule in RULES}


def _named(evidence: list[_Evidence], name: str) -> bool:
    return any(e.finding.signature == name for e in evidence)


def _evidence(rule: Rule, values: dict, where: Where, seq: int) -> _Evidence:
    line, text = where
    finding = Finding(
        rule.name, line, text[:MAX_TEXT], _fill(rule.meaning, values), _fill(rule.advice, values)
    )
    return _Evidence(finding, rule.verdict or HANG, rule.root, seq)


def _decide(evidence: list[_Evidence]) -> str:
    """The earliest root cause decides; consequences alone (a dead process) mean failure."""
    roots = [e for e in evidence if e.root]
    if roots:
        return min(roots, key=lambda e: (e.finding.line, e.seq)).verdict
    return FAILURE if evidence else HEALTHY


def newest_first(lines: list[str]) -> bool:
    """True for logs printed newest line first (journalctl -r): dated lines only ever go back in time."""
    stamps = [s for s in map(parse_timestamp, lines) if s]
    steps = [b[1] - a[1] for a, b in zip(stamps, stamps[1:], strict=False) if a[0] == b[0]]
    return sum(step < 0 for step in steps) >= 2 and not any(step > 0 for step in steps)


def scan_log(text: str, backend: str = "auto", silent_for: float = 0.0) -> Verdict:
    """Judge a whole log, read as everything printed up to now; silent_for: seconds since its last line."""
    _check_silent_for(silent_for)
    lines = text.splitlines()
    reverse = newest_first(lines)
    scanner = LogScanner(backend)
    scanner.feed(lines[::-1] if reverse else lines)
    result = scanner.verdict(silent_for)
    if reverse:  # report line numbers of the file as given
        result.findings = [replace(f, line=len(lines) + 1 - f.line) for f in result.findings]
    return result


def render(result: Verdict) -> str:
    """Human-readable report: the verdict line, then each finding with its line, meaning and advice."""
    out = [f"{result.verdict.upper()}  (backend: {result.backend}, phase: {result.phase})"]
    if not result.findings:
        out.append("No problem signatures found.")
    for f in result.findings:
        out += [f"line {f.line}: {f.text}", f"  signature: {f.signature}", f"  meaning: {f.meaning}"]
        out.append(f"  advice: {f.advice}")
    return "\n".join(out)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # bad arguments exit 1, like an unreadable file
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _seconds(value: str) -> float:
    try:
        return _check_silent_for(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m agents.logscan", description="Classify an inference-server log.")
    parser.add_argument("file", metavar="FILE", help="log file to read, or - for standard input")
    parser.add_argument("--backend", choices=("auto", *BACKENDS), default="auto")
    parser.add_argument(
        "--silent-for",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="how long nothing has been printed since the last line (default 0: judge by content alone)",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return parser


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        text = _read(args.file)
    except OSError as exc:
        print(f"logscan: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    result = scan_log(text, args.backend, args.silent_for)
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
