"""The sign-up page's form: the fields of ``POST /api/auth/signup/``, judged
by its serializer, so that the page refuses what the API refuses, in the
same words (docs/api.md, "Accounts")."""

from __future__ import annotations

from typing import Any

from django import forms

from .serializers import SignupSerializer


class PostedField(forms.Field):
    """A value as posted, for the serializer to judge (Django's CharField
    would strip it, and refuse an empty or NUL-bearing one in words of its
    own)."""

    def to_python(self, value):
        return value


class SignupForm(forms.Form):
    username = PostedField(required=False)
    email = PostedField(required=False)
    password = PostedField(required=False)

    # What account_create takes, once the form is valid.
    account: dict[str, Any]

    def clean(self):
        posted = {k: v for k, v in self.cleaned_data.items() if v is not None}
        payload = SignupSerializer(data=posted)
        if payload.is_valid():
            self.account = dict(payload.validated_data)
        else:
            for field, messages in payload.errors.items():
                self.add_error(field, [str(m) for m in messages])
        return self.cleaned_data
