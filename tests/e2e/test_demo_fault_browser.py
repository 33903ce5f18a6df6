"""The demo's reason to exist, as a new operator sees it in Chromium: inject a stall into the simulated
deployment, send a prompt that never gets its answer, watch the alert open (banner, evidence, mail in the
demo's SMTP sink on /demo/mails/), read it at phone width, and resolve it by restarting."""

import pytest

from dashboard import mailsink, stack
from dashboard.models import Alert, Deployment
from tests.conftest import point_celery_at
from tests.e2e.test_browser import login
from tests.e2e.test_e2e_deploy import deploy_plan, plan_through_the_form, state_of
from tests.harness import node_with_token, start_agent, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]
INTERVAL = 0.5
STALL_WINDOW = 5.0
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def mail_sink(tmp_path, log_dir):
    """The SMTP sink runstack starts for the demo, on a free port."""
    port, directory = stack.free_port(), tmp_path / "mail"
    sink = stack.mail_sink_service(port, directory, log_dir).start()
    wait_until(lambda: stack.port_answers(port), timeout=15, what="the SMTP sink")
    yield port, directory
    sink.stop()


@pytest.fixture
def server_env(server_env, mail_sink, tmp_path):
    """As runstack's demo: mail to the sink, the demo mail page on, the fleet judged every agent interval."""
    port, directory = mail_sink
    mail = {"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(port), "DEMO_MAIL_DIR": str(directory)}
    backend = {"EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend"}
    return {**server_env, **mail, **backend, "AGENT_INTERVAL": str(INTERVAL), "MODEL_DIRS": str(tmp_path)}


@pytest.fixture
def demo(live_stack, server_env, log_dir, settings, tmp_path, alice):
    point_celery_at(server_env["REDIS_URL"], settings)
    services = [
        stack.celery_worker_service(server_env, log_dir, queues="celery,detect").start(),
        stack.celery_notify_worker_service(server_env, log_dir).start(),
        stack.celery_beat_service(server_env, log_dir).start(),
    ]
    node, token = node_with_token("a30-seed")
    agent = start_agent(live_stack.url, token, "sim:a30x4,workload=idle", log_dir, INTERVAL, tmp_path / "run")
    wait_until(lambda: node.gpus.count() == 4, what="agent hello")
    yield live_stack
    agent.stop()
    for service in services:
        service.stop()
    stop_servers(tmp_path / "run")


def stop_servers(run_dir) -> None:
    import contextlib
    import json
    import os
    import signal

    for state in run_dir.glob("*.json"):
        with contextlib.suppress(ProcessLookupError, ValueError, KeyError):
            os.killpg(json.loads(state.read_text())["pid"], signal.SIGKILL)


def test_it_injects_a_stall_shows_the_alert_and_its_mail_and_resolves_by_restart(
    demo, operator, browser, log_dir
):
    deployment = deploy_plan(operator, plan_through_the_form(operator, model="Qwen3-VL-32B-Instruct"))
    Deployment.objects.filter(pk=deployment.pk).update(stall_window_s=STALL_WINDOW)
    wait_until(lambda: state_of(deployment) in ("ready", "serving"), timeout=60, what="ready")
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    login(page, demo.url)
    page.goto(demo.url + deployment.get_absolute_url())
    page.check("input[name=fault][value=stall]")
    page.click("#inject")
    assert "Running with the injected fault stall" in page.locator("#injected").inner_text()
    first_pid = deployment.pid
    wait_until(
        lambda: state_of(deployment) in ("ready", "serving") and deployment.pid != first_pid,
        timeout=60,
        what="restarted with the stall",
    )
    page.reload()
    page.wait_for_function("document.getElementById('live-status').textContent === 'live'")
    page.click("#try-send")  # the request that will never get its tokens
    page.wait_for_function(
        "document.getElementById('try-status').textContent === 'streaming…'", timeout=15000
    )
    alert = wait_until(
        lambda: Alert.objects.filter(kind="stall", status="open").first(), timeout=40, what="stall alert"
    )
    page.wait_for_selector(f".alert-banner li[data-alert='{alert.pk}']", timeout=15000)  # live, no reload
    page.click(f".alert-banner li[data-alert='{alert.pk}'] a")
    page.wait_for_selector("#evidence-chart")
    assert "no tokens" in page.locator("h1").inner_text()
    page.screenshot(path=str(log_dir / "demo-alert.png"), full_page=True)
    mails = wait_until(
        lambda: [m for m in mailsink.kept_mails(demo_mail_dir(demo)) if "OPEN" in m.subject],
        timeout=30,
        what="the alert mail in the sink",
    )
    page.goto(demo.url + "/demo/mails/")
    assert mails[0].subject in page.locator("article.mail h2").first.inner_text()
    page.screenshot(path=str(log_dir / "demo-mails.png"), full_page=True)
    phone = browser.new_page(viewport=PHONE)
    login(phone, demo.url)
    for url in (alert.get_absolute_url(), "/alerts/"):
        phone.goto(demo.url + url)
        assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], url
    phone.screenshot(path=str(log_dir / "alert-phone.png"), full_page=True)
    page.goto(demo.url + deployment.get_absolute_url())
    page.click("#restart")
    wait_until(
        lambda: Alert.objects.get(pk=alert.pk).status == "resolved",
        timeout=60,
        what="resolved by the restart",
    )
    deployment.refresh_from_db()
    assert deployment.launch["options"]["sim_fault"] == "none"


def demo_mail_dir(stack_) -> "object":
    from pathlib import Path

    return Path(stack_.env["DEMO_MAIL_DIR"])
