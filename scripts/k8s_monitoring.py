#!/usr/bin/env python
"""Render the Kubernetes monitoring resources from the files in ``monitoring/``.

``monitoring/alerts.yml`` and ``monitoring/dashboards/*.json`` are the one definition of the
alert rules and dashboards: compose mounts them as they are, and this script wraps them for the
Prometheus Operator and Grafana's dashboard sidecar, into ``deploy/k8s/components/monitoring/``:

- ``prometheus-rule.yaml``: a PrometheusRule whose groups are the rule file's groups;
- ``dashboards.yaml``: one ConfigMap per dashboard, labelled ``grafana_dashboard: "1"`` (the
  sidecar's default label), the JSON file verbatim under ``allocator-<name>.json``.

``tests/deploy/test_k8s_monitoring.py`` fails when the checked-in files differ from what this
renders.

Usage:
  python scripts/k8s_monitoring.py            # print what would be written
  python scripts/k8s_monitoring.py --write    # write the files
  python scripts/k8s_monitoring.py --check    # exit 1 when a file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "monitoring"
COMPONENT = ROOT / "deploy" / "k8s" / "components" / "monitoring"
NAMESPACE = "allocator"
LABELS = {
    "app.kubernetes.io/name": "allocator",
    "app.kubernetes.io/component": "monitoring",
    "app.kubernetes.io/part-of": "allocator",  # what the base's kustomize labels give the rest
}
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
DASHBOARD_FOLDER = {"grafana_folder": "Allocator"}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, dashboard JSON) as literal blocks, readable in a diff."""


def _string(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _string)


def dump(documents: list[dict[str, Any]], source: str) -> str:
    header = f"# Generated from {source} by scripts/k8s_monitoring.py: do not edit.\n"
    body = yaml.dump_all(
        documents, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100
    )
    return header + body


def prometheus_rule() -> str:
    groups = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "allocator", "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {"groups": groups},
    }
    return dump([rule], "monitoring/alerts.yml")


def dashboards() -> str:
    maps = []
    for path in sorted((MONITORING / "dashboards").glob("*.json")):
        maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"allocator-dashboard-{path.stem}",
                    "namespace": NAMESPACE,
                    "labels": {**LABELS, **DASHBOARD_LABEL},
                    "annotations": dict(DASHBOARD_FOLDER),
                },
                "data": {f"allocator-{path.stem}.json": path.read_text()},
            }
        )
    return dump(maps, "monitoring/dashboards/*.json")


def render() -> dict[Path, str]:
    """Every generated file and its content."""
    return {
        COMPONENT / "prometheus-rule.yaml": prometheus_rule(),
        COMPONENT / "dashboards.yaml": dashboards(),
    }


def stale() -> list[Path]:
    return [
        path for path, text in render().items() if not path.exists() or path.read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the generated files")
    mode.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            print(f"{path.relative_to(ROOT)} is stale: run scripts/k8s_monitoring.py --write")
        return 1 if old else 0
    for path, text in render().items():
        if args.write:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
        else:
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
