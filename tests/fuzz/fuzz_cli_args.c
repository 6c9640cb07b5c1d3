/*
 * libFuzzer target: `clattn run`'s option parsing, file loading and shape validation
 * (cmd_run_check, which stops before any OpenCL device work), and `clattn sdpa`'s
 * (cmd_sdpa_check, the same) when the first token is `sdpa`: a paged KV cache's block table
 * and counts included.
 *
 * The input is a list of argument tokens separated by '\n' or NUL bytes (at most MAX_TOKENS,
 * each cut to MAX_TOKEN_BYTES; one trailing separator ends the list). A token `@name`, or the
 * value of `--option=@name`, becomes the absolute path of a fixture file (table below), so
 * that the fuzzer reaches the shape checks with real, mutually compatible files. A token
 * `%R,C:v,v,...` (or `%R:...`), or such an option value, becomes an int64 .npy of shape (R, C)
 * (or (R,)) holding the values (missing ones 0; at most 64 values; R, C from 0 to 64) written to
 * a scratch file: a block table or counts of any content. argv[0] is "run", or "sdpa" (that
 * first token then dropped). Each token is its own exact-size allocation, so a read past one
 * is caught.
 *
 * Findings: any crash, sanitizer report or leak, and an exit code other than 0 (ok, --help)
 * or 2 (bad input): 1 means the device or the library failed, and no device is used here.
 *
 * The fixture paths are relative to the source tree: $CLATTN_FUZZ_FIXTURES, else
 * CLATTN_SOURCE_DIR (compiled in by tests/fuzz/CMakeLists.txt).
 * cli_fail's messages (one line per input on stderr) would drown libFuzzer's log, so
 * LLVMFuzzerInitialize adds -close_fd_mask=3 to the options: libFuzzer keeps its own copy of
 * stderr for its log and the sanitizer reports, and gives the code under test /dev/null.
 * Set CLATTN_FUZZ_VERBOSE=1 to see the messages (e.g. when replaying one input).
 *
 *     fuzz_cli_args [libFuzzer options] CORPUS_DIR...      (see tests/fuzz/run.sh)
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, dup, fdopen */

#include "cli.h"
#include "fuzz_common.h"

#ifndef CLATTN_SOURCE_DIR
#define CLATTN_SOURCE_DIR "."
#endif

#define MAX_TOKENS 24
#define MAX_TOKEN_BYTES 200

/* `@name` -> a file of the source tree, or an absolute path that does not exist. */
static const struct fixture {
    const char *token;
    const char *file;
} fixtures[] = {
    {"@self_query", "tests/fixtures/cli/self_query.npy"},             /* (2, 5, 8) f4 */
    {"@self", "tests/fixtures/cli/self.safetensors"},                 /* packed in_proj, E = 8 */
    {"@self_kpm", "tests/fixtures/cli/self_kpm.npy"},                 /* (2, 5) b1 */
    {"@self_mask", "tests/fixtures/cli/self_mask.npy"},               /* (5, 5) b1 */
    {"@cross_query", "tests/fixtures/cli/cross_query.npy"},           /* (4, 6) f4 */
    {"@cross_key", "tests/fixtures/cli/cross_key.npy"},               /* (7, 5) f4 */
    {"@cross_value", "tests/fixtures/cli/cross_value.npy"},           /* (7, 3) f8 */
    {"@cross", "tests/fixtures/cli/cross.safetensors"},               /* q/k/v_proj_weight, E = 6 */
    {"@half", "tests/fixtures/cli/half.safetensors"},                 /* F16, E = 8 */
    {"@bfloat", "tests/fixtures/cli/bfloat.safetensors"},             /* BF16, E = 8 */
    {"@causal_query", "tests/fixtures/cli/causal_query.npy"},         /* (1, 6, 8) f4 */
    {"@causal_attn", "tests/fixtures/cli/causal_attn.npy"},           /* (1, 4, 6, 6) f4 */
    {"@textbook_x", "tests/fixtures/cli/textbook_x.npy"},             /* (3, 4) f4 */
    {"@textbook_wq", "tests/fixtures/cli/textbook_wq.npy"},           /* (4, 4) f4 */
    {"@textbook_wk", "tests/fixtures/cli/textbook_wk.npy"},           /* (4, 4) f4 */
    {"@textbook_wv", "tests/fixtures/cli/textbook_wv.npy"},           /* (4, 4) f4 */
    {"@textbook_weights", "tests/fixtures/cli/textbook_weights.npy"}, /* (1, 3, 3) f4 */
    {"@io_scalar", "tests/io/np_scalar.npy"},                         /* () f4 */
    {"@io_empty", "tests/io/np_empty.npy"},                           /* (0, 3) f4 */
    {"@io_u1", "tests/io/np_u1.npy"},                                 /* (3,) u1 */
    {"@io_f8", "tests/io/np_f8_v2.npy"},                              /* (2, 3) f8, format 2.0 */
    {"@io_mixed", "tests/io/st_mixed.safetensors"},                   /* no attention weights */
    {"@zero_width", "tests/fuzz/corpus/npy/zero_width.npy"},          /* (4, 0) f4 */
    {"@zero_vdim", "tests/fuzz/corpus/safetensors/cli_zero_vdim.safetensors"}, /* v (4, 0) */
    {"@dir", "tests/fixtures/cli"},                                            /* a directory */
    {"@paged_q", "tests/fixtures/cli/paged_q.npy"},                            /* (2, 4, 3, 8) */
    {"@paged_kp", "tests/fixtures/cli/paged_kp.npy"},                          /* (6, 4, 2, 8) */
    {"@paged_vp", "tests/fixtures/cli/paged_vp.npy"},                          /* (6, 4, 2, 8) */
    {"@missing", "/tmp/clattn-fuzz-no-such-dir/query.npy"},
    {"@missing_st", "/tmp/clattn-fuzz-no-such-dir/weights.safetensors"},
};

#define FIXTURE_COUNT (sizeof fixtures / sizeof fixtures[0])

static char fixture_paths[FIXTURE_COUNT][FUZZ_PATH_MAX];

/* libFuzzer's options plus -close_fd_mask=3, which must come first so the user's win. */
static void add_close_fd_mask(int *argc, char ***argv)
{
    static char quiet[] = "-close_fd_mask=3";
    static char **with_quiet;
    with_quiet = malloc(((size_t)*argc + 2) * sizeof *with_quiet);
    if (with_quiet == NULL)
        return;
    with_quiet[0] = (*argv)[0];
    with_quiet[1] = quiet;
    for (int i = 1; i < *argc; ++i)
        with_quiet[i + 1] = (*argv)[i];
    with_quiet[*argc + 1] = NULL;
    *argc += 1;
    *argv = with_quiet;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *root = getenv("CLATTN_FUZZ_FIXTURES");
    if (root == NULL || root[0] == '\0')
        root = CLATTN_SOURCE_DIR;
    for (size_t i = 0; i < FIXTURE_COUNT; ++i) {
        if (fixtures[i].file[0] == '/') {
            snprintf(fixture_paths[i], FUZZ_PATH_MAX, "%s", fixtures[i].file);
            continue;
        }
        snprintf(fixture_paths[i], FUZZ_PATH_MAX, "%s/%s", root, fixtures[i].file);
        if (access(fixture_paths[i], R_OK) != 0) {
            fprintf(stderr,
                    "fuzz_cli_args: no fixture %s (%s): set CLATTN_FUZZ_FIXTURES to "
                    "the root of the clattn source tree\n",
                    fixture_paths[i], strerror(errno));
            exit(1);
        }
    }
    /* fuzz_fail's messages must survive the closing of fd 2. */
    int log_fd = dup(2);
    fuzz_log = log_fd >= 0 ? fdopen(log_fd, "w") : NULL;
    const char *verbose = getenv("CLATTN_FUZZ_VERBOSE");
    if (verbose == NULL || verbose[0] == '\0' || strcmp(verbose, "0") == 0)
        add_close_fd_mask(argc, argv);
    return 0;
}

static const char *fixture_path(const char *token, size_t length)
{
    for (size_t i = 0; i < FIXTURE_COUNT; ++i) {
        if (strlen(fixtures[i].token) == length && memcmp(fixtures[i].token, token, length) == 0)
            return fixture_paths[i];
    }
    return NULL;
}

/* `%R,C:v,...` / `%R:v,...` (length bytes) as an int64 .npy in the scratch file of token
 * `slot`; its path, or NULL when the bytes are not of that form. */
static const char *int_array(const char *bytes, size_t length, int slot)
{
    static char paths[MAX_TOKENS + 1][FUZZ_PATH_MAX];
    char text[MAX_TOKEN_BYTES + 1];
    if (length < 2 || bytes[0] != '%' || length > MAX_TOKEN_BYTES)
        return NULL;
    memcpy(text, bytes + 1, length - 1);
    text[length - 1] = '\0';
    char *at = text, *end = NULL;
    const long rows = strtol(at, &end, 10);
    long cols = -1;
    if (end == at || rows < 0 || rows > 64)
        return NULL;
    if (*end == ',') {
        at = end + 1;
        cols = strtol(at, &end, 10);
        if (end == at || cols < 0 || cols > 64)
            return NULL;
    }
    if (*end != ':' || (cols >= 0 && rows * cols > 64))
        return NULL;
    long long values[64] = {0};
    const long count = cols >= 0 ? rows * cols : rows;
    at = end + 1;
    for (long i = 0; i < count && *at != '\0'; ++i) {
        values[i] = strtoll(at, &end, 10);
        if (end == at)
            break;
        at = *end == ',' ? end + 1 : end;
    }
    char name[32], header[128], shape[48];
    snprintf(name, sizeof name, "int_%d.npy", slot);
    if (paths[slot][0] == '\0') /* one scratch file per token position, made once */
        snprintf(paths[slot], FUZZ_PATH_MAX, "%s", fuzz_scratch_file(name));
    if (cols >= 0)
        snprintf(shape, sizeof shape, "(%ld, %ld)", rows, cols);
    else
        snprintf(shape, sizeof shape, "(%ld,)", rows);
    int n = snprintf(header, sizeof header,
                     "{'descr': '<i8', 'fortran_order': False, 'shape': %s, }", shape);
    while ((10 + n + 1) % 64 != 0)
        header[n++] = ' ';
    header[n++] = '\n';
    FILE *f = fopen(paths[slot], "wb");
    if (f == NULL)
        fuzz_fail("cannot write %s", paths[slot]);
    const unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                     (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
    fwrite(magic, 1, sizeof magic, f);
    fwrite(header, 1, (size_t)n, f);
    for (long i = 0; i < count; ++i) {
        unsigned char le[8];
        for (int b = 0; b < 8; ++b)
            le[b] = (unsigned char)((unsigned long long)values[i] >> (8 * b));
        fwrite(le, 1, 8, f);
    }
    fclose(f);
    return paths[slot];
}

/* A malloc'd token: the bytes as given, or with `@name` / `--option=@name` resolved (a
 * `%R,C:...` array written to the scratch file of token `slot`). */
static char *make_token(const char *bytes, size_t length, int slot)
{
    const char *path = fixture_path(bytes, length);
    if (path == NULL)
        path = int_array(bytes, length, slot);
    size_t prefix = 0; /* bytes kept before the path */
    if (path == NULL && length > 2 && memcmp(bytes, "--", 2) == 0) {
        const char *equals = memchr(bytes, '=', length);
        if (equals != NULL) {
            prefix = (size_t)(equals - bytes) + 1;
            path = fixture_path(bytes + prefix, length - prefix);
            if (path == NULL)
                path = int_array(bytes + prefix, length - prefix, slot);
        }
    }
    const size_t tail = path != NULL ? strlen(path) : length - prefix;
    char *token = malloc(prefix + tail + 1);
    if (token == NULL)
        fuzz_fail("out of memory for a %zu-byte token", prefix + tail + 1);
    memcpy(token, bytes, prefix);
    memcpy(token + prefix, path != NULL ? path : bytes + prefix, tail);
    token[prefix + tail] = '\0';
    return token;
}

/* Splits the input into argv[1..]; returns argc. */
static int split_tokens(const uint8_t *data, size_t size, char **argv)
{
    int argc = 1;
    size_t start = 0;
    while (start < size && argc < MAX_TOKENS + 1) {
        size_t end = start;
        while (end < size && data[end] != '\n' && data[end] != '\0')
            ++end;
        const size_t length = end - start < MAX_TOKEN_BYTES ? end - start : MAX_TOKEN_BYTES;
        argv[argc] = make_token((const char *)data + start, length, argc);
        ++argc;
        start = end + 1; /* past the separator; a trailing one starts no token */
    }
    argv[argc] = NULL;
    return argc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char run[] = "run", sdpa[] = "sdpa";
    char *argv[MAX_TOKENS + 2];
    argv[0] = run;
    const int argc = split_tokens(data, size, argv);
    const bool is_sdpa = argc > 1 && strcmp(argv[1], "sdpa") == 0;
    char *dropped = NULL;
    if (is_sdpa) { /* `sdpa` first: argv[1] is the command's name */
        dropped = argv[1];
        argv[1] = sdpa;
    }
    const int rc = is_sdpa ? cmd_sdpa_check(argc - 1, argv + 1) : cmd_run_check(argc, argv);
    if (rc != CLI_OK && rc != CLI_BAD_INPUT)
        fuzz_fail("%s returned %d (only 0 and 2 are possible without a device)",
                  is_sdpa ? "cmd_sdpa_check" : "cmd_run_check", rc);
    free(dropped);
    for (int i = is_sdpa ? 2 : 1; i < argc; ++i)
        free(argv[i]);
    fflush(stdout); /* --help: one flush per input, not a growing buffer */
    return 0;
}
