"""One dispatcher for every agent message, whatever carried it (a socket, a REST report).

Messages reach it checked and projected (:mod:`fleet.agents.guard`); each runs for the host whose
token sent it, in the caller's thread.
"""

from __future__ import annotations

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.last_seen import hosts_seen
from fleet.agents.reports import agent_event, agent_telemetry
from fleet.agents.versions import agent_protocol_check
from fleet.allocations.workloads import workloads_record
from fleet.inventory.models import Host
from fleet.workflows.registry import workflows_wake
from hostagent import protocol


def handle_message(host_id: int, message: protocol.UpMessage) -> bool:
    """Apply one up-message for a host; returns whether the agent must be sent desired state."""
    host = Host.objects.get(pk=host_id)
    if message["type"] == "hello":
        agent_protocol_check(host=host, hello=message)  # an agent this server cannot serve
        return agent_hello(host=host, hello=message)
    if message["type"] == "telemetry":  # sockets batch theirs (fleet.live.ingest)
        agent_telemetry(host=host, telemetry=message)
        return False
    hosts_seen([host_id])  # any message says the agent is there (an offline host is back)
    if message["type"] == "event":
        agent_event(host=host, event=message)
    elif message["type"] == "workloads":
        recorded = workloads_record(
            host_id=host_id, statuses=message["workloads"], full=message["full"]
        )
        if recorded.changed or recorded.released:
            # Moves wait for their new copies, rollouts for theirs; drains, defrags, repacks
            # and host drains for their moves and stopped copies.
            workflows_wake("report", host_id)
    elif message["type"] == "ack":
        agent_ack(host=host, ack=message)
        # Something may have changed while the agent was applying: send it if so.
        desired = Host.objects.filter(pk=host_id).values_list("desired_generation", flat=True)
        return desired.get() > message["generation"]
    return False
