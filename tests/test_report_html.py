"""The HTML report: drawn from fusion_result.json alone, and checked in a real headless browser (Chromium
driven by Playwright: the page loads without console errors, the after-fusion drawing has one box per
kernel, a screenshot is taken)."""

import json
import os
import shutil

import onnx
import pytest

import tvm_ascendfuse as af
from tvm_ascendfuse.cli import main, summary_text
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.report_html import render_html
from tvm_ascendfuse.workloads import llama_block

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


@pytest.fixture(scope="module")
def report():
    result = af.compile_model(import_onnx(llama_block(seq=16, hidden=64, heads=4, ffn=96)), portable=True,
                              traffic_baseline=True)
    return json.loads(json.dumps(result.report.to_dict(), default=str))   # as read back from the file


@needs_dot
def test_page_has_both_graphs_kernel_boxes_and_tables(report):
    page = render_html(report)
    assert page.count('class="cluster kernel"') == len(report["kernels"]) == 3
    assert "graph-before" in page and "graph-after" in page and "<svg" in page
    assert "TVM default fusion" in page and "lower bound" in page
    assert page.count("class='kernel-row'") == 3 and "attention-projection" in page
    assert "id='refusals'" in page and "more than three cube ops" in page
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page   # offline


def test_page_without_recorded_graph_still_has_tables(report):
    old = {k: v for k, v in report.items() if not k.startswith("graph_")}
    page = render_html(old)
    assert "Graph not drawn" in page and page.count("class='kernel-row'") == 3


def test_summary_prints_traffic_as_a_table(report):
    text = summary_text(report)
    assert "traffic" in text and "TVM default fusion" in text and "NPU us (modeled)" in text
    assert '"tvm_default"' not in text and "{" not in text


@needs_dot
def test_cli_report_and_compile_write_pages(report, tmp_path, capsys):
    path = tmp_path / "fusion_result.json"
    path.write_text(json.dumps(report))
    assert main(["report", str(path), "--html"]) == 0
    assert (tmp_path / "fusion_report.html").read_text().count('class="cluster kernel"') == 3
    assert main(["report", str(path), "--html", "-o", str(tmp_path / "x.html")]) == 0
    model = tmp_path / "m.onnx"
    onnx.save(llama_block(seq=8, hidden=32, heads=2, ffn=48), str(model))
    assert main(["compile", str(model), "-o", str(tmp_path / "o"), "--portable", "--html"]) == 0
    assert "fusion_report.html" in capsys.readouterr().out
    assert (tmp_path / "o" / "fusion_report.html").is_file()
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["report", str(bad), "--html"]) == 2


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _browser_or_skip():
    """Playwright and a system Chromium; in CI (CI=true) their absence is a failure, not a skip."""
    missing = None
    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        missing = "the playwright package is not installed"
    if missing is None and _chromium() is None:
        missing = "no Chromium on this machine (Debian: apt-get install chromium)"
    if missing is None and shutil.which("dot") is None:
        missing = "Graphviz's dot is not installed"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser test cannot run in CI: {missing} (.ci/setup installs it)")
        pytest.skip(missing)


def test_page_in_headless_chromium(report, tmp_path):
    _browser_or_skip()
    from playwright.sync_api import sync_playwright

    page_path = tmp_path / "fusion_report.html"
    page_path.write_text(render_html(report))
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS[1:],
                                    chromium_sandbox=False)
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
        page = context.new_page()
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning")
                else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.goto(page_path.as_uri())
        page.wait_for_load_state("load")
        assert page.locator("#graph-before svg").count() == 1
        assert page.locator("#graph-after svg g.kernel").count() == 3
        assert page.locator("#graph-after svg g.node").count() > 3
        page.click("#row2")                        # the row's kernel box gets outlined
        assert page.locator("#kernel2.sel").count() == 1 and page.locator("#row2.sel").count() == 1
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert problems == []
    assert shot.stat().st_size > 20_000
