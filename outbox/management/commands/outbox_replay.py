"""``manage.py outbox_replay``: replay dead letters, backfill a consumer.

A thin caller of :func:`outbox.services.outbox_replay`: it parses the filters,
prints one line per message and a total.
"""

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from outbox.services import ReplayRefused, outbox_replay


def _iso_time(option: str, value: str) -> dt.datetime:
    try:
        at = parse_datetime(value)
        day = None if at else parse_date(value)
    except ValueError:
        at = day = None
    if day is not None:
        at = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    if at is None:
        raise CommandError(
            f"{option} {value!r} is not an ISO 8601 time (e.g. 2026-12-02T12:00:00Z or 2026-12-02)"
        )
    return at if timezone.is_aware(at) else at.replace(tzinfo=dt.UTC)


class Command(BaseCommand):
    help = (
        "Replay dead letters through the inbox (consumers that already ran are skipped): "
        "each selected row is made due again with its redelivery schedule restarted. With "
        "--consumer, also backfill that consumer: completed messages of its topics that it "
        "has not processed are delivered to it (and to nothing else)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--id",
            dest="ids",
            type=int,
            action="append",
            metavar="ID",
            help="this message (repeatable)",
        )
        parser.add_argument("--topic", help="messages of this topic only")
        parser.add_argument(
            "--consumer",
            metavar="DOTTED.PATH",
            help="a consumer as routed in OUTBOX_CONSUMERS: dead letters it "
            "has not processed, and a backfill of its topics' history",
        )
        parser.add_argument(
            "--since", help="created at or after this ISO 8601 time (UTC unless it says otherwise)"
        )
        parser.add_argument("--until", help="created before this ISO 8601 time")
        parser.add_argument("--reason", default="", help="why (goes to the log line)")
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would be replayed; change nothing"
        )

    def handle(
        self,
        *args,
        ids=None,
        topic=None,
        consumer=None,
        since=None,
        until=None,
        reason="",
        dry_run=False,
        **options,
    ):
        try:
            result = outbox_replay(
                ids=ids,
                topic=topic,
                consumer=consumer,
                since=_iso_time("--since", since) if since else None,
                until=_iso_time("--until", until) if until else None,
                dry_run=dry_run,
                operator="manage.py outbox_replay",
                reason=reason,
            )
        except ReplayRefused as exc:
            raise CommandError(str(exc)) from exc
        for line in result.lines:
            created = line.created_at.isoformat() if line.created_at else "-"
            head = f"#{line.message_id} {line.topic or '-'} created {created}"
            if line.refused:
                self.stdout.write(f"{head}: refused: {line.refused}")
                continue
            text = f"{head} {line.kind}: runs {', '.join(line.runs) or 'nothing (it completes)'}"
            if line.skips:
                text += f"; skips {', '.join(line.skips)} (already ran)"
            self.stdout.write(text)
        total = len(result.replayed)
        verb = "would be replayed (dry run)" if dry_run else "replayed"
        refused = f", {len(result.refused)} refused" if result.refused else ""
        self.stdout.write(f"{total} message(s) {verb}{refused}")
