"""The configuration reference in docs/operations.md is what the script renders now, and the
server's flags are its config fields with the config defaults.
"""

from __future__ import annotations

import click

from allocator.serving.server import ServerConfig
from tests.deploy.helpers import (
    REFERENCE,
    ROOT,
)


def test_configuration_reference_is_current():
    document = (ROOT / "docs/operations.md").read_text()
    assert REFERENCE.splice(document, REFERENCE.render()) == document, (
        "docs/operations.md is stale: run python scripts/config_reference.py --write"
    )


def test_configuration_reference_covers_every_setting():
    from allocator.trainer.jobs.retrain.config import RetrainConfig
    from allocator.trainer.jobs.retrain.gates import GateSettings
    from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig

    section = REFERENCE.render()
    for model in (ServerConfig, RetrainConfig, GateSettings, WalkForwardConfig):
        for name in model.model_fields:
            assert f"| `{name}` |" in section, f"{model.__name__}.{name}"
    # A setting the CLI renamed or negated is shown with the flag that sets it.
    assert "| `default_model` | `--model` |" in section
    assert "| `prefer_cuda` | `--cpu` (negated) |" in section


def test_serve_flags_are_config_fields_left_unset_by_default():
    """Each flag sets a ServerConfig field, and only when given: a flag default would hide
    the ALLOCATOR_* variable and the --config file (the reference shows the config's
    defaults)."""
    from allocator.cli.serve import serve

    fields = ServerConfig.model_fields
    negated = {flag: field for field, flag in REFERENCE.negated_flags().items()}
    for param in serve.params:
        assert isinstance(param, click.Option)
        if param.name == "config_file":
            continue
        if param.name in negated:
            assert fields[negated[param.name]].default is True  # the flag turns it off
            assert not param.required
            continue
        assert param.name in fields, f"--{param.name} sets no ServerConfig field"
        assert not param.required, f"--{param.name}: ALLOCATOR_* or --config may set it"
        assert param.default is None, f"--{param.name}"
