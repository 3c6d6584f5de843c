"""The buyer pages (docs/api.md, "Pages for buyers") and their session login."""

from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

urlpatterns = [
    path("", views.event_list, name="shop-events"),
    path("events/<int:event_id>/", views.event_seat_map, name="shop-seat-map"),
    path("purchases/", views.purchase_list, name="shop-purchases"),
    path("purchases/<uuid:saga_id>/", views.purchase_detail, name="shop-purchase"),
    path("purchases/<uuid:saga_id>/live/", views.purchase_live, name="shop-purchase-live"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="shop/login.html",
            redirect_authenticated_user=True,
            extra_context={"nav": "login"},
        ),
        name="login",
    ),
    # POST only (Django's LogoutView), with the CSRF token of the page's form.
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
]
