"""One webhook POST and what its outcome proves: delivered, refused, certainly not received (retry), or unknown."""

from __future__ import annotations

import functools
import http.client
import logging
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

log = logging.getLogger(__name__)

DELIVERED = "delivered"  # a 2xx answer
REFUSED = "refused"  # a 4xx answer other than RETRY_STATUSES: the server will not take it, ever
RETRY = "retry"  # certainly not handled: no connection was made, or the server said so (RETRY_STATUSES)
UNKNOWN = "unknown"  # the request may have reached the receiver and been handled: never sent again

# Answers that say the request was not handled: 408 (the server timed out *receiving* it), 429 (rate limited,
# not processed) and 503 (unavailable, not processed). Any other 5xx (500, 502, 504 ...) may come after the
# receiver acted on the request (an application error after posting, a gateway that timed out waiting for an
# upstream that went on): its outcome is unknown, and at most once forbids sending it again.
RETRY_STATUSES = (408, 429, 503)
_KEY_NAMESPACE = uuid.UUID("5f4c1a56-8d0e-4c7e-9a43-6a0b1f3c2d11")  # flightrec's alert keys


# Slack's mrkdwn gives meaning to three characters only: & < > (`<!channel>`, `<@U123>`, `<https://x|label>`); escaped
# as Slack asks, untrusted text shows as written and can neither page a channel nor disguise a link. A message's
# text is one line: line breaks, other control characters and Unicode's line separators become visible escapes.
_ONE_LINE = {c: repr(chr(c))[1:-1] for c in [*range(0x20), 0x7F, 0x85]} | {0x2028: "\\u2028", 0x2029: "\\u2029"}


def slack_text(value: Any) -> str:
    """Untrusted text (an instance id, a stage name, a log line) as Slack's mrkdwn shows it literally, on one line.
    Pure."""
    text = "" if value is None else str(value)
    return text.translate(_ONE_LINE).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def idempotency_key(alert_id: str) -> str:
    """The stable key of an alert (a UUIDv5 of its id): the same alert always carries the same key, so a receiver
    can drop a repeat; header-safe whatever characters an instance id holds. Pure."""
    return str(uuid.uuid5(_KEY_NAMESPACE, alert_id))


@dataclass(frozen=True)
class PostResult:
    """What one POST proved about delivery, with the reason in words and a server's Retry-After (seconds)."""

    outcome: str
    why: str = ""
    retry_after: float | None = None


def judge_status(code: int) -> str:
    """The outcome an HTTP status proves (DELIVERED, RETRY, REFUSED or UNKNOWN). Pure."""
    if 200 <= code < 300:
        return DELIVERED
    if code in RETRY_STATUSES:
        return RETRY
    if 400 <= code < 500:
        return REFUSED
    return UNKNOWN  # 5xx and anything stranger: it may have been handled


def _retry_after(headers: Any) -> float | None:
    value = (headers.get("Retry-After") if headers is not None else None) or ""
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class _Progress:
    """Whether the connection to the receiver (or the proxy's tunnel to it, TLS included) was made: from then on
    the request may reach it, so a failure no longer proves it was not received."""

    def __init__(self) -> None:
        self.connected = False


class _HTTP(http.client.HTTPConnection):
    def __init__(self, progress: _Progress, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._progress = progress

    def connect(self) -> None:
        super().connect()
        self._progress.connected = True


class _HTTPS(http.client.HTTPSConnection):
    def __init__(self, progress: _Progress, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._progress = progress

    def connect(self) -> None:
        super().connect()  # TCP, the proxy's tunnel if any, then the TLS handshake
        self._progress.connected = True


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, progress: _Progress) -> None:
        super().__init__()
        self._progress = progress

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTP, self._progress), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, progress: _Progress) -> None:
        super().__init__()
        self._progress = progress

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTPS, self._progress), req, context=self._context)  # type: ignore[attr-defined]  # HTTPSHandler keeps its context there


def post(url: str, body: bytes, key: str, timeout: float) -> PostResult:
    """POST ``body`` (JSON) to ``url`` once, with ``Idempotency-Key: key``, and judge what happened.

    A failure before the connection was made (refused, no such host, TLS handshake, connect timeout) proves the
    receiver never saw the request: RETRY. Any failure after it (no answer within ``timeout``, a reset, a close
    without an answer) leaves the outcome UNKNOWN. Proxies from the environment are honoured (urllib's).
    """
    progress = _Progress()
    opener = urllib.request.build_opener(_HTTPHandler(progress), _HTTPSHandler(progress))
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", "Idempotency-Key": key}
    )
    try:
        with opener.open(req, timeout=timeout) as resp:
            resp.read()
            return PostResult(judge_status(resp.status), f"HTTP {resp.status}")
    except urllib.error.HTTPError as exc:
        return PostResult(judge_status(exc.code), f"HTTP {exc.code}", _retry_after(exc.headers))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        why = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
        if not progress.connected:
            return PostResult(RETRY, f"not sent ({why})")
        return PostResult(UNKNOWN, f"sent, no answer ({why}; timeout {timeout:g}s)")
