"""The account pages (docs/api.md, "Accounts"): sign-up, logging in and
out, and Django's password reset, with our templates; every page extends
the shop's base template.

Posts to the login, sign-up and reset pages count against the token
endpoint's throttle, per client address (``AUTH_TOKEN_THROTTLE_RATE``), as
``POST /api/auth/token/`` and ``/signup/`` do: a page is no way around the
API's rate (a password guessed at the login page is a guess too)."""

from __future__ import annotations

import functools
import math

from django.conf import settings
from django.contrib.auth import login, password_validation
from django.contrib.auth import views as auth_views
from django.core.exceptions import ValidationError
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods

# The token endpoint's throttle and count (accounts/apis.py says why).
from purchases.throttling import TokenThrottle

from . import services
from .forms import SignupForm

# The password reset pages' context. "next": where the shop's header (its Sign
# up and Log in links, shop/templates/shop/base.html) comes back to: the events,
# not these pages.
RESET_PAGE = {"nav": "account", "next": "/"}


def _throttled_posts(view):
    """``view``, whose POSTs are refused with a 429 page past the rate."""

    @functools.wraps(view)
    def throttled(request, *args, **kwargs):
        if request.method == "POST":
            throttle = TokenThrottle()
            # DRF's throttle reads only the request's META and user: a
            # Django request will do, and there is no DRF view.
            if not throttle.allow_request(request, None):
                return _too_many(request, throttle.wait())
        return view(request, *args, **kwargs)

    return throttled


def _too_many(request, wait: float | None) -> HttpResponse:
    retry_after = math.ceil(wait) if wait is not None else None
    response = render(
        request,
        "accounts/throttled.html",
        {"retry_after": retry_after, "nav": "account"},
        status=429,
    )
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _safe_next(request) -> str:
    """The ``next`` asked for, if it is a URL of this site (else empty), as
    Django's LoginView judges it."""
    asked = request.POST.get("next", request.GET.get("next", ""))
    safe = url_has_allowed_host_and_scheme(
        asked, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return asked if safe else ""


@require_http_methods(["GET", "POST"])
def _signup(request):
    """Sign-up: the account made with ``account_create``, as the API makes
    it, then logged in, then ``next`` (a 303, as after the shop's POSTs), or
    the events. A visitor already logged in goes there at once."""
    next_url = _safe_next(request)
    if request.user.is_authenticated:
        return HttpResponseRedirect(next_url or resolve_url(settings.LOGIN_REDIRECT_URL))
    form = SignupForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        try:
            user = services.account_create(**form.account)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            login(request, user, backend=settings.AUTHENTICATION_BACKENDS[0])
            redirect = HttpResponseRedirect(next_url or resolve_url(settings.LOGIN_REDIRECT_URL))
            redirect.status_code = 303
            return redirect
    context = {
        "form": form,
        "next": next_url,
        "nav": "signup",
        "problem_field": next(iter(form.errors), None),
        "password_rules": password_validation.password_validators_help_texts(),
    }
    return render(request, "accounts/signup.html", context, status=400 if form.errors else 200)


signup = _throttled_posts(_signup)

# Django's password reset, our templates. The mail goes out through
# EMAIL_BACKEND from this process (make run's prints it); it says the same
# whether or not an account has that address.
password_reset = _throttled_posts(
    auth_views.PasswordResetView.as_view(
        template_name="accounts/password_reset_form.html",
        email_template_name="accounts/password_reset_email.txt",
        subject_template_name="accounts/password_reset_subject.txt",
        extra_context=RESET_PAGE,
    )
)
password_reset_done = auth_views.PasswordResetDoneView.as_view(
    template_name="accounts/password_reset_done.html", extra_context=RESET_PAGE
)
password_reset_confirm = auth_views.PasswordResetConfirmView.as_view(
    template_name="accounts/password_reset_confirm.html", extra_context=RESET_PAGE
)
password_reset_complete = auth_views.PasswordResetCompleteView.as_view(
    template_name="accounts/password_reset_complete.html", extra_context=RESET_PAGE
)


# The shop's login page (its template, shop/login.html), its posts counted.
login_page = _throttled_posts(
    auth_views.LoginView.as_view(
        template_name="shop/login.html",
        redirect_authenticated_user=True,
        extra_context={"nav": "login"},
    )
)
logout_page = auth_views.LogoutView.as_view(next_page="login")
