"""Packaging hook: a built Fleet (``pip install .``, a wheel) carries the dashboard's
``templates/`` and ``static/`` as ``fleet/assets/``, so an installed Fleet serves its pages and
collects its static files without the source tree (``fleet.settings.mode.ASSETS_DIR`` finds
them). The metadata is in pyproject.toml; an editable install (``pip install -e .``) reads the
two folders from the checkout and copies nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
ASSETS = ("templates", "static")


class BuildPyWithAssets(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in ASSETS:
            target = Path(self.build_lib) / "fleet" / "assets" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(ROOT / name, target)


setup(cmdclass={"build_py": BuildPyWithAssets})
