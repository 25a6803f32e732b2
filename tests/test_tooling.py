"""The tools CI holds the code to: ruff's rules and mypy on the modules [tool.mypy] lists (their
settings are in pyproject.toml; .pre-commit-config.yaml runs the same before a commit), an
import graph without cycles, and no function above radon's cyclomatic complexity 25 without a
comment that says why."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*command) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (the test extra has it)")
    done = _run("ruff", "check", "oocgemm", "benchmarks", "tests", "examples")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_checked_modules():
    pytest.importorskip("mypy", reason="mypy is not installed (the test extra has it)")
    done = _run(sys.executable, "-m", "mypy")
    assert done.returncode == 0, done.stdout + done.stderr


def _imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top or inside functions)."""
    import ast

    package = ROOT / "oocgemm"
    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = (here.split(".")[:len(here.split(".")) - node.level + 1]
                        if node.level else [])
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    deps.add(full if full in names else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[module] = {d for d in deps if d in names and d != module}
    return graph


def test_the_package_has_no_import_cycle():
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module, path):
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])



def test_the_subpackages_have_no_import_cycle():
    """planning, storage, runtime, cuda, diagnostics and dask, each taken as one: none
    imports, through the others, back into itself (the planner learns the kernels from
    kernel_catalog, not from cuda/; NVTX ranges are diagnostics)."""
    packages = {p.name for p in (ROOT / "oocgemm").iterdir() if (p / "__init__.py").exists()}

    def package(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in packages else None

    graph: dict[str, set[str]] = {p: set() for p in packages}
    why: dict[tuple[str, str], str] = {}
    for module, deps in _imports().items():
        for dep in deps:
            a, b = package(module), package(dep)
            if a and b and a != b:
                graph[a].add(b)
                why.setdefault((a, b), f"{module} -> {dep}")

    def reaches(start: str, goal: str, seen: set[str]) -> list[str] | None:
        for nxt in sorted(graph[start]):
            if nxt == goal:
                return [start, nxt]
            if nxt not in seen:
                seen.add(nxt)
                path = reaches(nxt, goal, seen)
                if path:
                    return [start, *path]
        return None

    for pkg in sorted(packages):
        cycle = reaches(pkg, pkg, set())
        assert cycle is None, "package cycle: " + ", ".join(
            why[(a, b)] for a, b in zip(cycle, cycle[1:]))


def _imported_by(prefix: str) -> dict[str, set[str]]:
    return {module: deps for module, deps in _imports().items()
            if module == prefix or module.startswith(prefix + ".")}


@pytest.mark.parametrize("importer, forbidden", [
    ("oocgemm.storage", "oocgemm.api"),  # the run's I/O is assembled below the API
    ("oocgemm.planning", "oocgemm.storage"),  # the planner never touches storage
    ("oocgemm.runtime", "oocgemm.api"),
    ("oocgemm.storage", "oocgemm.lifecycle"),  # adapters know nothing of a run's life
    ("oocgemm.planning", "oocgemm.lifecycle"),
    ("oocgemm.lifecycle", "oocgemm.api"),
])
def test_the_way_through_goes_down_only(importer, forbidden):
    for module, deps in _imported_by(importer).items():
        wrong = sorted(d for d in deps if d == forbidden or d.startswith(forbidden + "."))
        assert not wrong, f"{module} imports {wrong}"


def test_storage_imports_no_plan():
    """The adapters take what they are told (regions, chunk grids), not plans: of planning/
    they use the pure chunk-grid helpers only."""
    allowed = {"oocgemm.planning.chunks", "oocgemm.planning.grid"}
    for module, deps in _imported_by("oocgemm.storage").items():
        wrong = sorted(d for d in deps if d.startswith("oocgemm.planning") and d not in allowed)
        assert not wrong, f"{module} imports {wrong}"


def test_a_kind_of_device_is_compared_by_name_in_its_backend_only():
    """What 'cpu' or 'cuda' means is asked of ``oocgemm.backends``: a comparison with a
    kind's name (``==``, ``!=``, ``in``, ``startswith``) elsewhere is a decision that belongs
    to a backend."""
    import ast

    kinds = {"cpu", "cuda"}
    found: dict[str, int] = {}
    for path in sorted((ROOT / "oocgemm").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("oocgemm/backends.py", "oocgemm/devices.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = False
            if isinstance(node, ast.Compare):
                named = any(isinstance(x, ast.Constant) and x.value in kinds
                            for x in [node.left, *node.comparators])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "startswith":
                named = any(isinstance(x, ast.Constant) and x.value in kinds for x in node.args)
            if named:
                found[rel] = found.get(rel, 0) + 1
    assert found == {}


def test_nothing_in_the_library_imports_benchmarks():
    import ast

    for path in (ROOT / "oocgemm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n.split(".")[0] == "benchmarks" for n in names), path


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


#: The standard library's public names that begin with an underscore.
PUBLIC_UNDERSCORED = {"os._exit", "sys._getframe"}


def test_no_module_reaches_into_another_modules_private_names():
    """A name another module uses is public within the package: no ``from .x import _y``, no
    private module (``_x.py``) imported by a sibling, no ``module._name``."""
    import ast

    wrong = []
    for path in (ROOT / "oocgemm").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                parts = (node.module or "").split(".")
                wrong += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                          if _private(a.name) or any(map(_private, parts))]
                modules.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                wrong += [f"{path.name}: import {a.name}" for a in node.names
                          if any(map(_private, a.name.split(".")))]
                modules.update((a.asname or a.name).split(".")[0] for a in node.names)
        wrong += [f"{path.name}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and _private(node.attr)
                  and isinstance(node.value, ast.Name) and node.value.id in modules
                  and f"{node.value.id}.{node.attr}" not in PUBLIC_UNDERSCORED]
    assert not wrong, wrong


def test_the_api_reads_at_once():
    """api.py tells a run's story: no function longer than 60 lines of code (its docstring
    aside), so that each reads at once."""
    import ast

    tree = ast.parse((ROOT / "oocgemm" / "api.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                body = body[1:]  # the docstring
            lines = (body[-1].end_lineno - body[0].lineno + 1) if body else 0
            assert lines <= 60, f"api.{node.name} has {lines} lines of code"


#: The most branches (radon's cyclomatic complexity) a function may have without a comment in its
#: body that says why it must (with the word "complexity").
COMPLEXITY_LIMIT = 25


def _too_complex(source: str) -> list[str]:
    """The functions and methods of ``source`` above :data:`COMPLEXITY_LIMIT` whose lines carry
    no comment with the word "complexity" (a closure counts in the function around it)."""
    import io
    import tokenize

    from radon.complexity import cc_visit
    from radon.visitors import Function

    comments = [(token.start[0], token.string.lower())
                for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT]
    return [f"{block.fullname} (line {block.lineno}): {block.complexity}"
            for block in cc_visit(source)
            if isinstance(block, Function) and block.complexity > COMPLEXITY_LIMIT
            and not any(block.lineno <= line <= block.endline and "complexity" in text
                        for line, text in comments)]


def _branches(count: int, why: str = "") -> str:
    """A function of ``count + 1`` paths, with ``why`` as a comment in its body."""
    lines = ["def f(x):", f"    {why}" if why else ""]
    lines += [f"    if x == {i}:\n        return {i}" for i in range(count)]
    return "\n".join(lines + ["    return -1", ""])


def test_the_complexity_check_flags_what_it_should():
    pytest.importorskip("radon", reason="radon is not installed (the test extra has it)")
    assert not _too_complex(_branches(COMPLEXITY_LIMIT - 1))
    assert _too_complex(_branches(COMPLEXITY_LIMIT)) == [f"f (line 1): {COMPLEXITY_LIMIT + 1}"]
    assert not _too_complex(_branches(COMPLEXITY_LIMIT, "# complexity: one rule per branch"))
    assert _too_complex(_branches(COMPLEXITY_LIMIT, "'''complexity in a string'''"))


def test_no_function_is_more_complex_than_the_limit_without_saying_why():
    """Every function and method of the package: at most COMPLEXITY_LIMIT (radon's cyclomatic
    measure), or a comment in its body that says why it must be more (with the word
    "complexity"); split into helpers that each say one thing otherwise."""
    pytest.importorskip("radon", reason="radon is not installed (the test extra has it)")
    over = [f"{path.relative_to(ROOT)}: {entry}"
            for path in sorted((ROOT / "oocgemm").rglob("*.py"))
            for entry in _too_complex(path.read_text())]
    assert not over, "\n".join(over)


#: The modules that read the environment: the settings (every OOCGEMM_* variable), the NVTX
#: switches (the tools' own: NVTX_INJECTION64_PATH, NVTX_DISABLE, CUDA_PATH) and ``oocgemm
#: info`` (the BLAS threads it reports).
READ_THE_ENVIRONMENT = {"oocgemm/settings.py", "oocgemm/diagnostics/nvtx.py", "oocgemm/info.py"}
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _reads_the_environment(source: str) -> list[str]:
    """Where ``source`` reaches the process's environment through ``os`` (``os.environ``,
    ``os.getenv``..., under any name ``os`` is imported as, or imported from it), by line."""
    import ast

    tree = ast.parse(source)
    aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name == "os"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"line {node.lineno}: from os import {a.name}" for a in node.names
                      if a.name in ENVIRONMENT_NAMES]
        elif (isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES
              and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_environment_check_flags_what_it_should():
    assert _reads_the_environment("import os\nx = os.environ.get('A')\n") == [
        "line 2: os.environ"]
    assert _reads_the_environment("import os as o\no.getenv('A')\n") == ["line 2: o.getenv"]
    assert _reads_the_environment("from os import environ\n") == [
        "line 1: from os import environ"]
    assert not _reads_the_environment("import os\nos.path.join('a')\nenviron = {}\n")


def test_the_environment_is_read_in_the_settings_module_only():
    """Every OOCGEMM_* variable is read by oocgemm.settings (the default of a setting that an
    option or ``settings.set`` replaces); elsewhere, only the NVTX switches and ``info``."""
    found = [f"{path.relative_to(ROOT)} {where}"
             for path in sorted((ROOT / "oocgemm").rglob("*.py"))
             if str(path.relative_to(ROOT)) not in READ_THE_ENVIRONMENT
             for where in _reads_the_environment(path.read_text())]
    assert not found, "read oocgemm.settings instead: " + "; ".join(found)
