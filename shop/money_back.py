"""The purchase page's money back (docs/refunds.md, "Who asks"): a confirmed
purchase's refunds in words, what they gave back and what is left, and the
buyer's cancellation offer: which seats, until when, and the amount they
would get back, shown before they confirm.

Reads only, through the refunds' selectors (``purchase_refunds``,
``refunded_amount``, ``cancellable_until``) and the opening's readings
(``refundable``, ``seat_links``), the ones the API answers with. The
cancellation itself is ``purchases.services.purchase_cancel``, called by
the view (shop/views.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from common.money import format_money
from purchases.refunds.errors import RefundExceedsPaid, RefundKeyReused
from purchases.refunds.opening import refundable, seat_links
from purchases.refunds.selectors import cancellable_until, purchase_refunds, refunded_amount
from purchases.saga.states import SagaState

from . import display

CONFIRMED = SagaState.CONFIRMED.value
# The event's status once cancelled (purchases.models.EventStatus, which the
# buyer pages do not import: pyproject.toml's contract for shop).
EVENT_CANCELLED = "cancelled"


@dataclass(frozen=True)
class SeatOffer:
    ref: str
    price: int  # what the buyer paid for it, minor units
    price_text: str


@dataclass(frozen=True)
class CancelOffer:
    """What the buyer may cancel now: until when, the organizer's fee, the
    seats still theirs (not released, not named by a refund)."""

    until: datetime
    fee_percent: int
    seats: list[SeatOffer]
    refundable: int  # what is left to give back of the charge
    currency: str

    @property
    def refs(self) -> list[str]:
        return [seat.ref for seat in self.seats]


@dataclass(frozen=True)
class Quote:
    """What cancelling ``seats`` gives back, as ``refund_open`` will count
    it (docs/refunds.md, "Amounts"): their prices less the fee (rounded down
    in the buyer's favour), capped at what is left."""

    seats: list[str]
    prices: str
    fee_percent: int
    fee: str
    amount: int
    amount_text: str


@dataclass
class MoneyBackPage:
    """What the purchase page shows of the money back; empty for a purchase
    that is not confirmed (only a confirmed one has refunds)."""

    refunds: list[display.RefundView] = field(default_factory=list)
    money: display.MoneyBack | None = None
    refunded_text: str = ""
    pending_text: str = ""
    left_text: str = ""
    live_seats: list[str] | None = None  # None: the saga's seats as they are
    mark: str = ""  # display.refunds_mark
    pending: bool = False
    offer: CancelOffer | None = None


def read(saga, *, now: datetime, offer: bool = True) -> MoneyBackPage:
    """The money back of ``saga`` (the buyer's, read by
    ``selectors.purchase_get``); with ``offer``, the cancellation offer too
    (one more read: the event's policy)."""
    if saga.state != CONFIRMED:
        return MoneyBackPage()
    refunds = purchase_refunds(saga)
    links = seat_links(saga)
    page = MoneyBackPage(
        refunds=[display.refund_view(refund) for refund in refunds],
        live_seats=[link.ref for link in links if not link.released],
        mark=display.refunds_mark(refunds),
        pending=any(refund.status == "pending" for refund in refunds),
    )
    left = refundable(saga)
    if refunds:
        page.money = display.MoneyBack(
            total=saga.amount,
            refunded=refunded_amount(saga),
            pending=sum(r.amount for r in refunds if r.status == "pending"),
            failed=sum(1 for r in refunds if r.status == "failed"),
            currency=saga.currency,
        )
        page.refunded_text = page.money.money(page.money.refunded)
        page.pending_text = page.money.money(page.money.pending) if page.money.pending else ""
        page.left_text = format_money(left, saga.currency)
    if offer:
        page.offer = _offer(saga, links, refunds, left=left, now=now)
    return page


def _seat_price(link, saga, links) -> int:
    # As refund_open prices a seat (purchases/refunds/opening.py): a link
    # older than refunds has no price of its own, only its share of the total.
    return link.price if link.price is not None else saga.amount // len(links)


def _offer(saga, links, refunds, *, left: int, now: datetime) -> CancelOffer | None:
    until = cancellable_until(saga, saga.event, now=now)
    if until is None or left <= 0:
        return None
    taken = {ref for r in refunds if r.status != "failed" for ref in r.seats}
    seats = [
        SeatOffer(
            ref=link.ref,
            price=_seat_price(link, saga, links),
            price_text=format_money(_seat_price(link, saga, links), saga.currency),
        )
        for link in links
        if not link.released and link.ref not in taken
    ]
    if not seats:
        return None
    return CancelOffer(
        until=until,
        fee_percent=saga.event.cancel_fee_percent,
        seats=seats,
        refundable=left,
        currency=saga.currency,
    )


def quote(offer: CancelOffer, refs: list[str]) -> Quote:
    """What cancelling ``refs`` (seats of ``offer``) gives back."""
    prices = sum(seat.price for seat in offer.seats if seat.ref in refs)
    fee = prices * offer.fee_percent // 100
    amount = min(prices - fee, offer.refundable)
    return Quote(
        seats=[ref for ref in offer.refs if ref in refs],
        prices=format_money(prices, offer.currency),
        fee_percent=offer.fee_percent,
        fee=format_money(fee, offer.currency),
        amount=amount,
        amount_text=format_money(amount, offer.currency),
    )


def why_not(saga, *, now: datetime) -> str:
    """Why this purchase cannot be cancelled now, in words."""
    if saga.state != CONFIRMED:
        return "Only a confirmed purchase can be cancelled."
    event = saga.event
    if event.status == EVENT_CANCELLED:
        return "The event is cancelled: everything you paid is refunded without asking."
    until = event.buyer_can_cancel_until
    if until is None:
        return "The organizer does not let buyers cancel tickets for this event."
    if now >= until:
        return f"The time to cancel tickets for this event ended on {_when(until)}."
    return "Every seat of this purchase is cancelled or refunded already."


def _when(at: datetime) -> str:
    return at.strftime("%A %-d %B %Y, %H:%M UTC")


def refusal_words(exc: Exception) -> str:
    """A refusal of ``purchase_cancel`` (purchases/refunds/errors.py), in words."""
    if isinstance(exc, RefundKeyReused):
        return (
            "This form was already used to cancel other seats. Nothing new was cancelled: "
            "go back to your purchase and start again."
        )
    if isinstance(exc, RefundExceedsPaid):
        text = f"at most {format_money(exc.refundable, exc.currency)} is left to refund"
    else:
        text = str(exc)
    return (
        f"Your tickets were not cancelled: {text[:1].lower()}{text[1:]}. "
        "Nothing was refunded, and your tickets stay valid."
    )
