"""The architecture of docs/architecture.md, checked on every test run.

Two kinds of check. The layer contracts in pyproject.toml (``[tool.importlinter]``) are run by
import-linter: a lower layer never imports a higher one, and serving with everything below it
never reaches torch, SB3, the trainer or the CLI (the serving image installs no torch, so such an
import would crash the server at start-up). Imports under ``if TYPE_CHECKING:`` count there and
here, so a cycle cannot hide behind them.

The rest are read from the source with ``ast``: module and function size (a newcomer reads a
module in one sitting), function-level imports (they hide a module's dependencies and usually
paper over a cycle), import cycles between modules, rule constants defined in one place only
(two copies drift apart), and private names staying private to their module.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "allocator"

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
LONG_MARKER = re.compile(r"#\s*long:\s*\S")
"""A function may run past MAX_FUNCTION_LINES when a comment ``# long: <why>`` opens it."""

GENERATED = re.compile(r"_pb2(_grpc)?\.py$")
"""protoc output: checked in byte for byte (tests/serving/test_proto.py), never edited."""

RULE_CONSTANTS = ("CASH_ID", "MAX_ID_LENGTH", "WEIGHT_SUM_TOLERANCE")
"""Contract rules that must be assigned in exactly one module (the layer that owns them)."""

VERSION_NAMES = re.compile(r"^_?VERSION_(RE|REGEX|PATTERN)$")
VERSION_LITERAL = r"^\d+(\.\d+)*$"
"""The model-version naming rule: one module defines it, every other layer imports it."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    source: str
    tree: ast.Module

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = module_name(path)
        found[name] = Module(name, path, source, ast.parse(source, filename=str(path)))
    return found


def comment_lines(source: str) -> set[int]:
    """Line numbers that carry a ``#`` comment (own line or trailing)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0] for tok in tokens if tok.type == tokenize.COMMENT}


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def imported_modules(module: Module, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The allocator modules an import statement names (a submodule when ``from`` names one)."""
    known = modules()
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    if node.level:
        base = module.name.split(".")
        if not module.is_package:
            base.pop()
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    if target not in known:
        return []
    named = [f"{target}.{alias.name}" for alias in node.names]
    submodules = [name for name in named if name in known]
    if len(submodules) < len(named):
        submodules.append(target)
    return submodules


def allocator_imports(module: Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, list[str]]]:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            targets = imported_modules(module, node)
            if targets:
                yield node, targets


def report(violations: list[str], rule: str) -> None:
    if violations:
        pytest.fail(f"{rule}:\n  " + "\n  ".join(violations), pytrace=False)


def test_import_contracts() -> None:
    """Run the contracts of pyproject.toml with import-linter (the ``dev`` extra installs it)."""
    pytest.importorskip("importlinter")
    beside_python = Path(sys.executable).with_name("lint-imports")
    lint_imports = str(beside_python) if beside_python.exists() else shutil.which("lint-imports")
    assert lint_imports, "import-linter is installed but its lint-imports command is not found"
    result = subprocess.run(
        [lint_imports, "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr, pytrace=False)


def test_modules_are_short() -> None:
    violations = [
        f"{module.rel}: {len(module.source.splitlines())} lines"
        for module in modules().values()
        if not GENERATED.search(module.path.name)
        and len(module.source.splitlines()) > MAX_MODULE_LINES
    ]
    report(violations, f"modules over {MAX_MODULE_LINES} lines")


def test_functions_are_short_or_say_why() -> None:
    violations = []
    for module in modules().values():
        if GENERATED.search(module.path.name):
            continue
        lines = module.source.splitlines()
        for fn in functions(module.tree):
            length = fn.end_lineno - fn.lineno + 1
            if length <= MAX_FUNCTION_LINES:
                continue
            first = fn.body[0]
            has_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            header_end = first.end_lineno if has_docstring else first.lineno - 1
            opening = lines[fn.lineno - 1 : header_end + 3]
            if not any(LONG_MARKER.search(line) for line in opening):
                violations.append(f"{module.rel}:{fn.lineno} {fn.name}() is {length} lines")
    report(
        violations,
        f"functions over {MAX_FUNCTION_LINES} lines without a '# long: <why>' comment at the top",
    )


def statement_lists(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every block of statements under ``tree`` (bodies, else and finally branches, handlers)."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def test_function_level_imports_say_why() -> None:
    """A lazy import of an allocator module needs a comment saying why: on its line, on the line
    above, or above the block of consecutive imports it belongs to."""
    violations = set()
    for module in modules().values():
        commented = comment_lines(module.source)
        for fn in functions(module.tree):
            for block in statement_lists(fn):
                justified = False
                previous_end = -1
                for stmt in block:
                    if not isinstance(stmt, ast.Import | ast.ImportFrom):
                        justified = False
                        continue
                    own = bool(commented.intersection(range(stmt.lineno - 1, stmt.end_lineno + 1)))
                    justified = own or (justified and previous_end == stmt.lineno - 1)
                    previous_end = stmt.end_lineno
                    if not justified and imported_modules(module, stmt):
                        violations.add(f"{module.rel}:{stmt.lineno} in {fn.name}()")
    # Nested functions are walked twice (as themselves and inside their parent): hence a set.
    report(sorted(violations), "function-level allocator imports without a comment saying why")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with a cycle (size > 1 or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles() -> None:
    """Every import counts: module level, ``if TYPE_CHECKING:`` and function level alike."""
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    where: dict[tuple[str, str], str] = {}
    for module in modules().values():
        for node, targets in allocator_imports(module):
            for target in targets:
                if target != module.name:
                    graph[module.name].add(target)
                    where.setdefault((module.name, target), f"{module.rel}:{node.lineno}")
    violations = []
    for component in strongly_connected(graph):
        members = set(component)
        edges = sorted(
            f"{where[(a, b)]} ({a} -> {b})" for a in component for b in graph[a] if b in members
        )
        violations.append("cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(edges))
    report(violations, "import cycles")


def assigned_names(tree: ast.Module) -> Iterator[tuple[str, int, ast.AST | None]]:
    """Names bound by module- and class-level assignments, with their line and value."""
    bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for body in bodies:
        for node in body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        yield target.id, node.lineno, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                yield node.target.id, node.lineno, node.value


@pytest.mark.parametrize("constant", [*RULE_CONSTANTS, "version pattern"])
def test_rule_constants_are_defined_once(constant: str) -> None:
    definitions = []
    for module in modules().values():
        for name, line, value in assigned_names(module.tree):
            if constant == "version pattern":
                literal = value is not None and any(
                    isinstance(n, ast.Constant) and n.value == VERSION_LITERAL
                    for n in ast.walk(value)
                )
                matches = bool(VERSION_NAMES.match(name)) or literal
            else:
                matches = name == constant
            if matches:
                definitions.append((module.rel, line, name))
    if len({rel for rel, _, _ in definitions}) != 1:
        found = [f"{rel}:{line} ({name})" for rel, line, name in definitions] or ["nowhere"]
        report(found, f"{constant} must be defined in exactly one module; found")


def test_no_private_strict_base_classes() -> None:
    """Strict config models derive from ``allocator.typed_config.StrictModel``, not a copy."""
    violations = [
        f"{module.rel}:{node.lineno}"
        for module in modules().values()
        for node in ast.walk(module.tree)
        if isinstance(node, ast.ClassDef) and node.name == "_Strict"
    ]
    report(violations, "private `_Strict` base classes (use allocator.typed_config.StrictModel)")


def test_private_names_stay_in_their_module() -> None:
    """``from allocator.x import _name``: a shared name is public; rename it instead."""
    violations = []
    for module in modules().values():
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.ImportFrom) or not imported_modules(module, node):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    violations.append(f"{module.rel}:{node.lineno} imports {alias.name}")
    report(violations, "private names imported across modules")


def test_tests_import_only_public_names() -> None:
    """A test reaches the code (and other tests' helpers) as a user or a contributor would:
    through public names, so a private name stays free to change."""
    violations = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if node.module.split(".")[0] not in ("allocator", "tests"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    rel = path.relative_to(ROOT)
                    violations.append(f"{rel}:{node.lineno} imports {alias.name}")
    report(violations, "private names imported by tests")
