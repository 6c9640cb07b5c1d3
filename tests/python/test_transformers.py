"""clattn as Hugging Face transformers' attention implementation (clattn.transformers).

Tiny random-init Llama, BERT, Gemma 2 and GPT-OSS models (configurations built here, nothing
fetched), each run once with attn_implementation="eager" and once with "clattn" on the same
weights: logits, cached decode, greedy generate, output_attentions and parameter gradients
must agree within float32 round-off. Skips as a whole where transformers (or a torch it
accepts) cannot be imported, except under CLATTN_PY_HF_REQUIRED=1 (tests/python/run_hf.sh,
whose venv has them). About 15-30 s on 2 cores with PoCL (about 65 s with a cold PoCL
kernel cache)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if os.environ.get("CLATTN_PY_HF_REQUIRED") == "1":  # tests/python/run_hf.sh: no skipping
    import torch
    import transformers
    from transformers import (BertConfig, BertForMaskedLM, Gemma2Config, Gemma2ForCausalLM,
                              GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM)
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    try:
        from transformers import (BertConfig, BertForMaskedLM, Gemma2Config,
                                  Gemma2ForCausalLM, GptOssConfig, GptOssForCausalLM,
                                  LlamaConfig, LlamaForCausalLM)
    except ImportError as e:  # transformers refuses this torch, or lacks these models
        pytest.skip(f"transformers' models do not import: {e}", allow_module_level=True)

import clattn.transformers as clattn_hf  # noqa: E402

TOL = 2e-5  # float32 round-off through two layers (measured: about 1e-6 at most)


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert clattn_hf.register() == "clattn"
    torch.manual_seed(0)


def close(a, b, tol=TOL):
    diff = (a - b).abs().max().item()
    assert diff <= tol * max(1.0, b.abs().max().item()), diff
    return diff


def both(model, fn):
    """fn(model) with eager attention, then with clattn's (the same weights)."""
    out = []
    for impl in ("eager", "clattn"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            out.append(fn(model))
    return out


def grads(model, fn):
    """The parameters' gradients of fn(model).backward() with eager, then clattn."""
    result = []
    model.train()
    for impl in ("eager", "clattn"):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        fn(model).backward()
        result.append({n: p.grad.clone() for n, p in model.named_parameters()
                       if p.grad is not None})
    model.eval()
    assert result[0].keys() == result[1].keys() and result[0]
    return result


def check_grads(model, fn, tol=1e-4):
    eager, ours = grads(model, fn)
    for name in eager:
        scale = max(1e-3, eager[name].abs().max().item())
        diff = (eager[name] - ours[name]).abs().max().item()
        assert diff <= tol * scale, (name, diff, scale)


def check_attentions(a, b, rows=None):
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.shape == y.shape
        if rows is not None:  # (B, L) bool: the query rows to compare
            x, y = x.permute(0, 2, 1, 3)[rows], y.permute(0, 2, 1, 3)[rows]
        close(x, y)


def check_decode(model, ids, mask=None):
    """Prefill all but the last token with a cache, then one cached step: the step's logits
    (and the prefill's) agree with eager, and with clattn's own uncached forward."""
    def run(m):
        pre = m(ids[:, :-1], attention_mask=None if mask is None else mask[:, :-1],
                use_cache=True)
        step = m(ids[:, -1:], attention_mask=mask, cache=pre.cache, use_cache=True)
        full = m(ids, attention_mask=mask)
        return pre.logits, step.logits[:, -1], full.logits[:, -1]
    (pe, se, _), (pc, sc, fc) = both(model, run)
    rows = slice(None) if mask is None else mask[:, :-1].bool()
    close(pe[rows], pc[rows])
    close(se, sc)
    close(sc, fc, 1e-4)


def check_generate(model, ids, mask=None, steps=6):
    out = both(model, lambda m: m.generate(ids, attention_mask=mask, max_new_tokens=steps,
                                           do_sample=False))
    assert out[0].shape == out[1].shape and torch.equal(out[0], out[1]), out


def lm_loss(ids, mask=None):
    """The LM loss over the real tokens: the padded rows, which eager and clattn compute
    differently, reach no loss (label j is predicted by row j - 1: the first real token's
    label goes too)."""
    labels = ids
    if mask is not None:
        before = torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], 1)
        labels = ids.masked_fill((mask == 0) | (before == 0), -100)
    return lambda m: m(ids, attention_mask=mask, labels=labels).loss


# --- Llama: GQA, RoPE, causal, left padding, KV cache ------------------------------------------

@pytest.fixture(scope="module")
def llama():
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, intermediate_size=128, vocab_size=128,
                      pad_token_id=0, bos_token_id=1, eos_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def left_padded(batch=2, length=9, pad=3):
    ids = torch.randint(2, 128, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    return ids, mask


def check_logits_and_attentions(model, length):
    """Two random sequences of `length` tokens: logits and attention weights as eager's.
    Returns the ids and clattn's output."""
    ids = torch.randint(2, 128, (2, length))
    e, c = both(model, lambda m: m(ids, output_attentions=True))
    close(e.logits, c.logits)
    check_attentions(e.attentions, c.attentions)
    return ids, c


def check_left_padded_decode_generate(model):
    """Left-padded logits (the real tokens'), cached decode and generation past the window."""
    ids, mask = left_padded(length=10, pad=2)
    e, c = both(model, lambda m: m(ids, attention_mask=mask))
    rows = mask.bool()
    close(e.logits[rows], c.logits[rows])
    check_decode(model, ids, mask)
    check_generate(model, ids[:1], steps=8)


def test_llama_logits_and_attentions(llama):
    check_logits_and_attentions(llama, 9)


def test_llama_left_padded(llama):
    """Padded query rows have every key masked: clattn gives zeros there, eager a uniform
    average; only the real tokens are compared (the padded rows' outputs are never read)."""
    ids, mask = left_padded()
    e, c = both(llama, lambda m: m(ids, attention_mask=mask, output_attentions=True))
    rows = mask.bool()
    close(e.logits[rows], c.logits[rows])
    check_attentions(e.attentions, c.attentions, rows)


def test_llama_cached_decode(llama):
    ids, mask = left_padded()
    check_decode(llama, ids[:1])
    check_decode(llama, ids, mask)


def test_llama_generate(llama):
    ids, mask = left_padded()
    check_generate(llama, ids[:1], steps=8)
    check_generate(llama, ids, mask)


def test_llama_gradients(llama):
    ids, mask = left_padded()
    check_grads(llama, lm_loss(ids[:1]))
    check_grads(llama, lm_loss(ids, mask))

    def with_weights(m):  # a loss that reads the attention weights too (differentiable)
        out = m(ids[:1], labels=ids[:1], output_attentions=True)
        return out.loss + sum((a * a).sum() for a in out.attentions)
    check_grads(llama, with_weights)


# --- BERT: a bidirectional encoder with padding masks ------------------------------------------

@pytest.fixture(scope="module")
def bert():
    cfg = BertConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                     intermediate_size=128, vocab_size=128, max_position_embeddings=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForMaskedLM(cfg).eval()


def test_bert_padding_mask(bert):
    ids = torch.randint(2, 128, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0  # right padding: every row keeps some keys
    e, c = both(bert, lambda m: m(ids, attention_mask=mask, output_attentions=True))
    close(e.logits, c.logits)
    check_attentions(e.attentions, c.attentions)
    e, c = both(bert, lambda m: m(ids))  # no padding: no mask reaches clattn
    close(e.logits, c.logits)


def test_bert_gradients(bert):
    ids = torch.randint(2, 128, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, 7:] = 0
    check_grads(bert, lambda m: m(ids, attention_mask=mask, labels=ids).loss)


# --- Gemma 2: logit soft-capping, sliding windows ----------------------------------------------

@pytest.fixture(scope="module")
def gemma2():
    # a wide initialisation and a small cap, so that tanh bends the scores; a window of 4
    # within sequences of 10 on the sliding layer
    cfg = Gemma2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, num_hidden_layers=2, intermediate_size=128, vocab_size=128,
                       query_pre_attn_scalar=16, sliding_window=4, attn_logit_softcapping=2.0,
                       final_logit_softcapping=30.0, initializer_range=0.2,
                       layer_types=["sliding_attention", "full_attention"],
                       pad_token_id=0, bos_token_id=1, eos_token_id=None)
    return Gemma2ForCausalLM(cfg).eval()


def test_gemma2_logits_and_attentions(gemma2):
    ids, c = check_logits_and_attentions(gemma2, 10)
    # the cap does bend the scores here: without it the logits differ
    gemma2.config.attn_logit_softcapping = None
    for layer in gemma2.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    try:
        u, = both(gemma2, lambda m: m(ids))[1:]
    finally:
        gemma2.config.attn_logit_softcapping = 2.0
        for layer in gemma2.model.layers:
            layer.self_attn.attn_logit_softcapping = 2.0
    assert (u.logits - c.logits).abs().max() > 1e-3


def test_gemma2_left_padded_decode_generate(gemma2):
    check_left_padded_decode_generate(gemma2)


def test_gemma2_gradients(gemma2):
    ids = torch.randint(2, 128, (2, 10))
    check_grads(gemma2, lm_loss(ids))


# --- GPT-OSS: learned sinks, sliding windows, a tiny MoE ---------------------------------------

@pytest.fixture(scope="module")
def gpt_oss():
    cfg = GptOssConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, num_hidden_layers=2, intermediate_size=64, vocab_size=128,
                       num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                       layer_types=["sliding_attention", "full_attention"],
                       pad_token_id=0, bos_token_id=1, eos_token_id=None)
    model = GptOssForCausalLM(cfg).eval()
    with torch.no_grad():  # sinks that matter (the initialisation's are near 0)
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn_like(layer.self_attn.sinks) * 2)
    return model


def test_gpt_oss_logits_and_attentions(gpt_oss):
    check_logits_and_attentions(gpt_oss, 10)


def test_gpt_oss_decode_generate(gpt_oss):
    check_left_padded_decode_generate(gpt_oss)


def test_gpt_oss_gradients(gpt_oss):
    ids = torch.randint(2, 128, (2, 10))
    eager, ours = grads(gpt_oss, lm_loss(ids))
    sinks = [n for n in eager if n.endswith("self_attn.sinks")]
    assert sinks, "the sinks get gradients"
    for name in eager:
        scale = max(1e-3, eager[name].abs().max().item())
        assert (eager[name] - ours[name]).abs().max().item() <= 1e-4 * scale, name


# --- T5: cross-attention and a relative position bias (position_bias) -------------------------

def test_t5_position_bias_cross_attention():
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(cfg).eval()
    ids, dec = torch.randint(3, 128, (2, 8)), torch.randint(3, 128, (2, 5))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    e, c = both(model, lambda m: m(input_ids=ids, attention_mask=mask, decoder_input_ids=dec))
    close(e.logits, c.logits)
    check_generate(model, ids, mask, steps=5)


# --- the interface ----------------------------------------------------------------------------

def test_register_and_from_config():
    assert clattn_hf.register() == "clattn"
    cfg = LlamaConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                      num_hidden_layers=1, intermediate_size=64, vocab_size=64)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="clattn")
    assert model.config._attn_implementation == "clattn"
    calls = []
    real = clattn_hf.attention_forward

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)
    transformers.AttentionInterface.register("clattn", spy)
    try:
        with torch.no_grad():
            model(torch.randint(0, 64, (1, 5)))
    finally:
        clattn_hf.register()
    assert len(calls) == 1 and calls[0] == (1, 2, 5, 16)
