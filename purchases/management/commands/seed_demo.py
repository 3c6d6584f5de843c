"""``manage.py seed_demo``: the demo's users, its two organizers and an
event on sale for each (docs/api.md, "Authentication", the demo data)."""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from organizers.models import Membership, Organizer
from organizers.roles import Role
from organizers.services import member_add, organizer_create
from purchases.catalog import CategoryInput, SeatInput, event_create_with_seats, seat_grid
from purchases.models import Event

DEMO_EVENT = "boxoffice demo night"
DEFAULT_PASSWORD = "boxoffice"


@dataclass(frozen=True)
class DemoSeller:
    slug: str
    name: str
    owner: str
    event: str
    categories: tuple[CategoryInput, ...]
    seats: tuple[SeatInput, ...]


# Two sellers, so that one's data is seen to stay its own (docs/api.md,
# "Organizers and roles"): the demo venue (the default organizer the
# migrations gave existing events to) with the demo event, and a second one
# with an event of its own. alice owns the first, bob the second; each is
# a stranger to the other's. Both events are real seat maps (sections,
# rows, coordinates, categories, accessible places); the demo event keeps
# its 50 seats A1-E10 and 50.00 EUR for A1 (the docs' and the curl tour's
# purchase), riverside its 20 seats A1-B10.
SELLERS = (
    DemoSeller(
        slug="demo",
        name="Demo venue",
        owner="alice",
        event=DEMO_EVENT,
        categories=(
            CategoryInput(code="stalls", name="Stalls", price_amount=5000),
            CategoryInput(code="balcony", name="Balcony", price_amount=3500),
            CategoryInput(code="restricted", name="Balcony, restricted view", price_amount=2000),
        ),
        seats=(
            *seat_grid(
                section="Stalls",
                rows="ABC",
                seats_per_row=10,
                category="stalls",
                accessible=("A1", "A10"),
            ),
            # A row's gap between the stalls and the balcony on the map.
            *seat_grid(section="Balcony", rows="D", seats_per_row=10, category="balcony", top=4),
            *seat_grid(section="Balcony", rows="E", seats_per_row=10, category="restricted", top=5),
        ),
    ),
    DemoSeller(
        slug="riverside",
        name="Riverside Hall",
        owner="bob",
        event="riverside jazz evening",
        categories=(
            CategoryInput(code="floor", name="Floor tables", price_amount=4500),
            CategoryInput(code="gallery", name="Gallery", price_amount=3000),
        ),
        seats=(
            *seat_grid(
                section="Floor",
                rows="A",
                seats_per_row=10,
                category="floor",
                accessible=("A1", "A2"),
            ),
            *seat_grid(section="Gallery", rows="B", seats_per_row=10, category="gallery", top=2),
        ),
    ),
)


class Command(BaseCommand):
    help = (
        "Create the users alice, bob and admin (staff), the organizers demo (owner alice) "
        "with the demo event (50 seats A1-E10: stalls, balcony, restricted view) and "
        "riverside (owner bob) with an event of 20 seats A1-B10 (floor, gallery), both on "
        "sale. Running it twice changes nothing."
    )

    def handle(self, *args, **options):
        password = settings.DEMO_PASSWORD
        if password == DEFAULT_PASSWORD and not settings.DEBUG:
            raise CommandError(
                "refusing to create demo users with the default password while DEBUG is off: "
                "set DEMO_PASSWORD"
            )
        created = self._users(password)
        for seller in SELLERS:
            organizer = self._organizer(seller.slug, seller.name, seller.owner, created)
            # An event of that name is there already (a second run, or a
            # database seeded before seat maps): left as it is.
            if not Event.objects.filter(organizer=organizer, name=seller.event).exists():
                event = event_create_with_seats(
                    organizer=organizer,
                    name=seller.event,
                    starts_at=(timezone.now() + timedelta(days=30)).replace(
                        hour=20, minute=0, second=0, microsecond=0
                    ),
                    currency="EUR",
                    categories=seller.categories,
                    seats=seller.seats,
                )
                created.append(f"event {event.pk} with {len(seller.seats)} seats")
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
