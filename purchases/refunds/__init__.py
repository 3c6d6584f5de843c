"""Money back: refunds as rows with a life of their own, the buyer's
cancellation, the organizer's refunds and an event's cancellation run
(docs/refunds.md).

- ``errors``: why a refund is refused (each maps to one API answer);
- ``opening``: a refund row opened under its saga's lock (amount, seats,
  release), with its obligations, inside the caller's transaction;
- ``requests``: the services a buyer, an organizer and an operator call;
- ``step``: asking the processor, once, and looking it up after;
- ``cancellation``: an event's cancellation, paced and resumable;
- ``selectors``: what a purchase's answer and a cancellation's progress read.
"""
