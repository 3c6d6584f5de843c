"""What the project's admin pages share."""

from __future__ import annotations

from django import forms

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
