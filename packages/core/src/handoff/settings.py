"""A team's settings: `[tool.handoff]` in pyproject.toml (or a handoff.toml beside it), over
each backend's defaults, under the command line. Every value remembers where it came from
and is checked there: its type, its range, its topologies.

Layout (handoff.toml holds the same tables without the `tool.handoff` prefix):

    [tool.handoff]              # for every backend
    graceful_bound_s = 2.0
    [tool.handoff.vllm]         # for one backend; wins over the table above
    model = "Qwen/Qwen3-0.6B"
    model_cache = "~/.cache/huggingface"
    image = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1"
    max_tokens = { aggregate = 512, decode = 512, kv_transfer = 192 }
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from handoff.cases import TOPOLOGIES
from handoff.errors import HandoffError

#: Every key a settings table may hold: its type and what it is for.
KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "model": (str, "the model clients ask for: a hub id or a name"),
    "model_path": (str, "a local folder with the model's weights (default: fetch `model`)"),
    "model_cache": (str, "host folder of the model cache, mounted into the runtime container"),
    "image": (str, "runtime container image the GPU sessions run inside"),
    "device": (
        str,
        "where the workers run, for a backend that offers more than one (vllm: cuda or cpu)",
    ),
    "max_tokens": (dict, "output tokens per topology, e.g. { aggregate = 512 }"),
    "graceful_bound_s": ((int, float), "seconds between SIGTERM and SIGKILL"),
    "stream_timeout_s": (
        int,
        "whole seconds of silence on a worker's response stream before the frontend gives up "
        "on it and migrates (DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS), in the stall cases",
    ),
    "case_timeout_s": ((int, float), "the most one case may take, start-up to teardown"),
    "startup_timeout_s": ((int, float), "the most a deployment may take to become ready"),
    "fresh_deployments": (
        bool,
        "start every case's workers anew, as Dynamo's own suite does, not from warm pools",
    ),
    "discovery": (
        str,
        "where Dynamo's processes find each other: file (Dynamo's file store) or etcd (started "
        "by handoff on loopback, as production runs it)",
    ),
    "spare_workers": (
        int,
        "workers of the faulted role each pool keeps ready, unseen by frontends, so that the "
        "next case need not wait for a replacement (none beyond the cases the run brings)",
    ),
    "load_requests": (
        int,
        "requests a load case sends at once, spread over its workers by the frontend's router",
    ),
    "dynamo": (
        str,
        "the Dynamo release to qualify (handoff.releases lists those it knows); the CPU "
        "sessions install it in a virtualenv of its own",
    ),
    "beside": (
        str,
        "another Dynamo release, whose processes a mixed deployment runs (the `mix` setting); "
        "its virtualenv is .nox/dynamo-RELEASE, which `nox -s upgrade` makes",
    ),
    "mix": (
        str,
        "which processes run from the `beside` release: frontend, alternate (every second "
        "worker), replacements (a rolling upgrade) or prefill (handoff.mixes)",
    ),
    "durations_file": (
        str,
        "pytest-split's durations file for --splits N --group G (default: "
        "durations/<backend>.json, or <backend>-<device>.json, under the working folder)",
    ),
}
ABOVE_ZERO, ZERO_OR_MORE = "above 0", "0 or more"
#: Each number's range (max_tokens: each topology's count is above 0). A bound or a timeout
#: of 0 would turn a case into another: a graceful case whose SIGKILL follows its SIGTERM.
RANGES = {
    "graceful_bound_s": ABOVE_ZERO,
    "stream_timeout_s": ABOVE_ZERO,
    "case_timeout_s": ABOVE_ZERO,
    "startup_timeout_s": ABOVE_ZERO,
    "spare_workers": ZERO_OR_MORE,
    "load_requests": ABOVE_ZERO,
}
BUILT_IN = {
    "graceful_bound_s": 2.0,
    "stream_timeout_s": 3,
    "fresh_deployments": False,
    "spare_workers": 1,
    "discovery": "file",
}
#: The values a setting may take, where they are few.
CHOICES = {"discovery": ("file", "etcd")}
FILES = ("handoff.toml", "pyproject.toml")


@dataclass(frozen=True)
class Setting:
    value: object
    source: str


@dataclass(frozen=True)
class Configuration:
    """The effective settings of one backend: key -> value and where it came from."""

    backend: str
    values: Mapping[str, Setting]

    def get(self, key: str, default: object = None) -> object:
        found = self.values.get(key)
        return default if found is None else found.value


def find_file(start: Path) -> Path | None:
    """handoff.toml, or a pyproject.toml with a [tool.handoff] table, in `start` or above."""
    for folder in (start.resolve(), *start.resolve().parents):
        if (folder / "handoff.toml").is_file():
            return folder / "handoff.toml"
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "handoff" in _read(pyproject).get("tool", {}):
            return pyproject
    return None


def find_repository(start: Path) -> Path | None:
    """The handoff repository at or above `start` (the folder holding packages/core)."""
    for folder in (start.resolve(), *start.resolve().parents):
        if (folder / "packages" / "core" / "pyproject.toml").is_file():
            return folder
    return None


def repository_backends(repo: Path) -> set[str]:
    """The backends whose packages this repository holds (packages/<backend>_backend)."""
    return {p.name.removesuffix("_backend") for p in (repo / "packages").glob("*_backend")}


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HandoffError(f"cannot read settings file {path}: {exc}; fix its TOML") from None


def file_tables(path: Path, backends: set[str]) -> dict[str, dict]:
    """The shared table ('') and each backend's table of `path`, every key and value checked.
    A table may be named after any of `backends`, whether or not it runs here."""
    data = _read(path)
    root = data if path.name == "handoff.toml" else data.get("tool", {}).get("handoff", {})
    prefix = "" if path.name == "handoff.toml" else "tool.handoff"
    tables: dict[str, dict] = {"": {}}
    for key, value in root.items():
        label = f"[{'.'.join(filter(None, (prefix, key)))}]"
        if isinstance(value, dict) and key in backends:
            tables[key] = _checked(value, label, path)
        elif isinstance(value, dict) and key not in KEYS:
            near = difflib.get_close_matches(key, backends, n=1)
            hint = f"did you mean [{near[0]}]?" if near else "install the backend's package"
            raise HandoffError(
                f"{label} of {path} names no backend that is installed or in this "
                f"repository's packages ({', '.join(sorted(backends)) or 'none'}): {hint}"
            )
        else:
            tables[""][key] = value
    tables[""] = _checked(tables[""], f"[{prefix}]" if prefix else "the top level", path)
    return tables


def _checked(table: dict, where: str, path: Path) -> dict:
    for key, value in table.items():
        if key not in KEYS:
            raise HandoffError(
                f"unknown key {key!r} in {where} of {path}: use one of {', '.join(KEYS)} "
                "(or a table named after a backend)"
            )
        if wrong := problem(key, value):
            raise HandoffError(f"{key} in {where} of {path} {wrong}, or remove it")
    return table


def problem(key: str, value: object) -> str | None:
    """What is wrong with `value` for `key` and the fix ("must be ..., not ...: give ..."), or
    None when it is in range."""
    if key not in KEYS:
        return f"is no setting: use one of {', '.join(KEYS)}"
    kind = KEYS[key][0]
    if not _is(value, kind):
        expected = "a number" if kind == (int, float) else f"a {_type_name(kind)}"
        return f"must be {expected}, not {value!r}: give {expected}"
    if key == "max_tokens":
        assert isinstance(value, dict)
        if unknown := [t for t in value if t not in TOPOLOGIES]:
            near = difflib.get_close_matches(unknown[0], TOPOLOGIES, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            return (
                f"names no topology {unknown[0]!r} in {value!r}: use {', '.join(TOPOLOGIES)}{hint}"
            )
        if not all(_is(v, int) and v > 0 for v in value.values()):
            return (
                f"must map topologies to integers above 0, not {value!r}: give each topology "
                "its output tokens, e.g. { aggregate = 512 }"
            )
        return None
    if key in CHOICES and value not in CHOICES[key]:
        return f"must be one of {', '.join(CHOICES[key])}, not {value!r}: give one of them"
    rule = RANGES.get(key)
    if rule is None:
        return None
    assert isinstance(value, int | float)
    if not math.isfinite(value) or value < 0 or (value == 0 and rule == ABOVE_ZERO):
        return f"must be {rule}, not {value!r}: give a value {rule}"
    return None


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    """isinstance, but a boolean is no number."""
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _type_name(kind: type | tuple[type, ...]) -> str:
    return {str: "string", int: "integer", dict: "table", bool: "boolean"}.get(kind, str(kind))  # type: ignore[arg-type]


def resolve(
    backend: str,
    defaults: Mapping[str, object],
    installed: set[str],
    overrides: Mapping[str, tuple[object, str]] | None = None,
    start: Path | None = None,
    used: tuple[str, ...] = tuple(KEYS),
) -> Configuration:
    """Built-in defaults < the backend's defaults < the shared table < the backend's table
    < `overrides` (key -> (value, which option)); None overrides are ignored. A key in the
    backend's own table that the backend does not use (`used`) is an error, not a silent no-op.
    A file's tables may be named after any `installed` backend or one of the packages of the
    handoff repository the file lies in, so the host and a runtime container read one file
    alike. Every value is checked where it comes from.
    """
    values = {k: Setting(v, "built-in default") for k, v in BUILT_IN.items()}
    values.update({k: Setting(v, f"{backend} backend default") for k, v in defaults.items()})
    for key, found in values.items():
        if wrong := problem(key, found.value):
            raise HandoffError(f"{key} of the {found.source} {wrong} in its plugin")
    path = find_file(start or Path.cwd())
    if path is not None:
        repo = find_repository(path.parent)
        tables = file_tables(path, installed | (repository_backends(repo) if repo else set()))
        prefix = "" if path.name == "handoff.toml" else "tool.handoff"
        for table, label in (("", prefix), (backend, ".".join(filter(None, (prefix, backend))))):
            where = f"{path.name} [{label}]" if label else path.name
            found = tables.get(table, {})
            if table and (unused := [k for k in found if k not in used]):
                raise HandoffError(
                    f"{', '.join(unused)} in [{label}] of {path} does nothing for the "
                    f"{backend} backend (it uses {', '.join(used)}): remove it"
                )
            if table == "":
                found = {k: v for k, v in found.items() if k in used}
            values.update({k: Setting(v, where) for k, v in found.items()})
    for key, (value, option) in (overrides or {}).items():
        if value is None:
            continue
        if wrong := problem(key, value):
            raise HandoffError(f"{option} {wrong}, or leave {option} out")
        values[key] = Setting(value, f"command line {option}")
    return Configuration(backend, values)
