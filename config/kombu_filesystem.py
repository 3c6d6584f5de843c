"""kombu's filesystem transport (the embedded broker of make run), with its
exchange tables created, locked and read in that order.

kombu creates an exchange's file (``open("wb")``) and only then locks it; a
second process that finds the file in between reads it empty and fails with
``JSONDecodeError``: make run lost a worker that way when two started at once
(tests/test_embedded_broker.py). Here the file is opened with ``O_CREAT`` and
no truncation, locked, and only then read; an empty file is an empty table.
Everything else is kombu's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.transport.filesystem import (  # type: ignore[attr-defined]  # LOCK_*: not in the stubs
    LOCK_EX,
    LOCK_SH,
    exchange_queue_t,
    lock,
    unlock,
)
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads


def _table(raw: bytes) -> list[exchange_queue_t]:
    return [exchange_queue_t(*q) for q in loads(bytes_to_str(raw))] if raw.strip() else []


class Channel(filesystem.Channel):
    if TYPE_CHECKING:  # kombu's own method, missing from kombu-stubs

        def _exchange_file(self, exchange: str) -> Path: ...

    def get_table(self, exchange):
        file = self._exchange_file(exchange)
        try:
            with file.open("rb", buffering=0) as f_obj:
                lock(f_obj, LOCK_SH)
                try:
                    return _table(f_obj.read())
                finally:
                    unlock(f_obj)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        queue_val = exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            # "a+b": created if missing, never truncated by the open itself.
            with file.open("a+b", buffering=0) as f_obj:
                lock(f_obj, LOCK_EX)
                try:
                    f_obj.seek(0)
                    queues = _table(f_obj.read())
                    if queue_val not in queues:
                        queues.insert(0, queue_val)
                        f_obj.truncate(0)  # then append-mode writes start at 0
                        f_obj.write(str_to_bytes(dumps(queues)))
                finally:
                    unlock(f_obj)
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc


class Transport(filesystem.Transport):
    Channel = Channel
