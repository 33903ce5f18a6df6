"""Websocket consumers: the agent endpoint and the browsers' live feed. Thin: rules live in ingest.py.

Where an agent's frame goes: `AgentConsumer` validates it (agents.protocol) and hands it to this process's
`ingest_buffer()`, which hands its samples to the browsers' fan-out at once (live.FleetFanout, one "fleet"
tick per FANOUT_SECONDS), writes it to the database (ingest.store_batch, on the agents' database thread:
agent_db), then queues the tasks its report calls for (tasks.enqueue: a multi-node head up or failed), then
passes the deployment summaries made in that transaction to the fan-out, then acks the agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from redis.exceptions import RedisError

from agents import protocol
from dashboard import admission, asking, browser_json, ingest, subscriptions, tasks
from dashboard.agent_db import agent_database
from dashboard.choices import NodeStatus
from dashboard.groups import memberships
from dashboard.live import FLEET_GROUP, FleetFanout, agent_group, announce_node, announce_nodes
from dashboard.models import AgentToken, Node
from dashboard.per_loop import PerLoop
from dashboard.telemetry import LIVE

BROWSER_OUTBOX = 50  # ticks waiting for a slow browser beyond this are dropped (as a full channel drops them)
SERVER_STOPPING = 1012  # the close code uvicorn gives every socket when the process stops ("service restart")
CHANNEL_LAYER_TIMEOUT_S = 5.0  # a hello that waits longer on Redis is told to reconnect
BUS_RETRY_S = 5.0  # ... after this long, not within its 1 s restart window
MAX_BROWSER_FRAME_CHARS = 16_384  # a browser's ask: a prompt of at most 4,000 characters and a few fields

log = logging.getLogger(__name__)


def make_ingest_buffer() -> ingest.IngestBuffer:
    """Stored reports' follow-up tasks go to the broker, received and stored samples to the browsers' fan-out."""
    fanout = FleetFanout(settings.FANOUT_SECONDS)
    buffer = ingest.IngestBuffer(
        queue_jobs=tasks.enqueue, listeners=[fanout.record_summaries], received=[fanout.record]
    )
    LIVE.attach(buffer)  # /metrics reads the newest readings and the rows waiting
    return buffer


# Each of this process's (event loop's), shared by its agent connections, made on first use:
ingest_buffer = PerLoop(make_ingest_buffer)
hello_gate = PerLoop(lambda: admission.HelloGate(settings.HELLO_CONCURRENT))  # admission of hellos
# batches of hellos for the database thread: (node id, hello) in
hello_batcher = PerLoop(lambda: admission.Batcher(agent_database(ingest.welcome_nodes)))
# batches of agent token checks: the bearer token in, its AgentToken row or None out
token_batcher = PerLoop(lambda: admission.Batcher(agent_database(AgentToken.authenticate_tokens)))
# "Online" announcements of welcomed nodes, sent to the browsers together: what is welcomed while one message
# goes out waits for the next. One group message per node was a Redis round trip for the sender and for each
# browser's channel; in a reconnect wave they reached the browser ~12 s after the values did (bench/README.md,
# restart storm).
online_batcher = PerLoop(lambda: admission.Batcher(announce_online))


async def announce_online(nodes: list[dict]) -> list[None]:
    """A batch's announcement failing must not fail its hellos: they are stored and welcomed, and a page marks
    a node online on its first value anyway."""
    try:
        await announce_nodes(nodes)
    except (RedisError, OSError) as exc:
        log.warning("could not announce %d nodes online: %s", len(nodes), exc)
    return [None] * len(nodes)


def bearer_token(scope: dict) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization" and value.lower().startswith(b"bearer "):
            return value[7:].decode("latin-1").strip()
    return ""


class AgentConsumer(AsyncWebsocketConsumer):
    """One connected node agent. Frames are validated before anything is stored."""

    node: Node | None = None
    token_id: int | None = None
    gpu_ids: dict[int, int] | None = None  # set by a stored hello; samples need it
    accepted_seq: int = 0  # highest sequence number handed to the ingest buffer
    accepted_at: float = 0.0  # when accepted_seq last moved (unix time): bounds how far the next may jump
    stored_seq: int = 0  # highest sequence number known to be in the database (what may be acked)
    closing: bool = False  # revoked, replaced or told to send again: no more frames are taken
    replaced: bool = False  # a newer connection of this node took over (it marks the node connected)
    queued: bool = False  # admitted by the hello gate and not welcomed yet

    async def connect(self) -> None:
        await self.accept()
        LIVE.socket_opened("agent")
        hello_gate().admit()
        self.queued = True
        token = await token_batcher().do(bearer_token(self.scope))
        if token is None:
            await self.refuse_token()
            return
        self.node, self.token_id = token.node, token.pk
        try:
            await asyncio.wait_for(self.join_node_group(), timeout=CHANNEL_LAYER_TIMEOUT_S)
        except (RedisError, OSError, TimeoutError):
            # Redis away (restarting, overloaded): without the group the server cannot reach this agent, so
            # tell it to come back rather than leave it waiting for a welcome that never comes.
            self.closing = True
            await self.send(protocol.busy("the server's message bus is unavailable; reconnect", BUS_RETRY_S))
            await self.close(protocol.CLOSE_RETRY)
            return
        # A revocation between the check and joining the group told a group this socket was not in yet; from
        # here on the group tells it, and this second (batched) check sees any before.
        if await token_batcher().do(bearer_token(self.scope)) is None:
            await self.refuse_token()

    async def refuse_token(self) -> None:
        self.closing = True
        await self.send(protocol.error("unauthorized", "unknown or revoked agent token"))
        await self.close(protocol.CLOSE_UNAUTHORIZED)

    async def join_node_group(self) -> None:
        # One agent per node: an older connection (a duplicate agent, or a socket not yet seen dead) is closed.
        await self.channel_layer.group_send(agent_group(self.node.pk), {"type": "agent.replaced"})
        await memberships().join(self.channel_layer, agent_group(self.node.pk), self.channel_name)

    def leave_queue(self) -> None:
        if self.queued:
            self.queued = False
            hello_gate().leave()

    async def disconnect(self, code: int) -> None:
        LIVE.socket_closed("agent")
        self.leave_queue()
        if self.node is not None:
            if self.gpu_ids is not None and not self.replaced:
                LIVE.agent_gone(self.node.pk)
            await memberships().leave(self.channel_layer, agent_group(self.node.pk), self.channel_name)
        if self.node is not None and self.gpu_ids is not None and not self.replaced:
            await agent_database(ingest.mark_disconnected)(self.node.pk)
            try:
                await announce_node(self.node.pk, self.node.name, NodeStatus.STALE)
            except RedisError as exc:  # many agents leaving at once; the beat task announces them anyway
                log.warning("could not announce %s leaving: %s", self.node.name, exc)

    def server_stopping(self) -> None:
        """This process stops (uvicorn closes every socket with 1012): the agent did not go anywhere and will be
        back on the next process in about a second. Marking 1,000 nodes disconnected and announcing each (a
        database write, Redis messages and two trips to the database thread per agent) held a restart's stop
        until its timeout; the node's next hello, or the silent-node sweep if none comes, says how it is."""
        LIVE.socket_closed("agent")
        self.leave_queue()
        if self.node is not None:
            memberships().forget(agent_group(self.node.pk), self.channel_name)
            if self.gpu_ids is not None and not self.replaced:
                LIVE.agent_gone(self.node.pk)
        raise StopConsumer()

    async def dispatch(self, message: dict) -> None:
        # Channels hops to asgiref's sync thread before every handler to close stale connections there. This
        # consumer reaches the database only on the agents' own thread (agent_db, which does that around each
        # call), so the hop would only queue agent frames and commands behind the browsers' database work.
        if message["type"] == "websocket.disconnect" and message.get("code") == SERVER_STOPPING:
            self.server_stopping()
            return
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.node is None or self.closing:
            return
        try:
            if text_data is None:
                raise protocol.ProtocolError("binary", "binary frames are refused: the protocol is JSON text")
            await self.handle(protocol.parse_agent_message(text_data))
        except protocol.ProtocolError as exc:
            log.warning("agent %s: rejected frame: %s", self.node.name, exc.message)
            await self.send(protocol.error(exc.code, exc.message))

    async def handle(
        self,
        message: protocol.Hello | protocol.Samples | protocol.LogTail | protocol.Report | protocol.Answer,
    ) -> None:
        if isinstance(message, protocol.Hello):
            await self.hello(message)
        elif self.gpu_ids is None:
            raise protocol.ProtocolError("hello_required", "send hello before samples or logs")
        elif isinstance(message, protocol.Answer):
            await self.answer(message)
        elif message.seq <= self.stored_seq:
            await self.send(protocol.ack(self.stored_seq))  # a replay of what is already stored
        elif message.seq <= self.accepted_seq:
            return  # a replay of what is still in flight: its flush will ack it
        else:
            now = time.time()
            ingest.check_seq(message.seq, self.accepted_seq, now - self.accepted_at)
            ingest.check_time(message.t, now)
            self.enqueue(message)
            self.accepted_at = now

    async def hello(self, message: protocol.Hello) -> None:
        async with hello_gate().turn():
            welcome = await self.store_hello(message)
        self.leave_queue()
        node = self.node = welcome.node
        self.gpu_ids, self.accepted_seq, self.stored_seq = welcome.gpu_ids, node.last_seq, node.last_seq
        LIVE.agent_online(node.pk)
        self.accepted_at = welcome.watermark_moved.timestamp()
        await self.send(protocol.welcome(node.name, node.last_seq, node.inventory_digest))
        for frame in welcome.launches:
            await self.send(frame)  # the agent launches idempotently: this only restores what it lost
        await online_batcher().do({"node": node.pk, "name": node.name, "status": NodeStatus.ONLINE})

    async def store_hello(self, message: protocol.Hello) -> ingest.Welcome:
        buffer = ingest_buffer()
        if buffer.holds(self.node.pk):  # what an earlier connection of this agent still has in flight
            await buffer.flush()  # (only then: after a restart, 1,000 hellos were 1,000 early flushes)
        try:
            return await hello_batcher().do((self.node.pk, message))
        except protocol.ProtocolError:
            raise  # full_hello_required: the agent sends its inventory on this connection
        except (DatabaseError, *ingest.REFUSALS) as exc:
            raise protocol.ProtocolError(
                "hello_refused", f"the server could not store this hello: {exc}"
            ) from None

    async def answer(self, message: protocol.Answer) -> None:
        """Part of an answer to a browser's ask: stored if it ends a measurement, passed to that browser."""
        if message.done:
            await agent_database(asking.record_answer)(self.node.pk, message)
        await self.channel_layer.group_send(asking.ask_group(message.request), asking.browser_event(message))

    async def agent_command(self, event: dict) -> None:
        """A command for this node's agent from a Celery task (launch, stop, restart)."""
        if self.gpu_ids is not None and not self.closing:
            await self.send(event["frame"])

    async def agent_replaced(self, event: dict) -> None:
        """A newer connection of this node's agent: it takes over, this one is closed."""
        self.closing = self.replaced = True
        await self.send(
            protocol.error("replaced", "a newer connection of this node's agent replaced this one")
        )
        await self.close(protocol.CLOSE_REPLACED)

    async def agent_revoked(self, event: dict) -> None:
        """An admin revoked (or deleted) an agent token of this node: its sockets close now."""
        if event["token"] == self.token_id:
            self.closing = True
            await self.send(protocol.error("unauthorized", "agent token revoked"))
            await self.close(protocol.CLOSE_UNAUTHORIZED)

    def enqueue(self, message: protocol.Samples | protocol.LogTail | protocol.Report) -> None:
        rows, logs, report, sampled_at, xids = [], [], None, 0.0, {}
        if isinstance(message, protocol.Samples):
            unknown = {s.index for s in message.gpus} - set(self.gpu_ids)
            if unknown:
                raise protocol.ProtocolError(
                    "unknown_gpu", f"GPU index {sorted(unknown)} not announced in hello"
                )
            rows, sampled_at = ingest.sample_rows(message, self.gpu_ids), message.t
            xids = ingest.sample_xids(message, self.gpu_ids)
        elif isinstance(message, protocol.LogTail):
            logs = [ingest.log_row(message, self.node.pk, self.node.boot_id)]
        else:
            report = message
        self.accepted_seq = message.seq
        pending = ingest.Pending(
            self.node.pk,
            message.seq,
            rows,
            logs,
            self.acknowledge,
            report,
            sampled_at,
            on_failed=self.not_stored,
            xids=xids,
            boot_id=self.node.boot_id,
        )
        ingest_buffer().add(pending)

    async def acknowledge(self, seq: int) -> None:
        self.stored_seq = max(self.stored_seq, seq)
        await self.send(protocol.ack(seq))

    async def not_stored(self, item: ingest.Pending) -> None:
        """An item the flush did not store. Refused: the agent is told why (the next ack skips it). To be sent
        again: nothing after it may be acked, so the agent reconnects and replays from the stored watermark."""
        if item.refused:
            await self.send(
                protocol.error("store_refused", f"seq {item.seq} was not stored: {item.refused}", item.seq)
            )
        elif not self.closing:
            self.closing = True
            await self.send(
                protocol.error("store_failed", f"seq {item.seq} could not be stored now; send it again")
            )
            await self.close(protocol.CLOSE_RETRY)


class FleetConsumer(AsyncWebsocketConsumer):
    """A logged-in browser's live feed: node status changes, deployments, plans and alerts, and the live
    values of what the page subscribed to (dashboard.subscriptions)."""

    counted: bool = False  # accepted, so counted among this process's browser sockets
    outbox: asyncio.Queue | None = None  # this page's part of the ticks, sent in order by `send_outbox`
    sender: asyncio.Task | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(4403)
            return
        await memberships().join(self.channel_layer, FLEET_GROUP, self.channel_name)
        await self.accept()
        self.counted = True
        LIVE.socket_opened("browser")

    async def disconnect(self, code: int) -> None:
        if self.counted:
            LIVE.socket_closed("browser")
        if self.sender is not None:
            subscriptions.live_hub().forget(self)
            self.sender.cancel()
        await memberships().leave(self.channel_layer, FLEET_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """A page says what it shows ("subscribe"), or asks a deployment's server something ("ask")."""
        try:
            data = json.loads(text_data or "") if len(text_data or "") <= MAX_BROWSER_FRAME_CHARS else None
        except ValueError:
            data = None
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "subscribe":
            await self.subscribe(data)
        elif kind == "ask":
            await self.ask(data)
        else:
            await self.refuse("", "expected a subscribe or an ask (JSON)")

    async def refuse(self, ref: str, error: str) -> None:
        await self.send(browser_json.dumps({"type": "fleet.refused", "ref": ref, "error": error}))

    async def subscribe(self, data: dict) -> None:
        """What the page shows from now on; a refused subscription changes nothing."""
        ref = str(data.get("ref", ""))[:64]
        try:
            subscription = subscriptions.parse(data)
            await database_sync_to_async(subscriptions.authorize)(self.scope["user"], subscription)
        except subscriptions.Refused as exc:
            await self.refuse(ref, str(exc))
            return
        if self.sender is None:
            self.outbox = asyncio.Queue(BROWSER_OUTBOX)
            self.sender = asyncio.get_running_loop().create_task(self.send_outbox())
        self.deliver(browser_json.dumps({"type": "fleet.subscribed", "ref": ref, **subscription.describe()}))
        await subscriptions.live_hub().watch(self, subscription)

    def deliver(self, text: str) -> None:
        """The hub's message for this page: queued, so that one slow browser never holds up the others."""
        try:
            self.outbox.put_nowait(text)
        except asyncio.QueueFull:
            log.warning("a browser is %d messages behind; dropping a live update", BROWSER_OUTBOX)

    async def send_outbox(self) -> None:
        while True:
            await self.send(await self.outbox.get())

    async def ask(self, data: dict) -> None:
        """A browser asks a deployment's server something ("Try it", "Measure"), through the node's agent."""
        ref = str(data.get("ref", ""))[:64]  # the page's own name for this ask, echoed back
        try:
            node_id, frame, request = await database_sync_to_async(asking.start_ask)(self.scope["user"], data)
        except (asking.AskRefused, PermissionDenied) as exc:
            await self.refuse(ref, str(exc))
            return
        await self.channel_layer.group_add(asking.ask_group(request), self.channel_name)
        await self.channel_layer.group_send(agent_group(node_id), {"type": "agent.command", "frame": frame})
        await self.send(browser_json.dumps({"type": "fleet.asked", "ref": ref, "request": request}))

    async def fleet_answer(self, event: dict) -> None:
        if event.get("done"):
            await self.channel_layer.group_discard(asking.ask_group(event["request"]), self.channel_name)
        await self.send(browser_json.dumps(event))

    async def fleet_update(self, event: dict) -> None:
        await self.send(
            event["text"]
        )  # deployment changes, encoded once for every browser (live.fleet_update)

    async def fleet_node(self, event: dict) -> None:
        await self.send(browser_json.dumps(event))

    async def fleet_nodes(self, event: dict) -> None:
        await self.send(browser_json.dumps(event))

    async def fleet_plan(self, event: dict) -> None:
        await self.send(browser_json.dumps(event))

    async def fleet_alert(self, event: dict) -> None:
        await self.send(browser_json.dumps(event))
