/*
 * Unit tests for agent/logs.c: where each stream of each rank goes (-r, -t,
 * maps, --local_ranks_filter, /dev/null), the line prefix template, the line
 * splitter over every way a stream can be cut into reads, the directory
 * layout and its removal, and a real tee (pipe, libuv loop, file and console).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/unit_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/logs.h"

static struct launch_config cfg_with(const char *redirects, const char *tee, long *filter,
                                     int nfilter)
{
    struct launch_config c;
    memset(&c, 0, sizeof(c));
    /* the same encoding launcher/cli.c produces */
    const char *specs[2] = {redirects, tee};
    struct launch_std_spec *dst[2] = {&c.redirects, &c.tee};
    for (int k = 0; k < 2; k++) {
        const char *s = specs[k];
        if (strchr(s, ':') == NULL) {
            dst[k]->all = (uint8_t)(s[0] - '0');
            continue;
        }
        dst[k]->is_map = true;
        for (const char *p = s;; p += 4) {
            dst[k]->rank[p[0] - '0'] = (uint8_t)(p[2] - '0');
            if (p[3] == '\0')
                break;
        }
    }
    c.ranks_filter = filter;
    c.ranks_filter_len = nfilter;
    return c;
}

static void test_stream_dest(void **state)
{
    (void)state;
    struct launch_config c = cfg_with("0", "0", NULL, 0);
    assert_int_equal(agent_stream_dest(&c, false, 0, 1), AGENT_DEST_INHERIT);
    assert_int_equal(agent_stream_dest(&c, false, 0, 2), AGENT_DEST_INHERIT);
    c = cfg_with("1", "0", NULL, 0);
    assert_int_equal(agent_stream_dest(&c, false, 3, 1), AGENT_DEST_FILE);
    assert_int_equal(agent_stream_dest(&c, false, 3, 2), AGENT_DEST_INHERIT);
    c = cfg_with("0", "3", NULL, 0);
    assert_int_equal(agent_stream_dest(&c, false, 1, 1), AGENT_DEST_TEE);
    assert_int_equal(agent_stream_dest(&c, false, 1, 2), AGENT_DEST_TEE);
    /* tee wins over redirect; maps per rank; unmapped ranks get nothing */
    c = cfg_with("0:2,1:3", "0:1,2:2", NULL, 0);
    assert_int_equal(agent_stream_dest(&c, false, 0, 1), AGENT_DEST_TEE);
    assert_int_equal(agent_stream_dest(&c, false, 0, 2), AGENT_DEST_FILE);
    assert_int_equal(agent_stream_dest(&c, false, 1, 1), AGENT_DEST_FILE);
    assert_int_equal(agent_stream_dest(&c, false, 1, 2), AGENT_DEST_FILE);
    assert_int_equal(agent_stream_dest(&c, false, 2, 1), AGENT_DEST_INHERIT);
    assert_int_equal(agent_stream_dest(&c, false, 2, 2), AGENT_DEST_TEE);
    assert_int_equal(agent_stream_dest(&c, false, 3, 1), AGENT_DEST_INHERIT);
    /* --local_ranks_filter=1: others keep their files, lose the console */
    long f[] = {1};
    c = cfg_with("2", "1", f, 1);
    assert_int_equal(agent_stream_dest(&c, false, 1, 1), AGENT_DEST_TEE);
    assert_int_equal(agent_stream_dest(&c, false, 1, 2), AGENT_DEST_FILE);
    assert_int_equal(agent_stream_dest(&c, false, 0, 1), AGENT_DEST_FILE);
    assert_int_equal(agent_stream_dest(&c, false, 0, 2), AGENT_DEST_FILE);
    c = cfg_with("0", "0", f, 1);
    assert_int_equal(agent_stream_dest(&c, false, 0, 1), AGENT_DEST_DEVNULL);
    assert_int_equal(agent_stream_dest(&c, false, 1, 1), AGENT_DEST_INHERIT);
    /* --log_dir=/dev/null: torchrun redirects and filters nothing */
    c = cfg_with("3", "3", f, 1);
    assert_int_equal(agent_stream_dest(&c, true, 0, 1), AGENT_DEST_INHERIT);
    assert_int_equal(agent_stream_dest(&c, true, 1, 2), AGENT_DEST_INHERIT);
}

static void test_prefix(void **state)
{
    (void)state;
    char out[128];
    agent_log_prefix(NULL, "default", 7, 3, out, sizeof(out));
    assert_string_equal(out, "[default3]:");
    agent_log_prefix("[${role_name}-${rank}/${local_rank}] ", "trainer", 7, 3, out, sizeof(out));
    assert_string_equal(out, "[trainer-7/3] ");
    agent_log_prefix("$role_name:$rank:$local_rank|", "r", 1, 0, out, sizeof(out));
    assert_string_equal(out, "r:1:0|");
    /* safe_substitute: $$ is '$', unknown names and stray '$' stay */
    agent_log_prefix("$$ ${host} $nope $ ${rank", "r", 1, 0, out, sizeof(out));
    assert_string_equal(out, "$ ${host} $nope $ ${rank");
    agent_log_prefix("${rank}x", "r", 12, 0, out, 3); /* truncated, terminated */
    assert_string_equal(out, "12");
}

struct sink {
    char buf[4 * AGENT_TEE_MAX_LINE];
    size_t len;
    int calls;
};

static void sink_emit(void *arg, const char *line, size_t len)
{
    struct sink *s = arg;
    assert_true(s->len + len <= sizeof(s->buf));
    memcpy(s->buf + s->len, line, len);
    s->len += len;
    s->calls++;
    assert_int_equal(line[len - 1], '\n'); /* every emit is whole lines */
}

static void test_lines_every_split(void **state)
{
    (void)state;
    const char *input = "alpha\nbeta\n\ngamma without end";
    const char *want = "[p]:alpha\n[p]:beta\n[p]:\n[p]:gamma without end\n";
    size_t n = strlen(input);
    /* every way to cut the input into two or three reads */
    for (size_t a = 0; a <= n; a++) {
        for (size_t b = a; b <= n; b++) {
            struct agent_lines l;
            struct sink s = {.len = 0};
            agent_lines_init(&l, "[p]:");
            agent_lines_feed(&l, input, a, sink_emit, &s);
            agent_lines_feed(&l, input + a, b - a, sink_emit, &s);
            agent_lines_feed(&l, input + b, n - b, sink_emit, &s);
            agent_lines_flush(&l, sink_emit, &s);
            s.buf[s.len] = '\0';
            if (strcmp(s.buf, want) != 0)
                fail_msg("cuts %zu,%zu: got '%s'", a, b, s.buf);
            assert_int_equal(s.calls, 4);
            agent_lines_free(&l);
        }
    }
}

static void test_lines_too_long(void **state)
{
    (void)state;
    size_t n = AGENT_TEE_MAX_LINE + 10;
    char *big = malloc(n + 1);
    memset(big, 'x', n);
    big[n] = '\n';
    struct agent_lines l;
    struct sink *s = calloc(1, sizeof(*s));
    agent_lines_init(&l, ">");
    /* fed byte-wise for the first part, then the rest at once */
    for (size_t i = 0; i < 100; i++)
        agent_lines_feed(&l, big + i, 1, sink_emit, s);
    agent_lines_feed(&l, big + 100, n + 1 - 100, sink_emit, s);
    agent_lines_flush(&l, sink_emit, s);
    assert_int_equal(s->calls, 2); /* cut at the limit, then the remainder */
    assert_int_equal(s->len, (1 + AGENT_TEE_MAX_LINE + 1) + (1 + 10 + 1));
    agent_lines_free(&l);
    free(s);
    free(big);
}

static char tmp[64];

static int tmp_setup(void **state)
{
    (void)state;
    snprintf(tmp, sizeof(tmp), "/tmp/cddp-test-logs-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int tmp_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_layout(void **state)
{
    (void)state;
    struct agent_logs l;
    char err[256], path[4096], base[256];
    snprintf(base, sizeof(base), "%s/deep/er", tmp); /* created, like makedirs */
    assert_int_equal(agent_logs_init(&l, base, "job/7", err, sizeof(err)), 0);
    assert_false(l.root_is_ours);
    assert_true(is_dir(l.run_dir));
    char want_prefix[300];
    snprintf(want_prefix, sizeof(want_prefix), "%s/job_7_", base);
    assert_int_equal(strncmp(l.run_dir, want_prefix, strlen(want_prefix)), 0);
    assert_int_equal(strlen(l.run_dir), strlen(want_prefix) + 6);
    assert_int_equal(agent_logs_attempt(&l, 0, 3, err, sizeof(err)), 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(agent_logs_path(&l, 0, r, NULL, path, sizeof(path)), 0);
        assert_true(is_dir(path));
    }
    /* a reused attempt is wiped */
    assert_int_equal(agent_logs_path(&l, 0, 1, "stdout.log", path, sizeof(path)), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(agent_logs_attempt(&l, 0, 2, err, sizeof(err)), 0);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(agent_logs_path(&l, 0, 2, NULL, path, sizeof(path)), 0);
    assert_false(is_dir(path));
    assert_int_equal(agent_logs_path(&l, 4, 1, "error.json", path, sizeof(path)), 0);
    char want[4200];
    snprintf(want, sizeof(want), "%s/attempt_4/1/error.json", l.run_dir);
    assert_string_equal(path, want);
    agent_logs_remove_tmp(&l); /* not ours: kept */
    assert_true(is_dir(l.run_dir));
    agent_logs_free(&l);

    /* the default: a torchelastic_ directory under TMPDIR, removable */
    setenv("TMPDIR", tmp, 1);
    assert_int_equal(agent_logs_init(&l, NULL, "none", err, sizeof(err)), 0);
    assert_true(l.root_is_ours);
    snprintf(want_prefix, sizeof(want_prefix), "%s/torchelastic_", tmp);
    assert_int_equal(strncmp(l.root, want_prefix, strlen(want_prefix)), 0);
    char root[4096];
    snprintf(root, sizeof(root), "%s", l.root);
    agent_logs_remove_tmp(&l);
    assert_false(is_dir(root));
    agent_logs_free(&l);
    unsetenv("TMPDIR");

    /* /dev/null: nothing on disk, empty paths */
    assert_int_equal(agent_logs_init(&l, "/dev/null", "x", err, sizeof(err)), 0);
    assert_true(l.devnull);
    assert_int_equal(agent_logs_attempt(&l, 0, 2, err, sizeof(err)), 0);
    assert_int_equal(agent_logs_path(&l, 0, 0, "error.json", path, sizeof(path)), 0);
    assert_string_equal(path, "");
    agent_logs_free(&l);

    /* a file where the directory should be: a clear error */
    snprintf(path, sizeof(path), "%s/afile", tmp);
    f = fopen(path, "w");
    fclose(f);
    err[0] = '\0';
    assert_true(agent_logs_init(&l, path, "x", err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "afile"));
    agent_logs_free(&l);
}

static void touch(const char *dir, const char *name)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("x\n", f);
    fclose(f);
}

/* A run's tree after a restart, with files at every level and a link to a
 * directory outside it. */
static void make_tree(const char *root, const char *outside)
{
    char p[4200];
    assert_int_equal(mkdir(root, 0700), 0);
    snprintf(p, sizeof(p), "%s/run_x", root);
    assert_int_equal(mkdir(p, 0700), 0);
    touch(root, "stray.txt");
    for (int a = 0; a < 2; a++) {
        snprintf(p, sizeof(p), "%s/run_x/attempt_%d", root, a);
        assert_int_equal(mkdir(p, 0777), 0);
        touch(p, "filtered_stdout.log");
        for (int r = 0; r < 3; r++) {
            snprintf(p, sizeof(p), "%s/run_x/attempt_%d/%d", root, a, r);
            assert_int_equal(mkdir(p, 0777), 0);
            touch(p, "error.json");
            touch(p, "stdout.log");
        }
    }
    snprintf(p, sizeof(p), "%s/run_x/attempt_1/2/link", root);
    assert_int_equal(symlink(outside, p), 0);
    snprintf(p, sizeof(p), "%s/run_x/attempt_1/2/deeper", root);
    assert_int_equal(mkdir(p, 0777), 0);
    touch(p, "more");
}

/* Both ways of removing a tree (one by one, and side by side as when each
 * removal waits for the disk) remove all of it, and nothing a link points at. */
static void test_remove_tree(void **state)
{
    (void)state;
    char outside[300], keep[400];
    snprintf(outside, sizeof(outside), "%s/outside", tmp);
    assert_int_equal(mkdir(outside, 0700), 0);
    touch(outside, "keep");
    snprintf(keep, sizeof(keep), "%s/keep", outside);
    const uint64_t ways[2] = {0, UINT64_MAX}; /* threads at once; never */
    for (int w = 0; w < 2; w++) {
        char root[300];
        snprintf(root, sizeof(root), "%s/tree%d", tmp, w);
        make_tree(root, outside);
        agent_logs_remove_tree(root, ways[w]);
        assert_int_not_equal(access(root, F_OK), 0);
        assert_int_equal(access(keep, F_OK), 0);
        assert_true(is_dir(outside));
    }

    /* The temporary tree of a run with a restart: what the agent made is
     * removed by name, and what a worker added besides by the walk. */
    struct agent_logs l;
    char err[256], path[4096];
    setenv("TMPDIR", tmp, 1);
    assert_int_equal(agent_logs_init(&l, NULL, "job", err, sizeof(err)), 0);
    unsetenv("TMPDIR");
    assert_int_equal(agent_logs_attempt(&l, 0, 3, err, sizeof(err)), 0);
    assert_int_equal(agent_logs_attempt(&l, 1, 2, err, sizeof(err)), 0);
    assert_int_equal(agent_logs_path(&l, 0, 2, NULL, path, sizeof(path)), 0);
    touch(path, "error.json");
    assert_int_equal(agent_logs_path(&l, 1, -1, NULL, path, sizeof(path)), 0);
    touch(path, "filtered_stdout.log");
    assert_int_equal(agent_logs_path(&l, 1, 1, "extra", path, sizeof(path)), 0);
    assert_int_equal(mkdir(path, 0777), 0);
    touch(path, "more");
    assert_int_equal(agent_logs_path(&l, 1, 0, "link", path, sizeof(path)), 0);
    assert_int_equal(symlink(outside, path), 0);
    char root[4096];
    snprintf(root, sizeof(root), "%s", l.root);
    agent_logs_remove_tmp(&l);
    assert_int_not_equal(access(root, F_OK), 0);
    assert_int_equal(access(keep, F_OK), 0);
    agent_logs_free(&l);
}

static void test_tee_roundtrip(void **state)
{
    (void)state;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    struct agent_tee_set set;
    agent_tee_set_init(&set, &loop);
    int console[2];
    assert_int_equal(pipe(console), 0);
    char file[256];
    snprintf(file, sizeof(file), "%s/stdout.log", tmp);
    int wfd = -1;
    assert_int_equal(agent_tee_open(&set, file, console[1], "[default0]:", &wfd), 0);
    assert_int_equal(set.open, 1);
    const char *msg = "hello\nwor";
    assert_int_equal(write(wfd, msg, strlen(msg)), (ssize_t)strlen(msg));
    assert_int_equal(write(wfd, "ld\ntail", 7), 7);
    close(wfd); /* the last writer is gone: EOF ends the tee */
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(set.open, 0);
    assert_string_equal(unit_slurp(file), "hello\nworld\ntail"); /* the file gets bytes unchanged */
    close(console[1]);
    char got[256];
    ssize_t n = read(console[0], got, sizeof(got) - 1);
    got[n > 0 ? n : 0] = '\0';
    assert_string_equal(got, "[default0]:hello\n[default0]:world\n[default0]:tail\n");
    close(console[0]);

    /* closing the set drains what is buffered even while a writer lives */
    assert_int_equal(pipe(console), 0);
    assert_int_equal(agent_tee_open(&set, file, console[1], "[r1]:", &wfd), 0);
    assert_int_equal(write(wfd, "pending\n", 8), 8);
    agent_tee_set_close(&set);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(set.open, 0);
    close(console[1]);
    n = read(console[0], got, sizeof(got) - 1);
    got[n > 0 ? n : 0] = '\0';
    assert_string_equal(got, "[r1]:pending\n");
    close(console[0]);
    close(wfd);
    assert_int_equal(uv_loop_close(&loop), 0); /* nothing left open */
}

/* --duplicate_*_filters: any filter as a substring of the line's text. */
static void test_line_matches(void **state)
{
    (void)state;
    const char *const f[] = {"NCCL WARN", "a,b"};
    const char line[] = "x NCCL WARN y\n";
    assert_true(agent_line_matches(line, strlen(line), f, 2));
    assert_true(agent_line_matches("..a,b..", 7, f, 2));
    assert_false(agent_line_matches("NCCL WAR", 8, f, 2));
    /* only len bytes count: no reading past the line */
    assert_false(agent_line_matches("NCCL WARN", 8, f, 2));
    assert_false(agent_line_matches(line, strlen(line), f, 0));
    const char *const empty[] = {""};
    assert_true(agent_line_matches("anything\n", 9, empty, 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_dest),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_line_matches),
        cmocka_unit_test(test_lines_every_split),
        cmocka_unit_test(test_lines_too_long),
        cmocka_unit_test_setup_teardown(test_layout, tmp_setup, tmp_teardown),
        cmocka_unit_test_setup_teardown(test_remove_tree, tmp_setup, tmp_teardown),
        cmocka_unit_test_setup_teardown(test_tee_roundtrip, tmp_setup, tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
