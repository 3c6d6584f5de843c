from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.utils import timezone

from organizers.models import Membership, Organizer
from organizers.roles import Role
from purchases.availability import availability_bump
from purchases.models import Event, EventStatus, Seat

T = TypeVar("T")

if TYPE_CHECKING:
    # ``SomeFactory(...)`` returns the model instance (factory_boy's metaclass
    # makes it so, untyped): said here, for the type checker only.
    class ModelFactory(factory.django.DjangoModelFactory[T]):
        def __new__(cls, **kwargs: Any) -> T: ...  # type: ignore[misc]  # the metaclass's doing
else:
    ModelFactory = factory.django.DjangoModelFactory


class UserFactory(ModelFactory[User]):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("pw")


class OrganizerFactory(ModelFactory[Organizer]):
    class Meta:
        model = Organizer
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"organizer-{n}")
    name = factory.LazyAttribute(lambda o: f"The {o.slug} venue")


class MembershipFactory(ModelFactory[Membership]):
    class Meta:
        model = Membership

    organizer = factory.SubFactory(OrganizerFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.OWNER


class EventFactory(ModelFactory[Event]):
    class Meta:
        model = Event
        skip_postgeneration_save = True

    # The events of a test are one organizer's unless it says otherwise.
    organizer = factory.LazyFunction(lambda: OrganizerFactory(slug="default-venue"))
    name = factory.Sequence(lambda n: f"event {n}")
    starts_at = factory.LazyFunction(lambda: timezone.now() + timedelta(days=7))
    # On sale, as the tests' events were before events had a status.
    status = EventStatus.ON_SALE
    currency = "EUR"

    @factory.post_generation
    def seats(event: Event, create, extracted, **kwargs):  # the built Event, not the factory
        # EventFactory(seats=["A1", "A2"]) or the default: row A, seats 1-4.
        refs = extracted if extracted is not None else [f"A{n}" for n in range(1, 5)]
        price = kwargs.get("price", 2500)
        for ref in refs:
            SeatFactory(event=event, ref=ref, row=ref[0], number=int(ref[1:]), price_amount=price)
        if create:
            # As the product's event_create_with_seats on its commit: the
            # events list shows the new event at once, not a list a test
            # before this one cached (for AVAILABILITY_MAX_STALE_SECONDS).
            availability_bump(event.pk)


class SeatFactory(ModelFactory[Seat]):
    class Meta:
        model = Seat

    event = factory.SubFactory(EventFactory, seats=[])
    ref = factory.Sequence(lambda n: f"Z{n + 1}")
    row = factory.LazyAttribute(lambda s: s.ref[0])
    number = factory.LazyAttribute(lambda s: int(s.ref[1:]))
    price_amount = 2500
    currency = "EUR"
