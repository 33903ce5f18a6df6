"""Hang detection rules over deployments and nodes as the agents' reports leave them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from dashboard import deploy, detect
from dashboard.choices import DeploymentState
from dashboard.models import GpuSample, LogChunk
from tests.dashboard.test_deploy import planned
from tests.personas import seed_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def serving(alice):
    """The seed model served on the seed server, 60 s stall window, last scrape at t0."""
    seed_server()
    d = deploy.create_deployment(planned("Qwen3-VL-32B-Instruct"), 0, alice)
    d.move_to(DeploymentState.SERVING)
    return d


def scrape(d, at, tokens, running):
    d.record_metrics(
        at.timestamp(),
        protocol.ServerCounters(generation_tokens_total=tokens, requests_running=running, requests_waiting=0),
    )


def kinds(problems):
    return sorted(p.kind for p in problems)


def test_it_finds_a_stall_when_requests_run_and_tokens_do_not_move(serving):
    t0 = timezone.now() - timedelta(seconds=90)
    scrape(serving, t0, 1000, 1)
    for s in range(1, 80, 5):
        scrape(serving, t0 + timedelta(seconds=s), 1000, 1)
    problems = detect.deployment_problems(serving, timezone.now())
    assert kinds(problems) == ["stall"]
    assert problems[0].key == f"stall:{serving.pk}" and problems[0].evidence["series"]["t"]


def test_it_does_not_call_an_idle_deployment_stalled(serving):
    t0 = timezone.now() - timedelta(seconds=300)
    for s in range(0, 300, 10):
        scrape(serving, t0 + timedelta(seconds=s), 1000, 0)
    assert detect.deployment_problems(serving, timezone.now()) == []


def test_it_does_not_call_steady_generation_stalled(serving):
    t0 = timezone.now() - timedelta(seconds=300)
    for s in range(0, 300, 10):
        scrape(serving, t0 + timedelta(seconds=s), 1000 + 50 * s, 2)
    assert detect.deployment_problems(serving, timezone.now()) == []


def test_it_waits_for_the_stall_window(serving):
    t0 = timezone.now() - timedelta(seconds=30)
    scrape(serving, t0, 1000, 1)
    scrape(serving, t0 + timedelta(seconds=29), 1000, 1)
    assert detect.deployment_problems(serving, timezone.now()) == []


def test_it_counts_a_frozen_server_that_no_longer_answers_scrapes(serving):
    scrape(
        serving, timezone.now() - timedelta(seconds=120), 1000, 1
    )  # then nothing: SIGSTOP, scrapes time out
    assert kinds(detect.deployment_problems(serving, timezone.now())) == ["stall"]


def test_it_offers_a_replan_without_tp_for_a_tp_plan_over_sys(serving):
    serving.plan = {**serving.plan, "tp": 2, "pp": 1, "gpus": [0, 1]}
    serving.save()
    scrape(serving, timezone.now() - timedelta(seconds=120), 1000, 1)
    problem = detect.deployment_problems(serving, timezone.now())[0]
    assert "NCCL_P2P_DISABLE=1" in problem.remedy and "GPU0-GPU1 (SYS" in problem.cause
    assert (
        problem.actions["replan"]["tp"] == 1
        and problem.actions["replan"]["model_ref"] == "Qwen3-VL-32B-Instruct"
    )


def test_it_reports_a_startup_that_overran_its_deadline_with_the_phase(serving):
    serving.move_to(DeploymentState.LOADING)
    serving.startup_deadline_s = 60
    serving.startup_progress_at = timezone.now() - timedelta(seconds=90)
    serving.save()
    lines = [
        "INFO 01-01 00:00:00 [__init__.py:1] NCCL version 2.21.5+cuda12.4",
        "host:1:1 [0] NCCL INFO Channel 00/02 :    0   1",
        "host:1:1 [0] NCCL INFO Connected all rings",
    ]
    LogChunk.objects.create(
        node=serving.node, source=serving.pk, seq=1, lines=lines, t=timezone.now() - timedelta(seconds=90)
    )
    problem = detect.deployment_problems(serving, timezone.now())[0]
    assert problem.kind == "startup" and "nccl-init" in problem.title


def test_it_restarts_the_startup_clock_on_loading_progress(serving):
    serving.move_to(DeploymentState.LOADING)
    serving.startup_deadline_s = 60
    serving.save()
    serving.apply_status(
        protocol.DeploymentStatus(
            type="deployment", v=1, seq=1, t=1.0, deployment=serving.pk, state="loading", progress=0.5
        )
    )
    assert detect.deployment_problems(serving, timezone.now() + timedelta(seconds=50)) == []


def test_it_reports_a_crash_with_its_exit_code(serving):
    serving.move_to(DeploymentState.FAILED, exit_code=1)
    assert kinds(detect.deployment_problems(serving, timezone.now())) == ["crashed"]


def test_it_reports_a_node_whose_agent_went_silent_once_it_waited_out_the_grouping_window(settings):
    node = seed_server()
    node.last_seen = timezone.now() - timedelta(seconds=5)  # stale after 3 s, but others may follow it
    node.save()
    assert detect.node_problems([node], timezone.now()) == []
    later = node.last_seen + node.stale_after() + timedelta(seconds=settings.NODE_LOST_GROUP_WINDOW_S)
    assert [p.kind for p in detect.node_problems([node], later)] == ["node-lost"]


def test_it_reports_xid_errors_with_their_meaning():
    node = seed_server()
    node.last_seen = timezone.now()
    node.save()
    GpuSample.objects.create(
        gpu=node.gpus.get(index=2),
        t=timezone.now(),
        seq=1,
        util_gpu=0,
        util_mem=0,
        mem_used_mib=1,
        mem_free_mib=1,
        temp_c=40,
        power_w=50,
        xids=[79],
    )
    problem = detect.node_problems([node], timezone.now())[0]
    assert problem.key == f"xid:{node.pk}:2:79" and "fallen off the bus" in problem.title


def test_it_raises_no_alert_for_informational_xids_and_reads_the_same_table_as_the_log_classifier():
    from agents import xids
    from agents.logscan import scan_log

    node = seed_server()
    node.last_seen = timezone.now()
    node.save()
    sample = {"t": timezone.now(), "util_gpu": 0, "util_mem": 0, "mem_used_mib": 1, "mem_free_mib": 1}
    sample |= {"temp_c": 40, "power_w": 50}
    GpuSample.objects.create(gpu=node.gpus.get(index=1), seq=1, xids=[63, 92, 64], **sample)
    assert detect.node_problems([node], timezone.now()) == []
    GpuSample.objects.create(gpu=node.gpus.get(index=1), seq=2, xids=[13], **{**sample, "t": timezone.now()})
    [problem] = detect.node_problems([node], timezone.now())
    finding = scan_log("NVRM: Xid (PCI:0000:43:00): 13, pid=1, name=python3, Graphics Exception").findings[0]
    meaning = xids.describe(13)[0]
    assert meaning in problem.title and meaning in finding.meaning


def test_it_opens_the_stall_alert_from_the_servers_own_stats_lines(serving):
    stats = (
        "INFO 11-29 10:00:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%"
    )
    lines = [stats.format(s=s) for s in (0, 5, 10)]
    LogChunk.objects.create(node=serving.node, source=serving.pk, seq=1, lines=lines, t=timezone.now())
    problems = detect.deployment_problems(serving, timezone.now())
    assert [(p.kind, p.key) for p in problems] == [("stall", f"stall:{serving.pk}")]
