import signal

from django.core.management.base import BaseCommand

from config import tracing
from outbox.relay import relay_run, relay_tick


class Command(BaseCommand):
    help = "Run the outbox relay: hand due outbox rows and timers to Celery."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--poll", type=float, default=None, help="poll interval (seconds)")

    def handle(self, *args, once=False, poll=None, **options):
        # Its hand-overs only: a pass's queries belong to no purchase.
        tracing.tracing_init(instrument=tracing.PUBLISHER)
        if once:
            self.stdout.write(f"relayed {relay_tick()} message(s)")
            return
        stopping = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.append(True))
        relay_run(stop=lambda: bool(stopping), poll=poll)
