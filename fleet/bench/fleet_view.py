"""``bench_fleet_view``: how fast the fleet view (``/``) draws in Chromium for a fleet of N GPUs.

What runs, per size: a scratch database (SQLite in a temporary directory, or a scratch database
on the PostgreSQL server ``--database-url`` names; never the developer's own), seeded with
``fleet.bench.seed`` (hosts of 8 simulated GPUs each, known as after the agents' first hello, and
a viewer with a session), one daphne process on a free loopback port (embedded mode, no agents:
each card shows its row's telemetry checkpoint), and Debian's Chromium driven by Playwright,
signed in as the viewer. The page is loaded ``--repeat`` times; each figure is the median.

What it measures (milliseconds from the start of the navigation):

* ``ttfb_ms``: the first byte of the HTML (``responseStart``);
* ``html_bytes``: the size of the HTML document (uncompressed: ``decodedBodySize``);
* ``first_useful_render_ms``: the ``fleet:useful`` mark ``static/web/fleet.js`` sets in the first
  animation frame after it has wired the page: the header, the filters, the fleet summary and
  every host group (drawn, or its summary header) are in the document and about to be painted;
* ``visible_cards_ms``: the ``fleet:cards-visible`` mark, set in the first animation frame once
  every host group on the first screen has its GPU cards drawn;
* ``load_ms``: the load event (``loadEventEnd``), for comparison with earlier figures.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.bench.processes import (
    create_database,
    drop_database,
    free_port,
    terminate,
    wait_until,
)
from fleet.bench.stack import BIN, ROOT, _healthy

GPUS_PER_HOST = 8
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
DAPHNE = [str(BIN / "daphne"), "-v", "0", "-b", "127.0.0.1"]
VIEWPORT = {"width": 1600, "height": 1000}
MARK_TIMEOUT_MS = 120_000

TIMINGS_JS = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const mark = (name) => {
    const found = performance.getEntriesByName(name, "mark")[0];
    return found ? found.startTime : null;
  };
  return {
    ttfb_ms: nav.responseStart - nav.startTime,
    html_bytes: nav.decodedBodySize,
    load_ms: nav.loadEventEnd - nav.startTime,
    first_useful_render_ms: mark("fleet:useful"),
    visible_cards_ms: mark("fleet:cards-visible"),
    cards_drawn: document.querySelectorAll("article.gpu").length,
  };
}"""


@dataclass
class ViewOptions:
    sizes: list[int]
    product: str = "h100-sxm5-80gb"
    repeat: int = 3
    database_url: str = ""
    workdir: Path | None = None
    log: Callable[[str], None] = print
    env: dict[str, str] = field(default_factory=dict)  # more FLEET_* settings for the server


def run_fleet_view_bench(options: ViewOptions) -> dict[str, Any]:
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-view-bench-"))
    runs = []
    for gpus in options.sizes:
        with scratch_server(workdir / f"gpus-{gpus}", gpus, options) as (url, session_key):
            options.log(f"{gpus} GPUs: measuring {options.repeat} loads")
            seeded = _hosts_for(gpus) * min(gpus, GPUS_PER_HOST)
            runs.append({"gpus": seeded, **_measure(url, session_key, options.repeat)})
    return {
        "definition": {
            "first_useful_render_ms": "mark fleet:useful (header, filters, summary and every "
            "host group or its summary in the document, first frame after the script ran)",
            "visible_cards_ms": "mark fleet:cards-visible (the first screen's GPU cards drawn)",
        },
        "gpus_per_host": GPUS_PER_HOST,
        "repeat": options.repeat,
        "runs": runs,
    }


def _scratch_env(data_dir: Path, database_url: str, extra: dict[str, str]) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"FLEET_DATABASE_URL", "FLEET_REDIS_URL", "FLEET_MODE"}
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "fleet.settings.base",
            "FLEET_DATA_DIR": str(data_dir),
            "FLEET_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "FLEET_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
    )
    if database_url:
        env["FLEET_DATABASE_URL"] = database_url
    return env


def _python(env: dict[str, str], *args: str, timeout: float = 1800) -> None:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")


def _hosts_for(gpus: int) -> int:
    return max(1, -(-gpus // GPUS_PER_HOST))


@contextmanager
def scratch_server(workdir: Path, gpus: int, options: ViewOptions) -> Iterator[tuple[str, str]]:
    """A seeded scratch database and a daphne server on it; yields its URL and a viewer's
    session key."""
    workdir.mkdir(parents=True, exist_ok=True)
    with _scratch_database(options.database_url) as database_url:
        env = _scratch_env(workdir / "data", database_url, options.env)
        started = time.monotonic()
        session_key = _seed(env, workdir, gpus, options.product)
        options.log(f"{gpus} GPUs: seeded in {time.monotonic() - started:.0f} s")
        port = free_port()
        with (workdir / "daphne.log").open("ab") as log:
            process = subprocess.Popen(
                [*DAPHNE, "-p", str(port), "fleet.asgi:application"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: _healthy(url), 60, f"the ASGI server at {url}")
            yield url, session_key
        finally:
            terminate(process)


@contextmanager
def _scratch_database(database_url: str) -> Iterator[str]:
    """A new database on the PostgreSQL server of ``database_url`` (dropped afterwards), or
    ``""``: SQLite in the run's data directory."""
    if not database_url:
        yield ""
        return
    server_url = database_url.rsplit("/", 1)[0]
    name = f"fleet_view_bench_{uuid.uuid4().hex[:10]}"
    create_database(server_url, name)
    try:
        yield f"{server_url}/{name}"
    finally:
        drop_database(server_url, name)


def _seed(env: dict[str, str], workdir: Path, gpus: int, product: str) -> str:
    """Migrate and seed the scratch database; returns the viewer's session key."""
    _python(env, "manage.py", "migrate", "-v0")
    out = workdir / "seed.json"
    hosts, per_host = _hosts_for(gpus), min(gpus, GPUS_PER_HOST)
    run = uuid.uuid4().hex[:6]
    _python(
        env,
        "-m",
        "fleet.bench.seed",
        "setup",
        str(hosts),
        str(per_host),
        product,
        run,
        str(out),
        "--api-token",
    )
    return str(seeded(workdir)["session_key"])


def seeded(workdir: Path) -> dict[str, Any]:
    """What :func:`scratch_server` seeded in ``workdir``: the hosts, the viewer's session key and
    their API token (``api_token``)."""
    result: dict[str, Any] = json.loads((workdir / "seed.json").read_text(encoding="utf-8"))
    return result


def _measure(url: str, session_key: str, repeat: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    samples: list[dict[str, Any]] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for attempt in range(repeat + 1):
                sample = _load_once(browser, url, session_key)
                if attempt:  # the first load warms the server (imports, template cache)
                    samples.append(sample)
        finally:
            browser.close()
    keys = ("ttfb_ms", "html_bytes", "first_useful_render_ms", "visible_cards_ms", "load_ms")
    result: dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in samples if s[key] is not None]
        result[key] = round(statistics.median(values), 1) if values else None
    result["html_bytes"] = int(result["html_bytes"] or 0)
    result["cards_drawn"] = samples[-1]["cards_drawn"] if samples else 0
    return result


def _load_once(browser: Any, url: str, session_key: str) -> dict[str, Any]:
    context = browser.new_context(viewport=VIEWPORT)
    try:
        context.add_cookies([{"name": "sessionid", "value": session_key, "url": url}])
        page = context.new_page()
        response = page.goto(url + "/", wait_until="load", timeout=MARK_TIMEOUT_MS)
        if response is None or response.status != 200 or "/login/" in page.url:
            raise RuntimeError(f"the fleet view did not answer as the viewer: {page.url}")
        page.wait_for_function(
            "() => performance.getEntriesByName('fleet:cards-visible', 'mark').length > 0",
            timeout=MARK_TIMEOUT_MS,
        )
        timings: dict[str, Any] = page.evaluate(TIMINGS_JS)
        return timings
    finally:
        context.close()
