"""End to end: real Redis, the real ASGI server, `python -m agents run` as a subprocess, a browser feed."""

import asyncio
import time

import pytest
import websockets

from dashboard.models import GpuSample, Node
from tests.harness import browser_messages, node_with_token, session_cookie, start_agent, wait_until

pytestmark = pytest.mark.slow


def test_it_stores_simulated_samples_and_pushes_them_to_a_logged_in_browser(live_stack, alice, log_dir):
    node, token = node_with_token("a30-seed")
    agent = start_agent(live_stack.url, token, "sim:a30x4", log_dir)
    try:
        wait_until(lambda: GpuSample.objects.filter(gpu__node=node).count() >= 8, what="stored samples")
        updates = asyncio.run(browser_messages(live_stack.url, session_cookie(alice), count=2))
    finally:
        agent.stop()
    node.refresh_from_db()
    assert node.simulated and node.gpus.count() == 4
    assert {link.link for link in node.links.filter(a__startswith="GPU", b__startswith="GPU")} == {"SYS"}
    mine = [n for u in updates for n in u["nodes"] if n["node"] == node.pk]
    assert mine and len(mine[-1]["gpus"]) == 4
    assert abs(mine[-1]["t"] - time.time()) < 10


def test_it_refuses_the_browser_feed_without_login(live_stack):
    async def try_connect():
        url = live_stack.url.replace("http://", "ws://") + "/ws/fleet/"
        async with websockets.connect(url, additional_headers={"Origin": live_stack.url}) as ws:
            await ws.recv()

    with pytest.raises(websockets.exceptions.WebSocketException):
        asyncio.run(try_connect())


def test_it_exits_with_a_clear_error_on_a_wrong_token(live_stack, log_dir):
    node_with_token("a30-seed")
    agent = start_agent(live_stack.url, "lc_not-the-token", "sim:a30x4", log_dir)
    assert agent.proc.wait(timeout=30) == 3
    assert "refused the token" in (log_dir / "agent-sim-a30x4.log").read_text()
    assert GpuSample.objects.count() == 0


def seqs_per_gpu(node: Node) -> dict[int, list[int]]:
    rows = GpuSample.objects.filter(gpu__node=node).values_list("gpu__index", "seq")
    result: dict[int, list[int]] = {}
    for index, seq in rows:
        result.setdefault(index, []).append(seq)
    return {i: sorted(s) for i, s in result.items()}


def test_it_replays_what_was_sampled_while_the_server_was_down(live_stack, log_dir):
    node, token = node_with_token("rtx4090-box")
    live_stack.stop_server()
    agent = start_agent(live_stack.url, token, "sim:rtx4090x2", log_dir, interval=0.2)
    try:
        time.sleep(2.0)  # ten samples taken with no server
        live_stack.start_server()
        wait_until(lambda: Node.objects.get(pk=node.pk).last_seq >= 15, what="replay after first start")
        live_stack.stop_server()  # and down once more mid-stream
        time.sleep(1.5)
        live_stack.start_server()
        first_gap_end = Node.objects.get(pk=node.pk).last_seq + 8
        wait_until(
            lambda: Node.objects.get(pk=node.pk).last_seq >= first_gap_end + 5, what="replay after restart"
        )
    finally:
        agent.stop()
    seqs = seqs_per_gpu(node)
    assert set(seqs) == {0, 1}
    for gpu_seqs in seqs.values():
        assert gpu_seqs == list(range(1, len(gpu_seqs) + 1)), "a gap or a duplicate"
        assert len(gpu_seqs) >= 20
