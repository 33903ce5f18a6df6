"""The server's side of canary probes: probe reports stored, the "hung while idle" rule, probes per hour on the
deployment page, and the operator's switch."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from dashboard import deploy, detect, ingest, tasks
from dashboard.choices import DeploymentState
from dashboard.models import CanaryProbe
from tests.dashboard.test_deploy import planned
from tests.personas import seed_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready(alice):
    node = seed_server()
    d = deploy.create_deployment(planned("Qwen3-VL-32B-Instruct"), 0, alice)
    d.move_to(DeploymentState.READY)
    d.node = node
    return d


def probe(d, seq, ok, at=None, **fields):
    at = at or timezone.now()
    failed = {"error": "no answer within 10 s", "health_status": 200, "health_s": 0.01} if not ok else {}
    report = protocol.Probe(
        type="probe",
        v=1,
        seq=seq,
        t=at.timestamp(),
        deployment=d.pk,
        ok=ok,
        elapsed_s=0.2 if ok else 10.0,
        timeout_s=10.0,
        idle_s=45.0,
        tokens=2 if ok else 0,
        **{**failed, **fields},
    )
    ingest.apply_report(d.node_id, report)
    d.refresh_from_db()


def hung(d, now=None):
    return [p for p in detect.deployment_problems(d, now or timezone.now()) if p.kind == "hung-idle"]


def test_it_opens_hung_while_idle_on_a_failed_probe_with_health_ok_and_its_evidence(ready):
    probe(ready, 1, ok=True)
    assert hung(ready) == []
    probe(ready, 2, ok=False)
    [problem] = hung(ready)
    assert problem.key == f"hung-idle:{ready.pk}" and "hung while idle" in problem.title
    assert "/health answered 200" in problem.title and "deadlocked" in problem.cause
    assert problem.evidence["probe"]["error"] == "no answer within 10 s"
    assert problem.evidence["health"]["health_status"] == 200
    probe(ready, 3, ok=True)
    assert hung(ready) == []  # a probe that answers resolves it


def test_it_says_frozen_when_health_did_not_answer_either(ready):
    probe(ready, 1, ok=False, health_status=None, health_s=2.0)
    [problem] = hung(ready)
    assert "did not answer either" in problem.title and "frozen" in problem.cause


def test_it_forgets_a_failed_probe_with_no_newer_one_for_two_periods_or_when_probes_are_off(ready):
    probe(ready, 1, ok=False, at=timezone.now() - timedelta(seconds=200))
    assert hung(ready) == []  # 2 x (60 + 10) s + clock slack ago: the agent stopped probing (real requests)
    probe(ready, 2, ok=False)
    ready.set_probes(False)
    assert hung(ready) == []


def test_it_counts_probes_per_hour_and_keeps_them_out_of_tokens_per_second(ready):
    for seq in range(1, 4):
        probe(ready, seq, ok=True)
    probe(ready, 4, ok=True, at=timezone.now() - timedelta(hours=2))
    assert ready.probes_per_hour() == 3 and CanaryProbe.objects.count() == 4
    assert ready.tokens_per_s is None and ready.last_counters is None


def test_it_shows_probes_on_the_deployment_page_and_lets_an_operator_turn_them_off(
    ready, client, alice, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.send_canary, "delay", sent.append)
    probe(ready, 1, ok=False)
    client.force_login(alice)
    page = client.get(ready.get_absolute_url()).content.decode()
    assert 'id="probes-per-hour">1<' in page and "failed: no answer within 10 s" in page
    assert "Turn probes off" in page
    client.post(f"/deployments/{ready.pk}/probes-off/")
    ready.refresh_from_db()
    assert ready.probes_enabled is False and sent == [ready.pk]
    assert ready.canary_command().canary.enabled is False
    assert "Canary probes: off" in client.get(ready.get_absolute_url()).content.decode()
