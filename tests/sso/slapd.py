"""Debian's slapd (OpenLDAP) for the tests: a scratch directory, a config file (``slapd -f``),
a free loopback port, no system service. The directory holds a few people and groups."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ldap
import ldap.modlist

SLAPD = "/usr/sbin/slapd"
SUFFIX = "dc=fleet,dc=test"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PASSWORD = "directory-admin"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
# The same groups as posixGroup entries (memberUid: the members' uid; NIS, RFC 2307), for
# FLEET_LDAP_GROUP_TYPE=posixGroup.
POSIX_GROUPS = f"ou=posixgroups,{SUFFIX}"
USERS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}
MEMBERS = {"gpu-admins": ["alice"], "team-search": ["alice", "bob"], "unmapped": ["carol"]}

CONFIG = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
pidfile {dir}/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 10485760
suffix "{suffix}"
rootdn "{root_dn}"
rootpw {root_password}
directory {dir}/data
"""


@dataclass
class Directory:
    uri: str

    def connect(self) -> ldap.ldapobject.LDAPObject:
        connection = ldap.initialize(self.uri)
        connection.simple_bind_s(ROOT_DN, ROOT_PASSWORD)
        return connection

    def user_dn(self, name: str) -> str:
        return f"uid={name},{PEOPLE}"

    def set_members(self, group: str, names: list[str]) -> None:
        members = [self.user_dn(n).encode() for n in names] or [ROOT_DN.encode()]
        self.connect().modify_s(f"cn={group},{GROUPS}", [(ldap.MOD_REPLACE, "member", members)])

    def set_posix_members(self, group: str, names: list[str]) -> None:
        members = [(ldap.MOD_REPLACE, "memberUid", [n.encode() for n in names])]
        self.connect().modify_s(f"cn={group},{POSIX_GROUPS}", members)

    def set_description(self, name: str, text: str) -> None:
        self.connect().modify_s(
            self.user_dn(name), [(ldap.MOD_REPLACE, "description", [text.encode()])]
        )

    def populate(self) -> None:
        connection = self.connect()
        entries: list[tuple[str, dict[str, list[bytes]]]] = [
            (SUFFIX, {"objectClass": [b"dcObject", b"organization"], "o": [b"fleet"]}),
            (PEOPLE, {"objectClass": [b"organizationalUnit"]}),
            (GROUPS, {"objectClass": [b"organizationalUnit"]}),
            (POSIX_GROUPS, {"objectClass": [b"organizationalUnit"]}),
        ]
        for name, password in USERS.items():
            entries.append(
                (
                    self.user_dn(name),
                    {
                        "objectClass": [b"inetOrgPerson"],
                        "cn": [name.encode()],
                        "sn": [name.encode()],
                        "uid": [name.encode()],
                        "mail": [f"{name}@fleet.test".encode()],
                        "userPassword": [password.encode()],
                        "description": [b"active"],
                    },
                )
            )
        for group, names in MEMBERS.items():
            entries.append(
                (
                    f"cn={group},{GROUPS}",
                    {
                        "objectClass": [b"groupOfNames"],
                        "cn": [group.encode()],
                        "member": [self.user_dn(n).encode() for n in names],
                    },
                )
            )
        for gid, (group, names) in enumerate(MEMBERS.items(), start=20000):
            entries.append(
                (
                    f"cn={group},{POSIX_GROUPS}",
                    {
                        "objectClass": [b"posixGroup"],
                        "cn": [group.encode()],
                        "gidNumber": [str(gid).encode()],
                        "memberUid": [n.encode() for n in names],
                    },
                )
            )
        for dn, attrs in entries:
            connection.add_s(dn, ldap.modlist.addModlist(attrs))
        connection.unbind_s()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_slapd(scratch: Path) -> Iterator[Directory]:
    (scratch / "data").mkdir(parents=True)
    config = scratch / "slapd.conf"
    config.write_text(
        CONFIG.format(dir=scratch, suffix=SUFFIX, root_dn=ROOT_DN, root_password=ROOT_PASSWORD)
    )
    uri = f"ldap://127.0.0.1:{free_port()}"
    # -d 0: stay in the foreground (no fork), so the test owns the process.
    process = subprocess.Popen(
        [SLAPD, "-f", str(config), "-h", f"{uri}/", "-d", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        directory = Directory(uri)
        deadline = time.monotonic() + 10
        while True:
            try:
                directory.connect().unbind_s()
                break
            except ldap.SERVER_DOWN:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"slapd did not start: {process.stderr.read()!r}") from None
                time.sleep(0.05)
        directory.populate()
        yield directory
    finally:
        process.terminate()
        process.wait(timeout=10)
