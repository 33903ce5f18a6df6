"""Reconnecting after a server restart: a short window for a server reachable moments ago, and the delay a
busy server asks for (agents.protocol.busy / retry_after), refused when malformed."""

import json

import pytest
import websockets

from agents import protocol
from agents.runner import Agent, Backoff, ServerBusy


def test_it_keeps_the_window_short_for_a_server_reachable_moments_ago():
    backoff = Backoff()
    backoff.lost()
    delays = [backoff.next_delay() for _ in range(50)]
    assert max(delays) <= backoff.recent_window and backoff.attempt == 0


def test_it_grows_the_window_for_a_server_not_reachable_lately(monkeypatch):
    backoff = Backoff(recent_s=30.0)
    backoff.lost()
    backoff.reachable_at -= 31.0
    monkeypatch.setattr("agents.runner.random.uniform", lambda low, high: high)
    assert [round(backoff.next_delay(), 3) for _ in range(3)] == [0.75, 1.125, 1.688]


def test_it_waits_once_as_long_as_the_server_asks(monkeypatch):
    backoff = Backoff()
    backoff.lost()
    backoff.defer(7.0)
    assert 7.0 <= backoff.next_delay() <= 8.4
    assert backoff.next_delay() <= backoff.recent_window  # then its own window again


def test_it_builds_a_busy_reply_that_the_agent_reads_back():
    reply = json.loads(protocol.busy("a wave", 3.14159))
    assert reply["type"] == "error" and reply["code"] == "busy"
    assert protocol.retry_after(reply) == 3.14


def test_it_clamps_what_the_server_asks_into_the_allowed_range():
    assert protocol.retry_after(json.loads(protocol.busy("x", -2))) == 0.0
    assert protocol.retry_after(json.loads(protocol.busy("x", 1e9))) == protocol.MAX_RETRY_AFTER_S


def test_it_names_no_delay_when_the_reply_has_none():
    assert protocol.retry_after(json.loads(protocol.error("busy", "bus away"))) is None


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), 601, "5", True, None, [1], {"s": 1}])
def test_it_refuses_a_malformed_retry_after(value):
    with pytest.raises(protocol.ProtocolError) as raised:
        protocol.retry_after({"type": "error", "code": "busy", "retry_after_s": value})
    assert raised.value.code == "bad_retry_after" and "retry_after_s must be a number" in raised.value.message


class OneReply:
    def __init__(self, reply: dict) -> None:
        self.reply = reply

    async def recv(self) -> str:
        return json.dumps(self.reply)


def agent() -> Agent:
    from agents.gpus import make_source

    return Agent("http://127.0.0.1:1", "token", make_source("sim:a30x4"))


@pytest.mark.asyncio
async def test_it_takes_a_busy_reply_as_a_delay_to_obey():
    with pytest.raises(ServerBusy) as raised:
        await agent().expect_welcome(OneReply(json.loads(protocol.busy("a wave", 4.0))))
    assert raised.value.retry_after == 4.0


@pytest.mark.asyncio
async def test_it_falls_back_to_its_own_backoff_when_the_delay_is_malformed():
    reply = {"type": "error", "v": 1, "code": "busy", "message": "x", "retry_after_s": "soon"}
    with pytest.raises(ServerBusy) as raised:
        await agent().expect_welcome(OneReply(reply))
    assert raised.value.retry_after is None


@pytest.mark.asyncio
async def test_it_still_refuses_an_unexpected_reply():
    with pytest.raises(websockets.WebSocketException):
        await agent().expect_welcome(OneReply({"type": "ack", "seq": 1}))


class TurnedAway:
    """A connection the server closed with a busy reply before the agent's hello went out."""

    def __init__(self) -> None:
        self.replies = [protocol.busy("a wave", 6.0)]

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    async def send(self, frame: str) -> None:
        from websockets.frames import Close

        raise websockets.ConnectionClosedError(Close(1013, ""), Close(1013, ""), True)

    async def recv(self) -> str:
        return self.replies.pop(0)


@pytest.mark.asyncio
async def test_it_reads_the_busy_reply_of_a_server_that_closed_before_the_hello_went_out(monkeypatch):
    monkeypatch.setattr("agents.runner.websockets.connect", lambda *a, **k: TurnedAway())
    with pytest.raises(ServerBusy) as raised:
        await agent().session(Backoff())
    assert raised.value.retry_after == 6.0


@pytest.mark.asyncio
async def test_it_connects_without_compression():
    """A samples frame is ~2 KB a second: deflating it and every ack cost the server more than it saved."""
    offered: list[str | None] = []

    async def server(ws) -> None:
        offered.append(ws.request.headers.get("Sec-WebSocket-Extensions"))
        await ws.send(protocol.error("unauthorized", "no"))

    async with websockets.serve(server, "127.0.0.1", 0) as served:
        port = served.sockets[0].getsockname()[1]
        runner = agent()
        runner.server = f"http://127.0.0.1:{port}"
        with pytest.raises(Exception):  # noqa: B017 (refused: only the handshake matters here)
            await runner.session(Backoff())
    assert offered == [None]
