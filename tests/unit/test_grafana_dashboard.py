"""deploy/grafana/vramfabric.json asks only for metrics and labels the code exports.

The exported names come from the registries WorkerMetrics and CoordinatorMetrics build, not
from a list; the queries are read by a small PromQL lexer here and, where promtool is on PATH,
checked by Prometheus's own parser.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from vramfabric.coordinator.metrics import CoordinatorMetrics
from vramfabric.worker.node.metrics import WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "vramfabric.json"
# PromQL's words that are not metric names: the functions and operators these queries may use.
FUNCTIONS = {"sum", "avg", "min", "max", "count", "topk", "bottomk", "rate", "irate", "increase"}
FUNCTIONS |= {"histogram_quantile", "clamp_min", "clamp_max", "abs", "delta", "deriv"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
OPERATORS = {"and", "or", "unless", "bool", "offset"}
# A string, a range or subquery (skipped whole: it may hold Grafana's `$__rate_interval`), a
# name, or any other single character.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|\S')
# Grafana's variables, and what stands for them when promtool parses a query.
_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$tenant": ".*"}


def samples() -> Iterator[tuple[str, str, set[str]]]:
    """(family, sample name, label names) of every sample the metrics classes export."""
    for metrics in (WorkerMetrics(), CoordinatorMetrics()):
        for field in attrs.fields(type(metrics)):
            metric = getattr(metrics, field.name)
            if isinstance(metric, MetricWrapperBase) and metric._labelnames:
                # A labelled metric shows samples only once a child exists: make one.
                metric.labels(*metric._labelnames)
        for family in metrics.registry.collect():
            for sample in family.samples:
                yield family.name, sample.name, set(sample.labels)


def exported() -> dict[str, set[str]]:
    """Every sample name exported (a counter's `_total`), with its labels (`le` on buckets)."""
    names: dict[str, set[str]] = {}
    for _, name, labels in samples():
        names.setdefault(name, set()).update(labels)
    return names


def families() -> dict[str, set[str]]:
    """Every metric family exported, with its sample names."""
    found: dict[str, set[str]] = {}
    for family, name, _ in samples():
        found.setdefault(family, set()).add(name)
    return found


def dashboard() -> dict[str, Any]:
    """The dashboard, parsed."""
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def queries() -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) of every query target."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


@attrs.frozen
class Query:
    """What one PromQL expression names: metrics, the labels it matches on, its grouping."""

    metrics: frozenset[str]
    matched: frozenset[tuple[str, str]]
    grouping: frozenset[str]


def read(expr: str) -> Query:
    """The names in `expr`; AssertionError on a word that is no metric, function or keyword."""
    tokens = [t for t in _TOKEN.findall(expr) if not t.startswith("[")]
    metrics: set[str] = set()
    matched: set[tuple[str, str]] = set()
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        word, after = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
        if word in GROUPING:
            assert after == "(", f"{word} without a label list in {expr!r}"
            end = tokens.index(")", i)
            grouping |= {t for t in tokens[i + 2 : end] if t != ","}
            i = end
        elif word == "{":
            raise AssertionError(f"a selector without a metric name in {expr!r}")
        elif re.fullmatch(r"[A-Za-z_:]\w*", word) and word not in OPERATORS:
            if word in FUNCTIONS:
                assert after == "(" or after in GROUPING, f"{word} called how? {expr!r}"
            elif after == "(":
                raise AssertionError(f"{word}(...) is no PromQL function here: {expr!r}")
            else:
                metrics.add(word)
                if after == "{":
                    end = tokens.index("}", i)
                    matched |= {
                        (word, tokens[j]) for j in range(i + 2, end) if _is_label(tokens, j)
                    }
                    i = end
        i += 1
    return Query(frozenset(metrics), frozenset(matched), frozenset(grouping))


def _is_label(tokens: list[str], j: int) -> bool:
    """Whether tokens[j] is a label name in a matcher list (`label op "value"`)."""
    return bool(re.fullmatch(r"[A-Za-z_]\w*", tokens[j])) and tokens[j + 1] in ("=", "!")


def problems(expr: str, known: dict[str, set[str]]) -> list[str]:
    """What `expr` names that the code does not export: metrics, matched or grouping labels."""
    query = read(expr)
    found = [] if query.metrics else ["no metric"]
    for metric in sorted(query.metrics):
        if metric not in known:
            found.append(f"{metric} is not exported")
        # Grouping by a label only some of the metrics carry would merge series silently.
        elif missing := query.grouping - known[metric]:
            found.append(f"{metric} has no label {sorted(missing)} to group by")
    found += [f"{m} has no label {label}" for m, label in query.matched if label not in known[m]]
    return found


def test_every_query_names_only_exported_metrics_and_their_labels() -> None:
    known = exported()
    for title, expr in queries():
        assert not problems(expr, known), f"{title}: {expr!r}: {problems(expr, known)}"


def test_the_tenant_variable_reads_an_exported_label() -> None:
    known = exported()
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        assert match[2] in known[match[1]], variable["query"]


def test_every_exported_metric_has_a_panel() -> None:
    # Given the metric families the code exports, and the metrics the queries name
    shown = {metric for _, expr in queries() for metric in read(expr).metrics}
    # Then each family is shown somewhere: a metric added without a panel fails here
    missing = sorted(name for name, samples in families().items() if not samples & shown)
    assert not missing, f"exported but on no panel of {DASHBOARD.name}: {missing}"


def test_panels_use_the_datasource_variable_and_have_unique_ids() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_a_misspelled_metric_label_or_function_is_caught() -> None:
    known = exported()
    # Given a query the dashboard could hold, Then it reads as its metric, labels and grouping
    assert read('sum by (tenant) (rate(chunks_done_total{tenant=~"$tenant"}[5m]))') == Query(
        frozenset({"chunks_done_total"}),
        frozenset({("chunks_done_total", "tenant")}),
        frozenset({"tenant"}),
    )
    # And a name the code does not export is a problem, wherever it stands
    assert problems("rate(chunks_don_total[5m])", known) == ["chunks_don_total is not exported"]
    assert problems('gpu_leases_active{node="a"}', known) == ["gpu_leases_active has no label node"]
    assert problems("sum by (node) (gpu_leases_active)", known) == [
        "gpu_leases_active has no label ['node'] to group by"
    ]
    with pytest.raises(AssertionError, match="no PromQL function"):
        read("summ(gpu_leases_active)")


def test_every_query_parses_with_prometheus_own_parser(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (the lexer above still checks every name)")
    # Given every query as a recording rule, Grafana's variables replaced by values
    rules = []
    for n, (_, expr) in enumerate(queries()):
        for variable, value in _VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"vramfabric:query{n}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    # When promtool checks them, Then each one parses
    out = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
