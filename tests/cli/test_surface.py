"""The command line a user scripts against: every command, argument and flag stays as it was,
every ``--help`` works, and the CLI imports none of the heavy libraries until a command runs."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import allocator.cli
from allocator.cli import main

# Every command's parameters, in declaration order, as (name, flags): renaming, dropping or
# reordering one changes what users type or see in --help.
EXPECTED: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "": [("version", ("--version",))],
    "backtest": [
        ("policy_spec", ("--policy",)),
        ("start", ("--start",)),
        ("end", ("--end",)),
        ("dataset", ("--dataset",)),
        ("assets", ("--assets",)),
        ("cost_bps", ("--cost-bps",)),
        ("beta", ("--beta",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
        ("plot_path", ("--plot",)),
    ],
    "checkpoint": [],
    "checkpoint inspect": [("run_dir", ("run_dir",)), ("as_json", ("--json",))],
    "checkpoint migrate": [
        ("run_dir", ("run_dir",)),
        ("to_version", ("--to-version",)),
        ("max_assets", ("--max-assets",)),
    ],
    "data": [],
    "data check": [("path", ("path",)), ("min_history", ("--min-history",))],
    "data info": [
        ("dataset", ("--dataset",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
    ],
    "data ingest": [
        ("paths", ("paths",)),
        ("database_url", ("--database-url",)),
        ("keep_valid", ("--keep-valid",)),
    ],
    "db": [],
    "db current": [
        ("database_url", ("--database-url",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
    ],
    "db downgrade": [("revision", ("revision",)), ("database_url", ("--database-url",))],
    "db upgrade": [("revision", ("revision",)), ("database_url", ("--database-url",))],
    "demo": [
        ("out", ("--out",)),
        ("start", ("--start",)),
        ("end", ("--end",)),
        ("cost_bps", ("--cost-bps",)),
        ("do_train", ("--no-train", "--train")),
        ("config_path", ("--config",)),
    ],
    "export": [
        ("run_dir", ("run_dir",)),
        ("registry", ("--registry",)),
        ("name", ("--name",)),
        ("version", ("--version",)),
    ],
    "request": [
        ("target", ("--target",)),
        ("portfolio_id", ("--portfolio",)),
        ("prices_csv", ("--prices-csv",)),
        ("synthetic", ("--synthetic",)),
        ("assets", ("--assets",)),
        ("seed", ("--seed",)),
        ("current_weights", ("--current-weights",)),
        ("model", ("--model",)),
        ("model_version", ("--version",)),
        ("request_id", ("--request-id",)),
        ("token_file", ("--token-file",)),
        ("tls_ca", ("--tls-ca",)),
        ("tls_cert", ("--tls-cert",)),
        ("tls_key", ("--tls-key",)),
        ("tls_server_name", ("--tls-server-name",)),
        ("timeout", ("--timeout",)),
        ("as_json", ("--json",)),
    ],
    "retrain": [
        ("config_path", ("--config",)),
        ("overrides", ("--set",)),
        ("as_of", ("--as-of",)),
    ],
    "serve": [
        ("config_file", ("--config",)),
        ("registry", ("--registry",)),
        ("host", ("--host",)),
        ("port", ("--port",)),
        ("metrics_port", ("--metrics-port",)),
        ("database_url", ("--database-url",)),
        ("no_record", ("--no-record",)),
        ("spool_dir", ("--spool-dir",)),
        ("redis_url", ("--redis-url",)),
        ("auth_token_file", ("--auth-token-file",)),
        ("tls_cert", ("--tls-cert",)),
        ("tls_key", ("--tls-key",)),
        ("tls_client_ca", ("--tls-client-ca",)),
        ("latency_budget_ms", ("--latency-budget-ms",)),
        ("max_concurrent_rpcs", ("--max-concurrent-rpcs",)),
        ("threads", ("--threads",)),
        ("workers", ("--workers",)),
        ("default_model", ("--model",)),
        ("reload_interval", ("--reload-interval",)),
        ("cpu", ("--cpu",)),
        ("spool_quota_bytes", ("--spool-quota-bytes",)),
        ("ack", ("--ack",)),
        ("batch_window_ms", ("--batch-window-ms",)),
        ("batch_max_decisions", ("--batch-max-decisions",)),
        ("idempotency_cache", ("--idempotency-cache",)),
        ("grace_seconds", ("--grace-seconds",)),
        ("drain_seconds", ("--drain-seconds",)),
        ("max_connection_age_seconds", ("--max-connection-age-seconds",)),
        ("max_connection_age_grace_seconds", ("--max-connection-age-grace-seconds",)),
    ],
    "train": [
        ("config_path", ("--config",)),
        ("overrides", ("--set",)),
        ("run_dir", ("--run-dir",)),
        ("resume_dir", ("--resume",)),
        ("database_url", ("--database-url",)),
    ],
    "suite": [],
    "suite choose": [
        ("screens", ("screens",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
    ],
    "suite run": [
        ("config_path", ("--config",)),
        ("overrides", ("--set",)),
        ("recipe", ("--recipe",)),
        ("mode", ("--mode",)),
        ("draws", ("--draws",)),
        ("markets", ("--markets",)),
        ("steps", ("--steps",)),
        ("executor", ("--executor",)),
        ("workers", ("--workers",)),
        ("out", ("--out",)),
        ("progress", ("--no-progress", "--progress")),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
    ],
    "trade": [],
    "trade account": [],
    "trade account create": [
        ("name", ("name",)),
        ("assets", ("--assets",)),
        ("cash", ("--cash",)),
        ("broker", ("--broker",)),
        ("model", ("--model",)),
        ("cost_bps", ("--cost-bps",)),
        ("lot_size", ("--lot-size",)),
        ("min_order_value", ("--min-order-value",)),
        ("band", ("--band",)),
        ("cash_buffer", ("--cash-buffer",)),
        ("database_url", ("--database-url",)),
    ],
    "trade account resume": [("name", ("name",)), ("database_url", ("--database-url",))],
    "trade compare": [
        ("account_name", ("--account",)),
        ("registry", ("--registry",)),
        ("start", ("--start",)),
        ("end", ("--end",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
        ("pushgateway_url", ("--pushgateway-url",)),
        ("database_url", ("--database-url",)),
    ],
    "trade cycle": [
        ("account_name", ("--account",)),
        ("server", ("--server",)),
        ("token_file", ("--token-file",)),
        ("attempts", ("--attempts",)),
        ("slippage_bps", ("--slippage-bps",)),
        ("pushgateway_url", ("--pushgateway-url",)),
        ("database_url", ("--database-url",)),
        ("date_", ("--date",)),
    ],
    "trade run": [
        ("account_name", ("--account",)),
        ("server", ("--server",)),
        ("token_file", ("--token-file",)),
        ("attempts", ("--attempts",)),
        ("slippage_bps", ("--slippage-bps",)),
        ("pushgateway_url", ("--pushgateway-url",)),
        ("database_url", ("--database-url",)),
        ("start", ("--start",)),
        ("end", ("--end",)),
    ],
    "trade status": [
        ("account_name", ("--account",)),
        ("as_json", ("--json",)),
        ("database_url", ("--database-url",)),
    ],
    "tune": [
        ("config_path", ("--config",)),
        ("overrides", ("--set",)),
        ("executor", ("--executor",)),
        ("out", ("--out",)),
        ("progress", ("--no-progress", "--progress")),
    ],
    "walk-forward": [
        ("config_path", ("--config",)),
        ("executor", ("--executor",)),
        ("ray_address", ("--ray-address",)),
        ("overrides", ("--set",)),
        ("out", ("--out",)),
        ("resume_dir", ("--resume",)),
        ("progress", ("--no-progress", "--progress")),
    ],
    "walk-forward stats": [
        ("run_dir", ("run_dir",)),
        ("configurations_tried", ("--configurations-tried",)),
        ("trials_sharpe_variance", ("--trials-sharpe-variance",)),
        ("baselines", ("--baseline",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
    ],
    "walk-forward status": [
        ("run_dir", ("run_dir",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
    ],
    "walk-forward seeds": [
        ("run_dirs", ("run_dirs",)),
        ("as_json", ("--json",)),
        ("json_out", ("--json-out",)),
    ],
}


def command_tree() -> dict[str, click.Command]:
    """Every command and group under ``allocator``, keyed by its words ("" for the root)."""
    found: dict[str, click.Command] = {}

    def visit(command: click.Command, path: tuple[str, ...], parent: click.Context | None) -> None:
        ctx = click.Context(command, info_name=path[-1] if path else "allocator", parent=parent)
        found[" ".join(path)] = command
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                visit(sub, (*path, name), ctx)

    visit(main, (), None)
    return found


def test_the_commands_and_their_parameters_are_unchanged():
    tree = command_tree()
    assert sorted(tree) == sorted(EXPECTED)
    for path, command in tree.items():
        params = [(p.name, tuple(sorted(p.opts + p.secondary_opts))) for p in command.params]
        assert params == EXPECTED[path], path or "allocator"


def test_json_prints_to_stdout_everywhere():
    """``--json`` is a flag on every command that has it (JSON on stdout); a file is
    ``--json-out PATH``, never ``--json PATH``."""
    tree = command_tree()
    with_json = {
        path: {o: p for p in command.params for o in p.opts} for path, command in tree.items()
    }
    with_json = {path: opts for path, opts in with_json.items() if "--json" in opts}
    assert {"backtest", "data info", "db current", "walk-forward status"} <= with_json.keys()
    for path, opts in with_json.items():
        assert isinstance(opts["--json"], click.Option), path
        assert opts["--json"].is_flag, f"{path}: --json takes no value"
        if "--json-out" in opts:
            assert isinstance(opts["--json-out"].type, click.Path), path


def test_json_output_is_one_document(tmp_path):
    import json

    url = f"sqlite:///{tmp_path / 'trade.db'}"
    result = CliRunner().invoke(main, ["db", "current", "--database-url", url, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["revisions"] == []
    assert report["head"]
    out = tmp_path / "info.json"
    result = CliRunner().invoke(main, ["data", "info", "--json", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info == json.loads(out.read_text())
    assert info["days"] > 0
    assert info["assets"]


def test_walk_forward_status_json_is_the_text_as_data(monkeypatch, tmp_path):
    import json
    from types import SimpleNamespace

    from allocator.trainer.jobs.walk_forward import progress

    state = SimpleNamespace(name="wf", run_id=None, database=None, sessions=[{"resumed": True}])
    windows = [
        progress.WindowStatus("w00", "done", None),
        progress.WindowStatus("w01", "waiting", None),
    ]
    monkeypatch.setattr(progress, "run_status", lambda run_dir: (state, windows, False))
    result = CliRunner().invoke(main, ["walk-forward", "status", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [w["state"] for w in report["windows"]] == ["done", "waiting"]
    assert report["resumed"] == 1
    assert "--resume" in report["advice"]


def test_the_shared_config_options_read_the_same_everywhere():
    """``--config/--set`` come from one declaration: same type and metavar in every job."""
    tree = command_tree()
    for path in ("train", "retrain", "walk-forward", "tune"):
        params = {p.name: p for p in tree[path].params}
        config, overrides = params["config_path"], params["overrides"]
        assert isinstance(config.type, click.Path)
        assert not config.type.dir_okay
        assert overrides.multiple
        assert overrides.metavar == "KEY=VALUE"
        # walk-forward is also a group (``walk-forward stats``): it checks --config itself.
        assert config.required is (path in ("retrain", "tune")), path


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_every_help_works(path: str):
    res = CliRunner().invoke(main, [*path.split(), "--help"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Usage: "), res.output


def test_importing_the_cli_loads_no_heavy_library():
    """``allocator --help`` stays instant: the commands import these only when they run."""
    heavy = ("torch", "pandas", "sqlalchemy", "alembic", "onnxruntime", "grpc", "matplotlib")
    code = f"import sys, allocator.cli; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == ""


def test_every_import_inside_a_command_resolves():
    """Commands import their implementation when they run; a renamed name would only surface
    then. Resolve every such import now (this loads the trainer, so it is not instant)."""
    cli_dir = Path(allocator.cli.__file__).parent
    missing = []
    for source in sorted(cli_dir.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                module = importlib.import_module(node.module)
                missing += [
                    f"{source.name}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                    and importlib.util.find_spec(f"{node.module}.{alias.name}") is None
                ]
    assert not missing, missing
