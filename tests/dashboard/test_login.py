"""Logging in: lockout after repeated wrong passwords (django-axes), and password-reset mails that are rationed."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core import mail
from django.test import Client
from django.utils import timezone

from dashboard import roles
from dashboard.models import RateCount
from tests.personas import person

pytestmark = pytest.mark.django_db
PASSWORD = "pia-pw-123"


@pytest.fixture(autouse=True)
def quick_settings(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_FAILURE_LIMIT, settings.AXES_COOLOFF_TIME = 5, timedelta(minutes=15)
    settings.PASSWORD_RESET_LIMIT, settings.PASSWORD_RESET_WINDOW_S = 3, 3600


@pytest.fixture
def pia(db):
    return person("pia", roles.OPERATOR, password=PASSWORD)


def log_in(username: str, password: str, address: str = "10.0.0.1", url: str = "/accounts/login/"):
    client = Client(REMOTE_ADDR=address)
    response = client.post(url, {"username": username, "password": password})
    return response, "_auth_user_id" in client.session


def test_it_locks_a_username_out_from_an_address_after_five_wrong_passwords(pia):
    for _ in range(4):
        response, logged_in = log_in("pia", "wrong")
        assert response.status_code == 200 and not logged_in and "didn't match" in response.content.decode()
    response, logged_in = log_in("pia", "wrong")
    assert response.status_code == 429 and not logged_in
    response, logged_in = log_in("pia", PASSWORD)  # the right password, too late
    text = response.content.decode()
    assert response.status_code == 429 and not logged_in and 'id="locked-out"' in text
    assert "Too many failed logins for pia from your address" in text and "(5 in a row)" in text
    assert "locked for 15 minutes" in text


def test_it_locks_the_admin_login_too(pia):
    for _ in range(5):
        log_in("pia", "wrong")
    response, logged_in = log_in("pia", PASSWORD, url="/admin/login/")
    assert response.status_code == 429 and not logged_in


def test_it_keeps_other_addresses_and_other_usernames_out_of_the_lockout(pia):
    person("quinn", roles.VIEWER, password="quinn-pw-123")
    for _ in range(5):
        log_in("pia", "wrong", address="10.0.0.1")
    assert not log_in("pia", PASSWORD, address="10.0.0.1")[1]
    assert log_in("pia", PASSWORD, address="10.0.0.2")[1]
    assert log_in("quinn", "quinn-pw-123", address="10.0.0.1")[1]


def test_it_lets_the_user_in_again_after_the_cooloff(pia):
    for _ in range(5):
        log_in("pia", "wrong")
    assert not log_in("pia", PASSWORD)[1]
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16)
    )
    assert log_in("pia", PASSWORD)[1]


def test_it_forgets_failures_after_a_successful_login(pia):
    for _ in range(4):
        log_in("pia", "wrong")
    assert log_in("pia", PASSWORD)[1]
    for _ in range(4):
        log_in("pia", "wrong")
    assert log_in("pia", PASSWORD)[1]
    for _ in range(5):
        log_in("pia", "wrong")
    assert not log_in("pia", PASSWORD)[1]


def test_it_reads_the_lockout_and_reset_limits_from_the_environment():
    env = {
        **os.environ,
        "LOGIN_FAILURE_LIMIT": "3",
        "LOGIN_COOLOFF_MINUTES": "2",
        "PASSWORD_RESET_LIMIT": "7",
    }
    code = (
        "from layercake import settings as s; "
        "print(s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME.total_seconds(), s.PASSWORD_RESET_LIMIT)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "120.0", "7"]


# ---- password reset ----------------------------------------------------------------------------------------
def ask_reset(email: str, address: str = "10.0.0.1"):
    return Client(REMOTE_ADDR=address).post("/accounts/password_reset/", {"email": email})


def test_it_sends_at_most_three_reset_mails_per_address_and_says_why_it_stops(pia):
    responses = [ask_reset("pia@example.com", address=f"10.0.1.{i}") for i in range(6)]
    assert [r.status_code for r in responses] == [302, 302, 302, 200, 200, 200]
    assert len(mail.outbox) == 3 and all(m.to == ["pia@example.com"] for m in mail.outbox)
    assert "Too many password reset requests for this address or from your network: no mail was sent" in (
        responses[3].content.decode()
    )


def test_it_limits_reset_requests_from_one_client_across_addresses(pia):
    person("quinn", roles.VIEWER)
    statuses = [
        ask_reset(email).status_code
        for email in ("nobody@example.com", "someone@example.com", "quinn@example.com", "pia@example.com")
    ]
    assert statuses == [302, 302, 302, 200] and [m.to for m in mail.outbox] == [["quinn@example.com"]]
    assert ask_reset("pia@example.com", address="10.0.0.9").status_code == 302 and len(mail.outbox) == 2


def test_it_counts_addresses_without_an_account_so_the_refusal_tells_nothing(pia):
    for address in ("10.0.2.1", "10.0.2.2", "10.0.2.3"):
        assert ask_reset("Nobody@Example.com", address=address).status_code == 302
    refused = ask_reset("nobody@example.com", address="10.0.2.4")
    assert refused.status_code == 200 and "Too many password reset requests" in refused.content.decode()
    assert not mail.outbox


def test_it_starts_a_new_window_once_the_last_one_ended(pia):
    start = timezone.now()
    assert [RateCount.hit("k", 60, now=start + timedelta(seconds=s)) for s in (0, 10, 59)] == [1, 2, 3]
    assert RateCount.hit("k", 60, now=start + timedelta(seconds=60)) == 1
    assert RateCount.hit("other", 60, now=start + timedelta(seconds=200)) == 1
    assert list(RateCount.objects.values_list("key", flat=True)) == ["other"]  # ended windows are dropped
