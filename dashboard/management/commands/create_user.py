"""`manage.py create_user NAME --role viewer|operator|admin [--email ADDRESS]`: a login in one role."""

from __future__ import annotations

import os
import secrets
import sys

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from dashboard import roles

PASSWORD_ENV = "LAYERCAKE_PASSWORD"


class Command(BaseCommand):
    help = (
        f"Create a user in a role. The password comes from ${PASSWORD_ENV}, or from standard input with "
        "--password-stdin; otherwise one is generated and printed once."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=roles.ROLE_NAMES)
        parser.add_argument("--email", default="", help="alert mail goes here")
        parser.add_argument(
            "--password-stdin", action="store_true", help="read the password from standard input"
        )

    def handle(self, username: str, role: str, email: str, password_stdin: bool, **options):
        user_model = get_user_model()
        if user_model.objects.filter(username=username).exists():
            raise CommandError(f"user {username!r} exists already; change its role with `manage.py set_role`")
        password, generated = self.password(password_stdin)
        user = user_model(username=username, email=email)
        try:
            user.full_clean(exclude=["password"])
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError(f"cannot create {username!r}: {'; '.join(exc.messages)}") from None
        with transaction.atomic():
            user.set_password(password)
            user.save()
            roles.assign_role(user, role)
        self.stdout.write(f"created {username} ({role})")
        if generated:
            self.stdout.write(f"password (shown once): {password}")

    def password(self, from_stdin: bool) -> tuple[str, bool]:
        if from_stdin:
            password = sys.stdin.readline().rstrip("\n")
            if not password:
                raise CommandError("--password-stdin: standard input had no password")
            return password, False
        if os.environ.get(PASSWORD_ENV):
            return os.environ[PASSWORD_ENV], False
        return secrets.token_urlsafe(12), True
