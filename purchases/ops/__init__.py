"""What operators use (docs/operations.md): the sweeps that keep a saga from
being silently stuck (resumer, chaser) and their heartbeats, the runbook's
audited actions, the invariant auditor, the saga admin and the state metrics.
Everything here acts on sagas through ``purchases.services`` only."""
