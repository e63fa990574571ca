"""The live dashboard in Debian's headless Chromium while a simulated fleet publishes.

The page is served by a real `kvscope serve` (subprocess) collecting from the real broker
into chDB. Checks: every chart renders (empty first, then with data), the figures change
as more data arrives without reloading, and the page logs no console error.
Set KVSCOPE_UPDATE_SCREENSHOT=1 to refresh docs/images/dashboard-screenshot.png.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from support.chromium_cdp import CHROMIUM, Chromium
from support.serve_kit import ServeProcess, publish_fleet

REPO = Path(__file__).resolve().parents[3]
SCREENSHOT = REPO / "docs" / "images" / "dashboard-screenshot.png"
CHARTS = (
    "chart-hit-rate",
    "chart-churn",
    "chart-usage",
    "chart-transfers",
    "chart-ingest",
    "chart-completeness",
)
STATE = """(() => {
  const banner = document.getElementById("error");
  const tiles = [...document.querySelectorAll(".tile p")];
  const charts = [...document.querySelectorAll(".chart")];
  const drawn = (c) => [...c.querySelectorAll("svg, canvas, table")]
    .some((e) => e.getBoundingClientRect().width > 0);
  return JSON.stringify({
    updates: Number(document.body.dataset.updates || 0),
    error: banner.hidden ? "" : banner.textContent,
    kpis: Object.fromEntries(tiles.map((p) => [p.id, p.textContent])),
    charts: Object.fromEntries(charts.map((c) => [c.id, {
      rendered: c.dataset.rendered === "1",
      points: Number(c.dataset.points || 0),
      drawn: drawn(c),
    }])),
  });
})()"""


def page_state(browser: Chromium) -> dict[str, Any]:
    return json.loads(browser.evaluate(STATE))


def wait_for(browser: Chromium, what: str, check: Any, timeout_s: float = 90) -> dict[str, Any]:
    """Poll the page until `check(state)` holds; fail with the last state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = page_state(browser)
        if check(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"dashboard: {what} did not happen in {timeout_s} s: {state}")
        time.sleep(0.25)


def test_dashboard_updates_while_a_fleet_publishes(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    assert CHROMIUM, "needs Chromium: apt-get install -y chromium (as .ci/run does)"
    with (
        ServeProcess(bootstrap_servers, tmp_path / "chdb", topic_prefix) as serve,
        Chromium() as browser,
    ):
        page = browser.open_url(serve.url + "/", width=1400, height=1300)
        assert page.title == "kvscope live dashboard"
        empty = wait_for(browser, "first update", lambda s: s["updates"] >= 1)
        assert all(empty["charts"][c]["rendered"] for c in CHARTS), empty

        publish_fleet(bootstrap_servers, topic_prefix, requests=30, instances="1p,1d", seed=3)
        first = wait_for(
            browser,
            "data from the first fleet",
            lambda s: (
                s["kpis"]["kpi-hit-rate"] != "–" and s["charts"]["chart-transfers"]["points"] >= 1
            ),
        )
        assert first["charts"]["chart-hit-rate"]["points"] == 3  # two instances and the fleet

        publish_fleet(bootstrap_servers, topic_prefix, requests=40, instances="2p,2d", seed=4)
        grew = ("chart-ingest", "chart-completeness", "chart-transfers")
        second = wait_for(
            browser,
            "figures change with the second fleet",
            lambda s: (
                s["charts"]["chart-hit-rate"]["points"] == 5
                and all(s["charts"][c]["points"] > first["charts"][c]["points"] for c in grew)
            ),
        )
        assert second["kpis"] != first["kpis"]
        for chart in CHARTS:
            assert second["charts"][chart]["rendered"] and second["charts"][chart]["drawn"], chart
            assert second["charts"][chart]["points"] > 0, chart
        assert second["error"] == ""
        shot = browser.screenshot(tmp_path / "dashboard.png")
        errors = browser.console_errors()
    assert errors == []
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("KVSCOPE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)
