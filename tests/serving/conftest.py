"""Shared serving fixtures: one tiny exported model per session, and a real Redis.

The model is built with ``onnx.helper`` (``tests.serving``) so no training is needed. Its ICM
graph depends on every one of its inputs, so a test can tell which observation and which action
the server fed it: ``reward = 0.5 * ||obs - previous||^2 + action . ICM_ACTION_COEF``.

Redis is required, not optional (as Postgres is for the trade schema): ``ALLOCATOR_TEST_REDIS``
or ``redis://127.0.0.1:6379/0``. Each test gets its own random key prefix, deleted afterwards.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from numpy.typing import ArrayLike
from onnx import TensorProto, helper, numpy_helper

from allocator.artifacts.manifest import checksums, write_manifest
from allocator.recording.migrations import upgrade
from allocator.serving import LoadedModel, load_model
from allocator.serving.decision import DecisionOutput, decide_many
from allocator.serving.idempotency import request_fingerprints
from allocator.serving.portfolio_state import PortfolioState
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from allocator.serving.step import Item, model_shape
from allocator.serving.validation import ValidRequest
from tests.serving import IR_VERSION, OPSET, Spec, make_manifest, policy_model
from tests.serving.requests import validate_one

TINY = Spec(max_assets=4, window=5)
REDIS_URL = os.environ.get("ALLOCATOR_TEST_REDIS", "redis://127.0.0.1:6379/0")


def icm_action_coef(spec: Spec) -> np.ndarray:
    return np.linspace(0.5, 2.0, spec.n_slots, dtype=np.float32)


def reference_icm(
    previous: np.ndarray, action: np.ndarray, observation: np.ndarray, spec: Spec
) -> float:
    """What the test ICM graph computes, in float64."""
    d = observation.astype(np.float64) - previous.astype(np.float64)
    return float(0.5 * d @ d + action.astype(np.float64) @ icm_action_coef(spec))


def action_icm_model(spec: Spec) -> onnx.ModelProto:
    """``0.5 * sum((observation - previous)^2) + sum(action * coef)``; the mask is read, unused."""

    def io(name: str, width: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])

    nodes = [
        helper.make_node("Sub", ["observation", "previous_observation"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
        helper.make_node("Mul", ["s", "half"], ["r0"]),
        helper.make_node("Mul", ["action", "coef"], ["ac"]),
        helper.make_node("ReduceSum", ["ac", "axes"], ["r1"], keepdims=1),
        helper.make_node("Mul", ["mask", "zero"], ["m0"]),
        helper.make_node("ReduceSum", ["m0", "axes"], ["r2"], keepdims=1),
        helper.make_node("Add", ["r0", "r1"], ["r01"]),
        helper.make_node("Add", ["r01", "r2"], ["intrinsic_reward"]),
    ]
    graph = helper.make_graph(
        nodes,
        "icm",
        [
            io("previous_observation", spec.obs_dim),
            io("action", spec.n_slots),
            io("observation", spec.obs_dim),
            io("mask", spec.n_slots),
        ],
        [io("intrinsic_reward", 1)],
        initializer=[
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
            numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
            numpy_helper.from_array(icm_action_coef(spec), "coef"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    return model


def write_tiny_model(directory: Path, spec: Spec = TINY, *, icm: bool = True) -> Path:
    """An exported-model directory: the test policy, optionally the action-reading ICM."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.onnx").write_bytes(policy_model(spec).SerializeToString())
    names = ["model.onnx"]
    if icm:
        (directory / "icm.onnx").write_bytes(action_icm_model(spec).SerializeToString())
        names.append("icm.onnx")
    write_manifest(directory, make_manifest(spec, checksums(directory, names), icm=icm))
    return directory


@pytest.fixture(scope="session")
def tiny_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny/1`` (with ICM) and ``plain/1`` (without), written once per session."""
    root = tmp_path_factory.mktemp("serving-registry")
    write_tiny_model(root / "tiny" / "1")
    write_tiny_model(root / "plain" / "1", icm=False)
    return root


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_registry: Path) -> Path:
    return tiny_registry / "tiny" / "1"


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> LoadedModel:
    return load_model(tiny_model_dir, prefer_cuda=False)


@pytest.fixture(scope="session")
def plain_model(tiny_registry: Path) -> LoadedModel:
    return load_model(tiny_registry / "plain" / "1", prefer_cuda=False)


def allocate_request(
    asset_ids: Sequence[str],
    prices: ArrayLike,
    current_weights: ArrayLike | None = None,
    *,
    portfolio_id: str = "p",
    request_id: str = "r",
) -> pb.AllocateRequest:
    """The wire message a client sends for these arrays (prices row per asset, cash first)."""
    request = pb.AllocateRequest(
        portfolio_id=portfolio_id,
        request_id=request_id,
        asset_ids=list(asset_ids),
        prices=np.asarray(prices).ravel().tolist(),
    )
    if current_weights is not None:
        request.current_weights.extend(np.asarray(current_weights).ravel().tolist())
    return request


def request_for(
    model: LoadedModel,
    asset_ids: Sequence[str],
    prices: ArrayLike,
    current_weights: ArrayLike | None = None,
    *,
    portfolio_id: str = "p",
    request_id: str = "r",
) -> ValidRequest:
    """A request for ``model`` as the decision step receives it: validated at the edge."""
    message = allocate_request(
        asset_ids, prices, current_weights, portfolio_id=portfolio_id, request_id=request_id
    )
    return validate_one(message, model_shape(model))


def items_for(model: LoadedModel, requests: Sequence[ValidRequest]) -> list[Item]:
    """Requests of one model as the batcher hands them to ``DecisionStep.run``."""
    started = time.perf_counter()
    fingerprints = request_fingerprints(requests)
    return [Item(model, r, f, started) for r, f in zip(requests, fingerprints, strict=True)]


def decide_one(
    model: LoadedModel, request: ValidRequest, state: PortfolioState | None
) -> tuple[DecisionOutput, PortfolioState]:
    """One portfolio's decision through the batch path the server runs."""
    decided = decide_many(model, (request,), (state,))
    return decided.outputs[0], decided.states[0]


def delete_prefixed(client: object, *prefixes: str) -> None:
    """Delete every key under the given prefixes (test clean-up)."""
    for prefix in prefixes:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))  # type: ignore[attr-defined]
        if keys:
            client.delete(*keys)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(
            f"Redis is not reachable at {REDIS_URL} ({exc}). The state-store tests need it: "
            "start redis-server on 127.0.0.1:6379 or set ALLOCATOR_TEST_REDIS.",
            pytrace=False,
        )
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def portfolio_tag(request: pytest.FixtureRequest) -> Iterator[str]:
    """A random prefix for one test's portfolio ids; a test parametrized with ``workers`` > 1
    keeps their state in Redis, whose state and lock keys are deleted afterwards."""
    tag = f"t{secrets.token_hex(4)}"
    yield tag
    if request.node.callspec.params.get("workers", 1) > 1:
        import redis

        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        try:
            delete_prefixed(client, f"allocator:state:{tag}", f"lock:allocator:state:{tag}")
        finally:
            client.close()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A random key prefix for one test; its state and lock keys are deleted afterwards."""
    import redis

    prefix = f"allocator-test:{secrets.token_hex(6)}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed(client, prefix, "lock:" + prefix)
    finally:
        client.close()


def start_sqlite_server(
    registry: Path, tmp: Path, model: str, redis_url: str | None = None
) -> AllocationServer:
    """A real server on a free port, recording to a migrated SQLite file under ``tmp``."""
    url = f"sqlite:///{tmp / 'trades.db'}"
    upgrade(url)
    config = ServerConfig(
        registry=registry,
        port=0,
        metrics_port=None,
        database_url=url,
        spool_dir=tmp / "spool",
        prefer_cuda=False,
        default_model=model,
        redis_url=redis_url,
        reload_interval=60.0,
        grace_seconds=2.0,
    )
    return build_server(config).start()
