"""The allocation server in process, over real gRPC: bad input, fuzzing, auth, TLS, deadlines,
the concurrency limit, idempotency, recording and metrics.

Servers are built by ``build_server`` on port 0 with the tiny exported models of
``tests.serving.conftest`` (``tiny/1`` with an ICM, ``plain/1`` without) and record into a
migrated SQLite file, so every answer has been through the real validation, decision, state
store and recorder. Nothing is mocked; waits poll for an event with a generous bound and no
test asserts a duration.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from allocator.portfolio import renormalize
from allocator.recording.migrations import upgrade
from allocator.serving.client import AllocatorClient, AllocatorError
from allocator.serving.proto import SERVICE_NAME
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from tests.serving.certs import Pki, have_openssl, make_pki
from tests.serving.conftest import TINY

WINDOW = TINY.window
PER_ASSET = WINDOW + 1
MAX_ASSETS = TINY.max_assets
BETA = 0.5  # tests.serving.make_manifest's
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
WAIT = 20.0  # upper bound of a poll for something that happens in milliseconds


# --- helpers -------------------------------------------------------------------------------------


def price_window(n: int, seed: int = 0) -> np.ndarray:
    """``(n, window + 1)`` positive closes, a random walk per asset."""
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(rng.normal(0.0, 0.02, (n, PER_ASSET)).cumsum(axis=1))


def make_request(
    portfolio_id: str = "p",
    assets: tuple[str, ...] = ("A", "B", "C"),
    *,
    prices: Any = None,
    current: Any = None,
    request_id: str | None = None,
    model: str | None = None,
    version: str | None = None,
    seed: int = 0,
) -> pb.AllocateRequest:
    p = price_window(len(assets), seed) if prices is None else np.asarray(prices, dtype=float)
    message = pb.AllocateRequest(
        portfolio_id=portfolio_id,
        request_id=request_id or uuid.uuid4().hex,
        asset_ids=list(assets),
        prices=p.ravel().tolist(),
    )
    if current is not None:
        message.current_weights.extend(np.asarray(current, dtype=float).tolist())
    if model is not None or version is not None:
        message.model.name = model or ""
        message.model.version = version or ""
    return message


def sqlite_url(directory: Path) -> str:
    url = f"sqlite:///{directory / 'trades.db'}"
    upgrade(url)
    return url


def start_server(tmp: Path, registry: Path, **overrides: Any) -> AllocationServer:
    """A started server on free ports; SQLite recording unless ``record``/``database_url``."""
    tmp.mkdir(parents=True, exist_ok=True)
    settings_: dict[str, Any] = {
        "registry": registry,
        "port": 0,
        "metrics_port": None,
        "spool_dir": tmp / "spool",
        "prefer_cuda": False,
        "default_model": "tiny",
        "grace_seconds": 2.0,
        "reload_interval": 60.0,
    }
    settings_.update(overrides)
    if settings_.get("record", True) and "database_url" not in settings_:
        settings_["database_url"] = sqlite_url(tmp)
    return build_server(ServerConfig(**settings_)).start()


@dataclass
class Conn:
    """A server with a plaintext channel and raw stubs to it."""

    server: AllocationServer
    channel: grpc.Channel
    stub: pb_grpc.AllocatorStub
    health: health_pb2_grpc.HealthStub

    def call(self, method: str, request: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str, Any]:
        """(code, details, response or None) of one unary call."""
        kwargs.setdefault("timeout", 10.0)
        try:
            return OK, "", getattr(self.stub, method)(request, **kwargs)
        except grpc.RpcError as error:
            return error.code(), error.details() or "", None

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        code, details, response = self.call("Allocate", request)
        assert code is OK, f"{code.name}: {details}"
        return response

    def health_status(self, service: str = "") -> str:
        reply = self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10.0)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def serving(self) -> bool:
        return self.health_status("") == self.health_status(SERVICE_NAME) == "SERVING"

    def state(self, portfolio_id: str) -> Any:
        """The portfolio's stored state (None: never decided, or reset)."""
        with self.server.store.locked([portfolio_id]) as session:
            return session.get()[0]

    def counter(self, name: str, **labels: str) -> float:
        value = self.server.metrics_registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def connect(server: AllocationServer) -> Conn:
    channel = grpc.insecure_channel(server.target)
    return Conn(
        server, channel, pb_grpc.AllocatorStub(channel), health_pb2_grpc.HealthStub(channel)
    )


@pytest.fixture(scope="module")
def shared(tiny_registry: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Conn]:
    """One recording server for the tests that do not need a configuration of their own."""
    server = start_server(tmp_path_factory.mktemp("shared-server"), tiny_registry, metrics_port=0)
    conn = connect(server)
    yield conn
    conn.channel.close()
    server.stop()


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


def weights(response: pb.AllocateResponse, which: str = "smoothed") -> np.ndarray:
    return np.asarray(getattr(response, f"{which}_weights"), dtype=np.float64)


# --- 1. the bad-input suite ----------------------------------------------------------------------


def _bad(**kwargs: Any) -> pb.AllocateRequest:
    return make_request(portfolio_id=f"bad-{uuid.uuid4().hex[:8]}", **kwargs)


def _with_price(i: int, value: float) -> Callable[[], pb.AllocateRequest]:
    def build() -> pb.AllocateRequest:
        p = price_window(3)
        p.flat[i] = value
        return _bad(prices=p)

    return build


def _batch(*items: pb.AllocateRequest) -> pb.AllocateBatchRequest:
    return pb.AllocateBatchRequest(requests=list(items))


# (name, method, request builder, code, field the details must start with)
BAD_INPUT: list[tuple[str, str, Callable[[], Any], grpc.StatusCode, str]] = [
    ("nan-price", "Allocate", _with_price(4, math.nan), INVALID, "prices"),
    ("inf-price", "Allocate", _with_price(7, math.inf), INVALID, "prices"),
    ("minus-inf-price", "Allocate", _with_price(0, -math.inf), INVALID, "prices"),
    ("zero-price", "Allocate", _with_price(17, 0.0), INVALID, "prices"),
    ("negative-price", "Allocate", _with_price(9, -3.0), INVALID, "prices"),
    ("window-too-short", "Allocate",
     lambda: _bad(prices=price_window(3)[:, 1:]), INVALID, "prices"),
    ("window-too-long", "Allocate",
     lambda: _bad(prices=np.hstack([price_window(3), price_window(3)[:, :1]])), INVALID, "prices"),
    ("no-prices", "Allocate", lambda: _bad(prices=np.empty((3, 0))), INVALID, "prices"),
    ("too-many-assets", "Allocate",
     lambda: _bad(assets=tuple("ABCDE")), INVALID, "asset_ids"),
    ("duplicate-asset", "Allocate",
     lambda: _bad(assets=("A", "B", "A")), INVALID, "asset_ids[2]"),
    ("no-assets", "Allocate",
     lambda: _bad(assets=(), prices=np.empty((0, PER_ASSET))), INVALID, "asset_ids"),
    ("empty-asset-id", "Allocate", lambda: _bad(assets=("A", "", "C")), INVALID, "asset_ids[1]"),
    ("cash-as-asset", "Allocate", lambda: _bad(assets=("CASH", "B")), INVALID, "asset_ids[0]"),
    ("weights-sum-not-one", "Allocate",
     lambda: _bad(current=[0.5, 0.2, 0.2, 0.2]), INVALID, "current_weights"),
    ("negative-weight", "Allocate",
     lambda: _bad(current=[0.5, -0.1, 0.3, 0.3]), INVALID, "current_weights"),
    ("nan-weight", "Allocate",
     lambda: _bad(current=[0.5, math.nan, 0.25, 0.25]), INVALID, "current_weights"),
    ("inf-weight", "Allocate",
     lambda: _bad(current=[math.inf, 0.0, 0.0, 0.0]), INVALID, "current_weights"),
    ("weights-wrong-length", "Allocate",
     lambda: _bad(current=[0.5, 0.5]), INVALID, "current_weights"),
    ("weights-without-cash", "Allocate",
     lambda: _bad(current=[0.2, 0.3, 0.5]), INVALID, "current_weights"),
    ("empty-request", "Allocate", lambda: pb.AllocateRequest(), INVALID, "request"),
    ("no-portfolio-id", "Allocate", lambda: make_request(portfolio_id=""), INVALID, "portfolio_id"),
    ("no-request-id", "Allocate",
     lambda: pb.AllocateRequest(portfolio_id="x", asset_ids=["A"],
                                prices=price_window(1).ravel().tolist()),
     INVALID, "request_id"),
    ("nul-in-portfolio-id", "Allocate",
     lambda: make_request(portfolio_id="a\x00b"), INVALID, "portfolio_id"),
    ("id-too-long", "Allocate", lambda: make_request(portfolio_id="x" * 201), INVALID,
     "portfolio_id"),
    ("unknown-model", "Allocate", lambda: _bad(model="ghost"), NOT_FOUND, "model"),
    ("unknown-version", "Allocate", lambda: _bad(model="tiny", version="9"), NOT_FOUND, "model"),
    ("unknown-version-of-default", "Allocate", lambda: _bad(version="9"), NOT_FOUND, "model"),
    ("empty-batch", "AllocateBatch", lambda: pb.AllocateBatchRequest(), INVALID, "requests"),
    ("batch-bad-prices", "AllocateBatch",
     lambda: _batch(_bad(), _with_price(3, math.nan)()), INVALID, "requests[1].prices"),
    ("batch-bad-weights", "AllocateBatch",
     lambda: _batch(_bad(current=[1.0, 0.0, 0.0, 0.1]), _bad()),
     INVALID, "requests[0].current_weights"),
    ("batch-too-many-assets", "AllocateBatch",
     lambda: _batch(_bad(), _bad(), _bad(assets=tuple("VWXYZ"))), INVALID, "requests[2].asset_ids"),
    ("batch-empty-item", "AllocateBatch",
     lambda: _batch(_bad(), pb.AllocateRequest()), INVALID, "requests[1].request"),
    ("batch-portfolio-twice", "AllocateBatch",
     lambda: _batch(make_request("twice"), make_request("twice")), INVALID,
     "requests[1].portfolio_id"),
    ("batch-request-id-twice", "AllocateBatch",
     lambda: _batch(_bad(request_id="same"), _bad(request_id="same")), INVALID,
     "requests[1].request_id"),
    ("batch-unknown-model", "AllocateBatch",
     lambda: _batch(_bad(), _bad(model="ghost")), NOT_FOUND, "requests[1].model"),
    ("reset-no-portfolio", "ResetPortfolio", lambda: pb.ResetPortfolioRequest(), INVALID,
     "portfolio_id"),
]  # fmt: skip


def _portfolios(request: Any) -> list[str]:
    if isinstance(request, pb.AllocateBatchRequest):
        return [r.portfolio_id for r in request.requests if r.portfolio_id]
    return [request.portfolio_id] if getattr(request, "portfolio_id", "") else []


@pytest.mark.parametrize(
    ("method", "build", "code", "field"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUT],
)
def test_bad_input_is_refused_naming_the_field(
    shared: Conn, method: str, build: Callable[[], Any], code: grpc.StatusCode, field: str
) -> None:
    request = build()
    got, details, _ = shared.call(method, request)
    assert got is code, details
    assert details.startswith(f"{field}: "), details
    if code is NOT_FOUND:  # an unknown pin also says what is loaded
        assert "ghost" in details or "'9'" in details, details
        assert "loaded: plain, tiny" in details or "loaded: 1" in details, details
    # Refused whole: no portfolio of the request advanced, the server is still serving.
    assert all(shared.state(pid) is None for pid in _portfolios(request))
    assert shared.serving()


def test_server_answers_after_the_bad_input_suite(shared: Conn) -> None:
    for _, method, build, _, _ in BAD_INPUT:
        shared.call(method, build())
    assert shared.serving()
    response = shared.allocate(make_request("after-bad-input"))
    assert tuple(response.asset_ids) == ("CASH", "A", "B", "C")
    assert weights(response).sum() == pytest.approx(1.0, abs=1e-12)
    assert (
        shared.counter(
            "allocator_serving_requests_total", grpc_method="Allocate", grpc_code="INTERNAL"
        )
        == 0.0
    )


# --- 2. generated requests -----------------------------------------------------------------------

# Every field is drawn from a valid strategy most of the time and from garbage otherwise, so
# about half the requests are decided (smoothing, slot changes and the ICM get exercised) and the
# rest probe the validation one broken field at a time, or several.
# Portfolio ids all start "fz" (but the empty one), so no other test's portfolio is touched.
_GOOD_ID = st.sampled_from(["fz1", "fz2", "fz3", "fz4", "fz5"])
_BAD_ID = st.one_of(
    st.sampled_from(["", "fz" + "x" * 198, "fz" + "x" * 199, "fz\x00", "fzü€☃"]),
    st.text(max_size=6).map(lambda s: "fz" + s),
)
_REQUEST_IDS = itertools.count()
_BAD_REQUEST_ID = st.sampled_from(["fz-r1", "fz-r2", "", "\x00", "r" * 201])
_GOOD_ASSETS = st.lists(st.sampled_from("ABCDE"), min_size=1, max_size=MAX_ASSETS, unique=True)
_BAD_ASSETS = st.lists(
    st.one_of(
        st.sampled_from(["A", "B", "C", "D", "E", "", "CASH", "\x00", "y" * 201]),
        st.text(max_size=3),
    ),
    max_size=MAX_ASSETS + 2,
)
_GOOD_PRICE = st.one_of(
    st.floats(min_value=1.0, max_value=1000.0),
    st.floats(min_value=5e-324, max_value=1.7e308, allow_subnormal=True),  # extreme, but valid
)
_ANY_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, -1.0, 1.0, 5e-324, 1.7976931348623157e308, math.nan, math.inf]),
)
_GOOD_PIN = st.sampled_from([None, ("tiny", ""), ("plain", ""), ("tiny", "1"), ("", "1")])
_BAD_PIN = st.tuples(
    st.sampled_from(["", "tiny", "plain", "ghost", "\x00"]),
    st.sampled_from(["2", "v" * 101, "\x00", "1"]),
)


def _mostly(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    return draw(bad) if draw(st.integers(0, 6)) == 0 else draw(good)


def _distribution(w: list[float]) -> list[float]:
    total = sum(w)
    return [1.0 / len(w)] * len(w) if total == 0 else [x / total for x in w]


@st.composite
def _requests(draw: st.DrawFn) -> pb.AllocateRequest:
    assets = _mostly(draw, _GOOD_ASSETS, _BAD_ASSETS)
    size = len(assets) * PER_ASSET
    prices = _mostly(
        draw,
        st.lists(_GOOD_PRICE, min_size=size, max_size=size),
        st.one_of(
            st.lists(_ANY_FLOAT, min_size=size, max_size=size),
            st.lists(_ANY_FLOAT, max_size=3 * PER_ASSET),
        ),
    )
    n1 = len(assets) + 1
    current = _mostly(
        draw,
        st.one_of(
            st.none(), st.lists(st.floats(0.0, 1.0), min_size=n1, max_size=n1).map(_distribution)
        ),
        st.lists(_ANY_FLOAT, max_size=MAX_ASSETS + 2),
    )
    message = pb.AllocateRequest(
        portfolio_id=_mostly(draw, _GOOD_ID, _BAD_ID),
        request_id=_mostly(draw, st.just(None), _BAD_REQUEST_ID) or f"fz-{next(_REQUEST_IDS)}",
        asset_ids=assets,
        prices=prices,
        current_weights=current or [],
    )
    pin = _mostly(draw, _GOOD_PIN, _BAD_PIN)
    if pin is not None:
        message.model.name, message.model.version = pin
    return message


_CALLS = st.one_of(
    _requests().map(lambda r: ("Allocate", r)),
    st.lists(_requests(), max_size=3).map(
        lambda rs: ("AllocateBatch", pb.AllocateBatchRequest(requests=rs))
    ),
    st.one_of(_GOOD_ID, _BAD_ID).map(
        lambda pid: ("ResetPortfolio", pb.ResetPortfolioRequest(portfolio_id=pid))
    ),
)


def _check_answer(request: pb.AllocateRequest, response: pb.AllocateResponse) -> None:
    assert tuple(response.asset_ids) == ("CASH", *request.asset_ids)
    for which in ("raw", "smoothed"):
        w = weights(response, which)
        assert w.shape == (len(request.asset_ids) + 1,)
        assert np.all(np.isfinite(w)), w
        assert np.all(w >= 0.0), w
        assert abs(w.sum() - 1.0) < 1e-9, w
    assert math.isfinite(response.turnover)
    assert response.turnover >= 0.0


# Valid but absurd prices (5e-324 beside 1.7e308) overflow the price ratio of a log return to
# +-inf, which numpy warns about; the exported graph's clip (and the cash fallback for NaN
# preferences) turns that into a well-formed answer, which is what the test checks.
@pytest.mark.filterwarnings("ignore:overflow encountered in divide:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
@settings(
    max_examples=2000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(call=_CALLS)
def test_generated_requests_never_fail_inside(shared: Conn, call: tuple[str, Any]) -> None:
    method, request = call
    code, details, response = shared.call(method, request)
    assert code in {OK, INVALID, NOT_FOUND}, f"{code.name}: {details}"
    if code is not OK:
        assert details, "a refusal must say why"
    elif method == "Allocate":
        _check_answer(request, response)
    elif method == "AllocateBatch":
        assert len(response.responses) == len(request.requests)
        for item, answer in zip(request.requests, response.responses, strict=True):
            _check_answer(item, answer)


def test_health_after_generated_requests(shared: Conn) -> None:
    """Runs after the generator in file order (and is true at any time)."""
    assert shared.serving()
    for method in ("Allocate", "AllocateBatch", "ResetPortfolio", "ListModels"):
        for code in ("INTERNAL", "UNKNOWN"):
            assert (
                shared.counter(
                    "allocator_serving_requests_total", grpc_method=method, grpc_code=code
                )
                == 0
            )
    assert shared.allocate(make_request("after-fuzz")).model.name == "tiny"


# --- 3. authentication ---------------------------------------------------------------------------


def test_bearer_token(tiny_registry: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  correct horse battery staple\n")
    server = start_server(tmp_path, tiny_registry, auth_token_file=token_file, record=False)
    try:
        good = make_request("auth")
        for token in (
            None,
            "wrong",
            "correct horse battery stapl",
            "correct horse battery staple!",
        ):
            with AllocatorClient(server.target, token=token) as client:
                with pytest.raises(AllocatorError) as info:
                    client.allocate("auth", ["A"], price_window(1))
                assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
                assert "bearer token" in info.value.details
                # Health (and so Kubernetes probes) needs no token.
                assert client.is_serving()
        # A header that is not "Bearer ..." counts as missing.
        channel = grpc.insecure_channel(server.target)
        stub = pb_grpc.AllocatorStub(channel)
        with pytest.raises(grpc.RpcError) as raw:
            stub.ListModels(
                pb.ListModelsRequest(),
                metadata=[("authorization", "correct horse battery staple")],
                timeout=10,
            )
        assert raw.value.code() is grpc.StatusCode.UNAUTHENTICATED
        channel.close()
        with AllocatorClient(server.target, token="correct horse battery staple") as client:
            answer = client.allocate(
                "auth", ["A", "B", "C"], np.asarray(good.prices).reshape(3, -1)
            )
            assert answer.smoothed_weights.sum() == pytest.approx(1.0)
            assert {m.name for m in client.list_models()} == {"tiny", "plain"}
        denied = server.metrics_registry.get_sample_value(
            "allocator_serving_requests_total",
            {"grpc_method": "Allocate", "grpc_code": "UNAUTHENTICATED"},
        )
        assert denied == 4.0
    finally:
        server.stop()


# --- 4. TLS and mTLS ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not have_openssl():
        pytest.skip("openssl is not installed")
    return make_pki(tmp_path_factory.mktemp("pki"))


def _ok(client: AllocatorClient) -> bool:
    return client.allocate("tls", ["A", "B"], price_window(2)).asset_ids == ("CASH", "A", "B")


def _refused(client: AllocatorClient) -> grpc.StatusCode:
    with pytest.raises(AllocatorError) as info:
        client.list_models(timeout=10)
    return info.value.code


def test_tls(tiny_registry: Path, tmp_path: Path, pki: Pki) -> None:
    server = start_server(
        tmp_path,
        tiny_registry,
        tls_cert=pki.path("server.pem"),
        tls_key=pki.path("server.key"),
        record=False,
    )
    try:
        with AllocatorClient(server.target, root_certificates=pki.read("ca.pem")) as client:
            assert _ok(client)
            assert client.is_serving()
        with AllocatorClient(server.target, timeout=5) as plaintext:
            assert _refused(plaintext) is grpc.StatusCode.UNAVAILABLE
        # A client that trusts another CA does not accept the server's certificate.
        with AllocatorClient(server.target, root_certificates=pki.read("client-ca.pem")) as other:
            assert _refused(other) is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


def test_mtls(tiny_registry: Path, tmp_path: Path, pki: Pki) -> None:
    server = start_server(
        tmp_path,
        tiny_registry,
        tls_cert=pki.path("server.pem"),
        tls_key=pki.path("server.key"),
        tls_client_ca=pki.path("client-ca.pem"),
        record=False,
    )
    ca = pki.read("ca.pem")
    try:
        with AllocatorClient(
            server.target,
            root_certificates=ca,
            private_key=pki.read("client.key"),
            certificate_chain=pki.read("client.pem"),
        ) as client:
            assert _ok(client)
        with AllocatorClient(server.target, root_certificates=ca) as no_cert:
            assert _refused(no_cert) is grpc.StatusCode.UNAVAILABLE
        # Signed by a CA the server knows, but not by the client CA: refused.
        with AllocatorClient(
            server.target,
            root_certificates=ca,
            private_key=pki.read("rogue.key"),
            certificate_chain=pki.read("rogue.pem"),
        ) as rogue:
            assert _refused(rogue) is grpc.StatusCode.UNAVAILABLE
        with AllocatorClient(server.target, timeout=5) as plaintext:
            assert _refused(plaintext) is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


# --- 5. deadlines --------------------------------------------------------------------------------


def test_tiny_deadlines_then_retries_step_once(shared: Conn) -> None:
    """With a microsecond deadline the client mostly gives up before the answer (gRPC's timers
    are coarse, so an answer may still win the race). Either way a retry with the same request
    id is safe: the portfolio steps exactly once per request id."""
    pid = "deadline-tiny"
    codes = []
    for k in range(20):
        request = make_request(pid, seed=k, request_id=f"{pid}-{k}")
        code, details, _ = shared.call("Allocate", request, timeout=1e-6)
        codes.append(code)
        assert code in {OK, grpc.StatusCode.DEADLINE_EXCEEDED}, details
        retried = shared.allocate(request)
        assert retried.request_id == request.request_id
    assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
    assert shared.state(pid).steps == 20
    assert shared.serving()


def test_expired_call_decides_nothing(shared: Conn) -> None:
    """A call whose deadline passes while it waits for the portfolio's lock is not decided:
    the client has given up, so the portfolio's state must not move on its behalf."""
    pid = "deadline-held"
    before = shared.counter(
        "allocator_serving_requests_total", grpc_method="Allocate", grpc_code="DEADLINE_EXCEEDED"
    )
    with shared.server.store.locked([pid]):
        code, _, _ = shared.call("Allocate", make_request(pid), timeout=0.3)
        assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(
        lambda: (
            shared.counter(
                "allocator_serving_requests_total",
                grpc_method="Allocate",
                grpc_code="DEADLINE_EXCEEDED",
            )
            > before
        ),
        "the handler to give up on the expired call",
    )
    assert shared.state(pid) is None
    assert shared.serving()
    assert shared.allocate(make_request(pid)).portfolio_id == pid


# --- 6. the concurrency limit --------------------------------------------------------------------


def test_over_the_concurrency_limit_is_resource_exhausted(
    tiny_registry: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, tiny_registry, max_concurrent_rpcs=1, workers=4, record=False)
    conn = connect(server)
    stripes = 4096  # MemoryStateStore's default: the probe must not wait on the held stripe
    held = "held"
    free = next(
        f"free-{k}" for k in range(10) if hash(f"free-{k}") % stripes != hash(held) % stripes
    )
    try:
        with server.store.locked([held]):
            blocked = conn.stub.Allocate.future(make_request(held), timeout=30)
            # Once the held call is inside the handler it has the one slot, and a probe is
            # refused at the door. Until then a probe is answered, or it takes the slot first
            # and the held call is the one refused: then send that again.
            deadline = time.monotonic() + WAIT
            while True:
                assert time.monotonic() < deadline, "no call was refused"
                code, details, _ = conn.call("Allocate", make_request(free), timeout=10)
                if code is not OK:
                    break
                if blocked.done():
                    assert blocked.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                    blocked = conn.stub.Allocate.future(make_request(held), timeout=30)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert not blocked.done()
        assert blocked.result().portfolio_id == held  # released: the held call completes
        assert conn.allocate(make_request(free)).portfolio_id == free
        assert conn.serving()
    finally:
        conn.channel.close()
        server.stop()


# --- 7. idempotency and reset --------------------------------------------------------------------


def test_retried_request_is_answered_once(shared: Conn) -> None:
    first = make_request("retry", seed=1, request_id="retry-1")
    again = shared.allocate(first)
    assert shared.allocate(first) == again
    assert shared.allocate(first) == again
    steps = shared.state("retry").steps
    assert steps == 1
    # A twin portfolio that saw the first step once: the next step smooths identically.
    shared.allocate(make_request("twin", seed=1, request_id="twin-1"))
    nxt = shared.allocate(make_request("retry", seed=2, request_id="retry-2"))
    twin = shared.allocate(make_request("twin", seed=2, request_id="twin-2"))
    np.testing.assert_array_equal(weights(nxt), weights(twin))
    np.testing.assert_array_equal(weights(nxt, "raw"), weights(twin, "raw"))
    assert nxt.icm_reward == twin.icm_reward
    assert shared.state("retry").steps == 2
    # The same id for another portfolio is a client bug, not a retry.
    code, details, _ = shared.call("Allocate", make_request("other", request_id="retry-1"))
    assert code is INVALID
    assert details.startswith("request_id: ")
    assert "another portfolio" in details
    assert shared.state("other") is None
    # So is the same id with other inputs: its answer would be for other assets or prices.
    for changed in (
        make_request("retry", ("A", "B"), seed=1, request_id="retry-1"),
        make_request("retry", seed=3, request_id="retry-1"),
        make_request("retry", seed=1, request_id="retry-1", current=[1, 0, 0, 0]),
        make_request("retry", seed=1, request_id="retry-1", model="plain"),
    ):
        code, details, _ = shared.call("Allocate", changed)
        assert code is INVALID
        assert details.startswith("request_id: ")
        assert "other inputs" in details
    assert shared.state("retry").steps == 2


def test_batch_retry_and_mixed_batch(shared: Conn) -> None:
    a = make_request("batch-a", seed=3, request_id="ba-1")
    b = make_request("batch-b", seed=4, request_id="bb-1")
    batch = shared.call("AllocateBatch", _batch(a, b))[2]
    assert [r.portfolio_id for r in batch.responses] == ["batch-a", "batch-b"]
    # Retrying the batch answers the same, without a second step.
    assert shared.call("AllocateBatch", _batch(a, b))[2] == batch
    assert shared.allocate(a) == batch.responses[0]
    # A batch that mixes a retried item with a new one decides only the new one.
    b2 = make_request("batch-b", seed=5, request_id="bb-2")
    mixed = shared.call("AllocateBatch", _batch(a, b2))[2]
    assert mixed.responses[0] == batch.responses[0]
    assert shared.state("batch-a").steps == 1
    assert shared.state("batch-b").steps == 2
    assert mixed.responses[1].request_id == "bb-2"
    assert mixed.responses[1].HasField("icm_reward")  # batch-b's second step


def test_concurrent_duplicates_step_once(shared: Conn) -> None:
    """Two copies of one request in flight at once (a hedging client): one step, one answer."""
    pid = "dup-in-flight"
    shared.allocate(make_request(pid, seed=6))
    request = make_request(pid, seed=7, request_id="dup-1")
    with shared.server.store.locked([pid]):
        calls = [shared.stub.Allocate.future(request, timeout=30) for _ in range(2)]
        time.sleep(0.3)  # let both reach the lock (a shorter wait can only hide the bug)
    answers = [c.result() for c in calls]
    assert answers[0] == answers[1]
    assert shared.state(pid).steps == 2


def test_reset_portfolio(shared: Conn) -> None:
    pid = "to-reset"
    reset = pb.ResetPortfolioRequest(portfolio_id=pid)
    assert shared.call("ResetPortfolio", reset)[2].existed is False
    first = shared.allocate(make_request(pid, seed=8))
    np.testing.assert_array_equal(weights(first), weights(first, "raw"))
    assert not first.HasField("icm_reward")
    second = shared.allocate(make_request(pid, seed=9))
    assert not np.array_equal(weights(second), weights(second, "raw"))  # smoothing is on
    assert second.HasField("icm_reward")
    assert shared.call("ResetPortfolio", reset)[2].existed is True
    assert shared.state(pid) is None
    assert shared.call("ResetPortfolio", reset)[2].existed is False
    restarted = shared.allocate(make_request(pid, seed=9))
    np.testing.assert_array_equal(weights(restarted), weights(restarted, "raw"))
    assert not restarted.HasField("icm_reward")
    assert shared.state(pid).steps == 1


def test_list_models(shared: Conn) -> None:
    models = shared.call("ListModels", pb.ListModelsRequest())[2].models
    by_name = {m.name: m for m in models}
    assert set(by_name) == {"tiny", "plain"}
    assert by_name["tiny"].is_default
    assert not by_name["plain"].is_default
    assert by_name["tiny"].has_icm
    assert not by_name["plain"].has_icm
    assert (by_name["tiny"].max_assets, by_name["tiny"].window) == (MAX_ASSETS, WINDOW)
    assert by_name["tiny"].provider == "CPUExecutionProvider"


# --- 8. recording --------------------------------------------------------------------------------


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_every_decision_is_recorded(tiny_registry: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path, tiny_registry)
    conn = connect(server)
    answers: list[pb.AllocateResponse] = []
    try:
        for k in range(4):  # tiny (ICM) for one portfolio
            answers.append(conn.allocate(make_request("icm", seed=k, request_id=f"icm-{k}")))
        for k in range(3):  # plain (no ICM), pinned
            answers.append(
                conn.allocate(make_request("plain", seed=k, request_id=f"pl-{k}", model="plain"))
            )
        retried = make_request("icm", seed=9, request_id="icm-retried")
        answers.append(conn.allocate(retried))
        conn.allocate(retried)  # a retry: answered, not recorded twice
        batch = _batch(
            make_request("b1", seed=1, current=[0.2, 0.3, 0.3, 0.2]),
            make_request("b2", ("X", "Y"), seed=2, model="plain"),
        )
        answers.extend(conn.call("AllocateBatch", batch)[2].responses)
        # Refused calls record nothing.
        conn.call("Allocate", _with_price(0, math.nan)())
        conn.call("AllocateBatch", _batch(make_request("b3"), pb.AllocateRequest()))
    finally:
        conn.channel.close()
        server.stop()

    db = tmp_path / "trades.db"
    rows = _rows(
        db,
        "SELECT d.request_id, d.portfolio_id, d.asset_ids, d.raw_weights, d.smoothed_weights, "
        "d.icm_reward, d.turnover, m.name, m.version FROM decisions d "
        "JOIN model_versions m ON m.id = d.model_version_id",
    )
    assert len(rows) == len(answers)
    by_id = {r[0]: r for r in rows}
    for a in answers:
        _, pid, assets, raw, smoothed, icm, turnover, name, version = by_id[a.request_id]
        assert pid == a.portfolio_id
        assert json.loads(assets) == list(a.asset_ids)
        assert json.loads(raw) == list(a.raw_weights)  # exactly: float64 round trips
        assert json.loads(smoothed) == list(a.smoothed_weights)
        assert turnover == a.turnover
        assert (name, version) == (a.model.name, a.model.version)
        assert icm == (a.icm_reward if a.HasField("icm_reward") else None)
    icm_rows = [by_id[f"icm-{k}"][5] for k in range(4)]
    assert icm_rows[0] is None
    assert all(r is not None for r in icm_rows[1:])
    assert all(by_id[f"pl-{k}"][5] is None for k in range(3))
    models = _rows(db, "SELECT name, version, algorithm FROM model_versions")
    assert sorted(models) == [("plain", "1", "td3"), ("tiny", "1", "td3")]


def test_refusing_recorder_is_unavailable_and_state_holds(
    tiny_registry: Path, tmp_path: Path
) -> None:
    """The database is down and the spool is over quota: no decision may be acted on."""
    server = start_server(
        tmp_path,
        tiny_registry,
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/allocator",
        spool_quota_bytes=1,
        metrics_port=0,
    )
    conn = connect(server)
    try:
        assert server.recorder is not None
        # The model registrations go to the spool first, which closes the door.
        wait_for(lambda: server.recorder.stats().spool_bytes > 0, "the spool to fill")
        request = make_request("unrecorded", request_id="unrecorded-1")
        for _ in range(2):  # and a retry with the same id is refused again, not cached
            code, details, _ = conn.call("Allocate", request)
            assert code is grpc.StatusCode.UNAVAILABLE, details
            assert "not recorded" in details
        code, _, _ = conn.call("AllocateBatch", _batch(make_request("u1"), make_request("u2")))
        assert code is grpc.StatusCode.UNAVAILABLE
        for pid in ("unrecorded", "u1", "u2"):
            assert conn.state(pid) is None
        assert conn.counter("allocator_recorder_rejected_total") == 4.0  # records, not calls
        assert (
            conn.counter(
                "allocator_serving_requests_total", grpc_method="Allocate", grpc_code="UNAVAILABLE"
            )
            == 2.0
        )
        assert conn.serving()  # a recording outage is the client's to retry, not a crash
    finally:
        conn.channel.close()
        server.stop()


# --- 9. metrics ----------------------------------------------------------------------------------


def test_metrics_endpoint(shared: Conn) -> None:
    shared.allocate(make_request("metrics", seed=1))
    shared.allocate(make_request("metrics", seed=2))
    shared.call("Allocate", _with_price(1, -1.0)())
    shared.call("AllocateBatch", _batch(make_request("metrics-b", seed=3)))
    assert shared.server.recorder is not None
    assert shared.server.recorder.flush(WAIT)
    port = shared.server.metrics_port
    assert port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(metric: str, /, **labels: str) -> float:
        return samples.get((metric, tuple(sorted(labels.items()))), 0.0)

    assert 'allocator_serving_requests_total{grpc_code="OK",grpc_method="Allocate"}' in text
    assert value("allocator_serving_requests_total", grpc_method="Allocate", grpc_code="OK") >= 2
    assert (
        value(
            "allocator_serving_requests_total", grpc_method="Allocate", grpc_code="INVALID_ARGUMENT"
        )
        >= 1
    )
    assert (
        value("allocator_serving_requests_total", grpc_method="AllocateBatch", grpc_code="OK") >= 1
    )
    assert value("allocator_serving_provider_info", provider="CPUExecutionProvider") == 1.0
    assert value("allocator_serving_model_info", name="tiny", version="1", algorithm="td3") == 1.0
    assert value("allocator_serving_latency_budget_seconds") == pytest.approx(0.010)
    assert value("allocator_serving_request_latency_seconds_count", grpc_method="Allocate",
                 grpc_code="OK") >= 2  # fmt: skip
    assert value("allocator_serving_smoothing_gap_count") >= 3
    assert value("allocator_serving_icm_reward_count") >= 1
    assert value("allocator_serving_batch_size_count") >= 1
    assert value("allocator_recorder_rows_written_total") >= 3
    assert ("allocator_recorder_queue_depth", ()) in samples
    assert ("allocator_recorder_spool_bytes", ()) in samples
    assert (
        value("allocator_serving_requests_total", grpc_method="Allocate", grpc_code="INTERNAL")
        == 0.0
    )


# --- the renormalization the server promises (a cheap cross-check of the weights it sends) ------


def test_smoothed_is_the_ema_of_raw(shared: Conn) -> None:
    pid = "ema"
    previous = None
    for k in range(5):
        answer = shared.allocate(make_request(pid, seed=20 + k))
        raw, smoothed = weights(answer, "raw"), weights(answer)
        expected = raw if previous is None else BETA * previous + (1 - BETA) * raw
        np.testing.assert_allclose(smoothed, renormalize(expected, np.ones(4, bool)), atol=1e-12)
        previous = smoothed


def test_pool_of_clients_in_parallel(shared: Conn) -> None:
    """Many portfolios from many threads: every answer is well formed, no state is lost."""

    def work(i: int) -> int:
        for k in range(10):
            shared.allocate(make_request(f"par-{i}", seed=k))
        return shared.state(f"par-{i}").steps

    with futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(work, range(8))) == [10] * 8
