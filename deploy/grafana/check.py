#!/usr/bin/env python3
"""Checks that every metric a Grafana dashboard queries is one the processes really export.

    deploy/grafana/check.py DASHBOARD.json SOURCE [SOURCE ...]
    deploy/grafana/check.py --self-test

A SOURCE is a file of Prometheus text exposition (what `GET /metrics` answers) or an
http(s):// URL to fetch it from; the check runs against the union of all of them (the gateway
and booking export different metrics). Every PromQL `expr` of every panel target (rows and
collapsed rows included) and every query variable (`label_values(...)`, `query_result(...)`)
is read loosely: function and aggregation names, keywords, label names inside `{...}` and
`by/without/on/ignoring/group_left/group_right (...)`, strings, numbers, durations, `[...]`
ranges, Grafana variables (`$__rate_interval`, `${job}`, `[[x]]`) and `#` comments are not
metric names; everything else is, and so is `__name__="..."` inside a selector.

A name counts as exported when a sample of that name is in a source, or a `# TYPE`/`# HELP`
line declares its family (so a metric that is registered but not yet observed counts, when
the exporter prints those lines for it): a histogram family `x` exposes `x_bucket`, `x_sum`
and `x_count` (never a bare `x`), a summary `x`, `x_sum` and `x_count`.

Exit status: 0 and one summary line when every name is exported; 1 and a FAIL line per
missing name (with its panel's title) otherwise; 2 when the dashboard or a source cannot be
read. Python 3 standard library only.
"""

import argparse
import difflib
import json
import re
import sys
import tempfile
import urllib.request
from pathlib import Path

IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Aggregation operators may be followed by `by (...)`/`without (...)` instead of `(`.
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}
KEYWORDS = {"bool", "offset", "and", "or", "unless", "atan2", "inf", "nan", "start", "end"}
# Keywords whose parenthesised list holds label names, not expressions.
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


# --- PromQL -------------------------------------------------------------------------------------
def _string_end(s: str, i: int) -> int:
    """Index just past the string literal starting at s[i] (", ' or `; backslash escapes
    except in raw `...` strings). An unterminated string runs to the end."""
    quote, j = s[i], i + 1
    while j < len(s):
        if s[j] == "\\" and quote != "`":
            j += 2
            continue
        if s[j] == quote:
            return j + 1
        j += 1
    return len(s)


def _unquote(lit: str) -> str:
    body = lit[1:-1] if len(lit) >= 2 else ""
    return body if lit.startswith("`") else re.sub(r"\\(.)", r"\1", body)


def _matcher_names(body: str) -> list[str]:
    """Metric names a selector's `{...}` body names: `__name__="x"`, a literal alternation
    `__name__=~"x|y"`, or a quoted name on its own (Prometheus 3: `{"x", job="a"}`)."""
    names, items, i = [], [], 0
    while i < len(body):  # tokens: identifiers, strings, operators, commas
        c = body[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            j = _string_end(body, i)
            items.append(("str", _unquote(body[i:j])))
            i = j
        elif m := IDENT.match(body, i):
            items.append(("id", m.group()))
            i = m.end()
        elif body.startswith(("=~", "!=", "!~"), i):
            items.append(("op", body[i:i + 2]))
            i += 2
        else:
            items.append(("op", c))
            i += 1
    groups, cur = [], []
    for it in items:
        if it == ("op", ","):
            groups.append(cur)
            cur = []
        else:
            cur.append(it)
    groups.append(cur)
    for g in groups:
        if len(g) == 1 and g[0][0] == "str":
            names.append(g[0][1])
        elif len(g) == 3 and g[0] == ("id", "__name__") and g[2][0] == "str":
            op, value = g[1][1], g[2][1]
            if op == "=":
                names.append(value)
            elif op == "=~" and re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*(\|[A-Za-z_:][A-Za-z0-9_:]*)*",
                                            value):
                names += value.split("|")
    return names


def _tokens(expr: str) -> list[tuple[str, str]]:
    toks, i, n = [], 0, len(expr)
    while i < n:
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":  # a comment, to the end of the line
            j = expr.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'`":
            j = _string_end(expr, i)
            toks.append(("str", expr[i:j]))
            i = j
        elif c == "$":  # Grafana variable: ${name[:format]} or $name
            if expr.startswith("${", i):
                j = expr.find("}", i)
                i = n if j < 0 else j + 1
            else:
                m = re.compile(r"\$[A-Za-z0-9_]*").match(expr, i)
                i = m.end()
            toks.append(("var", ""))
        elif c == "[":  # a range, a subquery's range:step, or a [[variable]]
            depth, j = 0, i
            while j < n:
                if expr[j] == "[":
                    depth += 1
                elif expr[j] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            i = j + 1
            toks.append(("range", ""))
        elif c == "{":  # label matchers; strings inside may hold braces
            j = i + 1
            while j < n and expr[j] != "}":
                j = _string_end(expr, j) if expr[j] in "\"'`" else j + 1
            toks.append(("sel", expr[i + 1:j]))
            i = j + 1
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            # numbers, hex, exponents and durations (0.99, 1e-3, 0x1f, 5m, 1h30m)
            m = re.compile(r"[0-9.]+(?:[eE][+-]?[0-9]+)?[A-Za-z0-9_.]*").match(expr, i)
            toks.append(("num", m.group()))
            i = m.end()
        elif m := IDENT.match(expr, i):
            toks.append(("id", m.group()))
            i = m.end()
        else:
            toks.append(("op", c))
            i += 1
    return toks


def metric_names(expr: str) -> list[str]:
    """The metric names a PromQL expression reads, in order of appearance, without repeats."""
    toks = _tokens(expr)
    names: list[str] = []
    i = 0
    while i < len(toks):
        kind, val = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "sel":
            names += _matcher_names(val)
        elif kind == "id":
            low = val.lower()
            if low in LABEL_LISTS:
                if nxt == ("op", "("):  # skip the label list
                    depth, i = 0, i + 1
                    while i < len(toks):
                        if toks[i] == ("op", "("):
                            depth += 1
                        elif toks[i] == ("op", ")"):
                            depth -= 1
                            if depth == 0:
                                break
                        i += 1
            elif nxt == ("op", "(") or low in AGGREGATIONS or low in KEYWORDS:
                pass  # a function call, an aggregation, a keyword
            else:
                names.append(val)
        i += 1
    return list(dict.fromkeys(names))


def variable_expr(query: str) -> str:
    """The PromQL inside a Grafana Prometheus variable query (`label_values(sel, label)`,
    `query_result(expr)`); "" for the forms that name no metric (`label_values(label)`,
    `label_names()`, `metrics(regex)`)."""
    q = query.strip()
    m = re.fullmatch(r"(label_values|query_result|label_names|metrics)\s*\((.*)\)", q, re.S)
    if not m:
        return q
    fn, args = m.groups()
    if fn == "query_result":
        return args
    if fn != "label_values":
        return ""
    depth, cut, i = 0, -1, 0  # the last top-level comma splits selector and label
    while i < len(args):
        c = args[i]
        if c in "\"'`":
            i = _string_end(args, i)
            continue
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            cut = i
        i += 1
    return args[:cut] if cut >= 0 else ""


# --- the dashboard ------------------------------------------------------------------------------
def queries(dashboard: dict) -> tuple[list[tuple[str, str]], int, int]:
    """(where, expr) for every panel target and query variable; the panel and variable counts."""
    if "dashboard" in dashboard and "panels" not in dashboard:  # the HTTP API's wrapper
        dashboard = dashboard["dashboard"]
    found: list[tuple[str, str]] = []
    panels = 0

    def walk(items: list) -> None:
        nonlocal panels
        for p in items or []:
            if not isinstance(p, dict):
                continue
            walk(p.get("panels", []))  # rows (collapsed ones keep their panels inside)
            if p.get("type") == "row":
                continue
            panels += 1
            title = p.get("title") or f"panel id {p.get('id')}"
            for t in p.get("targets", []) or []:
                if isinstance(t, dict) and isinstance(t.get("expr"), str) and t["expr"].strip():
                    found.append((f'panel "{title}" ({t.get("refId", "?")})', t["expr"]))

    walk(dashboard.get("panels", []))
    for row in dashboard.get("rows", []) or []:  # schemaVersion < 16
        walk(row.get("panels", []))
    variables = 0
    for v in (dashboard.get("templating") or {}).get("list", []) or []:
        if v.get("type") != "query":
            continue
        variables += 1
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        if isinstance(q, str) and variable_expr(q).strip():
            found.append((f'variable "${v.get("name")}"', variable_expr(q)))
    return found, panels, variables


# --- the exposition -----------------------------------------------------------------------------
SUFFIXES = {  # the sample names a declared family exposes
    "counter": ("", "_total"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("", "_info"),
}


def exported(text: str) -> set[str]:
    """Every metric name a text exposition offers: its samples' names and what its
    `# TYPE`/`# HELP` lines declare. Label values (which may hold braces, quotes, `#`) and
    comments never count: only a line's leading name is read."""
    samples, helped, types = set(), set(), {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 2)
            if len(parts) >= 2 and parts[0] in ("HELP", "TYPE"):
                rest = parts[1] + (" " + parts[2] if len(parts) > 2 else "")
                if rest.startswith('"'):  # a quoted name (Prometheus 3)
                    j = _string_end(rest, 0)
                    name, after = _unquote(rest[:j]), rest[j:].strip()
                else:
                    name, _, after = rest.partition(" ")
                if parts[0] == "TYPE":
                    types[name] = after.strip().lower() or "untyped"
                else:
                    helped.add(name)
            continue  # other comments, `# EOF`, `# UNIT`
        if line.startswith("{"):  # {"quoted.name", labels...} value
            j = 1
            while j < len(line) and line[j].isspace():
                j += 1
            if j < len(line) and line[j] == '"':
                samples.add(_unquote(line[j:_string_end(line, j)]))
            continue
        if m := IDENT.match(line):
            samples.add(m.group())
    names = set(samples)
    for name in helped | set(types):
        for suffix in SUFFIXES.get(types.get(name, "untyped"), ("",)):
            if not (suffix == "_total" and name.endswith("_total")):
                names.add(name + suffix)
    return names


def read_source(src: str) -> str:
    if re.match(r"https?://", src):
        with urllib.request.urlopen(src, timeout=10) as r:  # noqa: S310 (the operator's URL)
            return r.read().decode("utf-8", "replace")
    return Path(src).read_text(encoding="utf-8", errors="replace")


# --- the check ----------------------------------------------------------------------------------
def check(dashboard_path: str, sources: list[str]) -> tuple[list[str], str]:
    """(FAIL lines, summary). Raises OSError/ValueError when an input cannot be read."""
    dashboard = json.loads(Path(dashboard_path).read_text(encoding="utf-8"))
    found, panels, variables = queries(dashboard)
    names: set[str] = set()
    for src in sources:
        names |= exported(read_source(src))
    failures, checked = [], set()
    for where, expr in found:
        for name in metric_names(expr):
            checked.add(name)
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
                hint = f" (did you mean {close[0]}?)" if close else ""
                failures.append(f"{where}: {name} is not exported by any source{hint}")
    summary = (f"{panels} panels, {variables} variables, {len(found)} queries, "
               f"{len(checked)} metric names checked against {len(sources)} source(s)")
    return failures, summary


# --- self-test ----------------------------------------------------------------------------------
SELF_TEST_EXPOSITION = r"""# HELP demo_latency_seconds Request latency (registered, nothing observed yet)
# TYPE demo_latency_seconds histogram
# HELP demo_requests_total Requests by code
# TYPE demo_requests_total counter
demo_requests_total{code="409",msg="a } b { c # not a comment"} 3
demo_requests_total{code="200",msg="quote \" and brace }"} 7
# a comment naming not_a_metric_total 1
# TYPE demo_queue gauge
demo_queue{event="x"} 12
demo_up 1
"""

SELF_TEST_EXTRACTION = [  # (expr, the names it must yield)
    ('histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{route=~"/x{1,2}"}'
     "[$__rate_interval])))", ["a_bucket"]),
    ('sum without (instance) (increase(b_total{msg="}{"}[5m] offset 1m)) / on (job) '
     "group_left (x) c", ["b_total", "c"]),
    ('sum(rate(d_total[${__rate_interval}])) by (kind) # e_total is in a comment', ["d_total"]),
    ('{__name__="f", job="$job"} or {__name__=~"g|h"} or {"i.j"} > bool 1e3', ["f", "g", "h", "i.j"]),
    ("max_over_time(k[1h:30s]) and count(l) * 60 + topk(3, m) - [[var]]", ["k", "l", "m"]),
    ("label_replace(n, \"dst\", \"$1\", \"src\", \"(.*)\") unless o @ start()", ["n", "o"]),
]


def self_test() -> list[str]:
    """Errors (empty: extraction, a passing dashboard and each failing one behave)."""
    failures = []
    for expr, want in SELF_TEST_EXTRACTION:
        got = metric_names(expr)
        if got != want:
            failures.append(f"self-test: metric_names({expr!r}) = {got}, want {want}")
    ok = {
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "query": "prometheus"},
            {"type": "query", "name": "event",
             "query": {"query": 'label_values(demo_queue{job=~"$job"}, event)', "refId": "A"}},
            {"type": "query", "name": "job", "query": "label_values(job)"},
        ]},
        "panels": [
            {"type": "row", "title": "row", "collapsed": True, "panels": [
                {"type": "timeseries", "title": "p99", "targets": [{"refId": "A", "expr":
                 'histogram_quantile(0.99, sum by (le) (rate(demo_latency_seconds_bucket'
                 '{route!~"/x{1,2}\\"}"}[$__rate_interval])))'}]},
            ]},
            {"type": "timeseries", "title": "409s", "targets": [{"refId": "A", "expr":
             'sum by (code) (rate(demo_requests_total{code="409"}[5m])) # per second'}]},
            {"type": "stat", "title": "queue", "targets": [
                {"refId": "A", "expr": 'max(demo_queue) and on() demo_up == 1'},
                {"refId": "B", "expr": "demo_latency_seconds_count / demo_latency_seconds_sum"}]},
            {"type": "text", "title": "notes"},
        ],
    }
    with tempfile.TemporaryDirectory(prefix="grafana-selftest-") as tmp:
        metrics = Path(tmp, "metrics.txt")
        metrics.write_text(SELF_TEST_EXPOSITION)

        def run(name: str, dashboard: dict) -> tuple[list[str], str]:
            path = Path(tmp, name + ".json")
            path.write_text(json.dumps(dashboard))
            return check(str(path), [str(metrics)])

        errors, summary = run("ok", ok)
        if errors or not summary.startswith("4 panels, 2 variables, 5 queries, 6 metric names"):
            failures.append(f"self-test 'a dashboard of exported metrics': {errors} / {summary}")
        else:
            print(f"  self-test: a dashboard of exported metrics: passes ({summary})")
        cases = [  # (name, the query that breaks it, the phrase its FAIL line must hold)
            ("a misspelt metric", 'sum(rate(demo_requets_total[5m]))',
             'panel "broken" (A): demo_requets_total is not exported by any source '
             "(did you mean demo_requests_total?)"),
            ("a histogram queried without _bucket", "histogram_quantile(0.9, demo_latency_seconds)",
             'panel "broken" (A): demo_latency_seconds is not exported'),
            ("a name only a comment of the exposition mentions", "rate(not_a_metric_total[1m])",
             "not_a_metric_total is not exported"),
        ]
        for name, expr, expect in cases:
            broken = json.loads(json.dumps(ok))
            broken["panels"].append({"type": "timeseries", "title": "broken",
                                     "targets": [{"refId": "A", "expr": expr}]})
            errors, _ = run("broken", broken)
            if len(errors) != 1 or expect not in errors[0]:
                failures.append(f"self-test '{name}': want one FAIL with {expect!r}, got {errors}")
            else:
                print(f"  self-test: {name}: rejected: {errors[0]}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true",
                        help="prove the check on a built-in dashboard and exposition")
    parser.add_argument("dashboard", nargs="?", help="the dashboard JSON")
    parser.add_argument("sources", nargs="*", help="/metrics text files or http(s) URLs")
    args = parser.parse_args()
    if args.self_test:
        failures = self_test()
        if failures:
            print("\n".join(f"FAIL {f}" for f in failures))
            return 1
        print(f"ok: self-test: {len(SELF_TEST_EXTRACTION)} expressions parsed, "
              "a good dashboard passes, 3 broken ones rejected")
        if not args.dashboard:
            return 0
    if not args.dashboard or not args.sources:
        parser.error("a dashboard and at least one exposition source are required")
    try:
        failures, summary = check(args.dashboard, args.sources)
    except (OSError, ValueError) as e:  # unreadable files, bad JSON, unreachable URLs
        print(f"FAIL cannot read the inputs: {e}")
        return 2
    if failures:
        print("\n".join(f"FAIL {f}" for f in failures))
        print(f"{len(failures)} missing metric name(s) in {args.dashboard} ({summary})")
        return 1
    print(f"ok: {args.dashboard}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
