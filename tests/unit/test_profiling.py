"""The NVML profiler with a substitute NVML: samples every 100 ms, baseline, peak, final and
leak per GPU, the markers to paste, the PNG; and one clear line where there is no GPU."""

import struct
import subprocess
import sys
import zlib
from itertools import pairwise

import pytest
from fake_nvml import FakeNvml

from handoff.cases import backend_cases
from handoff.commands import profiling
from handoff.commands.profiling import GpuProfile, Sample, Sampler, profile, report_lines
from handoff.history import History
from handoff.machine.environment import gpu_count
from handoff.machine.polling import Deadline, poll_until
from handoff.plugins import get_backend
from handoff.runner import CaseResult
from handoff.sharing.nvml import GIB, MIB
from handoff.sharing.plot import timeline_png
from handoff.verdict import Verdict


def sampled_after(nvml, reads):
    """Wait until the sampler has read NVML `reads` more times."""
    target = nvml.reads + reads
    poll_until(lambda: (True, None) if nvml.reads >= target else (None, nvml.reads),
               Deadline(10), f"{reads} samples")  # fmt: skip


def test_the_sampler_reads_every_gpu_every_100_ms_from_start_to_stop():
    nvml = FakeNvml(24, 24)
    sampler = Sampler(nvml).start()
    sampled_after(nvml, 3)
    nvml.use(1, 4242, 8)
    sampled_after(nvml, 3)
    nvml.use(1, 4242, 0)
    samples = sampler.stop()
    assert samples[0].used == {0: int(0.6 * GIB), 1: int(0.6 * GIB)}  # taken by start()
    assert samples[-1].used == samples[0].used  # taken by stop()
    assert any(s.processes[1] == {4242: 8 * GIB} for s in samples)
    gaps = sorted(b.at - a.at for a, b in pairwise(samples[1:-1]))
    assert 0.05 < gaps[len(gaps) // 2] < 0.3  # the median period, on a loaded machine
    assert sampler.error is None


def samples_of(*used_gib, processes=None):
    return [
        Sample(n * 0.1, {0: int(u * GIB)}, {0: (processes or {}).get(n, {})})
        for n, u in enumerate(used_gib)
    ]


def test_baseline_peak_final_and_leak_per_gpu():
    samples = samples_of(
        0.6, 0.6, 3.1, 7.4, 7.4, 2.0, 1.6, processes={3: {11: 5 * GIB, 12: int(1.2 * GIB)}}
    )
    (p,) = profile(samples)
    assert (p.baseline, p.peak, p.final) == (int(0.6 * GIB), int(7.4 * GIB), int(1.6 * GIB))
    assert p.peak_at == 0.3 and p.rise == int(7.4 * GIB) - int(0.6 * GIB)
    assert p.leak == int(1.6 * GIB) - int(0.6 * GIB)
    assert p.processes == {11: 5 * GIB, 12: int(1.2 * GIB)}


def test_a_leak_past_the_threshold_is_flagged():
    base = int(0.6 * GIB)
    leaked = GpuProfile(0, base, base + 8 * GIB, 2.0, base + GIB, {77: GIB}, 40)
    clean = GpuProfile(1, base, base + 8 * GIB, 2.0, base + 3 * MIB, {}, 40)
    lines = report_lines([leaked, clean], 128 * MIB, {77: "worker-1-decode"})
    assert lines == [
        "GPU 0: baseline 614 MiB, peak 8,806 MiB (+8,192 MiB at 2.0 s), final 1,638 MiB, "
        "leak +1,024 MiB  LEAK (40 samples)",
        "    pid 77       worker-1-decode        peak 1,024 MiB",
        "GPU 1: baseline 614 MiB, peak 8,806 MiB (+8,192 MiB at 2.0 s), final 617 MiB, "
        "leak +3 MiB (40 samples)",
    ]


def test_settling_waits_for_memory_freed_late_and_gives_up_on_a_leak():
    nvml = FakeNvml(24)
    sampler = Sampler(nvml).start()
    nvml.use(0, 5, 2)
    sampled_after(nvml, 2)
    nvml.use(0, 5, 0)  # freed, late
    assert sampler.settle(128 * MIB, Deadline(5))
    nvml.use(0, 6, 1)  # kept
    assert not sampler.settle(128 * MIB, Deadline(0.5))
    sampler.stop()


@pytest.mark.parametrize(
    ("rise_gib", "marker"), [(4.8, 4.8), (4.81, 4.9), (6.02, 6.1), (0.0, 0.0), (0.01, 0.1)]
)
def test_profiled_vram_is_the_peak_rounded_up_to_a_tenth(rise_gib, marker):
    assert profiling.vram_marker(rise_gib * GIB) == marker


def test_the_timeout_is_a_multiple_of_the_wall_time_rounded_up_to_ten_seconds():
    assert profiling.timeout_marker(9.2) == 30 and profiling.timeout_marker(95.0) == 290


def test_marker_text_to_paste():
    assert profiling.marker_lines("decode/x", 6.9, 60) == [
        "markers for decode/x: profiled_vram_gib(6.9) handoff_timeout(60)",
        "    in the backend: profiled_vram_gib['decode'] = 6.9, timeouts['decode'] = 60",
    ]


def png_rows(data):
    """Check a PNG's chunks and CRCs; its width, height and decoded scanlines."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = body
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    assert len(raw) == height * (1 + 3 * width)
    return width, height, raw


def test_the_timeline_is_a_valid_png_with_the_series_and_the_events(tmp_path):
    path = timeline_png(
        tmp_path / "vram.png",
        {"GPU 0": [(0, 0), (2, 7.5), (5, 7.5), (6, 1.0)]},
        [(2.5, "FAULT"), (2.7, "MIGRATION"), (5.5, "DONE")],
        "decode/x",
    )
    width, height, raw = png_rows(path.read_bytes())
    assert (width, height) == (960, 400)
    for colour in [(31, 119, 180), (214, 39, 40), (255, 127, 14), (44, 160, 44)]:
        assert bytes(colour) in raw  # the series and each event's line


def test_profile_prints_the_report_the_markers_and_draws_the_plot(tmp_path, monkeypatch, capsys):
    nvml = FakeNvml(80)
    monkeypatch.setattr(profiling, "open_nvml", lambda: nvml)
    monkeypatch.setattr(profiling, "SETTLE_S", 0.3)
    case = backend_cases(get_backend("mocker"), ["decode"], "pre_merge")[0]

    def run_case(backend, case, folder, settings, timeout_s, pools=None):
        history = History()
        history.record("launch")
        history.record("process_launched", process="worker-1-decode", pid=4242)
        nvml.use(0, 4242, 6)
        sampled_after(nvml, 3)
        history.record("fault_sent")
        history.record("migration_seen")
        nvml.use(0, 4242, 0)
        nvml.use(0, 4343, 1)  # a child left behind by the case, still holding 1 GiB
        sampled_after(nvml, 2)
        history.record("response_finished")
        history.record("teardown_done")
        return CaseResult(case, Verdict(True, [], "verdict"), 9.5, folder, history)

    monkeypatch.setattr("handoff.runner.run_case", run_case)
    monkeypatch.chdir(tmp_path)
    status = profiling.main([case.key, "--backend", "mocker", "--logs", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1  # leaked
    assert f"{case.key}: PASS in 9.5 s" in out
    assert "leak +1,024 MiB  LEAK" in out
    assert "pid 4242     worker-1-decode        peak 6,144 MiB" in out
    assert f"markers for {case.key}: profiled_vram_gib(6) handoff_timeout(30)" in out
    (picture,) = tmp_path.glob(f"*/{case.topology}/{case.id}/vram.png")
    png_rows(picture.read_bytes())
    assert f"plot: {picture.relative_to(tmp_path)}" in out or f"plot: {picture}" in out
    assert nvml.closed


@pytest.mark.skipif(gpu_count()[0] > 0, reason="this machine has a GPU")
def test_without_a_gpu_profile_says_why_in_one_line_and_fails():
    result = subprocess.run(
        [sys.executable, "-m", "handoff.commands.profiling", "aggregate/anything"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("handoff profile: no GPU can be read: ")
