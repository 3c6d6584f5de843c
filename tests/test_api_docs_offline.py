"""The API's docs pages render on a machine without internet.

``/api/docs/`` (Swagger UI) and ``/api/redoc/`` (ReDoc) must load every
script, stylesheet, icon and font from this service: each URL a page
references (``src``/``href`` of its tags, ``url(...)`` in the stylesheets it
loads) must be relative to the service, never absolute to another host, and
answer 200 with content. Checked the two ways static files are served:

- as under ``make run`` (runserver, DEBUG): from the apps' static folders,
  which is what pytest-django's live server does (Django's static files
  handler);
- as in a deployment (Dockerfile, Compose): ``collectstatic`` into
  ``STATIC_ROOT``, served by WhiteNoise, with DEBUG off.

The picture of the page rendered with the network blocked is
docs/images/api-docs-offline.png (devtools/screenshots.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from django.core.management import call_command
from django.test import Client

PAGES = ("/api/docs/", "/api/redoc/")
# src= or href= of the tags that make the browser fetch something.
TAG_REFERENCE = re.compile(
    r"""<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""",
    re.IGNORECASE,
)
CSS_REFERENCE = re.compile(r"""url\(\s*["']?([^"')\s]+)""", re.IGNORECASE)
# Anything in the page (inline scripts included) that names another host.
ABSOLUTE_URL = re.compile(r"""(?:https?:)?//[\w.-]+\.[a-z]{2,}[/"'\s]""", re.IGNORECASE)

Get = Callable[[str], tuple[int, str, bytes]]


def _offsite(url: str) -> bool:
    """Absolute (a scheme, or protocol-relative ``//host``): fetched from another
    host, or from nowhere offline."""
    parts = urlsplit(url)
    return bool(parts.scheme or parts.netloc)


def _problems(get: Get) -> list[str]:
    problems = []
    for page in PAGES:
        status, content_type, body = get(page)
        if status != 200 or "text/html" not in content_type:
            problems.append(f"{page}: {status} {content_type}")
            continue
        html = body.decode()
        problems += [
            f"{page} names another host: {m.group(0)!r}" for m in ABSOLUTE_URL.finditer(html)
        ]
        references = TAG_REFERENCE.findall(html)
        if not any(ref.endswith(".js") for ref in references):
            problems.append(f"{page}: no script found, {references}")
        for ref in references:
            if _offsite(ref):
                problems.append(f"{page} loads {ref} from another host")
                continue
            url = urljoin(page, ref)
            status, content_type, asset = get(url)
            if status != 200 or not asset:
                problems.append(f"{page} loads {url}: {status}, {len(asset)} bytes")
            elif "css" in content_type or url.endswith(".css"):
                for inner in CSS_REFERENCE.findall(asset.decode(errors="replace")):
                    if inner.startswith("data:"):
                        continue
                    if _offsite(inner):
                        problems.append(f"{url} loads {inner} from another host")
                        continue
                    inner_url = urljoin(url, inner)
                    code = get(inner_url)[0]
                    if code != 200:
                        problems.append(f"{url} loads {inner_url}: {code}")
    return problems


def test_the_docs_load_nothing_from_another_host_under_make_run(live_server):
    # The live server serves static files as runserver does under make run.
    with httpx.Client(base_url=live_server.url, timeout=10) as http:

        def get(path: str) -> tuple[int, str, bytes]:
            answer = http.get(path)
            return answer.status_code, answer.headers.get("content-type", ""), answer.content

        problems = _problems(get)
        assert not problems, "\n".join(problems)


def test_the_docs_load_nothing_from_another_host_once_collected(settings, tmp_path):
    # Set before the client exists: WhiteNoise reads STATIC_ROOT when its
    # middleware is built (on the client's first request).
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", interactive=False, verbosity=0)
    client = Client()

    def get(path: str) -> tuple[int, str, bytes]:
        answer = client.get(path)
        body = (
            b"".join(answer.streaming_content)  # type: ignore[attr-defined]  # a FileResponse
            if answer.streaming
            else answer.content
        )
        return answer.status_code, answer.get("Content-Type", ""), body

    problems = _problems(get)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "reference, offsite",
    [
        ("/static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js", False),
        ("swagger-ui.css", False),
        ("https://cdn.jsdelivr.net/npm/swagger-ui-dist@latest/swagger-ui.css", True),
        ("//fonts.googleapis.com/css2?family=Roboto", True),
    ],
)
def test_an_absolute_reference_is_offsite(reference, offsite):
    assert _offsite(reference) is offsite


def test_the_scan_finds_a_cdn_in_a_page():
    html = (
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css2?family=Roboto">'
        '<script src="/static/app.js"></script>'
    )
    assert TAG_REFERENCE.findall(html) == [
        "https://fonts.googleapis.com/css2?family=Roboto",
        "/static/app.js",
    ]
    assert ABSOLUTE_URL.search(html)
