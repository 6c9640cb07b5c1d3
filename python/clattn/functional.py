"""clattn's attention functions with PyTorch's argument meanings, on numpy arrays (torch
tensors and pyopencl arrays too): the names users import as ``clattn.functional.X``, each
defined in the module of what it serves.

    scaled_dot_product_attention            _sdpa_entry (routes to ops, autograd, _sdpa)
    sdpa_forward, sdpa_backward, SdpaGrads  _sdpa_grad  (training: lse and the backward)
    varlen_attention                        _varlen     (packed variable-length batches)
    paged_attention, quantize, kv_commit    _serving    (paged KV caches, block quantization,
                                                         speculative decoding's commit)
    paged_varlen_attention                  _serving    (packed queries over a paged cache)

The package's modules and who imports whom (bottom up, no circle): docs/python.md, "The
package's modules".
"""

from ._sdpa_entry import scaled_dot_product_attention
from ._sdpa_grad import SdpaGrads, sdpa_backward, sdpa_forward
from ._serving import kv_commit, paged_attention, paged_varlen_attention, quantize
from ._varlen import varlen_attention

__all__ = ["SdpaGrads", "kv_commit", "paged_attention", "paged_varlen_attention", "quantize",
           "scaled_dot_product_attention", "sdpa_backward", "sdpa_forward", "varlen_attention"]
