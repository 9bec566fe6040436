"""Shared by the alert tests: a webhook receiver, rule creation and alert listing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers.server import free_port


class Receiver:
    """A webhook target: a tiny http.server in a thread that records every JSON body."""

    def __init__(
        self,
        port: int | None = None,
        status: int = 200,
        status_for: Callable | None = None,
        delay: float = 0.0,
    ) -> None:
        self.port = port or free_port()
        self.status = status
        self.delay = delay  # seconds before answering (the body is recorded at once)
        self.status_for = status_for  # body → the status to answer, instead of ``status``
        self.messages: list[dict] = []
        self.times: list[float] = []
        self.raw: list[tuple[dict, bytes]] = []  # (headers, body) of each message, as sent
        received, times, outer = self.messages, self.times, self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                times.append(time.monotonic())
                outer.raw.append(({k.lower(): v for k, v in self.headers.items()}, body))
                received.append(json.loads(body))
                status = outer.status_for(received[-1]) if outer.status_for else outer.status
                time.sleep(outer.delay)
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("location", "https://elsewhere.example/hook")
                self.end_headers()

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def wait_for(self, n: int, timeout: float = 15.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.messages)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def make_rule(api, **body) -> dict:
    r = api.post("/api/v1/alert-rules", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def alerts_of(api, run_id: str, rule: str, **params) -> list[dict]:
    r = api.get("/api/v1/alerts", params={"run_id": run_id, "rule": rule, **params})
    assert r.status_code == 200, r.text
    return r.json()["alerts"]
