"""clattn.doctor(): self-validation of every kernel variant on a device (clattn_doctor)."""
import ctypes
from typing import List, Optional

from . import _lib
from ._core import Context, _raise

_RESULTS = ("passed", "recorded", "failed", "unchecked")


def validations(ctx: Context) -> List[dict]:
    """The context's self-validation log (clattn_ctx_validations), oldest first: dicts with
    variant, unit, result ("passed", "recorded", "failed", "unchecked"), max_error,
    tolerance, ms and detail."""
    total = _lib.lib.clattn_ctx_validations(ctx._handle, None, 0)
    entries = (_lib.Validation * max(total, 1))()
    _lib.lib.clattn_ctx_validations(ctx._handle, entries, total)
    return [{"variant": e.variant.decode(), "unit": e.unit.decode(),
             "result": _RESULTS[e.result], "max_error": e.max_error,
             "tolerance": e.tolerance, "ms": e.milliseconds,
             "detail": e.detail.decode(errors="replace")} for e in entries[:total]]


def doctor(device: Optional[str] = None, json_path: Optional[str] = None,
           verbose: bool = True) -> List[dict]:
    """Checks every kernel variant the device builds for clattn's attention problems against a
    float64 host reference (as ``clattn doctor``), on a fresh context of ``device`` (None:
    CLATTN_DEVICE, else the first GPU, else the first CPU device). Prints the table when
    ``verbose``; writes the JSON report to ``json_path`` when given. Returns the entries;
    ``any(e["result"] == "failed" for e in ...)`` says whether a variant failed (plans fall
    back to others then)."""
    ctx = Context(device)
    checked, failed = ctypes.c_size_t(0), ctypes.c_size_t(0)
    path = json_path.encode() if json_path else None
    status = _lib.lib.clattn_doctor(ctx._handle, path, ctypes.byref(checked),
                                    ctypes.byref(failed))
    if status != _lib.SUCCESS:
        _raise(status, _lib.lib.clattn_last_error(ctx._handle).decode(errors="replace"))
    entries = validations(ctx)
    if verbose:
        print(f"{'probe':16} {'variant':44} {'result':9} {'max error':>10} {'ms':>8}  detail")
        for e in entries:
            print(f"{e['unit']:16} {e['variant']:44} {e['result']:9} {e['max_error']:10.3g} "
                  f"{e['ms']:8.2f}  {e['detail']}")
        print(f"clattn.doctor: {failed.value} of {checked.value} checks failed"
              if failed.value else f"clattn.doctor: all {checked.value} variants passed")
    return entries
