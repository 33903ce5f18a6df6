"""Fleets with many problems at once, built in bulk: for the alert-storm tests and bench/alerts.py."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from dashboard.choices import DeploymentState
from dashboard.models import Deployment, DeploymentMetric, Gpu, GpuSample, LogChunk, Node

STATS_LINE = (
    "INFO 11-29 10:00:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: {tps} tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 9.0%"
)


def fleet(count: int, last_seen: datetime, prefix: str = "node", gpus: int = 0) -> list[Node]:
    """`count` nodes whose agents last reported at `last_seen` (1 s interval), with `gpus` GPUs each."""
    nodes = Node.objects.bulk_create(
        [
            Node(
                name=f"{prefix}-{n:04d}",
                interval_s=1.0,
                connected=True,
                last_seen=last_seen,
                hostname=f"{prefix}-{n}",
            )
            for n in range(count)
        ]
    )
    nodes = list(Node.objects.filter(name__startswith=f"{prefix}-").order_by("name"))
    Gpu.objects.bulk_create(
        [
            Gpu(node=node, index=i, uuid=f"GPU-{node.pk}-{i}", name="NVIDIA A30", memory_total_mib=24576)
            for node in nodes
            for i in range(gpus)
        ]
    )
    return nodes


def silence(nodes: list[Node], seconds: float, now: datetime | None = None) -> None:
    """These nodes' agents went quiet together `seconds` ago."""
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(
        last_seen=(now or timezone.now()) - timedelta(seconds=seconds)
    )


def report(nodes: list[Node], now: datetime | None = None) -> None:
    """These nodes' agents report again."""
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(last_seen=now or timezone.now())


def stalled_deployments(count: int, history_s: int = 120, stuck_s: float = 90.0) -> list[Deployment]:
    """`count` deployments on nodes that keep reporting, each serving one request that stopped producing
    tokens `stuck_s` ago, with a scraped-counter history, GPU samples and their server's stats lines."""
    now = timezone.now()
    nodes = fleet(count, now, prefix="serving", gpus=1)
    deployments = Deployment.objects.bulk_create(
        [
            Deployment(
                name=f"model-{n:04d}",
                node=node,
                state=DeploymentState.SERVING,
                plan={"tp": 1, "pp": 1, "gpus": [0]},
                launch={},
                progress_at=now - timedelta(seconds=stuck_s),
                last_counters_t=now.timestamp(),
                last_counters={"generation_tokens_total": 1000, "requests_running": 1, "requests_waiting": 0},
            )
            for n, node in enumerate(nodes)
        ]
    )
    history(deployments, nodes, now, history_s)
    return deployments


def history(deployments: list[Deployment], nodes: list[Node], now: datetime, seconds: int) -> None:
    """Five-second scrapes, one-second GPU samples and one stats line per ten seconds, over `seconds`."""
    gpus = dict(Gpu.objects.filter(node__in=nodes).values_list("node_id", "pk"))
    metrics, samples, chunks = [], [], []
    for d in deployments:
        for s in range(seconds, 0, -5):
            metrics.append(
                DeploymentMetric(
                    deployment=d,
                    t=now - timedelta(seconds=s),
                    generation_tokens_per_s=0.0,
                    generation_tokens_total=1000,
                    requests_running=1,
                    requests_waiting=0,
                )
            )
        samples += [
            GpuSample(
                gpu_id=gpus[d.node_id],
                t=now - timedelta(seconds=s),
                seq=s,
                util_gpu=100,
                util_mem=5,
                mem_used_mib=20000,
                mem_free_mib=4576,
                temp_c=60,
                power_w=150,
            )
            for s in range(seconds)
        ]
        chunks += [
            LogChunk(
                node_id=d.node_id,
                source=d.pk,
                seq=seconds - s,
                t=now - timedelta(seconds=s),
                lines=[STATS_LINE.format(s=s % 60, tps="0.0")],
            )
            for s in range(seconds, 0, -10)
        ]
    DeploymentMetric.objects.bulk_create(metrics, batch_size=5000)
    GpuSample.objects.bulk_create(samples, batch_size=5000)
    LogChunk.objects.bulk_create(chunks, batch_size=5000)
