"""Personal API tokens: made and revoked on the settings page and by `manage.py api_token`; shown once."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from dashboard import roles
from dashboard.models import ApiToken
from tests.personas import person

pytestmark = pytest.mark.django_db


@pytest.fixture
def olga(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return person("olga", roles.OPERATOR)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def shown_token(page: str) -> str | None:
    found = re.search(r'<pre id="new-token">(lcu_[^<]+)</pre>', page)
    return found.group(1) if found else None


def api_status(token: str) -> int:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/nodes/").status_code


def test_it_shows_a_new_token_once_on_the_settings_page_and_it_works(olga):
    browser = logged_in(olga)
    page = browser.post("/account/tokens/", {"action": "create", "name": "ci", "scope": "operate", "days": 7})
    token = shown_token(page.content.decode())
    assert token and api_status(token) == 200
    row = ApiToken.objects.get(user=olga)
    assert (row.name, row.scope, (row.expires - row.created).days) == ("ci", "operate", 6)
    again = browser.get("/account/tokens/").content.decode()
    assert shown_token(again) is None and token not in again and row.prefix in again


def test_it_refuses_a_bad_expiry_on_the_settings_page_and_makes_nothing(olga):
    page = logged_in(olga).post(
        "/account/tokens/", {"action": "create", "name": "ci", "scope": "read", "days": 400}
    )
    assert "less than or equal to 365" in page.content.decode() and not ApiToken.objects.exists()


def test_it_revokes_from_the_settings_page_and_only_ones_own(olga):
    _, token = ApiToken.issue(olga, "ci", "read", 30)
    other = person("otto", roles.OPERATOR)
    assert (
        logged_in(other)
        .post("/account/tokens/", {"action": "revoke", "token": ApiToken.objects.get().pk})
        .status_code
        == 404
    )
    assert api_status(token) == 200
    logged_in(olga).post("/account/tokens/", {"action": "revoke", "token": ApiToken.objects.get().pk})
    assert api_status(token) == 401


def test_it_issues_lists_and_revokes_from_the_command_line(olga):
    out = StringIO()
    call_command("api_token", "olga", "--scope", "operate", "--days", "3", "--name", "nightly", stdout=out)
    token = out.getvalue().strip()
    assert token.startswith("lcu_") and api_status(token) == 200
    listing = StringIO()
    call_command("api_token", "olga", "--list", stdout=listing)
    assert (
        token[:10] in listing.getvalue()
        and "operate" in listing.getvalue()
        and token not in listing.getvalue()
    )
    call_command("api_token", "olga", "--revoke", token[:10], stdout=StringIO())
    assert api_status(token) == 401


@pytest.mark.parametrize(
    "args, says",
    [
        (["nobody"], "no user 'nobody'"),
        (["olga", "--days", "0"], "1-365 days"),
        (["olga", "--name", " "], "name of 1-100"),
        (["olga", "--revoke", "lcu_nothing"], "no unrevoked token"),
    ],
)
def test_it_refuses_bad_command_input_and_makes_nothing(olga, args, says):
    with pytest.raises(CommandError, match=says):
        call_command("api_token", *args, stdout=StringIO())
    assert not ApiToken.objects.exists()


def test_it_lets_an_admin_revoke_anyones_token_in_the_admin(olga):
    _, token = ApiToken.issue(olga, "ci", "read", 30)
    action = {"action": "revoke", "_selected_action": [ApiToken.objects.get().pk], "index": "0"}
    assert logged_in(olga).post("/admin/dashboard/apitoken/", action).status_code == 302  # to the admin login
    assert api_status(token) == 200
    ada = logged_in(person("ada", roles.ADMIN))
    listing = ada.get("/admin/dashboard/apitoken/").content.decode()
    assert token[:10] in listing and token not in listing
    ada.post("/admin/dashboard/apitoken/", action)
    assert api_status(token) == 401
