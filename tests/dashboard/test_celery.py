"""Celery tasks through a real worker on the real Redis broker."""

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.models import Gpu, GpuMinute, GpuSample, Node, RollupRun

pytestmark = pytest.mark.slow


def test_it_rolls_up_and_prunes_samples_through_a_real_worker(celery_worker):
    node = Node.objects.create(name="a30-seed")
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-0", name="NVIDIA A30", memory_total_mib=24576)
    old, young = (
        GpuSample.objects.create(
            gpu=gpu,
            t=timezone.now() - timedelta(hours=age_h),
            seq=seq,
            util_gpu=1,
            util_mem=1,
            mem_used_mib=1,
            mem_free_mib=1,
            temp_c=30,
            power_w=50,
        )
        for age_h, seq in ((3, 1), (0, 2))
    )
    # A run two hours ago saw the old row (and nothing newer): this run folds it, and it is past the window.
    RollupRun.objects.create(t=timezone.now() - timedelta(hours=2), seen_id=old.pk, rolled_id=0)
    from dashboard.tasks import maintain_storage

    counts = maintain_storage.delay().get(timeout=60)
    assert (counts["rolled"], counts["deleted_raw"]) == (old.pk, 1)
    assert list(GpuSample.objects.values_list("seq", flat=True)) == [2]
    assert GpuMinute.objects.get(gpu=gpu).n == 1


def test_it_names_nodes_that_went_silent(celery_worker):
    Node.objects.create(
        name="quiet", interval_s=1, connected=True, last_seen=timezone.now() - timedelta(seconds=5)
    )
    # A long interval: on a loaded machine the worker may take seconds to pick the task up.
    Node.objects.create(name="chatty", interval_s=30, connected=True, last_seen=timezone.now())
    from dashboard.tasks import announce_silent_nodes

    assert announce_silent_nodes.delay().get(timeout=60) == ["quiet"]
