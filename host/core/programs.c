/* The program cache and builds (host/core): each kernel variant (a source, a kernel name and
 * its extra build options) is built once per context and kept; a build puts the prelude
 * (common.cl, types.cl, params.h, the user's score functions, score.cl) and the source's base
 * ahead of the source, from the embedded texts or CLATTN_KERNEL_DIR; a variant whose build
 * fails is tried again with -cl-opt-disable. */
#include "programs.h"
#include "status.h"
#include "validate.h"
#define CLATTN_KERNEL_FILES /* the file-name table */
#include "kernels_embedded.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The embedded text of kernels/`file` (cmake/embed_kernels.cmake's table); NULL if none. */
static const char *embedded_text(const char *file)
{
    for (size_t i = 0; i < sizeof clattn_kernel_files / sizeof clattn_kernel_files[0]; ++i)
        if (strcmp(clattn_kernel_files[i].name, file) == 0)
            return clattn_kernel_files[i].text;
    return NULL;
}

/* FNV-1a, 64 bits, of the embedded texts a program of `family` is built from (the prelude and
 * its sources; the user's functions are hashed by validate.c): part of its variants' keys, so
 * that a validation record a library with other kernel texts wrote is not taken for this
 * one's. (Keyed by options alone, an edited kernel recorded "bad" when a draft of it failed to
 * build kept the rebuilt library on that variant's -cl-opt-disable build, 10x slower, with no
 * message.) Kernels read from CLATTN_KERNEL_DIR have no records (validate.c). */
static uint64_t family_texts_hash(const clattn_family *family)
{
    static const char *const prelude[] = {"common.cl", "types.cl", "params.h", "score.cl"};
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < sizeof prelude / sizeof prelude[0] + CLATTN_FAMILY_SOURCES; ++i) {
        const size_t n = sizeof prelude / sizeof prelude[0];
        const char *file = i < n ? prelude[i] : family->sources[i - n];
        const char *text = file ? embedded_text(file) : NULL;
        for (const unsigned char *c = (const unsigned char *)text; c && *c; ++c) {
            h ^= *c;
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

/* Reads dir/file into a malloc'd string; NULL on failure. */
static char *read_text_file(const char *dir, const char *file)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *text = NULL;
    long length = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        length = ftell(f);
    /* A folder opens too, and its "length" is LONG_MAX on Linux: no kernel source is 64 MiB. */
    if (length >= 0 && length < (64L << 20) && fseek(f, 0, SEEK_SET) == 0)
        text = malloc((size_t)length + 1);
    if (text && fread(text, 1, (size_t)length, f) == (size_t)length) {
        text[length] = '\0';
    } else {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

static size_t count_lines(const char *text)
{
    size_t n = 0;
    for (; *text; ++text)
        n += *text == '\n';
    return n;
}

/* The build log with the score functions' lines named as their own: a compiler that ignores
 * #line (Oclgrind numbers the whole program's lines as one file's) names a line of one of the
 * parts in `flex` (the text that follows `before` lines of the program) by its place; each
 * `FILE:LINE:` that falls inside a part becomes `PART:LINE':`, PART the name its #line gives
 * (host/attn/flex.c). Returns a new string, or NULL (out of memory: the caller keeps log). */
static char *map_flex_lines(const char *log, const char *flex, size_t before)
{
    enum { PARTS = 8 };
    struct {
        size_t first, last;
        char name[32];
    } parts[PARTS];
    size_t count = 0, line = 1;
    for (const char *at = flex; *at && count < PARTS; ++line) {
        const char *end = strchr(at, '\n');
        if (end == NULL)
            break;
        char name[32];
        if (sscanf(at, "#line 1 \"%31[^\"]\"", name) == 1 && strcmp(name, "score.cl") != 0) {
            parts[count].first = before + line + 1;
            parts[count].last = SIZE_MAX;
            snprintf(parts[count].name, sizeof parts[count].name, "%s", name);
            ++count;
        } else if (count && parts[count - 1].last == SIZE_MAX &&
                   strncmp(at, "#undef score_mod\n", 17) == 0) {
            parts[count - 1].last = before + line - 1;
        }
        at = end + 1;
    }
    const size_t size = strlen(log) * 2 + 64;
    char *out = malloc(size);
    if (out == NULL)
        return NULL;
    size_t used = 0;
    for (const char *at = log; *at && used + 48 < size;) {
        /* a token of file-name characters followed by ":digits:" */
        size_t token = 0;
        while (at[token] && (isalnum((unsigned char)at[token]) || strchr("._-<>/", at[token])))
            ++token;
        if (token > 0 && at[token] == ':' && isdigit((unsigned char)at[token + 1])) {
            char *digits_end = NULL;
            const unsigned long long n = strtoull(at + token + 1, &digits_end, 10);
            size_t p = 0;
            while (p < count && !(n >= parts[p].first && n <= parts[p].last))
                ++p;
            if (*digits_end == ':' && p < count) {
                used += (size_t)snprintf(out + used, size - used, "%s:%llu", parts[p].name,
                                         n - parts[p].first + 1);
                at = digits_end;
                continue;
            }
        }
        const size_t step = token > 0 ? token : 1;
        for (size_t i = 0; i < step && used + 1 < size; ++i)
            out[used++] = at[i];
        at += step;
    }
    out[used < size ? used : size - 1] = '\0';
    return out;
}

/* The texts a program of `family` is built from, in order: common.cl, types.cl (dtype loads
 * and stores), params.h (the kernel families' parameter structs, shared with the host), the
 * user's score functions (flex_text, "" when none), score.cl (the score rule, which calls
 * them), then the family's sources; from CLATTN_KERNEL_DIR when set (what was read in disk[],
 * for the caller to free), else the embedded copies. */
enum { PRELUDE = 5, TEXTS = PRELUDE + CLATTN_FAMILY_SOURCES };
static clattn_status gather_texts(clattn_ctx *ctx, const clattn_family *family,
                                  const char *flex_text, const char **texts, char **disk,
                                  cl_uint *count)
{
    static const char *const prelude[PRELUDE] = {"common.cl", "types.cl", "params.h", NULL,
                                                 "score.cl"};
    const char *kernel_dir = getenv("CLATTN_KERNEL_DIR");
    const char *files[TEXTS];
    cl_uint n = 0;
    for (; n < PRELUDE; ++n)
        files[n] = prelude[n];
    for (size_t i = 0; i < CLATTN_FAMILY_SOURCES && family->sources[i]; ++i)
        files[n++] = family->sources[i];
    for (cl_uint i = 0; i < n; ++i) {
        if (files[i] == NULL) { /* the user's functions: not a file */
            texts[i] = flex_text;
            continue;
        }
        if (kernel_dir && kernel_dir[0]) {
            texts[i] = disk[i] = read_text_file(kernel_dir, files[i]);
            if (texts[i] == NULL)
                return clattn__fail(ctx, CLATTN_ERR_BUILD, "CLATTN_KERNEL_DIR=%s: cannot read %s",
                                    kernel_dir, files[i]);
        } else if ((texts[i] = embedded_text(files[i])) == NULL) {
            return clattn__fail(ctx, CLATTN_ERR_BUILD, "%s: no kernel source %s in the library",
                                clattn__family_file(family), files[i]);
        }
    }
    *count = n;
    return CLATTN_SUCCESS;
}

/* Builds `family`'s program with the context's options plus `extra` (may be ""). */
static clattn_status build_program(clattn_ctx *ctx, const clattn_family *family, const char *extra,
                                   int fault, cl_program *out)
{
    /* A user's score functions (-DFLEX_SRC=n: the context's source n - 1, host/attn/flex.c)
     * go between params.h and score.cl, which calls them. */
    const char *flex_at = strstr(extra, "-DFLEX_SRC=");
    const long flex_id = flex_at ? strtol(flex_at + strlen("-DFLEX_SRC="), NULL, 10) : 0;
    const char *flex_text = flex_id > 0 && (size_t)flex_id <= ctx->num_flex_sources
                                ? ctx->flex_sources[flex_id - 1]
                                : "";
    char *disk[TEXTS] = {NULL};
    const char *texts[TEXTS];
    cl_uint count = 0;
    cl_program program = NULL;
    cl_int err = CL_SUCCESS;
    clattn_status status = gather_texts(ctx, family, flex_text, texts, disk, &count);
    if (status != CLATTN_SUCCESS)
        goto done;
    program = clCreateProgramWithSource(ctx->context, count, texts, NULL, &err);
    CL_CHECK(ctx, err, "clCreateProgramWithSource");
    char options[sizeof ctx->build_options + 256];
    /* CLATTN_FAULT_VARIANT's planted faults (validate.c): 1 a wrong element, 2 a failed build */
    snprintf(options, sizeof options, "%s %s%s", ctx->build_options, extra,
             fault == 1 ? " -DCLATTN_FAULT_WRONG=1" : "");
    err = clattn__fault(CLATTN_FAULT_BUILD) || fault == 2
              ? CL_BUILD_PROGRAM_FAILURE
              : clBuildProgram(program, 1, &ctx->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        /* The log may be longer than the message keeps: fetch it whole, keep its start. */
        size_t log_size = 0;
        char *log = NULL;
        if (clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &log_size) ==
            CL_SUCCESS)
            log = calloc(log_size + 1, 1);
        if (log && clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, log_size, log,
                                         NULL) != CL_SUCCESS)
            log[0] = '\0';
        if (flex_text[0] && log) { /* the user's source: its lines numbered as its own */
            char *mapped = map_flex_lines(log, flex_text,
                                          count_lines(texts[0]) + count_lines(texts[1]) +
                                              count_lines(texts[2]));
            if (mapped) {
                free(log);
                log = mapped;
            }
        }
        if (flex_text[0])
            status = clattn__fail(
                ctx, err == CL_BUILD_PROGRAM_FAILURE ? CLATTN_ERR_BUILD : (clattn_status)err,
                "the user's score functions do not build (lines of score_mod are the "
                "source's own): %s (%d)\n%s",
                clattn__cl_error_name(err), (int)err, log ? log : "(no build log)");
        else
            status = clattn__fail(
                ctx, err == CL_BUILD_PROGRAM_FAILURE ? CLATTN_ERR_BUILD : (clattn_status)err,
                "clBuildProgram(%s, %s): %s (%d)\n%s", clattn__family_file(family), options,
                clattn__cl_error_name(err), (int)err, log ? log : "(no build log)");
        free(log);
        goto done;
    }
    if (flex_text[0])
        ++ctx->builds_user;
    *out = program;
    program = NULL;
done:
    if (program)
        clReleaseProgram(program);
    for (int i = 0; i < TEXTS; ++i)
        free(disk[i]);
    return status;
}

/* A variant whose build failed: its -cl-opt-disable build (a compiler's crash is often in an
 * optimisation), kept under the original options too so that it is built once; the user's
 * score functions excepted (their errors are theirs to see). Else the build's status. */
static clattn_status safe_instead(clattn_ctx *ctx, const clattn_family *family, const char *name,
                                  const char *extra, clattn_status status, cl_kernel *out)
{
    char safe[sizeof ctx->variants[0].options];
    if (status != CLATTN_ERR_BUILD || strstr(extra, "-cl-opt-disable") ||
        strstr(extra, "-DFLEX_SRC=") ||
        snprintf(safe, sizeof safe, "%s -cl-opt-disable", extra) >= (int)sizeof safe)
        return status;
    char message[sizeof ctx->message];
    memcpy(message, ctx->message, sizeof message);
    cl_kernel kernel = NULL;
    if (clattn__variant_kernel(ctx, family, name, safe, &kernel) != CLATTN_SUCCESS ||
        ctx->num_variants == ctx->variant_capacity) {
        memcpy(ctx->message, message, sizeof message);
        return status;
    }
    clattn_variant alias = ctx->variants[ctx->num_variants - 1];
    snprintf(alias.options, sizeof alias.options, "%s", extra);
    clRetainProgram(alias.program);
    clRetainKernel(alias.kernel);
    ctx->variants[ctx->num_variants++] = alias;
    *out = kernel;
    return CLATTN_SUCCESS;
}

clattn_status clattn__variant_kernel(clattn_ctx *ctx, const clattn_family *family, const char *name,
                                     const char *extra, cl_kernel *out)
{
    for (size_t i = 0; i < ctx->num_variants; ++i) {
        const clattn_variant *v = &ctx->variants[i];
        if (v->family == family && strcmp(v->options, extra) == 0 && strcmp(v->name, name) == 0) {
            *out = v->kernel;
            return CLATTN_SUCCESS;
        }
    }
    if (strlen(extra) >= sizeof ctx->variants[0].options)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "%s: build options too long", name);
    if (ctx->num_variants == ctx->variant_capacity) {
        const size_t capacity = ctx->variant_capacity ? 2 * ctx->variant_capacity : 8;
        clattn_variant *grown = realloc(ctx->variants, capacity * sizeof *grown);
        if (grown == NULL)
            return clattn__fail(ctx, CLATTN_ERR_HOST_MEMORY, "%s: out of host memory", name);
        ctx->variants = grown;
        ctx->variant_capacity = capacity;
    }
    /* The entry is filled first (its key and planted fault), and kept only once built. */
    clattn_variant *v = &ctx->variants[ctx->num_variants];
    memset(v, 0, sizeof *v);
    v->family = family;
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->options, sizeof v->options, "%s", extra);
    clattn__variant_identity(ctx, clattn__family_file(family), family_texts_hash(family), v);
    cl_program program = NULL;
    clattn_status status = build_program(ctx, family, extra, v->fault, &program);
    if (status != CLATTN_SUCCESS) {
        const clattn_variant failed = *v;
        char message[sizeof ctx->message];
        memcpy(message, ctx->message, sizeof message);
        clattn__note_build_failure(ctx, &failed, status);
        memcpy(ctx->message, message, sizeof message);
        return safe_instead(ctx, family, name, extra, status, out);
    }
    cl_int err = CL_SUCCESS;
    cl_kernel kernel = clCreateKernel(program, name, &err);
    if (err != CL_SUCCESS) {
        clReleaseProgram(program);
        return clattn__fail(ctx, (clattn_status)err, "clCreateKernel(%s): %s (%d)", name,
                            clattn__cl_error_name(err), (int)err);
    }
    v->program = program;
    v->kernel = kernel;
    ctx->num_variants++;
    if (v->fault == 3)
        ctx->enqueue_faults = true;
    *out = kernel;
    return CLATTN_SUCCESS;
}

clattn_status clattn__variant_fits(clattn_ctx *ctx, const clattn_family *family, const char *name,
                                   const char *extra, size_t items, cl_kernel *kernel)
{
    cl_kernel built = NULL;
    *kernel = NULL;
    clattn_status status = clattn__variant_kernel(ctx, family, name, extra, &built);
    if (status != CLATTN_SUCCESS)
        return status;
    size_t kernel_max = 0;
    const cl_int err = clGetKernelWorkGroupInfo(built, ctx->device, CL_KERNEL_WORK_GROUP_SIZE,
                                                sizeof kernel_max, &kernel_max, NULL);
    if (err != CL_SUCCESS)
        return clattn__cl_fail(ctx, err, "clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE)");
    if (kernel_max >= items)
        *kernel = built;
    return CLATTN_SUCCESS;
}

clattn_status clattn__family_kernel(clattn_ctx *ctx, const clattn_family *family,
                                    const char *kernel, const void *values,
                                    const clattn_define *defines, size_t count, cl_kernel *out)
{
    char options[sizeof ctx->variants[0].options];
    const clattn_status status =
        clattn__family_options(ctx, family, values, defines, count, options, sizeof options);
    return status != CLATTN_SUCCESS ? status
                                    : clattn__variant_kernel(ctx, family, kernel, options, out);
}

clattn_status clattn__family_fits(clattn_ctx *ctx, const clattn_family *family, const char *kernel,
                                  const void *values, const clattn_define *defines, size_t count,
                                  size_t items, cl_kernel *out)
{
    char options[sizeof ctx->variants[0].options];
    const clattn_status status =
        clattn__family_options(ctx, family, values, defines, count, options, sizeof options);
    return status != CLATTN_SUCCESS
               ? status
               : clattn__variant_fits(ctx, family, kernel, options, items, out);
}
