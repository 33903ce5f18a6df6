"""Deploy end to end: the form's endpoints on the real ASGI server, a real Celery worker, Redis, and an agent
subprocess that launches the inference server (simulated backend, or the real llama.cpp engine)."""

import importlib.util
import json
import os
import shutil
import signal
import time
import urllib.request

import httpx
import pytest

from agents.sim.testmodel import smollm2_path
from dashboard.models import Deployment, PlanRequest
from tests.harness import csrf_post, end_servers_left_in, node_with_token, start_agent, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server_env(server_env, tmp_path):
    """The server plans model files from the agent's model dir and from one the agent does not allow."""
    return {**server_env, "MODEL_DIRS": os.pathsep.join(str(tmp_path / d) for d in ("models", "elsewhere"))}


@pytest.fixture
def seed_agent(live_stack, celery_worker, log_dir, tmp_path):
    """The demo's 4x A30 node with an agent that may launch models from tmp_path/models."""
    node, token = node_with_token("a30-seed")
    (tmp_path / "models").mkdir()
    agent = start_agent(
        live_stack.url,
        token,
        "sim:a30x4,workload=idle",
        log_dir,
        interval=0.5,
        run_dir=tmp_path / "run",
        model_dirs=(tmp_path / "models",),
    )
    wait_until(lambda: node.gpus.count() == 4, what="agent hello")
    yield node
    agent.stop()
    end_servers_left_in(tmp_path / "run")


def plan_through_the_form(client: httpx.Client, **fields) -> PlanRequest:
    response = csrf_post(
        client,
        "/deploy/",
        {"max_model_len": 10000, "concurrency": 1, "node": "a30-seed", "backend": "", "gpus": "", **fields},
    )
    assert response.status_code == 302, response.text[:2000]
    row = PlanRequest.objects.get(pk=int(response.headers["location"].rstrip("/").rsplit("/", 1)[-1]))
    wait_until(lambda: PlanRequest.objects.get(pk=row.pk).status in ("done", "failed"), what="planning task")
    row.refresh_from_db()
    return row


def deploy_plan(client: httpx.Client, row: PlanRequest, number: int = 0) -> Deployment:
    response = csrf_post(client, f"/deploy/plans/{row.pk}/{number}/deploy/")
    assert response.status_code == 302 and "/deployments/" in response.headers["location"], response.text[
        :500
    ]
    return Deployment.objects.get(pk=response.headers["location"].rstrip("/").rsplit("/", 1)[-1])


def state_of(deployment: Deployment) -> str:
    deployment.refresh_from_db()
    return deployment.state


def served_model(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]


def complete(port: int, prompt: str = "Hello", max_tokens: int = 16) -> dict:
    body = json.dumps({"model": served_model(port), "prompt": prompt, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_it_deploys_the_top_plan_and_measures_tokens_per_second(operator, seed_agent):
    row = plan_through_the_form(operator, model="Qwen3-VL-32B-Instruct")
    assert row.status == "done", row.error
    page = operator.get(f"/deploy/plans/{row.pk}/fragment/").text
    assert "Deploy this plan" in page and "Rejected configurations" in page
    deployment = deploy_plan(operator, row)
    wait_until(lambda: state_of(deployment) in ("ready", "serving", "failed"), timeout=60, what="ready")
    assert deployment.state != "failed", deployment.detail
    assert deployment.launch["backend"] == "simulated" and deployment.port
    assert complete(deployment.port)["usage"]["completion_tokens"] == 16
    wait_until(
        lambda: state_of(deployment) == "serving" and (deployment.tokens_per_s or 0) > 0,
        timeout=30,
        what="serving with tokens/s",
    )
    states = list(deployment.events.values_list("state", flat=True))
    assert states[0] == "launching" and states[-1] == "serving" and "ready" in states
    page = operator.get(deployment.get_absolute_url()).text
    assert "Uvicorn running on" in page  # the server's own log tail, streamed by the agent


def test_it_shows_failed_with_the_exit_code_when_the_server_is_killed(operator, seed_agent):
    deployment = deploy_plan(operator, plan_through_the_form(operator, model="Qwen3-VL-32B-Instruct"))
    wait_until(lambda: state_of(deployment) in ("ready", "serving"), timeout=60, what="ready")
    os.kill(deployment.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: state_of(deployment) == "failed", timeout=10, what="failed")
    assert time.monotonic() - killed_at < 2 * 0.5 + 1.0  # two agent intervals, plus the server's flush
    assert deployment.exit_code == -9 and "SIGKILL" in deployment.detail


def test_it_stops_and_restarts_from_the_buttons(operator, seed_agent):
    deployment = deploy_plan(operator, plan_through_the_form(operator, model="Qwen3-VL-32B-Instruct"))
    wait_until(lambda: state_of(deployment) in ("ready", "serving"), timeout=60, what="ready")
    first_pid = deployment.pid
    csrf_post(operator, f"/deployments/{deployment.pk}/restart/")
    wait_until(
        lambda: state_of(deployment) in ("ready", "serving") and deployment.pid != first_pid,
        timeout=60,
        what="restarted",
    )
    csrf_post(operator, f"/deployments/{deployment.pk}/stop/")
    wait_until(lambda: state_of(deployment) == "stopped", timeout=30, what="stopped")
    with pytest.raises(ProcessLookupError):
        os.kill(deployment.pid, 0)


def test_it_refuses_an_unknown_model_with_a_clear_message(operator, seed_agent):
    row = plan_through_the_form(operator, model="no-such-model-anywhere")
    assert row.status == "failed" and "no-such-model-anywhere" in row.error
    assert "no-such-model-anywhere" in operator.get(f"/deploy/plans/{row.pk}/").text
    assert not Deployment.objects.exists()


def test_it_refuses_a_gguf_outside_the_agents_model_dirs_and_starts_nothing(operator, seed_agent, tmp_path):
    gguf = smollm2_path()
    if gguf is None:
        pytest.skip("the SmolLM2 GGUF is not installed (scripts/install-inference.sh)")
    outside = tmp_path / "elsewhere" / "smol.gguf"  # the server may read it (MODEL_DIRS), the agent may not
    outside.parent.mkdir()
    try:
        os.link(gguf, outside)
    except OSError:
        shutil.copyfile(gguf, outside)
    row = plan_through_the_form(operator, model=str(outside), backend="llama.cpp", max_model_len=2048)
    deployment = deploy_plan(operator, row)
    wait_until(lambda: state_of(deployment) == "failed", timeout=30, what="refusal")
    assert "refused" in deployment.detail and "model" in deployment.detail
    assert deployment.pid is None and not list((tmp_path / "run").glob("*.json"))


@pytest.mark.parametrize(
    "tamper",
    [
        {"model": "Qwen3; rm -rf /"},
        {"argv": ["--trust-remote-code"]},
        {"env": {"LD_PRELOAD": "/tmp/evil.so"}},
    ],
)
def test_it_refuses_a_tampered_launch_command_at_the_agent(seed_agent, alice, tamper, tmp_path):
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from dashboard import deploy
    from dashboard.live import agent_group
    from tests.dashboard.test_deploy import planned

    deployment = deploy.create_deployment(planned("Qwen3-VL-32B-Instruct"), 0, alice)
    frame = {**deployment.launch, "type": "launch", "v": 1, **tamper}
    async_to_sync(get_channel_layer().group_send)(
        agent_group(seed_agent.pk), {"type": "agent.command", "frame": json.dumps(frame)}
    )
    wait_until(lambda: state_of(deployment) == "failed", timeout=20, what="refusal")
    assert deployment.detail.startswith("refused:") and deployment.pid is None
    assert not list((tmp_path / "run").glob("*.json"))


def test_it_deploys_smollm2_on_the_real_llama_cpp_engine(operator, seed_agent, tmp_path):
    gguf = smollm2_path()
    if gguf is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python or the SmolLM2 GGUF is not installed (scripts/install-inference.sh)")
    model = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    try:  # a real file inside the model dir: a symlink out of it is refused, as it should be
        os.link(gguf, model)
    except OSError:
        shutil.copyfile(gguf, model)
    row = plan_through_the_form(operator, model=str(model), backend="llama.cpp", max_model_len=2048)
    assert row.status == "done", row.error
    deployment = deploy_plan(operator, row)
    wait_until(lambda: state_of(deployment) in ("ready", "failed"), timeout=120, what="llama.cpp ready")
    assert deployment.state == "ready", deployment.detail
    assert deployment.launch["backend"] == "llama-cpp-python"
    for _ in range(3):
        assert (
            complete(deployment.port, "The capital of France is", max_tokens=24)["usage"]["completion_tokens"]
            > 0
        )
    wait_until(
        lambda: state_of(deployment) == "serving" and (deployment.tokens_per_s or 0) > 0,
        timeout=30,
        what="tokens/s from the real engine",
    )
