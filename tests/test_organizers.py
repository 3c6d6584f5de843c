"""Organizers, their members and roles (docs/api.md, "Organizers and
roles"): the API's answers, the rules the services keep (a slug's form, at
least one owner, no delete while there are events), the organizer-scoped
webhook endpoints and what they are sent, the data migration, the admin.

Who may use which route is tests/test_organizer_scoping.py's: it walks every
route under /api/organizers/{slug}/ as a stranger and as each role.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from organizers import selectors, services
from organizers.errors import OrganizerConflict, OrganizerNotFound
from organizers.models import Membership, Organizer
from organizers.roles import MAY, Action, Role
from purchases.models import Event
from purchases.services import saga_charge
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services import webhook_endpoint_create, webhook_publish

from .conftest import start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory

ORGANIZERS = "/api/organizers/"


def _api(user) -> APIClient:
    client = APIClient()
    client.default_format = "json"
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def alice_api(alice):
    return _api(alice)


@pytest.fixture
def anon_api():
    client = APIClient()
    client.default_format = "json"
    return client


def _member(organizer: Organizer, role: Role, username: str | None = None):
    user = UserFactory(**({"username": username} if username else {}))
    MembershipFactory(organizer=organizer, user=user, role=role)
    return user


def _roles(organizer: Organizer) -> dict[str, str]:
    return dict(
        Membership.objects.filter(organizer=organizer).values_list("user__username", "role")
    )


@pytest.fixture(autouse=True)
def _webhook_settings(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True


# --- the matrix -----------------------------------------------------------------------


def test_the_matrix_is_the_contracts():
    # docs/api.md, "Organizers and roles": the table, row by row.
    o, m, f, d = Role.OWNER, Role.MANAGER, Role.FINANCE, Role.DOOR
    assert MAY == {
        Action.VIEW_ORGANIZER: {o, m, f, d},
        Action.DELETE_ORGANIZER: {o},
        Action.MANAGE_MEMBERS: {o},
        Action.MANAGE_EVENTS: {o, m},
        Action.MANAGE_WEBHOOKS: {o, m},
        Action.READ_SALES: {o, m, f},
        Action.REFUND: {o, f},
        Action.CANCEL_EVENT: {o},
        Action.CHECK_IN: {o, m, d},
    }


# --- creating and listing ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_signed_in_user_creates_an_organizer_and_owns_it(alice, alice_api):
    answer = alice_api.post(ORGANIZERS, {"slug": "riverside", "name": " Riverside Hall "})

    assert answer.status_code == 201
    assert answer.json() == {"slug": "riverside", "name": "Riverside Hall", "role": "owner"}
    assert _roles(Organizer.objects.get(slug="riverside")) == {"alice": "owner"}


@pytest.mark.django_db
def test_the_list_is_the_callers_organizers_with_their_role(alice, bob, alice_api):
    mine = OrganizerFactory(slug="b-hall", name="B Hall")
    door = OrganizerFactory(slug="a-club", name="A Club")
    MembershipFactory(organizer=mine, user=alice, role=Role.OWNER)
    MembershipFactory(organizer=door, user=alice, role=Role.DOOR)
    MembershipFactory(organizer=OrganizerFactory(slug="bobs"), user=bob, role=Role.OWNER)

    answer = alice_api.get(ORGANIZERS)

    assert answer.status_code == 200
    assert answer.json() == [
        {"slug": "a-club", "name": "A Club", "role": "door"},
        {"slug": "b-hall", "name": "B Hall", "role": "owner"},
    ]


@pytest.mark.django_db
def test_without_credentials_it_is_401(anon_api):
    assert anon_api.get(ORGANIZERS).status_code == 401
    assert anon_api.post(ORGANIZERS, {"slug": "x", "name": "X"}).status_code == 401
    assert anon_api.get(f"{ORGANIZERS}demo/members/").status_code == 401


@pytest.mark.parametrize(
    "slug",
    ["", "Riverside", "river side", "-river", "river-", "river_side", "a" * 51, "rïver", "a\x00b"],
)
@pytest.mark.django_db
def test_a_bad_slug_is_400_naming_it(alice_api, slug):
    answer = alice_api.post(ORGANIZERS, {"slug": slug, "name": "A name"})

    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid" and answer.json()["field"] == "slug"
    assert not Organizer.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"slug": "ok", "name": "  "}, "name"),
        ({"slug": "ok", "name": "x" * 201}, "name"),
        ({"slug": "ok"}, "name"),
        ({"name": "ok"}, "slug"),
    ],
)
@pytest.mark.django_db
def test_a_missing_or_empty_field_is_400_naming_it(alice_api, body, field):
    answer = alice_api.post(ORGANIZERS, body)

    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("invalid", field)


@pytest.mark.django_db
def test_a_taken_slug_is_400_naming_it_and_changes_nothing(alice_api, bob):
    OrganizerFactory(slug="riverside", name="Theirs")

    answer = alice_api.post(ORGANIZERS, {"slug": "riverside", "name": "Mine"})

    assert answer.status_code == 400 and answer.json()["field"] == "slug"
    assert "taken" in answer.json()["detail"]
    assert Organizer.objects.get(slug="riverside").name == "Theirs"
    assert not Membership.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_creates_of_one_slug_at_once_make_one_organizer(alice, bob):
    """The slug is unique in the database: the create that loses the race is
    told the slug is taken, not a server error."""
    arrived = threading.Barrier(2)
    outcomes: list[str] = []

    def create(user):
        arrived.wait()
        try:
            services.organizer_create(slug="twins", name="Twins", owner=user)
            outcomes.append("created")
        except services.OrganizerInvalid as exc:
            outcomes.append(exc.field)
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(u,)) for u in (alice, bob)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(outcomes) == ["created", "slug"]
    assert Membership.objects.filter(organizer__slug="twins").count() == 1


# --- members ----------------------------------------------------------------------------


@pytest.fixture
def venue(alice):
    organizer = OrganizerFactory(slug="venue", name="The Venue")
    MembershipFactory(organizer=organizer, user=alice, role=Role.OWNER)
    return organizer


MEMBERS = f"{ORGANIZERS}venue/members/"


@pytest.mark.django_db
def test_the_owner_adds_a_member_changes_the_role_and_removes_them(venue, alice_api, bob):
    added = alice_api.post(MEMBERS, {"username": "bob", "role": "door"})
    assert (added.status_code, added.json()) == (201, {"username": "bob", "role": "door"})

    changed = alice_api.post(MEMBERS, {"username": "bob", "role": "finance"})
    assert (changed.status_code, changed.json()) == (200, {"username": "bob", "role": "finance"})

    listed = alice_api.get(MEMBERS)
    assert listed.json() == [
        {"username": "alice", "role": "owner"},
        {"username": "bob", "role": "finance"},
    ]

    assert alice_api.delete(f"{MEMBERS}bob/").status_code == 204
    assert _roles(venue) == {"alice": "owner"}
    assert alice_api.delete(f"{MEMBERS}bob/").json()["code"] == "not_found"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"username": "bob", "role": "admin"}, "role"),
        ({"username": "bob"}, "role"),
        ({"username": "nobody", "role": "door"}, "username"),
        ({"role": "door"}, "username"),
        ({"username": "bo\x00b", "role": "door"}, "username"),
    ],
)
@pytest.mark.django_db
def test_a_bad_member_is_400_naming_the_field(venue, alice_api, bob, body, field):
    answer = alice_api.post(MEMBERS, body)

    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("invalid", field)
    assert _roles(venue) == {"alice": "owner"}


@pytest.mark.django_db
def test_the_last_owner_can_neither_go_nor_step_down(venue, alice_api, bob):
    for answer in (
        alice_api.delete(f"{MEMBERS}alice/"),
        alice_api.post(MEMBERS, {"username": "alice", "role": "manager"}),
    ):
        assert answer.status_code == 409 and answer.json()["code"] == "last_owner"
    assert _roles(venue) == {"alice": "owner"}

    # With a second owner, the first may go.
    alice_api.post(MEMBERS, {"username": "bob", "role": "owner"})
    assert alice_api.delete(f"{MEMBERS}alice/").status_code == 204
    assert _roles(venue) == {"bob": "owner"}


def _other_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


def _wait_until_blocked(other: psycopg.Connection, pid: int, thread: threading.Thread) -> None:
    """Until the backend ``pid`` waits for a lock, or its thread is done (it
    did not wait: the assertions after say what it did)."""
    while (
        thread.is_alive()
        and not other.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [pid]
        ).fetchone()
    ):
        threading.Event().wait(0.01)


@pytest.mark.django_db(transaction=True)
def test_two_owners_removing_each_other_at_once_leave_one(alice, bob):
    """A removal counts the other owners under the organizer's lock: one that
    waited for it sees the removal that went first, and refuses."""
    venue = OrganizerFactory(slug="venue")
    for user in (alice, bob):
        MembershipFactory(organizer=venue, user=user, role=Role.OWNER)
    worker: dict = {}

    def remove_alice():
        worker["pid"] = connection.cursor().connection.info.backend_pid
        try:
            services.member_remove(organizer=venue, username="alice")
            worker["outcome"] = "removed"
        except OrganizerConflict as exc:
            worker["outcome"] = exc.code
        finally:
            connection.close()

    with _other_connection() as other:
        with other.transaction():
            # The other removal holds the organizer's lock, as member_remove takes it.
            other.execute(
                "SELECT 1 FROM organizers_organizer WHERE id = %s FOR NO KEY UPDATE", [venue.pk]
            )
            thread = threading.Thread(target=remove_alice)
            thread.start()
            while "pid" not in worker:
                threading.Event().wait(0.01)
            _wait_until_blocked(other, worker["pid"], thread)
            other.execute(
                "DELETE FROM organizers_membership m USING auth_user u"
                " WHERE u.id = m.user_id AND u.username = 'bob' AND m.organizer_id = %s",
                [venue.pk],
            )
        thread.join()

    assert worker["outcome"] == "last_owner"
    assert _roles(venue) == {"alice": "owner"}


# --- deleting an organizer ----------------------------------------------------------------


@pytest.mark.django_db
def test_an_organizer_with_events_is_not_deleted(venue, alice_api):
    EventFactory(organizer=venue, seats=[])

    answer = alice_api.delete(f"{ORGANIZERS}venue/")

    assert answer.status_code == 409 and answer.json()["code"] == "organizer_has_events"
    assert Organizer.objects.filter(slug="venue").exists() and _roles(venue) == {"alice": "owner"}


@pytest.mark.django_db
def test_an_organizer_without_events_goes_with_its_members_and_endpoints(venue, alice_api):
    webhook_endpoint_create(
        url="http://127.0.0.1:9/v", events=["purchase.confirmed"], organizer=venue
    )
    platform = webhook_endpoint_create(url="http://127.0.0.1:9/p", events=["purchase.confirmed"])

    assert alice_api.get(f"{ORGANIZERS}venue/").json() == {
        "slug": "venue",
        "name": "The Venue",
        "role": "owner",
    }
    assert alice_api.delete(f"{ORGANIZERS}venue/").status_code == 204

    assert not Organizer.objects.filter(slug="venue").exists()
    assert not Membership.objects.exists()
    assert list(WebhookEndpoint.objects.values_list("pk", flat=True)) == [platform.pk]
    assert alice_api.get(f"{ORGANIZERS}venue/").status_code == 404


# --- one organizer's data stays its own ------------------------------------------------------


@pytest.mark.django_db
def test_a_stranger_gets_the_answer_of_a_missing_organizer(venue, bob):
    bob_api = _api(bob)

    for path in ("", "members/", "webhook-endpoints/"):
        stranger = bob_api.get(f"{ORGANIZERS}venue/{path}")
        missing = bob_api.get(f"{ORGANIZERS}no-such-venue/{path}")
        assert stranger.status_code == missing.status_code == 404
        assert (
            stranger.json()
            == missing.json()
            == {"code": "not_found", "detail": "no such organizer"}
        )


@pytest.mark.parametrize("slug", ["%00", "a%00b", "Venue", "a" * 300])
@pytest.mark.django_db
def test_a_slug_of_another_form_names_no_organizer(venue, alice_api, slug):
    answer = alice_api.get(f"{ORGANIZERS}{slug}/members/")

    assert answer.status_code == 404
    assert answer.json() == {"code": "not_found", "detail": "no such organizer"}


@pytest.mark.django_db
def test_a_username_with_a_nul_byte_is_no_member(venue, alice_api):
    answer = alice_api.delete(f"{MEMBERS}al%00ice/")

    assert answer.status_code == 404 and answer.json()["code"] == "not_found"


@pytest.mark.django_db
def test_a_role_without_the_action_is_403_permission_denied(venue, bob):
    MembershipFactory(organizer=venue, user=bob, role=Role.DOOR)

    answer = _api(bob).get(MEMBERS)

    assert answer.status_code == 403
    assert answer.json() == {
        "code": "permission_denied",
        "detail": f"the role door may not {Action.MANAGE_MEMBERS}",
    }


def _scoped(slug: str) -> str:
    return f"{ORGANIZERS}{slug}/webhook-endpoints/"


@pytest.mark.django_db
def test_an_organizers_endpoints_are_its_own_and_the_staffs_are_everyones(venue, alice_api, bob):
    other = OrganizerFactory(slug="other")
    MembershipFactory(organizer=other, user=bob, role=Role.MANAGER)
    theirs = webhook_endpoint_create(
        url="http://127.0.0.1:9/o", events=["purchase.confirmed"], organizer=other
    )
    platform = webhook_endpoint_create(url="http://127.0.0.1:9/p", events=["purchase.confirmed"])

    created = alice_api.post(
        _scoped("venue"), {"url": "http://127.0.0.1:9/v", "events": ["purchase.confirmed"]}
    )
    assert created.status_code == 201 and created.json()["secret"].startswith("whsec_")
    mine = WebhookEndpoint.objects.get(pk=created.json()["id"])
    assert mine.organizer == venue

    listed = alice_api.get(_scoped("venue")).json()
    assert [e["id"] for e in listed["results"]] == [mine.pk]
    assert set(listed["results"][0]) == set(
        _api(UserFactory(is_superuser=True, is_staff=True))
        .get("/api/webhook-endpoints/")
        .json()["results"][0]
    )

    # Another organizer's endpoint, or a platform-wide one, named under this
    # organizer's slug, is no endpoint of it, whatever the operation.
    for foreign in (theirs.pk, platform.pk):
        base = f"{_scoped('venue')}{foreign}/"
        for method, path, body in (
            ("get", "", None),
            ("patch", "", {"enabled": False}),
            ("delete", "", None),
            ("post", "rotate-secret/", None),
            ("get", "deliveries/", None),
        ):
            answer = getattr(alice_api, method)(f"{base}{path}", body, format="json")
            assert answer.status_code == 404, (method, path)
    assert (
        WebhookEndpoint.objects.filter(pk__in=[theirs.pk, platform.pk], enabled=True).count() == 2
    )


@pytest.mark.django_db
def test_a_delivery_is_resent_only_through_its_own_organizers_endpoint(venue, alice_api, event):
    endpoint = webhook_endpoint_create(
        url="http://127.0.0.1:9/v", events=["purchase.confirmed"], organizer=venue
    )
    other = webhook_endpoint_create(
        url="http://127.0.0.1:9/o",
        events=["purchase.confirmed"],
        organizer=OrganizerFactory(slug="other"),
    )
    delivery = WebhookDelivery.objects.create(
        endpoint=other,
        message_id="msg_x",
        event_type="purchase.confirmed",
        saga_id="00000000-0000-0000-0000-000000000001",
        event_id=event.pk,
        body="{}",
        status="failed",
        created_at=event.starts_at,
    )

    for endpoint_id in (endpoint.pk, other.pk):
        answer = alice_api.post(
            f"{_scoped('venue')}{endpoint_id}/deliveries/{delivery.pk}/resend/", {}, format="json"
        )
        assert answer.status_code == 404


@pytest.mark.django_db
def test_an_organizers_endpoint_is_sent_its_own_events_and_a_platform_endpoint_every_one(
    alice, gateway
):
    venue, other = OrganizerFactory(slug="venue"), OrganizerFactory(slug="other")
    ours = webhook_endpoint_create(
        url="http://127.0.0.1:9/v", events=["purchase.confirmed"], organizer=venue
    )
    theirs = webhook_endpoint_create(
        url="http://127.0.0.1:9/o", events=["purchase.confirmed"], organizer=other
    )
    platform = webhook_endpoint_create(url="http://127.0.0.1:9/p", events=["purchase.confirmed"])
    at_venue = EventFactory(organizer=venue, seats=["A1"])
    elsewhere = EventFactory(organizer=other, seats=["A1"])

    for event in (at_venue, elsewhere):
        saga = saga_charge(saga_id=start_purchase(alice, event).pk)
        assert saga.state == "CONFIRMED"

    sent = sorted(WebhookDelivery.objects.values_list("endpoint_id", "event_id"))
    assert sent == sorted(
        [
            (ours.pk, at_venue.pk),
            (theirs.pk, elsewhere.pk),
            (platform.pk, at_venue.pk),
            (platform.pk, elsewhere.pk),
        ]
    )


@pytest.mark.parametrize("at_once", [True, False], ids=["data in hand", "data read if needed"])
@pytest.mark.django_db
def test_both_ways_of_publishing_choose_the_same_endpoints(at_once):
    venue, other = OrganizerFactory(slug="venue"), OrganizerFactory(slug="other")
    ours = webhook_endpoint_create(
        url="http://127.0.0.1:9/v", events=["purchase.confirmed"], organizer=venue
    )
    webhook_endpoint_create(
        url="http://127.0.0.1:9/o", events=["purchase.confirmed"], organizer=other
    )
    platform = webhook_endpoint_create(url="http://127.0.0.1:9/p", events=["purchase.confirmed"])
    at_venue = EventFactory(organizer=venue, seats=[])

    def publish(event_id):
        data = {"n": 1}
        with transaction.atomic():
            written = webhook_publish(
                event_type="purchase.confirmed",
                saga_id=uuid.uuid4(),
                event_id=event_id,
                data=data if at_once else (lambda: data),
                now=None,
            )
        return sorted(d.endpoint_id for d in written)

    assert publish(at_venue.pk) == [ours.pk, platform.pk]
    assert publish(None) == [platform.pk]  # a message of no event


# --- the data migration --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_events_and_endpoints_to_the_default_organizer():
    executor = MigrationExecutor(connection)
    before = [("purchases", "0009_reservation_seats_index"), ("webhooks", "0004_fewer_indexes")]
    executor.migrate(before)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO purchases_event (name, starts_at) VALUES ('before', now()) RETURNING id"
        )
        [event_id] = cursor.fetchone()
        cursor.execute(
            "INSERT INTO webhooks_webhookendpoint (url, events, description, enabled, secret,"
            " created_at, updated_at) VALUES ('http://127.0.0.1:9/', '[]', '', true, 's',"
            " now(), now()) RETURNING id"
        )
        [endpoint_id] = cursor.fetchone()

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    default = Organizer.objects.get(slug="demo")
    assert default.name == "Demo venue"
    assert Event.objects.get(pk=event_id).organizer == default
    assert WebhookEndpoint.objects.get(pk=endpoint_id).organizer == default


# --- the admin ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_admin_shows_and_filters_events_and_endpoints_by_organizer(admin_client):
    venue, other = OrganizerFactory(slug="venue"), OrganizerFactory(slug="other")
    EventFactory(organizer=venue, name="venue night", seats=[])
    EventFactory(organizer=other, name="other night", seats=[])
    webhook_endpoint_create(
        url="http://127.0.0.1:9/venue", events=["purchase.confirmed"], organizer=venue
    )
    webhook_endpoint_create(
        url="http://127.0.0.1:9/other", events=["purchase.confirmed"], organizer=other
    )

    events = admin_client.get("/admin/purchases/event/", {"organizer__id__exact": venue.pk})
    endpoints = admin_client.get(
        "/admin/webhooks/webhookendpoint/", {"organizer__id__exact": venue.pk}
    )

    for page, shown, hidden in (
        (events, "venue night", "other night"),
        (endpoints, "/venue", "/other"),
    ):
        text = page.content.decode()
        assert page.status_code == 200 and shown in text and hidden not in text
        assert "By organizer" in text


@pytest.mark.django_db
def test_the_admin_refuses_to_leave_an_organizer_without_an_owner(admin_client, alice):
    venue = OrganizerFactory(slug="venue", name="Venue")
    membership = MembershipFactory(organizer=venue, user=alice, role=Role.OWNER)
    prefix = "memberships"
    form = {
        "slug": "venue",
        "name": "Venue",
        f"{prefix}-TOTAL_FORMS": "1",
        f"{prefix}-INITIAL_FORMS": "1",
        f"{prefix}-0-id": membership.pk,
        f"{prefix}-0-organizer": venue.pk,
        f"{prefix}-0-user": alice.pk,
        f"{prefix}-0-role": "door",
    }

    answer = admin_client.post(f"/admin/organizers/organizer/{venue.pk}/change/", form)

    assert answer.status_code == 200 and "keeps at least one owner" in answer.content.decode()
    assert _roles(venue) == {"alice": "owner"}


@pytest.mark.django_db
def test_membership_for_reads_the_membership_and_its_organizer_as_the_orm_does():
    # given two organizers, the user a member of one of them
    user, stranger = UserFactory(), UserFactory()
    ours = OrganizerFactory(slug="ours-to-read", name="Ours")
    OrganizerFactory(slug="not-ours")
    MembershipFactory(organizer=ours, user=user, role=Role.FINANCE)

    # when the scoping reads it (one statement of its own, not the ORM's)
    found = selectors.membership_for(user=user, slug="ours-to-read")

    # then it is the ORM's row, field for field, its organizer loaded with it
    expected = Membership.objects.select_related("organizer").get(user=user, organizer=ours)
    fields = [f.attname for f in Membership._meta.concrete_fields]
    assert [getattr(found, f) for f in fields] == [getattr(expected, f) for f in fields]
    assert found.organizer == ours and found.organizer.name == "Ours"
    assert found.role == Role.FINANCE  # the saved row itself: its pk is the ORM row's (above)
    # and a stranger, another organizer or a slug of another form find none
    for who, slug in [(stranger, "ours-to-read"), (user, "not-ours"), (user, "ours\x00")]:
        with pytest.raises(OrganizerNotFound):
            selectors.membership_for(user=who, slug=slug)
