"""The pages of money back (docs/refunds.md) with Django's test client: the
buyer's purchase page (its refunds in words, what is left, the Cancel with
the amount shown before confirming, one refund per form however often it
is posted, refusals in words), the seller's purchase page (the refund form
of finance and owners, refusals on their fields), the owner's Cancel event
with its confirmation step and the run's progress, and the operators'
read-only admin of refunds and cancellations.

The purchases are real (the services, the in-process fake gateway); the
refunds are asked of it by the outbox's own messages (``drain_outbox``).
The browser stories are tests/test_refund_pages_browser.py.
"""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from freezegun import freeze_time

from organizers.roles import Role
from purchases.models import (
    Event,
    EventCancellation,
    EventStatus,
    GatewayAnswer,
    PurchaseSaga,
    Refund,
    Seat,
)
from purchases.services import organizer_refund, saga_charge

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory

pytestmark = pytest.mark.django_db

KEY = re.compile(r'name="idempotency_key" value="([^"]+)"')


# --- reading the pages ------------------------------------------------------------------


def page_of(answer) -> str:
    return answer.content.decode()


def text_of(answer) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page_of(answer))).split())


def form_key(page: str) -> str:
    found = KEY.search(page)
    assert found is not None, "no idempotency key on the page"
    return found.group(1)


def refund_state(page: str) -> str:
    found = re.search(r'data-refund-state="([a-z]+)"', page)
    assert found is not None
    return found.group(1)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def venue():
    return OrganizerFactory(slug="riverside", name="Riverside Hall")


@pytest.fixture
def show(venue):
    """On sale, buyers may cancel for a week, no fee; seats at 25.00 EUR."""
    return EventFactory(
        organizer=venue,
        name="Harbour lights",
        seats=["A1", "A2", "A3", "A4"],
        buyer_can_cancel_until=timezone.now() + timedelta(days=7),
        cancel_fee_percent=0,
    )


@pytest.fixture
def alice_page(alice) -> Client:
    return client_for(alice)


@pytest.fixture
def bought(alice, show, gateway) -> PurchaseSaga:
    """Alice's confirmed purchase of A1 and A2 (50.00 EUR)."""
    saga = saga_charge(saga_id=start_purchase(alice, show, seats=["A1", "A2"]).pk)
    assert saga.state == "CONFIRMED"
    return saga


@pytest.fixture
def people(venue) -> dict[Role, User]:
    people = {role: UserFactory(username=f"{role.value}-person") for role in Role}
    for role, user in people.items():
        MembershipFactory(organizer=venue, user=user, role=role)
    return people


def purchase_url(saga) -> str:
    return f"/purchases/{saga.pk}/"


def cancel_url(saga) -> str:
    return f"/purchases/{saga.pk}/cancel/"


def confirm_cancel(client: Client, saga, query: str = "") -> tuple[str, Any]:
    """The confirmation page of a cancel, then its POST: (its page, the answer)."""
    confirmation = page_of(client.get(cancel_url(saga) + query))
    seats = re.findall(r'<input type="hidden" name="seats" value="([^"]+)">', confirmation)
    answer = client.post(
        cancel_url(saga), {"idempotency_key": form_key(confirmation), "seats": seats}
    )
    return confirmation, answer


# --- the buyer's purchase page --------------------------------------------------------------


def test_a_confirmed_purchase_offers_cancel_with_its_deadline_and_fee(alice_page, bought, show):
    Event.objects.filter(pk=show.pk).update(cancel_fee_percent=10)

    answer = alice_page.get(purchase_url(bought))

    page, text = page_of(answer), text_of(answer)
    assert 'data-action="cancel"' in page
    assert "You may cancel until" in text and "10% cancellation fee" in text
    assert re.findall(r'data-cancel-seat="([^"]+)"', page) == ["A1", "A2"]
    assert refund_state(page) == "none" and "hx-trigger" not in page  # settled: no poll
    assert not Refund.objects.exists()


def test_the_amount_is_shown_before_anything_is_cancelled(alice_page, bought, show):
    Event.objects.filter(pk=show.pk).update(cancel_fee_percent=10)

    every = alice_page.get(cancel_url(bought))
    one = alice_page.get(cancel_url(bought) + "?chosen=1&seats=A2")

    # 2 × 25.00 less 10%; 25.00 less 10%
    assert every.status_code == 200 and 'data-refund-quote="4500"' in page_of(every)
    assert "45.00 EUR" in text_of(every) and "−5.00 EUR" in text_of(every)
    assert 'data-action="confirm-cancel"' in page_of(every)
    assert 'data-refund-quote="2250"' in page_of(one)
    assert re.findall(r'name="seats" value="([^"]+)"', page_of(one)) == ["A2"]
    assert not Refund.objects.exists()
    assert Seat.objects.get(event=show, ref="A1").status == "sold"


def test_confirming_twice_with_the_same_form_cancels_once(alice_page, bought, show):
    confirmation, first = confirm_cancel(alice_page, bought)
    again = alice_page.post(
        cancel_url(bought), {"idempotency_key": form_key(confirmation), "seats": ["A1", "A2"]}
    )

    assert first.status_code == again.status_code == 303
    assert first["Location"] == again["Location"] == purchase_url(bought)
    refund = Refund.objects.get()
    assert (refund.amount, refund.status, sorted(refund.seats)) == (5000, "pending", ["A1", "A2"])
    assert set(Seat.objects.filter(event=show).values_list("status", flat=True)) == {"available"}

    answer = alice_page.get(purchase_url(bought))
    page, text = page_of(answer), text_of(answer)
    assert refund_state(page) == "pending" and "Refund on its way" in text
    assert f'data-refund="{refund.pk}" data-refund-status="pending"' in page
    assert "You cancelled A1, A2" in text and "On its way" in text
    assert 'hx-trigger="every 500ms"' in page  # follows the refund live
    assert "data-ticket=" not in page and 'data-action="cancel"' not in page


def test_a_succeeded_refund_of_everything_says_refunded_in_full(alice_page, bought):
    confirm_cancel(alice_page, bought)

    drain_outbox()

    assert Refund.objects.get().status == "succeeded"
    answer = alice_page.get(purchase_url(bought))
    page, text = page_of(answer), text_of(answer)
    assert refund_state(page) == "full"
    assert "Refunded in full" in text and "Everything you paid, 50.00 EUR, was refunded" in text
    assert re.search(r"data-refunded>50\.00 EUR<", page)
    assert re.search(r"data-refund-left>0\.00 EUR<", page)
    assert "hx-trigger" not in page  # nothing left to follow
    assert 'data-purchase-status="CONFIRMED"' in page  # the saga does not move


def test_a_partial_cancel_keeps_the_other_ticket_and_says_what_is_left(alice_page, bought, show):
    Event.objects.filter(pk=show.pk).update(cancel_fee_percent=10)
    confirm_cancel(alice_page, bought, "?chosen=1&seats=A1")
    drain_outbox()

    answer = alice_page.get(purchase_url(bought))

    page, text = page_of(answer), text_of(answer)
    assert refund_state(page) == "partial" and "Partly refunded" in text
    assert re.search(r"data-refunded>22\.50 EUR<", page)
    assert re.search(r"data-refund-left>27\.50 EUR<", page)
    assert re.findall(r'data-ticket="([^"]+)"', page) == ["A2"]
    # A2 may still be cancelled; A1 is refunded already
    assert re.findall(r'data-cancel-seat="([^"]+)"', page) == []
    assert "Seat A2" in text and 'data-action="cancel"' in page


def test_the_deadline_passed_meanwhile_is_said_in_words(alice_page, bought, show):
    confirmation = page_of(alice_page.get(cancel_url(bought)))
    Event.objects.filter(pk=show.pk).update(
        buyer_can_cancel_until=timezone.now() - timedelta(minutes=1)
    )

    answer = alice_page.post(
        cancel_url(bought), {"idempotency_key": form_key(confirmation), "seats": ["A1", "A2"]}
    )

    assert answer.status_code == 409
    assert "Your tickets were not cancelled: the time to cancel" in text_of(answer)
    assert "Nothing was refunded" in text_of(answer)
    assert not Refund.objects.exists()
    late = alice_page.get(cancel_url(bought))
    assert late.status_code == 409 and "The time to cancel tickets" in text_of(late)
    assert 'data-action="cancel"' not in page_of(alice_page.get(purchase_url(bought)))


def test_an_event_whose_buyers_may_not_cancel_offers_no_cancel(alice_page, bought, show):
    Event.objects.filter(pk=show.pk).update(buyer_can_cancel_until=None)

    page = page_of(alice_page.get(purchase_url(bought)))
    answer = alice_page.get(cancel_url(bought))

    assert 'data-action="cancel"' not in page
    assert answer.status_code == 409 and "does not let buyers cancel" in text_of(answer)


def test_a_choice_of_no_seat_or_of_a_seat_not_mine_is_refused_in_words(alice_page, bought):
    none = alice_page.get(cancel_url(bought) + "?chosen=1")
    stranger = alice_page.get(cancel_url(bought) + "?chosen=1&seats=A4")

    assert none.status_code == 400 and "Tick at least one seat" in text_of(none)
    assert stranger.status_code == 400 and "You cannot cancel A4" in text_of(stranger)
    assert 'data-action="confirm-cancel"' not in page_of(none) + page_of(stranger)


def test_a_damaged_form_is_refused_in_words(alice_page, bought):
    answer = alice_page.post(cancel_url(bought), {"idempotency_key": "", "seats": ["A1"]})

    assert answer.status_code == 400 and "This form is damaged" in text_of(answer)
    assert not Refund.objects.exists()


def test_another_buyers_purchase_cannot_be_cancelled_or_seen(bob, bought):
    bob_page = client_for(bob)

    seen = bob_page.get(cancel_url(bought))
    posted = bob_page.post(cancel_url(bought), {"idempotency_key": "page-x", "seats": ["A1"]})

    assert seen.status_code == posted.status_code == 404
    assert not Refund.objects.exists()


def test_the_live_part_follows_a_pending_refund_and_answers_304_meanwhile(alice_page, bought):
    confirm_cancel(alice_page, bought)
    live = f"/purchases/{bought.pk}/live/"
    poll = {"HX-Request": "true"}

    first = alice_page.get(live, headers=poll)
    again = alice_page.get(live, headers={**poll, "If-None-Match": first["ETag"]})
    drain_outbox()
    moved = alice_page.get(live, headers={**poll, "If-None-Match": first["ETag"]})

    assert first.status_code == 200 and ".r1." in first["ETag"]
    assert 'hx-trigger="every 500ms"' in page_of(first)
    assert again.status_code == 304
    assert moved.status_code == 200 and moved["ETag"] != first["ETag"]
    assert refund_state(page_of(moved)) == "full" and "hx-trigger" not in page_of(moved)


def test_the_buyer_reads_the_sentence_written_for_them_never_the_sellers_reason(
    alice_page, bought, venue, people
):
    organizer_refund(
        organizer=venue,
        saga_id=bought.pk,
        user=people[Role.FINANCE],
        reason="goodwill: broken armrest, ticket 4711",
        amount=1000,
    )
    drain_outbox()

    answer = alice_page.get(purchase_url(bought))

    text = text_of(answer)
    assert "The organizer gave back part or all of what you paid." in text
    assert "armrest" not in text and "4711" not in text
    assert re.search(r"data-refunded>10\.00 EUR<", page_of(answer))
    assert re.findall(r'data-ticket="([^"]+)"', page_of(answer)) == ["A1", "A2"]


# --- the seller's purchase page -------------------------------------------------------------


def seller_purchase(saga) -> str:
    return f"/seller/riverside/events/{saga.event_id}/purchases/?purchase={saga.pk}"


def refund_form(client: Client, saga, **fields) -> dict:
    page = page_of(client.get(seller_purchase(saga)))
    assert "data-refund-form" in page
    return {"purchase": str(saga.pk), "idempotency_key": form_key(page), **fields}


def post_refund(client: Client, saga, body: dict):
    return client.post(f"/seller/riverside/events/{saga.event_id}/purchases/", body)


def test_finance_refunds_an_amount_and_sees_it_with_its_reason(people, bought):
    finance = client_for(people[Role.FINANCE])
    body = refund_form(finance, bought, amount="12.50", reason="late start, 20 minutes")

    answer = post_refund(finance, bought, body)

    assert answer.status_code == 303
    assert answer["Location"].endswith(f"?purchase={bought.pk}")
    refund = Refund.objects.get()
    assert (refund.amount, refund.source, refund.reason) == (1250, "organizer", body["reason"])
    assert refund.requested_by == people[Role.FINANCE] and refund.released is False
    shown = finance.get(seller_purchase(bought))
    assert "Refund of 12.50 EUR opened" in text_of(shown)
    assert f'data-refund="{refund.pk}" data-refund-status="pending"' in page_of(shown)
    assert "late start, 20 minutes" in text_of(shown)
    assert 'data-refundable="3750"' in page_of(shown)


def test_the_refund_form_posted_twice_refunds_once(people, bought):
    owner = client_for(people[Role.OWNER])
    body = refund_form(owner, bought, amount="5", reason="sound problems")

    first, again = post_refund(owner, bought, body), post_refund(owner, bought, body)

    assert first.status_code == again.status_code == 303
    assert Refund.objects.count() == 1


def test_refunding_seats_with_release_puts_them_back_on_sale(people, bought, show):
    owner = client_for(people[Role.OWNER])
    body = refund_form(owner, bought, seats=["A2"], release_seats="on", reason="seat broken")

    answer = post_refund(owner, bought, body)

    assert answer.status_code == 303
    refund = Refund.objects.get()
    assert (refund.amount, refund.seats, refund.released) == (2500, ["A2"], True)
    assert Seat.objects.get(event=show, ref="A2").status == "available"
    assert 'data-panel-seat="A2" data-released="true"' in page_of(
        owner.get(seller_purchase(bought))
    )


def test_more_than_what_is_left_is_refused_on_the_amount_field(people, bought):
    finance = client_for(people[Role.FINANCE])
    body = refund_form(finance, bought, amount="60", reason="too much")

    answer = post_refund(finance, bought, body)

    assert answer.status_code == 409
    assert "At most 50.00 EUR is left to refund on this purchase." in text_of(answer)
    assert 'data-field="amount"' in page_of(answer) and "field--invalid" in page_of(answer)
    assert not Refund.objects.exists()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"amount": "5", "reason": ""}, "This field is required."),
        ({"amount": "5.555", "reason": "x"}, "at most 2 decimals in EUR"),
        ({"amount": "0", "reason": "x"}, "Nothing to refund: the amount is 0."),
    ],
)
def test_a_bad_field_is_refused_on_it_in_words(people, bought, fields, words):
    finance = client_for(people[Role.FINANCE])

    answer = post_refund(finance, bought, refund_form(finance, bought, **fields))

    assert answer.status_code == 400 and words in text_of(answer)
    assert not Refund.objects.exists()


def test_a_manager_sees_the_purchase_but_may_not_refund(people, bought):
    manager = client_for(people[Role.MANAGER])

    shown = manager.get(seller_purchase(bought))
    posted = post_refund(
        manager, bought, {"purchase": str(bought.pk), "idempotency_key": "k", "reason": "x"}
    )

    assert shown.status_code == 200 and "data-refund-form" not in page_of(shown)
    assert f'data-purchase-panel="{bought.pk}"' in page_of(shown)
    assert posted.status_code == 403 and 'data-error="permission_denied"' in page_of(posted)
    assert not Refund.objects.exists()


def test_a_purchase_of_another_event_is_missing_here(people, bought, venue, alice):
    other = EventFactory(organizer=venue, seats=["B1"])
    owner = client_for(people[Role.OWNER])

    shown = owner.get(f"/seller/riverside/events/{other.pk}/purchases/?purchase={bought.pk}")
    posted = owner.post(
        f"/seller/riverside/events/{other.pk}/purchases/",
        {"purchase": str(bought.pk), "idempotency_key": "k", "reason": "x", "amount": "1"},
    )

    assert shown.status_code == posted.status_code == 404
    assert "No such purchase of this event." in text_of(shown)
    assert not Refund.objects.exists()


def test_the_dashboard_links_each_purchase_to_its_refunds(people, bought):
    page = page_of(
        client_for(people[Role.FINANCE]).get(f"/seller/riverside/events/{bought.event_id}/")
    )

    assert f'data-open-purchase="{bought.pk}"' in page
    assert f"/seller/riverside/events/{bought.event_id}/purchases/?purchase={bought.pk}" in page


# --- the owner's Cancel event ---------------------------------------------------------------


def dashboard_url(event) -> str:
    return f"/seller/riverside/events/{event.pk}/"


def test_only_the_owner_is_offered_cancel_event(people, show):
    offered = {
        role: 'data-action="cancel-event"' in page_of(client_for(user).get(dashboard_url(show)))
        for role, user in people.items()
        if role != Role.DOOR
    }
    manager = client_for(people[Role.MANAGER]).post(
        f"/seller/riverside/events/{show.pk}/cancel/", {"reason": "storm", "confirm": "True"}
    )

    assert offered == {Role.OWNER: True, Role.MANAGER: False, Role.FINANCE: False}
    assert manager.status_code == 403
    assert Event.objects.get(pk=show.pk).status == EventStatus.ON_SALE


def test_the_owner_cancels_after_a_confirmation_and_watches_the_run_finish(
    people, bought, show, alice
):
    owner = client_for(people[Role.OWNER])
    cancel = f"/seller/riverside/events/{show.pk}/cancel/"
    with freeze_time(timezone.now()) as clock:
        step = owner.post(cancel, {"reason": "Storm warning: the hall is closed"})
        assert step.status_code == 200 and 'data-action="confirm-cancel-event"' in page_of(step)
        assert "1 purchase" in text_of(step) and "50.00 EUR" in text_of(step)
        assert not EventCancellation.objects.exists()  # nothing done before confirming
        hidden = dict(
            re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page_of(step))
        )
        assert hidden["reason"] == "Storm warning: the hall is closed"

        done = owner.post(cancel, {"reason": hidden["reason"], "confirm": hidden["confirm"]})
        assert done.status_code == 303 and done["Location"] == dashboard_url(show)
        assert Event.objects.get(pk=show.pk).status == EventStatus.CANCELLED

        running = page_of(owner.get(dashboard_url(show)))
        assert 'data-cancellation="running"' in running and 'hx-trigger="every 1s"' in running
        assert 'data-action="cancel-event"' not in running
        for _ in range(5):
            clock.tick(1.5)
            drain_outbox()

    live = owner.get(f"/seller/riverside/events/{show.pk}/cancellation/")
    page = page_of(live)
    assert live.status_code == 200 and page.startswith("<") and "<html" not in page
    assert 'data-cancellation="done"' in page and "hx-trigger" not in page
    assert re.search(r'data-progress="purchases">1<', page)
    assert re.search(r'data-progress="refunded">1<', page)
    assert re.search(r'data-progress="owed">0\.00 EUR<', page)
    buyer = page_of(client_for(alice).get(purchase_url(bought)))
    assert refund_state(buyer) == "full"
    assert "The event was cancelled" in html.unescape(buyer)


def test_a_cancel_without_a_reason_is_refused_on_its_field(people, show):
    answer = client_for(people[Role.OWNER]).post(
        f"/seller/riverside/events/{show.pk}/cancel/", {"reason": ""}
    )

    assert answer.status_code == 400 and "This field is required." in text_of(answer)
    assert Event.objects.get(pk=show.pk).status == EventStatus.ON_SALE


def test_an_event_not_cancelled_has_no_progress_to_show(people, show):
    answer = client_for(people[Role.FINANCE]).get(
        f"/seller/riverside/events/{show.pk}/cancellation/"
    )

    assert answer.status_code == 200 and "data-not-cancelled" in page_of(answer)


# --- the admin --------------------------------------------------------------------------------


@pytest.fixture
def root(db) -> Client:
    return client_for(UserFactory(username="root", is_staff=True, is_superuser=True))


def test_the_refund_admin_finds_a_sagas_refunds_and_shows_the_processors_answers(
    root, alice_page, bought, alice, show, gateway
):
    other = saga_charge(saga_id=start_purchase(alice, show, seats=["A3"]).pk)
    confirm_cancel(alice_page, bought)
    confirm_cancel(alice_page, other)
    drain_outbox()
    refund = Refund.objects.get(saga_id=bought.pk)
    assert GatewayAnswer.objects.filter(refund_id=refund.pk).exists()
    changelist = reverse("admin:purchases_refund_changelist")

    found = root.get(changelist, {"q": str(bought.pk)})
    short = root.get(changelist, {"q": str(bought.pk)[:8]})
    succeeded = root.get(changelist, {"status__exact": "succeeded", "source__exact": "buyer"})
    detail = root.get(reverse("admin:purchases_refund_change", args=[refund.pk]))

    assert [r.pk for r in found.context["cl"].result_list] == [refund.pk]
    assert [r.pk for r in short.context["cl"].result_list] == [refund.pk]
    assert len(succeeded.context["cl"].result_list) == 2
    page = page_of(detail)
    assert detail.status_code == 200 and 'class="refund-answer"' in page
    assert "refund_create" in page and "50.00 EUR" in page and "-50.00 EUR" in page
    assert 'name="_save"' not in page  # read-only


def test_the_refund_admin_cannot_change_a_refund(root, alice_page, bought):
    confirm_cancel(alice_page, bought)
    refund = Refund.objects.get()

    answer = root.post(
        reverse("admin:purchases_refund_change", args=[refund.pk]), {"status": "succeeded"}
    )

    assert answer.status_code == 403
    assert Refund.objects.get().status == "pending"


def test_the_cancellation_admin_shows_the_runs_progress(root, people, bought, show):
    owner = client_for(people[Role.OWNER])
    owner.post(
        f"/seller/riverside/events/{show.pk}/cancel/", {"reason": "storm", "confirm": "True"}
    )

    listed = root.get(reverse("admin:purchases_eventcancellation_changelist"))
    detail = root.get(reverse("admin:purchases_eventcancellation_change", args=[show.pk]))

    assert listed.status_code == 200 and "Harbour lights" in text_of(listed)
    assert detail.status_code == 200 and "cancellation-progress" in page_of(detail)
    assert "1 purchases" in text_of(detail) and "50.00 EUR still owed" in text_of(detail)
