"""MkDocs hooks (``hooks:`` in mkdocs.yml): the pages generated from the code at build time.

- ``reference/cli.md``: every ``allocator`` command, its help, usage and options, rendered
  by ``scripts/cli_reference.py`` from the click commands;
- ``reference/configuration.md``: every settings model's fields, types, defaults, bounds and
  descriptions, rendered by ``scripts/config_reference.py`` (the same renderer as the section
  in docs/operations.md, with the trainer and suite configs expanded too);
- ``examples/``: examples/README.md, and one page per script with its docstring and code;
- links from a docs page to examples/README.md or a script in examples/ lead to its page on
  the site, so the same link works on the site and in a checkout;
- a guide in docs/ that the nav does not name yet (a page added on another branch) is listed
  at the end of "Guides", under its first heading;
- other links from a docs page to a repository file outside docs/ (``../src/allocator/cli/``) become
  the path in code, or a link into ``repo_url`` when one is set; a link to a path that does not
  exist is left alone, so ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")


def _load(path: Path) -> ModuleType:
    """A script in scripts/ as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def configuration_page() -> str:
    renderer = _load(ROOT / "scripts" / "config_reference.py")
    head = [
        "# Configuration reference",
        "",
        "Every setting a user writes, read from the settings models themselves: a training",
        "config, a walk-forward, retraining or suite job (YAML, with `--set key=value`",
        "overrides) and the server's options (flags of `allocator serve`).",
        "",
    ]
    return "\n".join(head) + str(renderer.render(full=True))


def example_page(script: Path) -> str:
    """A script's docstring as prose, then its code."""
    source = script.read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source)) or script.stem
    title, _, body = doc.partition("\n")
    lines = [f"# {title.rstrip('.')}", "", f"`examples/{script.name}`", ""]
    lines += body.strip().splitlines()
    # the docstring's indented command lines become a shell block on the page
    return _indented_commands("\n".join(lines)) + f"\n\n```python\n{source.rstrip()}\n```\n"


def _indented_commands(text: str) -> str:
    """Blocks of 4-space indented lines (the docstrings' commands) as ```sh fences."""
    out: list[str] = []
    block: list[str] = []
    fenced = False
    for line in [*text.splitlines(), ""]:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("    ") and (block or not out or out[-1] == ""):
            block.append(line[4:])
            continue
        if block:
            out += ["```sh", *block, "```"]
            block = []
        out.append(line)
    return "\n".join(out)


def examples_index() -> str:
    text = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(([\w-]+)\.py\)", r"](\1.md)", text)


def site_page(path: Path) -> str | None:
    """The page (relative to docs/) the site builds from a repository file, if any."""
    if path == EXAMPLES / "README.md":
        return "examples/index.md"
    if path.parent == EXAMPLES and path.suffix == ".py":
        return f"examples/{path.stem}.md"
    return None


def _named(nav: Any) -> Iterator[str]:
    """Every page path the nav names."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _named(value)
    elif isinstance(nav, list):
        for item in nav:
            yield from _named(item)


def add_new_guides(files: Files, config: MkDocsConfig) -> None:
    """Top-level docs pages missing from the nav, appended to its "Guides" section."""
    named = set(_named(config.nav))
    sections = [item for item in config.nav or [] if isinstance(item, dict)]
    guides = next((item["Guides"] for item in sections if "Guides" in item), None)
    if guides is None:
        return  # no such section: mkdocs reports the pages the nav leaves out
    for file in files.documentation_pages():
        if "/" in file.src_uri or file.src_uri in named or file.generated_by:
            continue
        heading = re.search(r"^# (.+)$", file.content_string, re.M)
        guides.append({heading.group(1) if heading else file.name: file.src_uri})


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    add_new_guides(files, config)
    pages = {
        "reference/cli.md": _load(ROOT / "scripts" / "cli_reference.py").render(),
        "reference/configuration.md": configuration_page(),
        "examples/index.md": examples_index(),
    }
    for script in sorted(EXAMPLES.glob("*.py")):
        pages[f"examples/{script.stem}.md"] = example_page(script)
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(
    markdown: str, page: Page, config: MkDocsConfig, files: Files, **_: Any
) -> str:
    """Links that leave docs/ for a repository file: a code path, or a link into the repo."""
    docs_dir = Path(config.docs_dir).resolve()
    page_dir = (docs_dir / page.file.src_uri).parent
    repo_url = (config.repo_url or "").rstrip("/")

    def replace(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^#", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = (page_dir / path).resolve()
        if resolved.is_relative_to(docs_dir) or not resolved.is_relative_to(ROOT):
            return match.group(0)
        if not resolved.exists():
            return match.group(0)  # mkdocs reports it: strict builds fail
        site = site_page(resolved)
        if site is not None:
            url = Path(os.path.relpath(docs_dir / site, page_dir)).as_posix()
            return f"[{text}]({url}{'#' + anchor if anchor else ''})"
        relative = resolved.relative_to(ROOT).as_posix() + ("/" if resolved.is_dir() else "")
        if repo_url:
            kind = "tree" if resolved.is_dir() else "blob"
            suffix = f"#{anchor}" if anchor else ""
            return f"[{text}]({repo_url}/{kind}/main/{relative}{suffix})"
        return text if text.strip("`") == relative.rstrip("/") else f"{text} (`{relative}`)"

    return LINK.sub(replace, markdown)


def on_page_content(html: str, **_: Any) -> str:
    """Docstrings end a paragraph before a code block with reST's ``::``: one colon on the site."""
    return re.sub(r"(\w)::</p>", r"\1:</p>", html)
