"""Periodic fleet housekeeping run by Celery beat."""

from __future__ import annotations

from datetime import timedelta

from asgiref.sync import async_to_sync
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from dashboard.choices import NodeStatus
from dashboard.live import announce_node
from dashboard.models import GpuSample, LogChunk, Node


@shared_task(ignore_result=False)
def prune_old_samples() -> int:
    """Delete samples and log chunks older than SAMPLE_RETENTION_HOURS; return how many rows went."""
    cutoff = timezone.now() - timedelta(hours=settings.SAMPLE_RETENTION_HOURS)
    samples, _ = GpuSample.objects.filter(t__lt=cutoff).delete()
    logs, _ = LogChunk.objects.filter(t__lt=cutoff).delete()
    return samples + logs


@shared_task(ignore_result=False)
def announce_silent_nodes() -> list[str]:
    """Tell browsers about nodes whose agents went silent, whether or not a page saw the socket close."""
    now, silent = timezone.now(), []
    for node in Node.objects.filter(last_seen__isnull=False):
        status = node.status(now)
        if status != NodeStatus.ONLINE and node.last_seen > now - node.stale_after() * 4:
            async_to_sync(announce_node)(node.pk, node.name, status)
            silent.append(node.name)
    return silent
