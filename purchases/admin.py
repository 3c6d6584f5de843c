"""Django discovers each app's admin by this module's name; the purchases
admin is the operators' and lives with them (purchases/ops/admin.py, and
money back's rows in purchases/ops/refund_admin.py)."""

from .ops import admin, refund_admin  # noqa: F401 - registers the ModelAdmins
