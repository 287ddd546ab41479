"""nftables rules that cut connections of handoff's own processes, as a partition does.

Each cut is a table of its own, `handoff_<pid>_<n>` (the pid of the run that made it), whose
rules match only the exact ports and 4-tuples they were given, on the output hook: on loopback
every packet, either way, passes there once. Every table is recorded beside the process records
(machine/ownership.py), so that teardown, Ctrl-C and the next run after a killed one all remove
it: `reap_orphans` deletes the tables of runs that no longer exist, never a live run's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from handoff.errors import HandoffError
from handoff.machine import ownership

NFT = "nft"
FAMILY = "inet"
PREFIX = "handoff_"
NFT_TIMEOUT_S = 10.0
_numbers = itertools.count()


def missing() -> str | None:
    """Why no cut can be made here, in one line that says the fix; None when one can."""
    if shutil.which(NFT) is None:
        return "nft is not installed: apt-get install nftables (as root)"
    if os.geteuid() != 0:
        return "nftables rules need root: run as root"
    return None


@dataclass(frozen=True)
class Flow:
    """One direction of TCP traffic to drop: from `src`:`sport` to `dst`:`dport`, each part
    left out matching any."""

    src: str | None = None
    sport: int | None = None
    dst: str | None = None
    dport: int | None = None

    def rule(self) -> str:
        words = []
        for field, address in (("saddr", self.src), ("daddr", self.dst)):
            if address is not None:
                words.append(f"{'ip6' if ':' in address else 'ip'} {field} {address}")
        words.append("meta l4proto tcp")
        if self.sport is not None:
            words.append(f"th sport {self.sport}")
        if self.dport is not None:
            words.append(f"th dport {self.dport}")
        return " ".join([*words, "counter", "drop"])


def _nft(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [NFT, *args], input=stdin, capture_output=True, text=True, timeout=NFT_TIMEOUT_S
    )
    if done.returncode != 0:
        raise HandoffError(f"`nft {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def _records() -> Path:
    folder = ownership.records_dir() / "nftables"
    folder.mkdir(exist_ok=True)
    return folder


class Cut:
    """The rules of one table, in place from creation until `heal`."""

    def __init__(self, flows: list[Flow]) -> None:
        if not flows:
            raise HandoffError("nothing to cut: no port or connection was given")
        self.table = f"{PREFIX}{os.getpid()}_{next(_numbers)}"
        self.flows = flows
        self.healed = False
        ownership.write_owned(_records() / f"{self.table}.json", table=self.table)
        rules = "".join(f"    {flow.rule()}\n" for flow in flows)
        _nft("-f", "-", stdin=(
            f"table {FAMILY} {self.table} {{\n  chain output {{\n"
            f"    type filter hook output priority 0; policy accept;\n{rules}  }}\n}}\n"
        ))  # fmt: skip

    def dropped(self) -> int:
        """The packets its rules have dropped so far; HandoffError when unreadable."""
        listed = json.loads(_nft("-j", "list", "table", FAMILY, self.table))
        return sum(
            expr["counter"]["packets"]
            for item in listed["nftables"]
            if "rule" in item
            for expr in item["rule"]["expr"]
            if "counter" in expr
        )

    def heal(self) -> None:
        """Remove the table (again: a no-op)."""
        if not self.healed:
            delete(self.table)
            self.healed = True


def tables() -> list[str]:
    """handoff's tables in place now, of any run; none where nft cannot run."""
    if missing():
        return []
    listed = json.loads(_nft("-j", "list", "tables", FAMILY))
    names = [item["table"]["name"] for item in listed["nftables"] if "table" in item]
    return [name for name in names if name.startswith(PREFIX)]


def own_tables() -> list[str]:
    """The tables this process made that are still in place."""
    return [name for name in tables() if name.startswith(f"{PREFIX}{os.getpid()}_")]


def delete(table: str) -> None:
    """Remove `table` and its record."""
    with contextlib.suppress(HandoffError):  # gone already
        _nft("delete", "table", FAMILY, table)
    (_records() / f"{table}.json").unlink(missing_ok=True)


def reap_orphans() -> list[str]:
    """Delete the tables of runs that no longer exist; one description per table."""
    if missing():
        return []
    reaped = []
    in_place = tables()
    for path in sorted(_records().glob("*.json")):
        entry = ownership.orphaned(path)
        if entry is None:
            continue
        if entry["table"] in in_place:
            reaped.append(f"nftables table {entry['table']} (owner pid {entry['owner']})")
        delete(entry["table"])
    return reaped
