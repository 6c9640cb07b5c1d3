"""clattn.doctor(): every variant passes on a clean device and the JSON report lists them; a
planted wrong element (CLATTN_FAULT_VARIANT) is logged failed (clattn.validations), naming the
variant, while the attention computed still matches numpy's float64 result (the fallback)."""
import json
import os

import numpy as np

import clattn


def test_doctor_clean(tmp_path):
    path = tmp_path / "report.json"
    entries = clattn.doctor(json_path=str(path), verbose=False)
    assert entries and all(e["result"] in ("passed", "unchecked") for e in entries), entries
    report = json.loads(path.read_text())
    assert report["driver_key"] and len(report["variants"]) == len(entries)
    assert {e["variant"] for e in entries} == {v["variant"] for v in report["variants"]}


def _reference(q, k, v):
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", w / w.sum(-1, keepdims=True), v)


def test_planted_fault(monkeypatch, tmp_path):
    # (the doctor's exit and report under a planted fault: tests/cli_doctor_test.sh)
    monkeypatch.setenv("CLATTN_FAULT_VARIANT", "flash")
    monkeypatch.setenv("CLATTN_VALIDATION_FILE", str(tmp_path / "records"))
    ctx = clattn.Context()
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 17, 16)).astype(np.float32) for _ in range(3))
    out = clattn.scaled_dot_product_attention(q, k, v, ctx=ctx)
    np.testing.assert_allclose(out, _reference(q.astype(np.float64), k.astype(np.float64),
                                               v.astype(np.float64)), rtol=1e-4, atol=1e-5)
    failed = [e for e in clattn.validations(ctx) if e["result"] == "failed"]
    assert failed and all("flash" in e["variant"] for e in failed), clattn.validations(ctx)
