/* clattn bench: device-timed matmul, and executions of attention and MHA plans. */
#define _POSIX_C_SOURCE 199309L
#include "cli.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static const char bench_usage[] =
    "Also: mpirun -np N clattn bench --op ring ... (ring attention over MPI; --op ring --help).\n"
    "Times each op on the device: the median of --runs runs (default 10) after --warmup runs\n"
    "(default 1). softmax, attention and mha create their plan once, before any run (that\n"
    "validates, chooses the kernels and compiles them), and time its executions only.\n"
    "Device time comes from OpenCL profiling events (from a marker enqueued before the call to\n"
    "the call's last kernel); wall time is the host's clock around enqueue and wait, with\n"
    "clFinish before and after each run.\n"
    "Where the device's profiling timestamps are unusable (zero, placeholders, or a span longer\n"
    "than the run's wall time; e.g. Mesa 22.3's rusticl), the median and the rates are wall\n"
    "time instead: the table marks them 'wall' (with a note on stderr), --json says\n"
    "\"timer\": \"wall\" (else \"device\"). CLATTN_BENCH_TIMER=wall forces wall time.\n"
    "Sizes: matmul over --mnk (default 512x512x512,1024x1024x1024,4096x64x4096); softmax and\n"
    "attention over (--batch 1, --heads 8, --seq 512,1024 (= seq_q), --seq-k (default = seq),\n"
    "--head-dim 64); mha over --batch, --seq and --embed 512 with --heads (self-attention,\n"
    "PyTorch's packed in_proj weights and biases, an output projection).\n"
    "--kv-heads H (attention): grouped-query attention, k and v with H heads (a divisor of\n"
    "--heads; 1 = multi-query), shared by --heads / H query heads each; the rate counts every\n"
    "query head's work as without it.\n"
    "--softcap C (attention, decode): soft-capped scores, C * tanh(s / C) (C > 0).\n"
    "--alibi (attention): ALiBi biases with the paper's slopes (clattn_alibi_slopes).\n"
    "--sinks (attention, decode): attention sinks, one logit per query head (0.25 h - 1).\n"
    "--rope (mha): rotary embeddings on the projected q and k (clattn_mha_desc.rope).\n"
    "--dropout P (attention, backward): dropout on the weights with probability P (0 .. 1;\n"
    "  clattn_sdpa_desc.dropout_p, seed 0, offset 0), its cost: compare with a run without.\n"
    "additive (not in the default set): additive (Bahdanau) self-attention plans over --batch,\n"
    "--seq, --embed E (q = k = v, (B, L, E)) with --heads H of --head-dim da (W1, W2 (E, H*da),\n"
    "biases, w (H*da)); rate: tanh terms per second, B*H*L*L*da (G/s), the work that\n"
    "dominates.\n";
/* Two strings: C99 compilers need only take 4095 characters in one. */
static const char bench_usage_more[] =
    "decode (not in the default set): one generation step per run, as a model's attention\n"
    "layer takes it: one new token's key and value appended to a KV cache on the device and\n"
    "one query row per head attending the whole cache through a plan made once on the cache\n"
    "(causal bottom-right; fused: decode splits where the device would idle), in one launch\n"
    "where the fused kernel takes the step (clattn_kv_cache_decode; fused path), or with\n"
    "--two-launch as clattn_kv_cache_append then the plan. Cache lengths: --seq (default\n"
    "1024,2048,4096,8192,16384,32768), the length the last run attends; --batch, --heads,\n"
    "--kv-heads, --head-dim, --dtype (the cache's and q's storage), --path. Rate: tokens/s\n"
    "(batch / step time); GB/s of the cache read, and against a device copy of the cache's K\n"
    "bytes (\"copy_gbps\", read + written;\n"
    "\"cache_vs_copy\"); the kernels one step launches and each one's median device time\n"
    "(\"launches\", \"kernel_ms\", from clattn's kernel trace). With --page-size P,...: the\n"
    "same steps over a paged cache (clattn_kv_cache_desc.page_size; the built-in allocator's\n"
    "pages; fused only), after the contiguous one. --kv-dtype\n"
    "f32,f16,bf16,q8_0,q4_0,fp8_e4m3,fp8_e5m2: the cache's storage, each in turn (q, out and\n"
    "the appended tokens keep --dtype; q8_0 and q4_0 are llama.cpp's blocks, 34 and 18 bytes\n"
    "per 32 values, fp8_* vLLM's fp8 cache, a byte a value (scale 1), quantized by the append;\n"
    "fused only); GB/s counts the bytes the cache stores.\n"
    "";
/* The serving ops' help (C99 compilers need only take 4095 characters in one string). */
static const char bench_usage_serving[] =
    "paged (not in the default set): one decode step's attention (no append) over a paged KV\n"
    "cache of --seq lengths (default as decode's) in pages of --page-size keys (default\n"
    "16,256), each sequence's pages shuffled, after the same keys laid out contiguously: the\n"
    "page size's cost. --page-layout slots (default): vLLM's and FlashAttention's pools\n"
    "(pages, page_size, kv_heads, d), against contiguous (B, L, kv_heads, d); heads: head-major\n"
    "pages (pages, kv_heads, page_size, d; strided views of the same dims, as the KV cache\n"
    "object keeps them) against (B, kv_heads, L, d). Rate: tokens/s and the cache's GB/s.\n"
    "varlen (not in the default set): causal prefill of --batch sequences (the default 1 is\n"
    "taken as 8) whose lengths ramp from L / B to L (--seq L, default 512,1024), packed with\n"
    "cu_seqlens in one fused launch, then right-padded to (B, L, H, d) with their lengths as\n"
    "kv_seqlen (causal from row 0): packing's gain over padding. Rate: real tokens/s (the\n"
    "padding not counted).\n"
    "backward (not in the default set): training's attention step over\n"
    "(--batch, --heads, --seq (= seq_q), --seq-k, --head-dim) with --kv-heads, --causal\n"
    "(top-left), --softcap, --alibi, --sinks, --dropout, --dtype (q, k, v, out, dO and the\n"
    "gradients): the forward with its lse (clattn_sdpa_desc's lse output), then the backward\n"
    "(clattn_sdpa_backward_plan_create: dQ, dK, dV), each plan made once and timed alone. The\n"
    "row's time and rate are the backward's; after them the forward's ms and GFLOP/s, the\n"
    "ratio backward/forward and each plan's workspace bytes (clattn_plan_workspace_size).\n"
    "Flops: forward 4·B·H·Lq·Lk·d, backward 2.5 times that (10·B·H·Lq·Lk·d: FlashAttention-2's\n"
    "convention, the recomputed Q·Kᵀ not counted), both halved with --causal. --path: the\n"
    "backward's fused kernels, its unfused reference path (matmuls around three Lq x Lk float\n"
    "matrices; the forward stays fused), or both (the default).\n";
static const char bench_usage_rest[] =
    "softmax: the normalisation has no entry point of its own; it times the unfused attention\n"
    "plan that returns the attention weights (scores = Q·Kᵀ, softmax written to the weights,\n"
    "weights·V: what replaced clattn_softmax_rows), and --json says \"timed\":\n"
    "\"sdpa_unfused_weights\". The same case then times the softmax step by itself: the plan\n"
    "runs with kernel tracing (clattn_ctx_trace_kernels) and the step is its softmax_rows\n"
    "launch's own profiling event (\"step_ms\", median; \"step_gbps\" of the 2·B·H·Lq·Lk·4\n"
    "bytes it reads and writes in place), next to a device copy of the same bytes\n"
    "(\"copy_gbps\", \"step_vs_copy\"; the table's row ends with them). A step above the copy\n"
    "rate is flagged (\"step_above_copy\", a WARNING in the table): it cannot be real.\n"
    "Rates: matmul 2MNK flop; attention 2·B·H·Lq·Lk·(dk+dv); mha adds the 4 projections\n"
    "(8·B·L·E²); softmax in GB/s of the float scores' traffic on that path (written, read and\n"
    "written by the normalisation, read: 4·B·H·Lq·Lk·4 bytes).\n"
    "--path: attention and mha run on the fused (flash) kernel, the unfused path (scores\n"
    "materialised), or both (default). A path the device refuses (e.g. scores larger than the\n"
    "device's largest buffer) is reported as refused, not as a failure.\n"
    "--causal (attention): PyTorch's is_causal (query i sees keys j <= i); the rate still counts\n"
    "every score (4·B·H·Lq·Lk·d, as peers are compared). --mask (attention): padding, a U8\n"
    "key_padding_mask (batch, seq_k) ignoring the last seq_k/8 keys; additive, a float32\n"
    "(seq_q, seq_k) attn_mask of values in [-1, 1) added to the scores. JSON lines name them\n"
    "(\"causal\": true, \"mask\": ...) when set.\n"
    "--dtype: the storage type of q, k, v and out for softmax and attention, and of the input\n"
    "and the output for mha (its weights and biases stay f32): f32 (default), f16, bf16, or a\n"
    "list. Arithmetic is float32 on every type; matmul is f32.\n"
    "Memory: 'dev MiB' is what the case holds on the device (inputs, outputs and clattn's\n"
    "workspace); 'rss MiB' is the process's peak resident memory so far (run one case per\n"
    "process to attribute it).\n"
    "--json prints one JSON object per line per case instead of the table. A progress line goes\n"
    "to stderr while a case runs longer than a second.\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options.\n";

#define MAX_SIZES 16

typedef struct bench_options {
    cli_exec exec;   /* --device */
    cli_bench shape; /* --batch --heads --kv-heads --head-dim --runs --warmup --json */
    cli_score score; /* attention: --causal (top-left), --softcap, --alibi (the paper's) */
    bool ops[9]; /* matmul, softmax, attention, mha, decode, additive, paged, varlen, backward */
    size_t page_sizes[MAX_SIZES], num_page_sizes; /* paged: 0 = contiguous */
    bool page_layouts[2]; /* paged: slots (vLLM's (pages, slot, Hkv, d)), heads (head-major) */
    bool page_layout_given;
    bool seq_given, op_given;
    size_t mnk[MAX_SIZES][3], num_mnk;
    size_t embed, seq_k;
    size_t seq[MAX_SIZES], num_seq;
    bool paths[2];  /* fused, unfused */
    bool dtypes[3]; /* f32, f16, bf16 */
    bool kv_dtypes[7]; /* decode: the cache's f32 .. q4_0, fp8_e4m3, fp8_e5m2 (--kv-dtype) */
    bool kv_dtype_given;
    bool sinks;     /* attention, decode: attention sinks (sinks_buffer's logits) */
    bool two_launch; /* decode: append, then attend (no fused step) */
    bool rope;      /* mha: rotary embeddings on the projected q and k */
    int mask;       /* attention: 0 none, 1 key padding (U8), 2 additive (F32) */
    double dropout; /* attention, backward: dropout_p (seed 0, offset 0) */
} bench_options;

static const char *const mask_names[3] = {"none", "padding", "additive"};

static const char *const op_names[9] = {"matmul", "softmax",  "attention", "mha",     "decode",
                                        "additive", "paged", "varlen",    "backward"};
static const char *const dtype_names[3] = {"f32", "f16", "bf16"};
static const clattn_dtype dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16};
#define KV_DTYPES 7
static const char *const kv_dtype_names[KV_DTYPES] = {"f32",  "f16",      "bf16",    "q8_0",
                                                      "q4_0", "fp8_e4m3", "fp8_e5m2"};
static const clattn_dtype kv_dtypes[KV_DTYPES] = {
    CLATTN_DTYPE_F32,  CLATTN_DTYPE_F16,      CLATTN_DTYPE_BF16,    CLATTN_DTYPE_Q8_0,
    CLATTN_DTYPE_Q4_0, CLATTN_DTYPE_FP8_E4M3, CLATTN_DTYPE_FP8_E5M2};

/* Bytes a cache of `type` stores per element (the block types: 34 or 18 per 32). */
static double cache_elem_bytes(clattn_dtype type)
{
    return type == CLATTN_DTYPE_Q8_0   ? 34.0 / 32.0
           : type == CLATTN_DTYPE_Q4_0 ? 18.0 / 32.0
                                       : (double)clattn_dtype_size(type);
}

typedef struct bench_state {
    clattn_ctx *ctx;
    cl_context context;
    cl_command_queue queue;
    const bench_options *options;
    bool wall_noted; /* the text output's note on wall-clock timing is printed */
} bench_state;

/* One measured call, enqueued after a marker event and returning its final event. */
typedef clattn_status (*bench_fn)(bench_state *b, void *args, cl_uint num_wait,
                                  const cl_event *wait, cl_event *event);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int compare_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, size_t count)
{
    qsort(values, count, sizeof *values, compare_double);
    return count % 2 ? values[count / 2] : 0.5 * (values[count / 2 - 1] + values[count / 2]);
}

/* Runs fn warmup + runs times; medians in ms. Prints progress after the first second.
 * *device_ms is the median device time, or, where any run's profiling span is unusable (some
 * implementations return zeros or placeholders) or CLATTN_BENCH_TIMER=wall, the median wall
 * time, and *wall_timer says which. Returns the first failing call's status (with the
 * context's message in b->ctx). */
static clattn_status measure(bench_state *b, const char *label, bench_fn fn, void *args,
                             double *device_ms, double *wall_ms, bool *wall_timer)
{
    const char *timer = getenv("CLATTN_BENCH_TIMER");
    bool use_wall = timer && strcmp(timer, "wall") == 0;
    const size_t runs = b->options->shape.runs, total = b->options->shape.warmup + runs;
    double *device = calloc(runs, sizeof *device), *wall = calloc(runs, sizeof *wall);
    if (!device || !wall) {
        free(device);
        free(wall);
        return CLATTN_ERR_HOST_MEMORY;
    }
    const double started = now_s();
    double last_progress = started;
    clattn_status status = CLATTN_SUCCESS;
    for (size_t r = 0; r < total && status == CLATTN_SUCCESS; ++r) {
        cl_event start = NULL, end = NULL;
        cl_int err = clFinish(b->queue);
        const double t0 = now_s();
        if (err == CL_SUCCESS)
            err = clEnqueueMarkerWithWaitList(b->queue, 0, NULL, &start);
        status = err == CL_SUCCESS ? fn(b, args, 1, &start, &end) : (clattn_status)err;
        if (status == CLATTN_SUCCESS)
            status = (clattn_status)clWaitForEvents(1, &end);
        if (status == CLATTN_SUCCESS)
            status = (clattn_status)clFinish(b->queue);
        if (status == CLATTN_SUCCESS && r >= b->options->shape.warmup) {
            const double wall_run = (now_s() - t0) * 1e3;
            cl_ulong begin_ns = 0, end_ns = 0;
            const bool queried =
                clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_END, sizeof begin_ns, &begin_ns,
                                        NULL) == CL_SUCCESS &&
                clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof end_ns, &end_ns,
                                        NULL) == CL_SUCCESS;
            const double span = end_ns > begin_ns ? (double)(end_ns - begin_ns) / 1e6 : 0.0;
            /* The commands ran inside the wall bracket: a longer span (one timestamp zero)
             * or none at all (placeholder timestamps) is no measurement. */
            if (!queried || span <= 0.0 || span > 2.0 * wall_run + 1.0)
                use_wall = true;
            device[r - b->options->shape.warmup] = span;
            wall[r - b->options->shape.warmup] = wall_run;
        }
        if (start)
            clReleaseEvent(start);
        if (end)
            clReleaseEvent(end);
        const double now = now_s();
        if (now - last_progress >= 1.0) {
            fprintf(stderr, "clattn bench: %s: run %zu of %zu (%.1f s)\n", label, r + 1, total,
                    now - started);
            last_progress = now;
        }
    }
    if (status == CLATTN_SUCCESS) {
        *wall_ms = median(wall, runs);
        *device_ms = use_wall ? *wall_ms : median(device, runs);
        *wall_timer = use_wall;
    }
    free(device);
    free(wall);
    return status;
}

/* A fresh clattn context on the profiling queue for each case, so that its workspace belongs
 * to that case alone. */
static int fresh_context(bench_state *b)
{
    clattn_ctx_release(b->ctx);
    b->ctx = NULL;
    char message[512];
    clattn_status status = clattn_ctx_create_from_queue(b->queue, &b->ctx, message, sizeof message);
    return status == CLATTN_SUCCESS
               ? CLI_OK
               : cli_fail("bench", CLI_FAILED, "%s: %s", clattn_status_string(status), message);
}

static double peak_rss_mib(void)
{
    struct rusage usage;
    return getrusage(RUSAGE_SELF, &usage) == 0 ? usage.ru_maxrss / 1024.0 : 0.0;
}

/* A device buffer of `count` elements of dtype (F32, F16 or BF16), uniform in [-1, 1). */
static cl_mem random_buffer(bench_state *b, size_t count, clattn_dtype dtype,
                            unsigned long long seed)
{
    const size_t elem = clattn_dtype_size(dtype);
    unsigned char *host = malloc(count * elem);
    if (host == NULL)
        return NULL;
    unsigned long long state = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const float value = (float)((state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
        uint16_t half = 0; /* (the io library's rounding, as the .npy writer's) */
        clattn_io_round16(&value, 1, dtype == CLATTN_DTYPE_F16 ? CLATTN_IO_F16 : CLATTN_IO_BF16,
                          &half);
        if (dtype == CLATTN_DTYPE_F32)
            memcpy(host + i * elem, &value, sizeof value);
        else
            memcpy(host + i * elem, &half, sizeof half);
    }
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(b->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, count * elem,
                                host, &err);
    free(host);
    return err == CL_SUCCESS ? mem : NULL;
}

/* A device buffer of `bytes` bytes for an output (its contents are overwritten). */
/* Attention sinks for `heads` query heads: head h's logit 0.25 h - 1 (F32, (heads)); NULL
 * when the buffer cannot be made. */
static cl_mem sinks_buffer(bench_state *b, size_t heads)
{
    float *logits = malloc(heads * sizeof(float));
    if (logits == NULL)
        return NULL;
    for (size_t h = 0; h < heads; ++h)
        logits[h] = 0.25f * (float)h - 1.0f;
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                heads * sizeof(float), logits, &err);
    free(logits);
    return err == CL_SUCCESS ? mem : NULL;
}

static cl_mem output_buffer(bench_state *b, size_t bytes)
{
    cl_int err = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(b->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    return err == CL_SUCCESS ? mem : NULL;
}

static bool all_made(const cl_mem *mems, size_t count)
{
    for (size_t i = 0; i < count; ++i)
        if (mems[i] == NULL)
            return false;
    return true;
}

typedef struct case_result {
    const char *op, *path; /* path NULL for ops without one */
    char size_json[256], size_text[128];
    double device_ms, wall_ms, rate, device_mib; /* device_ms: wall time if wall_timer */
    bool wall_timer;
    const char *unit;                     /* "gflops", "gbps", "tokens_per_s" or "gterms_per_s" */
    char extra_json[512], extra_text[128]; /* more fields after the standard ones (softmax) */
} case_result;

/* A JSON number, or null for inf and nan (which JSON cannot hold). */
static const char *json_number(char *buffer, size_t size, const char *format, double value)
{
    if (isfinite(value))
        snprintf(buffer, size, format, value);
    else
        snprintf(buffer, size, "null");
    return buffer;
}

/* Prints a measured case, or (status != success) why the device refused it. Failures other
 * than a refusal end the run. */
static int report(bench_state *b, case_result *r, clattn_status status, size_t buffer_bytes)
{
    const bench_options *o = b->options;
    char label[160];
    snprintf(label, sizeof label, "%s%s%s", r->op, r->path ? "/" : "", r->path ? r->path : "");
    const bool refused = status == CLATTN_ERR_TOO_LARGE || status == CLATTN_ERR_UNSUPPORTED ||
                         status == CL_OUT_OF_RESOURCES ||
                         status == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
                         status == CLATTN_ERR_HOST_MEMORY;
    if (status != CLATTN_SUCCESS && !refused)
        return cli_fail("bench", CLI_FAILED, "%s %s: %s: %s", label, r->size_text,
                        clattn_status_string(status), b->ctx ? clattn_last_error(b->ctx) : "");
    char path_json[64] = "";
    if (r->path)
        snprintf(path_json, sizeof path_json, ", \"path\": \"%s\"", r->path);
    if (refused) {
        const char *why = b->ctx && clattn_last_error(b->ctx)[0] ? clattn_last_error(b->ctx)
                                                                 : clattn_status_string(status);
        if (o->shape.json) {
            printf("{\"op\": \"%s\"%s, %s, \"refused\": \"", r->op, path_json, r->size_json);
            for (const char *c = why; *c; ++c)
                if (*c != '"' && *c != '\\' && (unsigned char)*c >= 0x20)
                    putchar(*c);
            printf("\"}\n");
        } else {
            printf("%-18s %-32s refused: %s\n", label, r->size_text, why);
        }
        fflush(stdout);
        return CLI_OK;
    }
    size_t workspace = b->ctx ? clattn_ctx_workspace_bytes(b->ctx) : 0;
    r->device_mib = (double)(buffer_bytes + workspace) / 1048576.0;
    const double rss = peak_rss_mib();
    if (o->shape.json) {
        char median_text[32], wall_text[32], rate_text[32];
        printf("{\"op\": \"%s\"%s, %s, \"runs\": %zu, \"median_ms\": %s, \"timer\": \"%s\", "
               "\"wall_ms\": %s, \"%s\": %s, \"device_mib\": %.1f, \"peak_rss_mib\": %.1f%s}\n",
               r->op, path_json, r->size_json, o->shape.runs,
               json_number(median_text, sizeof median_text, "%.6f", r->device_ms),
               r->wall_timer ? "wall" : "device",
               json_number(wall_text, sizeof wall_text, "%.6f", r->wall_ms), r->unit,
               json_number(rate_text, sizeof rate_text, "%.6g", r->rate), r->device_mib, rss,
               r->extra_json);
    } else {
        if (r->wall_timer && !b->wall_noted) {
            fprintf(stderr,
                    "clattn bench: note: times marked 'wall' are wall-clock (clFinish before and "
                    "after each run): %s\n",
                    getenv("CLATTN_BENCH_TIMER")
                        ? "CLATTN_BENCH_TIMER=wall"
                        : "this device's profiling timestamps are unusable");
            b->wall_noted = true;
        }
        printf("%-18s %-32s %10.3f%-5s %10.3f %9.2f %-7s %9.1f %9.1f%s\n", label, r->size_text,
               r->device_ms, r->wall_timer ? " wall" : "", r->wall_ms,
               isfinite(r->rate) ? r->rate : 0.0,
               strcmp(r->unit, "gbps") == 0           ? "GB/s"
               : strcmp(r->unit, "tokens_per_s") == 0 ? "tok/s"
               : strcmp(r->unit, "gterms_per_s") == 0 ? "Gterm/s"
                                                      : "GFLOP/s",
               r->device_mib, rss, r->extra_text);
    }
    fflush(stdout);
    return CLI_OK;
}

/* --- matmul --------------------------------------------------------------------------------- */

typedef struct matmul_case {
    clattn_matmul_desc desc;
    clattn_tensor a, b, c;
} matmul_case;

static clattn_status run_matmul(bench_state *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    matmul_case *c = p;
    return clattn_matmul(b->ctx, &c->desc, &c->a, &c->b, NULL, &c->c, nw, w, e);
}

static int bench_matmul(bench_state *b, size_t m, size_t n, size_t k)
{
    matmul_case c = {.desc = {.struct_size = sizeof(clattn_matmul_desc), .alpha = 1.0f}};
    case_result r = {.op = "matmul", .unit = "gflops"};
    snprintf(r.size_json, sizeof r.size_json,
             "\"m\": %zu, \"n\": %zu, \"k\": %zu, \"dtype\": \"f32\"", m, n, k);
    snprintf(r.size_text, sizeof r.size_text, "m=%zu n=%zu k=%zu", m, n, k);
    int rc = fresh_context(b);
    if (rc != CLI_OK)
        return rc;
    cl_mem mem[3] = {random_buffer(b, m * k, CLATTN_DTYPE_F32, 1),
                     random_buffer(b, k * n, CLATTN_DTYPE_F32, 2),
                     random_buffer(b, m * n, CLATTN_DTYPE_F32, 3)};
    c.a = clattn_tensor_make(mem[0], 0, CLATTN_DTYPE_F32, 2, m, k, 0, 0);
    c.b = clattn_tensor_make(mem[1], 0, CLATTN_DTYPE_F32, 2, k, n, 0, 0);
    c.c = clattn_tensor_make(mem[2], 0, CLATTN_DTYPE_F32, 2, m, n, 0, 0);
    clattn_status status = all_made(mem, 3) ? measure(b, r.size_text, run_matmul, &c, &r.device_ms,
                                                      &r.wall_ms, &r.wall_timer)
                                            : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    r.rate = status == CLATTN_SUCCESS ? 2.0 * m * n * k / r.device_ms / 1e6 : 0.0;
    rc = report(b, &r, status, (m * k + k * n + m * n) * sizeof(float));
    cli_release_buffers(mem, 3);
    return rc;
}

/* --- plans: softmax, attention, MHA --------------------------------------------------------- */

/* A plan created once per case and the tensors each timed execution binds. */
typedef struct plan_case {
    clattn_plan *plan;
    clattn_tensors tensors;
} plan_case;

static clattn_status run_plan(bench_state *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    (void)b;
    plan_case *c = p;
    return clattn_plan_execute(c->plan, c->tensors.by_role, CLATTN_ROLE_COUNT, NULL, NULL, nw, w,
                               e);
}

/* The softmax step of the unfused plan timed by itself: the plan runs with kernel tracing on
 * (clattn_ctx_trace_kernels) and the step is the device time of its own normalisation kernel
 * launch ("softmax_rows", END - START of that launch's profiling event), never a difference of
 * two totals; next to it, a device copy of as many bytes (clEnqueueCopyBuffer of the scores:
 * reads and writes B·H·Lq·Lk floats, as the in-place softmax does). */
typedef struct copy_case {
    cl_mem from, to;
    size_t bytes;
} copy_case;

static clattn_status run_copy(bench_state *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    copy_case *c = p;
    return (clattn_status)clEnqueueCopyBuffer(b->queue, c->from, c->to, 0, 0, c->bytes, nw, w, e);
}

/* The median, over --runs executions after --warmup, of the summed device time of the plan's
 * softmax_rows launches; false where the device gives no kernel times. */
static bool softmax_kernel_ms(bench_state *b, plan_case *c, double *step_ms)
{
    const bench_options *o = b->options;
    double *times = calloc(o->shape.runs, sizeof *times);
    clattn_kernel_time kernels[64];
    bool ok = times && clattn_ctx_trace_kernels(b->ctx, 1) == CLATTN_SUCCESS;
    size_t kept = 0;
    for (size_t run = 0; ok && run < o->shape.warmup + o->shape.runs; ++run) {
        size_t count = 0;
        double sum = 0.0;
        bool found = false;
        ok = run_plan(b, c, 0, NULL, NULL) == CLATTN_SUCCESS && clFinish(b->queue) == CL_SUCCESS &&
             clattn_ctx_kernel_times(b->ctx, kernels, 64, &count, NULL) == CLATTN_SUCCESS;
        for (size_t k = 0; ok && k < count; ++k)
            if (strcmp(kernels[k].name, "softmax_rows") == 0) {
                sum += kernels[k].ms;
                found = true;
            }
        ok = ok && found && sum > 0.0;
        if (ok && run >= o->shape.warmup)
            times[kept++] = sum;
    }
    clattn_ctx_trace_kernels(b->ctx, 0);
    if (ok && kept > 0)
        *step_ms = median(times, kept);
    free(times);
    return ok && kept > 0;
}

/* Adds to r (the softmax case, measured): "step_ms" (the normalisation kernel's own device
 * time), "step_gbps" of the 2·B·H·Lq·Lk·4 bytes it reads and writes, "copy_gbps" and
 * "step_vs_copy"; a step faster than the copy cannot be (it moves the same bytes): it is
 * printed with a warning and "step_above_copy": true. Leaves r as it is where the device
 * gives no kernel times (wall-clock timing). */
static void measure_softmax_step(bench_state *b, plan_case *plan, size_t scores, case_result *r)
{
    if (r->wall_timer)
        return;
    copy_case c = {.from = plan->tensors.weights.mem, .bytes = scores * sizeof(float)};
    double step_ms = 0.0, copy_ms = 0.0, wall_ms = 0.0;
    bool wall_timer = false;
    c.to = output_buffer(b, c.bytes);
    const bool ok = c.to != NULL && softmax_kernel_ms(b, plan, &step_ms) &&
                    measure(b, "softmax step: copy", run_copy, &c, &copy_ms, &wall_ms,
                            &wall_timer) == CLATTN_SUCCESS &&
                    !wall_timer && copy_ms > 0.0;
    if (c.to)
        clReleaseMemObject(c.to);
    if (!ok)
        return;
    const double bytes = 2.0 * scores * sizeof(float);
    const double step_gbps = bytes / step_ms / 1e6, copy_gbps = bytes / copy_ms / 1e6;
    const bool above = step_gbps > copy_gbps;
    char step_text[32], step_rate[32], copy_rate[32], ratio[32];
    snprintf(r->extra_json, sizeof r->extra_json,
             ", \"step_ms\": %s, \"step_gbps\": %s, \"copy_gbps\": %s, \"step_vs_copy\": %s, "
             "\"step_timed\": \"softmax_rows kernel event\", \"step_above_copy\": %s",
             json_number(step_text, sizeof step_text, "%.6f", step_ms),
             json_number(step_rate, sizeof step_rate, "%.6g", step_gbps),
             json_number(copy_rate, sizeof copy_rate, "%.6g", copy_gbps),
             json_number(ratio, sizeof ratio, "%.3f", step_gbps / copy_gbps),
             above ? "true" : "false");
    snprintf(r->extra_text, sizeof r->extra_text, "  step %.2f GB/s = %.2fx copy %.2f GB/s%s",
             step_gbps, step_gbps / copy_gbps, copy_gbps,
             above ? " (WARNING: above the copy rate)" : "");
}

/* Sets t's buffer (the layout is the plan's) and adds its bytes to *bytes. */
static void bind(clattn_tensor *t, cl_mem mem, size_t count, size_t *bytes)
{
    t->mem = mem;
    *bytes += count * clattn_dtype_size(t->dtype);
}

/* softmax (the unfused plan with the weights) and attention (the plan on `path`). */
static int bench_sdpa(bench_state *b, bool softmax, size_t seq_q, size_t seq_k, int dtype,
                      clattn_path path)
{
    const bench_options *o = b->options;
    const size_t bh = o->shape.batch * o->shape.heads, d = o->shape.head_dim;
    const size_t kv_heads = !softmax && o->shape.kv_heads ? o->shape.kv_heads : o->shape.heads;
    const clattn_dtype type = dtypes[dtype];
    char kv_json[96] = "", kv_text[64] = "";
    if (kv_heads != o->shape.heads) {
        snprintf(kv_json, sizeof kv_json, ", \"kv_heads\": %zu", kv_heads);
        snprintf(kv_text, sizeof kv_text, " Hkv=%zu", kv_heads);
    }
    const float softcap = softmax ? 0.0f : o->score.softcap;
    if (softcap > 0.0f) {
        const size_t used = strlen(kv_json), used_text = strlen(kv_text);
        snprintf(kv_json + used, sizeof kv_json - used, ", \"softcap\": %g", (double)softcap);
        snprintf(kv_text + used_text, sizeof kv_text - used_text, " cap=%g", (double)softcap);
    }
    const bool alibi = !softmax && o->score.alibi;
    if (alibi) {
        const size_t used = strlen(kv_json), used_text = strlen(kv_text);
        snprintf(kv_json + used, sizeof kv_json - used, ", \"alibi\": true");
        snprintf(kv_text + used_text, sizeof kv_text - used_text, " alibi");
    }
    const bool sinks = !softmax && o->sinks;
    if (sinks) {
        const size_t used = strlen(kv_json), used_text = strlen(kv_text);
        snprintf(kv_json + used, sizeof kv_json - used, ", \"sinks\": true");
        snprintf(kv_text + used_text, sizeof kv_text - used_text, " sinks");
    }
    const double dropout = softmax ? 0.0 : o->dropout;
    if (dropout > 0.0) {
        const size_t used = strlen(kv_json), used_text = strlen(kv_text);
        snprintf(kv_json + used, sizeof kv_json - used, ", \"dropout\": %g", dropout);
        snprintf(kv_text + used_text, sizeof kv_text - used_text, " drop=%g", dropout);
    }
    case_result r = {.op = softmax ? "softmax" : "attention",
                     .unit = softmax ? "gbps" : "gflops",
                     .path = softmax                     ? NULL
                             : path == CLATTN_PATH_FUSED ? "fused"
                                                         : "unfused"};
    snprintf(r.size_json, sizeof r.size_json,
             "\"batch\": %zu, \"heads\": %zu, \"seq_q\": %zu, \"seq_k\": %zu, \"head_dim\": %zu, "
             "\"dtype\": \"%s\"%s%s%s%s%s%s",
             o->shape.batch, o->shape.heads, seq_q, seq_k, d, dtype_names[dtype], kv_json,
             softmax ? ", \"timed\": \"sdpa_unfused_weights\"" : "",
             !softmax && o->score.causal ? ", \"causal\": true" : "",
             !softmax && o->mask ? ", \"mask\": \"" : "",
             !softmax && o->mask ? mask_names[o->mask] : "", !softmax && o->mask ? "\"" : "");
    snprintf(r.size_text, sizeof r.size_text, "B=%zu H=%zu%s Lq=%zu Lk=%zu d=%zu%s%s%s%s%s",
             o->shape.batch, o->shape.heads, kv_text, seq_q, seq_k, d,
             type == CLATTN_DTYPE_F32 ? "" : " ",
             type == CLATTN_DTYPE_F32 ? "" : dtype_names[dtype],
             !softmax && o->score.causal ? " causal" : "", !softmax && o->mask ? " mask=" : "",
             !softmax && o->mask ? mask_names[o->mask] : "");
    int rc = fresh_context(b);
    if (rc != CLI_OK)
        return rc;
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.path = softmax ? CLATTN_PATH_UNFUSED : path;
    desc.softcap = softcap;
    desc.dropout_p = dropout;
    const int mask = softmax ? 0 : o->mask;
    desc.causal = !softmax && o->score.causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    clattn_tensors *t = &desc_tensors;
    t->q = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, o->shape.heads, seq_q, d);
    t->k = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, kv_heads, seq_k, d);
    t->v = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, kv_heads, seq_k, d);
    t->out = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, o->shape.heads, seq_q, d);
    if (softmax)
        t->weights = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 4, o->shape.batch,
                                        o->shape.heads, seq_q, seq_k);
    if (mask == 1)
        t->key_padding_mask =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_U8, 2, o->shape.batch, seq_k, 0, 0);
    if (mask == 2)
        t->attn_mask = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, seq_q, seq_k, 0, 0);
    if (alibi)
        t->alibi_slopes = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, o->shape.heads, 0, 0, 0);
    if (sinks)
        t->sinks = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, o->shape.heads, 0, 0, 0);
    plan_case c = {.tensors = desc_tensors};
    /* The plan first: a case the device cannot hold is refused before any buffer is made. */
    clattn_status status = clattn_sdpa_plan_create(b->ctx, &desc, &c.plan);
    const size_t q_count = bh * seq_q * d, kv_count = o->shape.batch * kv_heads * seq_k * d;
    const size_t scores = bh * seq_q * seq_k;
    cl_mem mem[8] = {NULL};
    size_t bytes = 0;
    if (status == CLATTN_SUCCESS) {
        if (sinks) {
            mem[7] = sinks_buffer(b, o->shape.heads);
            bind(&c.tensors.sinks, mem[7], o->shape.heads, &bytes);
        }
        if (alibi) {
            float *slopes = malloc(o->shape.heads * sizeof(float));
            cl_int err = CL_SUCCESS;
            if (slopes && clattn_alibi_slopes(o->shape.heads, 8.0f, slopes) == CLATTN_SUCCESS)
                mem[6] = clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                        o->shape.heads * sizeof(float), slopes, &err);
            free(slopes);
            if (err != CL_SUCCESS)
                mem[6] = NULL;
            bind(&c.tensors.alibi_slopes, mem[6], o->shape.heads, &bytes);
        }
        mem[0] = random_buffer(b, q_count, type, 6);
        mem[1] = random_buffer(b, kv_count, type, 7);
        mem[2] = random_buffer(b, kv_count, type, 8);
        mem[3] = output_buffer(b, q_count * clattn_dtype_size(type));
        mem[4] = softmax ? output_buffer(b, scores * sizeof(float)) : NULL;
        bind(&c.tensors.q, mem[0], q_count, &bytes);
        bind(&c.tensors.k, mem[1], kv_count, &bytes);
        bind(&c.tensors.v, mem[2], kv_count, &bytes);
        bind(&c.tensors.out, mem[3], q_count, &bytes);
        if (softmax)
            bind(&c.tensors.weights, mem[4], scores, &bytes);
        if (mask == 1) { /* the last seq_k/8 keys of every batch are padding */
            unsigned char *pad = malloc(o->shape.batch * seq_k);
            for (size_t i = 0; pad && i < o->shape.batch * seq_k; ++i)
                pad[i] = i % seq_k >= seq_k - seq_k / 8;
            cl_int err = CL_SUCCESS;
            mem[5] = pad ? clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                          o->shape.batch * seq_k, pad, &err)
                         : NULL;
            free(pad);
            if (err != CL_SUCCESS)
                mem[5] = NULL;
            bind(&c.tensors.key_padding_mask, mem[5], o->shape.batch * seq_k, &bytes);
        } else if (mask == 2) {
            mem[5] = random_buffer(b, seq_q * seq_k, CLATTN_DTYPE_F32, 9);
            bind(&c.tensors.attn_mask, mem[5], seq_q * seq_k, &bytes);
        }
        status =
            all_made(mem, softmax ? 5 : 4) && (mask == 0 || mem[5]) && (!alibi || mem[6]) &&
                    (!sinks || mem[7])
                ? measure(b, r.size_text, run_plan, &c, &r.device_ms, &r.wall_ms, &r.wall_timer)
                : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    }
    if (status == CLATTN_SUCCESS)
        r.rate = softmax ? 4.0 * scores * sizeof(float) / r.device_ms / 1e6
                         : 4.0 * bh * seq_q * seq_k * d / r.device_ms / 1e6;
    if (status == CLATTN_SUCCESS && softmax)
        measure_softmax_step(b, &c, scores, &r);
    rc = report(b, &r, status, bytes);
    clattn_plan_release(c.plan);
    cli_release_buffers(mem, 8);
    return rc;
}

/* backward: the fused forward with lse, then the backward, each plan made once and timed on
 * its own; the row is the backward's, the forward's time and rate, the ratio and the plans'
 * workspace bytes after it. */
static int bench_backward(bench_state *b, size_t seq_q, size_t seq_k, int dtype,
                          clattn_path path)
{
    const bench_options *o = b->options;
    const size_t bh = o->shape.batch * o->shape.heads, d = o->shape.head_dim;
    const size_t kv_heads = o->shape.kv_heads ? o->shape.kv_heads : o->shape.heads;
    const clattn_dtype type = dtypes[dtype];
    case_result r = {.op = "backward",
                     .unit = "gflops",
                     .path = path == CLATTN_PATH_FUSED ? "fused" : "unfused"};
    char kv_text[32] = "";
    if (kv_heads != o->shape.heads)
        snprintf(kv_text, sizeof kv_text, " Hkv=%zu", kv_heads);
    snprintf(r.size_json, sizeof r.size_json,
             "\"batch\": %zu, \"heads\": %zu, \"kv_heads\": %zu, \"seq_q\": %zu, "
             "\"seq_k\": %zu, \"head_dim\": %zu, \"dtype\": \"%s\", \"causal\": %s, "
             "\"softcap\": %g, \"alibi\": %s, \"sinks\": %s, \"dropout\": %g",
             o->shape.batch, o->shape.heads, kv_heads, seq_q, seq_k, d, dtype_names[dtype],
             o->score.causal ? "true" : "false", (double)o->score.softcap,
             o->score.alibi ? "true" : "false", o->sinks ? "true" : "false", o->dropout);
    char drop_text[32] = "";
    if (o->dropout > 0.0)
        snprintf(drop_text, sizeof drop_text, " drop=%g", o->dropout);
    snprintf(r.size_text, sizeof r.size_text, "B=%zu H=%zu%s Lq=%zu Lk=%zu d=%zu%s%s%s%s%s%s%s",
             o->shape.batch, o->shape.heads, kv_text, seq_q, seq_k, d,
             type == CLATTN_DTYPE_F32 ? "" : " ",
             type == CLATTN_DTYPE_F32 ? "" : dtype_names[dtype], o->score.causal ? " causal" : "",
             o->score.softcap > 0.0f ? " cap" : "", o->score.alibi ? " alibi" : "",
             o->sinks ? " sinks" : "", drop_text);
    int rc = fresh_context(b);
    if (rc != CLI_OK)
        return rc;
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    plan_case fwd = {0}, bwd = {0};
    clattn_tensors *t = &fwd.tensors;
    CLATTN_BIND_ROLES(desc, fwd.tensors);
    desc.path = CLATTN_PATH_FUSED;
    desc.softcap = o->score.softcap;
    desc.dropout_p = o->dropout; /* the same mask in both plans (seed 0, offset 0) */
    desc.causal = o->score.causal ? CLATTN_CAUSAL_TOP_LEFT : CLATTN_CAUSAL_NONE;
    t->q = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, o->shape.heads, seq_q, d);
    t->k = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, kv_heads, seq_k, d);
    t->v = t->k;
    t->out = t->q;
    t->lse =
        clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, o->shape.batch, o->shape.heads, seq_q, 0);
    if (o->score.alibi)
        t->alibi_slopes = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, o->shape.heads, 0, 0, 0);
    if (o->sinks)
        t->sinks = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, o->shape.heads, 0, 0, 0);
    /* The plans first: a case the device cannot hold is refused before any buffer is made. */
    clattn_status status = clattn_sdpa_plan_create(b->ctx, &desc, &fwd.plan);
    bwd.tensors = fwd.tensors;
    bwd.tensors.grad_out = bwd.tensors.grad_q = t->q;
    bwd.tensors.grad_k = bwd.tensors.grad_v = t->k;
    CLATTN_BIND_ROLES(desc, bwd.tensors);
    desc.path = path; /* the forward is fused (with lse) either way */
    if (status == CLATTN_SUCCESS)
        status = clattn_sdpa_backward_plan_create(b->ctx, &desc, &bwd.plan);
    const size_t q_count = bh * seq_q * d, kv_count = o->shape.batch * kv_heads * seq_k * d;
    cl_mem mem[11] = {NULL};
    size_t bytes = 0;
    double fwd_ms = 0.0, fwd_wall_ms = 0.0;
    bool fwd_wall = false;
    if (status == CLATTN_SUCCESS) {
        mem[0] = random_buffer(b, q_count, type, 6);
        mem[1] = random_buffer(b, kv_count, type, 7);
        mem[2] = random_buffer(b, kv_count, type, 8);
        mem[3] = output_buffer(b, q_count * clattn_dtype_size(type));
        mem[4] = output_buffer(b, bh * seq_q * sizeof(float));
        mem[5] = random_buffer(b, q_count, type, 9); /* dO */
        mem[6] = output_buffer(b, q_count * clattn_dtype_size(type));
        mem[7] = output_buffer(b, kv_count * clattn_dtype_size(type));
        mem[8] = output_buffer(b, kv_count * clattn_dtype_size(type));
        bind(&t->q, mem[0], q_count, &bytes);
        bind(&t->k, mem[1], kv_count, &bytes);
        bind(&t->v, mem[2], kv_count, &bytes);
        bind(&t->out, mem[3], q_count, &bytes);
        bind(&t->lse, mem[4], bh * seq_q, &bytes);
        clattn_tensors *g = &bwd.tensors;
        bind(&g->grad_out, mem[5], q_count, &bytes);
        bind(&g->grad_q, mem[6], q_count, &bytes);
        bind(&g->grad_k, mem[7], kv_count, &bytes);
        bind(&g->grad_v, mem[8], kv_count, &bytes);
        if (o->sinks) {
            mem[9] = sinks_buffer(b, o->shape.heads);
            bind(&t->sinks, mem[9], o->shape.heads, &bytes);
        }
        if (o->score.alibi) {
            float *slopes = malloc(o->shape.heads * sizeof(float));
            cl_int err = CL_SUCCESS;
            if (slopes && clattn_alibi_slopes(o->shape.heads, 8.0f, slopes) == CLATTN_SUCCESS)
                mem[10] = clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                         o->shape.heads * sizeof(float), slopes, &err);
            free(slopes);
            if (err != CL_SUCCESS)
                mem[10] = NULL;
            bind(&t->alibi_slopes, mem[10], o->shape.heads, &bytes);
        }
        /* the backward reads the forward's buffers: the same bindings, plus its own */
        g->q = t->q, g->k = t->k, g->v = t->v, g->out = t->out, g->lse = t->lse;
        g->sinks = t->sinks, g->alibi_slopes = t->alibi_slopes;
        char label[160];
        snprintf(label, sizeof label, "%s forward", r.size_text);
        status = all_made(mem, 9) && (!o->sinks || mem[9]) && (!o->score.alibi || mem[10])
                     ? measure(b, label, run_plan, &fwd, &fwd_ms, &fwd_wall_ms, &fwd_wall)
                     : CL_MEM_OBJECT_ALLOCATION_FAILURE;
        if (status == CLATTN_SUCCESS)
            status = measure(b, r.size_text, run_plan, &bwd, &r.device_ms, &r.wall_ms,
                             &r.wall_timer);
        r.wall_timer = r.wall_timer || fwd_wall;
        if (r.wall_timer) /* both on the same clock */
            r.device_ms = r.wall_ms, fwd_ms = fwd_wall_ms;
    }
    if (status == CLATTN_SUCCESS) {
        const double fwd_flops =
            4.0 * (double)bh * seq_q * seq_k * d * (o->score.causal ? 0.5 : 1.0);
        const double fwd_gflops = fwd_flops / fwd_ms / 1e6;
        const size_t fwd_ws = clattn_plan_workspace_size(fwd.plan);
        const size_t bwd_ws = clattn_plan_workspace_size(bwd.plan);
        char text[4][32];
        r.rate = 2.5 * fwd_flops / r.device_ms / 1e6;
        snprintf(r.extra_json, sizeof r.extra_json,
                 ", \"forward_ms\": %s, \"forward_wall_ms\": %s, \"forward_gflops\": %s, "
                 "\"backward_over_forward\": %s, \"forward_workspace_bytes\": %zu, "
                 "\"backward_workspace_bytes\": %zu, \"flops\": \"forward 4BHLqLkd, backward "
                 "2.5x%s\"",
                 json_number(text[0], sizeof text[0], "%.6f", fwd_ms),
                 json_number(text[1], sizeof text[1], "%.6f", fwd_wall_ms),
                 json_number(text[2], sizeof text[2], "%.6g", fwd_gflops),
                 json_number(text[3], sizeof text[3], "%.3f", r.device_ms / fwd_ms), fwd_ws, bwd_ws,
                 o->score.causal ? ", halved (causal)" : "");
        snprintf(r.extra_text, sizeof r.extra_text,
                 "  fwd %.3f ms %.2f GFLOP/s; bwd/fwd %.2fx; ws fwd %zu B bwd %zu B", fwd_ms,
                 fwd_gflops, r.device_ms / fwd_ms, fwd_ws, bwd_ws);
    }
    rc = report(b, &r, status, bytes);
    clattn_plan_release(bwd.plan);
    clattn_plan_release(fwd.plan);
    cli_release_buffers(mem, 11);
    return rc;
}

/* One decode step: append a token's key and value to the cache, then attend the cache. */
typedef struct decode_case {
    clattn_kv_cache *cache;
    clattn_tensor k_new, v_new;
    plan_case attend;
    bool fused_step; /* clattn_kv_cache_decode (else append, then execute) */
} decode_case;

static clattn_status run_decode(bench_state *b, void *p, cl_uint nw, const cl_event *w, cl_event *e)
{
    (void)b;
    decode_case *c = p;
    if (c->fused_step)
        return clattn_kv_cache_decode(c->cache, c->attend.plan, &c->k_new, &c->v_new,
                                      c->attend.tensors.by_role, CLATTN_ROLE_COUNT, NULL, nw, w,
                                      e);
    cl_event appended = NULL;
    clattn_status status = clattn_kv_cache_append(c->cache, &c->k_new, &c->v_new, nw, w, &appended);
    if (status == CLATTN_SUCCESS)
        status = clattn_plan_execute(c->attend.plan, c->attend.tensors.by_role, CLATTN_ROLE_COUNT,
                                     NULL, NULL, 1, &appended, e);
    if (appended)
        clReleaseEvent(appended);
    return status;
}

/* Where a decode step's device time goes: the kernels one step launches (clattn's kernel
 * trace), each one's median device time over --runs steps after --warmup; and a device copy
 * of the cache's K bytes (clEnqueueCopyBuffer, its rate counting the bytes read and written,
 * as the step's counts the cache bytes it reads). Adds "launches", "kernel_ms" {name: ms},
 * "copy_gbps" and "cache_vs_copy" to r; leaves r as it is where the device gives no kernel
 * times. */
static void decode_breakdown(bench_state *b, decode_case *c, double cache_bytes, case_result *r)
{
    const bench_options *o = b->options;
    enum { MOST = 16 };
    clattn_kernel_time kernels[MOST];
    double *times = calloc(o->shape.runs * MOST, sizeof *times);
    size_t launches = 0, kept = 0;
    bool ok = !r->wall_timer && times && clattn_ctx_trace_kernels(b->ctx, 1) == CLATTN_SUCCESS;
    for (size_t run = 0; ok && run < o->shape.warmup + o->shape.runs; ++run) {
        size_t count = 0;
        ok = run_decode(b, c, 0, NULL, NULL) == CLATTN_SUCCESS &&
             clFinish(b->queue) == CL_SUCCESS &&
             clattn_ctx_kernel_times(b->ctx, kernels, MOST, &count, NULL) == CLATTN_SUCCESS &&
             count > 0 && count <= MOST && (run == 0 || count == launches);
        launches = count;
        if (ok && run >= o->shape.warmup) {
            for (size_t k = 0; k < count; ++k)
                times[k * o->shape.runs + kept] = kernels[k].ms;
            ++kept;
        }
    }
    clattn_ctx_trace_kernels(b->ctx, 0);
    copy_case copy = {.bytes = cache_bytes / 2};
    double copy_ms = 0.0, wall_ms = 0.0;
    bool wall_timer = false;
    clattn_tensor cache_k, cache_v, kv_len;
    clattn_kv_cache_tensors(c->cache, &cache_k, &cache_v, &kv_len);
    copy.from = cache_k.mem;
    copy.to = ok ? output_buffer(b, copy.bytes) : NULL;
    ok = ok && copy.to != NULL &&
         measure(b, "decode: copy", run_copy, &copy, &copy_ms, &wall_ms, &wall_timer) ==
             CLATTN_SUCCESS &&
         !wall_timer && copy_ms > 0.0 && kept == o->shape.runs;
    if (copy.to)
        clReleaseMemObject(copy.to);
    if (ok) {
        const double copy_gbps = 2.0 * (double)copy.bytes / copy_ms / 1e6;
        const double cache_gbps = cache_bytes / r->device_ms / 1e6;
        size_t at = strlen(r->extra_json), text_at = strlen(r->extra_text);
        at += (size_t)snprintf(r->extra_json + at, sizeof r->extra_json - at,
                               ", \"copy_gbps\": %.3f, \"cache_vs_copy\": %.3f, \"launches\": %zu, "
                               "\"kernel_ms\": {",
                               copy_gbps, cache_gbps / copy_gbps, launches);
        text_at +=
            (size_t)snprintf(r->extra_text + text_at, sizeof r->extra_text - text_at,
                             " = %.2fx copy; %zu launches", cache_gbps / copy_gbps, launches);
        for (size_t i = 0; i < launches && at < sizeof r->extra_json; ++i)
            at += (size_t)snprintf(r->extra_json + at, sizeof r->extra_json - at,
                                   "%s\"%zu %s\": %.4f", i ? ", " : "", i, kernels[i].name,
                                   median(times + i * o->shape.runs, o->shape.runs));
        if (at < sizeof r->extra_json)
            snprintf(r->extra_json + at, sizeof r->extra_json - at, "}");
    }
    free(times);
}

/* A decode step's rates into r: tokens/s (batch / step) and the cache read per step (keys and
 * values of `length` keys) in GB/s; returns the cache's bytes. */
static double step_rates(case_result *r, size_t batch, size_t length, size_t kv_heads, size_t d,
                         clattn_dtype type)
{
    r->rate = (double)batch / (r->device_ms / 1e3);
    const double cache_bytes = 2.0 * (double)length * batch * kv_heads * d * cache_elem_bytes(type);
    snprintf(r->extra_json, sizeof r->extra_json, ", \"cache_gbps\": %.3f",
             cache_bytes / r->device_ms / 1e6);
    snprintf(r->extra_text, sizeof r->extra_text, "  cache %.2f GB/s",
             cache_bytes / r->device_ms / 1e6);
    return cache_bytes;
}

static int bench_decode(bench_state *b, size_t length, int dtype, clattn_path path,
                        size_t page_size, int cache_index)
{
    const bench_options *o = b->options;
    const size_t kv_heads = o->shape.kv_heads ? o->shape.kv_heads : o->shape.heads,
                 d = o->shape.head_dim;
    /* q, out and the appended tokens: --dtype; the cache: --kv-dtype (default the same) */
    const clattn_dtype type = dtypes[dtype];
    const clattn_dtype cache_type = cache_index < 0 ? type : kv_dtypes[cache_index];
    const size_t steps = o->shape.warmup + o->shape.runs;
    case_result r = {.op = "decode",
                     .unit = "tokens_per_s",
                     .path = path == CLATTN_PATH_FUSED ? "fused" : "unfused"};
    char cache_text[32] = "";
    if (cache_index >= 0)
        snprintf(cache_text, sizeof cache_text, " kv=%s", kv_dtype_names[cache_index]);
    snprintf(r.size_json, sizeof r.size_json,
             "\"batch\": %zu, \"heads\": %zu, \"kv_heads\": %zu, \"cache\": %zu, "
             "\"head_dim\": %zu, \"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"page_size\": %zu%s%s",
             o->shape.batch, o->shape.heads, kv_heads, length, d, dtype_names[dtype],
             cache_index < 0 ? dtype_names[dtype] : kv_dtype_names[cache_index], page_size,
             o->score.softcap > 0.0f ? ", \"softcap\": true" : "",
             o->sinks ? ", \"sinks\": true" : "");
    char page_text[32] = "";
    if (page_size)
        snprintf(page_text, sizeof page_text, " page=%zu", page_size);
    snprintf(r.size_text, sizeof r.size_text, "B=%zu H=%zu Hkv=%zu cache=%zu d=%zu%s%s%s%s%s",
             o->shape.batch, o->shape.heads, kv_heads, length, d,
             type == CLATTN_DTYPE_F32 ? "" : " ",
             type == CLATTN_DTYPE_F32 ? "" : dtype_names[dtype], cache_text, page_text,
             o->sinks ? " sinks" : "");
    int rc = fresh_context(b);
    if (rc != CLI_OK)
        return rc;
    if (length < steps)
        return cli_fail("bench", CLI_BAD_INPUT,
                        "decode: a cache of %zu keys holds fewer than the "
                        "%zu steps timed",
                        length, steps);
    decode_case c = {0};
    clattn_kv_cache_desc cd;
    clattn_kv_cache_desc_init(&cd);
    /* room for the timed steps' tokens and as many more for decode_breakdown's */
    cd.batch = o->shape.batch, cd.kv_heads = kv_heads, cd.capacity = length + steps;
    cd.head_dim_qk = d, cd.head_dim_v = d, cd.dtype = cache_type;
    cd.page_size = page_size;
    clattn_status status = clattn_kv_cache_create(b->ctx, &cd, &c.cache);
    const size_t prefill = length - steps, q_count = o->shape.batch * o->shape.heads * d;
    cl_mem mem[5] = {NULL};
    size_t bytes = 0;
    if (status == CLATTN_SUCCESS) {
        /* The prompt's keys and values (random), then one token's per step. */
        if (o->sinks && (mem[4] = sinks_buffer(b, o->shape.heads)) == NULL)
            status = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        const size_t block = prefill > 0 ? prefill : 1;
        mem[0] = random_buffer(b, o->shape.batch * kv_heads * block * d, type, 11);
        mem[1] = random_buffer(b, o->shape.batch * kv_heads * d, type, 12);
        mem[2] = random_buffer(b, q_count, type, 13);
        mem[3] = output_buffer(b, q_count * clattn_dtype_size(type));
        bytes = (size_t)(2.0 * (double)(length * o->shape.batch * kv_heads * d) *
                         cache_elem_bytes(cache_type)) +
                2 * q_count * clattn_dtype_size(type);
        if (!all_made(mem, 4))
            status = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        if (status == CLATTN_SUCCESS && prefill > 0) {
            const clattn_tensor prompt =
                clattn_tensor_make(mem[0], 0, type, 4, o->shape.batch, kv_heads, prefill, d);
            status = clattn_kv_cache_append(c.cache, &prompt, &prompt, 0, NULL, NULL);
        }
    }
    if (status == CLATTN_SUCCESS) {
        c.k_new = clattn_tensor_make(mem[1], 0, type, 4, o->shape.batch, kv_heads, 1, d);
        c.v_new = c.k_new;
        clattn_sdpa_desc desc;
        clattn_sdpa_desc_init(&desc);
        clattn_tensors desc_tensors = {0};
        CLATTN_BIND_ROLES(desc, desc_tensors);
        desc.path = path;
        desc.softcap = o->score.softcap;
        desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
        c.fused_step = path == CLATTN_PATH_FUSED && !o->two_launch;
        desc.kv_step = c.fused_step;
        clattn_tensors *t = &desc_tensors;
        t->q = clattn_tensor_make(mem[2], 0, type, 4, o->shape.batch, o->shape.heads, 1, d);
        t->out = clattn_tensor_make(mem[3], 0, type, 4, o->shape.batch, o->shape.heads, 1, d);
        clattn_kv_cache_tensors(c.cache, &t->k, &t->v, &t->kv_seqlen);
        clattn_kv_cache_block_table(c.cache, &t->block_table);
        if (o->sinks)
            t->sinks = clattn_tensor_make(mem[4], 0, CLATTN_DTYPE_F32, 1, o->shape.heads, 0, 0, 0);
        c.attend.tensors = desc_tensors;
        status = clattn_sdpa_plan_create(b->ctx, &desc, &c.attend.plan);
    }
    if (status == CLATTN_SUCCESS)
        status = measure(b, r.size_text, run_decode, &c, &r.device_ms, &r.wall_ms, &r.wall_timer);
    if (status == CLATTN_SUCCESS) {
        const double cache_bytes = step_rates(&r, o->shape.batch, length, kv_heads, d, cache_type);
        decode_breakdown(b, &c, cache_bytes, &r);
    }
    rc = report(b, &r, status, bytes);
    clattn_plan_release(c.attend.plan);
    clattn_kv_cache_release(c.cache);
    cli_release_buffers(mem, 5);
    return rc;
}

/* One decode step's attention over a paged KV cache (the fused plan through the block table:
 * pools of page_size keys, each sequence's pages in a shuffled order) or, page_size 0, over the
 * same keys laid out contiguously; both with kv_seqlen = length, causal bottom-right. No
 * append: the page size's cost in the attending kernel alone. */
static int bench_paged(bench_state *b, size_t length, int dtype, size_t page_size,
                       bool head_major)
{
    const bench_options *o = b->options;
    const size_t kv_heads = o->shape.kv_heads ? o->shape.kv_heads : o->shape.heads,
                 d = o->shape.head_dim;
    const clattn_dtype type = dtypes[dtype];
    case_result r = {.op = "paged", .unit = "tokens_per_s", .path = "fused"};
    snprintf(r.size_json, sizeof r.size_json,
             "\"batch\": %zu, \"heads\": %zu, \"kv_heads\": %zu, \"cache\": %zu, "
             "\"head_dim\": %zu, \"dtype\": \"%s\", \"page_size\": %zu, \"page_layout\": "
             "\"%s\"%s",
             o->shape.batch, o->shape.heads, kv_heads, length, d, dtype_names[dtype], page_size,
             head_major ? "heads" : "slots", o->sinks ? ", \"sinks\": true" : "");
    char page_text[48];
    if (page_size)
        snprintf(page_text, sizeof page_text, " page=%zu %s", page_size,
                 head_major ? "heads" : "slots");
    else
        snprintf(page_text, sizeof page_text, " contiguous %s", head_major ? "BHLD" : "BLHD");
    snprintf(
        r.size_text, sizeof r.size_text, "B=%zu H=%zu Hkv=%zu cache=%zu d=%zu%s%s%s%s",
        o->shape.batch, o->shape.heads, kv_heads, length, d, type == CLATTN_DTYPE_F32 ? "" : " ",
        type == CLATTN_DTYPE_F32 ? "" : dtype_names[dtype], page_text, o->sinks ? " sinks" : "");
    int rc = fresh_context(b);
    if (rc != CLI_OK)
        return rc;
    const size_t blocks = page_size ? (length + page_size - 1) / page_size : 0;
    const size_t pages = o->shape.batch * blocks;
    const size_t slots = page_size ? pages * page_size : o->shape.batch * length;
    const size_t kv_count = slots * kv_heads * d, q_count = o->shape.batch * o->shape.heads * d;
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.path = CLATTN_PATH_FUSED;
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    clattn_tensors *t = &desc_tensors;
    t->q = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, o->shape.heads, 1, d);
    t->out = t->q;
    if (page_size) {
        t->k = clattn_tensor_make(NULL, 0, type, 4, pages, page_size, kv_heads, d);
        if (head_major) { /* (pages, kv_heads, page_size, d) in memory */
            t->k.strides[1] = d;
            t->k.strides[2] = page_size * d;
        }
        t->block_table =
            clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 2, o->shape.batch, blocks, 0, 0);
    } else {
        t->k = clattn_tensor_make(NULL, 0, type, 4, o->shape.batch, kv_heads, length, d);
        if (!head_major) { /* (B, L, kv_heads, d) in memory, as the slots' pools */
            t->k.strides[1] = d;
            t->k.strides[2] = kv_heads * d;
        }
    }
    t->v = t->k;
    t->kv_seqlen = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, o->shape.batch, 0, 0, 0);
    if (o->sinks)
        t->sinks = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, o->shape.heads, 0, 0, 0);
    plan_case c = {.tensors = desc_tensors};
    clattn_status status = clattn_sdpa_plan_create(b->ctx, &desc, &c.plan);
    enum { COUNT = 7 };
    cl_mem mem[COUNT] = {NULL};
    size_t bytes = 0;
    int32_t *table = NULL, *counts = NULL;
    if (status == CLATTN_SUCCESS) {
        mem[0] = random_buffer(b, q_count, type, 21);
        mem[1] = random_buffer(b, kv_count, type, 22);
        mem[2] = random_buffer(b, kv_count, type, 23);
        mem[3] = output_buffer(b, q_count * clattn_dtype_size(type));
        table = malloc((blocks ? pages : 1) * sizeof *table);
        counts = malloc(o->shape.batch * sizeof *counts);
        cl_int err = table && counts ? CL_SUCCESS : CL_OUT_OF_HOST_MEMORY;
        for (size_t i = 0; table && i < pages; ++i) /* a shuffled order of the pages */
            table[i] = (int32_t)i;
        unsigned long long state = 0x9e3779b97f4a7c15ull;
        for (size_t i = pages; table && i > 1; --i) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const size_t j = (size_t)(state >> 33) % i;
            const int32_t swap = table[i - 1];
            table[i - 1] = table[j];
            table[j] = swap;
        }
        for (size_t i = 0; counts && i < o->shape.batch; ++i)
            counts[i] = (int32_t)length;
        if (err == CL_SUCCESS)
            mem[4] = clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                    o->shape.batch * sizeof *counts, counts, &err);
        if (err == CL_SUCCESS && page_size)
            mem[5] = clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                    pages * sizeof *table, table, &err);
        if (o->sinks)
            mem[6] = sinks_buffer(b, o->shape.heads);
        bind(&c.tensors.q, mem[0], q_count, &bytes);
        bind(&c.tensors.k, mem[1], kv_count, &bytes);
        bind(&c.tensors.v, mem[2], kv_count, &bytes);
        bind(&c.tensors.out, mem[3], q_count, &bytes);
        bind(&c.tensors.kv_seqlen, mem[4], o->shape.batch, &bytes);
        if (page_size)
            bind(&c.tensors.block_table, mem[5], pages, &bytes);
        if (o->sinks)
            bind(&c.tensors.sinks, mem[6], o->shape.heads, &bytes);
        status = err == CL_SUCCESS && all_made(mem, 5) && (!page_size || mem[5]) &&
                         (!o->sinks || mem[6])
                     ? measure(b, r.size_text, run_plan, &c, &r.device_ms, &r.wall_ms,
                               &r.wall_timer)
                     : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    }
    if (status == CLATTN_SUCCESS) {
        step_rates(&r, o->shape.batch, length, kv_heads, d, type);
    }
    rc = report(b, &r, status, bytes);
    free(table);
    free(counts);
    clattn_plan_release(c.plan);
    cli_release_buffers(mem, COUNT);
    return rc;
}

/* Packed variable-length prefill (cu_seqlens) against padding to the longest sequence: B
 * sequences of lengths spread from longest / B to longest (sequence i: longest * (i + 1) / B,
 * at least 1), self-attention, causal bottom-right, in one packed plan; then the same
 * sequences right-padded to (B, longest, H, d) with their lengths as kv_seqlen, causal from
 * row 0 (the kernel skips the padded keys, but every padded query row is computed), as a
 * padded batch is run. Both (tokens, heads, d) row-major. Rate: real tokens per second. */
static int bench_varlen(bench_state *b, size_t longest, int dtype, bool padded)
{
    const bench_options *o = b->options;
    const size_t seqs = o->shape.batch > 1 ? o->shape.batch : 8, d = o->shape.head_dim;
    const size_t kv_heads = o->shape.kv_heads ? o->shape.kv_heads : o->shape.heads;
    const clattn_dtype type = dtypes[dtype];
    case_result r = {.op = "varlen", .unit = "tokens_per_s", .path = "fused"};
    int32_t *cu = malloc((seqs + 1) * sizeof *cu);
    if (cu == NULL)
        return cli_fail("bench", CLI_FAILED, "out of memory");
    cu[0] = 0;
    for (size_t i = 0; i < seqs; ++i) {
        const size_t n = longest * (i + 1) / seqs;
        cu[i + 1] = cu[i] + (int32_t)(n ? n : 1);
    }
    const size_t total = (size_t)cu[seqs];
    snprintf(r.size_json, sizeof r.size_json,
             "\"sequences\": %zu, \"heads\": %zu, \"kv_heads\": %zu, \"longest\": %zu, "
             "\"tokens\": %zu, \"head_dim\": %zu, \"dtype\": \"%s\", \"layout\": \"%s\"",
             seqs, o->shape.heads, kv_heads, longest, total, d, dtype_names[dtype],
             padded ? "padded" : "packed");
    snprintf(r.size_text, sizeof r.size_text, "B=%zu H=%zu L<=%zu tok=%zu d=%zu%s%s %s", seqs,
             o->shape.heads, longest, total, d, type == CLATTN_DTYPE_F32 ? "" : " ",
             type == CLATTN_DTYPE_F32 ? "" : dtype_names[dtype], padded ? "padded" : "packed");
    int rc = fresh_context(b);
    if (rc != CLI_OK) {
        free(cu);
        return rc;
    }
    const size_t rows = padded ? seqs * longest : total;
    const size_t q_count = rows * o->shape.heads * d, kv_count = rows * kv_heads * d;
    clattn_sdpa_desc desc;
    clattn_sdpa_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.path = CLATTN_PATH_FUSED;
    desc.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    clattn_tensors *t = &desc_tensors;
    if (padded) { /* right-padded (B, L, H, d) buffers as (B, H, L, d) views; causal from the
                   * first row (the real rows' mask as packed: n_q = n_k) */
        t->q = clattn_tensor_make(NULL, 0, type, 4, seqs, o->shape.heads, longest, d);
        t->k = clattn_tensor_make(NULL, 0, type, 4, seqs, kv_heads, longest, d);
        const size_t hq = o->shape.heads * d, hk = kv_heads * d;
        const size_t qs[4] = {longest * hq, d, hq, 1}, ks[4] = {longest * hk, d, hk, 1};
        memcpy(t->q.strides, qs, sizeof qs);
        memcpy(t->k.strides, ks, sizeof ks);
        t->kv_seqlen = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, seqs, 0, 0, 0);
        desc.causal = CLATTN_CAUSAL_TOP_LEFT;
    } else {
        t->q = clattn_tensor_make(NULL, 0, type, 3, total, o->shape.heads, d, 0);
        t->k = clattn_tensor_make(NULL, 0, type, 3, total, kv_heads, d, 0);
        t->cu_seqlens_q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_I32, 1, seqs + 1, 0, 0, 0);
        t->cu_seqlens_k = t->cu_seqlens_q;
        desc.max_seqlen_q = desc.max_seqlen_k = longest;
    }
    t->v = t->k;
    t->out = t->q;
    plan_case c = {.tensors = desc_tensors};
    clattn_status status = clattn_sdpa_plan_create(b->ctx, &desc, &c.plan);
    enum { COUNT = 5 };
    cl_mem mem[COUNT] = {NULL};
    size_t bytes = 0;
    if (status == CLATTN_SUCCESS) {
        mem[0] = random_buffer(b, q_count, type, 31);
        mem[1] = random_buffer(b, kv_count, type, 32);
        mem[2] = random_buffer(b, kv_count, type, 33);
        mem[3] = output_buffer(b, q_count * clattn_dtype_size(type));
        cl_int err = CL_SUCCESS;
        int32_t *lengths = malloc(seqs * sizeof *lengths);
        for (size_t i = 0; lengths && i < seqs; ++i)
            lengths[i] = cu[i + 1] - cu[i];
        err = lengths ? CL_SUCCESS : CL_OUT_OF_HOST_MEMORY;
        if (err == CL_SUCCESS)
            mem[4] = clCreateBuffer(b->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                    (padded ? seqs : seqs + 1) * sizeof *cu,
                                    padded ? lengths : cu, &err);
        free(lengths);
        bind(&c.tensors.q, mem[0], q_count, &bytes);
        bind(&c.tensors.k, mem[1], kv_count, &bytes);
        bind(&c.tensors.v, mem[2], kv_count, &bytes);
        bind(&c.tensors.out, mem[3], q_count, &bytes);
        if (padded) {
            bind(&c.tensors.kv_seqlen, mem[4], seqs, &bytes);
        } else {
            bind(&c.tensors.cu_seqlens_q, mem[4], seqs + 1, &bytes);
            c.tensors.cu_seqlens_k.mem = mem[4];
        }
        status = err == CL_SUCCESS && all_made(mem, COUNT)
                     ? measure(b, r.size_text, run_plan, &c, &r.device_ms, &r.wall_ms,
                               &r.wall_timer)
                     : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    }
    if (status == CLATTN_SUCCESS)
        r.rate = (double)total / (r.device_ms * 1e-3);
    rc = report(b, &r, status, bytes);
    free(cu);
    clattn_plan_release(c.plan);
    cli_release_buffers(mem, COUNT);
    return rc;
}

/* Self-attention with PyTorch's packed in_proj weight and bias and an output projection. */
static int bench_mha(bench_state *b, size_t seq, int dtype, clattn_path path)
{
    const bench_options *o = b->options;
    const size_t e = o->embed;
    const clattn_dtype type = dtypes[dtype];
    case_result r = {
        .op = "mha", .unit = "gflops", .path = path == CLATTN_PATH_FUSED ? "fused" : "unfused"};
    snprintf(r.size_json, sizeof r.size_json,
             "\"batch\": %zu, \"heads\": %zu, \"seq_q\": %zu, \"seq_k\": %zu, \"head_dim\": %zu, "
             "\"embed_dim\": %zu, \"dtype\": \"%s\"%s",
             o->shape.batch, o->shape.heads, seq, seq, e / o->shape.heads, e, dtype_names[dtype],
             o->rope ? ", \"rope\": true" : "");
    snprintf(r.size_text, sizeof r.size_text, "B=%zu H=%zu L=%zu E=%zu%s%s%s", o->shape.batch,
             o->shape.heads, seq, e, type == CLATTN_DTYPE_F32 ? "" : " ",
             type == CLATTN_DTYPE_F32 ? "" : dtype_names[dtype], o->rope ? " rope" : "");
    if (e % o->shape.heads)
        return cli_fail("bench", CLI_BAD_INPUT, "--embed %zu is not divisible by --heads %zu", e,
                        o->shape.heads);
    int rc = fresh_context(b);
    if (rc != CLI_OK)
        return rc;
    clattn_mha_desc desc;
    clattn_mha_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.num_heads = o->shape.heads;
    desc.layout = CLATTN_LAYOUT_TORCH;
    desc.path = path;
    desc.rope = o->rope;
    clattn_tensors *t = &desc_tensors;
    t->q = clattn_tensor_make(NULL, 0, type, 3, o->shape.batch, seq, e, 0);
    t->k = t->q;
    t->v = t->q;
    t->out = t->q;
    t->in_proj_weight = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, 3 * e, e, 0, 0);
    t->in_proj_bias = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, 3 * e, 0, 0, 0);
    t->out_weight = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, e, e, 0, 0);
    t->out_bias = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, e, 0, 0, 0);
    plan_case c = {.tensors = desc_tensors};
    clattn_status status = clattn_mha_plan_create(b->ctx, &desc, &c.plan);
    enum { X, OUT, IN_W, IN_B, OUT_W, OUT_B, COUNT };
    const size_t counts[COUNT] = {
        o->shape.batch * seq * e, o->shape.batch * seq * e, 3 * e * e, 3 * e, e * e, e};
    cl_mem mem[COUNT] = {NULL};
    size_t bytes = 0;
    if (status == CLATTN_SUCCESS) {
        mem[X] = random_buffer(b, counts[X], type, 10);
        mem[OUT] = output_buffer(b, counts[OUT] * clattn_dtype_size(type));
        for (int i = IN_W; i < COUNT; ++i)
            mem[i] = random_buffer(b, counts[i], CLATTN_DTYPE_F32, 10 + (unsigned)i);
        /* One buffer as query, key and value: self-attention. */
        bind(&c.tensors.q, mem[X], counts[X], &bytes);
        c.tensors.k.mem = c.tensors.v.mem = mem[X];
        bind(&c.tensors.out, mem[OUT], counts[OUT], &bytes);
        bind(&c.tensors.in_proj_weight, mem[IN_W], counts[IN_W], &bytes);
        bind(&c.tensors.in_proj_bias, mem[IN_B], counts[IN_B], &bytes);
        bind(&c.tensors.out_weight, mem[OUT_W], counts[OUT_W], &bytes);
        bind(&c.tensors.out_bias, mem[OUT_B], counts[OUT_B], &bytes);
        status = all_made(mem, COUNT) ? measure(b, r.size_text, run_plan, &c, &r.device_ms,
                                                &r.wall_ms, &r.wall_timer)
                                      : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    }
    const double flops = 8.0 * o->shape.batch * seq * e * e + 4.0 * o->shape.batch * seq * seq * e;
    r.rate = status == CLATTN_SUCCESS ? flops / r.device_ms / 1e6 : 0.0;
    rc = report(b, &r, status, bytes);
    clattn_plan_release(c.plan);
    cli_release_buffers(mem, COUNT);
    return rc;
}

/* Additive self-attention: W1, W2 (E, H*da), biases, w (H*da), v = the input (dv = E). */
static int bench_additive(bench_state *b, size_t seq, clattn_path path)
{
    const bench_options *o = b->options;
    const size_t e = o->embed, h = o->shape.heads, da = o->shape.head_dim;
    case_result r = {.op = "additive",
                     .unit = "gterms_per_s",
                     .path = path == CLATTN_PATH_FUSED ? "fused" : "unfused"};
    snprintf(r.size_json, sizeof r.size_json,
             "\"batch\": %zu, \"heads\": %zu, \"seq_q\": %zu, \"seq_k\": %zu, \"da\": %zu, "
             "\"embed_dim\": %zu",
             o->shape.batch, h, seq, seq, da, e);
    snprintf(r.size_text, sizeof r.size_text, "B=%zu H=%zu L=%zu E=%zu da=%zu", o->shape.batch, h,
             seq, e, da);
    if (e % h)
        return cli_fail("bench", CLI_BAD_INPUT, "--embed %zu is not divisible by --heads %zu", e,
                        h);
    int rc = fresh_context(b);
    if (rc != CLI_OK)
        return rc;
    clattn_additive_desc desc;
    clattn_additive_desc_init(&desc);
    clattn_tensors desc_tensors = {0};
    CLATTN_BIND_ROLES(desc, desc_tensors);
    desc.num_heads = h;
    desc.path = path;
    clattn_tensors *t = &desc_tensors;
    t->q = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 3, o->shape.batch, seq, e, 0);
    t->k = t->v = t->out = t->q;
    t->q_weight = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 2, e, h * da, 0, 0);
    t->k_weight = t->q_weight;
    t->q_bias = clattn_tensor_make(NULL, 0, CLATTN_DTYPE_F32, 1, h * da, 0, 0, 0);
    t->k_bias = t->score_weight = t->q_bias;
    plan_case c = {.tensors = desc_tensors};
    clattn_status status = clattn_additive_plan_create(b->ctx, &desc, &c.plan);
    enum { X, OUT, W1, W2, B1, B2, W, COUNT };
    const size_t counts[COUNT] = {o->shape.batch * seq * e,
                                  o->shape.batch * seq * e,
                                  e * h * da,
                                  e * h * da,
                                  h * da,
                                  h * da,
                                  h * da};
    cl_mem mem[COUNT] = {NULL};
    size_t bytes = 0;
    if (status == CLATTN_SUCCESS) {
        mem[X] = random_buffer(b, counts[X], CLATTN_DTYPE_F32, 20);
        mem[OUT] = output_buffer(b, counts[OUT] * sizeof(float));
        for (int i = W1; i < COUNT; ++i)
            mem[i] = random_buffer(b, counts[i], CLATTN_DTYPE_F32, 20 + (unsigned)i);
        bind(&c.tensors.q, mem[X], counts[X], &bytes);
        c.tensors.k.mem = c.tensors.v.mem = mem[X];
        bind(&c.tensors.out, mem[OUT], counts[OUT], &bytes);
        clattn_tensor *roles[] = {&c.tensors.q_weight, &c.tensors.k_weight, &c.tensors.q_bias,
                                  &c.tensors.k_bias, &c.tensors.score_weight};
        for (int i = W1; i < COUNT; ++i)
            bind(roles[i - W1], mem[i], counts[i], &bytes);
        status = all_made(mem, COUNT) ? measure(b, r.size_text, run_plan, &c, &r.device_ms,
                                                &r.wall_ms, &r.wall_timer)
                                      : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    }
    const double terms = (double)o->shape.batch * h * seq * seq * da;
    r.rate = status == CLATTN_SUCCESS ? terms / r.device_ms / 1e6 : 0.0;
    rc = report(b, &r, status, bytes);
    clattn_plan_release(c.plan);
    cli_release_buffers(mem, COUNT);
    return rc;
}

/* --- options and driver -------------------------------------------------------------------- */

/* A comma-separated list of names from names[0 .. count) into flags (cleared first): false,
 * with the message printed, for an unknown name or an empty list. */
static bool parse_names(const char *option, const char *value, const char *const *names,
                        int count, bool *flags)
{
    memset(flags, 0, (size_t)count * sizeof *flags);
    char buffer[64];
    snprintf(buffer, sizeof buffer, "%s", value);
    char *save = NULL;
    bool any = false;
    for (char *item = strtok_r(buffer, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < count; ++i)
            if (strcmp(item, names[i]) == 0)
                found = i;
        if (found < 0) {
            char known[128] = "";
            for (int i = 0; i < count; ++i)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         i == 0 ? "" : i + 1 == count ? " or " : ", ", names[i]);
            cli_fail("bench", CLI_BAD_INPUT, "%s: '%s' is not %s", option, item, known);
            return false;
        }
        flags[found] = any = true;
    }
    if (!any)
        cli_fail("bench", CLI_BAD_INPUT, "%s: empty list", option);
    return any;
}

static bool parse_mnk(const char *text, bench_options *o)
{
    char buffer[512];
    if (strlen(text) >= sizeof buffer)
        return false;
    snprintf(buffer, sizeof buffer, "%s", text);
    o->num_mnk = 0;
    char *save = NULL;
    for (char *item = strtok_r(buffer, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char extra;
        unsigned long long m, n, k;
        if (o->num_mnk == MAX_SIZES || sscanf(item, "%llux%llux%llu%c", &m, &n, &k, &extra) != 3 ||
            m == 0 || n == 0 || k == 0 || m > (1u << 20) || n > (1u << 20) || k > (1u << 20))
            return false;
        o->mnk[o->num_mnk][0] = m, o->mnk[o->num_mnk][1] = n, o->mnk[o->num_mnk][2] = k;
        ++o->num_mnk;
    }
    return o->num_mnk > 0;
}

/* --op a,b,...: the ops; repeated, the lists add up (the first replaces the default set). */
static int parse_ops(const cli_args *args, const char *value, void *target)
{
    bench_options *o = target;
    char buffer[128];
    snprintf(buffer, sizeof buffer, "%s", value);
    char *save = NULL;
    bool any = false;
    for (char *item = strtok_r(buffer, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < 9; ++i)
            if (strcmp(item, op_names[i]) == 0)
                found = i;
        if (found < 0)
            return cli_fail(args->command, -1,
                            "--op: unknown op '%s' (matmul, softmax, attention, mha, decode, "
                            "additive, paged, varlen, backward)",
                            item);
        if (!o->op_given)
            memset(o->ops, 0, sizeof o->ops);
        o->ops[found] = any = o->op_given = true;
    }
    if (!any)
        return cli_fail(args->command, -1,
                        "--op: no op in '%s' (matmul, softmax, attention, mha, decode, "
                        "additive, paged, varlen, backward)",
                        value);
    return 1;
}

static int parse_paths(const cli_args *args, const char *value, void *target)
{
    static const char *const names[2] = {"fused", "unfused"};
    if (!parse_names("--path", value, names, 2, target))
        return -1;
    (void)args;
    return 1;
}

static int parse_dtypes(const cli_args *args, const char *value, void *target)
{
    (void)args;
    return parse_names("--dtype", value, dtype_names, 3, target) ? 1 : -1;
}

static const char *const page_layout_names[2] = {"slots", "heads"};
static int parse_page_layouts(const cli_args *args, const char *value, void *target)
{
    bench_options *o = target;
    (void)args;
    o->page_layout_given = true;
    return parse_names("--page-layout", value, page_layout_names, 2, o->page_layouts) ? 1 : -1;
}

static int parse_kv_dtypes(const cli_args *args, const char *value, void *target)
{
    bench_options *o = target;
    (void)args;
    o->kv_dtype_given = true;
    return parse_names("--kv-dtype", value, kv_dtype_names, KV_DTYPES, o->kv_dtypes) ? 1 : -1;
}

static int parse_mnk_option(const cli_args *args, const char *value, void *target)
{
    if (!parse_mnk(value, target))
        return cli_fail(args->command, -1,
                        "--mnk: '%s' is not a list of MxNxK sizes (each 1 .. 1048576)", value);
    return 1;
}

static int parse_seq(const cli_args *args, const char *value, void *target)
{
    bench_options *o = target;
    o->seq_given = true;
    return cli_parse_size_list(args->command, "--seq", value, o->seq, MAX_SIZES, &o->num_seq) ? 1
                                                                                              : -1;
}

static int parse_page_sizes(const cli_args *args, const char *value, void *target)
{
    bench_options *o = target;
    return cli_parse_size_list(args->command, "--page-size", value, o->page_sizes, MAX_SIZES,
                               &o->num_page_sizes)
               ? 1
               : -1;
}

static int parse_dropout(const cli_args *args, const char *value, void *target)
{
    return cli_parse_probability(args->command, "--dropout", value, target) ? 1 : -1;
}

static const cli_choice mask_choices[] = {{"none", 0}, {"padding", 1}, {"additive", 2}, {NULL, 0}};

#define AT(field) CLI_AT(bench_options, field)
static const cli_option bench_table[] = {
    {CLI_OPT("--op", CLI_CUSTOM, 0, "OP,...",
             "matmul, softmax, attention, mha (default), decode, additive, paged, varlen, "
             "backward; repeated, the lists add up"),
     .handle = parse_ops, .flags = CLI_REPEATABLE},
    {CLI_OPT("--mnk", CLI_CUSTOM, 0, "MxNxK,...", "matmul sizes"), .handle = parse_mnk_option},
    CLI_USE(cli_bench_group, bench_options, shape, 0),
    CLI_USE(cli_score_group, bench_options, score,
            CLI_SCORE_CAUSAL | CLI_SCORE_SOFTCAP | CLI_SCORE_ALIBI),
    {CLI_OPT("--sinks", CLI_FLAG, AT(sinks), NULL, "attention, decode: attention sinks")},
    {CLI_OPT("--rope", CLI_FLAG, AT(rope), NULL, "mha: rotary embeddings on q and k")},
    {CLI_OPT("--two-launch", CLI_FLAG, AT(two_launch), NULL,
             "decode: append, then attend (not the fused step)")},
    {CLI_OPT("--dropout", CLI_CUSTOM, AT(dropout), "P", "attention, backward: dropout probability"),
     .handle = parse_dropout},
    {CLI_OPT("--seq", CLI_CUSTOM, 0, "L,...", "sequence lengths (default 512,1024)"),
     .handle = parse_seq},
    {CLI_OPT("--seq-k", CLI_SIZE, AT(seq_k), "S", "key length (default: the sequence's)"),
     .min = 1},
    {CLI_OPT("--embed", CLI_SIZE, AT(embed), "E", "mha, additive: embedding (default 512)"),
     .min = 1},
    {CLI_OPT("--path", CLI_CUSTOM, AT(paths), "fused,unfused", "the paths (default both)"),
     .handle = parse_paths},
    {CLI_OPT("--dtype", CLI_CUSTOM, AT(dtypes), "f32,f16,bf16", "storage types (default f32)"),
     .handle = parse_dtypes},
    {CLI_OPT("--kv-dtype", CLI_CUSTOM, 0, "f32,f16,bf16,q8_0,q4_0,fp8_e4m3,fp8_e5m2",
             "decode, paged: the cache's types"),
     .handle = parse_kv_dtypes},
    {CLI_OPT("--page-size", CLI_CUSTOM, 0, "N,...", "paged: page sizes (0 = contiguous)"),
     .handle = parse_page_sizes},
    {CLI_OPT("--page-layout", CLI_CUSTOM, 0, "slots,heads",
             "paged: the pools' layouts (default slots)"),
     .handle = parse_page_layouts},
    {CLI_OPT("--mask", CLI_CHOICE, AT(mask), NULL, "attention: no mask, key padding or additive"),
     .choices = mask_choices},
    CLI_USE(cli_exec_group, bench_options, exec, 0),
};
#undef AT

static const char *const bench_help[] = {bench_usage, bench_usage_more, bench_usage_serving,
                                         bench_usage_rest, NULL};
static const cli_command bench_command_spec = CLI_COMMAND("bench", bench_table, bench_help);

static int parse_bench_options(int argc, char **argv, bench_options *o)
{
    return cli_parse_command(&bench_command_spec, argc, argv, o);
}

int cmd_bench(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; ++i) /* ring attention: its own driver (MPI) */
        if (strcmp(argv[i], "--op") == 0 && strcmp(argv[i + 1], "ring") == 0) {
#ifdef CLATTN_CLI_MPI
            return cli_ring_bench(argc, argv);
#else
            return cli_fail("bench", CLI_BAD_INPUT,
                            "--op ring: this clattn was built without MPI (cmake -DCLATTN_MPI=ON)");
#endif
        }
    bench_options o = {.ops = {true, true, true, true, false, false},
                       .shape = {.batch = 1, .heads = 8, .head_dim = 64, .runs = 10, .warmup = 1},
                       .mnk = {{512, 512, 512}, {1024, 1024, 1024}, {4096, 64, 4096}},
                       .num_mnk = 3,
                       .embed = 512,
                       .seq = {512, 1024},
                       .num_seq = 2,
                       .paths = {true, true},
                       .dtypes = {true, false, false}};
    int rc = parse_bench_options(argc, argv, &o);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;

    /* A profiling queue of our own, handed to clattn (the embedding path). */
    clattn_ctx *probe = cli_context("bench", o.exec.device);
    if (probe == NULL)
        return cli_context_exit();
    bench_state b = {.options = &o, .context = clattn_ctx_cl_context(probe)};
    cl_int err = CL_SUCCESS;
    b.queue =
        clCreateCommandQueue(b.context, clattn_ctx_device(probe), CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS)
        rc = cli_fail("bench", CLI_FAILED, "clCreateCommandQueue(profiling): %d", (int)err);
    if (rc == CLI_OK && !o.shape.json) {
        cli_print_device(stdout, clattn_ctx_device(probe));
        printf("median of %zu runs after %zu warm-up run(s)\n", o.shape.runs, o.shape.warmup);
        printf("%-18s %-32s %10s%5s %10s %17s %9s %9s\n", "op", "size", "device ms", "", "wall ms",
               "rate", "dev MiB", "rss MiB");
    }
    static const clattn_path paths[2] = {CLATTN_PATH_FUSED, CLATTN_PATH_UNFUSED};
    for (size_t i = 0; rc == CLI_OK && o.ops[0] && i < o.num_mnk; ++i)
        rc = bench_matmul(&b, o.mnk[i][0], o.mnk[i][1], o.mnk[i][2]);
    for (size_t i = 0; rc == CLI_OK && o.ops[1] && i < o.num_seq; ++i)
        for (int t = 0; rc == CLI_OK && t < 3; ++t)
            if (o.dtypes[t])
                rc = bench_sdpa(&b, true, o.seq[i], o.seq_k ? o.seq_k : o.seq[i], t,
                                CLATTN_PATH_UNFUSED);
    for (size_t i = 0; rc == CLI_OK && o.ops[2] && i < o.num_seq; ++i)
        for (int t = 0; rc == CLI_OK && t < 3; ++t)
            for (int p = 0; rc == CLI_OK && o.dtypes[t] && p < 2; ++p)
                if (o.paths[p])
                    rc = bench_sdpa(&b, false, o.seq[i], o.seq_k ? o.seq_k : o.seq[i], t, paths[p]);
    for (size_t i = 0; rc == CLI_OK && o.ops[3] && i < o.num_seq; ++i)
        for (int t = 0; rc == CLI_OK && t < 3; ++t)
            for (int p = 0; rc == CLI_OK && o.dtypes[t] && p < 2; ++p)
                if (o.paths[p])
                    rc = bench_mha(&b, o.seq[i], t, paths[p]);
    static const size_t decode_lengths[] = {1024, 2048, 4096, 8192, 16384, 32768};
    const size_t *lengths = o.seq_given ? o.seq : decode_lengths;
    const size_t num_lengths = o.seq_given ? o.num_seq : 6;
    /* decode: contiguous, then paged at each --page-size (fused only) */
    for (size_t i = 0; rc == CLI_OK && o.ops[4] && i < num_lengths; ++i)
        for (int t = 0; rc == CLI_OK && t < 3; ++t)
            for (size_t s = 0; rc == CLI_OK && o.dtypes[t] && s <= o.num_page_sizes; ++s)
                for (int p = 0; rc == CLI_OK && p < 2; ++p)
                    for (int c = o.kv_dtype_given ? 0 : -1; rc == CLI_OK && c < KV_DTYPES;
                         ++c) {
                        if (c >= 0 && !o.kv_dtypes[c])
                            continue;
                        /* paged caches and block types: the fused path only */
                        if (o.paths[p] && ((s == 0 && c < 3) || paths[p] == CLATTN_PATH_FUSED))
                            rc = bench_decode(&b, lengths[i], t, paths[p],
                                              s == 0 ? 0 : o.page_sizes[s - 1], c);
                        if (c < 0)
                            break;
                    }
    static const size_t default_pages[] = {16, 256};
    const size_t *pages = o.num_page_sizes ? o.page_sizes : default_pages;
    const size_t num_pages = o.num_page_sizes ? o.num_page_sizes : 2;
    const bool slots_layout = !o.page_layout_given || o.page_layouts[0];
    for (size_t i = 0; rc == CLI_OK && o.ops[6] && i < num_lengths; ++i)
        for (int t = 0; rc == CLI_OK && t < 3; ++t)
            for (int l = slots_layout ? 0 : 1; rc == CLI_OK && l < (o.page_layouts[1] ? 2 : 1); ++l)
                for (size_t s = 0; rc == CLI_OK && o.dtypes[t] && s <= num_pages; ++s)
                    rc = bench_paged(&b, lengths[i], t, s == 0 ? 0 : pages[s - 1], l == 1);
    for (size_t i = 0; rc == CLI_OK && o.ops[7] && i < o.num_seq; ++i)
        for (int t = 0; rc == CLI_OK && t < 3; ++t)
            for (int padded = 0; rc == CLI_OK && o.dtypes[t] && padded < 2; ++padded)
                rc = bench_varlen(&b, o.seq[i], t, padded);
    for (size_t i = 0; rc == CLI_OK && o.ops[8] && i < o.num_seq; ++i)
        for (int t = 0; rc == CLI_OK && t < 3; ++t)
            if (o.dtypes[t])
                for (int p = 0; rc == CLI_OK && p < 2; ++p)
                    if (o.paths[p])
                        rc = bench_backward(&b, o.seq[i], o.seq_k ? o.seq_k : o.seq[i], t,
                                            paths[p]);
    for (size_t i = 0; rc == CLI_OK && o.ops[5] && i < o.num_seq; ++i)
        for (int p = 0; rc == CLI_OK && p < 2; ++p)
            if (o.paths[p])
                rc = bench_additive(&b, o.seq[i], paths[p]);
    clattn_ctx_release(b.ctx);
    if (b.queue)
        clReleaseCommandQueue(b.queue);
    clattn_ctx_release(probe);
    return rc;
}
