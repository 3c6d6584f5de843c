"""Events as data, read and validated whole without a database
(seller/seat_maps.py; docs/api.md, "Events, seat maps and prices").

Each rule is broken once on its own, and the problem must come back named by
its path (JSON) or its line (CSV) with nothing else wrong; several problems
come back together, in input order; a map past the seat limit is refused in
one error before any seat is read.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seller import seat_maps
from seller.seat_maps import (
    MAX_ERRORS,
    MAX_SEATS,
    CategorySpec,
    SeatMapInvalid,
    SeatSpec,
    check_categories,
    check_seats,
    event_changes_from_json,
    event_from_json,
    seat_map_from_json,
    seats_from_csv,
    seats_from_json,
)

SEAT = "seat_map.sections[0].rows[0].seats"


def body() -> dict:
    """A valid create body: two categories, two sections, four seats."""
    return {
        "name": "  Tosca  ",
        "starts_at": "2027-03-01T19:30:00+01:00",
        "currency": "EUR",
        "sales_start": "2027-01-01T09:00:00Z",
        "sales_end": "2027-03-01T18:00:00Z",
        "hold_seconds": 600,
        "max_seats_per_buyer": 6,
        "refund_policy": {"buyer_can_cancel_until": "2027-02-20T00:00:00Z", "fee_percent": 10},
        "price_categories": [
            {"code": "stalls", "name": "Stalls", "price": {"amount": 5000, "currency": "EUR"}},
            {"code": "balcony", "name": "Balcony", "price": {"amount": 0, "currency": "EUR"}},
        ],
        "seat_map": {
            "sections": [
                {
                    "name": "Stalls",
                    "rows": [
                        {
                            "label": "A",
                            "seats": [
                                {"ref": "A1", "number": 1, "category": "stalls", "x": 0, "y": 0},
                                {
                                    "ref": "A2",
                                    "number": 2,
                                    "category": "stalls",
                                    "x": 1.5,
                                    "y": -2,
                                    "accessible": True,
                                },
                            ],
                        }
                    ],
                },
                {
                    "name": "Balcony",
                    "rows": [
                        {
                            "label": "B",
                            "seats": [
                                {"ref": "B1", "number": 1, "category": "balcony"},
                                {"ref": "B-2 (restricted)", "number": 2, "category": "balcony"},
                            ],
                        }
                    ],
                },
            ]
        },
    }


def problems(call: Callable[[], object]) -> list[tuple[str, str]]:
    with pytest.raises(SeatMapInvalid) as refused:
        call()
    return refused.value.errors


def only_problem(data: dict) -> tuple[str, str]:
    found = problems(lambda: event_from_json(data))
    assert len(found) == 1, found
    return found[0]


# --- a valid event ---------------------------------------------------------------------------


def test_a_valid_body_reads_into_an_event_spec():
    spec = event_from_json(body())

    assert spec.name == "Tosca"  # trimmed
    assert spec.starts_at == datetime(2027, 3, 1, 18, 30, tzinfo=UTC)
    assert (spec.currency, spec.hold_seconds, spec.max_seats_per_buyer) == ("EUR", 600, 6)
    assert spec.sales_start == datetime(2027, 1, 1, 9, tzinfo=UTC)
    assert spec.buyer_can_cancel_until == datetime(2027, 2, 20, tzinfo=UTC)
    assert spec.cancel_fee_percent == 10
    assert spec.categories == [
        CategorySpec("stalls", "Stalls", 5000, "EUR"),
        CategorySpec("balcony", "Balcony", 0, "EUR"),
    ]
    assert spec.seats == [
        SeatSpec("Stalls", "A", 1, "A1", "stalls", 0.0, 0.0, False),
        SeatSpec("Stalls", "A", 2, "A2", "stalls", 1.5, -2.0, True),
        SeatSpec("Balcony", "B", 1, "B1", "balcony"),
        SeatSpec("Balcony", "B", 2, "B-2 (restricted)", "balcony"),
    ]
    assert all(type(s.x) is float and type(s.y) is float for s in spec.seats)


def test_the_least_body_is_a_name_a_time_and_a_currency():
    spec = event_from_json({"name": "Gig", "starts_at": "2027-03-01T20:00", "currency": "JPY"})

    # A time without an offset is UTC's.
    assert spec.starts_at == datetime(2027, 3, 1, 20, tzinfo=UTC)
    assert (spec.sales_start, spec.sales_end, spec.hold_seconds) == (None, None, None)
    assert (spec.max_seats_per_buyer, spec.buyer_can_cancel_until) == (None, None)
    assert (spec.cancel_fee_percent, spec.categories, spec.seats) == (0, [], [])


def test_nulls_are_taken_where_the_contract_allows_them():
    data = body() | {
        "sales_start": None,
        "sales_end": None,
        "hold_seconds": None,
        "max_seats_per_buyer": None,
        "refund_policy": {"buyer_can_cancel_until": None},
        "seat_map": None,
    }

    spec = event_from_json(data)

    assert (spec.sales_start, spec.sales_end, spec.hold_seconds) == (None, None, None)
    assert (spec.buyer_can_cancel_until, spec.cancel_fee_percent, spec.seats) == (None, 0, [])


def test_the_specs_are_frozen():
    seat = SeatSpec("", "A", 1, "A1", "stalls")
    with pytest.raises(dataclasses.FrozenInstanceError):
        seat.ref = "A2"  # type: ignore[misc]  # what the test is about


# --- each rule, broken on its own --------------------------------------------------------------


def _set(path: str, value: object) -> Callable[[dict], None]:
    """Set ``value`` at a dotted path of the body (``[n]`` indexes a list);
    the value ``DELETE`` removes the key."""

    def apply(data: dict) -> None:
        keys = path.replace("[", ".").replace("]", "").split(".")
        node = data
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node[key]
        last = keys[-1]
        if value is DELETE:
            del node[last]
        elif last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return apply


DELETE = object()
S0 = "seat_map.sections[0]"
BROKEN = [
    ("name", "", "name", "1 to 200"),
    ("name", "x" * 201, "name", "1 to 200"),
    ("name", 7, "name", "string"),
    ("name", DELETE, "name", "required"),
    ("starts_at", "tomorrow", "starts_at", "ISO 8601"),
    ("starts_at", "2027-13-01T00:00:00Z", "starts_at", "ISO 8601"),
    ("starts_at", "0001-01-01T00:00:00+05:00", "starts_at", "from 1970 to 9998"),
    ("starts_at", None, "starts_at", "ISO 8601"),
    ("starts_at", DELETE, "starts_at", "required"),
    ("currency", "eur", "currency", "3 upper-case letters"),
    ("currency", "XYZ", "currency", "not an ISO 4217 currency"),
    ("sales_start", "2027-03-01T18:00:00Z", "sales_end", "after sales_start"),
    ("sales_end", 12, "sales_end", "ISO 8601"),
    ("hold_seconds", 59, "hold_seconds", "from 60 to 3600"),
    ("hold_seconds", 3601, "hold_seconds", "from 60 to 3600"),
    ("hold_seconds", "900", "hold_seconds", "integer"),
    ("hold_seconds", True, "hold_seconds", "integer"),
    ("max_seats_per_buyer", 0, "max_seats_per_buyer", "from 1"),
    ("max_seats_per_buyer", 2.0, "max_seats_per_buyer", "integer"),
    ("refund_policy", [], "refund_policy", "object"),
    ("refund_policy.fee_percent", 101, "refund_policy.fee_percent", "from 0 to 100"),
    ("refund_policy.fee_percent", -1, "refund_policy.fee_percent", "from 0 to 100"),
    (
        "refund_policy.buyer_can_cancel_until",
        "soon",
        "refund_policy.buyer_can_cancel_until",
        "ISO 8601",
    ),
    ("price_categories", {}, "price_categories", "list"),
    ("price_categories[1].code", "stalls", "price_categories[1].code", "price_categories[0]"),
    ("price_categories[0].code", "has space", "price_categories[0].code", "letters, digits"),
    ("price_categories[0].code", "x" * 33, "price_categories[0].code", "1 to 32"),
    ("price_categories[0].name", " ", "price_categories[0].name", "1 to 100"),
    ("price_categories[0].name", "x" * 101, "price_categories[0].name", "1 to 100"),
    ("price_categories[0].price", 5000, "price_categories[0].price", "object"),
    ("price_categories[0].price.amount", -1, "price_categories[0].price.amount", "from 0"),
    ("price_categories[0].price.amount", 50.5, "price_categories[0].price.amount", "integer"),
    ("price_categories[0].price.amount", "50", "price_categories[0].price.amount", "integer"),
    ("price_categories[0].price.amount", 2**31, "price_categories[0].price.amount", "from 0"),
    (
        "price_categories[0].price.currency",
        "USD",
        "price_categories[0].price.currency",
        "the event's currency, EUR",
    ),
    ("seat_map", [], "seat_map", "object"),
    ("seat_map.sections", {}, "seat_map.sections", "list"),
    (f"{S0}", "Stalls", S0, "object"),
    (f"{S0}.name", "x" * 65, f"{S0}.name", "at most 64"),
    (f"{S0}.rows", None, f"{S0}.rows", "list"),
    (f"{S0}.rows[0]", [], f"{S0}.rows[0]", "object"),
    (f"{S0}.rows[0].label", "", f"{S0}.rows[0].label", "1 to 16"),
    (f"{S0}.rows[0].label", "x" * 17, f"{S0}.rows[0].label", "1 to 16"),
    (f"{S0}.rows[0].label", DELETE, f"{S0}.rows[0].label", "required"),
    (f"{S0}.rows[0].seats", "A1", f"{S0}.rows[0].seats", "list"),
    (f"{SEAT}[0]", "A1", f"{SEAT}[0]", "object"),
    (f"{SEAT}[0].ref", "", f"{SEAT}[0].ref", "1 to 32"),
    (f"{SEAT}[0].ref", "x" * 33, f"{SEAT}[0].ref", "1 to 32"),
    (f"{SEAT}[0].ref", " A1", f"{SEAT}[0].ref", "space"),
    (f"{SEAT}[0].ref", "A\n1", f"{SEAT}[0].ref", "printable"),
    (f"{SEAT}[0].ref", "A\x001", f"{SEAT}[0].ref", "printable"),
    (f"{SEAT}[0].ref", 1, f"{SEAT}[0].ref", "string"),
    (f"{SEAT}[0].ref", DELETE, f"{SEAT}[0].ref", "required"),
    (f"{SEAT}[0].ref", "A2", f"{SEAT}[1].ref", f"already the ref of {SEAT}[0]"),
    (f"{SEAT}[0].number", 0, f"{SEAT}[0].number", "from 1"),
    (f"{SEAT}[0].number", -3, f"{SEAT}[0].number", "from 1"),
    (f"{SEAT}[0].number", 2**31, f"{SEAT}[0].number", "from 1"),
    (f"{SEAT}[0].number", 1.0, f"{SEAT}[0].number", "integer"),
    (f"{SEAT}[0].number", True, f"{SEAT}[0].number", "integer"),
    (f"{SEAT}[0].number", "1", f"{SEAT}[0].number", "integer"),
    (f"{SEAT}[0].number", DELETE, f"{SEAT}[0].number", "required"),
    (f"{SEAT}[0].category", "gallery", f"{SEAT}[0].category", "no price category 'gallery'"),
    (f"{SEAT}[0].category", DELETE, f"{SEAT}[0].category", "required"),
    (f"{SEAT}[0].category", ["stalls"], f"{SEAT}[0].category", "string"),
    (f"{SEAT}[0].x", "1", f"{SEAT}[0].x", "a number"),
    (f"{SEAT}[0].x", float("inf"), f"{SEAT}[0].x", "finite"),
    (f"{SEAT}[0].y", float("nan"), f"{SEAT}[0].y", "finite"),
    (f"{SEAT}[0].y", 10**400, f"{SEAT}[0].y", "finite"),
    (f"{SEAT}[0].x", False, f"{SEAT}[0].x", "a number"),
    (f"{SEAT}[0].accessible", "yes", f"{SEAT}[0].accessible", "true or false"),
    (f"{SEAT}[0].accessible", 1, f"{SEAT}[0].accessible", "true or false"),
]


@pytest.mark.parametrize(
    "where, value, path, said", BROKEN, ids=[f"{w}={v!r}"[:60] for w, v, _, _ in BROKEN]
)
def test_each_rule_broken_alone_is_named_by_its_path(where, value, path, said):
    data = body()
    _set(where, value)(data)

    found = problems(lambda: event_from_json(data))

    assert found[0][0] == path, found
    assert said in found[0][1]
    # Nothing else is wrong, but the seats naming a category whose code is
    # now another.
    assert all(p.endswith(".category") and "no price category" in m for p, m in found[1:])


def test_the_seats_of_a_category_that_is_not_an_object_name_no_category():
    data = body()
    data["price_categories"][1] = "balcony"

    assert problems(lambda: event_from_json(data)) == [
        ("price_categories[1]", "must be an object with code, name and price"),
        ("seat_map.sections[1].rows[0].seats[0].category", "no price category 'balcony'"),
        ("seat_map.sections[1].rows[0].seats[1].category", "no price category 'balcony'"),
    ]


@pytest.mark.parametrize("data", [[], "x", None, 3])
def test_a_body_that_is_not_an_object_is_one_non_field_error(data):
    assert problems(lambda: event_from_json(data)) == [
        ("non_field_errors", "expected a JSON object")
    ]


def test_a_seat_of_a_category_with_another_problem_is_not_refused_too():
    # The category's code is well formed: its seats name it, and only its
    # price is wrong.
    data = body()
    data["price_categories"][0]["price"]["amount"] = -5

    assert only_problem(data) == (
        "price_categories[0].price.amount",
        "must be from 0 to 99999999",
    )


def test_every_problem_comes_back_in_input_order():
    data = body()
    data["currency"] = "eur"
    data["price_categories"][1]["price"]["amount"] = -1
    seats = data["seat_map"]["sections"][1]["rows"][0]["seats"]
    seats[0]["number"] = 0
    seats[1]["ref"] = "A1"
    seats[1]["x"] = "left"

    found = problems(lambda: event_from_json(data))

    b = "seat_map.sections[1].rows[0].seats"
    assert [path for path, _ in found] == [
        "currency",
        "price_categories[1].price.amount",
        f"{b}[0].number",
        f"{b}[1].x",
        f"{b}[1].ref",
    ]
    assert found[4][1] == f"'A1' is already the ref of {SEAT}[0]"


def test_more_than_a_hundred_problems_are_cut_with_a_count_of_the_rest():
    seats = [{"ref": f"S{n}", "number": 0, "category": "stalls"} for n in range(150)]
    data = body()
    data["seat_map"] = {"sections": [{"name": "", "rows": [{"label": "A", "seats": seats}]}]}

    found = problems(lambda: event_from_json(data))

    assert len(found) == MAX_ERRORS + 1
    assert found[0] == (f"{SEAT}[0].number", "must be from 1 to 2147483647")
    assert found[MAX_ERRORS - 1][0] == f"{SEAT}[{MAX_ERRORS - 1}].number"
    assert found[-1] == ("...", "... and 50 more")


def test_more_seats_than_the_limit_is_one_error_before_any_seat_is_read():
    assert MAX_SEATS == 100_000
    row = {"label": "A", "seats": [{}] * 60_000}  # every seat wrong: none is read
    data = body()
    data["seat_map"] = {"sections": [{"rows": [row]}, {"rows": [row]}]}

    assert only_problem(data) == ("seat_map", "has 120000 seats: at most 100000 are taken")


def test_the_limit_itself_is_taken(monkeypatch):
    monkeypatch.setattr(seat_maps, "MAX_SEATS", 3)
    seats = [{"ref": f"A{n}", "number": n, "category": "c"} for n in range(1, 5)]

    assert len(seats_from_json({"sections": [{"rows": [{"label": "A", "seats": seats[:3]}]}]})) == 3
    assert problems(
        lambda: seats_from_json({"sections": [{"rows": [{"label": "A", "seats": seats}]}]})
    ) == [("seat_map", "has 4 seats: at most 3 are taken")]


def test_a_seat_map_alone_takes_any_well_formed_category_unless_told_which():
    seat_map = {"sections": [{"rows": [{"label": "A", "seats": [
        {"ref": "A1", "number": 1, "category": "vip"},
    ]}]}]}  # fmt: skip

    assert seats_from_json(seat_map)[0].category == "vip"
    assert problems(lambda: seats_from_json(seat_map, categories={"stalls"})) == [
        (f"{SEAT}[0].category", "no price category 'vip'")
    ]
    assert problems(lambda: seats_from_json(seat_map, path="map", categories=set()))[0][0] == (
        "map.sections[0].rows[0].seats[0].category"
    )


# --- CSV --------------------------------------------------------------------------------------

HEADER = "section,row,number,ref,category,x,y,accessible"


def test_a_csv_seat_map_reads_in_its_order():
    text = (
        "\ufeff" + "Ref, Row , Number,Category,Accessible\r\n"  # any order, some left out
        "A1,A,1,stalls,yes\r\n"
        "\r\n"  # a blank line is skipped
        '"A,2",A,2,stalls,\r\n'  # a quoted comma
        "B1,B,1,balcony,0\r\n"
    )

    assert seats_from_csv(text, categories={"stalls", "balcony"}) == [
        SeatSpec("", "A", 1, "A1", "stalls", 0.0, 0.0, True),
        SeatSpec("", "A", 2, "A,2", "stalls", 0.0, 0.0, False),
        SeatSpec("", "B", 1, "B1", "balcony", 0.0, 0.0, False),
    ]


def test_every_csv_column_is_read():
    text = f"{HEADER}\nStalls,A,7,A7,stalls,1.25,-3,TRUE\nStalls,A,8,A8,stalls,,,false\n"

    assert seats_from_csv(text) == [
        SeatSpec("Stalls", "A", 7, "A7", "stalls", 1.25, -3.0, True),
        SeatSpec("Stalls", "A", 8, "A8", "stalls", 0.0, 0.0, False),
    ]


CSV_BROKEN = [
    ("Stalls,A,0,A1,stalls,0,0,false", "line 2: number", "from 1"),
    ("Stalls,A,1.5,A1,stalls,0,0,false", "line 2: number", "integer"),
    ("Stalls,A,-1,A1,stalls,0,0,false", "line 2: number", "integer"),
    ("Stalls,A,,A1,stalls,0,0,false", "line 2: number", "integer"),
    ("Stalls,,1,A1,stalls,0,0,false", "line 2: row", "1 to 16"),
    ("Stalls,ABCDEFGHIJKLMNOPQ,1,A1,stalls,0,0,false", "line 2: row", "1 to 16"),
    (f"{'S' * 65},A,1,A1,stalls,0,0,false", "line 2: section", "at most 64"),
    ("Stalls,A,1,,stalls,0,0,false", "line 2: ref", "1 to 32"),
    ("Stalls,A,1,A1,gallery,0,0,false", "line 2: category", "no price category 'gallery'"),
    ("Stalls,A,1,A1,stalls,left,0,false", "line 2: x", "a number"),
    ("Stalls,A,1,A1,stalls,0,inf,false", "line 2: y", "finite"),
    ("Stalls,A,1,A1,stalls,nan,0,false", "line 2: x", "finite"),
    ("Stalls,A,1,A1,stalls,0,0,maybe", "line 2: accessible", "true or false"),
    ("Stalls,A,1,A1,stalls,0,0", "line 2", "has 7 fields, the header 8"),
    ("Stalls,A,1,A1,stalls,0,0,false,extra", "line 2", "has 9 fields, the header 8"),
]


@pytest.mark.parametrize("line, path, said", CSV_BROKEN, ids=[c[0][:40] for c in CSV_BROKEN])
def test_each_csv_problem_is_named_by_its_line_and_column(line, path, said):
    found = problems(lambda: seats_from_csv(f"{HEADER}\n{line}\n", categories={"stalls"}))

    assert len(found) == 1, found
    assert found[0][0] == path
    assert said in found[0][1]


def test_csv_lines_count_blank_and_quoted_lines():
    text = (
        f"{HEADER}\n"
        "Stalls,A,1,A1,stalls,0,0,false\n"  # line 2
        "\n"  # line 3, blank
        'Stalls,A,2,"A\n2",stalls,0,0,false\n'  # lines 4-5: a newline in a quoted ref
        "Stalls,A,3,A1,stalls,0,0,false\n"  # line 6: a ref used on line 2
        "Stalls,A,0,A4,stalls,0,0,false\n"  # line 7
    )

    assert problems(lambda: seats_from_csv(text)) == [
        ("line 4: ref", "must hold printable characters only"),
        ("line 6: ref", "'A1' is already the ref of line 2"),
        ("line 7: number", "must be from 1 to 2147483647"),
    ]


@pytest.mark.parametrize(
    "header, found",
    [
        ("", [("line 1", f"must be the header: {HEADER}")]),
        ("section,row,number,category", [("line 1: ref", "this column is required")]),
        (
            "section,row,number,ref,category,seat",
            [("line 1: seat", f"unknown column (the columns: {HEADER})")],
        ),
        ("row,number,ref,category,row", [("line 1: row", "named twice")]),
    ],
)
def test_the_header_is_required_and_named_on_line_1(header, found):
    assert problems(lambda: seats_from_csv(f"{header}\nA,1,A1,stalls\n")) == found


def test_a_csv_that_starts_with_a_blank_line_has_no_header():
    assert problems(lambda: seats_from_csv(f"\n{HEADER}\n")) == [
        ("line 1", f"must be the header: {HEADER}")
    ]


def test_text_that_is_not_csv_is_named_by_its_line():
    found = problems(lambda: seats_from_csv(f'{HEADER}\nStalls,A,1,"A1,stalls,0,0,false\n'))

    assert found[0][0] == "line 2"
    assert found[0][1].startswith("not CSV")


def test_a_csv_past_the_seat_limit_is_one_error():
    lines = "".join(f"S,A,{n},{n},c,0,0,false\n" for n in range(1, MAX_SEATS + 2))

    assert problems(lambda: seats_from_csv(f"{HEADER}\n{lines}")) == [
        ("seat_map", f"has {MAX_SEATS + 1} seats: at most {MAX_SEATS} are taken")
    ]


def test_a_hundred_thousand_csv_seats_are_read():
    lines = "".join(f"S,R{n // 50},{n % 50 + 1},{n},c,{n % 50},0,false\n" for n in range(MAX_SEATS))

    seats = seats_from_csv(f"{HEADER}\n{lines}", categories={"c"})

    assert len(seats) == MAX_SEATS
    assert seats[-1] == SeatSpec(
        "S", f"R{(MAX_SEATS - 1) // 50}", 50, str(MAX_SEATS - 1), "c", 49.0
    )


# --- a seat map's PUT, a PATCH --------------------------------------------------------------


def test_a_seat_map_body_names_the_event_categories_unless_it_brings_its_own():
    data = {"seat_map": copy.deepcopy(body()["seat_map"])}

    seats, categories = seat_map_from_json(data, currency="EUR", categories={"stalls", "balcony"})
    assert (len(seats), categories) == (4, None)

    assert problems(lambda: seat_map_from_json(data, currency="EUR", categories={"stalls"})) == [
        ("seat_map.sections[1].rows[0].seats[0].category", "no price category 'balcony'"),
        ("seat_map.sections[1].rows[0].seats[1].category", "no price category 'balcony'"),
    ]

    data["price_categories"] = body()["price_categories"]
    seats, categories = seat_map_from_json(data, currency="EUR", categories=set())
    assert len(seats) == 4 and [c.code for c in categories or []] == ["stalls", "balcony"]

    assert problems(lambda: seat_map_from_json(data, currency="GBP", categories=set()))[0] == (
        "price_categories[0].price.currency",
        "must be the event's currency, GBP",
    )
    assert problems(lambda: seat_map_from_json({}, currency="EUR", categories=set())) == [
        ("seat_map", "this field is required")
    ]


def test_a_patch_reads_only_what_is_sent():
    assert event_changes_from_json({}, currency="EUR") == {}
    changes = event_changes_from_json(
        {
            "name": "Later",
            "sales_end": None,
            "refund_policy": {"fee_percent": 5},
            "price_categories": [
                {"code": "stalls", "name": "Stalls", "price": {"amount": 1, "currency": "EUR"}}
            ],
        },
        currency="EUR",
    )

    assert changes == {
        "name": "Later",
        "sales_end": None,
        "cancel_fee_percent": 5,
        "categories": [CategorySpec("stalls", "Stalls", 1, "EUR")],
    }


def test_a_patch_checks_categories_against_the_currency_it_sends_or_the_events():
    category = {"code": "c", "name": "C", "price": {"amount": 1, "currency": "GBP"}}

    assert problems(
        lambda: event_changes_from_json({"price_categories": [category]}, currency="EUR")
    ) == [("price_categories[0].price.currency", "must be the event's currency, EUR")]
    changed = event_changes_from_json(
        {"currency": "GBP", "price_categories": [category]}, currency="EUR"
    )
    assert changed["currency"] == "GBP"
    assert problems(lambda: event_changes_from_json({"starts_at": None}, currency="EUR")) == [
        ("starts_at", "must be an ISO 8601 date and time")
    ]
    assert problems(lambda: event_changes_from_json(["name"], currency="EUR")) == [
        ("non_field_errors", "expected a JSON object")
    ]


# --- specs built by hand --------------------------------------------------------------------


def test_hand_built_seats_meet_the_same_rules():
    check_seats(
        [SeatSpec("", "A", 1, "A1", "c"), SeatSpec("", "A", 2, "A2", "c")], categories={"c"}
    )

    assert problems(
        lambda: check_seats(
            [
                SeatSpec("", "A", 1, "A1", "c"),
                SeatSpec("", "A", 0, "A1", "d"),
                SeatSpec("x" * 65, "", 3, "A3", "c", x=float("nan")),
            ],
            categories={"c"},
        )
    ) == [
        ("seats[1].number", "must be from 1 to 2147483647"),
        ("seats[1].category", "no price category 'd'"),
        ("seats[1].ref", "'A1' is already the ref of seats[0]"),
        ("seats[2].section", "must be at most 64 characters"),
        ("seats[2].row", "must be 1 to 16 characters"),
        ("seats[2].x", "must be a finite number"),
    ]


def test_hand_built_categories_meet_the_same_rules():
    check_categories([CategorySpec("a", "A", 0, "EUR")], currency="EUR")

    assert problems(
        lambda: check_categories(
            [
                CategorySpec("a", "A", 0, "EUR"),
                CategorySpec("a", "", -1, "USD"),
            ],
            currency="EUR",
        )
    ) == [
        ("price_categories[1].name", "must be 1 to 100 characters"),
        ("price_categories[1].price.amount", "must be from 0 to 99999999"),
        ("price_categories[1].price.currency", "must be the event's currency, EUR"),
        ("price_categories[1].code", "'a' is the code of an earlier category"),
    ]


# --- anything at all ----------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(["", " ", "stalls", "A1", "EUR", "2027-03-01T20:00:00Z", "\x00"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


def _leaves(node: object, path: str = "") -> list[str]:
    if isinstance(node, dict):
        return [path] + [p for k, v in node.items() for p in _leaves(v, f"{path}.{k}".lstrip("."))]
    if isinstance(node, list):
        return [path] + [p for n, v in enumerate(node) for p in _leaves(v, f"{path}[{n}]")]
    return [path]


PATHS = [p for p in _leaves(body()) if p]


@given(where=st.lists(st.sampled_from(PATHS), min_size=1, max_size=3), values=st.data())
@settings(max_examples=400, deadline=None, database=None)
def test_any_value_anywhere_is_read_or_refused_by_path(where, values):
    data = body()
    for path in where:
        try:
            _set(path, values.draw(JSON))(data)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier replacement took the path away

    try:
        spec = event_from_json(data)
    except SeatMapInvalid as refused:
        assert refused.errors
        assert all(isinstance(p, str) and isinstance(m, str) and m for p, m in refused.errors)
        return
    # What the reader takes, the services' own checks take too.
    check_categories(spec.categories, currency=spec.currency)
    check_seats(spec.seats, categories={c.code for c in spec.categories})
    for key in ("name", "starts_at", "currency", "sales_start", "hold_seconds"):
        assert seat_maps.field_problem(key, getattr(spec, key)) is None


@given(JSON)
@settings(max_examples=200, deadline=None, database=None)
def test_any_json_body_is_read_or_refused(data):
    for read in (
        lambda: event_from_json(data),
        lambda: event_changes_from_json(data, currency="EUR"),
        lambda: seat_map_from_json(data, currency="EUR", categories={"stalls"}),
    ):
        try:
            read()
        except SeatMapInvalid as refused:
            assert refused.errors


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None, database=None)
def test_any_text_is_a_csv_seat_map_or_refused_by_line(text):
    try:
        seats_from_csv(f"{HEADER}\n{text}")
    except SeatMapInvalid as refused:
        assert all(p == "seat_map" or p.startswith("line ") for p, _ in refused.errors)
