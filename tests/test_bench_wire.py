"""The bench's lean HTTP client (bench/wire.py) against a real HTTP server:
keep-alive, chunked answers, a server that closes, a connection that
breaks. The bench's figures depend on it reading every answer whole."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import wire


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: list[int] = []

    def setup(self) -> None:
        super().setup()
        type(self).connections.append(id(self.connection))

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = json.dumps(
            {
                "got": json.loads(body),
                "key": self.headers["Idempotency-Key"],
                "auth": self.headers["Authorization"],
                "type": self.headers["Content-Type"],
            }
        ).encode()
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello, ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/close":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"bye!!")
            self.close_connection = True
        elif self.path == "/drop":
            self.close_connection = True  # no answer at all
        else:
            self.send_response(304)
            self.end_headers()

    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture
def server():
    _Handler.connections = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_posts_ride_one_connection_and_each_answer_is_read_whole(server):
    with wire.Client(server, headers={"Authorization": "Token t"}) as client:
        for n in range(3):
            reply = client.post("/p", json={"n": n}, headers={"Idempotency-Key": f"k{n}"})
            assert reply.status_code == 202
            assert reply.json() == {
                "got": {"n": n},
                "key": f"k{n}",
                "auth": "Token t",
                "type": "application/json",
            }
        assert client.get("/nothing").status_code == 304
    assert len(_Handler.connections) == 1


def test_a_chunked_answer_is_joined(server):
    with wire.Client(server) as client:
        reply = client.get("/chunked")
        assert (reply.status_code, reply.text) == (200, "hello, chunked world")
        assert client.get("/nothing").status_code == 304  # the stream is where it should be
    assert len(_Handler.connections) == 1


def test_a_server_that_closes_gets_a_new_connection_next_time(server):
    with wire.Client(server) as client:
        assert client.get("/close").content == b"bye!!"
        assert client.post("/p", json={}, headers={"Idempotency-Key": "k"}).status_code == 202
    assert len(_Handler.connections) == 2


def test_a_connection_dropped_without_an_answer_is_a_transport_error_then_recovers(server):
    with wire.Client(server) as client:
        with pytest.raises(wire.TransportError):
            client.get("/drop")
        assert client.get("/nothing").status_code == 304


def test_only_plain_http_to_a_host():
    with pytest.raises(ValueError):
        wire.Client("https://example.com")


# --- figure 9's receiver (bench/figures/webhooks.py) ---------------------------------


def test_the_webhook_receiver_answers_each_request_on_a_kept_connection():
    import httpx

    from bench.figures.webhooks import Receiver

    receiver = Receiver(hang_s=5)
    try:
        with httpx.Client() as client:
            # Bodies of several sizes, one split across reads: each request whole.
            for body in (b"{}", b"x" * 70000, b'{"type":"purchase.confirmed"}'):
                answer = client.post(receiver.url("ok"), content=body)
                assert answer.status_code == 204
        assert receiver.count("ok") == 3 and receiver.count("hang") == 0
        assert receiver.connections == 1

        started = threading.Event()
        answers: list[int] = []

        def hanging():
            started.set()
            answers.append(httpx.post(receiver.url("hang"), content=b"{}", timeout=10).status_code)

        thread = threading.Thread(target=hanging)
        thread.start()
        assert started.wait(5)
        thread.join(0.5)
        assert answers == [] and thread.is_alive()  # no answer while it hangs
        receiver.release.set()
        thread.join(5)
        assert answers == [204] and receiver.count("hang") == 1
    finally:
        receiver.stop()
