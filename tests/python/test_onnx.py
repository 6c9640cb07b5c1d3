"""clattn.onnx_attention on ONNX's own Attention node tests (the same 93 that tests/onnx runs
through `clattn sdpa`; skipped without the onnx package): every output of ONNX's type and
within the lane's tolerances, on both paths (the score outputs on the unfused one)."""

import os
import sys

import numpy as np
import pytest

import clattn

onnx = pytest.importorskip("onnx")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "onnx"))
from run_onnx_tests import collect, tolerance, type_of  # noqa: E402

CASES = collect("Attention")
ATTRIBUTES = {"is_causal", "scale", "q_num_heads", "kv_num_heads", "softcap",
              "left_window_size", "right_window_size", "qk_matmul_output_mode",
              "softmax_precision"}


def test_collected_all():
    assert len(CASES) >= 93


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_node(case):
    name, attrs, inputs, outputs = case
    unknown = set(attrs) - ATTRIBUTES
    assert not unknown, f"attributes {unknown}"
    rtol, atol = tolerance(type_of(inputs["Q"]))
    paths = ["unfused"] if "qk_matmul_output" in outputs else ["fused", "unfused"]
    kwargs = {key: value for key, value in attrs.items()}
    if "scale" in kwargs:
        kwargs["scale"] = float(kwargs["scale"])
    for path in paths:
        try:
            got = clattn.onnx_attention(**inputs, **kwargs,
                                        want_qk_matmul_output="qk_matmul_output" in outputs,
                                        path=path)
        except clattn.DeviceError as error:
            if "cl_khr_fp64" in str(error):
                continue  # the device has no doubles (softmax_precision 11)
            raise
        for key, want in outputs.items():
            assert type_of(got[key]) == type_of(want), f"{path}: {key} dtype"
            assert got[key].shape == want.shape, f"{path}: {key} shape"
            np.testing.assert_allclose(got[key].astype(np.float64), want.astype(np.float64),
                                       rtol=rtol, atol=atol, err_msg=f"{path}: {key}")
