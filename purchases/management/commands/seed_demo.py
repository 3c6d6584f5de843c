from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from purchases.models import Event
from purchases.services import event_create_with_seats

DEMO_EVENT = "boxoffice demo night"
DEFAULT_PASSWORD = "boxoffice"


class Command(BaseCommand):
    help = (
        "Create the demo event (50 seats, rows A-E, 1-10) and the users alice, bob and admin "
        "(staff). Running it twice changes nothing."
    )

    def handle(self, *args, **options):
        password = settings.DEMO_PASSWORD
        if password == DEFAULT_PASSWORD and not settings.DEBUG:
            raise CommandError(
                "refusing to create demo users with the default password while DEBUG is off: "
                "set DEMO_PASSWORD"
            )
        User = get_user_model()
        created = []
        with transaction.atomic(durable=True):
            for username, staff in (("alice", False), ("bob", False), ("admin", True)):
                if User.objects.filter(username=username).exists():
                    continue
                User.objects.create_user(
                    username=username,
                    email=f"{username}@example.com",
                    password=password,
                    is_staff=staff,
                    is_superuser=staff,
                )
                created.append(username)
        if not Event.objects.filter(name=DEMO_EVENT).exists():
            event = event_create_with_seats(
                name=DEMO_EVENT,
                starts_at=(timezone.now() + timedelta(days=30)).replace(
                    hour=20, minute=0, second=0, microsecond=0
                ),
            )
            created.append(f"event {event.pk} with 50 seats")
        self.stdout.write(
            "seed_demo: " + (", ".join(f"created {c}" for c in created) or "nothing to do")
        )
