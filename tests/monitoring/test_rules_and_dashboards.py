"""The alert rules and dashboards as files: ``promtool`` checks and unit-tests the rules (every
alert fires in one test and stays quiet in another, every alert links its runbook section), the
dashboards are well formed and query only metrics that exist.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.monitoring.files import (
    ALERTS,
    ALERTS_TEST,
    DASHBOARDS,
    MONITORING,
    REPO_ROOT,
    SERVER_SERVICE,
    alert_rules,
    all_panels,
    all_promql,
    datasource_kind,
    defined_metric_names,
    load_dashboard,
    promtool,
    shipped_server_scrape,
)
from tests.test_docs import anchors


def test_alert_rules_pass_promtool_check() -> None:
    output = promtool("check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(alert_rules())} rules found" in output


def test_alert_rules_pass_their_promtool_unit_tests() -> None:
    promtool("test", "rules", ALERTS_TEST.name, cwd=MONITORING)


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases: dict[str, list[bool]] = {}
    for group in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    for rule in alert_rules():
        outcomes = cases.get(rule["alert"], [])
        assert True in outcomes, f"{rule['alert']}: no unit test where it fires"
        assert False in outcomes, f"{rule['alert']}: no unit test where it stays quiet"


def test_every_alert_links_its_runbook_section() -> None:
    for rule in alert_rules():
        url = rule["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path.startswith("docs/"), f"{rule['alert']}: runbook_url {url!r} not into docs/"
        document = REPO_ROOT / path
        assert document.is_file(), f"{rule['alert']}: {path} does not exist"
        assert anchor in anchors(document), f"{rule['alert']}: no section #{anchor} in {path}"


def test_server_rules_select_the_service_label_not_a_job_name() -> None:
    """Scrape configs name the job differently (compose, ServiceMonitor, annotations); the
    Service's name is what they share, so a rule that selects a job name fires forever under
    the others (``absent``) or never."""
    for where, expr in all_promql():
        assert 'job="allocator-server"' not in expr, where
    (down,) = [r for r in alert_rules() if r["alert"] == "AllocatorServerDown"]
    selector = f'up{{service="{SERVER_SERVICE}"}}'
    assert down["expr"].split() == [selector, "==", "0", "or", f"absent({selector})"]
    shipped = shipped_server_scrape(["x:1"])["static_configs"][0]
    assert shipped["labels"]["service"] == SERVER_SERVICE


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_is_well_formed(name: str) -> None:
    dashboard = load_dashboard(name)
    assert dashboard["uid"] == f"allocator-{name}"
    assert dashboard["title"]
    assert dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in all_panels(dashboard):
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{panel['title']}: say what the panel shows"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, f"{panel['title']}: no queries"
        assert len(refs) == len(set(refs)), f"{panel['title']}: refIds {refs}"
        for target in panel["targets"]:
            datasource_kind(dashboard, target.get("datasource") or panel.get("datasource"))


def test_queries_name_only_metrics_that_exist() -> None:
    """A typo in a metric name returns nothing without an error: catch it before Prometheus."""
    known = defined_metric_names()
    for where, expr in all_promql():
        code = re.sub(r'"[^"]*"', '""', expr)  # label values are not metric names
        for metric in re.findall(r"\b(allocator_[a-z_]+|up)\b", code):
            assert metric in known, f"{where}: unknown metric {metric} in {expr}"
