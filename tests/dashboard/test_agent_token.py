import hashlib
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dashboard.models import AgentToken, Node

pytestmark = pytest.mark.django_db


def issue(name: str, *args: str) -> str:
    out = StringIO()
    call_command("agent_token", name, *args, stdout=out)
    return out.getvalue().strip()


def test_it_creates_the_node_and_prints_a_token_stored_only_hashed():
    token = issue("a30-seed")
    row = AgentToken.objects.get()
    assert row.node.name == "a30-seed"
    assert row.digest == hashlib.sha256(token.encode()).hexdigest()
    assert token not in (row.digest, row.prefix)
    assert AgentToken.authenticate(token) == row.node


def test_it_can_revoke_the_earlier_tokens():
    first = issue("a30-seed")
    second = issue("a30-seed", "--revoke-others")
    assert AgentToken.authenticate(first) is None
    assert AgentToken.authenticate(second) == Node.objects.get()


@pytest.mark.parametrize("name", ["bad name", "a;rm -rf /", "", "x" * 64])
def test_it_refuses_a_bad_node_name(name):
    with pytest.raises(CommandError, match="bad node name"):
        issue(name)
    assert not Node.objects.exists()
