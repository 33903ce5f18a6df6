"""The SIMULATED backend's multi-node rendezvous, standing in for torch.distributed's TCP store and NCCL.

The head (node rank 0) listens on master_addr:master_port and waits until every other node has joined;
each other node connects (retrying while the head is not up yet) and says its rank. After that every
node holds its connections open: when one closes, a peer died or was stopped, and like a real NCCL
communicator the survivors cannot go on. Plain TCP on the real network, so a test sees real failures.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

JOIN_RETRY_S = 0.5
HELLO = b"layercake-simrank "


class RendezvousError(RuntimeError):
    """The rendezvous could not complete; the message is what the log says."""


@dataclass
class Rendezvous:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    join_timeout_s: float = 600.0
    peers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    async def complete(self) -> None:
        """Head: wait for all other nodes. Other nodes: join the head. Raises RendezvousError."""
        if self.node_rank == 0:
            await self._gather()
        else:
            await self._join()

    async def _gather(self) -> None:
        everyone = asyncio.Event()

        async def arrived(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            line = await reader.readline()
            if not line.startswith(HELLO):
                writer.close()
                return
            self.peers.append((reader, writer))
            if len(self.peers) == self.nnodes - 1:
                everyone.set()

        try:
            server = await asyncio.start_server(arrived, self.master_addr, self.master_port)
        except OSError as exc:
            raise RendezvousError(f"cannot listen for the other nodes on {self.endpoint}: {exc}") from None
        async with server:
            await everyone.wait()

    async def _join(self) -> None:
        deadline = asyncio.get_running_loop().time() + self.join_timeout_s
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.master_addr, self.master_port)
                break
            except OSError as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise RendezvousError(
                        f"timed out after {self.join_timeout_s:g} s joining the head at "
                        f"{self.endpoint}: {exc}"
                    ) from None
                await asyncio.sleep(JOIN_RETRY_S)
        writer.write(HELLO + str(self.node_rank).encode() + b"\n")
        await writer.drain()
        self.peers.append((reader, writer))

    async def peer_lost(self) -> None:
        """Returns when any peer's connection closes (it exited, was stopped, or the network went)."""
        waits = [asyncio.create_task(_until_closed(reader)) for reader, _ in self.peers]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    def close(self) -> None:
        for _, writer in self.peers:
            with contextlib.suppress(Exception):
                writer.close()


async def _until_closed(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError):
        while await reader.read(4096):
            pass
