from django.core.management.base import BaseCommand

from purchases.ops.sweeps import sweep_resume


class Command(BaseCommand):
    help = (
        "Drive again every live saga not moved for --older-than seconds (default "
        "RESUME_AFTER_SECONDS) and not waiting on a timer, from its current state, with its "
        "existing intent id."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=int, default=None, metavar="SECONDS")
        parser.add_argument("--dry-run", action="store_true", help="say what, change nothing")
        parser.add_argument("--limit", type=int, default=None, metavar="N")

    def handle(self, *args, older_than=None, dry_run=False, limit=None, **options):
        report = sweep_resume(older_than=older_than, limit=limit, dry_run=dry_run)
        for line in report.lines:
            self.stdout.write(f"{line.saga_id}  {line.state:<20} {line.why}  -> {line.result}")
        verb = "would resume" if dry_run else "resumed"
        self.stdout.write(f"{verb} {len(report.lines)} saga(s)")
