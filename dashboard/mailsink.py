"""The demo's local SMTP sink: `python -m dashboard.mailsink --port P --dir D` keeps every mail it receives
as one file in D (newest MAX_KEPT), so that the demo's alert mails can be read on a demo-only page
(/demo/mails/) without a real mail server. `runstack` starts it; production sends through EMAIL_HOST."""

from __future__ import annotations

import argparse
import asyncio
import email
import email.policy
import os
import signal
import time
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

MAX_KEPT = 200
MAX_MAIL_BYTES = 1024 * 1024


class Keeper:
    """aiosmtpd handler: writes each accepted message to its own file (0600), oldest dropped past MAX_KEPT."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.count = 0

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        self.count += 1
        path = self.directory / f"{time.time_ns()}-{self.count}.eml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(envelope.original_content or envelope.content)
        for old in sorted(self.directory.glob("*.eml"), key=_arrival)[:-MAX_KEPT]:
            old.unlink(missing_ok=True)
        return "250 OK: kept for the demo's mail page"


def _arrival(path: Path) -> int:
    return int(path.name.split("-", 1)[0])


@dataclass
class KeptMail:
    """A mail the sink kept, as the demo page shows it."""

    name: str
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"] or "")

    @property
    def recipients(self) -> str:
        return str(self.message["To"] or "")

    @property
    def date(self) -> str:
        return str(self.message["Date"] or "")

    @property
    def body(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        return part.get_content() if part is not None else ""


def kept_mails(directory: Path, limit: int = 50) -> list[KeptMail]:
    """The newest mails the sink kept in `directory`, newest first."""
    if not directory.is_dir():
        return []
    paths = sorted(directory.glob("*.eml"), key=_arrival, reverse=True)[:limit]
    return [KeptMail(p.name, _parse(p.read_bytes()[:MAX_MAIL_BYTES])) for p in paths]


def _parse(raw: bytes) -> EmailMessage:
    return email.message_from_bytes(raw, policy=email.policy.default)


def serve(port: int, directory: Path) -> None:
    from aiosmtpd.controller import Controller  # the demo's dependency only: imported where it runs

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    controller = Controller(
        Keeper(directory), hostname="127.0.0.1", port=port, data_size_limit=MAX_MAIL_BYTES
    )
    controller.start()
    print(f"SMTP sink on 127.0.0.1:{port}, keeping mails in {directory}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        loop.run_until_complete(stop.wait())
    finally:
        controller.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboard.mailsink", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    opts = parser.parse_args(argv)
    serve(opts.port, opts.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
