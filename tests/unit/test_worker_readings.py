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
from handoff.runner import decode_transfers
from handoff_mocker import MockerBackend

COUNTER = "handoff_test_transfers_total"
#: The client's side of a request still running, as the fault code reads it.
OPEN_REQUEST = SimpleNamespace(finished=False, response=SimpleNamespace(summary=lambda: "open"))


def serve(sock: socket.socket, text: str) -> HTTPServer:
    """Serve `text` as /metrics on the bound `sock`, from a thread, until shut down."""

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(sock.getsockname(), Metrics, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_activate()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


@pytest.fixture
def sockets():
    """Bound loopback sockets, each closed after the test (and its server shut down)."""
    made: list[socket.socket] = []
    servers: list[HTTPServer] = []

    def make(listen: bool = False, text: str | None = None) -> socket.socket:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        made.append(sock)
        if listen:
            sock.listen()
        if text is not None:
            servers.append(serve(sock, text))
        return sock

    make.serve = lambda sock, text: servers.append(serve(sock, text))
    yield make
    for server in servers:
        server.shutdown()
    for sock in made:
        sock.close()


def port(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def inflight_text(value: int) -> str:
    return f'{INFLIGHT}{{dynamo_endpoint="generate"}} {value}\n'


def worker(name: str, sock: socket.socket, role: str = "aggregate") -> Worker:
    return Worker(name, role, process=None, ports={"system": port(sock)})


def test_a_worker_that_accepts_and_never_answers_is_unknown_not_zero(sockets):
    silent, answering = sockets(listen=True), sockets(text=f"{COUNTER} 3\n")
    ports = {"worker-0": port(silent), "worker-1": port(answering)}
    with pytest.raises(metrics.Unanswered) as raised:
        metrics.worker_sums(ports, COUNTER, timeout_s=0.2)
    assert str(raised.value) == (
        f"no answer to {COUNTER} from worker-0 (port {port(silent)}: ReadTimeout); worker-1 said 3"
    )


def test_a_worker_that_refuses_is_unknown_and_an_absent_series_is_zero(sockets):
    refused, empty = sockets(), sockets(text="")
    assert metrics.worker_sums({"worker-1": port(empty)}, COUNTER) == {"worker-1": 0}
    with pytest.raises(
        metrics.Unanswered, match=r"worker-0 \(port \d+: ConnectionError\); worker-1 said 0$"
    ):
        metrics.worker_sums({"worker-0": port(refused), "worker-1": port(empty)}, COUNTER)


def test_a_worker_is_asked_again_until_it_answers(sockets):
    """Its first answer missing, the reading is taken again, not counted as 0."""
    late = sockets()
    asked = []

    def read():
        asked.append(1)
        try:
            return metrics.worker_sums({"worker-0": port(late)}, COUNTER)
        except metrics.Unanswered:
            sockets.serve(late, f"{COUNTER} 2\n")  # the worker comes up after the first ask
            raise

    assert metrics.once_answered(read, Deadline(10), "worker-0") == {"worker-0": 2}
    assert len(asked) == 2


def test_the_holder_search_goes_on_while_a_worker_does_not_answer(sockets):
    """One worker holds the request; another, silent, might hold it too: no holder is named."""
    holding, refused = sockets(text=inflight_text(1)), sockets()
    workers = [worker("worker-0", holding), worker("worker-1", refused)]
    with pytest.raises(Timeout) as raised:
        faults.find_holder(MockerBackend(), workers, OPEN_REQUEST, Deadline(0.2))
    assert str(raised.value) == (
        "timed out waiting for a worker to hold the request; last seen: no answer to "
        f"{INFLIGHT} from worker-1 (port {port(refused)}: ConnectionError); worker-0 said 1"
    )


def test_the_in_flight_proof_asks_the_holder_until_it_answers(sockets):
    """A holder that does not answer is not "no longer in flight": it is unknown."""
    refused = sockets()
    holder = worker("worker-0", refused)
    with pytest.raises(Timeout) as raised:
        faults.prove_in_flight(
            MockerBackend(), holder, OPEN_REQUEST, lambda: 0, "prefill", 1, "tokens", Deadline(0.2)
        )
    assert str(raised.value).startswith(
        "timed out waiting for worker-0 to say whether it still holds the request; last seen: "
        f"no answer to {INFLIGHT} from worker-0"
    )


def test_a_transfer_count_lacking_a_decode_worker_is_no_count(sockets):
    """Summed without a silent worker's history, a count read before the request would let the
    next full reading prove a transfer that never happened."""
    answering, refused = sockets(text=f"{COUNTER} 4\n"), sockets()
    deployment = SimpleNamespace(
        backend=SimpleNamespace(kv_transfer_counter=COUNTER),
        workers=[
            worker("worker-0-prefill", refused, "prefill"),
            worker("worker-1-decode", answering, "decode"),
            worker("worker-2-decode", refused, "decode"),
        ],
    )
    with pytest.raises(
        metrics.Unanswered, match=r"from worker-2-decode .*; worker-1-decode said 4$"
    ):
        decode_transfers(deployment)
    deployment.workers.pop()
    assert decode_transfers(deployment) == 4  # the prefill worker's port is never read
