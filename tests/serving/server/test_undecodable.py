"""Bytes that are not a request message: INVALID_ARGUMENT naming the method, counted, logged as
one line without a traceback, on every method of every service the server offers."""

from __future__ import annotations

import logging

import grpc
import pytest

from allocator.serving.proto import SERVICE_NAME
from tests.serving.server.helpers import INVALID, Conn, make_request
from tests.serving.server.wire import BAD_UTF8, length_delimited

ALLOCATOR = f"/{SERVICE_NAME}/"
_VALID = make_request("undecodable").SerializeToString()

# (id, full method, request type, bytes)
UNDECODABLE: list[tuple[str, str, str, bytes]] = [
    ("allocate-ff", "Allocate", "AllocateRequest", b"\xff"),
    ("allocate-truncated", "Allocate", "AllocateRequest", _VALID[: len(_VALID) // 2]),
    ("allocate-length-past-the-end", "Allocate", "AllocateRequest", b"\x0a\x05ab"),
    ("allocate-portfolio-id-not-utf8", "Allocate", "AllocateRequest",
     _VALID + length_delimited(1, BAD_UTF8[0])),
    ("allocate-asset-id-surrogate", "Allocate", "AllocateRequest",
     _VALID + length_delimited(3, b"\xed\xa0\x80")),
    ("allocate-model-name-not-utf8", "Allocate", "AllocateRequest",
     _VALID + length_delimited(6, length_delimited(1, b"\xc0\x80"))),
    ("allocate-field-zero", "Allocate", "AllocateRequest", b"\x00\x01"),
    ("batch-ff", "AllocateBatch", "AllocateBatchRequest", b"\xff"),
    ("batch-item-id-not-utf8", "AllocateBatch", "AllocateBatchRequest",
     length_delimited(1, _VALID) + length_delimited(1, length_delimited(2, b"r\xff"))),
    ("batch-item-truncated", "AllocateBatch", "AllocateBatchRequest",
     length_delimited(1, _VALID)[:-3]),
    ("list-models-ff", "ListModels", "ListModelsRequest", b"\xff"),
    ("list-models-truncated", "ListModels", "ListModelsRequest", b"\x0a\x05ab"),
    ("reset-ff", "ResetPortfolio", "ResetPortfolioRequest", b"\xff"),
    ("reset-portfolio-id-not-utf8", "ResetPortfolio", "ResetPortfolioRequest",
     length_delimited(1, b"p\xfe")),
]  # fmt: skip


def _invalid_count(conn: Conn, method: str) -> float:
    return conn.counter(
        "allocator_serving_requests_total", grpc_method=method, grpc_code="INVALID_ARGUMENT"
    )


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()


@pytest.mark.parametrize(
    ("method", "type_name", "data"), [pytest.param(*case[1:], id=case[0]) for case in UNDECODABLE]
)
def test_undecodable_bytes_are_invalid_argument_naming_the_method(
    shared: Conn, caplog: pytest.LogCaptureFixture, method: str, type_name: str, data: bytes
) -> None:
    before = _invalid_count(shared, method)
    with caplog.at_level(logging.INFO):
        code, details, _ = shared.call_raw(ALLOCATOR + method, data)
    assert code is INVALID, f"{code.name}: {details}"
    assert details.startswith(f"request: the {len(data)} bytes sent to {ALLOCATOR}{method} ")
    assert f"not a valid allocator.v1.{type_name} message (" in details
    assert _invalid_count(shared, method) == before + 1
    lines = [r for r in caplog.records if ALLOCATOR + method in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].levelno == logging.WARNING
    _no_traceback(caplog)
    assert shared.serving()


def test_invalid_utf8_is_named_as_such(shared: Conn) -> None:
    """Whether the parser refuses or accepts a string that is not UTF-8 depends on protobuf's
    implementation; either way the answer is INVALID_ARGUMENT, here with the parser's reason."""
    data = _VALID + length_delimited(1, b"\xff\xfe")
    code, details, _ = shared.call_raw(ALLOCATOR + "Allocate", data)
    assert code is INVALID, details
    assert "UTF-8" in details or details.startswith("portfolio_id: "), details


def test_health_and_reflection_refuse_undecodable_bytes_too(
    shared: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither counts in the allocation metrics, but neither may answer INTERNAL either."""
    with caplog.at_level(logging.INFO):
        code, details, _ = shared.call_raw("/grpc.health.v1.Health/Check", b"\xff")
        assert code is INVALID, details
        assert "grpc.health.v1.HealthCheckRequest" in details

        watch = shared.channel.unary_stream("/grpc.health.v1.Health/Watch")
        with pytest.raises(grpc.RpcError) as watched:
            next(iter(watch(b"\x0a\x02\xff\xfe", timeout=10)))
        assert watched.value.code() is INVALID, watched.value.details()

        reflect = shared.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        )
        with pytest.raises(grpc.RpcError) as reflected:
            list(reflect(iter([b"\xff"]), timeout=10))
        assert reflected.value.code() is INVALID, reflected.value.details()
        assert "ServerReflectionRequest" in (reflected.value.details() or "")
    _no_traceback(caplog)
    assert shared.serving()


def test_a_valid_request_as_bytes_is_answered(shared: Conn) -> None:
    """The guard decodes with the method's own parser: valid bytes reach the servicer."""
    request = make_request("raw-bytes")
    code, details, data = shared.call_raw(ALLOCATOR + "Allocate", request.SerializeToString())
    assert code is grpc.StatusCode.OK, details
    assert b"raw-bytes" in data
