"""Command lines and environment of the runtime services and Dynamo's frontend."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from handoff.machine.environment import find_nats_server

LOOPBACK = "127.0.0.1"

#: Tokio's own default for a runtime's blocking threads, for every Dynamo process. Dynamo
#: 1.6.1 caps them at the number of cores: on one core, on the NATS plane, a prefill worker
#: stopped after registering its first NATS endpoint listener and a frontend with a prefill
#: router never answered HTTP (a tokio worker parked in `block_in_place`); on two cores a
#: frontend once stopped answering mid-case (docs/known-issues.md).
RUNTIME_THREADS = {"DYN_RUNTIME_MAX_BLOCKING_THREADS": "512"}


def runtime_env(
    discovery: Mapping[str, str], nats_port: int | None, loopback: Mapping[str, str]
) -> dict[str, str]:
    """The environment every process of one deployment shares, `discovery`'s included (which
    store, handoff.machine.discovery: no process is told it on its command line), and the
    variables that make the release's processes bind loopback only (`loopback`).

    Inherited DYN_*, ETCD_* and NATS_SERVER variables are dropped: a case must not pick up a
    migration limit or a discovery store from the shell that launched it. On the NATS plane
    events go through NATS too. The runtime's blocking threads are not capped by the cores.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DYN_", "ETCD_")) and k != "NATS_SERVER"
    }
    env.update(loopback)
    env.update(RUNTIME_THREADS)
    env.update(discovery)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if nats_port is not None:
        env["NATS_SERVER"] = f"nats://{LOOPBACK}:{nats_port}"
        # With file discovery Dynamo picks the ZMQ event plane, whose publishers bind 0.0.0.0
        # whatever DYN_EVENT_PLANE_HOST says; where NATS runs anyway, events go through it.
        env["DYN_EVENT_PLANE"] = "nats"
    return env


def nats_command(port: int, store_dir: Path) -> list[str]:
    return [find_nats_server(), "-a", LOOPBACK, "-p", str(port), "-js", "-sd", str(store_dir)]


#: The frontend's module -> the module whose import is most of its start: a pool forks its
#: frontends from an interpreter that imported it (`handoff.machine.preload`).
PRELOADED = {"dynamo.frontend": "dynamo.frontend.main"}
#: What Dynamo's frontend and every worker module import, imported once for all of a pool's
#: warm interpreters; it leaves the environment as it found it (checked as it starts).
PRELOADED_BASE = ("dynamo.runtime", "dynamo.llm", "dynamo.common.configuration.groups")
