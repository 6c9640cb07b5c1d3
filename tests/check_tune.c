/*
 * check_tune: `clattn tune` and the tuning cache, run as a user runs them. A quick tune writes
 * rows for the device (with their comments and the device's driver key) into
 * $XDG_CACHE_HOME/clattn/tuning; a new context (`clattn info`) applies them,
 * CLATTN_TUNING=default and CLATTN_TUNING=FILE do not; tuning one op again replaces that op's
 * rows only (this device's rows of another driver too) and keeps other devices' rows;
 * --dry-run writes nothing; a garbage cache is ignored row by row (contexts still work,
 * `clattn info` lists the ignored lines); bad options exit 2; the row parser refuses and
 * applies rows by each of its rules (test_row_parser); rows keyed by another driver or clattn
 * version, or by none in the cache, are not applied and noted (test_driver_key). The cache the
 * quick tune wrote is copied to the folder given as the third argument, where the *_tuned ctest
 * entries (XDG_CACHE_HOME) read it: the suites must pass with the tuned rows too. Arguments: the
 * clattn binary, that folder.
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "problems.h"
#include "testutil.h"

static const char *clattn_bin;
static const char *tuned_dir;
static char scratch[] = "/tmp/clattn-tune-XXXXXX";

/* Runs `ENV clattn ARGS` with stdout and stderr captured; returns the exit status. */
static int run_cli(const char *env, const char *args)
{
    char command[4096];
    snprintf(command, sizeof command, "env %s '%s' %s >'%s/stdout' 2>'%s/stderr'", env, clattn_bin,
             args, scratch, scratch);
    int status = system(command);
    return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A file's text (one static buffer per slot, valid until that slot is read again). */
static const char *read_text(const char *path, int slot)
{
    static char buffers[3][1 << 16];
    char *text = buffers[slot];
    FILE *f = fopen(path, "r");
    size_t used = f ? fread(text, 1, sizeof buffers[0] - 1, f) : 0;
    text[used] = '\0';
    if (f)
        fclose(f);
    return f ? text : NULL;
}

static const char *captured(const char *which)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", scratch, which);
    const char *text = read_text(path, strcmp(which, "stdout") == 0 ? 0 : 1);
    return text ? text : "";
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (tu_expect(f != NULL, "cannot write %s", path)) {
        fputs(text, f);
        fclose(f);
    }
}

/* The value of `line` ("rows:", "parameters:") in `clattn info`'s output, up to its end. */
static void info_line(const char *info, const char *line, char *out, size_t size)
{
    const char *at = strstr(info, line);
    out[0] = '\0';
    if (at) {
        at += strlen(line);
        snprintf(out, size, "%.*s", (int)strcspn(at, "\n"), at);
    }
}

/* The device's driver fields as the tuning cache's rows carry them ("driver D | PLATFORM |
 * clattn V"): the "driver key:" line of a report (clattn_ctx_tuning, `clattn info`) after the
 * device name. */
static void driver_fields(const char *report, char *out, size_t size)
{
    char key[1024];
    info_line(report, "driver key: ", key, sizeof key);
    const char *fields = strstr(key, " | driver ");
    snprintf(out, size, "%s", fields ? fields + 3 : "");
}

/* Rows of the file (lines that are neither comments nor blank) naming `name`; each must
 * follow a `# clattn tune` comment. Collects their key=value parts into keys. */
static int device_rows(const char *text, const char *name, char *keys, size_t keys_size)
{
    int rows = 0;
    keys[0] = '\0';
    const char *previous = "";
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        const size_t length = end ? (size_t)(end - line) : strlen(line);
        char row[1024];
        snprintf(row, sizeof row, "%.*s", (int)length, line);
        if (row[0] != '#' && row[0] != '\0' && strstr(row, name)) {
            ++rows;
            tu_expect(tu_starts_with(row, "cpu | ") || tu_starts_with(row, "gpu | "),
                      "row '%s' has no device class", row);
            tu_expect(tu_starts_with(previous, "# clattn tune "),
                      "row '%s' follows '%s', not its comment", row, previous);
            const char *bar = strrchr(row, '|');
            const size_t used = strlen(keys);
            if (bar && bar[2] != '@') /* (a record's keys: record_rows) */
                snprintf(keys + used, keys_size - used, "%s%s", used ? " " : "", bar + 2);
        }
        static char saved[1024];
        snprintf(saved, sizeof saved, "%s", row);
        previous = saved;
        line = end ? end + 1 : NULL;
    }
    return rows;
}

/* The record rows (keys starting with selectors, "@head_dim=128 k=v ...") of device `name`
 * in text, each as clattn_ctx_tuning's records line shows it ("(@head_dim=128: k=v ...)"),
 * into records (separated by newlines); their count. */
static int record_rows(const char *text, const char *name, char *records, size_t size)
{
    int count = 0;
    records[0] = '\0';
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        char row[1024];
        snprintf(row, sizeof row, "%.*s", (int)(end ? (size_t)(end - line) : strlen(line)), line);
        const char *bar = strrchr(row, '|');
        if (row[0] != '#' && strstr(row, name) && bar && bar[1] == ' ' && bar[2] == '@') {
            char shown[512] = "(";
            char *save = NULL;
            bool keys = false;
            for (char *item = strtok_r((char *)bar + 2, " ", &save); item;
                 item = strtok_r(NULL, " ", &save)) {
                const size_t used = strlen(shown);
                snprintf(shown + used, sizeof shown - used, "%s%s%s",
                         item[0] != '@' && !keys ? ":" : "", used > 1 ? " " : "", item);
                keys = keys || item[0] != '@';
            }
            const size_t used = strlen(records);
            snprintf(records + used, size - used, "%s)\n", shown);
            ++count;
        }
        line = end ? end + 1 : NULL;
    }
    return count;
}

/* The device's name as `clattn info` prints it ("device: NAME (CPU)"). */
static void device_name(const char *info, char *name, size_t size)
{
    info_line(info, "device: ", name, size);
    char *paren = strrchr(name, '(');
    if (paren && paren > name)
        paren[-1] = '\0';
}

/* flash_cpu_rb and flash_cpu_nb are searched jointly (cmd_tune.c's joint_keys): every trial
 * line that names one names both, and where flash_cpu.cl runs (PoCL's parameters) there is
 * one at least: `  flash_cpu_rb=R flash_cpu_nb=N: ...`. */
static void expect_joint_search(const char *out)
{
    int joint = 0;
    for (const char *line = out; line && *line;) {
        const char *end = strchr(line, '\n');
        const size_t length = end ? (size_t)(end - line) : strlen(line);
        char text[512];
        snprintf(text, sizeof text, "%.*s", (int)(length < 511 ? length : 511), line);
        const char *rb = strstr(text, "  flash_cpu_rb="), *nb = strstr(text, " flash_cpu_nb=");
        if (rb == text || (nb != NULL && strstr(text, "->") == NULL && text[0] == ' ' &&
                           text[1] == ' ' && strchr(text, ':') != NULL)) {
            tu_expect(rb == text && nb != NULL && nb > rb,
                      "a trial of flash_cpu_rb or flash_cpu_nb alone: '%s'", text);
            joint += rb == text && nb != NULL;
        }
        line = end ? end + 1 : NULL;
    }
    tu_expect(joint > 0 || strstr(out, "flash_cpu_rb") == NULL,
              "flash_cpu_rb appears, but in no joint trial:\n%s", out);
}

/* A search at one head size starts from what the built-in records give it: on a CPU the
 * backward at d = 64 starts from the table's `@head_dim=64 flash_bwd_nv=2`, so its one
 * --quick trial (candidates 2 and 4) is 4, and at d = 128 (no record: the row's 4) it is 2. */
static void expect_record_start(const char *out, bool cpu)
{
    const char *d64 = strstr(out, "backward @head_dim=64 ");
    const char *d128 = strstr(out, "backward @head_dim=128 ");
    if (!tu_expect(cpu ? d64 && d128 && d64 < d128 : !d64 && !d128,
                   "the backward's head-size searches (CPU: %d) are not in:\n%s", cpu, out) ||
        !cpu)
        return;
    char first[2048], second[2048];
    snprintf(first, sizeof first, "%.*s", (int)(d128 - d64), d64);
    const char *next = strstr(d128 + 1, "\n  -> ");
    snprintf(second, sizeof second, "%.*s", next ? (int)(next - d128) : 512, d128);
    tu_expect(strstr(first, "flash_bwd_nv=4:") && !strstr(first, "flash_bwd_nv=2:"),
              "d = 64 did not start from the record's flash_bwd_nv=2:\n%s", first);
    tu_expect(strstr(second, "flash_bwd_nv=2:") && !strstr(second, "flash_bwd_nv=4:"),
              "d = 128 did not start from the row's flash_bwd_nv=4:\n%s", second);
}

START_TEST(test_quick_tune_writes_rows_that_apply)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn tune --quick --op all");
    char env[1024], cache[700], info[4096], name[256], rows[1024], params[2048];
    snprintf(env, sizeof env, "XDG_CACHE_HOME='%s/xdg'", scratch);
    snprintf(cache, sizeof cache, "%s/xdg/clattn/tuning", scratch);
    if (!tu_expect(run_cli(env, "info") == 0, "clattn info failed: %s", captured("stderr")))
        goto done;
    snprintf(info, sizeof info, "%s", captured("stdout"));
    device_name(info, name, sizeof name);
    char fields[1024];
    driver_fields(info, fields, sizeof fields);
    tu_expect(fields[0] != '\0', "`clattn info` prints no driver key: %s", info);
    info_line(info, "rows: ", rows, sizeof rows);
    tu_expect(strstr(rows, "cache") == NULL, "rows from an absent cache: %s", rows);
    /* --quick without --out measures at toy sizes: it prints its rows and must leave the
     * cache alone (absent here). */
    int code = run_cli(env, "tune --quick --op softmax --min-gain=-90");
    tu_expect(code == 0, "tune exited %d: %s", code, captured("stderr"));
    tu_expect(strstr(captured("stdout"), "not written to the tuning cache") != NULL,
              "tune --quick said: %s", captured("stdout"));
    tu_expect(read_text(cache, 0) == NULL, "tune --quick without --out wrote %s", cache);
    /* The user opts in by naming the file: --out the cache itself. A negative --min-gain
     * keeps any candidate within 10x of the best, so that the run writes rows whatever the
     * machine's load (a real run keeps only gains). */
    char folder[800], args[1200];
    snprintf(folder, sizeof folder, "mkdir -p '%s/xdg/clattn'", scratch);
    tu_expect(system(folder) == 0, "%s failed", folder);
    snprintf(args, sizeof args, "tune --quick --op all --min-gain=-90 --out '%s'", cache);
    code = run_cli(env, args);
    if (!tu_expect(code == 0, "tune exited %d: %s", code, captured("stderr")))
        goto done;
    tu_expect(strstr(captured("stdout"), "rows written") != NULL, "tune said: %s",
              captured("stdout"));
    expect_joint_search(captured("stdout"));
    expect_record_start(captured("stdout"), strstr(info, "(CPU)") != NULL);
    const char *text = read_text(cache, 2);
    if (text == NULL) {
        tu_expect(false, "tune wrote no %s", cache);
        goto done;
    }
    char keys[1024];
    const int count = device_rows(text, name, keys, sizeof keys);
    /* matmul, softmax, flash; on a CPU also flash at d = 128 and the backward at 64 and 128
     * (records: "@head_dim=N k=v") */
    tu_expect(count >= 1 && count <= 6, "%d rows for '%s' in:\n%s", count, name, text);
    char records[2048];
    const int record_count = record_rows(text, name, records, sizeof records);
    tu_expect(strstr(info, "(CPU)") || record_count == 0, "records on a GPU:\n%s", text);
    printf("check_tune: the quick tune wrote:\n%s", text);
    /* Each row carries the device's driver key: "class | vendor | NAME | FIELDS | keys". */
    char keyed[1536];
    snprintf(keyed, sizeof keyed, " | %s | %s | ", name, fields);
    int keyed_rows = 0;
    for (const char *at = strstr(text, keyed); at; at = strstr(at + 1, keyed))
        ++keyed_rows;
    tu_expect(keyed_rows == count, "%d of %d rows carry the driver key '%s':\n%s", keyed_rows,
              count, keyed, text);

    /* A new context applies them: `clattn info` names cache lines and shows their values. */
    tu_expect(run_cli(env, "info") == 0, "clattn info failed: %s", captured("stderr"));
    snprintf(info, sizeof info, "%s", captured("stdout"));
    info_line(info, "rows: ", rows, sizeof rows);
    info_line(info, "parameters:", params, sizeof params);
    tu_expect(strstr(rows, "cache line") != NULL, "no cache row applied: %s", info);
    char *save = NULL;
    for (char *kv = strtok_r(keys, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char needle[128];
        snprintf(needle, sizeof needle, " %s", kv);
        tu_expect(strstr(params, needle) != NULL, "'%s' not in the parameters: %s", kv, params);
    }
    /* each record row is a record of the context, with its selectors and keys */
    char applied[4096];
    info_line(info, "records: ", applied, sizeof applied);
    for (char *shown = strtok_r(records, "\n", &save); shown; shown = strtok_r(NULL, "\n", &save))
        tu_expect(strstr(applied, shown) != NULL, "record %s not applied: records: %s", shown,
                  applied);
    /* CLATTN_TUNING=default applies no row; CLATTN_TUNING=FILE reads FILE instead. */
    char other[2048];
    snprintf(other, sizeof other, "%s CLATTN_TUNING=default", env);
    tu_expect(run_cli(other, "info") == 0, "info failed: %s", captured("stderr"));
    info_line(captured("stdout"), "rows: ", rows, sizeof rows);
    tu_expect(strcmp(rows, "none") == 0, "CLATTN_TUNING=default applied: %s", rows);
    char empty[600];
    snprintf(empty, sizeof empty, "%s/empty", scratch);
    write_text(empty, "");
    snprintf(other, sizeof other, "%s CLATTN_TUNING='%s'", env, empty);
    tu_expect(run_cli(other, "info") == 0, "info failed: %s", captured("stderr"));
    info_line(captured("stdout"), "rows: ", rows, sizeof rows);
    tu_expect(strstr(rows, "cache") == NULL && strstr(rows, "table row") != NULL,
              "CLATTN_TUNING=FILE: rows %s", rows);

    /* The *_tuned ctest entries read this cache. */
    if (tuned_dir) {
        char command[2048];
        snprintf(command, sizeof command, "mkdir -p '%s/clattn' && cp '%s' '%s/clattn/tuning'",
                 tuned_dir, cache, tuned_dir);
        tu_expect(system(command) == 0, "%s failed", command);
    }

    /* Tuning one op again replaces that op's rows only; another device's row stays. A row of
     * this device tuned on another driver is not applied, and noted, until then; re-tuning its
     * op replaces it. */
    char appended[70000], vendor[256];
    info_line(info, "vendor: ", vendor, sizeof vendor);
    snprintf(appended, sizeof appended,
             "%s# by hand\ngpu | NoSuchVendor | NoSuchGPU | "
             "softmax_wg=64\n"
             "# clattn tune softmax, on another driver\n%s | %s | %s | driver 0.0-another | "
             "OpenCL 0.0 | clattn 0.0.1 | softmax_rows=0 softmax_wg=2\n",
             text, strstr(info, "(CPU)") ? "cpu" : "gpu", vendor, name);
    write_text(cache, appended);
    tu_expect(run_cli(env, "info") == 0, "clattn info failed: %s", captured("stderr"));
    char ignored[2048];
    info_line(captured("stdout"), "ignored: ", ignored, sizeof ignored);
    tu_expect(strstr(ignored, "tuned on another driver") && strstr(ignored, "driver 0.0-another"),
              "the other driver's row is not noted: %s", captured("stdout"));
    char before[1024];
    snprintf(before, sizeof before, "%s", keys);
    snprintf(args, sizeof args, "tune --quick --op softmax --min-gain=-90 --out '%s'", cache);
    tu_expect(run_cli(env, args) == 0, "tune failed: %s", captured("stderr"));
    text = read_text(cache, 2);
    tu_expect(text && strstr(text, "# by hand\ngpu | NoSuchVendor | NoSuchGPU | softmax_wg=64\n"),
              "the other device's row was lost:\n%s", text ? text : "");
    const char *matmul_row = strstr(appended, "# clattn tune matmul");
    if (matmul_row) {
        char row[2048];
        snprintf(row, sizeof row, "%.*s",
                 (int)(strchr(strchr(matmul_row, '\n') + 1, '\n') - matmul_row + 1), matmul_row);
        tu_expect(text && strstr(text, row), "the matmul rows changed:\n%s", text ? text : "");
    }
    int softmax_comments = 0;
    for (const char *at = text ? strstr(text, "# clattn tune softmax") : NULL; at;
         at = strstr(at + 1, "# clattn tune softmax"))
        ++softmax_comments;
    tu_expect(softmax_comments <= 1, "%d softmax rows:\n%s", softmax_comments, text ? text : "");
    tu_expect(text && strstr(text, "driver 0.0-another") == NULL,
              "re-tuning softmax kept the other driver's softmax row:\n%s", text ? text : "");
    tu_expect(run_cli(env, "info") == 0, "clattn info failed: %s", captured("stderr"));
    info_line(captured("stdout"), "ignored: ", ignored, sizeof ignored);
    tu_expect(strcmp(ignored, "none") == 0, "ignored after re-tuning: %s", ignored);

    /* A record is replaced by a search with the same selectors only: re-tuning flash (d = 64
     * for every problem, d = 128 as a record on a CPU) keeps a hand-made d = 96 record and
     * leaves one d = 128 record. */
    if (strstr(info, "(CPU)") && text) {
        char with_record[70000];
        snprintf(with_record, sizeof with_record,
                 "%s# by hand, head size 96\ncpu | %s | %s | %s | @head_dim=96 flash_cpu_rb=5\n",
                 text, vendor, name, fields);
        write_text(cache, with_record);
        snprintf(args, sizeof args, "tune --quick --op flash --min-gain=-90 --out '%s'", cache);
        tu_expect(run_cli(env, args) == 0, "tune failed: %s", captured("stderr"));
        text = read_text(cache, 2);
        int d128 = 0;
        for (const char *at = text ? strstr(text, "| @head_dim=128 flash_cpu") : NULL; at;
             at = strstr(at + 1, "| @head_dim=128 flash_cpu"))
            ++d128;
        tu_expect(text && strstr(text, "| @head_dim=96 flash_cpu_rb=5\n") && d128 == 1,
                  "re-tuning flash lost the d = 96 record or kept %d d = 128 ones:\n%s", d128,
                  text ? text + (strlen(text) > 1500 ? strlen(text) - 1500 : 0) : "");
    }
done:
    TU_END_TEST();
}
END_TEST

START_TEST(test_garbage_cache_is_ignored)
{
    TU_BEGIN_TEST();
    tu_set_case("garbage in the cache");
    char env[1024], dir[700], cache[800], plain[2048], params[2048], ignored[2048];
    snprintf(dir, sizeof dir, "%s/garbage/clattn", scratch);
    snprintf(cache, sizeof cache, "%s/tuning", dir);
    char command[2048];
    snprintf(command, sizeof command, "mkdir -p '%s'", dir);
    tu_expect(system(command) == 0, "%s failed", command);
    snprintf(env, sizeof env, "XDG_CACHE_HOME='%s/garbage'", scratch);
    tu_expect(run_cli(env, "info") == 0, "info failed: %s", captured("stderr"));
    info_line(captured("stdout"), "parameters:", plain, sizeof plain);
    write_text(cache, "this is not a row\n"
                      "cpu | * | * | no_such_key=1\n"
                      "gpu | * | * | vec_wg=many\n"
                      "any | * | * | vec_width=5\n"
                      "\x01\x02\xff garbage | | |\n");
    tu_expect(run_cli(env, "info") == 0, "info failed on a garbage cache: %s", captured("stderr"));
    info_line(captured("stdout"), "parameters:", params, sizeof params);
    info_line(captured("stdout"), "ignored: ", ignored, sizeof ignored);
    tu_expect(strcmp(plain, params) == 0, "garbage changed the parameters:\n%s\n%s", plain, params);
    for (int line = 1; line <= 5; ++line) {
        char needle[32];
        snprintf(needle, sizeof needle, "cache line %d", line);
        tu_expect(strstr(ignored, needle) != NULL, "'%s' not ignored: %s", needle, ignored);
    }
    /* A computation runs and is right (the demo prints the textbook's Z). */
    tu_expect(run_cli(env, "demo") == 0, "demo failed: %s", captured("stderr"));
    tu_expect(strstr(captured("stdout"), "1.9297") && strstr(captured("stdout"), "1.9646"),
              "demo: %s", captured("stdout"));
    /* A folder where the file should be. */
    remove(cache);
    mkdir(cache, 0755);
    tu_expect(run_cli(env, "info") == 0, "info failed on a folder: %s", captured("stderr"));
    info_line(captured("stdout"), "ignored: ", ignored, sizeof ignored);
    tu_expect(strstr(ignored, "cannot read") != NULL, "a folder as the cache: %s", ignored);
    rmdir(cache);
    TU_END_TEST();
}
END_TEST

typedef struct bad_case {
    const char *env, *args, *needle;
} bad_case;

static const bad_case bad_cases[] = {
    {"", "tune --op attention", "--op"},
    {"", "tune --min-gain=abc", "--min-gain"},
    {"", "tune --min-gain=100", "--min-gain"},
    {"", "tune --quick=yes", "--quick"},
    {"", "tune --frobnicate", "unknown option"},
    {"", "tune --out", "--out"},
    {"CLATTN_PARAMS=gpu", "tune --quick --dry-run", "CLATTN_PARAMS"},
    {"CLATTN_MATMUL=tiled", "tune --quick --dry-run", "CLATTN_MATMUL"},
    {"", "info --frobnicate", "unknown option"},
    /* docs/cli.md's exit contract: a malformed device spec, or one naming an index that does not
     * exist, is a bad option (2), on every command; so are a bad tuning file (named as such,
     * not "no device"), an unknown CLATTN_PARAMS, an unknown bench option and an output path
     * that cannot be written (checked before any work). */
    {"", "info --device banana", "bad --device"},
    {"CLATTN_DEVICE=-1:0", "info", "bad CLATTN_DEVICE"},
    {"", "info --device 99:0", "bad --device"},
    {"", "devices --device 0:99", "bad --device"},
    {"", "demo --device=-1:0", "bad --device"},
    {"CLATTN_DEVICE=banana", "tune --quick --dry-run", "bad CLATTN_DEVICE"},
    {"CLATTN_PARAMS=fast", "info", "CLATTN_PARAMS='fast'"},
    {"CLATTN_TUNING=/etc/os-release", "info", "bad tuning file"},
    {"CLATTN_TUNING=/nonexistent/tuning", "demo", "bad tuning file"},
    {"", "bench --bogus", "unknown option '--bogus'"},
    {"", "bench --bogus=1", "unknown option '--bogus'"},
    {"", "tune --quick --out /etc/os-release/rows", "'/etc/os-release' is not a folder"},
    {"", "tune --quick --out /tmp", "is a folder"},
};

START_TEST(test_bad_options_exit_2)
{
    TU_BEGIN_TEST();
    const bad_case *c = &bad_cases[_i];
    tu_set_case("%s clattn %s", c->env, c->args);
    char env[1024];
    snprintf(env, sizeof env, "XDG_CACHE_HOME='%s/bad' %s", scratch, c->env);
    const int code = run_cli(env, c->args);
    const char *err = captured("stderr");
    tu_expect(code == 2, "exit %d, stderr: %s", code, err);
    tu_expect(strstr(err, c->needle) != NULL, "stderr does not name %s: %s", c->needle, err);
    tu_expect(strchr(err, '\n') == err + strlen(err) - 1, "not one line: %s", err);
    char path[700];
    snprintf(path, sizeof path, "%s/bad", scratch);
    tu_expect(access(path, F_OK) != 0, "a failed tune created %s", path);
    TU_END_TEST();
}
END_TEST

START_TEST(test_dry_run_and_out)
{
    TU_BEGIN_TEST();
    tu_set_case("--dry-run, --out, --help");
    char env[1024], args[1024], out[700];
    snprintf(env, sizeof env, "XDG_CACHE_HOME='%s/dry'", scratch);
    tu_expect(run_cli(env, "tune --quick --op flash --dry-run") == 0, "dry run failed: %s",
              captured("stderr"));
    tu_expect(strstr(captured("stdout"), "nothing written") != NULL, "dry run said: %s",
              captured("stdout"));
    /* (the validation records next to it may be written: docs/validation.md) */
    snprintf(out, sizeof out, "%s/dry/clattn/tuning", scratch);
    tu_expect(access(out, F_OK) != 0, "--dry-run created %s", out);
    /* --out into a folder that does not exist yet. */
    snprintf(out, sizeof out, "%s/new/folder/rows.txt", scratch);
    snprintf(args, sizeof args, "tune --quick --op flash --min-gain=-90 --out '%s'", out);
    tu_expect(run_cli(env, args) == 0, "--out failed: %s", captured("stderr"));
    tu_expect(read_text(out, 2) != NULL, "--out wrote no %s", out);
    tu_expect(run_cli(env, "tune --help") == 0 && strstr(captured("stdout"), "usage: clattn tune"),
              "tune --help: %s", captured("stdout"));
    tu_expect(run_cli(env, "--help") == 0 && strstr(captured("stdout"), "tune "),
              "clattn --help does not list tune: %s", captured("stdout"));
    TU_END_TEST();
}
END_TEST

/* The library side: clattn_ctx_create_desc with tuning_rows and tuning_file, the cache read
 * (or not) by each, clattn_ctx_tuning's report, and the descriptor's errors. */
START_TEST(test_ctx_desc)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn_ctx_create_desc");
    char dir[700], cache[800], message[1024];
    snprintf(dir, sizeof dir, "%s/lib", scratch);
    snprintf(cache, sizeof cache, "%s/clattn/tuning", dir);
    char command[2048];
    snprintf(command, sizeof command, "mkdir -p '%s/clattn'", dir);
    tu_expect(system(command) == 0, "%s failed", command);
    char fields[1024], rows_text[4096];
    driver_fields(clattn_ctx_tuning(tu_ctx()), fields, sizeof fields);
    tu_expect(fields[0] != '\0', "no driver key: %s", clattn_ctx_tuning(tu_ctx()));
    snprintf(rows_text, sizeof rows_text,
             "# a cache row for every device on this driver\nany | * | * | %s | softmax_wg=8\n"
             "any | * | * | %s | no_such_key=1\n",
             fields, fields);
    write_text(cache, rows_text);
    const char *saved = getenv("XDG_CACHE_HOME");
    char *saved_copy = saved ? strdup(saved) : NULL;
    setenv("XDG_CACHE_HOME", dir, 1);
    const char *saved_tuning = getenv("CLATTN_TUNING");
    char *saved_tuning_copy = saved_tuning ? strdup(saved_tuning) : NULL;
    unsetenv("CLATTN_TUNING");

    clattn_ctx_desc desc;
    clattn_ctx_desc_init(&desc);
    clattn_ctx *ctx = NULL;
    tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message), CLATTN_SUCCESS,
                     "clattn_ctx_create_desc (defaults)");
    const char *report = clattn_ctx_tuning(ctx);
    tu_expect(strstr(report, "cache line 2") && strstr(report, " softmax_wg=8"),
              "the cache row did not apply: %s", report);
    tu_expect(strstr(report, "ignored: tuning cache line 3") != NULL,
              "the stale cache row is not reported: %s", report);
    clattn_ctx_release(ctx);
    ctx = NULL;

    /* Rows of the descriptor apply last, after the cache; "" reads no file. */
    desc.tuning_rows = "any | * | * | softmax_wg=16\n# comment\n\nany | * | * | flash_rows=32";
    tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message), CLATTN_SUCCESS,
                     "clattn_ctx_create_desc (rows)");
    report = clattn_ctx_tuning(ctx);
    tu_expect(strstr(report, "cache line 2; tuning_rows line 1; tuning_rows line 4") &&
                  strstr(report, " softmax_wg=16") && strstr(report, " flash_rows=32"),
              "rows: %s", report);
    clattn_ctx_release(ctx);
    ctx = NULL;
    desc.tuning_file = "";
    tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message), CLATTN_SUCCESS,
                     "clattn_ctx_create_desc (no file)");
    report = clattn_ctx_tuning(ctx);
    tu_expect(strstr(report, "cache") == NULL && strstr(report, "tuning_rows line 1"),
              "tuning_file \"\": %s", report);
    clattn_ctx_release(ctx);
    ctx = NULL;
    desc.tuning_file = "default";
    desc.tuning_rows = NULL;
    tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message), CLATTN_SUCCESS,
                     "clattn_ctx_create_desc (default)");
    tu_expect(strncmp(clattn_ctx_tuning(ctx), "rows: none\n", 11) == 0, "default: %s",
              clattn_ctx_tuning(ctx));
    /* On the caller's queue. */
    clattn_ctx *on_queue = NULL;
    clattn_ctx_desc queue_desc;
    clattn_ctx_desc_init(&queue_desc);
    queue_desc.queue = clattn_ctx_queue(ctx);
    queue_desc.device_spec = "no such device spec: unused with a queue";
    tu_expect_status(clattn_ctx_create_desc(&queue_desc, &on_queue, message, sizeof message),
                     CLATTN_SUCCESS, "clattn_ctx_create_desc (queue)");
    tu_expect(on_queue && clattn_ctx_queue(on_queue) == clattn_ctx_queue(ctx),
              "not on the caller's queue");
    clattn_ctx_release(on_queue);
    clattn_ctx_release(ctx);
    ctx = NULL;

    /* CLATTN_TUNING=default drops the cache (and the built-in rows) for desc.tuning_file NULL. */
    setenv("CLATTN_TUNING", "default", 1);
    clattn_ctx_desc_init(&desc);
    tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message), CLATTN_SUCCESS,
                     "CLATTN_TUNING=default");
    tu_expect(ctx && strncmp(clattn_ctx_tuning(ctx), "rows: none\n", 11) == 0,
              "CLATTN_TUNING=default: %s", clattn_ctx_tuning(ctx));
    clattn_ctx_release(ctx);
    ctx = NULL;
    unsetenv("CLATTN_TUNING");

    /* Errors: a malformed row, values the device cannot run, the struct, NULLs. */
    /* given: the tuning rows */
    static const tu_refusal bad[] = {
        {"not a row", "tuning_rows line 1", CLATTN_ERR_INVALID_ARGUMENT},
        {"# ok\nany | * | * | no_such_key=3", "tuning_rows line 2", CLATTN_ERR_INVALID_ARGUMENT},
        {"any | * | * | vec_width=5", "tuning_rows line 1", CLATTN_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        desc.tuning_rows = bad[i].given;
        message[0] = '\0';
        tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message), bad[i].want,
                         bad[i].given);
        tu_expect(ctx == NULL && strstr(message, bad[i].needle), "'%s': %s", bad[i].given, message);
        clattn_ctx_release(ctx);
        ctx = NULL;
    }
    desc.tuning_rows = NULL;
    desc.struct_size = sizeof desc - 1;
    tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message),
                     CLATTN_ERR_INVALID_ARGUMENT, "struct_size");
    tu_expect(strstr(message, "struct_size") != NULL, "struct_size: %s", message);
    tu_expect_status(clattn_ctx_create_desc(NULL, &ctx, message, sizeof message),
                     CLATTN_ERR_INVALID_ARGUMENT, "desc NULL");
    clattn_ctx_desc_init(&desc);
    tu_expect_status(clattn_ctx_create_desc(&desc, NULL, message, sizeof message),
                     CLATTN_ERR_INVALID_ARGUMENT, "out NULL");
    tu_expect(strstr(clattn_ctx_tuning(NULL), "NULL") != NULL, "clattn_ctx_tuning(NULL)");
    clattn_ctx_desc_init(NULL);

    if (saved_copy)
        setenv("XDG_CACHE_HOME", saved_copy, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    if (saved_tuning_copy)
        setenv("CLATTN_TUNING", saved_tuning_copy, 1);
    free(saved_copy);
    free(saved_tuning_copy);
    TU_END_TEST();
}
END_TEST

/* --- the tuning-row parser ------------------------------------------------------------------ */

/* Creates a context with `rows` as the descriptor's tuning rows (no tuning file or cache) and
 * returns its status; on success *report receives clattn_ctx_tuning (else message holds why). */
static clattn_status ctx_with_rows(const char *tuning_file, const char *rows, char *report,
                                   size_t report_size, char *message, size_t message_size)
{
    clattn_ctx_desc desc;
    clattn_ctx_desc_init(&desc);
    desc.tuning_file = tuning_file;
    desc.tuning_rows = rows;
    clattn_ctx *ctx = NULL;
    message[0] = '\0';
    report[0] = '\0';
    const clattn_status status = clattn_ctx_create_desc(&desc, &ctx, message, message_size);
    if (ctx)
        snprintf(report, report_size, "%s", clattn_ctx_tuning(ctx));
    clattn_ctx_release(ctx);
    return status;
}

/* The value of `key` on the report's parameters line (" key=N", the whole key), or -1. */
static long param_of(const char *report, const char *key)
{
    const char *params = strstr(report, "parameters:");
    char needle[64];
    snprintf(needle, sizeof needle, " %s=", key);
    const char *at = params ? strstr(params, needle) : NULL;
    return at ? strtol(at + strlen(needle), NULL, 10) : -1;
}

/* Whether the report's rows line lists `origin`. */
static bool row_listed(const char *report, const char *origin)
{
    char rows[1024];
    info_line(report, "rows: ", rows, sizeof rows);
    return strstr(rows, origin) != NULL;
}

/* A row that must be refused: the status, and a message naming the origin and the item. */
static void expect_refused(const char *file, const char *rows, const char *origin, const char *item)
{
    char report[4096], message[1024];
    const clattn_status status =
        ctx_with_rows(file, rows, report, sizeof report, message, sizeof message);
    tu_expect(status == CLATTN_ERR_INVALID_ARGUMENT && strstr(message, origin) &&
                  strstr(message, item),
              "'%s' (%s) was not refused naming '%s': %s (%d): %s", rows ? rows : file, origin,
              item, clattn_status_string(status), (int)status, message);
}

/* A well-formed row that applies (applies 1) or parses but does not apply (0): softmax_wg
 * becomes `value` (or keeps `plain`), and the rows line lists it (or not). */
static void expect_applied(const char *row, int applies, long value, long plain)
{
    char report[4096], message[1024];
    const clattn_status status =
        ctx_with_rows("", row, report, sizeof report, message, sizeof message);
    if (!tu_expect_status(status, CLATTN_SUCCESS, row))
        return;
    const long got = param_of(report, "softmax_wg");
    tu_expect(row_listed(report, "tuning_rows line 1") == (applies != 0) &&
                  got == (applies ? value : plain),
              "'%s' should %sapply: softmax_wg=%ld (plain %ld); %s", row, applies ? "" : "not ",
              got, plain, report);
}

/* The tuning-row parser (host/core/tuning.c), each rule tested on its own through the
 * context descriptor's rows, which CLATTN_TUNING=FILE and the cache parse alike:
 * - refused (CLATTN_ERR_INVALID_ARGUMENT naming the item), also in a row for another
 *   device: a key that is only a prefix of real keys (tile, flash_cpu_r, softmax_w), a key
 *   that has a real key as its prefix (softmax_wgx), an empty value (softmax_wg=, and
 *   flash_gpu= and loop_trip_limit=, where 0 would be valid), a value alone (=8);
 * - applied to itself only: a real key that is a prefix of another (flash_cpu, flash_cpu_rb);
 * - the vendor and device fields are prefixes of the device's strings (clattn.h: `class |
 *   vendor prefix | device-name prefix`): the whole string and a proper prefix apply; the
 *   string plus a character, and the string less its first character, parse but do not apply;
 * - CLATTN_TUNING=FILE refuses a prefix key and an empty value ("file line N"); the tuning
 *   cache ignores those rows and one whose values no kernel runs (vec_width=5: the parameters
 *   stay as before it), lists them as ignored and applies the good one after them. */
START_TEST(test_row_parser)
{
    TU_BEGIN_TEST();
    tu_set_case("tuning rows: keys, values, vendor and device prefixes");
    /* given: the tuning rows */
    static const tu_needle refused[] = {
        {"any | * | * | tile=8", "tile=8"},
        {"any | * | * | flash_cpu_r=4", "flash_cpu_r=4"},
        {"any | * | * | softmax_w=8", "softmax_w=8"},
        {"any | * | * | softmax_wgx=8", "softmax_wgx=8"},
        {"any | * | * | softmax_wg=", "softmax_wg="},
        {"any | * | * | flash_gpu=", "flash_gpu="},
        {"any | * | * | loop_trip_limit=", "loop_trip_limit="},
        {"any | * | * | =8", "=8"},
        {"any | no such vendor | * | tile=8", "tile=8"},
        {"any | * | no such device | flash_gpu=", "flash_gpu="},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i)
        expect_refused("", refused[i].given, "tuning_rows line 1", refused[i].needle);

    char report[4096], message[1024];
    tu_expect_status(ctx_with_rows("", NULL, report, sizeof report, message, sizeof message),
                     CLATTN_SUCCESS, "no rows");
    const long plain_wg = param_of(report, "softmax_wg");
    const long plain_cpu = param_of(report, "flash_cpu"),
               plain_rb = param_of(report, "flash_cpu_rb"),
               plain_vec_width = param_of(report, "vec_width");
    const long wg = plain_wg == 4 ? 8 : 4;
    tu_expect(plain_wg > 0 && plain_cpu >= 0 && plain_rb > 0, "parameters: %s", report);
    /* a real key that is a prefix of another sets itself only */
    char row[512];
    snprintf(row, sizeof row, "any | * | * | flash_cpu=%ld", 1 - plain_cpu);
    if (tu_expect_status(ctx_with_rows("", row, report, sizeof report, message, sizeof message),
                         CLATTN_SUCCESS, row))
        tu_expect(param_of(report, "flash_cpu") == 1 - plain_cpu &&
                      param_of(report, "flash_cpu_rb") == plain_rb,
                  "'%s': %s", row, report);
    snprintf(row, sizeof row, "any | * | * | flash_cpu_rb=%ld", plain_rb == 3 ? 5L : 3L);
    if (tu_expect_status(ctx_with_rows("", row, report, sizeof report, message, sizeof message),
                         CLATTN_SUCCESS, row))
        tu_expect(param_of(report, "flash_cpu_rb") == (plain_rb == 3 ? 5 : 3) &&
                      param_of(report, "flash_cpu") == plain_cpu,
                  "'%s': %s", row, report);

    /* vendor (field 1) and device name (field 2) prefixes */
    clattn_ctx *ctx = tu_ctx();
    char strings[2][256] = {"", ""};
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_VENDOR, sizeof strings[0], strings[0], NULL);
    clGetDeviceInfo(clattn_ctx_device(ctx), CL_DEVICE_NAME, sizeof strings[1], strings[1], NULL);
    for (int field = 0; field < 2; ++field) {
        const char *full = strings[field];
        const size_t length = strlen(full);
        if (!tu_expect(length >= 2 && !strpbrk(full, "|#") && !isspace((unsigned char)full[0]) &&
                           !isspace((unsigned char)full[length - 1]),
                       "device string '%s' cannot be a row field", full))
            continue;
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(length / 2), full);
        while (strlen(prefix) > 1 && isspace((unsigned char)prefix[strlen(prefix) - 1]))
            prefix[strlen(prefix) - 1] = '\0';
        const char *values[4] = {full, prefix, NULL, full + 1};
        char longer[260];
        snprintf(longer, sizeof longer, "%sx", full);
        values[2] = longer;
        for (int v = 0; v < 4; ++v) {
            const int applies = v < 2 || strncmp(full, values[v], strlen(values[v])) == 0;
            snprintf(row, sizeof row, "any | %s | %s | softmax_wg=%ld",
                     field == 0 ? values[v] : "*", field == 1 ? values[v] : "*", wg);
            expect_applied(row, applies, wg, plain_wg);
        }
    }

    /* CLATTN_TUNING=FILE refuses; the cache ignores and goes on */
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/parser", scratch);
    snprintf(path, sizeof path, "%s/clattn", dir);
    mkdir(dir, 0755);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/clattn/tuning", dir);
    write_text(path, "# prefix key\nany | * | * | tile=8\n");
    expect_refused(path, NULL, "file line 2", "tile=8");
    write_text(path, "any | * | * | flash_gpu=\n");
    expect_refused(path, NULL, "file line 1", "flash_gpu=");
    char fields[1024], cache_rows[8192];
    driver_fields(clattn_ctx_tuning(ctx), fields, sizeof fields);
    /* line 3 parses (4 <= vec_width <= 16) but no kernel runs it (4, 8 or 16): ignored, the
     * parameters as before it (not left half-applied) */
    snprintf(cache_rows, sizeof cache_rows,
             "any | * | * | %s | tile=8\nany | * | * | %s | flash_gpu=\n"
             "any | * | * | %s | vec_width=5\nany | * | * | %s | softmax_wg=%ld\n",
             fields, fields, fields, fields, wg);
    write_text(path, cache_rows);
    const char *saved = getenv("XDG_CACHE_HOME");
    char *saved_copy = saved ? strdup(saved) : NULL;
    const char *saved_tuning = getenv("CLATTN_TUNING");
    char *saved_tuning_copy = saved_tuning ? strdup(saved_tuning) : NULL;
    setenv("XDG_CACHE_HOME", dir, 1);
    unsetenv("CLATTN_TUNING");
    if (tu_expect_status(ctx_with_rows(NULL, NULL, report, sizeof report, message, sizeof message),
                         CLATTN_SUCCESS, "the cache")) {
        char ignored[1024];
        info_line(report, "ignored: ", ignored, sizeof ignored);
        tu_expect(strstr(ignored, "cache line 1") && strstr(ignored, "tile=8") &&
                      strstr(ignored, "cache line 2") && strstr(ignored, "flash_gpu=") &&
                      strstr(ignored, "cache line 3: values this device or the kernels cannot "
                                      "run") &&
                      row_listed(report, "cache line 4") && !row_listed(report, "cache line 1") &&
                      !row_listed(report, "cache line 3") &&
                      param_of(report, "softmax_wg") == wg &&
                      param_of(report, "vec_width") == plain_vec_width,
                  "the cache: %s", report);
    }
    if (saved_copy)
        setenv("XDG_CACHE_HOME", saved_copy, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    if (saved_tuning_copy)
        setenv("CLATTN_TUNING", saved_tuning_copy, 1);
    free(saved_copy);
    free(saved_tuning_copy);
    TU_END_TEST();
}
END_TEST

/* --- rows keyed by the driver (issue 48) ---------------------------------------------------- */

/* `fields` with its first occurrence of `from` replaced by `to`. */
static void replaced(const char *fields, const char *from, const char *to, char *out, size_t size)
{
    const char *at = strstr(fields, from);
    if (at == NULL)
        snprintf(out, size, "%s", fields);
    else
        snprintf(out, size, "%.*s%s%s", (int)(at - fields), fields, to, at + strlen(from));
}

/* A context reading `text` as the tuning cache (tuning_file NULL) or as a CLATTN_TUNING file
 * (file true) in dir; returns its status, the report in report. */
static clattn_status ctx_with_file(const char *dir, bool file, const char *text, char *report,
                                   size_t report_size, char *message, size_t message_size)
{
    char path[800];
    snprintf(path, sizeof path, "%s/clattn/tuning", dir);
    write_text(path, text);
    return ctx_with_rows(file ? path : NULL, NULL, report, report_size, message, message_size);
}

/* The tuning cache's rows carry the driver key of the device they were measured on
 * ("class | vendor | NAME | driver D | PLATFORM | clattn V | keys", the "driver key:" line of
 * clattn_ctx_tuning after the name): a row with this device's key applies (whitespace runs
 * compared as one space); the same row with another driver, or another clattn version, or
 * without the key (an older clattn's) is not applied, and the report's ignored line names its
 * line, says it was tuned on another driver and offers `clattn tune`; another device's row is
 * silently not applied. A CLATTN_TUNING file's row without the key applies as before; with
 * another driver's it is ignored with the same note (not an error); malformed driver fields
 * are refused there and ignored in the cache. */
START_TEST(test_driver_key)
{
    TU_BEGIN_TEST();
    tu_set_case("tuning rows keyed by the driver");
    char report[4096], message[1024], fields[1024], ignored[2048];
    if (!tu_expect_status(ctx_with_rows("", NULL, report, sizeof report, message, sizeof message),
                          CLATTN_SUCCESS, "no rows"))
        goto done;
    const long plain = param_of(report, "softmax_wg"), wg = plain == 4 ? 8 : 4;
    driver_fields(report, fields, sizeof fields);
    if (!tu_expect(tu_starts_with(fields, "driver ") &&
                       strstr(fields, " | clattn " CLATTN_VERSION_STRING) != NULL,
                   "the driver key: %s", report))
        goto done;
    char name[256] = "";
    clGetDeviceInfo(clattn_ctx_device(tu_ctx()), CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    /* the same fields another way: every separator and space doubled */
    char spaced[2048] = "", other_driver[1100], other_clattn[1100];
    for (const char *c = fields; *c && strlen(spaced) + 4 < sizeof spaced; ++c)
        strcat(spaced, *c == ' ' ? "  " : *c == '|' ? " | " : (char[]){*c, '\0'});
    replaced(fields, "driver ", "driver 0.0-another-", other_driver, sizeof other_driver);
    replaced(fields, " | clattn " CLATTN_VERSION_STRING, " | clattn 0.0.1", other_clattn,
             sizeof other_clattn);

    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/driver", scratch);
    snprintf(path, sizeof path, "%s/clattn", dir);
    mkdir(dir, 0755);
    mkdir(path, 0755);
    char *saved = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    char *saved_tuning = getenv("CLATTN_TUNING") ? strdup(getenv("CLATTN_TUNING")) : NULL;
    setenv("XDG_CACHE_HOME", dir, 1);
    unsetenv("CLATTN_TUNING");
    static const char *const another = "tuned on another driver or clattn version";
    const struct {
        const char *label, *device, *fields; /* fields NULL: a row without them */
        bool file, applies;
        const char *note; /* in the ignored line, with "line 1" and `clattn tune`; NULL: none */
    } cases[] = {
        {"the cache, this driver", name, fields, false, true, NULL},
        {"the cache, this driver spaced out", name, spaced, false, true, NULL},
        {"the cache, another driver", name, other_driver, false, false, other_driver},
        {"the cache, another clattn", name, other_clattn, false, false, other_clattn},
        {"the cache, no driver key", name, NULL, false, false, "no driver key"},
        {"the cache, another device", "NoSuchDevice", other_driver, false, false, NULL},
        {"a file, no driver key", name, NULL, true, true, NULL},
        {"a file, this driver", name, fields, true, true, NULL},
        {"a file, another driver", name, other_driver, true, false, other_driver},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        char row[4096];
        if (cases[i].fields)
            snprintf(row, sizeof row, "# %s\nany | * | %s | %s | softmax_wg=%ld\n", cases[i].label,
                     cases[i].device, cases[i].fields, wg);
        else
            snprintf(row, sizeof row, "# %s\nany | * | %s | softmax_wg=%ld\n", cases[i].label,
                     cases[i].device, wg);
        if (!tu_expect_status(ctx_with_file(dir, cases[i].file, row, report, sizeof report, message,
                                            sizeof message),
                              CLATTN_SUCCESS, cases[i].label))
            continue;
        const char *origin = cases[i].file ? "file line 2" : "cache line 2";
        info_line(report, "ignored: ", ignored, sizeof ignored);
        tu_expect(row_listed(report, origin) == cases[i].applies &&
                      param_of(report, "softmax_wg") == (cases[i].applies ? wg : plain),
                  "%s: the row should %sapply:\n%s\n%s", cases[i].label,
                  cases[i].applies ? "" : "not ", row, report);
        if (cases[i].note)
            tu_expect(strstr(ignored, origin) && strstr(ignored, another) &&
                          strstr(ignored, cases[i].note) && strstr(ignored, "`clattn tune`"),
                      "%s: the ignored line does not say why: %s", cases[i].label, ignored);
        else
            tu_expect(strcmp(ignored, "none") == 0, "%s: ignored %s", cases[i].label, ignored);
    }
    /* Driver fields that are not "driver D | PLATFORM | clattn V": refused in a file (and in
     * the descriptor's rows), ignored in the cache. */
    static const char *const malformed = "any | * | * | driver 1 | clattnX | softmax_wg=8\n";
    tu_expect_status(
        ctx_with_file(dir, true, malformed, report, sizeof report, message, sizeof message),
        CLATTN_ERR_INVALID_ARGUMENT, "malformed driver fields in a file");
    tu_expect(strstr(message, "file line 1") && strstr(message, "driver 1 | clattnX"),
              "malformed driver fields in a file: %s", message);
    if (tu_expect_status(
            ctx_with_file(dir, false, malformed, report, sizeof report, message, sizeof message),
            CLATTN_SUCCESS, "malformed driver fields in the cache")) {
        info_line(report, "ignored: ", ignored, sizeof ignored);
        tu_expect(strstr(ignored, "cache line 1") && strstr(ignored, "driver 1 | clattnX"),
                  "malformed driver fields in the cache: %s", report);
    }
    if (saved)
        setenv("XDG_CACHE_HOME", saved, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    if (saved_tuning)
        setenv("CLATTN_TUNING", saved_tuning, 1);
    free(saved);
    free(saved_tuning);
done:
    TU_END_TEST();
}
END_TEST

/* --- records scoped to a dtype ---------------------------------------------------------- */

/* Tuning records scoped to q's dtype (@dtype=, host/core/tuning.c's clattn__tuning_for) set
 * the plans of that dtype only (issue 48). For each selector f32, f16 and bf16, a context
 * whose one row is that record (flash.cl in groups of 4 rows with 8-float vectors, whatever
 * the device's own row picks) makes fused SDPA plans of one problem stored in F32, F16 and
 * BF16: the record's dtype's plan lists the record and runs that flash.cl variant, which
 * executes against the float64 reference; each other dtype's plan lists no record and is
 * described exactly as a context without the row describes it (the same kernel, variant and
 * geometry). */
static const char *const record_dtype_names[3] = {"f32", "f16", "bf16"};
static const clattn_dtype record_dtypes[3] = {CLATTN_DTYPE_F32, CLATTN_DTYPE_F16,
                                              CLATTN_DTYPE_BF16};

static void dtype_problem(pb_sdpa_problem *p, clattn_dtype dtype)
{
    pb_sdpa_spec spec;
    pb_sdpa_spec_init(&spec);
    spec.batch = 1, spec.heads = 2, spec.seq_q = 5, spec.seq_k = 40, spec.dk = spec.dv = 16;
    spec.q_dtype = spec.k_dtype = spec.v_dtype = spec.out_dtype = dtype;
    spec.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    spec.path = CLATTN_PATH_FUSED;
    pb_sdpa_make(p, &spec);
}

/* The plan's description (clattn_plan_info) into text; 0 when the plan was not made. */
static int dtype_plan_info(clattn_ctx *ctx, const pb_sdpa_problem *p, char *text, size_t size)
{
    clattn_sdpa_desc desc;
    pb_sdpa_desc(p, &desc);
    clattn_plan *plan = NULL;
    text[0] = '\0';
    if (!tu_expect_status(clattn_sdpa_plan_create(ctx, &desc, &plan), CLATTN_SUCCESS, p->label))
        return 0;
    snprintf(text, size, "%s", clattn_plan_info(plan));
    clattn_plan_release(plan);
    return 1;
}

START_TEST(test_records_by_dtype)
{
    TU_BEGIN_TEST();
    pb_sdpa_problem problems[3];
    char plain[3][1024];
    for (int t = 0; t < 3; ++t) {
        dtype_problem(&problems[t], record_dtypes[t]);
        dtype_plan_info(tu_ctx(), &problems[t], plain[t], sizeof plain[t]);
    }
    for (int r = 0; r < 3; ++r) {
        char row[160], message[1024] = "";
        snprintf(row, sizeof row,
                 "any | * | * | @dtype=%s flash_cpu=0 flash_gpu=0 flash_rows=4 flash_vw=8",
                 record_dtype_names[r]);
        tu_set_case("record '%s'", row);
        clattn_ctx_desc desc;
        clattn_ctx_desc_init(&desc);
        desc.queue = clattn_ctx_queue(tu_ctx());
        desc.tuning_rows = row;
        clattn_ctx *ctx = NULL;
        if (!tu_expect_status(clattn_ctx_create_desc(&desc, &ctx, message, sizeof message),
                              CLATTN_SUCCESS, message))
            continue;
        char listed[64];
        snprintf(listed, sizeof listed, "tuning_rows line 1 (@dtype=%s)", record_dtype_names[r]);
        for (int t = 0; t < 3; ++t) {
            const pb_sdpa_problem *p = &problems[t];
            tu_set_case("record '%s', a plan stored in %s: %s", row, record_dtype_names[t],
                        p->label);
            char info[1024];
            if (!dtype_plan_info(ctx, p, info, sizeof info))
                continue;
            if (t == r) {
                tu_expect(strstr(info, listed) && strstr(info, "flash.cl (4 rows") &&
                              strstr(info, "8-float vectors"),
                          "the %s plan did not take its record: %s", record_dtype_names[t], info);
                tu_expect_status(pb_sdpa_run(ctx, p, NULL), CLATTN_SUCCESS, "pb_sdpa_run");
            } else {
                tu_expect(strstr(info, "tuning_rows") == NULL && strcmp(info, plain[t]) == 0,
                          "the %s plan took the @dtype=%s record: '%s' (without the row: '%s')",
                          record_dtype_names[t], record_dtype_names[r], info, plain[t]);
            }
        }
        clattn_ctx_release(ctx);
    }
    for (int t = 0; t < 3; ++t)
        pb_sdpa_free(&problems[t]);
    TU_END_TEST();
}
END_TEST

/* The public list of tuning keys (clattn_tuning_key_get, what `clattn tune` searches): every
 * key below in this order (later keys may be added between them), each in the parameters line
 * of clattn_ctx_tuning, with sane columns; and the struct_size rules. */
static const char *const known_keys[] = {
    "matmul_vec",   "vec_rm",       "vec_width",    "vec_nv",       "vec_rb",
    "vec_kc",       "vec_wg",       "vec_stream",   "tile_m",       "tile_n",
    "tile_k",       "wpt_m",        "wpt_n",        "transpose_wg", "softmax_rows",
    "softmax_wg",   "heads_wg",     "flash_cpu",    "flash_cpu_rb", "flash_cpu_nb",
    "flash_cpu_kv", "flash_cpu_tp", "flash_cpu_pf", "flash_cpu_pf_min", "flash_bwd_nv", "flash_bwd_rb",
    "flash_gpu",    "fg_bq",        "fg_bk",        "fg_tx",        "fg_ty",
    "fg_dpas",      "fg_dpas_sg",   "flash_rows",   "flash_vw",     "decode_keys",
    "loop_trip_limit"};

START_TEST(test_public_key_list)
{
    TU_BEGIN_TEST();
    tu_set_case("clattn_tuning_key_count / clattn_tuning_key_get");
    const size_t count = clattn_tuning_key_count();
    const size_t known = sizeof known_keys / sizeof known_keys[0];
    tu_expect(count >= known && count <= 64, "%zu keys, expected %zu to 64", count, known);
    const char *parameters = strstr(clattn_ctx_tuning(tu_ctx()), "parameters:");
    tu_expect(parameters != NULL, "clattn_ctx_tuning has no parameters line");
    size_t next = 0; /* the next known key expected */
    for (size_t i = 0; i < count; ++i) {
        clattn_tuning_key_info info = {.struct_size = sizeof info};
        if (!tu_expect_status(clattn_tuning_key_get(i, &info), CLATTN_SUCCESS, "key_get"))
            continue;
        if (next < known && strcmp(info.name, known_keys[next]) == 0)
            ++next;
        char item[80];
        snprintf(item, sizeof item, " %s=", info.name);
        tu_expect(parameters && strstr(parameters, item), "key %zu '%s' is not a parameter", i,
                  info.name);
        tu_expect(info.lo <= info.hi && info.struct_size == sizeof info, "%s: range %u .. %u",
                  info.name, info.lo, info.hi);
        const bool op = !strcmp(info.op, "") || !strcmp(info.op, "matmul") ||
                        !strcmp(info.op, "softmax") || !strcmp(info.op, "flash") ||
                        !strcmp(info.op, "backward");
        const bool device_class = !strcmp(info.device_class, "any") ||
                                  !strcmp(info.device_class, "cpu") ||
                                  !strcmp(info.device_class, "gpu");
        tu_expect(op && device_class && info.when && info.quick && info.doc[0] != '\0' &&
                      (info.op[0] == '\0' || info.values[0] != '\0'),
                  "%s: op '%s', class '%s', values '%s'", info.name, info.op, info.device_class,
                  info.values);
        tu_expect(info.scope == CLATTN_TUNING_DEVICE || info.scope == CLATTN_TUNING_PROBLEM,
                  "%s: scope %d", info.name, (int)info.scope);
    }
    tu_expect(next == known, "the list lacks '%s' (or has it out of order)",
              next < known ? known_keys[next] : "");
    /* struct_size: an earlier version's smaller struct gets the fields it has */
    clattn_tuning_key_info older = {.struct_size = 16, .op = "untouched"};
    tu_expect_status(clattn_tuning_key_get(0, &older), CLATTN_SUCCESS, "struct_size 16");
    tu_expect(older.struct_size == 16 && older.name && !strcmp(older.name, known_keys[0]) &&
                  !strcmp(older.op, "untouched"),
              "struct_size 16: name '%s', op '%s'", older.name ? older.name : "(null)",
              older.op);
    const size_t bad_sizes[] = {0, 12, sizeof(clattn_tuning_key_info) + 8};
    for (size_t b = 0; b < sizeof bad_sizes / sizeof bad_sizes[0]; ++b) {
        clattn_tuning_key_info info = {.struct_size = bad_sizes[b]};
        tu_expect_status(clattn_tuning_key_get(0, &info), CLATTN_ERR_INVALID_ARGUMENT,
                         "a bad struct_size");
    }
    clattn_tuning_key_info info = {.struct_size = sizeof info};
    tu_expect_status(clattn_tuning_key_get(count, &info), CLATTN_ERR_INVALID_ARGUMENT,
                     "index == count");
    tu_expect_status(clattn_tuning_key_get(0, NULL), CLATTN_ERR_INVALID_ARGUMENT, "NULL out");
    TU_END_TEST();
}
END_TEST

static void remove_scratch(void)
{
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", scratch);
    if (system(command) != 0)
        fprintf(stderr, "check_tune: could not remove %s\n", scratch);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: check_tune CLATTN_BINARY [TUNED_CACHE_DIR]\n");
        return 1;
    }
    clattn_bin = argv[1];
    tuned_dir = argc > 2 ? argv[2] : NULL;
    tu_suite_begin("check_tune"); /* exits 77 without an OpenCL device */
    if (mkdtemp(scratch) == NULL) {
        fprintf(stderr, "check_tune: mkdtemp failed\n");
        return 1;
    }
    Suite *suite = suite_create("tune");
    /* The library's row parser first: milliseconds, and no tuning run in the way. */
    TCase *parser = tcase_create("row parser");
    tcase_add_test(parser, test_row_parser);
    tcase_add_test(parser, test_driver_key);
    tcase_add_test(parser, test_public_key_list);
    suite_add_tcase(suite, parser);
    /* Plans (a few kernel builds): CK_RUN_CASE="records by dtype" runs it alone. */
    TCase *records = tu_tcase(suite, "records by dtype", 300);
    tcase_add_test(records, test_records_by_dtype);
    TCase *tc = tu_tcase(suite, "clattn tune", 600);
    tcase_add_test(tc, test_quick_tune_writes_rows_that_apply);
    tcase_add_test(tc, test_garbage_cache_is_ignored);
    tcase_add_loop_test(tc, test_bad_options_exit_2, 0,
                        (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, test_dry_run_and_out);
    tcase_add_test(tc, test_ctx_desc);
    const int failed = tu_run_suite(suite);
    remove_scratch();
    return failed ? 1 : 0;
}
