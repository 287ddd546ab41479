"""Workers' logs read incrementally: each read takes what was written since the last, a line
only once it is whole, and a log rewritten shorter from its start."""

from pathlib import Path
from types import SimpleNamespace

from handoff.machine.worker_logs import Receipts, received


def log_line(request_id: str) -> str:
    return (
        "\x1b[2m2026-12-03T11:37:12.722454Z\x1b[0m \x1b[32m INFO\x1b[0m handle_payload: "
        "push_handler: request received \x1b[3mrequest_id\x1b[0m\x1b[2m=\x1b[0m"
        f"{request_id} component=backend\n"
    )


def test_a_request_is_where_a_workers_log_says_it_was_received(tmp_path: Path):
    logs = {"a": "".join(map(log_line, ["id-1", "another-case"])), "b": log_line("id-2")}
    workers = []
    for name, text in logs.items():
        (tmp_path / f"{name}.log").write_text(text)
        process = SimpleNamespace(log_path=tmp_path / f"{name}.log")
        workers.append(SimpleNamespace(name=name, process=process))
    assert received(workers, {"id-1", "id-2", "id-3"}) == {"id-1": ["a"], "id-2": ["b"]}


def test_each_read_takes_only_whole_lines_written_since_the_last(tmp_path: Path):
    log = tmp_path / "worker.log"
    line = log_line("id-1")
    log.write_text(line[:30])
    reader = Receipts(log)
    assert reader.read() == []
    with log.open("a") as f:
        f.write(line[30:] + log_line("id-2")[:-1])
    assert [i for _, i in reader.read()] == ["id-1"]
    with log.open("a") as f:
        f.write("\n")
    assert [i for _, i in reader.read()] == ["id-1", "id-2"]
    assert reader.tail.offset == log.stat().st_size


def test_a_log_rewritten_shorter_is_read_again_and_a_missing_one_is_empty(tmp_path: Path):
    log = tmp_path / "worker.log"
    reader = Receipts(log)
    assert reader.read() == []
    log.write_text(log_line("id-1") + log_line("id-2"))
    assert len(reader.read()) == 2
    log.write_text(log_line("id-3"))
    assert [i for _, i in reader.read()] == ["id-3"]
