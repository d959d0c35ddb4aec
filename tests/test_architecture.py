"""The architecture's rules, read from the source: the layers, no import circles, no MLX in the window,
and the bench above the product (it measures it; nothing in it depends on the bench).

Imports are read with ``ast`` from every module of ``app``, ``sessions`` and ``mlxcore``, those inside
functions included (they are dependencies too, only later); those under ``if TYPE_CHECKING:`` are not
(nothing runs them). A circle is a strongly connected set of modules.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "sessions", "mlxcore", "bench")
LAYERS = {"mlxcore": 0, "sessions": 1, "app": 2, "bench": 3}  # a module imports its own layer or lower ones only
# The one way up: `mlxchat bench` is a subcommand, so the command line hands it to the bench's package.
ALLOWED_UP = {("app.cli", "bench.command")}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(module: str, tree: ast.AST) -> set[str]:
    """The modules of the three packages ``module`` imports (a package's ``__init__`` counts when named)."""
    names: set[str] = set()
    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        else:
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name in MODULES and name != module}


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, those inside functions included, but not those under
    ``if TYPE_CHECKING:`` (nothing runs them)."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


GRAPH = {module: _imported(module, ast.parse(path.read_text())) for module, path in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected sets of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.add(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        circles.append(members)
    return circles


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
                    if LAYERS[target.split(".")[0]] > LAYERS[module.split(".")[0]]
                    and (module, target) not in ALLOWED_UP)
    assert not upward, upward


def test_the_product_imports_nothing_from_the_bench():
    """The twin builder, the load generator and every measurement live in ``bench``: a product module that
    imports one of them (but for the command line's dispatch of `mlxchat bench`) fails."""
    product = [f"{module} -> {target}" for module, targets in GRAPH.items() if not module.startswith("bench")
               for target in targets if target.split(".")[0] == "bench" and (module, target) not in ALLOWED_UP]
    assert not product, product
    assert ("app.cli", "bench.command") in {(m, t) for m, ts in GRAPH.items() for t in ts}, "the rule reads imports"


def test_no_import_circles():
    circles = [sorted(circle) for circle in _circles(GRAPH)]
    assert not circles, f"import circles: {circles}"


def test_the_circle_finder_finds_circles():
    """The check above cannot pass by finding nothing: a made-up circle is found, and only it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [{"a", "b", "c"}]


@pytest.mark.parametrize("entry", ["app.cli", "app.tui.run", "app.tui.app"])
def test_the_windows_process_loads_no_mlx(entry):
    """The window's process (the engine runs in another) imports no MLX: a fresh interpreter checks."""
    code = (f"import sys, {entry}; loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')); "
            "print(loaded); sys.exit(1 if loaded else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("argv", [["sessions", "ls"], ["ask", "--seed", "-1", "hi"], ["ask", "--max-kv", "12XB", "hi"],
                                  ["ask", "--session", "missing/chat.mlxchat", "hi"], ["serve", "--max-kv", "12XB"],
                                  ["ask", "--model", "no-such-model", "hi"]])
def test_a_command_that_loads_no_model_imports_no_model_code(argv, tmp_path):
    """Listing sessions, and an ask or serve refused for its input (a mistyped model too), answer at once: no
    mlx-lm, no transformers (whose import alone takes a second or more)."""
    code = (f"import sys\nfrom app.cli import main\nstatus = main({argv!r})\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'mlx_lm', 'transformers'})\n"
            "print(status, loaded)\nsys.exit(1 if loaded else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MLXCHAT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    status = int(done.stdout.splitlines()[-1].split()[0])  # (the last line: what ls printed comes first)
    assert status == (0 if argv[0] == "sessions" else 2) and ("mlxchat:" in done.stderr) == bool(status), done.stderr


def _exports(package: str) -> set[str]:
    """The public names of ``package``: the keys of its ``__init__``'s ``_EXPORTS``, read from the source."""
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return {key.value for key in node.value.keys}
    raise AssertionError(f"{package}/__init__.py has no _EXPORTS")


def _reaching_in(module: str, tree: ast.AST, public: dict[str, set[str]]) -> set[str]:
    """What ``module`` takes from a lower layer other than its public names (``mlxcore.kv.geometry``,
    ``mlxcore.NotExported``); imports under ``if TYPE_CHECKING:`` excluded, those in functions included."""
    found: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in public and "." in a.name)
        elif not node.level and node.module:
            top = node.module.split(".")[0]
            if top in public and top != module.split(".")[0]:
                if node.module != top:
                    found.add(node.module)
                else:
                    found.update(f"{top}.{a.name}" for a in node.names if a.name not in public[top])
    return found


# Submodules of the layer below that app and sessions may still reach into: none (issue 34). A name they
# need is exported by the layer's __init__, where it is listed and typed.
STILL_REACHED: set[str] = set()
PUBLIC = {"mlxcore": _exports("mlxcore"), "sessions": _exports("sessions")}


def test_app_and_sessions_use_only_the_public_names_of_the_layer_below():
    reached = {name: module for module, path in MODULES.items() if module.split(".")[0] in ("app", "sessions")
               for name in _reaching_in(module, ast.parse(path.read_text()), PUBLIC)}
    new = sorted(f"{module} -> {name}" for name, module in reached.items() if name not in STILL_REACHED)
    assert not new, f"not in the layer below's _EXPORTS: {new}"


def test_the_public_name_check_finds_reaching_in():
    """The check above cannot pass by finding nothing: made-up imports inside a module and a function are found."""
    source = ("from mlxcore import Engine, Secret\nimport mlxcore.kv.geometry\n"
              "def f():\n    from sessions.store_db import open_db\n    from sessions import ChatSession\n")
    public = {"mlxcore": {"Engine"}, "sessions": {"ChatSession"}}
    assert _reaching_in("app.x", ast.parse(source), public) == {
        "mlxcore.Secret", "mlxcore.kv.geometry", "sessions.store_db"}
    assert {"Engine", "GenerationParams"} <= PUBLIC["mlxcore"] and "ChatSession" in PUBLIC["sessions"]


def _typed_exports(package: str) -> dict[str, str]:
    """What ``package``'s ``__init__`` tells type checkers each lazy name is: name -> module, from the
    imports under its ``if TYPE_CHECKING:``."""
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return {a.asname or a.name: i.module for i in node.body if isinstance(i, ast.ImportFrom) and i.module
                    for a in i.names}
    raise AssertionError(f"{package}/__init__.py has no TYPE_CHECKING block")


@pytest.mark.parametrize("package", ["mlxcore", "sessions"])
def test_the_type_checkers_view_of_the_exports_is_the_exports(package):
    """The two lists in the __init__ (what __getattr__ loads, what type checkers are told) name the same
    things from the same modules: a name missing from the second would be untyped for every caller."""
    tree = ast.parse(MODULES[package].read_text())
    exports = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", None) == "_EXPORTS" for t in n.targets))
    assert _typed_exports(package) == exports
