"""Who may use the webhooks' staff API: staff holding the Django model
permission the admin asks for the same act (docs/api.md, "Webhooks").

The admin is the reference, so that a user it refuses is refused here too:
reading an endpoint takes ``view`` or ``change`` (Django's admin lets
``change`` read), adding ``add``, changing and rotating the secret
``change`` (the admin's "Rotate secret…"), deleting ``delete``; the
delivery log takes the deliveries' ``view`` or ``change`` (their admin is
read-only, but Django's lets ``change`` read it), and a resend
``resend_webhookdelivery``, the admin action's permission, together with one
of those: the action is on the deliveries' list, which the user must reach
(``ALSO_NEEDED``). Each view says which of these its methods take
(``required_permissions``); this class is the one place that checks them.
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission

VIEW_ENDPOINTS = ("webhooks.view_webhookendpoint", "webhooks.change_webhookendpoint")
ADD_ENDPOINTS = ("webhooks.add_webhookendpoint",)
CHANGE_ENDPOINTS = ("webhooks.change_webhookendpoint",)
DELETE_ENDPOINTS = ("webhooks.delete_webhookendpoint",)
VIEW_DELIVERIES = ("webhooks.view_webhookdelivery", "webhooks.change_webhookdelivery")
RESEND_DELIVERIES = ("webhooks.resend_webhookdelivery",)
# A permission that lets a user in only with one of these too: an admin
# action is offered on its model's list, which takes view or change.
ALSO_NEEDED: dict[str, tuple[str, ...]] = {"webhooks.resend_webhookdelivery": VIEW_DELIVERIES}

NOT_STAFF = "webhook endpoints are managed by staff only"


def required_permissions(view, method: str) -> tuple[str, ...] | None:
    """Any one of these lets a staff user make this request; ``None`` for a
    method the view does not serve (DRF answers it ``405``). A method it
    serves without saying what it takes gets ``()``: nobody, superusers
    included, until it says."""
    by_method: dict[str, tuple[str, ...]] = getattr(view, "required_permissions", {})
    if method == "HEAD":
        method = "GET"  # Django serves it with GET's handler
    if method == "OPTIONS":
        # What the route takes, for whoever may use it at all.
        return tuple(dict.fromkeys(p for needed in by_method.values() for p in needed))
    if not hasattr(view, method.lower()):
        return None
    return by_method.get(method, ())


class WebhookPermission(BasePermission):
    """Staff (``is_staff``, as the admin) holding one of the permissions the
    view's method takes. Anonymous requests fail here too: DRF answers them
    ``401``, any other refusal ``403 permission_denied`` with ``message``."""

    message = NOT_STAFF

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_staff):
            return False
        needed = required_permissions(view, request.method)
        if needed is None:
            return True
        # Read from the database at each request (the token cache keeps the
        # user's flags, never its permissions): a permission taken away
        # counts at once.
        if any(_holds(user, permission) for permission in needed):
            return True
        self.message = (
            "this needs the permission " + " or ".join(map(named, needed))
            if needed
            else "this request takes a permission nobody was given"
        )
        return False


def _holds(user, permission: str) -> bool:
    also = ALSO_NEEDED.get(permission)
    return user.has_perm(permission) and (also is None or any(map(user.has_perm, also)))


def named(permission: str, *, markdown: bool = False) -> str:
    """The permission as a refusal or the schema names it, with what it also takes."""
    also = ALSO_NEEDED.get(permission)
    quote = "`" if markdown else ""
    name = f"{quote}{permission}{quote}"
    if also is None:
        return name
    return f"{name} (with {' or '.join(f'{quote}{p}{quote}' for p in also)})"
