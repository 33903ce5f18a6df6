"""What happens to agent messages once they are valid: inventory updates and batched sample writes.

The websocket consumer stays thin: it validates (agents.protocol), then calls into this module.
Samples are not written one message at a time: `IngestBuffer` collects rows from every agent
connected to this server process and writes them in one transaction per flush, then acks each
agent for what is now stored, so an agent only forgets a sample once it is in the database.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    models,
    transaction,
)
from django.db.models.constants import OnConflict
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from agents import protocol
from agents.protocol import (
    DeploymentStatus,
    GpuReading,
    Hello,
    LogTail,
    Probe,
    ProtocolError,
    Report,
    Samples,
)
from dashboard import deploy
from dashboard.agent_db import agent_database
from dashboard.jobs import Job
from dashboard.models import Deployment, Gpu, GpuSample, Link, LogChunk, Node, NodeModel
from dashboard.node_models import sync_node_models

log = logging.getLogger(__name__)
AckCallback = Callable[[int], Awaitable[None]]
FailCallback = Callable[["Pending"], Awaitable[None]]
# What the database driver raises for a value it cannot hold (SQLite: OverflowError for a too-large int).
REFUSALS = (ValueError, OverflowError, TypeError)
TRANSIENT = (OperationalError, InterfaceError)  # the database is unreachable or busy, not the data wrong
# How far a message time may be from the server's clock: the agent may have buffered a while (or kept its
# outbox on disk across a restart), and a node without NTP drifts. Beyond it the clock is broken.
TIME_BEHIND_S = 7 * 86400
TIME_AHEAD_S = 86400
# Sequence numbers: an agent uses a few per interval (samples, log chunks, reports), so a jump past the
# watermark larger than this allows for the time since it moved is refused, not allowed to move it.
SEQ_SLACK = 10_000
SEQ_PER_SECOND = 1_000


# Set while a hello replaces a node's inventory rows: those deletions are the hello's own, its digest stands.
_APPLYING_HELLO: contextvars.ContextVar[bool] = contextvars.ContextVar("applying_hello", default=False)


@receiver(post_delete, sender=Gpu, dispatch_uid="ingest.forget_digest.gpu")
@receiver(post_delete, sender=Link, dispatch_uid="ingest.forget_digest.link")
@receiver(post_delete, sender=NodeModel, dispatch_uid="ingest.forget_digest.model")
def forget_inventory_digest(sender: type, instance: Gpu | Link | NodeModel, **kwargs: object) -> None:
    """A row of a node's inventory deleted outside a hello (an admin deleting a GPU): the stored digest no
    longer names what the database holds. Resumed on it, the agent's samples of that GPU would be refused for
    as long as the agent runs; without it, the next digest-only hello is asked for the full one."""
    if not _APPLYING_HELLO.get():
        Node.objects.filter(pk=instance.node_id).update(inventory_digest="")


def apply_hello(node: Node, hello: Hello) -> dict[int, int]:
    """Record the agent's inventory and topology; return GPU index -> Gpu id for sample rows."""
    applying = _APPLYING_HELLO.set(True)
    try:
        return _apply_hello(node, hello)
    finally:
        _APPLYING_HELLO.reset(applying)


def _apply_hello(node: Node, hello: Hello) -> dict[int, int]:
    digest = inventory_digest(hello)
    with transaction.atomic():
        new_boot = _take_boot(node, hello)
        if digest == node.inventory_digest:  # unchanged, from an agent that sends no digest-only hellos
            _update_node_fields(node, hello, new_boot, RESUME_FIELDS)
            return dict(node.gpus.values_list("index", "pk"))
        node.inventory_digest = digest
        node.topology = hello.topology.model_dump() if hello.topology else None
        _update_node_fields(node, hello, new_boot, HELLO_FIELDS)
        gpu_ids = _sync_gpus(node, hello)
        _sync_links(node, hello)
        sync_node_models(node, hello)
    return gpu_ids


@dataclass
class Welcome:
    """What a hello gives the agent's connection: the node as stored now, with its replay watermark."""

    node: Node
    gpu_ids: dict[int, int]  # GPU index -> Gpu id, for sample rows
    watermark_moved: datetime  # when the watermark last moved (before this hello): bounds the next seq jump
    launches: list[str]  # launch frames of what the node should be running


def welcome_node(node_id: int, hello: Hello) -> Welcome:
    """The database side of a hello in one trip to the database thread (three trips cost a reconnect wave
    of 1,000 hellos three queues behind the ingest flushes): the node read afresh (another server process
    may have moved its watermark), the hello applied, the launches to restore. A digest-only hello whose
    digest is not the stored one raises ProtocolError `full_hello_required` and changes nothing."""
    # Without the topology, the largest column: only a changed inventory sets it, nothing here reads it.
    node = Node.objects.defer("topology").get(pk=node_id)
    moved = node.last_seen or node.created
    gpu_ids = resume_known(node, hello) if hello.digest_only else apply_hello(node, hello)
    return Welcome(node, gpu_ids, moved, deploy.desired_launches(node))


def welcome_nodes(hellos: list[tuple[int, Hello]]) -> list[Welcome | Exception]:
    """Several hellos in one trip to the database thread and one transaction (a reconnect wave: 1,000 hellos
    were 1,000 trips, 1,000 commits and ~5,000 queries). Each hello's outcome, in order: its Welcome, or the
    exception that refused it (`full_hello_required`, a refusal). Digest-only hellos share their queries; a
    full one is applied as alone. If the batch fails, each hello is applied on its own, so that only the one
    at fault is refused."""
    try:
        with transaction.atomic():
            return _welcome_batch(hellos)
    except TRANSIENT as exc:  # each hello alone would wait for the database again, the flushes behind them
        return [exc] * len(hellos)
    except (DatabaseError, *REFUSALS):
        return [_welcome_alone(node_id, hello) for node_id, hello in hellos]


def _welcome_alone(node_id: int, hello: Hello) -> Welcome | Exception:
    try:
        return welcome_node(node_id, hello)
    except (DatabaseError, Node.DoesNotExist, *REFUSALS) as exc:  # ProtocolError is a ValueError
        return exc


def _welcome_in_batch(node_id: int, hello: Hello) -> Welcome | Exception:
    """A hello the batch applies as alone. A database error is not caught here: it fails the batch (on
    PostgreSQL the transaction is unusable after it) and every hello is then applied on its own."""
    try:
        return welcome_node(node_id, hello)
    except (ProtocolError, Node.DoesNotExist) as exc:  # raised before anything is written
        return exc


def _welcome_batch(hellos: list[tuple[int, Hello]]) -> list[Welcome | Exception]:
    nodes = Node.objects.defer("topology").in_bulk([node_id for node_id, _ in hellos])
    outcomes: list[Welcome | Exception | None] = []
    resumed: dict[int, tuple[Node, datetime, bool]] = {}  # outcome index -> node, watermark moved, new boot
    seen: set[int] = set()
    for node_id, hello in hellos:
        node = nodes.get(node_id)
        if node is None or not hello.digest_only or node_id in seen:
            # Full, unknown, or a second of one node: read afresh (a full hello before it may have replaced
            # the inventory its digest names).
            outcomes.append(_welcome_in_batch(node_id, hello))
        elif hello.inventory_digest != node.inventory_digest or not node.inventory_digest:
            outcomes.append(full_hello_required())
        else:
            resumed[len(outcomes)] = (node, node.last_seen or node.created, _take_boot(node, hello))
            _set_node_fields(node, hello)
            outcomes.append(None)
        seen.add(node_id)
    _welcome_resumed(resumed, outcomes)
    return outcomes


def _welcome_resumed(
    resumed: dict[int, tuple[Node, datetime, bool]], outcomes: list[Welcome | Exception | None]
) -> None:
    """The digest-only hellos of a batch: their node rows in one statement (two with new boots), their GPUs
    and launches in one query each."""
    ids = [node.pk for node, _, _ in resumed.values()]
    _save_resumed([node for node, _, new_boot in resumed.values() if not new_boot], [])
    _save_resumed([node for node, _, new_boot in resumed.values() if new_boot], ["boot_id", "last_seq"])
    gpu_ids: dict[int, dict[int, int]] = {pk: {} for pk in ids}
    for node_id, index, pk in Gpu.objects.filter(node_id__in=ids).values_list("node_id", "index", "pk"):
        gpu_ids[node_id][index] = pk
    launches = deploy.desired_launches_of(ids)
    for at, (node, moved, _) in resumed.items():
        outcomes[at] = Welcome(node, gpu_ids[node.pk], moved, launches[node.pk])


def _save_resumed(nodes: list[Node], more: list[str]) -> None:
    """What `_update_node_fields` saves of each node (RESUME_FIELDS), for many nodes in one executemany."""
    if not nodes:
        return
    fields = [Node._meta.get_field(name) for name in RESUME_FIELDS + more]
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(f.column)} = %s" for f in fields)
    sql = f"UPDATE {quote(Node._meta.db_table)} SET {assignments} WHERE {quote(Node._meta.pk.column)} = %s"
    rows = [
        [f.get_db_prep_save(getattr(node, f.attname), connection) for f in fields] + [node.pk]
        for node in nodes
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def full_hello_required() -> ProtocolError:
    return ProtocolError(
        "full_hello_required",
        "the server does not hold the inventory of that digest for this node; send the full hello",
    )


def resume_known(node: Node, hello: Hello) -> dict[int, int]:
    """A digest-only hello (a reconnect): the stored inventory stands, only the node row's own fields change."""
    if not node.inventory_digest or hello.inventory_digest != node.inventory_digest:
        raise full_hello_required()
    new_boot = _take_boot(node, hello)
    _update_node_fields(node, hello, new_boot, RESUME_FIELDS)
    return dict(node.gpus.values_list("index", "pk"))


def _take_boot(node: Node, hello: Hello) -> bool:
    """A new agent process (boot id) starts its sequence numbers again: the watermark goes back to 0."""
    new_boot = hello.boot_id != node.boot_id
    if new_boot:
        node.boot_id, node.last_seq = hello.boot_id, 0
    return new_boot


def inventory_digest(hello: Hello) -> str:
    return protocol.inventory_digest(hello)


# What a hello writes of the node: never last_seq (another server process may be moving it for this node
# right now; a save of the whole row could set it back), except to 0 when the agent process is a new one.
HELLO_FIELDS = [
    "hostname",
    "simulated",
    "gpu_source",
    "agent_version",
    "driver_version",
    "cuda_version",
    "engines",
    "interval_s",
    "topology",
    "connected",
    "last_seen",
    "inventory_digest",
]
# A digest-only hello leaves the inventory (digest, topology) as stored.
RESUME_FIELDS = [name for name in HELLO_FIELDS if name not in ("topology", "inventory_digest")]


def _update_node_fields(node: Node, hello: Hello, new_boot: bool, fields: list[str]) -> None:
    _set_node_fields(node, hello)
    node.save(update_fields=fields + (["boot_id", "last_seq"] if new_boot else []))


def _set_node_fields(node: Node, hello: Hello) -> None:
    node.hostname = hello.hostname
    node.simulated = hello.simulated
    node.gpu_source = hello.gpu_source
    node.agent_version = hello.agent_version
    node.driver_version = hello.driver_version
    node.cuda_version = hello.cuda_version
    node.engines = [e.model_dump() for e in hello.engines]
    node.interval_s = hello.interval_s
    node.connected = True
    node.last_seen = timezone.now()


def _sync_gpus(node: Node, hello: Hello) -> dict[int, int]:
    ids: dict[int, int] = {}
    for info in hello.gpus:
        gpu, _ = Gpu.objects.update_or_create(
            node=node, index=info.index, defaults=info.model_dump(exclude={"index"})
        )
        ids[info.index] = gpu.pk
    node.gpus.exclude(index__in=ids).delete()
    return ids


def _sync_links(node: Node, hello: Hello) -> None:
    node.links.all().delete()
    if hello.topology is None:
        return
    reads = {frozenset((x.a, x.b)): x.link for x in hello.topology.p2p.get("r", [])}
    writes = {frozenset((x.a, x.b)): x.link for x in hello.topology.p2p.get("w", [])}
    rows = []
    for x in hello.topology.links:
        pair = frozenset((x.a, x.b))
        rows.append(
            Link(
                node=node,
                a=x.a,
                b=x.b,
                link=x.link,
                p2p_read=reads.get(pair, ""),
                p2p_write=writes.get(pair, ""),
            )
        )
    Link.objects.bulk_create(rows)


def mark_disconnected(node_id: int) -> None:
    Node.objects.filter(pk=node_id).update(connected=False)


class SampleRow(NamedTuple):
    """One gpu sample row as the database takes it: a tuple, not a model instance (ingest's hot path).

    Building a model instance and letting bulk_create compile it cost ~100 us a row, most of the server's
    CPU at a few hundred agents; these go to the database in one executemany (`insert_samples`).
    """

    gpu_id: int
    t: Any  # the database's form of the sample time (connection.ops.adapt_datetimefield_value)
    seq: int
    util_gpu: float
    util_mem: float
    mem_used_mib: float
    mem_free_mib: float
    temp_c: float
    power_w: float
    power_limit_w: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    throttle_reasons: int
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    xids: Any  # JSON, adapted for the database
    processes: Any


def sample_rows(message: Samples, gpu_ids: dict[int, int]) -> list[SampleRow]:
    """Rows for one samples message; GPUs the hello did not announce are refused by the caller."""
    ops = connection.ops  # once per message: each lookup goes through asgiref's Local (8,000 a second)
    t = ops.adapt_datetimefield_value(datetime.fromtimestamp(message.t, tz=UTC))
    none = ops.adapt_json_value([], None)  # nearly every GPU has no XIDs, and an idle one no processes
    return [_sample_row(s, gpu_ids[s.index], t, message.seq, ops, none) for s in message.gpus]


def sample_xids(message: Samples, gpu_ids: dict[int, int]) -> dict[int, list[int]]:
    """GPU id -> the XID codes of a samples message, for the GPUs that had any (nearly always none)."""
    return {gpu_ids[s.index]: list(s.xids) for s in message.gpus if s.xids}


def _sample_row(s: GpuReading, gpu_id: int, t: Any, seq: int, ops: Any, none: Any) -> SampleRow:
    return SampleRow(
        gpu_id,
        t,
        seq,
        s.util_gpu,
        s.util_mem,
        s.mem_used_mib,
        s.mem_free_mib,
        s.temp_c,
        s.power_w,
        s.power_limit_w,
        s.sm_clock_mhz,
        s.mem_clock_mhz,
        s.throttle_reasons,
        s.ecc_corrected,
        s.ecc_uncorrected,
        ops.adapt_json_value(s.xids, None) if s.xids else none,
        ops.adapt_json_value([p.model_dump() for p in s.processes], None) if s.processes else none,
    )


def log_row(message: LogTail, node_id: int, boot_id: str) -> LogChunk:
    t = datetime.fromtimestamp(message.t, tz=UTC)
    return LogChunk(
        node_id=node_id, source=message.source, boot_id=boot_id, seq=message.seq, t=t, lines=message.lines
    )


def check_time(t: float, now: float) -> None:
    """Refuse a message time this far from the server's clock: a broken clock or a forged frame."""
    if now - TIME_BEHIND_S <= t <= now + TIME_AHEAD_S:
        return
    side = "behind" if t < now else "ahead of"
    raise ProtocolError(
        "bad_time",
        f"t={t:.0f} is {_duration(abs(now - t))} {side} the server's clock; the server "
        f"takes times from {_duration(TIME_BEHIND_S)} behind to {_duration(TIME_AHEAD_S)} ahead "
        "(is the node's clock set? NTP)",
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.0f} days"


def check_seq(seq: int, watermark: int, seconds_since: float) -> None:
    """Refuse a sequence number further past the watermark than the agent can have counted since it was set."""
    reach = watermark + SEQ_SLACK + SEQ_PER_SECOND * max(0.0, seconds_since)
    if seq > reach:
        raise ProtocolError(
            "seq_jump",
            f"seq {seq} is {seq - watermark} past the last one stored ({watermark}); "
            f"an agent cannot have sent that many frames in {seconds_since:.0f} s",
        )


@dataclass
class Pending:
    node_id: int
    seq: int
    rows: list[SampleRow]
    logs: list[LogChunk]
    on_stored: AckCallback
    report: Report | None = None
    sampled_at: float = 0.0  # the rows' sample time, seconds since the epoch (for the live pages)
    # Filled in when stored: the deployment's summary for the live pages, and the tasks its report calls for.
    deployment_summary: dict | None = None
    jobs: list[Job] = field(default_factory=list)
    # Told when the item was not stored (`refused` or `retry` says why); without one it is only logged.
    on_failed: FailCallback | None = None
    boot_id: str = ""  # the agent process that sent it: the watermark it may move is that boot's
    refused: str = ""  # the database refused this item's data: it never will be stored
    xids: dict[int, list[int]] = field(default_factory=dict)  # GPU id -> XID codes in these samples
    retry: bool = (
        False  # not stored for a passing reason (database unreachable): the agent must send it again
    )

    @property
    def stored(self) -> bool:
        return not self.refused and not self.retry

    async def settle(self) -> None:
        """Tell the agent: an ack when stored, else the failure (nothing after a retry is acked)."""
        if self.stored:
            await self.on_stored(self.seq)
        elif self.on_failed is not None:
            await self.on_failed(self)


@dataclass
class IngestBuffer:
    """Per-process write-behind buffer shared by all agent connections of this server process.

    `queue_jobs` gets the follow-up tasks of the reports once they are committed (in the database thread);
    `listeners` get the stored items on the event loop; `received` each item as it arrives, before it is stored
    (the browsers' live values: waiting for the flush and the store added ~0.1-0.4 s, and SQLite's write lock
    more, to every value on its way to a page). The agent consumer wires them (consumers.py).
    """

    queue_jobs: Callable[[list[Job]], None]
    flush_seconds: float = field(default_factory=lambda: settings.INGEST_FLUSH_SECONDS)
    max_rows: int = 5000
    pending: list[Pending] = field(default_factory=list)
    rows_pending: int = 0
    listeners: list[Callable[[list[Pending]], None]] = field(default_factory=list)
    received: list[Callable[[list[Pending]], None]] = field(default_factory=list)
    _task: asyncio.Task | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def holds(self, node_id: int) -> bool:
        """Does an item of this node wait for the next flush?"""
        return any(item.node_id == node_id for item in self.pending)

    def add(self, item: Pending) -> None:
        for listener in self.received:
            listener([item])
        self.pending.append(item)
        self.rows_pending += len(item.rows) + len(item.logs)
        self._ensure_running()

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.pending:
            await asyncio.sleep(self.flush_seconds if self.rows_pending < self.max_rows else 0)
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            batch, self.pending, self.rows_pending = self.pending, [], 0
            if not batch:
                return
            try:
                await agent_database(self._store)(batch)
            except Exception:  # a bug, not the data: store nothing, ack nothing, the agents send it all again
                log.exception("storing %d items failed; their agents will send them again", len(batch))
                for item in batch:
                    item.retry = True
            batch += self._after_retries(batch)
            stored = [item for item in batch if item.stored]
            for listener in self.listeners:
                listener(stored)
            await asyncio.gather(*(item.settle() for item in batch), return_exceptions=True)

    def _store(self, batch: list[Pending]) -> None:
        store_batch(batch)
        jobs = [job for item in batch if item.stored for job in item.jobs]
        if jobs:
            self.queue_jobs(jobs)

    def _after_retries(self, batch: list[Pending]) -> list[Pending]:
        """Take out what an agent sent after an item it must send again: storing it would leave a gap that
        a later ack would cover. Returned as retries too (the agent reconnects and replays from the gap)."""
        streams = {item.on_stored for item in batch if item.retry}
        if not streams:
            return []
        later = [item for item in self.pending if item.on_stored in streams]
        self.pending = [item for item in self.pending if item.on_stored not in streams]
        self.rows_pending = sum(len(item.rows) + len(item.logs) for item in self.pending)
        for item in later:
            item.retry = True
        return later


def store_batch(batch: list[Pending]) -> None:
    """Write every row of the batch and move each node's replay watermark, in one transaction; if the data
    breaks that, item by item, so that an item the database refuses costs only that item."""
    close_old_connections()
    try:
        with transaction.atomic():
            _store(batch)
        return
    except TRANSIENT as exc:  # every item would wait for it in turn: the agents send them again instead
        log.warning("storing %d items failed, to be sent again: %s", len(batch), exc)
        for item in batch:
            item.retry = True
        return
    except Exception as exc:
        log.warning(
            "storing %d items at once failed (%s: %s); storing them one by one",
            len(batch),
            type(exc).__name__,
            exc,
        )
    _store_one_by_one(batch)


def _store_one_by_one(batch: list[Pending]) -> None:
    blocked: set[int] = set()  # nodes with an item to be sent again: nothing after it may be stored
    for item in batch:
        item.deployment_summary, item.jobs = None, []  # computed in the transaction that was rolled back
        if item.node_id in blocked:
            item.retry = True
            continue
        try:
            with transaction.atomic():
                _store([item])
        except TRANSIENT as exc:
            log.warning("node %s seq %s not stored, to be sent again: %s", item.node_id, item.seq, exc)
            item.retry = True
            blocked.add(item.node_id)
        except (DatabaseError, *REFUSALS) as exc:
            item.refused = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("node %s seq %s refused by the database: %s", item.node_id, item.seq, item.refused)
        except Exception as exc:  # a bug (its traceback says where); it must not cost the other items
            item.refused = f"server error: {type(exc).__name__}"
            log.exception("node %s seq %s not stored", item.node_id, item.seq)


def _store(batch: list[Pending]) -> None:
    batch = not_stored_yet(batch)
    highest: dict[tuple[int, str], int] = {}
    for item in batch:
        highest[item.node_id, item.boot_id] = max(highest.get((item.node_id, item.boot_id), 0), item.seq)
    insert_samples([r for i in batch for r in i.rows])
    LogChunk.objects.bulk_create([r for i in batch for r in i.logs], batch_size=500, ignore_conflicts=True)
    for item in batch:
        if item.report is not None:
            item.deployment_summary, item.jobs = apply_report(item.node_id, item.report)
    _advance_watermarks(highest)


def not_stored_yet(batch: list[Pending]) -> list[Pending]:
    """The items no other server process has stored yet. With several processes, an agent that reconnects
    to another one replays what the first still holds unflushed: whichever flushes first stores it, and the
    other finds it at or below the node's watermark (same agent boot) and skips it, so a report is applied
    once. The nodes' rows stay locked to the end of the transaction (PostgreSQL: FOR UPDATE, in id order so
    that two flushes cannot deadlock; SQLite: the transaction took the write lock when it began)."""
    nodes = Node.objects.select_for_update().filter(pk__in={i.node_id for i in batch}).order_by("pk")
    marks = {pk: (boot, seq) for pk, boot, seq in nodes.values_list("pk", "boot_id", "last_seq")}
    return [item for item in batch if not _at_or_below(item, marks.get(item.node_id))]


def _at_or_below(item: Pending, mark: tuple[str, int] | None) -> bool:
    return mark is not None and item.boot_id == mark[0] and item.seq <= mark[1]


def apply_report(node_id: int, report: Report) -> tuple[dict | None, list[Job]]:
    """A deployment status, metrics or canary probe report from an agent, applied in sequence order with the samples.
    Returns the deployment's summary for the live pages and the tasks to queue once it is committed."""
    deployment = Deployment.objects.filter(pk=report.deployment).first()
    if deployment is not None and deployment.node_id != node_id:
        return _apply_member_report(deployment, node_id, report)
    if deployment is None:
        log.warning("node %s reported on unknown deployment %s", node_id, report.deployment)
        return None, []
    jobs = []
    if isinstance(report, DeploymentStatus):
        deployment.apply_status(report)
        jobs = deploy.follow_head(deployment, report)
    elif isinstance(report, Probe):
        deployment.record_probe(report)
    else:
        deployment.record_metrics(report.t, report.counters)
    return deployment.summary(), jobs


def _apply_member_report(
    deployment: Deployment, node_id: int, report: Report
) -> tuple[dict | None, list[Job]]:
    """A further node of a multi-node deployment; it serves no API, so only its status counts."""
    member = deployment.members.filter(node_id=node_id).select_related("node").first()
    if member is None:
        log.warning("node %s reported on deployment %s, which does not run there", node_id, deployment.pk)
        return None, []
    jobs = (
        deploy.apply_member_status(deployment, member, report) if isinstance(report, DeploymentStatus) else []
    )
    return deployment.summary(), jobs


class SampleTimeTaken(ValueError):
    """A sample for a GPU at a time that GPU already has a different sample at (another seq): the database
    holds one sample per GPU and time, so this one cannot be stored and must not be acked as if it were."""


def insert_samples(rows: list[SampleRow]) -> None:
    """Insert the rows, a few hundred per statement. A row already stored (same GPU, time and seq: a replay)
    is skipped; one whose GPU and time hold a sample of another seq raises SampleTimeTaken.

    Not one executemany: CPython's sqlite3 steps each of its rows apart and gives up the interpreter lock
    for each, so next to a busy event loop 8,000 rows took 94-465 ms instead of 13-25 ms (bench/README.md,
    "Restart storm"), and every hand-over of the lock stalled the loop too."""
    per = rows_per_insert()
    inserted = 0
    with connection.cursor() as cursor:
        for start in range(0, len(rows), per):
            chunk = rows[start : start + per]
            cursor.execute(_insert_samples_sql(len(chunk)), [value for row in chunk for value in row])
            inserted += cursor.rowcount if cursor.rowcount >= 0 else len(chunk)
    if inserted < len(rows):
        _check_skipped_are_replays(rows)


def rows_per_insert() -> int:
    """Sample rows per INSERT: 500, or fewer if the database takes fewer parameters per statement."""
    most = connection.features.max_query_params or 500 * len(SampleRow._fields)
    if connection.vendor == "sqlite":  # Django assumes SQLite's old limit of 999; ask the library its own
        connection.ensure_connection()
        most = connection.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return max(1, min(500, most // len(SampleRow._fields)))


def _check_skipped_are_replays(rows: list[SampleRow]) -> None:
    stored = _stored_seqs(rows)
    for row in rows:
        seq = stored.get((row.gpu_id, row.t))
        if seq is not None and seq != row.seq:
            gpu = Gpu.objects.get(pk=row.gpu_id)
            raise SampleTimeTaken(
                f"GPU {gpu.index} already has a sample at t={_shown_time(row.t)} (seq {seq}); "
                "each sample of a GPU needs its own time t"
            )


def _stored_seqs(rows: list[SampleRow]) -> dict[tuple[int, Any], int]:
    """(GPU id, time as the database holds it) -> seq of the stored samples at the rows' GPUs and times."""
    gpu, t, seq = (GpuSample._meta.get_field(n).column for n in ("gpu", "t", "seq"))
    q = connection.ops.quote_name
    ids = sorted({r.gpu_id for r in rows})
    sql = (
        f"SELECT {q(gpu)}, {q(t)}, {q(seq)} FROM {_table(GpuSample)} "
        f"WHERE {q(gpu)} IN ({', '.join(['%s'] * len(ids))}) AND {q(t)} >= %s AND {q(t)} <= %s"
    )
    times = [r.t for r in rows]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*ids, min(times), max(times)])
        found = cursor.fetchall()
    adapt = connection.ops.adapt_datetimefield_value  # the driver reads a datetime back; rows hold this form
    return {(g, adapt(when)): s for g, when, s in found}


def _shown_time(t: Any) -> str:
    return t.isoformat() if isinstance(t, datetime) else str(t)


@functools.lru_cache(maxsize=64)
def _insert_samples_sql(rows: int) -> str:
    ops = connection.ops
    fields = [GpuSample._meta.get_field(name) for name in SampleRow._fields]
    unique = [GpuSample._meta.get_field(name) for name in ("gpu", "t")]
    values = ", ".join([f"({', '.join(['%s'] * len(fields))})"] * rows)
    return (
        f"{ops.insert_statement(on_conflict=OnConflict.IGNORE)} {_table(GpuSample)} ({_columns(fields)}) "
        f"VALUES {values} {ops.on_conflict_suffix_sql(unique, OnConflict.IGNORE, [], [])}"
    )


def _advance_watermarks(highest: dict[tuple[int, str], int]) -> None:
    """Move each node's watermark forward only, and only for the agent boot it counts (a flush of an earlier
    boot's items, late from another process, must not move the new boot's)."""
    q = connection.ops.quote_name
    seq, seen, pk, boot = (
        q(Node._meta.get_field(n).column) for n in ("last_seq", "last_seen", "id", "boot_id")
    )
    sql = (
        f"UPDATE {_table(Node)} SET {seq} = CASE WHEN {seq} < %s THEN %s ELSE {seq} END, {seen} = %s "
        f"WHERE {pk} = %s AND {boot} = %s"
    )
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    rows = [(top, top, now, node_id, boot_id) for (node_id, boot_id), top in highest.items()]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _columns(fields: list[models.Field], suffix: str = "") -> str:
    return ", ".join(connection.ops.quote_name(f.column) + suffix for f in fields)
