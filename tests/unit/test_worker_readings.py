"""A worker's /metrics that does not answer is unknown wherever it decides something: never
read as 0, as holding nothing, or left out of a total. Each worker here is a real socket on
loopback: one that serves Prometheus text, one that accepts and never answers, one that refuses."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from handoff import faults, metrics
from handoff.backend import INFLIGHT, VLLM_RUNNING, Worker
from handoff.machine.polling import Deadline, Timeout
from handoff.responses import abandon
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


#: A worker's page while its engine runs the request, in the shape the mocker gives it: vLLM's
#: engine gauge, one series per engine, beside the handler's.
RUNNING_PAGE = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    'vllm:num_requests_running{engine="1",model_name="m"} 0\n'
)


def test_the_engine_gauge_is_summed_over_engines_and_absent_is_unknown_not_zero(loopback):
    """An engine gauge the page lacks says nothing about the engine: unknown, where an absent
    counter would be 0."""
    backend = MockerBackend()
    assert backend.engine_running_gauge == VLLM_RUNNING
    running = worker("worker-0", loopback.serving(inflight_text(0) + RUNNING_PAGE))
    assert backend.engine_running([running]) == {"worker-0": 1}
    bare = worker("worker-1", loopback.serving(inflight_text(0)))
    with pytest.raises(metrics.Unanswered) as raised:
        backend.engine_running([running, bare])
    assert str(raised.value) == (
        f"no answer to {VLLM_RUNNING} from worker-1 (port {bare.ports['system']}: exports no "
        f"{VLLM_RUNNING}); worker-0 said 1"
    )
    assert metrics.worker_sums({"worker-1": bare.ports["system"]}, VLLM_RUNNING) == {
        "worker-1": 0
    }  # as a counter, not required: absent is 0


def test_a_backend_without_an_engine_gauge_reads_none(loopback):
    backend = MockerBackend()
    backend.engine_running_gauge = None
    assert backend.engine_running([worker("worker-0", loopback.refusing())]) is None


def test_a_worker_whose_engine_goes_on_running_has_not_stopped_the_request(loopback):
    """Its handler let the request go (in flight 0), its engine still runs it: not stopped,
    and the timeout says which of the two still runs it."""
    deployment = SimpleNamespace(backend=MockerBackend())
    going_on = worker("worker-0", loopback.serving(inflight_text(0) + RUNNING_PAGE))
    with pytest.raises(Timeout) as raised:
        abandon.await_stopped(deployment, going_on, 0.0, Deadline(0.2))
    assert str(raised.value) == (
        "timed out waiting for worker-0 to stop the request; last seen: 0 in flight by its "
        f"handler, 1 running in its engine ({VLLM_RUNNING})"
    )
    refusing = worker("worker-1", loopback.refusing())
    with pytest.raises(Timeout) as raised:  # a worker that does not answer has not stopped
        abandon.await_stopped(deployment, refusing, 0.0, Deadline(0.2))
    assert f"no answer to {INFLIGHT} from worker-1" in str(raised.value)
    idle_page = RUNNING_PAGE.replace("} 1\n", "} 0\n")
    stopped = worker("worker-2", loopback.serving(inflight_text(0) + idle_page))
    assert abandon.await_stopped(deployment, stopped, time.monotonic(), Deadline(0.2)) < 0.2
