/* Option parsing, messages and helpers shared by the clattn sub-commands. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_fail(const char *command, int code, const char *fmt, ...)
{
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    /* One line: a multi-line message (a build log) keeps only its first line here. */
    char *newline = strchr(message, '\n');
    if (newline)
        *newline = '\0';
    fprintf(stderr, "clattn %s: %s\n", command, message);
    return code;
}

bool cli_next(cli_args *args)
{
    if (args->index >= args->argc)
        return false;
    static char name[128];
    const char *arg = args->argv[args->index++];
    const char *equals = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    if (equals && (size_t)(equals - arg) < sizeof name) {
        memcpy(name, arg, (size_t)(equals - arg));
        name[equals - arg] = '\0';
        args->name = name;
        args->inline_value = equals + 1;
    } else {
        args->name = arg;
        args->inline_value = NULL;
    }
    return true;
}

bool cli_is(const cli_args *args, const char *option)
{
    return strcmp(args->name, option) == 0;
}

int cli_flag(const cli_args *args, const char *option)
{
    if (!cli_is(args, option))
        return 0;
    if (args->inline_value) {
        cli_fail(args->command, CLI_BAD_INPUT, "%s takes no value (got '%s=%s')", option, option,
                 args->inline_value);
        return -1;
    }
    return 1;
}

const char *cli_value(cli_args *args)
{
    if (args->inline_value)
        return args->inline_value;
    if (args->index >= args->argc) {
        cli_fail(args->command, CLI_BAD_INPUT, "%s needs a value (see --help)", args->name);
        return NULL;
    }
    return args->argv[args->index++];
}

/* FILE:NAME, when path is not a file but FILE is: FILE into file, NAME returned; else NULL. */
static const char *tensor_name(const char *path, char *file, size_t size)
{
    struct stat st;
    const char *colon = strrchr(path, ':');
    if (stat(path, &st) == 0 || colon == NULL || strchr(colon, '/') != NULL ||
        (size_t)(colon - path) >= size)
        return NULL;
    snprintf(file, size, "%.*s", (int)(colon - path), path);
    return stat(file, &st) == 0 ? colon + 1 : NULL;
}

/* "a, b, c and 4 more": the names of the file's tensors. */
static void tensor_list(const clattn_safetensors *file, char *text, size_t size)
{
    const size_t count = clattn_safetensors_count(file);
    size_t used = 0, i = 0;
    text[0] = '\0';
    for (; i < count && i < 6 && used < size; ++i)
        used += (size_t)snprintf(text + used, size - used, "%s'%s'", i ? ", " : "",
                                 clattn_safetensors_name(file, i));
    if (i < count && used < size)
        snprintf(text + used, size - used, " and %zu more", count - i);
}

static int read_safetensors_array(const char *command, const char *file, const char *name,
                                  clattn_array *out)
{
    char msg[1024], names[600];
    clattn_safetensors *st = NULL;
    if (clattn_safetensors_open(file, &st, msg, sizeof msg) != CLATTN_IO_OK)
        return cli_fail(command, CLI_BAD_INPUT, "%s", msg);
    int rc = CLI_OK;
    const size_t count = clattn_safetensors_count(st);
    tensor_list(st, names, sizeof names);
    if (name == NULL && count != 1)
        rc = cli_fail(command, CLI_BAD_INPUT,
                      "%s: a safetensors file of %zu tensors%s%s: name the one to read as "
                      "%s:NAME",
                      file, count, count ? " " : "", names, file);
    else if (name && !clattn_safetensors_has(st, name))
        rc = cli_fail(command, CLI_BAD_INPUT, "%s: no tensor '%s' (it holds %s)", file, name,
                      count ? names : "none");
    else if (clattn_safetensors_read(st, name ? name : clattn_safetensors_name(st, 0), out, msg,
                                     sizeof msg) != CLATTN_IO_OK)
        rc = cli_fail(command, CLI_BAD_INPUT, "%s", msg);
    clattn_safetensors_close(st);
    return rc;
}

int cli_read_array(const char *command, const char *path, clattn_array *out)
{
    char msg[1024], file[4096];
    const char *name = tensor_name(path, file, sizeof file);
    if (name)
        return read_safetensors_array(command, file, name, out);
    if (clattn_npy_read(path, out, msg, sizeof msg) == CLATTN_IO_OK)
        return CLI_OK;
    if (strstr(msg, "(it is a safetensors file)") == NULL)
        return cli_fail(command, CLI_BAD_INPUT, "%s%s", msg,
                        strstr(msg, "not a .npy file") ? "; expected a .npy or a safetensors file"
                                                       : "");
    return read_safetensors_array(command, path, NULL, out);
}

bool cli_parse_size(const char *command, const char *option, const char *text, size_t min,
                    size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (text[0] == '-' || text[0] == '\0' || *end != '\0' || errno == ERANGE || value > SIZE_MAX ||
        value < min) {
        cli_fail(command, CLI_BAD_INPUT, "%s: '%s' is not a whole number >= %zu", option, text,
                 min);
        return false;
    }
    *out = (size_t)value;
    return true;
}

bool cli_parse_float(const char *command, const char *option, const char *text, float *out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (text[0] == '\0' || *end != '\0' || isnan(value)) {
        cli_fail(command, CLI_BAD_INPUT, "%s: '%s' is not a number", option, text);
        return false;
    }
    /* The values are float32: say so when the number is beyond its range (not "infinite"). */
    if (isinf(value) || fabs(value) > FLT_MAX) {
        cli_fail(command, CLI_BAD_INPUT, "%s: '%s' is %s float32's range (largest %g)", option,
                 text, isinf(value) && errno != ERANGE ? "infinite, outside" : "out of",
                 (double)FLT_MAX);
        return false;
    }
    if (value != 0.0 && fabs(value) < FLT_TRUE_MIN) {
        cli_fail(command, CLI_BAD_INPUT, "%s: '%s' is too small for float32 (it would be 0)",
                 option, text);
        return false;
    }
    *out = (float)value;
    return true;
}

bool cli_parse_probability(const char *command, const char *option, const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    const double value = strtod(text, &end);
    if (text[0] == '\0' || *end != '\0' || errno == ERANGE || !(value >= 0.0 && value <= 1.0)) {
        cli_fail(command, CLI_BAD_INPUT, "%s: '%s' is not a probability (a number from 0 to 1)",
                 option, text);
        return false;
    }
    *out = value;
    return true;
}

bool cli_parse_u64(const char *command, const char *option, const char *text,
                   unsigned long long *out)
{
    bool digits = text[0] != '\0';
    for (const char *c = text; digits && *c; ++c)
        digits = *c >= '0' && *c <= '9';
    char *end = NULL;
    errno = 0;
    const unsigned long long value = digits ? strtoull(text, &end, 10) : 0;
    if (!digits || *end != '\0' || errno == ERANGE) {
        cli_fail(command, CLI_BAD_INPUT,
                 "%s: '%s' is not a whole number from 0 to 18446744073709551615 (2^64 - 1)", option,
                 text);
        return false;
    }
    *out = value;
    return true;
}

bool cli_parse_window(const char *command, const char *text, long long *left, long long *right)
{
    char *end = NULL;
    errno = 0;
    const long long first = strtoll(text, &end, 10);
    const bool comma = end != text && *end == ',';
    const char *second_text = comma ? end + 1 : end;
    const long long second = comma ? strtoll(second_text, &end, 10) : 0;
    if (!comma || end == second_text || *end != '\0' || errno != 0 || first < -1 || second < -1) {
        cli_fail(command, CLI_BAD_INPUT,
                 "--window: '%s' is not LEFT,RIGHT (sizes >= 0, or -1 for unbounded)", text);
        return false;
    }
    *left = first;
    *right = second;
    return true;
}

bool cli_parse_size_list(const char *command, const char *option, const char *text, size_t *out,
                         size_t max_count, size_t *count)
{
    char buffer[512];
    if (strlen(text) >= sizeof buffer) {
        cli_fail(command, CLI_BAD_INPUT, "%s: list too long", option);
        return false;
    }
    snprintf(buffer, sizeof buffer, "%s", text);
    *count = 0;
    char *save = NULL;
    for (char *item = strtok_r(buffer, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (*count == max_count) {
            cli_fail(command, CLI_BAD_INPUT, "%s: at most %zu values", option, max_count);
            return false;
        }
        if (!cli_parse_size(command, option, item, 1, &out[*count]))
            return false;
        ++*count;
    }
    if (*count == 0) {
        cli_fail(command, CLI_BAD_INPUT, "%s: empty list", option);
        return false;
    }
    return true;
}

bool cli_check_rope(const char *command, const cli_rope *rope)
{
    if (rope->option && !rope->on) {
        cli_fail(command, CLI_BAD_INPUT,
                 "--rope-style, --rope-dims, --rope-base and --rope-start go with --rope");
        return false;
    }
    return true;
}

static int context_exit = CLI_FAILED;

int cli_context_exit(void)
{
    return context_exit;
}

/* "P:D" naming a platform or device index beyond what exists, where something exists: a bad
 * option. (No platform, or a platform with no device, is a missing device instead.) */
static bool index_beyond(const char *spec)
{
    unsigned p = 0, d = 0;
    char end = '\0';
    if (!spec || sscanf(spec, "%u:%u%c", &p, &d, &end) != 2 || strchr(spec, '-'))
        return false;
    cl_uint platforms = 0, devices = 0;
    if (clGetPlatformIDs(0, NULL, &platforms) != CL_SUCCESS || platforms == 0)
        return false;
    if (p >= platforms)
        return true;
    cl_platform_id *ids = calloc(platforms, sizeof *ids);
    if (ids == NULL || clGetPlatformIDs(platforms, ids, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(ids[p], CL_DEVICE_TYPE_ALL, 0, NULL, &devices) != CL_SUCCESS)
        devices = 0;
    free(ids);
    return devices > 0 && d >= devices;
}

bool cli_cache_file(const char *name, char *path, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = -1;
    if (xdg && xdg[0] == '/')
        n = snprintf(path, size, "%s/clattn/%s", xdg, name);
    else if (home && home[0])
        n = snprintf(path, size, "%s/.cache/clattn/%s", home, name);
    return n > 0 && (size_t)n < size;
}

/* The text of a line of clattn_ctx_tuning's report ("ignored: ", ...) into out; "" if none. */
static void tuning_line(const char *tuning, const char *label, char *out, size_t size)
{
    const size_t length = strlen(label);
    const char *at = tuning;
    while (at && strncmp(at, label, length) != 0)
        at = (at = strchr(at, '\n')) ? at + 1 : NULL;
    if (at)
        snprintf(out, size, "%.*s", (int)strcspn(at + length, "\n"), at + length);
    else if (size)
        out[0] = '\0';
}

/* Once per device (the names noted in the cache folder's tune-hinted), when no row of the
 * tuning cache applied to it and no CLATTN_TUNING file is in use: one line on stderr saying
 * that the parameters are the class defaults and that `clattn tune` measures better ones.
 * Where the cache has rows of the device tuned on another driver or clattn version (the
 * report's ignored line says so), once per driver key instead (noted the same way): they are
 * not applied, and `clattn tune` re-tunes. CLATTN_NO_TUNE_HINT=1 silences both (the test
 * suites set it). */
static void tune_hint(clattn_ctx *ctx)
{
    static bool shown;
    const char *off = getenv("CLATTN_NO_TUNE_HINT"), *file = getenv("CLATTN_TUNING");
    if (shown || (off && off[0] && strcmp(off, "0") != 0) || (file && file[0]))
        return;
    const char *tuning = clattn_ctx_tuning(ctx);
    char rows[1024], ignored[2048], key[1024];
    tuning_line(tuning, "rows: ", rows, sizeof rows);
    tuning_line(tuning, "ignored: ", ignored, sizeof ignored);
    tuning_line(tuning, "driver key: ", key, sizeof key);
    const bool stale = strstr(ignored, "tuned on another driver") != NULL && key[0];
    if (!stale && strstr(rows, "cache line") != NULL)
        return; /* a row of the tuning cache applied */
    char name[256] = "";
    if (clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_NAME, sizeof name - 1, name, NULL) !=
        CL_SUCCESS)
        return;
    const char *noted_as = stale ? key : name;
    char path[1024], line[1100];
    const bool have_path = cli_cache_file("tune-hinted", path, sizeof path);
    FILE *f = have_path ? fopen(path, "r") : NULL;
    bool noted = false;
    while (f && !noted && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        noted = strcmp(line, noted_as) == 0;
    }
    if (f)
        fclose(f);
    shown = true;
    if (noted)
        return;
    if (stale)
        fprintf(stderr,
                "clattn: the tuning cache's rows for '%s' were tuned on another driver or clattn "
                "version and are not applied (`clattn info` lists them): `clattn tune` re-tunes "
                "this one in a few minutes (this note comes once per driver)\n",
                name);
    else
        fprintf(stderr,
                "clattn: no tuned parameters for '%s' (the defaults of its device class): "
                "`clattn tune` measures its best ones in a few minutes (this note comes once "
                "per device)\n",
                name);
    if (have_path && cli_make_dirs(path) == 0 && (f = fopen(path, "a")) != NULL) {
        fprintf(f, "%s\n", noted_as);
        fclose(f);
    }
}

int cli_make_dirs(const char *path)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return -1;
        *slash = '/';
    }
    return 0;
}

void cli_release_context(clattn_ctx *ctx)
{
    if (ctx == NULL)
        return;
    const size_t total = clattn_ctx_validations(ctx, NULL, 0);
    clattn_validation *log = total ? calloc(total, sizeof *log) : NULL;
    size_t failed = 0, first = 0;
    if (log) {
        clattn_ctx_validations(ctx, log, total);
        for (size_t i = 0; i < total; ++i)
            if (log[i].result == CLATTN_CHECK_FAILED && failed++ == 0)
                first = i;
    }
    if (failed)
        fprintf(stderr,
                "clattn: %zu kernel variant%s failed validation on this device and %s not used "
                "(%s: %s); the results come from another variant (`clattn doctor` checks them "
                "all)\n",
                failed, failed == 1 ? "" : "s", failed == 1 ? "was" : "were", log[first].variant,
                log[first].detail);
    free(log);
    clattn_ctx_release(ctx);
}

clattn_ctx *cli_context(const char *command, const char *device)
{
    clattn_ctx *ctx = NULL;
    char message[1024];
    clattn_status status = clattn_ctx_create(device, &ctx, message, sizeof message);
    if (status == CLATTN_SUCCESS) {
        tune_hint(ctx);
        return ctx;
    }
    cli_context_failure(command, device, status, message);
    return NULL;
}

int cli_context_failure(const char *command, const char *device, clattn_status status,
                        const char *message)
{
    /* The exit code follows docs/cli.md's contract: a device spec that is malformed or names an
     * index that does not exist, a bad CLATTN_TUNING file and an unknown CLATTN_PARAMS are
     * bad input (2), each named as what it is; a device that is absent or fails is 1. */
    const char *spec = device ? device : getenv("CLATTN_DEVICE");
    if (status == CLATTN_ERR_INVALID_ARGUMENT) {
        context_exit = CLI_BAD_INPUT;
        const bool tuning = strstr(message, "CLATTN_TUNING") || strstr(message, "tuning file");
        const bool params = strstr(message, "CLATTN_PARAMS") != NULL;
        cli_fail(command, CLI_BAD_INPUT, "%s: %s",
                 tuning   ? "bad tuning file"
                 : params ? "bad CLATTN_PARAMS"
                 : device ? "bad --device"
                          : "bad CLATTN_DEVICE",
                 message);
    } else if (status == CLATTN_ERR_NO_DEVICE && index_beyond(spec)) {
        context_exit = CLI_BAD_INPUT;
        cli_fail(command, CLI_BAD_INPUT, "%s: %s (see clattn devices)",
                 device ? "bad --device" : "bad CLATTN_DEVICE", message);
    } else {
        context_exit = CLI_FAILED;
        cli_fail(command, CLI_FAILED, "no device: %s: %s", clattn_status_string(status), message);
    }
    return context_exit;
}

bool cli_check_output(const char *command, const char *option, const char *path)
{
    return cli_check_output_ex(command, option, path, false);
}

bool cli_check_output_ex(const char *command, const char *option, const char *path,
                         bool makes_folders)
{
    if (path == NULL)
        return true;
    struct stat st;
    if (path[0] == '\0') {
        cli_fail(command, CLI_BAD_INPUT, "%s: empty path", option);
        return false;
    }
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            cli_fail(command, CLI_BAD_INPUT, "%s: '%s' is a folder, not a file", option, path);
            return false;
        }
        if (access(path, W_OK) != 0) {
            cli_fail(command, CLI_BAD_INPUT, "%s: cannot write '%s': %s", option, path,
                     strerror(errno));
            return false;
        }
        return true;
    }
    /* A new file: its folder must exist and be writable (nothing is created before the run
     * succeeds, so a failed run leaves no empty file behind). */
    char folder[4096];
    snprintf(folder, sizeof folder, "%s", path);
    for (;;) {
        char *slash = strrchr(folder, '/');
        if (slash == NULL)
            snprintf(folder, sizeof folder, ".");
        else if (slash == folder)
            folder[1] = '\0';
        else
            *slash = '\0';
        /* A command that makes the missing folders (tune --out) needs the nearest existing
         * one to be a writable folder. */
        if (!makes_folders || stat(folder, &st) == 0 || strcmp(folder, ".") == 0 ||
            strcmp(folder, "/") == 0)
            break;
    }
    if (stat(folder, &st) == 0 && !S_ISDIR(st.st_mode)) {
        cli_fail(command, CLI_BAD_INPUT, "%s: cannot write '%s': '%s' is not a folder", option,
                 path, folder);
        return false;
    }
    if (stat(folder, &st) != 0) {
        cli_fail(command, CLI_BAD_INPUT, "%s: cannot write '%s': the folder '%s' does not exist",
                 option, path, folder);
        return false;
    }
    if (access(folder, W_OK | X_OK) != 0) {
        cli_fail(command, CLI_BAD_INPUT, "%s: cannot write '%s': folder '%s': %s", option, path,
                 folder, strerror(errno));
        return false;
    }
    return true;
}

int cli_parse_mask_true(const char *command, const char *text, bool *true_is_masked)
{
    if (strcmp(text, "attend") == 0)
        *true_is_masked = false;
    else if (strcmp(text, "masked") == 0)
        *true_is_masked = true;
    else
        return cli_fail(command, CLI_BAD_INPUT, "--mask-true: '%s' is not attend or masked",
                        text);
    return CLI_OK;
}

void cli_note_mask_convention(const char *command, const char *option, bool true_is_masked,
                              bool given)
{
    if (given)
        return;
    fprintf(stderr,
            "clattn %s: note: bool %s read as True = %s (%s); --mask-true attend|masked "
            "chooses\n",
            command, option, true_is_masked ? "masked" : "attend",
            true_is_masked ? "PyTorch's nn.MultiheadAttention" : "ONNX and torch's SDPA");
}

void cli_print_device(FILE *out, cl_device_id device)
{
    char name[256] = "";
    cl_device_type type = 0;
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    fprintf(out, "device: %s (%s)\n", name,
            (type & CL_DEVICE_TYPE_GPU)   ? "GPU"
            : (type & CL_DEVICE_TYPE_CPU) ? "CPU"
                                          : "accelerator");
}

void cli_print_matrix(const char *title, const float *values, size_t rows, size_t cols)
{
    printf("%s\n", title);
    for (size_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < cols; ++c)
            printf(" %10.6f", values[r * cols + c]);
        printf("\n");
    }
    printf("\n");
}

int cli_write_attention_png(const char *command, const char *path, const float *weights,
                            const cli_png_masks *m, clattn_heatmap_scale scale)
{
    const size_t cells = m->rows * m->cols; /* fits: the weights were allocated */
    const size_t panels = m->per_head_mask ? m->heads : 1;
    unsigned char *masked = calloc(panels * cells, 1);
    if (masked == NULL)
        return cli_fail(command, CLI_FAILED, "out of memory for the heatmap");
    bool any = false;
    for (size_t p = 0; p < panels; ++p)
        for (size_t i = 0; i < m->rows; ++i)
            for (size_t j = 0; j < m->cols; ++j) {
                const long long d = (long long)j - (long long)i;
                bool out = (m->causal && d > 0) ||
                           (m->window && m->window_left >= 0 && d < -m->window_left) ||
                           (m->window && m->window_right >= 0 && d > m->window_right) ||
                           (m->padding && m->padding[j]) ||
                           (m->additive && m->additive[p * cells + i * m->cols + j] == -INFINITY);
                masked[p * cells + i * m->cols + j] = out;
                any = any || out;
            }
    const clattn_heatmap_options options = {.scale = scale,
                                            .masked = any ? masked : NULL,
                                            .masked_per_panel = m->per_head_mask};
    char msg[1024];
    const clattn_io_status status = clattn_png_write_heatmap_ex(path, weights, m->heads, m->rows,
                                                                m->cols, &options, msg, sizeof msg);
    free(masked);
    return status == CLATTN_IO_OK ? CLI_OK : cli_fail(command, CLI_FAILED, "%s", msg);
}

void cli_release_buffers(cl_mem *mems, size_t count)
{
    for (size_t i = 0; i < count; ++i)
        if (mems[i]) {
            clReleaseMemObject(mems[i]);
            mems[i] = NULL;
        }
}

int cli_call_failure(const char *command, clattn_ctx *ctx, clattn_status status,
                     bool sizes_are_input, cl_int err)
{
    if (status == CLATTN_SUCCESS)
        return err == CL_SUCCESS ? CLI_OK
                                 : cli_fail(command, CLI_FAILED, "OpenCL error %d", (int)err);
    const bool input_error =
        status == CLATTN_ERR_INVALID_ARGUMENT || status == CLATTN_ERR_INVALID_SHAPE ||
        (sizes_are_input && (status == CLATTN_ERR_OVERFLOW || status == CLATTN_ERR_TOO_LARGE));
    return cli_fail(command, input_error ? CLI_BAD_INPUT : CLI_FAILED, "%s: %s",
                    clattn_status_string(status), clattn_last_error(ctx));
}

void cli_free_all(clattn_array *const arrays[], size_t num_arrays, void *const blocks[],
                  size_t num_blocks)
{
    for (size_t i = 0; i < num_arrays; ++i)
        clattn_array_free(arrays[i]);
    for (size_t i = 0; i < num_blocks; ++i)
        free(blocks[i]);
}
