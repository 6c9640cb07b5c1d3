/*
 * check_cli: the clattn command run as a user runs it. `clattn run` on PyTorch-exported
 * weights and inputs (tests/fixtures/cli, made by gen_cli_fixtures.py) must reproduce
 * PyTorch's outputs and attention weights to 1e-4; the textbook example to 1e-5; demo,
 * devices, bench --json and --attn-png produce what they promise; and bad input of every kind
 * exits with status 2 and exactly one line on stderr.
 * Arguments: the clattn binary, the fixture folder.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clattn_io.h"
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

START_TEST(test_demo_devices_help)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn demo, devices, --help");
    int status = run_cli("demo");
    const char *out = captured("stdout");
    tu_expect(status == 0, "demo: exit status %d: %s", status, captured("stderr"));
    static const char *const expected[] = {"Q = X", "K = X", "V = X", "scores", "weights",
                                           "2.000000   6.000000   8.000000",
                                           "0.035119   0.259496   0.705385",
                                           "1.705385   1.929762   1.481007   1.705385"};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; ++i)
        tu_expect(strstr(out, expected[i]) != NULL, "demo output lacks '%s'", expected[i]);

    status = run_cli("devices");
    out = captured("stdout");
    tu_expect(status == 0 && strstr(out, "* 0:") != NULL && strstr(out, "CLATTN_DEVICE"),
              "devices: status %d, no default marked or no CLATTN_DEVICE explanation: %s", status,
              out);
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
                          "\"seq_k\": 17, \"head_dim\": 8") != NULL,
              "attention line lacks its sizes: %s", out);
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
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
    {"run --query %1$s/textbook_x.npy --weights %1$s/self.safetensors --heads 2",
     "embed_dim"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--attn-mask %1$s/textbook_z.npy", "textbook_z.npy"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--key-padding-mask %1$s/self_mask.npy", "self_mask.npy"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --norm max",
     "--norm"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --scale x",
     "--scale"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 0", "--heads"},
    {"run --query %1$s/self_query.npy --wq %1$s/textbook_wq.npy", "--wv"},
    {"run --query %1$s/cross_query.npy --weights %1$s/cross.safetensors --heads 3 "
     "--key %1$s/cross_value.npy --value %1$s/cross_value.npy", "kdim"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 "
     "--key %1$s/cross_key.npy", "same B"},
    {"run --query %1$s/self_attn.npy --weights %1$s/self.safetensors --heads 2", "(L, E)"},
    /* Zero-width weights (found by fuzz_cli_args): refused, not read as "default width". */
    {"run --query %1$s/textbook_x.npy --wq %1$s/../../fuzz/corpus/npy/zero_width.npy "
     "--wk %1$s/../../fuzz/corpus/npy/zero_width.npy "
     "--wv %1$s/../../fuzz/corpus/npy/zero_width.npy --heads 100000000", "no dimension may be 0"},
    {"run --query %1$s/textbook_x.npy --heads 2 "
     "--weights %1$s/../../fuzz/corpus/safetensors/cli_zero_vdim.safetensors",
     "no dimension may be 0"},
    {"bench --mnk 3x4", "--mnk"},
    {"bench --path sideways", "--path"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --path fused "
     "--attn-out %2$s/a.npy", "--path fused"},
    {"run --query %1$s/self_query.npy --weights %1$s/self.safetensors --heads 2 --path warp",
     "--path"},
    {"bench --runs 0", "--runs"},
    {"bench --op sort", "sort"},
    {"devices --bogus", "unknown option"},
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
    TCase *tc = tcase_create("clattn command");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_run_matches_pytorch, 0,
                        (int)(sizeof torch_cases / sizeof torch_cases[0]));
    tcase_add_test(tc, test_run_textbook_and_png);
    tcase_add_test(tc, test_demo_devices_help);
    tcase_add_test(tc, test_bench_json);
    tcase_add_loop_test(tc, test_bad_input_exits_2, 0,
                        (int)(sizeof bad_cases / sizeof bad_cases[0]));
    suite_add_tcase(suite, tc);
    int result = tu_run_suite(suite);
    remove_scratch();
    return result;
}
