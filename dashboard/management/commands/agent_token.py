from django.core.management.base import BaseCommand, CommandError

from dashboard.models import AgentToken


class Command(BaseCommand):
    help = "Create NODE if needed and print a new agent token for it (shown once; stored hashed)."

    def add_arguments(self, parser):
        parser.add_argument("node")
        parser.add_argument("--revoke-others", action="store_true", help="revoke the node's earlier tokens")

    def handle(self, node: str, revoke_others: bool, **options):
        try:
            _, plaintext = AgentToken.issue_for(node, revoke_others)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(plaintext)
