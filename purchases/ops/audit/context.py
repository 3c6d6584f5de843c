"""One audit run's state: the gateway, the clock and its threshold, the
report being written, and the gateway's silences."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings

from payments.interface import GatewayCharge, GatewayRefund, GatewayUnavailable, PaymentGateway

from .report import AuditReport, Finding, Unverified, Violation

logger = logging.getLogger(__name__)

# After this many answerless look-ups in a row the gateway is taken for down:
# the remaining intents are reported unverified without waiting out a timeout
# each (a nightly audit must not hang for hours on a dead processor).
GATEWAY_FAILURES_BEFORE_GIVING_UP = 5


class AuditContext:
    def __init__(self, *, gateway: PaymentGateway, now: datetime, cutoff: datetime) -> None:
        self.gateway = gateway
        self.now = now
        # Time-based verdicts: younger than this is still moving.
        self.cutoff = cutoff
        self.report = AuditReport(started_at=now)
        self.report.gateway_url = str(getattr(gateway, "base_url", "") or type(gateway).__name__)
        self.compensation_deadline = timedelta(seconds=settings.COMPENSATION_DEADLINE_SECONDS)
        # intent id -> why the gateway gave no answer about it
        self.unanswered: dict[str, str] = {}
        self.failures_in_a_row = 0

    def flag(self, invariant: str, saga_id, intent_id: str | None, detail: str) -> None:
        self.report.violations.append(
            Violation(invariant, str(saga_id) if saga_id else None, intent_id or None, detail)
        )

    def note(self, name: str, saga_id, detail: str) -> None:
        """A finding: reported, not a violation (report.py, ``FINDINGS``)."""
        self.report.findings.append(Finding(name, str(saga_id) if saga_id else None, detail))

    def age(self, at: datetime) -> str:
        return f"{int((self.now - at).total_seconds())}s"

    def list_charges(self, intent_id: str, *, ref: str = "") -> list[GatewayCharge] | None:
        """The intent's charges, or None (the reason in ``self.unanswered``,
        by ``intent_id``); asked by ``ref`` (``PurchaseSaga.gateway_ref``)
        when given."""
        if self.failures_in_a_row >= GATEWAY_FAILURES_BEFORE_GIVING_UP:
            self.unanswered[intent_id] = (
                f"not asked: the gateway gave no answer {self.failures_in_a_row} times in a row"
            )
            return None
        self.report.intents_checked += 1
        try:
            charges = self.gateway.list_charges(ref or intent_id)
        except GatewayUnavailable as exc:
            self.failures_in_a_row += 1
            self.unanswered[intent_id] = str(exc)
            logger.warning(
                "audit: gateway unavailable", extra={"intent_id": intent_id, "detail": str(exc)}
            )
            return None
        self.failures_in_a_row = 0
        return charges

    def list_refunds(self, intent_id: str, *, ref: str = "") -> list[GatewayRefund] | None:
        """The intent's refunds at the processor (asked once its charges show
        money captured), or None as :meth:`list_charges`."""
        try:
            refunds = self.gateway.list_refunds(ref or intent_id)
        except GatewayUnavailable as exc:
            self.failures_in_a_row += 1
            self.unanswered[intent_id] = str(exc)
            logger.warning(
                "audit: gateway unavailable", extra={"intent_id": intent_id, "detail": str(exc)}
            )
            return None
        return refunds

    def unverified(self, saga_id, intent_id: str, *, override: bool = False) -> None:
        waiting = "; an operator's override awaits the gateway's records" if override else ""
        self.report.unverified.append(
            Unverified(
                str(saga_id) if saga_id else None,
                intent_id,
                f"money of this intent not verified ({self.unanswered[intent_id]}){waiting}",
            )
        )
