"""A real HTTP server on 127.0.0.1 that answers every request with given bytes: recorded
responses of Dynamo's frontend (data/frontend_responses.json), or altered ones, sent as the
frontend sends them (chunked, one SSE event a chunk unless told otherwise)."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from handoff.client import Request, Response, send

RECORDED = json.loads((Path(__file__).parent / "data" / "frontend_responses.json").read_text())
SSE = "text/event-stream"


def recorded(name: str) -> dict:
    return RECORDED["responses"][name]


def events(body: str) -> list[str]:
    """The SSE events of `body`, each with its closing blank line."""
    return [event + "\n\n" for event in body.split("\n\n") if event]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, content_type, pieces = self.server.reply
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in pieces:
            data = piece.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving(status: int, content_type: str, pieces: list[str]):
    """The base URL of a server that answers with `pieces`, one HTTP chunk each."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.reply = (status, content_type, pieces)
    # A short poll interval: shutdown() waits for the serving loop to look again.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def fetch(status: int, content_type: str, pieces: list[str], stream: bool) -> Response:
    """What handoff's client records of that answer to a chat request."""
    response = Response()
    with serving(status, content_type, pieces) as base_url:
        send(base_url, Request("chat", stream, "handoff-mocker", "p", 8), response, 10.0)
    return response


def replay(name: str, body: str | None = None) -> Response:
    """A recorded response as the client reads it, its body replaced by `body` if given."""
    answer = recorded(name)
    body = answer["body"] if body is None else body
    stream = answer["request"]["stream"]
    pieces = events(body) if answer["content_type"] == SSE else [body]
    return fetch(answer["status"], answer["content_type"], pieces, stream)
