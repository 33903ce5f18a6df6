"""Logging filters named in settings.LOGGING."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied


class RefusalWithoutTraceback(logging.Filter):
    """A 403 for a role that may not act is an expected answer, not a fault: keep Django's one warning line and
    drop the traceback, or a viewer's refused clicks fill the server log with tracebacks that look like bugs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], PermissionDenied):
            record.exc_info = None
        return True
