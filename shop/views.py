"""The buyer pages (docs/api.md, "Pages for buyers"): Django templates on the
same services, selectors and catalog cache as the API, and no second path to
the saga. A purchase starts through ``purchases.services.purchase_start``,
called as ``POST /api/purchases/`` calls it, with the same errors and the same
throttle; the purchase page reads what ``GET /api/purchases/{id}/`` reads and
follows the saga with a light poll that costs a 304 while nothing moves."""

from __future__ import annotations

import math
from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ObjectDoesNotExist
from django.core.paginator import EmptyPage, PageNotAnInteger, Paginator
from django.http import (
    Http404,
    HttpResponse,
    HttpResponseNotModified,
    HttpResponseRedirect,
    QueryDict,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import parse_etags, urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRefresh

from common.money import format_money
from door.errors import TICKET_CHECKED_IN, TICKET_REVOKED, TicketNotFound, TicketRefused
from door.services import ticket_reissue
from door.tickets import tickets_of

# The catalog's bodies come from purchases/catalog_answers.py, as the API's
# do: both read one cache entry per event.
from purchases import catalog_answers, selectors, services
from purchases.buyer_history import buyer_history
from purchases.errors import (
    BuyerLimitReached,
    IdempotencyKeyReused,
    InWaitingRoom,
    NotEnoughSeats,
    PaymentsPaused,
    SalesClosed,
    SalesNotOpen,
    SeatUnavailable,
    UnknownCategory,
    UnknownEvent,
    UnknownSeats,
)
from purchases.refunds.errors import RefundError
from purchases.refunds.selectors import purchase_refunds
from purchases.serializers import SEAT_REF_MAX
from purchases.throttling import PurchaseThrottled, purchase_start_throttled

from . import display, money_back
from .forms import (
    TEST_METHOD_TOKENS,
    CancelForm,
    PurchaseForm,
    new_idempotency_key,
    offers_test_methods,
    stripe_mode,
)

# How often a waiting purchase page asks whether its purchase moved (the
# fragment's poll; docs/api.md, "Pages for buyers", measures its cost).
POLL_EVERY = "500ms"
PAGE_SIZE = 20


# --- the catalog --------------------------------------------------------------------


def _events() -> list[display.EventView]:
    body = catalog_answers.event_list().body
    assert body is not None  # asked with no ETag held: the body comes with the answer
    return display.events(body)


def _event_names() -> dict[int, str]:
    return {event.id: event.name for event in _events()}


# The catalog is public, as the API's is (docs/api.md, "Pages for buyers"):
# anyone sees the events and the seat maps; Buy asks for a login.


@require_GET
def event_list(request):
    return render(request, "shop/event_list.html", {"events": _events(), "nav": "events"})


@require_http_methods(["GET", "POST"])
def event_seat_map(request, event_id: int):
    if request.method == "POST":
        return _purchase_post(request, event_id)
    # A choice carried in the query (back from the login page, see
    # _log_in_to_buy) is drawn ticked and filled in; Buy judges it.
    chosen = request.GET.getlist("seats")
    initial = {"payment_method": "pm_card_visa"} if offers_test_methods() else {}
    initial.update({k: request.GET[k] for k in ("quantity", "payment_method") if k in request.GET})
    return _seat_map(
        request, event_id, PurchaseForm(initial=initial, event_id=event_id), chosen=chosen
    )


# What a choice carried through the login keeps, so that its URL stays
# short: refs of 1 to 10 characters (no seat's is longer: the API's limit),
# at most this many (far past MAX_SEATS_PER_PURCHASE: Buy refuses the excess
# in words); a longer one could never be ticked on the map it comes back to.
_CARRIED_SEATS = 200


def _log_in_to_buy(request, event_id: int):
    """Buy, by a visitor who is not logged in: nothing is judged, started or
    counted; the login page, then this seat map again with the choice kept,
    in the ``next`` URL's query (it needs no session before the login). A
    303, as after any POST here: the browser GETs the login page."""
    choice = QueryDict(mutable=True)
    seats = [ref for ref in request.POST.getlist("seats") if 0 < len(ref) <= 10]
    if seats:
        choice.setlist("seats", seats[:_CARRIED_SEATS])
    quantity = request.POST.get("quantity", "")
    if 0 < len(quantity) <= 30:
        choice["quantity"] = quantity
    # Only one of the fake gateway's test cards: a real processor's payment
    # method is the buyer's, and a URL ends up in logs, history and Referer.
    method = request.POST.get("payment_method", "")
    if offers_test_methods() and method in TEST_METHOD_TOKENS:
        choice["payment_method"] = method
    seat_map = reverse("shop-seat-map", args=[event_id])
    response = redirect_to_login(f"{seat_map}?{choice.urlencode()}" if choice else seat_map)
    response.status_code = 303
    return response


def _seat_map(
    request,
    event_id: int,
    form: PurchaseForm,
    *,
    status: int = 200,
    problem: dict | None = None,
    chosen: Iterable[str] = (),
):
    """The seat map, from the catalog's cache, with the form, a fresh key
    and, after a refusal, the problem in words."""
    seats = catalog_answers.event_seats(event_id=event_id)
    if seats is None:
        raise Http404("no such event")
    assert seats.body is not None  # asked with no ETag held: the body comes with the answer
    hall = display.hall(seats.body, section=request.GET.get("section"))
    form.offer_categories(hall.categories)
    return render(
        request,
        "shop/seat_map.html",
        {
            "event": next((e for e in _events() if e.id == event_id), None),
            "event_id": event_id,
            "nav": "events",
            "hall": hall,
            "rows": hall.rows,
            "bands": hall.bands,
            "form": form,
            # A new key for every form drawn; a reload of a refused POST sends
            # the old one again, which the service refuses (or replays) the same way.
            "idempotency_key": new_idempotency_key(),
            "problem": problem,
            "chosen": set(chosen),
            "any_available": any(section.available for section in hall.sections),
            "stripe": _stripe_js(),
        },
        status=status,
    )


def _stripe_js() -> dict[str, str] | None:
    """What a page that takes a card, or completes its 3-D Secure, needs in
    Stripe mode (docs/stripe.md, "The buyer's pages"): where Stripe.js is
    loaded from and the publishable key, which is public by design. None
    with the fake gateway: its pages load nothing of Stripe's."""
    if not stripe_mode():
        return None
    return {"js_url": settings.STRIPE_JS_URL, "publishable_key": settings.STRIPE_PUBLISHABLE_KEY}


def _purchase_post(request, event_id: int):
    if not request.user.is_authenticated:
        return _log_in_to_buy(request, event_id)
    # The API's request serializer judges the form (shop/forms.py): the page
    # refuses what the API refuses.
    form = PurchaseForm(request.POST, event_id=event_id)
    chosen = request.POST.getlist("seats")
    if not form.is_valid():
        problem = {"code": "invalid", "field": _form_field(form), "text": _form_problem(form)}
        return _seat_map(request, event_id, form, status=400, chosen=chosen, problem=problem)
    data = form.request
    try:
        # The API's throttle, its scope and rate (PURCHASE_THROTTLE_RATE),
        # decided as the API decides it (docs/api.md, "Throttling"): a page
        # and the API count one user's starts together. Seats named, or best
        # available (N adjacent seats the service chooses): the form holds
        # exactly one.
        started = purchase_start_throttled(
            request,
            None,  # the throttle's key needs no view
            idempotency_key=form.cleaned_data["idempotency_key"],
            event_id=data["event"],
            seat_refs=data.get("seats"),
            quantity=data.get("quantity"),
            category=data.get("category"),
            payment_method=data["payment_method"],
        )
    except PurchaseThrottled as exc:
        return _throttled(request, event_id, wait=exc.wait)
    except InWaitingRoom:
        # The buyer is in the event's waiting room now (nothing held): its
        # page shows the place, live, and says when it is their turn.
        response = HttpResponseRedirect(reverse("shop-queue", args=[event_id]))
        response.status_code = 303
        return response
    except _REFUSALS as exc:
        status, problem = _refusal(exc, quantity=data.get("quantity"))
        page = _seat_map(request, event_id, form, status=status, chosen=chosen, problem=problem)
        if isinstance(exc, PaymentsPaused):
            page["Retry-After"] = str(exc.retry_after)
        return page
    response = HttpResponseRedirect(reverse("shop-purchase", args=[started.saga_id]))
    # 303: the browser GETs the purchase; a reload there cannot POST again.
    response.status_code = 303
    return response


# What the service refuses a start for, each told on the seat map (_refusal).
_REFUSALS = (
    SeatUnavailable,
    IdempotencyKeyReused,
    UnknownSeats,
    UnknownEvent,
    NotEnoughSeats,
    SalesNotOpen,
    SalesClosed,
    BuyerLimitReached,
    UnknownCategory,
    PaymentsPaused,
)


def _throttled(request, event_id: int, *, wait: float | None) -> HttpResponse:
    """429 with ``Retry-After`` and a page that says when to try again."""
    retry_after = max(1, math.ceil(wait)) if wait is not None else None
    response = render(
        request,
        "shop/throttled.html",
        {"retry_after": retry_after, "event_id": event_id},
        status=429,
    )
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _refusal(exc: Exception, *, quantity: int | None) -> tuple[int, dict]:
    """The status and the problem, in words, of a start the service refused
    (the API's status for the same refusal)."""
    if isinstance(exc, SeatUnavailable):
        taken = ", ".join(exc.seats)
        return 409, {
            "code": exc.code,
            "seats": exc.seats,
            "text": f"Sorry, {_seat_words(exc.seats)} {taken} "
            f"{'was' if len(exc.seats) == 1 else 'were'} just taken by someone else. "
            f"Nothing was charged. The map below is up to date: choose again.",
        }
    if isinstance(exc, IdempotencyKeyReused):
        return 422, {
            "code": exc.code,
            "text": "This form was already used for another purchase (see your purchases). "
            "Nothing new was bought; choose again below to make a new purchase.",
        }
    if isinstance(exc, SalesNotOpen | SalesClosed | BuyerLimitReached | UnknownCategory):
        return _sellers_rule(exc)
    if isinstance(exc, PaymentsPaused):
        return 503, {
            "code": exc.code,
            "text": "Card payments are paused for a moment: the card processor is not "
            "answering. Nothing was held or charged. Please try again in "
            f"{exc.retry_after} second{'' if exc.retry_after == 1 else 's'}.",
        }
    if isinstance(exc, NotEnoughSeats):
        return 409, {
            "code": exc.code,
            "text": f"No row has {quantity} free seats side by side "
            f"({exc.available} {'seat is' if exc.available == 1 else 'seats are'} free "
            f"in all). Nothing was charged. Choose seats on the map, or ask for fewer.",
        }
    return 400, {  # UnknownSeats, UnknownEvent
        "code": "invalid",
        "field": "event" if isinstance(exc, UnknownEvent) else "seats",
        "text": f"Those seats are not in this hall ({exc}). Choose seats on the map.",
    }


def _sellers_rule(
    exc: SalesNotOpen | SalesClosed | BuyerLimitReached | UnknownCategory,
) -> tuple[int, dict]:
    """A refusal by the seller's rules for the event, in words (the API's status)."""
    if isinstance(exc, SalesNotOpen):
        opens = exc.sales_start.strftime("%A %-d %B %Y, %H:%M UTC")
        return 409, {
            "code": exc.code,
            "text": f"Sales for this event open on {opens}. Nothing was bought; come back then.",
        }
    if isinstance(exc, SalesClosed):
        return 409, {
            "code": exc.code,
            "text": "Sales for this event are closed. Nothing was bought or charged.",
        }
    if isinstance(exc, BuyerLimitReached):
        return 409, {
            "code": exc.code,
            "text": f"You may have at most {exc.limit} "
            f"{_seat_words([''] * exc.limit)} for this event, and you hold or bought "
            f"{exc.held_or_bought} already. Nothing was charged; choose fewer seats.",
        }
    return 400, {
        "code": "invalid",
        "field": "category",
        "text": f"This hall has no part called {exc.category!r}. Choose another.",
    }


def _seat_words(seats: list[str]) -> str:
    return "seat" if len(seats) == 1 else "seats"


def _form_field(form: PurchaseForm) -> str:
    """The field the first refusal is about, as the API's ``field`` names it."""
    name = next(iter(form.errors), "")
    return "event" if name == "__all__" else name


def _form_problem(form: PurchaseForm) -> str:
    messages = [str(m) for m in form.non_field_errors()]
    for name, errors in form.errors.items():
        if name != "__all__":
            label = form.fields[name].label or name.replace("_", " ").capitalize()
            messages += [f"{label}: {m}" for m in errors]
    return " ".join(messages)


# --- purchases ----------------------------------------------------------------------


@login_required
@require_GET
def purchase_list(request):
    paginator = Paginator(selectors.purchase_list(user=request.user), PAGE_SIZE)
    try:
        page = paginator.page(request.GET.get("page", 1))
    except (EmptyPage, PageNotAnInteger) as exc:
        raise Http404("no such page") from exc
    names = _event_names()
    rows = [
        {
            "id": saga.pk,
            "event": names.get(saga.event_id, f"event {saga.event_id}"),
            "seats": selectors.saga_seat_refs(saga),
            "total": format_money(saga.amount, saga.currency),
            "created_at": saga.created_at,
            "state": saga.state,
            "status": display.list_headline(saga.state),
        }
        for saga in page.object_list
    ]
    return render(
        request, "shop/purchase_list.html", {"page": page, "purchases": rows, "nav": "purchases"}
    )


def _purchase_context(saga, *, offer: bool = False, reissued: dict | None = None) -> dict:
    """What the purchase page and its fragment show: what GET /api/purchases/{id}/
    answers (the same selector and the same buyer history), in words; with
    ``offer``, the buyer's cancellation offer too (the page's, not the
    fragment's: the fragment never redraws a form being filled in);
    ``reissued``, what came of replacing a ticket (``purchase_ticket_reissue``)."""
    seats = selectors.saga_seat_refs(saga)
    ticket_views = tickets_of(saga)  # none unless CONFIRMED
    marks = display.tickets_mark(ticket_views)
    refunded = bool(getattr(saga, "has_refund", False))
    terminal = display.is_terminal(saga.state)
    money = money_back.read(saga, now=timezone.now(), offer=offer)
    status = display.status_of(saga.state, refunded=refunded, seat_count=len(seats))
    if money.money is not None:
        live_seats = seats if money.live_seats is None else money.live_seats
        status = display.money_back_status(money.money, live_seats=len(live_seats)) or status
    return {
        "saga": saga,
        "state": saga.state,
        "version": saga.version,
        "status": status,
        "seats": seats,
        "total": format_money(saga.amount, saga.currency),
        "history": buyer_history(saga),
        "holding": display.is_holding(saga.state),
        "hold_expires_at": saga.reservation.hold_expires_at,
        # The seats still the buyer's (a released seat's ticket is gone):
        # door/tickets.py reads them with their codes and statuses.
        "tickets": display.tickets(ticket_views),
        "reissued": reissued or {},
        "reservation": saga.reservation.ref,
        "terminal": terminal,
        # A settled purchase polls on while a refund of it is pending: the
        # refund moves without moving the saga (docs/refunds.md, "The rows").
        "polls": not terminal or money.pending,
        "money_back": money,
        "refund_state": money.money.state if money.money is not None else "none",
        "poll_every": POLL_EVERY,
        "etag": display.purchase_etag(saga.version, money.mark + marks),
        "poll_headers": display.poll_headers(saga.version, money.mark + marks),
        "live_url": reverse("shop-purchase-live", args=[saga.pk]),
        "authentication": _authentication(saga),
    }


def _authentication(saga) -> dict[str, str] | None:
    """The 3-D Secure the buyer has to complete, while the saga waits on it
    (REQUIRES_ACTION): the PaymentIntent's client secret, which the page
    hands to ``stripe.confirmCardPayment``. Only ever rendered for the
    purchase's owner: both views read the saga through
    ``selectors.purchase_get(user=...)``, which answers None to anyone else."""
    if not display.awaits_authentication(saga.state) or not saga.action_secret:
        return None
    if not stripe_mode():  # a saga of Stripe's, while the site runs on the fake
        return None
    return {"client_secret": saga.action_secret}


@login_required
@require_GET
def purchase_detail(request, saga_id):
    saga = selectors.purchase_get(user=request.user, saga_id=saga_id)
    if saga is None:
        raise Http404("no such purchase")  # another user's too, exactly alike
    replaced = request.GET.get("replaced")
    context = _purchase_context(saga, offer=True, reissued={"seat": replaced} if replaced else None)
    context["event_name"] = _event_names().get(saga.event_id, f"event {saga.event_id}")
    # A purchase that may still move may come to wait on the buyer's bank
    # (REQUIRES_ACTION, while the page follows it live): its page loads
    # Stripe.js; a settled one has nothing left to authenticate.
    context["stripe"] = None if context["terminal"] else _stripe_js()
    return render(request, "shop/purchase_detail.html", context)


@require_GET
def purchase_live(request, saga_id):
    """The purchase page's live part, polled by htmx with the version it shows
    as ``If-None-Match``: ``304`` (htmx leaves the page alone) after one
    indexed query while the purchase has not moved, else the part anew with
    its ETag. A terminal purchase's part polls no more, unless a refund of
    it is pending: its ETag then carries the marks of its refunds and its
    tickets too (both move without moving the saga)."""
    if not request.user.is_authenticated:
        # Logged out meanwhile: reload the page, which goes to the login
        # page and back (a redirect would swap the login form into the page).
        if request.htmx:
            return HttpResponseClientRefresh()
        return redirect_to_login(request.get_full_path())
    etag, saga = _live_etag(request.user, saga_id)
    held = {tag.removeprefix("W/") for tag in parse_etags(request.headers.get("If-None-Match", ""))}
    response: HttpResponse
    if etag.removeprefix("W/") in held or "*" in held:
        response = HttpResponseNotModified()
    else:
        saga = saga or selectors.purchase_get(user=request.user, saga_id=saga_id)
        if saga is None:
            raise Http404("no such purchase")
        context = _purchase_context(saga)
        response = render(request, "shop/_purchase_live.html", context)
        etag = context["etag"]  # what was rendered, if it moved since
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    response["Vary"] = "Cookie"
    return response


def _live_etag(user, saga_id):
    """The live part's ETag as it stands, and the purchase when it had to be
    read for it: one indexed query (the version) while the saga may move; a
    confirmed one, whose refunds and tickets move without it, is read with
    them."""
    found = selectors.purchase_version(user=user, saga_id=saga_id)
    if found is None:
        raise Http404("no such purchase")
    version, state = found
    if state != "CONFIRMED":
        return display.purchase_etag(version), None
    saga = selectors.purchase_get(user=user, saga_id=saga_id)
    if saga is None:
        raise Http404("no such purchase")
    # Its refunds and its tickets (replaced, used at the door) move without it.
    marks = display.refunds_mark(purchase_refunds(saga)) + display.tickets_mark(tickets_of(saga))
    return display.purchase_etag(saga.version, marks), saga


# --- replacing a ticket ----------------------------------------------------------------


@login_required
@require_POST
def purchase_ticket_reissue(request, saga_id, seat: str):
    """The ticket's "Replace this ticket" (docs/api.md, "Replace a ticket"):
    ``door.services.ticket_reissue``, the API's service, gives the seat a
    new code and revokes the old one. With htmx the answer is the purchase's
    live part anew, the new code drawn; without, a 303 to the purchase page,
    which draws it. A refusal (the ticket was used at the door meanwhile) is
    said in words beside the ticket, never a 500."""
    if not 0 < len(seat) <= SEAT_REF_MAX or "\x00" in seat:
        raise Http404("no such ticket")  # no seat has such a ref
    saga = selectors.purchase_get(user=request.user, saga_id=saga_id)
    if saga is None:
        raise Http404("no such purchase")  # another user's too, exactly alike
    status = 200
    try:
        ticket_reissue(saga_id=saga.pk, seat_ref=seat, user=request.user)
        reissued = {"seat": seat}
    except TicketNotFound as exc:
        raise Http404("no such ticket") from exc
    except TicketRefused as exc:
        reissued = {"seat": seat, "problem": _REISSUE_REFUSALS.get(exc.code, str(exc))}
        status = 409
    if not request.htmx and status == 200:
        # The page says which ticket is new (?replaced=, a word on the page, no more).
        where = reverse("shop-purchase", args=[saga.pk])
        response = HttpResponseRedirect(f"{where}?{urlencode({'replaced': seat})}")
        # 303: the browser GETs the purchase; a reload there cannot POST again.
        response.status_code = 303
        return response
    saga = selectors.purchase_get(user=request.user, saga_id=saga.pk)  # its new code
    if saga is None:  # pragma: no cover - the buyer's a moment ago; never deleted
        raise Http404("no such purchase")
    if request.htmx:
        # 200 even for a refusal: the page's htmx swaps 2xx answers only
        # (shop/templates/shop/base.html), and the refusal is in the part.
        return render(
            request, "shop/_purchase_live.html", _purchase_context(saga, reissued=reissued)
        )
    context = _purchase_context(saga, offer=True, reissued=reissued)
    context["event_name"] = _event_names().get(saga.event_id, f"event {saga.event_id}")
    return render(request, "shop/purchase_detail.html", context, status=status)


# A ticket that cannot be replaced, in words (the API's 409 codes).
_REISSUE_REFUSALS = {
    TICKET_CHECKED_IN: "This ticket was already used at the door: it cannot be replaced.",
    TICKET_REVOKED: "This ticket no longer lets anyone in: there is nothing to replace.",
}


# --- a buyer's cancellation -----------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def purchase_cancel_page(request, saga_id):
    """The confirmation step of the purchase page's Cancel (docs/refunds.md,
    "Who asks"): GET shows the seats and the amount the buyer gets back,
    with a form of its own Idempotency-Key; POST cancels them through
    ``purchases.services.purchase_cancel`` (the API's service), then the
    purchase page, which shows the refund pending. A refusal (the time to
    cancel ran out meanwhile) is said in words, never a 500."""
    saga = selectors.purchase_get(user=request.user, saga_id=saga_id)
    if saga is None:
        raise Http404("no such purchase")  # another user's too, exactly alike
    if request.method == "POST":
        return _cancel_post(request, saga)
    now = timezone.now()
    offer = money_back.read(saga, now=now).offer
    if offer is None:
        return _cancel_page(request, saga, problem=money_back.why_not(saga, now=now), status=409)
    refs = request.GET.getlist("seats")
    if not request.GET.get("chosen") and not refs:
        refs = offer.refs  # no choice made: every seat still the buyer's
    unknown = [ref for ref in refs if ref not in offer.refs]
    if unknown or not refs:
        problem = (
            f"You cannot cancel {', '.join(unknown)[:200]}: choose among your seats below."
            if unknown
            else "Tick at least one seat to cancel."
        )
        return _cancel_page(request, saga, offer=offer, problem=problem, status=400)
    return _cancel_page(request, saga, offer=offer, quote=money_back.quote(offer, refs))


def _cancel_post(request, saga):
    form = CancelForm(request.POST)
    if not form.is_valid():
        problem = "This form is damaged; go back to your purchase and start again."
        return _cancel_page(request, saga, problem=problem, status=400)
    try:
        services.purchase_cancel(
            saga_id=saga.pk,
            user=request.user,
            seats=form.cleaned_data["seats"] or None,
            request_key=form.cleaned_data["idempotency_key"],
        )
    except ObjectDoesNotExist as exc:  # PurchaseSaga.DoesNotExist: not the buyer's
        raise Http404("no such purchase") from exc
    except RefundError as exc:
        problem = money_back.refusal_words(exc)
        return _cancel_page(request, saga, problem=problem, status=exc.status)
    response = HttpResponseRedirect(reverse("shop-purchase", args=[saga.pk]))
    # 303: the browser GETs the purchase; a reload there cannot POST again.
    response.status_code = 303
    return response


def _cancel_page(request, saga, *, offer=None, quote=None, problem=None, status=200):
    return render(
        request,
        "shop/purchase_cancel.html",
        {
            "saga": saga,
            "reservation": saga.reservation.ref,
            "event_name": _event_names().get(saga.event_id, f"event {saga.event_id}"),
            "nav": "purchases",
            "offer": offer,
            "quote": quote,
            # A new key for every confirmation drawn; a double click or a
            # reload of its POST sends this one again: one refund.
            "idempotency_key": new_idempotency_key(),
            "problem": problem,
        },
        status=status,
    )


# --- the waiting room (docs/waiting-room.md) ---------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def event_queue(request, event_id: int):
    """``/events/{id}/queue/``: the buyer's place in the event's waiting room,
    live (htmx polls its part, :func:`event_queue_live`). POST joins the
    room (what Buy does when the room lets buyers in in turn) and comes back
    here with a 303."""
    if request.method == "POST":
        if (
            services.waiting_room_place(event_id=event_id, user_id=request.user.pk, join_room=True)
            is None
        ):
            raise Http404("no such event")
        response = HttpResponseRedirect(reverse("shop-queue", args=[event_id]))
        response.status_code = 303
        return response
    context = _queue_context(request, event_id)
    return render(request, "shop/queue.html", context)


def event_queue_live(request, event_id: int):
    """The queue page's live part, polled by htmx."""
    if not request.user.is_authenticated:
        if request.htmx:
            return HttpResponseClientRefresh()
        return redirect_to_login(request.get_full_path())
    response = render(request, "shop/_queue_live.html", _queue_context(request, event_id))
    response["Cache-Control"] = "private, no-cache"
    return response


def _queue_context(request, event_id: int) -> dict:
    place = services.waiting_room_place(event_id=event_id, user_id=request.user.pk, join_room=False)
    if place is None:
        raise Http404("no such event")
    return {
        "event_id": event_id,
        "event_name": _event_names().get(event_id, f"event {event_id}"),
        "place": place,
        # Asked again as often as the place may move (at least every 2 s,
        # at most every 10 s: a position read at arm's length).
        "poll_every": f"{max(2, min(10, place.retry_after))}s",
        "nav": "events",
    }
