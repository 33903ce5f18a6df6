"""Personal API tokens: a user's credential for scripts. Only the SHA-256 is stored; the token is shown once.

A token acts as its user, never as more: its scope narrows what the user's role allows (`read` only reads;
`operate` may also plan, deploy, stop, restart and acknowledge, if the role allows it too).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

READ, OPERATE = "read", "operate"
SCOPES = [(READ, "read: look only"), (OPERATE, "operate: also plan, deploy, stop, restart, acknowledge")]
MAX_DAYS = 365
PREFIX = "lcu_"  # agent tokens start with lc_: the two are never confused in a log or a support ticket


class TokenRefused(Exception):
    """A presented API token that does not authenticate; the message says why (HTTP 401)."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="what the token is for, e.g. 'nightly deploy script'")
    scope = models.CharField(max_length=10, choices=SCOPES, default=READ)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField()
    revoked = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.prefix}… {self.name} ({self.user}, {self.scope})"

    @classmethod
    def issue(cls, user, name: str, scope: str, days: int) -> tuple[ApiToken, str]:
        """Create a token for `user`; return the row and the plaintext (never stored). ValueError on bad input."""
        name = (name or "").strip()
        if not name or len(name) > 100:
            raise ValueError("a token needs a name of 1-100 characters saying what it is for")
        if scope not in (READ, OPERATE):
            raise ValueError(f"unknown scope {scope!r}: choose {READ} or {OPERATE}")
        if not 1 <= days <= MAX_DAYS:
            raise ValueError(f"a token lives 1-{MAX_DAYS} days, not {days}")
        plaintext = PREFIX + secrets.token_urlsafe(32)
        expires = timezone.now() + timedelta(days=days)
        row = cls.objects.create(
            user=user,
            name=name,
            scope=scope,
            digest=_digest(plaintext),
            prefix=plaintext[:10],
            expires=expires,
        )
        return row, plaintext

    @classmethod
    def verify(cls, plaintext: str) -> ApiToken:
        """The token row (with its user) for a presented token; TokenRefused saying why it is not valid."""
        if not plaintext or len(plaintext) > 200:
            raise TokenRefused("no API token, or not one layercake issued")
        row = cls.objects.select_related("user").filter(digest=_digest(plaintext)).first()
        if row is None:
            raise TokenRefused("unknown API token")
        now = timezone.now()
        if row.revoked is not None:
            raise TokenRefused(f"this API token was revoked on {row.revoked:%Y-%m-%d %H:%M} UTC")
        if row.expires <= now:
            raise TokenRefused(f"this API token expired on {row.expires:%Y-%m-%d %H:%M} UTC")
        if not row.user.is_active:
            raise TokenRefused("the user of this API token is deactivated")
        cls.objects.filter(pk=row.pk).update(last_used=now)
        return row

    @property
    def may_operate(self) -> bool:
        return self.scope == OPERATE

    @property
    def is_valid(self) -> bool:
        return self.revoked is None and self.expires > timezone.now()

    def revoke(self) -> None:
        if self.revoked is None:
            self.revoked = timezone.now()
            self.save(update_fields=["revoked"])
