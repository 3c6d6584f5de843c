"""The API's JSON parser: DRF's, refusing a body nested deeper than
``MAX_JSON_DEPTH`` (docs/operations.md, "Settings") with ``400 parse_error``.

Python's ``json`` recurses once per level: a few kilobytes of ``[`` (well
under ``MAX_REQUEST_BYTES``) exhaust the interpreter's stack, and what walks
the parsed data afterwards (serializers, the error's rendering) recurses too.
The depth is measured before parsing and without recursion: strings taken
out by one regular expression, then the running sum of the brackets left,
both in C and in one pass: a string that never closes is taken to the end in
one match, never retried at each later quote. Bodies with fewer brackets than
the limit, which is every body a client sends, skip even that."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import IO, Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

# A JSON string, escapes included; what is between two strings is structure.
# One that never closes (a lone backslash last, perhaps) runs to the end: a
# pattern that failed there would be retried at every later quote, each try
# scanning to the end (quadratic: 0.7 s for 16 KiB of \").
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in the JSON ``text`` (0 for a
    scalar); for text that is not JSON, a number that json refuses anyway."""
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


class JSONParser(parsers.JSONParser):
    """DRF's ``JSONParser`` (its encodings, its strictness, its messages),
    with a limit on nesting. ``DEFAULT_PARSER_CLASSES``, and what the views
    that name their parsers name."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        body = stream.read()
        limit = settings.MAX_JSON_DEPTH
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = body.decode(encoding)
        except (LookupError, ValueError):
            # Not text in that encoding (UnicodeDecodeError, or the plain
            # UnicodeError punycode raises: both ValueErrors), or not a text
            # encoding (rot13, zlib): DRF's parse refuses it below, in its words.
            text = ""
        if text.count("[") + text.count("{") > limit and json_depth(text) > limit:
            raise ParseError(f"JSON parse error - nested deeper than {limit} levels")
        try:
            return super().parse(io.BytesIO(body), media_type, parser_context)
        except RecursionError:
            # Only with a limit set near the interpreter's own.
            raise ParseError("JSON parse error - nested too deep") from None
