"""Sharing between teams, above the allocations app: the queue of waiting replicas (and, later,
the reclaim). The rules are pure (:mod:`fleet.placement.sharing`, :mod:`fleet.placement.fairshare`);
docs/sharing.md tells the model."""
