"""A team's policy: what its workloads may do on a host, set by fleet admins only.

``Team.policy`` holds the keys an admin gave; every key left out takes its restricted default
(:data:`DEFAULTS`), so ``{}`` is the restricted policy:

* ``runtimes``: the workload runtimes the team may use, of ``container`` and ``process``
  (``none``, which runs nothing, is always allowed); default containers only. A process runs
  on the host itself, so allowing it also needs ``process_user``.
* ``registries``: image prefixes (``registry.example.com/team-a/``, ``docker.io/library/``) or
  repositories (``docker.io/library/python``) a container's image must come from; ``[]``: any.
* ``uids``: ``[[lo, hi], ...]``, the uids a workload's ``user`` may name (numeric
  ``uid[:gid]`` then, since a name cannot be checked against them); ``[]``: any user.
* ``allow_root``: uid 0 (``root``, ``0:0``) may run; default no, as Kubernetes'
  ``runAsNonRoot``.
* ``process_user``: the ``uid[:gid]`` every process workload of the team runs as.
* ``capabilities``: Linux capabilities added back after dropping them all (an allow-list:
  :data:`SAFE_CAPABILITIES`); ``max_pids``: each replica's PID limit; ``host_network``: the
  containers use the host's network; ``max_host_memory_mib`` / ``default_host_memory_mib``:
  the host memory a deployment may ask for, and what it gets when it asks for none.

:func:`policy_violations` checks a workload against a policy (422, a code per rule);
:func:`workload_security` turns the policy, the workload and the deployment's host memory into
the ``security`` block the agent applies (:class:`hostagent.protocol.Security`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, TypedDict, cast

from django.db import transaction

from fleet.core.errors import RuleViolation, ServiceError
from fleet.core.models import OperationKind, OperationStatus, Team
from fleet.core.operations import operation_record
from fleet.core.teams import lock_team
from fleet.domain import Violation
from hostagent import protocol

RUNTIMES = ("container", "process")
SAFE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "NET_BIND_SERVICE",
        "SETGID",
        "SETUID",
        "SYS_CHROOT",
    }
)
"""Docker's default capabilities less ``NET_RAW``, ``MKNOD``, ``SETPCAP`` and ``SETFCAP``
(sniffing, device nodes, capability games): what an admin may add back for a team."""
MAX_UID = 2**32 - 2
MAX_REGISTRIES = 32
MAX_UID_RANGES = 16
MIN_MEMORY_MIB, MAX_MEMORY_MIB = 16, 16 * 1024 * 1024
MIN_PIDS, MAX_PIDS = 16, 1_048_576
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@\[\]-]{0,254}$")
_NUMERIC_USER = re.compile(r"^([0-9]{1,10})(?::([0-9]{1,10}))?$")
_USER = re.compile(
    r"^(?:[a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10})(?::(?:[a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}))?$"
)


class Policy(TypedDict):
    """A team's effective policy: every key, defaults filled in (see the module docstring)."""

    runtimes: list[str]
    registries: list[str]
    uids: list[list[int]]
    allow_root: bool
    process_user: str | None
    capabilities: list[str]
    max_host_memory_mib: int
    default_host_memory_mib: int
    max_pids: int
    host_network: bool


DEFAULTS: Policy = {
    "runtimes": ["container"],
    "registries": [],
    "uids": [[1000, 2_147_483_647]],
    "allow_root": False,
    "process_user": None,
    "capabilities": [],
    "max_host_memory_mib": 65_536,
    "default_host_memory_mib": 16_384,
    "max_pids": 4096,
    "host_network": False,
}
KEYS = tuple(DEFAULTS)


def effective_policy(stored: Any) -> Policy:
    """The policy a team's stored ``policy`` means: its keys over :data:`DEFAULTS`. Keys that
    are not the policy's (a row edited by hand) are ignored."""
    given = stored if isinstance(stored, Mapping) else {}
    policy = {key: given.get(key, default) for key, default in DEFAULTS.items()}
    return cast(Policy, copy.deepcopy(policy))  # the caller may change it; DEFAULTS stay


# --------------------------------------------------------------------------------------------
# Checking a policy an admin gives
# --------------------------------------------------------------------------------------------


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _string_list(value: Any, limit: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= limit
        and all(isinstance(v, str) for v in value)
        and len(set(value)) == len(value)
    )


def _registry_problem(entry: str) -> str | None:
    first, slash, _ = entry.partition("/")
    if not _PREFIX.match(entry) or ".." in entry or "//" in entry:
        return f"{entry!r} is not an image prefix."
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        return (
            f"{entry!r} must start with its registry, e.g. 'docker.io/library/' or "
            "'registry.example.com/team-a/'."
        )
    return None


def _user_parts(user: str) -> tuple[str, str | None]:
    uid, _, gid = user.partition(":")
    return uid, gid or None


def _is_root(part: str | None) -> bool:
    return part is not None and (
        part == "root" or (part.isascii() and part.isdigit() and int(part) == 0)
    )


def _user_problem(user: str, policy: Policy) -> str | None:
    """Why ``user`` may not run under ``policy`` (``None``: it may)."""
    uid, gid = _user_parts(user)
    if _is_root(uid) or _is_root(gid):
        return None if policy["allow_root"] else f"{user!r} runs as root; the policy forbids it."
    if not policy["uids"]:
        return None
    numeric = _NUMERIC_USER.match(user)
    if numeric is None:
        return f"Give a numeric uid[:gid], not {user!r}: the policy allows uids by range."
    if not any(lo <= int(numeric.group(1)) <= hi for lo, hi in policy["uids"]):
        ranges = ", ".join(f"{lo}-{hi}" for lo, hi in policy["uids"])
        return f"uid {numeric.group(1)} is outside the allowed range(s) {ranges}."
    return None


def _checked_values(given: Mapping[str, Any]) -> dict[str, str]:
    """``{field: message}`` for each value of ``given`` that is not valid on its own."""
    errors: dict[str, str] = {}
    runtimes = given.get("runtimes", [])
    if not _string_list(runtimes, 3) or set(runtimes) - {*RUNTIMES, "none"}:
        errors["runtimes"] = "A list of distinct runtimes among 'container' and 'process'."
    registries = given.get("registries", [])
    if not _string_list(registries, MAX_REGISTRIES):
        errors["registries"] = f"A list of distinct image prefixes ({MAX_REGISTRIES} at most)."
    else:
        problem = next(filter(None, map(_registry_problem, registries)), None)
        if problem is not None:
            errors["registries"] = problem
    uids = given.get("uids", [])
    if (
        not isinstance(uids, list)
        or len(uids) > MAX_UID_RANGES
        or not all(
            isinstance(r, list)
            and len(r) == 2
            and _int(r[0], 0, MAX_UID)
            and _int(r[1], r[0], MAX_UID)
            for r in uids
        )
    ):
        errors["uids"] = f"A list of [lo, hi] uid ranges, 0 <= lo <= hi <= {MAX_UID}."
    for key in ("allow_root", "host_network"):
        if not isinstance(given.get(key, False), bool):
            errors[key] = "true or false."
    capabilities = given.get("capabilities", [])
    if not _string_list(capabilities, len(SAFE_CAPABILITIES)) or (
        set(capabilities) - SAFE_CAPABILITIES
    ):
        errors["capabilities"] = f"Distinct names among {', '.join(sorted(SAFE_CAPABILITIES))}."
    for key in ("max_host_memory_mib", "default_host_memory_mib"):
        if key in given and not _int(given[key], MIN_MEMORY_MIB, MAX_MEMORY_MIB):
            errors[key] = f"A whole number of MiB from {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB}."
    if "max_pids" in given and not _int(given["max_pids"], MIN_PIDS, MAX_PIDS):
        errors["max_pids"] = f"A whole number from {MIN_PIDS} to {MAX_PIDS}."
    user = given.get("process_user")
    if user is not None and (not isinstance(user, str) or not _USER.match(user)):
        errors["process_user"] = "A user as uid[:gid], or null."
    return errors


def _checked_together(policy: Policy) -> dict[str, str]:
    """``{field: message}`` for the rules between keys (each key valid on its own)."""
    errors: dict[str, str] = {}
    if policy["default_host_memory_mib"] > policy["max_host_memory_mib"]:
        errors["default_host_memory_mib"] = "The default cannot exceed 'max_host_memory_mib'."
    user = policy["process_user"]
    if "process" in policy["runtimes"] and user is None:
        errors["process_user"] = (
            "Allowing the 'process' runtime needs the non-root uid[:gid] its processes run as."
        )
    elif user is not None:
        problem = _user_problem(user, policy)
        if problem is not None:
            errors["process_user"] = problem
    return errors


def policy_checked(raw: Any) -> dict[str, Any]:
    """The policy to store for ``raw`` (the keys given, ``none`` dropped from ``runtimes``).

    Raises:
        ServiceError: 400 ``policy.invalid``; ``details.fields`` maps each bad key to why.
    """
    if not isinstance(raw, Mapping):
        raise ServiceError("malformed_request", "The policy must be a JSON object.")
    unknown = [str(key)[:64] for key in raw if key not in DEFAULTS][:8]  # a bounded answer
    errors = dict.fromkeys(unknown, f"Unknown key; the keys are {', '.join(KEYS)}.")
    errors.update(_checked_values(raw))
    if not errors:
        errors.update(_checked_together(effective_policy(raw)))
    if errors:
        field, message = next(iter(errors.items()))
        raise ServiceError(
            "policy.invalid", f"The policy is not valid: {field}: {message}", {"fields": errors}
        )
    stored = {key: raw[key] for key in KEYS if key in raw}
    if "runtimes" in stored:
        stored["runtimes"] = [r for r in stored["runtimes"] if r != "none"]
    return stored


# --------------------------------------------------------------------------------------------
# Checking a workload, and what the agent is told
# --------------------------------------------------------------------------------------------


def normalized_image(image: str) -> str:
    """``image`` with its registry spelled out as Docker reads it: ``python:3.11`` is
    ``docker.io/library/python:3.11``, ``org/app`` is ``docker.io/org/app``."""
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"docker.io/{rest}" if first == "index.docker.io" else image
    return f"docker.io/{image}" if slash else f"docker.io/library/{image}"


def image_allowed(image: str, registries: list[str]) -> bool:
    """Whether ``image`` comes from one of ``registries`` (``[]``: any). An entry ending in
    ``/`` is a prefix; any other is a repository, any tag or digest of it."""
    if not registries:
        return True
    full = normalized_image(image)
    return any(
        full.startswith(entry)
        if entry.endswith("/")
        else full == entry or full.startswith((f"{entry}:", f"{entry}@"))
        for entry in registries
    )


def _team_label(team: Team | None) -> tuple[str, str]:
    if team is None:
        return "This team", "/api/v1/teams/{id}/policy"
    return f"Team {team.name}", f"/api/v1/teams/{team.pk}/policy"


def policy_violations(
    policy: Policy,
    workload: Mapping[str, Any],
    *,
    host_memory_mib: int | None = None,
    team: Team | None = None,
) -> list[Violation]:
    """Every rule of ``policy`` that ``workload`` (checked already) and the deployment's
    ``host_memory_mib`` break, runtime first: ``policy.runtime_denied``, ``policy.image_denied``,
    ``policy.user_denied``, ``policy.host_memory_denied``."""
    label, where = _team_label(team)
    violations: list[Violation] = []
    runtime = str(workload.get("runtime", "none"))
    if runtime != "none" and runtime not in policy["runtimes"]:
        violations.append(
            Violation(
                "policy.runtime_denied",
                f"{label} may not run {runtime!r} workloads: a fleet admin must allow the runtime "
                f"in the team's policy (PUT {where}).",
                {"runtime": runtime, "allowed": list(policy["runtimes"])},
            )
        )
    image = workload.get("image")
    if runtime == "container" and image and not image_allowed(image, policy["registries"]):
        violations.append(
            Violation(
                "policy.image_denied",
                f"{label} may run images from {', '.join(policy['registries'])} only, not "
                f"{image!r}.",
                {"image": image, "registries": list(policy["registries"])},
            )
        )
    user = workload.get("user")
    problem = None
    if runtime == "process" and user is not None and user != policy["process_user"]:
        problem = (
            f"{label}'s processes run as {policy['process_user']!r} (its policy's "
            "process_user): leave 'user' out."
        )
    elif runtime == "container" and user is not None:
        problem = _user_problem(user, policy)
    if problem is not None:
        violations.append(Violation("policy.user_denied", problem, {"user": user}))
    if host_memory_mib is not None and host_memory_mib > policy["max_host_memory_mib"]:
        violations.append(
            Violation(
                "policy.host_memory_denied",
                f"{label}'s replicas may use {policy['max_host_memory_mib']} MiB of host memory "
                f"at most, not {host_memory_mib}.",
                {"requested_mib": host_memory_mib, "max_mib": policy["max_host_memory_mib"]},
            )
        )
    return violations


def policy_enforce(
    *, team: Team, workload: Mapping[str, Any], host_memory_mib: int | None = None
) -> None:
    """Refuse (422, the first broken rule's code) a workload the team's policy forbids."""
    violations = policy_violations(
        effective_policy(team.policy), workload, host_memory_mib=host_memory_mib, team=team
    )
    if violations:
        raise RuleViolation(violations[0].message, violations, team=team.pk)


def workload_security(
    policy: Policy, workload: Mapping[str, Any], host_memory_mib: int | None = None
) -> protocol.Security:
    """The ``security`` block of a replica: a process runs as the policy's ``process_user``, a
    container as its workload's ``user`` (``None``: the image's, which the agent refuses when
    it is root unless ``allow_root``); the host memory asked for (else the policy's default),
    never past the policy's maximum."""
    runtime = workload.get("runtime")
    memory = policy["default_host_memory_mib"] if host_memory_mib is None else host_memory_mib
    return {
        "user": policy["process_user"] if runtime == "process" else workload.get("user"),
        "allow_root": bool(policy["allow_root"]),
        "cap_add": sorted(policy["capabilities"]),
        "pids_limit": int(policy["max_pids"]),
        "memory_mib": min(int(memory), int(policy["max_host_memory_mib"])),
        "host_network": bool(policy["host_network"]),
    }


# --------------------------------------------------------------------------------------------
# The write
# --------------------------------------------------------------------------------------------


@transaction.atomic
def team_policy_set(*, team_id: int, policy: Any, requested_by: Any = None) -> Team:
    """Make ``policy`` the team's policy, whole: keys not given go back to their defaults.
    Deployments already running keep their workloads; every later create, workload change or
    hand-over is checked against the new policy, and replicas started from then on get its
    limits. Audited as a ``set_policy`` operation with the previous and the new policy."""
    stored = policy_checked(policy)
    team = lock_team(team_id)
    previous = effective_policy(team.policy)
    team.policy = stored
    team.save(update_fields=["policy", "updated_at"])
    operation_record(
        kind=OperationKind.SET_POLICY,
        summary=f"Set the policy of team {team.name}",
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        payload={
            "team": team.pk,
            "previous": dict(previous),
            "policy": dict(effective_policy(stored)),
        },
    )
    return team
