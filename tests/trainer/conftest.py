"""Fixtures shared by the trainer tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    # Tiny networks: thread start-up costs more than it saves, and CI machines are shared.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
