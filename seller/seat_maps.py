"""Events as data: a seller's event, price categories and seat map, read
from JSON or CSV and validated whole (docs/api.md, "Events, seat maps and
prices").

Nothing here touches the database. The parsers turn the request's data into
frozen specs (:class:`EventSpec`, :class:`CategorySpec`, :class:`SeatSpec`)
or raise :class:`SeatMapInvalid` listing every problem found, in input
order, each named by its path (``seat_map.sections[0].rows[2].seats[5].ref``,
``price_categories[1].code``) or its CSV line (``line 17: ref``; line 1 is
the header). Plain Python, one pass, no serializer per seat: a map of
100,000 seats is read in a fraction of a second, and a path is only
formatted for a seat that has a problem.

The services check a spec again before writing it (:func:`check_seats`,
:func:`check_categories`): a spec built by hand (a command, a test) meets
the same rules as one read from a request.
"""

from __future__ import annotations

import csv
import gc
import io
import re
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from common.money import UnknownCurrency, minor_units_exponent

MAX_SEATS = 100_000
# Problems reported at most (then one "... and N more").
MAX_ERRORS = 100
REF_MAX = 32
SECTION_MAX = 64
ROW_MAX = 16
CODE_MAX = 32
CATEGORY_NAME_MAX = 100
EVENT_NAME_MAX = 200
BLOCK_REASON_MAX = 200
HOLD_SECONDS_MIN, HOLD_SECONDS_MAX = 60, 3600
# PostgreSQL's integer (the seat's number, a price in minor units).
MAX_INT = 2**31 - 1
# The highest price of a seat, in minor units (999,999.99): Stripe's own
# ceiling for one charge in most currencies, and low enough that a purchase's
# total (at most MAX_SEATS_PER_PURCHASE seats, at most 20: config/settings.py)
# stays inside the integer columns that hold it.
PRICE_MAX = 99_999_999
# Times an event may name (any later one is a mistake, and stays inside
# datetime's range whatever its offset).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)
_OPTIONAL_INTS = {
    "hold_seconds": (HOLD_SECONDS_MIN, HOLD_SECONDS_MAX),
    "max_seats_per_buyer": (1, MAX_INT),
}
_NULLABLE_TIMES = frozenset({"sales_start", "sales_end", "buyer_can_cancel_until"})
# A price category's code: slug-like (letters, digits, "-" and "_").
CODE = re.compile(rf"[A-Za-z0-9_-]{{1,{CODE_MAX}}}")
CURRENCY = re.compile(r"[A-Z]{3}")
CSV_COLUMNS = ("section", "row", "number", "ref", "category", "x", "y", "accessible")
# Columns a CSV may leave out (their default: "", 0, 0, false).
CSV_OPTIONAL = frozenset({"section", "x", "y", "accessible"})
_COLUMNS = ",".join(CSV_COLUMNS)
_NUMBER = (int, float)  # exactly: bool is an int to Python, never a number here
_FLOAT_MAX = sys.float_info.max
_TRUE = frozenset({"true", "1", "yes", "y"})
_FALSE = frozenset({"false", "0", "no", "n", ""})
# The path of the one error that stands for a body that is not an object,
# as DRF names it.
NON_FIELD = "non_field_errors"


@dataclass(frozen=True, slots=True)
class CategorySpec:
    code: str
    name: str
    price_amount: int  # minor units
    currency: str


@dataclass(frozen=True, slots=True)
class SeatSpec:
    section: str
    row: str
    number: int
    ref: str
    category: str  # a CategorySpec's code
    x: float = 0.0
    y: float = 0.0
    accessible: bool = False


@dataclass(frozen=True)
class EventSpec:
    name: str
    starts_at: datetime
    currency: str
    sales_start: datetime | None = None
    sales_end: datetime | None = None
    hold_seconds: int | None = None  # None: PURCHASE_HOLD_SECONDS
    max_seats_per_buyer: int | None = None  # None: no limit
    buyer_can_cancel_until: datetime | None = None  # None: buyers never cancel
    cancel_fee_percent: int = 0
    categories: list[CategorySpec] = field(default_factory=list)
    seats: list[SeatSpec] = field(default_factory=list)


@contextmanager
def _bulk() -> Iterator[None]:
    """Reading a map makes a million objects that all stay alive and form no
    cycle: the cyclic collector would walk them again and again, as much
    work as the reading itself (measured: 1.4 s against 0.7 s of CPU for a
    100,000-line CSV). Off for the while, as it was after; a decorator of
    the readers."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class SeatMapInvalid(Exception):
    """The input breaks the rules: ``errors`` lists (path, message), in input
    order, at most ``MAX_ERRORS`` of them and then ``("...", "... and N
    more")``. The first is what the 400's ``field`` and ``detail`` name."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__(f"{errors[0][0]}: {errors[0][1]}" if errors else "invalid")
        self.errors = errors


class Problems:
    """The problems found so far (all counted, the first ``MAX_ERRORS`` kept)."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []
        self.count = 0

    def add(self, path: str, message: str) -> None:
        self.count += 1
        if len(self.found) < MAX_ERRORS:
            self.found.append((path, message))

    def check(self) -> None:
        """Raise :class:`SeatMapInvalid` if any problem was found."""
        if not self.count:
            return
        errors = list(self.found)
        if self.count > MAX_ERRORS:
            errors.append(("...", f"... and {self.count - MAX_ERRORS} more"))
        raise SeatMapInvalid(errors)


# --- single values: a message, or None when the value is fine ---------------------------


def text_problem(value: object, *, most: int, least: int = 1) -> str | None:
    """A label (a ref, a row, a section): a string of ``least`` to ``most``
    printable characters, without surrounding spaces (the purchase API
    trims them, so such a seat could never be named)."""
    if not isinstance(value, str):
        return "must be a string"
    if not least <= len(value) <= most:
        if least == 0:
            return f"must be at most {most} characters"
        return f"must be {least} to {most} characters"
    if not value.isprintable():
        return "must hold printable characters only"
    if value != value.strip():
        return "must not start or end with a space"
    return None


def name_problem(value: object, *, most: int) -> str | None:
    """A name (of an event, of a category): 1 to ``most`` printable
    characters once trimmed (:func:`clean_name` trims it)."""
    if not isinstance(value, str):
        return "must be a string"
    return text_problem(value.strip(), most=most)


def clean_name(value: str) -> str:
    return value.strip()


def code_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if not CODE.fullmatch(value):
        return f"must be 1 to {CODE_MAX} letters, digits, '-' or '_'"
    return None


def int_problem(value: object, *, least: int, most: int = MAX_INT) -> str | None:
    # bool is an int to Python, never a number here; 5.0 is not an integer.
    if type(value) is not int:
        return "must be an integer"
    if not least <= value <= most:
        return f"must be from {least} to {most}"
    return None


def coordinate_problem(value: object) -> str | None:
    if type(value) not in _NUMBER:
        return "must be a number"
    # Compared, not converted: an integer beyond any float is refused, not
    # an OverflowError; NaN compares false.
    if not -_FLOAT_MAX <= value <= _FLOAT_MAX:  # type: ignore[operator]  # int or float, checked
        return "must be a finite number"
    return None


def currency_problem(value: object) -> str | None:
    if not isinstance(value, str) or not CURRENCY.fullmatch(value):
        return "must be 3 upper-case letters (ISO 4217)"
    try:
        minor_units_exponent(value)
    except UnknownCurrency:
        return f"{value} is not an ISO 4217 currency"
    return None


def time_problem(value: object) -> str | None:
    """A time the database stores and every answer can show in UTC."""
    if not isinstance(value, datetime) or timezone.is_naive(value):
        return "must be a date and time with its offset"
    # Compared, never converted: a time near year 1 or 9999 with an offset
    # would leave datetime's range in UTC (an OverflowError, not an answer).
    if not EARLIEST <= value < LATEST:
        return f"must be from {EARLIEST.year} to {LATEST.year - 1}"
    return None


def parse_time(value: object) -> tuple[datetime | None, str | None]:
    """An ISO 8601 date and time (a time without an offset is UTC's, the
    project's zone), or the problem with it."""
    if not isinstance(value, str):
        return None, "must be an ISO 8601 date and time"
    try:
        parsed = parse_datetime(value.strip())
    except ValueError:  # well formed, yet no such time (a 13th month)
        parsed = None
    if parsed is None:
        return None, "must be an ISO 8601 date and time"
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=UTC)
    problem = time_problem(parsed)
    return (None, problem) if problem else (parsed, None)


def field_problem(key: str, value: object) -> str | None:
    """The problem with an event's own field (by the model's name), as a
    service is given it (typed already), or None."""
    if key in _NULLABLE_TIMES:
        return None if value is None else time_problem(value)
    if key in _OPTIONAL_INTS:
        least, most = _OPTIONAL_INTS[key]
        return None if value is None else int_problem(value, least=least, most=most)
    checks: dict[str, Callable[[object], str | None]] = {
        "name": lambda v: name_problem(v, most=EVENT_NAME_MAX),
        "starts_at": time_problem,
        "currency": currency_problem,
        "cancel_fee_percent": lambda v: int_problem(v, least=0, most=100),
    }
    if key not in checks:
        return "is not a field of an event that changes"
    return checks[key](value)


# The request's name of each of the event's fields that is named otherwise.
API_FIELD = {
    "cancel_fee_percent": "refund_policy.fee_percent",
    "buyer_can_cancel_until": "refund_policy.buyer_can_cancel_until",
    "categories": "price_categories",
}


# --- price categories --------------------------------------------------------------------


def categories_from_json(
    data: object, *, currency: str | None, path: str = "price_categories"
) -> list[CategorySpec]:
    """The price categories of ``data`` (a JSON list), all in ``currency``
    (None: not checked here, e.g. when the event's own is invalid)."""
    problems = Problems()
    found = read_categories(data, currency=currency, path=path, problems=problems)
    problems.check()
    return found


def read_categories(
    data: object, *, currency: str | None, path: str, problems: Problems
) -> list[CategorySpec]:
    """As :func:`categories_from_json`, adding its problems to ``problems``.
    Every well-formed code is kept in the answer's order even when the rest
    of its category is not (so that seats naming it are not refused too),
    but a category with a problem is not returned."""
    if not isinstance(data, list):
        problems.add(path, "must be a list")
        return []
    found: list[CategorySpec] = []
    seen: dict[str, int] = {}
    for n, item in enumerate(data):
        at = f"{path}[{n}]"
        before = problems.count
        spec = _category(item, at=at, currency=currency, problems=problems)
        code = item.get("code") if isinstance(item, dict) else None
        if isinstance(code, str) and code in seen:
            problems.add(f"{at}.code", f"{code!r} is already the code of {path}[{seen[code]}]")
        elif isinstance(code, str):
            seen[code] = n
        if spec is not None and problems.count == before:
            found.append(spec)
    return found


def _category(
    item: object, *, at: str, currency: str | None, problems: Problems
) -> CategorySpec | None:
    if not isinstance(item, dict):
        problems.add(at, "must be an object with code, name and price")
        return None
    code, name, price = item.get("code"), item.get("name"), item.get("price")
    ok = True
    for key, value, problem in (
        ("code", code, code_problem(code)),
        ("name", name, name_problem(name, most=CATEGORY_NAME_MAX)),
    ):
        if problem:
            problems.add(f"{at}.{key}", "this field is required" if value is None else problem)
            ok = False
    if not isinstance(price, dict):
        problems.add(f"{at}.price", "must be an object with amount and currency")
        return None
    amount, money = price.get("amount"), price.get("currency")
    if problem := int_problem(amount, least=0, most=PRICE_MAX):
        problems.add(f"{at}.price.amount", problem)
        ok = False
    if problem := currency_problem(money):
        problems.add(f"{at}.price.currency", problem)
        ok = False
    elif currency is not None and money != currency:
        problems.add(f"{at}.price.currency", f"must be the event's currency, {currency}")
        ok = False
    if not ok:
        return None
    return CategorySpec(
        code=item["code"],
        name=clean_name(item["name"]),
        price_amount=price["amount"],
        currency=price["currency"],
    )


def check_categories(categories: Iterable[CategorySpec], *, currency: str) -> None:
    """A hand-built list of categories meets the rules of a parsed one."""
    problems = Problems()
    seen: set[str] = set()
    for n, spec in enumerate(categories):
        at = f"price_categories[{n}]"
        for key, problem in (
            ("code", code_problem(spec.code)),
            ("name", name_problem(spec.name, most=CATEGORY_NAME_MAX)),
            ("price.amount", int_problem(spec.price_amount, least=0, most=PRICE_MAX)),
        ):
            if problem:
                problems.add(f"{at}.{key}", problem)
        if spec.currency != currency:
            problems.add(f"{at}.price.currency", f"must be the event's currency, {currency}")
        if spec.code in seen:
            problems.add(f"{at}.code", f"{spec.code!r} is the code of an earlier category")
        seen.add(spec.code)
    problems.check()


# --- seats ---------------------------------------------------------------------------------


class _Seats:
    """What reading one seat map needs: where problems go, the refs seen
    (and where), and the category codes a seat may name (None: any
    well-formed code)."""

    def __init__(self, problems: Problems, codes: Collection[str] | None) -> None:
        self.problems = problems
        self.codes = codes
        self.seen: dict[str, Any] = {}
        self.found: list[SeatSpec] = []
        # The (section, row) pairs found fine so far.
        self.places: set[tuple[str, str]] = set()

    def quick(
        self,
        section: str,
        row: str,
        number: object,
        ref: object,
        category: object,
        x: object,
        y: object,
        accessible: object,
        where: Any,
    ) -> bool:
        """Keep the seat if nothing is wrong with it, in one expression (the
        way nearly every seat goes: 100,000 of them take a fraction of a
        second); False, keeping nothing, when something is: :meth:`seat`
        then says what."""
        if not self.fine(number, ref, category, x, y, accessible):
            return False
        self.seen[cast(str, ref)] = where
        self.found.append(
            SeatSpec(section, row, number, ref, category, float(x), float(y), accessible)  # type: ignore[arg-type]  # checked by fine()
        )
        return True

    def fine(
        self,
        number: object,
        ref: object,
        category: object,
        x: object,
        y: object,
        accessible: object,
    ) -> bool:
        """Whether nothing is wrong with a seat's own values (and its ref is new)."""
        codes = self.codes
        return (
            type(number) is int
            and 1 <= number <= MAX_INT
            and type(ref) is str
            and 1 <= len(ref) <= REF_MAX
            and ref.isprintable()
            and ref[0] != " "
            and ref[-1] != " "
            and ref not in self.seen
            and type(category) is str
            and (CODE.fullmatch(category) is not None if codes is None else category in codes)
            and type(x) in _NUMBER
            and type(y) in _NUMBER
            and -_FLOAT_MAX <= x <= _FLOAT_MAX  # type: ignore[operator]  # int or float, checked
            and -_FLOAT_MAX <= y <= _FLOAT_MAX  # type: ignore[operator]  # int or float, checked
            and type(accessible) is bool
        )

    def seat(
        self,
        section: str,
        row: str,
        values: Mapping[str, Any],
        *,
        at: Callable[[str], str],
        where: Any,
        describe: Callable[[Any], str],
    ) -> None:
        """Check a seat's own values (``number``, ``ref``, ``category``, ``x``,
        ``y``, ``accessible``, converted already; section and row are checked
        by the caller) and keep it. ``where`` locates it for a later
        duplicate's message (``describe(where)``)."""
        before = self.problems.count
        ref, number, category = values.get("ref"), values.get("number"), values.get("category")
        x, y, accessible = values.get("x", 0), values.get("y", 0), values.get("accessible", False)
        for key, problem in (
            ("number", int_problem(number, least=1)),
            ("ref", text_problem(ref, most=REF_MAX)),
            ("category", self._category_problem(category)),
            ("x", coordinate_problem(x)),
            ("y", coordinate_problem(y)),
            ("accessible", None if type(accessible) is bool else "must be true or false"),
        ):
            if problem:
                missing = key in ("number", "ref", "category") and key not in values
                self.problems.add(at(key), "this field is required" if missing else problem)
        if isinstance(ref, str):
            if ref in self.seen:
                self.problems.add(
                    at("ref"), f"{ref!r} is already the ref of {describe(self.seen[ref])}"
                )
            else:
                self.seen[ref] = where
        if self.problems.count == before:
            self.found.append(
                SeatSpec(
                    section,
                    row,
                    values["number"],
                    values["ref"],
                    values["category"],
                    float(x),
                    float(y),
                    accessible,
                )
            )

    def _category_problem(self, category: object) -> str | None:
        if self.codes is None or not isinstance(category, str):
            return code_problem(category)
        if category not in self.codes:
            return f"no price category {category!r}"
        return None


@_bulk()
def seats_from_json(
    seat_map: object, *, path: str = "seat_map", categories: Collection[str] | None = None
) -> list[SeatSpec]:
    """The seats of a JSON seat map (``{"sections": [{"name", "rows":
    [{"label", "seats": [{"ref", "number", "category", "x"?, "y"?,
    "accessible"?}]}]}]}``), in its order. ``categories``: the codes a seat
    may name (None: any well-formed code)."""
    problems = Problems()
    found = read_seats_json(seat_map, path=path, categories=categories, problems=problems)
    problems.check()
    return found


def _count_json_seats(sections: list) -> int:
    return sum(
        len(row["seats"])
        for section in sections
        if isinstance(section, dict) and isinstance(section.get("rows"), list)
        for row in section["rows"]
        if isinstance(row, dict) and isinstance(row.get("seats"), list)
    )


def read_seats_json(
    seat_map: object, *, path: str, categories: Collection[str] | None, problems: Problems
) -> list[SeatSpec]:
    """As :func:`seats_from_json`, adding its problems to ``problems``."""
    if not isinstance(seat_map, dict):
        problems.add(path, "must be an object with sections")
        return []
    sections = seat_map.get("sections")
    if not isinstance(sections, list):
        problems.add(f"{path}.sections", "must be a list")
        return []
    total = _count_json_seats(sections)
    if total > MAX_SEATS:
        problems.add(path, f"has {total} seats: at most {MAX_SEATS} are taken")
        return []
    seats = _Seats(problems, categories)
    for i, section in enumerate(sections):
        _read_section(section, at=f"{path}.sections[{i}]", seats=seats, path=path, i=i)
    return seats.found


def _under(prefix: str) -> Callable[[str], str]:
    """A seat's field's path: ``prefix`` and the field's name."""

    def at(key: str) -> str:
        return prefix + key

    return at


def _describe_json(path: str) -> Callable[[Any], str]:
    def describe(where: tuple[int, int, int]) -> str:
        i, j, k = where
        return f"{path}.sections[{i}].rows[{j}].seats[{k}]"

    return describe


def _read_section(section: object, *, at: str, seats: _Seats, path: str, i: int) -> None:
    problems = seats.problems
    if not isinstance(section, dict):
        problems.add(at, "must be an object with name and rows")
        return
    name = section.get("name", "")
    if problem := text_problem(name, least=0, most=SECTION_MAX):
        problems.add(f"{at}.name", problem)
    rows = section.get("rows")
    if not isinstance(rows, list):
        problems.add(f"{at}.rows", "must be a list")
        return
    describe = _describe_json(path)
    for j, row in enumerate(rows):
        row_at = f"{at}.rows[{j}]"
        if not isinstance(row, dict):
            problems.add(row_at, "must be an object with label and seats")
            continue
        label: Any = row.get("label")
        if problem := text_problem(label, most=ROW_MAX):
            problems.add(f"{row_at}.label", "this field is required" if label is None else problem)
        if not isinstance(row.get("seats"), list):
            problems.add(f"{row_at}.seats", "must be a list")
            continue
        for k, seat in enumerate(row["seats"]):
            if type(seat) is dict and seats.quick(
                name,
                label,
                seat.get("number"),
                seat.get("ref"),
                seat.get("category"),
                seat.get("x", 0),
                seat.get("y", 0),
                seat.get("accessible", False),
                (i, j, k),
            ):
                continue
            seat_at = f"{row_at}.seats[{k}]"
            if not isinstance(seat, dict):
                problems.add(seat_at, "must be an object with ref, number and category")
                continue
            seats.seat(
                name,
                label,
                seat,
                at=_under(seat_at + "."),
                where=(i, j, k),
                describe=describe,
            )


@_bulk()
def seats_from_csv(text: str, *, categories: Collection[str] | None = None) -> list[SeatSpec]:
    """The seats of a CSV seat map, in its order: a header naming the
    columns (``CSV_COLUMNS``; ``section``, ``x``, ``y`` and ``accessible``
    may be left out) in any order, then a seat a line. Cells are trimmed;
    blank lines are skipped; ``accessible`` is true/false, yes/no or 1/0
    (empty: false); empty ``x`` or ``y``: 0. Problems are named
    ``line N: column`` (line 1 is the header)."""
    problems = Problems()
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""), strict=True)
    records: list[tuple[int, list[str]]] = []
    line = 1
    try:
        for record in reader:
            if "".join(record).strip():
                records.append((line, record))
            line = reader.line_num + 1
    except csv.Error as exc:  # a NUL byte, a quote that never closes
        problems.add(f"line {line}", f"not CSV: {exc}")
        problems.check()
    if not records or records[0][0] != 1:
        problems.add("line 1", f"must be the header: {','.join(CSV_COLUMNS)}")
        problems.check()
    columns = _header(records[0][1], problems)
    problems.check()
    if len(records) - 1 > MAX_SEATS:
        problems.add("seat_map", f"has {len(records) - 1} seats: at most {MAX_SEATS} are taken")
        problems.check()
    seats = _Seats(problems, categories)
    # Where each column is (None: left out), in CSV_COLUMNS's order.
    positions = tuple(columns.index(name) if name in columns else None for name in CSV_COLUMNS)
    for line, record in records[1:]:
        if len(record) != len(columns):
            problems.add(f"line {line}", f"has {len(record)} fields, the header {len(columns)}")
        else:
            _read_csv_line(
                line, [record[p].strip() if p is not None else "" for p in positions], seats
            )
    problems.check()
    return seats.found


def _header(record: list[str], problems: Problems) -> list[str]:
    columns = [cell.strip().lower() for cell in record]
    for n, name in enumerate(columns):
        if name not in CSV_COLUMNS:
            problems.add(
                f"line 1: {name}", f"unknown column (the columns: {','.join(CSV_COLUMNS)})"
            )
        elif name in columns[:n]:
            problems.add(f"line 1: {name}", "named twice")
    for name in CSV_COLUMNS:
        if name not in columns and name not in CSV_OPTIONAL:
            problems.add(f"line 1: {name}", "this column is required")
    return columns


def _read_csv_line(line: int, cells: list[str], seats: _Seats) -> None:
    """One seat of a CSV seat map: its trimmed ``cells`` in ``CSV_COLUMNS``'s
    order ("" for a column left out)."""
    section, row, number, ref, category, x, y, flag = cells
    if (section, row) not in seats.places:
        _check_place(section, row, seats, at=_under(f"line {line}: "))
    whole = int(number) if number.isascii() and number.isdigit() else number
    across, down, accessible = _csv_number(x), _csv_number(y), _csv_flag(flag)
    if seats.quick(section, row, whole, ref, category, across, down, accessible, line):
        return
    values = {
        "number": whole,
        "ref": ref,
        "category": category,
        "x": across,
        "y": down,
        "accessible": accessible,
    }
    seats.seat(
        section,
        row,
        values,
        at=_under(f"line {line}: "),
        where=line,
        describe=lambda where: f"line {where}",
    )


def _csv_flag(cell: str) -> object:
    flag = cell.lower()
    return True if flag in _TRUE else False if flag in _FALSE else cell


def _check_place(section: str, row: str, seats: _Seats, *, at: Callable[[str], str]) -> None:
    """Check a seat's section and row (each pair once: they repeat)."""
    fine = True
    for key, problem in (
        ("section", text_problem(section, least=0, most=SECTION_MAX)),
        ("row", text_problem(row, most=ROW_MAX)),
    ):
        if problem:
            seats.problems.add(at(key), problem)
            fine = False
    if fine:
        seats.places.add((section, row))


def _csv_number(cell: str) -> object:
    if not cell:
        return 0.0
    try:
        return float(cell)
    except ValueError:
        return cell  # not a number: the check says so


@_bulk()
def check_seats(seats: Iterable[SeatSpec], *, categories: Collection[str]) -> None:
    """A hand-built list of seats meets the rules of a parsed one, each
    naming one of ``categories`` (codes); problems are named
    ``seats[N].field``."""
    problems = Problems()
    checked = _Seats(problems, categories)
    for n, spec in enumerate(seats):
        if (spec.section, spec.row) not in checked.places:
            _check_place(spec.section, spec.row, checked, at=_under(f"seats[{n}]."))
        values = {
            "number": spec.number,
            "ref": spec.ref,
            "category": spec.category,
            "x": spec.x,
            "y": spec.y,
            "accessible": spec.accessible,
        }
        if checked.fine(**values):
            checked.seen[spec.ref] = n
            continue
        checked.seat(
            spec.section,
            spec.row,
            values,
            at=_under(f"seats[{n}]."),
            where=n,
            describe=lambda where: f"seats[{where}]",
        )
    problems.check()


# --- the event -----------------------------------------------------------------------------


@_bulk()
def event_from_json(data: object) -> EventSpec:
    """The event of a ``POST /api/organizers/{slug}/events/`` body (name,
    starts_at, currency, the sales window, hold_seconds,
    max_seats_per_buyer, refund_policy, price_categories, seat_map)."""
    if not isinstance(data, dict):
        raise SeatMapInvalid([(NON_FIELD, "expected a JSON object")])
    problems = Problems()
    fields = read_event_fields(data, problems=problems, required=True)
    categories = read_categories(
        data.get("price_categories", []),
        currency=fields.get("currency"),
        path="price_categories",
        problems=problems,
    )
    seats: list[SeatSpec] = []
    if data.get("seat_map") is not None:
        seats = read_seats_json(
            data["seat_map"],
            path="seat_map",
            categories=_well_formed_codes(data.get("price_categories")),
            problems=problems,
        )
    problems.check()
    return EventSpec(**fields, categories=categories, seats=seats)


def _well_formed_codes(data: object) -> set[str] | None:
    """The codes of the categories of ``data`` that are well formed (the
    seats may name them, whatever else is wrong with their category); None
    (any well-formed code) when ``data`` is not even a list, which is the
    one problem then reported (none is, when it is None: no categories)."""
    if data is None:
        return set()
    if not isinstance(data, list):
        return None
    return {
        item["code"]
        for item in data
        if isinstance(item, dict) and code_problem(item.get("code")) is None
    }


def read_event_fields(data: dict, *, problems: Problems, required: bool) -> dict[str, Any]:
    """The event's own fields present in ``data`` (all but the categories
    and the seat map), by the model's names (``cancel_fee_percent``...).
    ``required``: name, starts_at and currency must be there (a create);
    otherwise only what is sent is read (a PATCH)."""
    fields: dict[str, Any] = {}
    if "name" in data or required:
        if problem := name_problem(data.get("name"), most=EVENT_NAME_MAX):
            problems.add("name", "this field is required" if "name" not in data else problem)
        else:
            fields["name"] = clean_name(data["name"])
    _read_time(data, "starts_at", fields, problems, required=required, nullable=False)
    if "currency" in data or required:
        if problem := currency_problem(data.get("currency")):
            problems.add(
                "currency", "this field is required" if "currency" not in data else problem
            )
        else:
            fields["currency"] = data["currency"]
    for key in ("sales_start", "sales_end"):
        _read_time(data, key, fields, problems, required=False, nullable=True)
    for key, (least, most) in _OPTIONAL_INTS.items():
        if key in data:
            value = data[key]
            if value is not None and (problem := int_problem(value, least=least, most=most)):
                problems.add(key, problem)
            else:
                fields[key] = value
    if fields.get("sales_start") and fields.get("sales_end"):
        if fields["sales_start"] >= fields["sales_end"]:
            problems.add("sales_end", "must be after sales_start")
    _read_refund_policy(data, fields, problems)
    return fields


def _read_time(
    data: dict,
    key: str,
    fields: dict,
    problems: Problems,
    *,
    required: bool,
    nullable: bool,
    path: str | None = None,
) -> None:
    """Read the time ``data[key]`` into ``fields[key]``, or add its problem
    (named ``path``, by default ``key``)."""
    if key not in data:
        if required:
            problems.add(path or key, "this field is required")
        return
    if data[key] is None and nullable:
        fields[key] = None
        return
    parsed, problem = parse_time(data[key])
    if problem:
        problems.add(path or key, problem)
    else:
        fields[key] = parsed


def _read_refund_policy(data: dict, fields: dict, problems: Problems) -> None:
    if data.get("refund_policy") is None:
        return
    policy = data["refund_policy"]
    if not isinstance(policy, dict):
        problems.add("refund_policy", "must be an object with buyer_can_cancel_until, fee_percent")
        return
    _read_time(
        policy,
        "buyer_can_cancel_until",
        fields,
        problems,
        required=False,
        nullable=True,
        path="refund_policy.buyer_can_cancel_until",
    )
    if "fee_percent" in policy:
        if problem := int_problem(policy["fee_percent"], least=0, most=100):
            problems.add("refund_policy.fee_percent", problem)
        else:
            fields["cancel_fee_percent"] = policy["fee_percent"]


def event_changes_from_json(data: object, *, currency: str) -> dict[str, Any]:
    """The changes of a ``PATCH`` body, by the model's names (and
    ``categories``: the whole new list of price categories, a list of
    :class:`CategorySpec`), only what is sent. ``currency``: the event's,
    which the categories must be in unless the body changes it too."""
    if not isinstance(data, dict):
        raise SeatMapInvalid([(NON_FIELD, "expected a JSON object")])
    problems = Problems()
    changes = read_event_fields(data, problems=problems, required=False)
    if "price_categories" in data:
        body_currency = data.get("currency", currency)
        changes["categories"] = read_categories(
            data["price_categories"],
            currency=body_currency if currency_problem(body_currency) is None else None,
            path="price_categories",
            problems=problems,
        )
    problems.check()
    return changes


@_bulk()
def seat_map_from_json(
    data: object, *, currency: str, categories: Collection[str]
) -> tuple[list[SeatSpec], list[CategorySpec] | None]:
    """The seats and, if sent, the new price categories of a ``PUT
    .../seat-map/`` JSON body (``{"seat_map": {...}, "price_categories"?:
    [...]}``). The seats may name the categories sent, or else the event's
    (``categories``, codes); ``currency``: the event's."""
    if not isinstance(data, dict):
        raise SeatMapInvalid([(NON_FIELD, "expected a JSON object")])
    problems = Problems()
    new: list[CategorySpec] | None = None
    codes: Collection[str] | None = categories
    if "price_categories" in data:
        new = read_categories(
            data["price_categories"], currency=currency, path="price_categories", problems=problems
        )
        codes = _well_formed_codes(data["price_categories"])
    seats: list[SeatSpec] = []
    if data.get("seat_map") is None:
        problems.add("seat_map", "this field is required")
    else:
        seats = read_seats_json(
            data["seat_map"], path="seat_map", categories=codes, problems=problems
        )
    problems.check()
    return seats, new
