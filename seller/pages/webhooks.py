"""``/seller/<slug>/webhooks/``: the organizer's webhook endpoints, made,
disabled, enabled and deleted through the services behind
``/api/organizers/{slug}/webhook-endpoints/`` (``webhooks.services``), read
through its selectors (the organizer's own endpoints only). A new
endpoint's secret is shown once, on the answer to the form that made it."""

from __future__ import annotations

import re

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from organizers.roles import Action
from webhooks import selectors
from webhooks.services import (
    WebhookInvalid,
    WebhookNotFound,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_update,
)

from ..forms import WebhookEndpointForm, show_refusal
from ..page_access import SellerAccess, seller_page
from .home import see_other

_MAX_ID = 2**63 - 1  # a bigint: a longer run of digits names no endpoint


def _page(
    request: HttpRequest,
    access: SellerAccess,
    form: WebhookEndpointForm,
    *,
    status: int = 200,
    created=None,
) -> HttpResponse:
    return render(
        request,
        "seller/webhooks.html",
        {
            "access": access,
            "organizer": access.organizer,
            "section": "webhooks",
            "nav": "seller",
            "endpoints": list(selectors.endpoint_list(organizer=access.organizer)),
            "form": form,
            "created": created,
        },
        status=status,
    )


@seller_page(actions={"GET": Action.MANAGE_WEBHOOKS, "POST": Action.MANAGE_WEBHOOKS})
def endpoint_list(request: HttpRequest, access: SellerAccess) -> HttpResponse:
    """The endpoints; a POST makes one and shows its secret, this once (not
    a redirect: the secret is in no URL, session or later page)."""
    if request.method != "POST":
        return _page(request, access, WebhookEndpointForm())
    form = WebhookEndpointForm(request.POST)
    if not form.is_valid():
        return _page(request, access, form, status=400)
    try:
        endpoint = webhook_endpoint_create(organizer=access.organizer, **form.cleaned_data)
    except WebhookInvalid as exc:
        show_refusal(form, exc.field, exc.message)
        return _page(request, access, form, status=400)
    return _page(request, access, WebhookEndpointForm(), status=201, created=endpoint)


def _own_endpoint(access: SellerAccess, endpoint_id: str) -> int:
    """The id of one of the organizer's endpoints; 404 for any other id,
    another organizer's too."""
    pk = int(endpoint_id) if re.fullmatch(r"[0-9]{1,19}", endpoint_id) else None
    if pk is None or pk > _MAX_ID:
        raise Http404("no such webhook endpoint")
    if not selectors.endpoint_in_scope(endpoint_id=pk, organizer=access.organizer):
        raise Http404("no such webhook endpoint")
    return pk


@seller_page(actions={"POST": Action.MANAGE_WEBHOOKS})
def endpoint_enable(request: HttpRequest, access: SellerAccess, endpoint_id: str) -> HttpResponse:
    """Enable (``enabled=true`` posted) or disable an endpoint."""
    pk = _own_endpoint(access, endpoint_id)
    enabled = request.POST.get("enabled") == "true"
    try:
        endpoint = webhook_endpoint_update(endpoint_id=pk, enabled=enabled)
    except WebhookNotFound:  # deleted meanwhile
        raise Http404("no such webhook endpoint") from None
    messages.success(request, f"{endpoint.url} is {'enabled' if enabled else 'disabled'}.")
    return see_other(reverse("seller-webhooks", args=[access.organizer.slug]))


@seller_page(actions={"POST": Action.MANAGE_WEBHOOKS})
def endpoint_delete(request: HttpRequest, access: SellerAccess, endpoint_id: str) -> HttpResponse:
    pk = _own_endpoint(access, endpoint_id)
    try:
        webhook_endpoint_delete(endpoint_id=pk)
    except WebhookNotFound:  # deleted meanwhile: what was asked holds
        pass
    messages.success(request, "The endpoint is deleted, with its delivery log.")
    return see_other(reverse("seller-webhooks", args=[access.organizer.slug]))
