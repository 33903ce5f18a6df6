"""The offline/live log classifier (agents/logscan.py) on every public log fixture and on constructed logs."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest

from agents.logscan import PHASES, RULES, LogScanner, newest_first, scan_log
from tests.fixtures import REPO, fixture_files, read_fixture

LOG_FIXTURES = fixture_files("logs")


def quiet(phase: str) -> float:
    """A silence just beyond what the phase allows."""
    return PHASES[phase].allowance + 1


class Expect(NamedTuple):
    kind: str
    phase: str
    backend: str
    signatures: tuple[str, ...]  # the finding that drove the verdict first, then the rest
    silent_for: float = 0.0  # > 0: the hang is only visible as silence after the excerpt's last line
    note: str = ""  # why the expectation differs from the header, if it does


NO_MARKER = (
    "no line of the excerpt names its server (no vllm, EngineCore, ... marker), so the backend is unknown"
)
PYTORCH_ONLY = "the excerpt has only NCCL/torch.distributed lines, so the backend detected is nccl"
EXPECTED: dict[str, Expect] = {
    "001": Expect("hang", "nccl-init", "vllm", ("no-progress-nccl-init",), quiet("nccl-init")),
    "002": Expect("hang", "serving", "vllm", ("vllm-shm-broadcast-timeout",)),
    "004": Expect("failure", "nccl-init", "vllm", ("nccl-comm-init-error", "engine-traceback")),
    "006": Expect("failure", "nccl-init", "vllm", ("nccl-comm-init-error", "engine-traceback")),
    "007": Expect(
        "failure", "nccl-init", "vllm", ("engine-traceback",)
    ),  # phase from the frames (init_device)
    "008": Expect("failure", "nccl-init", "vllm", ("vllm-worker-exception", "engine-traceback")),
    "010": Expect("hang", "unknown", "vllm", ("vllm-worker-response-timeout", "engine-traceback")),
    "011": Expect("failure", "stopped", "vllm", ("cuda-error", "engine-traceback", "vllm-fatal-signal")),
    "012": Expect(
        "hang", "stopped", "sglang", ("sglang-watchdog-timeout", "sglang-child-failed", "process-killed")
    ),
    "014": Expect("hang", "nccl-init", "nccl", ("no-progress-nccl-init",), quiet("nccl-init")),
    "015": Expect(
        "hang", "stopped", "nccl", ("nccl-collective-timeout", "nccl-process-taken-down"), note=PYTORCH_ONLY
    ),
    "017": Expect("hang", "serving", "vllm", ("stalled-zero-generation", "nccl-collective-timeout")),
    "018": Expect(
        "hang", "stopped", "vllm", ("nccl-collective-timeout", "vllm-worker-died", "nccl-process-taken-down")
    ),
    "020": Expect("healthy", "serving", "vllm", ()),
    "021": Expect("healthy", "idle", "vllm", ()),
    "023": Expect("healthy", "serving", "vllm", ()),
    "024": Expect("healthy", "serving", "vllm", ()),
    "026": Expect("healthy", "serving", "sglang", ()),
    "028": Expect("healthy", "serving", "llamacpp", ()),
    "030": Expect(
        "failure", "stopped", "ollama", ("cuda-oom", "llamacpp-load-failed", "ollama-runner-panic")
    ),
    "032": Expect(
        "healthy",
        "idle",
        "ollama",
        (),
        note="the excerpt ends with a completed unload ('sending an unloaded event') followed only by "
        "'ollama ps' polls - exactly what every idle Ollama prints after its keep-alive expires; the stuck "
        "request is not in the excerpt, so calling this a hang would alarm on every idle unload",
    ),
    "034": Expect("failure", "stopped", "vllm", ("vllm-engine-dead",)),
    "036": Expect("hang", "nccl-init", "nccl", ("no-progress-nccl-init",), quiet("nccl-init"), PYTORCH_ONLY),
    "038": Expect("failure", "stopped", "llamacpp", ("ggml-assert",)),
    "039": Expect(
        "hang",
        "nccl-init",
        "nccl",
        ("no-progress-nccl-init",),
        quiet("nccl-init"),
        "the excerpt holds only NCCL channel lines, so the backend detected is nccl",
    ),
    "040": Expect("healthy", "nccl-init", "nccl", ()),
    "041": Expect("healthy", "warmup", "vllm", ()),
    "043": Expect("healthy", "idle", "vllm", ()),
    "044": Expect("healthy", "idle", "vllm", ()),
    "046": Expect("failure", "stopped", "vllm", ("cuda-oom", "vllm-engine-start-failed", "engine-traceback")),
    "047": Expect("hang", "serving", "vllm", ("vllm-shm-broadcast-timeout",)),
    "048": Expect("hang", "starting", "vllm", ("no-progress-starting",), quiet("starting")),
    # issue #16, item 2: the six classes read as healthy before, with new public examples
    "101": Expect(
        "hang", "starting", "vllm", ("ray-placement-group-too-small", "ray-placement-group-waiting")
    ),
    "102": Expect("hang", "starting", "vllm", ("ray-placement-group-waiting",)),
    "103": Expect("failure", "stopped", "vllm", ("ray-placement-group-refused",)),
    "104": Expect("hang", "warmup", "unknown", ("no-progress-warmup",), quiet("warmup"), NO_MARKER),
    "105": Expect("hang", "warmup", "unknown", ("no-progress-warmup",), quiet("warmup"), NO_MARKER),
    "106": Expect("hang", "unknown", "ollama", ("ollama-request-timeout",)),
    "107": Expect("hang", "idle", "ollama", ("ollama-request-timeout",)),
    "108": Expect("hang", "idle", "ollama", ("ollama-request-timeout",)),
    "109": Expect("failure", "nccl-init", "vllm", ("worker-method-error", "engine-traceback")),
    "110": Expect("failure", "nccl-init", "vllm", ("engine-traceback",)),
    "111": Expect("healthy", "idle", "vllm", ()),
    "112": Expect("healthy", "unknown", "unknown", (), note=NO_MARKER),
    "113": Expect("failure", "stopped", "vllm", ("unsupported-architecture", "startup-traceback")),
    "114": Expect("failure", "stopped", "unknown", ("unsupported-architecture",), note=NO_MARKER),
    "115": Expect("failure", "warmup", "unknown", ("no-kv-cache-room",), note=NO_MARKER),
    "116": Expect("failure", "warmup", "vllm", ("no-kv-cache-room", "engine-traceback")),
    "117": Expect("failure", "unknown", "unknown", ("kernel-xid",)),
    "118": Expect("failure", "unknown", "unknown", ("kernel-xid",)),
}


def fixture(prefix: str) -> Path:
    return next(path for path in LOG_FIXTURES if path.name.startswith(prefix))


def expectation(path: Path) -> Expect:
    return EXPECTED[path.name[:3]]


def header_kind(header: dict[str, str]) -> str:
    return {"fail": "failure"}.get(header["kind"], header["kind"])


def body_of(path: Path) -> str:
    return read_fixture(path)[1]


def signatures(verdict) -> list[str]:
    return [finding.signature for finding in verdict.findings]


def outcome(verdict) -> tuple[str, str, list[str]]:
    return verdict.verdict, verdict.phase, signatures(verdict)


def test_it_has_an_expectation_for_every_log_fixture():
    assert len(LOG_FIXTURES) == 50
    assert sorted(path.name[:3] for path in LOG_FIXTURES) == sorted(EXPECTED)


@pytest.mark.parametrize("path", LOG_FIXTURES, ids=lambda p: p.name[:40])
def test_it_classifies_each_fixture_as_its_header_says(path):
    header, body = read_fixture(path)
    expected = expectation(path)
    assert expected.kind == header_kind(header) or expected.note
    verdict = scan_log(body, silent_for=expected.silent_for)
    assert (verdict.verdict, verdict.phase) == (expected.kind, expected.phase)
    assert verdict.backend == expected.backend or (verdict.backend, expected.note) == (header["backend"], "")


@pytest.mark.parametrize("path", LOG_FIXTURES, ids=lambda p: p.name[:40])
def test_it_names_the_signature_that_drove_the_verdict(path):
    expected = expectation(path)
    found = signatures(scan_log(body_of(path), silent_for=expected.silent_for))
    assert found[:1] == list(expected.signatures[:1])
    assert sorted(found) == sorted(expected.signatures)


@pytest.mark.parametrize(
    "path", [p for p in LOG_FIXTURES if expectation(p).kind == "healthy"], ids=lambda p: p.name[:3]
)
def test_it_raises_no_alarm_on_healthy_fixtures_after_a_short_pause(path):
    assert scan_log(body_of(path), silent_for=30).verdict == "healthy"


@pytest.mark.parametrize(
    "path", [p for p in LOG_FIXTURES if expectation(p).silent_for], ids=lambda p: p.name[:3]
)
def test_it_needs_the_silence_to_call_a_log_that_just_stopped_a_hang(path):
    for silent_for in (0, 60):
        assert scan_log(body_of(path), silent_for=silent_for).verdict == "healthy"


@pytest.mark.parametrize("path", LOG_FIXTURES, ids=lambda p: p.name[:3])
def test_it_gives_the_same_verdict_fed_incrementally_as_on_the_whole_file(path):
    lines = body_of(path).splitlines()
    if newest_first(lines):
        lines.reverse()  # a live tail arrives oldest first
    silent_for = expectation(path).silent_for
    whole = scan_log("\n".join(lines), silent_for=silent_for).to_json()
    for chunk in (1, 2, 5):
        scanner = LogScanner()
        for start in range(0, len(lines), chunk):
            scanner.feed(lines[start : start + chunk])
        assert scanner.verdict(silent_for).to_json() == whole


def test_it_reports_each_finding_once_when_fed_line_by_line():
    scanner = LogScanner()
    reported = [f for line in body_of(fixture("012")).splitlines() for f in scanner.feed([line])]
    assert [f.signature for f in reported] == [
        "sglang-watchdog-timeout",
        "sglang-child-failed",
        "process-killed",
    ]


def test_it_fills_every_placeholder_in_meaning_and_advice():
    for path in LOG_FIXTURES:
        for finding in scan_log(body_of(path), silent_for=expectation(path).silent_for).findings:
            assert finding.meaning and finding.advice
            assert "{" not in finding.meaning + finding.advice, finding


def test_it_keeps_signatures_as_named_rules_with_meaning_and_advice():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        if rule.verdict:
            assert rule.meaning.endswith(".") and rule.advice.endswith("."), rule.name
    for name, phase in PHASES.items():
        assert phase.allowance is None or (phase.meaning and phase.advice), name


# --- constructed logs -------------------------------------------------------------------------------

T0 = datetime(2025, 8, 19, 14, 0, 0)


def stamp(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%m-%d %H:%M:%S")


def v0_stats(at: float, prompt: float, gen: float, running: int, pending: int) -> str:
    return (
        f"INFO {stamp(at)} metrics.py:295] Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation "
        f"throughput: {gen:.1f} tokens/s, Running: {running} reqs, Swapped: 0 reqs, Pending: {pending} reqs, "
        "GPU KV cache usage: 20.0%, CPU KV cache usage: 0.0%."
    )


def v1_stats(at: float, prompt: float, gen: float, running: int, engine: str = "000") -> str:
    return (
        f"(APIServer pid=7) INFO {stamp(at)} [loggers.py:127] Engine {engine}: Avg prompt throughput: "
        f"{prompt:.1f} tokens/s, Avg generation throughput: {gen:.1f} tokens/s, Running: {running} reqs, "
        "Waiting: 0 reqs, GPU KV cache usage: 1.7%, Prefix cache hit rate: 0.0%"
    )


def engine_line(at: float, message: str) -> str:
    return f"(EngineCore_0 pid=10) INFO {stamp(at)} [core.py:1] {message}"


SHM_WARNING = (
    "No available shared memory broadcast block found in 60 seconds. This typically happens when some "
    "processes are hanging or doing some time-consuming work (e.g. compilation)."
)
NCCL_INIT = [
    "host:11:11 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    "host:11:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "host:11:11 [0] NCCL INFO Connected all rings",
    "host:11:11 [0] NCCL INFO comm 0x5 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
]


def scan(lines: list[str], silent_for: float = 0.0):
    return scan_log("\n".join(lines), silent_for=silent_for)


def test_it_treats_prefill_intervals_with_zero_generation_as_healthy():
    log = [v0_stats(0, 0.0, 120.0, 20, 9)] + [
        v0_stats(5 * i, 1000.0, 0.0, 20 + 2 * i, 9 - 2 * i) for i in (1, 2, 3)
    ]
    verdict = scan(log)
    assert (verdict.verdict, verdict.phase, verdict.findings) == ("healthy", "serving", [])


def test_it_calls_zero_generation_and_zero_prompt_with_requests_running_a_hang():
    log = [v0_stats(0, 0.0, 120.0, 3, 0), v0_stats(5, 0.0, 0.0, 3, 0), v0_stats(10, 0.0, 0.0, 3, 0)]
    verdict = scan(log)
    assert (verdict.verdict, signatures(verdict)) == ("hang", ["stalled-zero-generation"])
    assert verdict.findings[0].line == 2


def test_it_lets_a_stall_resolve_when_tokens_flow_again():
    log = [v0_stats(0, 0.0, 0.0, 3, 0), v0_stats(5, 0.0, 0.0, 3, 0), v0_stats(10, 0.0, 95.0, 3, 0)]
    assert scan(log[:2]).verdict == "hang"
    assert scan(log).verdict == "healthy"


def test_it_never_calls_an_idle_server_hung_however_long_it_is_quiet():
    log = [v1_stats(10 * i, 0.0, 0.0, 0) for i in range(4)]
    for silent_for in (0, 600, 86400):
        verdict = scan(log, silent_for)
        assert (verdict.verdict, verdict.phase) == ("healthy", "idle")


def test_it_accepts_one_warm_up_warning_followed_by_progress():
    log = [
        engine_line(0, "Model loading took 15.2 GiB and 30.1 seconds"),
        engine_line(5, "Compiling a graph for dynamic shape takes 70.3 s"),
        f"(EngineCore_0 pid=10) INFO {stamp(65)} [shm_broadcast.py:466] {SHM_WARNING}",
        engine_line(80, "Graph capturing finished in 15 secs, took 0.4 GiB"),
        engine_line(81, "init engine (profile, create kv cache, warmup model) took 80.00 seconds"),
    ]
    assert scan(log[:3]).verdict == "healthy"
    verdict = scan(log)
    assert (verdict.verdict, verdict.phase, verdict.findings) == ("healthy", "idle", [])


def test_it_calls_the_warm_up_warning_a_hang_when_it_repeats_without_progress():
    warning = f"(EngineCore_0 pid=10) INFO {{}} [shm_broadcast.py:466] {SHM_WARNING}"
    log = [engine_line(0, "Compiling a graph for dynamic shape takes 70.3 s")]
    log += [warning.format(stamp(60)), warning.format(stamp(120))]
    verdict = scan(log)
    assert (verdict.verdict, signatures(verdict)) == ("hang", ["vllm-shm-broadcast-timeout"])
    assert verdict.findings[0].line == 2


def test_it_accepts_a_long_weight_load_that_keeps_progressing():
    log = [engine_line(0, "Starting to load model /models/llama-405b...")]
    log += [
        engine_line(180 * k, f"Loading safetensors checkpoint shards: {k * 100 // 30}% Completed | {k}/30")
        for k in range(1, 31)
    ]
    verdict = scan(log, silent_for=60)
    assert (verdict.verdict, verdict.phase) == ("healthy", "loading")


def test_it_calls_a_weight_load_with_no_progress_beyond_its_allowance_a_hang():
    log = [engine_line(0, "Starting to load model /models/llama-405b...")]
    assert scan(log, silent_for=quiet("loading") - 2).verdict == "healthy"
    verdict = scan(log, silent_for=quiet("loading"))
    assert (verdict.verdict, signatures(verdict)) == ("hang", ["no-progress-loading"])


def test_it_calls_silence_inside_nccl_init_a_hang_only_once_silent_for_says_so():
    assert scan(NCCL_INIT).verdict == "healthy"
    assert scan(NCCL_INIT, silent_for=60).verdict == "healthy"
    verdict = scan(NCCL_INIT, silent_for=quiet("nccl-init"))
    assert outcome(verdict) == ("hang", "nccl-init", ["no-progress-nccl-init"])
    finding = verdict.findings[0]
    assert (finding.line, finding.text) == (4, NCCL_INIT[3])
    assert "NCCL_P2P_DISABLE=1" in finding.advice and "--disable-custom-all-reduce" in finding.advice
    assert "pipeline/layer split" in finding.advice


def test_it_ignores_nccl_lines_once_the_server_serves():
    log = [v1_stats(0, 0.0, 150.0, 0), NCCL_INIT[3]]
    verdict = scan(log, silent_for=quiet("nccl-init"))
    assert (verdict.verdict, verdict.phase) == ("healthy", "idle")


def test_it_calls_a_v1_stats_line_with_zero_tokens_then_no_progress_a_stall():
    log = [v1_stats(0, 0.0, 180.0, 2), v1_stats(10, 0.0, 0.0, 2)]
    log += [f"(APIServer pid=7) INFO {stamp(t)} [launcher.py:1] GET /health HTTP/1.1 200" for t in (40, 70)]
    assert scan(log[:3]).verdict == "healthy"
    verdict = scan(log)
    assert (verdict.verdict, signatures(verdict)) == ("hang", ["no-progress-serving"])
    assert verdict.findings[0].line == 1  # the last line that showed tokens flowing


def test_it_calls_sglang_silence_with_requests_running_a_stall():
    log = [
        f"[2025-02-27 04:46:{s:02d} TP0] Decode batch. #running-req: 8, #token: {62531 + s}, token usage: 0.12, "
        f"gen throughput (token/s): 186.64, #queue-req: 0"
        for s in (39, 41, 43)
    ]
    assert scan(log, silent_for=30).verdict == "healthy"
    verdict = scan(log, silent_for=quiet("serving"))
    assert (outcome(verdict), verdict.backend) == (("hang", "serving", ["no-progress-serving"]), "sglang")


def test_it_leaves_busy_silence_of_backends_without_stats_lines_to_the_metrics():
    verdict = scan_log(body_of(fixture("028")), silent_for=3600)  # llama.cpp, a request just started
    assert (verdict.backend, verdict.phase, verdict.verdict) == ("llamacpp", "serving", "healthy")


def journal(at: float, message: str) -> str:
    return f"{T0 + timedelta(seconds=at):%b %d %H:%M:%S} gpu1 ollama[829]: {message}"


def ollama_line(at: float, message: str) -> str:
    return journal(at, f"time={T0 + timedelta(seconds=at):%Y-%m-%dT%H:%M:%S}.000Z level=DEBUG {message}")


def test_it_reads_newest_first_journals_and_reports_their_own_line_numbers():
    timeout = "timed out waiting for llama runner to start - progress 0.00 - "
    chronological = [
        ollama_line(0, 'source=server.go:1 msg="starting llama server" cmd="/usr/bin/ollama runner"'),
        ollama_line(120, 'source=server.go:2 msg="waiting for llama runner to start responding"'),
        ollama_line(300, f'source=sched.go:3 msg="error loading llama server" error="{timeout}"'),
        journal(
            301, '[GIN] 2025/08/19 - 14:05:01 | 500 |          5m1s |       127.0.0.1 | POST     "/api/chat"'
        ),
    ]
    log = list(reversed(chronological))
    assert newest_first(log) and not newest_first(chronological)
    verdict = scan(log)
    assert (verdict.verdict, verdict.backend, signatures(verdict)) == (
        "hang",
        "ollama",
        ["ollama-load-timeout"],
    )
    assert (verdict.findings[0].line, verdict.findings[0].text) == (2, log[1])


def test_it_calls_an_ollama_runner_stuck_in_stopping_a_hang_but_not_a_clean_unload():
    expired = ollama_line(0, 'source=sched.go:1 msg="runner expired event received"')
    retries = [
        ollama_line(t, 'msg="expired event with positive ref count, retrying" refCount=1') for t in (1, 60)
    ]
    assert scan([expired, *retries]).verdict == "healthy"
    stuck = scan([expired, *retries, retries[0].replace("14:00:01", "14:02:30")])
    assert outcome(stuck) == ("hang", "stopping", ["no-progress-stopping"])
    clean = [
        expired,
        ollama_line(2, 'msg="got lock to unload"'),
        ollama_line(3, 'msg="sending an unloaded event"'),
    ]
    assert scan(clean, silent_for=86400).verdict == "healthy"


def test_it_reports_a_forced_backend_and_rejects_unknown_ones():
    assert scan(NCCL_INIT).backend == "nccl"
    assert scan_log("\n".join(NCCL_INIT), backend="vllm").backend == "vllm"
    with pytest.raises(ValueError, match="unknown backend 'tgi'.*vllm"):
        LogScanner("tgi")


def test_it_rejects_a_negative_silence():
    with pytest.raises(ValueError, match="silent_for must be .* >= 0, got -1"):
        scan_log("", silent_for=-1)


# --- command line -----------------------------------------------------------------------------------


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agents.logscan", *args], cwd=REPO, input=stdin, capture_output=True, text=True
    )


def test_it_prints_json_with_verdict_backend_phase_and_findings(tmp_path):
    log = tmp_path / "nccl.log"
    log.write_text("\n".join(NCCL_INIT) + "\n")
    done = run_cli(str(log), "--silent-for", str(quiet("nccl-init")), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"verdict", "backend", "phase", "findings"}
    assert (result["verdict"], result["backend"], result["phase"]) == ("hang", "nccl", "nccl-init")
    assert [set(f) for f in result["findings"]] == [{"signature", "line", "text", "meaning", "advice"}]
    assert result["findings"][0]["line"] == 4


def test_it_prints_a_verdict_line_then_each_finding_for_people(tmp_path):
    log = tmp_path / "018.log"
    log.write_text(body_of(fixture("018")))  # a worker died after an NCCL watchdog timeout
    done = run_cli(str(log))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "HANG  (backend: vllm, phase: stopped)"
    assert lines[1].startswith("line 3: ") and "Watchdog caught collective operation timeout" in lines[1]
    assert lines[2] == "  signature: nccl-collective-timeout"
    assert lines[3].startswith("  meaning: NCCL collective ALLREDUCE #2 did not finish")
    assert lines[4].startswith("  advice: ") and "NCCL_P2P_DISABLE=1" in lines[4]
    assert [line.split(":")[0] for line in lines[5::4]] == ["line 1", "line 6"]


def test_it_reads_standard_input_when_file_is_a_dash():
    done = run_cli("-", "--backend", "vllm", stdin=v0_stats(0, 0.0, 0.0, 0, 0) + "\n")
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, "HEALTHY  (backend: vllm, phase: idle)")
    assert "No problem signatures found." in done.stdout


def test_it_exits_1_with_a_clear_message_for_an_unreadable_file(tmp_path):
    missing = tmp_path / "missing.log"
    done = run_cli(str(missing))
    assert done.returncode == 1
    assert f"cannot read {missing}" in done.stderr and "No such file" in done.stderr


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["x.log", "--silent-for", "-5"], "--silent-for: expected a number of seconds >= 0, got '-5'"),
        (["x.log", "--silent-for", "soon"], "--silent-for: expected a number of seconds >= 0, got 'soon'"),
        (["x.log", "--backend", "tgi"], "--backend: invalid choice: 'tgi'"),
        ([], "the following arguments are required: FILE"),
    ],
)
def test_it_exits_1_with_a_clear_message_for_bad_arguments(args, complaint):
    done = run_cli(*args)
    assert done.returncode == 1
    assert complaint in done.stderr


# --- issue #16, item 2: the classes read as healthy before -----------------------------------------------
def placement_wait(at: float, secs: int) -> str:
    return (
        f"INFO {stamp(at)} ray_utils.py:214] Waiting for creating a placement group of specs for {secs} seconds. "
        "specs=[{'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status` to see if you have enough resources."
    )


def test_it_lets_ray_wait_for_a_placement_group_a_while_then_calls_the_growing_wait_a_hang():
    waits = [placement_wait(10 * n, secs) for n, secs in enumerate((10, 30))]
    assert scan(waits).verdict == "healthy"  # a node may still be joining
    verdict = scan([*waits, placement_wait(70, 70)])
    assert (verdict.verdict, signatures(verdict)) == ("hang", ["ray-placement-group-waiting"])
    assert "70 s" in verdict.findings[0].meaning
    loading = f"INFO {stamp(90)} model_runner.py:1] Starting to load model Qwen/Qwen2.5-7B..."
    assert scan([*waits, placement_wait(70, 70), loading]).verdict == "healthy"  # the group formed after all


@pytest.mark.parametrize(
    "line",
    [
        "DEBUG 09-09 15:33:36 [cuda_piecewise_backend.py:162] Capturing a cudagraph for shape 272",
        "DEBUG 09-09 15:33:36 [cuda_piecewise_backend.py:151] Warming up 1/1 for shape 264",
        "INFO 09-09 15:33:36 [backends.py:215] Compiling a graph for dynamic shape takes 31.42 s",
        "INFO 09-09 15:33:36 [backends.py:118] Directly load the compiled graph(s) for dynamic shape",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  61%|██████    | 41/67 [00:06<00:04,  6.30it/s]",
    ],
)
def test_it_recognises_each_variant_of_warm_up_and_judges_it_by_the_warm_up_allowance(line):
    assert scan([line]).phase == "warmup"
    assert scan([line], silent_for=quiet("warmup") - 2).verdict == "healthy"
    assert scan([line], silent_for=quiet("warmup")).verdict == "hang"


def test_it_calls_a_long_ollama_500_a_hung_request_but_not_a_quick_one_nor_a_load_timeout():
    def gin(status: int, took: str) -> str:
        return f'[GIN] 2024/12/11 - 09:58:58 | {status} | {took:>13} |      10.0.0.123 | POST     "/api/chat"'

    assert signatures(scan([gin(500, "29m59s")])) == ["ollama-request-timeout"]
    assert signatures(scan([gin(500, "1h2m3s")])) == ["ollama-request-timeout"]
    for quick in (gin(500, "4.709180529s"), gin(500, "5m1s"), gin(200, "31m0s")):
        assert scan([quick]).verdict == "healthy", quick


STARTUP_FRAMES = [
    'File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 160, in init_device',
    'File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/parallel_state.py", line 980, in '
    "init_distributed_environment",
    'File "/usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py", line 2806, in '
    "all_reduce",
]


def traceback_lines(at: float, module: str, frames: list[str]) -> list[str]:
    prefix = f"(RayWorkerWrapper pid=4242) ERROR {stamp(at)} [{module}:77]"
    return [f"{prefix} Traceback (most recent call last):", *(f"{prefix}   {frame}" for frame in frames)]


def test_it_fails_a_startup_traceback_that_ends_before_its_exception_with_the_phase_of_its_frames():
    start = [f"INFO {stamp(0)} [api_server.py:1] vLLM API server version 0.10.1"]
    verdict = scan(start + traceback_lines(5, "ray_utils.py", STARTUP_FRAMES))
    assert (verdict.verdict, verdict.phase, signatures(verdict)) == (
        "failure",
        "nccl-init",
        ["startup-traceback"],
    )


def test_it_does_not_fail_a_request_traceback_after_the_server_is_ready():
    ready = [f"INFO {stamp(0)} [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000"]
    frames = ['File "/usr/lib/python3.12/json/decoder.py", line 356, in raw_decode']
    after_ready = (
        ready + traceback_lines(5, "serving_chat.py", frames) + traceback_lines(6, "ray_utils.py", frames)
    )
    assert scan(after_ready).verdict == "healthy"
    assert (
        scan(traceback_lines(5, "serving_chat.py", frames)).verdict == "healthy"
    )  # request handling, any time


def test_it_calls_kernel_xid_lines_failures_with_their_meaning_but_informational_ones_healthy():
    xid13 = "kernel: NVRM: Xid (PCI:0000:43:00): 13, pid=1, name=python3, Graphics Exception: ESR 0x1"
    verdict = scan([xid13])
    assert (verdict.verdict, signatures(verdict)) == ("failure", ["kernel-xid"])
    assert (
        "Xid 13" in verdict.findings[0].meaning and "Graphics engine exception" in verdict.findings[0].meaning
    )
    for code in (63, 64, 92):
        assert (
            scan([f"kernel: NVRM: Xid (PCI:0000:43:00): {code}, pid=1, name=python3, info"]).verdict
            == "healthy"
        )
