"""Edge cases of the digest-only hello found in review: an inventory row deleted outside a hello, two hellos of
one node in one batch, a database that is away during a batch, a token revoked while its socket joins its group,
an agent that found no engine speaking to a server from before engine versions."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.db import OperationalError

from agents import protocol
from dashboard import ingest
from dashboard.consumers import AgentConsumer
from dashboard.models import AgentToken, Gpu, Node
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    close_the_consumers_connection,
    connect,
    hello,
    in_memory_layer,
    make_node,
    samples,
    say,
)


def digest_only(digest: str, boot: str = "boot-0001", **changes) -> dict:
    frame = {key: value for key, value in hello(boot=boot).items() if key not in ("gpus", "topology")}
    return {**frame, "inventory_digest": digest, **changes}


@database_sync_to_async
def delete_gpu(index: int) -> None:
    Gpu.objects.filter(node__name="a30-seed", index=index).delete()  # e.g. an admin in GpuAdmin / GpuInline


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_asks_for_the_full_hello_when_a_gpu_of_the_stored_inventory_was_deleted_and_takes_all_samples():
    token = await make_node()
    comm = await connect(token)
    first = await say(comm, hello())
    await comm.disconnect()
    await delete_gpu(1)
    comm = await connect(token)
    # The server no longer holds the inventory the digest names (GPU 1 is gone): resumed on it, every samples
    # frame would be refused unknown_gpu for as long as the agent runs.
    reply = await say(comm, digest_only(first["inventory_digest"]))
    assert reply.get("code") == "full_hello_required", reply
    welcome = await say(comm, hello())  # the agent's full hello on the same socket puts GPU 1 back
    assert welcome["type"] == "welcome", welcome
    assert await say(comm, samples(1)) == {"type": "ack", "v": 1, "seq": 1}
    await comm.disconnect()


@pytest.mark.django_db
def test_it_does_not_resume_a_digest_that_a_full_hello_earlier_in_the_batch_replaced():
    node = Node.objects.create(name="a30-seed")
    old = ingest.welcome_node(node.pk, protocol.Hello(**hello())).node.inventory_digest
    changed = protocol.Hello(**hello(gpus=1))  # the node lost a GPU: a new inventory
    stale = protocol.Hello(**digest_only(old))  # a second connection of the node, still on the old one
    outcomes = ingest.welcome_nodes([(node.pk, changed), (node.pk, stale)])
    stored = Node.objects.get(pk=node.pk).inventory_digest
    assert stored != old
    second = outcomes[1]
    assert isinstance(second, protocol.ProtocolError) and second.code == "full_hello_required", (
        f"resumed digest {old[:8]} though the node now holds {stored[:8]}: welcome says "
        f"{getattr(getattr(second, 'node', None), 'inventory_digest', '?')[:8]}, gpus {getattr(second, 'gpu_ids', '?')}"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_refuses_a_hello_whose_token_was_revoked_while_the_connection_was_being_admitted(
    monkeypatch,
):
    token = await make_node()
    join = AgentConsumer.join_node_group

    async def revoked_meanwhile(self) -> None:
        # The revocation lands after the (batched) token check, before the socket is in its node's group: the
        # agent.revoked message that should close it goes to a group it is not in yet.
        await database_sync_to_async(lambda: AgentToken.objects.get().revoke())()
        await join(self)

    monkeypatch.setattr(AgentConsumer, "join_node_group", revoked_meanwhile)
    comm = await connect(token)
    reply = await say(comm, hello())
    assert reply["type"] != "welcome", "a revoked token's connection was welcomed and stays connected"
    await comm.disconnect()


@pytest.mark.django_db
def test_it_does_not_retry_each_hello_alone_when_the_database_is_unreachable(monkeypatch):
    ids = [Node.objects.create(name=f"n{i}").pk for i in range(8)]
    tries = []

    def locked(*args, **kwargs):
        tries.append(args)
        raise OperationalError("database is locked")  # each try waited the 20 s busy timeout first

    monkeypatch.setattr(ingest, "_welcome_batch", locked)
    monkeypatch.setattr(ingest, "welcome_node", locked)
    outcomes = ingest.welcome_nodes([(pk, protocol.Hello(**hello())) for pk in ids])
    assert all(isinstance(o, OperationalError) for o in outcomes)
    assert len(tries) == 1, f"{len(tries)} waits for the lock on the agents' database thread, not 1"


def test_it_leaves_out_an_empty_engines_list_so_that_an_older_server_takes_the_hello():
    sent = json.loads(protocol.dump_hello(protocol.Hello(**hello())))
    assert "engines" not in sent and "inventory_digest" not in sent
    with_engine = protocol.Hello(**hello(), engines=[{"backend": "vllm", "version": "0.7.3"}])
    sent = json.loads(protocol.dump_hello(with_engine))
    assert sent["engines"] == [{"backend": "vllm", "version": "0.7.3", "detail": ""}]
