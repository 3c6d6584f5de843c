"""Accounts (docs/api.md, "Accounts"): the sign-up API, the sign-up page,
the login and logout pages and the password reset pages. Django's URL
names, which its views reverse."""

from django.urls import path

from . import apis, views

urlpatterns = [
    path("api/auth/signup/", apis.SignupApi.as_view(), name="auth-signup"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", views.login_page, name="login"),
    # POST only (Django's LogoutView), with the CSRF token of the page's form.
    path("accounts/logout/", views.logout_page, name="logout"),
    path("accounts/password-reset/", views.password_reset, name="password_reset"),
    path("accounts/password-reset/sent/", views.password_reset_done, name="password_reset_done"),
    path(
        "accounts/password-reset/done/",
        views.password_reset_complete,
        name="password_reset_complete",
    ),
    # From the mail's link; Django's view then moves the token into the
    # session and redirects to <uidb64>/set-password/ (the token leaves the URL).
    path(
        "accounts/password-reset/<uidb64>/<token>/",
        views.password_reset_confirm,
        name="password_reset_confirm",
    ),
]
