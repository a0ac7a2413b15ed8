"""One self-contained HTML page from a ``fusion_result.json`` (``ascendfuse report FILE --html``,
``ascendfuse compile ... --html``): works offline, no external scripts, styles or fonts.

* the graph before fusion (the import) and after it side by side, each kernel a coloured box around its ops
  (layout by Graphviz's ``dot``, rendered to SVG when the page is written and embedded in it; hover a box or
  an op for its name, rule and shape);
* the traffic table (kernel launches, GM bytes counted on the TIR, *modeled* NPU time) for TVM's default
  fusion, ours and the compulsory lower bound;
* per kernel: source ops, pattern, schedule rule, UB bytes as a bar against the target's usable UB, counted
  GM bytes and modeled time against the same ops unfused;
* the merges and rewrites that did not happen, with their reasons; the ``--verify`` result when present.

Graphviz (the ``graphviz`` Python package and the ``dot`` program) is needed for the drawings only: without
it the page says so and still has every table.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

# Fill colours for kernel boxes (light, distinct; cycled).
PALETTE = ["#fde2e4", "#e2ece9", "#dfe7fd", "#fff1c1", "#e8dff5", "#d7f2f7", "#fce1c8", "#e3f6d5",
           "#f6d6e8", "#dbe2ef", "#f9f0d9", "#d9f0e3"]
BORDER = ["#c9184a", "#2d6a4f", "#3a56c4", "#b08900", "#6a3fa0", "#087e8b", "#c2571a", "#4f8a10",
          "#a4136f", "#3d5a80", "#8a6d1e", "#1b7f4b"]


class GraphvizMissing(Exception):
    pass


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _svg(dot_source: str) -> str:
    try:
        import graphviz
    except ImportError:
        raise GraphvizMissing("the 'graphviz' Python package is not installed (pip install graphviz)") from None
    try:
        svg = graphviz.Source(dot_source, format="svg").pipe(encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise GraphvizMissing("Graphviz's 'dot' program is not installed (Debian: apt-get install graphviz)") \
            from None
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_lines(nodes, prefix: str, fill: dict | None = None) -> dict[int, str]:
    out = {}
    for i, (label, shape) in enumerate(nodes):
        is_input = str(label).startswith("input ")
        attrs = {"label": f"{label}\n{shape}" if shape else label, "tooltip": f"{label} {shape}".strip(),
                 "id": f"{prefix}n{i}"}
        if is_input:
            attrs.update(shape="oval", style="filled", fillcolor="#ffffff")
        out[i] = f"{prefix}n{i} [" + ", ".join(f"{k}={_q(v)}" for k, v in attrs.items()) + "];"
    return out


def dot_before(graph: dict) -> str:
    lines = ["digraph before {", 'graph [rankdir=TB, fontname="Helvetica", nodesep=0.2, ranksep=0.3];',
             'node [shape=box, style="rounded,filled", fillcolor="#f1f3f5", color="#868e96", fontname="Helvetica",'
             ' fontsize=10, height=0.3];', 'edge [color="#868e96", arrowsize=0.6];']
    lines += _node_lines(graph["nodes"], "b").values()
    lines += [f"bn{a} -> bn{b};" for a, b in graph["edges"]]
    return "\n".join(lines + ["}"])


def dot_after(graph: dict, kernel_info: dict) -> str:
    lines = ["digraph after {", 'graph [rankdir=TB, fontname="Helvetica", nodesep=0.2, ranksep=0.3];',
             'node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#868e96", fontname="Helvetica",'
             ' fontsize=10, height=0.3];', 'edge [color="#868e96", arrowsize=0.6];']
    nodes = _node_lines(graph["nodes"], "a")
    placed = set()
    for k, kern in enumerate(graph.get("kernels", [])):
        info = kernel_info.get(kern["name"], {})
        idx = info.get("index", k)
        title = f"K{idx + 1} {info.get('rule') or ''}".strip()
        tip = f"{info.get('display_name', kern['name'])} | rule {info.get('rule')} | pattern {info.get('pattern')}"
        lines.append(f"subgraph cluster_k{k} {{")
        lines.append(f'id={_q(f"kernel{idx + 1}")}; class="kernel"; label={_q(title)}; tooltip={_q(tip)}; '
                     f'style="rounded,filled"; fillcolor={_q(PALETTE[idx % len(PALETTE)])}; '
                     f'color={_q(BORDER[idx % len(BORDER)])}; penwidth=2; fontsize=11;')
        for n in kern["nodes"]:
            lines.append(nodes[n])
            placed.add(n)
        lines.append("}")
    lines += [line for i, line in nodes.items() if i not in placed]
    lines += [f"an{a} -> an{b};" for a, b in graph["edges"]]
    return "\n".join(lines + ["}"])


# ---- tables ---------------------------------------------------------------------------------------------
def _mb(b) -> str:
    return f"{b / 1e6:.2f}" if isinstance(b, (int, float)) else "–"


def _us(t) -> str:
    return f"{t:.1f}" if isinstance(t, (int, float)) else "–"


def traffic_rows(report: dict) -> list[tuple[str, dict]]:
    t = report.get("traffic") or {}
    return [(label, t[key]) for key, label in (("tvm_default", "TVM default fusion"), ("ours", "ascendfuse"),
                                                ("lower_bound", "lower bound (compulsory)")) if key in t]


def kernel_rows(report: dict) -> list[dict]:
    """One row per kernel with what the page and the terminal show."""
    traffic_k = (report.get("traffic") or {}).get("kernels", {})
    groups = {g.get("name"): g for g in (report.get("grouping") or {}).get("groups", [])}
    ub = report.get("ub_usage") or {}
    cap = (report.get("target_capacity") or {}).get("ub_usable_bytes")
    rows = []
    for i, k in enumerate(report.get("kernels", [])):
        src = k.get("source_name", k["name"])
        t = traffic_k.get(src) or traffic_k.get(k["name"]) or {}
        g = groups.get(src, {})
        rows.append({
            "index": i, "name": k["name"], "source_name": src, "ops": k.get("ops", []), "pattern": k.get("pattern"),
            "rule": k.get("rule"), "launches": k.get("launches", 1),
            "ub_bytes": k.get("ub_bytes", (ub.get(k["name"]) or {}).get("ub_bytes")), "ub_capacity": cap,
            "gm_bytes": t.get("gm_bytes"), "modeled_time_us": t.get("modeled_time_us"),
            "modeled_time_us_unfused": g.get("modeled_time_us_unfused"), "precision": k.get("precision"),
        })
    return rows


def refusal_rows(report: dict) -> list[dict]:
    out = []
    for cat in ("graph_fusion", "ub_fusion", "other"):
        for name, rec in (report.get(cat) or {}).items():
            for e in rec.get("not_effective", []):
                detail = {k: v for k, v in e.items() if k not in ("reason", "where")}
                out.append({"pass": name, "reason": e.get("reason"), "where": e.get("where", ""),
                            "detail": "; ".join(f"{k}: {v}" for k, v in detail.items())})
    return out


CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:16px;color:#212529;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #dee2e6}
.meta{color:#495057;font-size:13px} .note{color:#868e96;font-size:12px}
table{border-collapse:collapse;font-size:12px} th,td{border:1px solid #dee2e6;padding:3px 6px;text-align:left;
vertical-align:top} th{background:#f8f9fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.graphs{display:flex;gap:12px;align-items:flex-start} .graph{flex:1;min-width:0;border:1px solid #dee2e6;
padding:6px;overflow:auto;max-height:80vh} .graph h3{font-size:13px;margin:0 0 6px}
.graph svg{max-width:100%;height:auto}
.bar{position:relative;width:160px;height:12px;background:#e9ecef;border-radius:2px}
.bar span{position:absolute;left:0;top:0;bottom:0;background:#4c6ef5;border-radius:2px}
.bar.over span{background:#e03131} .sw{display:inline-block;width:12px;height:12px;border:2px solid;
vertical-align:middle;margin-right:4px} tr.kernel-row{cursor:pointer} tr.kernel-row.sel td{background:#fff3bf}
g.kernel.sel > path,g.kernel.sel > polygon{stroke-width:5} .ok{color:#2b8a3e;font-weight:bold}
.bad{color:#c92a2a;font-weight:bold} .ops{max-width:420px;word-break:break-word}
"""

# Clicking a kernel row outlines its box in the after-fusion drawing (and the reverse).
JS = """
(function () {
  function select(idx) {
    document.querySelectorAll('.sel').forEach(function (e) { e.classList.remove('sel'); });
    var row = document.getElementById('row' + idx), box = document.getElementById('kernel' + idx);
    if (row) { row.classList.add('sel'); }
    if (box) { box.classList.add('sel'); box.scrollIntoView({block: 'nearest'}); }
  }
  document.querySelectorAll('tr.kernel-row').forEach(function (row) {
    row.addEventListener('click', function () { select(row.getAttribute('data-k')); });
  });
  document.querySelectorAll('g.kernel').forEach(function (box) {
    box.addEventListener('click', function () { select(box.id.replace('kernel', '')); });
  });
})();
"""


def _ub_bar(row: dict) -> str:
    b, cap = row.get("ub_bytes"), row.get("ub_capacity")
    if not isinstance(b, (int, float)):
        return "–"
    if not cap:
        return f"{b:,} B"
    frac = b / cap
    cls = "bar over" if frac > 1 else "bar"
    return (f'<div class="{cls}" title="{b:,} of {cap:,} bytes usable UB"><span style="width:{min(frac, 1) * 100:.1f}%">'
            f'</span></div><span class="note">{b:,} B ({frac * 100:.1f}%)</span>')


def precision_cell(row: dict) -> str:
    """A kernel's GM dtypes (it computes in float32 on the host), e.g. ``f16,f32 → f16``."""
    from .precision.modes import short_dtypes

    p = row.get("precision")
    return "f32" if not p else f"{','.join(short_dtypes(p['inputs']))} → {short_dtypes([p['output']])[0]}"


def render_html(report: dict, title: str | None = None) -> str:
    """The page for one report (a ``fusion_result.json`` as a dict)."""
    summary = report.get("summary") or {}
    model = summary.get("model") or title or "model"
    rows = kernel_rows(report)
    info = {r["source_name"]: {"index": r["index"], "rule": r["rule"], "pattern": r["pattern"],
                               "display_name": r["name"]} for r in rows}
    info.update({r["name"]: info[r["source_name"]] for r in rows})
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>ascendfuse report: {_esc(model)}"
             f"</title><style>{CSS}</style></head><body>",
             f"<h1>Fusion report: {_esc(model)}</h1>",
             f"<div class='meta'>target {_esc(report.get('target'))} · kernels {len(rows)} · launches "
             f"{sum(r['launches'] for r in rows)}"
             + (f" · ops before {_esc(summary.get('ops_before'))}" if summary.get("ops_before") is not None else "")
             + "</div><div class='note'>GM bytes are counted on the generated TIR; NPU times are modeled from the "
               "target description, not measured.</div>"]

    # traffic
    trows = traffic_rows(report)
    if trows:
        parts.append("<h2>Traffic</h2><table><tr><th></th><th>kernel launches</th><th>GM MB (counted)</th>"
                     "<th>NPU µs (modeled)</th></tr>")
        for label, t in trows:
            parts.append(f"<tr><td>{_esc(label)}</td><td class='num'>{_esc(t.get('launches', '–'))}</td>"
                         f"<td class='num'>{_mb(t.get('gm_bytes'))}</td><td class='num'>"
                         f"{_us(t.get('modeled_time_us'))}</td></tr>")
        parts.append("</table>")

    # graphs
    parts.append("<h2>Graph before and after fusion</h2>")
    before, after = report.get("graph_before") or {}, report.get("graph_after") or {}
    try:
        if not before.get("nodes") or not after.get("nodes"):
            reason = before.get("omitted") or after.get("omitted") or "this report has no recorded graph " \
                     "(written by an older version)"
            raise GraphvizMissing(reason)
        svg_before, svg_after = _svg(dot_before(before)), _svg(dot_after(after, info))
        parts.append("<div class='graphs'>"
                     f"<div class='graph' id='graph-before'><h3>before: the import ({len(before['nodes'])} nodes)</h3>"
                     f"{svg_before}</div>"
                     f"<div class='graph' id='graph-after'><h3>after: {len(after.get('kernels', []))} kernels, each a "
                     f"box around its ops</h3>{svg_after}</div></div>")
    except GraphvizMissing as why:
        parts.append(f"<p class='note' id='no-graph'>Graph not drawn: {_esc(why)}.</p>")

    # kernels
    sixteen = any(r["precision"] for r in rows)   # a precision mode stores some tensors in 16 bits
    parts.append("<h2>Kernels</h2><table><tr><th>#</th><th>kernel</th><th>source ops</th><th>pattern</th>"
                 "<th>schedule rule</th><th>UB (usable)</th><th>GM bytes (counted)</th><th>NPU µs (modeled)</th>"
                 "<th>same ops unfused µs (modeled)</th>" + ("<th>GM dtypes (in → out)</th>" if sixteen else "")
                 + "</tr>")
    for r in rows:
        i = r["index"]
        sw = f"<span class='sw' style='background:{PALETTE[i % len(PALETTE)]};border-color:{BORDER[i % len(BORDER)]}'>" \
             "</span>"
        gm = f"{r['gm_bytes']:,}" if isinstance(r["gm_bytes"], (int, float)) else "–"
        parts.append(f"<tr class='kernel-row' id='row{i + 1}' data-k='{i + 1}'><td>{sw}K{i + 1}</td>"
                     f"<td>{_esc(r['name'])}{' ×' + str(r['launches']) if r['launches'] > 1 else ''}</td>"
                     f"<td class='ops'>{_esc(' + '.join(r['ops']))}</td><td>{_esc(r['pattern'] or '–')}</td>"
                     f"<td>{_esc(r['rule'] or '–')}</td><td>{_ub_bar(r)}</td><td class='num'>{gm}</td>"
                     f"<td class='num'>{_us(r['modeled_time_us'])}</td>"
                     f"<td class='num'>{_us(r['modeled_time_us_unfused'])}</td>"
                     + (f"<td>{_esc(precision_cell(r))}</td>" if sixteen else "") + "</tr>")
    parts.append("</table>")

    # verify
    ver = report.get("verify")
    if ver:
        cls = "ok" if ver.get("ok") else "bad"
        parts.append(f"<h2>Equivalence check</h2><p>against {_esc(ver.get('reference'))} on seeded random inputs "
                     f"(seed {_esc(ver.get('seed'))}): <span class='{cls}'>{'OK' if ver.get('ok') else 'MISMATCH'}"
                     "</span></p><table><tr><th>output</th><th>dtype</th><th>max abs error</th><th>max rel error</th>"
                     "<th>tolerance</th><th></th></tr>")
        for o in ver.get("outputs", []):
            parts.append(f"<tr><td>{_esc(o['name'])}</td><td>{_esc(o['dtype'])}</td><td class='num'>"
                         f"{o['max_abs']:.3g}</td><td class='num'>{o['max_rel']:.3g}</td><td>rtol {o['rtol']:g}, "
                         f"atol {o['atol']:g} &times; max|ref|</td><td>{'ok' if o['ok'] else 'MISMATCH'}</td></tr>")
        parts.append("</table>")
        bad = (ver.get("bisection") or {}).get("first_bad_kernel")
        if bad:
            parts.append(f"<p class='bad'>first kernel that differs from its unfused ops: {_esc(bad['kernel'])} "
                         f"(rule {_esc(bad.get('rule'))}); source ops: {_esc(' + '.join(bad.get('ops', [])))}</p>")

    # refusals
    refused = refusal_rows(report)
    parts.append(f"<h2>Not fused ({len(refused)})</h2>")
    if refused:
        parts.append("<table id='refusals'><tr><th>pass</th><th>reason</th><th>where</th><th>detail</th></tr>")
        for r in refused:
            parts.append(f"<tr><td>{_esc(r['pass'])}</td><td>{_esc(r['reason'])}</td><td class='ops'>"
                         f"{_esc(r['where'])}</td><td class='ops'>{_esc(r['detail'])}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p class='note'>every match took effect</p>")
    parts.append(f"<script>{JS}</script></body></html>")
    return "\n".join(parts)


def write_html(report: dict, path: str | os.PathLike, title: str | None = None) -> Path:
    path = Path(path)
    path.write_text(render_html(report, title), encoding="utf-8")
    return path


def load_report(path: str | os.PathLike) -> dict:
    return json.loads(Path(path).read_text())
