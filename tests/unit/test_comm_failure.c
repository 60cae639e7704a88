/* Unit tests for trainer/comm/failure.c: the message, torchrun's error.json, exit 75. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/unit_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/exitcodes.h"
#include "trainer/comm/failure.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/cddp-test-failure-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    struct dirent *ent;
    char p[400];
    while (d && (ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.')
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, ent->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    return rmdir(dir);
}

static int count_files(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL)
        n += ent->d_name[0] != '.';
    closedir(d);
    return n;
}

static struct trn_comm_error timeout_error(void)
{
    struct trn_comm_error e = {.code = CDDP_ETIMEOUT,
                               .coll = TRN_COLL_ALLREDUCE,
                               .bytes = 4096,
                               .waited_s = 5.02,
                               .timeout_s = 5};
    snprintf(e.op, sizeof(e.op), "allreduce");
    snprintf(e.detail, sizeof(e.detail), "Timed out waiting 5000ms for recv operation to complete");
    return e;
}

static void test_message(void **state)
{
    (void)state;
    char msg[1024];
    struct trn_comm_error e = timeout_error();
    trn_comm_failure_message(&e, 12, 1, msg, sizeof(msg));
    assert_non_null(strstr(msg, "allreduce at step 12 on rank 1 timed out"));
    assert_non_null(strstr(msg, "waited 5.0 s"));
    assert_non_null(strstr(msg, "--collective-timeout 5 s"));
    assert_non_null(strstr(msg, "Timed out waiting 5000ms"));

    e.code = CDDP_EPEER;
    snprintf(e.op, sizeof(e.op), "broadcast");
    snprintf(e.detail, sizeof(e.detail), "Connection closed by peer");
    trn_comm_failure_message(&e, -1, 0, msg, sizeof(msg));
    assert_non_null(strstr(msg, "broadcast on rank 0 failed after 5.0 s: a peer failed"));
    assert_null(strstr(msg, "step"));
}

static void test_error_file(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof(path), "%s/error.json", dir);
    assert_int_equal(trn_error_file_write(path, "CollectiveTimeoutError", "allreduce \"x\"\n",
                                          "line1\nline2\n", 1700000000),
                     0);
    cJSON *root = cJSON_Parse(unit_slurp(path));
    assert_non_null(root);
    cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "message");
    assert_true(cJSON_IsObject(m));
    cJSON *text = cJSON_GetObjectItemCaseSensitive(m, "message");
    assert_string_equal(text->valuestring, "CollectiveTimeoutError: allreduce \"x\"\n");
    cJSON *extra = cJSON_GetObjectItemCaseSensitive(m, "extraInfo");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(extra, "py_callstack")->valuestring,
                        "line1\nline2\n");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(extra, "timestamp")->valuestring,
                        "1700000000");
    cJSON_Delete(root);
    assert_int_equal(count_files(), 1); /* no temporary left behind */

    /* A directory that does not exist: an error, and nothing written. */
    snprintf(path, sizeof(path), "%s/missing/error.json", dir);
    assert_int_equal(trn_error_file_write(path, "T", "m", "s", 1), -ENOENT);
    assert_int_equal(count_files(), 1);
}

static void test_fail_exits_75(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof(path), "%s/child-error.json", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct trn_comm_error e = timeout_error();
        trn_comm_fail(&e, 7, 3, path);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), CDDP_EXIT_COLLECTIVE_TIMEOUT);
    cJSON *root = cJSON_Parse(unit_slurp(path));
    assert_non_null(root);
    const char *text = cJSON_GetObjectItemCaseSensitive(
                           cJSON_GetObjectItemCaseSensitive(root, "message"), "message")
                           ->valuestring;
    assert_non_null(strstr(text, "CollectiveTimeoutError: allreduce at step 7 on rank 3"));
    cJSON_Delete(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message),
        cmocka_unit_test_setup_teardown(test_error_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_exits_75, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
