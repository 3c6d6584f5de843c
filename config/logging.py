"""Structured log lines: ``level logger message key=value ...``.

Anything passed in ``extra={...}`` (``saga_id`` above all) is rendered as
``key=value`` so that ``grep saga_id=<uuid>`` finds every line about a saga.
"""

import logging

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record)} {record.levelname} {record.name} {record.getMessage()}"
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extras:
            base += " " + " ".join(f"{k}={v}" for k, v in sorted(extras.items()))
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


class DropMessages(logging.Filter):
    """Drops the records whose message starts with one of ``prefixes``: a
    library's notice that says nothing about this deployment (LOGGING in
    config/settings.py names which, and why; docs/operations.md, "Logs")."""

    def __init__(self, prefixes: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)
