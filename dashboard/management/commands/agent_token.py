from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from dashboard.models import AgentToken, Node


class Command(BaseCommand):
    help = "Create NODE if needed and print a new agent token for it (shown once; stored hashed)."

    def add_arguments(self, parser):
        parser.add_argument("node")
        parser.add_argument("--revoke-others", action="store_true", help="revoke the node's earlier tokens")

    def handle(self, node: str, revoke_others: bool, **options):
        candidate = Node(name=node)
        try:
            candidate.full_clean(validate_unique=False)
        except ValidationError as exc:
            raise CommandError(f"bad node name {node!r}: {'; '.join(exc.message_dict['name'])}") from None
        row, _ = Node.objects.get_or_create(name=node)
        if revoke_others:
            for token in row.tokens.filter(revoked=None):
                token.revoke()
        _, plaintext = AgentToken.issue(row)
        self.stdout.write(plaintext)
