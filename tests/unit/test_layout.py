"""The core package's layout: the top level holds the flow of one case and few modules beside
it, and no module imports one that imports it back (directly or around a circle), counting
imports made only for type checking and those inside functions."""

import ast
from pathlib import Path

import handoff
from handoff.cases import FAULTS

CORE = Path(handoff.__file__).parent
#: The case's three parts (cases, lifecycle, verdict), the plugin API and the flow's modules.
MOST_AT_TOP = 23


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each core module and the core modules it imports, from its source."""
    modules = {module_name(p): p for p in CORE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            graph[name].update(f for f in found if f in modules and f != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle: a path from a module back to itself, found by depth-first search."""
    found, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                found.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert circles(imports()) == []


def test_a_circle_is_found_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]


def test_the_top_level_holds_at_most_23_modules():
    top = sorted(p.name for p in CORE.glob("*.py"))
    assert len(top) <= MOST_AT_TOP, top
    assert {"cases.py", "backend.py", "deployment.py", "faults.py", "client.py", "verdict.py",
            "history.py", "runner.py", "pytest_plugin.py", "cli.py",
            "lifecycle.py"} <= set(top)  # fmt: skip


def room(module: str) -> str:
    """The top-level room a core module is in: itself, or the folder it is in."""
    return module.split(".")[1] if "." in module else module


def test_no_room_imports_one_that_imports_it_back():
    """The rooms (a top-level module, or a folder taken as one) import down only: a module in
    a folder that imports a room that imports the folder back is a circle too."""
    graph: dict[str, set[str]] = {}
    for module, targets in imports().items():
        here = room(module)
        graph.setdefault(here, set()).update(room(t) for t in targets if room(t) != here)
    for target in {t for ts in graph.values() for t in ts}:
        graph.setdefault(target, set())
    assert circles(graph) == []


#: Where a fault's name may decide what is done: the case model and its policies, and the
#: lifecycle definitions (`responses.lifecycles`); a backend's restrictions are case model too.
FAULT_NAMES_LIVE_IN = {
    "handoff.cases",
    "handoff.policies",
    "handoff.responses.lifecycles",
    "handoff.gpu_backend",
}
#: The case model's names for sets of faults.
FAULT_FAMILIES = {
    "DISCOVERY", "KILLS", "ABANDONS", "WORKER_FAULTS", "ENGINE", "PAST_LEASE", "STALLS",
    "SILENT", "DRAINS", "BROKER",
}  # fmt: skip


def fault_name_uses(path: Path) -> list[str]:
    """Where `path` names a fault, a family of faults, or compares a `.fault`: line and what."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in FAULTS:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Name) and node.id in FAULT_FAMILIES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.alias) and node.name in FAULT_FAMILIES:
            found.append(f"import {node.name}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "fault" for s in sides):
                found.append(f"{node.lineno}: a comparison of .fault")
    return found


def test_no_fault_name_decides_anything_outside_the_lifecycles_and_the_case_model():
    """A fault is a value (`handoff.lifecycle.Lifecycle`): the exercise asks it what to do,
    never its name."""
    found = {
        module_name(path): uses
        for path in CORE.rglob("*.py")
        if module_name(path) not in FAULT_NAMES_LIVE_IN and (uses := fault_name_uses(path))
    }
    assert found == {}
