"""Routes of the fake processor, mounted by the project under
``fake-gateway/v1/`` when ``FAKE_GATEWAY_ENABLED`` is on."""

from django.urls import path, re_path

from . import views

app_name = "fake_gateway"

urlpatterns = [
    path("payment_intents/<str:intent_id>", views.retrieve, name="retrieve"),
    path("payment_intents/<str:intent_id>/charge", views.charge, name="charge"),
    path("payment_intents/<str:intent_id>/cancel", views.cancel, name="cancel"),
    path("payment_intents/<str:intent_id>/refund", views.refund, name="refund"),
    path("payment_intents/<str:intent_id>/refunds", views.create_refund, name="create-refund"),
    path("charges", views.list_charges, name="list-charges"),
    path("refunds", views.list_refunds, name="list-refunds"),
    path("refunds/<str:refund_id>", views.retrieve_refund, name="retrieve-refund"),
    # Last: anything else under the prefix answers JSON too.
    re_path(r"^.*$", views.unknown_endpoint),
]
