/* Option parsing, messages and helpers shared by the clattn sub-commands. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (text[0] == '\0' || *end != '\0' || errno == ERANGE || !isfinite(value) ||
        fabs(value) > 3.0e38) {
        cli_fail(command, CLI_BAD_INPUT, "%s: '%s' is not a finite number", option, text);
        return false;
    }
    *out = (float)value;
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

int cli_parse_rope(cli_args *args, cli_rope *rope)
{
    const char *command = args->command, *value = NULL;
    const int flag = cli_flag(args, "--rope");
    if (flag != 0) {
        rope->on = flag > 0;
        return flag;
    }
    if (!cli_is(args, "--rope-style") && !cli_is(args, "--rope-dims") &&
        !cli_is(args, "--rope-base") && !cli_is(args, "--rope-start"))
        return 0;
    rope->option = true;
    if (!(value = cli_value(args)))
        return -1;
    if (cli_is(args, "--rope-style")) {
        if (strcmp(value, "pairs") == 0)
            rope->style = CLATTN_ROPE_PAIRS;
        else if (strcmp(value, "halves") == 0)
            rope->style = CLATTN_ROPE_HALVES;
        else
            return cli_fail(command, -1, "--rope-style: '%s' is not pairs or halves", value);
    } else if (cli_is(args, "--rope-dims")) {
        if (!cli_parse_size(command, "--rope-dims", value, 2, &rope->dims))
            return -1;
    } else if (cli_is(args, "--rope-start")) {
        if (!cli_parse_size(command, "--rope-start", value, 0, &rope->start))
            return -1;
    } else {
        if (!cli_parse_float(command, "--rope-base", value, &rope->base))
            return -1;
        if (!(rope->base > 0.0f))
            return cli_fail(command, -1, "--rope-base: %s is not a positive base", value);
    }
    return 1;
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

clattn_ctx *cli_context(const char *command, const char *device)
{
    clattn_ctx *ctx = NULL;
    char message[1024];
    clattn_status status = clattn_ctx_create(device, &ctx, message, sizeof message);
    if (status != CLATTN_SUCCESS) {
        cli_fail(command, CLI_FAILED, "no device: %s: %s", clattn_status_string(status), message);
        return NULL;
    }
    return ctx;
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
