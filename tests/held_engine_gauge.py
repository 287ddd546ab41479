"""A worker whose engine goes on running a request after its handler has let it go, as the
engine's own gauge tells it: once the engine has run a request, its running gauge never falls
again (vLLM's engine, left with nothing to step after an abort, kept reporting the aborted
requests running: vLLM issue 22545). Dynamo's handler gauge is untouched.

The worker's launch runs this file first: `python held_engine_gauge.py ENGINE_PORT SYSTEM_PORT
GAUGE -- ARGV...` starts the real worker (ARGV, which serves its /metrics on SYSTEM_PORT) as
its child, reads that page every POLL_S, and serves it on ENGINE_PORT with each sample of
GAUGE held at the highest value read. It exits with the worker, passing SIGTERM and SIGINT on.
`HeldEngineGauge` (tests/misbehaving.py) is the backend side: its engine gauge is read there.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

#: How often the worker's page is read: well inside the shortest time an engine runs the
#: request before its client leaves.
POLL_S = 0.01


class Held:
    """The worker's page, with GAUGE's samples held at their highest."""

    def __init__(self, system_port: int, gauge: str) -> None:
        self.url, self.gauge = f"http://127.0.0.1:{system_port}/metrics", gauge
        self.highest: dict[str, float] = {}
        self.lock = threading.Lock()

    def page(self) -> str:
        text = requests.get(self.url, timeout=5).text
        lines = []
        for line in text.splitlines():
            if line.startswith(self.gauge) and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                with self.lock:
                    held = max(self.highest.get(series, 0.0), float(value))
                    self.highest[series] = held
                line = f"{series} {held:g}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    def watch(self, worker: subprocess.Popen) -> None:
        while worker.poll() is None:
            with contextlib.suppress(requests.RequestException):  # not up yet
                self.page()
            time.sleep(POLL_S)  # a reading's pace, not a wait on a state


def serve(engine_port: int, held: Held) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                body = held.page().encode()
            except requests.RequestException:
                self.send_error(502)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", engine_port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main(engine_port: int, system_port: int, gauge: str, argv: list[str]) -> int:
    worker = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: worker.send_signal(signum))
    held = Held(system_port, gauge)
    threading.Thread(target=held.watch, args=(worker,), daemon=True).start()
    serve(engine_port, held)
    return worker.wait()


if __name__ == "__main__":
    engine, system, name, separator, *command = sys.argv[1:]
    assert separator == "--", sys.argv
    sys.exit(main(int(engine), int(system), name, command))
