"""The password-reset limit holds across server processes: two real uvicorn processes on one database, the
requests for one address alternating between them, and the fourth is refused (each process counting alone
would have let four through, two each)."""

from __future__ import annotations

import httpx
import pytest

from dashboard import stack
from tests.harness import csrf_post

pytestmark = pytest.mark.slow


def ask_reset(url: str, email: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as client:
        client.get("/accounts/password_reset/")
        return csrf_post(client, "/accounts/password_reset/", {"email": email})


def test_it_counts_reset_requests_of_every_process_together(live_stack, server_env, tmp_path):
    port = stack.free_port()
    env = {**server_env, "PASSWORD_RESET_LIMIT": "3", "PASSWORD_RESET_WINDOW_S": "3600"}
    live_stack.stop_server()
    live_stack.env = env
    live_stack.start_server()
    other = stack.asgi_service(port, env, tmp_path).start()
    try:
        stack.wait_for_port(port, proc=other.proc)
        urls = [live_stack.url, f"http://127.0.0.1:{port}"] * 2
        answers = [ask_reset(url, "nobody@example.com") for url in urls]
    finally:
        other.stop()
    assert [a.status_code for a in answers] == [302, 302, 302, 200]
    assert "Too many password reset requests" in answers[3].text
