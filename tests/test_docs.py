"""The docs tell the truth about the code: every dotted name of the package that README.md,
docs/ and the library's docstrings mention exists, and every relative link of the docs leads
to a file, and to a heading of it where it names one."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: A dotted name of the package in prose or code (not a path such as oocgemm/api.py).
NAME = re.compile(r"(?<![\w./-])(oocgemm(?:\.[A-Za-z_]\w*)+)")
#: A Sphinx role's target in a docstring.
ROLE = re.compile(r":(?:class|func|mod|data|meth|attr|exc):`~?(oocgemm[\w.]*)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _defined(path: pathlib.Path, name: str) -> bool:
    """Whether the module at ``path`` defines ``name`` at its top level (read, not imported:
    for modules that need CuPy)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = {node.name}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found = {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found = {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            continue
        if name in found:
            return True
    return False


def _exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        file = ROOT.joinpath(*parts[:i])
        try:
            obj = importlib.import_module(module)
        except ImportError:
            if file.with_suffix(".py").is_file() and i < len(parts):  # needs CuPy: read it
                return _defined(file.with_suffix(".py"), parts[i])
            if file.is_dir() or file.with_suffix(".py").is_file():
                return True  # a module of the package that needs CuPy, named whole
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def _mentions() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for doc in DOCS:
        for match in NAME.finditer(doc.read_text()):
            found.setdefault(match.group(1), set()).add(str(doc.relative_to(ROOT)))
    for source in sorted((ROOT / "oocgemm").rglob("*.py")):
        for match in ROLE.finditer(source.read_text()):
            found.setdefault(match.group(1), set()).add(str(source.relative_to(ROOT)))
    return found


def test_every_name_the_docs_mention_exists():
    mentions = _mentions()
    assert len(mentions) > 50  # the pattern finds the names (it did not silently miss all)
    missing = {name: sorted(where) for name, where in mentions.items() if not _exists(name)}
    assert not missing, f"names that do not exist: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: pathlib.Path) -> set[str]:
    anchors, seen = set(), {}
    fenced = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            slug = _slug(line.lstrip("#"))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, broken


def test_the_anchor_rule_is_githubs():
    assert _slug("Choosing memory limits") == "choosing-memory-limits"
    assert _slug("Ozaki scheme II (`kernel=\"ozaki\"`: `oocgemm/ozaki.py`)") == \
        "ozaki-scheme-ii-kernelozaki-oocgemmozakipy"
    assert _slug("Several GPUs") != "several-gpu"
