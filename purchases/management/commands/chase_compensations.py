from django.core.management.base import BaseCommand

from purchases.ops.heartbeats import sweeps_stalled
from purchases.ops.sweeps import sweep_chase


class Command(BaseCommand):
    help = (
        "Alert (ERROR log with saga_id, metric, outbox purchase.needs_operator) for compensations "
        "pending longer than --deadline seconds (default COMPENSATION_DEADLINE_SECONDS) and "
        "for UNKNOWN_EXPIRED sagas: once per saga per escalation. Also reports stalled sweeps."
    )

    def add_arguments(self, parser):
        parser.add_argument("--deadline", type=int, default=None, metavar="SECONDS")

    def handle(self, *args, deadline=None, **options):
        lines = sweep_chase(deadline=deadline)
        for line in lines:
            verdict = "ALERT raised" if line.alerted else "already alerted"
            self.stdout.write(f"{line.saga_id}  {line.state:<20} {verdict}")
        raised = sum(line.alerted for line in lines)
        self.stdout.write(f"{len(lines)} saga(s) need an operator; {raised} new alert(s)")
        for name in sweeps_stalled():
            self.stderr.write(f"sweep stalled: {name}")
