"""Stripe's events: the signed endpoint, the inbox of events received and
the consumer that acts on them (docs/stripe.md, "Stripe's events")."""
