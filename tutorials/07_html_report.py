"""Tutorial 7: the HTML fusion report, and how to read it.

What happens:
  1. a BERT-style encoder layer (W3: attention with a padding mask, post-LN, GELU FFN) is compiled with the
     traffic baseline and the equivalence check, and ``fusion_result.json`` is written;
  2. ``ascendfuse report fusion_result.json --html`` draws the page from that file alone (it works offline:
     one file, no scripts, fonts or styles from elsewhere); ``ascendfuse compile ... --html`` writes the
     same page next to the library;
  3. this script prints, section by section, what the page shows and where the numbers come from;
  4. with ``--screenshot`` and Chromium installed, a PNG of the page is taken (headless).

Reading the page, top to bottom:
  * Traffic: kernel launches, GM bytes and NPU time for TVM's default fusion, ours, and the compulsory
    lower bound (each input, weight and output moved once). Bytes are counted on the generated TIR; NPU
    times come from the target description's roofline: modeled, not measured.
  * Graph before and after fusion: on the left the model as imported (one box per operator), on the right
    one coloured box per kernel around the ops it computes. Hover a box for its kernel, schedule rule and
    pattern; click a kernel row in the table below to outline its box.
  * Kernels: per kernel its source ops, the pattern that formed it (if any), the schedule rule, the UB bytes
    its tiles use as a bar against the target's usable UB, GM bytes and modeled time, and the modeled time
    of the same ops run one kernel each (what fusing them saved).
  * Equivalence check: the ``--verify`` result per output, and on a mismatch the first kernel that differs.
  * Not fused: every match that did not take effect, with its reason and numbers (a check that failed,
    a UB overflow with bytes needed vs available, a merge that was not profitable, a switch turned off).

Run:  .venv/bin/python tutorials/07_html_report.py [--seq 128 --hidden 768 --heads 12 --ffn 3072] [--out DIR]
                                                  [--screenshot]
"""

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import tvm_ascendfuse as af
from tvm_ascendfuse.cli import main as ascendfuse
from tvm_ascendfuse.cli import traffic_text
from tvm_ascendfuse.frontend import import_onnx
from tvm_ascendfuse.report_html import kernel_rows, refusal_rows
from tvm_ascendfuse.verify import onnxruntime_reference
from tvm_ascendfuse.workloads import bert_layer


def screenshot(page: Path, png: Path) -> bool:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no Chromium here (Debian: apt-get install chromium); no screenshot")
        return False
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", "--window-size=1400,1800", f"--screenshot={png}",
                        page.resolve().as_uri()], check=False, capture_output=True, timeout=120)
    return png.is_file()


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--out", default="tutorial_out/report")
    ap.add_argument("--screenshot", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1. compile with everything the page can show
    model = bert_layer(seq=args.seq, hidden=args.hidden, heads=args.heads, ffn=args.ffn, mask=True)
    result = af.compile_model(import_onnx(model), target="ascend910b", traffic_baseline=True, verify=True,
                              reference=onnxruntime_reference(model), reference_name="onnxruntime")
    report_path = out / "fusion_result.json"
    result.report.write(report_path)

    # 2. the page, from the JSON alone
    page = out / "fusion_report.html"
    status = ascendfuse(["report", str(report_path), "--html", "-o", str(page)])

    # 3. what it shows
    report = json.loads(report_path.read_text())
    print("\n-- Traffic (the table at the top of the page)")
    print(traffic_text(report))
    before, after = report["graph_before"], report["graph_after"]
    print(f"\n-- Graphs: {len(before['nodes'])} nodes before fusion; after it {len(after['kernels'])} kernel boxes "
          f"around {len(after['nodes'])} ops")
    print("\n-- Kernels")
    for r in kernel_rows(report):
        ub = f"{r['ub_bytes']:,} B of {r['ub_capacity']:,} B UB" if r["ub_bytes"] is not None else "UB -"
        print(f"   K{r['index'] + 1} {r['rule']:22s} {ub:26s} GM {r['gm_bytes'] or 0:>10,} B  "
              f"{len(r['ops'])} ops: {'+'.join(r['ops'])[:70]}")
    print(f"\n-- Equivalence check: {'OK' if report['verify']['ok'] else 'MISMATCH'} against "
          f"{report['verify']['reference']}")
    refused = refusal_rows(report)
    print(f"\n-- Not fused: {len(refused)} matches")
    for r in refused[:5]:
        print(f"   {r['pass']}: {r['reason']} — {r['detail'][:100]}")

    shot_ok = screenshot(page, out / "fusion_report.png") if args.screenshot else True
    good = status == 0 and page.is_file() and report["verify"]["ok"] and len(after["kernels"]) == len(report["kernels"])
    good = good and shot_ok
    print(f"\nopen {page} in a browser; tutorial checks: " + ("OK" if good else "FAILED"))
    if not good:
        raise SystemExit(1)


if __name__ == "__main__":
    run()
