"""The commands the README and docs/writing-a-backend.md show, run as written, so that the
docs cannot drift from the tool: each handoff and pytest command with its documented exit
status, and each nox session the README names must exist in the noxfile. (The nox sessions
themselves install gigabytes or run for minutes; the mocker ones are what `nox -s tests` and
CI exercise anyway, and RESULTS.md records them run as written on a fresh clone.)"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: A command line in a code block: optionally a `$ ` prompt and an environment assignment,
#: then handoff or pytest, up to a trailing `# comment`.
COMMAND = re.compile(r"^(?:\$ )?((?:[A-Z_]+=\S+ )?(?:handoff|pytest) [^#\n]*?)\s*(?:#.*)?$")
#: writing-a-backend.md's own backend is called `myengine`; its example package is `example`.
READER_BACKEND = ("myengine", "example")
#: What a documented command must exit with, where it is not 0: the doc shows it failing.
FAILS = {"pytest --pyargs handoff.qualification --handoff-backend vllm": "no GPU here"}


def code_lines(doc: Path) -> list[str]:
    """Every line of the doc's fenced and indented code blocks."""
    text = doc.read_text()
    fenced = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    indented = re.findall(r"(?:^    .*\n)+", text, re.M)
    return [line.strip() for block in fenced + indented for line in block.splitlines()]


def documented(doc: str) -> list[str]:
    found = [m.group(1) for line in code_lines(REPO / doc) if (m := COMMAND.match(line))]
    return list(dict.fromkeys(c.replace(*READER_BACKEND) for c in found))


COMMANDS = documented("docs/writing-a-backend.md") + documented("README.md")


def test_the_docs_show_commands_at_all():
    assert any(c.startswith("pytest ") for c in COMMANDS)
    assert any(c.startswith("handoff cases") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_documented_command_runs_as_written(command, tmp_path):
    words = shlex.split(command)
    env = dict(os.environ)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    module = {"handoff": "handoff.cli", "pytest": "pytest"}[words[0]]
    argv = [sys.executable, "-m", module, *words[1:]]
    if words[0] == "pytest":
        argv += ["-p", "no:cacheprovider", "--handoff-logs", str(tmp_path / "runs")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    output = result.stdout[-3000:] + result.stderr[-2000:]
    if command in FAILS:
        assert result.returncode != 0, output
    else:
        assert result.returncode == 0, output


def noxfile_sessions() -> set[str]:
    """The sessions noxfile.py defines: each @nox.session function, by its name= or its own."""
    names = set()
    for node in ast.parse((REPO / "noxfile.py").read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if ast.unparse(target) != "nox.session":
                continue
            named = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
            names.add(named[0] if named else node.name)
    return names


def test_every_session_the_readme_names_exists():
    lines = code_lines(REPO / "README.md")
    named = {m.group(1) for line in lines if (m := re.match(r"^nox -s (\w+)", line))}
    assert named and named <= noxfile_sessions(), named - noxfile_sessions()
