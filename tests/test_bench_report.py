"""bench/report.py: the headline lines a script reads, and the sections of bench/RESULTS.md it did not write."""

from __future__ import annotations

import json
from pathlib import Path

from bench import report


def row(name: str, sps: float, **extra) -> dict:
    return {"name": name, "ok": True, "samples_per_s": sps, "mfu": 0.2, "tflop_per_sample": 19.5,
            "flags": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 8},
            "phase_s_per_step": {"step": 1.0}, "loss_log": [1.0, 0.9], "versions": {"gpu": "H200"}, **extra}


def test_write_puts_the_headline_first_and_keeps_other_sections(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    fv = row("freeze_vision_3ep", 30.0, workload={"rows": 10, "epochs": 3, "samples": 30, "train_wall_s": 12.5,
                                                  "samples_per_s": 2.4, "optimizer_steps": 6},
             step_s=[1.0] * 6, levers={"image_feature_cache": {"hits": 20, "misses": 10, "gib": 0.1}})
    rows = [row("tutorial", 1.0), row("plain_trl", 8.0), row("default", 12.0), fv]
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "RESULTS.md"
    out.write_text("## Job start (image engineer)\n\nsubmission -> first step: 80 s\n")
    for _ in range(2):  # regenerating replaces only its own section
        report.write(out, report.section(report.load(results), "r.jsonl", None))
    text = out.read_text()
    lines = text.splitlines()
    assert lines[0] == ("default: 12.00 samples/s, 12.0× the tutorial recipe, 1.50× plain TRL, — Unsloth ? (—), "
                        "one call: `r.jsonl`")
    assert lines[1] == "freeze_vision: the tutorial's 3 epochs in 12.5 s (`r.jsonl`)"
    assert text.count(report.BEGIN) == 1 and text.count("submission -> first step: 80 s") == 1
    assert text.index(report.END) < text.index("## Job start (image engineer)")
