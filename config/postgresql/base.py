"""Django's PostgreSQL backend, but for one shortcut.

Django groups an aggregate query by the primary key alone when it selects a
whole row (``GROUP BY id``), which PostgreSQL accepts only when ``id`` is
the table's whole primary key. The distributed tables' keys are
``(id, event_id)`` in the database (config/distribution.py, docs/design.md
"Running"), so every ``annotate(Count(...))`` over them would fail. Without
the shortcut Django groups by every selected column: the same answer.
"""

from django.db.backends.postgresql import base, features


class DatabaseFeatures(features.DatabaseFeatures):
    allows_group_by_selected_pks = False


class DatabaseWrapper(base.DatabaseWrapper):
    features_class = DatabaseFeatures
