"""House rule: ``allocator.serving`` never imports torch (even transitively) and never unpickles.

The server is installed with the ``serve`` extra only (no torch); a stray import would crash it
at start-up, and unpickling a file from the registry would run arbitrary code.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.serving import Spec, write_exported_model

SERVING = Path(__file__).resolve().parents[2] / "src" / "allocator" / "serving"

BLOCKED = ("torch", "stable_baselines3", "allocator.trainer", "onnx")
"""Must fail to import in the server: trainer imports torch; `serve` installs no onnx."""

FORBIDDEN_MODULES = {"torch", "stable_baselines3", "pickle", "_pickle", "cloudpickle", "dill"}
FORBIDDEN_MODULES |= {"joblib", "allocator.trainer", "onnx"}
"""``onnx`` too: the serve extra installs onnxruntime only."""

ALLOWED_ALLOCATOR = (
    "allocator.artifacts",
    "allocator.typed_config",
    "allocator.portfolio",
    "allocator.registry",
    "allocator.serving",
    "allocator.recording",
    "allocator.metrics",
)

CHILD = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = {blocked!r}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"house rule: serving must not import {{name}}")
            return None

    sys.meta_path.insert(0, Blocker())

    import numpy as np

    import allocator.serving
    import allocator.serving.loader
    from allocator.serving import load_model

    model = load_model({directory!r})
    obs = np.zeros((2, model.obs_dim), np.float32)
    mask = np.ones((2, model.n_slots), np.float32)
    action, weights = model.run(obs, mask)
    assert weights.shape == (2, model.n_slots), weights.shape
    model.intrinsic_reward(obs, action, obs, mask)
    leaked = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    assert "torch" not in sys.modules
    print("OK", model.provider)
    """
)


def test_serving_loads_a_model_with_torch_blocked(tmp_path: Path) -> None:
    d = write_exported_model(tmp_path / "registry" / "alpha" / "1", Spec(), icm=True)
    code = CHILD.format(blocked=BLOCKED, directory=str(d))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK ")


SHARED_CHILD = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = {blocked!r}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"house rule: serving must not import {{name}}")
            return None

    sys.meta_path.insert(0, Blocker())

    import numpy as np

    from allocator.serving import load_model
    from allocator.serving.decision import decide_many
    from allocator.serving.proto.v1 import allocator_pb2 as pb
    from allocator.serving.step import model_shape
    from allocator.serving.validation import validate_call

    model = load_model({directory!r}, prefer_cuda=False)
    n = 12
    prices = np.exp(np.cumsum(np.full((n, model.prices_per_asset), 0.01), axis=1))
    request = pb.AllocateRequest(
        portfolio_id="p", request_id="r", asset_ids=[f"A{{i}}" for i in range(n)],
        prices=prices.ravel().tolist(),
    )
    valid = validate_call(request, lambda name, version: model_shape(model))
    out = decide_many(model, [valid], [None]).outputs[0]
    assert out.raw_weights.shape == (n + 1,), out.raw_weights.shape
    leaked = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    print("OK", model.provider)
    """
)


def test_serving_decides_for_a_shared_policy_with_torch_blocked(tmp_path: Path) -> None:
    """The anchor, the tilt and the features of a shared policy are numpy: no torch either."""
    from tests.serving.shared_models import build_fixture, write_shared_model  # needs torch

    d = write_shared_model(tmp_path / "registry" / "shared" / "1", build_fixture())
    code = SHARED_CHILD.format(blocked=BLOCKED, directory=str(d))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK ")


def _sources() -> list[Path]:
    files = sorted(SERVING.rglob("*.py"))
    assert files, f"no sources under {SERVING}"
    return files


def test_no_torch_or_pickle_in_serving_sources() -> None:
    """Static scan: the text (for torch.load) and the AST (every import, every name)."""
    text_patterns = re.compile(r"^\s*(import torch|from torch)|torch\.load|pickle\.load", re.M)
    problems: list[str] = []
    for path in _sources():
        source = path.read_text()
        problems.extend(f"{path}: {m.group(0).strip()}" for m in text_patterns.finditer(source))
        for node in ast.walk(ast.parse(source, filename=str(path))):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            elif isinstance(node, ast.Name) and node.id in {"pickle", "torch"}:
                problems.append(f"{path}:{node.lineno}: uses name {node.id}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
                problems.append(f"{path}:{node.lineno}: dynamic __import__")
            for module in modules:
                root_match = any(
                    module == f or module.startswith(f + ".") for f in FORBIDDEN_MODULES
                )
                if root_match:
                    problems.append(f"{path}:{node.lineno}: imports {module}")
                elif module.startswith("allocator") and not module.startswith(ALLOWED_ALLOCATOR):
                    problems.append(f"{path}:{node.lineno}: imports {module} (not torch-free)")
    assert not problems, "\n".join(problems)


def test_allowed_allocator_modules_are_torch_free_too() -> None:
    """What serving imports from allocator must itself import no torch or pickle."""
    src = SERVING.parent
    packages = ("artifacts", "portfolio", "registry", "recording", "metrics")
    deps = [src / "typed_config.py", *sorted(p for d in packages for p in (src / d).rglob("*.py"))]
    problems: list[str] = []
    for path in deps:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            problems.extend(
                f"{path}:{node.lineno}: imports {n}"
                for n in names
                if n.split(".")[0] in {"torch", "stable_baselines3", "pickle", "dill", "joblib"}
                or n.startswith("allocator.trainer")
            )
    assert not problems, "\n".join(problems)
