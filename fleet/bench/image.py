"""The test image every Docker test and benchmark runs, built locally (no registry is
reachable): ``docker import`` of a root filesystem holding Debian's static busybox."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static


def rootfs_tar() -> bytes:
    """A root filesystem holding only a static busybox and every one of its applets, ``/tmp``
    writable by any user (1777), as a tar stream: the image every Docker test and benchmark
    runs (one builder: a second one made the same tag without ``/tmp`` or ``httpd``, and which
    ran first decided what the other tests got)."""
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for directory in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(BUSYBOX), arcname="bin/busybox")
        for applet in applets:
            if applet == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return out.getvalue()


def ensure_image(tag: str) -> None:
    """Build ``tag`` from Debian's static busybox with ``docker import`` unless it exists."""
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return
    if not BUSYBOX.exists():
        raise RuntimeError("no busybox to build the image from: apt-get install busybox-static")
    # The image's id that `docker import` prints must not reach a command's JSON on stdout.
    done = subprocess.run(["docker", "import", "-", tag], input=rootfs_tar(), capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"docker import {tag} failed: {done.stderr.decode(errors='replace')}")
