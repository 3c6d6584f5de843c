"""The purchase saga, one module per step (docs/design.md, "The saga").

Read it top to bottom: ``states`` (the transition table), ``topics`` (what
the saga writes to the outbox, and who consumes it), ``transition`` (the one
conditional move), ``step`` (the gateway step every step is made of), then
``start``, ``charge``, ``reconcile``, ``expiry``, ``confirm``,
``compensate``, ``operator`` (an operator's verdicts), ``alerts`` and
``driver`` (what drives a saga that stopped moving). ``purchases.services``
is its public face, and lends out none of the machinery.

This package's ``__init__`` imports nothing: the settings read
``topics.ROUTING`` before the apps are loaded.
"""
