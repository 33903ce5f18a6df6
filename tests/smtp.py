"""A real SMTP server for tests (aiosmtpd on a free port) that keeps what it receives."""

from __future__ import annotations

import email
import email.policy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import EmailMessage

from aiosmtpd.controller import Controller

from dashboard import stack


class Inbox:
    """aiosmtpd handler: parsed messages in arrival order; addresses in `refuse` get a permanent 550."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.messages: list[EmailMessage] = []
        self.refuse = refuse
        self.port = 0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 - aiosmtpd's name
        if address in self.refuse:
            return "550 5.1.1 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        self.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 OK"

    def subjects(self) -> list[str]:
        return [str(m["Subject"]) for m in self.messages]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.messages) >= count, (
            f"{len(self.messages)} mails arrived, expected {count}: {self.subjects()}"
        )
        return self.messages


@contextmanager
def smtp_server(refuse: tuple[str, ...] = ()) -> Iterator[Inbox]:
    inbox = Inbox(refuse)
    inbox.port = stack.free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=inbox.port)
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()
