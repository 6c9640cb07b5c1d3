/*
 * check_cli: the clattn command run as a user runs it. `clattn run` on PyTorch-exported
 * weights and inputs (tests/fixtures/cli, made by gen_cli_fixtures.py) must reproduce
 * PyTorch's outputs and attention weights to 1e-4; the textbook example to 1e-5; the demo's
 * chapters print the numbers of a float64 computation (1e-4); devices, bench --json and
 * --attn-png produce what they promise; and bad input of every kind exits with status 2 and
 * exactly one line on stderr.
 * Arguments: the clattn binary, the fixture folder.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <png.h>

#include "clattn_io.h"
#include "reference.h"
#include "testutil.h"

static const char *clattn_bin;
static const char *fixtures;
static char scratch[] = "/tmp/clattn-cli-XXXXXX";

/* Runs `clattn ARGS` with stdout and stderr captured into scratch files; returns the exit
 * status (-1 when it did not exit normally). */
static int run_cli(const char *args)
{
    char command[4096];
    snprintf(command, sizeof command, "'%s' %s >'%s/stdout' 2>'%s/stderr'", clattn_bin, args,
             scratch, scratch);
    int status = system(command);
    return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The captured stdout or stderr (one static buffer for each, valid until the next run). */
static const char *captured(const char *which)
{
    static char buffers[2][1 << 16];
    char *text = buffers[strcmp(which, "stdout") == 0 ? 0 : 1];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", scratch, which);
    FILE *f = fopen(path, "r");
    size_t used = f ? fread(text, 1, sizeof buffers[0] - 1, f) : 0;
    text[used] = '\0';
    if (f)
        fclose(f);
    return text;
}

static size_t count_lines(const char *text)
{
    size_t lines = 0;
    for (const char *c = text; *c; ++c)
        lines += *c == '\n';
    return lines;
}

/* Compares an .npy the command wrote with an expected .npy from the fixtures. */
static void expect_npy_close(const char *got_path, const char *want_name, double tol)
{
    char want_path[512], msg[512];
    snprintf(want_path, sizeof want_path, "%s/%s", fixtures, want_name);
    clattn_array got = {0}, want = {0};
    clattn_io_status s1 = clattn_npy_read(got_path, &got, msg, sizeof msg);
    tu_expect(s1 == CLATTN_IO_OK, "reading the output %s: %s", got_path, msg);
    clattn_io_status s2 = clattn_npy_read(want_path, &want, msg, sizeof msg);
    tu_expect(s2 == CLATTN_IO_OK, "reading the fixture %s: %s", want_path, msg);
    if (s1 == CLATTN_IO_OK && s2 == CLATTN_IO_OK) {
        int same_shape = got.ndim == want.ndim && got.count == want.count;
        for (int i = 0; same_shape && i < got.ndim; ++i)
            same_shape = got.shape[i] == want.shape[i];
        tu_expect(same_shape, "%s: shape differs from %s (ndim %d vs %d, %zu vs %zu values)",
                  got_path, want_name, got.ndim, want.ndim, got.count, want.count);
        if (same_shape) {
            double *ref = tu_doubles(want.count);
            tu_floats_to_doubles(want.data, want.count, ref);
            tu_expect_close(want_name, got.data, ref, got.count, tol);
            free(ref);
        }
    }
    clattn_array_free(&got);
    clattn_array_free(&want);
}

/* --- PyTorch cases --------------------------------------------------------------------------- */

typedef struct torch_case {
    const char *name;
    int heads;
    const char *extra; /* options beyond query/weights, with %s = fixture dir */
} torch_case;

static const torch_case torch_cases[] = {
    {"self", 2, "--key-padding-mask %s/self_kpm.npy --attn-mask %s/self_mask.npy"},
    {"cross", 3, "--key %s/cross_key.npy --value %s/cross_value.npy"},
    {"causal", 4, "--causal"},
    {"half", 2, ""},
    {"self", 2, "--key-padding-mask %s/self_kpm.npy --attn-mask %s/self_mask.npy --path unfused"},
    {"bfloat", 2, ""},
    /* PyTorch's 3-d attn_mask (N * H, L, S): a different bool mask per batch entry and head. */
    {"mask3d", 2, "--attn-mask %s/mask3d_mask.npy"},
    {"mask3d", 2, "--attn-mask %s/mask3d_mask.npy --path unfused"},
};

START_TEST(test_run_matches_pytorch)
{
    TU_BEGIN_TEST();
    const torch_case *c = &torch_cases[_i];
    tu_set_case("clattn run on the '%s' PyTorch fixture", c->name);
    char extra[1024], args[4096], out[512], attn[512];
    snprintf(extra, sizeof extra, c->extra, fixtures, fixtures);
    snprintf(out, sizeof out, "%s/%s_out.npy", scratch, c->name);
    snprintf(attn, sizeof attn, "%s/%s_attn.npy", scratch, c->name);
    snprintf(args, sizeof args,
             "run --query %s/%s_query.npy --weights %s/%s.safetensors --heads %d %s "
             "--out %s --attn-out %s",
             fixtures, c->name, fixtures, c->name, c->heads, extra, out, attn);
    int status = run_cli(args);
    tu_expect(status == 0, "exit status %d, stderr: %s", status, captured("stderr"));
    if (status == 0) {
        char want[128];
        snprintf(want, sizeof want, "%s_out.npy", c->name);
        expect_npy_close(out, want, TU_TOL);
        snprintf(want, sizeof want, "%s_attn.npy", c->name);
        expect_npy_close(attn, want, TU_TOL);
    }
    /* Without --attn-out the fused kernel runs: the same output. */
    if (strstr(c->extra, "--path") == NULL) {
        snprintf(args, sizeof args,
                 "run --query %s/%s_query.npy --weights %s/%s.safetensors --heads %d %s "
                 "--path fused --out %s",
                 fixtures, c->name, fixtures, c->name, c->heads, extra, out);
        status = run_cli(args);
        tu_expect(status == 0, "--path fused: exit status %d, stderr: %s", status,
                  captured("stderr"));
        char want[128];
        snprintf(want, sizeof want, "%s_out.npy", c->name);
        if (status == 0)
            expect_npy_close(out, want, TU_TOL);
    }
    TU_END_TEST();
}
END_TEST

/* The textbook single-head form with X·W weights, and a heatmap of its weights. */
START_TEST(test_run_textbook_and_png)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn run --wq --wk --wv --scale 0.5 --attn-png");
    char args[4096], out[512], attn[512], png[512];
    snprintf(out, sizeof out, "%s/z.npy", scratch);
    snprintf(attn, sizeof attn, "%s/w.npy", scratch);
    snprintf(png, sizeof png, "%s/w.png", scratch);
    snprintf(args, sizeof args,
             "run --query %s/textbook_x.npy --wq %s/textbook_wq.npy --wk %s/textbook_wk.npy "
             "--wv %s/textbook_wv.npy --scale 0.5 --out %s --attn-out %s --attn-png %s",
             fixtures, fixtures, fixtures, fixtures, out, attn, png);
    int status = run_cli(args);
    tu_expect(status == 0, "exit status %d, stderr: %s", status, captured("stderr"));
    if (status == 0) {
        expect_npy_close(out, "textbook_z.npy", 1e-5);
        expect_npy_close(attn, "textbook_weights.npy", 1e-5);
        FILE *f = fopen(png, "rb");
        unsigned char magic[8] = {0};
        size_t got = f ? fread(magic, 1, 8, f) : 0;
        if (f)
            fclose(f);
        tu_expect(got == 8 && memcmp(magic, "\x89PNG\r\n\x1a\n", 8) == 0,
                  "%s is not a PNG file", png);
    }
    /* Without --out the output is printed. */
    snprintf(args, sizeof args,
             "run --query %s/textbook_x.npy --wq %s/textbook_wq.npy --wk %s/textbook_wk.npy "
             "--wv %s/textbook_wv.npy --scale 0.5",
             fixtures, fixtures, fixtures, fixtures);
    status = run_cli(args);
    tu_expect(status == 0 && strstr(captured("stdout"), "1.70538") &&
                  strstr(captured("stdout"), "1.964663"),
              "printed output lacks Z: status %d, stdout: %s", status, captured("stdout"));
    TU_END_TEST();
}
END_TEST

static void expect_npy_reference(const char *got_path, const char *what, const double *ref,
                                 size_t count, int ndim, const size_t *shape);

/* Writes a fresh random (rows, cols) .npy in the scratch folder; returns the values. */
static float *scratch_npy(const char *name, size_t rows, size_t cols, char *path, size_t size)
{
    char msg[512];
    float *values = tu_random_floats(rows * cols);
    const size_t shape[2] = {rows, cols};
    snprintf(path, size, "%s/%s", scratch, name);
    tu_expect(clattn_npy_write(path, values, 2, shape, msg, sizeof msg) == CLATTN_IO_OK,
              "writing %s: %s", path, msg);
    return values;
}

/* --kv-heads: grouped-query attention with textbook X·W weights (Wk and Wv project to G heads
 * of the query heads' sizes), against the float64 reference; then the refusals. */
START_TEST(test_run_kv_heads)
{
    TU_BEGIN_TEST();
    enum { L = 17, E = 12, H = 4, G = 2, DK = 8, DV_KV = 6, DV = DV_KV / G * H };
    tu_set_case("clattn run --heads %d --kv-heads %d (textbook weights, causal)", H, G);
    char x_path[512], wq_path[512], wk_path[512], wv_path[512], wo_path[512], out[512];
    char args[4096];
    float *x = scratch_npy("gqa_x.npy", L, E, x_path, sizeof x_path);
    float *wq = scratch_npy("gqa_wq.npy", E, DK, wq_path, sizeof wq_path);
    float *wk = scratch_npy("gqa_wk.npy", E, DK / H * G, wk_path, sizeof wk_path);
    float *wv = scratch_npy("gqa_wv.npy", E, DV_KV, wv_path, sizeof wv_path);
    float *wo = scratch_npy("gqa_wo.npy", DV, E, wo_path, sizeof wo_path);
    snprintf(out, sizeof out, "%s/gqa_out.npy", scratch);

    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = 1, desc.seq_q = L, desc.seq_k = L, desc.embed_dim = E, desc.num_heads = H;
    desc.num_kv_heads = G, desc.qk_dim = DK, desc.v_dim = DV, desc.layout = CLATTN_LAYOUT_XW;
    desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    const clattn_mha_host_weights w = {
        .q_weight = wq, .k_weight = wk, .v_weight = wv, .out_weight = wo};
    const clattn_host_masks masks = {0};
    double *ref = tu_doubles((size_t)L * E);
    ref_mha_forward(&desc, &w, x, x, x, &masks, ref, NULL);

    snprintf(args, sizeof args,
             "run --query %s --wq %s --wk %s --wv %s --wo %s --heads %d --kv-heads %d --causal "
             "--out %s",
             x_path, wq_path, wk_path, wv_path, wo_path, H, G, out);
    int status = run_cli(args);
    tu_expect(status == 0, "exit status %d, stderr: %s", status, captured("stderr"));
    const size_t shape[2] = {L, E};
    if (status == 0)
        expect_npy_reference(out, "grouped-query out", ref, (size_t)L * E, 2, shape);
    /* Without --kv-heads the same Wk is the wrong width for 4 heads of 2. */
    snprintf(args, sizeof args, "run --query %s --wq %s --wk %s --wv %s --heads %d", x_path,
             wq_path, wk_path, wv_path, H);
    status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "gqa_wk.npy"),
              "Wk of 2 heads without --kv-heads: status %d, stderr: %s", status,
              captured("stderr"));
    snprintf(args, sizeof args, "run --query %s --wq %s --wk %s --wv %s --heads %d --kv-heads 3",
             x_path, wq_path, wk_path, wv_path, H);
    status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "--kv-heads 3 does not divide"),
              "--kv-heads 3 with 4 heads: status %d, stderr: %s", status, captured("stderr"));
    snprintf(args, sizeof args,
             "run --query %s/self_query.npy --weights %s/self.safetensors --heads 2 --kv-heads 1",
             fixtures, fixtures);
    status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "in_proj_weight"),
              "--kv-heads with a packed in_proj_weight: status %d, stderr: %s", status,
              captured("stderr"));
    free(ref);
    free(wo);
    free(wv);
    free(wk);
    free(wq);
    free(x);
    TU_END_TEST();
}
END_TEST

/* --softcap, --window, --alibi / --alibi-slopes with an additive --attn-mask and --causal
 * (textbook weights, 3 heads), against the float64 reference; then the refusals. */
START_TEST(test_run_score_rules)
{
    TU_BEGIN_TEST();
    enum { L = 19, E = 12, H = 3, DK = 12, DV = 9 };
    tu_set_case("clattn run --softcap --window --alibi (textbook weights, %d heads)", H);
    char x_path[512], wq_path[512], wk_path[512], wv_path[512], m_path[512], s_path[512];
    char out[512], args[4096];
    float *x = scratch_npy("rules_x.npy", L, E, x_path, sizeof x_path);
    float *wq = scratch_npy("rules_wq.npy", E, DK, wq_path, sizeof wq_path);
    float *wk = scratch_npy("rules_wk.npy", E, DK, wk_path, sizeof wk_path);
    float *wv = scratch_npy("rules_wv.npy", E, DV, wv_path, sizeof wv_path);
    float *mask = scratch_npy("rules_mask.npy", L, L, m_path, sizeof m_path);
    snprintf(out, sizeof out, "%s/rules_out.npy", scratch);

    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = 1, desc.seq_q = L, desc.seq_k = L, desc.embed_dim = E, desc.num_heads = H;
    desc.qk_dim = DK, desc.v_dim = DV, desc.layout = CLATTN_LAYOUT_XW;
    desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    desc.softcap = 1.5f;
    desc.window_align = CLATTN_CAUSAL_TOP_LEFT, desc.window_left = 4, desc.window_right = 2;
    const clattn_mha_host_weights w = {.q_weight = wq, .k_weight = wk, .v_weight = wv};
    float slopes[H];
    tu_expect_status(clattn_alibi_slopes(H, 8.0f, slopes), CLATTN_SUCCESS, "clattn_alibi_slopes");
    clattn_host_masks masks = {.attn_mask = mask, .alibi_slopes = slopes};
    double *ref = tu_doubles((size_t)L * DV);
    ref_mha_forward(&desc, &w, x, x, x, &masks, ref, NULL);
    const size_t shape[2] = {L, DV};
    for (int path = 0; path < 2; ++path) {
        snprintf(args, sizeof args,
                 "run --query %s --wq %s --wk %s --wv %s --heads %d --causal --attn-mask %s "
                 "--softcap 1.5 --window 4,2 --alibi --path %s --out %s",
                 x_path, wq_path, wk_path, wv_path, H, m_path, path ? "unfused" : "fused", out);
        int status = run_cli(args);
        tu_expect(status == 0, "exit status %d, stderr: %s", status, captured("stderr"));
        if (status == 0)
            expect_npy_reference(out, path ? "rules out (unfused)" : "rules out (fused)", ref,
                                 (size_t)L * DV, 2, shape);
    }
    /* Own slopes from a file, without the mask and the window. */
    const float own[H] = {0.75f, 0.1f, 0.0f};
    char msg[256];
    const size_t s_shape[1] = {H};
    snprintf(s_path, sizeof s_path, "%s/rules_slopes.npy", scratch);
    tu_expect(clattn_npy_write(s_path, own, 1, s_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s",
              msg);
    desc.softcap = 0.0f, desc.window_align = CLATTN_CAUSAL_NONE;
    masks.attn_mask = NULL, masks.alibi_slopes = own;
    ref_mha_forward(&desc, &w, x, x, x, &masks, ref, NULL);
    snprintf(args, sizeof args,
             "run --query %s --wq %s --wk %s --wv %s --heads %d --causal --alibi-slopes %s "
             "--out %s",
             x_path, wq_path, wk_path, wv_path, H, s_path, out);
    int status = run_cli(args);
    tu_expect(status == 0, "--alibi-slopes: exit status %d, stderr: %s", status,
              captured("stderr"));
    if (status == 0)
        expect_npy_reference(out, "rules out (own slopes)", ref, (size_t)L * DV, 2, shape);

    /* Refusals: one line, exit 2, naming the option or file. */
    static const struct {
        const char *extra, *needle;
    } bad[] = {
        {"--softcap 0", "--softcap"},
        {"--softcap -2", "--softcap"},
        {"--window 3", "--window"},
        {"--window 3,-2", "--window"},
        {"--alibi --alibi-slopes SLOPES", "not both"},
        {"--alibi-slopes MASK", "one per head"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char extra[1100];
        snprintf(extra, sizeof extra, "%s", bad[i].extra);
        char *at = strstr(extra, "SLOPES");
        if (at)
            snprintf(at, sizeof extra - (size_t)(at - extra), "%s", s_path);
        at = strstr(extra, "MASK");
        if (at)
            snprintf(at, sizeof extra - (size_t)(at - extra), "%s", m_path);
        snprintf(args, sizeof args, "run --query %s --wq %s --wk %s --wv %s --heads %d %s", x_path,
                 wq_path, wk_path, wv_path, H, extra);
        status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), bad[i].needle),
                  "'%s': status %d, stderr: %s", bad[i].extra, status, captured("stderr"));
    }
    free(ref);
    free(mask);
    free(wv);
    free(wk);
    free(wq);
    free(x);
    TU_END_TEST();
}
END_TEST

/* Writes a bool .npy ('|b1') of the given shape in the scratch folder. */
static void write_bool_npy(const char *path, const unsigned char *values, int ndim,
                           const size_t *shape)
{
    char header[256], dims[128] = "";
    size_t count = 1;
    int used = 0;
    for (int i = 0; i < ndim; ++i) {
        used += snprintf(dims + used, sizeof dims - (size_t)used, "%zu, ", shape[i]);
        count *= shape[i];
    }
    int length = snprintf(header, sizeof header,
                          "{'descr': '|b1', 'fortran_order': False, 'shape': (%s), }", dims);
    while ((10 + length + 1) % 64 != 0)
        header[length++] = ' ';
    header[length++] = '\n';
    FILE *f = fopen(path, "wb");
    if (!tu_expect(f != NULL, "cannot write %s", path))
        return;
    const unsigned char length_le[2] = {(unsigned char)(length & 0xff),
                                        (unsigned char)(length >> 8)};
    fwrite("\x93NUMPY\x01\x00", 1, 8, f); /* magic, version 1.0 */
    fwrite(length_le, 1, 2, f);
    fwrite(header, 1, (size_t)length, f);
    for (size_t i = 0; i < count; ++i)
        fputc(values[i] ? 1 : 0, f);
    fclose(f);
}

/* Writes fresh random values of any shape as a float32 .npy; returns them. */
static float *scratch_array(const char *name, int ndim, const size_t *shape, char *path,
                            size_t size)
{
    char msg[512];
    size_t count = 1;
    for (int i = 0; i < ndim; ++i)
        count *= shape[i];
    float *values = tu_random_floats(count);
    snprintf(path, size, "%s/%s", scratch, name);
    tu_expect(clattn_npy_write(path, values, ndim, shape, msg, sizeof msg) == CLATTN_IO_OK,
              "writing %s: %s", path, msg);
    return values;
}

/* An int64 (width 8) or int32 (width 4) .npy of a vector (ONNX's nonpad_kv_seqlen,
 * cu_seqlens) or, with rows > 0, of a (rows, count / rows) matrix (a block table). */
static void write_int_npy(const char *path, const long long *values, size_t count, size_t rows,
                          int width)
{
    char header[128];
    char shape[64];
    if (rows > 0)
        snprintf(shape, sizeof shape, "(%zu, %zu)", rows, count / rows);
    else
        snprintf(shape, sizeof shape, "(%zu,)", count);
    int length = snprintf(header, sizeof header,
                          "{'descr': '<i%d', 'fortran_order': False, 'shape': %s, }", width,
                          shape);
    while ((10 + length + 1) % 64 != 0)
        header[length++] = ' ';
    header[length++] = '\n';
    FILE *f = fopen(path, "wb");
    if (!tu_expect(f != NULL, "cannot write %s", path))
        return;
    const unsigned char magic[10] = {0x93,
                                     'N',
                                     'U',
                                     'M',
                                     'P',
                                     'Y',
                                     1,
                                     0,
                                     (unsigned char)(length & 0xff),
                                     (unsigned char)(length >> 8)};
    fwrite(magic, 1, sizeof magic, f);
    fwrite(header, 1, (size_t)length, f);
    for (size_t i = 0; i < count; ++i) {
        unsigned char bytes[8];
        for (int b = 0; b < width; ++b)
            bytes[b] = (unsigned char)((unsigned long long)values[i] >> (8 * b));
        fwrite(bytes, 1, (size_t)width, f);
    }
    fclose(f);
}

static void write_i64_npy_rows(const char *path, const long long *values, size_t count,
                               size_t rows)
{
    write_int_npy(path, values, count, rows, 8);
}

static void write_i64_npy(const char *path, const long long *values, size_t count)
{
    write_int_npy(path, values, count, 0, 8);
}


/* clattn sdpa with ONNX's KV cache (--past-key/--past-value, --present-*-out), the window, the
 * scores (--qk-out, modes 2 and 3) and a static cache's fill (--nonpad-kv-seqlen), against the
 * float64 reference with ONNX's rules; then the refusals. */
/* --posenc sinusoidal (self-attention) and --posenc-table (cross-attention, key and value of
 * another length), against the float64 reference on inputs with the encodings added; then the
 * refusals. */
START_TEST(test_run_posenc)
{
    TU_BEGIN_TEST();
    enum { LQ = 13, LK = 21, E = 10, DK = 8, DV = 6, ROWS = 30 };
    tu_set_case("clattn run --posenc (textbook weights, 2 heads)");
    char x_path[512], k_path[512], v_path[512], wq_path[512], wk_path[512], wv_path[512];
    char t_path[512], out[512], args[8192];
    float *x = scratch_npy("pe_x.npy", LQ, E, x_path, sizeof x_path);
    float *key = scratch_npy("pe_k.npy", LK, E, k_path, sizeof k_path);
    float *value = scratch_npy("pe_v.npy", LK, E, v_path, sizeof v_path);
    float *wq = scratch_npy("pe_wq.npy", E, DK, wq_path, sizeof wq_path);
    float *wk = scratch_npy("pe_wk.npy", E, DK, wk_path, sizeof wk_path);
    float *wv = scratch_npy("pe_wv.npy", E, DV, wv_path, sizeof wv_path);
    float *table = scratch_npy("pe_table.npy", ROWS, E, t_path, sizeof t_path);
    snprintf(out, sizeof out, "%s/pe_out.npy", scratch);
    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = 1, desc.seq_q = LQ, desc.seq_k = LQ, desc.embed_dim = E, desc.num_heads = 2;
    desc.qk_dim = DK, desc.v_dim = DV, desc.layout = CLATTN_LAYOUT_XW;
    const clattn_mha_host_weights w = {.q_weight = wq, .k_weight = wk, .v_weight = wv};
    const clattn_host_masks masks = {0};
    double *ref = tu_doubles((size_t)LQ * DV), *pe = tu_doubles((size_t)LK * E);
    float *xq = tu_floats((size_t)LQ * E), *xk = tu_floats((size_t)LK * E);
    float *xv = tu_floats((size_t)LK * E);
    const size_t shape[2] = {LQ, DV};

    /* Self-attention with the sinusoid. */
    ref_posenc_sinusoid(0, LQ, E, 10000.0, pe);
    for (size_t e = 0; e < (size_t)LQ * E; ++e)
        xq[e] = (float)(x[e] + pe[e]);
    ref_mha_forward(&desc, &w, xq, NULL, NULL, &masks, ref, NULL);
    snprintf(args, sizeof args,
             "run --query %s --wq %s --wk %s --wv %s --heads 2 --posenc sinusoidal --out %s",
             x_path, wq_path, wk_path, wv_path, out);
    int status = run_cli(args);
    tu_expect(status == 0, "--posenc sinusoidal: exit status %d, stderr: %s", status,
              captured("stderr"));
    if (status == 0)
        expect_npy_reference(out, "posenc sinusoidal out", ref, (size_t)LQ * DV, 2, shape);

    /* Cross-attention with a learned table: rows 0 .. LQ - 1 on the query, 0 .. LK - 1 on
     * key and value. */
    for (size_t e = 0; e < (size_t)LQ * E; ++e)
        xq[e] = x[e] + table[e];
    for (size_t e = 0; e < (size_t)LK * E; ++e) {
        xk[e] = key[e] + table[e];
        xv[e] = value[e] + table[e];
    }
    desc.seq_k = LK;
    ref_mha_forward(&desc, &w, xq, xk, xv, &masks, ref, NULL);
    snprintf(args, sizeof args,
             "run --query %s --key %s --value %s --wq %s --wk %s --wv %s --heads 2 "
             "--posenc-table %s --out %s",
             x_path, k_path, v_path, wq_path, wk_path, wv_path, t_path, out);
    status = run_cli(args);
    tu_expect(status == 0, "--posenc-table: exit status %d, stderr: %s", status,
              captured("stderr"));
    if (status == 0)
        expect_npy_reference(out, "posenc table out", ref, (size_t)LQ * DV, 2, shape);

    /* Refusals. */
    static const struct {
        const char *extra, *needle;
    } bad[] = {
        {"--posenc learned", "sinusoidal"},
        {"--posenc sinusoidal --posenc-table @TABLE@", "not both"},
        {"--posenc-table @WQ@", "positional table"},
        {"--posenc-table @X@", "positional table"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char extra[1200];
        snprintf(extra, sizeof extra, "%s", bad[i].extra);
        /* '@' placeholders: a path put in for one may hold the letters of another (mkdtemp's
         * random names do), never an '@'. */
        static const char *const names[3] = {"@TABLE@", "@WQ@", "@X@"};
        const char *paths[3] = {t_path, wq_path, x_path};
        for (int n = 0; n < 3; ++n) {
            char *at = strstr(extra, names[n]);
            if (at)
                snprintf(at, sizeof extra - (size_t)(at - extra), "%s", paths[n]);
        }
        snprintf(args, sizeof args, "run --query %s --key %s --wq %s --wk %s --wv %s --heads 2 %s",
                 x_path, k_path, wq_path, wk_path, wv_path, extra);
        status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), bad[i].needle),
                  "'%s': status %d, stderr: %s", bad[i].extra, status, captured("stderr"));
    }
    free(xv);
    free(xk);
    free(xq);
    free(pe);
    free(ref);
    free(table);
    free(wv);
    free(wk);
    free(wq);
    free(value);
    free(key);
    free(x);
    TU_END_TEST();
}
END_TEST

/* --rope (pairs, 4 of 6 columns, base 500; then the defaults) on textbook weights with causal
 * masking, against the float64 reference; then the refusals. */
START_TEST(test_run_rope)
{
    TU_BEGIN_TEST();
    enum { L = 19, E = 12, H = 2, DK = 12, DV = 8 };
    tu_set_case("clattn run --rope (textbook weights, %d heads)", H);
    char x_path[512], wq_path[512], wk_path[512], wv_path[512], out[512], args[4096];
    float *x = scratch_npy("rope_x.npy", L, E, x_path, sizeof x_path);
    float *wq = scratch_npy("rope_wq.npy", E, DK, wq_path, sizeof wq_path);
    float *wk = scratch_npy("rope_wk.npy", E, DK, wk_path, sizeof wk_path);
    float *wv = scratch_npy("rope_wv.npy", E, DV, wv_path, sizeof wv_path);
    snprintf(out, sizeof out, "%s/rope_out.npy", scratch);
    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = 1, desc.seq_q = L, desc.seq_k = L, desc.embed_dim = E, desc.num_heads = H;
    desc.qk_dim = DK, desc.v_dim = DV, desc.layout = CLATTN_LAYOUT_XW;
    desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    desc.rope = 1, desc.rope_style = CLATTN_ROPE_PAIRS, desc.rope_dims = 4, desc.rope_base = 500;
    const clattn_mha_host_weights w = {.q_weight = wq, .k_weight = wk, .v_weight = wv};
    const clattn_host_masks masks = {0};
    double *ref = tu_doubles((size_t)L * DV);
    const size_t shape[2] = {L, DV};
    for (int form = 0; form < 2; ++form) {
        if (form == 1)
            desc.rope_style = CLATTN_ROPE_HALVES, desc.rope_dims = 0, desc.rope_base = 0;
        ref_mha_forward(&desc, &w, x, NULL, NULL, &masks, ref, NULL);
        snprintf(args, sizeof args,
                 "run --query %s --wq %s --wk %s --wv %s --heads %d --causal --rope %s --out %s",
                 x_path, wq_path, wk_path, wv_path, H,
                 form ? "" : "--rope-style pairs --rope-dims 4 --rope-base 500", out);
        const int status = run_cli(args);
        tu_expect(status == 0, "form %d: exit status %d, stderr: %s", form, status,
                  captured("stderr"));
        if (status == 0)
            expect_npy_reference(out, form ? "rope out (defaults)" : "rope out (pairs, 4 dims)",
                                 ref, (size_t)L * DV, 2, shape);
    }
    static const struct {
        const char *extra, *needle;
    } bad[] = {
        {"--rope --rope-dims 5", "rope_dims"},          {"--rope --rope-dims 8", "rope_dims"},
        {"--rope --rope-style spiral", "--rope-style"}, {"--rope-base 100", "go with --rope"},
        {"--rope --rope-base -1", "--rope-base"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        snprintf(args, sizeof args, "run --query %s --wq %s --wk %s --wv %s --heads %d %s", x_path,
                 wq_path, wk_path, wv_path, H, bad[i].extra);
        const int status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), bad[i].needle),
                  "'%s': status %d, stderr: %s", bad[i].extra, status, captured("stderr"));
    }
    free(ref);
    free(wv);
    free(wk);
    free(wq);
    free(x);
    TU_END_TEST();
}
END_TEST

/* The float64 reference's shape of the sdpa command tests: grouped heads (g k/v heads), causal
 * bottom-right, softmax at the default scale; the tests add their feature's fields. */
static ref_sdpa_shape bottom_right_shape(size_t b, size_t h, size_t g, size_t lq, size_t lk,
                                         size_t d)
{
    ref_sdpa_shape shape = ref_softmax_shape(b, h, lq, lk, d, d);
    shape.causal = CLATTN_CAUSAL_BOTTOM_RIGHT, shape.kv_heads = g;
    return shape;
}

/* --alibi (the paper's slopes, (Hq)) and --alibi-slopes ((B, Hq) from a file) with grouped
 * heads and bottom-right causal masking, on both paths, against the float64 reference. */
START_TEST(test_sdpa_alibi)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 4, G = 2, LQ = 5, LK = 13, D = 8 };
    tu_set_case("clattn sdpa --alibi: B=%d Hq=%d Hkv=%d Lq=%d Lk=%d", B, H, G, LQ, LK);
    char q_path[512], k_path[512], v_path[512], s_path[512], out[512], args[8192], msg[512];
    const size_t q_shape[4] = {B, H, LQ, D}, k_shape[4] = {B, G, LK, D};
    float *q = scratch_array("alibi_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("alibi_k.npy", 4, k_shape, k_path, sizeof k_path);
    float *v = scratch_array("alibi_v.npy", 4, k_shape, v_path, sizeof v_path);
    snprintf(out, sizeof out, "%s/alibi_y.npy", scratch);
    snprintf(s_path, sizeof s_path, "%s/alibi_slopes.npy", scratch);
    float slopes[B * H], own[B * H];
    tu_expect_status(clattn_alibi_slopes(H, 8.0f, slopes), CLATTN_SUCCESS, "clattn_alibi_slopes");
    for (int i = 0; i < H; ++i)
        slopes[H + i] = slopes[i];
    for (int i = 0; i < B * H; ++i)
        own[i] = (float)(0.6 * tu_rand_unit());
    const size_t s_shape[2] = {B, H};
    tu_expect(clattn_npy_write(s_path, own, 2, s_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s",
              msg);
    const size_t out_count = (size_t)B * H * LQ * D;
    double *ref = tu_doubles(out_count);
    for (int form = 0; form < 2; ++form) {
        ref_sdpa_shape shape = bottom_right_shape(B, H, G, LQ, LK, D);
        shape.alibi = form ? own : slopes;
        ref_sdpa(&shape, q, k, v, NULL, NULL, ref, NULL, NULL);
        for (int p = 0; p < 2; ++p) {
            snprintf(args, sizeof args,
                     "sdpa --q %s --k %s --v %s --causal --causal-align bottom-right %s%s "
                     "--path %s --out %s",
                     q_path, k_path, v_path, form ? "--alibi-slopes " : "--alibi",
                     form ? s_path : "", p ? "unfused" : "auto", out);
            const int status = run_cli(args);
            tu_expect(status == 0, "form %d path %d: exit status %d, stderr: %s", form, p, status,
                      captured("stderr"));
            if (status == 0)
                expect_npy_reference(out, form ? "Y (own slopes)" : "Y (the paper's slopes)", ref,
                                     out_count, 4, (const size_t[]){B, H, LQ, D});
        }
    }
    /* Slopes of the wrong shape, and both forms at once: one line, exit 2. */
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --alibi-slopes %s", q_path, k_path,
             v_path, q_path);
    int status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "ALiBi slopes have shape"),
              "slopes of Q's shape: status %d, stderr: %s", status, captured("stderr"));
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --alibi --alibi-slopes %s", q_path,
             k_path, v_path, s_path);
    status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "not both"),
              "--alibi with --alibi-slopes: status %d, stderr: %s", status, captured("stderr"));
    free(ref);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

/* --sinks (Hq) logits, one -inf, with grouped heads, bottom-right causal masking and a
 * window, on both paths, against the float64 reference; a sink per head of the wrong count,
 * a NaN sink and relu refused with one line, exit 2. */
/* clattn sdpa --kv-dtype q8_0 / q4_0: K and V quantized on the device, then attention over
 * them (grouped heads, causal bottom-right), against the float64 reference over the values
 * llama.cpp's reference quantizer gives; and the refusals (head size, unfused path, rope). */
START_TEST(test_sdpa_kv_dtype)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 4, G = 2, LQ = 3, LK = 37, D = 64 };
    tu_set_case("clattn sdpa --kv-dtype: B=%d Hq=%d Hkv=%d Lq=%d Lk=%d d=%d", B, H, G, LQ, LK, D);
    char q_path[512], k_path[512], v_path[512], small_path[512], out[512], args[8192];
    const size_t q_shape[4] = {B, H, LQ, D}, k_shape[4] = {B, G, LK, D};
    const size_t small_shape[4] = {B, G, LK, 48};
    float *q = scratch_array("kvq_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("kvq_k.npy", 4, k_shape, k_path, sizeof k_path);
    float *v = scratch_array("kvq_v.npy", 4, k_shape, v_path, sizeof v_path);
    float *small = scratch_array("kvq_small.npy", 4, small_shape, small_path, sizeof small_path);
    snprintf(out, sizeof out, "%s/kvq_y.npy", scratch);
    const size_t kv_count = (size_t)B * G * LK * D, out_count = (size_t)B * H * LQ * D;
    float *kq = malloc(kv_count * sizeof(float)), *vq = malloc(kv_count * sizeof(float));
    uint8_t *blocks = malloc(kv_count * 34 / 32);
    double *ref = tu_doubles(out_count);
    static const clattn_dtype types[2] = {CLATTN_DTYPE_Q8_0, CLATTN_DTYPE_Q4_0};
    for (int i = 0; i < 2; ++i) {
        ref_quantize(types[i], k, kv_count, blocks);
        ref_dequantize(types[i], blocks, kv_count, kq);
        ref_quantize(types[i], v, kv_count, blocks);
        ref_dequantize(types[i], blocks, kv_count, vq);
        const ref_sdpa_shape shape = bottom_right_shape(B, H, G, LQ, LK, D);
        ref_sdpa(&shape, q, kq, vq, NULL, NULL, ref, NULL, NULL);
        snprintf(args, sizeof args,
                 "sdpa --q %s --k %s --v %s --causal --causal-align bottom-right --kv-dtype %s "
                 "--out %s",
                 q_path, k_path, v_path, i ? "q4_0" : "q8_0", out);
        const int status = run_cli(args);
        tu_expect(status == 0, "%s: exit status %d, stderr: %s", i ? "q4_0" : "q8_0", status,
                  captured("stderr"));
        if (status == 0)
            expect_npy_reference(out, i ? "Y (q4_0 K, V)" : "Y (q8_0 K, V)", ref, out_count, 4,
                                 (const size_t[]){B, H, LQ, D});
    }
    static const struct {
        const char *extra, *want;
    } bad[] = {
        {"--kv-dtype q8_0 --path unfused", "cannot be combined with --path unfused"},
        {"--kv-dtype q4_0 --rope", "cannot be combined with --rope"},
        {"--kv-dtype q4_0 SMALL", "the head sizes (k 48, v 48) must be multiples of 32"},
        {"--kv-dtype q5_1", "q5_1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        const bool small_kv = strstr(bad[i].extra, "SMALL") != NULL;
        char extra[64];
        snprintf(extra, sizeof extra, "%.*s", small_kv ? 15 : 63, bad[i].extra);
        snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s %s", small_kv ? small_path : q_path,
                 small_kv ? small_path : k_path, small_kv ? small_path : v_path, extra);
        const int status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), bad[i].want) &&
                      strchr(captured("stderr"), '\n') == strrchr(captured("stderr"), '\n'),
                  "%s: status %d, stderr: %s", bad[i].extra, status, captured("stderr"));
    }
    free(ref);
    free(blocks);
    free(vq);
    free(kq);
    free(small);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

START_TEST(test_sdpa_sinks)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 4, G = 2, LQ = 5, LK = 13, D = 8 };
    tu_set_case("clattn sdpa --sinks: B=%d Hq=%d Hkv=%d Lq=%d Lk=%d", B, H, G, LQ, LK);
    char q_path[512], k_path[512], v_path[512], s_path[512], bad_path[512], out[512], args[8192],
        msg[512];
    const size_t q_shape[4] = {B, H, LQ, D}, k_shape[4] = {B, G, LK, D};
    float *q = scratch_array("sinks_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("sinks_k.npy", 4, k_shape, k_path, sizeof k_path);
    float *v = scratch_array("sinks_v.npy", 4, k_shape, v_path, sizeof v_path);
    snprintf(out, sizeof out, "%s/sinks_y.npy", scratch);
    snprintf(s_path, sizeof s_path, "%s/sinks.npy", scratch);
    snprintf(bad_path, sizeof bad_path, "%s/sinks_bad.npy", scratch);
    float sinks[H];
    for (int i = 0; i < H; ++i)
        sinks[i] = (float)(-1.0 + 4.0 * tu_rand_unit());
    sinks[tu_rand_below(H)] = -INFINITY; /* no sink for that head */
    const size_t s_shape[1] = {H}, bad_shape[1] = {H - 1};
    tu_expect(clattn_npy_write(s_path, sinks, 1, s_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s",
              msg);
    tu_expect(clattn_npy_write(bad_path, sinks, 1, bad_shape, msg, sizeof msg) == CLATTN_IO_OK,
              "%s", msg);
    const size_t out_count = (size_t)B * H * LQ * D;
    double *ref = tu_doubles(out_count);
    for (int window = 0; window < 2; ++window) {
        ref_sdpa_shape shape = bottom_right_shape(B, H, G, LQ, LK, D);
        shape.window_align = window ? CLATTN_CAUSAL_BOTTOM_RIGHT : CLATTN_CAUSAL_NONE;
        shape.window_left = 2, shape.window_right = -1, shape.sinks = sinks;
        ref_sdpa(&shape, q, k, v, NULL, NULL, ref, NULL, NULL);
        for (int p = 0; p < 2; ++p) {
            snprintf(args, sizeof args,
                     "sdpa --q %s --k %s --v %s --causal --causal-align bottom-right %s "
                     "--sinks %s --path %s --out %s",
                     q_path, k_path, v_path, window ? "--window 2,-1" : "", s_path,
                     p ? "unfused" : "auto", out);
            const int status = run_cli(args);
            tu_expect(status == 0, "window %d path %d: exit status %d, stderr: %s", window, p,
                      status, captured("stderr"));
            if (status == 0)
                expect_npy_reference(out, window ? "Y (sinks, window)" : "Y (sinks)", ref,
                                     out_count, 4, (const size_t[]){B, H, LQ, D});
        }
    }
    static const struct {
        const char *extra, *want;
    } bad[] = {
        {"--sinks BAD", "expected (4,): one logit per query head"},
        {"--sinks SINKS --norm relu", "--sinks with --norm relu"},
        {"--sinks Q", "the sinks have shape"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char extra[1200];
        const char *path = strstr(bad[i].extra, "BAD")     ? bad_path
                           : strstr(bad[i].extra, "SINKS") ? s_path
                                                           : q_path;
        snprintf(extra, sizeof extra, "--sinks %s%s", path,
                 strstr(bad[i].extra, "relu") ? " --norm relu" : "");
        snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s %s", q_path, k_path, v_path, extra);
        const int status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), bad[i].want) &&
                      strchr(captured("stderr"), '\n') == strrchr(captured("stderr"), '\n'),
                  "%s: status %d, stderr: %s", bad[i].extra, status, captured("stderr"));
    }
    /* a NaN sink */
    sinks[0] = NAN;
    tu_expect(clattn_npy_write(s_path, sinks, 1, s_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s",
              msg);
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --sinks %s", q_path, k_path, v_path,
             s_path);
    const int status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "sink 0 is nan"),
              "a NaN sink: status %d, stderr: %s", status, captured("stderr"));
    free(ref);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

/* A paged KV cache (--k-pages, --v-pages, --block-table, --seqlens-k): pools of 5-key pages in
 * a shuffled order with NaN in every slot past a sequence's count, grouped heads, causal
 * bottom-right, with and without sinks, against the float64 reference of the same keys laid
 * out contiguously. Counts of 13 and 1 end inside a block (ceil(count / 5) blocks hold keys);
 * the blocks past them hold garbage the check must accept and never use (the page just past
 * the pool, 2^31 - 1, 2^40, -7; issue 48). Then the refusals: a block index outside the pool
 * in a whole block and in a sequence's partial last block (keys 10 .. 12 of 13), a count past
 * the table's pages, --k with --k-pages, a missing --seqlens-k and --path unfused, each one
 * line and exit 2. */
START_TEST(test_sdpa_paged)
{
    TU_BEGIN_TEST();
    enum { B = 3, H = 4, G = 2, LQ = 3, D = 8, PS = 5, BLOCKS = 4, LK = PS * BLOCKS };
    enum { PAGES = B * BLOCKS + 2 };
    tu_set_case("clattn sdpa paged: B=%d Hq=%d Hkv=%d Lq=%d d=%d page=%d blocks=%d", B, H, G, LQ,
                D, PS, BLOCKS);
    char q_path[512], kp_path[512], vp_path[512], bt_path[512], n_path[512], s_path[512],
        out[512], args[8192], msg[512];
    const size_t q_shape[4] = {B, H, LQ, D};
    float *q = scratch_array("paged_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = tu_random_floats((size_t)B * G * LK * D), *v = tu_random_floats((size_t)B * G * LK * D);
    const int counts[B] = {13, LK, 1};
    int order[PAGES];
    for (int i = 0; i < PAGES; ++i)
        order[i] = i;
    for (int i = PAGES; i > 1; --i) {
        const int j = (int)tu_rand_below((size_t)i), swap = order[i - 1];
        order[i - 1] = order[j];
        order[j] = swap;
    }
    long long table[B * BLOCKS], lengths[B];
    static const long long garbage[4] = {PAGES, 2147483647LL, 1LL << 40, -7};
    const size_t pool_count = (size_t)PAGES * PS * G * D;
    float *kp = tu_nan_floats(pool_count), *vp = tu_nan_floats(pool_count);
    for (int b = 0; b < B; ++b) {
        lengths[b] = counts[b];
        for (int blk = 0; blk < BLOCKS; ++blk)
            table[b * BLOCKS + blk] =
                blk * PS < counts[b] ? order[b * BLOCKS + blk] : garbage[(b + blk) % 4];
        for (int j = 0; j < counts[b]; ++j)
            for (int h = 0; h < G; ++h)
                for (int c = 0; c < D; ++c) {
                    const size_t at = (((size_t)table[b * BLOCKS + j / PS] * PS + j % PS) * G + h) * D + c;
                    const size_t from = (((size_t)b * G + h) * LK + j) * D + c;
                    kp[at] = k[from];
                    vp[at] = v[from];
                }
    }
    const size_t pool_shape[4] = {PAGES, PS, G, D};
    snprintf(kp_path, sizeof kp_path, "%s/paged_kp.npy", scratch);
    snprintf(vp_path, sizeof vp_path, "%s/paged_vp.npy", scratch);
    snprintf(bt_path, sizeof bt_path, "%s/paged_bt.npy", scratch);
    snprintf(n_path, sizeof n_path, "%s/paged_n.npy", scratch);
    snprintf(s_path, sizeof s_path, "%s/paged_sinks.npy", scratch);
    snprintf(out, sizeof out, "%s/paged_y.npy", scratch);
    tu_expect(clattn_npy_write(kp_path, kp, 4, pool_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s",
              msg);
    tu_expect(clattn_npy_write(vp_path, vp, 4, pool_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s",
              msg);
    write_i64_npy_rows(bt_path, table, B * BLOCKS, B);
    write_i64_npy(n_path, lengths, B);
    float sinks[H];
    for (int i = 0; i < H; ++i)
        sinks[i] = (float)(-1.0 + 3.0 * tu_rand_unit());
    const size_t s_shape[1] = {H};
    tu_expect(clattn_npy_write(s_path, sinks, 1, s_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s",
              msg);
    const int32_t kv_len[B] = {counts[0], counts[1], counts[2]};
    const size_t out_count = (size_t)B * H * LQ * D;
    double *ref = tu_doubles(out_count);
    for (int with_sinks = 0; with_sinks < 2; ++with_sinks) {
        ref_sdpa_shape shape = bottom_right_shape(B, H, G, LQ, LK, D);
        shape.kv_len = kv_len, shape.sinks = with_sinks ? sinks : NULL;
        ref_sdpa(&shape, q, k, v, NULL, NULL, ref, NULL, NULL);
        snprintf(args, sizeof args,
                 "sdpa --q %s --k-pages %s --v-pages %s --block-table %s --seqlens-k %s --causal "
                 "--causal-align bottom-right %s%s --out %s",
                 q_path, kp_path, vp_path, bt_path, n_path, with_sinks ? "--sinks " : "",
                 with_sinks ? s_path : "", out);
        const int status = run_cli(args);
        tu_expect(status == 0, "sinks %d: exit status %d, stderr: %s", with_sinks, status,
                  captured("stderr"));
        if (status == 0)
            expect_npy_reference(out, with_sinks ? "Y (paged, sinks)" : "Y (paged)", ref,
                                 out_count, 4, (const size_t[]){B, H, LQ, D});
    }
    /* Refusals: one line, exit 2. */
    char bad_bt[512], partial_bt[512], bad_n[512];
    snprintf(bad_bt, sizeof bad_bt, "%s/paged_bad_bt.npy", scratch);
    snprintf(partial_bt, sizeof partial_bt, "%s/paged_partial_bt.npy", scratch);
    snprintf(bad_n, sizeof bad_n, "%s/paged_bad_n.npy", scratch);
    long long outside[B * BLOCKS], longer[B] = {13, LK + 1, 1};
    memcpy(outside, table, sizeof table);
    outside[1] = PAGES; /* sequence 0's second block (keys 5 .. 9 of its 13) */
    write_i64_npy_rows(bad_bt, outside, B * BLOCKS, B);
    memcpy(outside, table, sizeof table);
    outside[2] = PAGES; /* sequence 0's partial last block (keys 10 .. 12 of its 13) */
    write_i64_npy_rows(partial_bt, outside, B * BLOCKS, B);
    write_i64_npy(bad_n, longer, B);
    char common[2600];
    snprintf(common, sizeof common, "sdpa --q %s --k-pages %s --v-pages %s", q_path, kp_path,
             vp_path);
    static const struct {
        const char *form, *want;
    } bad[] = {
        {"%s --block-table %s --seqlens-k %s", "block_table[0, 1] = 14 is not a page of the pool"},
        {"%s --block-table %s --seqlens-k %s", "block_table[0, 2] = 14 is not a page of the pool"},
        {"%s --block-table %s --seqlens-k %s", "seqlens_k[1] = 21 is not in 0 .. 20"},
        {"%s --block-table %s --seqlens-k %s --k %s", "cannot be combined with --k"},
        {"%s --block-table %s%s", "--seqlens-k together"},
        {"%s --block-table %s --seqlens-k %s --path unfused", "cannot be combined with --path"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        snprintf(args, sizeof args, bad[i].form, common,
                 i == 0   ? bad_bt
                 : i == 1 ? partial_bt
                          : bt_path,
                 i == 4   ? ""
                 : i == 2 ? bad_n
                          : n_path,
                 q_path);
        const int status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), bad[i].want) &&
                      strchr(captured("stderr"), '\n') == strrchr(captured("stderr"), '\n'),
                  "refusal %zu: status %d, stderr: %s", i, status, captured("stderr"));
    }
    free(ref);
    free(vp);
    free(kp);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

/* Packed variable-length batches (--cu-seqlens-q/-k): Q (total_q, Hq, d), K and V
 * (total_k, Hkv, d) of 4 sequences (one without rows), causal bottom-right and then ALiBi
 * slopes per (sequence, head) with int32 offsets, each sequence against its own float64
 * reference; then the refusals: offsets not from 0, decreasing, not ending at the total,
 * counts that differ, the options packed sequences do not take. */
START_TEST(test_sdpa_varlen)
{
    TU_BEGIN_TEST();
    enum { B = 4, H = 4, G = 2, D = 8 };
    static const int lq[B] = {5, 0, 3, 1}, lk[B] = {9, 3, 12, 40};
    int cq[B + 1] = {0}, ck[B + 1] = {0};
    for (int b = 0; b < B; ++b)
        cq[b + 1] = cq[b] + lq[b], ck[b + 1] = ck[b] + lk[b];
    const size_t tq = (size_t)cq[B], tk = (size_t)ck[B];
    tu_set_case("clattn sdpa varlen: B=%d Hq=%d Hkv=%d d=%d total_q=%zu total_k=%zu", B, H, G, D,
                tq, tk);
    char q_path[512], k_path[512], v_path[512], cq_path[512], ck_path[512], cq32_path[512],
        s_path[512], out[512], args[8192], msg[512];
    const size_t q_shape[3] = {tq, H, D}, k_shape[3] = {tk, G, D};
    float *q = scratch_array("varlen_q.npy", 3, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("varlen_k.npy", 3, k_shape, k_path, sizeof k_path);
    float *v = scratch_array("varlen_v.npy", 3, k_shape, v_path, sizeof v_path);
    snprintf(cq_path, sizeof cq_path, "%s/varlen_cq.npy", scratch);
    snprintf(ck_path, sizeof ck_path, "%s/varlen_ck.npy", scratch);
    snprintf(cq32_path, sizeof cq32_path, "%s/varlen_cq32.npy", scratch);
    snprintf(s_path, sizeof s_path, "%s/varlen_slopes.npy", scratch);
    snprintf(out, sizeof out, "%s/varlen_y.npy", scratch);
    long long cq64[B + 1], ck64[B + 1];
    for (int b = 0; b <= B; ++b)
        cq64[b] = cq[b], ck64[b] = ck[b];
    write_i64_npy(cq_path, cq64, B + 1);
    write_i64_npy(ck_path, ck64, B + 1);
    write_int_npy(cq32_path, cq64, B + 1, 0, 4);
    float slopes[B * H];
    for (int i = 0; i < B * H; ++i)
        slopes[i] = (float)(0.5 * tu_rand_unit());
    tu_expect(clattn_npy_write(s_path, slopes, 2, (const size_t[]){B, H}, msg, sizeof msg) ==
                  CLATTN_IO_OK,
              "%s", msg);
    const size_t out_count = tq * H * D;
    double *ref = tu_doubles(out_count);
    for (int run = 0; run < 2; ++run) {
        /* each sequence alone: its rows gathered as (1, H, n, d), the output scattered back */
        for (int b = 0; b < B; ++b) {
            if (lq[b] == 0)
                continue;
            float *qs = tu_floats((size_t)H * lq[b] * D), *ks = tu_floats((size_t)G * lk[b] * D),
                  *vs = tu_floats((size_t)G * lk[b] * D);
            double *os = tu_doubles((size_t)H * lq[b] * D);
            for (int h = 0; h < H; ++h)
                for (int i = 0; i < lq[b]; ++i)
                    memcpy(qs + ((size_t)h * lq[b] + i) * D, q + ((size_t)(cq[b] + i) * H + h) * D,
                           D * sizeof(float));
            for (int h = 0; h < G; ++h)
                for (int j = 0; j < lk[b]; ++j) {
                    memcpy(ks + ((size_t)h * lk[b] + j) * D, k + ((size_t)(ck[b] + j) * G + h) * D,
                           D * sizeof(float));
                    memcpy(vs + ((size_t)h * lk[b] + j) * D, v + ((size_t)(ck[b] + j) * G + h) * D,
                           D * sizeof(float));
                }
            ref_sdpa_shape shape = bottom_right_shape(1, H, G, (size_t)lq[b], (size_t)lk[b], D);
            if (run == 1) {
                shape.causal = CLATTN_CAUSAL_NONE;
                shape.alibi = slopes + b * H;
            }
            ref_sdpa(&shape, qs, ks, vs, NULL, NULL, os, NULL, NULL);
            for (int h = 0; h < H; ++h)
                for (int i = 0; i < lq[b]; ++i)
                    memcpy(ref + ((size_t)(cq[b] + i) * H + h) * D, os + ((size_t)h * lq[b] + i) * D,
                           D * sizeof(double));
            free(qs);
            free(ks);
            free(vs);
            free(os);
        }
        if (run == 0)
            snprintf(args, sizeof args,
                     "sdpa --q %s --k %s --v %s --cu-seqlens-q %s --cu-seqlens-k %s --causal "
                     "--causal-align bottom-right --out %s",
                     q_path, k_path, v_path, cq_path, ck_path, out);
        else
            snprintf(args, sizeof args,
                     "sdpa --q %s --k %s --v %s --cu-seqlens-q %s --cu-seqlens-k %s "
                     "--alibi-slopes %s --out %s",
                     q_path, k_path, v_path, cq32_path, ck_path, s_path, out);
        const int status = run_cli(args);
        tu_expect(status == 0, "run %d: exit status %d, stderr: %s", run, status,
                  captured("stderr"));
        if (status == 0)
            expect_npy_reference(out, run ? "Y (varlen, ALiBi)" : "Y (varlen, causal)", ref,
                                 out_count, 3, (const size_t[]){tq, H, D});
    }
    /* Refusals: one line, exit 2. */
    char bad[4][512];
    static const long long not_zero[B + 1] = {1, 5, 5, 8, 9}, falling[B + 1] = {0, 5, 4, 8, 9},
                           short_end[B + 1] = {0, 5, 5, 8, 8}, three[3] = {0, 5, 9};
    const long long *bad_values[4] = {not_zero, falling, short_end, three};
    for (int i = 0; i < 4; ++i) {
        snprintf(bad[i], sizeof bad[i], "%s/varlen_bad%d.npy", scratch, i);
        write_i64_npy(bad[i], bad_values[i], i == 3 ? 3 : B + 1);
    }
    static const struct {
        int file; /* the bad cu_seqlens_q, or -1 */
        const char *extra, *want;
    } refusals[] = {
        {0, "", "cu_seqlens_q[0] = 1; the offsets start at 0"},
        {1, "", "cu_seqlens_q[2] = 4 is below cu_seqlens_q[1] = 5: the offsets must be "
                "non-decreasing"},
        {2, "", "cu_seqlens_q[4] = 8 but q has 9 rows: the offsets end at the total"},
        {3, "", "cu_seqlens_k has 5 offsets but cu_seqlens_q 3"},
        {-1, " --nonpad-kv-seqlen X", "cannot be combined with --nonpad-kv-seqlen"},
        {-1, " --path unfused", "cannot be combined with --path unfused"},
        {-1, " --rope", "cannot be combined with --rope"},
    };
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; ++i) {
        snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --cu-seqlens-q %s --cu-seqlens-k %s%s",
                 q_path, k_path, v_path, refusals[i].file >= 0 ? bad[refusals[i].file] : cq_path,
                 ck_path, refusals[i].extra);
        const int status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), refusals[i].want) &&
                      strchr(captured("stderr"), '\n') == strrchr(captured("stderr"), '\n'),
                  "refusal %zu: status %d, stderr: %s", i, status, captured("stderr"));
    }
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --cu-seqlens-q %s", q_path, k_path,
             v_path, cq_path);
    const int status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "--cu-seqlens-q and --cu-seqlens-k go "
                                                         "together"),
              "one offsets file: status %d, stderr: %s", status, captured("stderr"));
    free(ref);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

START_TEST(test_sdpa_cache_command)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 4, G = 2, LQ = 3, LN = 5, P = 7, D = 8, DV = 6 };
    enum { LK = P + LN };
    tu_set_case("clattn sdpa cache: B=%d Hq=%d Hkv=%d Lq=%d past=%d new=%d", B, H, G, LQ, P, LN);
    char q_path[512], k_path[512], v_path[512], pk_path[512], pv_path[512], n_path[512];
    char out[512], present_k[512], present_v[512], scores[512], args[8192], msg[512];
    const size_t q_shape[4] = {B, H, LQ, D}, k_shape[4] = {B, G, LN, D},
                 v_shape[4] = {B, G, LN, DV};
    const size_t pk_shape[4] = {B, G, P, D}, pv_shape[4] = {B, G, P, DV};
    float *q = scratch_array("cache_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("cache_k.npy", 4, k_shape, k_path, sizeof k_path);
    float *v = scratch_array("cache_v.npy", 4, v_shape, v_path, sizeof v_path);
    float *pk = scratch_array("cache_pk.npy", 4, pk_shape, pk_path, sizeof pk_path);
    float *pv = scratch_array("cache_pv.npy", 4, pv_shape, pv_path, sizeof pv_path);
    snprintf(out, sizeof out, "%s/cache_y.npy", scratch);
    snprintf(present_k, sizeof present_k, "%s/cache_present_k.npy", scratch);
    snprintf(present_v, sizeof present_v, "%s/cache_present_v.npy", scratch);
    snprintf(scores, sizeof scores, "%s/cache_scores.npy", scratch);
    /* present = past then new, per (b, g) */
    float *all_k = tu_floats((size_t)B * G * LK * D), *all_v = tu_floats((size_t)B * G * LK * DV);
    for (size_t bg = 0; bg < B * G; ++bg) {
        memcpy(all_k + bg * LK * D, pk + bg * P * D, P * D * sizeof(float));
        memcpy(all_k + (bg * LK + P) * D, k + bg * LN * D, LN * D * sizeof(float));
        memcpy(all_v + bg * LK * DV, pv + bg * P * DV, P * DV * sizeof(float));
        memcpy(all_v + (bg * LK + P) * DV, v + bg * LN * DV, LN * DV * sizeof(float));
    }
    ref_sdpa_shape shape = ref_softmax_shape(B, H, LQ, LK, D, DV);
    shape.causal = CLATTN_CAUSAL_ONNX, shape.kv_heads = G, shape.has_past = 1, shape.past = P;
    shape.window_align = CLATTN_CAUSAL_ONNX, shape.window_left = 2, shape.window_right = -1;
    const size_t out_count = (size_t)B * H * LQ * DV, s_count = (size_t)B * H * LQ * LK;
    double *ref = tu_doubles(out_count), *weights = tu_doubles(s_count);
    double *ref_scores = tu_doubles(s_count);
    ref_sdpa(&shape, q, all_k, all_v, NULL, NULL, ref, weights, NULL);
    ref_sdpa_scores(&shape, q, all_k, NULL, NULL, 2, ref_scores);
    double *all_k64 = tu_doubles((size_t)B * G * LK * D),
           *all_v64 = tu_doubles((size_t)B * G * LK * DV);
    tu_floats_to_doubles(all_k, (size_t)B * G * LK * D, all_k64);
    tu_floats_to_doubles(all_v, (size_t)B * G * LK * DV, all_v64);
    const char *paths[2] = {"auto", "unfused"};
    for (int p = 0; p < 2; ++p) {
        snprintf(args, sizeof args,
                 "sdpa --q %s --k %s --v %s --past-key %s --past-value %s --causal --window 2,-1 "
                 "--present-key-out %s --present-value-out %s --path %s --out %s%s%s",
                 q_path, k_path, v_path, pk_path, pv_path, present_k, present_v, paths[p], out,
                 p ? " --qk-output-mode 2 --qk-out " : "", p ? scores : "");
        const int status = run_cli(args);
        tu_expect(status == 0, "cache, path %s: exit status %d, stderr: %s", paths[p], status,
                  captured("stderr"));
        if (status != 0)
            continue;
        expect_npy_reference(out, "cache Y", ref, out_count, 4, (const size_t[]){B, H, LQ, DV});
        expect_npy_reference(present_k, "present_k", all_k64, (size_t)B * G * LK * D, 4,
                             (const size_t[]){B, G, LK, D});
        expect_npy_reference(present_v, "present_v", all_v64, (size_t)B * G * LK * DV, 4,
                             (const size_t[]){B, G, LK, DV});
        if (p == 0)
            continue;
        clattn_array got = {0};
        if (tu_expect(clattn_npy_read(scores, &got, msg, sizeof msg) == CLATTN_IO_OK &&
                          got.count == s_count,
                      "reading the scores: %s", msg)) {
            size_t wrong = 0;
            for (size_t i = 0; i < s_count; ++i)
                wrong += isinf(ref_scores[i]) ? !(isinf(got.data[i]) && got.data[i] < 0)
                                              : !(fabs(got.data[i] - ref_scores[i]) <= 1e-4);
            tu_expect(wrong == 0, "--qk-output-mode 2: %zu of %zu scores wrong", wrong, s_count);
        }
        clattn_array_free(&got);
    }
    /* Mode 3: the probabilities. */
    snprintf(args, sizeof args,
             "sdpa --q %s --k %s --v %s --past-key %s --past-value %s --causal --window 2,-1 "
             "--qk-output-mode 3 --qk-out %s --out %s",
             q_path, k_path, v_path, pk_path, pv_path, scores, out);
    int status = run_cli(args);
    tu_expect(status == 0, "mode 3: exit status %d, stderr: %s", status, captured("stderr"));
    if (status == 0)
        expect_npy_reference(scores, "--qk-output-mode 3", weights, s_count, 4,
                             (const size_t[]){B, H, LQ, LK});

    /* A static cache: all LK keys in k/v, batch b filled to n[b]; causal at n[b] - Lq. */
    char ak_path[512], av_path[512];
    snprintf(ak_path, sizeof ak_path, "%s/cache_all_k.npy", scratch);
    snprintf(av_path, sizeof av_path, "%s/cache_all_v.npy", scratch);
    tu_expect(clattn_npy_write(ak_path, all_k, 4, (const size_t[]){B, G, LK, D}, msg, sizeof msg) ==
                      CLATTN_IO_OK &&
                  clattn_npy_write(av_path, all_v, 4, (const size_t[]){B, G, LK, DV}, msg,
                                   sizeof msg) == CLATTN_IO_OK,
              "writing the caches: %s", msg);
    const long long fill[B] = {LK, 4};
    const int32_t fill32[B] = {LK, 4};
    snprintf(n_path, sizeof n_path, "%s/cache_nonpad.npy", scratch);
    write_i64_npy(n_path, fill, B);
    ref_sdpa_shape static_shape = shape;
    static_shape.has_past = 0, static_shape.past = 0, static_shape.kv_len = fill32;
    static_shape.window_align = CLATTN_CAUSAL_NONE;
    ref_sdpa(&static_shape, q, all_k, all_v, NULL, NULL, ref, NULL, NULL);
    for (int p = 0; p < 2; ++p) {
        snprintf(args, sizeof args,
                 "sdpa --q %s --k %s --v %s --nonpad-kv-seqlen %s --causal --path %s --out %s",
                 q_path, ak_path, av_path, n_path, paths[p], out);
        status = run_cli(args);
        tu_expect(status == 0, "nonpad, path %s: exit status %d, stderr: %s", paths[p], status,
                  captured("stderr"));
        if (status == 0)
            expect_npy_reference(out, "nonpad Y", ref, out_count, 4,
                                 (const size_t[]){B, H, LQ, DV});
    }

    static const struct {
        const char *args, *needle;
    } bad[] = {
        {"--q Q --k K --v V --past-key PK", "go together"},
        {"--q Q --k K --v V --past-key PK --past-value PK", "past key"},
        {"--q Q --k K --v V --nonpad-kv-seqlen Q", "int64"},
        {"--q Q --k K --v V --nonpad-kv-seqlen N --past-key PK --past-value PV", "ONNX"},
        {"--q Q --k K --v V --window 3", "--window"},
        {"--q Q --k K --v V --window 1,-2", "--window"},
        {"--q Q --k K --v V --qk-output-mode 2", "--qk-out"},
        {"--q Q --k K --v V --qk-output-mode 4 --qk-out S", "--qk-output-mode"},
        {"--q Q --k K --v V --softmax-precision 10", "float16"},
        {"--q Q --k K --v V --qk-out S --path fused", "scores"},
        {"--q Q --k AK --v AV --nonpad-kv-seqlen N --present-key-out PK", "go together"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        int used = snprintf(args, sizeof args, "sdpa");
        char words[256];
        snprintf(words, sizeof words, "%s", bad[i].args);
        char *save = NULL;
        for (char *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            const char *path = strcmp(w, "Q") == 0    ? q_path
                               : strcmp(w, "K") == 0  ? k_path
                               : strcmp(w, "V") == 0  ? v_path
                               : strcmp(w, "PK") == 0 ? pk_path
                               : strcmp(w, "PV") == 0 ? pv_path
                               : strcmp(w, "AK") == 0 ? ak_path
                               : strcmp(w, "AV") == 0 ? av_path
                               : strcmp(w, "N") == 0  ? n_path
                               : strcmp(w, "S") == 0  ? scores
                                                      : w;
            used += snprintf(args + used, sizeof args - (size_t)used, " %s", path);
        }
        status = run_cli(args);
        const char *err = captured("stderr");
        tu_expect(status == 2 && strstr(err, bad[i].needle) != NULL &&
                      strchr(err, '\n') == strrchr(err, '\n'),
                  "%s: status %d, want 2 and one line with '%s'; stderr: %s", args, status,
                  bad[i].needle, err);
    }
    free(all_v64);
    free(all_k64);
    free(ref_scores);
    free(weights);
    free(ref);
    free(all_v);
    free(all_k);
    free(pv);
    free(pk);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

/* The largest |a - b| over two .npy files of one shape (INFINITY when unreadable or shaped
 * differently). */
static double npy_difference(const char *a_path, const char *b_path)
{
    char msg[512];
    clattn_array a = {0}, b = {0};
    double worst = INFINITY;
    if (clattn_npy_read(a_path, &a, msg, sizeof msg) == CLATTN_IO_OK &&
        clattn_npy_read(b_path, &b, msg, sizeof msg) == CLATTN_IO_OK && a.ndim == b.ndim &&
        a.count == b.count) {
        worst = 0.0;
        for (int i = 0; i < a.ndim; ++i)
            worst = a.shape[i] == b.shape[i] ? worst : INFINITY;
        for (size_t i = 0; i < a.count; ++i)
            worst = fmax(worst, fabs((double)a.data[i] - b.data[i]));
        worst = isnan(worst) ? INFINITY : worst;
    }
    clattn_array_free(&a);
    clattn_array_free(&b);
    return worst;
}

/* Runs `clattn ARGS`, expecting exit status 0. */
static bool run_ok(const char *what, const char *args)
{
    const int status = run_cli(args);
    return tu_expect(status == 0, "%s: exit status %d, stderr: %s", what, status,
                     captured("stderr"));
}

/* clattn sdpa --rope (pairs on 6 of 8 columns, base 500, from position 3; grouped heads;
 * bottom-right causal; both paths) against the float64 reference and against the same
 * computation through files (clattn rope on Q and K, then clattn sdpa on the rotated files);
 * a cache step at P = 7 (--past-key holding rotated keys, --rope-start 7) against the same,
 * its present key the past then the rotated new key; then the refusals. */
START_TEST(test_sdpa_rope_command)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 4, G = 2, LQ = 5, LK = 11, D = 8, DV = 6, START = 3, P = 7 };
    tu_set_case("clattn sdpa --rope: B=%d Hq=%d Hkv=%d Lq=%d Lk=%d d=%d", B, H, G, LQ, LK, D);
    char q_path[512], k_path[512], v_path[512], qr_path[512], kr_path[512], files_out[512];
    char out[512], args[8192];
    const size_t q_shape[4] = {B, H, LQ, D}, k_shape[4] = {B, G, LK, D};
    const size_t v_shape[4] = {B, G, LK, DV};
    float *q = scratch_array("rope_sdpa_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("rope_sdpa_k.npy", 4, k_shape, k_path, sizeof k_path);
    float *v = scratch_array("rope_sdpa_v.npy", 4, v_shape, v_path, sizeof v_path);
    snprintf(qr_path, sizeof qr_path, "%s/rope_sdpa_qr.npy", scratch);
    snprintf(kr_path, sizeof kr_path, "%s/rope_sdpa_kr.npy", scratch);
    snprintf(files_out, sizeof files_out, "%s/rope_sdpa_files_y.npy", scratch);
    snprintf(out, sizeof out, "%s/rope_sdpa_y.npy", scratch);
    ref_sdpa_shape shape = ref_softmax_shape(B, H, LQ, LK, D, DV);
    shape.causal = CLATTN_CAUSAL_BOTTOM_RIGHT, shape.kv_heads = G;
    const ref_rope_spec rope = {.pairs = 1, .dims = 6, .start = START, .base = 500.0};
    const size_t out_count = (size_t)B * H * LQ * DV;
    double *ref = tu_doubles(out_count);
    ref_sdpa_rope(&shape, &rope, q, k, v, NULL, NULL, ref, NULL, NULL);
    /* Through files: clattn rope, then clattn sdpa without --rope. */
    static const char rope_options[] = "--interleaved --rotary-dim 6 --base 500 --start 3";
    snprintf(args, sizeof args, "rope --x %s %s --out %s", q_path, rope_options, qr_path);
    bool files = run_ok("clattn rope (q)", args);
    snprintf(args, sizeof args, "rope --x %s %s --out %s", k_path, rope_options, kr_path);
    files = files && run_ok("clattn rope (k)", args);
    snprintf(args, sizeof args,
             "sdpa --q %s --k %s --v %s --causal --causal-align bottom-right --out %s", qr_path,
             kr_path, v_path, files_out);
    files = files && run_ok("clattn sdpa on the rotated files", args);
    const char *paths[2] = {"auto", "unfused"};
    for (int p = 0; p < 2; ++p) {
        snprintf(args, sizeof args,
                 "sdpa --q %s --k %s --v %s --causal --causal-align bottom-right --rope "
                 "--rope-style pairs --rope-dims 6 --rope-base 500 --rope-start %d --path %s "
                 "--out %s",
                 q_path, k_path, v_path, START, paths[p], out);
        if (!run_ok(paths[p], args))
            continue;
        expect_npy_reference(out, p ? "sdpa --rope (unfused)" : "sdpa --rope (auto)", ref,
                             out_count, 4, (const size_t[]){B, H, LQ, DV});
        if (files) {
            const double difference = npy_difference(out, files_out);
            tu_expect(difference <= 1e-5,
                      "path %s: --rope differs from clattn rope + clattn sdpa by %.3g", paths[p],
                      difference);
        }
    }

    /* A cache step at P: the past keys rotated (clattn rope from 0, halves, all columns), one
     * new query and key at position P. */
    char pk_raw[512], pk_path[512], pv_path[512], q1_path[512], k1_path[512], v1_path[512];
    char q1r_path[512], k1r_path[512], present_k[512], present_v[512], present_files[512];
    const size_t pk_shape[4] = {B, G, P, D}, pv_shape[4] = {B, G, P, DV};
    const size_t q1_shape[4] = {B, H, 1, D}, k1_shape[4] = {B, G, 1, D};
    const size_t v1_shape[4] = {B, G, 1, DV};
    float *raw = scratch_array("rope_cache_pk_raw.npy", 4, pk_shape, pk_raw, sizeof pk_raw);
    float *pv = scratch_array("rope_cache_pv.npy", 4, pv_shape, pv_path, sizeof pv_path);
    float *q1 = scratch_array("rope_cache_q.npy", 4, q1_shape, q1_path, sizeof q1_path);
    float *k1 = scratch_array("rope_cache_k.npy", 4, k1_shape, k1_path, sizeof k1_path);
    float *v1 = scratch_array("rope_cache_v.npy", 4, v1_shape, v1_path, sizeof v1_path);
    snprintf(pk_path, sizeof pk_path, "%s/rope_cache_pk.npy", scratch);
    snprintf(q1r_path, sizeof q1r_path, "%s/rope_cache_qr.npy", scratch);
    snprintf(k1r_path, sizeof k1r_path, "%s/rope_cache_kr.npy", scratch);
    snprintf(present_k, sizeof present_k, "%s/rope_cache_present_k.npy", scratch);
    snprintf(present_v, sizeof present_v, "%s/rope_cache_present_v.npy", scratch);
    snprintf(present_files, sizeof present_files, "%s/rope_cache_present_files.npy", scratch);
    snprintf(args, sizeof args, "rope --x %s --out %s", pk_raw, pk_path);
    files = run_ok("clattn rope (past keys)", args);
    snprintf(args, sizeof args, "rope --x %s --start %d --out %s", q1_path, P, q1r_path);
    files = files && run_ok("clattn rope (step query)", args);
    snprintf(args, sizeof args, "rope --x %s --start %d --out %s", k1_path, P, k1r_path);
    files = files && run_ok("clattn rope (step key)", args);
    snprintf(args, sizeof args,
             "sdpa --q %s --k %s --v %s --past-key %s --past-value %s --causal "
             "--present-key-out %s --present-value-out %s --out %s",
             q1r_path, k1r_path, v1_path, pk_path, pv_path, present_files, present_v, files_out);
    files = files && run_ok("clattn sdpa on the rotated step", args);
    if (files) {
        snprintf(args, sizeof args,
                 "sdpa --q %s --k %s --v %s --past-key %s --past-value %s --causal --rope "
                 "--rope-start %d --present-key-out %s --present-value-out %s --out %s",
                 q1_path, k1_path, v1_path, pk_path, pv_path, P, present_k, present_v, out);
        if (run_ok("sdpa --rope with a cache", args)) {
            double difference = npy_difference(out, files_out);
            tu_expect(difference <= 1e-5, "cache step: --rope differs from the files by %.3g",
                      difference);
            difference = npy_difference(present_k, present_files);
            tu_expect(difference <= 1e-6,
                      "cache step: present key differs from past + the rotated key by %.3g",
                      difference);
        }
    }

    /* Refusals: one line, exit 2. */
    char n_path[512];
    snprintf(n_path, sizeof n_path, "%s/rope_sdpa_nonpad.npy", scratch);
    const long long fill[B] = {LK, 4};
    write_i64_npy(n_path, fill, B);
    static const struct {
        const char *extra, *needle;
    } bad[] = {
        {"--rope --rope-dims 5", "rope_dims"},   {"--rope --rope-dims 10", "rope_dims"},
        {"--rope-start 3", "go with --rope"},    {"--rope --rope-style spiral", "--rope-style"},
        {"--rope --rope-base 0", "--rope-base"}, {"--rope --rope-start 16777210", "2^24"},
        {"--rope=1", "takes no value"},          {"--rope --nonpad-kv-seqlen N", "kv_seqlen"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char extra[1024];
        snprintf(extra, sizeof extra, "%s", bad[i].extra);
        char *n = strstr(extra, " N");
        if (n)
            snprintf(n + 1, sizeof extra - (size_t)(n + 1 - extra), "%s", n_path);
        snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s %s", q_path, k_path, v_path, extra);
        const int status = run_cli(args);
        const char *err = captured("stderr");
        tu_expect(status == 2 && strstr(err, bad[i].needle) != NULL &&
                      strchr(err, '\n') == strrchr(err, '\n'),
                  "'%s': status %d, want 2 and one line with '%s'; stderr: %s", bad[i].extra,
                  status, bad[i].needle, err);
    }
    free(v1);
    free(k1);
    free(q1);
    free(pv);
    free(raw);
    free(ref);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

/* Fresh random values written as a .npy of `dtype` (CLATTN_IO_F32 with f64 set: a float64 file,
 * built by hand); returns the values as the file holds them (rounded to its dtype). */
static float *typed_scratch(const char *name, int ndim, const size_t *shape, clattn_io_dtype dtype,
                            bool f64, char *path, size_t size)
{
    char msg[512];
    size_t count = 1;
    for (int i = 0; i < ndim; ++i)
        count *= shape[i];
    float *values = tu_random_floats(count);
    snprintf(path, size, "%s/%s", scratch, name);
    if (f64) {
        char header[128];
        int length = snprintf(header, sizeof header,
                              "{'descr': '<f8', 'fortran_order': False, 'shape': (%zu, %zu, %zu, "
                              "%zu), }",
                              shape[0], shape[1], shape[2], shape[3]);
        while ((10 + length + 1) % 64 != 0)
            header[length++] = ' ';
        header[length++] = '\n';
        FILE *f = fopen(path, "wb");
        if (!tu_expect(f != NULL && ndim == 4, "cannot write %s", path))
            return values;
        const unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)length,
                                         0};
        fwrite(magic, 1, sizeof magic, f);
        fwrite(header, 1, (size_t)length, f);
        for (size_t i = 0; i < count; ++i) {
            const double value = values[i];
            uint64_t bits;
            memcpy(&bits, &value, sizeof bits);
            unsigned char bytes[8];
            for (int b = 0; b < 8; ++b)
                bytes[b] = (unsigned char)(bits >> (8 * b));
            fwrite(bytes, 1, 8, f);
        }
        fclose(f);
        return values;
    }
    tu_expect(clattn_npy_write_typed(path, values, ndim, shape, dtype, msg, sizeof msg) ==
                  CLATTN_IO_OK,
              "writing %s: %s", path, msg);
    clattn_array held = {0};
    if (tu_expect(clattn_npy_read(path, &held, msg, sizeof msg) == CLATTN_IO_OK &&
                      held.count == count && held.source == dtype,
                  "reading back %s: %s", path, msg))
        memcpy(values, held.data, count * sizeof *values);
    clattn_array_free(&held);
    return values;
}

/* An output of a typed sdpa run: the file's descr is `descr`, it reads back as `dtype` with
 * the shape, and each value is within rel * |ref| + abs of the float64 reference (rel: half
 * an ulp of the type, the one rounding of a float32 result; abs: float32's own error). */
static void expect_typed_output(const char *path, const char *what, const char *descr,
                                clattn_io_dtype dtype, const double *ref, size_t count,
                                const size_t *shape, double rel, double abs)
{
    char msg[512], text[129] = {0}, want[32];
    FILE *f = fopen(path, "rb");
    size_t used = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    snprintf(want, sizeof want, "'descr': '%s'", descr);
    tu_expect(used == 128 && strstr(text + 10, want) != NULL, "%s: %s is not %s: %.118s", what,
              path, descr, used > 10 ? text + 10 : "(short file)");
    clattn_array got = {0};
    if (tu_expect(clattn_npy_read(path, &got, msg, sizeof msg) == CLATTN_IO_OK,
                  "%s: reading %s: %s", what, path, msg)) {
        bool same = got.ndim == 4 && got.count == count && got.source == dtype;
        for (int i = 0; same && i < 4; ++i)
            same = got.shape[i] == shape[i];
        if (tu_expect(same, "%s: ndim %d, %zu values, source %d; want 4, %zu, %d", what, got.ndim,
                      got.count, (int)got.source, count, (int)dtype)) {
            size_t wrong = 0, first = 0;
            double worst = 0.0;
            for (size_t i = 0; i < count; ++i) {
                const double error = fabs(got.data[i] - ref[i]);
                if (!(error <= rel * fabs(ref[i]) + abs) && wrong++ == 0)
                    first = i;
                worst = fmax(worst, error / (fabs(ref[i]) + 1e-3));
            }
            tu_expect(wrong == 0,
                      "%s: %zu of %zu values off, the first [%zu] %.9g for %.9g (rel %g, abs %g)",
                      what, wrong, count, first, wrong ? got.data[first] : 0.0,
                      wrong ? ref[first] : 0.0, rel, abs);
            tu_track_error(worst);
        }
    }
    clattn_array_free(&got);
}

typedef struct typed_case {
    const char *name;
    clattn_io_dtype q, k, v; /* the inputs' file dtypes (K's for the past key, V's for the
                              * past value) */
    bool q_f64;              /* Q as float64 (read as CLATTN_IO_F32) */
} typed_case;

static const typed_case typed_cases[] = {
    {"float16", CLATTN_IO_F16, CLATTN_IO_F16, CLATTN_IO_F16, false},
    {"bfloat16", CLATTN_IO_BF16, CLATTN_IO_BF16, CLATTN_IO_BF16, false},
    {"mixed: q bfloat16, k float16, v float32", CLATTN_IO_BF16, CLATTN_IO_F16, CLATTN_IO_F32,
     false},
    {"mixed: q float64, k bfloat16, v float16", CLATTN_IO_F32, CLATTN_IO_BF16, CLATTN_IO_F16, true},
};

/* clattn sdpa writes its outputs in ONNX's types: Y and the scores in Q's file dtype, the
 * present key and value in K's and V's (float64 in: float32 out). Values against the float64
 * reference of the inputs as their files hold them, within the one rounding to the type; the
 * present key and value, copies of the inputs, exactly. */
START_TEST(test_sdpa_typed_outputs)
{
    TU_BEGIN_TEST();
    const typed_case *c = &typed_cases[_i];
    enum { B = 2, H = 4, G = 2, LQ = 3, LN = 5, P = 4, D = 8, DV = 6 };
    enum { LK = P + LN };
    tu_set_case("clattn sdpa typed outputs, %s: B=%d Hq=%d Hkv=%d Lq=%d past=%d new=%d", c->name, B,
                H, G, LQ, P, LN);
    char q_path[512], k_path[512], v_path[512], pk_path[512], pv_path[512];
    char out[512], present_k[512], present_v[512], scores[512], args[8192];
    const size_t q_shape[4] = {B, H, LQ, D}, k_shape[4] = {B, G, LN, D},
                 v_shape[4] = {B, G, LN, DV}, pk_shape[4] = {B, G, P, D},
                 pv_shape[4] = {B, G, P, DV};
    float *q = typed_scratch("typed_q.npy", 4, q_shape, c->q, c->q_f64, q_path, sizeof q_path);
    float *k = typed_scratch("typed_k.npy", 4, k_shape, c->k, false, k_path, sizeof k_path);
    float *v = typed_scratch("typed_v.npy", 4, v_shape, c->v, false, v_path, sizeof v_path);
    float *pk = typed_scratch("typed_pk.npy", 4, pk_shape, c->k, false, pk_path, sizeof pk_path);
    float *pv = typed_scratch("typed_pv.npy", 4, pv_shape, c->v, false, pv_path, sizeof pv_path);
    snprintf(out, sizeof out, "%s/typed_y.npy", scratch);
    snprintf(present_k, sizeof present_k, "%s/typed_present_k.npy", scratch);
    snprintf(present_v, sizeof present_v, "%s/typed_present_v.npy", scratch);
    snprintf(scores, sizeof scores, "%s/typed_scores.npy", scratch);
    const size_t k_count = (size_t)B * G * LK * D, v_count = (size_t)B * G * LK * DV;
    float *all_k = tu_floats(k_count), *all_v = tu_floats(v_count);
    for (size_t bg = 0; bg < B * G; ++bg) {
        memcpy(all_k + bg * LK * D, pk + bg * P * D, P * D * sizeof(float));
        memcpy(all_k + (bg * LK + P) * D, k + bg * LN * D, LN * D * sizeof(float));
        memcpy(all_v + bg * LK * DV, pv + bg * P * DV, P * DV * sizeof(float));
        memcpy(all_v + (bg * LK + P) * DV, v + bg * LN * DV, LN * DV * sizeof(float));
    }
    ref_sdpa_shape shape = ref_softmax_shape(B, H, LQ, LK, D, DV);
    shape.causal = CLATTN_CAUSAL_ONNX, shape.kv_heads = G, shape.has_past = 1, shape.past = P;
    const size_t out_count = (size_t)B * H * LQ * DV, s_count = (size_t)B * H * LQ * LK;
    double *ref = tu_doubles(out_count), *ref_scores = tu_doubles(s_count);
    double *all_k64 = tu_doubles(k_count), *all_v64 = tu_doubles(v_count);
    ref_sdpa(&shape, q, all_k, all_v, NULL, NULL, ref, NULL, NULL);
    ref_sdpa_scores(&shape, q, all_k, NULL, NULL, 0, ref_scores);
    tu_floats_to_doubles(all_k, k_count, all_k64);
    tu_floats_to_doubles(all_v, v_count, all_v64);
    /* half an ulp: 2^-11 (float16), 2^-8 (bfloat16); float32 outputs: float32's error */
    const clattn_io_dtype types[3] = {c->q, c->k, c->v};
    const char *descrs[3];
    double rel[3];
    for (int t = 0; t < 3; ++t) {
        descrs[t] = types[t] == CLATTN_IO_F16 ? "<f2" : types[t] == CLATTN_IO_BF16 ? "<V2" : "<f4";
        rel[t] = types[t] == CLATTN_IO_F16 ? 0x1p-11 : types[t] == CLATTN_IO_BF16 ? 0x1p-8 : 1e-5;
    }
    const char *paths[2] = {"auto", "unfused"};
    for (int p = 0; p < 2; ++p) {
        snprintf(args, sizeof args,
                 "sdpa --q %s --k %s --v %s --past-key %s --past-value %s --causal "
                 "--present-key-out %s --present-value-out %s --path %s --out %s%s%s",
                 q_path, k_path, v_path, pk_path, pv_path, present_k, present_v, paths[p], out,
                 p ? " --qk-output-mode 0 --qk-out " : "", p ? scores : "");
        const int status = run_cli(args);
        if (!tu_expect(status == 0, "%s, path %s: exit status %d, stderr: %s", c->name, paths[p],
                       status, captured("stderr")))
            continue;
        expect_typed_output(out, "Y", descrs[0], types[0], ref, out_count,
                            (const size_t[]){B, H, LQ, DV}, rel[0], 2e-6);
        expect_typed_output(present_k, "present_k", descrs[1], types[1], all_k64, k_count,
                            (const size_t[]){B, G, LK, D}, 0.0, 0.0);
        expect_typed_output(present_v, "present_v", descrs[2], types[2], all_v64, v_count,
                            (const size_t[]){B, G, LK, DV}, 0.0, 0.0);
        if (p == 1)
            expect_typed_output(scores, "qk_matmul_output", descrs[0], types[0], ref_scores,
                                s_count, (const size_t[]){B, H, LQ, LK}, rel[0], 2e-6);
    }
    free(all_v64);
    free(all_k64);
    free(ref_scores);
    free(ref);
    free(all_v);
    free(all_k);
    free(pv);
    free(pk);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

/* clattn sdpa on rank-4 files (grouped-query heads, a bool mask shorter than Lk that ONNX pads
 * as masked, soft-capping, bottom-right causal) and on the same data as rank-3
 * (B, L, H * d) files, against the float64 reference; then the refusals. */
START_TEST(test_sdpa_command)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 6, G = 3, LQ = 17, LK = 29, D = 16, DV = 8, MW = 25 };
    tu_set_case("clattn sdpa: B=%d Hq=%d Hkv=%d Lq=%d Lk=%d d=%d dv=%d", B, H, G, LQ, LK, D, DV);
    char q_path[512], k_path[512], v_path[512], m_path[512], out[512], args[4096];
    const size_t q_shape[4] = {B, H, LQ, D}, k_shape[4] = {B, G, LK, D};
    const size_t v_shape[4] = {B, G, LK, DV}, m_shape[2] = {LQ, MW};
    float *q = scratch_array("sdpa_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("sdpa_k.npy", 4, k_shape, k_path, sizeof k_path);
    float *v = scratch_array("sdpa_v.npy", 4, v_shape, v_path, sizeof v_path);
    unsigned char *keep = tu_bytes(LQ * MW);
    for (size_t i = 0; i < LQ * MW; ++i)
        keep[i] = tu_rand_below(10) < 7; /* True = attend (ONNX) */
    snprintf(m_path, sizeof m_path, "%s/sdpa_mask.npy", scratch);
    write_bool_npy(m_path, keep, 2, m_shape);
    snprintf(out, sizeof out, "%s/sdpa_y.npy", scratch);

    /* The reference: the mask expanded to (B, H, Lq, Lk), keys past MW masked. */
    float *mask = tu_floats((size_t)B * H * LQ * LK);
    for (size_t bh = 0; bh < B * H; ++bh)
        for (size_t i = 0; i < LQ; ++i)
            for (size_t j = 0; j < LK; ++j)
                mask[(bh * LQ + i) * LK + j] = j < MW && keep[i * MW + j] ? 0.0f : -INFINITY;
    ref_sdpa_shape shape = ref_softmax_shape(B, H, LQ, LK, D, DV);
    shape.causal = CLATTN_CAUSAL_BOTTOM_RIGHT, shape.kv_heads = G, shape.softcap = 2.5;
    const size_t out_count = (size_t)B * H * LQ * DV;
    double *ref = tu_doubles(out_count);
    ref_sdpa(&shape, q, k, v, mask, NULL, ref, NULL, NULL);
    const char *paths[2] = {"auto", "unfused"};
    for (int p = 0; p < 2; ++p) {
        snprintf(args, sizeof args,
                 "sdpa --q %s --k %s --v %s --attn-mask %s --causal --causal-align bottom-right "
                 "--softcap 2.5 --path %s --out %s",
                 q_path, k_path, v_path, m_path, paths[p], out);
        const int status = run_cli(args);
        tu_expect(status == 0, "rank 4, path %s: exit status %d, stderr: %s", paths[p], status,
                  captured("stderr"));
        if (status == 0)
            expect_npy_reference(
                out, paths[p][0] == 'a' ? "sdpa rank 4 (auto)" : "sdpa rank 4 (unfused)", ref,
                out_count, 4, (const size_t[]){B, H, LQ, DV});
    }

    /* The same numbers as (B, L, H * d) files: transposed inputs, transposed output. */
    char q3_path[512], k3_path[512], v3_path[512], msg[512];
    float *q3 = tu_floats((size_t)B * H * LQ * D), *k3 = tu_floats((size_t)B * G * LK * D);
    float *v3 = tu_floats((size_t)B * G * LK * DV);
    double *ref3 = tu_doubles(out_count);
    for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t l = 0; l < LQ; ++l) {
                for (size_t x = 0; x < D; ++x)
                    q3[((b * LQ + l) * H + h) * D + x] = q[((b * H + h) * LQ + l) * D + x];
                for (size_t x = 0; x < DV; ++x)
                    ref3[((b * LQ + l) * H + h) * DV + x] = ref[((b * H + h) * LQ + l) * DV + x];
            }
    for (size_t b = 0; b < B; ++b)
        for (size_t g = 0; g < G; ++g)
            for (size_t l = 0; l < LK; ++l) {
                for (size_t x = 0; x < D; ++x)
                    k3[((b * LK + l) * G + g) * D + x] = k[((b * G + g) * LK + l) * D + x];
                for (size_t x = 0; x < DV; ++x)
                    v3[((b * LK + l) * G + g) * DV + x] = v[((b * G + g) * LK + l) * DV + x];
            }
    const size_t q3_shape[3] = {B, LQ, H * D}, k3_shape[3] = {B, LK, G * D};
    const size_t v3_shape[3] = {B, LK, G * DV};
    snprintf(q3_path, sizeof q3_path, "%s/sdpa_q3.npy", scratch);
    snprintf(k3_path, sizeof k3_path, "%s/sdpa_k3.npy", scratch);
    snprintf(v3_path, sizeof v3_path, "%s/sdpa_v3.npy", scratch);
    tu_expect(clattn_npy_write(q3_path, q3, 3, q3_shape, msg, sizeof msg) == CLATTN_IO_OK &&
                  clattn_npy_write(k3_path, k3, 3, k3_shape, msg, sizeof msg) == CLATTN_IO_OK &&
                  clattn_npy_write(v3_path, v3, 3, v3_shape, msg, sizeof msg) == CLATTN_IO_OK,
              "writing the rank-3 files: %s", msg);
    snprintf(args, sizeof args,
             "sdpa --q %s --k %s --v %s --q-heads %d --kv-heads %d --attn-mask %s --causal "
             "--causal-align bottom-right --softcap 2.5 --out %s",
             q3_path, k3_path, v3_path, H, G, m_path, out);
    int status = run_cli(args);
    tu_expect(status == 0, "rank 3: exit status %d, stderr: %s", status, captured("stderr"));
    if (status == 0)
        expect_npy_reference(out, "sdpa rank 3", ref3, out_count, 3,
                             (const size_t[]){B, LQ, H * DV});

    /* Refusals: one line, exit 2, naming what is wrong. Q K V: the rank-4 files, q k v the
     * rank-3 ones, M the bool mask. */
    static const struct {
        const char *args, *needle;
    } bad[] = {
        {"--q Q --k K", "--v"},
        {"--q q --k k --v v", "--q-heads"},
        {"--q Q --k K --v V --q-heads 4", "--q-heads is 4"},
        {"--q Q --k K --v V --softcap -1", "--softcap"},
        {"--q Q --k K --v V --causal-align left --causal", "--causal-align"},
        {"--q Q --k K --v V --causal-align bottom-right", "--causal"},
        {"--q K --k Q --v Q", "must divide"},
        {"--q Q --k K --v Q", "v has 6 heads"},
        {"--q q --k k --v v --q-heads 5 --kv-heads 3", "not --q-heads=5"},
        {"--q Q --k K --v V --attn-mask K", "does not broadcast"},
        {"--q M --k K --v V", "bool/uint8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        int used = snprintf(args, sizeof args, "sdpa");
        char words[256];
        snprintf(words, sizeof words, "%s", bad[i].args);
        char *save = NULL;
        for (char *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            const char *path = strcmp(w, "Q") == 0   ? q_path
                               : strcmp(w, "K") == 0 ? k_path
                               : strcmp(w, "V") == 0 ? v_path
                               : strcmp(w, "q") == 0 ? q3_path
                               : strcmp(w, "k") == 0 ? k3_path
                               : strcmp(w, "v") == 0 ? v3_path
                               : strcmp(w, "M") == 0 ? m_path
                                                     : w;
            used += snprintf(args + used, sizeof args - (size_t)used, " %s", path);
        }
        status = run_cli(args);
        const char *err = captured("stderr");
        tu_expect(status == 2 && strstr(err, bad[i].needle) != NULL &&
                      strchr(err, '\n') == strrchr(err, '\n'),
                  "%s: status %d, want 2 and one line with '%s'; stderr: %s", args, status,
                  bad[i].needle, err);
    }
    free(ref3);
    free(v3);
    free(k3);
    free(q3);
    free(ref);
    free(mask);
    free(keep);
    free(v);
    free(k);
    free(q);
    TU_END_TEST();
}
END_TEST

START_TEST(test_demo_devices_help)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn demo, devices, --help");
    int status = run_cli("demo");
    const char *out = captured("stdout");
    tu_expect(status == 0, "demo: exit status %d: %s", status, captured("stderr"));
    /* Without a chapter: dot (test_demo_dot checks its numbers). */
    static const char *const expected[] = {
        "== dot:", "q^i = W^q a^i", "α_{i,j}", "b^i", "1.000000   3.000000   4.000000",
        /* 0.7053845130 exactly: the last printed digit
         * depends on the order of the device's sum. */
        "0.035119   0.259496   0.70538", "1.929762   1.481007   1.70538"};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; ++i)
        tu_expect(strstr(out, expected[i]) != NULL, "demo output lacks '%s'", expected[i]);

    status = run_cli("devices");
    out = captured("stdout");
    tu_expect(status == 0 && strstr(out, "CLATTN_DEVICE"),
              "devices: status %d, no CLATTN_DEVICE explanation: %s", status, out);
    /* Exactly one device is marked, and it is the one clattn uses: CLATTN_DEVICE's choice (the
     * shared test context honours it), or the default when it is unset. */
    char chosen[32] = "";
    cl_platform_id platforms[16];
    cl_uint num_platforms = 0;
    if (clGetPlatformIDs(16, platforms, &num_platforms) != CL_SUCCESS)
        num_platforms = 0;
    for (cl_uint p = 0; p < num_platforms && p < 16; ++p) {
        cl_device_id devices[64];
        cl_uint num_devices = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 64, devices, &num_devices) !=
            CL_SUCCESS)
            num_devices = 0;
        for (cl_uint d = 0; d < num_devices && d < 64; ++d)
            if (devices[d] == clattn_ctx_device(tu_ctx()))
                snprintf(chosen, sizeof chosen, "%u:%u", (unsigned)p, (unsigned)d);
    }
    const char *spec = getenv("CLATTN_DEVICE");
    if (spec && strchr(spec, ':'))
        tu_expect(strcmp(chosen, spec) == 0, "CLATTN_DEVICE=%s but the context uses %s", spec,
                  chosen);
    size_t marked = 0;
    char marked_label[32] = "";
    for (const char *line = out; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "") {
        unsigned p = 0, d = 0;
        if (line[0] == '*' && sscanf(line, "* %u:%u ", &p, &d) == 2) {
            ++marked;
            snprintf(marked_label, sizeof marked_label, "%u:%u", p, d);
        }
    }
    tu_expect(chosen[0] != '\0' && marked == 1 && strcmp(marked_label, chosen) == 0,
              "devices: %zu device(s) marked (last %s), want exactly %s: %s", marked, marked_label,
              chosen, out);
    tu_expect(strstr(out, "compute units") && strstr(out, "fp64") && strstr(out, "fp16"),
              "devices output lacks a field: %s", out);

    static const char *const commands[] = {"--help", "devices --help", "demo --help",
                                           "run --help", "bench --help"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i) {
        status = run_cli(commands[i]);
        tu_expect(status == 0 && strstr(captured("stdout"), "usage: clattn"),
                  "'clattn %s': status %d", commands[i], status);
    }
    TU_END_TEST();
}
END_TEST

/* --- clattn demo's chapters: the printed numbers against float64 -------------------------- */

/* The example the chapters share (clattn demo's, restated): X (3 x 4) and X·W projections. */
enum { DEMO_SEQ = 3, DEMO_DIM = 4, DEMO_DA = 3 };
static const float demo_x[12] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1};
static const float demo_wq[16] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0};
static const float demo_wk[16] = {0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1};
static const float demo_wv[16] = {1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0};
static const float demo_wo[16] = {1, 0, 0, 1, 0, 1, 1, 0, 1, 0, -1, 0, 0, 1, 0, -1};
static const float demo_w1[12] = {0.5f, 0, -0.5f, 0, 0.5f, 0.5f, 0.5f, -0.5f, 0, 0, 0, 0.5f};
static const float demo_w2[12] = {0, 0.5f, 0, -0.5f, 0, 0.5f, 0, 0, -0.5f, 0.5f, -0.5f, 0};
static const float demo_w[3] = {1, -1, 2};

/* Runs `clattn demo ARGS`; expects exit 0, and each of `labels` in stdout. Returns stdout. */
static const char *run_demo(const char *args, const char *const *labels, size_t count)
{
    tu_set_case("clattn demo %s", args);
    char command[1024];
    snprintf(command, sizeof command, "demo %s", args);
    int status = run_cli(command);
    tu_expect(status == 0, "exit status %d: %s", status, captured("stderr"));
    const char *out = captured("stdout");
    for (size_t i = 0; i < count; ++i)
        tu_expect(strstr(out, labels[i]) != NULL, "output lacks '%s'", labels[i]);
    return out;
}

/* The rows x cols numbers printed under the line of `text` that starts with `title`: the last
 * cols numbers of each following line, after at most one column header. false (after recording
 * a failure) when the title is absent or a row does not parse. */
static bool parse_printed(const char *text, const char *title, size_t rows, size_t cols,
                          float *values)
{
    const size_t length = strlen(title);
    const char *line = text;
    while (line && strncmp(line, title, length) != 0)
        line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL;
    if (!tu_expect(line != NULL, "no line starting with '%s'", title))
        return false;
    size_t row = 0;
    bool header_skipped = false;
    for (line = strchr(line, '\n'); line && row < rows; line = strchr(line + 1, '\n')) {
        char copy[1024];
        const char *end = strchr(line + 1, '\n');
        size_t size = end ? (size_t)(end - line - 1) : strlen(line + 1);
        snprintf(copy, sizeof copy, "%.*s", (int)(size < sizeof copy ? size : sizeof copy - 1),
                 line + 1);
        char *tokens[64];
        size_t count = 0;
        char *save = NULL;
        for (char *t = strtok_r(copy, " ", &save); t && count < 64; t = strtok_r(NULL, " ", &save))
            tokens[count++] = t;
        bool ok = count >= cols;
        for (size_t c = 0; ok && c < cols; ++c) {
            char *stop = NULL;
            values[row * cols + c] = strtof(tokens[count - cols + c], &stop);
            ok = *stop == '\0';
        }
        if (ok) {
            ++row;
        } else if (row == 0 && !header_skipped) {
            header_skipped = true;
        } else {
            return tu_expect(false, "'%s': row %zu does not hold %zu numbers", title, row, cols);
        }
    }
    return tu_expect(row == rows, "'%s': %zu of %zu rows", title, row, rows);
}

/* The printed matrix under `title` against ref, to tol absolutely. */
static void expect_printed(const char *text, const char *title, size_t rows, size_t cols,
                           const double *ref, double tol)
{
    float got[128];
    if (rows * cols <= 128 && parse_printed(text, title, rows, cols, got)) {
        const double err = tu_abs_error(got, ref, rows * cols);
        tu_expect(err <= tol, "'%s': off by %.3g from float64 (tolerance %.1g)", title, err, tol);
    }
}

/* The number after the last '=' of the line holding `needle`; NAN when absent. */
static double printed_value(const char *text, const char *needle)
{
    const char *at = strstr(text, needle);
    if (!at)
        return NAN;
    const char *end = strchr(at, '\n');
    const char *equals = NULL;
    for (const char *c = at; *c && c != end; ++c)
        if (*c == '=')
            equals = c;
    return equals ? strtod(equals + 1, NULL) : NAN;
}

/* y (rows x cols) = x (rows x inner) · w (inner x cols), in double. */
static void demo_project(const float *x, const float *w, size_t rows, size_t inner, size_t cols,
                         double *y)
{
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) {
            y[r * cols + c] = 0.0;
            for (size_t i = 0; i < inner; ++i)
                y[r * cols + c] += (double)x[r * inner + i] * w[i * cols + c];
        }
}

/* Self-attention of demo_x through ref_mha_forward (X·W weights, heads, Wo when given). */
static void demo_mha_reference(size_t heads, const float *wo, double *out, double *weights)
{
    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = 1;
    desc.seq_q = desc.seq_k = DEMO_SEQ;
    desc.embed_dim = DEMO_DIM;
    desc.num_heads = heads;
    desc.layout = CLATTN_LAYOUT_XW;
    desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
    const clattn_mha_host_weights w = {
        .q_weight = demo_wq, .k_weight = demo_wk, .v_weight = demo_wv, .out_weight = wo};
    ref_mha_forward(&desc, &w, demo_x, NULL, NULL, NULL, out, weights);
}

START_TEST(test_demo_dot)
{
    TU_BEGIN_TEST();
    static const char *const labels[] = {"a^i",
                                         "a^1",
                                         "W^q",
                                         "W^k",
                                         "W^v",
                                         "q^i = W^q a^i",
                                         "k^i = W^k a^i",
                                         "v^i = W^v a^i",
                                         "α_{i,j} = q^i·k^j / sqrt(d)",
                                         "α'_{i,j}",
                                         "b^i = Σ_j α'_{i,j} v^j"};
    const char *out = run_demo("dot", labels, sizeof labels / sizeof labels[0]);
    double b[12], weights[9], q[12], alpha[9];
    demo_mha_reference(1, NULL, b, weights);
    demo_project(demo_x, demo_wq, DEMO_SEQ, DEMO_DIM, DEMO_DIM, q);
    double k[12];
    demo_project(demo_x, demo_wk, DEMO_SEQ, DEMO_DIM, DEMO_DIM, k);
    for (size_t i = 0; i < 3; ++i)
        for (size_t j = 0; j < 3; ++j) {
            alpha[i * 3 + j] = 0.0;
            for (size_t c = 0; c < 4; ++c)
                alpha[i * 3 + j] += q[i * 4 + c] * k[j * 4 + c] / 2.0;
        }
    expect_printed(out, "q^i = W^q a^i", 3, 4, q, 1e-6);
    expect_printed(out, "α_{i,j} = ", 3, 3, alpha, 1e-6);
    expect_printed(out, "α'_{i,j} = ", 3, 3, weights, 1e-4);
    expect_printed(out, "b^i = ", 3, 4, b, 1e-4);
    TU_END_TEST();
}
END_TEST

START_TEST(test_demo_multihead)
{
    TU_BEGIN_TEST();
    static const char *const labels[] = {"Q = X·Wq",
                                         "K = X·Wk",
                                         "V = X·Wv",
                                         "Wo",
                                         "A_1 = Q_1·K_1ᵀ / sqrt(d_h)",
                                         "A'_1 = softmax",
                                         "O_1 = A'_1·V_1",
                                         "A_2 = Q_2·K_2ᵀ",
                                         "A'_2",
                                         "O_2",
                                         "concat(O_1, O_2)",
                                         "O = concat(O_1, O_2)·Wo"};
    const char *out = run_demo("multihead", labels, sizeof labels / sizeof labels[0]);
    double o[12], weights[18];
    demo_mha_reference(2, demo_wo, o, weights);
    expect_printed(out, "A'_1 = ", 3, 3, weights, 1e-4);
    expect_printed(out, "A'_2 = ", 3, 3, weights + 9, 1e-4);
    expect_printed(out, "O = concat(O_1, O_2)·Wo", 3, 4, o, 1e-4);
    /* The concatenated heads: O without Wo. */
    double heads[12];
    demo_mha_reference(2, NULL, heads, NULL);
    expect_printed(out, "concat(O_1, O_2): ", 3, 4, heads, 1e-4);
    TU_END_TEST();
}
END_TEST

/* Width and height from a PNG's IHDR; false unless the file starts as a PNG does. */
static bool png_size(const char *path, uint32_t *width, uint32_t *height)
{
    unsigned char head[24] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(head, 1, sizeof head, f) : 0;
    if (f)
        fclose(f);
    if (got != sizeof head || memcmp(head, "\x89PNG\r\n\x1a\n", 8) != 0 ||
        memcmp(head + 12, "IHDR", 4) != 0)
        return false;
    *width =
        (uint32_t)head[16] << 24 | (uint32_t)head[17] << 16 | (uint32_t)head[18] << 8 | head[19];
    *height =
        (uint32_t)head[20] << 24 | (uint32_t)head[21] << 16 | (uint32_t)head[22] << 8 | head[23];
    return true;
}

START_TEST(test_demo_posenc)
{
    TU_BEGIN_TEST();
    static const char *const labels[] = {"PE(pos, 2k) = sin(pos / 10000^(2k/d))", "e^i = PE(",
                                         "e^1", "e^8", "a^i + e^i"};
    const char *out = run_demo("posenc", labels, sizeof labels / sizeof labels[0]);
    double table[48], added[12];
    ref_posenc_sinusoid(0, 8, 6, 10000.0, table);
    expect_printed(out, "e^i = PE(", 8, 6, table, 1e-6);
    ref_posenc_sinusoid(0, 3, 4, 10000.0, added);
    for (size_t i = 0; i < 12; ++i)
        added[i] += demo_x[i];
    expect_printed(out, "a^i + e^i", 3, 4, added, 1e-6);
    tu_expect(strstr(out, "wrote") == NULL, "a PNG without --png: %s", out);

    /* --png: a PNG of the 128 x 64 table, sized as the heatmap writer sizes one panel with
     * the table's labels (positions and dimensions, not query and key) at 3 pixels a cell, and
     * larger than the attention default (1 pixel a cell at 128 rows). */
    char png[512], want_png[512], args[1200], msg[512];
    snprintf(png, sizeof png, "%s/posenc.png", scratch);
    snprintf(want_png, sizeof want_png, "%s/posenc_layout.png", scratch);
    snprintf(args, sizeof args, "posenc --png %s", png);
    out = run_demo(args, labels, 0);
    tu_expect(strstr(out, png) != NULL, "the output does not name %s: %s", png, out);
    float *zeros = calloc(128 * 64, sizeof(float));
    const clattn_heatmap_options table_options = {.scale = CLATTN_HEATMAP_GLOBAL,
                                                  .panel_title = "sinusoidal positional encoding",
                                                  .row_label = "position",
                                                  .col_label = "dimension",
                                                  .value_label = "(PE + 1) / 2",
                                                  .min_panel = 384};
    tu_expect(zeros && clattn_png_write_heatmap_ex(want_png, zeros, 1, 128, 64, &table_options,
                                                   msg, sizeof msg) == CLATTN_IO_OK,
              "writing the layout PNG: %s", msg);
    char plain_png[512];
    uint32_t plain_width = 0, plain_height = 0;
    snprintf(plain_png, sizeof plain_png, "%s/posenc_plain.png", scratch);
    tu_expect(zeros && clattn_png_write_heatmap(plain_png, zeros, 1, 128, 64, msg, sizeof msg) ==
                               CLATTN_IO_OK &&
                  png_size(plain_png, &plain_width, &plain_height),
              "writing the plain PNG: %s", msg);
    free(zeros);
    uint32_t width = 0, height = 0, want_width = 0, want_height = 0;
    tu_expect(png_size(png, &width, &height), "%s is not a PNG file", png);
    tu_expect(png_size(want_png, &want_width, &want_height) && width == want_width &&
                  height == want_height,
              "%s is %u x %u, want %u x %u (one panel of 128 x 64)", png, width, height, want_width,
              want_height);
    tu_expect(width > plain_width + 200 && height > plain_height + 200,
              "%s is %u x %u: not larger than the attention default %u x %u", png, width, height,
              plain_width, plain_height);

    /* A PNG path that cannot be written: a bad option (2), found before any work, one line
     * naming it. */
    snprintf(args, sizeof args, "demo posenc --png %s/no-such-folder/posenc.png", scratch);
    tu_set_case("clattn %s", args);
    int status = run_cli(args);
    const char *err = captured("stderr");
    tu_expect(status == 2 && count_lines(err) == 1 && strstr(err, "--png") &&
                  strstr(err, "no-such-folder/posenc.png") && captured("stdout")[0] == '\0',
              "exit status %d (want 2), stderr (want one line naming the file, no output): %s",
              status, err);
    TU_END_TEST();
}
END_TEST

/* x (4 values) at position pos, turned by RoPE's halves pairing (d = 4), in double. */
static void demo_rope(const double *x, double pos, double *out)
{
    for (size_t j = 0; j < 2; ++j) {
        const double angle = pos * pow(10000.0, -2.0 * (double)j / 4.0);
        out[j] = x[j] * cos(angle) - x[j + 2] * sin(angle);
        out[j + 2] = x[j] * sin(angle) + x[j + 2] * cos(angle);
    }
}

START_TEST(test_demo_rope)
{
    TU_BEGIN_TEST();
    static const char *const labels[] = {"q^i: dot's queries", "R_m q^i",         "R_m k^i",
                                         "R_m q · R_n k",      "(m, n) = (0, 2)", "(m, n) = (3, 5)",
                                         "(m, n) = (7, 9)"};
    const char *out = run_demo("rope", labels, sizeof labels / sizeof labels[0]);
    double q[12], k[12], q_rot[12], gram[100];
    demo_project(demo_x, demo_wq, DEMO_SEQ, DEMO_DIM, DEMO_DIM, q);
    demo_project(demo_x, demo_wk, DEMO_SEQ, DEMO_DIM, DEMO_DIM, k);
    for (size_t i = 0; i < 3; ++i)
        demo_rope(q + 4 * i, (double)i, q_rot + 4 * i);
    expect_printed(out, "R_m q^i", 3, 4, q_rot, 1e-5);
    for (size_t m = 0; m < 10; ++m)
        for (size_t n = 0; n < 10; ++n) {
            double qm[4], kn[4];
            demo_rope(q, (double)m, qm);     /* q^1 */
            demo_rope(k + 4, (double)n, kn); /* k^2 */
            gram[m * 10 + n] = qm[0] * kn[0] + qm[1] * kn[1] + qm[2] * kn[2] + qm[3] * kn[3];
        }
    expect_printed(out, "R_m q · R_n k", 10, 10, gram, 1e-3); /* printed to 3 decimals */
    const double dots[3] = {printed_value(out, "(m, n) = (0, 2)"),
                            printed_value(out, "(m, n) = (3, 5)"),
                            printed_value(out, "(m, n) = (7, 9)")};
    for (int i = 0; i < 3; ++i)
        tu_expect(fabs(dots[i] - dots[0]) <= 1e-5 && fabs(dots[i] - gram[2]) <= 1e-5,
                  "dot product %d is %.9g; the first %.9g, float64 %.9g", i, dots[i], dots[0],
                  gram[2]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_demo_additive)
{
    TU_BEGIN_TEST();
    static const char *const labels[] = {"W1",       "W2",
                                         "w:",       "q^i W1",
                                         "k^j W2",   "α_{i,j} = wᵀ tanh(q^i W1 + k^j W2)",
                                         "α'_{i,j}", "b^i = Σ_j α'_{i,j} v^j"};
    const char *out = run_demo("additive", labels, sizeof labels / sizeof labels[0]);
    /* float64: P1 = X·W1, P2 = X·W2, s = wᵀ tanh(P1_i + P2_j), α' = softmax_j, b = α'·(X·Wv). */
    double p1[9], p2[9], v[12], weights[9], b[12];
    demo_project(demo_x, demo_w1, DEMO_SEQ, DEMO_DIM, DEMO_DA, p1);
    demo_project(demo_x, demo_w2, DEMO_SEQ, DEMO_DIM, DEMO_DA, p2);
    demo_project(demo_x, demo_wv, DEMO_SEQ, DEMO_DIM, DEMO_DIM, v);
    for (size_t i = 0; i < 3; ++i) {
        double sum = 0.0;
        for (size_t j = 0; j < 3; ++j) {
            double s = 0.0;
            for (size_t c = 0; c < 3; ++c)
                s += demo_w[c] * tanh(p1[i * 3 + c] + p2[j * 3 + c]);
            sum += weights[i * 3 + j] = exp(s);
        }
        for (size_t j = 0; j < 3; ++j)
            weights[i * 3 + j] /= sum;
        for (size_t c = 0; c < 4; ++c) {
            b[i * 4 + c] = 0.0;
            for (size_t j = 0; j < 3; ++j)
                b[i * 4 + c] += weights[i * 3 + j] * v[j * 4 + c];
        }
    }
    expect_printed(out, "q^i W1", 3, 3, p1, 1e-6);
    expect_printed(out, "k^j W2", 3, 3, p2, 1e-6);
    expect_printed(out, "α'_{i,j} = ", 3, 3, weights, 1e-4);
    expect_printed(out, "b^i = ", 3, 4, b, 1e-4);
    TU_END_TEST();
}
END_TEST

START_TEST(test_demo_all)
{
    TU_BEGIN_TEST();
    static const char *const chapters[] = {
        "== dot:", "== multihead:", "== posenc:", "== rope:", "== additive:"};
    const char *out = run_demo("all", chapters, sizeof chapters / sizeof chapters[0]);
    const char *previous = out;
    for (size_t i = 0; i < sizeof chapters / sizeof chapters[0]; ++i) {
        const char *at = strstr(out, chapters[i]);
        tu_expect(at && at >= previous, "'%s' is missing or out of order", chapters[i]);
        previous = at ? at : previous;
    }
    const char *device = strstr(out, "device: ");
    tu_expect(device && !strstr(device + 1, "device: "), "want one device line: %s", out);
    /* --help documents every chapter. */
    int status = run_cli("demo --help");
    out = captured("stdout");
    static const char *const names[] = {"dot",      "multihead", "posenc", "rope",
                                        "additive", "all",       "--png"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
        tu_expect(status == 0 && strstr(out, names[i]), "demo --help: status %d, lacks '%s'",
                  status, names[i]);
    TU_END_TEST();
}
END_TEST

START_TEST(test_bench_json)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn bench --json over small sizes");
    int status = run_cli("bench --json --runs 3 --mnk 17x33x65,64x64x64 --seq 33 --seq-k 17 "
                         "--heads 2 --head-dim 8 --embed 16");
    const char *out = captured("stdout");
    tu_expect(status == 0, "bench: status %d: %s", status, captured("stderr"));
    tu_expect(count_lines(out) == 7, "expected 7 JSON lines (2 matmul, softmax, attention and "
                                     "mha fused and unfused), got: %s", out);
    tu_expect(strstr(out, "\"op\": \"attention\", \"path\": \"fused\"") &&
                  strstr(out, "\"op\": \"mha\", \"path\": \"unfused\"") &&
                  strstr(out, "\"device_mib\": ") && strstr(out, "\"peak_rss_mib\": "),
              "lines lack path or memory fields: %s", out);
    tu_expect(strstr(out, "{\"op\": \"matmul\", \"m\": 17, \"n\": 33, \"k\": 65") != NULL,
              "matmul line lacks its sizes: %s", out);
    tu_expect(strstr(out, "\"path\": \"fused\", \"batch\": 1, \"heads\": 2, \"seq_q\": 33, "
                          "\"seq_k\": 17, \"head_dim\": 8, \"dtype\": \"f32\"") != NULL,
              "attention line lacks its sizes or dtype: %s", out);
    /* softmax has no entry point of its own: the line says what it timed. */
    const char *softmax = strstr(out, "{\"op\": \"softmax\"");
    tu_expect(softmax && strstr(softmax, "\"timed\": \"sdpa_unfused_weights\"") &&
                  strstr(softmax, "\"timed\"") < strchr(softmax, '\n'),
              "softmax line does not say what it timed: %s", out);
    /* Its step is its own kernel's event (never a difference of two medians), and a rate
     * above the copy's is flagged, not printed as fact. */
    const char *step = softmax ? strstr(softmax, "\"step_gbps\": ") : NULL;
    const char *copy = softmax ? strstr(softmax, "\"copy_gbps\": ") : NULL;
    const char *above = softmax ? strstr(softmax, "\"step_above_copy\": ") : NULL;
    const char *wall = softmax ? strstr(softmax, "\"timer\": \"wall\"") : NULL;
    const bool device_timer = softmax && (!wall || wall > strchr(softmax, '\n'));
    if (device_timer && /* wall-clock timing (e.g. rusticl 22.3) has no kernel events */
        tu_expect(step && copy && above && above < strchr(softmax, '\n') &&
                      strstr(softmax, "\"step_timed\": \"softmax_rows kernel event\""),
                  "softmax line lacks the step's own timing: %s", out)) {
        const double step_gbps = strtod(step + 13, NULL), copy_gbps = strtod(copy + 13, NULL);
        const bool flagged = strncmp(above + 19, "true", 4) == 0;
        tu_expect(step_gbps > 0.0 && copy_gbps > 0.0 && flagged == (step_gbps > copy_gbps),
                  "step %g GB/s, copy %g GB/s, flagged %d", step_gbps, copy_gbps, (int)flagged);
    }
    for (const char *line = out; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (*line == '\0')
            break;
        double median = -1.0;
        const char *at = strstr(line, "\"median_ms\": ");
        if (at)
            median = strtod(at + 13, NULL);
        tu_expect(line[0] == '{' && at && median > 0.0 &&
                      (strstr(line, "\"gflops\": ") || strstr(line, "\"gbps\": ")),
                  "bad JSON line: %.200s", line);
    }
    TU_END_TEST();
}
END_TEST

/* --- bad input: status 2, one line on stderr ------------------------------------------------- */

typedef struct bad_case {
    const char *args; /* %1$s = fixtures, %2$s = scratch */
    const char *needle;
} bad_case;

static const bad_case bad_cases[] = {
    {"frobnicate", "unknown command"},
    {"run --bogus", "unknown option"},
    {"run --weights %1$s/self.safetensors --heads 2", "--query"},
    {"run --query %2$s/missing.npy --weights %1$s/self.safetensors --heads 2", "missing.npy"},
    {"run --query %2$s/garbage.npy --weights %1$s/self.safetensors --heads 2", "garbage.npy"},
    {"run --query %1$s/self_query.npy --weights %2$s/truncated.safetensors --heads 2",
     "truncated.safetensors"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 3", "heads"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors", "--heads"},
    {"run --query %1$s/textbook_x.npy --weights %1$s/self.safetensors --heads 2", "embed_dim"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--attn-mask %1$s/textbook_z.npy",
     "textbook_z.npy"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--key-padding-mask %1$s/self_mask.npy",
     "self_mask.npy"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --norm max",
     "--norm"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --scale x",
     "--scale"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 0", "--heads"},
    {"run --query %1$s/self_query.npy --wq %1$s/textbook_wq.npy", "--wv"},
    {"run --query %1$s/cross_query.npy --weights %1$s/cross.safetensors --heads 3 "
     "--key %1$s/cross_value.npy --value %1$s/cross_value.npy",
     "kdim"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--key %1$s/cross_key.npy",
     "same B"},
    {"run --query %1$s/self_attn.npy --weights %1$s/self.safetensors --heads 2", "(L, E)"},
    /* Zero-width weights (found by fuzz_cli_args): refused, not read as "default width". */
    {"run --query %1$s/textbook_x.npy --wq %1$s/../../fuzz/corpus/npy/zero_width.npy "
     "--wk %1$s/../../fuzz/corpus/npy/zero_width.npy "
     "--wv %1$s/../../fuzz/corpus/npy/zero_width.npy --heads 100000000",
     "no dimension may be 0"},
    {"run --query %1$s/textbook_x.npy --heads 2 "
     "--weights %1$s/../../fuzz/corpus/safetensors/cli_zero_vdim.safetensors",
     "no dimension may be 0"},
    {"bench --mnk 3x4", "--mnk"},
    {"bench --path sideways", "--path"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --path fused "
     "--attn-out %2$s/a.npy",
     "--path fused"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --path warp",
     "--path"},
    {"bench --runs 0", "--runs"},
    {"bench --op sort", "sort"},
    {"bench --dtype f64", "--dtype: 'f64' is not f32, f16 or bf16"},
    {"bench --mask causal", "--mask: 'causal' is not none, padding or additive"},
    {"devices --bogus", "unknown option"},
    {"demo dotproduct", "unknown chapter 'dotproduct' (chapters: dot, multihead"},
    {"demo posenc --png", "--png needs a value"},
    {"demo dot --png %2$s/dot.png", "--png draws the posenc chapter's table"},
    {"demo dot rope", "one chapter at a time"},
    {"demo --chapter dot", "unknown option '--chapter'"},
    /* Output paths are checked before any work (docs/cli.md's exit contract: 2). */
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--out /nonexistent/dir/o.npy",
     "--out: cannot write '/nonexistent/dir/o.npy': the folder '/nonexistent/dir' does not"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--attn-png %2$s",
     "--attn-png: '"},
    {"sdpa --q %1$s/self_query.npy --k %1$s/self_query.npy --v %1$s/self_query.npy "
     "--q-heads 2 --out /nonexistent/y.npy",
     "--out: cannot write '/nonexistent/y.npy'"},
    {"additive --query %1$s/textbook_x.npy --w1 a --w2 b --w c --attn-out /nonexistent/a.npy",
     "--attn-out: cannot write"},
    {"rope --x %1$s/self_query.npy --out /nonexistent/r.npy", "--out: cannot write"},
    {"demo posenc --png /nonexistent/p.png", "--png: cannot write"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--mask-true yes",
     "--mask-true: 'yes' is not attend or masked"},
    /* Device specs: malformed, or naming an index that does not exist, are bad options. */
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--device banana",
     "bad --device: "},
    {"sdpa --q %1$s/self_query.npy --k %1$s/self_query.npy --v %1$s/self_query.npy "
     "--q-heads 2 --device 0:99",
     "bad --device: "},
    {"bench --bogus", "unknown option '--bogus'"},
    /* A 3-d attn_mask must be PyTorch's (B * H, L, S): mask3d's (4, 5, 5) is not (2 * 1, ...). */
    {"run --query %1$s/mask3d_query.npy --weights %1$s/mask3d.safetensors --heads 1 "
     "--attn-mask %1$s/mask3d_mask.npy",
     "expected (5, 5) or (B * H, L, S) = (2, 5, 5)"},
};

START_TEST(test_bad_input_exits_2)
{
    TU_BEGIN_TEST();
    char args[4096];
    snprintf(args, sizeof args, bad_cases[_i].args, fixtures, scratch);
    tu_set_case("clattn %s", args);
    int status = run_cli(args);
    const char *err = captured("stderr");
    tu_expect(status == 2, "exit status %d, want 2; stderr: %s", status, err);
    tu_expect(count_lines(err) == 1, "stderr has %zu lines, want 1: %s", count_lines(err), err);
    tu_expect(strncmp(err, "clattn", 6) == 0 && strstr(err, bad_cases[_i].needle) != NULL,
              "stderr does not name '%s': %s", bad_cases[_i].needle, err);
    TU_END_TEST();
}
END_TEST

/* --- one mask story: --mask-true on every command that reads a bool mask ---------------------- */

/* A random bool (L, L) mask with at least one True and one False per row, and its inverse. */
static void mask_pair(size_t l, unsigned char *mask, unsigned char *inverse)
{
    float *random = tu_random_floats(l * l);
    for (size_t i = 0; i < l; ++i)
        for (size_t j = 0; j < l; ++j) {
            unsigned char m = (unsigned char)(random[i * l + j] > 0.0f);
            if (j == i)
                m = 1;
            if (j == (i + 1) % l)
                m = 0;
            mask[i * l + j] = m;
            inverse[i * l + j] = (unsigned char)!m;
        }
    free(random);
}

/* `run` and `additive` read True = masked (nn.MultiheadAttention), `sdpa` True = attend (ONNX,
 * torch's SDPA), each by default; --mask-true attend|masked chooses either way: a mask read
 * with the other meaning must give what its inverse gives by default, and not what the mask
 * gives by default. `run` is also checked against the float64 reference both ways. Without
 * the flag stderr carries one note naming the convention; with it, nothing. */
START_TEST(test_mask_true)
{
    TU_BEGIN_TEST();
    enum { L = 17, E = 8, H = 2, DA = 5 };
    tu_set_case("--mask-true on run, sdpa, additive (L=%d)", L);
    char x_path[512], wq_path[512], wk_path[512], wv_path[512], m_path[512], inv_path[512];
    char a_path[512], b_path[512], c_path[512], args[4096];
    float *x = scratch_npy("mt_x.npy", L, E, x_path, sizeof x_path);
    float *wq = scratch_npy("mt_wq.npy", E, E, wq_path, sizeof wq_path);
    float *wk = scratch_npy("mt_wk.npy", E, E, wk_path, sizeof wk_path);
    float *wv = scratch_npy("mt_wv.npy", E, E, wv_path, sizeof wv_path);
    unsigned char mask[L * L], inverse[L * L];
    mask_pair(L, mask, inverse);
    const size_t m_shape[2] = {L, L};
    snprintf(m_path, sizeof m_path, "%s/mt_mask.npy", scratch);
    snprintf(inv_path, sizeof inv_path, "%s/mt_inverse.npy", scratch);
    write_bool_npy(m_path, mask, 2, m_shape);
    write_bool_npy(inv_path, inverse, 2, m_shape);
    snprintf(a_path, sizeof a_path, "%s/mt_a.npy", scratch);
    snprintf(b_path, sizeof b_path, "%s/mt_b.npy", scratch);
    snprintf(c_path, sizeof c_path, "%s/mt_c.npy", scratch);

    /* run: the float64 reference with True = masked, then True = attend. */
    clattn_mha_host_desc desc;
    clattn_mha_host_desc_init(&desc);
    desc.batch = 1, desc.seq_q = L, desc.seq_k = L, desc.embed_dim = E, desc.num_heads = H;
    desc.qk_dim = E, desc.v_dim = E, desc.layout = CLATTN_LAYOUT_XW;
    const clattn_mha_host_weights w = {.q_weight = wq, .k_weight = wk, .v_weight = wv};
    float additive[L * L];
    double *ref = tu_doubles((size_t)L * E);
    const size_t shape[2] = {L, E};
    static const char *const modes[] = {"", "--mask-true masked", "--mask-true attend"};
    for (int mode = 0; mode < 3; ++mode) {
        const bool true_is_masked = mode < 2;
        for (size_t i = 0; i < (size_t)L * L; ++i)
            additive[i] = (mask[i] != 0) == true_is_masked ? -INFINITY : 0.0f;
        const clattn_host_masks masks = {.attn_mask = additive};
        ref_mha_forward(&desc, &w, x, x, x, &masks, ref, NULL);
        snprintf(args, sizeof args,
                 "run --query %s --wq %s --wk %s --wv %s --heads %d --attn-mask %s %s --out %s",
                 x_path, wq_path, wk_path, wv_path, H, m_path, modes[mode], a_path);
        if (run_ok(modes[mode][0] ? modes[mode] : "run, default", args))
            expect_npy_reference(a_path, modes[mode][0] ? modes[mode] : "run default", ref,
                                 (size_t)L * E, 2, shape);
        const bool noted = strstr(captured("stderr"), "note: bool --attn-mask read as True = "
                                                      "masked (PyTorch's nn.MultiheadAttention)");
        tu_expect(noted == (mode == 0), "run %s: stderr: '%s'", modes[mode], captured("stderr"));
    }

    /* sdpa: default True = attend; --mask-true masked on the mask = default on the inverse. */
    const size_t q_shape[4] = {1, H, L, E};
    char q_path[512], k_path[512], v_path[512];
    float *q = scratch_array("mt_q.npy", 4, q_shape, q_path, sizeof q_path);
    float *k = scratch_array("mt_k.npy", 4, q_shape, k_path, sizeof k_path);
    float *v = scratch_array("mt_v.npy", 4, q_shape, v_path, sizeof v_path);
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --attn-mask %s --out %s", q_path,
             k_path, v_path, m_path, a_path);
    run_ok("sdpa default", args);
    tu_expect(strstr(captured("stderr"), "note: bool --attn-mask read as True = attend (ONNX") !=
                  NULL,
              "sdpa: no note: '%s'", captured("stderr"));
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --attn-mask %s --out %s", q_path,
             k_path, v_path, inv_path, b_path);
    run_ok("sdpa default, inverse", args);
    snprintf(args, sizeof args,
             "sdpa --q %s --k %s --v %s --attn-mask %s --mask-true masked --out %s", q_path,
             k_path, v_path, m_path, c_path);
    run_ok("sdpa --mask-true masked", args);
    tu_expect(captured("stderr")[0] == '\0', "sdpa with --mask-true: stderr '%s'",
              captured("stderr"));
    tu_expect(npy_difference(b_path, c_path) == 0.0, "sdpa --mask-true masked != inverse: %g",
              npy_difference(b_path, c_path));
    tu_expect(npy_difference(a_path, c_path) > 1e-3, "sdpa --mask-true masked changed nothing");

    /* additive: default True = masked; --mask-true attend on the mask = default on the inverse. */
    char w1_path[512], w2_path[512], wa_path[512];
    float *w1 = scratch_npy("mt_w1.npy", E, DA, w1_path, sizeof w1_path);
    float *w2 = scratch_npy("mt_w2.npy", E, DA, w2_path, sizeof w2_path);
    const size_t wa_shape[1] = {DA};
    float *wa = scratch_array("mt_wa.npy", 1, wa_shape, wa_path, sizeof wa_path);
    const char *outs[3] = {a_path, b_path, c_path};
    const char *files[3] = {m_path, inv_path, m_path};
    const char *flags[3] = {"", "", "--mask-true attend"};
    for (int i = 0; i < 3; ++i) {
        snprintf(args, sizeof args,
                 "additive --query %s --w1 %s --w2 %s --w %s --attn-mask %s %s --out %s", x_path,
                 w1_path, w2_path, wa_path, files[i], flags[i], outs[i]);
        run_ok("additive", args);
        tu_expect((strstr(captured("stderr"), "note: bool --attn-mask") != NULL) == (i < 2),
                  "additive %s: stderr '%s'", flags[i], captured("stderr"));
    }
    tu_expect(npy_difference(b_path, c_path) == 0.0, "additive --mask-true attend != inverse: %g",
              npy_difference(b_path, c_path));
    tu_expect(npy_difference(a_path, c_path) > 1e-3, "additive --mask-true attend changed nothing");

    /* A bad value: one line, exit 2, on each command. */
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --attn-mask %s --mask-true maybe",
             q_path, k_path, v_path, m_path);
    const int status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "--mask-true: 'maybe' is not attend or "
                                                        "masked") &&
                  count_lines(captured("stderr")) == 1,
              "--mask-true maybe: status %d, stderr '%s'", status, captured("stderr"));
    free(wa), free(w2), free(w1), free(v), free(k), free(q);
    free(ref), free(wv), free(wk), free(wq), free(x);
    TU_END_TEST();
}
END_TEST

/* Every command's --help (the top level's too) ends with its exit-status paragraph. */
START_TEST(test_help_ends_with_exit_status)
{
    TU_BEGIN_TEST();
    static const char *const commands[] = {"",     "devices", "info",     "demo", "run",
                                           "sdpa", "rope",    "additive", "bench", "tune"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i) {
        char args[128];
        snprintf(args, sizeof args, "%s --help", commands[i]);
        tu_set_case("clattn %s", args);
        const int status = run_cli(args);
        const char *out = captured("stdout");
        const char *exit_line = NULL;
        for (const char *at = strstr(out, "Exit status"); at; at = strstr(at + 1, "Exit status"))
            exit_line = at;
        tu_expect(status == 0 && exit_line && (exit_line == out || exit_line[-1] == '\n') &&
                      strstr(exit_line, "0 success") && strstr(exit_line, "2 bad options") &&
                      strstr(exit_line, "\n\n") == NULL,
                  "clattn %s: status %d, help does not end with its exit status:\n%s", args,
                  status, out);
    }
    TU_END_TEST();
}
END_TEST

/* Files from real models (tests/fixtures/gen_cli_fixtures.py --issue25): the "self" block
 * inside a whole model's state dict (found alone, or chosen with --prefix among two), in F64;
 * the missing-key message lists the attention-like keys present; run refuses integer queries,
 * writes a float16 query's output as float16, and prints the real output shape. */
START_TEST(test_run_model_files)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn run on whole-model files");
    char base[2048], args[4096], out[512], other[512];
    snprintf(out, sizeof out, "%s/model_out.npy", scratch);
    snprintf(other, sizeof other, "%s/model_other.npy", scratch);
    snprintf(base, sizeof base,
             "run --query %s/self_query.npy --heads 2 --key-padding-mask %s/self_kpm.npy "
             "--attn-mask %s/self_mask.npy",
             fixtures, fixtures, fixtures);
    /* One block in the file: found without --prefix, with a note; the same with it. */
    snprintf(args, sizeof args, "%s --weights %s/model_one.safetensors --out %s", base, fixtures,
             out);
    if (run_ok("model_one, no --prefix", args))
        expect_npy_close(out, "self_out.npy", TU_TOL);
    tu_expect(strstr(captured("stderr"), "under the prefix 'layers.0.self_attn.'") != NULL,
              "no note of the prefix found: %s", captured("stderr"));
    snprintf(args, sizeof args,
             "%s --weights %s/model_one.safetensors --prefix layers.0.self_attn. --out %s "
             "--mask-true masked",
             base, fixtures, out);
    if (run_ok("model_one --prefix", args))
        expect_npy_close(out, "self_out.npy", TU_TOL);
    tu_expect(captured("stderr")[0] == '\0', "stderr with --prefix: %s", captured("stderr"));
    /* Two blocks: --prefix must choose; each prefix reads its own block. */
    snprintf(args, sizeof args, "%s --weights %s/model_two.safetensors --out %s", base, fixtures,
             out);
    int status = run_cli(args);
    tu_expect(status == 2 && count_lines(captured("stderr")) == 1 &&
                  strstr(captured("stderr"), "holds 2 attention blocks: choose one with --prefix "
                                             "('layers.0.self_attn.', 'layers.1.self_attn.')"),
              "model_two without --prefix: status %d, %s", status, captured("stderr"));
    snprintf(args, sizeof args,
             "%s --weights %s/model_two.safetensors --prefix layers.0.self_attn. --out %s", base,
             fixtures, out);
    if (run_ok("model_two layers.0", args))
        expect_npy_close(out, "self_out.npy", TU_TOL);
    snprintf(args, sizeof args,
             "%s --weights %s/model_two.safetensors --prefix layers.1.self_attn. --out %s", base,
             fixtures, other);
    run_ok("model_two layers.1", args);
    tu_expect(npy_difference(out, other) > 1e-3 && isfinite(npy_difference(out, other)),
              "--prefix layers.1 read layers.0's block (difference %g)",
              npy_difference(out, other));
    /* A prefix that names nothing: the message lists the attention-like keys present. */
    snprintf(args, sizeof args, "%s --weights %s/model_one.safetensors --prefix encoder.", base,
             fixtures);
    status = run_cli(args);
    tu_expect(status == 2 && count_lines(captured("stderr")) == 1 &&
                  strstr(captured("stderr"), "no tensor 'encoder.q_proj_weight'") &&
                  strstr(captured("stderr"), "attention-like keys in the file: ") &&
                  strstr(captured("stderr"), "layers.0.self_attn.in_proj_weight") &&
                  !strstr(captured("stderr"), "embed.weight"),
              "a prefix naming nothing: status %d, %s", status, captured("stderr"));
    /* F64 weights are read (rounded to float32 once, as float64 .npy). */
    snprintf(args, sizeof args, "%s --weights %s/self_f64.safetensors --out %s", base, fixtures,
             out);
    if (run_ok("F64 safetensors", args))
        expect_npy_close(out, "self_out.npy", TU_TOL);

    /* An integer query is refused as sdpa refuses it. */
    char ids[512];
    const long long values[4] = {1, 2, 3, 4};
    snprintf(ids, sizeof ids, "%s/ids.npy", scratch);
    write_i64_npy(ids, values, 4);
    snprintf(args, sizeof args, "run --query %s --weights %s/self.safetensors --heads 2", ids,
             fixtures);
    status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "an integer array; expected float32"),
              "integer query: status %d, %s", status, captured("stderr"));
    /* A float16 query gives a float16 output, the float32 run on the same values rounded. */
    char q16[512], q32[512];
    const size_t q_shape[2] = {7, 8};
    float *q = typed_scratch("q16.npy", 2, q_shape, CLATTN_IO_F16, false, q16, sizeof q16);
    char msg[512];
    snprintf(q32, sizeof q32, "%s/q32.npy", scratch);
    tu_expect(clattn_npy_write(q32, q, 2, q_shape, msg, sizeof msg) == CLATTN_IO_OK, "%s", msg);
    snprintf(args, sizeof args, "run --query %s --weights %s/self.safetensors --heads 2 --out %s",
             q16, fixtures, out);
    run_ok("float16 query", args);
    snprintf(args, sizeof args, "run --query %s --weights %s/self.safetensors --heads 2 --out %s",
             q32, fixtures, other);
    run_ok("float32 query", args);
    clattn_array got = {0}, want = {0};
    if (tu_expect(clattn_npy_read(out, &got, msg, sizeof msg) == CLATTN_IO_OK &&
                      clattn_npy_read(other, &want, msg, sizeof msg) == CLATTN_IO_OK &&
                      got.count == want.count,
                  "reading the outputs: %s", msg)) {
        tu_expect(got.source == CLATTN_IO_F16 && want.source == CLATTN_IO_F32,
                  "output dtypes %d and %d, want float16 and float32", (int)got.source,
                  (int)want.source);
        for (size_t i = 0; i < got.count; ++i)
            tu_expect(fabs(got.data[i] - want.data[i]) <= 1e-3 * fabs(want.data[i]) + 1e-6,
                      "float16 output %zu: %g, float32 %g", i, (double)got.data[i],
                      (double)want.data[i]);
    }
    clattn_array_free(&got);
    clattn_array_free(&want);
    free(q);
    /* Printed instead of written: the real output shape. */
    char big[512];
    float *x = scratch_npy("big_query.npy", 600, 8, big, sizeof big);
    snprintf(args, sizeof args, "run --query %s --weights %s/self.safetensors --heads 2", big,
             fixtures);
    if (run_ok("printed output", args))
        tu_expect(strstr(captured("stdout"), "output: (600, 8) floats") != NULL,
                  "run printed: %s", captured("stdout"));
    free(x);
    const size_t s_shape[4] = {1, 2, 300, 8};
    char sq[512];
    float *sv = scratch_array("big_q4.npy", 4, s_shape, sq, sizeof sq);
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s", sq, sq, sq);
    if (run_ok("sdpa printed output", args))
        tu_expect(strstr(captured("stdout"), "output: (1, 2, 300, 8) floats") != NULL,
                  "sdpa printed: %s", captured("stdout"));
    free(sv);
    TU_END_TEST();
}
END_TEST

/* Decodes a PNG as RGB; NULL when it cannot. */
static unsigned char *read_png_rgb(const char *path, uint32_t *width, uint32_t *height)
{
    png_image image;
    memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&image, path))
        return NULL;
    image.format = PNG_FORMAT_RGB;
    unsigned char *pixels = malloc(PNG_IMAGE_SIZE(image));
    if (pixels == NULL || !png_image_finish_read(&image, NULL, pixels, 0, NULL)) {
        png_image_free(&image);
        free(pixels);
        return NULL;
    }
    *width = image.width, *height = image.height;
    return pixels;
}

/* A causal heatmap at L = 4096 (`clattn run --causal --attn-png`): max-pooled 8 x 8 to 512
 * pixels a side; the upper triangle is the masked grey, the diagonal is not, and with the
 * default per-row scale most of the lower triangle is bright (a global scale to row 0's weight
 * of 1 made it all dark: eight black panels). --png-scale global reproduces the dark map. The
 * map is found by its frame: the first frame-grey pixel in raster order is its top-left. */
START_TEST(test_causal_heatmap_pixels)
{
    TU_BEGIN_TEST();
    enum { L = 4096, E = 8, SIDE = 512 };
    tu_set_case("clattn run --causal --attn-png at L = %d", L);
    char x_path[512], wq_path[512], wk_path[512], wv_path[512], png[512], args[4096];
    float *x = scratch_npy("hm_x.npy", L, E, x_path, sizeof x_path);
    float *wq = scratch_npy("hm_wq.npy", E, E, wq_path, sizeof wq_path);
    float *wk = scratch_npy("hm_wk.npy", E, E, wk_path, sizeof wk_path);
    float *wv = scratch_npy("hm_wv.npy", E, E, wv_path, sizeof wv_path);
    for (int scale = 0; scale < 2; ++scale) {
        snprintf(png, sizeof png, "%s/causal_%d.png", scratch, scale);
        snprintf(args, sizeof args,
                 "run --query %s --wq %s --wk %s --wv %s --causal --attn-png %s %s --out %s/hm.npy",
                 x_path, wq_path, wk_path, wv_path, png, scale ? "--png-scale global" : "",
                 scratch);
        if (!run_ok(scale ? "--png-scale global" : "default scale", args))
            break;
        uint32_t width = 0, height = 0;
        unsigned char *rgb = read_png_rgb(png, &width, &height);
        if (!tu_expect(rgb != NULL, "%s: not a PNG", png))
            break;
        long x0 = -1, y0 = -1;
        for (uint32_t row = 0; row < height && x0 < 0; ++row)
            for (uint32_t col = 0; col < width && x0 < 0; ++col) {
                const unsigned char *p = rgb + 3 * ((size_t)row * width + col);
                if (p[0] == 96 && p[1] == 96 && p[2] == 96)
                    x0 = (long)col + 1, y0 = (long)row + 1;
            }
        if (tu_expect(x0 >= 0 && x0 + SIDE <= (long)width && y0 + SIDE <= (long)height,
                      "no map frame in a %u x %u image", width, height)) {
#define HM_PIXEL(px, py) (rgb + 3 * ((size_t)(y0 + (py)) * width + (size_t)(x0 + (px))))
            size_t grey_upper = 0, upper = 0, grey_diagonal = 0, bright = 0, lower = 0;
            for (long py = 0; py < SIDE; ++py)
                for (long px = 0; px < SIDE; ++px) {
                    const unsigned char *p = HM_PIXEL(px, py);
                    const bool grey = p[0] == 176 && p[1] == 176 && p[2] == 176;
                    if (px > py) {
                        ++upper;
                        grey_upper += grey;
                    } else if (px == py) {
                        grey_diagonal += grey;
                    } else {
                        ++lower;
                        bright += p[0] + p[1] + p[2] > 300;
                    }
                }
#undef HM_PIXEL
            tu_expect(grey_upper == upper, "%zu of %zu upper-triangle pixels are masked grey",
                      grey_upper, upper);
            tu_expect(grey_diagonal == 0, "%zu diagonal pixels are masked grey", grey_diagonal);
            if (scale == 0)
                tu_expect(bright > lower / 2,
                          "per-row scale: only %zu of %zu lower-triangle pixels are bright",
                          bright, lower);
            else
                tu_expect(bright < lower / 20,
                          "global scale: %zu of %zu lower-triangle pixels are bright (row 0's "
                          "weight 1 should darken the rest)",
                          bright, lower);
        }
        free(rgb);
    }
    free(wv), free(wk), free(wq), free(x);
    TU_END_TEST();
}
END_TEST

/* `clattn additive` with a 3-d W1 (H, dq, da) and no --heads says to pass --heads. */
START_TEST(test_additive_heads_hint)
{
    TU_BEGIN_TEST();
    tu_set_case("additive: 3-d W1 without --heads");
    char x_path[512], w1_path[512], w2_path[512], wa_path[512], args[4096];
    float *x = scratch_npy("ah_x.npy", 5, 8, x_path, sizeof x_path);
    const size_t w_shape[3] = {4, 8, 3}, wa_shape[2] = {4, 3};
    float *w1 = scratch_array("ah_w1.npy", 3, w_shape, w1_path, sizeof w1_path);
    float *w2 = scratch_array("ah_w2.npy", 3, w_shape, w2_path, sizeof w2_path);
    float *wa = scratch_array("ah_wa.npy", 2, wa_shape, wa_path, sizeof wa_path);
    snprintf(args, sizeof args, "additive --query %s --w1 %s --w2 %s --w %s", x_path, w1_path,
             w2_path, wa_path);
    int status = run_cli(args);
    tu_expect(status == 2 && strstr(captured("stderr"), "pass --heads 4") &&
                  count_lines(captured("stderr")) == 1,
              "status %d, stderr '%s'", status, captured("stderr"));
    snprintf(args, sizeof args, "additive --query %s --w1 %s --w2 %s --w %s --heads 4 --out %s/ah.npy",
             x_path, w1_path, w2_path, wa_path, scratch);
    run_ok("additive --heads 4", args);
    free(wa), free(w2), free(w1), free(x);
    TU_END_TEST();
}
END_TEST

/* --- --norm relu, --path auto, --opt=value: against the float64 reference -------------------- */

/* A PyTorch fixture run with options the recorded outputs do not cover (relu normalisation);
 * the expected numbers come from the float64 reference on the fixture's own inputs. */
typedef struct reference_case {
    const char *name;
    int heads, causal, key_padding, cross;
} reference_case;

static const reference_case reference_cases[] = {
    {"self", 2, 1, 1, 0},  /* packed in_proj, batch 2, causal + key padding */
    {"cross", 3, 0, 0, 1}, /* q/k/v_proj_weight with kdim 5, vdim 3, unbatched */
    {"causal", 4, 1, 0, 0},
};

/* The reference output and per-head weights of `clattn run` on case c with norm. */
typedef struct reference_result {
    double *out, *attn;
    size_t out_count, attn_count;
    int ndim;        /* of the query: 2 unbatched, 3 batched */
    size_t shape[4]; /* out: shape[0..ndim-1]; attn: (B,) H, L, S */
    size_t attn_shape[4];
} reference_result;

static clattn_array fixture_npy(const char *name, const char *suffix)
{
    char path[512], msg[512];
    snprintf(path, sizeof path, "%s/%s_%s.npy", fixtures, name, suffix);
    clattn_array array = {0};
    tu_expect(clattn_npy_read(path, &array, msg, sizeof msg) == CLATTN_IO_OK, "%s: %s", path, msg);
    return array;
}

/* scale NAN: the default, 1/sqrt(head dim). */
static int reference_run(const reference_case *c, clattn_norm norm, float scale,
                         reference_result *r)
{
    char path[512], msg[512];
    memset(r, 0, sizeof *r);
    clattn_array query = fixture_npy(c->name, "query"), key = {0}, value = {0}, kpm = {0};
    if (c->cross) {
        key = fixture_npy(c->name, "key");
        value = fixture_npy(c->name, "value");
    }
    if (c->key_padding)
        kpm = fixture_npy(c->name, "kpm");
    snprintf(path, sizeof path, "%s/%s.safetensors", fixtures, c->name);
    clattn_safetensors *file = NULL;
    tu_expect(clattn_safetensors_open(path, &file, msg, sizeof msg) == CLATTN_IO_OK, "%s: %s", path,
              msg);
    static const char *const names[7] = {"in_proj_weight", "in_proj_bias",  "q_proj_weight",
                                         "k_proj_weight",  "v_proj_weight", "out_proj.weight",
                                         "out_proj.bias"};
    clattn_array p[7];
    memset(p, 0, sizeof p);
    for (int i = 0; file && i < 7; ++i)
        if (clattn_safetensors_has(file, names[i]))
            tu_expect(clattn_safetensors_read(file, names[i], &p[i], msg, sizeof msg) ==
                          CLATTN_IO_OK,
                      "%s: %s: %s", path, names[i], msg);
    int ok = !tu_failed() && query.data && (query.ndim == 2 || query.ndim == 3);
    if (ok) {
        const int batched = query.ndim == 3;
        const size_t batch = batched ? query.shape[0] : 1;
        const size_t seq_q = query.shape[query.ndim - 2], embed = query.shape[query.ndim - 1];
        const clattn_array *k = c->cross ? &key : &query, *v = c->cross ? &value : &query;
        const size_t seq_k = k->shape[k->ndim - 2];
        clattn_mha_host_desc desc;
        clattn_mha_host_desc_init(&desc);
        desc.batch = batch;
        desc.seq_q = seq_q;
        desc.seq_k = seq_k;
        desc.embed_dim = embed;
        desc.num_heads = (size_t)c->heads;
        desc.kdim = k->shape[k->ndim - 1];
        desc.vdim = v->shape[v->ndim - 1];
        desc.layout = CLATTN_LAYOUT_TORCH;
        desc.causal = c->causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
        desc.scale = scale;
        desc.norm = norm;
        desc.need_weights = CLATTN_WEIGHTS_PER_HEAD;
        clattn_mha_host_weights w = {.out_weight = p[5].data, .out_bias = p[6].data};
        if (p[0].data) {
            w.in_proj_weight = p[0].data;
            w.in_proj_bias = p[1].data;
        } else {
            w.q_weight = p[2].data, w.k_weight = p[3].data, w.v_weight = p[4].data;
            if (p[1].data)
                w.q_bias = p[1].data, w.k_bias = p[1].data + embed,
                w.v_bias = p[1].data + 2 * embed;
        }
        uint8_t *padding = kpm.data ? tu_bytes(kpm.count) : NULL;
        for (size_t i = 0; padding && i < kpm.count; ++i)
            padding[i] = kpm.data[i] != 0.0f;
        const clattn_host_masks masks = {.key_padding_mask = padding};
        r->out_count = batch * seq_q * embed;
        r->attn_count = batch * (size_t)c->heads * seq_q * seq_k;
        r->out = tu_doubles(r->out_count);
        r->attn = tu_doubles(r->attn_count);
        ref_mha_forward(&desc, &w, query.data, k->data, v->data, &masks, r->out, r->attn);
        r->ndim = query.ndim;
        const size_t out_shape[3] = {batch, seq_q, embed};
        const size_t attn_shape[4] = {batch, (size_t)c->heads, seq_q, seq_k};
        memcpy(r->shape, batched ? out_shape : out_shape + 1, (size_t)r->ndim * sizeof(size_t));
        memcpy(r->attn_shape, batched ? attn_shape : attn_shape + 1,
               (size_t)(r->ndim + 1) * sizeof(size_t));
        free(padding);
    }
    for (int i = 0; i < 7; ++i)
        clattn_array_free(&p[i]);
    clattn_safetensors_close(file);
    clattn_array_free(&kpm);
    clattn_array_free(&value);
    clattn_array_free(&key);
    clattn_array_free(&query);
    return ok;
}

static void reference_free(reference_result *r)
{
    free(r->out);
    free(r->attn);
}

/* Compares an .npy the command wrote with the reference, shape included. */
static void expect_npy_reference(const char *got_path, const char *what, const double *ref,
                                 size_t count, int ndim, const size_t *shape)
{
    char msg[512];
    clattn_array got = {0};
    if (tu_expect(clattn_npy_read(got_path, &got, msg, sizeof msg) == CLATTN_IO_OK,
                  "%s: reading %s: %s", what, got_path, msg)) {
        int same_shape = got.ndim == ndim && got.count == count;
        for (int i = 0; same_shape && i < ndim; ++i)
            same_shape = got.shape[i] == shape[i];
        tu_expect(same_shape, "%s: %s has ndim %d and %zu values, want ndim %d and %zu", what,
                  got_path, got.ndim, got.count, ndim, count);
        if (same_shape)
            tu_expect_close(what, got.data, ref, count, TU_TOL);
    }
    clattn_array_free(&got);
}

/* The fixture's input options (%s: fixture dir), in the spelling `equals` picks. */
static void fixture_args(const reference_case *c, int equals, char *args, size_t size)
{
    const char *sep = equals ? "=" : " ";
    int used = snprintf(args, size,
                        "--query%s%s/%s_query.npy --weights%s%s/%s.safetensors "
                        "--heads%s%d",
                        sep, fixtures, c->name, sep, fixtures, c->name, sep, c->heads);
    if (c->cross)
        used += snprintf(args + used, size - (size_t)used,
                         " --key%s%s/%s_key.npy --value%s%s/%s_value.npy", sep, fixtures, c->name,
                         sep, fixtures, c->name);
    if (c->key_padding)
        used += snprintf(args + used, size - (size_t)used, " --key-padding-mask%s%s/%s_kpm.npy",
                         sep, fixtures, c->name);
    if (c->causal)
        snprintf(args + used, size - (size_t)used, " --causal");
}

/* --norm relu with --path auto: with --attn-out the unfused path (which returns the weights),
 * without it the fused kernel; both against the float64 reference. */
START_TEST(test_run_relu_auto_matches_reference)
{
    TU_BEGIN_TEST();
    const reference_case *c = &reference_cases[_i];
    tu_set_case("clattn run --norm relu --path auto on the '%s' fixture", c->name);
    reference_result r;
    if (reference_run(c, CLATTN_NORM_RELU, NAN, &r)) {
        char inputs[2048], args[4096], out[512], attn[512];
        fixture_args(c, 0, inputs, sizeof inputs);
        snprintf(out, sizeof out, "%s/relu_out.npy", scratch);
        snprintf(attn, sizeof attn, "%s/relu_attn.npy", scratch);
        snprintf(args, sizeof args, "run %s --norm relu --path auto --out %s --attn-out %s", inputs,
                 out, attn);
        int status = run_cli(args);
        tu_expect(status == 0, "unfused: exit status %d, stderr: %s", status, captured("stderr"));
        if (status == 0) {
            expect_npy_reference(out, "relu out (auto, weights asked)", r.out, r.out_count, r.ndim,
                                 r.shape);
            expect_npy_reference(attn, "relu weights", r.attn, r.attn_count, r.ndim + 1,
                                 r.attn_shape);
        }
        remove(out);
        snprintf(args, sizeof args, "run %s --norm relu --path auto --out %s", inputs, out);
        status = run_cli(args);
        tu_expect(status == 0, "fused: exit status %d, stderr: %s", status, captured("stderr"));
        if (status == 0)
            expect_npy_reference(out, "relu out (auto, fused)", r.out, r.out_count, r.ndim,
                                 r.shape);
        /* The softmax default is not what relu gives: the comparison can tell them apart. */
        reference_result softmax;
        if (reference_run(c, CLATTN_NORM_SOFTMAX, NAN, &softmax)) {
            double largest = 0.0;
            for (size_t i = 0; i < r.out_count && i < softmax.out_count; ++i) {
                const double diff = fabs(softmax.out[i] - r.out[i]);
                largest = diff > largest ? diff : largest;
            }
            tu_expect(largest > 1e-2, "relu and softmax references agree to %g", largest);
            reference_free(&softmax);
        }
        reference_free(&r);
    }
    TU_END_TEST();
}
END_TEST

/* --opt=value is the same as --opt value: the same numbers, for every option kind (paths,
 * sizes, words, flags without a value). */
START_TEST(test_run_option_equals_syntax)
{
    TU_BEGIN_TEST();
    const reference_case *c = &reference_cases[0];
    tu_set_case("clattn run --opt=value on the '%s' fixture", c->name);
    reference_result r;
    if (reference_run(c, CLATTN_NORM_RELU, 0.3f, &r)) {
        char inputs[2048], args[4096], out[512], attn[512];
        fixture_args(c, 1, inputs, sizeof inputs);
        snprintf(out, sizeof out, "%s/equals_out.npy", scratch);
        snprintf(attn, sizeof attn, "%s/equals_attn.npy", scratch);
        snprintf(args, sizeof args,
                 "run %s --norm=relu --path=unfused --scale=0 --out=%s --attn-out=%s", inputs, out,
                 attn);
        /* --scale=0 is refused (it would ignore the scores): the value was read from '='. */
        int status = run_cli(args);
        tu_expect(status == 2 && strstr(captured("stderr"), "--scale"),
                  "--scale=0: exit status %d, stderr: %s", status, captured("stderr"));
        snprintf(args, sizeof args,
                 "run %s --norm=relu --path=unfused --scale=0.3 --out=%s --attn-out=%s", inputs,
                 out, attn);
        status = run_cli(args);
        tu_expect(status == 0, "exit status %d, stderr: %s", status, captured("stderr"));
        if (status == 0) {
            expect_npy_reference(out, "out (--opt=value)", r.out, r.out_count, r.ndim, r.shape);
            expect_npy_reference(attn, "weights (--opt=value)", r.attn, r.attn_count, r.ndim + 1,
                                 r.attn_shape);
        }
        reference_free(&r);
    }
    TU_END_TEST();
}
END_TEST

/* Bad values given with '=': exit 2, one line naming the option. */
static const bad_case bad_equals_cases[] = {
    {"run --query %1$s/self_query.npy --weights=%1$s/self.safetensors --heads=", "--heads"},
    {"run --query %1$s/self_query.npy --weights=%1$s/self.safetensors --heads=two", "--heads"},
    {"run --query %1$s/self_query.npy --weights=%1$s/self.safetensors --heads=2 --norm=max",
     "--norm"},
    {"run --query %1$s/self_query.npy --weights=%1$s/self.safetensors --heads=2 --path=warp",
     "--path"},
    {"run --query=%2$s/missing.npy --weights=%1$s/self.safetensors --heads=2", "missing.npy"},
    {"run --bogus=1", "unknown option '--bogus'"},
    {"run --query", "--query needs a value"},
    {"bench --runs=0", "--runs"},
    {"bench --op=matmul,sort", "sort"},
    {"bench --seq=", "--seq"},
    {"bench --seq=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "--seq"},
    {"bench --embed=6 --heads=4 --op=mha --seq=4", "--embed"},
    {"bench --warmup", "--warmup needs a value"},
    /* Flags take no value: --causal=no must not mean causal. */
    {"run --query %1$s/self_query.npy --weights=%1$s/self.safetensors --heads=2 --causal=no",
     "--causal takes no value"},
    {"bench --json=1", "--json takes no value"},
    {"bench --causal=no", "--causal takes no value"},
    {"bench --op=,", "--op: no op"},
    {"bench --dtype=", "--dtype: empty list"},
    {"bench --dtype=f16,half", "'half'"},
    {"bench --op ,,", "--op: no op"},
};

START_TEST(test_bad_equals_exits_2)
{
    TU_BEGIN_TEST();
    char args[4096];
    snprintf(args, sizeof args, bad_equals_cases[_i].args, fixtures, scratch);
    tu_set_case("clattn %s", args);
    int status = run_cli(args);
    const char *err = captured("stderr");
    tu_expect(status == 2, "exit status %d, want 2; stderr: %s", status, err);
    tu_expect(count_lines(err) == 1, "stderr has %zu lines, want 1: %s", count_lines(err), err);
    tu_expect(strncmp(err, "clattn", 6) == 0 && strstr(err, bad_equals_cases[_i].needle) != NULL,
              "stderr does not name '%s': %s", bad_equals_cases[_i].needle, err);
    TU_END_TEST();
}
END_TEST

/* --- bench: op lists, the table, refused cases ---------------------------------------------- */

/* The "op" (and "path") of each JSON line of the captured stdout, joined by spaces. */
static void json_ops(const char *text, char *ops, size_t size)
{
    size_t used = 0;
    ops[0] = '\0';
    for (const char *line = text; *line && used < size;) {
        const char *op = strstr(line, "{\"op\": \"");
        const char *end = strchr(line, '\n');
        if (op == NULL || (end && op > end))
            break;
        const char *path = strstr(line, "\"path\": \"");
        int length = (int)strcspn(op + 8, "\"");
        used +=
            (size_t)snprintf(ops + used, size - used, "%s%.*s", used ? " " : "", length, op + 8);
        if (path && (!end || path < end) && used < size)
            used += (size_t)snprintf(ops + used, size - used, "/%.*s", (int)strcspn(path + 9, "\""),
                                     path + 9);
        if (end == NULL)
            break;
        line = end + 1;
    }
}

typedef struct bench_list_case {
    const char *args, *ops; /* the op/path of each line, in order */
} bench_list_case;

static const bench_list_case bench_list_cases[] = {
    {"--op softmax,matmul --mnk 9x7x5 --seq 12", "matmul softmax"},
    {"--op=mha --path=fused --seq=8,12 --embed=8", "mha/fused mha/fused"},
    {"--op attention,attention --path unfused,fused --seq 6", "attention/fused attention/unfused"},
    {"--op matmul --op mha --path unfused --mnk 3x3x3,5x5x5 --seq 4 --embed 8",
     "matmul matmul mha/unfused"},
    {"--op softmax,attention,mha --path fused --seq 4,6 --seq-k 5 --embed 8",
     "softmax softmax attention/fused attention/fused mha/fused mha/fused"},
    {"--op attention --seq 9 --seq-k 17 --causal --mask padding",
     "attention/fused attention/unfused"},
    {"--op attention,mha --path fused --seq 9 --mask additive --embed 8",
     "attention/fused mha/fused"},
};

/* --causal and --mask (bench/peers.py's attention variants): the attention lines name them,
 * the softmax line (which times the plain unfused plan) does not. */
START_TEST(test_bench_masks)
{
    TU_BEGIN_TEST();
    static const char *const masks[2] = {"padding", "additive"};
    for (int i = 0; i < 2; ++i) {
        char args[512], want[128];
        snprintf(args, sizeof args,
                 "bench --json --runs 2 --warmup 0 --heads 2 --head-dim 4 --op softmax,attention "
                 "--path fused --seq 9 --seq-k 17 --causal --mask %s",
                 masks[i]);
        tu_set_case("clattn %s", args);
        int status = run_cli(args);
        const char *out = captured("stdout");
        tu_expect(status == 0, "status %d: %s", status, captured("stderr"));
        snprintf(want, sizeof want, "\"dtype\": \"f32\", \"causal\": true, \"mask\": \"%s\", ",
                 masks[i]);
        const char *attention = strstr(out, "{\"op\": \"attention\"");
        tu_expect(attention && strstr(attention, want), "attention line lacks '%s': %s", want, out);
        /* The softmax line comes first: neither key may occur before the attention line. */
        tu_expect(count_lines(out) == 2 && attention && strstr(out, "\"causal\"") > attention &&
                      strstr(out, "\"mask\"") > attention,
                  "the softmax line names a mask or causal: %s", out);
    }
    TU_END_TEST();
}
END_TEST

/* --op picks the ops (in the driver's order, each once), --path the paths, --seq the sizes:
 * exactly those JSON lines, each with a positive time. */
START_TEST(test_bench_op_lists)
{
    TU_BEGIN_TEST();
    const bench_list_case *c = &bench_list_cases[_i];
    char args[1024], ops[512];
    snprintf(args, sizeof args, "bench --json --runs 2 --warmup 0 --heads 2 --head-dim 4 %s",
             c->args);
    tu_set_case("clattn %s", args);
    int status = run_cli(args);
    const char *out = captured("stdout");
    tu_expect(status == 0, "status %d: %s", status, captured("stderr"));
    json_ops(out, ops, sizeof ops);
    tu_expect(strcmp(ops, c->ops) == 0, "lines are '%s', want '%s': %s", ops, c->ops, out);
    size_t want_lines = 1;
    for (const char *s = c->ops; *s; ++s)
        want_lines += *s == ' ';
    tu_expect(count_lines(out) == want_lines, "%zu lines, want %zu: %s", count_lines(out),
              want_lines, out);
    static const char median_key[] = "\"median_ms\": ";
    for (const char *at = strstr(out, median_key); at; at = strstr(at + 1, median_key))
        tu_expect(strtod(at + 13, NULL) > 0.0, "a median is not positive: %.80s", at);
    TU_END_TEST();
}
END_TEST

/* --dtype: softmax, attention and mha on 16-bit storage, one line per type in the order
 * f32, f16, bf16 whatever the order given, each naming its type; the table marks the type. */
START_TEST(test_bench_dtype)
{
    TU_BEGIN_TEST();
    static const char args[] = "bench --json --runs 2 --warmup 0 --op softmax,attention,mha "
                               "--dtype bf16,f16 --path fused --seq 5 --seq-k 7 --heads 2 "
                               "--head-dim 4 --embed 8";
    tu_set_case("clattn %s", args);
    int status = run_cli(args);
    const char *out = captured("stdout");
    char ops[512];
    tu_expect(status == 0, "status %d: %s", status, captured("stderr"));
    json_ops(out, ops, sizeof ops);
    tu_expect(strcmp(ops, "softmax softmax attention/fused attention/fused mha/fused mha/fused") ==
                  0,
              "lines are '%s': %s", ops, out);
    const char *line = out;
    for (int i = 0; i < 6 && line && *line; ++i) {
        const char *want = i % 2 ? "\"dtype\": \"bf16\"" : "\"dtype\": \"f16\"";
        const char *end = strchr(line, '\n');
        const char *at = strstr(line, want);
        tu_expect(at && (!end || at < end), "line %d lacks %s: %.200s", i + 1, want, line);
        line = end ? end + 1 : NULL;
    }
    status = run_cli("bench --op attention --dtype f16 --path unfused --seq 5 --heads 2 "
                     "--head-dim 4 --runs 2 --warmup 0");
    out = captured("stdout");
    tu_expect(status == 0 && strstr(out, "\nattention/unfused ") &&
                  strstr(out, "B=1 H=2 Lq=5 Lk=5 d=4 f16"),
              "table: status %d, no f16 attention row: %s", status, out);
    TU_END_TEST();
}
END_TEST

/* The table: a device line, a header, one row per case with its rate unit. */
START_TEST(test_bench_table)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn bench (table) --op matmul,softmax");
    int status = run_cli("bench --op matmul,softmax --mnk 9x7x5 --seq 12 --heads 2 --runs 3 "
                         "--warmup 1");
    const char *out = captured("stdout");
    tu_expect(status == 0, "status %d: %s", status, captured("stderr"));
    tu_expect(tu_starts_with(out, "device: ") && strstr(out, "median of 3 runs after 1 warm-up"),
              "no device or runs line: %s", out);
    tu_expect(strstr(out, "device ms") && strstr(out, "dev MiB") && strstr(out, "rss MiB"),
              "no header: %s", out);
    const char *matmul = strstr(out, "\nmatmul ");
    const char *softmax = strstr(out, "\nsoftmax ");
    tu_expect(matmul && strstr(matmul, "m=9 n=7 k=5") && strstr(matmul, "GFLOP/s"),
              "no matmul row with its size and GFLOP/s: %s", out);
    tu_expect(softmax && softmax > matmul && strstr(softmax, "B=1 H=2 Lq=12 Lk=12") &&
                  strstr(softmax, "GB/s"),
              "no softmax row after matmul with its size and GB/s: %s", out);
    tu_expect(count_lines(out) == 5, "%zu lines, want 5: %s", count_lines(out), out);
    TU_END_TEST();
}
END_TEST

/* A case whose workspace no device can hold (the unfused path's scores at L = 2^20: 4 TiB)
 * is reported as refused, with the library's reason, and the run goes on and exits 0; in the
 * table and in JSON. */
START_TEST(test_bench_refused)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn bench at L = 2^20 on the unfused path");
    static const char sizes[] = "--op attention,mha --path unfused --seq 1048576 --heads 1 "
                                "--head-dim 1 --embed 1 --runs 1 --warmup 0";
    char args[512], ops[256];
    snprintf(args, sizeof args, "bench --json %s", sizes);
    int status = run_cli(args);
    const char *out = captured("stdout");
    tu_expect(status == 0, "--json: status %d: %s", status, captured("stderr"));
    json_ops(out, ops, sizeof ops);
    tu_expect(strcmp(ops, "attention/unfused mha/unfused") == 0 && count_lines(out) == 2,
              "--json: lines are '%s': %s", ops, out);
    tu_expect(strstr(out, "\"seq_q\": 1048576, \"seq_k\": 1048576") != NULL,
              "--json: no sizes in the lines: %s", out);
    /* 2^40 scores of 4 bytes (and a little more): refused when the plan is created, before
     * any buffer is made, with the size the library computed. */
    const char *first = strstr(out, "\"refused\": \"sdpa: the workspace (the scores (batch, "
                                    "heads, seq_q, seq_k)) needs ");
    const char *second = strstr(out, "\"refused\": \"mha: the workspace (the projections and "
                                     "the scores");
    const char *first_size = first ? strstr(first, "needs ") : NULL;
    const char *second_size = second ? strstr(second, "needs ") : NULL;
    tu_expect(first_size && second_size && strtod(first_size + 6, NULL) >= 4398046511104.0 &&
                  strtod(second_size + 6, NULL) >= 4398046511104.0,
              "--json: refusals lack the library's reason and size: %s", out);
    tu_expect(strstr(out, "median_ms") == NULL, "--json: a refused case has a time: %s", out);

    snprintf(args, sizeof args, "bench %s", sizes);
    status = run_cli(args);
    out = captured("stdout");
    tu_expect(status == 0, "table: status %d: %s", status, captured("stderr"));
    const char *row = strstr(out, "\nattention/unfused ");
    tu_expect(row && strstr(row, "B=1 H=1 Lq=1048576 Lk=1048576 d=1") &&
                  strstr(row, "refused: sdpa: the workspace (the scores"),
              "table: no refused attention row: %s", out);
    row = strstr(out, "\nmha/unfused ");
    tu_expect(row && strstr(row, "refused: mha: "), "table: no refused mha row: %s", out);
    TU_END_TEST();
}
END_TEST

/* Every line of `clattn bench --json` (with CLATTN_BENCH_TIMER=wall when force_wall) is a JSON
 * object that cJSON parses (no inf or nan), with a positive median, a rate, and "timer": "wall"
 * or "device" ("wall" when forced). Returns the number of lines checked. */
static size_t expect_bench_json_lines(bool force_wall)
{
    char command[4096];
    snprintf(command, sizeof command,
             "%s'%s' bench --json --runs 2 --mnk 5x7x33 --seq 9 --heads 1 --head-dim 8 "
             "--embed 8 >'%s/stdout' 2>'%s/stderr'",
             force_wall ? "CLATTN_BENCH_TIMER=wall " : "", clattn_bin, scratch, scratch);
    int status = system(command);
    status = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    tu_expect(status == 0, "bench: status %d: %s", status, captured("stderr"));
    const char *out = captured("stdout");
    size_t lines = 0;
    for (const char *line = out; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "") {
        const char *newline = strchr(line, '\n');
        const size_t length = newline ? (size_t)(newline - line) : strlen(line);
        cJSON *json = cJSON_ParseWithLength(line, length);
        ++lines;
        tu_expect(json != NULL && cJSON_IsObject(json), "not a JSON object: %.*s", (int)length,
                  line);
        if (json == NULL)
            continue;
        const cJSON *median = cJSON_GetObjectItemCaseSensitive(json, "median_ms");
        const cJSON *timer = cJSON_GetObjectItemCaseSensitive(json, "timer");
        const cJSON *rate = cJSON_GetObjectItemCaseSensitive(json, "gflops");
        if (rate == NULL)
            rate = cJSON_GetObjectItemCaseSensitive(json, "gbps");
        tu_expect(cJSON_IsNumber(median) && median->valuedouble > 0.0 && cJSON_IsNumber(rate) &&
                      rate->valuedouble > 0.0,
                  "median_ms or rate missing or not positive: %.*s", (int)length, line);
        const char *timer_name = cJSON_IsString(timer) ? timer->valuestring : "";
        tu_expect(force_wall ? strcmp(timer_name, "wall") == 0
                             : strcmp(timer_name, "wall") == 0 || strcmp(timer_name, "device") == 0,
                  "\"timer\" is '%s'%s: %.*s", timer_name,
                  force_wall ? " under CLATTN_BENCH_TIMER=wall" : "", (int)length, line);
        cJSON_Delete(json);
    }
    return lines;
}

START_TEST(test_bench_json_timer)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn bench --json: parsable lines naming their timer");
    size_t lines = expect_bench_json_lines(false);
    tu_expect(lines == 6, "expected 6 JSON lines, got %zu", lines);
    tu_set_case("clattn bench --json with CLATTN_BENCH_TIMER=wall");
    lines = expect_bench_json_lines(true);
    tu_expect(lines == 6, "expected 6 JSON lines under CLATTN_BENCH_TIMER=wall, got %zu", lines);
    /* The table marks wall-clock times and says why on stderr. */
    char command[4096];
    snprintf(command, sizeof command,
             "CLATTN_BENCH_TIMER=wall '%s' bench --op matmul --runs 2 --mnk 5x7x33 >'%s/stdout' "
             "2>'%s/stderr'",
             clattn_bin, scratch, scratch);
    int status = system(command);
    tu_expect(status == 0 && strstr(captured("stdout"), " wall ") &&
                  strstr(captured("stderr"), "note: times marked 'wall' are wall-clock"),
              "bench table under CLATTN_BENCH_TIMER=wall lacks the mark or the note: %s%s",
              captured("stdout"), captured("stderr"));
    TU_END_TEST();
}
END_TEST

/* --- no OpenCL platform, no device: exit 1 with the library's reason -------------------------- */

/* Copies the file at `from` to `to`; 1 on success. */
static int copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    char buffer[4096];
    size_t got = 0;
    int ok = in != NULL && out != NULL;
    while (ok && (got = fread(buffer, 1, sizeof buffer, in)) > 0)
        ok = fwrite(buffer, 1, got, out) == got;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        ok = 0;
    return ok;
}

/* Runs `clattn ARGS` and expects exit 1 and one stderr line containing needle. */
static void expect_no_device(const char *args, const char *needle)
{
    tu_set_case("OCL_ICD_VENDORS=%s clattn %s", getenv("OCL_ICD_VENDORS"), args);
    int status = run_cli(args);
    const char *err = captured("stderr");
    tu_expect(status == 1 && count_lines(err) == 1 && strstr(err, needle) != NULL,
              "exit status %d (want 1), stderr (want one line with '%s'): %s", status, needle, err);
}

/* The OpenCL loader reads OCL_ICD_VENDORS (a folder of .icd files) in the child: an empty
 * folder means no platform; a folder holding one ICD whose platform lists no device (Mesa's,
 * on a machine without a GPU it drives) means no device, whatever the spec asks for. */
/* Saves an environment variable (NULL when unset) to restore it with restore_env. */
static char *save_env(const char *name)
{
    const char *value = getenv(name);
    return value ? strdup(value) : NULL;
}

static void restore_env(const char *name, char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* The clattn command pins PoCL's worker threads (POCL_AFFINITY=1) when the environment does
 * not set POCL_AFFINITY and no MPI launcher placed it; `clattn info` says what PoCL was given. */
START_TEST(test_pocl_affinity)
{
    TU_BEGIN_TEST();
    static const char *const names[] = {"POCL_AFFINITY", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                                        "PMI_SIZE"};
    char *saved[4];
    for (int i = 0; i < 4; ++i) {
        saved[i] = save_env(names[i]);
        unsetenv(names[i]);
    }
    static const struct {
        const char *set, *value, *expect;
    } cases[] = {
        {NULL, NULL, "POCL_AFFINITY=1\n"},
        {"POCL_AFFINITY", "0", "POCL_AFFINITY=0\n"},
        {"POCL_AFFINITY", "1", "POCL_AFFINITY=1\n"},
        {"PMI_RANK", "0", "POCL_AFFINITY=(unset)\n"},
        {"OMPI_COMM_WORLD_SIZE", "1", "POCL_AFFINITY=(unset)\n"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        if (cases[c].set)
            setenv(cases[c].set, cases[c].value, 1);
        tu_set_case("clattn info with %s=%s", cases[c].set ? cases[c].set : "nothing",
                    cases[c].value ? cases[c].value : "");
        const int status = run_cli("info");
        tu_expect(status == 0 && strstr(captured("stdout"), cases[c].expect) != NULL,
                  "exit %d, no \"%.*s\" in: %s", status, (int)strlen(cases[c].expect) - 1,
                  cases[c].expect, captured("stdout"));
        if (cases[c].set)
            unsetenv(cases[c].set);
    }
    for (int i = 0; i < 4; ++i)
        restore_env(names[i], saved[i]);
    TU_END_TEST();
}
END_TEST

/* The first command on a device that the tuning cache does not tune says once that `clattn
 * tune` would (issue 27): not again for the same device (noted in the cache folder's
 * tune-hinted), never with a cache row for it, a CLATTN_TUNING file or CLATTN_NO_TUNE_HINT=1.
 * A cache whose rows for the device were tuned on another driver (or carry no driver key)
 * says once per driver key that they are not applied and that `clattn tune` re-tunes
 * (issue 48). */
START_TEST(test_tune_hint)
{
    TU_BEGIN_TEST();
    char *saved_xdg = save_env("XDG_CACHE_HOME"), *saved_off = save_env("CLATTN_NO_TUNE_HINT");
    char *saved_tuning = save_env("CLATTN_TUNING");
    char dir[600], path[700];
    unsetenv("CLATTN_NO_TUNE_HINT");
    unsetenv("CLATTN_TUNING");

    snprintf(dir, sizeof dir, "%s/xdg-fresh", scratch);
    setenv("XDG_CACHE_HOME", dir, 1);
    tu_set_case("XDG_CACHE_HOME=%s (no tuning cache): clattn info, twice", dir);
    int status = run_cli("info");
    const char *err = captured("stderr");
    tu_expect(status == 0 && count_lines(err) == 1 && strstr(err, "`clattn tune`") != NULL &&
                  strstr(err, "once per device") != NULL,
              "the first run did not give the one-line hint (exit %d): %s", status, err);
    status = run_cli("info");
    tu_expect(status == 0 && captured("stderr")[0] == '\0',
              "the second run on the same device hinted again (exit %d): %s", status,
              captured("stderr"));
    /* The device's driver fields: the "driver key:" line after the name. */
    char fields[1024] = "";
    const char *key = strstr(captured("stdout"), "\ndriver key: ");
    const char *after_name = key ? strstr(key, " | driver ") : NULL;
    if (after_name)
        snprintf(fields, sizeof fields, "%.*s", (int)strcspn(after_name + 3, "\n"),
                 after_name + 3);
    tu_expect(fields[0] != '\0', "clattn info prints no driver key: %s", captured("stdout"));
    snprintf(path, sizeof path, "%s/clattn/tune-hinted", dir);
    tu_expect(access(path, F_OK) == 0, "no %s after the hint", path);

    /* A row of the tuning cache applies to the device: no hint, nothing noted. */
    snprintf(dir, sizeof dir, "%s/xdg-tuned", scratch);
    snprintf(path, sizeof path, "%s/clattn", dir);
    tu_expect(mkdir(dir, 0755) == 0 && mkdir(path, 0755) == 0, "mkdir %s failed", path);
    snprintf(path, sizeof path, "%s/clattn/tuning", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "any | * | * | %s | softmax_rows=4\n", fields);
        fclose(f);
    }
    setenv("XDG_CACHE_HOME", dir, 1);
    tu_set_case("XDG_CACHE_HOME=%s (a cache row for every device): clattn info", dir);
    status = run_cli("info");
    tu_expect(status == 0 && captured("stderr")[0] == '\0', "hinted (exit %d): %s", status,
              captured("stderr"));
    snprintf(path, sizeof path, "%s/clattn/tune-hinted", dir);
    tu_expect(access(path, F_OK) != 0, "%s written without a hint", path);

    /* The same row without the driver key (an older clattn's): once per driver. */
    snprintf(dir, sizeof dir, "%s/xdg-stale", scratch);
    snprintf(path, sizeof path, "%s/clattn", dir);
    tu_expect(mkdir(dir, 0755) == 0 && mkdir(path, 0755) == 0, "mkdir %s failed", path);
    snprintf(path, sizeof path, "%s/clattn/tuning", dir);
    if ((f = fopen(path, "w")) != NULL) {
        fputs("any | * | * | softmax_rows=4\n", f);
        fclose(f);
    }
    setenv("XDG_CACHE_HOME", dir, 1);
    tu_set_case("XDG_CACHE_HOME=%s (a cache row without a driver key): clattn info, twice", dir);
    status = run_cli("info");
    err = captured("stderr");
    tu_expect(status == 0 && count_lines(err) == 1 && strstr(err, "another driver") != NULL &&
                  strstr(err, "`clattn tune`") != NULL && strstr(err, "once per driver") != NULL,
              "no one-line note of the other driver's rows (exit %d): %s", status, err);
    status = run_cli("info");
    tu_expect(status == 0 && captured("stderr")[0] == '\0',
              "the second run on the same driver hinted again (exit %d): %s", status,
              captured("stderr"));

    /* A CLATTN_TUNING file, or CLATTN_NO_TUNE_HINT=1: no hint either. */
    snprintf(dir, sizeof dir, "%s/xdg-off", scratch);
    setenv("XDG_CACHE_HOME", dir, 1);
    setenv("CLATTN_TUNING", "default", 1);
    tu_set_case("CLATTN_TUNING=default: clattn info");
    status = run_cli("info");
    tu_expect(status == 0 && captured("stderr")[0] == '\0', "hinted (exit %d): %s", status,
              captured("stderr"));
    unsetenv("CLATTN_TUNING");
    setenv("CLATTN_NO_TUNE_HINT", "1", 1);
    tu_set_case("CLATTN_NO_TUNE_HINT=1: clattn info");
    status = run_cli("info");
    tu_expect(status == 0 && captured("stderr")[0] == '\0', "hinted (exit %d): %s", status,
              captured("stderr"));

    restore_env("XDG_CACHE_HOME", saved_xdg);
    restore_env("CLATTN_NO_TUNE_HINT", saved_off);
    restore_env("CLATTN_TUNING", saved_tuning);
    TU_END_TEST();
}
END_TEST

START_TEST(test_no_platform_or_device)
{
    TU_BEGIN_TEST();
    char vendors[] = "/tmp/clattn-icd-XXXXXX", path[1024], icd[1024];
    tu_make_temp_dir(vendors);
    const char *saved = getenv("OCL_ICD_VENDORS"), *saved_device = getenv("CLATTN_DEVICE");
    char *saved_copy = saved ? strdup(saved) : NULL;
    char *saved_device_copy = saved_device ? strdup(saved_device) : NULL;
    const char *system_vendors = saved ? saved_copy : "/etc/OpenCL/vendors";
    setenv("OCL_ICD_VENDORS", vendors, 1);
    unsetenv("CLATTN_DEVICE");

    expect_no_device("demo", "clattn demo: no device: CLATTN_ERR_NO_DEVICE: no OpenCL platform "
                             "found: install an ICD");

    /* Look for an installed ICD whose platform has no device. */
    int found = 0;
    DIR *folder = opendir(system_vendors);
    for (struct dirent *entry = folder ? readdir(folder) : NULL; entry && !found;
         entry = readdir(folder)) {
        const size_t length = strlen(entry->d_name);
        if (length < 5 || strcmp(entry->d_name + length - 4, ".icd") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", system_vendors, entry->d_name);
        snprintf(icd, sizeof icd, "%s/%s", vendors, entry->d_name);
        if (!copy_file(path, icd))
            continue;
        found = run_cli("demo") == 1 &&
                strstr(captured("stderr"), "no OpenCL device found on any platform") != NULL;
        if (!found)
            remove(icd);
    }
    if (folder)
        closedir(folder);
    if (found) {
        expect_no_device("demo", "clattn demo: no device: CLATTN_ERR_NO_DEVICE: no OpenCL device "
                                 "found on any platform");
        expect_no_device("demo --device cpu",
                         "device_spec=cpu: no CPU device on any of 1 platform(s)");
        expect_no_device("demo --device gpu",
                         "device_spec=gpu: no GPU device on any of 1 platform(s)");
        expect_no_device("demo --device 0:0",
                         "device_spec=0:0: platform 0 has no device 0 (0 device(s))");
        /* An index beyond the platforms is a bad option (2), not a missing device. */
        tu_set_case("OCL_ICD_VENDORS=%s clattn demo --device 1:0", vendors);
        const int status = run_cli("demo --device 1:0");
        tu_expect(status == 2 && count_lines(captured("stderr")) == 1 &&
                      strstr(captured("stderr"),
                             "bad --device: device_spec=1:0: platform 1 does not exist"),
                  "exit status %d (want 2): %s", status, captured("stderr"));
        setenv("CLATTN_DEVICE", "cpu", 1);
        expect_no_device("demo", "CLATTN_DEVICE=cpu: no CPU device on any of 1 platform(s)");
        unsetenv("CLATTN_DEVICE");
        remove(icd);
    } else {
        printf("check_cli: NOT RUN: no installed ICD lists a platform without devices; the "
               "no-device cases of test_no_platform_or_device did not run\n");
    }

    if (saved_copy)
        setenv("OCL_ICD_VENDORS", saved_copy, 1);
    else
        unsetenv("OCL_ICD_VENDORS");
    if (saved_device_copy)
        setenv("CLATTN_DEVICE", saved_device_copy, 1);
    free(saved_device_copy);
    free(saved_copy);
    rmdir(vendors);
    TU_END_TEST();
}
END_TEST

/* Broken files the bad-input cases read. */
static void write_broken_files(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/garbage.npy", scratch);
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs("this is not a numpy file at all", f);
        fclose(f);
    }
    /* The first 100 bytes of a real safetensors file. */
    char source[512];
    snprintf(source, sizeof source, "%s/self.safetensors", fixtures);
    snprintf(path, sizeof path, "%s/truncated.safetensors", scratch);
    FILE *in = fopen(source, "rb"), *out = fopen(path, "wb");
    char bytes[100];
    size_t got = in ? fread(bytes, 1, sizeof bytes, in) : 0;
    if (out) {
        fwrite(bytes, 1, got, out);
        fclose(out);
    }
    if (in)
        fclose(in);
}

/* --- issue 46: the CLI's formats, prefixes, printing, repeated options, option tables -------- */

/* Writes float32 tensors (names[i], shapes[i] of ndims[i] dims, values[i]) as a safetensors
 * file. */
static void write_safetensors_f32(const char *path, size_t count, const char *const *names,
                                  const int *ndims, const size_t (*shapes)[4],
                                  const float *const *values)
{
    char header[2048];
    size_t used = (size_t)snprintf(header, sizeof header, "{"), offset = 0;
    for (size_t t = 0; t < count; ++t) {
        size_t elems = 1;
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [", t ? ", " : "",
                                 names[t]);
        for (int i = 0; i < ndims[t]; ++i) {
            elems *= shapes[t][i];
            used += (size_t)snprintf(header + used, sizeof header - used, "%s%zu", i ? ", " : "",
                                     shapes[t][i]);
        }
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 "], \"data_offsets\": [%zu, %zu]}", offset, offset + 4 * elems);
        offset += 4 * elems;
    }
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    FILE *f = fopen(path, "wb");
    tu_expect(f != NULL, "cannot write %s", path);
    if (f == NULL)
        return;
    unsigned char length[8];
    for (int i = 0; i < 8; ++i)
        length[i] = (unsigned char)((uint64_t)used >> (8 * i));
    fwrite(length, 1, 8, f);
    fwrite(header, 1, used, f);
    for (size_t t = 0; t < count; ++t) {
        size_t elems = 1;
        for (int i = 0; i < ndims[t]; ++i)
            elems *= shapes[t][i];
        fwrite(values[t], sizeof(float), elems, f);
    }
    fclose(f);
}

/* Whether two .npy files hold the same shape and the same values, bit for bit. */
static bool same_npy(const char *a_path, const char *b_path)
{
    char msg[512];
    clattn_array a = {0}, b = {0};
    bool same = clattn_npy_read(a_path, &a, msg, sizeof msg) == CLATTN_IO_OK &&
                clattn_npy_read(b_path, &b, msg, sizeof msg) == CLATTN_IO_OK && a.ndim == b.ndim &&
                a.count == b.count && a.count > 0 &&
                memcmp(a.shape, b.shape, sizeof a.shape) == 0 &&
                memcmp(a.data, b.data, a.count * sizeof(float)) == 0;
    clattn_array_free(&a);
    clattn_array_free(&b);
    return same;
}

/* Runs args (printf'd with the fixtures and the scratch folder) and expects exit 2 with one
 * line on stderr naming `needle`. */
static void expect_refused(const char *needle, const char *format, ...)
{
    char args[3000];
    va_list list;
    va_start(list, format);
    vsnprintf(args, sizeof args, format, list);
    va_end(list);
    const int status = run_cli(args);
    const char *err = captured("stderr");
    tu_expect(status == 2 && count_lines(err) == 1 && strstr(err, needle) != NULL,
              "clattn %s: status %d, want 2 and one line naming '%s': %s", args, status, needle,
              err);
}

/* `run --query x.safetensors` reads the file by its format: a one-tensor safetensors file (or
 * FILE:NAME of a file of several) gives the .npy's output bit for bit; --weights x.npy says
 * what the file is; a prefix without its final dot finds the block. */
START_TEST(test_run_reads_formats)
{
    TU_BEGIN_TEST();
    tu_set_case("run on safetensors inputs, --weights x.npy, --prefix without the dot");
    char msg[512], path[512], npy_out[512], st_out[512], one[512], two[512];
    snprintf(path, sizeof path, "%s/self_query.npy", fixtures);
    clattn_array query = {0};
    tu_expect(clattn_npy_read(path, &query, msg, sizeof msg) == CLATTN_IO_OK, "%s", msg);
    snprintf(one, sizeof one, "%s/query_one.safetensors", scratch);
    snprintf(two, sizeof two, "%s/query_two.safetensors", scratch);
    const size_t shapes[2][4] = {{query.shape[0], query.shape[1], query.shape[2]}, {3}};
    static const float other[3] = {1.0f, 2.0f, 3.0f};
    const char *const names[2] = {"query", "other"};
    const int ndims[2] = {3, 1};
    const float *const values[2] = {query.data, other};
    write_safetensors_f32(one, 1, names, ndims, shapes, values);
    write_safetensors_f32(two, 2, names, ndims, shapes, values);
    clattn_array_free(&query);

    snprintf(npy_out, sizeof npy_out, "%s/formats_npy.npy", scratch);
    snprintf(st_out, sizeof st_out, "%s/formats_st.npy", scratch);
    char args[4096];
    snprintf(args, sizeof args,
             "run --query %s/self_query.npy --weights %s/self.safetensors "
             "--heads 2 --causal --out %s",
             fixtures, fixtures, npy_out);
    int status = run_cli(args);
    tu_expect(status == 0, "%s: status %d: %s", args, status, captured("stderr"));
    const char *inputs[2] = {one, NULL};
    char named[600];
    snprintf(named, sizeof named, "%s:query", two);
    inputs[1] = named;
    for (int i = 0; i < 2; ++i) {
        remove(st_out);
        snprintf(args, sizeof args,
                 "run --query %s --weights %s/self.safetensors --heads 2 "
                 "--causal --out %s",
                 inputs[i], fixtures, st_out);
        status = run_cli(args);
        tu_expect(status == 0 && same_npy(npy_out, st_out),
                  "%s: status %d, output differs from the .npy query's: %s", args, status,
                  captured("stderr"));
    }
    expect_refused("name the one to read as",
                   "run --query %s --weights %s/self.safetensors "
                   "--heads 2",
                   two, fixtures);
    expect_refused("no tensor 'nope'",
                   "run --query %s:nope --weights %s/self.safetensors "
                   "--heads 2",
                   two, fixtures);
    expect_refused("self_query.npy: not a safetensors file (it is a .npy file)",
                   "run --query %1$s/self_query.npy --weights %1$s/self_query.npy --heads 2",
                   fixtures);
    expect_refused("garbage.npy: not a .npy file (bad magic); expected a .npy or a safetensors",
                   "run --query %2$s/garbage.npy --weights %1$s/self.safetensors --heads 2",
                   fixtures, scratch);
    expect_refused("not a safetensors file",
                   "run --query %1$s/self_query.npy --weights "
                   "%2$s/garbage.npy --heads 2",
                   fixtures, scratch);

    /* --prefix layers.0.self_attn (no dot) reads the block --prefix layers.0.self_attn. reads */
    for (int dot = 0; dot < 2; ++dot) {
        snprintf(args, sizeof args,
                 "run --query %s/self_query.npy --weights "
                 "%s/model_two.safetensors --prefix layers.0.self_attn%s --heads 2 --out %s",
                 fixtures, fixtures, dot ? "." : "", dot ? st_out : npy_out);
        status = run_cli(args);
        tu_expect(status == 0, "%s: status %d: %s", args, status, captured("stderr"));
    }
    tu_expect(same_npy(npy_out, st_out), "--prefix without the dot gave another output");
    TU_END_TEST();
}
END_TEST

/* `sdpa` prints its (B, H) blocks as Y[b,h]; --attn-png draws the weights (as --qk-out's mode
 * 3 holds them) and is refused where the weights are never formed. */
START_TEST(test_sdpa_blocks_and_png)
{
    TU_BEGIN_TEST();
    enum { B = 2, H = 4, L = 3, D = 2 };
    tu_set_case("sdpa Y[b,h] and --attn-png (B=%d, H=%d)", B, H);
    char msg[512], q[512], png[512], args[4096];
    snprintf(q, sizeof q, "%s/blocks_q.npy", scratch);
    snprintf(png, sizeof png, "%s/blocks.png", scratch);
    float *values = tu_random_floats(B * H * L * D);
    const size_t shape[4] = {B, H, L, D};
    tu_expect(clattn_npy_write(q, values, 4, shape, msg, sizeof msg) == CLATTN_IO_OK, "%s", msg);
    free(values);
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s", q, q, q);
    int status = run_cli(args);
    const char *out = captured("stdout");
    tu_expect(status == 0 && strstr(out, "Y[0,0]") && strstr(out, "Y[1,3]") &&
                  strstr(out, "Y[7]") == NULL,
              "%s: status %d, blocks not titled Y[b,h]: %s", args, status, out);

    remove(png);
    snprintf(args, sizeof args, "sdpa --q %s --k %s --v %s --causal --attn-png %s --png-scale log",
             q, q, q, png);
    status = run_cli(args);
    unsigned char signature[8] = {0};
    FILE *f = fopen(png, "rb");
    const size_t got = f ? fread(signature, 1, 8, f) : 0;
    if (f)
        fclose(f);
    tu_expect(status == 0 && got == 8 && png_sig_cmp(signature, 0, 8) == 0,
              "%s: status %d, no PNG written: %s", args, status, captured("stderr"));
    expect_refused("--path fused never forms the attention weights",
                   "sdpa --q %1$s --k %1$s --v %1$s --path fused --attn-png %2$s", q, png);
    expect_refused("--attn-png",
                   "sdpa --q %1$s --k %1$s --v %1$s --kv-dtype q8_0 "
                   "--attn-png %2$s",
                   q, png);
    TU_END_TEST();
}
END_TEST

/* An option given twice is refused, naming it, unless the table says it may repeat (bench's
 * --op adds up); a number beyond float32 says so. */
START_TEST(test_repeated_and_range)
{
    TU_BEGIN_TEST();
    tu_set_case("repeated options, --scale 1e40");
    static const char run_head[] =
        "run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 ";
    char format[512];
    snprintf(format, sizeof format, "%s--scale 1 --scale 2", run_head);
    expect_refused("--scale given twice", format, fixtures);
    snprintf(format, sizeof format, "%s--causal --causal", run_head);
    expect_refused("--causal given twice", format, fixtures);
    snprintf(format, sizeof format, "%s--heads 2", run_head);
    expect_refused("--heads given twice", format, fixtures);
    expect_refused("--q given twice", "sdpa --q a --q b --k c --v d");
    expect_refused("--x given twice", "rope --x a --x b");
    expect_refused("--device given twice", "devices --device cpu --device gpu");
    expect_refused("--runs given twice", "bench --runs 1 --runs 2");
    snprintf(format, sizeof format, "%s--scale 1e40", run_head);
    expect_refused("--scale: '1e40' is out of float32's range", format, fixtures);
    expect_refused("--softcap: '-1e39' is out of float32's range",
                   "sdpa --q a --k b --v c --softcap -1e39");
    expect_refused("--scale: '1e-60' is too small for float32", "sdpa --q a --k b --v c "
                                                                "--scale 1e-60");
    expect_refused("--scale: 'nan' is not a number", "sdpa --q a --k b --v c --scale nan");
    TU_END_TEST();
}
END_TEST

/* Whether text names the option as a word of a usage line ("[--q Q.npy]", " --q Q.npy"). */
static bool names_option(const char *text, const char *option)
{
    const size_t length = strlen(option);
    for (const char *at = strstr(text, option); at; at = strstr(at + 1, option)) {
        const char before = at == text ? ' ' : at[-1], after = at[length];
        if ((before == ' ' || before == '[') &&
            (after == ' ' || after == ']' || after == '\n' || after == '\0'))
            return true;
    }
    return false;
}

/* Every option in a command's table (the option list of --help, made from it) is in the
 * usage line and is accepted by the parser (never "unknown option"). */
START_TEST(test_option_tables)
{
    TU_BEGIN_TEST();
    static const char *const commands[] = {"devices",  "info",  "demo", "run", "sdpa",
                                           "additive", "bench", "rope", "tune"};
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; ++c) {
        char args[512];
        snprintf(args, sizeof args, "%s --help", commands[c]);
        tu_set_case("clattn %s", args);
        int status = run_cli(args);
        static char help[1 << 16];
        snprintf(help, sizeof help, "%s", captured("stdout"));
        char *usage_end = strstr(help, "\n\n");
        const char *list = strstr(help, "\noptions:\n");
        tu_expect(status == 0 && usage_end && list,
                  "%s: status %d, no usage line and option "
                  "list: %s",
                  args, status, help);
        if (!usage_end || !list)
            continue;
        *usage_end = '\0'; /* help now holds the usage line(s) alone */
        size_t options = 0;
        for (const char *line = list + 10; line[0] == ' '; line = strchr(line, '\n') + 1) {
            char name[64];
            if (sscanf(line, " %63s", name) != 1 || strncmp(name, "--", 2) != 0)
                break;
            ++options;
            tu_expect(names_option(help, name), "clattn %s: %s is not in the usage line: %s",
                      commands[c], name, help);
            /* `--x --x --zz`: a flag is given twice; an option with a value takes "--x" and
             * the parser stops at --zz, before any device work */
            char unknown[96];
            snprintf(args, sizeof args, "%s %s %s --zz", commands[c], name, name);
            snprintf(unknown, sizeof unknown, "unknown option '%s'", name);
            status = run_cli(args);
            const char *err = captured("stderr");
            tu_expect(status == 2 && strstr(err, unknown) == NULL,
                      "clattn %s: status %d (want 2, not unknown): %s", args, status, err);
            if (!strchr(line, '\n'))
                break;
        }
        tu_expect(options >= 1, "clattn %s --help lists no option", commands[c]);
    }
    /* Issue 46's omissions. */
    static const struct {
        const char *command, *option;
    } listed[] = {{"sdpa", "--kv-dtype"}, {"sdpa", "--attn-png"}, {"additive", "--png-scale"},
                  {"run", "--prefix"},    {"sdpa", "--dropout"},  {"bench", "--page-size"}};
    for (size_t i = 0; i < sizeof listed / sizeof listed[0]; ++i) {
        char args[128];
        snprintf(args, sizeof args, "%s --help", listed[i].command);
        run_cli(args);
        const char *out = captured("stdout"), *end = strstr(out, "\n\n");
        const char *at = strstr(out, listed[i].option);
        tu_expect(at && end && at < end, "clattn %s: usage line lacks %s", args, listed[i].option);
    }
    TU_END_TEST();
}
END_TEST

static void remove_scratch(void)
{
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", scratch);
    if (system(command) != 0)
        fprintf(stderr, "check_cli: could not remove %s\n", scratch);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: check_cli CLATTN_BINARY FIXTURE_DIR\n");
        return 1;
    }
    clattn_bin = argv[1];
    fixtures = argv[2];
    tu_suite_begin("check_cli"); /* exits 77 without an OpenCL device */
    if (mkdtemp(scratch) == NULL) {
        fprintf(stderr, "check_cli: mkdtemp failed\n");
        return 1;
    }
    write_broken_files();
    Suite *suite = suite_create("cli");
    TCase *tc = tu_tcase(suite, "clattn command", 600);
    tcase_add_loop_test(tc, test_run_matches_pytorch, 0,
                        (int)(sizeof torch_cases / sizeof torch_cases[0]));
    tcase_add_test(tc, test_run_textbook_and_png);
    tcase_add_test(tc, test_run_kv_heads);
    tcase_add_test(tc, test_run_score_rules);
    tcase_add_test(tc, test_sdpa_alibi);
    tcase_add_test(tc, test_sdpa_sinks);
    tcase_add_test(tc, test_sdpa_kv_dtype);
    tcase_add_test(tc, test_sdpa_paged);
    tcase_add_test(tc, test_sdpa_varlen);
    tcase_add_test(tc, test_run_posenc);
    tcase_add_test(tc, test_run_rope);
    tcase_add_test(tc, test_sdpa_command);
    tcase_add_test(tc, test_sdpa_cache_command);
    tcase_add_test(tc, test_sdpa_rope_command);
    tcase_add_loop_test(tc, test_sdpa_typed_outputs, 0,
                        (int)(sizeof typed_cases / sizeof typed_cases[0]));
    tcase_add_test(tc, test_demo_devices_help);
    tcase_add_test(tc, test_demo_dot);
    tcase_add_test(tc, test_demo_multihead);
    tcase_add_test(tc, test_demo_posenc);
    tcase_add_test(tc, test_demo_rope);
    tcase_add_test(tc, test_demo_additive);
    tcase_add_test(tc, test_demo_all);
    tcase_add_test(tc, test_bench_json);
    tcase_add_test(tc, test_bench_json_timer);
    tcase_add_loop_test(tc, test_bad_input_exits_2, 0,
                        (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_loop_test(tc, test_run_relu_auto_matches_reference, 0,
                        (int)(sizeof reference_cases / sizeof reference_cases[0]));
    tcase_add_test(tc, test_run_option_equals_syntax);
    tcase_add_loop_test(tc, test_bad_equals_exits_2, 0,
                        (int)(sizeof bad_equals_cases / sizeof bad_equals_cases[0]));
    tcase_add_loop_test(tc, test_bench_op_lists, 0,
                        (int)(sizeof bench_list_cases / sizeof bench_list_cases[0]));
    tcase_add_test(tc, test_bench_dtype);
    tcase_add_test(tc, test_bench_masks);
    tcase_add_test(tc, test_bench_table);
    tcase_add_test(tc, test_bench_refused);
    tcase_add_test(tc, test_no_platform_or_device);
    tcase_add_test(tc, test_tune_hint);
    tcase_add_test(tc, test_pocl_affinity);
    tcase_add_test(tc, test_mask_true);
    tcase_add_test(tc, test_additive_heads_hint);
    tcase_add_test(tc, test_help_ends_with_exit_status);
    tcase_add_test(tc, test_run_model_files);
    tcase_add_test(tc, test_causal_heatmap_pixels);
    tcase_add_test(tc, test_run_reads_formats);
    tcase_add_test(tc, test_sdpa_blocks_and_png);
    tcase_add_test(tc, test_repeated_and_range);
    tcase_add_test(tc, test_option_tables);
    int result = tu_run_suite(suite);
    remove_scratch();
    return result;
}
