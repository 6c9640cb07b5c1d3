/* Kernel parameters per device: a default row computed from the device's limits, then the
 * rows of the tuning table (host/tuning/table.h), of the tuning cache written by `clattn tune`
 * (or of CLATTN_TUNING=FILE instead), of the context descriptor, and the quirks, that match.
 * A row may carry the driver key of the device it was measured on (driver_rows below); the
 * cache's rows must, and apply only on that driver, platform and clattn version. */
#include "family.h"
#include "status.h"
#include "tuning.h"
#include "tuning/table.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The context's build options (core/family.h): the device-scope keys every program takes. */
/* clang-format off */
#define CONTEXT_SWITCHES(X)                                                                        \
    X(TILE_M, 0, NULL) X(TILE_N, 0, NULL) X(TILE_K, 0, NULL) X(WPT_M, 0, NULL) X(WPT_N, 0, NULL)   \
    X(VEC_RM, 0, NULL) X(VEC_W, 0, NULL) X(VEC_WG, 0, NULL) X(TRANSPOSE_WG, 0, NULL)               \
    X(SOFTMAX_WG, 0, NULL) X(HEADS_WG, 0, NULL)
/* clang-format on */
CLATTN_FAMILY(context, CONTEXT_SWITCHES, .label = "every program", .flags = "-cl-std=CL1.2");

typedef struct tuning_key {
    const char *name;
    size_t offset;
    bool problem; /* scope PROBLEM: rows with selectors may set it */
    unsigned long long lo, hi;
} tuning_key;

enum { DEVICE = 0, PROBLEM = 1 };
#define KEY(field, scope, lo, hi, op, cls, when, values, quick, doc)                              \
    {#field, offsetof(clattn_tuning, field), scope == PROBLEM, lo, hi},
static const tuning_key tuning_keys[] = {CLATTN_TUNING_KEYS(KEY)};
#undef KEY
/* The same list as the public API gives it (clattn_tuning_key_get). */
/* clang-format off */
#define KEY_INFO(field, scope, lo, hi, op, cls, when, values, quick, doc)                         \
    {sizeof(clattn_tuning_key_info), #field, op, cls, when, values, quick, doc, lo, hi,          \
     scope == PROBLEM ? CLATTN_TUNING_PROBLEM : CLATTN_TUNING_DEVICE},
/* clang-format on */
static const clattn_tuning_key_info public_keys[] = {CLATTN_TUNING_KEYS(KEY_INFO)};
#undef KEY_INFO
enum { NUM_KEYS = sizeof tuning_keys / sizeof tuning_keys[0] };
_Static_assert(NUM_KEYS <= 64, "clattn_tuning_record.set has a bit per key");

static unsigned *key_field(clattn_tuning *t, size_t k)
{
    return (unsigned *)((char *)t + tuning_keys[k].offset);
}

static unsigned key_value(const clattn_tuning *t, size_t k)
{
    return *(const unsigned *)((const char *)t + tuning_keys[k].offset);
}

static unsigned pow2_at_most(size_t limit, unsigned cap)
{
    unsigned v = 1;
    while (v * 2 <= cap && v * 2 <= limit)
        v *= 2;
    return v;
}

static size_t max_1d(const clattn_device_info *info)
{
    return info->max_work_group_size < info->max_item_sizes[0] ? info->max_work_group_size
                                                               : info->max_item_sizes[0];
}

static bool tile_fits(const clattn_device_info *info, unsigned tm, unsigned tn, unsigned tk,
                      unsigned wm, unsigned wn)
{
    if (tm == 0 || tn == 0 || tk == 0 || wm == 0 || wn == 0 || tm % wm || tn % wn)
        return false;
    const size_t items_x = tn / wn, items_y = tm / wm;
    /* Leave room for the runtime's own use of local memory. */
    const cl_ulong budget =
        info->local_mem_size > 1024 ? info->local_mem_size - 1024 : info->local_mem_size;
    const cl_ulong local_bytes = (cl_ulong)tk * (tm + 1 + tn + 1) * sizeof(float);
    return items_x * items_y <= info->max_work_group_size && items_x <= info->max_item_sizes[0] &&
           items_y <= info->max_item_sizes[1] && local_bytes <= budget;
}

/* The default row: the largest local-memory tile from a fixed ladder that fits the device,
 * scalar kernels, power-of-two work-groups within its limits. It runs on any device. */
static clattn_status default_row(clattn_ctx *ctx, clattn_tuning *t)
{
    static const unsigned ladder[][5] = {
        {64, 64, 16, 4, 4}, {32, 32, 16, 4, 4}, {16, 16, 16, 2, 2},
        {8, 8, 8, 1, 1},    {4, 4, 4, 1, 1},    {1, 1, 1, 1, 1},
    };
    const clattn_device_info *info = &ctx->info;
    size_t i = 0;
    while (i < sizeof ladder / sizeof ladder[0] &&
           !tile_fits(info, ladder[i][0], ladder[i][1], ladder[i][2], ladder[i][3], ladder[i][4]))
        ++i;
    if (i == sizeof ladder / sizeof ladder[0])
        return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                            "device '%s': no matmul tile fits its limits (work-group %zu, local "
                            "memory %llu bytes)",
                            info->name, info->max_work_group_size,
                            (unsigned long long)info->local_mem_size);
    t->tile_m = ladder[i][0], t->tile_n = ladder[i][1], t->tile_k = ladder[i][2];
    t->wpt_m = ladder[i][3], t->wpt_n = ladder[i][4];
    const size_t wide = max_1d(info);
    t->matmul_vec = 0;
    t->vec_rm = 6;
    /* matmul_vec: one register per vector; 4 vectors per micro-tile row where vectors are
     * 16 wide (AVX-512: 6 x 4 accumulators of its 32 registers), else 2 (AVX2 has 16). */
    const cl_uint width = info->preferred_float_width;
    t->vec_width = width >= 16 ? 16 : width >= 8 ? 8 : 4;
    t->vec_nv = t->vec_width >= 16 ? 4 : 2;
    t->vec_rb = 4;
    t->vec_kc = 256;
    t->vec_stream = 0;
    t->vec_wg = 1;
    t->transpose_wg = pow2_at_most(wide, 16);
    t->softmax_wg = pow2_at_most(wide, 256);
    t->softmax_rows = 0;
    t->heads_wg = pow2_at_most(wide, 256);
    /* Decode splits of at least 256 keys: past that a split's tiles outweigh the merge. */
    t->decode_keys = 256;
    t->flash_rows = pow2_at_most(wide, 64);
    t->flash_vw = 1;
    t->flash_cpu = 0;
    t->flash_cpu_rb = 6;
    t->flash_cpu_nb = 32;
    /* flash_cpu: 6 rows x 4 float16 accumulators need AVX-512's 32 registers; with AVX2's 16
     * one float16 per row (6 x 2 ymm) does not spill (measured on a 2-core EPYC, AVX2). */
    t->flash_cpu_kv = t->vec_width >= 16 ? 4 : 1;
    /* A key tile's row blocks all take their scores and weights, then all their P.V, so K's
     * tile and then V's stay in L1 (ops/flash.c: with more than one block a group) */
    t->flash_cpu_tp = 1;
    t->flash_cpu_pf = 0; /* (the CPU row of host/tuning/table.h sets it) */
    /* Prefetching pays where keys and values come from memory, not from the cache (ops/flash.c:
     * cpu_prefetch) */
    const cl_ulong half_cache_kib = info->global_cache_size / 2048;
    t->flash_cpu_pf_min = half_cache_kib < 4194304 ? (unsigned)half_cache_kib : 4194304u;
    t->flash_bwd_nv = 4;
    /* The CPU backward's rows a step: 6 where the device has 32 vector registers (AVX-512:
     * 6 rows x 4 float16 sums of scores, then of dp, fit; the backward 1.01-1.06x at d = 64,
     * 1.16-1.23x at d = 128 against 4 rows, Intel Xeon), else 4 (AVX2's 16 registers). */
    t->flash_bwd_rb = t->vec_width >= 16 ? 6 : 4;
    t->flash_gpu = 0;
    t->fg_bq = 64, t->fg_bk = 32, t->fg_tx = 16, t->fg_ty = 8;
    t->fg_dpas = 1, t->fg_dpas_sg = 8; /* (1: only where the device has the extension) */
    t->loop_trip_limit = 0;
    return CLATTN_SUCCESS;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    size_t start = 0;
    while (isspace((unsigned char)s[start]))
        ++start;
    memmove(s, s + start, n - start + 1);
}

/* A row's text: without its comment (from '#') and surrounding spaces; false when empty. */
static bool strip_line(char *line)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    trim(line);
    return line[0] != '\0';
}

/* One selector of a row, "@head_dim=N", "@dtype=f32|f16|bf16" or "@phase=prefill|decode",
 * into the record (and its text into record->selectors). */
static clattn_status parse_selector(clattn_ctx *ctx, const char *origin, const char *item,
                                    clattn_tuning_record *record)
{
    const char *value = strchr(item, '=');
    bool ok = value != NULL;
    if (ok && strncmp(item, "@head_dim=", 10) == 0) {
        char *end = NULL;
        const unsigned long n = strtoul(value + 1, &end, 10);
        ok = end != value + 1 && *end == '\0' && n >= 1 && n <= 65536;
        record->head_dim = (unsigned)n;
    } else if (ok && strncmp(item, "@dtype=", 7) == 0) {
        static const char *const names[] = {"f32", "f16", "bf16"};
        static const clattn_dtype dtypes[] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16,
                                              CLATTN_DTYPE_BF16};
        ok = false;
        for (int i = 0; i < 3; ++i)
            if (strcmp(value + 1, names[i]) == 0)
                ok = true, record->dtype = (int)dtypes[i];
    } else if (ok && strncmp(item, "@phase=", 7) == 0) {
        ok = strcmp(value + 1, "prefill") == 0 || strcmp(value + 1, "decode") == 0;
        record->phase = strcmp(value + 1, "decode") == 0 ? 2 : 1;
    } else {
        ok = false;
    }
    if (!ok)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "tuning %s: '%s' is not a selector: @head_dim=1..65536, "
                            "@dtype=f32|f16|bf16 (q's) or @phase=prefill|decode (decode: one "
                            "query row)",
                            origin, item);
    const size_t used = strlen(record->selectors);
    snprintf(record->selectors + used, sizeof record->selectors - used, "%s%s", used ? " " : "",
             item);
    return CLATTN_SUCCESS;
}

/* Rows keyed by the driver. A row may name, after the device name, the driver fields of the
 * device it was measured on (the driver key after the name, ctx->info.driver_key, made by
 * clattn__driver_key in host/core/device.c):
 *
 *     class | vendor | NAME | driver CL_DRIVER_VERSION | CL_PLATFORM_VERSION | clattn V | keys
 *
 * `clattn tune` writes its rows so. Such a row applies only where those fields are the
 * device's (compared with whitespace runs as one space); a row of this device keyed by another
 * driver, platform or clattn version is not applied and noted, never an error. In the tuning
 * cache the key is required: a row without one (an older clattn's) is noted the same way. */
typedef struct driver_rows {
    const char *fields;     /* this device's driver fields, "driver D | P | clattn V" */
    bool required;          /* set while the cache is read */
    char unkeyed[192];      /* origins of this device's rows without one, where required */
    char other[192];        /* origins of this device's rows keyed by another driver */
    char other_fields[256]; /* the first of those rows' driver fields */
} driver_rows;

/* Driver fields as they are compared: whitespace runs ('#' too: a row cannot hold one) as one
 * space, none next to a '|' or at the ends. */
static void compact_fields(const char *in, char *out, size_t size)
{
    size_t n = 0;
    bool space = false;
    for (const char *c = in; *c && n + 2 < size; ++c) {
        if (isspace((unsigned char)*c) || *c == '#') {
            space = true;
            continue;
        }
        if (space && n > 0 && *c != '|' && out[n - 1] != '|')
            out[n++] = ' ';
        space = false;
        out[n++] = *c;
    }
    out[n] = '\0';
}

/* Appends origin to a list of origins (size bytes), separated by ", ". */
static void add_origin(char *list, size_t size, const char *origin)
{
    const size_t used = strlen(list);
    if (used + 1 < size)
        snprintf(list + used, size - used, "%s%s", used ? ", " : "", origin);
}

/* Whether a row of this device applies, given its driver fields (NULL: none); if not, it is
 * noted in rows. */
static bool driver_matches(driver_rows *rows, const char *fields, const char *origin)
{
    if (fields == NULL) {
        if (rows->required)
            add_origin(rows->unkeyed, sizeof rows->unkeyed, origin);
        return !rows->required;
    }
    char theirs[512], ours[512];
    compact_fields(fields, theirs, sizeof theirs);
    compact_fields(rows->fields, ours, sizeof ours);
    if (strcmp(theirs, ours) == 0)
        return true;
    if (rows->other[0] == '\0')
        snprintf(rows->other_fields, sizeof rows->other_fields, "%s", fields);
    add_origin(rows->other, sizeof rows->other, origin);
    return false;
}

/* Applies one row (`origin` names it in messages) when it matches the device (and its driver,
 * driver_rows): a row with selectors becomes a record (clattn__tuning_for), any other sets
 * ctx->tuning. */
static clattn_status apply_row(clattn_ctx *ctx, const char *row, const char *origin,
                               driver_rows *drivers)
{
    char text[1024];
    if (strlen(row) >= sizeof text)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "tuning %s: row too long", origin);
    strcpy(text, row);
    /* class | vendor | name [| driver fields] | keys: the keys follow the last bar. */
    char *fields[4] = {text, NULL, NULL, strrchr(text, '|')};
    for (int i = 1; i < 3; ++i) {
        char *bar = fields[i - 1] ? strchr(fields[i - 1], '|') : NULL;
        fields[i] = bar && bar < fields[3] ? bar + 1 : NULL;
        if (bar && fields[i])
            *bar = '\0';
    }
    if (fields[2] == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "tuning %s: expected 'class | vendor | name | key=value ...' (or "
                            "'class | vendor | name | driver D | PLATFORM | clattn V | "
                            "key=value ...'), got '%s'",
                            origin, row);
    *fields[3]++ = '\0';
    char *driver = strchr(fields[2], '|');
    if (driver)
        *driver++ = '\0';
    for (int i = 0; i < 4; ++i)
        trim(fields[i]);
    if (driver) {
        trim(driver);
        char compact[512];
        compact_fields(driver, compact, sizeof compact);
        const char *last = strrchr(compact, '|');
        if (strncmp(compact, "driver", 6) != 0 || (compact[6] != ' ' && compact[6] != '|') ||
            last == NULL || strncmp(last + 1, "clattn ", 7) != 0)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "tuning %s: '%s' after the device name is not the driver "
                                "fields 'driver D | PLATFORM | clattn V' (`clattn info` prints "
                                "the device's driver key)",
                                origin, driver);
    }
    const bool cpu = ctx->tuning.cpu_params;
    if (strcmp(fields[0], "any") != 0 && strcmp(fields[0], "cpu") != 0 &&
        strcmp(fields[0], "gpu") != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "tuning %s: class '%s' is not cpu, gpu or any", origin, fields[0]);
    /* Every row is parsed, so that a malformed row is refused on every device; only the
     * rows that match the device apply. */
    const bool applies =
        !((strcmp(fields[0], "cpu") == 0 && !cpu) || (strcmp(fields[0], "gpu") == 0 && cpu)) &&
        (strcmp(fields[1], "*") == 0 ||
         strncmp(ctx->info.vendor, fields[1], strlen(fields[1])) == 0) &&
        (strcmp(fields[2], "*") == 0 || strncmp(ctx->info.name, fields[2], strlen(fields[2])) == 0);
    clattn_tuning parsed = ctx->tuning;
    clattn_tuning_record record = {.dtype = -1};
    int selectors = 0;
    for (char *item = fields[3]; *item;) {
        while (*item == ' ' || *item == '\t')
            ++item;
        if (*item == '\0')
            break;
        char *next = item + strcspn(item, " \t");
        if (*next)
            *next++ = '\0';
        if (item[0] == '@') {
            clattn_status status = parse_selector(ctx, origin, item, &record);
            if (status != CLATTN_SUCCESS)
                return status;
            ++selectors;
            item = next;
            continue;
        }
        char *eq = strchr(item, '=');
        size_t k = 0;
        while (eq && k < NUM_KEYS &&
               (strlen(tuning_keys[k].name) != (size_t)(eq - item) ||
                strncmp(tuning_keys[k].name, item, (size_t)(eq - item)) != 0))
            ++k;
        char *end = NULL;
        const unsigned long value = eq ? strtoul(eq + 1, &end, 10) : 0;
        if (eq == NULL || k == NUM_KEYS || end == eq + 1 || *end != '\0' || value > UINT_MAX)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "tuning %s: '%s' is not key=number with a known key", origin,
                                item);
        *key_field(&parsed, k) = (unsigned)value;
        record.set |= 1ull << k;
        item = next;
    }
    for (size_t k = 0; selectors && k < NUM_KEYS; ++k)
        if ((record.set >> k & 1) && !tuning_keys[k].problem)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "tuning %s: %s is one value per context; a row with @selectors "
                                "sets only the fused kernels' keys (flash_*, fg_*, decode_keys)",
                                origin, tuning_keys[k].name);
    if (!applies || !driver_matches(drivers, driver, origin))
        return CLATTN_SUCCESS;
    if (selectors == 0) {
        ctx->tuning = parsed;
        const size_t used = strlen(ctx->tuning_rows);
        snprintf(ctx->tuning_rows + used, sizeof ctx->tuning_rows - used, "%s%s",
                 used ? "; " : "", origin);
        return CLATTN_SUCCESS;
    }
    if (ctx->num_tuning_records == CLATTN_TUNING_RECORDS)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "tuning %s: more than %d rows with @selectors match this device",
                            origin, CLATTN_TUNING_RECORDS);
    record.values = parsed;
    snprintf(record.origin, sizeof record.origin, "%s", origin);
    ctx->tuning_records[ctx->num_tuning_records++] = record;
    return CLATTN_SUCCESS;
}

static clattn_status apply_file(clattn_ctx *ctx, const char *path, driver_rows *drivers)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT, "CLATTN_TUNING=%s: cannot open it",
                            path);
    char line[1024], origin[640];
    clattn_status status = CLATTN_SUCCESS;
    for (int number = 1; status == CLATTN_SUCCESS && fgets(line, sizeof line, f); ++number) {
        if (!strip_line(line))
            continue;
        /* The path too: the message must say it is the tuning file that is wrong. */
        snprintf(origin, sizeof origin, "file line %d (%.500s)", number, path);
        status = apply_row(ctx, line, origin, drivers);
    }
    /* A folder opens on Linux but cannot be read (EISDIR). */
    if (status == CLATTN_SUCCESS && ferror(f))
        status = clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                              "CLATTN_TUNING=%s: cannot read it", path);
    fclose(f);
    return status;
}

static void add_note(char *buf, size_t size, const char *fmt, ...);

/* Refuses parameters that the kernels or the device cannot run; `rows` names where they came
 * from in the message. */
static clattn_status check_values(clattn_ctx *ctx, const clattn_tuning *t, const char *rows)
{
    const size_t wide = max_1d(&ctx->info);
    for (size_t k = 0; k < NUM_KEYS; ++k)
        if (key_value(t, k) < tuning_keys[k].lo || key_value(t, k) > tuning_keys[k].hi)
            return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                                "device '%s': the tuning rows (%s) give %s=%u, outside the "
                                "kernels' %llu .. %llu",
                                ctx->info.name, rows, tuning_keys[k].name, key_value(t, k),
                                tuning_keys[k].lo, tuning_keys[k].hi);
    const unsigned pow2s[] = {t->vec_wg, t->transpose_wg, t->softmax_wg, t->heads_wg,
                              t->flash_rows};
    /* Each key's range was checked above (host/tuning/keys.h); these tie keys together or
     * to the device. */
    bool ok = tile_fits(&ctx->info, t->tile_m, t->tile_n, t->tile_k, t->wpt_m, t->wpt_n) &&
              (t->vec_width == 4 || t->vec_width == 8 || t->vec_width == 16) &&
              (t->flash_vw == 1 || t->flash_vw == 4 || t->flash_vw == 8) &&
              (t->loop_trip_limit == 0 || t->loop_trip_limit >= 64) && t->softmax_rows <= wide &&
              (t->softmax_rows & (t->softmax_rows - 1)) == 0 &&
              (t->flash_cpu_kv == 1 || t->flash_cpu_kv == 2 || t->flash_cpu_kv == 4) &&
              (t->flash_bwd_nv == 1 || t->flash_bwd_nv == 2 || t->flash_bwd_nv == 4) &&
              /* flash_gpu's shape (whether the device runs fg_tx * fg_ty work-items is
               * checked when a plan builds it; flash.cl runs where it does not) */
              t->fg_bq >= t->fg_ty && t->fg_bk >= t->fg_tx && t->fg_bq % t->fg_ty == 0 &&
              t->fg_bk % t->fg_tx == 0 && (t->fg_dpas_sg == 8 || t->fg_dpas_sg == 16) &&
              /* matmul_vec's private sums: at most 64 KiB */
              (size_t)t->vec_rb * t->vec_rm * t->vec_nv * t->vec_width <= 16384;
    for (size_t i = 0; ok && i < sizeof pow2s / sizeof pow2s[0]; ++i)
        ok = pow2s[i] >= 1 && pow2s[i] <= wide && (pow2s[i] & (pow2s[i] - 1)) == 0;
    if (ok)
        return CLATTN_SUCCESS;
    return clattn__fail(ctx, CLATTN_ERR_UNSUPPORTED,
                        "device '%s': the tuning rows (%s) give parameters its limits or the "
                        "kernels do not allow (work-group %zu, local memory %llu bytes)",
                        ctx->info.name, rows, wide, (unsigned long long)ctx->info.local_mem_size);
}

static clattn_status check_row(clattn_ctx *ctx)
{
    return check_values(ctx, &ctx->tuning, ctx->tuning_rows[0] ? ctx->tuning_rows : "none");
}

/* A record's keys on top of *t. */
static void apply_record(const clattn_tuning_record *r, clattn_tuning *t)
{
    for (size_t k = 0; k < NUM_KEYS; ++k)
        if (r->set >> k & 1)
            *key_field(t, k) = key_value(&r->values, k);
}

static int specificity(const clattn_tuning_record *r)
{
    return (r->head_dim != 0) + (r->dtype >= 0) + (r->phase != 0);
}

void clattn__tuning_for(clattn_ctx *ctx, size_t head_dim, clattn_dtype dtype, bool decode,
                        clattn_tuning *out, char *applied, size_t applied_size)
{
    *out = ctx->tuning;
    if (applied_size)
        applied[0] = '\0';
    size_t used = 0;
    for (int level = 1; level <= 3; ++level)
        for (size_t i = 0; i < ctx->num_tuning_records; ++i) {
            const clattn_tuning_record *r = &ctx->tuning_records[i];
            if (specificity(r) != level || (r->head_dim && r->head_dim != head_dim) ||
                (r->dtype >= 0 && r->dtype != (int)dtype) ||
                (r->phase && r->phase != (decode ? 2 : 1)))
                continue;
            apply_record(r, out);
            if (used + 1 < applied_size)
                used += (size_t)snprintf(applied + used, applied_size - used, "%s%s (%s)",
                                         used ? "; " : "", r->origin, r->selectors);
        }
    /* Each record was checked alone on the context's row; two that select the same problem
     * could still combine into values the kernels refuse: then none applies. */
    if (used && check_values(ctx, out, applied) != CLATTN_SUCCESS) {
        *out = ctx->tuning;
        snprintf(applied, applied_size, "none (the matching records combine into values the "
                                        "kernels refuse)");
    }
}

/* Each record on top of the context's row must give values the kernels run: else it fails
 * (a row of the table, a file or tuning_rows) or is dropped with a note (the cache's). */
static clattn_status check_records(clattn_ctx *ctx, char *ignored, size_t ignored_size)
{
    size_t kept = 0;
    for (size_t i = 0; i < ctx->num_tuning_records; ++i) {
        const clattn_tuning_record *r = &ctx->tuning_records[i];
        clattn_tuning t = ctx->tuning;
        apply_record(r, &t);
        if (check_values(ctx, &t, r->origin) != CLATTN_SUCCESS) {
            if (!r->lenient)
                return CLATTN_ERR_UNSUPPORTED; /* the message is set */
            add_note(ignored, ignored_size, "%s: values this device or the kernels cannot run",
                     r->origin);
            continue;
        }
        ctx->tuning_records[kept++] = *r;
    }
    ctx->num_tuning_records = kept;
    return CLATTN_SUCCESS;
}

/* Appends a formatted note to buf (size bytes), separated by "; ". */
static void add_note(char *buf, size_t size, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used && used + 3 < size)
        used += (size_t)snprintf(buf + used, size - used, "; ");
    if (used + 1 < size) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(buf + used, size - used, fmt, args);
        va_end(args);
    }
}

/* The tuning cache `clattn tune` writes: $XDG_CACHE_HOME/clattn/tuning, or
 * $HOME/.cache/clattn/tuning (XDG: a relative XDG_CACHE_HOME is ignored); false if neither. */
static bool cache_path(char *path, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = -1;
    if (xdg && xdg[0] == '/')
        n = snprintf(path, size, "%s/clattn/tuning", xdg);
    else if (home && home[0])
        n = snprintf(path, size, "%s/.cache/clattn/tuning", home);
    return n > 0 && (size_t)n < size;
}

/* The cache is a disposable file that every program reads: a row in it that is malformed
 * (or names a key this version does not know) or that gives values the device cannot run is
 * ignored, whole, and noted in `ignored` (clattn_ctx_tuning, `clattn info`), never an error.
 * A missing file is no row (returns false). */
static bool apply_cache(clattn_ctx *ctx, const char *path, driver_rows *drivers, char *ignored,
                        size_t ignored_size)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        if (errno != ENOENT)
            add_note(ignored, ignored_size, "%s: cannot open it", path);
        return errno != ENOENT;
    }
    char line[1024], origin[48];
    for (int number = 1; fgets(line, sizeof line, f); ++number) {
        if (!strip_line(line))
            continue;
        snprintf(origin, sizeof origin, "cache line %d", number);
        const clattn_tuning before = ctx->tuning;
        const size_t records = ctx->num_tuning_records, rows_used = strlen(ctx->tuning_rows);
        if (apply_row(ctx, line, origin, drivers) != CLATTN_SUCCESS) {
            add_note(ignored, ignored_size, "%.240s", ctx->message);
        } else if (check_row(ctx) != CLATTN_SUCCESS) {
            ctx->tuning = before; /* undone whole: its values and its name in the rows */
            ctx->tuning_rows[rows_used] = '\0';
            add_note(ignored, ignored_size, "%s: values this device or the kernels cannot run",
                     origin);
        } else if (ctx->num_tuning_records > records) {
            ctx->tuning_records[records].lenient = true; /* checked with the others */
        }
    }
    if (ferror(f))
        add_note(ignored, ignored_size, "%s: cannot read it", path);
    fclose(f);
    return true;
}

/* Rows given as text (the context descriptor's tuning_rows), one per line, # comments; a
 * malformed row fails, as CLATTN_TUNING=FILE's do. */
static clattn_status apply_text(clattn_ctx *ctx, const char *text, driver_rows *drivers)
{
    char line[1024], origin[48];
    clattn_status status = CLATTN_SUCCESS;
    for (int number = 1; status == CLATTN_SUCCESS && *text; ++number) {
        const size_t length = strcspn(text, "\n");
        if (length >= sizeof line)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "tuning_rows line %d: row too long", number);
        memcpy(line, text, length);
        line[length] = '\0';
        text += length + (text[length] == '\n');
        if (!strip_line(line))
            continue;
        snprintf(origin, sizeof origin, "tuning_rows line %d", number);
        status = apply_row(ctx, line, origin, drivers);
    }
    return status;
}

/* What clattn_ctx_tuning reports: where the rows came from, the driver key, which rows were
 * ignored, the parameters. */
static void summarise(clattn_ctx *ctx, const char *source, const char *driver_key,
                      const char *ignored)
{
    char *out = ctx->tuning_summary;
    const size_t size = sizeof ctx->tuning_summary;
    int n = snprintf(out, size, "rows: %s\nrecords:", ctx->tuning_rows[0] ? ctx->tuning_rows : "none");
    if (ctx->num_tuning_records == 0 && n > 0 && (size_t)n < size)
        n += snprintf(out + n, size - (size_t)n, " none");
    for (size_t i = 0; i < ctx->num_tuning_records && n > 0 && (size_t)n < size; ++i) {
        const clattn_tuning_record *r = &ctx->tuning_records[i];
        n += snprintf(out + n, size - (size_t)n, "%s %s (%s:", i ? ";" : "", r->origin,
                      r->selectors);
        for (size_t k = 0; k < NUM_KEYS && n > 0 && (size_t)n < size; ++k)
            if (r->set >> k & 1)
                n += snprintf(out + n, size - (size_t)n, " %s=%u", tuning_keys[k].name,
                              key_value(&r->values, k));
        if (n > 0 && (size_t)n < size)
            n += snprintf(out + n, size - (size_t)n, ")");
    }
    if (n > 0 && (size_t)n < size)
        n += snprintf(out + n, size - (size_t)n,
                      "\nfile: %s\ndriver key: %s\nignored: %s\nparameters:", source, driver_key,
                      ignored[0] ? ignored : "none");
    for (size_t k = 0; n > 0 && (size_t)n < size && k < NUM_KEYS; ++k)
        n += snprintf(out + n, size - (size_t)n, " %s=%u", tuning_keys[k].name,
                      key_value(&ctx->tuning, k));
}

clattn_status clattn__choose_tuning(clattn_ctx *ctx, const char *tuning_file,
                                    const char *tuning_rows)
{
    clattn_tuning *t = &ctx->tuning;
    memset(t, 0, sizeof *t);
    ctx->num_tuning_records = 0;
    ctx->tuning_rows[0] = '\0';
    /* CLATTN_PARAMS=gpu|cpu applies the other class's rows (tests run the GPU kernels'
     * work-group sizes, vector widths and tiles on a CPU device); unset: the device's type. */
    const char *params = getenv("CLATTN_PARAMS");
    if (params && params[0] == '\0')
        params = NULL;
    if (params && strcmp(params, "gpu") != 0 && strcmp(params, "cpu") != 0)
        return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                            "CLATTN_PARAMS='%s': expected gpu or cpu (the class of tuning rows "
                            "to apply), or unset for the device's own",
                            params);
    t->cpu_params = params && strcmp(params, "gpu") == 0   ? false
                    : params && strcmp(params, "cpu") == 0 ? true
                                                           : (ctx->info.type & CL_DEVICE_TYPE_CPU) != 0;
    clattn_status status = default_row(ctx, t);
    /* tuning_file (the descriptor's): NULL: CLATTN_TUNING's choice, or the cache when that is
     * unset or empty; "": no file; "default": no row at all; else that file. */
    const char *file = tuning_file ? tuning_file : getenv("CLATTN_TUNING");
    const bool only_default = file && strcmp(file, "default") == 0;
    char cache[512] = "", ignored[1536] = "", source[600] = "none";
    char origin[32];
    /* The driver key as rows carry it: '#' would start a comment there. Its fields follow the
     * device name (clattn__driver_key: "NAME | driver D | P | clattn V"). */
    char key[sizeof ctx->info.driver_key];
    snprintf(key, sizeof key, "%s", ctx->info.driver_key);
    for (char *c = key; *c; ++c)
        if (*c == '#')
            *c = ' ';
    const size_t name_length = strlen(ctx->info.name);
    driver_rows drivers = {.fields = strlen(key) > name_length + 3 ? key + name_length + 3 : ""};
    for (size_t i = 0; status == CLATTN_SUCCESS && !only_default &&
                       i < sizeof clattn_tuning_table / sizeof clattn_tuning_table[0];
         ++i) {
        /* A built-in row that does not fit this device (a class row on a small GPU) is
         * skipped: the rows before it stay. */
        const clattn_tuning before = *t;
        const size_t records = ctx->num_tuning_records;
        snprintf(origin, sizeof origin, "table row %zu", i);
        status = apply_row(ctx, clattn_tuning_table[i], origin, &drivers);
        if (status == CLATTN_SUCCESS && check_row(ctx) != CLATTN_SUCCESS)
            *t = before;
        else if (status == CLATTN_SUCCESS && ctx->num_tuning_records > records)
            ctx->tuning_records[records].lenient = true;
    }
    if (status == CLATTN_SUCCESS && file && file[0] && !only_default) {
        status = apply_file(ctx, file, &drivers);
        snprintf(source, sizeof source, "%s", file);
    } else if (status == CLATTN_SUCCESS && !only_default && tuning_file == NULL &&
               cache_path(cache, sizeof cache)) {
        drivers.required = true;
        const bool present = apply_cache(ctx, cache, &drivers, ignored, sizeof ignored);
        drivers.required = false;
        snprintf(source, sizeof source, "%s (the tuning cache%s)", cache,
                 present ? "" : ", absent");
    } else if (only_default) {
        snprintf(source, sizeof source, "none (CLATTN_TUNING=default: no row applies)");
    }
    if (status == CLATTN_SUCCESS && tuning_rows)
        status = apply_text(ctx, tuning_rows, &drivers);
    for (size_t i = 0; status == CLATTN_SUCCESS &&
                       i < sizeof clattn_quirk_table / sizeof clattn_quirk_table[0];
         ++i) {
        snprintf(origin, sizeof origin, "quirk row %zu", i);
        status = apply_row(ctx, clattn_quirk_table[i], origin, &drivers);
    }
    /* CLATTN_MATMUL=tiled|vec picks the matmul kernel whatever the rows say (tests run both). */
    const char *choice = getenv("CLATTN_MATMUL");
    if (choice && strcmp(choice, "tiled") == 0)
        t->matmul_vec = 0;
    else if (choice && strcmp(choice, "vec") == 0)
        t->matmul_vec = 1;
    /* CLATTN_LOOP_TRIP_LIMIT=N imposes a loop limit on any device, so that the split launches
     * it causes are tested where no row asks for them (the *_split ctest entries). */
    const char *trip_limit = getenv("CLATTN_LOOP_TRIP_LIMIT");
    if (status == CLATTN_SUCCESS && trip_limit && trip_limit[0] != '\0') {
        char *end = NULL;
        const unsigned long value = strtoul(trip_limit, &end, 10);
        if (*end != '\0' || value < 64 || value > UINT_MAX)
            return clattn__fail(ctx, CLATTN_ERR_INVALID_ARGUMENT,
                                "CLATTN_LOOP_TRIP_LIMIT='%s' is not a number from 64 to %u",
                                trip_limit, UINT_MAX);
        t->loop_trip_limit = (unsigned)value;
    }
    if (status == CLATTN_SUCCESS)
        status = check_row(ctx);
    if (status == CLATTN_SUCCESS)
        status = check_records(ctx, ignored, sizeof ignored);
    if (status != CLATTN_SUCCESS)
        return status;
    if (drivers.other[0])
        add_note(ignored, sizeof ignored,
                 "%s: tuned on another driver or clattn version (%.200s; this device's is the "
                 "driver key line), not applied: re-run `clattn tune` to re-tune",
                 drivers.other, drivers.other_fields);
    if (drivers.unkeyed[0])
        add_note(ignored, sizeof ignored,
                 "%s: tuned on another driver or clattn version (no driver key: an older "
                 "clattn's row, or one added by hand), not applied: re-run `clattn tune` to "
                 "re-tune",
                 drivers.unkeyed);
    summarise(ctx, source, key, ignored);
    const context_switches sw = {
        .TILE_M = t->tile_m, .TILE_N = t->tile_n, .TILE_K = t->tile_k, .WPT_M = t->wpt_m,
        .WPT_N = t->wpt_n, .VEC_RM = t->vec_rm, .VEC_W = t->vec_width, .VEC_WG = t->vec_wg,
        .TRANSPOSE_WG = t->transpose_wg, .SOFTMAX_WG = t->softmax_wg, .HEADS_WG = t->heads_wg};
    status = clattn__family_options(ctx, &context_family, &sw, NULL, 0, ctx->build_options,
                                    sizeof ctx->build_options);
    if (status != CLATTN_SUCCESS)
        return status;
    return CLATTN_SUCCESS;
}

size_t clattn_tuning_key_count(void)
{
    return NUM_KEYS;
}

clattn_status clattn_tuning_key_get(size_t index, clattn_tuning_key_info *out)
{
    if (out == NULL || index >= NUM_KEYS)
        return CLATTN_ERR_INVALID_ARGUMENT;
    const size_t size = out->struct_size;
    if (size == 0 || size > sizeof *out || size % 8 != 0)
        return CLATTN_ERR_INVALID_ARGUMENT;
    memcpy(out, &public_keys[index], size); /* an earlier version's struct: the fields it has */
    out->struct_size = size;
    return CLATTN_SUCCESS;
}
