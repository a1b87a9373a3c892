"""``allocator request``: the command against a tiny real gRPC server (``tests.serving.echo``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from allocator.serving.client import (
    ModelInfo,
)
from allocator.serving.request_cli import pick_model, read_prices_csv, request_command
from tests.serving.echo import (
    TOKEN,
    Server,
    echo_prices,
    raw_weights,
    serving_echo,
)


@pytest.fixture
def server() -> Iterator[Server]:
    with serving_echo() as info:
        yield info


def _run(server: Server, tmp_path: Path, *args: str) -> tuple[int, str]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    result = CliRunner().invoke(
        request_command,
        ["--target", server.target, "--token-file", str(token_file), *args],
        catch_exceptions=False,
    )
    return result.exit_code, result.output


def test_request_command_synthetic_prints_a_table(server: Server, tmp_path: Path) -> None:
    code, out = _run(server, tmp_path, "--portfolio", "desk-1", "--synthetic", "3")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["asset", "raw", "smoothed"]
    assert [line.split()[0] for line in lines[2:6]] == ["CASH", "SYN1", "SYN2", "SYN3"]
    assert lines[2].split()[1] == "0.1000"
    assert "model       alpha version 2" in out
    assert "icm reward  -" in out
    assert "turnover    0.0000" in out
    assert "portfolio   desk-1" in out


def test_request_command_csv_json(server: Server, tmp_path: Path) -> None:
    window = 9  # the "wide" model's
    prices = echo_prices(3, window=window + 5, seed=3)
    csv_path = tmp_path / "prices.csv"
    rows = ["date,AAA,BBB,CCC"]
    rows += [f"2024-01-{d + 1:02d},{prices[0, d]},{prices[1, d]},{prices[2, d]}" for d in range(15)]
    csv_path.write_text("\n".join(rows) + "\n")
    code, out = _run(
        server, tmp_path, "--portfolio", "desk-2", "--prices-csv", str(csv_path),
        "--assets", "CCC,AAA", "--model", "wide", "--current-weights", "0.5,0.25,0.25",
        "--request-id", "cli-1", "--json",
    )  # fmt: skip
    assert code == 0, out
    data = json.loads(out)
    assert data["asset_ids"] == ["CASH", "CCC", "AAA"]
    assert data["request_id"] == "cli-1"
    assert (data["model_name"], data["model_version"]) == ("wide", "10")
    sent = np.stack([prices[2, -(window + 1) :], prices[0, -(window + 1) :]])
    np.testing.assert_allclose(data["raw_weights"], raw_weights(sent), rtol=1e-15)
    smoothed = np.array(data["smoothed_weights"])
    expected = np.abs(smoothed - [0.5, 0.25, 0.25])[1:].sum()
    assert data["turnover"] == pytest.approx(expected, abs=1e-12)


def test_request_command_reports_server_errors(server: Server, tmp_path: Path) -> None:
    code, out = _run(server, tmp_path, "--portfolio", "p", "--synthetic", "6")  # max_assets 5
    assert code == 1
    assert "INVALID_ARGUMENT: asset_ids: 6 assets" in out
    code, out = _run(server, tmp_path, "--portfolio", "p", "--synthetic", "2", "--model", "ghost")
    assert code == 1
    assert "model ghost is not loaded" in out


def test_request_command_wrong_token(server: Server, tmp_path: Path) -> None:
    token_file = tmp_path / "bad-token"
    token_file.write_text("nope")
    result = CliRunner().invoke(
        request_command,
        ["--target", server.target, "--portfolio", "p", "--synthetic", "1",
         "--token-file", str(token_file)],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "UNAUTHENTICATED" in result.output


def test_request_command_needs_one_price_source(server: Server, tmp_path: Path) -> None:
    code, out = _run(server, tmp_path, "--portfolio", "p")
    assert code == 2
    assert "exactly one of --prices-csv FILE and --synthetic N" in out


def test_read_prices_csv_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("date,A,B\n2024-01-01,1,2\n2024-01-02,x,3\n")
    with pytest.raises(click.ClickException, match=r"p.csv:3: A price 'x' is not a number"):
        read_prices_csv(path, 2)
    with pytest.raises(click.ClickException, match="2 data rows, the model needs the last 5"):
        read_prices_csv(path, 5)
    with pytest.raises(click.ClickException, match="no column for Q"):
        read_prices_csv(path, 1, ["Q"])
    assets, values = read_prices_csv(path, 1, ["B"])
    assert assets == ["B"]
    np.testing.assert_array_equal(values, [[3.0]])


def test_pick_model_follows_the_api_rules() -> None:
    def info(name: str, version: str, default: bool = False) -> ModelInfo:
        return ModelInfo(name, version, "td3", 5, 4, 0.5, False, "CPU", default)

    models = [info("a", "9"), info("a", "10"), info("b", "1", default=True)]
    assert pick_model(models, None, None).name == "b"
    assert pick_model(models, "a", None).version == "10"  # numeric, not lexicographic
    assert pick_model(models, "a", "9").version == "9"
