"""Fixtures shared by the trainer tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.mlflow_server import mlflow_server


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    # Tiny networks: thread start-up costs more than it saves, and CI machines are shared.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real MLflow tracking server for every test that tracks (its start costs seconds)."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url
