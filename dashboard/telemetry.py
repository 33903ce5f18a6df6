"""What this server process knows live, for `/metrics`: each GPU's newest reading, XID events counted, ingest
and socket counts.

The newest reading of every GPU is already in this process: the ingest buffer hands each stored batch to its
listeners (the browsers' fan-out is one). `LiveState.record` is another listener and keeps the stored rows
themselves (tuples, no copy), so a scrape reads 8,000 GPUs from memory instead of querying the samples table.
Like the ingest buffer it is per process: with several web processes each holds its own agents' readings
(docs/production.md, "Worker processes").

Threads: `record` runs on the event loop; a snapshot may be taken on another thread (the metrics listener,
dashboard/metrics_listener.py). Both hold `LiveState.lock`, so a snapshot holds every stored batch it saw
whole, never part of one. The socket and agent counts are single reads (atomic under the GIL).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


class StoredBatchItem(Protocol):
    """What the live state reads of an item the ingest buffer stored (ingest.Pending)."""

    node_id: int
    rows: list[Any]
    sampled_at: float
    xids: dict[int, list[int]]


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of the live state (whole stored batches), read by a scrape in its own thread."""

    readings: dict[int, Any]  # GPU id -> its newest stored row (ingest.SampleRow)
    sampled_at: dict[int, float]  # node id -> newest sample time (the agent's clock, unix seconds)
    stored_at: dict[int, float]  # node id -> when this process last stored its samples (this server's clock)
    xid_events: dict[int, int]  # GPU id -> XID events stored since this process started
    last_xid: dict[int, int]  # GPU id -> the code of its most recent XID
    samples_stored: int
    ingest_lag_s: float | None
    buffer_rows: int
    agents_connected: int
    sockets: dict[str, int]
    scrapes: int
    render_cpu_s: float
    taken: float


@dataclass
class LiveState:
    readings: dict[int, Any] = field(default_factory=dict)
    reading_t: dict[int, float] = field(default_factory=dict)
    sampled_at: dict[int, float] = field(default_factory=dict)
    stored_at: dict[int, float] = field(default_factory=dict)
    xid_events: Counter[int] = field(default_factory=Counter)
    last_xid: dict[int, int] = field(default_factory=dict)
    samples_stored: int = 0
    ingest_lag_s: float | None = None
    agents: set[int] = field(default_factory=set)
    sockets: Counter[str] = field(default_factory=Counter)
    scrapes: int = 0
    render_cpu_s: float = 0.0
    buffers: list[weakref.ref] = field(default_factory=list)  # ingest buffers are dataclasses: unhashable
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by record, scraped and snapshot

    def attach(self, buffer: Any) -> None:
        """Follow an ingest buffer: its stored batches, and how many rows wait in it."""
        self.buffers = [ref for ref in self.buffers if ref() is not None] + [weakref.ref(buffer)]
        buffer.listeners.append(self.record)

    def record(self, batch: list[StoredBatchItem]) -> None:
        """Keep the newest row per GPU from a stored batch (a replayed older sample does not replace it)."""
        try:
            with self.lock:
                self._record(batch)
        except Exception:  # a bug here must not keep the ingest buffer from acking what it stored
            log.exception("live state for /metrics: a stored batch was not recorded")

    def _record(self, batch: list[StoredBatchItem]) -> None:
        oldest, now = None, time.time()
        for item in batch:
            if not item.rows:
                continue
            t = item.sampled_at
            oldest = t if oldest is None else min(oldest, t)
            self.sampled_at[item.node_id] = max(self.sampled_at.get(item.node_id, 0.0), t)
            self.stored_at[item.node_id] = now
            self._keep_rows(item.rows, t)
            self.samples_stored += len(item.rows)
            self._count_xids(item.xids)
        if oldest is not None:
            self.ingest_lag_s = max(0.0, now - oldest)

    def _keep_rows(self, rows: list[Any], t: float) -> None:
        readings, reading_t = self.readings, self.reading_t
        for row in rows:
            if reading_t.get(row.gpu_id, 0.0) <= t:
                readings[row.gpu_id], reading_t[row.gpu_id] = row, t

    def _count_xids(self, xids: dict[int, list[int]]) -> None:
        for gpu_id, codes in xids.items():
            self.xid_events[gpu_id] += len(codes)
            self.last_xid[gpu_id] = codes[-1]

    def socket_opened(self, kind: str) -> None:
        self.sockets[kind] += 1

    def socket_closed(self, kind: str) -> None:
        self.sockets[kind] = max(0, self.sockets[kind] - 1)

    def agent_online(self, node_id: int) -> None:
        self.agents.add(node_id)

    def agent_gone(self, node_id: int) -> None:
        self.agents.discard(node_id)

    def scraped(self, cpu_s: float) -> None:
        with self.lock:  # scrapes end on the event loop's pool threads and on the listener's
            self.scrapes += 1
            self.render_cpu_s += cpu_s

    def snapshot(self) -> Snapshot:
        """Copies of the maps (the rows are immutable tuples), from any thread."""
        with self.lock:
            return self._copy()

    def _copy(self) -> Snapshot:
        return Snapshot(
            readings=dict(self.readings),
            sampled_at=dict(self.sampled_at),
            stored_at=dict(self.stored_at),
            xid_events=dict(self.xid_events),
            last_xid=dict(self.last_xid),
            samples_stored=self.samples_stored,
            ingest_lag_s=self.ingest_lag_s,
            buffer_rows=sum(b.rows_pending for b in (ref() for ref in self.buffers) if b is not None),
            agents_connected=len(self.agents),
            sockets={"agent": self.sockets["agent"], "browser": self.sockets["browser"]},
            scrapes=self.scrapes,
            render_cpu_s=self.render_cpu_s,
            taken=time.time(),
        )


LIVE = LiveState()  # this process's
