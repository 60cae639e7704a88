/*
 * Unit tests for agent/report.c: reading error.json in both of torch's
 * formats (and surviving broken ones), the root cause choice, the failure
 * table byte for byte, the agent's own error file, and the hint for a
 * Python without torch (from the worker's tail, or from asking it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/report.h"

static char tmp[64];

static int setup(void **state)
{
    (void)state;
    setenv("TZ", "UTC", 1);
    tzset();
    snprintf(tmp, sizeof(tmp), "/tmp/cddp-test-report-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *write_json(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static struct agent_failure failure(int lr, int rank, int pid, int code, double observed,
                                    uint64_t seq)
{
    struct agent_failure f;
    memset(&f, 0, sizeof(f));
    f.local_rank = lr;
    f.rank = rank;
    f.pid = pid;
    f.exitcode = code;
    f.observed = observed;
    f.seq = seq;
    return f;
}

static void test_load_without_file(void **state)
{
    (void)state;
    struct agent_failure f = failure(1, 5, 4242, -SIGKILL, 1700000000.75, 1);
    assert_int_equal(agent_failure_load(&f, "/nonexistent/error.json"), 0);
    assert_false(f.has_error_file);
    assert_string_equal(f.error_file, "<N/A>");
    assert_int_equal(f.timestamp, 1700000000);
    assert_string_equal(f.message, "Signal 9 (SIGKILL) received by PID 4242");
    agent_failure_free(&f);
    f = failure(0, 0, 1, 3, 1700000001.0, 2);
    assert_int_equal(agent_failure_load(&f, ""), 0); /* --log_dir=/dev/null */
    assert_string_equal(
        f.message, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html");
    agent_failure_free(&f);
}

static void test_load_record_format(void **state)
{
    (void)state;
    /* what torch's @record writes */
    const char *p =
        write_json("e1.json", "{\"message\": {\"message\": \"ValueError: boom\", \"extraInfo\": "
                              "{\"py_callstack\": \"Traceback (most recent call last):\\n  File "
                              "x\\nValueError: boom\\n\", \"timestamp\": \"1600000000\"}}}");
    struct agent_failure f = failure(0, 0, 7, 1, 1700000000.0, 1);
    assert_int_equal(agent_failure_load(&f, p), 0);
    assert_true(f.has_error_file);
    assert_string_equal(f.error_file, p);
    assert_int_equal(f.timestamp, 1600000000); /* the file's, not the observed time */
    assert_string_equal(f.message,
                        "Traceback (most recent call last):\n    File x\n  ValueError: boom\n  ");
    assert_non_null(f.error_json);
    agent_failure_free(&f);
    /* no py_callstack: the message; numeric timestamp accepted */
    p = write_json("e2.json", "{\"message\": {\"message\": \"RuntimeError: x\", \"extraInfo\": "
                              "{\"timestamp\": 1650000000}}}");
    f = failure(0, 0, 7, 1, 1700000000.0, 1);
    assert_int_equal(agent_failure_load(&f, p), 0);
    assert_string_equal(f.message, "RuntimeError: x");
    assert_int_equal(f.timestamp, 1650000000);
    agent_failure_free(&f);
}

static void test_load_string_format(void **state)
{
    (void)state;
    const char *p = write_json("e3.json", "{\"message\": \"plain\\nmessage\", \"timestamp\": 123}");
    struct agent_failure f = failure(0, 0, 7, 2, 1700000000.0, 1);
    assert_int_equal(agent_failure_load(&f, p), 0);
    assert_string_equal(f.message, "plain\nmessage"); /* not indented, as torch */
    assert_int_equal(f.timestamp, 123);
    agent_failure_free(&f);
}

static void test_load_broken_files(void **state)
{
    (void)state;
    const char *bad[] = {"not json", "[1,2]", "{\"nomessage\": 1}", "{\"message\": 5}", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "bad%zu.json", i);
        const char *p = write_json(name, bad[i]);
        struct agent_failure f = failure(0, 0, 7, 1, 1700000000.5, 1);
        assert_int_equal(agent_failure_load(&f, p), 0); /* never fatal */
        assert_true(f.has_error_file);
        assert_int_equal(f.message[0], '<');
        assert_null(f.error_json);
        assert_int_equal(f.timestamp, 1700000000);
        agent_failure_free(&f);
    }
}

static void test_root_cause(void **state)
{
    (void)state;
    struct agent_failure f[3] = {
        failure(0, 0, 1, -15, 1000.9, 3),
        failure(1, 1, 2, 1, 1000.2, 1),
        failure(2, 2, 3, -15, 1000.5, 2),
    };
    for (int i = 0; i < 3; i++)
        f[i].timestamp = 1000;
    /* same second: the first seen, not the lowest rank (torchrun's tie) */
    assert_int_equal(agent_failure_root(f, 3), 1);
    f[2].timestamp = 999; /* an error.json written earlier wins */
    assert_int_equal(agent_failure_root(f, 3), 2);
    assert_int_equal(agent_failure_root(f, 1), 0);
    /* a worker replaced in place, its run gone on, is not the cause of
     * the failure that ended it, however early */
    f[2].recovered = true;
    f[2].timestamp = 900;
    assert_int_equal(agent_failure_root(f, 3), 1);
    f[1].recovered = true;
    assert_int_equal(agent_failure_root(f, 3), 0);
    f[0].recovered = true; /* all recovered: the first of them */
    assert_int_equal(agent_failure_root(f, 3), 2);
}

static void test_table_exact(void **state)
{
    (void)state;
    struct agent_failure f[2] = {
        failure(0, 4, 100, -15, 1700000000.4, 2),
        failure(1, 5, 101, 3, 1700000000.1, 1),
    };
    assert_int_equal(agent_failure_load(&f[0], NULL), 0);
    assert_int_equal(agent_failure_load(&f[1], NULL), 0);
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    assert_int_equal(agent_failure_table("train.py", f, 2, "node1.example", NULL, &b), 0);
    const char *want = "============================================================\n"
                       "train.py FAILED\n"
                       "------------------------------------------------------------\n"
                       "Failures:\n"
                       "[0]:\n"
                       "  time      : 2023-11-14_22:13:20\n"
                       "  host      : node1.example\n"
                       "  rank      : 4 (local_rank: 0)\n"
                       "  exitcode  : -15 (pid: 100)\n"
                       "  error_file: <N/A>\n"
                       "  traceback : Signal 15 (SIGTERM) received by PID 100\n"
                       "------------------------------------------------------------\n"
                       "Root Cause (first observed failure):\n"
                       "[1]:\n"
                       "  time      : 2023-11-14_22:13:20\n"
                       "  host      : node1.example\n"
                       "  rank      : 5 (local_rank: 1)\n"
                       "  exitcode  : 3 (pid: 101)\n"
                       "  error_file: <N/A>\n"
                       "  traceback : To enable traceback see: "
                       "https://pytorch.org/docs/stable/elastic/errors.html\n"
                       "============================================================\n";
    assert_string_equal(b.data, want);
    cddp_buf_free(&b);
    agent_failure_free(&f[0]);
    agent_failure_free(&f[1]);
}

static void test_table_narrow_and_alone(void **state)
{
    (void)state;
    /* short lines: width = the longest line (< 60); one failure: no others */
    struct agent_failure f = failure(0, 0, 9, 2, 0, 1);
    f.message = strdup("x");
    cddp_strlcpy(f.error_file, "<N/A>", sizeof(f.error_file));
    f.timestamp = 0;
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    assert_int_equal(agent_failure_table("w", &f, 1, "h", NULL, &b), 0);
    /* the longest line is "  time      : 1970-01-01_00:00:00" (33) */
    const char *want = "=================================\n"
                       "w FAILED\n"
                       "---------------------------------\n"
                       "Failures:\n"
                       "  <NO_OTHER_FAILURES>\n"
                       "---------------------------------\n"
                       "Root Cause (first observed failure):\n"
                       "[0]:\n"
                       "  time      : 1970-01-01_00:00:00\n"
                       "  host      : h\n"
                       "  rank      : 0 (local_rank: 0)\n"
                       "  exitcode  : 2 (pid: 9)\n"
                       "  error_file: <N/A>\n"
                       "  traceback : x\n"
                       "=================================\n";
    assert_string_equal(b.data, want);
    cddp_buf_free(&b);
    free(f.message);
}

static cJSON *read_json(const char *path)
{
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    return j;
}

static void test_agent_error_file(void **state)
{
    (void)state;
    char out[256];
    snprintf(out, sizeof(out), "%s/agent.json", tmp);
    /* copied from the worker's, with errorCode = its exit code */
    const char *p = write_json("w.json", "{\"message\": {\"message\": \"ValueError: boom\", "
                                         "\"extraInfo\": {\"py_callstack\": \"tb\", "
                                         "\"timestamp\": \"1600000000\"}}}");
    struct agent_failure f = failure(0, 0, 7, -11, 1700000000.0, 1);
    assert_int_equal(agent_failure_load(&f, p), 0);
    assert_int_equal(agent_write_error_file(out, &f, "train.py", "TABLE"), 0);
    cJSON *j = read_json(out);
    cJSON *m = cJSON_GetObjectItem(j, "message");
    assert_string_equal(cJSON_GetObjectItem(m, "message")->valuestring, "ValueError: boom");
    assert_int_equal(cJSON_GetObjectItem(m, "errorCode")->valueint, -11);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(m, "extraInfo"), "py_callstack")->valuestring,
        "tb");
    cJSON_Delete(j);
    agent_failure_free(&f);
    /* no worker file: our own record of the same shape */
    f = failure(2, 6, 8, 3, 1700000000.0, 1);
    assert_int_equal(agent_failure_load(&f, NULL), 0);
    assert_int_equal(agent_write_error_file(out, &f, "./worker", "THE TABLE"), 0);
    j = read_json(out);
    m = cJSON_GetObjectItem(j, "message");
    assert_non_null(strstr(cJSON_GetObjectItem(m, "message")->valuestring, "exited with code 3"));
    assert_non_null(strstr(cJSON_GetObjectItem(m, "message")->valuestring, "./worker"));
    assert_int_equal(cJSON_GetObjectItem(m, "errorCode")->valueint, 3);
    cJSON *extra = cJSON_GetObjectItem(m, "extraInfo");
    assert_string_equal(cJSON_GetObjectItem(extra, "py_callstack")->valuestring, "THE TABLE");
    assert_string_equal(cJSON_GetObjectItem(extra, "timestamp")->valuestring, "1700000000");
    cJSON_Delete(j);
    agent_failure_free(&f);
    /* the agent's own failure */
    assert_int_equal(agent_write_agent_error(out, "rendezvous failed: timed out"), 0);
    j = read_json(out);
    m = cJSON_GetObjectItem(j, "message");
    assert_string_equal(cJSON_GetObjectItem(m, "message")->valuestring,
                        "AgentError: rendezvous failed: timed out");
    assert_true(
        strtol(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "extraInfo"), "timestamp")->valuestring,
               NULL, 10) > 1600000000);
    cJSON_Delete(j);
    /* an unwritable place: an error, and no stray temporary file */
    assert_true(agent_write_error_file("/nonexistent/dir/e.json", &f, "w", "t") < 0);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

/* A worker rank's log directory under tmp, as agent/logs.c lays it out;
 * returns its error.json path (the file itself is not written). */
static const char *rank_dir(const char *name, const char *stderr_text)
{
    static char path[512];
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/%s", tmp, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    if (stderr_text) {
        snprintf(path, sizeof(path), "%s/stderr.log", dir);
        write_file(path, stderr_text, 0644);
    }
    snprintf(path, sizeof(path), "%s/error.json", dir);
    return path;
}

static bool no_torch(const char *python, int code, const char *error_file)
{
    struct agent_failure f = failure(0, 0, 7, code, 1700000000.0, 1);
    f.python = python;
    assert_int_equal(agent_failure_load(&f, error_file), 0);
    bool r = f.no_torch;
    agent_failure_free(&f);
    return r;
}

#define TB "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"

static void test_no_torch_from_the_tail(void **state)
{
    (void)state;
    const char *py = "/env/bin/python3";
    /* the worker's stderr.log (-r 2, -t 2) */
    assert_true(
        no_torch(py, 1, rank_dir("r0", TB "ModuleNotFoundError: No module named 'torch'\n")));
    assert_false(no_torch(py, 1,
                          rank_dir("r1", TB "ModuleNotFoundError: No module named "
                                            "'torchvision'\n")));
    assert_false(no_torch(py, 1, rank_dir("r2", TB "ValueError: boom\n")));
    /* a program, not a Python worker: never */
    assert_false(
        no_torch(NULL, 1, rank_dir("r3", "ModuleNotFoundError: No module named 'torch'\n")));
    /* only the tail is read: the line early in a long log does not count,
     * late in it it does */
    char *big = malloc(200000);
    assert_non_null(big);
    snprintf(big, 200000, "%s", "ModuleNotFoundError: No module named 'torch'\n");
    size_t n = strlen(big);
    memset(big + n, 'x', 100000);
    big[n + 100000] = '\0';
    assert_false(no_torch(py, 1, rank_dir("r4", big)));
    memset(big, 'x', 100000);
    snprintf(big + 100000, 100000, "\nModuleNotFoundError: No module named 'torch'\n");
    assert_true(no_torch(py, 1, rank_dir("r5", big)));
    free(big);
    /* the error file's message (--run_path's bootstrap writes one) */
    const char *p = rank_dir("r6", NULL);
    write_file(p,
               "{\"message\": {\"message\": \"ModuleNotFoundError: No module named 'torch'\", "
               "\"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n"
               "ModuleNotFoundError: No module named 'torch'\\n\", \"timestamp\": \"1\"}}}",
               0644);
    assert_true(no_torch(py, 1, p));
}

static void test_no_torch_asks_the_interpreter(void **state)
{
    (void)state;
    /* No stderr.log (inherited, as by default, or /dev/null): an exit 1
     * from a Python in which importlib finds no torch. */
    char py[256], with[256], broken[256];
    snprintf(py, sizeof(py), "%s/notorch", tmp);
    snprintf(with, sizeof(with), "%s/withtorch", tmp);
    snprintf(broken, sizeof(broken), "%s/broken", tmp);
    write_file(py, "#!/bin/sh\nexit 3\n", 0755);     /* what the probe's "not found" exits with */
    write_file(with, "#!/bin/sh\nexit 0\n", 0755);   /* found */
    write_file(broken, "#!/bin/sh\nexit 1\n", 0755); /* failed otherwise: cannot tell */
    const char *none = rank_dir("p0", NULL);
    assert_true(no_torch(py, 1, none));
    assert_true(no_torch(py, 1, ""));     /* --log_dir=/dev/null */
    assert_false(no_torch(py, 2, none));  /* not an uncaught exception */
    assert_false(no_torch(py, -9, none)); /* a signal */
    assert_false(no_torch(with, 1, none));
    assert_false(no_torch(broken, 1, none));
    assert_false(no_torch("/nonexistent/python3", 1, none));
    /* a real Python that cannot see Debian's packages (no site) */
    if (access("/usr/bin/python3", X_OK) == 0) {
        char nosite[256];
        snprintf(nosite, sizeof(nosite), "%s/nosite", tmp);
        write_file(nosite, "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n", 0755);
        assert_true(no_torch(nosite, 1, none));
    }
}

static void test_table_hint(void **state)
{
    (void)state;
    struct agent_failure f[2] = {failure(0, 0, 9, 1, 0, 1), failure(1, 1, 10, -15, 1, 2)};
    for (int i = 0; i < 2; i++) {
        f[i].message = strdup("x");
        cddp_strlcpy(f[i].error_file, "<N/A>", sizeof(f[i].error_file));
        f[i].timestamp = i;
        f[i].python = "/v/bin/python3";
    }
    f[0].no_torch = true;
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    assert_int_equal(agent_failure_table("t.py", f, 2, "h", NULL, &b), 0);
    const char *hint = "  traceback : x\n"
                       "hint: /v/bin/python3, the workers' Python, has no torch "
                       "(ModuleNotFoundError); set PYTHON_EXEC to a Python that has PyTorch\n"
                       "=================================\n";
    assert_true(b.len > strlen(hint));
    assert_string_equal(b.data + b.len - strlen(hint), hint);
    /* one line however many failures have it; none when none has it */
    f[1].no_torch = true;
    cddp_buf_reset(&b);
    assert_int_equal(agent_failure_table("t.py", f, 2, "h", NULL, &b), 0);
    assert_non_null(strstr(b.data, "hint: "));
    assert_null(strstr(strstr(b.data, "hint: ") + 1, "hint: "));
    f[0].no_torch = f[1].no_torch = false;
    cddp_buf_reset(&b);
    assert_int_equal(agent_failure_table("t.py", f, 2, "h", NULL, &b), 0);
    assert_null(strstr(b.data, "hint: "));
    cddp_buf_free(&b);
    free(f[0].message);
    free(f[1].message);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_without_file),
        cmocka_unit_test(test_load_record_format),
        cmocka_unit_test(test_load_string_format),
        cmocka_unit_test(test_load_broken_files),
        cmocka_unit_test(test_root_cause),
        cmocka_unit_test(test_table_exact),
        cmocka_unit_test(test_table_narrow_and_alone),
        cmocka_unit_test(test_agent_error_file),
        cmocka_unit_test(test_no_torch_from_the_tail),
        cmocka_unit_test(test_no_torch_asks_the_interpreter),
        cmocka_unit_test(test_table_hint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
