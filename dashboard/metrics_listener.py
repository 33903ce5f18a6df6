"""`/metrics` on a socket of its own, answered by threads of the web process (LAYERCAKE_METRICS_LISTEN).

Why: when agent ingest saturates the web process's event loop (1,000 agents x 8 GPUs on a busy machine), a
scrape through Django waits there: up to 4 s for a render of 50-270 ms of CPU, against 0.2-0.6 s through this
listener (bench/README.md, /metrics). These threads never touch the event loop: the same access check (scrape_access.check_scrape), the same renderer and
a snapshot of this process's live state taken under its lock (metrics_views.render_scrape, telemetry.LiveState).

What one scrape shows: the fleet as the database has it (nodes, inventory, topology, deployments, alerts) and
this process's live state: the readings of the agents whose samples this process stored, its sockets and its
counters. With one web process that is the whole fleet. With WEB_CONCURRENCY=N each process takes the first
free port of port..port+N-1: scrape every port, one Prometheus target each (docs/production.md).

Started once per serving process by layercake/asgi.py, which the ASGI server imports (uvicorn in each worker;
not its --reload parent). A taken port is logged, not fatal: /metrics on the main port stays.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from django.conf import settings
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from dashboard import metrics_views
from dashboard.scrape_access import check_scrape

log = logging.getLogger(__name__)
MAX_CONNECTIONS = 16  # Prometheus keeps one; more than this get 503 instead of a thread each
IDLE_TIMEOUT_S = 30.0  # a client that sends nothing for this long is dropped
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class ScrapeHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive for Prometheus), GET /metrics only. Headers over the standard library's limits
    (a line over 64 KiB, more than 100 headers) get its 431, a request line over 64 KiB its 414."""

    protocol_version = "HTTP/1.1"
    server_version = "layercake-metrics"
    sys_version = ""
    timeout = IDLE_TIMEOUT_S

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path != "/metrics":
            return self.refuse(404, f"{path[:200]} is not here: this port serves /metrics only")
        verdict = check_scrape(self.client_host(), self.headers.get("Authorization", ""))
        if verdict.status != 200:
            return self.refuse(verdict.status, verdict.reason, verdict.challenge)
        try:
            text = metrics_views.render_scrape()
        except Exception:  # the database away, a bug: the scrape fails, the listener stays
            log.exception("/metrics (listener) failed to render")
            return self.answer(500, b"rendering /metrics failed; the server log has the error\n", close=True)
        self.answer(200, text, CONTENT_TYPE_PLAIN_0_0_4)

    def refuse_method(self) -> None:
        self.refuse(405, f"{self.command} is not allowed: GET /metrics", allow="GET")

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = refuse_method

    def refuse(self, status: int, reason: str, challenge: str = "", allow: str = "") -> None:
        log.warning("/metrics (listener) refused %s %s to %s: %s", self.command, self.path[:200],
                    self.client_host() or "?", reason)  # fmt: skip
        headers = {"WWW-Authenticate": challenge, "Allow": allow}
        self.answer(status, f"{reason}\n".encode(), close=True, **{k: v for k, v in headers.items() if v})

    def answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
               close: bool = False, **headers: str) -> None:  # fmt: skip
        # A refused request's body (a POST's) is never read: close instead of parsing it as the next request.
        self.send_response(status)
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **headers}
        for name, value in headers.items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def client_host(self) -> str:
        """The peer, or behind a trusted proxy (FORWARDED_ALLOW_IPS) the client it names, as uvicorn takes it:
        the right-most X-Forwarded-For address that is not a trusted proxy."""
        peer = self.client_address[0]
        forwarded = self.headers.get("X-Forwarded-For", "") if self.headers else ""
        if not forwarded or not trusted_proxy(peer):
            return peer
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        return next((hop for hop in reversed(hops) if not trusted_proxy(hop)), hops[0] if hops else peer)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the standard library's name)
        log.debug("/metrics (listener) %s: " + format, self.client_address[0], *args)

    def log_error(self, format: str, *args: object) -> None:  # noqa: A002
        log.warning("/metrics (listener) %s: " + format, self.client_address[0], *args)


def trusted_proxy(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in settings.FORWARDED_ALLOW_IPS)


class ListenerServer(ThreadingHTTPServer):
    """One thread per connection (daemon: they never hold up the process's exit), at most MAX_CONNECTIONS."""

    daemon_threads = True
    block_on_close = False  # closing does not wait for an idle keep-alive connection's thread

    def __init__(self, address: tuple[str, int]) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, ScrapeHandler)

    def process_request(self, request: socket.socket, client_address: object) -> None:
        if not self.slots.acquire(blocking=False):
            request.sendall(BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class ListenerServerV6(ListenerServer):
    address_family = socket.AF_INET6


def start(host: str, ports: range) -> ListenerServer | None:
    """Bind the first free port of `ports` and serve it in a daemon thread; None (logged) when all are taken."""
    server_class = ListenerServerV6 if ":" in host else ListenerServer
    for port in ports:
        try:
            server = server_class((host, port))
        except OSError as exc:
            log.info("/metrics listener: %s port %s: %s", host, port, exc.strerror)
            continue
        threading.Thread(target=server.serve_forever, name=f"metrics-listener-{port}", daemon=True).start()
        log.info("/metrics listener on %s port %s (this process's live state)", host, port)
        return server
    log.error("LAYERCAKE_METRICS_LISTEN: no free port in %s %s..%s; this process serves /metrics on its main "
              "port only", host, ports.start, ports.stop - 1)  # fmt: skip
    return None


def stop(server: ListenerServer) -> None:
    server.shutdown()
    server.server_close()


_started: list[ListenerServer | None] = []
_starting = threading.Lock()


def start_from_settings() -> ListenerServer | None:
    """The process's listener, started on the first call when LAYERCAKE_METRICS_LISTEN is set."""
    if settings.METRICS_LISTEN is None:
        return None
    with _starting:
        if not _started:
            host, port = settings.METRICS_LISTEN
            _started.append(start(host, range(port, port + settings.WEB_PROCESSES)))
        return _started[0]
