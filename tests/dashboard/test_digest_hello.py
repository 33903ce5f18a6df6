"""A known node's reconnect (issue #13, restart storms): the digest-only hello, the full hello the server asks
for when it does not hold that inventory, and the token check done once per connect (revocation at once)."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents import protocol
from agents.gpus import make_source
from agents.runner import Agent
from dashboard import ingest
from dashboard.models import AgentToken, Gpu, Link, Node
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    close_the_consumers_connection,
    connect,
    counts,
    hello,
    in_memory_layer,
    make_node,
    samples,
    say,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
OTHER_DIGEST = "0" * 64


def digest_only(digest: str, boot: str = "boot-0001", **changes) -> dict:
    frame = {key: value for key, value in hello(boot=boot).items() if key not in ("gpus", "topology")}
    return {**frame, "inventory_digest": digest, **changes}


@database_sync_to_async
def node_state(name: str = "a30-seed") -> dict:
    """Everything a hello may write: the node row, its GPUs and links."""
    node = Node.objects.get(name=name)
    row = {f.attname: getattr(node, f.attname) for f in Node._meta.concrete_fields}
    gpus = list(Gpu.objects.filter(node=node).order_by("index").values())
    return {"node": row, "gpus": gpus, "links": list(Link.objects.filter(node=node).values())}


async def welcomed_node(token: str) -> dict:
    comm = await connect(token)
    welcome = await say(comm, hello())
    await comm.disconnect()
    return welcome


async def test_it_welcomes_a_digest_only_hello_of_a_known_node_and_takes_its_samples():
    token = await make_node()
    first = await welcomed_node(token)
    assert first["inventory_digest"] == ingest.inventory_digest(protocol.Hello(**hello()))
    before = await node_state()
    comm = await connect(token)
    welcome = await say(comm, digest_only(first["inventory_digest"], hostname="renamed"))
    assert welcome["type"] == "welcome" and welcome["inventory_digest"] == first["inventory_digest"]
    await comm.send_to(text_data=json.dumps(samples(1)))
    assert json.loads(await comm.receive_from(timeout=5)) == {"type": "ack", "v": 1, "seq": 1}
    after = await node_state()
    assert after["gpus"] == before["gpus"] and after["links"] == before["links"]
    assert after["node"]["topology"] == before["node"]["topology"] and after["node"]["hostname"] == "renamed"
    assert await counts() == (2, 0)
    await comm.disconnect()


async def test_it_asks_for_the_full_hello_when_the_digest_is_not_the_stored_one():
    token = await make_node()
    await welcomed_node(token)
    before = await node_state()
    comm = await connect(token)
    reply = await say(comm, digest_only(OTHER_DIGEST, boot="boot-0002", hostname="elsewhere"))
    assert reply["type"] == "error" and reply["code"] == "full_hello_required", reply
    assert await node_state() == before  # the refused hello changed nothing, not even the boot id
    welcome = await say(comm, hello(boot="boot-0002"))  # the full hello on the same connection
    assert welcome["type"] == "welcome" and welcome["last_seq"] == 0
    await comm.disconnect()


async def test_it_asks_for_the_full_hello_of_a_node_it_never_had_an_inventory_of():
    comm = await connect(await make_node())
    digest = ingest.inventory_digest(protocol.Hello(**hello()))
    reply = await say(comm, digest_only(digest))
    assert reply["code"] == "full_hello_required"
    assert (await node_state())["node"]["inventory_digest"] == ""
    await comm.disconnect()


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (digest_only("ABC"), "inventory_digest: String should match pattern"),
        (digest_only("a" * 63), "inventory_digest: String should match pattern"),
        (digest_only(OTHER_DIGEST) | {"gpus": hello()["gpus"]}, "only for a digest-only hello"),
        (digest_only(OTHER_DIGEST) | {"topology": hello()["topology"]}, "only for a digest-only hello"),
        (
            {k: v for k, v in digest_only(OTHER_DIGEST).items() if k != "inventory_digest"},
            "needs either gpus",
        ),
        (digest_only(12345), "inventory_digest: Input should be a valid string"),
    ],
)
async def test_it_refuses_a_malformed_digest_hello_clearly_and_changes_nothing(frame, says):
    token = await make_node()
    await welcomed_node(token)
    before = await node_state()
    comm = await connect(token)
    reply = await say(comm, frame)
    assert reply["type"] == "error" and reply["code"] == "invalid" and says in reply["message"], reply
    assert await node_state() == before
    await comm.send_to(text_data=json.dumps(samples(1)))  # still no hello: nothing is taken
    assert json.loads(await comm.receive_from(timeout=5))["code"] == "hello_required"
    await comm.disconnect()


async def test_it_still_welcomes_an_old_style_hello_without_the_digest():
    token = await make_node()
    welcome = await welcomed_node(token)
    again = await welcomed_node(token)  # an older agent always sends the inventory
    assert welcome["type"] == again["type"] == "welcome"
    assert (await node_state())["node"]["inventory_digest"] == welcome["inventory_digest"]


async def test_it_refuses_a_revoked_token_at_the_next_connect_after_a_welcome():
    token = await make_node()
    await welcomed_node(token)
    await database_sync_to_async(lambda: AgentToken.objects.get().revoke())()
    comm = await connect(token)
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["code"] == "unauthorized"
    assert (await comm.receive_output(timeout=5))["code"] == protocol.CLOSE_UNAUTHORIZED


async def test_it_checks_a_token_in_one_read_and_writes_last_used_at_most_once_a_minute():
    await database_sync_to_async(check_token_queries)()


def check_token_queries() -> None:
    node = Node.objects.create(name="n1", topology={"gpus": [{"name": f"GPU{i}"} for i in range(8)]})
    row, token = AgentToken.issue(node)
    assert AgentToken.authenticate_token(token).pk == row.pk  # first use: last_used written
    with CaptureQueriesContext(connection) as queries:
        found = AgentToken.authenticate_token(token)
    assert found.node.name == "n1" and len(queries) == 1
    assert "topology" not in queries[0]["sql"]  # the node's largest column is not read to connect
    row.revoke()
    with CaptureQueriesContext(connection) as queries:
        assert AgentToken.authenticate_token(token) is None
    assert len(queries) == 1


class CommSocket:
    """The agent's view of a websocket (send, recv) on an in-process connection to the real consumer,
    keeping the frames the agent sent."""

    def __init__(self, comm) -> None:
        self.comm, self.sent = comm, []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))
        await self.comm.send_to(text_data=text)

    async def recv(self) -> str:
        return await self.comm.receive_from(timeout=5)


async def agent_session(agent: Agent, token: str) -> list[dict]:
    socket = CommSocket(await connect(token))
    assert (await agent.say_hello(socket))["type"] == "welcome"
    await socket.comm.disconnect()
    return socket.sent


async def test_it_sends_a_digest_only_hello_on_reconnect_and_the_full_one_when_asked():
    token = await make_node()
    agent = Agent("http://127.0.0.1:1", token, make_source("sim:a30x4"))
    first = await agent_session(agent, token)
    assert len(first) == 1 and len(first[0]["gpus"]) == 4 and "inventory_digest" not in first[0]
    second = await agent_session(agent, token)
    assert len(second) == 1 and second[0]["inventory_digest"] == agent.welcomed_inventory[1]
    assert not {"gpus", "topology", "models"} & set(second[0])
    await database_sync_to_async(lambda: Node.objects.update(inventory_digest=OTHER_DIGEST))()
    third = await agent_session(agent, token)  # the server lost it: asked, then the full hello
    assert [("gpus" in frame, "inventory_digest" in frame) for frame in third] == [
        (False, True),
        (True, False),
    ]
    assert (await node_state())["node"]["inventory_digest"] == agent.welcomed_inventory[1] != OTHER_DIGEST


async def test_it_sends_the_full_hello_when_its_inventory_changed_since_the_welcome():
    token = await make_node()
    agent = Agent("http://127.0.0.1:1", token, make_source("sim:a30x4"))
    await agent_session(agent, token)
    agent.source = make_source("sim:rtx4090x2")
    sent = await agent_session(agent, token)
    assert len(sent) == 1 and len(sent[0]["gpus"]) == 2
    assert len((await node_state())["gpus"]) == 2


def batch_fleet(count: int) -> tuple[list[int], list[dict]]:
    """`count` nodes, each welcomed once with a full hello (2 GPUs): their ids and digest-only hellos."""
    nodes = [Node.objects.create(name=f"batch-{i}") for i in range(count)]
    frames = [hello(boot=f"boot-{i:04d}") for i in range(count)]
    for node, frame in zip(nodes, frames, strict=True):
        ingest.welcome_node(node.pk, protocol.Hello(**frame))
    digests = [Node.objects.get(pk=node.pk).inventory_digest for node in nodes]
    return [n.pk for n in nodes], [
        digest_only(d, boot=f["boot_id"]) for d, f in zip(digests, frames, strict=True)
    ]


def welcome_batch(ids: list[int], frames: list[dict]) -> list:
    return ingest.welcome_nodes(
        [(pk, protocol.Hello(**frame)) for pk, frame in zip(ids, frames, strict=True)]
    )


async def test_it_welcomes_a_batch_of_digest_only_hellos_in_queries_that_do_not_grow_with_it():
    await database_sync_to_async(check_batch_queries)()


def check_batch_queries() -> None:
    ids, frames = batch_fleet(12)
    with CaptureQueriesContext(connection) as few:
        welcome_batch(ids[:2], frames[:2])
    with CaptureQueriesContext(connection) as many:
        outcomes = welcome_batch(ids[2:], frames[2:])
    assert len(many) == len(few) <= 8, [q["sql"][:80] for q in many]
    assert [w.node.pk for w in outcomes] == ids[2:] and all(len(w.gpu_ids) == 2 for w in outcomes)
    stored = Node.objects.filter(pk__in=ids).values_list("connected", "inventory_digest")
    assert all(connected and digest for connected, digest in stored)


async def test_it_gives_each_hello_of_a_mixed_batch_its_own_outcome():
    await database_sync_to_async(check_mixed_batch)()


def check_mixed_batch() -> None:
    ids, frames = batch_fleet(3)
    before = Node.objects.get(pk=ids[1]).boot_id
    frames[1] = digest_only(OTHER_DIGEST, boot="boot-new")  # the server holds another inventory
    frames[2] = hello(boot="boot-0002")  # a full hello
    outcomes = welcome_batch([*ids, 999_999], [*frames, frames[0]])
    assert isinstance(outcomes[0], ingest.Welcome) and isinstance(outcomes[2], ingest.Welcome)
    assert outcomes[1].code == "full_hello_required" and Node.objects.get(pk=ids[1]).boot_id == before
    assert isinstance(outcomes[3], Node.DoesNotExist)


async def test_it_applies_each_hello_alone_when_the_batch_fails(monkeypatch):
    from django.db import IntegrityError

    def broken(hellos):  # a fault of one hello's data (a database that is away: test_digest_hello_edges)
        raise IntegrityError("UNIQUE constraint failed")

    monkeypatch.setattr(ingest, "_welcome_batch", broken)
    await database_sync_to_async(check_mixed_batch)()


async def test_it_checks_a_wave_of_tokens_in_one_read_each_answer_its_own():
    await database_sync_to_async(check_token_wave)()


def check_token_wave() -> None:
    issued = [AgentToken.issue(Node.objects.create(name=f"w{i}")) for i in range(3)]
    issued[1][0].revoke()
    presented = [issued[0][1], issued[1][1], "", "lc_" + "x" * 300, "lc_unknown", issued[2][1]]
    with CaptureQueriesContext(connection) as queries:
        rows = AgentToken.authenticate_tokens(presented)
    assert [row.node.name if row else None for row in rows] == ["w0", None, None, None, None, "w2"]
    assert len(queries) == 2  # the read, and last_used of the two first used now


async def test_it_batches_what_arrives_while_a_batch_runs_and_answers_each_caller():
    import asyncio

    from dashboard.admission import Batcher

    batches = []

    async def run(items):
        batches.append(list(items))
        await asyncio.sleep(0.05)
        return [ValueError(f"bad {i}") if i == 3 else i * 10 for i in items]

    batcher = Batcher(run, most=3)
    first = asyncio.create_task(batcher.do(0))
    await asyncio.sleep(0.01)  # its batch is running: the next ones gather meanwhile
    outcomes = await asyncio.gather(*(batcher.do(i) for i in range(1, 6)), return_exceptions=True)
    assert batches == [[0], [1, 2, 3], [4, 5]] and await first == 0
    assert outcomes[:2] == [10, 20] and str(outcomes[2]) == "bad 3" and outcomes[3:] == [40, 50]


async def test_it_stores_the_engine_versions_of_a_digest_only_hello():
    """An operator upgraded vLLM on a node whose GPUs did not change: the next reconnect is digest-only, and the
    planner's default release (the node's reported one) must still follow it."""
    token = await make_node()
    first = await welcomed_node(token)
    engines = [{"backend": "vllm", "version": "0.7.3"}]
    comm = await connect(token)
    welcome = await say(comm, digest_only(first["inventory_digest"], engines=engines))
    assert welcome["type"] == "welcome"
    assert [(e["backend"], e["version"]) for e in (await node_state())["node"]["engines"]] == [
        ("vllm", "0.7.3")
    ]
    await comm.disconnect()
