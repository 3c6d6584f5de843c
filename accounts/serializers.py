"""The sign-up API's input and answer (docs/api.md, "Accounts"), also the
sign-up page's judge (accounts/forms.py): the page refuses what the API
refuses, in the same words."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.validators import UnicodeUsernameValidator
from rest_framework import serializers

from .services import normalized_email, normalized_username


# Each field checks the name as it is stored (Django's UserCreationForm does
# the same): NFKC can make a username longer (one character can become
# eighteen, spaces included), and lower-casing an email's domain can too.
class UsernameField(serializers.CharField):
    def to_internal_value(self, data) -> str:
        return normalized_username(super().to_internal_value(data))


class AccountEmailField(serializers.EmailField):
    def to_internal_value(self, data) -> str:
        return normalized_email(super().to_internal_value(data))


class SignupSerializer(serializers.Serializer):
    """What a new account needs. `password` must pass Django's password
    validators (checked once the fields are valid)."""

    username = UsernameField(
        max_length=150,  # the column's (Django's User)
        validators=[UnicodeUsernameValidator()],
        help_text="Letters, digits and @/./+/-/_ only; 150 characters at most. Unique, "
        "whatever its case",
    )
    email = AccountEmailField(
        max_length=254,  # the column's
        help_text="Where a password reset is sent. Unique, whatever its case",
    )
    password = serializers.CharField(
        write_only=True,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="Django's password validators judge it (long enough, not too common, not "
        "all digits, not like the username or email)",
    )


class AccountSerializer(serializers.ModelSerializer):
    """The account made (`201`)."""

    class Meta:
        model = get_user_model()
        fields = ["id", "username", "email"]
        read_only_fields = fields
