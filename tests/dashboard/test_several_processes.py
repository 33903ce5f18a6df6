"""Two server processes storing the same node's items: each item once, the watermark only forward.

Each `store_batch` call here is what one process's ingest buffer flushes; the end-to-end version with two
real uvicorn processes is tests/e2e/test_two_processes.py.
"""

from __future__ import annotations

import time

import pytest

from agents import protocol
from dashboard import ingest
from dashboard.models import Deployment, DeploymentMetric, Gpu, GpuSample, Node

pytestmark = pytest.mark.django_db(transaction=True)  # store_batch closes old connections, as in the server
T0 = time.time() - 600


async def on_stored(_: int) -> None:
    return None


@pytest.fixture
def node() -> Node:
    node = Node.objects.create(name="moved", boot_id="boot-0001")
    Gpu.objects.create(node=node, index=0, uuid="GPU-0", name="NVIDIA A30", memory_total_mib=24576)
    Deployment.objects.create(id="d1", name="d1", node=node, plan={}, launch={})
    return node


def item(node: Node, seq: int, boot: str = "boot-0001") -> ingest.Pending:
    """Odd seqs are samples, even ones a metrics report (whose replay would make a second metric row)."""
    if seq % 2:
        reading = protocol.GpuReading(
            index=0, util_gpu=50, util_mem=5, mem_used_mib=1, mem_free_mib=1, temp_c=40, power_w=90
        )
        message = protocol.Samples(type="samples", v=1, seq=seq, t=T0 + seq, gpus=[reading])
        gpus = dict(node.gpus.values_list("index", "pk"))
        return ingest.Pending(node.pk, seq, ingest.sample_rows(message, gpus), [], on_stored, boot_id=boot)
    counters = protocol.ServerCounters(generation_tokens_total=10.0 * seq, requests_running=1)
    report = protocol.Metrics(type="metrics", v=1, seq=seq, t=T0 + seq, deployment="d1", counters=counters)
    return ingest.Pending(node.pk, seq, [], [], on_stored, report, boot_id=boot)


def watermark(node: Node) -> int:
    node.refresh_from_db()
    return node.last_seq


def test_it_stores_each_item_once_when_two_processes_flush_the_same_replay(node):
    ingest.store_batch([item(node, s) for s in range(1, 9)])  # process B: the agent replayed 1-8 to it
    late = [item(node, s) for s in range(1, 6)]
    ingest.store_batch(late)  # process A flushes what it held when the agent left it
    assert all(i.stored for i in late)  # acked: they are in the database (B stored them)
    assert GpuSample.objects.count() == 4 and DeploymentMetric.objects.count() == 3  # metrics 2..8: 3 rates
    assert watermark(node) == 8


def test_it_stores_the_rest_of_a_replay_the_other_process_stored_part_of(node):
    ingest.store_batch([item(node, s) for s in range(1, 6)])  # process A flushes first
    ingest.store_batch([item(node, s) for s in range(1, 11)])  # then B, with the replay and what came after
    assert sorted(GpuSample.objects.values_list("seq", flat=True)) == [1, 3, 5, 7, 9]
    assert DeploymentMetric.objects.count() == 4 and watermark(node) == 10


def test_it_never_moves_the_watermark_back(node):
    ingest.store_batch([item(node, 7)])
    ingest.store_batch([item(node, 9)])
    Node.objects.filter(pk=node.pk).update(last_seq=5)  # as if a flush of 1-5 had raced ahead of the check
    ingest.store_batch([item(node, 3)])
    assert watermark(node) == 5  # 3 is below 5: skipped, and the mark stays
    ingest.store_batch([item(node, 11)])
    assert watermark(node) == 11


def test_it_leaves_a_new_agent_boots_watermark_to_it(node):
    Node.objects.filter(pk=node.pk).update(
        boot_id="boot-0002", last_seq=2
    )  # the agent restarted, re-said hello
    ingest.store_batch([item(node, s, boot="boot-0001") for s in (41, 43)])  # the old boot's, late from A
    node.refresh_from_db()
    assert (node.boot_id, node.last_seq) == ("boot-0002", 2)
    assert (
        GpuSample.objects.count() == 2
    )  # its samples are kept all the same (they are keyed by GPU and time)


def test_it_keeps_the_watermark_a_flush_moved_while_a_hello_was_being_applied(node):
    stale = Node.objects.get(pk=node.pk)  # a hello read the node here...
    ingest.store_batch([item(node, s) for s in (1, 3)])  # ...another process flushed...
    hello = protocol.Hello(
        type="hello",
        v=1,
        agent_version="test",
        hostname="moved",
        boot_id="boot-0001",
        interval_s=1.0,
        gpu_source="sim",
        simulated=True,
        gpus=[{"index": 0, "uuid": "GPU-0", "name": "NVIDIA A30", "memory_total_mib": 24576}],
    )
    ingest.apply_hello(stale, hello)  # ...and the hello is stored
    assert watermark(node) == 3
