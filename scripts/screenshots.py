"""Screenshots of every dashboard page for the docs, taken in headless Chromium.

Usage: PYTHONSAFEPATH=1 .venv/bin/python scripts/screenshots.py DB [OUT_DIR] [--port N]
(for example against the demo's database after `flightrec demo --headless`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from flightrec.broker.local import free_port
from flightrec.db.query import run_query

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
]


def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the dashboard did not come up on {url}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("out", nargs="?", default="docs/screenshots")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    failure = run_query(
        args.db,
        "SELECT failure_id, instance_id FROM failures "
        "ORDER BY failure_class = 'gpu_arch_unsupported' DESC, ts_us LIMIT 1",
    ).to_pylist()[0]
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("flightrec")), "dashboard", "--db", args.db, "--port", str(port)],
        env=dict(os.environ, PYTHONSAFEPATH="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        wait_healthy(url, proc)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, chromium_sandbox=False)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            for name, path in (
                ("fleet", "/"),
                ("instance", f"/instance?instance={failure['instance_id']}"),
                ("failures", f"/failures?failure={failure['failure_id']}"),
                ("throughput", "/throughput"),
                ("cost", "/cost"),
                ("sql", "/sql"),
            ):
                page.goto(url + path)
                page.wait_for_selector("[data-testid='stAppViewContainer']")
                page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")
                page.wait_for_timeout(2500)  # charts draw asynchronously
                height = page.evaluate(
                    "() => (document.querySelector('[data-testid=\"stMain\"]') || document.body).scrollHeight"
                )
                page.set_viewport_size({"width": 1400, "height": min(max(int(height), 900) + 40, 4000)})
                page.wait_for_timeout(500)
                page.screenshot(path=str(out / f"{name}.png"))
                page.set_viewport_size({"width": 1400, "height": 900})
                print(f"{out / name}.png")
            browser.close()
    finally:
        proc.terminate()
        proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
