"""Covering array sizes for the issue's nine models (strength 2): handoff's, the optimum or the
best lower bound, allpairspy's, and handoff's generation time (ms, best and worst of --repeat).

    python benchmarks/covering_sizes.py [--repeat 5] [--more]

`nox -s bench -- covering_sizes` installs handoff's core and allpairspy, and runs this. The
"optimum" column is `lower_bound`: where handoff reaches it, handoff's size is proved optimal and
the bound is printed alone; elsewhere it reads ">= bound". Without allpairspy its column is "-".
`--more` adds larger models, strength 3, and a constrained model shaped like handoff's cases.
Every array is checked with `handoff.covering.verify.missing`; an allpairspy array that misses some
interactions is shown with how many.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from importlib.metadata import PackageNotFoundError, version

from handoff.covering.generate import cover
from handoff.covering.verify import Implies, Model, missing

#: name -> (level counts, strength), as the issue writes them (4x2^6: one 4-level axis, six
#: 2-level ones).
MODELS = {
    "2^4": ([2] * 4, 2),
    "2^5": ([2] * 5, 2),
    "2^6": ([2] * 6, 2),
    "2^7": ([2] * 7, 2),
    "2^8": ([2] * 8, 2),
    "2^10": ([2] * 10, 2),
    "4x2^4": ([4] + [2] * 4, 2),
    "4x2^6": ([4] + [2] * 6, 2),
    "4x2^8": ([4] + [2] * 8, 2),
}
MORE = {
    "3^4": ([3] * 4, 2),
    "3^13": ([3] * 13, 2),
    "5^6": ([5] * 6, 2),
    "2^5 t3": ([2] * 5, 3),
    "2^10 t3": ([2] * 10, 3),
    "3^6 t3": ([3] * 6, 3),
    "cases": ([4, 4, 2, 2, 2, 2], 2),
    "cases t3": ([4, 4, 2, 2, 2, 2], 3),
}


def model(name: str, levels: list[int]) -> Model:
    axes = {f"x{i}": tuple(str(v) for v in range(n)) for i, n in enumerate(levels)}
    if not name.startswith("cases"):
        return Model(axes)
    # topology x policy x fault x api x response x plane: decode streams, kv_transfer migrates.
    return Model(axes, (Implies("x0", "1", "x4", ("0",)), Implies("x0", "2", "x1", ("0",))))


def allpairs_size(name: str, levels: list[int], strength: int) -> str:
    try:
        from allpairspy import AllPairs
    except ImportError:
        return "-"
    if name.startswith("cases"):
        return "-"  # its filter callback sees partial rows: not the same constraint model
    names = [f"x{i}" for i in range(len(levels))]
    rows = [
        dict(zip(names, map(str, r), strict=True))
        for r in AllPairs([list(range(n)) for n in levels], n=strength)
    ]
    gaps = len(missing(model(name, levels), rows, strength))
    return f"{len(rows)}" if not gaps else f"{len(rows)} ({gaps} missing)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--more", action="store_true")
    args = parser.parse_args()
    try:
        allpairs = f"allpairspy {version('allpairspy')}"
    except PackageNotFoundError:
        allpairs = "allpairspy not installed"
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{allpairs}, {args.repeat} runs each"
    )
    print(
        f"{'model':9} {'handoff':>7} {'optimum':>8} {'allpairspy':>16} {'best ms':>8} {'max ms':>7}"
    )
    for name, (levels, strength) in (MODELS | (MORE if args.more else {})).items():
        times, result = [], None
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = cover(model(name, levels), strength)
            times.append(time.perf_counter() - start)
        assert result is not None and not missing(model(name, levels), result.rows, strength)
        best = str(result.lower_bound) if result.proved_optimal else f">= {result.lower_bound}"
        print(
            f"{name:9} {len(result.rows):7} {best:>8} "
            f"{allpairs_size(name, levels, strength):>16} "
            f"{min(times) * 1000:8.1f} {max(times) * 1000:7.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
