"""The newest sample of each GPU (fleet page, node page, API nodes list, planning)."""

from __future__ import annotations

import pytest

from dashboard import fleet
from dashboard.models import Gpu, GpuSample
from tests.dashboard.test_charts import add_sample, node  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def test_it_gives_each_gpu_its_newest_sample_whatever_the_order_they_were_stored_in(node):  # noqa: F811
    first, second = node.gpus.order_by("index")
    for seconds_ago, util in ((30, 1.0), (10, 3.0), (20, 2.0)):  # the newest is not the last stored
        add_sample(first, seconds_ago, util)
    add_sample(second, 5, 9.0)
    latest = fleet.latest_samples([first, second])
    assert {gpu: sample.util_gpu for gpu, sample in latest.items()} == {first.pk: 3.0, second.pk: 9.0}


def test_it_leaves_out_a_gpu_without_samples_and_other_gpus(node):  # noqa: F811
    first, second = node.gpus.order_by("index")
    add_sample(first, 3, 5.0)
    add_sample(second, 3, 6.0)
    assert list(fleet.latest_samples([first])) == [first.pk]
    silent = Gpu.objects.create(node=node, index=2, uuid="GPU-2", name="NVIDIA A30", memory_total_mib=24576)
    assert fleet.latest_samples([silent]) == {}
    assert GpuSample.objects.count() == 2
