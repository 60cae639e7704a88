/* Unit tests for common/file.c: write_all, the atomic replace and its
 * failure paths (no temporary file left behind, the old file intact). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/unit_util.h"

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/file.h"

static char dir[64];

static int make_dir(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/cddp-test-file-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    if (d)
        closedir(d);
    return rmdir(dir);
}

static size_t entries(void)
{
    size_t n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static void test_write_all(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(cddp_write_all(p[1], "hello", 5), 0);
    char got[8] = "";
    assert_int_equal(read(p[0], got, sizeof(got)), 5);
    assert_memory_equal(got, "hello", 5);
    close(p[0]);
    /* A closed reader: the error comes back (SIGPIPE ignored for this). */
    signal(SIGPIPE, SIG_IGN);
    assert_int_equal(cddp_write_all(p[1], "x", 1), CDDP_ERR_FROM_ERRNO(EPIPE));
    close(p[1]);
    assert_int_equal(cddp_write_all(-1, "x", 1), CDDP_ERR_FROM_ERRNO(EBADF));
}

static void test_atomic_write(void **state)
{
    (void)state;
    char path[128], err[256] = "";
    snprintf(path, sizeof(path), "%s/error.json", dir);
    assert_int_equal(cddp_write_file_atomic(path, "{\"a\":1}", 7, 0600, err, sizeof(err)), 0);
    assert_string_equal(unit_slurp(path), "{\"a\":1}");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    mode_t um = umask(0);
    umask(um);
    assert_int_equal(st.st_mode & 0777, 0600 & ~um);
    /* Replaces, and leaves nothing else in the directory. */
    assert_int_equal(cddp_write_file_atomic(path, "second", 6, 0644, NULL, 0), 0);
    assert_string_equal(unit_slurp(path), "second");
    assert_int_equal(entries(), 1);
    /* Empty content is a file too. */
    assert_int_equal(cddp_write_file_atomic(path, "", 0, 0644, NULL, 0), 0);
    assert_string_equal(unit_slurp(path), "");
}

static void test_atomic_failures(void **state)
{
    (void)state;
    char path[128], err[256] = "";
    snprintf(path, sizeof(path), "%s/no/such/dir/file", dir);
    assert_int_equal(cddp_write_file_atomic(path, "x", 1, 0644, err, sizeof(err)),
                     CDDP_ERR_FROM_ERRNO(ENOENT));
    assert_non_null(strstr(err, "no/such/dir/file.tmp."));
    /* The target is a directory: the rename fails, the temporary file goes. */
    snprintf(path, sizeof(path), "%s/sub", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    char inner[160];
    snprintf(inner, sizeof(inner), "%s/keep", path);
    assert_int_equal(cddp_write_file_atomic(inner, "k", 1, 0644, NULL, 0), 0);
    err[0] = '\0';
    assert_true(cddp_write_file_atomic(path, "x", 1, 0644, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "rename"));
    assert_string_equal(unit_slurp(inner), "k");
    assert_int_equal(entries(), 2); /* error.json and sub: no sub.tmp.<pid> */
    unlink(inner);
    rmdir(path);
    /* A path too long for the temporary name. */
    char *longp = malloc(5000);
    memset(longp, 'a', 4999);
    longp[4999] = '\0';
    assert_int_equal(cddp_write_file_atomic(longp, "x", 1, 0644, NULL, 0),
                     CDDP_ERR_FROM_ERRNO(ENAMETOOLONG));
    free(longp);
}

static void test_commit(void **state)
{
    (void)state;
    char tmp[128], path[128], err[256];
    snprintf(tmp, sizeof(tmp), "%s/ckpt.tmp", dir);
    snprintf(path, sizeof(path), "%s/ckpt", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(cddp_write_all(fd, "data", 4), 0);
    bool renamed = false;
    assert_int_equal(cddp_file_commit(fd, tmp, path, &renamed, err, sizeof(err)), 0);
    assert_true(renamed);
    close(fd);
    assert_string_equal(unit_slurp(path), "data");
    assert_int_equal(access(tmp, F_OK), -1);
    /* The temporary file is gone: the rename fails, and says so. */
    fd = open(path, O_RDONLY);
    assert_true(cddp_file_commit(fd, tmp, path, &renamed, err, sizeof(err)) < 0);
    assert_false(renamed);
    close(fd);
    assert_int_equal(cddp_fsync_dir_of(path), 0);
    assert_int_equal(cddp_fsync_dir_of("relative-name"), 0); /* "." */
    assert_int_equal(cddp_fsync_dir_of("/no/such/dir/x"), CDDP_ERR_FROM_ERRNO(ENOENT));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_all),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_atomic_failures),
        cmocka_unit_test(test_commit),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
