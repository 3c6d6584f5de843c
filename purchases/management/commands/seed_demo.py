from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from organizers.models import Membership, Organizer
from organizers.roles import Role
from organizers.services import member_add, organizer_create
from purchases.models import Event
from purchases.services import event_create_with_seats

DEMO_EVENT = "boxoffice demo night"
DEFAULT_PASSWORD = "boxoffice"
# Two sellers, so that one's data is seen to stay its own (docs/api.md,
# "Organizers and roles"): the demo venue (the default organizer the
# migrations gave existing events to) with the demo event, and a second one
# with an event of its own. alice owns the first, bob the second; each is
# a stranger to the other's.
ORGANIZERS = (
    # slug, name, owner, event, rows, seats per row
    ("demo", "Demo venue", "alice", DEMO_EVENT, "ABCDE", 10),
    ("riverside", "Riverside Hall", "bob", "riverside jazz evening", "AB", 10),
)


class Command(BaseCommand):
    help = (
        "Create the users alice, bob and admin (staff), the organizers demo (owner alice) "
        "with the demo event (50 seats, rows A-E, 1-10) and riverside (owner bob) with an "
        "event of 20 seats (rows A-B). Running it twice changes nothing."
    )

    def handle(self, *args, **options):
        password = settings.DEMO_PASSWORD
        if password == DEFAULT_PASSWORD and not settings.DEBUG:
            raise CommandError(
                "refusing to create demo users with the default password while DEBUG is off: "
                "set DEMO_PASSWORD"
            )
        created = self._users(password)
        for slug, name, owner, event_name, rows, per_row in ORGANIZERS:
            organizer = self._organizer(slug, name, owner, created)
            if not Event.objects.filter(organizer=organizer, name=event_name).exists():
                event = event_create_with_seats(
                    organizer=organizer,
                    name=event_name,
                    starts_at=(timezone.now() + timedelta(days=30)).replace(
                        hour=20, minute=0, second=0, microsecond=0
                    ),
                    rows=rows,
                    seats_per_row=per_row,
                )
                created.append(f"event {event.pk} with {len(rows) * per_row} seats")
        self.stdout.write(
            "seed_demo: " + (", ".join(f"created {c}" for c in created) or "nothing to do")
        )

    def _users(self, password: str) -> list[str]:
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
        return created

    def _organizer(self, slug: str, name: str, owner: str, created: list[str]) -> Organizer:
        """The organizer ``slug``, made with ``owner`` as its owner if it is
        not there; one that is there without members (the default organizer
        the migrations made for the events before organizers) gets ``owner``."""
        organizer = Organizer.objects.filter(slug=slug).first()
        if organizer is None:
            organizer = organizer_create(slug=slug, name=name, owner=self._user(owner)).organizer
            created.append(f"organizer {slug} (owner {owner})")
        elif not Membership.objects.filter(organizer=organizer).exists():
            member_add(organizer=organizer, username=owner, role=Role.OWNER)
            created.append(f"owner {owner} of {slug}")
        return organizer

    def _user(self, username: str):
        return get_user_model().objects.get(username=username)
