"""Generated arrays kept on disk. The search is deterministic, so an array is a function of its
model, its strength, the search budget and the generator's own code: each process after the
first that asks for it reads the rows instead of searching again (collecting the nightly, `handoff
cases`, every xdist worker). The file is named by a digest of all four, so a changed model or
generator is a new file, never a stale one; a file that does not hold rows of the model is
generated again, and a cache that cannot be written only makes the next process search again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from handoff.covering import generate as generator
from handoff.covering import verify
from handoff.covering.verify import Model
from handoff.machine.environment import cache_root


def generate(model: Model, strength: int) -> list[dict[str, str]]:
    """`handoff.covering.generate.generate(model, strength)`, from the cache when it is there."""
    path = cache_root() / "covering" / f"{_digest(model, strength)}.json"
    with contextlib.suppress(OSError, ValueError):
        kept = json.loads(path.read_text())
        if _rows_of(model, kept):
            return kept
    rows = generator.generate(model, strength)
    with contextlib.suppress(OSError):
        _write(path, rows)
    return rows


def _rows_of(model: Model, kept: object) -> bool:
    """Whether `kept` is a list of rows of `model`: each axis once, each value one of its own."""
    return (
        isinstance(kept, list)
        and bool(kept)
        and all(
            isinstance(row, dict)
            and row.keys() == model.axes.keys()
            and all(row[axis] in values for axis, values in model.axes.items())
            for row in kept
        )
    )


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    """Whole or absent, however many processes write it at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as out:
        try:
            json.dump(rows, out)
            out.close()
            os.replace(out.name, path)
        finally:  # a file half written (a full disk) goes too, not only one never moved
            Path(out.name).unlink(missing_ok=True)


def _digest(model: Model, strength: int) -> str:
    code = b"".join(Path(m.__file__).read_bytes() for m in (generator, verify))
    chosen = repr((model, strength, generator.MOVES, generator.SEED)).encode()
    return hashlib.sha256(code + chosen).hexdigest()[:24]
