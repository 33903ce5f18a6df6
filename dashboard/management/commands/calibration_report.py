"""Write the fleet calibration (factors in use, sample counts, accuracy) into docs/placement.md."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from dashboard import calibration

START, END = "<!-- fleet-calibration:start -->", "<!-- fleet-calibration:end -->"


def replace_section(text: str, body: str) -> str:
    """`text` with the part between the markers replaced by `body`."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise CommandError(f"the file must hold one '{START}' line followed by one '{END}' line")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{body}{END}{tail}"


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--output", default=str(Path(settings.BASE_DIR) / "docs" / "placement.md"))
        parser.add_argument("--print", action="store_true", help="print the section instead of writing it")

    def handle(self, *args: object, **options: object) -> None:
        when = timezone.now().strftime("%Y-%m-%d %H:%M UTC")
        body = calibration.markdown_report(calibration.calibration_rows(), when)
        if options["print"]:
            self.stdout.write(body)
            return
        path = Path(str(options["output"]))
        try:
            path.write_text(replace_section(path.read_text(encoding="utf-8"), body), encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot update {path}: {exc.strerror}") from None
        self.stdout.write(f"wrote the fleet calibration ({len(body.splitlines())} lines) into {path}")
