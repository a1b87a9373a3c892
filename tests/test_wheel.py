"""The built wheel, installed into a new virtualenv outside the checkout, with no checkout on the
path: ``allocator db upgrade`` (SQLite and Postgres), ``allocator serve`` and
``allocator request`` work, and a CPU machine's server log carries no error line.

Installing every dependency from the index takes minutes, so the new virtualenv borrows them:
a ``.pth`` line names a directory of links to this environment's installed packages, the
editable ``allocator`` install left out (a ``.pth`` line only adds a directory to ``sys.path``;
the ``.pth`` files inside it are not run). Only the wheel itself is installed there, and the test
checks that ``allocator`` is imported from it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
import pytest
from alembic.script import ScriptDirectory

from allocator.recording.migrations import alembic_config
from tests.postgres import temporary_database
from tests.serving.conftest import write_tiny_model
from tests.serving.load import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
OWN_INSTALL = ("allocator", "__editable__")
"""Entries of this environment's site-packages that are the checkout's own (editable) install."""


@dataclass(frozen=True)
class Installation:
    """A virtualenv holding the wheel, and the environment to run its commands in."""

    root: Path
    env: dict[str, str]
    workdir: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def allocator(self) -> Path:
        return self.root / "bin" / "allocator"

    def run(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``allocator ARGS`` from the new virtualenv, run outside the checkout."""
        return subprocess.run(
            [str(self.allocator), *map(str, args)],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def build_wheel(out: Path) -> Path:
    """``pip wheel`` of a copy of the sources (the build leaves nothing in the checkout)."""
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignore)
    wheels = out / "wheels"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--no-index", "--wheel-dir", str(wheels), str(source)),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("allocator-*.whl")
    return wheel


def borrowed_dependencies(directory: Path) -> Path:
    """Links to every installed package of this environment except the checkout's own."""
    directory.mkdir()
    site_dirs = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    for site in site_dirs:
        for entry in site.iterdir():
            if entry.name.startswith(OWN_INSTALL) or entry.suffix == ".pth":
                continue
            if not (directory / entry.name).exists():
                (directory / entry.name).symlink_to(entry)
    return directory


def clean_env() -> dict[str, str]:
    """This process's environment without anything that points Python or the CLI elsewhere."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DATABASE_URL", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in dropped}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel-build"))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installation:
    base = tmp_path_factory.mktemp("wheel-venv")
    root = base / "venv"
    venv.create(root, with_pip=False, symlinks=True)
    site = subprocess.run(
        [
            str(root / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = borrowed_dependencies(base / "dependencies")
    (Path(site) / "borrowed_dependencies.pth").write_text(f"{deps}\n")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install"),
            *("--quiet", "--no-deps", "--no-index", str(wheel)),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    workdir = base / "work"
    workdir.mkdir()
    return Installation(root=root, env=clean_env(), workdir=workdir)


def head_revision() -> str:
    (head,) = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    return head


def test_the_wheel_carries_the_migrations(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "allocator/migrations/env.py" in names
    assert "allocator/migrations/script.py.mako" in names
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("allocator/migrations/versions/")}
    in_checkout = {p.name for p in (ROOT / "src/allocator/migrations/versions").glob("*.py")}
    assert shipped == in_checkout


def test_allocator_is_imported_from_the_wheel_not_the_checkout(installed: Installation) -> None:
    probe = (
        "import json, sys, allocator; "
        "print(json.dumps({'file': allocator.__file__, 'path': sys.path}))"
    )
    result = subprocess.run(
        [str(installed.python), "-c", probe],
        cwd=installed.workdir,
        env=installed.env,
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(result.stdout)
    assert Path(seen["file"]).is_relative_to(installed.root), seen["file"]
    assert not any(Path(p).resolve().is_relative_to(ROOT) for p in seen["path"] if p), seen["path"]


def test_db_upgrade_on_sqlite(installed: Installation, tmp_path: Path) -> None:
    database = tmp_path / "trades.db"
    result = installed.run("db", "upgrade", "--database-url", f"sqlite:///{database}")
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(database) as db:
        (version,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert version == head_revision()
    assert {"decisions", "model_versions"} <= tables


def test_db_upgrade_on_postgres(installed: Installation) -> None:
    with temporary_database("allocator_wheel") as url:
        result = installed.run("db", "upgrade", "--database-url", url)
        assert result.returncode == 0, result.stderr
        plain = url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(plain) as db:
            (version,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
            (decisions,) = db.execute("SELECT to_regclass('public.decisions')").fetchone()
    assert version == head_revision()
    assert decisions == "decisions"


def test_serve_and_request(installed: Installation, tmp_path: Path) -> None:
    """The wheel's server answers the wheel's client, records the decision, and a CPU machine
    logs no error line on the way (no red onnxruntime errors about CUDA libraries)."""
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    database = tmp_path / "trades.db"
    url = f"sqlite:///{database}"
    assert installed.run("db", "upgrade", "--database-url", url).returncode == 0
    server = ServeProcess(
        [
            *("--registry", str(registry), "--metrics-port", "0", "--database-url", url),
            *("--spool-dir", str(tmp_path / "spool"), "--reload-interval", "60"),
        ],
        cwd=installed.workdir,
        program=[str(installed.allocator)],
        env=installed.env,
    )
    try:
        target = server.wait_ready()
        result = installed.run(
            "request", "--target", target, "--portfolio", "wheel-1", "--synthetic", "3", "--json"
        )
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        server.terminate()
        assert server.wait(30) == 0, server.stderr
    finally:
        server.kill()
    assert answer["model_version"] == "1"
    assert len(answer["smoothed_weights"]) == 4  # cash and the three assets
    assert np.isclose(sum(answer["smoothed_weights"]), 1.0)
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT portfolio_id FROM decisions").fetchall()
    assert rows == [("wheel-1",)]
    # onnxruntime's own log lines look like "[E:onnxruntime:...]"; the server's like " ERROR ".
    marks = ("[E:", "[W:", " ERROR ", " WARNING ", "Traceback")
    assert not [line for line in server.lines if any(m in line for m in marks)], server.stderr
    assert len([line for line in server.lines if "CUDA" in line]) <= 1, server.stderr


def isolated(root: Path, requirement: str) -> Installation:
    """A virtualenv with pip, ``requirement`` installed from the index against the lock."""
    venv.create(root, with_pip=True, symlinks=True)
    subprocess.run(
        [
            *(str(root / "bin" / "python"), "-m", "pip", "install", "--quiet"),
            *("--constraint", str(ROOT / "requirements.lock"), requirement),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    workdir = root.parent / f"{root.name}-work"
    workdir.mkdir()
    return Installation(root=root, env=clean_env(), workdir=workdir)


@pytest.mark.slow
def test_serve_and_client_extras_alone_are_enough(wheel: Path, tmp_path: Path) -> None:
    """Nothing borrowed: `[serve]` alone migrates and serves, `[client]` alone asks it, and the
    client's environment has neither onnxruntime nor SQLAlchemy."""
    server_side = isolated(tmp_path / "serve", f"{wheel}[serve]")
    client_side = isolated(tmp_path / "client", f"{wheel}[client]")
    missing = subprocess.run(
        [str(client_side.python), "-c", "import onnxruntime"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode != 0
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    url = f"sqlite:///{tmp_path / 'trades.db'}"
    upgraded = server_side.run("db", "upgrade", "--database-url", url)
    assert upgraded.returncode == 0, upgraded.stderr
    server = ServeProcess(
        [*("--registry", str(registry), "--metrics-port", "0", "--database-url", url)],
        cwd=server_side.workdir,
        program=[str(server_side.allocator)],
        env=server_side.env,
    )
    try:
        target = server.wait_ready()
        result = client_side.run(
            "request", "--target", target, "--portfolio", "alone-1", "--synthetic", "2", "--json"
        )
        assert result.returncode == 0, result.stderr
        server.terminate()
        assert server.wait(30) == 0, server.stderr
    finally:
        server.kill()
    assert np.isclose(sum(json.loads(result.stdout)["smoothed_weights"]), 1.0)
