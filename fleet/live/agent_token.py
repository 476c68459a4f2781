"""The host token on an agent socket (:class:`HostTokenConsumer`, the base of
:class:`fleet.live.agent.AgentConsumer`): read from the ``Authorization`` header, re-checked,
renewed when close to its expiry, retired once its replacement is in use, and replaced by an
admin's rotation.

Revoking the host token (or enrolling again) closes its sockets at once (``agent.revoke``
through the host's group); each socket also re-checks its token every
:data:`fleet.live.agent.TOKEN_RECHECK_SECONDS` in case that message was lost. Renewal
(:mod:`fleet.agents.host_tokens`): a token close to its expiry (or from before tokens expired,
or the one a renewal replaced) is renewed and the new one sent down as ``host_token``; an
admin's rotation reaches the socket as ``agent.host_token`` and is forwarded the same way. From
then on the socket checks the new token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fleet.agents.enrollment import TokenHolder, host_token_previous_forget
from fleet.agents.host_tokens import host_token_renew, renewal_due
from fleet.core.tokens import hash_token
from fleet.live.admission import CONTROL, admission, in_thread
from fleet.live.base import LoopConsumer
from hostagent import protocol

logger = logging.getLogger(__name__)


def token_of(scope: dict[str, Any]) -> str:
    """The bearer token in the socket's ``Authorization`` header, or ``""``."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() == protocol.AUTH_SCHEME.lower():
                return str(parts[1])
    return ""


class HostTokenConsumer(LoopConsumer):
    """An agent socket's host and token: the host it speaks for, the token it checks, and when
    it last checked it."""

    host_id: int | None = None
    token = ""
    token_hash = ""
    token_checked_at = 0.0
    # The token's expiry (Unix seconds; None: from before tokens expired), whether it is the
    # one a renewal replaced, and whether it is the current one with a replaced one still
    # accepted (see fleet.agents.enrollment.TokenHolder).
    token_expires_at: float | None = None
    token_previous = False
    token_replaced = False
    closing = False
    # A renewal and an admin's rotation reaching this socket at once: one at a time, so that
    # the token the agent is sent last is one the server accepts (see agent_host_token).
    _token_turn: asyncio.Lock

    async def _token_still_valid(self) -> bool:
        assert self.host_id is not None
        holder, self.token_checked_at = await admission().authenticate(self.token, fresh=True)
        valid = holder is not None and (holder.host_id, holder.token_hash) == (
            self.host_id,
            self.token_hash,
        )
        if holder is None or not valid:
            self.closing = True
            await self.close(code=protocol.CLOSE_REVOKED)
            return False
        self._token_facts(holder)  # an admin's rotation may have made it the previous one
        return True

    def _token_facts(self, holder: TokenHolder) -> None:
        self.token_expires_at = holder.expires_at
        self.token_previous = holder.previous
        self.token_replaced = holder.replaced

    async def _retire_replaced_token(self) -> None:
        """The agent came with its new token: the one it replaced is no longer accepted."""
        assert self.host_id is not None
        await in_thread(CONTROL, host_token_previous_forget)(self.host_id, self.token_hash)
        admission().forget_host(self.host_id)  # this process's entry of the replaced one
        self.token_replaced = False

    async def _renew_token_if_due(self) -> None:
        """Send the agent a new token when this one is close to its expiry (no query unless
        it is): :func:`fleet.agents.host_tokens.host_token_renew`."""
        async with self._token_turn:
            due = renewal_due(self.token_expires_at, previous=self.token_previous, now=time.time())
            if self.host_id is None or self.closing or not due:
                return
            renew = in_thread(CONTROL, host_token_renew)
            message = await renew(host_id=self.host_id, token=self.token)
            if message is None or self.host_id is None or self.closing:
                return
            admission().forget_host(self.host_id)
            self._use_token(message)
            logger.info("host %s: agent token renewed", self.host_id)
            await self.send_json(message)

    def _use_token(self, message: protocol.HostToken) -> None:
        """This socket checks the token just sent to the agent from now on: the one the agent
        will hold (the last sent wins, on both ends)."""
        self.token = message["token"]
        self.token_hash = hash_token(self.token)
        self.token_expires_at = message["expires_at"]
        self.token_previous = self.token_replaced = False

    async def agent_host_token(self, event: dict[str, Any]) -> None:
        """An admin rotated the host token (through the group): hand the agent the new one,
        unless a renewal of this socket replaced it meanwhile (the agent has that one)."""
        if self.host_id is None or self.closing:
            return
        message: protocol.HostToken = event["message"]
        async with self._token_turn:
            admission().forget_host(self.host_id)
            holder, _ = await admission().authenticate(message["token"], fresh=True)
            if holder is None or holder.previous or holder.host_id != self.host_id:
                return
            self._use_token(message)
            await self.send_json(message)

    async def agent_revoke(self, event: dict[str, Any]) -> None:
        """The host token was revoked or rotated: close unless this socket's token still holds
        (it connected with the new one)."""
        if self.host_id is not None:
            admission().forget_host(self.host_id)
            await self._token_still_valid()
