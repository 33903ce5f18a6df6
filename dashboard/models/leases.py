"""State every server process shares through the database: leases that keep a periodic task from running twice
at once (one row per task name), and event counts for rate limits (one row per counted key)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models, transaction
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
