"""What the project's admin pages share."""

from __future__ import annotations

import uuid

from django import forms
from django.db.models import QuerySet

REASON_MAX_LENGTH = 300


class ReasonForm(forms.Form):
    """The reason an operator gives for an audited action (a runbook action,
    a replay); rendered by ``admin/includes/reason_fieldset.html``."""

    reason = forms.CharField(
        max_length=REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Required. Lands in the saga's history and in the admin log.",
    )


class ReadOnlyAdminMixin:
    """Nobody adds, changes or deletes these rows by hand, superusers
    included: money and inventory move only through the services, which lock,
    check state and write history, ledger and outbox in one commit. A hand
    edit would skip all of that. Viewing still needs the view permission; the
    change page renders without a save row, and "delete selected" is not
    offered.

    Put it first in the bases (``class SeatAdmin(ReadOnlyAdminMixin,
    admin.ModelAdmin)``). It fits inlines too (their ``has_add_permission``
    takes ``obj``).
    """

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def exact_search(queryset: QuerySet, search_term: str, *, field: str) -> tuple[QuerySet, bool]:
    """An admin search that finds rows exactly, through their indexes: a
    saga id (``saga_id``), a primary key, or ``field`` (unique, compared as
    typed). What ``get_search_results`` returns: no duplicates possible."""
    term = search_term.strip()
    if not term:
        return queryset, False
    try:
        return queryset.filter(saga_id=uuid.UUID(term)), False
    except ValueError:
        pass
    exact = queryset.filter(**{field: term})
    if term.isdigit():
        return queryset.filter(pk=int(term)) | exact, False
    return exact, False
