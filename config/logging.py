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
