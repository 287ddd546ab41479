"""A worker's /metrics that does not answer is unknown wherever it decides something: never
read as 0, as holding nothing, or left out of a total. Each worker here is a real socket on
loopback: one that serves Prometheus text, one that accepts and never answers, one that refuses."""

import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from handoff import faults, metrics
from handoff.backend import INFLIGHT, Worker
from handoff.polling import Deadline, Timeout
from handoff.responses.transfers import decode_transfers
from handoff_mocker import MockerBackend

COUNTER = "handoff_test_transfers_total"
#: The client's side of a request still running, as the fault code reads it.
OPEN_REQUEST = SimpleNamespace(finished=False, response=SimpleNamespace(summary=lambda: "open"))


class Loopback:
    """Workers as real sockets on loopback, each a port: `refusing()` (bound, not listening),
    `silent()` (accepts into its backlog, never answers) and `serving(text)` (/metrics)."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.servers: list[HTTPServer] = []

    def refusing(self) -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.sockets.append(sock)
        return sock.getsockname()[1]

    def silent(self) -> int:
        port = self.refusing()
        self.sockets[-1].listen()
        return port

    def serving(self, text: str) -> int:
        port = self.refusing()
        self.serve(port, text)
        return port

    def serve(self, port: int, text: str) -> None:
        """Serve `text` as /metrics from now on, on a port of `refusing()`, from a thread."""

        class Metrics(BaseHTTPRequestHandler):
            def do_GET(self):
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        (sock,) = [s for s in self.sockets if s.getsockname()[1] == port]
        server = HTTPServer(sock.getsockname(), Metrics, bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        server.server_activate()
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        self.servers.append(server)

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def loopback():
    workers = Loopback()
    yield workers
    workers.close()


def inflight_text(value: int) -> str:
    return f'{INFLIGHT}{{dynamo_endpoint="generate"}} {value}\n'


def worker(name: str, port: int, role: str = "aggregate") -> Worker:
    return Worker(name, role, process=None, ports={"system": port})


def test_a_worker_that_accepts_and_never_answers_is_unknown_not_zero(loopback):
    silent, answering = loopback.silent(), loopback.serving(f"{COUNTER} 3\n")
    with pytest.raises(metrics.Unanswered) as raised:
        metrics.worker_sums({"worker-0": silent, "worker-1": answering}, COUNTER, timeout_s=0.2)
    assert str(raised.value) == (
        f"no answer to {COUNTER} from worker-0 (port {silent}: ReadTimeout); worker-1 said 3"
    )


def test_a_worker_that_refuses_is_unknown_and_an_absent_series_is_zero(loopback):
    refused, empty = loopback.refusing(), loopback.serving("")
    assert metrics.worker_sums({"worker-1": empty}, COUNTER) == {"worker-1": 0}
    with pytest.raises(metrics.Unanswered) as raised:
        metrics.worker_sums({"worker-0": refused, "worker-1": empty}, COUNTER)
    assert str(raised.value).endswith(
        f"from worker-0 (port {refused}: ConnectionError); worker-1 said 0"
    )


def test_a_worker_is_asked_again_until_it_answers(loopback):
    """Its first answer missing, the reading is taken again, not counted as 0."""
    late = loopback.refusing()
    asked = []

    def read():
        asked.append(1)
        try:
            return metrics.worker_sums({"worker-0": late}, COUNTER)
        except metrics.Unanswered:
            loopback.serve(late, f"{COUNTER} 2\n")  # the worker comes up after the first ask
            raise

    assert metrics.once_answered(read, Deadline(10), "worker-0") == {"worker-0": 2}
    assert len(asked) == 2


def test_the_holder_search_goes_on_while_a_worker_does_not_answer(loopback):
    """One worker holds the request; another, silent, might hold it too: no holder is named."""
    refused = loopback.refusing()
    workers = [worker("worker-0", loopback.serving(inflight_text(1))), worker("worker-1", refused)]
    with pytest.raises(Timeout) as raised:
        faults.find_holder(MockerBackend(), workers, OPEN_REQUEST, Deadline(0.2))
    assert str(raised.value) == (
        "timed out waiting for a worker to hold the request; last seen: no answer to "
        f"{INFLIGHT} from worker-1 (port {refused}: ConnectionError); worker-0 said 1"
    )


def test_the_in_flight_proof_asks_the_holder_until_it_answers(loopback):
    """A holder that does not answer is not "no longer in flight": it is unknown."""
    holder = worker("worker-0", loopback.refusing())
    with pytest.raises(Timeout) as raised:
        faults.prove_in_flight(
            MockerBackend(), holder, OPEN_REQUEST, lambda: 0, "prefill", 1, "tokens", Deadline(0.2)
        )
    assert str(raised.value).startswith(
        "timed out waiting for worker-0 to say whether it still holds the request; last seen: "
        f"no answer to {INFLIGHT} from worker-0"
    )


def test_a_transfer_count_lacking_a_decode_worker_is_no_count(loopback):
    """Summed without a silent worker's history, a count read before the request would let the
    next full reading prove a transfer that never happened."""
    deployment = SimpleNamespace(
        backend=SimpleNamespace(kv_transfer_counter=COUNTER),
        workers=[
            worker("worker-0-prefill", loopback.refusing(), "prefill"),
            worker("worker-1-decode", loopback.serving(f"{COUNTER} 4\n"), "decode"),
            worker("worker-2-decode", loopback.refusing(), "decode"),
        ],
    )
    with pytest.raises(metrics.Unanswered) as raised:
        decode_transfers(deployment)
    assert " from worker-2-decode " in str(raised.value)
    assert str(raised.value).endswith("; worker-1-decode said 4")
    deployment.workers.pop()
    assert decode_transfers(deployment) == 4  # the prefill worker's port is never read
