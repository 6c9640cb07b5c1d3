/* clattn run: multi-head or single-head attention on .npy / .safetensors files. */
#include "cli.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char run_usage[] =
    "Inputs: the query is (L, E) or (B, L, E) float32, float64, float16 or bfloat16 (integer\n"
    "and bool arrays are refused, as by `clattn sdpa`), a .npy or a safetensors file of one\n"
    "tensor (FILE:NAME: tensor NAME of several; read as float32, so the output is float32);\n"
    "every array option reads both formats. Key and value default to the query\n"
    "(self-attention) and value defaults to the key; they are (S, kdim) / (S, vdim) with the\n"
    "query's batching.\n"
    "Weights, either:\n"
    "  --weights: a PyTorch nn.MultiheadAttention state_dict saved as safetensors\n"
    "    (in_proj_weight (3E, E) [+ in_proj_bias], or q_proj_weight (E, E), k_proj_weight\n"
    "    (E, kdim), v_proj_weight (E, vdim) [+ in_proj_bias]; out_proj.weight (E, E)\n"
    "    [+ out_proj.bias]; F32, F16, BF16 or F64), with --heads H. A whole model's state dict\n"
    "    works: --prefix P reads P + those names (e.g. --prefix layers.0.self_attn.; a prefix\n"
    "    without its final dot, layers.0.self_attn, reads P + '.' + the names when P + the\n"
    "    names are not in the file); without\n"
    "    it a file holding exactly one such block under some prefix is read with a note on\n"
    "    stderr, one holding several is refused with their prefixes listed; or\n"
    "  --wq/--wk/--wv[/--wo]: textbook single-head weights in the X·W layout, Wq (E, dk),\n"
    "    Wk (kdim, dk), Wv (vdim, dv), optional Wo (dv, E); --heads splits dk and dv (default 1).\n"
    "--kv-heads G: grouped-query attention (G divides H; 1 = multi-query): K and V have G heads\n"
    "  of the query heads' sizes and query head h attends with K/V head h / (H / G). Wk is then\n"
    "  (kdim, dk / H * G) and Wv (vdim, dv_kv) with dv = dv_kv / G * H; with --weights the\n"
    "  separate k_proj_weight and v_proj_weight are (E / H * G, kdim / vdim) and in_proj_bias,\n"
    "  if any, (E + 2 * E / H * G) (a packed in_proj_weight cannot hold them).\n"
    "Masks: --causal (query i sees keys j <= i); --attn-mask (L, S), or PyTorch's 3-d\n"
    "(B * H, L, S) (one per batch entry and head, head fastest): float, added to the scaled\n"
    "scores (-inf masks), or bool/uint8, True = masked by default (PyTorch's\n"
    "nn.MultiheadAttention; `clattn sdpa` reads True = attend, as ONNX and torch's SDPA);\n"
    "--mask-true attend|masked says which (a note on stderr when a bool mask comes without\n"
    "it); --key-padding-mask (B, S) (or (S) unbatched), bool or 0/1, true = ignore that key\n"
    "(every framework's convention; --mask-true does not change it). A fully masked row\n"
    "gives zeros.\n";
/* Two strings: C99 compilers need only take 4095 characters in one. */
static const char run_usage_more[] =
    "--softcap C: soft-capping (Gemma 2), each scaled score s becomes C tanh(s / C) before the\n"
    "  masks (C > 0).\n"
    "--window LEFT,RIGHT: sliding window (Mistral): query i sees keys i - LEFT .. i + RIGHT; -1\n"
    "  leaves a side unbounded (with --causal, RIGHT beyond 0 changes nothing).\n"
    "--alibi: ALiBi (BLOOM, MPT): head h adds -m_h |i + S - L - j| to the score of key j, with\n"
    "  the paper's slopes m_h (2^(-8 (h + 1) / H) for H a power of two; BLOOM's rule otherwise);\n"
    "  --alibi-slopes S.npy: your own slopes, (H) floats.\n"
    "--posenc sinusoidal: adds Attention Is All You Need's positional encoding (position p's\n"
    "  row gets sin/cos of p / 10000^(2k / features)) to the query, and to the key and value\n"
    "  when they are given, before the projections, on the device; --posenc-table T.npy: adds\n"
    "  rows 0 .. L - 1 of a learned table (max_len, features) instead (key and value: rows\n"
    "  0 .. S - 1; every input's width must be the table's).\n"
    "--rope: rotary position embeddings on every head of the projected q and k (query row i\n"
    "  and key row j at positions P + i and P + j, --rope-start P, default 0): pairs\n"
    "  (x[j], x[j + N/2]) (--rope-style halves, GPT-NeoX/Llama; the default) or\n"
    "  (x[2j], x[2j + 1]) (pairs, the RoFormer paper), of the first N columns (--rope-dims,\n"
    "  default the head size), turned by pos * B^(-2j/N) (--rope-base, default 10000).\n"
    "--scale: default 1/sqrt(head dim). --norm: softmax (default) or relu (relu(s)/sum).\n"
    "--path: auto (default: the fused kernel, which never forms the L x S scores, unless the\n"
    "weights are asked for), fused, or unfused.\n"
    "Outputs: --out O.npy, with the query's batching ((L, E) or (B, L, E)) and float type\n"
    "(float16 and bfloat16 queries give float16 and bfloat16, else float32), as `clattn sdpa`;\n"
    "without --out the output is printed (its real shape only, when large). --attn-out A.npy:\n"
    "the per-head weights (B, H, L, S), or (H, L, S)\n"
    "unbatched. --attn-png A.png: heatmap of the weights of batch 0, one panel per head\n"
    "(query position down, key position across); --png-scale row (default: each row by its own\n"
    "largest weight, so causal and long rows stay visible), log (log10 weight from 1e-4) or\n"
    "global (linear to the largest weight); the colour bar says which; masked cells (causal,\n"
    "window, -inf or bool mask, key padding) are grey; maps over 512 a side are max-pooled, as\n"
    "the picture states.\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options or input files.\n";

typedef struct run_options {
    const char *query, *key, *value, *weights, *wq, *wk, *wv, *wo;
    const char *attn_mask, *out, *attn_out;
    const char *posenc_table; /* --posenc-table */
    const char *prefix;       /* --prefix: the block's key prefix in a whole model's file */
    bool posenc;              /* --posenc sinusoidal */
    size_t heads, kv_heads;   /* kv_heads 0: heads */
    bool heads_given;
    cli_score score;     /* --causal, --softcap, --window, --alibi, --scale, --norm, --path */
    cli_rope rope;       /* --rope and its options */
    cli_masks masks;     /* --mask-true (default masked, as PyTorch MHA), --key-padding-mask */
    cli_heatmap heatmap; /* --attn-png, --png-scale */
    cli_exec exec;       /* --device */
} run_options;

/* Everything loaded from files; freed by run_free. */
typedef struct run_data {
    clattn_array query, key, value, mask, padding, slopes, pos_table;
    clattn_array param[8];
    clattn_safetensors *safetensors;
    char prefix[256]; /* prepended to every key read from safetensors */
    float *mask_additive;
    uint8_t *padding_bytes;
    float *out, *weights;
} run_data;

enum { P_IN_W, P_IN_B, P_Q, P_K, P_V, P_OUT_W, P_OUT_B, P_COUNT };

static void run_free(run_data *d)
{
    clattn_array *const arrays[] = {&d->query,   &d->key,    &d->value,    &d->mask,
                                    &d->padding, &d->slopes, &d->pos_table};
    void *const blocks[] = {d->mask_additive, d->padding_bytes, d->out, d->weights};
    cli_free_all(arrays, CLI_COUNT(arrays), blocks, CLI_COUNT(blocks));
    for (int i = 0; i < P_COUNT; ++i)
        clattn_array_free(&d->param[i]);
    clattn_safetensors_close(d->safetensors);
}

static int parse_posenc(const cli_args *args, const char *value, void *target)
{
    if (strcmp(value, "sinusoidal") != 0)
        return cli_fail(args->command, -1,
                        "--posenc: '%s' is not sinusoidal (a learned table: --posenc-table T.npy)",
                        value);
    *(bool *)target = true;
    return 1;
}

static const cli_choice posenc_choices[] = {{"sinusoidal", 1}, {NULL, 0}};

#define AT(field) CLI_AT(run_options, field)
static const cli_option run_table[] = {
    {CLI_OPT("--query", CLI_PATH, AT(query), "Q.npy",
             "the query, (L, E) or (B, L, E) (.npy or a one-tensor .safetensors)"),
     .flags = CLI_REQUIRED},
    {CLI_OPT("--key", CLI_PATH, AT(key), "K.npy", "the key, (S, kdim) (default: the query)")},
    {CLI_OPT("--value", CLI_PATH, AT(value), "V.npy", "the value, (S, vdim) (default: the key)")},
    {CLI_OPT("--weights", CLI_PATH, AT(weights), "W.safetensors",
             "an nn.MultiheadAttention state_dict (or a model's, with --prefix)")},
    {CLI_OPT("--prefix", CLI_PATH, AT(prefix), "P",
             "the block's key prefix (layers.0.self_attn. or layers.0.self_attn)")},
    {CLI_OPT("--heads", CLI_SIZE, AT(heads), "H", "the heads (needed with --weights; default 1)"),
     .min = 1, .given = CLI_GIVEN(run_options, heads_given)},
    {CLI_OPT("--wq", CLI_PATH, AT(wq), "WQ.npy", "textbook X.W query weights (E, dk)")},
    {CLI_OPT("--wk", CLI_PATH, AT(wk), "WK.npy", "textbook key weights (kdim, dk)")},
    {CLI_OPT("--wv", CLI_PATH, AT(wv), "WV.npy", "textbook value weights (vdim, dv)")},
    {CLI_OPT("--wo", CLI_PATH, AT(wo), "WO.npy", "textbook output weights (dv, E)")},
    {CLI_OPT("--kv-heads", CLI_SIZE, AT(kv_heads), "G", "grouped-query attention: K/V heads"),
     .min = 1},
    {CLI_OPT("--attn-mask", CLI_PATH, AT(attn_mask), "M.npy",
             "(L, S) or (B * H, L, S): float added, or bool (True = masked)")},
    CLI_USE(cli_masks_group, run_options, masks, 0),
    CLI_USE(cli_score_group, run_options, score, ~(unsigned)CLI_SCORE_ALIGN),
    {CLI_OPT("--posenc", CLI_CUSTOM, AT(posenc), NULL, "add the sinusoidal positional encoding"),
     .choices = posenc_choices, .handle = parse_posenc},
    {CLI_OPT("--posenc-table", CLI_PATH, AT(posenc_table), "T.npy",
             "add rows of a learned positional table (max_len, features)")},
    CLI_USE(cli_rope_group, run_options, rope, 0),
    {CLI_OPT("--out", CLI_PATH, AT(out), "O.npy", "write the output (else it is printed)")},
    {CLI_OPT("--attn-out", CLI_PATH, AT(attn_out), "A.npy",
             "write the per-head weights (B, H, L, S)")},
    CLI_USE(cli_heatmap_group, run_options, heatmap, 0),
    CLI_USE(cli_exec_group, run_options, exec, 0),
};
#undef AT

static const char *const run_help[] = {run_usage, run_usage_more, NULL};
static const cli_command run_command_spec = CLI_COMMAND("run", run_table, run_help);

static int parse_options(int argc, char **argv, run_options *o)
{
    const int rc = cli_parse_command(&run_command_spec, argc, argv, o);
    if (rc != CLI_OK)
        return rc;
    if (o->score.scale == 0.0f) /* sdpa leaves that to the library; here it is refused */
        return cli_fail("run", CLI_BAD_INPUT, "--scale: 0 would ignore the scores");
    if (!o->query)
        return cli_fail("run", CLI_BAD_INPUT, "--query Q.npy is required (see --help)");
    const bool textbook = o->wq || o->wk || o->wv || o->wo;
    if (o->weights && textbook)
        return cli_fail("run", CLI_BAD_INPUT, "give --weights or --wq/--wk/--wv, not both");
    if (!o->weights && !textbook)
        return cli_fail("run", CLI_BAD_INPUT,
                        "weights needed: --weights W.safetensors --heads H, or --wq --wk --wv");
    if (textbook && !(o->wq && o->wk && o->wv))
        return cli_fail("run", CLI_BAD_INPUT, "--wq, --wk and --wv go together");
    if (o->score.path == CLATTN_PATH_FUSED && (o->attn_out || o->heatmap.png))
        return cli_fail("run", CLI_BAD_INPUT,
                        "--path fused never forms the attention weights: "
                        "drop --attn-out/--attn-png or use --path auto");
    if (o->weights && !o->heads_given)
        return cli_fail("run", CLI_BAD_INPUT, "--weights needs --heads H");
    if (o->prefix && !o->weights)
        return cli_fail("run", CLI_BAD_INPUT, "--prefix goes with --weights W.safetensors");
    if (o->prefix && strlen(o->prefix) > 200)
        return cli_fail("run", CLI_BAD_INPUT, "--prefix: longer than 200 characters");
    if (!o->heads_given)
        o->heads = 1;
    if (!cli_check_rope("run", &o->rope))
        return CLI_BAD_INPUT;
    if (o->posenc && o->posenc_table)
        return cli_fail("run", CLI_BAD_INPUT, "give --posenc or --posenc-table, not both");
    if (o->score.alibi && o->score.alibi_slopes)
        return cli_fail("run", CLI_BAD_INPUT, "give --alibi or --alibi-slopes, not both");
    if (o->kv_heads && o->heads % o->kv_heads != 0)
        return cli_fail("run", CLI_BAD_INPUT, "--kv-heads %zu does not divide --heads %zu",
                        o->kv_heads, o->heads);
    /* Before any work: an output that cannot be written fails now, not after the run. */
    if (!cli_check_output("run", "--out", o->out) ||
        !cli_check_output("run", "--attn-out", o->attn_out) ||
        !cli_check_output("run", "--attn-png", o->heatmap.png))
        return CLI_BAD_INPUT;
    return CLI_OK;
}

static int load_npy(const char *path, clattn_array *out)
{
    return cli_read_array("run", path, out);
}

/* An input sequence (query, key, value): floats only, as `clattn sdpa` takes them. */
static int load_input(const char *path, clattn_array *out)
{
    int rc = load_npy(path, out);
    if (rc == CLI_OK && (out->source == CLATTN_IO_BOOL || out->source == CLATTN_IO_INT))
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s: %s array; expected float32, float64, float16 or bfloat16", path,
                        out->source == CLATTN_IO_INT ? "an integer" : "a bool/uint8");
    return rc;
}

/* "(2, 3, 4)" */
static const char *shape_text(const clattn_array *a, char *buffer, size_t size)
{
    size_t used = (size_t)snprintf(buffer, size, "(");
    for (int i = 0; i < a->ndim && used < size; ++i)
        used += (size_t)snprintf(buffer + used, size - used, "%s%zu", i ? ", " : "", a->shape[i]);
    if (used < size)
        snprintf(buffer + used, size - used, a->ndim == 1 ? ",)" : ")");
    return buffer;
}

/* Requires a 2-D array of shape (rows, cols) with no zero dimension; rows or cols 0 means
 * "any". (A zero-width weight would reach the library as qk_dim/v_dim = 0, which means
 * "embed_dim" there: found by fuzz_cli_args.) */
static int expect_matrix(const char *what, const clattn_array *a, size_t rows, size_t cols)
{
    char text[128];
    if (a->ndim == 2 && (a->shape[0] == 0 || a->shape[1] == 0))
        return cli_fail("run", CLI_BAD_INPUT, "%s has shape %s: no dimension may be 0", what,
                        shape_text(a, text, sizeof text));
    if (a->ndim != 2 || (rows && a->shape[0] != rows) || (cols && a->shape[1] != cols)) {
        char want[96];
        snprintf(want, sizeof want, "(%s, %s)", rows ? "" : "any", cols ? "" : "any");
        if (rows && cols)
            snprintf(want, sizeof want, "(%zu, %zu)", rows, cols);
        else if (rows)
            snprintf(want, sizeof want, "(%zu, any)", rows);
        else if (cols)
            snprintf(want, sizeof want, "(any, %zu)", cols);
        return cli_fail("run", CLI_BAD_INPUT, "%s has shape %s, expected %s", what,
                        shape_text(a, text, sizeof text), want);
    }
    return CLI_OK;
}

/* Inputs as (B, L, features): a 2-D array is one unbatched sequence. */
static int sequence_dims(const char *path, const clattn_array *a, size_t *batch, size_t *seq,
                         size_t *features)
{
    char text[128];
    if (a->ndim == 2) {
        *batch = 1, *seq = a->shape[0], *features = a->shape[1];
    } else if (a->ndim == 3) {
        *batch = a->shape[0], *seq = a->shape[1], *features = a->shape[2];
    } else {
        return cli_fail("run", CLI_BAD_INPUT, "%s has shape %s, expected (L, E) or (B, L, E)", path,
                        shape_text(a, text, sizeof text));
    }
    if (*batch == 0 || *seq == 0 || *features == 0)
        return cli_fail("run", CLI_BAD_INPUT, "%s has shape %s: no dimension may be 0", path,
                        shape_text(a, text, sizeof text));
    return CLI_OK;
}

/* The key of `name` in the file: the block's prefix (--prefix, or the one found) first. */
static const char *st_key(const run_data *d, const char *name)
{
    static char keys[4][512];
    static int next;
    char *key = keys[next++ % 4];
    snprintf(key, sizeof keys[0], "%s%s", d->prefix, name);
    return key;
}

/* Whether a key looks like part of an attention block (to list when one is missing). */
static bool attention_like(const char *name)
{
    static const char *const words[] = {"attn", "attention", "proj", "query", "key",
                                        "value", "q_",        "k_",   "v_",    "out"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; ++i)
        if (strstr(name, words[i]))
            return true;
    return false;
}

/* "a, b, c and 4 more": the file's attention-like keys (at most 8 named). */
static void list_attention_keys(const clattn_safetensors *file, char *text, size_t size)
{
    size_t named = 0, more = 0, used = 0;
    text[0] = '\0';
    for (size_t i = 0; i < clattn_safetensors_count(file); ++i) {
        const char *name = clattn_safetensors_name(file, i);
        if (!name || !attention_like(name))
            continue;
        if (named == 8 || used + strlen(name) + 3 >= size) {
            ++more;
            continue;
        }
        used += (size_t)snprintf(text + used, size - used, "%s%s", named ? ", " : "", name);
        ++named;
    }
    if (more && used < size)
        snprintf(text + used, size - used, " and %zu more", more);
}

static int read_tensor(run_data *d, const char *path, const char *name, clattn_array *out,
                       bool required)
{
    char msg[1024];
    const char *key = st_key(d, name);
    clattn_io_status s = clattn_safetensors_read(d->safetensors, key, out, msg, sizeof msg);
    if (s == CLATTN_IO_ERR_NOT_FOUND && !required)
        return CLI_OK;
    if (s == CLATTN_IO_ERR_NOT_FOUND) {
        char present[600];
        list_attention_keys(d->safetensors, present, sizeof present);
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s: no tensor '%s' (an nn.MultiheadAttention state_dict has "
                        "in_proj_weight or q/k/v_proj_weight; --prefix P reads P + those names); "
                        "attention-like keys in the file: %s",
                        path, key, present[0] ? present : "none");
    }
    return s == CLATTN_IO_OK ? CLI_OK : cli_fail("run", CLI_BAD_INPUT, "%s", msg);
}

/* Without --prefix: when the file has no top-level block but exactly one nested one (keys
 * ending in in_proj_weight or q_proj_weight under one prefix), takes its prefix and says so;
 * several: refuses, listing them. */
static int find_prefix(const run_options *o, run_data *d, const char *path)
{
    if (o->prefix) { /* "layers.0.self_attn." or, without the dot, "layers.0.self_attn" */
        snprintf(d->prefix, sizeof d->prefix, "%s", o->prefix);
        const bool found = clattn_safetensors_has(d->safetensors, st_key(d, "in_proj_weight")) ||
                           clattn_safetensors_has(d->safetensors, st_key(d, "q_proj_weight"));
        const size_t length = strlen(d->prefix);
        if (!found && length > 0 && d->prefix[length - 1] != '.') {
            snprintf(d->prefix, sizeof d->prefix, "%s.", o->prefix);
            if (!clattn_safetensors_has(d->safetensors, st_key(d, "in_proj_weight")) &&
                !clattn_safetensors_has(d->safetensors, st_key(d, "q_proj_weight")))
                d->prefix[length] = '\0'; /* neither: the first read names what is missing */
        }
        return CLI_OK;
    }
    d->prefix[0] = '\0';
    if (clattn_safetensors_has(d->safetensors, "in_proj_weight") ||
        clattn_safetensors_has(d->safetensors, "q_proj_weight"))
        return CLI_OK;
    static const char *const anchors[] = {"in_proj_weight", "q_proj_weight"};
    char found[8][256], list[1200] = "";
    size_t count = 0, extra = 0;
    for (size_t i = 0; i < clattn_safetensors_count(d->safetensors); ++i) {
        const char *name = clattn_safetensors_name(d->safetensors, i);
        const size_t length = name ? strlen(name) : 0;
        for (size_t a = 0; a < 2; ++a) {
            const size_t tail = strlen(anchors[a]);
            if (length <= tail || length - tail >= sizeof found[0] ||
                strcmp(name + length - tail, anchors[a]) != 0)
                continue;
            char prefix[256];
            snprintf(prefix, sizeof prefix, "%.*s", (int)(length - tail), name);
            bool seen = false;
            for (size_t j = 0; j < count; ++j)
                seen = seen || strcmp(found[j], prefix) == 0;
            if (seen)
                continue;
            if (count < 8)
                snprintf(found[count++], sizeof found[0], "%s", prefix);
            else
                ++extra;
        }
    }
    if (count == 1) {
        snprintf(d->prefix, sizeof d->prefix, "%s", found[0]);
        fprintf(stderr, "clattn run: note: %s holds one attention block, under the prefix '%s' "
                        "(--prefix chooses)\n",
                path, d->prefix);
        return CLI_OK;
    }
    if (count > 1) {
        size_t used = 0;
        for (size_t j = 0; j < count && used < sizeof list; ++j)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s'%s'", j ? ", " : "",
                                     found[j]);
        if (extra && used < sizeof list)
            snprintf(list + used, sizeof list - used, " and %zu more", extra);
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s holds %zu attention blocks: choose one with --prefix (%s)", path,
                        count + extra, list);
    }
    return CLI_OK; /* none: the first read names what is missing and what the file has */
}

/* Loads a PyTorch state_dict; fills desc dims and the parameters. */
static int load_torch_weights(const run_options *o, run_data *d, clattn_mha_host_desc *desc)
{
    char msg[1024], text[128];
    const char *path = o->weights;
    if (clattn_safetensors_open(path, &d->safetensors, msg, sizeof msg) != CLATTN_IO_OK)
        return cli_fail("run", CLI_BAD_INPUT, "%s", msg);
    int rc;
    if ((rc = find_prefix(o, d, path)))
        return rc;
    if (clattn_safetensors_has(d->safetensors, st_key(d, "bias_k")) ||
        clattn_safetensors_has(d->safetensors, st_key(d, "bias_v")))
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s: bias_k/bias_v (add_bias_kv=True) are not supported", path);
    clattn_array *p = d->param;
    const bool packed = clattn_safetensors_has(d->safetensors, st_key(d, "in_proj_weight"));
    size_t kv_rows = 0; /* k/v projections' outputs (separate weights) */
    if (packed && o->kv_heads && o->kv_heads != o->heads)
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s: --kv-heads %zu needs separate q/k/v_proj_weight (in_proj_weight "
                        "packs three (E, E) matrices)",
                        path, o->kv_heads);
    if (packed) {
        if ((rc = read_tensor(d, path, "in_proj_weight", &p[P_IN_W], true)))
            return rc;
        if (p[P_IN_W].ndim != 2 || p[P_IN_W].shape[1] == 0 ||
            p[P_IN_W].shape[0] != 3 * p[P_IN_W].shape[1])
            return cli_fail("run", CLI_BAD_INPUT,
                            "%s: in_proj_weight has shape %s, expected "
                            "(3E, E)",
                            path, shape_text(&p[P_IN_W], text, sizeof text));
        desc->embed_dim = p[P_IN_W].shape[1];
    } else {
        if ((rc = read_tensor(d, path, "q_proj_weight", &p[P_Q], true)) ||
            (rc = read_tensor(d, path, "k_proj_weight", &p[P_K], true)) ||
            (rc = read_tensor(d, path, "v_proj_weight", &p[P_V], true)))
            return rc;
        desc->embed_dim = p[P_Q].ndim == 2 ? p[P_Q].shape[1] : 0;
        const size_t e = desc->embed_dim;
        if ((rc = expect_matrix("q_proj_weight", &p[P_Q], e, e)))
            return rc;
        if (e % o->heads != 0)
            return cli_fail("run", CLI_BAD_INPUT,
                            "--heads %zu does not divide embed_dim %zu (from %s)", o->heads, e,
                            path);
        kv_rows = o->kv_heads ? e / o->heads * o->kv_heads : e;
        if ((rc = expect_matrix("k_proj_weight", &p[P_K], kv_rows, 0)) ||
            (rc = expect_matrix("v_proj_weight", &p[P_V], kv_rows, 0)))
            return rc;
        desc->kdim = p[P_K].shape[1];
        desc->vdim = p[P_V].shape[1];
    }
    const size_t e = desc->embed_dim, bias_count = packed ? 3 * e : e + 2 * kv_rows;
    if ((rc = read_tensor(d, path, "in_proj_bias", &p[P_IN_B], false)) ||
        (rc = read_tensor(d, path, "out_proj.weight", &p[P_OUT_W], false)) ||
        (rc = read_tensor(d, path, "out_proj.bias", &p[P_OUT_B], false)))
        return rc;
    if (p[P_IN_B].data && (p[P_IN_B].ndim != 1 || p[P_IN_B].shape[0] != bias_count))
        return cli_fail("run", CLI_BAD_INPUT, "%s: in_proj_bias has shape %s, expected (%zu,)",
                        path, shape_text(&p[P_IN_B], text, sizeof text), bias_count);
    if (p[P_OUT_W].data && (rc = expect_matrix("out_proj.weight", &p[P_OUT_W], e, e)))
        return rc;
    if (p[P_OUT_B].data && (p[P_OUT_B].ndim != 1 || p[P_OUT_B].shape[0] != e))
        return cli_fail("run", CLI_BAD_INPUT, "%s: out_proj.bias has shape %s, expected (%zu,)",
                        path, shape_text(&p[P_OUT_B], text, sizeof text), e);
    if (p[P_OUT_B].data && !p[P_OUT_W].data)
        return cli_fail("run", CLI_BAD_INPUT, "%s: out_proj.bias without out_proj.weight", path);
    if (e % o->heads != 0)
        return cli_fail("run", CLI_BAD_INPUT, "--heads %zu does not divide embed_dim %zu (from %s)",
                        o->heads, e, path);
    desc->layout = CLATTN_LAYOUT_TORCH;
    return CLI_OK;
}

/* Loads the textbook X·W weights. */
static int load_textbook_weights(const run_options *o, run_data *d, clattn_mha_host_desc *desc,
                                 size_t embed_dim)
{
    int rc;
    clattn_array *p = d->param;
    if ((rc = load_npy(o->wq, &p[P_Q])) || (rc = load_npy(o->wk, &p[P_K])) ||
        (rc = load_npy(o->wv, &p[P_V])) || (o->wo && (rc = load_npy(o->wo, &p[P_OUT_W]))))
        return rc;
    if ((rc = expect_matrix(o->wq, &p[P_Q], embed_dim, 0)))
        return rc;
    const size_t dk = p[P_Q].shape[1];
    if (dk % o->heads != 0)
        return cli_fail("run", CLI_BAD_INPUT, "--heads %zu does not divide dk=%zu (from %s)",
                        o->heads, dk, o->wq);
    /* Grouped-query: Wk and Wv have kv_heads heads of the query heads' sizes. */
    const size_t kv_heads = o->kv_heads ? o->kv_heads : o->heads;
    if ((rc = expect_matrix(o->wk, &p[P_K], 0, dk / o->heads * kv_heads)) ||
        (rc = expect_matrix(o->wv, &p[P_V], 0, 0)))
        return rc;
    const size_t dv_kv = p[P_V].shape[1];
    if (dv_kv % kv_heads != 0)
        return cli_fail("run", CLI_BAD_INPUT, "%s %zu does not divide dv=%zu (from %s)",
                        o->kv_heads ? "--kv-heads" : "--heads", kv_heads, dv_kv, o->wv);
    const size_t dv = dv_kv / kv_heads * o->heads;
    if (o->wo && (rc = expect_matrix(o->wo, &p[P_OUT_W], dv, embed_dim)))
        return rc;
    desc->embed_dim = embed_dim;
    desc->kdim = p[P_K].shape[0];
    desc->vdim = p[P_V].shape[0];
    desc->qk_dim = dk;
    desc->v_dim = dv;
    desc->layout = CLATTN_LAYOUT_XW;
    return CLI_OK;
}

/* Loads and converts the masks into what the host API takes. */
static int load_masks(const run_options *o, run_data *d, clattn_mha_host_desc *desc,
                      bool batched)
{
    int rc;
    char text[128];
    if (o->attn_mask) {
        if ((rc = load_npy(o->attn_mask, &d->mask)))
            return rc;
        /* (L, S) for every batch entry and head, or PyTorch's (B * H, L, S), head fastest. */
        const clattn_array *m = &d->mask;
        if (m->ndim == 3) {
            if (m->shape[0] != desc->batch * o->heads || m->shape[1] != desc->seq_q ||
                m->shape[2] != desc->seq_k)
                return cli_fail("run", CLI_BAD_INPUT,
                                "%s has shape %s, expected (%zu, %zu) or (B * H, L, S) = (%zu, "
                                "%zu, %zu)",
                                o->attn_mask, shape_text(m, text, sizeof text), desc->seq_q,
                                desc->seq_k, desc->batch * o->heads, desc->seq_q, desc->seq_k);
            desc->attn_mask_per_head = 1;
        } else if ((rc = expect_matrix(o->attn_mask, &d->mask, desc->seq_q, desc->seq_k))) {
            return rc;
        }
        d->mask_additive = malloc(d->mask.count * sizeof(float));
        if (d->mask_additive == NULL)
            return cli_fail("run", CLI_FAILED, "out of memory");
        const bool boolean = d->mask.source == CLATTN_IO_BOOL;
        if (boolean)
            cli_note_mask_convention("run", "--attn-mask", o->masks.true_masked,
                                     o->masks.true_given);
        for (size_t i = 0; i < d->mask.count; ++i)
            d->mask_additive[i] =
                boolean ? ((d->mask.data[i] != 0.0f) == o->masks.true_masked ? -INFINITY : 0.0f)
                        : d->mask.data[i];
    }
    if (o->masks.key_padding) {
        if ((rc = load_npy(o->masks.key_padding, &d->padding)))
            return rc;
        const bool ok = batched ? d->padding.ndim == 2 && d->padding.shape[0] == desc->batch &&
                                      d->padding.shape[1] == desc->seq_k
                                : d->padding.ndim == 1 && d->padding.shape[0] == desc->seq_k;
        if (!ok) {
            char want[64];
            if (batched)
                snprintf(want, sizeof want, "(%zu, %zu)", desc->batch, desc->seq_k);
            else
                snprintf(want, sizeof want, "(%zu,)", desc->seq_k);
            return cli_fail("run", CLI_BAD_INPUT, "%s has shape %s, expected %s",
                            o->masks.key_padding, shape_text(&d->padding, text, sizeof text), want);
        }
        d->padding_bytes = malloc(d->padding.count ? d->padding.count : 1);
        if (d->padding_bytes == NULL)
            return cli_fail("run", CLI_FAILED, "out of memory");
        for (size_t i = 0; i < d->padding.count; ++i)
            d->padding_bytes[i] = d->padding.data[i] != 0.0f;
    }
    return CLI_OK;
}

/* Prints the output when no --out was given. */
static void print_output(const float *out, bool batched, size_t batch, size_t seq,
                         size_t features)
{
    if (batch * seq * features > 4096) { /* the shape --out would write */
        if (batched)
            printf("output: (%zu, %zu, %zu) floats; use --out O.npy to save it\n", batch, seq,
                   features);
        else
            printf("output: (%zu, %zu) floats; use --out O.npy to save it\n", seq, features);
        return;
    }
    for (size_t b = 0; b < batch; ++b) {
        char title[64];
        snprintf(title, sizeof title, batch > 1 ? "output[%zu]" : "output", b);
        cli_print_matrix(title, out + b * seq * features, seq, features);
    }
}

static int write_npy(const char *path, const float *data, int ndim, const size_t *shape)
{
    char msg[1024];
    return clattn_npy_write(path, data, ndim, shape, msg, sizeof msg) == CLATTN_IO_OK
               ? CLI_OK
               : cli_fail("run", CLI_FAILED, "%s", msg);
}

/* The output in the query's float type, as `clattn sdpa` writes it: float16 and bfloat16
 * queries give float16 and bfloat16 outputs (computed in float32, rounded once); float32 and
 * float64 give float32. */
static int write_typed(const char *path, const float *data, int ndim, const size_t *shape,
                       clattn_io_dtype like)
{
    char msg[1024];
    const clattn_io_dtype dtype =
        like == CLATTN_IO_F16 || like == CLATTN_IO_BF16 ? like : CLATTN_IO_F32;
    return clattn_npy_write_typed(path, data, ndim, shape, dtype, msg, sizeof msg) == CLATTN_IO_OK
               ? CLI_OK
               : cli_fail("run", CLI_FAILED, "%s", msg);
}

/* Adds the positional encoding (--posenc: the sinusoid; --posenc-table: rows 0.. of the
 * table) to the rows of input `a` ((L, F) or (B, L, F)) in place, on the device. */
static int add_posenc(clattn_ctx *ctx, const clattn_array *table, clattn_array *a, const char *path)
{
    clattn_posenc_desc desc;
    clattn_posenc_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.kind = table->data ? CLATTN_POSENC_TABLE : CLATTN_POSENC_SINUSOIDAL;
    const size_t *shape = a->shape;
    desc_tensors.q =
        a->ndim == 3
            ? clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, shape[0], shape[1], shape[2], 0)
            : clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, shape[0], shape[1], 0, 0);
    desc_tensors.out = desc_tensors.q;
    if (table->data)
        desc_tensors.pos_table = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, table->shape[0],
                                                    table->shape[1], 0, 0);
    clattn_plan *plan = NULL;
    clattn_status status = clattn_posenc_plan_create(ctx, &desc, &plan);
    cl_mem mem[2] = {NULL, NULL};
    cl_int err = CL_SUCCESS;
    if (status == CLATTN_SUCCESS) {
        mem[0] =
            clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                           a->count * sizeof(float), a->data, &err);
        if (err == CL_SUCCESS && table->data)
            mem[1] =
                clCreateBuffer(clattn_ctx_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                               table->count * sizeof(float), table->data, &err);
    }
    if (status == CLATTN_SUCCESS && err == CL_SUCCESS) {
        clattn_tensors bound = desc_tensors;
        bound.q.mem = bound.out.mem = mem[0];
        bound.pos_table.mem = mem[1];
        status =
            clattn_plan_execute(plan, bound.by_role, CLATTN_ROLE_COUNT, NULL, NULL, 0, NULL, NULL);
        if (status == CLATTN_SUCCESS)
            err = clEnqueueReadBuffer(clattn_ctx_queue(ctx), mem[0], CL_TRUE, 0,
                                      a->count * sizeof(float), a->data, 0, NULL, NULL);
    }
    cli_release_buffers(mem, 2);
    clattn_plan_release(plan);
    if (status != CLATTN_SUCCESS)
        return cli_fail("run", CLI_FAILED, "positional encoding of %s: %s: %s", path,
                        clattn_status_string(status), clattn_last_error(ctx));
    if (err != CL_SUCCESS)
        return cli_fail("run", CLI_FAILED, "positional encoding of %s: OpenCL error %d", path,
                        (int)err);
    return CLI_OK;
}

/* Loads and validates everything; with check_only, stops before the device. */
/* The inputs' sizes: the query (B, L, E) or (L, E), the key and value (S, kdim), (S, vdim). */
typedef struct run_sizes {
    size_t batch, seq_q, embed, seq_k, kdim, vdim, out_features;
    const char *key_path, *value_path; /* the files they came from (the query's by default) */
    bool batched;
} run_sizes;

/* Reads the query, key and value (key and value default to the query, value to the key):
 * one batching, as many values as keys. */
static int load_sequences(const run_options *o, run_data *d, run_sizes *z)
{
    int rc;
    size_t kb, vb, seq_v;
    if ((rc = load_input(o->query, &d->query)) ||
        (rc = sequence_dims(o->query, &d->query, &z->batch, &z->seq_q, &z->embed)))
        return rc;
    const clattn_array *key = &d->query, *value = &d->query;
    z->key_path = o->query;
    if (o->key) {
        if ((rc = load_input(o->key, &d->key)))
            return rc;
        key = &d->key, z->key_path = o->key;
    }
    value = key, z->value_path = z->key_path;
    if (o->value) {
        if ((rc = load_input(o->value, &d->value)))
            return rc;
        value = &d->value, z->value_path = o->value;
    }
    if ((rc = sequence_dims(z->key_path, key, &kb, &z->seq_k, &z->kdim)) ||
        (rc = sequence_dims(z->value_path, value, &vb, &seq_v, &z->vdim)))
        return rc;
    if (key->ndim != d->query.ndim || value->ndim != d->query.ndim || kb != z->batch ||
        vb != z->batch)
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s, %s and %s must all be (L, features) or all "
                        "(B, L, features) with the same B",
                        o->query, z->key_path, z->value_path);
    if (seq_v != z->seq_k)
        return cli_fail("run", CLI_BAD_INPUT, "%s has %zu positions but %s has %zu", z->value_path,
                        seq_v, z->key_path, z->seq_k);
    z->batched = d->query.ndim == 3;
    return CLI_OK;
}

/* The descriptor's sizes and options (the weights and masks come after). */
static void describe(const run_options *o, const run_sizes *z, clattn_mha_host_desc *desc)
{
    clattn_mha_host_desc_init(desc); /* struct_size; scale NAN = 1/sqrt(head dim) */
    desc->batch = z->batch;
    desc->seq_q = z->seq_q;
    desc->seq_k = z->seq_k;
    desc->num_heads = o->heads;
    desc->num_kv_heads = o->kv_heads ? o->kv_heads : CLATTN_KV_HEADS_ALL;
    desc->scale = o->score.scale;
    desc->norm = o->score.norm;
    desc->causal = o->score.causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    desc->path = o->score.path;
    desc->softcap = o->score.softcap;
    desc->rope = o->rope.on;
    desc->rope_style = o->rope.style;
    desc->rope_dims = o->rope.dims ? o->rope.dims : CLATTN_ROPE_WHOLE_HEAD;
    desc->rope_base = o->rope.base ? o->rope.base : CLATTN_ROPE_BASE_DEFAULT;
    desc->rope_start = o->rope.start;
    if (o->score.window.on) {
        desc->window_align = CLATTN_CAUSAL_TOP_LEFT;
        desc->window_left = o->score.window.left;
        desc->window_right = o->score.window.right;
    }
}

/* The inputs' widths against the weights' embed_dim, kdim and vdim. */
static int check_features(const run_options *o, const run_sizes *z,
                          const clattn_mha_host_desc *desc)
{
    const size_t want_kdim = desc->kdim ? desc->kdim : desc->embed_dim;
    const size_t want_vdim = desc->vdim ? desc->vdim : desc->embed_dim;
    if (z->embed != desc->embed_dim)
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s has %zu features but the weights expect "
                        "embed_dim %zu",
                        o->query, z->embed, desc->embed_dim);
    if (z->kdim != want_kdim)
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s has %zu features but the weights expect "
                        "kdim %zu",
                        z->key_path, z->kdim, want_kdim);
    if (z->vdim != want_vdim)
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s has %zu features but the weights expect "
                        "vdim %zu",
                        z->value_path, z->vdim, want_vdim);
    return CLI_OK;
}

/* Host room for the output and, when asked for, the per-head weights. */
static int allocate_outputs(const run_options *o, run_data *d, run_sizes *z,
                            clattn_mha_host_desc *desc)
{
    const bool want_weights = o->attn_out || o->heatmap.png;
    desc->need_weights = want_weights ? CLATTN_WEIGHTS_PER_HEAD : CLATTN_WEIGHTS_NONE;
    z->out_features = d->param[P_OUT_W].data ? desc->embed_dim
                      : desc->v_dim          ? desc->v_dim
                                             : desc->embed_dim;
    const size_t out_count = z->batch * z->seq_q * z->out_features; /* fits: inputs were read */
    size_t weights_count = 0;
    if (want_weights) {
        const double count = (double)z->batch * o->heads * z->seq_q * z->seq_k;
        if (count * sizeof(float) > 64.0 * 1073741824.0)
            return cli_fail("run", CLI_BAD_INPUT,
                            "the attention weights (%zu x %zu x %zu x "
                            "%zu) are too large to return",
                            z->batch, o->heads, z->seq_q, z->seq_k);
        weights_count = z->batch * o->heads * z->seq_q * z->seq_k;
    }
    d->out = malloc(out_count * sizeof(float));
    d->weights = want_weights ? malloc(weights_count * sizeof(float)) : NULL;
    if (!d->out || (want_weights && !d->weights))
        return cli_fail("run", CLI_FAILED, "out of memory for the outputs");
    return CLI_OK;
}

/* The loaded parameters as clattn_mha_forward_host takes them. */
static clattn_mha_host_weights host_weights(const run_data *d, size_t embed_dim)
{
    const clattn_array *p = d->param;
    clattn_mha_host_weights w = {.in_proj_weight = p[P_IN_W].data,
                                 .q_weight = p[P_Q].data,
                                 .k_weight = p[P_K].data,
                                 .v_weight = p[P_V].data,
                                 .out_weight = p[P_OUT_W].data,
                                 .out_bias = p[P_OUT_B].data};
    if (p[P_IN_B].data && p[P_IN_W].data)
        w.in_proj_bias = p[P_IN_B].data;
    else if (p[P_IN_B].data) { /* PyTorch keeps one in_proj_bias even with separate weights */
        const size_t kv_rows = p[P_K].shape[0]; /* TORCH layout: (outputs, kdim) */
        w.q_bias = p[P_IN_B].data, w.k_bias = p[P_IN_B].data + embed_dim;
        w.v_bias = p[P_IN_B].data + embed_dim + kv_rows;
    }
    return w;
}

/* ALiBi: the paper's slopes, or the file's (H). */
static int load_slopes(const run_options *o, run_data *d)
{
    int rc;
    if (o->score.alibi) {
        d->slopes.data = malloc(o->heads * sizeof(float));
        if (!d->slopes.data)
            return cli_fail("run", CLI_FAILED, "out of memory for the ALiBi slopes");
        if (clattn_alibi_slopes(o->heads, 8.0f, d->slopes.data) != CLATTN_SUCCESS)
            return cli_fail("run", CLI_FAILED, "clattn_alibi_slopes failed for %zu heads",
                            o->heads);
        return CLI_OK;
    }
    if (!o->score.alibi_slopes)
        return CLI_OK;
    if ((rc = load_npy(o->score.alibi_slopes, &d->slopes)))
        return rc;
    if (d->slopes.ndim != 1 || d->slopes.shape[0] != o->heads)
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s: the ALiBi slopes must be (%zu) floats, one per head",
                        o->score.alibi_slopes, o->heads);
    for (size_t h = 0; h < o->heads; ++h)
        if (!isfinite(d->slopes.data[h]))
            return cli_fail("run", CLI_BAD_INPUT, "%s: slope %zu is not finite",
                            o->score.alibi_slopes, h);
    return CLI_OK;
}

/* A learned positional table: as wide as every input, as long as the longest. */
static int load_pos_table(const run_options *o, run_data *d, const run_sizes *z)
{
    int rc;
    if ((rc = load_npy(o->posenc_table, &d->pos_table)))
        return rc;
    const size_t rows = d->pos_table.ndim == 2 ? d->pos_table.shape[0] : 0;
    const size_t cols = d->pos_table.ndim == 2 ? d->pos_table.shape[1] : 0;
    const size_t longest = z->seq_q > z->seq_k ? z->seq_q : z->seq_k;
    if (d->pos_table.ndim != 2 || rows < longest || cols != z->embed ||
        (o->key && cols != z->kdim) || (o->value && cols != z->vdim))
        return cli_fail("run", CLI_BAD_INPUT,
                        "%s: the positional table must be (max_len >= %zu, %zu) floats, "
                        "as wide as every input",
                        o->posenc_table, longest, z->embed);
    return CLI_OK;
}

/* On the device: the positional encoding added to the inputs, then the attention. */
static int run_device(const run_options *o, run_data *d, const clattn_mha_host_desc *desc)
{
    int rc = CLI_OK;
    clattn_ctx *ctx = cli_context("run", o->exec.device);
    if (ctx == NULL)
        return cli_context_exit();
    if (o->posenc || o->posenc_table) {
        if ((rc = add_posenc(ctx, &d->pos_table, &d->query, o->query)) ||
            (o->key && (rc = add_posenc(ctx, &d->pos_table, &d->key, o->key))) ||
            (o->value && (rc = add_posenc(ctx, &d->pos_table, &d->value, o->value)))) {
            cli_release_context(ctx);
            return rc;
        }
    }
    const clattn_mha_host_weights w = host_weights(d, desc->embed_dim);
    const clattn_host_masks masks = {.attn_mask = d->mask_additive,
                                     .key_padding_mask = d->padding_bytes,
                                     .alibi_slopes = d->slopes.data};
    clattn_status status =
        clattn_mha_forward_host(ctx, desc, &w, d->query.data, o->key ? d->key.data : NULL,
                                o->value ? d->value.data : NULL, &masks, d->out, d->weights);
    rc = cli_call_failure("run", ctx, status, true, CL_SUCCESS);
    cli_release_context(ctx);
    return rc;
}

/* The output (written, or printed), the weights and their heatmap. */
static int write_results(const run_options *o, const run_data *d, const run_sizes *z,
                         const clattn_mha_host_desc *desc)
{
    int rc;
    const bool batched = z->batched;
    const size_t out_shape[3] = {z->batch, z->seq_q, z->out_features};
    if (o->out) {
        if ((rc = write_typed(o->out, d->out, batched ? 3 : 2,
                              batched ? out_shape : out_shape + 1, d->query.source)))
            return rc;
    } else {
        print_output(d->out, batched, z->batch, z->seq_q, z->out_features);
    }
    if (o->attn_out) {
        const size_t shape[4] = {z->batch, o->heads, z->seq_q, z->seq_k};
        if ((rc = write_npy(o->attn_out, d->weights, batched ? 4 : 3, batched ? shape : shape + 1)))
            return rc;
    }
    if (!o->heatmap.png)
        return CLI_OK;
    const cli_png_masks masks_png = {.heads = o->heads,
                                     .rows = z->seq_q,
                                     .cols = z->seq_k,
                                     .causal = o->score.causal,
                                     .window = o->score.window.on,
                                     .window_left = o->score.window.left,
                                     .window_right = o->score.window.right,
                                     .padding = d->padding_bytes,
                                     .additive = d->mask_additive,
                                     .per_head_mask = desc->attn_mask_per_head != 0};
    return cli_write_attention_png("run", o->heatmap.png, d->weights, &masks_png, o->heatmap.scale);
}

static int run(const run_options *o, run_data *d, bool check_only)
{
    int rc;
    run_sizes sizes = {0};
    clattn_mha_host_desc desc;
    if ((rc = load_sequences(o, d, &sizes)))
        return rc;
    describe(o, &sizes, &desc);
    if ((rc = o->weights ? load_torch_weights(o, d, &desc)
                         : load_textbook_weights(o, d, &desc, sizes.embed)) ||
        (rc = check_features(o, &sizes, &desc)) || (rc = load_masks(o, d, &desc, sizes.batched)) ||
        (rc = allocate_outputs(o, d, &sizes, &desc)) || (rc = load_slopes(o, d)) ||
        (o->posenc_table && (rc = load_pos_table(o, d, &sizes))))
        return rc;
    if (check_only)
        return CLI_OK;
    if ((rc = run_device(o, d, &desc)))
        return rc;
    return write_results(o, d, &sizes, &desc);
}

static int run_command(int argc, char **argv, bool check_only)
{
    run_options options = {.score = {.norm = CLATTN_NORM_SOFTMAX, .scale = NAN}, /* the default */
                           .masks = {.true_masked = true}};
    int rc = parse_options(argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    run_data data;
    memset(&data, 0, sizeof data);
    rc = run(&options, &data, check_only);
    run_free(&data);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    return run_command(argc, argv, false);
}

int cmd_run_check(int argc, char **argv)
{
    return run_command(argc, argv, true);
}
