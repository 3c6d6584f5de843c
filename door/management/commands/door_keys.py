"""``manage.py door_keys``: an event's ticket signing keys, for operators
(docs/door.md, "Rotating an event's key")."""

from django.core.management.base import BaseCommand, CommandError

from door import services
from door.errors import KeyRefused
from door.models import EventKey
from purchases.models import Event


class Command(BaseCommand):
    help = (
        "An event's ticket signing keys: `list EVENT_ID`; `rotate EVENT_ID` (a new current "
        "key: new codes at once, the old ones still scan); `retire EVENT_ID VERSION` (that "
        "key's codes scan invalid from now on); `reencrypt` (every private key encrypted "
        "again with the first of TICKET_KEY_SECRETS)."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["list", "rotate", "retire", "reencrypt"])
        parser.add_argument("event_id", type=int, nargs="?")
        parser.add_argument("version", type=int, nargs="?")

    def handle(self, *args, action, event_id, version, **options):
        if action == "reencrypt":
            self.stdout.write(f"re-encrypted {services.event_keys_reencrypt()} keys")
            return
        if event_id is None:
            raise CommandError(f"{action} takes an EVENT_ID")
        event = Event.objects.filter(pk=event_id).first()
        if event is None:
            raise CommandError(f"no event {event_id}")
        try:
            if action == "rotate":
                made = services.event_key_rotate(event)
                self.stdout.write(f"event {event_id}: key {made} is current")
            elif action == "retire":
                if version is None:
                    raise CommandError("retire takes EVENT_ID VERSION")
                services.event_key_retire(event, version)
                self.stdout.write(f"event {event_id}: key {version} retired")
        except KeyRefused as exc:
            raise CommandError(str(exc)) from None
        for key in EventKey.objects.filter(event_id=event_id).order_by("version"):
            state = f"retired {key.retired_at:%Y-%m-%d %H:%M}" if key.retired_at else "accepted"
            self.stdout.write(
                f"  key {key.version}: created {key.created_at:%Y-%m-%d %H:%M}, {state}"
            )
