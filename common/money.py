"""Money as the project shows it: one formatter for the emails and the admin.

Money is an integer amount of minor units and an ISO 4217 code, never a
float. How many minor units make a major one is ISO 4217's "minor unit"
exponent: 2 for EUR (cents), 0 for JPY, 3 for KWD (fils). It is what a
payment processor means by an amount, so it is the only safe way to read the
integers we store.

Babel (CLDR) supplies the exponent, with one correction: CLDR records how
many decimals a currency is usually *displayed* with, and for a handful of
currencies that is fewer than ISO 4217's minor units (HUF, IDR, IQD...).
Read with CLDR's digits, 1050 forint minor units would show as "1,050 HUF"
instead of 10.50 HUF. ``_ISO_4217_MINOR_UNITS`` holds ISO's value for
those, and every amount is shown with all its minor units (nothing is
rounded away on a receipt or in the ledger view).

The text is English, like the rest of the project: "1,234.50 EUR",
"5,000 JPY", "1.234 KWD", "-12.50 EUR": CLDR's "en" number format (groups
of three digits by ",", "." before the decimals, "-" before a negative
amount), which Python's own format spec writes (``format(value, ",f")``)
in a tenth of Babel's time (1.5 µs a call, 16 before). A confirmation
e-mail formats its amount in every purchase's background work;
``tests/test_money.py`` holds the two to the same text for every currency
Babel knows.
"""

from __future__ import annotations

import functools
from decimal import Decimal

from babel.numbers import get_currency_precision, is_currency

# Current ISO 4217 codes whose minor units differ from CLDR's display digits
# (ISO 4217 list one, checked against babel 2.19 / CLDR 49).
_ISO_4217_MINOR_UNITS = {
    "AFN": 2,
    "ALL": 2,
    "COP": 2,
    "HUF": 2,
    "IDR": 2,
    "IQD": 3,
    "IRR": 2,
    "KPW": 2,
    "LAK": 2,
    "LBP": 2,
    "MGA": 2,
    "MMK": 2,
    "SLL": 2,
    "SOS": 2,
    "SYP": 2,
    "YER": 2,
}


class UnknownCurrency(ValueError):
    """Not an ISO 4217 code: its minor units are unknown."""


def _code(currency: object) -> str:
    return currency.strip().upper() if isinstance(currency, str) else ""


def _minor_units(amount: object) -> int:
    # bool is an int in Python but never an amount; a float or a Decimal is
    # not minor units.
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise TypeError(f"money is integer minor units, not {type(amount).__name__}")
    return amount


def minor_units_exponent(currency: str) -> int:
    """ISO 4217's minor units of ``currency`` (case-insensitive): 2 for EUR,
    0 for JPY, 3 for KWD. Raises :class:`UnknownCurrency` for anything else."""
    code = _code(currency)
    exponent = _exponent(code)
    if exponent is None:
        raise UnknownCurrency(f"unknown currency {currency!r}")
    return exponent


@functools.lru_cache(maxsize=1024)
def _exponent(code: str) -> int | None:
    # Babel's look-ups, once per code (None: not a currency).
    if len(code) != 3 or not is_currency(code):
        return None
    return _ISO_4217_MINOR_UNITS.get(code, get_currency_precision(code))


def _shift(amount: int, exponent: int) -> Decimal:
    # Exact at any size: Decimal.scaleb rounds to the context's 28 digits.
    sign, digits, _ = Decimal(amount).as_tuple()
    return Decimal((sign, digits, -exponent))


def to_decimal(amount: int, currency: str) -> Decimal:
    """Minor units as an exact Decimal in major units: (1234, "KWD") -> 1.234."""
    return _shift(_minor_units(amount), minor_units_exponent(currency))


def _grouped(value: Decimal | int) -> str:
    """``value`` with every digit it has (a Decimal's own decimals), its
    integer part grouped by three: "1,234.50", "-12", "0.000"."""
    return format(value, ",f") if isinstance(value, Decimal) else format(value, ",")


def format_money(amount: int, currency: str) -> str:
    """Minor units as text: "1,234.50 EUR", "5,000 JPY", "1.234 KWD", "-12.50 EUR".

    An unknown code does not raise (an admin page or an email must still
    render): the amount is shown as the minor units it is, marked so, e.g.
    "1,234 ZZZ (minor units)", rather than with guessed decimals.
    """
    _minor_units(amount)
    code = _code(currency)
    try:
        exponent = minor_units_exponent(code)
    except UnknownCurrency:
        digits = _grouped(amount)
        return " ".join(part for part in (digits, code, "(minor units)") if part)
    return f"{_grouped(_shift(amount, exponent))} {code}"
