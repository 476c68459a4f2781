"""The server side of the agent protocol: enrolment and host tokens, discovery (hello, adoption),
telemetry ingest, events, the desired-state document, and its delivery and acknowledgement.

The top Django floor below the interfaces: it calls down into allocations, partitioning,
inventory and core; nothing below imports it. The sockets (:mod:`fleet.live.agent`) and the REST
fallback (:mod:`fleet.api.views_agent`) are thin over :mod:`fleet.agents.messages`.
"""
