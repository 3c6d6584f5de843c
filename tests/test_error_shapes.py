"""Every error under /api/ has the one shape of docs/api.md ("Errors"),
whatever raised it: the API's exception handler maps every exception Django
or DRF raises to a status and a code; a body nested too deep, a chunked
body without a length, an unknown ``?format=`` and an id of the wrong JSON
type are refused in that shape, never a 500."""

from __future__ import annotations

import json
import uuid

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import (
    BadRequest,
    DisallowedHost,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousFileOperation,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.http import Http404
from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.test import APIClient

from common.parsers import _STRING, JSONParser, json_depth
from purchases.models import PurchaseSaga

from .conftest import _client_for, new_key, purchase_body
from .factories import UserFactory

# --- the exception handler: every exception → status and code ---------------------


class _Teapot(exceptions.APIException):
    status_code = 418
    default_detail = "I am a teapot."
    default_code = "teapot"


class _Bare(exceptions.APIException):
    """An APIException subclass that sets nothing of its own."""


HANDLED = [
    # Django's
    (Http404(), 404, "not_found"),
    (Http404("No Event matches the given query."), 404, "not_found"),
    (PermissionDenied(), 403, "permission_denied"),
    (PermissionDenied("nope"), 403, "permission_denied"),
    (SuspiciousOperation("odd"), 400, "bad_request"),
    (DisallowedHost("Invalid HTTP_HOST header: 'evil'."), 400, "bad_request"),
    (TooManyFieldsSent("too many"), 400, "bad_request"),
    (TooManyFilesSent("too many"), 400, "bad_request"),
    (SuspiciousFileOperation("../etc"), 400, "bad_request"),
    (BadRequest("bad"), 400, "bad_request"),
    (RequestDataTooBig("too big"), 413, "payload_too_large"),
    # DRF's, each with its own code
    (exceptions.ParseError(), 400, "parse_error"),
    (exceptions.AuthenticationFailed(), 401, "authentication_failed"),
    (exceptions.NotAuthenticated(), 401, "not_authenticated"),
    (exceptions.PermissionDenied(), 403, "permission_denied"),
    (exceptions.NotFound(), 404, "not_found"),
    (exceptions.MethodNotAllowed("PUT"), 405, "method_not_allowed"),
    (exceptions.NotAcceptable(), 406, "not_acceptable"),
    (exceptions.UnsupportedMediaType("text/plain"), 415, "unsupported_media_type"),
    (exceptions.Throttled(wait=7), 429, "throttled"),
    (exceptions.ValidationError("bad"), 400, "invalid"),
    (exceptions.ValidationError(["bad", "worse"]), 400, "invalid"),
    (exceptions.ValidationError([]), 400, "invalid"),
    (exceptions.ValidationError({}), 400, "invalid"),
    (exceptions.APIException(), 500, "error"),
    (_Bare(), 500, "error"),
    (_Teapot(), 418, "teapot"),
    # a detail that is not a sentence: a list, a dict, empty
    (exceptions.NotFound(detail=["gone", "really"]), 404, "not_found"),
    (exceptions.NotFound(detail={"event": ["gone"]}), 404, "not_found"),
    (exceptions.NotFound(detail=[]), 404, "not_found"),
    (exceptions.PermissionDenied(detail={}), 403, "permission_denied"),
]


def _handle(exc):
    # The handler the settings name: the one every DRF view calls.
    handler = import_string(str(django_settings.REST_FRAMEWORK["EXCEPTION_HANDLER"]))
    return handler(exc, {"view": None, "args": (), "kwargs": {}})


@pytest.mark.parametrize(
    ("exc", "status_code", "code"),
    HANDLED,
    ids=[f"{type(e).__name__}-{i}" for i, (e, *_) in enumerate(HANDLED)],
)
def test_every_exception_django_or_drf_raises_answers_the_error_shape(exc, status_code, code):
    response = _handle(exc)

    assert response is not None
    assert response.status_code == status_code
    assert response.data["code"] == code
    assert isinstance(response.data["detail"], str) and response.data["detail"].strip()
    assert set(response.data) <= {"code", "detail", "field", "errors"}
    json.dumps(response.data)  # renderable as it is


def test_every_apiexception_drf_defines_answers_its_own_status_and_code():
    needs = {
        exceptions.MethodNotAllowed: ("PUT",),
        exceptions.UnsupportedMediaType: ("text/plain",),
    }
    classes = [
        cls
        for cls in vars(exceptions).values()
        if isinstance(cls, type) and issubclass(cls, exceptions.APIException)
    ]
    assert len(classes) >= 11  # APIException and its ten subclasses, at least

    for cls in classes:
        response = _handle(cls(*needs.get(cls, ())))
        assert response is not None, cls
        assert (response.status_code, response.data["code"]) == (
            cls.status_code,
            cls.default_code,
        ), cls
        assert isinstance(response.data["detail"], str) and response.data["detail"], cls


def test_a_validation_error_names_its_first_field_and_lists_every_problem():
    response = _handle(
        exceptions.ValidationError({"event": ["not an id"], "seats": ["none given"]})
    )

    assert response.status_code == 400
    assert response.data == {
        "code": "invalid",
        "detail": "event: not an id",
        "field": "event",
        "errors": {"event": ["not an id"], "seats": ["none given"]},
    }


def test_an_empty_detail_says_the_default_sentence():
    assert _handle(exceptions.NotFound(detail=[])).data["detail"] == "Not found."
    assert _handle(exceptions.ValidationError({})).data == {
        "code": "invalid",
        "detail": "Invalid input.",
    }


def test_throttled_and_authentication_failed_keep_their_headers():
    assert _handle(exceptions.Throttled(wait=7))["Retry-After"] == "7"
    assert _handle(exceptions.NotAuthenticated()).status_code == 401


def test_an_exception_neither_raises_is_left_to_the_server_error_answer():
    # A bug: Django logs it with its traceback and answers 500 server_error
    # (config/urls.py); the handler does not swallow it.
    assert _handle(ValueError("a bug")) is None


# --- ?format= ----------------------------------------------------------------------


@pytest.fixture
def clients(db):
    # A superuser: every permission the webhooks' staff API asks for.
    staff = UserFactory(username="sam", is_staff=True, is_superuser=True)
    return {
        "anonymous": APIClient(),
        "alice": _client_for(UserFactory(username="alice")),
        "staff": _client_for(staff),
    }


FORMATS = [
    ("anonymous", "get", "/api/events/?format=foo"),
    ("anonymous", "get", "/api/events/?format=html"),
    ("anonymous", "get", "/api/events/?format=openapi"),
    ("anonymous", "get", "/api/events/1/seats/?format=foo"),
    ("anonymous", "get", "/api/schema/?format=xml"),
    ("anonymous", "get", "/api/schema/?format=html"),
    ("anonymous", "get", "/api/schema/?format=api"),
    ("anonymous", "get", "/api/schema/?format=openapi-json"),
    ("anonymous", "post", "/api/auth/token/?format=foo"),
    ("alice", "get", "/api/purchases/?format=foo"),
    ("alice", "get", f"/api/purchases/{uuid.UUID(int=1)}/?format=xml"),
    ("alice", "post", "/api/purchases/?format=foo"),
    ("staff", "get", "/api/webhook-endpoints/?format=foo"),
]


@pytest.mark.parametrize(("who", "method", "url"), FORMATS)
def test_an_unknown_format_answers_404_not_found_in_json(clients, who, method, url):
    response = getattr(clients[who], method)(url)

    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert body["code"] == "not_found" and isinstance(body["detail"], str)


def test_an_unacceptable_accept_answers_406_in_json_on_the_schema_too(clients):
    for url in ("/api/events/", "/api/schema/"):
        response = clients["anonymous"].get(url, HTTP_ACCEPT="text/xml")

        assert response.status_code == 406, url
        assert response["Content-Type"] == "application/json", url
        assert json.loads(response.content)["code"] == "not_acceptable", url


def test_an_error_on_the_schema_is_json_not_yaml(clients):
    response = clients["anonymous"].get("/api/schema/", HTTP_AUTHORIZATION="Token stale")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content)["code"] == "authentication_failed"


def test_the_known_formats_still_answer(clients):
    assert clients["anonymous"].get("/api/events/?format=json").status_code == 200
    schema = clients["anonymous"].get("/api/schema/?format=json")
    assert schema.status_code == 200 and "openapi" in schema.json()
    yaml = clients["anonymous"].get("/api/schema/")
    assert yaml.status_code == 200 and yaml.content.startswith(b"openapi:")
    browsable = clients["anonymous"].get("/api/events/?format=api")
    assert browsable.status_code == 200 and browsable["Content-Type"].startswith("text/html")


# --- JSON nested too deep ----------------------------------------------------------


def _nested_arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _nested_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


DEEP_BODIES = {
    "arrays-3000": _nested_arrays(3000),
    "objects-1500": _nested_objects(1500),
    "arrays-in-a-field": b'{"event": 1, "seats": '
    + _nested_arrays(2000)
    + b', "payment_method": "x"}',
    "just-over-the-limit": _nested_arrays(65),
}
DEEP_URLS = [
    ("anonymous", "/api/auth/token/"),
    ("alice", "/api/purchases/"),
    ("staff", "/api/webhook-endpoints/"),
]


@pytest.mark.parametrize("body", DEEP_BODIES.values(), ids=list(DEEP_BODIES))
@pytest.mark.parametrize(("who", "url"), DEEP_URLS)
def test_json_nested_deeper_than_the_limit_answers_400_parse_error(clients, who, url, body):
    assert len(body) < 16 * 1024  # under MAX_REQUEST_BYTES: the parser refuses it

    response = clients[who].post(
        url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=new_key()
    )

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "parse_error"
    assert PurchaseSaga.objects.count() == 0


def test_the_depth_limit_is_a_setting(clients, settings):
    settings.MAX_JSON_DEPTH = 3
    alice = clients["alice"]

    deep = alice.post(
        "/api/purchases/",
        b'{"event": 1, "seats": [[["A1"]]], "payment_method": "x"}',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=new_key(),
    )
    shallow = alice.post(
        "/api/purchases/",
        b'{"event": 1, "seats": ["A1"], "payment_method": "x", "note": "[[[[{{{{"}',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=new_key(),
    )

    assert (deep.status_code, deep.json()["code"]) == (400, "parse_error")
    assert "3" in deep.json()["detail"]
    # brackets inside a string are text, not depth: judged (no event 1) as usual
    assert shallow.json()["code"] != "parse_error"


def test_json_at_the_limit_is_parsed():
    from common.parsers import JSONParser

    parser = JSONParser()
    for body, want in [
        (_nested_arrays(64), eval("[" * 63 + "[]" + "]" * 63)),
        (b'{"a": "[[[[\\"[[[[", "b": [[1]]}', {"a": '[[[["[[[[', "b": [[1]]}),
        (b'"\\\\"', "\\"),
        ('["é["]'.encode(), ["é["]),
    ]:
        assert parser.parse(_stream(body), "application/json", {}) == want


def test_an_unclosed_string_is_one_match_to_the_end():
    # The depth check's cost stays linear only if a string that never closes
    # is taken out in one match: a pattern that fails there is retried at
    # every later quote, each scan to the end (16 KiB of \\" took 0.7 s).
    for text in ['"abc', '"a\\"b\\"c', '"' + '\\"' * 8000, '"ab\\', '"ab\\\\']:
        match = _STRING.match(text)
        assert match is not None and match.end() == len(text), text
    # closed strings end at their closing quote, escapes included
    for text, string in [
        ('"ab" 1', '"ab"'),
        ('"a\\"b" 1', '"a\\"b"'),
        ('"a\\\\" 1', '"a\\\\"'),
        ('"" 1', '""'),
    ]:
        match = _STRING.match(text)
        assert match is not None and match.group() == string, text


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("[" * 65 + '"' + '\\"' * 8000, 65),
        ('["[[[[', 1),  # the brackets after an unclosed quote are its text
        ('[{"a": "[[\\', 2),  # a lone backslash at the end
        ('["a\\\\", ["b"]]', 2),  # the quote after an escaped backslash closes
        ('["a\\"]", ["b"]]', 2),  # an escaped quote does not close
        ('{"a": "[[[[\\"[[[[", "b": [[1]]}', 3),
        ("1", 0),
    ],
)
def test_json_depth_counts_the_brackets_outside_strings(text, depth):
    assert json_depth(text) == depth


def test_a_16_kib_body_with_an_unclosed_string_is_refused_as_too_deep():
    body = ("[" * 65 + '"' + '\\"' * 8000).encode()
    assert len(body) <= 16 * 1024

    with pytest.raises(exceptions.ParseError, match="nested deeper than"):
        JSONParser().parse(_stream(body), "application/json", {})


# --- a charset that is not one ----------------------------------------------------

# Each one a codec Python knows. punycode raises UnicodeError (a ValueError,
# not a UnicodeDecodeError) on a JSON body; the others but idna are not text
# encodings at all (LookupError from bytes.decode). idna reads ASCII as
# itself: that body is read, and judged as usual (no event 1).
ODD_CHARSETS = {
    "punycode": "parse_error",
    "idna": "invalid",
    "rot13": "parse_error",
    "hex": "parse_error",
    "base64": "parse_error",
    "zlib": "parse_error",
}


@pytest.mark.parametrize(("charset", "code"), ODD_CHARSETS.items(), ids=list(ODD_CHARSETS))
def test_a_body_in_an_odd_charset_answers_400_not_500(clients, charset, code):
    body = {"event": 1, "seats": ["A1"], "payment_method": "card"}

    response = clients["alice"].post(
        "/api/purchases/",
        json.dumps(body).encode(),
        content_type=f"application/json; charset={charset}",
        HTTP_IDEMPOTENCY_KEY=new_key(),
    )

    assert response.status_code == 400, response.content
    assert response.json()["code"] == code
    assert PurchaseSaga.objects.count() == 0


def _stream(body: bytes):
    import io

    return io.BytesIO(body)


# --- a chunked body without a length ----------------------------------------------


@pytest.mark.parametrize(("who", "url"), DEEP_URLS)
def test_a_chunked_body_without_a_length_answers_411(clients, who, url):
    client = clients[who]

    response = client.generic(
        "POST",
        url,
        "",
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
        HTTP_IDEMPOTENCY_KEY=new_key(),
    )

    assert response.status_code == 411, response.content
    assert response.json()["code"] == "length_required"
    assert isinstance(response.json()["detail"], str)
    assert PurchaseSaga.objects.count() == 0


def test_a_chunked_request_outside_the_api_is_left_alone(clients):
    response = clients["anonymous"].generic("GET", "/healthz", HTTP_TRANSFER_ENCODING="chunked")
    assert response.status_code != 411


# --- the event's id: a JSON integer only ----------------------------------------------


# A string, a float, a bool or a container: the id, in the wrong JSON type.
WRONG_TYPES = {
    "string": str,
    "float": float,
    "float-string": lambda pk: f"{pk}.0",
    "bool": lambda pk: True,
    "list": lambda pk: [pk],
    "object": lambda pk: {"id": pk},
}


@pytest.mark.parametrize("wrong", WRONG_TYPES.values(), ids=list(WRONG_TYPES))
def test_an_event_that_is_not_a_json_integer_is_refused_as_invalid(clients, event, wrong):
    body = {**purchase_body(event), "event": wrong(event.pk)}

    response = clients["alice"].post(
        "/api/purchases/", body, format="json", HTTP_IDEMPOTENCY_KEY=new_key()
    )

    assert response.status_code == 400, response.content
    data = response.json()
    assert (data["code"], data["field"]) == ("invalid", "event")
    assert PurchaseSaga.objects.count() == 0


# --- content negotiation: the fast answers are DRF's -------------------------------------

_ACCEPTS = [
    None,  # no header: DRF reads */*
    "",
    "*/*",
    "application/json",
    "application/json; indent=4",
    "application/json;q=0.5",
    "text/html",
    "text/html,application/json;q=0.9",
    "application/*",
    "*/*;q=0.1",
    "text/xml",
    " */*",
]
_QUERIES = ["", "format=json", "format=api", "format=xml", "page=2"]


def _renderer_lists():
    from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer, TemplateHTMLRenderer

    return [
        [JSONRenderer()],
        [JSONRenderer(), BrowsableAPIRenderer()],
        [BrowsableAPIRenderer(), JSONRenderer()],
        [TemplateHTMLRenderer()],
    ]


@pytest.mark.parametrize("accept", _ACCEPTS)
@pytest.mark.parametrize("query", _QUERIES)
def test_the_api_negotiates_every_accept_as_drf_does(rf, accept, query):
    from rest_framework.negotiation import DefaultContentNegotiation
    from rest_framework.request import Request

    from common.negotiation import ContentNegotiation

    headers = {} if accept is None else {"HTTP_ACCEPT": accept}

    def answer(negotiation, renderers, suffix):
        request = Request(rf.get(f"/api/x/?{query}" if query else "/api/x/", **headers))
        try:
            renderer, media_type = negotiation.select_renderer(request, renderers, suffix)
        except exceptions.NotAcceptable:
            return "406"
        except Http404:  # a format no renderer has
            return "404"
        return type(renderer).__name__, media_type

    for renderers in _renderer_lists():
        for suffix in (None, "json"):
            assert answer(ContentNegotiation(), renderers, suffix) == answer(
                DefaultContentNegotiation(), renderers, suffix
            ), (renderers, suffix)


def test_the_api_uses_its_negotiation():
    from rest_framework.settings import api_settings

    from common.negotiation import ContentNegotiation

    negotiation: object = api_settings.DEFAULT_CONTENT_NEGOTIATION_CLASS
    assert negotiation is ContentNegotiation
