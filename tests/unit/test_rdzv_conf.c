/* Unit tests for rendezvous/conf.c: rdzv_conf's keys, values and
 * defaults, and the timeouts derived from them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/errors.h"
#include "rendezvous/conf.h"

static void test_conf(void **state)
{
    (void)state;
    struct rdzv_conf c;
    char err[512];
    rdzv_conf_init(&c);
    assert_int_equal(c.join_timeout_ms, 600000);
    assert_int_equal(c.last_call_timeout_ms, 30000);
    assert_int_equal(c.close_timeout_ms, 30000);
    assert_int_equal(c.keep_alive_interval_ms, 5000);
    assert_int_equal(c.keep_alive_max_attempt, 3);
    assert_int_equal(c.read_timeout_ms, 60000);
    assert_int_equal(rdzv_conf_dead_after_ms(&c), 15000);
    assert_int_equal(c.is_host, -1);

    assert_int_equal(rdzv_conf_parse(&c,
                                     " join_timeout=10, last_call_timeout = 0.5,close_timeout=0,"
                                     "keep_alive_interval=1,keep_alive_max_attempt=2,"
                                     "read_timeout=7,is_host=yes,timeout=900,use_libuv=0,"
                                     "token=a=b",
                                     err, sizeof(err)),
                     0);
    assert_int_equal(c.join_timeout_ms, 10000);
    assert_int_equal(c.last_call_timeout_ms, 500);
    assert_int_equal(c.close_timeout_ms, 0);
    assert_int_equal(c.keep_alive_interval_ms, 1000);
    assert_int_equal(c.keep_alive_max_attempt, 2);
    assert_int_equal(c.read_timeout_ms, 7000);
    assert_int_equal(c.is_host, 1);
    assert_int_equal(c.timeout_ms, 900000);
    assert_false(c.use_libuv);
    assert_true(c.has_token);
    assert_string_equal(c.token, "a=b");
    assert_int_equal(rdzv_conf_parse(&c, "  ", err, sizeof(err)), 0);

    assert_int_equal(rdzv_conf_parse(&c, "bogus=1", err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "unknown key 'bogus'"));
    assert_non_null(strstr(err, "keep_alive_max_attempt"));
    assert_int_equal(rdzv_conf_parse(&c, "join_timeout", err, sizeof(err)), CDDP_ECONFIG);
    assert_int_equal(rdzv_conf_parse(&c, "join_timeout=", err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "no value"));
    assert_int_equal(rdzv_conf_parse(&c, "=3", err, sizeof(err)), CDDP_ECONFIG);
    assert_int_equal(rdzv_conf_parse(&c, "join_timeout=0", err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "join_timeout"));
    assert_int_equal(rdzv_conf_parse(&c, "join_timeout=-1", err, sizeof(err)), CDDP_ECONFIG);
    assert_int_equal(rdzv_conf_parse(&c, "join_timeout=abc", err, sizeof(err)), CDDP_ECONFIG);
    assert_int_equal(rdzv_conf_parse(&c, "keep_alive_max_attempt=0", err, sizeof(err)),
                     CDDP_ECONFIG);
    assert_int_equal(rdzv_conf_parse(&c, "keep_alive_max_attempt=1.5", err, sizeof(err)),
                     CDDP_ECONFIG);
    assert_int_equal(rdzv_conf_parse(&c, "is_host=maybe", err, sizeof(err)), CDDP_ECONFIG);
    assert_int_equal(rdzv_conf_parse(&c, "join_timeout=1e99", err, sizeof(err)), CDDP_ECONFIG);
    /* torch's other c10d keys: heartbeat_timeout (no effect here), store_type=tcp only. */
    assert_int_equal(rdzv_conf_parse(&c, "heartbeat_timeout=7,store_type=tcp", err, sizeof(err)),
                     0);
    assert_int_equal(c.heartbeat_timeout_ms, 7000);
    assert_int_equal(rdzv_conf_parse(&c, "store_type=file", err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "store_type='file'"));
    /* resume_timeout: the keep-alive window unless given; 0 turns rebuilds off. */
    rdzv_conf_init(&c);
    assert_int_equal(rdzv_conf_resume_timeout_ms(&c), 15000);
    assert_int_equal(rdzv_conf_parse(&c, "keep_alive_interval=1", err, sizeof(err)), 0);
    assert_int_equal(rdzv_conf_resume_timeout_ms(&c), 3000);
    assert_int_equal(rdzv_conf_parse(&c, "resume_timeout=0.5", err, sizeof(err)), 0);
    assert_int_equal(rdzv_conf_resume_timeout_ms(&c), 500);
    assert_int_equal(rdzv_conf_parse(&c, "resume_timeout=0", err, sizeof(err)), 0);
    assert_int_equal(rdzv_conf_resume_timeout_ms(&c), 0);
    assert_int_equal(rdzv_conf_parse(&c, "resume_timeout=-1", err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "resume_timeout"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
