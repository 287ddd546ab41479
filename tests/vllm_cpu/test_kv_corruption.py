"""Wrong KV made for real: the decode workers' engines corrupt the KV each NIXL transfer wrote
into their cache (tests/corrupting_kv_worker), after it landed and before decode read it, as a
transfer with wrong layer, head or block offsets would, or one that read another request's
block. The prompt and the prefill are right, so only the log-probabilities can tell: each
kind fails the kv_transfer case, and the verdict names the first token that departs. The
earlier requests a decode worker receives (the case's warm-ups) carry the case's own prompt, so
another request's block at the same position is the right one: that kind takes the earlier
request's block of another position."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_engine import SETTINGS, TIMEOUT_S, reasons_of
from test_wrong_contexts import TRANSFERRED

from handoff.runner import run_case
from handoff_vllm import VllmBackend

HERE = Path(__file__).resolve().parents[1] / "corrupting_kv_worker"
KINDS = ("a layer", "a head", "a block", "another request's block")
DEPARTS = "the log-probabilities depart from the reference at token 1: "


class Corrupting(VllmBackend):
    """Decode workers whose engine corrupts the KV of every transfer it receives (`kind`), but
    the first where the kind needs an earlier request's block."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        if role != "decode":
            return launch
        path = [p for p in (launch.env.get("PYTHONPATH"), str(HERE)) if p]
        env = {"PYTHONPATH": ":".join(path), "HANDOFF_CORRUPT_KV": self.kind}
        return replace(launch, env={**launch.env, **env})


@pytest.mark.parametrize("kind", KINDS)
def test_a_decode_worker_whose_received_kv_is_corrupted_fails_by_the_first_departing_token(
    vllm_cpu, tmp_path, kind
):
    """The corruption must be logged (else the case proves nothing). The decode worker computes
    the response's first token itself, from the received KV: so that token already departs."""
    backend = Corrupting(kind)
    backend.configure(vllm_cpu.configuration)
    result = run_case(backend, TRANSFERRED, tmp_path, SETTINGS, TIMEOUT_S)
    logs = "".join(p.read_text() for p in tmp_path.rglob("worker-*.log"))
    assert f"handoff-test: corrupted KV: {kind}: " in logs, "no received KV was corrupted"
    reasons = reasons_of(result)
    assert DEPARTS in reasons, reasons
