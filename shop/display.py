"""What the buyer pages show, in words and pictures: a purchase's status as a
buyer reads it, the hall laid out from the catalog's answer, the tickets'
QR codes. Reads nothing: the views hand it what the selectors and the
catalog answered."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby

import segno
from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString, mark_safe

from common.money import format_money
from purchases.saga.states import TERMINAL, SagaState

S = SagaState

# --- a purchase's status ----------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """A state as a buyer reads it: a headline, a sentence, and the kind of
    news it is (``progress``, ``success``, ``failure``, ``waiting``: the
    page's style, always beside the words, never instead of them)."""

    headline: str
    sentence: str
    tone: str


# While the seats are held and the outcome is open, the page counts the hold down.
HOLDING = frozenset({S.PENDING, S.CHARGING, S.REQUIRES_ACTION, S.UNKNOWN, S.UNKNOWN_EXPIRED})

_CONFIRMING = "We are confirming with your bank"
_WORDS: dict[SagaState, Status] = {
    S.PENDING: Status("Seats held", "Your seats are held while we take the payment.", "progress"),
    S.CHARGING: Status(
        "Taking the payment", "We are taking the payment; this takes a few seconds.", "progress"
    ),
    S.REQUIRES_ACTION: Status(
        "Confirm the payment with your bank",
        "Your bank asks you to confirm this payment. Nothing is charged until you do; "
        "your seats stay held until the hold runs out.",
        "waiting",
    ),
    S.UNKNOWN: Status(
        _CONFIRMING,
        "The bank has not told us yet whether the payment went "
        "through. Your seats stay held meanwhile, and you are never charged "
        "twice.",
        "waiting",
    ),
    S.UNKNOWN_EXPIRED: Status(
        _CONFIRMING,
        "This is taking longer than usual; our team is "
        "checking it with the bank. Your seats stay held, and you are "
        "never charged twice.",
        "waiting",
    ),
    S.CONFIRMED: Status(
        "Confirmed", "Payment received; your seats are booked. Your tickets are below.", "success"
    ),
    S.PAYMENT_FAILED: Status(
        "Payment declined", "Your payment was declined; we are cancelling the purchase.", "failure"
    ),
    S.EXPIRED: Status(
        "Hold ran out",
        "The hold on your seats ran out before the payment "
        "went through; we are cancelling the purchase.",
        "failure",
    ),
    S.COMPENSATING: Status("Cancelling", "We are cancelling the purchase.", "failure"),
    S.COMPENSATION_PENDING: Status(
        "Refund on its way", "Your refund is taking longer than usual; we keep trying.", "waiting"
    ),
}
# The end of a cancelled purchase: the ledger says whether money came back.
_REFUNDED = Status(
    "Cancelled and refunded", "Your payment was refunded and the purchase cancelled.", "failure"
)


def _not_charged(seat_count: int) -> Status:
    released = "the seat was released" if seat_count == 1 else "the seats were released"
    return Status(
        "Not booked",
        f"The payment did not go through: nothing was charged and {released}.",
        "failure",
    )


def _state(state: str) -> SagaState | None:
    try:
        return S(state)
    except ValueError:
        return None


def status_of(state: str, *, refunded: bool, seat_count: int) -> Status:
    known = _state(state)
    if known is S.COMPENSATED:
        return _REFUNDED if refunded else _not_charged(seat_count)
    updated = Status("Updated", "Your purchase was updated.", "progress")
    return _WORDS.get(known, updated) if known is not None else updated


def list_headline(state: str) -> str:
    """A state in a list of purchases, where the ledger is not read: a
    cancelled purchase is "Cancelled", refunded or not."""
    if _state(state) is S.COMPENSATED:
        return "Cancelled"
    return status_of(state, refunded=False, seat_count=1).headline


def is_terminal(state: str) -> bool:
    return _state(state) in TERMINAL


def is_holding(state: str) -> bool:
    return _state(state) in HOLDING


def awaits_authentication(state: str) -> bool:
    """The purchase waits on the buyer's bank (3-D Secure): the page
    completes the authentication with Stripe.js."""
    return _state(state) is S.REQUIRES_ACTION


def purchase_etag(version: int, refunds: str = "") -> str:
    """The purchase fragment's ETag: the saga's version, which every move
    increments (docs/design.md, "A transition"), and the mark of its refunds
    (``refunds_mark``): a refund moves without moving the saga."""
    return f'W/"v{version}{refunds}"'


def refunds_mark(refunds) -> str:
    """What changes when a purchase's refund is opened or settled: how many
    there are and the latest change ("" when there are none)."""
    if not refunds:
        return ""
    latest = max(refund.updated_at for refund in refunds)
    return f".r{len(refunds)}.{latest.timestamp():.6f}"


def poll_headers(version: int, refunds: str = "") -> str:
    """``hx-headers`` of the polling element: the version it shows, sent back."""
    return json.dumps({"If-None-Match": purchase_etag(version, refunds)})


# --- the hall ---------------------------------------------------------------------


@dataclass(frozen=True)
class SeatView:
    ref: str
    row: str
    number: int
    status: str
    price: str
    band: int  # the price band's number in the legend, from 1
    accessible: bool = False


@dataclass(frozen=True)
class PriceBand:
    number: int
    price: str
    rows: str  # "A–E", or "A, C"
    count: int


@dataclass(frozen=True)
class Section:
    """A section of the hall ("" when the map has none): its rows of seats
    in order, and how many of its seats are free."""

    name: str
    rows: list[tuple[str, list[SeatView]]]
    available: int
    total: int


# A seat map past this many seats is drawn one section at a time (the page
# of a 20,000-seat arena would weigh megabytes); the sections are listed
# with what each has free, and best available still chooses over them all.
DRAWN_AT_ONCE = 1200


@dataclass(frozen=True)
class Hall:
    sections: list[Section]  # every section, drawn or not
    drawn: list[Section]  # those the page draws (all, or the one asked for)
    bands: list[PriceBand]
    categories: list[str]  # the codes of the seats' price categories, in order

    @property
    def rows(self) -> list[tuple[str, list[SeatView]]]:
        return [row for section in self.drawn for row in section.rows]


def hall(seats_json: bytes, *, section: str | None = None) -> Hall:
    """The catalog's seats (the API's JSON, as cached) as sections of rows
    of seats in order, and the price legend (one band per price). A map of
    more than ``DRAWN_AT_ONCE`` seats draws only ``section`` (none: no seat)."""
    seats = json.loads(seats_json)
    prices = sorted({(s["price"]["currency"], s["price"]["amount"]) for s in seats})
    band_of = {price: n for n, price in enumerate(prices, start=1)}
    by_section: dict[str, list[SeatView]] = {}
    for s in seats:
        price = (s["price"]["currency"], s["price"]["amount"])
        by_section.setdefault(s.get("section", ""), []).append(
            SeatView(
                ref=s["ref"],
                row=s["row"],
                number=s["number"],
                status=s["status"],
                price=format_money(price[1], price[0]),
                band=band_of[price],
                accessible=bool(s.get("accessible")),
            )
        )
    sections = [_section(name, views) for name, views in by_section.items()]
    if len(seats) <= DRAWN_AT_ONCE:
        drawn = sections
    else:
        drawn = [x for x in sections if x.name == section]
    categories = sorted({s["category"] for s in seats if s.get("category")})
    return Hall(sections, drawn, _bands(band_of, sections), categories)


def _section(name: str, views: list[SeatView]) -> Section:
    views.sort(key=lambda v: (v.row, v.number))
    rows = [(row, list(group)) for row, group in groupby(views, key=lambda v: v.row)]
    free = sum(1 for v in views if v.status == "available")
    return Section(name=name, rows=rows, available=free, total=len(views))


def _bands(band_of: dict[tuple[str, int], int], sections: list[Section]) -> list[PriceBand]:
    views = [seat for section in sections for _, row in section.rows for seat in row]
    all_rows = list(dict.fromkeys(row for section in sections for row, _ in section.rows))
    bands = []
    for (currency, amount), number in band_of.items():
        in_band = [v for v in views if v.band == number]
        band_rows = [r for r in all_rows if r in {v.row for v in in_band}]
        bands.append(
            PriceBand(
                number=number,
                price=format_money(amount, currency),
                rows=_rows_text(band_rows, all_rows),
                count=len(in_band),
            )
        )
    return bands


def _rows_text(band_rows: list[str], all_rows: list[str]) -> str:
    if (
        len(band_rows) > 2
        and all_rows[all_rows.index(band_rows[0]) : all_rows.index(band_rows[-1]) + 1] == band_rows
    ):
        return f"{band_rows[0]}–{band_rows[-1]}"
    return ", ".join(band_rows)


# --- the catalog's events -----------------------------------------------------------


@dataclass(frozen=True)
class EventView:
    id: int
    name: str
    starts_at: datetime | None
    seats_available: int
    organizer: str = ""  # the seller's name


def events(events_json: bytes) -> list[EventView]:
    return [
        EventView(
            id=e["id"],
            name=e["name"],
            starts_at=parse_datetime(e["starts_at"]),
            seats_available=e["seats_available"],
            organizer=e["organizer"]["name"],
        )
        for e in json.loads(events_json)
    ]


# --- tickets ------------------------------------------------------------------------
# docs/api.md, "Your tickets": a ticket's code is signed (door/tickets.py,
# which the view reads); here it becomes a QR code and words.

TICKET_WORDS = {
    "valid": "Valid",
    "checked_in": "Checked in",
    "revoked": "No longer valid",
}
_TICKET_SENTENCES = {
    "valid": "Show this code at the door: it lets one person in, once.",
    "checked_in": "Used: this ticket was scanned in at the door.",
    "revoked": "This ticket was replaced or taken back: its code lets no one in.",
}


@dataclass(frozen=True)
class Ticket:
    seat: str
    code: str  # what the QR code says: the signed code (door/codes.py)
    status: str  # valid | checked_in | revoked (the API's)
    words: str  # the status in words
    sentence: str
    qr_svg: SafeString | None  # none for a revoked ticket: nothing to show at the door

    @property
    def reissuable(self) -> bool:
        """Only a valid ticket can be replaced (door.services.ticket_reissue)."""
        return self.status == "valid"


def tickets(views) -> list[Ticket]:
    """``door.tickets.tickets_of``'s tickets (seat, code, status) drawn."""
    made = []
    for view in views:
        svg = None
        if view.status != "revoked":
            # segno writes the SVG itself (no user input reaches it but the
            # code, which the service signed: base64url): safe to inline.
            # A full QR code (make_qr), never a Micro QR, which most phones
            # cannot read; 119 characters at level M are a version 7 code.
            svg = mark_safe(
                segno.make_qr(view.code, error="m").svg_inline(
                    scale=5, border=2, title=view.code, svgclass="qr", lineclass=None
                )
            )
        made.append(
            Ticket(
                seat=view.seat,
                code=view.code,
                status=view.status,
                words=TICKET_WORDS.get(view.status, view.status),
                sentence=_TICKET_SENTENCES.get(view.status, ""),
                qr_svg=svg,
            )
        )
    return made


def tickets_mark(views) -> str:
    """What changes when a ticket is replaced or used: the live part's ETag
    carries it (a confirmed purchase's tickets move without moving the
    saga); "" when there are none."""
    if not views:
        return ""
    said = "|".join(f"{view.seat}:{view.status}:{view.code}" for view in views)
    return ".t" + hashlib.blake2s(said.encode(), digest_size=6).hexdigest()


# --- money back ---------------------------------------------------------------------
# docs/refunds.md, "A refund's life": a refund is pending, then succeeded or
# failed; the saga stays CONFIRMED, so the page tells the money apart.


@dataclass(frozen=True)
class RefundView:
    """One refund as the buyer reads it: never the seller's reason, only the
    sentence written for the buyer (``public_reason``)."""

    id: str
    amount: str
    status: str  # pending | succeeded | failed (the API's)
    words: str  # the status in words
    sentence: str  # what happened, for the buyer
    seats: list[str]
    created_at: datetime
    settled_at: datetime | None


REFUND_WORDS = {
    "pending": "On its way",
    "succeeded": "Refunded",
    "failed": "Not refunded yet",
}
_REFUND_NEXT = {
    "pending": "We asked the bank to pay it back; this page follows it.",
    "succeeded": "Paid back to the card you paid with (banks take a few days to show it).",
    "failed": "The bank refused this refund. Our team has been told and will sort it out.",
}


def refund_view(refund) -> RefundView:
    """A refund row (``purchases.refunds.selectors.purchase_refunds``) in words."""
    return RefundView(
        id=str(refund.pk),
        amount=format_money(refund.amount, refund.currency),
        status=refund.status,
        words=REFUND_WORDS.get(refund.status, refund.status),
        sentence=f"{refund.public_reason} {_REFUND_NEXT.get(refund.status, '')}".strip(),
        seats=list(refund.seats),
        created_at=refund.created_at,
        settled_at=refund.settled_at,
    )


@dataclass(frozen=True)
class MoneyBack:
    """What a confirmed purchase's refunds add up to (minor units)."""

    total: int
    refunded: int  # succeeded
    pending: int  # asked for, not settled
    failed: int  # how many refunds failed
    currency: str

    @property
    def state(self) -> str:
        """``full``, ``pending``, ``partial``, ``failed`` or ``none``: the
        page's ``data-refund-state``."""
        if self.total and self.refunded >= self.total:
            return "full"
        if self.pending:
            return "pending"
        if self.refunded:
            return "partial"
        return "failed" if self.failed else "none"

    def money(self, amount: int) -> str:
        return format_money(amount, self.currency)


def money_back_status(money: MoneyBack, *, live_seats: int) -> Status | None:
    """A confirmed purchase's status once money went back (None: none did,
    the saga's own words stand)."""
    state = money.state
    tickets = "Your remaining tickets are below." if live_seats else ""
    if state == "full":
        return Status(
            "Refunded in full",
            f"Everything you paid, {money.money(money.total)}, was refunded.",
            "success",
        )
    if state == "pending":
        return Status(
            "Refund on its way",
            f"We are paying back {money.money(money.pending)}; this page follows it. {tickets}",
            "waiting",
        )
    if state == "partial":
        return Status(
            "Partly refunded",
            f"{money.money(money.refunded)} of {money.money(money.total)} was paid back. {tickets}",
            "success",
        )
    if state == "failed":
        return Status(
            "Confirmed, refund delayed",
            "A refund could not be made yet; our team has been told. " + tickets,
            "waiting",
        )
    return None
