"""The materializer's HTTP endpoint: ``/metrics`` (Prometheus text) and ``/health`` (JSON) on one port.

``/health`` answers 200 when the materializer's input is caught up within BEHIND_AFTER_S (consumers/progress.py)
and 503 otherwise, with the same figures `flightrec status` prints: lag, last commit, when the input was last
caught up, disk free, dead letters, the agent versions seen. It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


def serve(
    address: str, port: int, registry: CollectorRegistry, health: Callable[[], tuple[bool, dict[str, Any]]]
) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Start the endpoint in a daemon thread; OSError when the address cannot be bound."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path in ("/metrics", "/"):
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/health":
                ok, figures = health()
                self._send(200 if ok else 503, "application/json", json.dumps(figures, default=str).encode())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: /metrics or /health\n")

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # scrapes are not news
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="flightrec-metrics", daemon=True)
    thread.start()
    return server, thread
