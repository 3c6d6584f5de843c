"""Screenshots of the seller pages for the docs (docs/images/seller-*.png):
the events list, a draft's edit page and an event's dashboard, on a desktop
and (the dashboard) 375 px wide.

    .venv/bin/python -m devtools.seller_screenshots [--out docs/images]

Nothing of yours is touched: a scratch embedded PostgreSQL under a temporary
folder (``BOXOFFICE_VAR_DIR``), ``DEBUG=true``, the demo data
(``seed_demo``: alice owns the organizer "demo"), then, in a child process
with Django set up, an event with a seat map of two price categories made
and published through ``seller.services``, purchases of it charged through
the services with the in-process fake gateway (one refunded, one still
held), a few seats blocked, a draft to edit and alice's session; Django's
development server on a free port; headless Chromium (Debian's
``/usr/bin/chromium``) with every request to another host aborted.
Everything is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from playwright.sync_api import Route, ViewportSize, sync_playwright

from devtools import embedded_pg
from devtools.processes import ROOT, free_port, manage_argv, spawn, stop_group, wait_until
from devtools.screenshots import CHROMIUM, CHROMIUM_ARGS, LOCAL_HOSTS, NOT_INHERITED

if TYPE_CHECKING:  # the type of Playwright's add_cookies, not exported by its API
    from playwright._impl._api_structures import SetCookieParam

DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 812}
ORGANIZER = "demo"


def _hall_csv() -> str:
    """A hall of two blocks of stalls around an aisle and a balcony behind,
    with the balcony's seats cheaper and two accessible seats in row A."""
    lines = ["section,row,number,ref,category,x,y,accessible"]
    for r, row in enumerate("ABCDEF"):
        for n in range(1, 15):
            x = n * 2 + (2 if n > 7 else 0)  # the aisle
            accessible = row == "A" and n in (1, 14)
            lines.append(f"Stalls,{row},{n},{row}{n},stalls,{x},{r * 2},{str(accessible).lower()}")
    for r, row in enumerate("GH"):
        for n in range(1, 17):
            lines.append(f"Balcony,{row},{n},{row}{n},balcony,{n * 2 - 1},{14 + r * 2},false")
    return "\n".join(lines) + "\n"


# --- in the seeding child (Django set up on the scratch database) ------------------------


def _event_body(name: str, days: int, now) -> dict[str, Any]:
    return {
        "name": name,
        "starts_at": (now + timedelta(days=days)).replace(hour=20, minute=0).isoformat(),
        "currency": "EUR",
        "max_seats_per_buyer": 10,
        "refund_policy": {"buyer_can_cancel_until": None, "fee_percent": 0},
        "price_categories": [
            {"code": "stalls", "name": "Stalls", "price": {"amount": 4500, "currency": "EUR"}},
            {"code": "balcony", "name": "Balcony", "price": {"amount": 2800, "currency": "EUR"}},
        ],
    }


def seed() -> dict:
    """Make the events, the purchases and alice's session; their ids."""
    # Django is set up only in this child: the parent never imports it.
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    # After django.setup(): these need the app registry.
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone

    from organizers.models import Organizer
    from seller import seat_maps, services

    organizer = Organizer.objects.get(slug=ORGANIZER)
    now = timezone.now()
    seats = seat_maps.seats_from_csv(_hall_csv())
    spec = seat_maps.event_from_json(_event_body("Harbour lights", 21, now))
    event = services.event_create(organizer=organizer, spec=dataclasses.replace(spec, seats=seats))
    services.event_publish(organizer=organizer, event_id=event.pk)
    services.seats_block(
        organizer=organizer, event_id=event.pk, refs=["H15", "H16"], reason="sound desk"
    )
    draft_spec = seat_maps.event_from_json(_event_body("Winter concert", 90, now))
    draft = services.event_create(
        organizer=organizer, spec=dataclasses.replace(draft_spec, seats=seats)
    )
    _sell(event.pk)
    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    return {"event": event.pk, "draft": draft.pk, "session": client.cookies["sessionid"].value}


def _sell(event_id: int) -> None:
    """Purchases through the services: charged, one refunded, one held."""
    # After django.setup() (seed): these need the app registry.
    from django.contrib.auth import get_user_model

    from outbox.delivery import message_deliver
    from outbox.relay import relay_tick
    from payments.fake_gateway.inprocess import InProcessFakeGateway
    from payments.registry import override_gateway
    from purchases.services import By, purchase_refund, purchase_start, saga_charge

    users = {u.username: u for u in get_user_model().objects.all()}
    orders = [
        ("bob", ["C7", "C8"]), ("alice", ["D3", "D4", "D5"]), ("bob", ["A8", "A9"]),
        ("alice", ["G5", "G6"]), ("bob", ["B1"]), ("alice", ["E10", "E11"]),
    ]  # fmt: skip
    with override_gateway(InProcessFakeGateway()):
        for n, (buyer, refs) in enumerate(orders):
            started = purchase_start(
                user=users[buyer], idempotency_key=f"shot-{n}", event_id=event_id,
                seat_refs=refs, payment_method="pm_card_visa",
            )  # fmt: skip
            saga_charge(saga_id=started.saga_id)
            if buyer == "bob" and refs == ["B1"]:
                purchase_refund(
                    saga_id=started.saga_id, by=By.operator("admin"), reason="customer asked"
                )
        purchase_start(
            user=users["alice"], idempotency_key="shot-held", event_id=event_id,
            seat_refs=["F1", "F2"], payment_method="pm_card_visa",
        )  # fmt: skip
        # What the relay and the workers would do, here and now.
        while relay_tick(dispatch=lambda message_id: message_deliver(message_id=message_id)):
            pass


# --- in the parent -------------------------------------------------------------------------


def _shoot(url: str, path: Path, *, viewport: ViewportSize, session: str) -> None:
    cookies: list[SetCookieParam] = [
        {"name": "sessionid", "value": session, "domain": "127.0.0.1", "path": "/"}
    ]

    def only_local(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=viewport)
            context.route("**/*", only_local)
            context.add_cookies(cookies)
            page = context.new_page()
            page.goto(url, wait_until="networkidle")
            page.screenshot(path=str(path), full_page=True)
        finally:
            browser.close()


def _env(scratch: Path, port: int, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update(
        BOXOFFICE_VAR_DIR=str(scratch),
        DEBUG="true",
        PORT=str(port),
        DATABASE_URL=database_url,
        PAYMENT_GATEWAY_URL=f"http://127.0.0.1:{port}/fake-gateway/v1",
        EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    return env


def _seeded(env: dict[str, str]) -> dict:
    for step in (["migrate", "--no-input"], ["seed_demo"]):
        subprocess.run(manage_argv(*step), env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    child = subprocess.run(
        [sys.executable, "-m", "devtools.seller_screenshots", "--seed"],
        env=env, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if child.returncode != 0:
        raise RuntimeError(f"seeding failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--seed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seed:
        print(json.dumps(seed()))
        return 0
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="seller-shots-")))
        scratch.chmod(0o755)  # as root, the embedded PostgreSQL runs as postgres
        port = free_port()
        env = _env(scratch, port, stack.enter_context(embedded_pg.serving(scratch)))
        seeded = _seeded(env)
        log = scratch / "web.log"
        web = spawn(manage_argv("runserver", f"127.0.0.1:{port}", "--noreload"), log=log, env=env)
        stack.callback(stop_group, web)
        base = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: web.poll() is not None or _answers(base),
            "the server to answer",
            timeout=60,
            error=RuntimeError,
            detail=lambda: log.read_text()[-3000:],
        )
        event, draft = seeded["event"], seeded["draft"]
        shots = [
            (f"/seller/{ORGANIZER}/", "seller-events.png", DESKTOP),
            (f"/seller/{ORGANIZER}/events/{draft}/edit/", "seller-event-edit.png", DESKTOP),
            (f"/seller/{ORGANIZER}/events/{event}/", "seller-dashboard.png", DESKTOP),
            (f"/seller/{ORGANIZER}/events/{event}/", "seller-dashboard-phone.png", PHONE),
        ]
        args.out.mkdir(parents=True, exist_ok=True)
        for page, name, viewport in shots:
            _shoot(f"{base}{page}", args.out / name, viewport=viewport, session=seeded["session"])
            print(args.out / name)
    return 0


def _answers(base: str) -> bool:
    """Whether the server answers (its liveness check)."""
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())
