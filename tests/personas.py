"""Named test nodes built the way a real agent's hello builds them (from the simulated GPU sources)."""

from __future__ import annotations

from agents import protocol
from agents.sim.gpus import SimSource
from dashboard.ingest import apply_hello
from dashboard.models import Node


def hello_for(name: str, spec: str) -> protocol.Hello:
    source = SimSource(spec)
    return protocol.Hello(type="hello", v=1, agent_version="test", hostname=name, boot_id="boot-" + name,
                          interval_s=1.0, gpu_source="sim", simulated=True, gpus=source.inventory(),
                          topology=source.topology())


def sim_node(name: str, spec: str) -> Node:
    """A node as it is after its agent said hello: GPUs, links and topology stored."""
    node = Node.objects.create(name=name)
    apply_hello(node, hello_for(name, spec))
    node.refresh_from_db()
    return node


def seed_server() -> Node:
    """The field report's server: 4x A30 24 GB, every GPU pair SYS, no P2P."""
    return sim_node("a30-seed", "sim:a30x4")
