import json

from django.core.management.base import BaseCommand, CommandError

from purchases.ops.audit import INVARIANTS, audit_run
from purchases.ops.health import error_reason
from purchases.ops.metrics import database_named, database_unreachable


class Command(BaseCommand):
    help = (
        "Check every invariant (docs/design.md) across sagas, seats, ledger, outbox and the "
        "gateway's records (read through its API), record the run (AuditRun) and print the "
        "verdict per invariant, then each violation. Exits 1 when anything is violated, "
        "2 when nothing is but the run is incomplete (the gateway could not be asked about "
        "some intents) or the database could not be reached, 0 otherwise."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--stuck-after",
            type=int,
            default=None,
            metavar="SECONDS",
            help="grace for live sagas and undelivered emails (default "
            "RESUME_AFTER_SECONDS + PURCHASE_HOLD_SECONDS)",
        )

    def handle(self, *args, **options):
        try:
            report = audit_run(stuck_after_seconds=options["stuck_after"])
        except Exception as exc:
            if not database_unreachable(exc):
                raise  # a query that failed (a statement_timeout…): a bug, exit 1
            # Could not audit (2), as for a gateway that gives no answer: 1
            # would tell monitoring that invariants are broken. One line, no
            # traceback; the database by host, port and name, no credentials.
            raise CommandError(
                f"could not audit: the database at {database_named()} is unreachable "
                f"({error_reason(exc)})",
                returncode=2,
            ) from None
        summary = (
            f"audit run {report.run_id}: {report.sagas_checked} saga(s) checked, "
            f"{report.sagas_skipped} skipped (moved during the audit), "
            f"{report.intents_checked} intent(s) asked at the gateway, "
            f"{len(report.violations)} violation(s)"
        )
        if report.unverified:
            summary += (
                f"; incomplete: {len(report.unverified)} intent(s) not verified, the gateway "
                f"at {report.gateway_url} gave no answer"
            )
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            self._table(report)
            self.stdout.write(summary)
        if report.violations:
            raise CommandError(summary, returncode=1)
        if report.unverified:
            raise CommandError(summary, returncode=2)

    def _table(self, report) -> None:
        counts = report.counts
        width = max(len(name) for name in INVARIANTS)
        for name in INVARIANTS:
            verdict = "ok" if not counts[name] else str(counts[name])
            self.stdout.write(f"{name:<{width}}  {verdict}")
        if report.violations:
            self.stdout.write("")
            self.stdout.write(f"{'invariant':<{width}}  {'saga_id':<36}  {'intent_id':<20}  detail")
            for v in report.violations:
                self.stdout.write(
                    f"{v.invariant:<{width}}  {v.saga_id or '-':<36}  {v.intent_id or '-':<20}  "
                    f"{v.detail}"
                )
        if report.unverified:
            self.stdout.write("")
            self.stdout.write(
                f"incomplete: not verified, the gateway at {report.gateway_url} gave no answer:"
            )
            for u in report.unverified:
                self.stdout.write(f"  {u.saga_id or '-':<36}  {u.intent_id:<20}  {u.detail}")
