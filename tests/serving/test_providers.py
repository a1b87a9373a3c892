"""CUDA is asked of onnxruntime only where it can start: a CPU machine logs one plain line.

No GPU is assumed: the probe's verdict is checked against what onnxruntime itself does with the
same request, on whatever machine runs the test.
"""

from __future__ import annotations

import ctypes.util
import logging
from collections.abc import Iterator
from pathlib import Path

import onnxruntime as ort
import pytest

from allocator.serving import load_model
from allocator.serving import loader as loader_module
from tests.serving import Spec, policy_model, write_exported_model

SPEC = Spec(max_assets=2, window=3)


@pytest.fixture(autouse=True)
def fresh_probe() -> Iterator[None]:
    """The verdict is cached per process: each test asks anew, and leaves no verdict behind."""
    loader_module.cuda_usable.cache_clear()
    yield
    loader_module.cuda_usable.cache_clear()


def test_the_verdict_matches_what_onnxruntime_does() -> None:
    session = ort.InferenceSession(
        policy_model(SPEC).SerializeToString(), providers=[loader_module.CUDA, loader_module.CPU]
    )
    runs_on_cuda = session.get_providers()[0] == loader_module.CUDA
    assert loader_module.cuda_usable() == runs_on_cuda, loader_module.cuda_unavailable_reason()


def test_a_provider_library_that_cannot_load_means_cpu_in_one_plain_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "libonnxruntime_providers_cuda.so"
    broken.write_bytes(b"not a shared library")
    monkeypatch.setattr(loader_module, "cuda_provider_library", lambda: broken)
    monkeypatch.setattr(
        loader_module.ort,
        "get_available_providers",
        lambda: [loader_module.CUDA, loader_module.CPU],
    )
    asked: list[list[str]] = []
    real = ort.InferenceSession

    def session(
        data: bytes, options: ort.SessionOptions, providers: list[str]
    ) -> ort.InferenceSession:
        asked.append(list(providers))
        return real(data, options, providers=providers)

    monkeypatch.setattr(loader_module.ort, "InferenceSession", session)
    with caplog.at_level(logging.INFO, logger="allocator.serving"):
        for version in ("1", "2"):
            model = load_model(write_exported_model(tmp_path / "m" / version, SPEC, icm=True))
            assert model.provider == loader_module.CPU
    assert asked
    assert all(p == [loader_module.CPU] for p in asked)
    said = [r for r in caplog.records if "CUDA" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.INFO
    assert "cannot run here" in said[0].getMessage()


def test_a_build_without_cuda_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain onnxruntime wheel (CPU only) lists no CUDA provider at all."""
    monkeypatch.setattr(loader_module.ort, "get_available_providers", lambda: [loader_module.CPU])
    assert loader_module.cuda_unavailable_reason() == "this onnxruntime build has no CUDA provider"
    assert loader_module.cuda_usable() is False


def test_no_driver_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A CUDA library stack without a driver (a container without the GPU runtime)."""
    monkeypatch.setattr(
        loader_module.ort,
        "get_available_providers",
        lambda: [loader_module.CUDA, loader_module.CPU],
    )
    monkeypatch.setattr(loader_module, "cuda_provider_library", lambda: Path(ctypes_loadable()))
    monkeypatch.setattr(loader_module, "CUDA_DRIVER", str(tmp_path / "libcuda.so.1"))
    reason = loader_module.cuda_unavailable_reason()
    assert reason is not None
    assert "no NVIDIA driver" in reason


def ctypes_loadable() -> str:
    """A shared library every Linux process can load (libc), standing in for the provider."""
    name = ctypes.util.find_library("c")
    if name is None:
        pytest.skip("no libc found to stand in for a loadable library")
    return name
