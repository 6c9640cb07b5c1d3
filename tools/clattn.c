/* The clattn command: attention on OpenCL devices from the shell.
 *   clattn devices | info | demo | run | bench | tune   (each with --help) */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: clattn <command> [options]\n"
    "\n"
    "commands:\n"
    "  devices   list OpenCL platforms and devices; mark the default\n"
    "  info      the device clattn uses and the tuning rows that apply to it\n"
    "  demo      the textbook attention examples on the device, chapter by chapter\n"
    "  run       multi-head or single-head attention on .npy / .safetensors files\n"
    "  sdpa      scaled dot-product attention on .npy / .safetensors files (ONNX Attention)\n"
    "  rope      rotary position embeddings on .npy / .safetensors files (ONNX RotaryEmbedding)\n"
    "  additive  additive (Bahdanau) attention on .npy / .safetensors files\n"
    "  serve     one serving step: decodes and prefill chunks packed over a paged KV cache\n"
    "  merge     two partial attention states merged by their log-sum-exp (merge_state)\n"
    "  bench     time matmul, softmax, attention and MHA forward on the device\n"
    "  tune      search the kernel parameters on the device; write them to the tuning cache\n"
    "\n"
    "Each command takes --help. An option is given once (\"--scale given twice\" otherwise),\n"
    "except where its help says it may be repeated (bench --op). Array inputs are .npy files,\n"
    "or safetensors files of one tensor (FILE:NAME picks one of several). The device is\n"
    "chosen by --device SPEC or the environment\n"
    "variable CLATTN_DEVICE: gpu, cpu, or P:D (platform and device index, see `clattn\n"
    "devices`); by default the first GPU, else the first CPU device.\n"
    "clattn " CLATTN_VERSION_STRING "\n"
    "Exit status (every command): 0 success, 1 device or library failure, 2 bad options or\n"
    "input files (a malformed device spec, an unwritable output path, a bad CLATTN_TUNING file,\n"
    "an unknown CLATTN_PARAMS value included).\n";

/* ---------------------------------------------------------------------------------------------
 * clattn devices
 * ------------------------------------------------------------------------------------------- */

static const char devices_usage[] =
    "Lists every OpenCL platform and device: index P:D, type, compute units, global and local\n"
    "memory, max work-group size, fp16/fp64 support. '*' marks the device clattn uses by\n"
    "default (or the one --device / CLATTN_DEVICE selects).\n"
    "Exit status: 0 success, 1 no usable device, 2 bad options (a malformed --device\n"
    "or CLATTN_DEVICE, or one naming a device that does not exist; a bad CLATTN_TUNING file).\n";

static bool has_extension(cl_device_id device, const char *name)
{
    size_t size = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS)
        return false;
    char *text = malloc(size + 1);
    bool found = false;
    if (text && clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, size, text, NULL) == CL_SUCCESS) {
        text[size] = '\0';
        for (char *at = strstr(text, name); at && !found; at = strstr(at + 1, name)) {
            const char after = at[strlen(name)];
            found = (at == text || at[-1] == ' ') && (after == ' ' || after == '\0');
        }
    }
    free(text);
    return found;
}

static const char *type_name(cl_device_type type)
{
    return (type & CL_DEVICE_TYPE_GPU)           ? "GPU"
           : (type & CL_DEVICE_TYPE_CPU)         ? "CPU"
           : (type & CL_DEVICE_TYPE_ACCELERATOR) ? "accelerator"
                                                 : "other";
}

/* devices and info take only --device. */
typedef struct device_options {
    cli_exec exec; /* --device */
} device_options;
static const cli_option device_table[] = {CLI_USE(cli_exec_group, device_options, exec, 0)};

/* devices or info (name, prose): parses --device, then shows what the command shows. */
static int device_command(const char *name, const char *prose, int (*show)(const char *device),
                          int argc, char **argv)
{
    const char *const help[] = {prose, NULL};
    const cli_command command = {
        .name = name, .options = device_table, .count = CLI_COUNT(device_table), .help = help};
    device_options options = {{NULL}};
    const int rc = cli_parse_command(&command, argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    return show(options.exec.device);
}

/* The platforms and their devices, the one `device_spec` picks marked. */
static int list_devices(const char *device_spec)
{
    cl_platform_id platforms[16];
    cl_uint num_platforms = 0;
    cl_int err = clGetPlatformIDs(16, platforms, &num_platforms);
    if (err != CL_SUCCESS || num_platforms == 0) {
        printf("no OpenCL platform found: install an ICD (pocl-opencl-icd for CPUs, or the GPU "
               "vendor's OpenCL driver)\n");
        return CLI_FAILED;
    }
    if (num_platforms > 16)
        num_platforms = 16;

    /* The device clattn would pick, to mark it. */
    cl_device_id chosen = NULL;
    clattn_ctx *ctx = NULL;
    char message[512] = "";
    const clattn_status status = clattn_ctx_create(device_spec, &ctx, message, sizeof message);
    if (status == CLATTN_SUCCESS) {
        chosen = clattn_ctx_device(ctx);
    } else if (cli_context_failure("devices", device_spec, status, message) == CLI_BAD_INPUT) {
        return CLI_BAD_INPUT; /* a malformed spec, an index that does not exist, bad tuning */
    }

    for (cl_uint p = 0; p < num_platforms; ++p) {
        char name[256] = "", version[256] = "";
        clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
        clGetPlatformInfo(platforms[p], CL_PLATFORM_VERSION, sizeof version - 1, version, NULL);
        printf("platform %u: %s (%s)\n", (unsigned)p, name, version);
        cl_device_id devices[64];
        cl_uint num_devices = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 64, devices, &num_devices) !=
            CL_SUCCESS)
            num_devices = 0;
        if (num_devices > 64)
            num_devices = 64;
        for (cl_uint d = 0; d < num_devices; ++d) {
            cl_device_id dev = devices[d];
            char dev_name[256] = "";
            cl_device_type type = 0;
            cl_uint units = 0;
            cl_ulong global = 0, local = 0, max_alloc = 0;
            size_t max_wg = 0;
            cl_device_fp_config fp64 = 0;
            clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dev_name - 1, dev_name, NULL);
            clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
            clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
            clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
            clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
            clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
            clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL);
            clGetDeviceInfo(dev, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64, &fp64, NULL);
            printf("%c %u:%u  %s  [%s]\n", dev == chosen ? '*' : ' ', (unsigned)p, (unsigned)d,
                   dev_name, type_name(type));
            printf("      compute units %u, global memory %.1f GiB (largest buffer %.1f GiB), "
                   "local memory %llu KiB\n",
                   (unsigned)units, global / 1073741824.0, max_alloc / 1073741824.0,
                   (unsigned long long)(local / 1024));
            printf("      max work-group size %zu, fp16 %s, fp64 %s\n", max_wg,
                   has_extension(dev, "cl_khr_fp16") ? "yes" : "no",
                   fp64 != 0 || has_extension(dev, "cl_khr_fp64") ? "yes" : "no");
        }
    }
    printf("\n* = the device clattn uses");
    if (chosen == NULL)
        printf(": none (%s)", message);
    printf(".\nCLATTN_DEVICE (or --device) chooses it: 'gpu' (first GPU), 'cpu' (first CPU "
           "device), or 'P:D' (platform P, device D as listed above); unset: the first GPU, "
           "else the first CPU device.\n");
    clattn_ctx_release(ctx);
    return chosen ? CLI_OK : CLI_FAILED;
}

/* ---------------------------------------------------------------------------------------------
 * clattn info
 * ------------------------------------------------------------------------------------------- */

static const char info_usage[] =
    "Prints the device clattn uses and its tuning: which rows of the built-in table and of the\n"
    "tuning cache (`clattn tune`, $XDG_CACHE_HOME/clattn/tuning) or of CLATTN_TUNING=FILE\n"
    "applied, the cache rows ignored (malformed, stale, or values the device cannot run: rerun\n"
    "`clattn tune` or delete the file), and the parameters the kernels get.\n"
    "Exit status: 0 success, 1 device or library failure, 2 bad options (a malformed --device\n"
    "or CLATTN_DEVICE, or one naming a device that does not exist; a bad CLATTN_TUNING file).\n";

/* The device device_spec picks, clattn's version and the tuning applied. */
static int show_info(const char *device_spec)
{
    clattn_ctx *ctx = cli_context("info", device_spec);
    if (ctx == NULL)
        return cli_context_exit();
    char vendor[256] = "";
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_VENDOR, sizeof vendor - 1, vendor, NULL);
    cli_print_device(stdout, clattn_ctx_device(ctx));
    printf("vendor: %s\nclattn: %s\n%s\n", vendor, CLATTN_VERSION_STRING, clattn_ctx_tuning(ctx));
    const char *affinity = getenv("POCL_AFFINITY"); /* (pin_pocl_workers, below) */
    printf("PoCL workers: POCL_AFFINITY=%s\n", affinity ? affinity : "(unset)");
    clattn_ctx_release(ctx);
    return CLI_OK;
}

/* devices and info: one parser, then what each shows. */
int cmd_devices(int argc, char **argv)
{
    return device_command("devices", devices_usage, list_devices, argc, argv);
}
int cmd_info(int argc, char **argv)
{
    return device_command("info", info_usage, show_info, argc, argv);
}

/* ---------------------------------------------------------------------------------------------
 * clattn doctor
 * ------------------------------------------------------------------------------------------- */

static const char doctor_usage[] =
    "Checks every kernel variant the device builds for clattn's attention problems (dtypes,\n"
    "head sizes, masks, ALiBi, sinks, decode, paged and quantized caches, the unfused path) on\n"
    "small random problems against a float64 host reference, whatever the validation records\n"
    "say, and prints a table: the probe, the variant, the result, the max error and the\n"
    "tolerance, the time, and the variant's options or what failed. --json FILE writes the\n"
    "report to attach to a bug report. CLATTN_FAULT_VARIANT=PATTERN[:wrong|:build|:enqueue]\n"
    "plants a fault to see it caught.\n"
    "Exit status: 0 every variant passed, 1 a variant failed (named above; plans fell back to\n"
    "another) or a device or library failure, 2 bad options.\n";

typedef struct doctor_options {
    cli_exec exec; /* --device */
    const char *json;
} doctor_options;
static const cli_option doctor_table[] = {
    CLI_USE(cli_exec_group, doctor_options, exec, 0),
    {CLI_OPT("--json", CLI_PATH, CLI_AT(doctor_options, json), "FILE",
             "write the report as JSON to FILE")},
};
static const char *const doctor_help[] = {doctor_usage, NULL};
static const cli_command doctor_command = CLI_COMMAND("doctor", doctor_table, doctor_help);

int cmd_doctor(int argc, char **argv)
{
    doctor_options options = {{NULL}, NULL};
    const int rc = cli_parse_command(&doctor_command, argc, argv, &options);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    clattn_ctx *ctx = cli_context("doctor", options.exec.device);
    if (ctx == NULL)
        return cli_context_exit();
    size_t checked = 0, failed = 0;
    const clattn_status status = clattn_doctor(ctx, options.json, &checked, &failed);
    cli_print_device(stdout, clattn_ctx_device(ctx));
    static const char *const results[] = {"passed", "recorded", "FAILED", "unchecked"};
    const size_t total = clattn_ctx_validations(ctx, NULL, 0);
    clattn_validation *log = calloc(total ? total : 1, sizeof *log);
    if (log)
        clattn_ctx_validations(ctx, log, total);
    printf("%-18s %-44s %-9s %10s %9s %8s  %s\n", "probe", "variant", "result", "max error",
           "tolerance", "ms", "options or what failed");
    for (size_t i = 0; log && i < total; ++i)
        printf("%-18s %-44s %-9s %10.3g %9.3g %8.2f  %s\n", log[i].unit, log[i].variant,
               results[log[i].result], log[i].max_error, log[i].tolerance, log[i].milliseconds,
               log[i].detail);
    free(log);
    int exit_code = CLI_OK;
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "clattn doctor: %s\n", clattn_last_error(ctx));
        exit_code = CLI_FAILED;
    } else if (failed) {
        fprintf(stderr, "clattn doctor: %zu of %zu checks failed on this device (plans fell back "
                        "to other variants)%s%s\n",
                failed, checked, options.json ? "; report: " : "",
                options.json ? options.json : "");
        exit_code = CLI_FAILED;
    } else {
        printf("clattn doctor: all %zu variants passed%s%s\n", checked,
               options.json ? "; report: " : "", options.json ? options.json : "");
    }
    clattn_ctx_release(ctx);
    return exit_code;
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

/* PoCL's CPU device: its worker threads pinned one to a core (POCL_AFFINITY=1, read at the
 * first OpenCL call, which comes after this), unless the environment sets POCL_AFFINITY or an
 * MPI launcher placed the process (its binding stays). Unpinned, Linux often started both
 * workers on one core of a 2-core machine and left them there for seconds: a process's first
 * launches ran at half speed in 10 of 21 processes, a decode step's median 0.30 ms against
 * 0.18 pinned (BENCHMARKS.md, docs/tuning.md). Other devices ignore it. */
static void pin_pocl_workers(void)
{
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_RANK") || getenv("PMI_SIZE"))
        return;
    setenv("POCL_AFFINITY", "1", 0);
}

int main(int argc, char **argv)
{
    pin_pocl_workers();
    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_BAD_INPUT;
    }
    const char *command = argv[1];
    if (strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0 ||
        strcmp(command, "help") == 0) {
        fputs(usage, stdout);
        return CLI_OK;
    }
    if (strcmp(command, "--version") == 0) {
        printf("clattn %s\n", CLATTN_VERSION_STRING);
        return CLI_OK;
    }
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {
#define COMMAND_ENTRY(name) {#name, cmd_##name},
        CLI_COMMANDS(COMMAND_ENTRY)
#undef COMMAND_ENTRY
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i)
        if (strcmp(command, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr,
            "clattn: unknown command '%s' (commands: devices, info, demo, run, sdpa, rope, "
            "additive, merge, bench, "
            "tune, doctor, serve; "
            "see clattn --help)\n",
            command);
    return CLI_BAD_INPUT;
}
