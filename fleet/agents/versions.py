"""Mixed versions: which agents this server serves, and what it says to the others.

A fleet is upgraded in waves: the server first, then the hosts. The server serves agents of its
own protocol and the one before (:func:`hostagent.protocol.protocol_support`); an older agent, or
one newer than the server, is refused at its hello with a sentence saying what to upgrade. The
refusal is recorded on the host (its version and protocol, shown on the host page) and raised
as an alert the first time that version is refused, never once per reconnect.
"""

from __future__ import annotations

import logging

from fleet.core.alerts import AGENT_UNSUPPORTED, alert_emit
from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.inventory.models import Host
from hostagent import protocol

logger = logging.getLogger(__name__)


class UnsupportedAgent(ServiceError):
    status_code = 426  # Upgrade Required


def protocol_sentence(*, agent_version: str, agent_protocol: int) -> str | None:
    """What to upgrade, in words; ``None`` when this server serves that protocol."""
    support = protocol.protocol_support(agent_protocol)
    if support == "supported":
        return None
    served = f"protocols {protocol.OLDEST_PROTOCOL} and {protocol.PROTOCOL_VERSION}"
    name = f"Agent {agent_version or '(unknown version)'} speaks protocol {agent_protocol}"
    if support == "too_new":
        return f"{name}, newer than this server ({served}): upgrade the server first."
    return f"{name}; this server serves {served}: upgrade the agent on this host."


def agent_problem(host: Host) -> str:
    """The host page's sentence about its agent's version; empty when it is served, or when no
    agent has said hello yet."""
    if not host.agent_version:
        return ""
    sentence = protocol_sentence(
        agent_version=host.agent_version, agent_protocol=host.agent_protocol
    )
    return sentence or ""


def agent_protocol_check(*, host: Host, hello: protocol.Hello) -> None:
    """Refuse (:class:`UnsupportedAgent`) a hello this server cannot serve; record it first."""
    agent_protocol = int(hello["protocol"])
    version = hello["agent_version"][:64]
    sentence = protocol_sentence(agent_version=version, agent_protocol=agent_protocol)
    if sentence is None:
        return
    changed = (
        Host.objects.filter(pk=host.pk)
        .exclude(agent_protocol=agent_protocol, agent_version=version)
        .update(agent_protocol=agent_protocol, agent_version=version)
    )
    if changed:  # the first refusal of this version on this host, not every reconnect
        logger.warning("host %s: %s", host.name, sentence)
        alert_emit(
            event=AGENT_UNSUPPORTED,
            summary=f"{host.name}: {sentence}",
            subject={
                "host": {"id": host.pk, "name": host.name},
                "agent_version": version,
                "protocol": agent_protocol,
            },
        )
        publish_changed("host", [host.pk])
    raise UnsupportedAgent(
        "agent.protocol_unsupported",
        sentence,
        {
            "protocol": agent_protocol,
            "served": [protocol.OLDEST_PROTOCOL, protocol.PROTOCOL_VERSION],
        },
    )
