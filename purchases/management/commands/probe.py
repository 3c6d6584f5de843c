import json

from django.core.management.base import BaseCommand, CommandError

from purchases.ops.health import CHECKS, readiness


class Command(BaseCommand):
    help = (
        "Readiness of this process's dependencies, for the health checks of the processes "
        "that serve no HTTP (worker, relay, beat): the checks of /readyz, all of them or those "
        "named. Prints /readyz's JSON body; exits 0 when every check passes, 1 otherwise."
    )
    # A probe runs every few seconds: no system checks (they import every
    # outbox consumer), and a failing one must not make the process look down.
    requires_system_checks = []

    def add_arguments(self, parser):
        # (No argparse choices: Python 3.11 checks an empty list against them.)
        parser.add_argument(
            "checks", nargs="*", metavar="CHECK", help=f"one of {', '.join(CHECKS)} (default: all)"
        )

    def handle(self, *args, checks=(), **options):
        unknown = sorted(set(checks) - set(CHECKS))
        if unknown:
            raise CommandError(
                f"unknown check {', '.join(unknown)}; the checks are {', '.join(CHECKS)}",
                returncode=2,
            )
        result = readiness(checks or CHECKS)
        self.stdout.write(json.dumps(result.as_dict()))
        if not result.ok:
            raise CommandError(
                "not ready: "
                + "; ".join(f"{name}: {result.checks[name].detail}" for name in result.failed),
                returncode=1,
            )
