"""Webhook endpoints for tests: a real local HTTP server that records the JSON bodies it receives."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver(ThreadingHTTPServer):
    """A webhook endpoint answering with the given status codes in turn (the last one repeats)."""

    def __init__(self, codes: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.codes, self.bodies = codes, []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class ReceiverHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        code = self.server.codes[min(len(self.server.bodies), len(self.server.codes)) - 1]
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass
