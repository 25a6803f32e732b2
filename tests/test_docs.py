"""The docs tell the truth about the code: every dotted name of the package that the Markdown
docs (README.md, kernels/README.md, docs/) and the library's docstrings mention exists (as
``oocgemm.cuda.context.PROCESS``, ``~oocgemm.planning.Plan``, or from inside the package as
``api._plan`` or ``CudaExecutor.staging``), every file they name by its path exists, and
every relative link of the docs leads to a file, and to a heading of it where it names one.

Names in modules that need CuPy (``oocgemm.cuda.context``, ...) are checked by reading the
module's source (``ast``), not by importing it, so the test runs the same on a machine without
CuPy: a module-level class, function or assignment, a class's methods, attributes and the
``self.x`` its methods assign (and, through ``x = Class()``, an instance's), followed through
the module's imports."""

from __future__ import annotations

import ast
import functools
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "oocgemm"
DOCS = [ROOT / "README.md", *sorted((ROOT / "kernels").glob("*.md")),
        *sorted((ROOT / "docs").rglob("*.md"))]
#: A dotted name of the package in prose or code (not a path such as oocgemm/api.py).
NAME = re.compile(r"(?<![\w./-])(oocgemm(?:\.[A-Za-z_]\w*)+)")
#: A Sphinx role's target (``:class:`~oocgemm.planning.Plan```).
ROLE = re.compile(r":(?:class|func|mod|data|meth|attr|exc|obj):`~?(oocgemm[\w.]*)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


# -- names read from the source ------------------------------------------------------------

def _module_file(module: str) -> pathlib.Path | None:
    base = ROOT.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text())


def _statements(body: list[ast.stmt]):
    """The statements of a scope, those inside its if/try/with blocks included."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _statements(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _statements(node.body + node.orelse + node.finalbody
                                   + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.With):
            yield from _statements(node.body)
        else:
            yield node


def _targets(target: ast.expr):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _targets(element)


def _imported(module: str, node: ast.ImportFrom, alias: ast.alias) -> str:
    """The dotted name that ``from ... import alias`` in ``module`` binds."""
    if not node.level:
        return f"{node.module}.{alias.name}"
    package = module.split(".")
    if _module_file(module).name != "__init__.py":
        package = package[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else []), alias.name])


def _defines(node: ast.stmt, found: dict[str, object]) -> bool:
    """Record what a statement defines (a class or function, an assigned value) in
    ``found``; whether it was such a statement."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        found[node.name] = node
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            for name in _targets(target):
                found[name] = node.value
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        found[node.target.id] = node.value
    else:
        return False
    return True


@functools.cache
def _bindings(module: str) -> dict[str, object]:
    """What each top-level name of ``module`` is bound to: a class or function node, an
    assigned value (an expression), or the dotted name of an import."""
    found: dict[str, object] = {}
    for node in _statements(_tree(_module_file(module)).body):
        if _defines(node, found):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    found[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                found[alias.asname or alias.name] = _imported(module, node, alias)
    lazy = found.get("__getattr__")  # a module's __getattr__ (PEP 562): what it imports
    if isinstance(lazy, ast.FunctionDef):
        for node in ast.walk(lazy):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    found.setdefault(alias.asname or alias.name,
                                     _imported(module, node, alias))
    return found


def _members(module: str, cls: ast.ClassDef) -> dict[str, object]:
    """A class's names: its body's, the ``self.x`` its methods assign, its bases' (those of
    the package)."""
    found: dict[str, object] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and isinstance(bound := _bindings(module).get(base.id),
                                                     ast.ClassDef):
            found.update(_members(module, bound))
    for node in _statements(cls.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                value = getattr(inner, "value", None)
                targets = (inner.targets if isinstance(inner, ast.Assign) else
                           [inner.target] if isinstance(inner, ast.AnnAssign) else [])
                for target in targets:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self"):
                        found.setdefault(target.attr, value)
    for node in _statements(cls.body):
        _defines(node, found)
    return found


def _follow(module: str, bound: object, rest: list[str]) -> bool:
    """Whether ``rest`` can be looked up on what a name of ``module`` is bound to."""
    if not rest:
        return True
    if isinstance(bound, str):  # an import: the dotted name it binds
        return _exists(".".join([bound, *rest]))
    if isinstance(bound, ast.ClassDef):
        members = _members(module, bound)
        return rest[0] in members and _follow(module, members[rest[0]], rest[1:])
    if isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name):  # x = Class(...)
        return _follow(module, _bindings(module).get(bound.func.id), rest)
    return False  # a function's attributes, or a value this reader cannot tell


def _static(module: str, rest: list[str]) -> bool:
    """Whether ``module.rest`` exists, read from the source of ``module`` (not imported)."""
    if _module_file(module) is None:
        return False
    if not rest:
        return True
    bindings = _bindings(module)
    if rest[0] in bindings:
        return _follow(module, bindings[rest[0]], rest[1:])
    return _static(f"{module}.{rest[0]}", rest[1:])  # a submodule not imported by its package


def _static_name(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if _module_file(".".join(parts[:i])) is not None:
            return _static(".".join(parts[:i]), parts[i:])
    return False


# -- names imported ------------------------------------------------------------------------

def _needs_another_library(exc: ImportError) -> bool:
    """Whether an import failed for a library that is not installed (CuPy, an extra's)."""
    return isinstance(exc, ModuleNotFoundError) and exc.name is not None and \
        exc.name.split(".")[0] != "oocgemm"


def _by_import(dotted: str) -> bool | None:
    """Import the longest module prefix of ``dotted`` and look the rest up on it: whether it
    is there, or None where the module needs a library that is not installed (CuPy)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ImportError as exc:
            if _needs_another_library(exc):
                return None
            if isinstance(exc, ModuleNotFoundError) and f"{module}.".startswith(f"{exc.name}."):
                continue  # not a module: an attribute of a shorter prefix
            raise
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


@functools.cache
def _exists(dotted: str) -> bool:
    """Whether ``dotted`` exists: imported where it can be; read from the source where the
    module needs a library that is not installed (CuPy), or where an attribute is not on a class but
    set on its instances (``self.x`` in a method, a dataclass field without a default)."""
    return bool(_by_import(dotted)) or _static_name(dotted)


def _docstrings(path: pathlib.Path):
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(_tree(path)):
        if isinstance(node, kinds) and (doc := ast.get_docstring(node, clean=False)) is not None:
            yield doc


def _mentions() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for doc in DOCS:
        text = doc.read_text()
        for name in [*NAME.findall(text), *ROLE.findall(text)]:
            found.setdefault(name, set()).add(str(doc.relative_to(ROOT)))
    for source in sorted(PACKAGE.rglob("*.py")):
        names = ROLE.findall(source.read_text())  # roles in comments too (#: ...)
        names += [n for doc in _docstrings(source) for n in NAME.findall(doc)]
        for name in names:
            found.setdefault(name, set()).add(str(source.relative_to(ROOT)))
    return found


MENTIONS = _mentions()


def test_every_name_the_docs_mention_exists():
    assert len(MENTIONS) > 50  # the patterns find the names (they did not silently miss all)
    missing = {name: sorted(where) for name, where in MENTIONS.items() if not _exists(name)}
    assert not missing, f"names that do not exist: {missing}"


def test_names_in_modules_that_need_cupy_are_checked_too():
    """The docs name things of oocgemm.cuda's modules, and the reader of the source tells a
    name that is there from one that is not (with CuPy or without)."""
    assert any(name.startswith("oocgemm.cuda.context.") for name in MENTIONS)
    for name in ("oocgemm.cuda.context.PROCESS", "oocgemm.cuda.context.PROCESS.pinned.release",
                 "oocgemm.cuda.context.Resources.close", "oocgemm.cuda.context.GpuContext.emulator",
                 "oocgemm.cuda.ozaki.Emulator", "oocgemm.cuda.kernels.KernelError",
                 "oocgemm.runtime.cuda_executor.CudaExecutor.staging"):
        assert _static_name(name) and _exists(name), name
    for name in ("oocgemm.cuda.context.PINNED", "oocgemm.cuda.context.PINNED.release",
                 "oocgemm.cuda.context.PROCESS.pinned.free", "oocgemm.cuda.context.Resources.open",
                 "oocgemm.cuda.nothing", "oocgemm.cuda.ozaki.Emulator.no_such_method",
                 "oocgemm.api._prepare.staging"):
        assert not _static_name(name) and not _exists(name), name


def test_the_source_reader_agrees_with_imports():
    """Every name the docs mention that imports without CuPy is found by reading the source
    as well: the reader that checks oocgemm.cuda is the one these names test."""
    importable = [name for name in MENTIONS if _by_import(name)]
    assert len(importable) > 40
    unread = [name for name in importable if not _static_name(name)]
    assert not unread, unread
    for name in ("oocgemm.plan.Plan", "oocgemm.Engine.nothing", "oocgemm.storage.nowhere"):
        assert not _exists(name) and not _static_name(name), name


def test_the_errors_troubleshooting_lists_are_oocgemms():
    """docs/troubleshooting.md's table: each error it names is exported by the package (as
    ``oocgemm.KernelError``) and is an :class:`oocgemm.OOCGemmError`."""
    import oocgemm

    table = (ROOT / "docs" / "troubleshooting.md").read_text().partition("## Errors")[2]
    named = set(re.findall(r"^\| `(\w+Error)\b", table, re.MULTILINE))
    assert {"DeviceError", "KernelError", "OptionError"} <= named
    for name in named:
        assert name in oocgemm.__all__, name
        assert issubclass(getattr(oocgemm, name), oocgemm.OOCGemmError), name


# -- names without the package's prefix ----------------------------------------------------

#: The docs that describe the code as it is (lab-notes.md and the black-box reports are dated
#: records of their day's code).
CURRENT = [doc for doc in DOCS if doc.name != "lab-notes.md" and "blackbox" not in doc.parts]
#: A dotted name in prose or code; file names (api.py, c.zarr) are left out below.
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
FILES = ("py", "cu", "cuh", "md", "json", "txt", "zarr", "npy", "toml", "png", "c", "h")
#: What the docs' examples call a run's objects: ``result = oocgemm.multiply(...)``,
#: ``plan = oocgemm.plan(...)``.
INSTANCES = {"result": "oocgemm.Result", "plan": "oocgemm.Plan"}


@functools.cache
def _package_names() -> tuple[set[str], dict[str, list[str]]]:
    """The package's top-level modules and subpackages, and its classes by name."""
    modules = {p.stem for p in PACKAGE.iterdir()
               if p.suffix == ".py" or (p / "__init__.py").is_file()} - {"__init__", "__main__"}
    classes: dict[str, list[str]] = {}
    for source in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(source.relative_to(ROOT).with_suffix("").parts).removesuffix(
            ".__init__")
        for node in _statements(_tree(source).body):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(f"{module}.{node.name}")
    return modules, classes


def _relative(name: str) -> list[str] | None:
    """The package's names that ``name`` may stand for (``lifecycle.run.open_run``,
    ``CudaExecutor.staging``, ``result.bytes``), or None where it names none of its modules,
    classes or a run's objects. A class's or an object's name is checked one attribute deep
    (what follows is an attribute of that attribute's value)."""
    modules, classes = _package_names()
    head, *rest = name.split(".")
    if rest[-1] in FILES:
        return None
    if head in INSTANCES:  # before the modules: result.bytes is not oocgemm.result's
        return [f"{INSTANCES[head]}.{rest[0]}"]
    if head in modules:
        return [f"oocgemm.{name}"]
    if head in classes:
        return [f"{cls}.{rest[0]}" for cls in classes[head]]
    return None


def _elsewhere(name: str) -> bool:
    """Whether ``name`` is a module of another library (dask.array beside oocgemm.dask)."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def test_every_relative_name_the_docs_use_exists():
    """Names written from inside the package (``api._plan``, ``RunIO.begin``,
    ``CudaExecutor.staging``, ``result.bytes``) exist as well."""
    missing, checked = {}, 0
    for doc in CURRENT:
        for name in DOTTED.findall(doc.read_text()):
            if (candidates := _relative(name)) is None:
                continue
            checked += 1
            if not any(_exists(c) for c in candidates) and not _elsewhere(name):
                missing.setdefault(name, set()).add(str(doc.relative_to(ROOT)))
    assert checked > 40
    assert not missing, f"names that do not exist: {missing}"


def test_a_relative_name_that_is_not_there_is_found():
    assert _relative("api._prepare") == ["oocgemm.api._prepare"]
    assert not _exists("oocgemm.api._prepare.staging")
    assert not any(_exists(c) for c in _relative("Executor.staging"))
    assert any(_exists(c) for c in _relative("CudaExecutor.staging"))
    assert not any(_exists(c) for c in _relative("result.no_such_field"))
    assert _relative("api.py") is None and _relative("numpy.matmul") is None


def _cupy_imports(path: pathlib.Path) -> tuple[bool, bool]:
    """Whether a module imports CuPy at its top level, and whether it does anywhere."""
    def imports(node):
        return (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "cupy"
                                                     for a in node.names)) or \
            (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cupy")
    tree = _tree(path)
    return (any(imports(n) for n in _statements(tree.body)),
            any(imports(n) for n in ast.walk(tree)))


def test_design_md_names_the_modules_that_import_cupy():
    """design.md's layout: cuda/'s modules are the only ones that import CuPy at their top;
    every module elsewhere that imports it (inside a function) is named there."""
    layout = (ROOT / "docs" / "design.md").read_text().partition("## Layout")[2].partition(
        "\n## ")[0]
    at_top, inside = set(), set()
    for source in sorted(PACKAGE.rglob("*.py")):
        top, anywhere = _cupy_imports(source)
        rel = source.relative_to(PACKAGE)
        if top:
            at_top.add(rel)
        elif anywhere and rel.parts[0] != "cuda":
            inside.add(rel)
    assert at_top and all(rel.parts[0] == "cuda" and rel.name in layout for rel in at_top)
    assert inside and all(str(rel) in layout for rel in inside), inside


def test_design_md_maps_every_module():
    """design.md's layout names every module of the package by its path from ``oocgemm/``
    (dask/'s are named in its own section, Dask graphs): a module added without a line in the
    map fails here."""
    design = (ROOT / "docs" / "design.md").read_text()
    layout = design.partition("## Layout")[2].partition("\n## ")[0]
    dask = design.partition("## Dask graphs")[2].partition("\n## ")[0]
    unmapped = []
    for source in sorted(PACKAGE.rglob("*.py")):
        rel = source.relative_to(PACKAGE)
        if rel.name in ("__init__.py", "__main__.py"):
            continue  # a package's own module is its folder's line
        named = (f"`{rel.name}`" in dask if rel.parts[0] == "dask" else
                 re.search(rf"(?<![\w/]){re.escape(str(rel))}\b", layout) is not None)
        if not named:
            unmapped.append(str(rel))
    assert not unmapped, f"modules design.md's layout does not name: {unmapped}"


#: A path in code spans: ``oocgemm/cuda/context.py``, ``runtime/cuda_executor.py``,
#: ``kernels/ozaki.cu``.
PATH = re.compile(r"`([\w.-]+(?:/[\w.*-]+)+\.(?:py|cu|cuh|md|toml|c))`")


def test_every_path_the_docs_name_exists():
    """Files named by their path, from the checkout's root or the package's
    (``planning/tiling.py``); ``.scratch/`` holds probes kept out of the repository."""
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in CURRENT
               for path in PATH.findall(doc.read_text())
               if not path.startswith(".scratch/")
               and not any(next(base.glob(path), None) for base in (ROOT, PACKAGE))]
    assert not missing, missing


# -- links ---------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: its text as rendered (code spans kept whole,
    emphasis marks and link targets dropped), lowercased, punctuation but hyphens and
    underscores dropped, spaces as hyphens."""
    parts = re.split(r"(`[^`]*`)", heading.strip())
    text = "".join(
        part[1:-1] if part.startswith("`") else
        re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", part))
        for part in parts)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(doc: pathlib.Path) -> set[str]:
    """The anchors of a document's headings; a repeated one gets -1, -2, ... as on GitHub."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence = None
    for line in doc.read_text().splitlines():
        if fence is None and (opening := re.match(r" {0,3}(```+|~~~+)", line)):
            fence = opening.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None and (heading := re.match(r" {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)):
            slug = base = _slug(heading.group(1))
            while slug in anchors:
                seen[base] = seen.get(base, 0) + 1
                slug = f"{base}-{seen[base]}"
            anchors.add(slug)
    return anchors


def _broken_links(doc: pathlib.Path) -> list[str]:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[A-Za-z][\w+.-]*:", target):
            continue  # a URL (https:, mailto:)
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(doc):
    broken = _broken_links(doc)
    assert not broken, broken


def test_the_anchor_rule_is_githubs():
    assert _slug("Choosing memory limits") == "choosing-memory-limits"
    assert _slug("Ozaki scheme II (`kernel=\"ozaki\"`: `oocgemm/ozaki.py`)") == \
        "ozaki-scheme-ii-kernelozaki-oocgemmozakipy"
    assert _slug("Memory pressure (`_execute` in `api.py`)") == \
        "memory-pressure-_execute-in-apipy"
    assert _slug("A01: out=np.load('a.npy', mmap_mode='r+')") == "a01-outnploadanpy-mmap_moder"
    assert _slug("*Big* chunks, _small_ [budgets](#x)") == "big-chunks-small-budgets"
    assert _slug("Several GPUs") != "several-gpu"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Top\n\n## Part\n\n```\n# not a heading\n```\n"
                                       "## Part\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#part-1) [ok](#here) [url](https://example.org/x#y)\n"
                   "[gone](missing.md) [bad](other.md#not-a-heading) [bad](other.md#part-2)\n"
                   "# Here\n")
    assert _broken_links(doc) == ["missing.md: no such file",
                                  "other.md#not-a-heading: no heading #not-a-heading in other.md",
                                  "other.md#part-2: no heading #part-2 in other.md"]


# -- the README, short, and the guide's pages beside it ------------------------------------

README = ROOT / "README.md"
#: The pages the README leaves the detail to. They are among DOCS and CURRENT, so the checks
#: above hold them to the same rules as the README: the names they mention exist, the paths
#: they name exist, their links lead somewhere.
GUIDE = [ROOT / "docs" / name for name in (
    "usage.md", "zarr.md", "object-storage.md", "dask.md", "kernels.md", "profiling.md",
    "troubleshooting.md", "performance.md")]


def _code_blocks(text: str) -> list[str]:
    """The fenced code blocks of Markdown text (a block left open at the end is left out)."""
    return re.findall(r"^ {0,3}```[^\n]*\n(.*?)^ {0,3}```", text, re.MULTILINE | re.DOTALL)


def test_the_guide_pages_are_checked_and_linked_from_the_readme():
    readme = README.read_text()
    for page in GUIDE:
        assert page.is_file(), page
        assert page in DOCS and page in CURRENT, page
        assert f"](docs/{page.name}" in readme, f"README does not link docs/{page.name}"
    named = {n for page in GUIDE for n in NAME.findall(page.read_text())}
    assert {"oocgemm.dask.WarmUp", "oocgemm.dask.timeline"} <= named  # the pages' names are read


def test_the_readme_starts_short():
    """At most 250 lines; within its first 60, code that multiplies numpy arrays, code that
    multiplies Zarr arrays into a Zarr array, the command line and a Gram product, and where
    C is (``.out``)."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    blocks = _code_blocks("\n".join(lines[:60]) + "\n")
    python = [b for b in blocks if "oocgemm.multiply(" in b or "oocgemm.gram(" in b]
    assert any("import numpy" in b and "oocgemm.multiply(" in b for b in python), "numpy"
    assert any(b.count(".zarr") >= 3 and "oocgemm.multiply(" in b for b in python), "Zarr"
    assert any(re.search(r"^oocgemm multiply ", b, re.MULTILINE) for b in blocks), "CLI"
    assert any("oocgemm.gram(" in b for b in python), "Gram"
    assert any(re.search(r"^oocgemm gram ", b, re.MULTILINE) for b in blocks), "oocgemm gram"
    assert all(".out" in b for b in python), "where C is"


def test_the_readme_gives_the_test_command_ci_runs():
    """README's "For developers" gives the command that .ci/run runs (the two kept in step)."""
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"^python3 -m pytest [^\n]*$", ci, re.MULTILINE).group(0)
    developers = README.read_text().partition("## For developers")[2]
    lines = [line.strip() for b in _code_blocks(developers) for line in b.splitlines()]
    assert command in lines, (command, lines)
    assert "-e '.[test]'" in ci and "pip install -e '.[test]'" in lines
