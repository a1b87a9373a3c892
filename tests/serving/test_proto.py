"""The API definition: checked-in generated code is current, and the wire contract holds still.

Field numbers are the wire format: renumbering one silently breaks every deployed client, so
they are pinned here, not just the names.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor

from allocator.serving.proto import SERVICE_NAME, allocator_pb2, allocator_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "src" / "allocator" / "serving" / "proto" / "v1"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "generate_proto", ROOT / "scripts" / "generate_proto.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_checked_in_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the dev extra")
    written = _generator().generate(tmp_path)
    fresh = {p.name: p.read_bytes() for p in written}
    checked_in = {p.name: p.read_bytes() for p in GENERATED.iterdir() if p.is_file()}
    assert set(fresh) == {
        "__init__.py",
        "allocator_pb2.py",
        "allocator_pb2.pyi",
        "allocator_pb2_grpc.py",
    }
    assert set(checked_in) == set(fresh), "stray or missing files: run `make proto`"
    stale = sorted(name for name in fresh if fresh[name] != checked_in[name])
    assert not stale, f"stale generated code {stale}: run `make proto` and commit the result"


def test_generation_is_deterministic(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the dev extra")
    generate = _generator().generate
    first = {p.name: p.read_bytes() for p in generate(tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in generate(tmp_path / "b")}
    assert first == second


def test_generated_files_pass_ruff() -> None:
    """The generator's header must keep both ruff check and ruff format quiet."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed next to this interpreter")
    for args in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [str(ruff), *args, "--no-cache", str(GENERATED)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_service_name_and_methods() -> None:
    service = allocator_pb2.DESCRIPTOR.services_by_name["Allocator"]
    assert service.full_name == "allocator.v1.Allocator" == SERVICE_NAME
    assert allocator_pb2.DESCRIPTOR.package == "allocator.v1"
    assert allocator_pb2.DESCRIPTOR.name == "allocator/v1/allocator.proto"
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert methods == {
        "Allocate": ("AllocateRequest", "AllocateResponse"),
        "AllocateBatch": ("AllocateBatchRequest", "AllocateBatchResponse"),
        "AllocateStream": ("AllocateStreamRequest", "AllocateStreamResponse"),
        "ListModels": ("ListModelsRequest", "ListModelsResponse"),
        "ResetPortfolio": ("ResetPortfolioRequest", "ResetPortfolioResponse"),
    }
    for name in methods:
        assert hasattr(allocator_pb2_grpc.AllocatorStub, "__init__")
        assert hasattr(allocator_pb2_grpc.AllocatorServicer, name)
    streaming = {m.name for m in service.methods if m.client_streaming or m.server_streaming}
    assert streaming == {"AllocateStream"}
    stream = service.methods_by_name["AllocateStream"]
    assert stream.client_streaming
    assert stream.server_streaming


def _fields(message: str) -> dict[str, tuple[int, bool]]:
    """name -> (number, repeated) for one message type."""
    descriptor = allocator_pb2.DESCRIPTOR.message_types_by_name[message]
    return {f.name: (f.number, f.is_repeated) for f in descriptor.fields}


def test_numeric_wire_types() -> None:
    """Doubles stay doubles (a float32 field would change every weight past 1e-7)."""
    request = allocator_pb2.AllocateRequest.DESCRIPTOR.fields_by_name
    response = allocator_pb2.AllocateResponse.DESCRIPTOR.fields_by_name
    info = allocator_pb2.ModelInfo.DESCRIPTOR.fields_by_name
    for field in (
        request["prices"],
        request["current_weights"],
        response["raw_weights"],
        response["smoothed_weights"],
        response["icm_reward"],
        response["turnover"],
        info["beta"],
    ):
        assert field.type == FieldDescriptor.TYPE_DOUBLE, field.full_name
    assert info["max_assets"].type == info["window"].type == FieldDescriptor.TYPE_INT32
    assert response["icm_reward"].has_presence
    assert request["prices"].is_packed


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("ModelRef", {"name": (1, False), "version": (2, False)}),
        (
            "AllocateRequest",
            {
                "portfolio_id": (1, False),
                "request_id": (2, False),
                "asset_ids": (3, True),
                "prices": (4, True),
                "current_weights": (5, True),
                "model": (6, False),
            },
        ),
        (
            "AllocateResponse",
            {
                "request_id": (1, False),
                "portfolio_id": (2, False),
                "asset_ids": (3, True),
                "raw_weights": (4, True),
                "smoothed_weights": (5, True),
                "model": (6, False),
                "icm_reward": (7, False),
                "turnover": (8, False),
            },
        ),
        ("AllocateBatchRequest", {"requests": (1, True)}),
        ("AllocateBatchResponse", {"responses": (1, True)}),
        ("AllocateStreamRequest", {"sequence": (1, False), "batch": (2, False)}),
        (
            "AllocateStreamResponse",
            {"sequence": (1, False), "responses": (2, True), "error": (3, False)},
        ),
        ("StreamError", {"code": (1, False), "message": (2, False)}),
        ("ListModelsRequest", {}),
        (
            "ModelInfo",
            {
                "name": (1, False),
                "version": (2, False),
                "algorithm": (3, False),
                "max_assets": (4, False),
                "window": (5, False),
                "beta": (6, False),
                "has_icm": (7, False),
                "provider": (8, False),
                "is_default": (9, False),
            },
        ),
        ("ListModelsResponse", {"models": (1, True), "refused": (2, True)}),
        (
            "ModelRefusal",
            {
                "name": (1, False),
                "version": (2, False),
                "reason": (3, False),
                "message": (4, False),
            },
        ),
        ("ResetPortfolioRequest", {"portfolio_id": (1, False)}),
        ("ResetPortfolioResponse", {"existed": (1, False)}),
    ],
)
def test_wire_contract(message: str, expected: dict[str, tuple[int, bool]]) -> None:
    assert _fields(message) == expected


def test_icm_reward_distinguishes_absent_from_zero() -> None:
    response = allocator_pb2.AllocateResponse()
    assert not response.HasField("icm_reward")
    response.icm_reward = 0.0
    assert response.HasField("icm_reward")
    again = allocator_pb2.AllocateResponse.FromString(response.SerializeToString())
    assert again.HasField("icm_reward")
    assert again.icm_reward == 0.0


def test_prices_round_trip_as_packed_doubles() -> None:
    prices = [100.0, 100.5, 99.25, 1e-300, 1.7976931348623157e308]
    request = allocator_pb2.AllocateRequest(prices=prices)
    again = allocator_pb2.AllocateRequest.FromString(request.SerializeToString())
    assert list(again.prices) == prices
    # packed: one tag + length for the whole field, 8 bytes per double
    assert request.ByteSize() == 1 + 1 + 8 * len(prices)


def test_messages_live_at_their_import_path() -> None:
    assert allocator_pb2.AllocateRequest.__module__ == "allocator.serving.proto.v1.allocator_pb2"
    source = (GENERATED / "allocator_pb2_grpc.py").read_text()
    assert "from . import allocator_pb2 as" in source
    assert "from allocator.v1" not in source
