"""Leases that keep a periodic task from running twice at once (one row per task name)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
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
