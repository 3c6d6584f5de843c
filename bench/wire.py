"""The load generator's HTTP/1.1 client: one keep-alive connection on a raw
socket, requests written in one piece, answers read by Content-Length or
chunks.

The bench's clients run on the same two cores as the stack they load, so
what a client costs is taken from the product's share. pgbench, the
baseline of figure 1, spends microseconds of C per transaction; httpx spent
about 1.5 ms of Python per request (h11, httpcore and httpx's models, in
an in-process comparison against ``http.client`` at 0.6 ms and this client
at 0.3 ms), about a sixth of a reserve's whole machine CPU. Only what the
bench needs: ``GET`` and ``POST`` with a JSON body, no TLS, no redirects, no
proxies (127.0.0.1 only).
"""

from __future__ import annotations

import json as jsonlib
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_READ = 65536


class TransportError(OSError):
    """The connection broke or the answer could not be read; the connection
    is closed and the next request opens a new one."""


@dataclass
class Reply:
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    content: bytes = b""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        return jsonlib.loads(self.content)


class Client:
    """One connection to ``base_url`` (``http://host:port``), opened on the
    first request and again after a failure. Not for several threads at
    once: each bench client thread has its own."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, timeout=60.0):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"bench.wire speaks plain http to a host and port: {base_url!r}")
        self.address = (parts.hostname, parts.port or 80)
        self.host = parts.netloc
        self.headers = dict(headers or {})
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buf = None, b""

    def get(self, path: str, *, headers: dict[str, str] | None = None) -> Reply:
        return self.request("GET", path, headers=headers)

    def post(self, path: str, *, json=None, headers: dict[str, str] | None = None) -> Reply:
        body = jsonlib.dumps(json).encode() if json is not None else b""
        return self.request(
            "POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})}
        )

    def request(
        self, method: str, path: str, *, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        lines += [f"{k}: {v}" for k, v in {**self.headers, **(headers or {})}.items()]
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        wire = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        try:
            if self._sock is None:
                self._sock = socket.create_connection(self.address, timeout=self.timeout)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.sendall(wire)
            reply, keep = self._read(method)
        except (OSError, ValueError) as exc:
            self.close()
            raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if not keep:
            self.close()
        return reply

    def _read(self, method: str) -> tuple[Reply, bool]:
        head = self._until(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, code = status_line.split(" ", 2)[:2]
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(code)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            content = b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            content = self._chunks()
        elif "content-length" in headers:
            content = self._exactly(int(headers["content-length"]))
        else:  # the body ends with the connection
            content = self._buf + self._rest()
            self._buf = b""
            return Reply(status, headers, content), False
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        return Reply(status, headers, content), keep

    def _fill(self) -> None:
        assert self._sock is not None
        data = self._sock.recv(_READ)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        self._buf += data

    def _until(self, mark: bytes) -> bytes:
        while (at := self._buf.find(mark)) < 0:
            self._fill()
        found, self._buf = self._buf[:at], self._buf[at + len(mark) :]
        return found

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        found, self._buf = self._buf[:n], self._buf[n:]
        return found

    def _chunks(self) -> bytes:
        out: list[bytes] = []
        while True:
            size = int(self._until(b"\r\n").split(b";", 1)[0], 16)
            if size == 0:
                while self._until(b"\r\n"):  # trailers, then the empty line
                    pass
                return b"".join(out)
            out.append(self._exactly(size))
            self._until(b"\r\n")

    def _rest(self) -> bytes:
        assert self._sock is not None
        parts = []
        while data := self._sock.recv(_READ):
            parts.append(data)
        return b"".join(parts)
