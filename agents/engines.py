"""Which inference engines this node can launch, and their versions (sent with the hello: the planner picks vLLM's
non-torch memory by release, issue #14).

An engine is looked for where its adapter (agents/backends) finds it when it launches: `vllm`, `python3` (with
the sglang package), `llama-server` and `ollama` on the agent's PATH. Nothing is imported into the agent: a
Python engine's version is its package metadata, read by the Python that runs it; a binary's is its
`--version` output. Every probe has a timeout, and one that fails reports the engine with no version and why,
never stops the agent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agents import protocol

PROBE_TIMEOUT_S = 10.0
RECHECK_S = (
    300.0  # an agent re-reads the versions on a reconnect at most this often (an engine upgraded meanwhile)
)
NOT_INSTALLED = 3  # the exit code METADATA_CODE gives when the package is not in that Python
METADATA_CODE = (
    "import importlib.metadata as m, sys\n"
    "try:\n    print(m.version(sys.argv[1]))\n"
    "except m.PackageNotFoundError:\n    sys.exit(3)\n"
)
VERSION = re.compile(protocol.ENGINE_VERSION)
LLAMA_CPP_BUILD = re.compile(r"version:\s*(\d+)\s*\(")  # `llama-server --version`: "version: 4567 (abc1234)"
OLLAMA_VERSION = re.compile(r"version is\s+(\S+)")  # "ollama version is 0.5.7" / "client version is 0.5.7"
MAX_DETAIL = protocol.MAX_MODEL_FIELD
# pip's entry point when the interpreter's path is too long for `#!`: `#!/bin/sh`, then this line.
PIP_SH_EXEC = re.compile(r"""^'''exec' (?:"([^"]+)"|(\S+)) "\$0" "\$@"$""")


class ProbeFailed(RuntimeError):
    """A version could not be read; the message says why, for the node page."""


class EngineCache:
    """The last probe's result, shared by every agent in this process (the engines are the machine's: a bench
    running 1,000 agents in one process probes once, not 1,000 times)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: tuple[float, list[protocol.EngineVersion]] | None = None  # (monotonic time, engines)

    def fresh(self, max_age_s: float = RECHECK_S) -> list[protocol.EngineVersion] | None:
        """The engines found less than `max_age_s` ago, else None."""
        last = self.last
        return last[1] if last is not None and time.monotonic() - last[0] < max_age_s else None

    def read(self, max_age_s: float = RECHECK_S) -> list[protocol.EngineVersion]:
        """The engines, probed again if the last probe is older than `max_age_s` (blocks: call it in a thread)."""
        with self.lock:
            found = self.fresh(max_age_s)
            if found is None:
                found = detect_engines()
                self.last = (time.monotonic(), found)
            return found


ENGINES = EngineCache()


def detect_engines(path: str | None = None) -> list[protocol.EngineVersion]:
    """The engines installed on this node (on `path`, default the agent's PATH), each with its version or why
    it is unknown."""
    probes: list[Callable[[str | None], protocol.EngineVersion | None]] = [vllm, sglang, llama_cpp, ollama]
    return [engine for probe in probes if (engine := probe(path)) is not None]


def vllm(path: str | None) -> protocol.EngineVersion | None:
    script = shutil.which("vllm", path=path)
    if script is None:
        return None
    try:
        python = script_python(Path(script), path)
        found = package_version(python, "vllm")
        if found is None:
            raise ProbeFailed(f"{script} runs {python}, which has no vllm package")
        return engine("vllm", found, f"{script} ({python})")
    except ProbeFailed as exc:
        return unknown("vllm", str(exc))


def sglang(path: str | None) -> protocol.EngineVersion | None:
    python = shutil.which("python3", path=path)
    if python is None:
        return None
    try:
        found = package_version(python, "sglang")
    except ProbeFailed as exc:
        return unknown("sglang", str(exc))
    return None if found is None else engine("sglang", found, python)


def llama_cpp(path: str | None) -> protocol.EngineVersion | None:
    return binary_engine("llama.cpp", "llama-server", LLAMA_CPP_BUILD, "b{}", path)


def ollama(path: str | None) -> protocol.EngineVersion | None:
    return binary_engine("ollama", "ollama", OLLAMA_VERSION, "{}", path)


def binary_engine(
    backend: str, name: str, pattern: re.Pattern[str], form: str, path: str | None
) -> protocol.EngineVersion | None:
    """An engine that is one executable: the last version its `--version` prints (Ollama prints its client's
    after a warning that no server runs)."""
    exe = shutil.which(name, path=path)
    if exe is None:
        return None
    try:
        output = run_probe([exe, "--version"], merge=True).stdout
        found = pattern.findall(output)
        if not found:
            raise ProbeFailed(f"`{exe} --version` printed no version: {shorten(output)!r}")
        return engine(backend, form.format(found[-1]), exe)
    except ProbeFailed as exc:
        return unknown(backend, str(exc))


def script_python(script: Path, path: str | None) -> str:
    """The interpreter an entry-point script runs: its `#!` line (`#!/usr/bin/env python3` looked up on path),
    or the `exec` line pip writes under `#!/bin/sh` when the interpreter's path is too long for `#!`."""
    try:
        with script.open("rb") as fh:
            first, second = (fh.readline(4096).decode("utf-8", "replace").strip() for _ in range(2))
    except OSError as exc:
        raise ProbeFailed(f"cannot read {script}: {exc.strerror}") from None
    trampoline = PIP_SH_EXEC.match(second) if first == "#!/bin/sh" else None
    if trampoline:
        return trampoline.group(1) or trampoline.group(2)
    words = first[2:].split() if first.startswith("#!") else []
    if len(words) == 2 and Path(words[0]).name == "env":
        words = [shutil.which(words[1], path=path) or ""]
    if len(words) != 1 or not words[0]:
        raise ProbeFailed(f"cannot tell which Python runs {script} (first line {shorten(first)!r})")
    return words[0]


def package_version(python: str, package: str) -> str | None:
    """`package`'s installed version in that Python, from its metadata (the package is not imported); None
    when that Python does not have it."""
    done = run_probe([python, "-c", METADATA_CODE, package])
    if done.returncode == NOT_INSTALLED:
        return None
    if done.returncode != 0:
        raise ProbeFailed(f"{python} could not read {package}'s version: {shorten(done.stderr)!r}")
    return done.stdout.strip()


def run_probe(argv: list[str], merge: bool = False) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge else subprocess.PIPE,
            text=True,
            errors="replace",
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"`{' '.join(argv[:2])}` gave no answer within {PROBE_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise ProbeFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def engine(backend: str, version: str, where: str) -> protocol.EngineVersion:
    if not VERSION.match(version):
        return unknown(backend, f"{where} reports a version that is not a release name: {shorten(version)!r}")
    return protocol.EngineVersion(backend=backend, version=version)


def unknown(backend: str, why: str) -> protocol.EngineVersion:
    return protocol.EngineVersion(backend=backend, version=None, detail=shorten(why, MAX_DETAIL))


def shorten(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
