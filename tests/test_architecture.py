"""The package's architecture, checked from the source: the import graph of edge_infer/,
formats/, kernels_cpu/ and kernels_cuda/ has no cycles and only imports down the layers (RANKS,
the table ARCHITECTURE.md shows), edge_infer/ holds few modules directly, and no source file is
long.

Every import statement counts wherever it stands (module level, inside functions, under
TYPE_CHECKING, relative), since each is a dependency all the same. An import maps to the most
specific module it names: `from edge_infer.cli.args import x` is a dependency on
edge_infer.cli.args (not on the package edge_infer.cli), `from edge_infer import hub` one on
edge_infer.hub, `from edge_infer import LLM` one on the package root.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Import name -> source folder (pyproject.toml's [tool.setuptools.package-dir]).
SOURCES = {
    "edge_infer": REPO / "edge_infer",
    "edge_infer.formats": REPO / "formats",
    "edge_infer.kernels_cpu": REPO / "kernels_cpu",
    "edge_infer.kernels_cuda": REPO / "kernels_cuda",
}
ROOT = "edge_infer"

# A module may import its own rank or lower. A name stands for the module and everything
# under it. _version (the version string, no imports) sits with errors at the bottom; the file
# format below the CPU backend, the CUDA backend (which reuses the CPU one's host code) above it.
RANKS = {
    "edge_infer._version": 0, "edge_infer.errors": 0, "edge_infer.numba_codegen": 0,
    "edge_infer.numba_cache": 0,
    "edge_infer.formats": 1,
    "edge_infer.kernels_cpu": 2,
    "edge_infer.kernels_cuda": 3,
    "edge_infer.config": 4, "edge_infer.sampling_params": 4, "edge_infer.outputs": 4,
    "edge_infer.tokenizer": 4, "edge_infer.chat": 4, "edge_infer.convert": 4, "edge_infer.hub": 4,
    "edge_infer.images": 4,
    "edge_infer.models": 5,
    "edge_infer.engine": 6,
    "edge_infer.llm": 7,
    "edge_infer.server": 8, "edge_infer.cluster": 8, "edge_infer.bench": 8, "edge_infer.quantize": 8,
    "edge_infer.cli": 9,
}
# The package root is the public face: it re-exports these, and nothing imports it.
ROOT_MAY_IMPORT = {"edge_infer._version", "edge_infer.errors", "edge_infer.sampling_params", "edge_infer.llm"}

MAX_TOP_LEVEL_MODULES = 12  # .py files directly in edge_infer/, __init__ included
MAX_LINES = 400


@dataclass(frozen=True, slots=True)
class Edge:
    """One import statement: module `src` depends on module `dst` (file and line for the report)."""

    src: str
    dst: str
    file: Path
    line: int

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst} ({self.file.relative_to(REPO)}:{self.line})"


def source_modules(sources: dict[str, Path] = SOURCES) -> dict[str, Path]:
    """Every module of the source folders: dotted name -> file."""
    mods: dict[str, Path] = {}
    for pkg, folder in sources.items():
        for f in sorted(folder.rglob("*.py")):
            parts = f.relative_to(folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            mods[".".join([pkg, *[p for p in parts if p != "__init__"]])] = f
    return mods


def _known(name: str, mods: dict[str, Path]) -> str | None:
    """The most specific module of ours that `name` (a dotted import path) falls in, if any."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, file: Path, mods: dict[str, Path]) -> set[str]:
    """The modules of ours that one import statement in `module` names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if file.name == "__init__.py" else module.rpartition(".")[0]
            up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(up + ([base] if base else []))
        # `from pkg import sub` names the submodule when there is one, else pkg itself.
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    return {k for k in (_known(n, mods) for n in names) if k is not None}


def import_edges(mods: dict[str, Path] | None = None) -> list[Edge]:
    """Every dependency between the modules, one per import statement and target."""
    mods = source_modules() if mods is None else mods
    edges = []
    for module, file in mods.items():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = sorted(_targets(node, module, file, mods))
                edges += [Edge(module, t, file, node.lineno) for t in targets]
    return [e for e in edges if e.src != e.dst]


def rank(module: str) -> int | None:
    """The layer of `module` by the most specific entry of RANKS that covers it."""
    name = module
    while name:
        if name in RANKS:
            return RANKS[name]
        name = name.rpartition(".")[0]
    return None


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (as its edges) per strongly connected component of more than one module."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.src, {}).setdefault(e.dst, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm (the graph is a few hundred nodes)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(sorted(comp)[0], comp, graph) for comp in comps]


def _cycle_in(start: str, comp: set[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    """A shortest path from `start` back to itself inside the component (breadth first)."""
    paths: dict[str, list[Edge]] = {start: []}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w, e in sorted(graph.get(v, {}).items()):
                if w == start:
                    return paths[v] + [e]
                if w in comp and w not in paths:
                    paths[w] = paths[v] + [e]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def _fail_if(problems: list[str], title: str) -> None:
    if problems:
        pytest.fail(title + ":\n  " + "\n  ".join(problems), pytrace=False)


# -- the checks -------------------------------------------------------------------------------
def test_no_import_cycles() -> None:
    report = []
    for c in find_cycles(import_edges()):
        report.append(" -> ".join([c[0].src, *[e.dst for e in c]]) + "".join(f"\n      {e}" for e in c))
    _fail_if(report, "import cycles")


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in source_modules() if m != ROOT and rank(m) is None)
    _fail_if(missing, "modules in no layer of the rank table (add them to RANKS)")


def test_imports_go_down_the_layers() -> None:
    bad = []
    for e in import_edges():
        if e.dst == ROOT:
            bad.append(f"{e}: nothing in the package may import the package root; import the module itself")
        elif e.src == ROOT:
            if e.dst not in ROOT_MAY_IMPORT:
                bad.append(f"{e}: the package root may only import {', '.join(sorted(ROOT_MAY_IMPORT))}")
        else:
            a, b = rank(e.src), rank(e.dst)
            if a is not None and b is not None and b > a:
                bad.append(f"{e}: rank {a} imports rank {b}")
    _fail_if(bad, "imports against the layer table")


def documented_ranks(text: str) -> dict[str, int]:
    """ARCHITECTURE.md's layer table as RANKS: each row's rank and its modules (`config`,
    `formats/`: edge_infer.config, edge_infer.formats)."""
    table = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    ranks = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`([\w/]+)`", cells[1]):
                ranks[f"{ROOT}.{name.rstrip('/')}"] = int(cells[0])
    return ranks


def test_architecture_md_shows_the_rank_table() -> None:
    documented = documented_ranks((REPO / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    if documented != RANKS:
        diff = sorted(f"{m}: ARCHITECTURE.md {documented.get(m)}, RANKS {RANKS.get(m)}"
                      for m in set(documented) | set(RANKS) if documented.get(m) != RANKS.get(m))
        _fail_if(diff, "ARCHITECTURE.md's layer table differs from RANKS")


def test_few_modules_directly_in_edge_infer() -> None:
    top = sorted(f.name for f in SOURCES[ROOT].glob("*.py"))
    if len(top) > MAX_TOP_LEVEL_MODULES:
        _fail_if(top, f"{len(top)} modules directly in edge_infer/ (at most {MAX_TOP_LEVEL_MODULES})")


def test_no_source_file_is_long() -> None:
    long = []
    for f in source_modules().values():
        n = len(f.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            long.append(f"{f.relative_to(REPO)} ({n} lines)")
    _fail_if(sorted(long), f"source files over {MAX_LINES} lines")


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checks above rest on this: imports inside functions, under TYPE_CHECKING and relative
    ones are found, `from package import submodule` names the submodule, other names the package."""
    files = {
        "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
        "a.py": "def f():\n    from . import b\n    from .sub import c\n",
        "b.py": "import os\n",
        "sub/__init__.py": "from .. import a\n",
        "sub/c.py": "import pkg.a\nfrom pkg import NAME\nfrom pkg.sub import c\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    edges = {(e.src, e.dst) for e in import_edges(source_modules({"pkg": tmp_path / "pkg"}))}
    assert edges == {
        ("pkg", "pkg.b"), ("pkg.a", "pkg.b"), ("pkg.a", "pkg.sub.c"), ("pkg.sub", "pkg.a"),
        ("pkg.sub.c", "pkg.a"), ("pkg.sub.c", "pkg"),
    }
    loop = [Edge("x", "y", tmp_path, 1), Edge("y", "x", tmp_path, 2), Edge("y", "z", tmp_path, 3)]
    assert [[e.dst for e in c] for c in find_cycles(loop)] == [["y", "x"]]
