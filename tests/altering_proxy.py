"""A loopback proxy between handoff's client and Dynamo's frontend that alters the real stream
at the migration, the way a frontend that replays or drops a token there would: Dynamo has no
switch that makes its frontend do it.

It runs as a process of its own, so that its forwarding never waits for the test's interpreter
(the client and the runner read and poll there), and forwards every server-sent event the
moment it comes, so the gaps the client sees are the frontend's own, with one exception: after
the migration, a content frame that came less than `SPREAD_S` after the one before is held
until then. A loaded frontend sometimes sends the new worker's first frames together, and the
verdict rightly cannot tell that burst from a client that fell behind: it calls the boundary
ambiguous, and then the token the test loses there cannot show. It does not guess where the
migration is from timing: the test says. `alter` arms it while the faulted worker still
runs and answers once the next content frame has been altered; `migrating`, sent once that
worker is stopped and the client has read everything there was, says that every frame from
then on is the new worker's.

In mode "unheard_close" it alters nothing, but keeps its client's going from the frontend: once
the client has hung up, the frontend's stream is read on to its end with nobody to send it to,
as a proxy or load balancer that holds its upstream connection open would. The frontend then
never learns that the client left.

`AlteringProxy` is the test's side: it starts the process (`python altering_proxy.py UPSTREAM
MODE`, on 127.0.0.1) and talks to it one JSON line per command on its stdin and stdout.
`through_proxy` sends a case's request through one and makes the case's fault from a still
stream, for a test's fixture or for a plugin of a whole qualification run.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from injections import wrap_injections

from handoff import client
from handoff.client import REQUEST_ID_HEADER, Chunk
from handoff.machine.polling import poll_until
from handoff.responses import single
from handoff_mocker.origins import BASE, ENGINES, PERIOD, origin

#: The ways to alter the stream: replay the armed frame (and drop the frontend's final content
#: frame, so the count stays at max_tokens), or lose it and repeat the third frame after the
#: migration; `burst` loses no token but holds the armed frame back, with any the faulted
#: worker sends after it before it is stopped (in order: a loaded machine lets a few through),
#: and sends them after the migration together with the new worker's first, back to back, as
#: a client that fell behind reads them; "unheard_close" forwards the stream as it came but
#: never closes the frontend's stream when the client hangs up; None forwards the stream as it
#: came.
#: "crossed" gives every token before the migration as another worker's token of the same place,
#: as a frontend that crossed the stream with another request's on a worker that never
#: received this one would.
MODES = ("replay", "lost_and_repeated", "burst", "drawn", "crossed", "unheard_close", None)
#: How long the stopped holder's stream must have been still before the kill: longer than the
#: stalls of a frontend and a client on a loaded machine.
STILL_S = 0.3
#: How long the armed proxy waits for a content frame to alter.
ALTER_TIMEOUT_S = 5.0
#: How long the test waits for the proxy to answer a command, or to exit once told.
ANSWER_TIMEOUT_S = 10.0
#: The least time between content frames after the migration: far above the verdict's "back to
#: back" (continuity.BURST_S), well below the slowed mocker's decode step.
SPREAD_S = 0.02
#: A token of the mocker's own random draws (ids 1000 to 1999), which no replayed output holds.
DRAWN = " t1500"


class AlteringProxy:
    """The proxy's process, forwarding POSTs to `upstream`; `url` is where clients send them.
    `close` stops and reaps it."""

    def __init__(self, upstream: str, mode: str | None) -> None:
        assert mode in MODES
        self.process = subprocess.Popen(
            [sys.executable, __file__, upstream, str(mode)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url: str = self.answer("start")["url"]

    def alter(self) -> list[list]:
        """Alter the next content frame (nothing in mode None); what was done so far."""
        return self.ask("alter")["altered"]

    def migrating(self) -> None:
        """Every frame from now on is the new worker's."""
        self.ask("migrating")

    def status(self) -> dict:
        """`forwarded`: content frames sent to the client; `last_content_at`: when the last
        content frame came from the frontend (monotonic, the same clock as the test's)."""
        return self.ask("status")

    def altered(self) -> list[tuple[str, int]]:
        """What was done to the stream: ("replayed", 1), ("lost", 1), ("repeated", 3)..."""
        return [tuple(a) for a in self.ask("status")["altered"]]

    def ask(self, command: str) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.answer(command)

    def answer(self, command: str) -> dict:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], ANSWER_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(
                f"the altering proxy (pid {self.process.pid}) gave no answer to {command!r} in "
                f"{ANSWER_TIMEOUT_S:.0f} s; exit code {self.process.poll()}"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the altering proxy, asked {command!r}: {answer['error']}")
        return answer

    def close(self) -> None:
        """Stop the process (EOF on its stdin, SIGKILL if it outlives the wait) and reap it."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        try:
            self.process.wait(ANSWER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


class Alterations:
    """The proxy process's state, shared by the request it relays and the test's commands."""

    def __init__(self, mode: str | None) -> None:
        self.mode = mode
        self.lock = threading.Lock()
        self.altered: list[tuple[str, int]] = []
        self.armed = False
        self.done = threading.Event()
        self.after_migration: int | None = None  # content frames since `migrating`
        self.received = 0  # content frames from the frontend
        self.forwarded = 0  # content frames to the client
        self.last_content_at: float | None = None
        self.next_content_at = 0.0  # the earliest the next content frame may go out
        self.held: list[bytes] = []  # `burst`: the faulted worker's frames, held back

    def sends(self, event: bytes, max_tokens: int | None) -> list[tuple[float, bytes]]:
        """What goes to the client for `event` from the frontend, each with when (monotonic)
        it may go out: at once, but for content frames after the migration, `SPREAD_S` apart."""
        now = time.monotonic()
        if not is_content(event):
            return [(now, event)]
        with self.lock:
            self.received += 1
            self.last_content_at = now
            sends = self.altered_content(event, max_tokens)
            self.forwarded += len(sends)
            if self.mode == "burst" and len(sends) >= 2:  # back to back, at once
                return [(now, data) for data in sends]
            timed = []
            for data in sends:
                at = now if self.after_migration is None else max(now, self.next_content_at)
                self.next_content_at = at + SPREAD_S
                timed.append((at, data))
        return timed

    def altered_content(self, event: bytes, max_tokens: int | None) -> list[bytes]:
        if self.mode == "crossed" and self.after_migration is None:
            if self.armed:
                self.armed = False
                self.done.set()
            self.altered.append(("crossed", 1))
            return [with_text(event, crossed(frame(event).text))]
        if self.armed:
            self.armed = False
            self.done.set()
            if self.mode == "burst":
                self.held = [event]
                self.altered.append(("held", 1))
                return []
            if self.mode == "replay":
                self.altered.append(("replayed", 1))
                return [event, event]
            self.altered.append(("lost", 1))
            return []
        if self.held and self.after_migration is None:  # the faulted worker's, after the held
            self.held.append(event)
            self.altered.append(("held", 1))
            return []
        if self.after_migration is not None:
            self.after_migration += 1
            if self.mode == "lost_and_repeated" and self.after_migration == 3:
                self.altered.append(("repeated", 3))
                return [event, event]
            if self.mode == "drawn" and self.after_migration == 2:
                self.altered.append(("drawn", 2))
                return [drawn(event)]
            if self.mode == "burst" and self.after_migration == 1 and self.held:
                sent, self.held = [*self.held, event], []
                self.altered.append(("sent_together", len(sent)))
                return sent
        if self.mode == "replay" and self.altered and self.received == max_tokens:
            self.altered.append(("dropped_final", 1))
            return []
        return [event]

    def command(self, name: str) -> dict:
        if name == "alter":
            if self.mode is not None:
                with self.lock:
                    self.armed = True
                if not self.done.wait(ALTER_TIMEOUT_S):
                    return {"error": f"no content frame came in {ALTER_TIMEOUT_S:.0f} s"}
        elif name == "migrating":
            with self.lock:
                self.after_migration = 0
        elif name != "status":
            return {"error": f"unknown command {name!r}: alter, migrating or status"}
        with self.lock:
            return {
                "altered": self.altered,
                "forwarded": self.forwarded,
                "last_content_at": self.last_content_at,
            }


def serve(upstream: str, mode: str | None) -> None:
    """Relay on a port of 127.0.0.1 until stdin closes, answering a command per line."""
    state = Alterations(mode)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked, as the frontend sends it: frame by frame

        def do_POST(self) -> None:
            # Each frame goes out in its own segment, the moment it is written.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            relay(self, upstream, state)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    say({"url": f"http://127.0.0.1:{server.server_address[1]}"})
    for line in sys.stdin:
        say(state.command(line.strip()))
    server.shutdown()
    server.server_close()


def say(answer: dict) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def relay(handler: BaseHTTPRequestHandler, upstream: str, state: Alterations) -> None:
    """Forward one POST and its streamed answer, each whole SSE event as it comes."""
    body = handler.rfile.read(int(handler.headers["Content-Length"]))
    max_tokens = json.loads(body).get("max_tokens")
    headers = {"Content-Type": "application/json"}
    if request_id := handler.headers.get(REQUEST_ID_HEADER):  # the workers log it
        headers[REQUEST_ID_HEADER] = request_id
    with requests.post(
        upstream + handler.path,
        data=body,
        headers=headers,
        stream=True,
        timeout=(5, 60),
    ) as answer:
        handler.send_response(answer.status_code)
        handler.send_header("Content-Type", answer.headers.get("Content-Type", ""))
        handler.send_header("Transfer-Encoding", "chunked")
        if state.mode != "unheard_close":  # a client that hangs up needs its socket, which
            # http.client hands over to a "close" response, out of InFlight.close's reach
            handler.send_header("Connection", "close")
        handler.end_headers()
        buffer, heard = b"", True
        for piece in answer.iter_content(chunk_size=None):
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for at, data in together(state.sends(event + b"\n\n", max_tokens), state):
                    time.sleep(max(0.0, at - time.monotonic()))  # pacing, not a wait on a state
                    heard = heard and sent(handler, b"%x\r\n%s\r\n" % (len(data), data), state)
        if buffer:
            heard = heard and sent(handler, b"%x\r\n%s\r\n" % (len(buffer), buffer), state)
        if heard:
            sent(handler, b"0\r\n\r\n", state)


def together(sends: list[tuple[float, bytes]], state: Alterations) -> list[tuple[float, bytes]]:
    """In `burst` mode, the frames sent back to back as one write: in the client's socket at
    once, as the queue of a client that fell behind is (written one by one, a busy machine
    spaced them out, and the client read them apart)."""
    if state.mode != "burst" or len(sends) < 2:
        return sends
    return [(sends[0][0], b"".join(data for _, data in sends))]


def sent(handler: BaseHTTPRequestHandler, data: bytes, state: Alterations) -> bool:
    """Write `data` to the client; False once it has hung up. Only in mode "unheard_close" is
    that kept from the frontend, whose stream the caller then reads on; else it ends the relay,
    and with it the frontend's stream."""
    try:
        handler.wfile.write(data)
        handler.wfile.flush()
    except OSError:
        if state.mode != "unheard_close":
            raise
        return False
    return True


def through_proxy(patch: pytest.MonkeyPatch, mode: str | None) -> list[AlteringProxy]:
    """Send each case's request through an AlteringProxy in `mode`, and make the case's fault
    from a still stream: the proxy alters the next frame while the holder still runs, the
    holder is then stopped (SIGSTOP), and the fault goes out once the client has read every
    frame there was and the frontend has sent none for `STILL_S`. The proxies started, for the
    caller to close."""
    proxies: list[AlteringProxy] = []

    def sent_through(base_url, request, read_timeout_s):
        proxies.append(AlteringProxy(base_url, mode))
        return client.InFlight(proxies[-1].url, request, read_timeout_s)

    def from_a_still_stream(inject):
        return lambda run, holder, watched, aimed: still_then(inject, run, holder, watched, aimed)

    def still_then(inject, run, holder, watched, aimed):
        deadline = run.deadline
        proxy = proxies[-1]
        proxy.alter()
        holder.process.freeze(deadline)

        def still() -> tuple[bool | None, str]:
            status = proxy.status()
            read, forwarded = watched.inflight.response.content_chunks, status["forwarded"]
            quiet = time.monotonic() - status["last_content_at"]
            seen = f"the client read {read} of {forwarded} content frames, {quiet:.3f} s quiet"
            return (True if read == forwarded and quiet >= STILL_S else None), seen

        poll_until(still, deadline, "the stopped holder's stream to be still")
        proxy.migrating()
        return inject(run, holder, watched, aimed)

    patch.setattr(single, "InFlight", sent_through)
    wrap_injections(patch, from_a_still_stream)
    return proxies


def frame(event: bytes) -> Chunk | None:
    """The JSON frame an SSE event carries; None for `[DONE]` or anything else."""
    payload = event.decode(errors="replace").strip().removeprefix("data:").strip()
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    return Chunk(0.0, data) if isinstance(data, dict) else None


def drawn(event: bytes) -> bytes:
    """The frame with its token replaced by one the mocker draws at random (`DRAWN`), as a
    worker that was not replaying its output would have sent it: the count is unchanged."""
    return with_text(event, DRAWN)


def crossed(text: str) -> str:
    """The token of the same place in the output of a worker half the mocker's engines away:
    none of a deployment of fewer workers than that."""
    found = origin(int(text.strip().removeprefix("t")))
    assert found is not None, text
    worker = (found.worker + ENGINES // 2) % ENGINES
    return f" t{BASE + worker * PERIOD + found.place}"


def with_text(event: bytes, text: str) -> bytes:
    """The content frame `event` carrying `text` in place of its own."""
    chunk = frame(event)
    assert chunk is not None
    choice = chunk.data["choices"][0]
    where, key = (choice["delta"], "content") if "delta" in choice else (choice, "text")
    where[key] = text
    return b"data: " + json.dumps(chunk.data).encode() + b"\n\n"


def is_content(event: bytes) -> bool:
    """A frame that carries a token."""
    return bool((chunk := frame(event)) and chunk.text)


if __name__ == "__main__":
    serve(sys.argv[1], None if sys.argv[2] == "None" else sys.argv[2])
