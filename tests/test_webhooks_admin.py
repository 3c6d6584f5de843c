"""Webhook endpoints managed in the admin (webhooks/admin.py; docs/operations.md,
"Admin"): added, changed, re-keyed and deleted through the services, never
inside the admin's own transaction; the secret shown once; the endpoint's
page lists its latest deliveries and their attempts, with Resend for those
who may.

The endpoints are real (made by the services, on PostgreSQL); the deliveries
and attempts the pages display are rows written here with the ORM (test
data: no purchase needs to run for a page to show them).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import Client
from django.urls import reverse
from freezegun import freeze_time

from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import webhook_endpoint_create

from .factories import UserFactory

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:9/hook"
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ADD = reverse("admin:webhooks_webhookendpoint_add")
CHANGELIST = reverse("admin:webhooks_webhookendpoint_changelist")
DELIVERIES = reverse("admin:webhooks_webhookdelivery_changelist")
VIEW = ["view_webhookendpoint", "view_webhookdelivery"]


@pytest.fixture(autouse=True)
def local_urls(settings):
    # http:// and 127.0.0.1, as `make run` allows: nothing here resolves a name.
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True


@pytest.fixture
def staff(db):
    """A logged-in client per call, for a staff user holding exactly these
    permissions (codenames)."""

    def login(*codenames: str) -> Client:
        user = UserFactory(username=f"staff-{'-'.join(codenames) or 'none'}", is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        client = Client()
        client.force_login(user)
        return client

    return login


def _change(endpoint) -> str:
    return reverse("admin:webhooks_webhookendpoint_change", args=[endpoint.pk])


def _rotate(endpoint) -> str:
    return reverse("admin:webhooks_webhookendpoint_rotate_secret", args=[endpoint.pk])


def _delete(endpoint) -> str:
    return reverse("admin:webhooks_webhookendpoint_delete", args=[endpoint.pk])


def _endpoint(events=("purchase.confirmed",), **kwargs) -> WebhookEndpoint:
    return webhook_endpoint_create(url=URL, events=list(events), **kwargs)


def _form(endpoint, **overrides) -> dict:
    """What the change form posts for ``endpoint`` (``enabled`` absent: unchecked)."""
    data = {"url": endpoint.url, "events": endpoint.events, "description": endpoint.description}
    if endpoint.enabled:
        data["enabled"] = "on"
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def _errors(response) -> dict:
    assert response.status_code == 200, response
    return response.context["adminform"].form.errors


def _delivery(endpoint, *, status="failed", at=T0, attempts=(), message_id=None):
    """A delivery row and its attempts (``(status_code, latency_ms, error,
    excerpt)`` each, a second apart), as the worker would have left them."""
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint,
        message_id=message_id or f"msg_{uuid.uuid4().hex}",
        event_type="purchase.confirmed",
        saga_id=uuid.uuid4(),
        body='{"type":"x"}',
        status=status,
        armed_attempt=len(attempts) + 1 if status == "pending" else max(len(attempts), 1),
        next_attempt_at=at + timedelta(minutes=5) if status == "pending" else None,
        created_at=at,
        delivered_at=at if status == "delivered" else None,
        failed_at=at if status == "failed" else None,
    )
    for number, (code, latency, error, excerpt) in enumerate(attempts, start=1):
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=number,
            at=at + timedelta(seconds=number - 1),
            status_code=code,
            latency_ms=latency,
            error=error,
            response_excerpt=excerpt,
        )
    return delivery


def _log(endpoint, flag) -> list[LogEntry]:
    return list(
        LogEntry.objects.filter(
            object_id=str(endpoint.pk), action_flag=flag, content_type__model="webhookendpoint"
        )
    )


# --- add ------------------------------------------------------------------------------


def test_adding_an_endpoint_creates_it_and_shows_its_secret_once(admin_client):
    # The service's atomic(durable=True) raises if it runs inside the atomic
    # block Django's admin opens around a POST (see the next test): that it
    # created the endpoint is the proof that the admin does not open one.
    posted = admin_client.post(
        ADD,
        {
            "url": URL,
            "events": ["purchase.confirmed", "purchase.refunded"],
            "description": "the ERP",
        },
    )

    # Post/redirect/get: a reload of the page that shows the secret is a GET.
    assert posted.status_code == 303
    response = admin_client.get(posted["Location"])
    assert response.status_code == 200
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.url, endpoint.events, endpoint.description, endpoint.enabled) == (
        URL,
        ["purchase.confirmed", "purchase.refunded"],
        "the ERP",
        True,
    )
    html = response.content.decode()
    assert endpoint.secret.startswith("whsec_") and endpoint.secret in html
    assert "it is not shown again" in html
    reload = admin_client.get(posted["Location"]).content.decode()
    assert endpoint.secret.removeprefix("whsec_") not in reload
    assert WebhookEndpoint.objects.count() == 1
    [entry] = _log(endpoint, ADDITION)
    assert entry.user.username == "admin"

    page = admin_client.get(_change(endpoint))
    assert page.status_code == 200
    assert endpoint.secret.removeprefix("whsec_") not in page.content.decode()


def test_the_services_would_refuse_the_admins_own_transaction():
    # What the add, change and delete views avoid: Django wraps a POST in
    # transaction.atomic, and a durable block inside it fails loudly.
    with transaction.atomic(), pytest.raises(RuntimeError, match="durable"):
        _endpoint()


def test_adding_an_endpoint_with_a_url_that_is_not_allowed_is_an_error_on_url(
    admin_client, settings
):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = False

    plain_http = admin_client.post(ADD, {"url": URL, "events": ["purchase.confirmed"]})
    private = admin_client.post(
        ADD, {"url": "https://10.0.0.1/hook", "events": ["purchase.confirmed"]}
    )

    assert "https://" in " ".join(_errors(plain_http)["url"])
    assert "not public" in " ".join(_errors(private)["url"])
    assert not WebhookEndpoint.objects.exists()
    assert not LogEntry.objects.exists()


def test_adding_an_endpoint_without_an_event_type_is_an_error_on_events(admin_client):
    response = admin_client.post(ADD, {"url": URL, "description": "nothing chosen"})

    assert list(_errors(response)) == ["events"]
    assert not WebhookEndpoint.objects.exists()


def test_the_add_form_offers_the_four_event_types_as_checkboxes(admin_client):
    html = admin_client.get(ADD).content.decode()

    for event_type in (
        "purchase.confirmed",
        "purchase.failed",
        "purchase.refunded",
        "purchase.needs_attention",
    ):
        assert f'type="checkbox" name="events" value="{event_type}"' in html


# --- change ---------------------------------------------------------------------------


def test_changing_an_endpoint_goes_through_the_service(admin_client):
    with freeze_time(T0):
        endpoint = _endpoint(description="old")

    with freeze_time(T0 + timedelta(hours=1)):
        response = admin_client.post(
            _change(endpoint),
            _form(endpoint, enabled=None, events=["purchase.failed", "purchase.refunded"]),
        )

    assert response.status_code == 302
    changed = WebhookEndpoint.objects.get()
    assert changed.enabled is False
    assert changed.events == ["purchase.failed", "purchase.refunded"]
    assert (changed.url, changed.description, changed.secret) == (URL, "old", endpoint.secret)
    assert changed.updated_at == T0 + timedelta(hours=1)
    [entry] = _log(endpoint, CHANGE)
    assert "Enabled" in entry.get_change_message() and "Events" in entry.get_change_message()


def test_changing_an_endpoint_to_a_bad_url_is_an_error_on_url(admin_client, settings):
    endpoint = _endpoint()
    settings.WEBHOOK_ALLOW_LOCAL_URLS = False

    response = admin_client.post(_change(endpoint), _form(endpoint, url="https://127.0.0.1/x"))

    assert "not public" in " ".join(_errors(response)["url"])
    unchanged = WebhookEndpoint.objects.get()
    assert (unchanged.url, unchanged.updated_at) == (URL, endpoint.updated_at)
    assert not _log(endpoint, CHANGE)


def test_the_change_page_never_shows_the_secret(admin_client):
    endpoint = _endpoint()

    html = admin_client.get(_change(endpoint)).content.decode()

    assert endpoint.secret.removeprefix("whsec_") not in html
    assert 'name="secret"' not in html
    assert "rotate-secret-link" in html and 'name="_save"' in html


# --- rotate ---------------------------------------------------------------------------


def test_rotating_shows_the_new_secret_once_and_the_old_one_is_gone(admin_client):
    endpoint = _endpoint()

    confirm = admin_client.get(_rotate(endpoint))
    assert confirm.status_code == 200
    assert WebhookEndpoint.objects.get().secret == endpoint.secret  # a GET changes nothing
    assert endpoint.secret not in confirm.content.decode()

    posted = admin_client.post(_rotate(endpoint))

    assert posted.status_code == 303
    rotated = admin_client.get(posted["Location"])
    new = WebhookEndpoint.objects.get().secret
    assert new != endpoint.secret and new.startswith("whsec_")
    html = rotated.content.decode()
    assert new in html and endpoint.secret not in html
    assert "it is not shown again" in html
    assert new.removeprefix("whsec_") not in admin_client.get(posted["Location"]).content.decode()
    assert new.removeprefix("whsec_") not in admin_client.get(_change(endpoint)).content.decode()
    [entry] = _log(endpoint, CHANGE)
    assert "Rotated the secret" in entry.get_change_message()


def test_rotating_takes_a_post_with_a_csrf_token(admin_user, admin_client):
    endpoint = _endpoint()
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)

    assert client.post(_rotate(endpoint)).status_code == 403  # no token
    assert admin_client.put(_rotate(endpoint)).status_code == 405
    assert WebhookEndpoint.objects.get().secret == endpoint.secret


# --- delete ---------------------------------------------------------------------------


def test_deleting_an_endpoint_takes_its_deliveries_and_attempts(admin_client):
    endpoint = _endpoint()
    _delivery(endpoint, attempts=[(500, 12.0, "HTTP 500", "no")])
    kept = _delivery(_endpoint(), status="delivered", attempts=[(200, 5.0, "", "")])

    confirm = admin_client.get(_delete(endpoint))
    assert confirm.status_code == 200 and "1 delivery, with their attempts" in (
        confirm.content.decode()
    )
    done = admin_client.post(_delete(endpoint), {"post": "yes"})

    assert done.status_code == 302
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert list(WebhookDelivery.objects.all()) == [kept]
    assert list(WebhookAttempt.objects.values_list("delivery", flat=True)) == [kept.pk]
    [entry] = _log(endpoint, DELETION)
    assert entry.object_repr == URL


def test_deleting_selected_endpoints_goes_through_the_service(admin_client):
    first, second = _endpoint(), _endpoint()
    _delivery(first)

    response = admin_client.post(
        CHANGELIST,
        {"action": "delete_selected", "_selected_action": [first.pk, second.pk], "post": "yes"},
    )

    assert response.status_code == 302
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()
    assert len(_log(first, DELETION) + _log(second, DELETION)) == 2


# --- permissions ----------------------------------------------------------------------


def test_staff_who_may_only_look_cannot_add_change_rotate_or_delete(staff, settings):
    endpoint = _endpoint()
    viewer = staff(*VIEW)

    assert viewer.get(ADD).status_code == 403
    assert viewer.post(ADD, {"url": URL, "events": ["purchase.confirmed"]}).status_code == 403
    assert viewer.post(_change(endpoint), _form(endpoint, enabled=None)).status_code == 403
    assert viewer.get(_rotate(endpoint)).status_code == 403
    assert viewer.post(_rotate(endpoint)).status_code == 403
    assert viewer.get(_delete(endpoint)).status_code == 403
    assert viewer.post(_delete(endpoint), {"post": "yes"}).status_code == 403
    viewer.post(
        CHANGELIST, {"action": "delete_selected", "_selected_action": [endpoint.pk], "post": "yes"}
    )

    assert list(WebhookEndpoint.objects.values("enabled", "secret", "updated_at")) == [
        {"enabled": True, "secret": endpoint.secret, "updated_at": endpoint.updated_at}
    ]
    assert WebhookEndpoint.objects.count() == 1 and not LogEntry.objects.exists()
    page = viewer.get(_change(endpoint)).content.decode()
    assert "rotate-secret-link" not in page and 'name="_save"' not in page
    assert "deletelink" not in page
    listing = viewer.get(CHANGELIST).content.decode()
    assert "addlink" not in listing and "delete_selected" not in listing


def test_changing_lets_staff_rotate_but_not_delete(staff):
    endpoint = _endpoint()
    editor = staff(*VIEW, "change_webhookendpoint")

    assert editor.get(ADD).status_code == 403
    rotated = editor.post(_rotate(endpoint))
    assert rotated.status_code == 303
    assert editor.get(rotated["Location"]).status_code == 200
    assert editor.post(_delete(endpoint), {"post": "yes"}).status_code == 403
    assert WebhookEndpoint.objects.get().secret != endpoint.secret


# --- the endpoint's deliveries --------------------------------------------------------


def test_the_endpoint_page_lists_its_deliveries_and_their_attempts(staff):
    endpoint = _endpoint()
    failed = _delivery(
        endpoint,
        attempts=[
            (500, 12.4, "HTTP 500", "receiver says no"),
            (None, None, "timeout after 5s", ""),
        ],
    )
    pending = _delivery(endpoint, status="pending", at=T0 + timedelta(hours=1))
    elsewhere = _delivery(_endpoint())

    html = staff(*VIEW).get(_change(endpoint)).content.decode()

    assert 'id="endpoint-deliveries"' in html
    assert failed.message_id in html and pending.message_id in html
    assert elsewhere.message_id not in html
    assert html.index(pending.message_id) < html.index(failed.message_id)  # newest first
    assert "#1 2026-12-02 12:00:00 UTC: HTTP 500, 12 ms — HTTP 500" in html
    assert "receiver says no" in html
    assert "#2 2026-12-02 12:00:01 UTC: no answer — timeout after 5s" in html
    assert "attempt 1 due 2026-12-02 13:05:00 UTC" in html
    assert str(failed.saga_id) in html
    assert f"{DELIVERIES}?endpoint__id__exact={endpoint.pk}" in html
    assert "Resend…" not in html  # not without the permission


def test_resend_is_offered_with_the_permission_for_deliveries_not_pending(staff):
    endpoint = _endpoint()
    failed = _delivery(endpoint, attempts=[(500, 3.0, "HTTP 500", "")])
    _delivery(endpoint, status="pending")
    operator = staff(*VIEW, "resend_webhookdelivery")

    html = operator.get(_change(endpoint)).content.decode()

    assert html.count('value="Resend…"') == 1
    assert f'name="_selected_action" value="{failed.pk}"' in html
    assert f'action="{DELIVERIES}"' in html
    # the button posts to the delivery list's action: its dry run first
    dry_run = operator.post(DELIVERIES, {"action": "resend", "_selected_action": [failed.pk]})
    assert dry_run.status_code == 200 and "Dry run" in dry_run.content.decode()
    assert WebhookAttempt.objects.filter(delivery=failed).count() == 1


def test_the_endpoint_page_shows_the_latest_deliveries_and_links_to_all(staff):
    endpoint = _endpoint()
    oldest = _delivery(endpoint, at=T0 - timedelta(days=1))
    for minute in range(20):
        _delivery(endpoint, at=T0 + timedelta(minutes=minute))
    viewer = staff(*VIEW)

    html = viewer.get(_change(endpoint)).content.decode()
    every = viewer.get(f"{DELIVERIES}?endpoint__id__exact={endpoint.pk}")

    assert html.count('class="webhook-delivery ') == 20
    assert oldest.message_id not in html
    assert every.status_code == 200 and every.context["cl"].result_count == 21


def test_staff_who_may_not_read_deliveries_do_not_see_them_on_the_endpoint_page(staff):
    endpoint = _endpoint()
    delivery = _delivery(endpoint)

    html = staff("view_webhookendpoint").get(_change(endpoint)).content.decode()

    assert delivery.message_id not in html and 'id="endpoint-deliveries"' not in html


def test_the_delivery_list_finds_a_saga_id_a_delivery_id_or_a_webhook_id_exactly(admin_client):
    endpoint = _endpoint()
    one, other = _delivery(endpoint), _delivery(endpoint, message_id="msg_wanted")

    def found(term) -> set[int]:
        page = admin_client.get(DELIVERIES, {"q": term})
        assert page.status_code == 200
        return set(page.context["cl"].queryset.values_list("pk", flat=True))

    assert found(str(one.saga_id)) == {one.pk}
    assert found(f"  {other.pk} ") == {other.pk}
    assert found("msg_wanted") == {other.pk}
    assert found("msg_want") == set()  # exact: the unique index answers it
    assert found("") == {one.pk, other.pk}
