"""The outbox topic of the webhooks app and its consumer (docs/design.md,
"Messaging").

``config/settings.py`` merges ``ROUTING`` into ``OUTBOX_CONSUMERS`` beside the
saga's own table, so this module imports nothing of ours. The consumer's
dotted path is its name in the inbox: moving it would deliver every attempt
still in flight again. Keep it.
"""

DELIVERY = "webhook.delivery"

ROUTING: dict[str, list[str]] = {
    # One row per attempt of one delivery (key "webhook:<delivery id>:<n>").
    DELIVERY: ["webhooks.consumers.deliver"],
}
