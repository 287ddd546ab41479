"""The folders every handoff run on this machine shares, each by the variable that names it:
the port leases with the VRAM ledger beside them (`ports`, `sharing.vram_ledger`) and the
records of the processes runs started (`ownership`, read by the next run's reaping).

Runs that share the machine's network, pids and GPUs must share these too, or two of them
lease the same port, reap nothing of each other's and place on GPUs blind to each other. A run
in a container with the host's network and pids (handoff.commands.container) gets each folder
mounted at its own path and its variable set to that path.
"""

from __future__ import annotations

from pathlib import Path

from handoff.machine.ownership import STATE_ENV, records_path
from handoff.machine.ports import LEASE_DIR_ENV, lease_path


def shared_folders() -> dict[str, Path]:
    """Each shared folder as this process resolves it (not made), by its variable."""
    return {LEASE_DIR_ENV: lease_path(), STATE_ENV: records_path()}
