"""One dispatcher for every agent message, whatever carried it (a socket, a REST report).

Messages reach it checked and projected (:mod:`fleet.agents.guard`); each runs for the host whose
token sent it, in the caller's thread.
"""

from __future__ import annotations

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.ingest import hosts_seen
from fleet.agents.reports import agent_event, agent_telemetry
from fleet.allocations.defrag import defrags_advance
from fleet.allocations.drain import drains_advance
from fleet.allocations.maintenance import host_drains_advance
from fleet.allocations.moves import moves_advance
from fleet.allocations.repack import repacks_advance
from fleet.allocations.rollouts import rollouts_advance
from fleet.allocations.workloads import workloads_record
from fleet.inventory.models import Host
from hostagent import protocol


def handle_message(host_id: int, message: protocol.UpMessage) -> bool:
    """Apply one up-message for a host; returns whether the agent must be sent desired state."""
    host = Host.objects.get(pk=host_id)
    if message["type"] == "hello":
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
            if "done" in moves_advance(host_id):
                drains_advance()  # a drain waits for its moves (whichever host they left)
            rollouts_advance()  # a rollout waits for its new copies
            defrags_advance()  # and a defrag for its moves
            repacks_advance()  # and a repack
            host_drains_advance()  # a host drain waits for its moves and stopped copies
    elif message["type"] == "ack":
        agent_ack(host=host, ack=message)
        # Something may have changed while the agent was applying: send it if so.
        desired = Host.objects.filter(pk=host_id).values_list("desired_generation", flat=True)
        return desired.get() > message["generation"]
    return False
