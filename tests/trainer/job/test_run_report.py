"""report.html: agreement numbers, escaping, and the page as Debian's chromium renders it (no network)."""

from __future__ import annotations

import base64
import http.server
import io
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests import browser
from trainer.job import run_report
from trainer.worker import samples

N_SAMPLES = 3
HOSTILE = '<script>document.title="pwned"</script><img src="http://127.0.0.1:9/x.png">'


def test_token_f1() -> None:
    ref = "The number seven in bold handwriting, framed for a calm wall."
    assert run_report.token_f1(ref, ref) == 1.0
    assert run_report.token_f1("THE NUMBER seven!", ref) == pytest.approx(2 * 1.0 * (3 / 11) / (1 + 3 / 11))
    assert run_report.token_f1("acknowledge acknowledge", ref) == 0.0
    assert run_report.token_f1("", ref) == 0.0 and run_report.token_f1("", "") == 1.0
    # repeated words count once per occurrence in the reference (bag of words, not a set)
    assert run_report.token_f1("the the the the", "the cat") == pytest.approx(2 * 0.25 * 0.5 / 0.75)


def test_pick_rows_is_deterministic_and_spread() -> None:
    assert samples.pick_rows(24, 8) == [0, 3, 6, 9, 12, 15, 18, 21]
    assert samples.pick_rows(5, 8) == [0, 1, 2, 3, 4]
    assert samples.pick_rows(0, 8) == [] and samples.pick_rows(10, 0) == []


def _image(seed: int) -> Image.Image:
    im = Image.new("RGB", (64, 64), "white")
    for i in range(64):
        im.putpixel((i, (i * (seed + 1)) % 64), (0, 0, 0))
    return im


def fake_samples() -> list[dict[str, Any]]:
    out = []
    for i in range(N_SAMPLES):
        ref = f"The number {i} in bold handwriting, framed for a calm wall."
        base = "acknowledge acknowledge" if i else HOSTILE
        tuned = f"The number {i} in bold handwriting."
        out.append({
            "row_id": i * 3, "product": f"Handwritten {i} Wall Print", "category": "Home & Kitchen | Wall Art",
            "reference": ref, "base_output": base, "finetuned_output": tuned,
            "tokens": {"prompt": 107, "reference": 14, "base_output": 24, "finetuned_output": 9},
            "base_f1": run_report.token_f1(base, ref), "finetuned_f1": run_report.token_f1(tuned, ref),
            "thumbnail": samples.thumbnail(_image(i)),
        })
    return out


RECORDS = ([{"kind": "train", "step": s, "loss": 12.0 / s**0.7} for s in range(2, 41, 2)]
           + [{"kind": "eval", "step": s, "eval_loss": 10.0 / s**0.6, "eval_mean_token_accuracy": s / 50}
              for s in (10, 20, 30, 40)])
SUMMARY = {"global_step": 40, "max_steps": 40, "epochs": 0.7, "num_workers": 2, "global_batch_size": 2,
           "train_rows": 216, "eval_rows": 24, "skipped_rows": {}, "samples_per_second": 1.5,
           "startup": {"runtime_env_s": 12.5, "workers_s": None, "model_load_s": 30.0, "total_s": 50.0,
                       "from": "submission", "submission_time_source": "Ray's job record"}}
CONFIG = {"model_id": "tiny-gemma3", "dataset_name": "products.parquet", "recipe": "fast", "use_gpu": False,
          "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "quantization": "none"}


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / run_report.REPORT_FILE
    path.write_text(run_report.build_html(run_name="r1-test", status="finished at step 40", config=CONFIG,
                                          summary=SUMMARY, records=RECORDS, samples=fake_samples()))
    return path


def test_page_text_escapes_outputs_and_references_nothing_remote(page: Path) -> None:
    text = page.read_text()
    assert HOSTILE not in text and "&lt;script&gt;" in text
    # No markup that loads anything: every src is a data: URI; no links, stylesheets, scripts or CSS url().
    assert "href=" not in text and "<script" not in text and "url(" not in text and "<link" not in text
    assert all(src.startswith("data:image/") for src in re.findall(r'src="([^"]*)"', text))
    assert f'content="{run_report.CSP}"' in text
    # the job-start split of summary.json (startup_timing.py's keys), unknown phases left out
    assert "runtime env 12.5 s, model load 30.0 s, total 50.0 s (from submission)" in text


def test_empty_run_still_renders() -> None:
    text = run_report.build_html(run_name="r0", status="starting", config={}, summary=None, records=[], samples=[])
    assert "No loss records yet." in text and "No evaluation yet." in text and "No sample generations" in text


@pytest.mark.slow
def test_browser_renders_gallery_chart_and_table(page: Path, tmp_path: Path) -> None:
    els = browser.parse(browser.dump_dom(page))
    title = next(e for e in els if e.tag == "title")
    assert title.text == "gemma3-ray run r1-test"  # the hostile output did not run
    figures = [e for e in els if e.tag == "figure" and browser.has_class(e, "sample")]
    assert len(figures) == N_SAMPLES
    for fig, sample in zip(figures, fake_samples(), strict=True):
        inside = [e for e in els if e.inside(fig)]
        (img,) = [e for e in inside if e.tag == "img"]
        kind, _, payload = img.attrs["src"].partition(";base64,")
        assert kind == "data:image/jpeg"
        Image.open(io.BytesIO(base64.b64decode(payload))).verify()
        texts = {c: e.text for e in inside for c in ("reference", "base", "finetuned") if browser.has_class(e, c)}
        assert sample["reference"] in texts["reference"]
        assert sample["base_output"] in texts["base"] and sample["finetuned_output"] in texts["finetuned"]
        assert "F1 " in texts["base"] and "F1 " in texts["finetuned"]
    (chart,) = [e for e in els if e.attrs.get("id") == "loss-chart"]
    assert chart.tag == "svg"
    lines = {e.attrs.get("class") for e in els if e.tag == "polyline" and e.inside(chart)}
    assert lines == {"train-loss", "eval-loss"}
    (table,) = [e for e in els if e.attrs.get("id") == "eval-metrics"]
    assert len([e for e in els if e.tag == "tr" and e.inside(table)]) == 1 + 4  # header + one row per eval
    png = browser.screenshot(page, tmp_path / "report.png")
    with Image.open(png) as im:
        assert im.size == (1200, 900) and len(im.convert("L").getcolors() or []) > 16  # drawn, not blank


@pytest.fixture
def canary() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server that records every path requested from it."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()


@pytest.mark.slow
def test_no_request_leaves_the_page(page: Path, tmp_path: Path, canary: tuple[str, list[str]]) -> None:
    url, hits = canary
    # The detector first: a page with a remote image is seen requesting it, by the net log and the server.
    control = tmp_path / "control.html"
    control.write_text(f'<!DOCTYPE html><html><body><img src="{url}/canary.png"></body></html>')
    assert browser.page_requests(control.as_uri(), tmp_path / "control-net.json") == [f"{url}/canary.png"]
    assert hits == ["/canary.png"]
    # The report, with a remote image smuggled into a model output: no request at all.
    assert browser.page_requests(page.as_uri(), tmp_path / "report-net.json") == []
    # Even a remote reference that got past escaping would be blocked by the page's CSP.
    leaky = tmp_path / "leaky.html"
    leaky.write_text(page.read_text().replace("</body>", f'<img src="{url}/leak.png"></body>'))
    assert browser.page_requests(leaky.as_uri(), tmp_path / "leaky-net.json") == []
    assert hits == ["/canary.png"]


def test_write_reads_the_runs_metrics_and_samples(tmp_path: Path) -> None:
    from trainer.job.storage import Storage

    run = Storage(root=str(tmp_path / "runs" / "r1"))
    metrics = "".join(json.dumps(r) + "\n" for r in RECORDS) + '{"kind": "train", "st'  # a record being written
    run.write_bytes(run_report.METRICS_FILE, metrics.encode())
    run.write_bytes(run_report.SAMPLES_FILE, samples.to_jsonl(fake_samples()))
    uri = run_report.write(run, run_name="r1", status=run_report.final_status(SUMMARY), config=CONFIG,
                           summary=SUMMARY)
    assert uri == run.uri(run_report.REPORT_FILE)
    text = (tmp_path / "runs" / "r1" / run_report.REPORT_FILE).read_text()
    assert text.count('<figure class="sample"') == N_SAMPLES
    assert 'class="eval-loss"' in text and "eval loss (4)" in text and "train loss (20)" in text
    assert "finished at step 40" in text


def test_final_status_says_what_is_missing() -> None:
    assert run_report.final_status({"global_step": 9, "resumed_from_step": 4}) == (
        "finished at step 9 (resumed from step 4)")
    assert run_report.final_status({"global_step": 9, "samples_left_out": 2, "samples_error": None}) == (
        "finished at step 9; 2 sample rows did not fit the time budget")
    assert "sample generation failed: OutOfMemoryError: CUDA" in run_report.final_status(
        {"global_step": 9, "samples_error": "OutOfMemoryError: CUDA"})
