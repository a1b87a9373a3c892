"""The documentation stays inside the repository and stays true to it.

Every relative link in a tracked Markdown file must resolve to a file or directory of the
checkout (and, for a link into a Markdown file with ``#anchor``, to one of its headings): a clone
is all a reader has, so a link to a sibling checkout or a moved module is a dead end. For the
same reason no document, docstring or comment may explain itself by pointing at notes that live
outside the repository (design seeds, numbered issues, a design document in a shared folder):
the explanation belongs where the code is.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
"""``https:``, ``mailto:`` and any other scheme: not checked (no network in tests)."""

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")

OUTSIDE_REFERENCES = re.compile(
    r"\.\.[/]shared|DESIGN[.]md|\bseeds[/]|\bseed[ -]0\d\d\b|\bissue #?\d+\b",
    re.IGNORECASE,
)
"""Pointers to notes a clone does not have: the shared design folder and its seeds, a design
document, numbered issues. (Written so this file does not match itself.)"""

SITE_PAGES = {ROOT / "docs/reference/cli.md", ROOT / "docs/reference/configuration.md"}
"""Pages the docs site generates from the code at build time (scripts/docs_hooks.py): no file
in the checkout, so a link to one is checked by the site's strict build below instead."""

SCANNED_SUFFIXES = {".md", ".py", ".toml", ".ini", ".cfg", ".yaml", ".yml", ".sh", ".proto"}


def repository_files(*patterns: str) -> list[Path]:
    """Tracked files plus new ones not ignored yet (a file is documented before it is committed)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return sorted({ROOT / name for name in listed if (ROOT / name).is_file()})


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(markdown):
        match = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line[1])
        if match:
            anchor = github_anchor(match.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def prose_lines(markdown: Path) -> list[tuple[int, str]]:
    """(line number, text) outside fenced code blocks, inline code spans blanked out."""
    lines = []
    fenced = False
    for number, line in enumerate(markdown.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line)))
    return lines


def links(markdown: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(markdown):
        found += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
        found += [(number, m.group(1)) for m in REFERENCE_LINK.finditer(line)]
    return found


def broken(markdown: Path, link: str) -> str | None:
    """Why ``link`` (as written in ``markdown``) does not resolve, or None when it does."""
    if EXTERNAL.match(link):
        return None
    path, _, anchor = link.partition("#")
    target = (markdown.parent / path).resolve() if path else markdown
    if not target.is_relative_to(ROOT):
        return "points outside the repository"
    if target in SITE_PAGES:
        return None
    if not target.exists():
        return "no such file or directory"
    if anchor and target.suffix == ".md" and anchor.lower() not in anchors(target):
        return f"no heading with anchor #{anchor} in {target.relative_to(ROOT)}"
    return None


def test_markdown_links_resolve_inside_the_checkout() -> None:
    failures = []
    for markdown in repository_files("*.md"):
        for number, link in links(markdown):
            reason = broken(markdown, link)
            if reason:
                failures.append(f"{markdown.relative_to(ROOT)}:{number}: ({link}) {reason}")
    if failures:
        pytest.fail("broken links:\n  " + "\n  ".join(failures), pytrace=False)


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link or anchor, a page missing from the nav, a nav
    entry without a page, or an API reference to a name that no longer exists fails the build.
    The site also renders the CLI and configuration references and the examples from the code."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    problems = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems)
    for page in ("reference/cli", "reference/configuration", "reference/api/client", "examples"):
        assert (site / page / "index.html").is_file(), page
    cli = (site / "reference/cli/index.html").read_text(encoding="utf-8")
    assert 'id="allocator-request"' in cli  # the lazily loaded command is listed too
    config = (site / "reference/configuration/index.html").read_text(encoding="utf-8")
    assert 'id="trainconfig"' in config


def test_architecture_doc_is_linked_from_the_readme() -> None:
    readme = ROOT / "README.md"
    targets = {link.partition("#")[0] for _, link in links(readme)}
    assert "docs/architecture.md" in targets


def test_nothing_cites_notes_outside_the_repository() -> None:
    failures = []
    for path in repository_files():
        if path.suffix not in SCANNED_SUFFIXES and "Dockerfile" not in path.name:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            match = OUTSIDE_REFERENCES.search(line)
            if match:
                failures.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    if failures:
        pytest.fail(
            "explain the idea in place instead of citing notes outside the repository:\n  "
            + "\n  ".join(failures),
            pytrace=False,
        )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("see [ops](docs/operations.md#scaling-out).", ["docs/operations.md#scaling-out"]),
        (
            "[site](https://example.com) and [mail](mailto:a@b.c)",
            ["https://example.com", "mailto:a@b.c"],
        ),
        ("`[not](a-link)` but [this](README.md)", ["README.md"]),
        ('![plot](docs/x.png "title")', ["docs/x.png"]),
    ],
)
def test_link_parser(tmp_path: Path, line: str, expected: list[str]) -> None:
    markdown = tmp_path / "x.md"
    markdown.write_text(f"# Title\n\n{line}\n\n```\n[code](not/a/link)\n```\n", encoding="utf-8")
    assert [link for _, link in links(markdown)] == expected


def test_github_anchor() -> None:
    assert github_anchor("`allocator serve`: ServerConfig") == "allocator-serve-serverconfig"
    assert github_anchor("Scaling out") == "scaling-out"
