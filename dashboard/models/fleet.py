"""Fleet models: nodes, their agent tokens, GPUs, links and samples."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from agents import protocol
from dashboard.choices import LinkClass, NodeStatus

node_name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", "Node names are 1-63 letters, digits, dots, dashes or underscores."
)


class Node(models.Model):
    """A GPU server with one agent. Inventory and topology come from the agent's hello."""

    name = models.CharField(max_length=63, unique=True, validators=[node_name_validator])
    hostname = models.CharField(max_length=200, blank=True)
    simulated = models.BooleanField(default=False)
    gpu_source = models.CharField(max_length=10, blank=True)
    agent_version = models.CharField(max_length=protocol.MAX_NAME_CHARS, blank=True)
    driver_version = models.CharField(max_length=protocol.MAX_VERSION_CHARS, blank=True)
    cuda_version = models.CharField(max_length=protocol.MAX_VERSION_CHARS, blank=True)
    interval_s = models.FloatField(default=1.0)
    # The inference engines its agent can launch, as the hello lists them: [{"backend", "version", "detail"}]
    # (version None: installed, version unknown). The planner's default vLLM release for this node.
    engines = models.JSONField(default=list, blank=True)
    topology = models.JSONField(null=True, blank=True)
    network_gbps = models.FloatField(default=10.0, help_text="this node's link to the other nodes, Gbit/s")
    rdma = models.BooleanField(default=False, help_text="InfiniBand/RoCE between nodes")
    address = models.CharField(
        max_length=253,
        blank=True,
        help_text="where the other nodes reach this one "
        "(multi-node deployments); blank: the hostname its agent reported",
    )
    # Hash of the last hello's GPUs and topology: a reconnecting agent with the same hardware costs one UPDATE.
    inventory_digest = models.CharField(max_length=64, blank=True, editable=False)
    # Replay bookkeeping: the agent process (boot_id) and the highest sequence number stored from it.
    boot_id = models.CharField(max_length=64, blank=True)
    last_seq = models.BigIntegerField(default=0)
    connected = models.BooleanField(default=False)
    last_seen = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("node", args=[self.name])

    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.interval_s * settings.STALE_AFTER_INTERVALS)

    def status(self, now: datetime | None = None) -> str:
        return node_status(self.last_seen, self.interval_s, self.connected, now or timezone.now())

    def status_color(self) -> str:
        return NodeStatus.color(self.status())

    @property
    def reach_address(self) -> str:
        return self.address or self.hostname

    def status_label(self) -> str:
        return NodeStatus.label(self.status())


def node_status(last_seen: datetime | None, interval_s: float, connected: bool, now: datetime) -> str:
    """A node's state from its row's fields (the fleet page reads rows, not Node instances)."""
    if last_seen is None:
        return NodeStatus.NEW
    if now - last_seen <= timedelta(seconds=interval_s * settings.STALE_AFTER_INTERVALS):
        return NodeStatus.ONLINE
    return NodeStatus.STALE if connected else NodeStatus.OFFLINE


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


LAST_USED_STEP = timedelta(minutes=1)  # an agent token's last_used is written at most this often


class AgentToken(models.Model):
    """A node's credential. Only its SHA-256 is stored; the token itself is shown once, at creation."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    revoked = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.node.name}{', revoked' if self.revoked else ''})"

    @classmethod
    def issue(cls, node: Node) -> tuple[AgentToken, str]:
        """Create a token for `node`; return the row and the plaintext (never stored)."""
        plaintext = "lc_" + secrets.token_urlsafe(32)
        row = cls.objects.create(node=node, digest=_digest(plaintext), prefix=plaintext[:10])
        return row, plaintext

    @classmethod
    def issue_for(cls, node_name: str, revoke_others: bool = False) -> tuple[AgentToken, str]:
        """A token for the node of that name, created if needed (`manage.py agent_token`, the API); ValueError
        naming what is wrong with a bad node name."""
        candidate = Node(name=node_name)
        try:
            candidate.full_clean(validate_unique=False)
        except ValidationError as exc:
            raise ValueError(f"bad node name {node_name!r}: {'; '.join(exc.message_dict['name'])}") from None
        node, _ = Node.objects.get_or_create(name=node_name)
        if revoke_others:
            for token in node.tokens.filter(revoked=None):
                token.revoke()
        return cls.issue(node)

    @classmethod
    def authenticate(cls, plaintext: str) -> Node | None:
        """The node a valid, unrevoked token belongs to, or None."""
        row = cls.authenticate_token(plaintext)
        return None if row is None else row.node

    @classmethod
    def authenticate_token(cls, plaintext: str) -> AgentToken | None:
        """The valid, unrevoked token row (with its node), or None."""
        return cls.authenticate_tokens([plaintext])[0]

    @classmethod
    def authenticate_tokens(cls, plaintexts: list[str]) -> list[AgentToken | None]:
        """`authenticate_token` of several connections at once (a reconnect wave), in one indexed read.
        Nothing is cached: a revocation counts from the next connect on. The node's topology (its largest
        column) is not read: connecting does not need it, the hello reads the node."""
        digests = [_digest(p) if p and len(p) <= 200 else "" for p in plaintexts]
        found = cls.objects.select_related("node").defer("node__topology").filter(revoked=None)
        rows = found.in_bulk({d for d in digests if d}, field_name="digest")
        now = timezone.now()
        stale = [
            row for row in rows.values() if row.last_used is None or now - row.last_used >= LAST_USED_STEP
        ]
        if (
            stale
        ):  # a write per connect was a write per agent in a reconnect wave; a minute's precision will do
            cls.objects.filter(pk__in=[row.pk for row in stale]).update(last_used=now)
            for row in stale:
                row.last_used = now
        return [rows.get(digest) for digest in digests]

    def revoke(self) -> None:
        self.revoked = timezone.now()
        self.save(update_fields=["revoked"])


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=200)
    name = models.CharField(max_length=200)
    pci_bus_id = models.CharField(max_length=64, blank=True)
    memory_total_mib = models.PositiveIntegerField()
    numa_node = models.IntegerField(null=True, blank=True)
    power_limit_w = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index")]

    def __str__(self) -> str:
        return f"{self.node.name} GPU{self.index} ({self.name})"


class NodeModel(models.Model):
    """A model the node's agent found in its --model-dir folders (reported in its hello; replaced each time)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="local_models")
    path = models.CharField(max_length=1024)
    name = models.CharField(max_length=200)
    format = models.CharField(max_length=8)  # hf or gguf
    architecture = models.CharField(max_length=200, blank=True)
    quantization = models.CharField(max_length=200, blank=True)
    size_bytes = models.BigIntegerField(default=0)
    size_label = models.CharField(max_length=200, blank=True)
    config = models.JSONField(null=True, blank=True)  # the config.json keys the planner reads (hf only)

    class Meta:
        ordering = ["name", "node", "path"]
        constraints = [models.UniqueConstraint(fields=["node", "path"], name="nodemodel_unique_path")]

    def __str__(self) -> str:
        return f"{self.name} on {self.node.name} ({self.path})"


class Link(models.Model):
    """One unordered pair of devices (GPU or NIC) on a node, as nvidia-smi topo labels it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="links")
    # as long as the protocol allows (agents.protocol.TopoLink): a longer value would be refused by PostgreSQL
    a = models.CharField(max_length=protocol.MAX_NAME_CHARS)
    b = models.CharField(max_length=protocol.MAX_NAME_CHARS)
    link = models.CharField(max_length=protocol.MAX_LINK_CHARS)
    p2p_read = models.CharField(max_length=protocol.MAX_LINK_CHARS, blank=True)
    p2p_write = models.CharField(max_length=protocol.MAX_LINK_CHARS, blank=True)

    class Meta:
        ordering = ["node", "a", "b"]
        constraints = [models.UniqueConstraint(fields=["node", "a", "b"], name="link_unique_pair")]

    def __str__(self) -> str:
        return f"{self.node.name} {self.a}-{self.b} {self.link}"

    @property
    def link_class(self) -> str:
        return LinkClass.of(self.link)


class RealField(models.FloatField):
    """A 4-byte float (`real`): a rollup keeps a tenth of a percent or a watt, not 15 digits, in half the bytes
    of a double on PostgreSQL (SQLite stores every float in 8 bytes, or fewer when it is a whole number)."""

    def db_type(self, connection: Any) -> str:
        return "real"


class GpuSample(models.Model):
    """One raw sample, kept SAMPLE_RETENTION_HOURS (default 1): the live charts and hang evidence. Longer
    ranges read the minute and hour rollups (dashboard/storage.py)."""

    # Readings as 4-byte floats (RealField): NVML reports whole percent, MiB and milliwatts; 36 bytes a row
    # less on PostgreSQL. No index of its own: the unique (gpu, t) index serves every lookup by GPU.
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples", db_index=False)
    t = models.DateTimeField()
    seq = models.BigIntegerField()
    util_gpu = RealField()
    util_mem = RealField()
    mem_used_mib = RealField()
    mem_free_mib = RealField()
    temp_c = RealField()
    power_w = RealField()
    power_limit_w = RealField(null=True, blank=True)
    sm_clock_mhz = RealField(null=True, blank=True)
    mem_clock_mhz = RealField(null=True, blank=True)
    throttle_reasons = models.BigIntegerField(default=0)
    ecc_corrected = models.BigIntegerField(null=True, blank=True)
    ecc_uncorrected = models.BigIntegerField(null=True, blank=True)
    xids = models.JSONField(default=list, blank=True)
    processes = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["gpu", "t"]
        constraints = [models.UniqueConstraint(fields=["gpu", "t"], name="sample_unique_time")]
        # The few samples that carry XID errors, by time: the fleet's XID rule reads only these, every second.
        indexes = [models.Index(fields=["t"], name="sample_xid_time", condition=~models.Q(xids=[]))]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.t:%H:%M:%S}"


# The rolled-up metrics, named after GpuSample's columns: what the charts draw.
ROLLUP_METRICS = ("util_gpu", "util_mem", "mem_used_mib", "temp_c", "power_w")


class GpuRollup(models.Model):
    """min/avg/max of each chart metric of one GPU over one bucket (a minute or an hour), built incrementally
    from the raw samples by dashboard/storage.py. Keyed by (gpu, start) alone: no surrogate id, no other index."""

    pk = models.CompositePrimaryKey("gpu", "start")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+", db_index=False)
    start = models.IntegerField(help_text="the bucket's start, unix seconds")
    n = models.IntegerField(help_text="raw samples in the bucket")
    util_gpu_min = RealField()
    util_gpu_avg = RealField()
    util_gpu_max = RealField()
    util_mem_min = RealField()
    util_mem_avg = RealField()
    util_mem_max = RealField()
    mem_used_mib_min = RealField()
    mem_used_mib_avg = RealField()
    mem_used_mib_max = RealField()
    temp_c_min = RealField()
    temp_c_avg = RealField()
    temp_c_max = RealField()
    power_w_min = RealField()
    power_w_avg = RealField()
    power_w_max = RealField()

    class Meta:
        abstract = True


class GpuMinute(GpuRollup):
    """Kept MINUTE_RETENTION_DAYS (default 7): the 6 h and 24 h charts."""

    SECONDS = 60


class GpuHour(GpuRollup):
    """Kept HOUR_RETENTION_DAYS (default 90): the 7 d and 90 d charts."""

    SECONDS = 3600


class RollupRun(models.Model):
    """One run of the rollup. `seen_id`: the highest sample id when it started; the next run rolls up to there
    (an ingest transaction that held lower ids has committed by then). `rolled_id`: rows up to here are in
    both tiers, so retention may delete them."""

    t = models.DateTimeField(default=timezone.now, db_index=True)
    seen_id = models.BigIntegerField()
    rolled_id = models.BigIntegerField()

    class Meta:
        ordering = ["-t", "-pk"]


class LogChunk(models.Model):
    """Lines of a log tail an agent sent in one message (agent output, later inference servers)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="log_chunks")
    source = models.CharField(max_length=200)
    # The agent process that sent it: its sequence numbers start again at 1 when it restarts.
    boot_id = models.CharField(max_length=64, blank=True)
    seq = models.BigIntegerField()
    t = models.DateTimeField()
    lines = models.JSONField()

    class Meta:
        ordering = ["node", "t"]
        indexes = [models.Index(fields=["node", "source", "t"], name="log_node_source_time")]
        constraints = [models.UniqueConstraint(fields=["node", "boot_id", "seq"], name="log_unique_boot_seq")]

    def __str__(self) -> str:
        return f"{self.node.name} {self.source} ({len(self.lines)} lines)"
