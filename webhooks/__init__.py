"""Outgoing webhooks for the seller's systems (docs/design.md, "The edges")."""
