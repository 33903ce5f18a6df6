"""`manage.py set_role NAME --role viewer|operator|admin`: move an existing user into one role."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboard import roles


class Command(BaseCommand):
    help = "Put an existing user in exactly one role (admins also get staff status for the Django admin)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=roles.ROLE_NAMES)

    def handle(self, username: str, role: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}; create one with `manage.py create_user`")
        roles.assign_role(user, role)
        self.stdout.write(f"{username} is now {role}")
