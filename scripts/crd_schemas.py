#!/usr/bin/env python
"""Write the JSON schemas of the Prometheus Operator resources the deploy tests validate.

``kubernetes-validate`` knows the built-in Kubernetes kinds only; the ServiceMonitor and the
PrometheusRule of ``deploy/k8s/components/monitoring`` are custom resources, defined by the
Prometheus Operator's CRDs. The tests run offline, so their schemas live in
``tests/fixtures/k8s_schemas/``, small: derived from the typed models that
``cloudcoil-models-prometheus-operator`` (PyPI, Apache-2.0) generates from those CRDs, without
descriptions and titles, with ``null`` dropped where the CRD has a plain type, and strict like
the built-in validation (``additionalProperties: false`` on every object with known fields, so
a misspelt field fails).

The models are not a project dependency; regenerate in a throwaway virtualenv:

  python -m venv /tmp/crd
  /tmp/crd/bin/pip install 'cloudcoil-models-prometheus-operator==0.80.1.0'
  /tmp/crd/bin/python scripts/crd_schemas.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "k8s_schemas"
KINDS = ("ServiceMonitor", "PrometheusRule")
DROPPED = {"title", "description", "default"}


def tighten(node: Any) -> Any:
    """The schema without prose and defaults, ``X | null`` as ``X``, objects closed."""
    if isinstance(node, list):
        return [tighten(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: tighten(value) for key, value in node.items() if key not in DROPPED}
    options = out.get("anyOf")
    if isinstance(options, list):
        kept = [option for option in options if option != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(options):
            del out["anyOf"]
            out.update(kept[0])
        elif len(kept) < len(options):
            out["anyOf"] = kept
    if out.get("properties") and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def schema(kind: str) -> dict[str, Any]:
    from cloudcoil.models.prometheus_operator import v1  # not a project dependency

    model = getattr(v1, kind)
    tight: dict[str, Any] = tighten(model.model_json_schema(by_alias=True, mode="validation"))
    tight["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    tight["required"] = sorted({*tight.get("required", []), "apiVersion", "kind", "spec"})
    return tight


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        path = OUT / f"monitoring.coreos.com_v1_{kind.lower()}.json"
        path.write_text(json.dumps(schema(kind), indent=1, sort_keys=True) + "\n")
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
