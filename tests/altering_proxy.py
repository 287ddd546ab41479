"""A loopback proxy between handoff's client and Dynamo's frontend that alters the real stream
at the migration, the way a frontend that replays or drops a token there would: Dynamo has no
switch that makes its frontend do it.

Every server-sent event is forwarded a fixed `DELAY_S` after it came, so the gaps the client
sees are the frontend's own; that delay is what lets the proxy know, when it forwards a frame,
whether a pause follows it. The frame before the migration is the last one followed by a
pause once the worker that takes the request over has logged receiving it (`taken_over`).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from handoff.client import Chunk

#: Longer than a decode step, shorter than the new worker's prefill.
DELAY_S = 0.012
#: How often a held frame looks again for the next frame or the takeover.
HOLD_POLL_S = 0.001
#: The ways to alter the stream: replay the last frame before the migration (and drop the final
#: content frame, so the count stays at max_tokens), or lose that frame and repeat the third
#: frame after the migration; None forwards the stream as it came.
MODES = ("replay", "lost_and_repeated", None)


class AlteringProxy:
    """Forwards POSTs to `upstream` on a port of its own; `url` is where clients send them."""

    def __init__(self, upstream: str, mode: str | None, taken_over: Callable[[], bool]) -> None:
        assert mode in MODES
        self.upstream, self.mode, self.taken_over = upstream, mode, taken_over
        #: What was done to the stream, for the test to assert on: ("replayed", n) ...
        self.altered: list[tuple[str, int]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked, as the frontend sends it: frame by frame

            def do_POST(self) -> None:
                proxy.relay(self)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def relay(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers["Content-Length"]))
        with requests.post(
            self.upstream + handler.path,
            data=body,
            headers={"Content-Type": "application/json"},
            stream=True,
            timeout=(5, 60),
        ) as upstream:
            handler.send_response(upstream.status_code)
            handler.send_header("Content-Type", upstream.headers.get("Content-Type", ""))
            handler.send_header("Transfer-Encoding", "chunked")
            handler.send_header("Connection", "close")
            handler.end_headers()
            arrivals: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
            reader = threading.Thread(target=read_events, args=(upstream, arrivals))
            reader.start()
            self.forward(arrivals, handler)
            reader.join()
            handler.wfile.write(b"0\r\n\r\n")

    def forward(self, arrivals: queue.Queue, handler: BaseHTTPRequestHandler) -> None:
        """Send each event `DELAY_S` after it came, altered where `mode` says."""
        pending: list[tuple[float, bytes]] = []
        ended = False
        after_migration: int | None = None  # content frames sent since the migration
        while pending or not ended:
            due = pending[0][0] + DELAY_S if pending else None
            if not ended and (due is None or time.monotonic() < due):
                timeout = None if due is None else max(0.0, due - time.monotonic())
                try:
                    item = arrivals.get(timeout=timeout)
                except queue.Empty:
                    continue
                if item is None:
                    ended = True
                else:
                    pending.append(item)
                continue
            _, event = pending.pop(0)
            sends = [event]
            if is_content(event):
                quiet = not pending and not ended  # nothing came within DELAY_S
                if after_migration is None and self.mode and quiet:
                    ended = self.hold(pending, arrivals)
                    last_before_migration = not pending and not ended
                else:
                    last_before_migration = False
                if last_before_migration:
                    after_migration = 0
                    if self.mode == "replay":
                        sends = [event, event]
                        self.altered.append(("replayed", 1))
                    elif self.mode == "lost_and_repeated":
                        sends = []
                        self.altered.append(("lost", 1))
                elif after_migration is not None:
                    after_migration += 1
                    if self.mode == "lost_and_repeated" and after_migration == 3:
                        sends = [event, event]
                        self.altered.append(("repeated", 3))
                    later = [e for _, e in pending]
                    final = any(map(is_finish, later)) and not any(map(is_content, later))
                    if self.mode == "replay" and final:
                        sends = []
                        self.altered.append(("dropped_final", 1))
            for data in sends:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def hold(self, pending: list, arrivals: queue.Queue) -> bool:
        """Keep the frame about to go while the frontend is quiet, until the next event comes
        (then it was not the last before the migration) or another worker has taken the
        request over. Returns whether the stream ended meanwhile."""
        while not self.taken_over():
            try:
                item = arrivals.get(timeout=HOLD_POLL_S)
            except queue.Empty:
                continue
            if item is None:
                return True
            pending.append(item)
            return False
        return False


def read_events(upstream: requests.Response, arrivals: queue.Queue) -> None:
    """Put each whole SSE event of `upstream` on `arrivals` with when it came; None at the end."""
    buffer = b""
    for piece in upstream.iter_content(chunk_size=None):
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            arrivals.put((time.monotonic(), event + b"\n\n"))
    if buffer:
        arrivals.put((time.monotonic(), buffer))
    arrivals.put(None)


def frame(event: bytes) -> Chunk | None:
    """The JSON frame an SSE event carries; None for `[DONE]` or anything else."""
    payload = event.decode(errors="replace").strip().removeprefix("data:").strip()
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    return Chunk(0.0, data) if isinstance(data, dict) else None


def is_content(event: bytes) -> bool:
    """A frame that carries a token."""
    return bool((chunk := frame(event)) and chunk.text)


def is_finish(event: bytes) -> bool:
    return bool((chunk := frame(event)) and chunk.choice.get("finish_reason"))
