"""The API's content negotiation: DRF's, answered at once for what nearly
every client sends.

A JSON client sends ``Accept: application/json``, ``*/*`` or nothing, and
no ``?format=``; for those DRF's ``DefaultContentNegotiation`` picks the
view's first renderer when it renders JSON, after parsing the header into
media types and ordering them by precedence: a twentieth of a door scan's
CPU (docs/performance.md, figure 16). Here those three are answered without
the parse, as DRF answers them; anything else (another type, parameters, a
list, a query string that may carry ``format``) goes to DRF, whose answer,
406 included, it stays. tests/test_error_shapes.py holds the two to the
same answers.
"""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

# No header is DRF's */*; an empty one accepts nothing (406), so it goes to DRF.
_AT_ONCE = frozenset({"*/*", "application/json"})


class ContentNegotiation(DefaultContentNegotiation):
    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)  # DRF's view passes its list
        if (
            format_suffix is None
            and renderers
            and renderers[0].media_type == "application/json"
            and not request.META.get("QUERY_STRING")
            and request.META.get("HTTP_ACCEPT", "*/*") in _AT_ONCE
        ):
            return renderers[0], renderers[0].media_type
        return super().select_renderer(request, renderers, format_suffix)
