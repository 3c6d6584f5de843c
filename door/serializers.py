"""The shapes of the door's seller routes (docs/door.md, "The door API"):
what a scanner sends, what it is answered."""

from __future__ import annotations

from rest_framework import serializers

from .models import ScanResult

# A scanned code is taken as it came (a valid one is 119 characters): a
# scanner that read garbage gets ``invalid``, not a 400; longer than this
# is not a scan.
CODE_MAX_CHARS = 2000
GATE_MAX_CHARS = 64
# Scans per upload: an offline gate uploads in batches of at most this many.
UPLOAD_MAX_SCANS = 1000

RESULTS = [
    (ScanResult.OK, "let in now: the ticket is valid and was not in yet"),
    (ScanResult.ALREADY_CHECKED_IN, "in already (`checked_in_at` and `gate` say when and where)"),
    (ScanResult.REVOKED, "refunded, replaced by a new code, or taken back: not valid"),
    (ScanResult.INVALID, "not a ticket of ours: malformed, or its signature fails"),
    (ScanResult.WRONG_EVENT, "a ticket for another event"),
]

_CODE_HELP = "What the ticket's QR code encodes (base64url, 119 characters)"
_GATE_HELP = "Which entrance scanned it (free text, e.g. `north`); empty when not given"


class CheckinRequestSerializer(serializers.Serializer):
    code = serializers.CharField(max_length=CODE_MAX_CHARS, allow_blank=True, help_text=_CODE_HELP)
    gate = serializers.CharField(
        max_length=GATE_MAX_CHARS,
        required=False,
        allow_blank=True,
        default="",
        help_text=_GATE_HELP,
    )


def checkin_request(data) -> tuple[str, str]:
    """A scan's ``(code, gate)`` as :class:`CheckinRequestSerializer`
    validates them, or its ``ValidationError``. A scan is the door's hot
    path, and building the serializer (a deep copy of its fields) and
    running it cost a tenth of a scan's CPU (docs/performance.md, figure
    16): a body whose two values are plain ASCII strings within their
    lengths is taken here, as the serializer takes it (stripped of
    whitespace, its other keys ignored); any other body goes to the
    serializer, which answers it. tests/test_door_checkin.py holds the
    two to the same answers."""
    if isinstance(data, dict):
        code, gate = data.get("code"), data.get("gate", "")
        if type(code) is str and type(gate) is str:
            code, gate = code.strip(), gate.strip()
            if (
                code.isascii()  # no surrogate, which the serializer refuses
                and gate.isascii()
                and "\x00" not in code  # nor a NUL
                and "\x00" not in gate
                and len(code) <= CODE_MAX_CHARS
                and len(gate) <= GATE_MAX_CHARS
            ):
                return code, gate
    payload = CheckinRequestSerializer(data=data)
    payload.is_valid(raise_exception=True)
    return payload.validated_data["code"], payload.validated_data["gate"]


class CheckinAnswerSerializer(serializers.Serializer):
    result = serializers.ChoiceField(RESULTS, read_only=True)
    seat = serializers.CharField(
        required=False,
        read_only=True,
        help_text="The ticket's seat (its ref); not for an invalid code or one of another event",
    )
    checked_in_at = serializers.DateTimeField(
        required=False,
        read_only=True,
        help_text="`ok`: now; `already_checked_in`: when it was let in",
    )
    gate = serializers.CharField(
        required=False, read_only=True, help_text="With `checked_in_at`: the gate that let it in"
    )


class PublicKeySerializer(serializers.Serializer):
    version = serializers.IntegerField(read_only=True)
    key = serializers.CharField(read_only=True, help_text="The Ed25519 public key, base64")


class CheckinListSerializer(serializers.Serializer):
    public_key = serializers.CharField(
        read_only=True,
        help_text="The event's current Ed25519 public key (32 raw bytes, base64 with padding)",
    )
    key_version = serializers.IntegerField(
        read_only=True,
        help_text="Its version: a code's second and third bytes (big-endian) name the key "
        "that signed it",
    )
    public_keys = PublicKeySerializer(
        many=True, read_only=True, help_text="Every key a code may be signed with (not retired)"
    )
    revoked = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Codes that must not let anyone in (under every key above)",
    )
    checked_in = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Codes let in already (under every key above)",
    )
    as_of = serializers.DateTimeField(
        read_only=True, help_text="The list holds what was committed before this time"
    )


class ScanSerializer(CheckinRequestSerializer):
    """A scan an offline gate made: a scan's ``code`` and ``gate``, and when."""

    at = serializers.DateTimeField(help_text="When the gate scanned it (its clock)")


class UploadRequestSerializer(serializers.Serializer):
    scans = serializers.ListField(child=ScanSerializer(), max_length=UPLOAD_MAX_SCANS)


class ScanAnswerSerializer(serializers.Serializer):
    code = serializers.CharField(read_only=True)
    result = serializers.ChoiceField(RESULTS, read_only=True)
    conflict = serializers.BooleanField(
        read_only=True,
        help_text="The gate let in a ticket that was in already (scanned in elsewhere, online "
        "or offline, before this scan was uploaded)",
    )
    at = serializers.DateTimeField(read_only=True)


class UploadAnswerSerializer(serializers.Serializer):
    results = ScanAnswerSerializer(many=True, read_only=True)


class GateProgressSerializer(serializers.Serializer):
    gate = serializers.CharField(read_only=True)
    admitted = serializers.IntegerField(read_only=True)


class CheckinProgressSerializer(serializers.Serializer):
    expected = serializers.IntegerField(
        read_only=True, help_text="Tickets that may come in: live seats of confirmed purchases"
    )
    admitted = serializers.IntegerField(read_only=True, help_text="Tickets let in so far")
    by_gate = GateProgressSerializer(many=True, read_only=True)
