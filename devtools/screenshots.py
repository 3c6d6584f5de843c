"""Screenshots of the service's pages for the docs (docs/images/), taken by
headless Chromium (Debian's, /usr/bin/chromium) with the network cut off:
every request to a host other than 127.0.0.1 is aborted, so a picture shows
what a machine without internet shows.

From the repository's root::

    .venv/bin/python -m devtools.screenshots
        # starts a server like make run's web process (DEBUG, demo data, PostgreSQL in
        # a temporary folder) and takes docs/images/api-docs-offline.png
    .venv/bin/python -m devtools.screenshots --base-url http://127.0.0.1:8000 \\
        --login admin:boxoffice /admin/=docs/images/admin.png
        # pages of a server already running, as a logged-in user

In Python: ``screenshot(url, path)`` takes one picture; ``demo_server()``
starts a server and yields its base URL; ``login_cookies(base_url, user,
password)`` logs in through the admin's login form and returns the session's
cookies for ``screenshot(..., cookies=...)``; ``screenshots(base_url, shots)``
takes several.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

import httpx
from playwright.sync_api import Route, ViewportSize, sync_playwright

from devtools import embedded_pg
from devtools.processes import ROOT, free_port, manage_argv, spawn, stop_group, wait_until

if TYPE_CHECKING:  # the type of Playwright's add_cookies, not exported by its API
    from playwright._impl._api_structures import SetCookieParam

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
# The only host a page may reach when the network is blocked.
LOCAL_HOSTS = frozenset({"127.0.0.1"})
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
DEFAULT_SHOTS = {"/api/docs/": ROOT / "docs" / "images" / "api-docs-offline.png"}
# What a server started here must not inherit from the shell: it runs on its
# own embedded PostgreSQL and needs no broker (make test exports these).
NOT_INHERITED = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "DJANGO_SETTINGS_MODULE",
    "PROMETHEUS_MULTIPROC_DIR",
    "PAYMENT_GATEWAY_URL",
    "SECRET_KEY",
)


def screenshot(
    url: str,
    path: str | os.PathLike,
    *,
    cookies: list[SetCookieParam] | None = None,
    block_network: bool = True,
    full_page: bool = True,
) -> list[str]:
    """Save a PNG of ``url`` at ``path``, once the page has loaded and the
    network is idle. ``cookies``: Playwright cookies (``login_cookies``).
    With ``block_network``, every request to another host than 127.0.0.1 is
    aborted. Returns the URLs that were blocked (empty: the page asked for
    nothing outside)."""
    blocked: list[str] = []

    def only_local(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=VIEWPORT)
            if block_network:
                context.route("**/*", only_local)
            if cookies:
                context.add_cookies(cookies)
            page = context.new_page()
            page.goto(url, wait_until="networkidle")
            page.screenshot(path=str(path), full_page=full_page)
        finally:
            browser.close()
    return blocked


def login_cookies(base_url: str, username: str, password: str) -> list[SetCookieParam]:
    """Log in through the admin's login form; the session's cookies, for
    ``screenshot(..., cookies=...)``."""
    login = urljoin(base_url, "/admin/login/")
    with httpx.Client(timeout=10) as http:
        form = http.get(login)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        if token is None:
            raise RuntimeError(f"no login form at {login}")
        answer = http.post(
            login,
            headers={"Referer": login},
            data={
                "csrfmiddlewaretoken": token.group(1),
                "username": username,
                "password": password,
                "next": "/admin/",
            },
        )
        if answer.status_code != 302:
            raise RuntimeError(f"login as {username} refused ({answer.status_code})")
        return [
            {"name": name, "value": value, "url": base_url} for name, value in http.cookies.items()
        ]


def screenshots(
    base_url: str,
    shots: Mapping[str, str | os.PathLike],
    *,
    cookies: list[SetCookieParam] | None = None,
    block_network: bool = True,
) -> dict[str, list]:
    """``screenshot`` each page path of ``shots`` (path -> file) under
    ``base_url``; the requests each page had blocked."""
    return {
        page: screenshot(
            urljoin(base_url, page), file, cookies=cookies, block_network=block_network
        )
        for page, file in shots.items()
    }


@contextlib.contextmanager
def demo_server(port: int | None = None) -> Iterator[str]:
    """runserver as in make run's web process (DEBUG: static files served, the
    fake gateway mounted), on a fresh embedded PostgreSQL with the demo data
    (``seed_demo``: users alice, bob and admin, password ``boxoffice``), in
    a temporary folder; yields its base URL and stops it afterwards."""
    port = port or free_port()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="boxoffice-screenshots-"))
        os.chmod(tmp, 0o755)  # as root, the embedded PostgreSQL runs as postgres
        database_url = stack.enter_context(embedded_pg.serving(Path(tmp)))
        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        env.update(
            DEBUG="true",
            PORT=str(port),
            BOXOFFICE_VAR_DIR=tmp,
            DATABASE_URL=database_url,
            PYTHONUNBUFFERED="1",
        )
        log = Path(tmp) / "server.log"
        for step in (["migrate", "--no-input"], ["seed_demo"]):
            setup = spawn(manage_argv(*step), log=log, env=env)
            if setup.wait(120) != 0:
                raise RuntimeError(f"{' '.join(step)} failed:\n{log.read_text()[-3000:]}")
        server = spawn(
            manage_argv("runserver", f"127.0.0.1:{port}", "--noreload"), log=log, env=env
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            # Stops waiting, too, if the server exited (the port was taken...).
            wait_until(
                lambda: server.poll() is not None or _answers(f"{base_url}/api/schema/"),
                "the server to answer",
                timeout=60,
                error=RuntimeError,
                detail=lambda: log.read_text()[-3000:],
            )
            if server.poll() is not None:
                raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
            yield base_url
        finally:
            stop_group(server)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.screenshots", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "shots",
        nargs="*",
        metavar="PATH=FILE",
        help="a page path and the PNG to write "
        "(default: /api/docs/=docs/images/api-docs-offline.png)",
    )
    parser.add_argument("--base-url", help="a server already running (default: start one)")
    parser.add_argument(
        "--login", metavar="USER:PASSWORD", help="log in through the admin's login form first"
    )
    parser.add_argument(
        "--network", action="store_true", help="let the pages reach other hosts (not blocked)"
    )
    args = parser.parse_args(argv)
    shots = dict(s.split("=", 1) for s in args.shots) if args.shots else DEFAULT_SHOTS

    with contextlib.ExitStack() as stack:
        base_url = args.base_url or stack.enter_context(demo_server())
        cookies = login_cookies(base_url, *args.login.split(":", 1)) if args.login else None
        results = screenshots(base_url, shots, cookies=cookies, block_network=not args.network)
    for page, blocked in results.items():
        print(f"{page} -> {shots[page]}" + (f" (blocked: {', '.join(blocked)})" if blocked else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
