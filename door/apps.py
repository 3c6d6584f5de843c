from django.apps import AppConfig


class DoorConfig(AppConfig):
    """The door (docs/door.md): a confirmed purchase's tickets as signed codes,
    each event's signing keys, and the check-in of those codes at the gates,
    online and offline. The tickets are the purchases app's seat links
    (``ReservationSeat``); who may scan is the organizers app's."""

    name = "door"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "door"
