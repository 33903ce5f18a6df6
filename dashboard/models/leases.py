"""State every server process shares through the database: leases that keep a periodic task from running twice
at once (one row per task name; on SQLite a file lock beside the database instead), and event counts for rate
limits (one row per counted key)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from django.db import connection, models, transaction
from django.db.models import F
from django.utils import timezone


class TaskLease(models.Model):
    """Held by the run of `name` that claimed it until `until`; a run that dies holding it loses it then."""

    name = models.CharField(primary_key=True, max_length=100)
    until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} until {self.until:%H:%M:%S}"

    @classmethod
    def claim(cls, name: str, seconds: float, now: datetime | None = None) -> datetime | None:
        """Take the lease for `seconds` unless a run holds it: a conditional UPDATE only one claimer wins.
        Returns the lease's end (the claim's token for `release`), or None if another run holds it."""
        now = now or timezone.now()
        until = now + timedelta(seconds=seconds)
        cls.objects.get_or_create(name=name, defaults={"until": now - timedelta(seconds=1)})
        won = cls.objects.filter(name=name, until__lt=now).update(until=until)
        return until if won == 1 else None

    @classmethod
    def release(cls, name: str, until: datetime) -> None:
        """Give the lease back, unless it ran out and another run claimed it since."""
        cls.objects.filter(name=name, until=until).update(until=timezone.now() - timedelta(seconds=1))


@contextmanager
def held(name: str, seconds: float) -> Iterator[bool]:
    """True for the one run that holds the lease `name` (for up to `seconds`), False for a run that finds it
    held. On SQLite every process is on the database's host, and a claim's UPDATE would wait for SQLite's one
    writer (ingest flushes, the rollup): at 1,000 agents x 8 GPUs that wait, not the work, made evaluate_fleet's
    slowest runs (claim p90 36 ms, max 185 ms; the evaluation itself 16-38 ms). A file lock waits for nobody,
    and goes with its process when it dies; a run that hangs keeps it, as it keeps its worker's one slot."""
    if connection.vendor == "sqlite":
        with file_lock(lock_path(name)) as mine:
            yield mine
        return
    until = TaskLease.claim(name, seconds)
    try:
        yield until is not None
    finally:
        if until is not None:
            TaskLease.release(name, until)


def lock_path(name: str) -> Path:
    """The lease's lock file, beside the SQLite database (one set of leases per database)."""
    return Path(f"{connection.settings_dict['NAME']}.{name}.lock")


@contextmanager
def file_lock(path: Path) -> Iterator[bool]:
    """An exclusive lock on `path` if no other open file holds one (never waits)."""
    with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o600)) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RateCount(models.Model):
    """Events counted under `key` in a window that began with the first of them and ends at `window_end`.
    In the database, so that every web process counts the same events (a per-process cache would let each
    process allow the limit again)."""

    key = models.CharField(primary_key=True, max_length=300)
    window_end = models.DateTimeField(db_index=True)
    count = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key}: {self.count} until {self.window_end:%H:%M:%S}"

    @classmethod
    def hit(cls, key: str, window_s: float, now: datetime | None = None) -> int:
        """Count one event under `key`; return how many it has had in its window, this one included.
        Ended windows are dropped first (the next event starts a new one), which also keeps the table small."""
        now = now or timezone.now()
        with transaction.atomic():
            cls.objects.filter(window_end__lte=now).delete()
            cls.objects.get_or_create(key=key, defaults={"window_end": now + timedelta(seconds=window_s)})
            cls.objects.filter(key=key).update(count=F("count") + 1)
            return cls.objects.values_list("count", flat=True).get(key=key)
