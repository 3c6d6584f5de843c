"""Screenshots of the saga admin for docs/operations.md, "Admin": the saga
pages of a reconciled, a compensated (refunded), an UNKNOWN and an escalated
(UNKNOWN_EXPIRED) purchase.

    .venv/bin/python devtools/admin_screenshots.py [--out docs/images]

Nothing of yours is touched: a scratch embedded PostgreSQL under a temporary folder
(``BOXOFFICE_VAR_DIR``), ``DEBUG=true``, the demo data (``seed_demo``), the
four sagas made through the services with the in-process fake gateway (the
same tables the mounted fake serves), a logged-in staff session, Django's
development server on a free port, headless Chromium (Debian's
``/usr/bin/chromium``) through playwright. Everything is removed afterwards.

If ``devtools/screenshots.py`` (the project's shared ``screenshot(url,
path, *, cookies=None, block_network=True, full_page=True)``) exists, it
takes the pictures; otherwise the small fallback below does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: devtools.* and the project import

from devtools import embedded_pg  # noqa: E402
from devtools.processes import free_port, listening, spawn, stop_group  # noqa: E402

if TYPE_CHECKING:  # the type of Playwright's add_cookies, not exported by its API
    from playwright._impl._api_structures import SetCookieParam

CHROMIUM = "/usr/bin/chromium"
SHOTS = {
    # saga (as --seed names it) -> picture
    "reconciled": "admin-saga-reconciled.png",
    "compensated": "admin-saga-compensated.png",
    "unknown": "admin-saga-unknown.png",
    "escalated": "admin-saga-escalated.png",
}
WIDTH, HEIGHT = 1400, 900


# --- in the seeding child (Django set up on the scratch database) ---------------------


def seed() -> dict:
    """Make the four sagas through the services, at times that read well when
    the pictures are taken (the UNKNOWN one's probe is still ahead), and a
    staff session; return their ids and the session cookie."""
    # Django is set up only in this child: the parent never imports it.
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    # After django.setup(): these need the app registry.
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone
    from freezegun import freeze_time

    from outbox.delivery import message_deliver
    from outbox.relay import relay_tick
    from payments.fake_gateway.inprocess import InProcessFakeGateway
    from payments.registry import override_gateway
    from purchases.models import Event, PurchaseSaga
    from purchases.services import By, purchase_refund, purchase_start, saga_charge

    users = {u.username: u for u in get_user_model().objects.all()}
    event = Event.objects.get(name="boxoffice demo night")
    keys = iter(range(1, 100))

    def start(user, seats, method):
        return purchase_start(
            user=users[user],
            idempotency_key=f"shot-{next(keys)}",
            event_id=event.pk,
            seat_refs=seats,
            payment_method=method,
        ).saga_id

    def drain():
        # What the relay and the workers would do, here and now.
        while relay_tick(dispatch=lambda message_id: message_deliver(message_id=message_id)):
            pass

    gateway = InProcessFakeGateway()
    real = timezone.now().replace(microsecond=0)
    sagas = {}
    with override_gateway(gateway):
        # The charge's answer was lost; the first probe found the charge.
        with freeze_time(real - timedelta(minutes=42, seconds=17)) as clock:
            sagas["reconciled"] = start("alice", ["A1"], "pm_card_timeout_charged")
            saga_charge(saga_id=sagas["reconciled"])
            clock.tick(60)
            drain()
        # Sold, then refunded by customer service.
        with freeze_time(real - timedelta(minutes=31, seconds=48)) as clock:
            sagas["compensated"] = start("bob", ["B4", "B5"], "pm_card_visa")
            saga_charge(saga_id=sagas["compensated"])
            drain()
            clock.tick(7 * 60 + 12)
            purchase_refund(
                saga_id=sagas["compensated"],
                by=By.operator("admin"),
                reason="customer asked (ticket 4711)",
            )
            drain()
        # No answer to the charge, and the gateway reports the intent
        # cancelled: a step of ours committed there and died before recording
        # it. Escalated, with an alert.
        with freeze_time(real - timedelta(minutes=3, seconds=5)) as clock:
            sagas["escalated"] = start("alice", ["C7"], "pm_card_timeout_not_charged")
            saga_charge(saga_id=sagas["escalated"])
            gateway.cancel(PurchaseSaga.objects.get(pk=sagas["escalated"]).intent_id)
            clock.tick(60)
            drain()
        # The charge's answer was lost a moment ago; the first probe is ahead.
        with freeze_time(real - timedelta(seconds=8)):
            sagas["unknown"] = start("bob", ["D2"], "pm_card_timeout_charged")
            saga_charge(saga_id=sagas["unknown"])
            drain()
    client = Client()
    client.force_login(users["admin"])
    return {
        "sagas": {k: str(v) for k, v in sagas.items()},
        "session": client.cookies["sessionid"].value,
    }


# --- in the parent ----------------------------------------------------------------------


def _shoot(url: str, path: Path, *, cookies: list[SetCookieParam]) -> None:
    try:
        from devtools.screenshots import screenshot  # the shared helper, once it exists
    except ImportError:
        screenshot = _fallback_screenshot
    screenshot(url, str(path), cookies=cookies, block_network=True, full_page=True)


def _fallback_screenshot(url, path, *, cookies=None, block_network=True, full_page=True):
    from urllib.parse import urlsplit  # only the fallback needs these

    from playwright.sync_api import sync_playwright

    origin = "{0.scheme}://{0.netloc}".format(urlsplit(url))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = browser.new_context(
                viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1
            )
            if cookies:
                context.add_cookies(cookies)
            # The admin's navigation sidebar closed: the page gets the width.
            context.add_init_script(
                "localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
            )
            page = context.new_page()
            if block_network:
                page.route(
                    "**/*",
                    lambda route: (
                        route.continue_() if route.request.url.startswith(origin) else route.abort()
                    ),
                )
            page.goto(url, wait_until="networkidle")
            page.screenshot(path=path, full_page=full_page)
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--seed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed:
        print(json.dumps(seed()))
        return 0

    scratch = Path(tempfile.mkdtemp(prefix="boxoffice-shots-"))
    scratch.chmod(0o755)  # as root, the embedded PostgreSQL runs as postgres
    database = contextlib.ExitStack()
    port = free_port()
    env = {
        **os.environ,
        "BOXOFFICE_VAR_DIR": str(scratch),
        "DEBUG": "true",
        "PORT": str(port),
        "PAYMENT_GATEWAY_URL": f"http://127.0.0.1:{port}/fake-gateway/v1",
        "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    env["DATABASE_URL"] = database.enter_context(embedded_pg.serving(scratch))
    for name in (
        "CELERY_BROKER_URL",
        "PROMETHEUS_MULTIPROC_DIR",
        "SECRET_KEY",
        "DJANGO_SETTINGS_MODULE",
    ):
        env.pop(name, None)
    python, manage = sys.executable, str(ROOT / "manage.py")
    web = None
    try:
        for command in (["migrate", "--no-input"], ["seed_demo"]):
            subprocess.run(
                [python, manage, *command], env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL
            )
        seeded = json.loads(
            subprocess.run(
                [python, __file__, "--seed"],
                env=env,
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        web = spawn(
            [python, manage, "runserver", f"127.0.0.1:{port}", "--noreload"],
            log=scratch / "web.log",
            env=env,
        )
        deadline = time.monotonic() + 30
        while not listening(port):
            if web.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start:\n{(scratch / 'web.log').read_text()}")
            time.sleep(0.2)
        cookies: list[SetCookieParam] = [
            {"name": "sessionid", "value": seeded["session"], "domain": "127.0.0.1", "path": "/"}
        ]
        args.out.mkdir(parents=True, exist_ok=True)
        for name, picture in SHOTS.items():
            url = (
                f"http://127.0.0.1:{port}/admin/purchases/purchasesaga/"
                f"{seeded['sagas'][name]}/change/"
            )
            _shoot(url, args.out / picture, cookies=cookies)
            print(args.out / picture)
    finally:
        if web is not None:
            stop_group(web)
        database.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
