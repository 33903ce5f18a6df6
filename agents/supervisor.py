"""Supervise inference servers on this node: launch, watch, stop and restart them on the server's command.

One `Supervisor` per agent. `handle(command)` acts on a Launch, Stop or Restart; `poll()`, called every
sampling interval, follows each server's log, notices exits, probes health, scrapes metrics and sends an
idle server canary probes (agents/canary.py). What it finds goes out through four callbacks: status
(`deployment_id, state, **fields` with port, pid, exit_code, progress, detail), counters (`deployment_id,
ServerCounters`, without the probes), log lines (`source, lines`) and probe outcomes (`deployment_id,
ProbeOutcome`).

Lifecycle: launching (process started) -> loading (weights loading; progress where the backend prints
it) -> ready (health endpoint answers) -> serving (the metrics show work done); stopped; failed.

Servers outlive the agent: each runs in its own session with stdout/stderr appended to a log file in
`run_dir` (not a pipe to the agent), and a small state file per deployment records pid, process start
time, port and the launch. After an agent restart `adopt()` re-attaches to every server still running,
so a repeated Launch never starts a second one. The agent rotates the log by copy-and-truncate, which
is safe because the server writes with O_APPEND.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agents import canary, protocol
from agents.backends import ADAPTERS, LOOPBACK, SIMULATION_BACKENDS, Adapter, LaunchRefused, admit
from agents.canary import CanaryClock, ProbeOutcome
from agents.protocol import Canary, CanarySettings, Command, Launch, ServerCounters, Stop

log = logging.getLogger("agents.supervisor")

ACTIVE = ("launching", "loading", "ready", "serving")
PRIVATE_ENV_PREFIX = "LAYERCAKE_"  # the agent's token and settings stay out of the servers' environment
READ_CHUNK = 128 * 1024
MAX_BODY = 4 * 1024 * 1024
TAIL_LINES = 30
LINE_END = re.compile(rb"\r\n|\r|\n")  # tqdm progress bars (vLLM, SGLang) redraw with a bare \r
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never send loopback probes to a proxy

EmitStatus = Callable[..., None]
EmitMetrics = Callable[[str, ServerCounters], None]
EmitLogs = Callable[[str, list[str]], None]
EmitProbe = Callable[[str, ProbeOutcome], None]


# ---- the child process -----------------------------------------------------------------------------------
def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, its identity), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass
class Child:
    """A server process: our own child (popen set) or one re-attached after an agent restart."""

    pid: int
    ticks: int | None
    popen: subprocess.Popen | None = None

    def exited(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is not None
        if not Path("/proc").is_dir():
            return not _signal_reaches(self.pid)
        return start_ticks(self.pid) != self.ticks

    @property
    def exit_code(self) -> int | None:
        """Known only for our own children: a re-attached process's parent is no longer the agent."""
        return self.popen.returncode if self.popen is not None else None

    def signal_group(self, sig: int) -> None:
        # The server's workers (vLLM engine cores, TP ranks) share its process group; signal all of them.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


def _signal_reaches(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the server exited; exit code unknown (it was re-attached after an agent restart)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the server was killed by {name} (exit code {code})"
    return f"the server exited with code {code}"


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV_PREFIX)}
    env["PYTHONUNBUFFERED"] = "1"  # Python servers' log lines (and progress) reach the file as they happen
    return {**env, **extra}


def argv_hash(argv: list[str]) -> str:
    return hashlib.sha256("\0".join(argv).encode()).hexdigest()


# ---- the log file ----------------------------------------------------------------------------------------
@dataclass
class LogFile:
    """A server's stdout+stderr file: read incrementally, rotated by copy-and-truncate."""

    path: Path
    max_bytes: int
    backups: int
    offset: int = 0
    rotated: bool = False  # this run's earlier lines are in the first backup

    def backup(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def start_fresh(self) -> None:
        """Move an earlier run's output to the first backup, so the new run starts an empty file."""
        if self.size() > 0:
            self._shift()
            os.replace(self.path, self.backup(1))
        self.offset = 0

    def rotate_if_needed(self) -> None:
        if self.size() <= self.max_bytes:
            return
        self._shift()
        shutil.copyfile(self.path, self.backup(1))
        os.truncate(self.path, 0)
        self.offset = 0
        self.rotated = True

    def _shift(self) -> None:
        self.backup(self.backups).unlink(missing_ok=True)
        for n in range(self.backups - 1, 0, -1):
            if self.backup(n).exists():
                os.replace(self.backup(n), self.backup(n + 1))

    def read_new(self, max_lines: int) -> tuple[list[str], str]:
        """Complete new lines (at most max_lines, blank ones skipped) and the unfinished last line."""
        if self.size() < self.offset:  # truncated behind our back
            self.offset = 0
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read(READ_CHUNK)
        except FileNotFoundError:
            return [], ""
        lines, used = _split_lines(data, max_lines)
        self.offset += used
        rest = data[used:] if len(lines) < max_lines else b""
        return lines, rest.decode("utf-8", "replace")

    def tail(self, count: int) -> list[str]:
        """The last `count` non-blank lines of this run, looking into the first backup if it was just rotated."""
        lines = _last_lines(self.path, count)
        if len(lines) < count and self.rotated:
            lines = _last_lines(self.backup(1), count - len(lines)) + lines
        return lines


def _split_lines(data: bytes, max_lines: int) -> tuple[list[str], int]:
    lines: list[str] = []
    used = 0
    for end in LINE_END.finditer(data):
        text = data[used : end.start()].decode("utf-8", "replace")
        used = end.end()
        if text.strip():
            lines.append(text[: protocol.MAX_LOG_LINE_CHARS])
        if len(lines) >= max_lines:
            break
    if not lines and used == 0 and len(data) >= READ_CHUNK:  # one enormous line: pass it on in pieces
        return [data.decode("utf-8", "replace")[: protocol.MAX_LOG_LINE_CHARS]], len(data)
    return lines, used


def _last_lines(path: Path, count: int) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 64 * 1024))
            data = fh.read()
    except FileNotFoundError:
        return []
    lines = [t.decode("utf-8", "replace") for t in LINE_END.split(data) if t.strip()]
    return [line[: protocol.MAX_LOG_LINE_CHARS] for line in lines[-count:]] if count > 0 else []


# ---- HTTP (stdlib only: the agent's dependency list stays tiny) --------------------------------------------
def http_call(url: str, timeout: float, body: dict | None = None) -> tuple[int, str] | None:
    """(status, text) of a GET, or a POST of `body` as JSON; None when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with _HTTP.open(request, timeout=timeout) as response:
            return response.status, response.read(MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None


# ---- one running inference server (a deployment, or this node's rank of one) ----------------------------
@dataclass
class RunningServer:
    id: str
    launch: Launch  # as the server sent it (for restart and to spot a different launch under the same id)
    admitted: Launch  # after the agent's checks: model resolved to the real path
    adapter: Adapter
    port: int
    argv_hash: str
    child: Child
    log: LogFile
    state: str = "launching"
    progress: float | None = None
    stopping: bool = False
    finished: bool = False
    failure: str = ""
    load_task: asyncio.Task | None = None
    metrics_warned: bool = False
    canary: CanaryClock = field(default_factory=CanaryClock)

    @property
    def dist_port(self) -> int | None:
        """The rendezvous port of a multi-node head (None on a single node or a non-head rank)."""
        o = self.admitted.options
        return o.master_port if o.nnodes > 1 and o.is_head else None

    @property
    def serves_api(self) -> bool:
        return self.adapter.serves_api(self.admitted)

    def saved(self) -> dict:
        return {
            "deployment": self.id,
            "launch": self.launch.model_dump(mode="json"),
            "pid": self.child.pid,
            "start_ticks": self.child.ticks,
            "port": self.port,
            "argv_hash": self.argv_hash,
            "state": self.state,
            "progress": self.progress,
            "log": str(self.log.path),
            "dist_port": self.dist_port,
            "canary": self.canary.settings.model_dump(),
        }


def _with_saved_rendezvous(launch: Launch, dist_port: object) -> Launch:
    if dist_port is None or launch.options.master_port is not None:
        return launch
    return launch.model_copy(
        update={"options": launch.options.model_copy(update={"master_port": int(dist_port)})}
    )


def served_anything(counters: ServerCounters) -> bool:
    return (counters.generation_tokens_total or 0) > 0 or (counters.requests_finished_total or 0) > 0


def exit_detail(headline: str, lines: list[str]) -> str:
    """The headline plus as many of the last log lines as fit the protocol's detail field."""
    limit = 4000
    text = headline
    if lines:
        body = "\n".join(lines)
        room = limit - len(headline) - len("\nlast log lines:\n")
        text += "\nlast log lines:\n" + (body[-room:] if room > 0 else "")
    return text[:limit]


# ---- the supervisor --------------------------------------------------------------------------------------
@dataclass
class Supervisor:
    model_dirs: list[Path]
    run_dir: Path
    emit_status: EmitStatus
    emit_metrics: EmitMetrics
    emit_logs: EmitLogs
    emit_probe: EmitProbe | None = None
    host: str = LOOPBACK
    adapters: dict[str, Adapter] = field(default_factory=lambda: dict(ADAPTERS))
    grace_s: float = 10.0
    probe_timeout_s: float = 2.0
    load_timeout_s: float = 1800.0
    log_max_bytes: int = 10 * 1024 * 1024
    log_backups: int = 3
    max_log_lines: int = protocol.MAX_LOG_LINES

    def __post_init__(self) -> None:
        self.model_dirs = [Path(d) for d in self.model_dirs]
        self.run_dir = Path(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.deployments: dict[str, RunningServer] = {}
        self.canaries: dict[str, CanarySettings] = {}  # as the server last set them, per deployment
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._polling = asyncio.Lock()

    def api_endpoint(self, deployment: str) -> tuple[int, str] | None:
        """(port, served model name) of a server of this node that is up and serves the API, or None."""
        current = self.deployments.get(deployment)
        if current is None or current.finished or current.state not in ("ready", "serving"):
            return None
        if not current.serves_api:
            return None
        options = current.admitted.options
        return current.port, options.served_model_name or current.admitted.model

    # ---- commands ----
    async def handle(self, command: Command) -> None:
        """Act on one command. A refusal is reported as a failed status and raised as LaunchRefused."""
        async with self._locks[command.deployment]:
            try:
                if isinstance(command, Canary):
                    self._set_canary(command.deployment, command.canary)
                elif isinstance(command, Launch):
                    await self._launch(command)
                elif isinstance(command, Stop):
                    await self._stop(command.deployment)
                else:
                    await self._restart(command.deployment, command.launch)
            except LaunchRefused as exc:
                self.emit_status(command.deployment, "failed", detail=f"refused: {exc.reason}")
                raise

    async def _launch(self, launch: Launch) -> None:
        current = self._known(launch.deployment)
        if current is not None and not current.finished:
            same = current.launch == launch
            self._report(
                current,
                detail="already running"
                if same
                else "already running with a different launch; stop or restart it to apply a new one",
            )
            return
        adapter = self._adapter(launch.backend)
        self._spawn(launch, admit(adapter, launch, self.model_dirs), adapter)

    async def _stop(self, deployment: str) -> None:
        current = self._known(deployment)
        if current is None or current.finished:
            self.emit_status(deployment, "stopped", detail="not running on this node")
            return
        if current.child.exited():  # it died before the stop came: that is a failure, not a stop
            self._finish(current)
            return
        await self._terminate(current)
        self._finish(current)

    async def _restart(self, deployment: str, launch: Launch | None = None) -> None:
        """Restart with the running launch, or with `launch` (checked before the old server is stopped)."""
        current = self._known(deployment)
        if current is None:
            raise LaunchRefused(f"deployment {deployment} is not known on this node; send a launch instead")
        launch = launch or current.launch
        adapter = self._adapter(launch.backend)
        admitted = admit(adapter, launch, self.model_dirs)
        if not current.finished:
            await self._terminate(current)
            self._finish(current, detail="restarting")
        self._spawn(launch, admitted, adapter)

    def _set_canary(self, deployment: str, settings: CanarySettings) -> None:
        self.canaries[deployment] = settings
        current = self.deployments.get(deployment)
        if current is not None and not current.finished:
            current.canary.settings = settings
            self._save(current)

    def _adapter(self, backend: str) -> Adapter:
        adapter = self.adapters.get(backend)
        if adapter is None and backend in SIMULATION_BACKENDS:
            raise LaunchRefused(
                f"{backend}: this agent has no simulation installed; it ships in layercake-agent-sim "
                f"(demos and tests, not GPU nodes)"
            )
        if adapter is None:
            raise LaunchRefused(f"backend {backend!r} is not supported by this agent")
        return adapter

    def _known(self, deployment: str) -> RunningServer | None:
        return self.deployments.get(deployment) or self._adopt_file(self._state_path(deployment))

    # ---- starting and ending processes ----
    def _spawn(self, launch: Launch, admitted: Launch, adapter: Adapter) -> RunningServer | None:
        port = self._free_port()
        admitted = self._with_rendezvous_port(admitted, port)
        argv = adapter.argv(admitted, port, self.host)
        env = child_environment(adapter.env(admitted, port, self.host))
        logfile = LogFile(self.run_dir / f"{launch.deployment}.log", self.log_max_bytes, self.log_backups)
        logfile.start_fresh()
        with logfile.path.open("ab") as out:
            out.write(f"[layercake agent] starting: {shlex.join(argv)}\n".encode())
            out.flush()
            try:
                popen = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                self.emit_status(launch.deployment, "failed", detail=f"could not start {argv[0]}: {exc}")
                return None
        child = Child(popen.pid, start_ticks(popen.pid), popen)
        current = RunningServer(
            launch.deployment, launch, admitted, adapter, port, argv_hash(argv), child, logfile
        )
        current.canary.settings = self.canaries.get(launch.deployment, CanarySettings())
        self.deployments[launch.deployment] = current
        log.info(
            "deployment %s: started pid %d on port %d: %s", current.id, child.pid, port, shlex.join(argv)
        )
        self._set_state(current, "launching")
        return current

    async def _terminate(self, current: RunningServer) -> None:
        """SIGTERM to the server's process group, SIGKILL after the grace period (and for any stragglers)."""
        current.stopping = True
        loop = asyncio.get_running_loop()
        current.child.signal_group(signal.SIGTERM)
        deadline = loop.time() + self.grace_s
        while not current.child.exited() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        current.child.signal_group(signal.SIGKILL)
        deadline = loop.time() + 5.0
        while not current.child.exited() and loop.time() < deadline:
            await asyncio.sleep(0.05)

    def _finish(self, current: RunningServer, detail: str = "") -> None:
        """Report the end of a server exactly once: stopped if asked to, failed otherwise."""
        if current.finished:
            return
        self._follow_log(current)
        current.finished = True
        current.child.signal_group(signal.SIGKILL)  # workers left behind by a dead server hold GPU memory
        for task in (current.load_task, current.canary.task):
            if task is not None:
                task.cancel()
        self._state_path(current.id).unlink(missing_ok=True)
        code = current.child.exit_code
        if current.stopping and not current.failure:
            current.state = "stopped"
            self._report(current, exit_code=code, detail=detail)
            return
        current.state = "failed"
        headline = current.failure or describe_exit(code)
        self._report(current, exit_code=code, detail=exit_detail(headline, current.log.tail(TAIL_LINES)))

    def _with_rendezvous_port(self, admitted: Launch, api_port: int) -> Launch:
        """A multi-node head listens for the other nodes on a port of its own choosing, reported as dist_port."""
        o = admitted.options
        if o.nnodes == 1 or not o.is_head or o.master_port is not None:
            return admitted
        options = o.model_copy(update={"master_port": self._free_port(also_taken={api_port})})
        return admitted.model_copy(update={"options": options})

    def _free_port(self, also_taken: set[int] | None = None) -> int:
        taken = {d.port for d in self.deployments.values() if not d.finished} | (also_taken or set())
        taken |= {d.dist_port for d in self.deployments.values() if not d.finished and d.dist_port}
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        for _ in range(50):
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((self.host, 0))
                port = sock.getsockname()[1]
            if port not in taken:
                return port
        raise LaunchRefused("no free TCP port found on this node")

    # ---- watching ----
    async def poll(self) -> None:
        """One look at every running server: log, exit, loading progress, health, metrics."""
        if self._polling.locked():  # the previous poll is still waiting on a slow server
            return
        async with self._polling:
            watched = [
                d for d in self.deployments.values() if not d.finished and not self._locks[d.id].locked()
            ]
            results = await asyncio.gather(*(self._poll_one(d) for d in watched), return_exceptions=True)
        for current, result in zip(watched, results, strict=True):
            if isinstance(result, Exception):
                log.error("deployment %s: poll failed: %r", current.id, result)

    async def _poll_one(self, current: RunningServer) -> None:
        self._follow_log(current)
        if current.child.exited():
            self._finish(current)
            return
        if not current.serves_api:
            pass  # a non-head rank of a multi-node launch: alive or not is all there is to see
        elif current.load_task is not None:
            await self._check_load(current)
        elif current.state in ("launching", "loading"):
            await self._probe_health(current)
        if current.state in ("ready", "serving") and not current.finished:
            await self._scrape(current)
            self._canary(current)
        current.log.rotate_if_needed()

    def _follow_log(self, current: RunningServer) -> None:
        lines, unfinished = current.log.read_new(self.max_log_lines)
        if lines:
            self.emit_logs(current.id, lines)
        self._track_progress(current, lines + [unfinished] if unfinished else lines)

    def _track_progress(self, current: RunningServer, lines: list[str]) -> None:
        if current.state not in ("launching", "loading"):
            return
        seen = [p for p in map(current.adapter.loading_progress, lines) if p is not None]
        if not seen:
            return
        progress = round(max([*seen, current.progress or 0.0]), 3)
        if current.state == "launching" or progress != current.progress:
            self._set_state(current, "loading", progress=progress)

    async def _probe_health(self, current: RunningServer) -> None:
        url = current.adapter.health_url(current.port, self.host)
        answer = await asyncio.to_thread(http_call, url, self.probe_timeout_s)
        if answer is None or current.finished:
            return
        if answer[0] != 200:  # up, but still loading (llama.cpp answers 503 "Loading model")
            if current.state == "launching":
                self._set_state(current, "loading")
            return
        request = current.adapter.load_request(current.admitted, current.port, self.host)
        if request is None:
            self._set_state(current, "ready", progress=1.0 if current.progress is not None else None)
            return
        url, body = request
        current.load_task = asyncio.create_task(asyncio.to_thread(http_call, url, self.load_timeout_s, body))
        if current.state == "launching":
            self._set_state(current, "loading")

    async def _check_load(self, current: RunningServer) -> None:
        if not current.load_task.done():
            return
        answer = current.load_task.result()
        current.load_task = None
        if answer is not None and answer[0] == 200:
            self._set_state(current, "ready", progress=1.0)
            return
        said = f"HTTP {answer[0]}: {answer[1][:500]}" if answer else "no answer"
        current.failure = f"the server could not load model {current.admitted.model} ({said})"
        await self._terminate(current)
        self._finish(current)

    async def _scrape(self, current: RunningServer) -> None:
        url = current.adapter.metrics_url(current.port, self.host)
        if url is None or current.canary.in_flight:  # a probe's tokens may be in the counters, not yet known
            return
        answer = await asyncio.to_thread(http_call, url, self.probe_timeout_s)
        if answer is None or answer[0] != 200 or current.finished:
            return
        try:
            counters = current.adapter.counters(answer[1])
        except (ValueError, TypeError, KeyError) as exc:
            if not current.metrics_warned:
                log.warning("deployment %s: unreadable metrics from %s: %s", current.id, url, exc)
                current.metrics_warned = True
            return
        if current.canary.in_flight:
            return
        counters = current.canary.adjusted(counters, asyncio.get_running_loop().time())
        self.emit_metrics(current.id, counters)
        if current.state == "ready" and served_anything(counters):
            self._set_state(current, "serving")

    # ---- canary probes (agents/canary.py) ----
    def _canary(self, current: RunningServer) -> None:
        clock, now = current.canary, asyncio.get_running_loop().time()
        if clock.due(now) and current.serves_api:
            clock.task = asyncio.create_task(self._probe(current, clock.idle_for(now)))
            clock.task.add_done_callback(lambda task: self._probe_done(current, task))

    async def _probe(self, current: RunningServer, idle_s: float) -> ProbeOutcome:
        url, model = current.adapter.canary_request(current.admitted, current.port, self.host)
        body = canary.completion_body(model, current.canary.settings)
        health = current.adapter.health_url(current.port, self.host)
        return await canary.probe(http_call, url, body, health, current.canary.settings, idle_s)

    def _probe_done(self, current: RunningServer, task: asyncio.Task) -> None:
        """Reported as soon as the probe ends (not at the next poll, which may wait on a frozen server)."""
        now = asyncio.get_running_loop().time()
        if task.cancelled() or current.finished:
            return
        if (
            task.exception() is not None
        ):  # a bug in the probe must not end the watch; the next one tries again
            log.error("deployment %s: canary probe failed to run: %r", current.id, task.exception())
            current.canary.task, current.canary.next_at = None, now + current.canary.settings.interval_s
            return
        outcome = task.result()
        current.canary.record(outcome, now)
        log.log(
            logging.INFO if outcome.ok else logging.WARNING,
            "deployment %s: canary probe %s in %.2f s%s",
            current.id,
            "answered" if outcome.ok else "failed",
            outcome.elapsed_s,
            f": {outcome.error}" if outcome.error else "",
        )
        if self.emit_probe is not None:
            self.emit_probe(current.id, outcome)

    # ---- state ----
    def _set_state(self, current: RunningServer, state: str, **fields) -> None:
        if current.finished:
            return
        if state == "ready" and current.state != "ready":
            current.canary.became_ready(asyncio.get_running_loop().time())
        current.state = state
        if "progress" in fields:
            current.progress = fields["progress"]
        self._save(current)
        self._report(current)

    def _report(self, current: RunningServer, **fields) -> None:
        fields.setdefault("progress", current.progress)
        if current.dist_port is not None:
            fields["dist_port"] = current.dist_port
        self.emit_status(current.id, current.state, port=current.port, pid=current.child.pid, **fields)

    def _state_path(self, deployment: str) -> Path:
        return self.run_dir / f"{deployment}.json"

    def _save(self, current: RunningServer) -> None:
        path = self._state_path(current.id)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(current.saved()))
        os.replace(tmp, path)

    # ---- agent restarts ----
    async def adopt(self) -> list[str]:
        """Re-attach to the servers a previous agent started; report those that died meanwhile as failed."""
        adopted = []
        for path in sorted(self.run_dir.glob("*.json")):
            if path.stem not in self.deployments and self._adopt_file(path) is not None:
                adopted.append(path.stem)
        return adopted

    def _adopt_file(self, path: Path) -> RunningServer | None:
        current = self._load(path)
        if current is None:
            return None
        self.deployments[current.id] = current
        if current.child.exited():
            current.failure = "the server exited while the agent was not running; exit code unknown"
            self._finish(current)
            return None
        log.info(
            "deployment %s: re-attached to pid %d on port %d", current.id, current.child.pid, current.port
        )
        self._report(current, detail="re-attached after an agent restart")
        return current

    def _load(self, path: Path) -> RunningServer | None:
        if not path.exists():
            return None
        try:
            saved = json.loads(path.read_text())
            launch = Launch.model_validate(saved["launch"])
            child = Child(int(saved["pid"]), saved["start_ticks"])
            port, state = int(saved["port"]), saved["state"]
            admitted = _with_saved_rendezvous(launch, saved.get("dist_port"))
            settings = CanarySettings.model_validate(saved.get("canary") or {})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("ignoring unreadable deployment state %s: %s", path, exc)
            path.unlink(missing_ok=True)
            return None
        adapter = self.adapters.get(launch.backend)
        if adapter is None or state not in ACTIVE:
            path.unlink(missing_ok=True)
            return None
        logfile = LogFile(self.run_dir / f"{launch.deployment}.log", self.log_max_bytes, self.log_backups)
        logfile.offset = logfile.size()  # lines printed while the agent was down stay in the file
        self.canaries[launch.deployment] = settings
        return RunningServer(
            launch.deployment,
            launch,
            admitted,
            adapter,
            port,
            saved.get("argv_hash", ""),
            child,
            logfile,
            state=state,
            progress=saved.get("progress"),
            canary=CanaryClock(settings),
        )

    async def close(self) -> None:
        """Stop watching (servers keep running, to be re-attached by the next agent)."""
        for current in self.deployments.values():
            for task in (current.load_task, current.canary.task):
                if task is not None:
                    task.cancel()
