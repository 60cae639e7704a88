/*
 * test_etcd_wire.c: rendezvous/etcd_wire.c, the etcd-v3 JSON gateway's codec
 * (pure): base64, the requests, the gateway's answers (taken from a real etcd
 * 3.4 gateway), malformed answers of every kind (a fuzz-ish loop over
 * mutations, which also feeds the round state's decoder), the leader's batch.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "proto/msg.h"
#include "rendezvous/etcd_round.h"
#include "rendezvous/etcd_wire.h"

/* ---- base64 ---- */

/* The gateway's base64 is proto's: strict, as etcd (Go) writes it. */
static void test_base64(void **state)
{
    (void)state;
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *want[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < 7; i++) {
        char out[16];
        proto_base64_encode(in[i], strlen(in[i]), out);
        assert_string_equal(out, want[i]);
        unsigned char back[16];
        assert_int_equal(proto_base64_decode(out, strlen(out), back, sizeof(back)),
                         (long)strlen(in[i]));
        assert_memory_equal(back, in[i], strlen(in[i]));
    }
    unsigned char dec[16];
    const char *bad[] = {"Zg=",      "Zg=a", "Z===", "Zh==", "Zm9=v",
                         "Zm9v====", "Zm 9", "Zm-v", "=Zm9"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (proto_base64_decode(bad[i], strlen(bad[i]), dec, sizeof(dec)) >= 0)
            fail_msg("'%s' decoded", bad[i]);
    }
}

static void test_prefix_end(void **state)
{
    (void)state;
    char out[8];
    assert_int_equal(etcd_prefix_end("/a/", 3, out), 3);
    assert_memory_equal(out, "/a0", 3);
    assert_int_equal(etcd_prefix_end("a\xff", 2, out), 1);
    assert_memory_equal(out, "b", 1);
    assert_int_equal(etcd_prefix_end("\xff\xff", 2, out), 0);
}

/* ---- requests ---- */

static void test_requests(void **state)
{
    (void)state;
    char *s = etcd_req_put("/a", "hi", 2, 42);
    assert_string_equal(s, "{\"key\":\"L2E=\",\"value\":\"aGk=\",\"lease\":\"42\"}");
    free(s);
    s = etcd_req_range("/a/", "/a0", true, false);
    assert_string_equal(s, "{\"key\":\"L2Ev\",\"range_end\":\"L2Ew\",\"count_only\":true}");
    free(s);
    s = etcd_req_cas("/s", 7, "v", 1, 0);
    assert_non_null(strstr(s, "\"target\":\"MOD\""));
    assert_non_null(strstr(s, "\"mod_revision\":\"7\""));
    assert_non_null(strstr(s, "\"request_put\""));
    assert_non_null(strstr(s, "\"request_range\""));
    free(s);
    s = etcd_req_watch("/p/", "/p0", 9);
    assert_non_null(strstr(s, "\"create_request\""));
    assert_non_null(strstr(s, "\"start_revision\":\"9\""));
    free(s);
    s = etcd_req_lease_id(-5);
    assert_string_equal(s, "{\"ID\":\"-5\"}");
    free(s);
}

/* ---- answers (as etcd 3.4.23's gateway writes them) ---- */

#define HDR                                                                                        \
    "\"header\":{\"cluster_id\":\"15118495548433857066\",\"member_id\":\"13668033151171901709\","  \
    "\"revision\":\"2\",\"raft_term\":\"2\"}"

static const char RANGE[] =
    "{" HDR ",\"kvs\":[{\"key\":\"L2Ex\",\"create_revision\":\"2\",\"mod_revision\":\"2\","
    "\"version\":\"1\",\"value\":\"aGk=\",\"lease\":\"4111120368646321159\"}],\"count\":\"1\"}";
static const char CAS_FAILED[] =
    "{" HDR ",\"responses\":[{\"response_range\":{\"header\":{\"revision\":\"2\"},\"kvs\":[{"
    "\"key\":\"L2Ex\",\"create_revision\":\"2\",\"mod_revision\":\"2\",\"version\":\"1\","
    "\"value\":\"aGk=\"}],\"count\":\"1\"}}]}";
static const char CAS_OK[] = "{" HDR ",\"succeeded\":true,\"responses\":[{\"response_put\":{"
                             "\"header\":{\"revision\":\"3\"}}}]}";
static const char GRANT[] = "{" HDR ",\"ID\":\"4111120368646321157\",\"TTL\":\"5\"}";
static const char KEEPALIVE[] =
    "{\"result\":{" HDR ",\"ID\":\"4111120368646321159\",\"TTL\":\"5\"}}";
static const char KEEPALIVE_GONE[] = "{\"result\":{" HDR ",\"ID\":\"4111120368646321159\"}}";
static const char WATCH_CREATED[] = "{\"result\":{" HDR ",\"created\":true}}";
static const char WATCH_EVENTS[] =
    "{\"result\":{" HDR ",\"events\":[{\"kv\":{\"key\":\"L2Ex\",\"create_revision\":\"2\","
    "\"mod_revision\":\"2\",\"version\":\"1\",\"value\":\"aGk=\",\"lease\":\"41\"}},"
    "{\"type\":\"DELETE\",\"kv\":{\"key\":\"L2Ex\",\"mod_revision\":\"3\"}}]}}";
static const char ERROR_ANSWER[] =
    "{\"error\":\"illegal base64 data at input byte 0\",\"message\":\"illegal base64 data at "
    "input byte 0\",\"code\":3}";

static void test_answers(void **state)
{
    (void)state;
    char err[256];
    struct etcd_range r;
    assert_int_equal(etcd_parse_range(RANGE, strlen(RANGE), &r, err, sizeof(err)), 0);
    assert_int_equal(r.revision, 2);
    assert_int_equal(r.count, 1);
    assert_int_equal(r.nkvs, 1);
    assert_string_equal(r.kvs[0].key, "/a1");
    assert_string_equal((char *)r.kvs[0].value, "hi");
    assert_int_equal(r.kvs[0].mod_rev, 2);
    assert_true(r.kvs[0].lease == 4111120368646321159LL);
    etcd_range_free(&r);

    bool ok;
    assert_int_equal(etcd_parse_cas(CAS_FAILED, strlen(CAS_FAILED), &ok, &r, err, sizeof(err)), 0);
    assert_false(ok);
    assert_int_equal(r.nkvs, 1);
    assert_string_equal((char *)r.kvs[0].value, "hi");
    etcd_range_free(&r);
    assert_int_equal(etcd_parse_cas(CAS_OK, strlen(CAS_OK), &ok, &r, err, sizeof(err)), 0);
    assert_true(ok);
    etcd_range_free(&r);

    int64_t id, ttl;
    assert_int_equal(etcd_parse_lease(GRANT, strlen(GRANT), &id, &ttl, err, sizeof(err)), 0);
    assert_true(id == 4111120368646321157LL);
    assert_int_equal(ttl, 5);
    assert_int_equal(etcd_parse_lease(KEEPALIVE, strlen(KEEPALIVE), &id, &ttl, err, sizeof(err)),
                     0);
    assert_int_equal(ttl, 5);
    assert_int_equal(
        etcd_parse_lease(KEEPALIVE_GONE, strlen(KEEPALIVE_GONE), &id, &ttl, err, sizeof(err)), 0);
    assert_int_equal(ttl, 0);

    struct etcd_watch_msg m;
    assert_int_equal(etcd_parse_watch(WATCH_CREATED, strlen(WATCH_CREATED), &m, err, sizeof(err)),
                     0);
    assert_true(m.created);
    assert_int_equal(m.nevents, 0);
    etcd_watch_msg_free(&m);
    assert_int_equal(etcd_parse_watch(WATCH_EVENTS, strlen(WATCH_EVENTS), &m, err, sizeof(err)), 0);
    assert_int_equal(m.nevents, 2);
    assert_int_equal(m.events[0].type, ETCD_PUT);
    assert_string_equal((char *)m.events[0].kv.value, "hi");
    assert_int_equal(m.events[1].type, ETCD_DELETE);
    assert_string_equal(m.events[1].kv.key, "/a1");
    assert_int_equal(m.events[1].kv.mod_rev, 3);
    etcd_watch_msg_free(&m);

    char tok[32];
    const char *auth = "{" HDR ",\"token\":\"abc.17\"}";
    assert_int_equal(etcd_parse_token(auth, strlen(auth), tok, sizeof(tok), err, sizeof(err)), 0);
    assert_string_equal(tok, "abc.17");
    const char *bad_tokens[] = {"{}", "{\"token\":\"\"}", "{\"token\":\"a b\"}",
                                "{\"token\":\"0123456789012345678901234567890123\"}",
                                "{\"token\":5}"};
    for (size_t i = 0; i < sizeof(bad_tokens) / sizeof(bad_tokens[0]); i++)
        assert_true(etcd_parse_token(bad_tokens[i], strlen(bad_tokens[i]), tok, sizeof(tok), err,
                                     sizeof(err)) < 0);
    char *req = etcd_req_auth("u\"x", "p");
    assert_string_equal(req, "{\"name\":\"u\\\"x\",\"password\":\"p\"}");
    free(req);

    char msg[64];
    assert_true(etcd_parse_error(ERROR_ANSWER, strlen(ERROR_ANSWER), msg, sizeof(msg)));
    assert_non_null(strstr(msg, "illegal base64"));
    assert_true(etcd_parse_watch(ERROR_ANSWER, strlen(ERROR_ANSWER), &m, err, sizeof(err)) ==
                CDDP_EPEER);
    assert_false(etcd_parse_error(RANGE, strlen(RANGE), msg, sizeof(msg)));
}

static void test_bad_answers(void **state)
{
    (void)state;
    char err[256];
    struct etcd_range r;
    struct etcd_watch_msg m;
    const char *bad_range[] = {
        "",
        "[]",
        "{}",
        "nonsense",
        "{\"header\":5}",
        "{\"header\":{\"revision\":\"x\"}}",
        "{\"header\":{\"revision\":\"1\"},\"kvs\":{}}",
        "{\"header\":{\"revision\":\"1\"},\"kvs\":[5]}",
        "{\"header\":{\"revision\":\"1\"},\"kvs\":[{\"value\":\"aGk=\"}]}",
        "{\"header\":{\"revision\":\"1\"},\"kvs\":[{\"key\":\"!!!!\"}]}",
        "{\"header\":{\"revision\":\"1\"},\"kvs\":[{\"key\":\"AA==\"}]}", /* a NUL in the key */
        "{\"header\":{\"revision\":\"1\"},\"kvs\":[{\"key\":\"L2E=\",\"mod_revision\":1.5}]}",
        "{\"header\":{\"revision\":\"99999999999999999999999\"}}",
        "{\"header\":{\"revision\":\"1\"},\"count\":true}",
    };
    for (size_t i = 0; i < sizeof(bad_range) / sizeof(bad_range[0]); i++) {
        err[0] = '\0';
        if (etcd_parse_range(bad_range[i], strlen(bad_range[i]), &r, err, sizeof(err)) == 0)
            fail_msg("accepted: %s", bad_range[i]);
        assert_true(err[0] != '\0');
    }
    /* deep nesting is refused before cJSON recurses */
    char deep[4096];
    size_t o = 0;
    for (int i = 0; i < 1000; i++)
        deep[o++] = '[';
    deep[o] = '\0';
    assert_true(etcd_parse_range(deep, o, &r, err, sizeof(err)) < 0);
    bool ok;
    const char *bad_cas[] = {
        "{\"header\":{\"revision\":\"1\"},\"succeeded\":\"yes\"}",
        "{\"header\":{\"revision\":\"1\"}}", /* failed without its range */
        "{\"header\":{\"revision\":\"1\"},\"responses\":[{\"response_range\":7}]}",
    };
    for (size_t i = 0; i < sizeof(bad_cas) / sizeof(bad_cas[0]); i++)
        assert_true(etcd_parse_cas(bad_cas[i], strlen(bad_cas[i]), &ok, &r, err, sizeof(err)) < 0);
    int64_t id, ttl;
    const char *bad_lease[] = {"{}", "{\"ID\":\"0\",\"TTL\":\"5\"}",
                               "{\"ID\":\"1\",\"TTL\":\"-1\"}", "{\"result\":3}", "{\"ID\":{}}"};
    for (size_t i = 0; i < sizeof(bad_lease) / sizeof(bad_lease[0]); i++)
        assert_true(
            etcd_parse_lease(bad_lease[i], strlen(bad_lease[i]), &id, &ttl, err, sizeof(err)) < 0);
    const char *bad_watch[] = {
        "{}",
        "{\"result\":{}}",
        "{\"result\":{\"header\":{},\"events\":7}}",
        "{\"result\":{\"header\":{},\"events\":[{\"type\":\"BOOM\",\"kv\":{\"key\":\"L2E=\"}}]}}",
        "{\"result\":{\"header\":{},\"events\":[{\"kv\":5}]}}",
        "{\"result\":{\"header\":{},\"events\":[3]}}",
    };
    for (size_t i = 0; i < sizeof(bad_watch) / sizeof(bad_watch[0]); i++)
        assert_true(etcd_parse_watch(bad_watch[i], strlen(bad_watch[i]), &m, err, sizeof(err)) < 0);
}

/* Every answer, cut at every length and with bytes flipped at random: each
 * decoder answers 0 or an error, never crashes, never leaks (ASan). */
static void test_fuzzish(void **state)
{
    (void)state;
    const char *seeds[] = {RANGE,     CAS_FAILED,   CAS_OK,        GRANT,
                           KEEPALIVE, WATCH_EVENTS, WATCH_CREATED, ERROR_ANSWER};
    char buf[2048], err[256], msg[64];
    uint32_t rnd = 12345;
    const char junk[] = "{}[]\",:0123456789-+=/eE\\tnul ";
    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        size_t n = strlen(seeds[s]);
        for (int round = 0; round < 600; round++) {
            memcpy(buf, seeds[s], n);
            size_t len = n;
            if (round < (int)n) {
                len = (size_t)round; /* every prefix */
            } else {
                int flips = 1 + (int)(rnd % 4);
                for (int f = 0; f < flips; f++) {
                    rnd = rnd * 1103515245u + 12345u;
                    buf[(rnd >> 8) % n] = junk[(rnd >> 20) % (sizeof(junk) - 1)];
                }
            }
            buf[len] = '\0';
            struct etcd_range r;
            struct etcd_watch_msg m;
            bool ok;
            int64_t id, ttl;
            if (etcd_parse_range(buf, len, &r, err, sizeof(err)) == 0)
                etcd_range_free(&r);
            if (etcd_parse_cas(buf, len, &ok, &r, err, sizeof(err)) == 0)
                etcd_range_free(&r);
            (void)etcd_parse_lease(buf, len, &id, &ttl, err, sizeof(err));
            if (etcd_parse_watch(buf, len, &m, err, sizeof(err)) == 0)
                etcd_watch_msg_free(&m);
            (void)etcd_parse_error(buf, len, msg, sizeof(msg));
            char tok[64];
            (void)etcd_parse_token(buf, len, tok, sizeof(tok), err, sizeof(err));
            struct etcd_round st;
            if (etcd_round_decode(buf, len, &st, err, sizeof(err)) == 0)
                etcd_round_free(&st);
        }
    }
}

/* ---- the leader's batch ---- */

/* The leader's batch: the state, its copy under news/, and each folded
 * request deleted, compared on its own revision. */
static void test_fold_request(void **state)
{
    (void)state;
    const char *keys[] = {"/j/a", "/j/b"};
    const int64_t revs[] = {11, 12};
    char *s = etcd_req_fold("/s", 7, "v", 1, 0, "/n/round", keys, revs, 2);
    assert_non_null(s);
    cJSON *o = cJSON_Parse(s);
    free(s);
    assert_non_null(o);
    const cJSON *cmp = cJSON_GetObjectItem(o, "compare");
    const cJSON *succ = cJSON_GetObjectItem(o, "success");
    const cJSON *fail = cJSON_GetObjectItem(o, "failure");
    assert_int_equal(cJSON_GetArraySize(cmp), 3);
    assert_int_equal(cJSON_GetArraySize(succ), 4); /* put, copy, two deletes */
    assert_int_equal(cJSON_GetArraySize(fail), 1);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cmp, 2), "mod_revision")->valuestring, "12");
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(succ, 1), "request_put"), "key")
            ->valuestring,
        "L24vcm91bmQ="); /* /n/round */
    assert_non_null(cJSON_GetObjectItem(cJSON_GetArrayItem(succ, 3), "request_delete_range"));
    cJSON_Delete(o);
    /* No copy, no deletes: a plain compare-and-put. */
    s = etcd_req_fold("/s", 0, "v", 1, 5, NULL, NULL, NULL, 0);
    o = cJSON_Parse(s);
    free(s);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "success")), 1);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "compare")), 1);
    cJSON_Delete(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64),       cmocka_unit_test(test_prefix_end),
        cmocka_unit_test(test_requests),     cmocka_unit_test(test_answers),
        cmocka_unit_test(test_bad_answers),  cmocka_unit_test(test_fuzzish),
        cmocka_unit_test(test_fold_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
