"""A webhook receiver for the tests: a real HTTP server on 127.0.0.1 in a
thread of the test process, recording every request it gets (the webhook
tests, the webhook part of the make run story)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def verify(self, secret: str) -> dict:
        return Webhook(secret).verify(self.body, self.headers)

    @property
    def json(self) -> dict:
        return json.loads(self.body)


class Receiver:
    """An HTTP server on 127.0.0.1, in a thread: it records every request and
    answers from ``script`` in turn (a status code, ``("redirect", path)``, or
    ``("hang", seconds)``: no answer at all), then 200. ``connections`` counts
    every TCP connection accepted, whatever came over it."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.script: list = []
        self.connections = 0
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.requests.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                action = receiver.script.pop(0) if receiver.script else 200
                if isinstance(action, tuple) and action[0] == "hang":
                    receiver.release.wait(action[1])
                    self.close_connection = True
                    return  # the client gave up long ago: nothing to answer
                if isinstance(action, tuple) and action[0] == "redirect":
                    self.send_response(302)
                    self.send_header("Location", action[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                answer = b'{"ok": true}' if action < 300 else b"receiver says no " * 100
                self.send_response(action)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

            def verify_request(self, request, client_address):
                receiver.connections += 1
                return True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
