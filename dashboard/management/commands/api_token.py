from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboard.models import ApiToken
from dashboard.models.api_tokens import MAX_DAYS, OPERATE, READ


class Command(BaseCommand):
    help = (
        "Print a new personal API token for USER (shown once; stored hashed), list USER's tokens (--list), or "
        "revoke one by its prefix (--revoke lcu_XXXXXX)."
    )

    def add_arguments(self, parser):
        parser.add_argument("user")
        parser.add_argument("--name", default="script", help="what the token is for")
        parser.add_argument("--scope", choices=(READ, OPERATE), default=READ)
        parser.add_argument("--days", type=int, default=90, help=f"lifetime, 1-{MAX_DAYS} days")
        parser.add_argument(
            "--list", dest="show_list", action="store_true", help="list the user's tokens (never the secret)"
        )
        parser.add_argument("--revoke", metavar="PREFIX", help="revoke the user's token with this prefix")

    def handle(
        self, user: str, name: str, scope: str, days: int, show_list: bool, revoke: str | None, **options
    ):
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"no user {user!r}")
        if show_list:
            for row in ApiToken.objects.filter(user=owner):
                state = "revoked" if row.revoked else "valid" if row.is_valid else "expired"
                self.stdout.write(
                    f"{row.prefix}  {row.scope:<7}  {state:<7}  expires {row.expires:%Y-%m-%d}  {row.name}"
                )
            return
        if revoke:
            self.revoke(owner, revoke)
            return
        try:
            _, plaintext = ApiToken.issue(owner, name, scope, days)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(plaintext)

    def revoke(self, owner, prefix: str) -> None:
        rows = ApiToken.objects.filter(user=owner, prefix=prefix[:10], revoked=None)
        if not rows:
            raise CommandError(f"{owner.get_username()} has no unrevoked token starting {prefix!r}")
        for row in rows:
            row.revoke()
        self.stdout.write(f"revoked {prefix[:10]}")
