"""The agent reports the inference engines it can launch and their versions (issue #14): found where the
adapters look (PATH), read without importing the engine, a failure reported as unknown, never a crash."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from agents import engines, protocol, runner
from agents.engines import EngineCache, detect_engines
from agents.gpus import make_source
from agents.runner import Agent


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def dist_info(site: Path, package: str, version: str) -> None:
    """An installed package as importlib.metadata finds it: `name-version.dist-info/METADATA`."""
    folder = site / f"{package}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n", encoding="utf-8"
    )


@pytest.fixture
def install(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A fake engine install: a bin folder (the PATH searched) and a site-packages this Python reads."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site-packages"
    bin_dir.mkdir()
    site.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(site))
    return bin_dir, site


def shell(output: str, code: int = 0) -> str:
    return f"#!/bin/sh\ncat <<'EOF' >&2\n{output}\nEOF\nexit {code}\n"


def found(bin_dir: Path) -> dict[str, protocol.EngineVersion]:
    return {e.backend: e for e in detect_engines(str(bin_dir))}


def test_it_reads_every_engines_version_from_a_fake_install(install) -> None:
    bin_dir, site = install
    executable(bin_dir / "vllm", f"#!{sys.executable}\nraise SystemExit('never run')\n")
    (bin_dir / "python3").symlink_to(sys.executable)
    dist_info(site, "vllm", "0.7.3")
    dist_info(site, "sglang", "0.4.6.post1")
    executable(bin_dir / "llama-server", shell("version: 4567 (1c5eba6)\nbuilt with cc for x86_64-linux-gnu"))
    executable(
        bin_dir / "ollama",
        shell("Warning: could not connect to a running Ollama instance\nWarning: client version is 0.5.7"),
    )
    versions = {name: e.version for name, e in found(bin_dir).items()}
    assert versions == {"vllm": "0.7.3", "sglang": "0.4.6.post1", "llama.cpp": "b4567", "ollama": "0.5.7"}


def test_it_reports_nothing_for_engines_not_installed(install, tmp_path: Path) -> None:
    bin_dir, _ = install
    (bin_dir / "python3").symlink_to(sys.executable)  # a Python without sglang is not an SGLang install
    assert detect_engines(str(bin_dir)) == []
    assert detect_engines(str(tmp_path / "nowhere")) == []


def test_it_follows_an_env_shebang_to_the_python_on_path(install) -> None:
    bin_dir, site = install
    (bin_dir / "python3").symlink_to(sys.executable)
    executable(bin_dir / "vllm", "#!/usr/bin/env python3\n")
    dist_info(site, "vllm", "0.6.4.post1")
    assert found(bin_dir)["vllm"].version == "0.6.4.post1"


def test_it_follows_pips_sh_trampoline_for_a_long_interpreter_path(install, tmp_path: Path) -> None:
    bin_dir, site = install
    python = tmp_path / "a venv whose path pip would not put after #!" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    body = f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\nimport sys\n"
    executable(bin_dir / "vllm", body)
    dist_info(site, "vllm", "0.7.2")
    assert found(bin_dir)["vllm"].version == "0.7.2"


def test_it_reports_a_version_it_cannot_read_as_unknown_with_why(install, monkeypatch) -> None:
    bin_dir, site = install
    executable(bin_dir / "vllm", f"#!{sys.executable}\n")  # the script is there, its package is not
    executable(bin_dir / "llama-server", shell("usage: llama-server [options]", code=1))
    executable(bin_dir / "ollama", "#!/bin/sh\nsleep 30\n")
    monkeypatch.setattr(engines, "PROBE_TIMEOUT_S", 0.5)
    got = found(bin_dir)
    assert got["vllm"].version is None and "has no vllm package" in got["vllm"].detail
    assert got["llama.cpp"].version is None and "printed no version" in got["llama.cpp"].detail
    assert got["ollama"].version is None and "no answer within 0.5 s" in got["ollama"].detail


def test_it_refuses_a_bogus_version_string_from_an_engine(install) -> None:
    bin_dir, site = install
    executable(bin_dir / "vllm", f"#!{sys.executable}\n")
    dist_info(site, "vllm", "1" * 80)  # longer than a release name may be
    executable(bin_dir / "ollama", shell("ollama version is <script>"))
    got = found(bin_dir)
    assert got["vllm"].version is None and "not a release name" in got["vllm"].detail
    assert got["ollama"].version is None and "not a release name" in got["ollama"].detail


def test_it_says_when_it_cannot_tell_which_python_runs_the_script(install) -> None:
    bin_dir, _ = install
    executable(bin_dir / "vllm", "\x7fELF not a script")
    got = found(bin_dir)["vllm"]
    assert got.version is None and "cannot tell which Python runs" in got.detail


def test_the_agent_sends_the_engines_in_its_hello(install, monkeypatch) -> None:
    bin_dir, site = install
    executable(bin_dir / "llama-server", shell("version: 6001 (deadbee)"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setattr(runner, "ENGINES", EngineCache())
    agent = Agent("http://127.0.0.1:9", "token", make_source("sim:a30x4"))
    asyncio.run(agent.refresh_engines())
    hello = protocol.parse_agent_message(agent.hello())
    assert [(e.backend, e.version) for e in hello.engines] == [("llama.cpp", "b6001")]


def test_agents_in_one_process_probe_once_until_the_result_ages(install, monkeypatch) -> None:
    """A bench runs 1,000 agents in one process: one probe serves them all; an old result is probed again."""
    bin_dir, _ = install
    executable(bin_dir / "ollama", shell("ollama version is 0.5.7"))
    probes: list[str | None] = []
    monkeypatch.setattr(
        engines, "detect_engines", lambda path=None: probes.append(path) or detect_engines(str(bin_dir))
    )
    monkeypatch.setattr(runner, "ENGINES", EngineCache())
    fleet = [Agent("http://127.0.0.1:9", f"token{i}", make_source("sim:a30x4")) for i in range(50)]

    async def refresh_all() -> None:
        await asyncio.gather(*(a.refresh_engines() for a in fleet))

    asyncio.run(refresh_all())
    assert len(probes) == 1 and {a.engines[0].version for a in fleet} == {"0.5.7"}
    runner.ENGINES.last = (runner.ENGINES.last[0] - engines.RECHECK_S - 1, runner.ENGINES.last[1])
    asyncio.run(fleet[0].refresh_engines())
    assert len(probes) == 2


# ---- on the wire ---------------------------------------------------------------------------------------


def hello_frame(engines: object = None) -> dict:
    frame = {
        "type": "hello",
        "v": 1,
        "agent_version": "0.1",
        "hostname": "gpu-1",
        "boot_id": "boot-0001",
        "interval_s": 1.0,
        "gpu_source": "sim",
        "simulated": True,
        "gpus": [],
    }
    if engines is not None:
        frame["engines"] = engines
    return frame


def test_it_round_trips_the_engines_through_the_protocol() -> None:
    sent = [
        protocol.EngineVersion(backend="vllm", version="0.8.3rc2.dev224+g49c0d11ec"),
        protocol.EngineVersion(
            backend="ollama", version=None, detail="`ollama --version` printed no version"
        ),
    ]
    hello = protocol.Hello(**hello_frame(), engines=sent)
    assert protocol.parse_agent_message(protocol.dump(hello)).engines == sent


def test_it_accepts_a_hello_from_an_older_agent_without_engines() -> None:
    assert protocol.parse_agent_message(json.dumps(hello_frame())).engines == []


@pytest.mark.parametrize(
    ("engines_field", "where"),
    [
        ([{"backend": "vllm", "version": "9" * 65}], "engines.0.version: String should match pattern"),
        (
            [{"backend": "vllm", "version": "0.7.3; rm -rf /"}],
            "engines.0.version: String should match pattern",
        ),
        ([{"backend": "vllm", "version": ""}], "engines.0.version: String should match pattern"),
        ([{"backend": "tgi", "version": "2.0"}], "engines.0.backend: Input should be"),
        ([{"backend": "vllm", "version": "0.7.3"}] * 2, "engines lists a backend twice"),
        ([{"backend": "vllm", "version": 7}], "engines.0.version: Input should be a valid string"),
    ],
)
def test_it_refuses_a_bogus_or_oversized_engine_version_clearly(engines_field: list, where: str) -> None:
    with pytest.raises(protocol.ProtocolError) as refused:
        protocol.parse_agent_message(json.dumps(hello_frame(engines_field)))
    assert where in refused.value.message
