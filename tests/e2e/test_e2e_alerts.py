"""Hang detection end to end: agents, the real ASGI server, a real Celery worker and beat, Redis, a real SMTP
server (aiosmtpd) and inference servers that really stall (simulated backend, or the llama.cpp engine
frozen with SIGSTOP), including idle servers that hang, found by canary probes."""

import contextlib
import http.client
import importlib.util
import json
import os
import signal
import threading
import time
import urllib.request

import pytest

from dashboard import stack, tasks
from dashboard.models import Alert, Deployment
from tests.conftest import point_celery_at
from tests.e2e.test_e2e_deploy import (
    complete,
    deploy_plan,
    plan_through_the_form,
    served_model,
    smollm2_path,
    state_of,
)
from tests.harness import node_with_token, start_agent, wait_until
from tests.smtp import smtp_server

pytestmark = pytest.mark.slow
INTERVAL = 0.5
STALL_WINDOW = 5.0


@pytest.fixture
def inbox():
    with smtp_server() as box:
        yield box


@pytest.fixture
def watched_stack(live_stack, server_env, log_dir, inbox, settings, alice, tmp_path):
    """Workers and beat judging the fleet every agent interval, mailing through the test's SMTP server."""
    env = {
        **server_env,
        "AGENT_INTERVAL": str(INTERVAL),
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(inbox.port),
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "MODEL_DIRS": str(tmp_path / "models"),
    }
    point_celery_at(server_env["REDIS_URL"], settings)
    services = [
        stack.celery_worker_service(env, log_dir, queues="celery,detect").start(),
        stack.celery_notify_worker_service(env, log_dir).start(),
        stack.celery_beat_service(env, log_dir).start(),
    ]
    yield live_stack
    for service in services:
        service.stop()


@pytest.fixture
def operator(watched_stack):
    import httpx

    from tests.harness import login

    with httpx.Client(base_url=watched_stack.url, timeout=30) as client:
        login(client, "alice", "alice-pw-123")
        yield client


@pytest.fixture
def seed_agent(watched_stack, log_dir, tmp_path):
    node, token = node_with_token("a30-seed")
    (tmp_path / "models").mkdir()
    agent = start_agent(
        watched_stack.url,
        token,
        "sim:a30x4,workload=idle",
        log_dir,
        interval=INTERVAL,
        run_dir=tmp_path / "run",
        model_dirs=(tmp_path / "models",),
    )
    wait_until(lambda: node.gpus.count() == 4, what="agent hello")
    yield node
    agent.stop()
    for state in (tmp_path / "run").glob("*.json"):
        pid = json.loads(state.read_text()).get("pid")
        if pid:
            try:
                os.killpg(pid, signal.SIGCONT)
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def ready_deployment(operator, **form) -> Deployment:
    deployment = deploy_plan(operator, plan_through_the_form(operator, **form))
    Deployment.objects.filter(pk=deployment.pk).update(stall_window_s=STALL_WINDOW)
    wait_until(lambda: state_of(deployment) in ("ready", "serving", "failed"), timeout=120, what="ready")
    assert deployment.state != "failed", deployment.detail
    return deployment


def set_fault(port: int, fault: str) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/sim/fault",
        json.dumps({"fault": fault}).encode(),
        {"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).read()


def in_background(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def read_quietly(request: urllib.request.Request) -> None:
    """A request the test leaves running: its server is killed at teardown, which ends it without a reply."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        urllib.request.urlopen(request, timeout=300).read()


def open_alert(kind: str) -> Alert | None:
    return Alert.objects.filter(kind=kind, status__in=("open", "acknowledged")).first()


def test_it_alerts_on_a_stall_mails_it_and_resolves_when_tokens_flow_again(operator, seed_agent, inbox):
    deployment = ready_deployment(operator, model="Qwen3-VL-32B-Instruct")
    set_fault(deployment.port, "stall")
    onset = time.monotonic()
    request = in_background(complete, deployment.port, "Hello", 8)
    try:
        alert = wait_until(lambda: open_alert("stall"), timeout=30, what="stall alert")
    except AssertionError:
        d = Deployment.objects.get(pk=deployment.pk)
        raise AssertionError(
            f"no stall alert; deployment {d.state}, counters {d.last_counters} at "
            f"{d.last_counters_t}, progress at {d.progress_at}, alerts "
            f"{list(Alert.objects.values_list('key', 'status'))}"
        ) from None
    opened_after = time.monotonic() - onset
    assert opened_after <= STALL_WINDOW + 2 * INTERVAL + 1.0, f"alert after {opened_after:.1f} s"
    assert "no tokens" in alert.title and alert.evidence["series"]["t"]
    wait_until(lambda: any("OPEN" in s for s in inbox.subjects()), timeout=30, what="the alert mail")
    set_fault(deployment.port, "none")
    request.join(timeout=30)
    wait_until(lambda: Alert.objects.get(pk=alert.pk).status == "resolved", timeout=30, what="resolution")
    wait_until(lambda: any("RESOLVED" in s for s in inbox.subjects()), timeout=30, what="the resolve mail")
    assert len([s for s in inbox.subjects() if "OPEN" in s]) == 1
    print(f"stall alert opened {opened_after:.2f} s after the request got stuck")


def test_it_never_alerts_on_an_idle_deployment(operator, seed_agent, inbox):
    ready_deployment(operator, model="Qwen3-VL-32B-Instruct")
    time.sleep(STALL_WINDOW * 2)
    assert not Alert.objects.exists() and inbox.messages == []


def test_it_alerts_on_a_startup_stuck_in_nccl_init(operator, seed_agent, alice, inbox):
    from dashboard import deploy, tasks
    from tests.dashboard.test_deploy import planned

    deployment = deploy.create_deployment(planned("Qwen3-VL-32B-Instruct"), 0, alice)
    launch = {**deployment.launch, "gpus": [0, 1]}
    launch["options"] = {**launch["options"], "tp": 2, "pp": 1, "sim_fault": "nccl-init-hang"}
    Deployment.objects.filter(pk=deployment.pk).update(
        launch=launch, plan={**deployment.plan, "tp": 2, "pp": 1, "gpus": [0, 1]}, startup_deadline_s=5.0
    )
    tasks.launch_deployment.delay(deployment.pk)
    alert = wait_until(lambda: open_alert("startup"), timeout=60, what="startup alert")
    assert "nccl-init" in alert.title
    assert "NCCL_P2P_DISABLE=1" in alert.remedy and alert.actions["replan"]["tp"] == 1
    wait_until(
        lambda: any("OPEN" in s and "nccl-init" in s for s in inbox.subjects()),
        timeout=30,
        what="the alert mail",
    )


def test_it_alerts_when_the_real_llama_cpp_engine_freezes_and_resolves_on_sigcont(
    operator, seed_agent, tmp_path
):
    gguf = smollm2_path()
    if gguf is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python or the SmolLM2 GGUF is not installed (scripts/install-inference.sh)")
    model = tmp_path / "models" / "smol.gguf"
    os.link(gguf, model)
    deployment = ready_deployment(operator, model=str(model), backend="llama.cpp", max_model_len=2048)
    body = {
        "model": served_model(deployment.port),
        "prompt": "Once upon a time",
        "max_tokens": 400,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{deployment.port}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    in_background(read_quietly, request)
    wait_until(
        lambda: (Deployment.objects.get(pk=deployment.pk).last_counters or {}).get("requests_running"),
        timeout=30,
        what="the request running",
    )
    os.kill(deployment.pid, signal.SIGSTOP)
    try:
        alert = wait_until(lambda: open_alert("stall"), timeout=STALL_WINDOW + 20, what="stall alert")
    finally:
        os.kill(deployment.pid, signal.SIGCONT)
    wait_until(lambda: Alert.objects.get(pk=alert.pk).status == "resolved", timeout=60, what="resolution")


# ---- canary probes: a server that hangs while idle ---------------------------------------------------------
IDLE, PROBE_INTERVAL, TIMEOUT = 1.0, 3.0, 2.0
# what the agent needs to hand a failure over and the beat to judge it: a poll, a flush, an evaluation
DELIVERY = 2 * INTERVAL + 1.0


def probing_fast(deployment: Deployment) -> Deployment:
    Deployment.objects.filter(pk=deployment.pk).update(
        probe_idle_s=IDLE, probe_interval_s=PROBE_INTERVAL, probe_timeout_s=TIMEOUT
    )
    tasks.send_canary.delay(deployment.pk)
    wait_until(lambda: (last_probe(deployment) or {}).get("ok"), timeout=30, what="a probe that answered")
    return Deployment.objects.get(pk=deployment.pk)


def last_probe(deployment: Deployment) -> dict | None:
    return Deployment.objects.get(pk=deployment.pk).last_probe


def hung_alert_after(onset: float) -> tuple[Alert, float]:
    alert = wait_until(lambda: open_alert("hung-idle"), timeout=30, what="the hung-while-idle alert")
    return alert, time.monotonic() - onset


def test_it_alerts_on_a_server_that_hangs_while_idle_and_resolves_when_a_probe_answers(
    operator, seed_agent, inbox
):
    deployment = probing_fast(ready_deployment(operator, model="Qwen3-VL-32B-Instruct"))
    assert deployment.state == "ready"  # probes are not use: it never became "serving"
    assert not (deployment.last_counters or {}).get("generation_tokens_total")
    assert deployment.probes_per_hour() >= 1
    set_fault(deployment.port, "idle-hang")
    alert, opened_after = hung_alert_after(time.monotonic())
    assert opened_after <= PROBE_INTERVAL + TIMEOUT + DELIVERY, f"alert after {opened_after:.1f} s"
    assert alert.evidence["health"]["health_status"] == 200
    assert alert.evidence["probe"]["error"] == f"no answer within {TIMEOUT:g} s"
    assert not open_alert("stall")  # the hanging probe is not a user's request in flight
    wait_until(lambda: any("OPEN" in s and "hung while idle" in s for s in inbox.subjects()), what="mail")
    set_fault(deployment.port, "none")
    wait_until(lambda: Alert.objects.get(pk=alert.pk).status == "resolved", timeout=30, what="resolution")
    print(f"hung-while-idle alert opened {opened_after:.2f} s after the simulated engine hung")


def test_it_alerts_when_the_idle_real_llama_cpp_engine_is_frozen_and_resolves_on_sigcont(
    operator, seed_agent, tmp_path
):
    gguf = smollm2_path()
    if gguf is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python or the SmolLM2 GGUF is not installed (scripts/install-inference.sh)")
    model = tmp_path / "models" / "smol.gguf"
    os.link(gguf, model)
    deployment = ready_deployment(operator, model=str(model), backend="llama.cpp", max_model_len=2048)
    deployment = probing_fast(deployment)
    os.kill(deployment.pid, signal.SIGSTOP)
    try:
        alert, opened_after = hung_alert_after(time.monotonic())
        # a poll may also wait out a scrape of the frozen server (2 s) before it sees the probe's end
        assert opened_after <= PROBE_INTERVAL + TIMEOUT + DELIVERY + 2.0, f"alert after {opened_after:.1f} s"
        assert alert.evidence["health"]["health_status"] is None and "frozen" in alert.cause
    finally:
        os.kill(deployment.pid, signal.SIGCONT)
    wait_until(lambda: Alert.objects.get(pk=alert.pk).status == "resolved", timeout=60, what="resolution")
    print(f"hung-while-idle alert opened {opened_after:.2f} s after SIGSTOP of the idle llama.cpp engine")
