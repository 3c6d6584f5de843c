"""Structured log lines: ``level logger message key=value ...``, or one
JSON object per line (``LOG_FORMAT=json``) for log shippers.

Anything passed in ``extra={...}`` (``saga_id`` above all) is rendered as
``key=value`` (a key of the object) so that ``grep saga_id=<uuid>`` finds
every line about a saga; with tracing on, a line written inside a span also
carries its ``trace_id`` and ``span_id`` (``config/tracing.py`` adds them).
"""

import json
import logging
from datetime import UTC, datetime

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record)} {record.levelname} {record.name} {record.getMessage()}"
        extras = _extras(record)
        if extras:
            base += " " + " ".join(f"{k}={v}" for k, v in sorted(extras.items()))
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback included, as the
    ``exception`` key): ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, then the extras. A value JSON cannot hold is its ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, tz=UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in sorted(_extras(record).items()):
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class DropMessages(logging.Filter):
    """Drops the records whose message starts with one of ``prefixes``: a
    library's notice that says nothing about this deployment (LOGGING in
    config/settings.py names which, and why; docs/operations.md, "Logs")."""

    def __init__(self, prefixes: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)
