"""The dashboard's seat map: an SVG drawn from the seats' ``x`` and ``y``
(docs/api.md, "Events, seat maps and prices"), each seat marked by its
status with a shape as well as a colour (a legend that does not rely on
colour: an outlined circle is free, a hatched one held, a crossed dark one
sold, a slashed square blocked).

Drawn here as text rather than by the template engine: one ``<use>`` per
seat, so that a hall of tens of thousands of seats is drawn in a few
milliseconds. Seats made before seat maps had coordinates (all at 0, 0) are
laid out by row and number instead.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

STATUSES = ("available", "held", "sold", "unavailable")
# What a status is called on the pages, and the shape that shows it.
STATUS_WORDS = {
    "available": ("Free", "outlined circle"),
    "held": ("Held", "hatched circle, dashed edge"),
    "sold": ("Sold", "dark circle, crossed"),
    "unavailable": ("Blocked", "grey square, slashed"),
}

# One symbol per status, in a 2 × 2 box centred on the seat.
SYMBOLS = """<defs>
<pattern id="hatch" width="0.5" height="0.5" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="0.5" height="0.5" fill="#fff4d6"/><line x1="0" y1="0" x2="0" y2="0.5" stroke="#6b4300" stroke-width="0.22"/></pattern>
<symbol id="seat-available" viewBox="-1 -1 2 2"><circle r="0.8" fill="#ffffff" stroke="#14532d" stroke-width="0.3"/></symbol>
<symbol id="seat-held" viewBox="-1 -1 2 2"><circle r="0.8" fill="url(#hatch)" stroke="#6b4300" stroke-width="0.3" stroke-dasharray="0.45 0.25"/></symbol>
<symbol id="seat-sold" viewBox="-1 -1 2 2"><circle r="0.85" fill="#1f2937"/><path d="M-0.4-0.4L0.4 0.4M0.4-0.4L-0.4 0.4" stroke="#ffffff" stroke-width="0.25"/></symbol>
<symbol id="seat-unavailable" viewBox="-1 -1 2 2"><rect x="-0.8" y="-0.8" width="1.6" height="1.6" fill="#d1d5db" stroke="#4b5563" stroke-width="0.2"/><path d="M-0.8 0.8L0.8-0.8" stroke="#4b5563" stroke-width="0.25"/></symbol>
</defs>"""  # noqa: E501 - one symbol a line reads best
# The symbols, once per page, for the map and the legend (which is drawn
# when the map is not).
DEFINITIONS = mark_safe(  # noqa: S308 - constant markup
    '<svg class="seat-symbols" width="0" height="0" aria-hidden="true" focusable="false" '
    f'style="position: absolute" xmlns="http://www.w3.org/2000/svg">{SYMBOLS}</svg>'
)


@dataclass(frozen=True)
class SeatMark:
    ref: str
    row: str
    number: int
    section: str
    status: str
    x: float
    y: float
    accessible: bool = False


@dataclass(frozen=True)
class Drawing:
    svg: SafeString
    seats: int
    laid_out: bool  # by row and number, the seats having no coordinates


def marks(seats: Iterable) -> list[SeatMark]:
    """Seat rows (``purchases.models.Seat``) as what the drawing needs."""
    return [
        SeatMark(s.ref, s.row, s.number, s.section, s.status, float(s.x), float(s.y), s.accessible)
        for s in seats
    ]


def _pitch(seats: Sequence[SeatMark]) -> float:
    """The usual distance between neighbours in a row: a seat's size."""
    by_y: dict[float, list[float]] = defaultdict(list)
    for seat in seats:
        by_y[seat.y].append(seat.x)
    gaps = [b - a for xs in by_y.values() for a, b in zip(sorted(xs), sorted(xs)[1:], strict=False)]
    gaps = [g for g in gaps if g > 0]
    return statistics.median(gaps) if gaps else 1.0


def _laid_out(seats: Sequence[SeatMark]) -> list[SeatMark]:
    """Seats without coordinates, placed by section, row and number."""
    rows = sorted({(s.section, s.row) for s in seats})
    line = {key: index for index, key in enumerate(rows)}
    return [
        SeatMark(
            ref=s.ref,
            row=s.row,
            number=s.number,
            section=s.section,
            status=s.status,
            x=float(s.number),
            y=line[(s.section, s.row)] * 1.2,
            accessible=s.accessible,
        )
        for s in seats
    ]


def _title(seat: SeatMark) -> str:
    where = f"{seat.section}, " if seat.section else ""
    extra = ", accessible" if seat.accessible else ""
    word = STATUS_WORDS.get(seat.status, (seat.status, ""))[0].lower()
    return f"{seat.ref} ({where}row {seat.row}, seat {seat.number}{extra}): {word}"


def draw(seats: Sequence[SeatMark], *, label: str) -> Drawing:
    """The seat map as an inline SVG, scaled to its box; ``label`` is what a
    screen reader hears (the counts, said in words beside it too)."""
    placed = list(seats)
    laid_out = len({(s.x, s.y) for s in placed}) < len(placed)
    if laid_out:
        placed = _laid_out(placed)
    size = _pitch(placed) * 0.9 if placed else 1.0
    if placed:
        left, right = min(s.x for s in placed), max(s.x for s in placed)
        top, bottom = min(s.y for s in placed), max(s.y for s in placed)
    else:
        left = right = top = bottom = 0.0
    pad = size
    box = (left - pad, top - pad, right - left + 2 * pad, bottom - top + 2 * pad)
    uses = "".join(
        f'<use href="#seat-{escape(s.status)}" x="{s.x - size / 2:.3f}" y="{s.y - size / 2:.3f}" '
        f'width="{size:.3f}" height="{size:.3f}" data-seat="{escape(s.ref)}" '
        f'data-seat-status="{escape(s.status)}"><title>{escape(_title(s))}</title></use>'
        for s in placed
    )
    svg = (
        f'<svg class="seat-svg" role="img" aria-label="{escape(label)}" '
        f'viewBox="{box[0]:.3f} {box[1]:.3f} {box[2]:.3f} {box[3]:.3f}" '
        f'preserveAspectRatio="xMidYMin meet" xmlns="http://www.w3.org/2000/svg">'
        f"{uses}</svg>"
    )
    return Drawing(svg=mark_safe(svg), seats=len(placed), laid_out=laid_out)  # noqa: S308 - escaped above


def legend_symbol(status: str) -> SafeString:
    """A small picture of a status's mark, for the legend (the symbols are
    :data:`DEFINITIONS`, drawn once on the page)."""
    return mark_safe(  # noqa: S308 - a status from STATUSES
        f'<svg class="legend-mark" viewBox="-1 -1 2 2" aria-hidden="true" focusable="false">'
        f'<use href="#seat-{escape(status)}" x="-1" y="-1" width="2" height="2"/></svg>'
    )
