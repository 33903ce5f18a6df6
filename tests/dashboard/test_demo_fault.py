"""The demo's "Inject fault" (server side) and its SMTP sink with the demo-only mail page."""

import smtplib
from email.message import EmailMessage

import pytest

from agents import protocol
from dashboard import deploy, mailsink, stack, tasks
from dashboard.models import Deployment
from tests.dashboard.test_ux_pages import running_on
from tests.harness import wait_until
from tests.personas import sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def simulated(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return running_on(sim_node("rtx4090-box", "sim:rtx4090x2"), [0])


def test_it_lists_the_simulated_backends_faults_and_says_which_need_tensor_parallelism(simulated):
    choices = {fault: refusal for fault, _, refusal in deploy.fault_choices(simulated)}
    assert set(choices) == {"nccl-init-hang", "stall", "crash", "idle-hang"}
    assert choices["stall"] == choices["crash"] == choices["idle-hang"] == ""
    assert "needs tensor parallelism" in choices["nccl-init-hang"]


def test_it_restarts_with_the_fault_then_a_plain_restart_clears_it(simulated):
    tasks.restart_deployment(simulated.pk, "stall", "alice")
    simulated.refresh_from_db()
    assert simulated.launch["options"]["sim_fault"] == "stall" and simulated.state == "launching"
    assert simulated.events.filter(detail="fault stall injected by alice").exists()
    frame = protocol.parse_server_command(deploy.restart_frame(simulated, new_launch=True))
    assert frame.launch.options.sim_fault == "stall" and frame.launch.deployment == simulated.pk
    tasks.restart_deployment(simulated.pk)
    assert Deployment.objects.get(pk=simulated.pk).launch["options"]["sim_fault"] == "none"
    plain = protocol.parse_server_command(deploy.restart_frame(simulated, new_launch=False))
    assert plain.launch is None  # an agent of before this change still validates a plain restart


def test_it_refuses_a_bad_fault_naming_it_and_changes_nothing(client, alice, simulated):
    client.force_login(alice)
    page = client.get(simulated.get_absolute_url()).content.decode()
    assert 'id="inject-form"' in page and 'value="stall"' in page
    response = client.post(f"/deployments/{simulated.pk}/inject/", {"fault": "melt"}, follow=True)
    assert (
        "unknown fault &#x27;melt&#x27;: one of nccl-init-hang, stall, crash, idle-hang"
        in response.content.decode()
    )
    response = client.post(f"/deployments/{simulated.pk}/inject/", {"fault": "nccl-init-hang"}, follow=True)
    assert "cannot inject nccl-init-hang: needs tensor parallelism" in response.content.decode()
    Deployment.objects.filter(pk=simulated.pk).update(launch={**simulated.launch, "backend": "vllm"})
    with pytest.raises(deploy.DeployError, match="only injected into simulated deployments"):
        deploy.check_fault(Deployment.objects.get(pk=simulated.pk), "stall")
    assert Deployment.objects.get(pk=simulated.pk).launch["options"].get("sim_fault") is None
    assert not simulated.events.exists()


def test_it_shows_the_injected_fault_at_once_before_the_worker_restarts(
    client, alice, simulated, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.restart_deployment, "delay", lambda *args: sent.append(args))  # a busy worker
    client.force_login(alice)
    response = client.post(f"/deployments/{simulated.pk}/inject/", {"fault": "stall"}, follow=True)
    assert "Running with the injected fault <b>stall</b>" in response.content.decode()
    assert sent == [(simulated.pk, "stall", "alice")]
    tasks.restart_deployment(*sent[0])  # the worker gets to it: one event, the restart carries the fault
    assert simulated.events.filter(detail="fault stall injected by alice").count() == 1
    assert Deployment.objects.get(pk=simulated.pk).state == "launching"


def test_it_refuses_a_restart_whose_launch_names_another_deployment():
    launch = protocol.Launch(type="launch", v=1, deployment="other", backend="simulated", model="m", gpus=[0])
    with pytest.raises(ValueError, match="the launch is for other, not d1"):
        protocol.Restart(type="restart", v=1, deployment="d1", launch=launch)


def test_it_keeps_what_the_sink_receives_and_lists_it_on_the_demo_page(
    client, alice, tmp_path, log_dir, settings
):
    client.force_login(alice)
    assert client.get("/demo/mails/").status_code == 404  # not the demo: no such page
    port, directory = stack.free_port(), tmp_path / "mail"
    sink = stack.mail_sink_service(port, directory, log_dir).start()
    try:
        wait_until(lambda: stack.port_answers(port), timeout=15, what="the SMTP sink")
        mail = EmailMessage()
        mail["Subject"], mail["From"], mail["To"] = (
            "[layercake] stall: demo",
            "lc@localhost",
            "admin@localhost",
        )
        mail.set_content("Requests in flight and no token for 5 s.")
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
            smtp.send_message(mail)
    finally:
        sink.stop()
    [kept] = mailsink.kept_mails(directory)
    assert (kept.subject, kept.recipients) == ("[layercake] stall: demo", "admin@localhost")
    assert (directory / kept.name).stat().st_mode & 0o777 == 0o600
    settings.DEMO_MAIL_DIR = str(directory)
    page = client.get("/demo/mails/").content.decode()
    assert "[layercake] stall: demo" in page and "Requests in flight and no token for 5 s." in page
    assert 'href="/demo/mails/"' in page
