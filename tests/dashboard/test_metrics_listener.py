"""The metrics listener (LAYERCAKE_METRICS_LISTEN) driven through a real socket: who gets in, what else is refused,
and that a refusal changes nothing."""

from __future__ import annotations

import http.client
import ipaddress
import socket

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents.sim.gpus import SimSource
from dashboard import ingest, metrics_listener, stack
from dashboard.models import Node
from dashboard.stack import free_port
from layercake import settings as layercake_settings
from tests.dashboard.test_metrics_endpoint import TOKEN, hello_of, live, report, scrape_settings  # noqa: F401

pytestmark = pytest.mark.usefixtures("transactional_db")
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def listener(live, scrape_settings):  # noqa: F811 (the fixtures imported above)
    port = free_port()
    server = metrics_listener.start("127.0.0.1", range(port, port + 1))
    assert server is not None
    yield server
    metrics_listener.stop(server)


def request(server, method: str = "GET", path: str = "/metrics", headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_it_answers_a_token_with_the_families_of_the_live_state(live, listener):  # noqa: F811
    source = SimSource("a30x4")
    node = Node.objects.create(name="a30-seed")
    readings = report(live, node, source, ingest.apply_hello(node, hello_of(source)), 1)
    status, headers, body = request(listener, headers=BEARER)
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    temps = {s.labels["gpu"]: s.value for s in families["layercake_gpu_temperature_celsius"].samples}
    assert temps == {str(r.index): r.temp_c for r in readings}
    assert {"layercake_gpu_link_info", "layercake_node_status", "layercake_alerts_open"} <= set(families)
    assert live.scrapes == 1


def test_it_leaves_out_readings_this_process_stopped_storing_while_the_node_is_online(live, listener):  # noqa: F811
    """Several web processes: the node's agent moved to another one, which keeps it online in the database."""
    source = SimSource("rtx4090x2")
    node = Node.objects.create(name="rtx4090-box")
    report(live, node, source, ingest.apply_hello(node, hello_of(source)), 1)
    live.stored_at[node.pk] -= 3 * node.stale_after().total_seconds()
    Node.objects.filter(pk=node.pk).update(last_seen=timezone.now())
    families = {
        f.name: f for f in text_string_to_metric_families(request(listener, headers=BEARER)[2].decode())
    }
    assert families["layercake_gpu_temperature_celsius"].samples == []
    online = [s for s in families["layercake_node_status"].samples if s.labels["status"] == "online"]
    assert [(s.labels["node"], s.value) for s in online] == [("rtx4090-box", 1.0)]


def test_it_keeps_the_connection_for_the_next_scrape(live, listener):  # noqa: F811
    connection = http.client.HTTPConnection("127.0.0.1", listener.server_address[1], timeout=30)
    for _ in range(2):
        connection.request("GET", "/metrics", headers=BEARER)
        response = connection.getresponse()
        assert response.status == 200 and b"layercake_metrics_scrapes_total" in response.read()
    connection.close()
    assert live.scrapes == 2


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ({}, 401, "a bearer token is required"),
        ({"Authorization": "Bearer not-the-token"}, 401, "wrong token"),
        ({"Authorization": "Bearer " + "x" * 600}, 401, "wrong token"),
    ],
)
def test_it_refuses_no_or_a_wrong_token_with_401(live, listener, headers, status, says):  # noqa: F811
    got, response_headers, body = request(listener, headers=headers)
    assert (got, body.decode()) == (status, f"{says}\n")
    assert response_headers["WWW-Authenticate"].startswith('Bearer realm="layercake metrics"')
    assert live.scrapes == 0


def test_it_refuses_an_address_not_allowed_with_403_when_no_token_is_set(live, listener, settings):  # noqa: F811
    settings.METRICS_TOKEN_SHA256 = ""
    status, _, body = request(listener, headers={"Authorization": "Bearer anything-at-all-here"})
    assert status == 401
    status, _, body = request(listener)
    assert status == 403 and b"127.0.0.1 is not allowed to scrape (LAYERCAKE_METRICS_ALLOW)" in body
    assert live.scrapes == 0


def test_it_takes_the_client_from_x_forwarded_for_only_from_a_trusted_proxy(live, listener, settings):  # noqa: F811
    """Behind nginx the peer is 127.0.0.1 and the client is the right-most address nginx appended."""
    settings.METRICS_TOKEN_SHA256 = ""  # the allowed network 10.0.0.0/8 is the only way in
    assert request(listener, headers={"X-Forwarded-For": "10.1.2.3"})[0] == 200
    # nginx appended the address it saw; the one before it is only the client's claim
    assert request(listener, headers={"X-Forwarded-For": "10.1.2.3, 203.0.113.9"})[0] == 403
    settings.FORWARDED_ALLOW_IPS = [ipaddress.ip_network("192.0.2.0/24")]  # 127.0.0.1 is not a trusted proxy
    assert request(listener, headers={"X-Forwarded-For": "10.1.2.3"})[0] == 403
    assert live.scrapes == 1


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/", 404, None),
        ("GET", "/metrics/", 404, None),
        ("GET", "/admin/", 404, None),
        ("HEAD", "/metrics", 405, "GET"),
        ("POST", "/metrics", 405, "GET"),
        ("DELETE", "/metrics", 405, "GET"),
        ("BREW", "/metrics", 501, None),
    ],
)
def test_it_refuses_other_paths_and_methods(live, listener, method, path, status, allow):  # noqa: F811
    got, headers, _ = request(listener, method, path, BEARER)
    assert got == status and headers.get("Allow") == allow
    assert live.scrapes == 0


def test_it_answers_a_query_string_on_metrics(live, listener):  # noqa: F811
    assert request(listener, path="/metrics?name[]=up", headers=BEARER)[0] == 200


def test_it_refuses_an_oversized_header_with_431(live, listener):  # noqa: F811
    status, _, body = request(listener, headers={**BEARER, "X-Padding": "x" * 70_000})
    assert status == 431 and b"Line too long" in body
    assert live.scrapes == 0


def test_it_refuses_a_post_body_without_reading_it_as_the_next_request(live, listener):  # noqa: F811
    with socket.create_connection(("127.0.0.1", listener.server_address[1]), timeout=30) as sock:
        smuggled = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        head = f"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {len(smuggled)}\r\n\r\n"
        sock.sendall((head + smuggled).encode())
        answer = b"".join(iter(lambda: sock.recv(65536), b""))  # the server closes after its one answer
    assert answer.startswith(b"HTTP/1.1 405") and answer.count(b"HTTP/1.1") == 1
    assert live.scrapes == 0


def test_it_takes_the_next_port_when_one_is_taken_and_none_when_all_are(live, scrape_settings):  # noqa: F811
    """Several web processes: each binds the first free port of port..port+N-1."""
    port = free_port()
    first = metrics_listener.start("127.0.0.1", range(port, port + 2))
    second = metrics_listener.start("127.0.0.1", range(port, port + 2))
    third = metrics_listener.start("127.0.0.1", range(port, port + 2))
    try:
        assert (first.server_address[1], second.server_address[1], third) == (port, port + 1, None)
        assert request(second, headers=BEARER)[0] == 200
    finally:
        metrics_listener.stop(first)
        metrics_listener.stop(second)


def test_it_serves_ipv6(live, scrape_settings):  # noqa: F811
    port = free_port()
    try:
        server = metrics_listener.start("::1", range(port, port + 1))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    if server is None:
        pytest.skip("no IPv6 loopback here")
    try:
        connection = http.client.HTTPConnection("::1", server.server_address[1], timeout=30)
        connection.request("GET", "/metrics")  # ::1 is in the allowed networks
        assert connection.getresponse().status == 200
    finally:
        metrics_listener.stop(server)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:9108", ("127.0.0.1", 9108)), ("[::1]:9108", ("::1", 9108)), ("", None)],
)
def test_it_reads_the_listen_setting(monkeypatch, value, expected):
    monkeypatch.setenv("LAYERCAKE_METRICS_LISTEN", value)
    assert layercake_settings.envlisten("LAYERCAKE_METRICS_LISTEN") == expected


@pytest.mark.parametrize("value", ["9108", "localhost:9108", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000"])
def test_it_refuses_a_bad_listen_setting_naming_it(monkeypatch, value):
    monkeypatch.setenv("LAYERCAKE_METRICS_LISTEN", value)
    with pytest.raises(
        ImproperlyConfigured, match="LAYERCAKE_METRICS_LISTEN must be an IP address and a port"
    ):
        layercake_settings.envlisten("LAYERCAKE_METRICS_LISTEN")


def test_it_starts_once_per_process_and_not_without_the_setting(monkeypatch, settings):
    monkeypatch.setattr(metrics_listener, "_started", [])
    settings.METRICS_LISTEN = None
    assert metrics_listener.start_from_settings() is None and metrics_listener._started == []
    settings.METRICS_LISTEN, settings.WEB_PROCESSES = ("127.0.0.1", free_port()), 1
    server = metrics_listener.start_from_settings()
    try:
        assert server is not None and metrics_listener.start_from_settings() is server
    finally:
        metrics_listener.stop(server)


@pytest.mark.slow
def test_it_gives_each_of_several_web_processes_its_own_port(server_env, log_dir):
    """uvicorn --workers 2 with WEB_CONCURRENCY=2: each process listens on one of the two ports and counts its
    own scrapes (its own live state)."""
    port, base = free_port(), free_port()
    env = {**server_env, "WEB_CONCURRENCY": "2", "LAYERCAKE_METRICS_LISTEN": f"127.0.0.1:{base}"}
    env |= {"LAYERCAKE_METRICS_TOKEN": TOKEN}
    service = stack.asgi_service(port, env, log_dir)
    service.argv += ["--workers", "2"]
    service.start()
    try:
        for listen in (base, base + 1):
            stack.wait_for_port(listen, timeout=60, proc=service.proc)
        urls = [f"http://127.0.0.1:{listen}/metrics" for listen in (base, base + 1)]
        counted = [scrapes_counted(urls[0]) for _ in range(3)] + [scrapes_counted(urls[1])]
        assert counted == [0, 1, 2, 0]  # the second process answered none of the first's three
    finally:
        service.stop()


def scrapes_counted(url: str) -> float:
    body = httpx.get(url, headers=BEARER, timeout=60).text
    return next(
        float(line.split()[1]) for line in body.splitlines() if line.startswith("layercake_metrics_scrapes_")
    )
