"""What the protocol lets an agent send, the database holds: every bounded text field of a frame has a column
at least as long (PostgreSQL refuses a longer value; SQLite would keep it silently), and the longest values
a hello may carry are stored as sent."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.db import models

from agents import protocol
from dashboard.models import Gpu, Link, LogChunk, Node, NodeModel
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    close_the_consumers_connection,
    connect,
    hello,
    in_memory_layer,
    make_node,
    say,
)

# (protocol message, its field) -> the columns that store it
STORED_IN = [
    ((protocol.TopoLink, "a"), [(Link, "a")]),
    ((protocol.TopoLink, "b"), [(Link, "b")]),
    ((protocol.TopoLink, "link"), [(Link, "link"), (Link, "p2p_read"), (Link, "p2p_write")]),
    ((protocol.Hello, "hostname"), [(Node, "hostname")]),
    ((protocol.Hello, "agent_version"), [(Node, "agent_version")]),
    ((protocol.Hello, "driver_version"), [(Node, "driver_version")]),
    ((protocol.Hello, "cuda_version"), [(Node, "cuda_version")]),
    ((protocol.Hello, "boot_id"), [(Node, "boot_id"), (LogChunk, "boot_id")]),
    ((protocol.GpuInfo, "uuid"), [(Gpu, "uuid")]),
    ((protocol.GpuInfo, "name"), [(Gpu, "name")]),
    ((protocol.GpuInfo, "pci_bus_id"), [(Gpu, "pci_bus_id")]),
    ((protocol.LogTail, "source"), [(LogChunk, "source")]),
    ((protocol.LocalModel, "path"), [(NodeModel, "path")]),
    ((protocol.LocalModel, "name"), [(NodeModel, "name")]),
]


def longest(message: type[protocol.BaseModel], field: str) -> int | None:
    """The longest text the protocol takes in this field (None: unbounded)."""
    bounds = [m.max_length for m in message.model_fields[field].metadata if hasattr(m, "max_length")]
    return min(bounds) if bounds else None


@pytest.mark.parametrize(("sent", "columns"), STORED_IN, ids=[f"{m.__name__}.{f}" for (m, f), _ in STORED_IN])
def test_it_has_a_column_as_long_as_the_protocol_allows(sent, columns):
    allowed = longest(*sent)
    assert allowed is not None, f"{sent[0].__name__}.{sent[1]} is unbounded on the wire"
    for model, name in columns:
        column: models.CharField = model._meta.get_field(name)
        assert column.max_length >= allowed, (
            f"{model.__name__}.{name} holds {column.max_length} characters; the protocol allows {allowed}"
        )


def hello_at_the_limits() -> dict:
    frame = hello()
    a, b = "G" * protocol.MAX_NAME_CHARS, "H" * protocol.MAX_NAME_CHARS
    label = "L" * protocol.MAX_LINK_CHARS
    frame["topology"] = {
        "gpus": [{"name": a}, {"name": b}],
        "links": [{"a": a, "b": b, "link": label}],
        "p2p": {mode: [{"a": a, "b": b, "link": mode.upper() * protocol.MAX_LINK_CHARS}] for mode in "rw"},
    }
    frame["agent_version"] = "v" * protocol.MAX_NAME_CHARS
    frame["driver_version"] = frame["cuda_version"] = "9" * protocol.MAX_VERSION_CHARS
    return frame


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_stores_a_hello_with_the_longest_names_and_labels_the_protocol_allows():
    comm = await connect(await make_node())
    frame = hello_at_the_limits()
    assert (await say(comm, frame))["type"] == "welcome"
    link = await database_sync_to_async(lambda: Link.objects.get())()
    sent = frame["topology"]["links"][0]
    assert (link.a, link.b, link.link) == (sent["a"], sent["b"], sent["link"])
    assert (link.p2p_read, link.p2p_write) == ("R" * protocol.MAX_LINK_CHARS, "W" * protocol.MAX_LINK_CHARS)
    node = await database_sync_to_async(Node.objects.get)()
    assert (node.agent_version, node.driver_version) == (frame["agent_version"], frame["driver_version"])
    too_long = {**frame, "driver_version": "9" * (protocol.MAX_VERSION_CHARS + 1)}
    refused = await say(comm, too_long)
    assert (refused["code"], refused["message"].split(":")[0]) == ("invalid", "driver_version")
    await comm.disconnect()
