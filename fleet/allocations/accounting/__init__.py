"""What the fleet's replicas used: chargeback intervals and reports (:mod:`.usage`) and each
replica's utilisation and memory series, rolled up from the telemetry store (:mod:`.telemetry`).

Read-only over the rest of the app: nothing else in ``fleet.allocations`` imports it, except
``apps.py``, which connects the usage signals.
"""
