"""`python -m agents run` from an operator's shell: clear errors and exit codes."""

import subprocess
import sys

import pytest

from dashboard.stack import BASE_DIR


def run_agent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agents", "run", *args],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_it_exits_2_with_one_line_when_there_is_no_gpu_driver():
    pytest.importorskip("pynvml")
    result = run_agent("--server", "http://127.0.0.1:9", "--token", "lc_x", "--gpu-source", "nvml")
    if result.returncode == 0:
        pytest.skip("a real NVIDIA driver is present")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-source", "sim:z80x3"], "unknown sim preset"),
        (["--gpu-source", "sim:a30x4", "--interval", "0"], "--interval"),
        (["--gpu-source", "sim:a30x4", "--log", "nonsense"], "SOURCE=PATH"),
    ],
)
def test_it_refuses_bad_arguments_with_a_clear_message(args, message):
    result = run_agent("--server", "http://127.0.0.1:9", "--token", "lc_x", *args)
    assert result.returncode in (1, 2)
    assert message in result.stderr


def test_it_requires_a_token():
    result = run_agent("--server", "http://127.0.0.1:9", "--gpu-source", "sim:a30x4")
    assert result.returncode == 1 and "--token" in result.stderr
