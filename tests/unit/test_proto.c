/* Unit tests for proto/frame.c and proto/msg.c: frames, messages, base64,
 * error names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"
#include "proto/frame.h"
#include "proto/msg.h"

/* ---- frames ---- */

struct frames {
    int n;
    char got[8][64];
    size_t len[8];
    int stop_after;
};

static int on_frame(void *arg, const char *p, size_t len)
{
    struct frames *f = arg;
    assert_true(f->n < 8);
    memcpy(f->got[f->n], p, len < 63 ? len : 63);
    f->len[f->n] = len;
    f->n++;
    return f->stop_after && f->n == f->stop_after ? 99 : 0;
}

static void test_frame_split(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    assert_int_equal(proto_frame_append(&b, "{\"a\":1}", 7), 0);
    assert_int_equal(proto_frame_append(&b, "", 0), 0);
    assert_int_equal(proto_frame_append(&b, "{}", 2), 0);
    assert_int_equal(b.len, 4 + 7 + 4 + 0 + 4 + 2);
    assert_memory_equal(b.data, "\0\0\0\7", 4);

    /* Every split of the stream into two reads gives the same frames. */
    for (size_t cut = 0; cut <= b.len; cut++) {
        struct proto_decoder d;
        struct frames f = {0};
        proto_decoder_init(&d, 0);
        assert_int_equal(proto_decoder_feed(&d, b.data, cut, on_frame, &f), 0);
        assert_int_equal(proto_decoder_feed(&d, b.data + cut, b.len - cut, on_frame, &f), 0);
        assert_int_equal(f.n, 3);
        assert_int_equal(f.len[0], 7);
        assert_memory_equal(f.got[0], "{\"a\":1}", 7);
        assert_int_equal(f.len[1], 0);
        assert_memory_equal(f.got[2], "{}", 2);
        assert_int_equal(proto_decoder_pending(&d), 0);
        proto_decoder_free(&d);
    }
    /* One byte at a time. */
    struct proto_decoder d;
    struct frames f = {0};
    proto_decoder_init(&d, 0);
    for (size_t i = 0; i < b.len; i++)
        assert_int_equal(proto_decoder_feed(&d, b.data + i, 1, on_frame, &f), 0);
    assert_int_equal(f.n, 3);
    proto_decoder_free(&d);

    /* A callback's nonzero return stops the decoder. */
    struct frames g = {.stop_after = 1};
    proto_decoder_init(&d, 0);
    assert_int_equal(proto_decoder_feed(&d, b.data, b.len, on_frame, &g), 99);
    assert_int_equal(g.n, 1);
    proto_decoder_free(&d);
    cddp_buf_free(&b);
}

static void test_frame_oversized(void **state)
{
    (void)state;
    struct proto_decoder d;
    struct frames f = {0};
    unsigned char hdr[4];
    /* A header announcing more than the limit is refused before the body. */
    proto_frame_header(PROTO_FRAME_MAX + 1, hdr);
    proto_decoder_init(&d, 0);
    assert_int_equal(proto_decoder_feed(&d, hdr, 4, on_frame, &f), CDDP_ETOOBIG);
    assert_int_equal(proto_decoder_announced(&d), PROTO_FRAME_MAX + 1);
    proto_decoder_free(&d);

    /* Also when the header arrives in pieces. */
    proto_decoder_init(&d, 100);
    proto_frame_header(101, hdr);
    assert_int_equal(proto_decoder_feed(&d, hdr, 2, on_frame, &f), 0);
    assert_int_equal(proto_decoder_feed(&d, hdr + 2, 2, on_frame, &f), CDDP_ETOOBIG);
    proto_decoder_free(&d);

    /* Exactly the limit is fine. */
    proto_decoder_init(&d, 100);
    char body[104] = {0};
    proto_frame_header(100, (unsigned char *)body);
    assert_int_equal(proto_decoder_feed(&d, body, sizeof(body), on_frame, &f), 0);
    assert_int_equal(f.n, 1);
    assert_int_equal(f.len[0], 100);
    proto_decoder_free(&d);

    struct cddp_buf b;
    cddp_buf_init(&b, 4 << 20);
    char *big = calloc(1, PROTO_FRAME_MAX + 1);
    assert_int_equal(proto_frame_append(&b, big, PROTO_FRAME_MAX + 1), CDDP_ETOOBIG);
    assert_int_equal(b.len, 0);
    free(big);
    cddp_buf_free(&b);
}

/* ---- messages ---- */

static void roundtrip(const struct proto_msg *in, struct proto_msg *out)
{
    struct cddp_buf b;
    char err[256];
    cddp_buf_init(&b, PROTO_FRAME_MAX + 4);
    assert_int_equal(proto_msg_encode(in, &b), 0);
    assert_int_equal(proto_frame_length((unsigned char *)b.data), b.len - 4);
    int rc = proto_msg_decode(b.data + 4, b.len - 4, out, err, sizeof(err));
    if (rc)
        fail_msg("decode of %s failed: %s", b.data + 4, err);
    assert_int_equal(out->type, in->type);
    cddp_buf_free(&b);
}

static void test_msg_roundtrip(void **state)
{
    (void)state;
    struct proto_msg m = {0}, o;

    m.type = PROTO_HELLO;
    m.hello.token = "s3cr\"et";
    m.hello.run_id = "job7";
    roundtrip(&m, &o);
    assert_string_equal(o.hello.token, "s3cr\"et");
    assert_string_equal(o.hello.run_id, "job7");
    assert_null(o.hello.client);
    proto_msg_free(&o);

    struct proto_conf_kv conf[2] = {{"join_timeout", "600"}, {"last_call_timeout", "0.5"}};
    memset(&m, 0, sizeof(m));
    m.type = PROTO_JOIN;
    m.join.node_id = "host_42_0";
    m.join.nproc = 8;
    m.join.min_nodes = 1;
    m.join.max_nodes = 4;
    m.join.hostname = "node1.example";
    m.join.master_port = 29500;
    m.join.conf = conf;
    m.join.nconf = 2;
    roundtrip(&m, &o);
    assert_string_equal(o.join.node_id, "host_42_0");
    assert_int_equal(o.join.nproc, 8);
    assert_int_equal(o.join.max_nodes, 4);
    assert_null(o.join.local_addr);
    assert_int_equal(o.join.nconf, 2);
    assert_string_equal(o.join.conf[1].key, "last_call_timeout");
    assert_string_equal(o.join.conf[1].value, "0.5");
    assert_int_equal(o.join.round, 0); /* optional, absent */
    assert_int_equal(o.join.restart_count, 0);
    assert_int_equal(o.join.status_port, 0);
    proto_msg_free(&o);
    m.join.round = 7;
    m.join.last_nnodes = 3;
    m.join.restart_count = 2;
    m.join.status_port = 29501;
    roundtrip(&m, &o);
    assert_int_equal(o.join.status_port, 29501);
    assert_int_equal(o.join.round, 7);
    assert_int_equal(o.join.last_nnodes, 3);
    assert_int_equal(o.join.restart_count, 2);
    proto_msg_free(&o);

    /* Heartbeat acknowledgements, resume (feature flags in hello and welcome). */
    memset(&m, 0, sizeof(m));
    m.type = PROTO_HELLO;
    m.hello.run_id = "job7";
    m.hello.heartbeat_ack = true;
    roundtrip(&m, &o);
    assert_true(o.hello.heartbeat_ack);
    proto_msg_free(&o);
    memset(&m, 0, sizeof(m));
    m.type = PROTO_WELCOME;
    m.welcome.server = "s";
    m.welcome.heartbeat_ack = true;
    m.welcome.resume = true;
    m.welcome.generations = true;
    roundtrip(&m, &o);
    assert_true(o.welcome.heartbeat_ack && o.welcome.resume && o.welcome.generations);
    assert_false(o.welcome.replace_ranks);
    proto_msg_free(&o);
    m.welcome.replace_ranks = true;
    roundtrip(&m, &o);
    assert_true(o.welcome.generations && o.welcome.replace_ranks);
    proto_msg_free(&o);
    memset(&m, 0, sizeof(m));
    m.type = PROTO_HEARTBEAT;
    roundtrip(&m, &o);
    assert_false(o.heartbeat.has_waiting); /* an agent's heartbeat carries nothing */
    proto_msg_free(&o);
    m.heartbeat.has_waiting = true;
    m.heartbeat.waiting = 0;
    roundtrip(&m, &o);
    assert_true(o.heartbeat.has_waiting);
    assert_int_equal(o.heartbeat.waiting, 0);
    proto_msg_free(&o);
    m.heartbeat.waiting = 3;
    roundtrip(&m, &o);
    assert_int_equal(o.heartbeat.waiting, 3);
    assert_false(o.heartbeat.has_perf);
    proto_msg_free(&o);
    /* An agent's summary of its ranks' step times (optional). */
    memset(&m, 0, sizeof(m));
    m.type = PROTO_HEARTBEAT;
    m.heartbeat.has_perf = true;
    m.heartbeat.perf = (struct proto_perf){
        .ranks = 4, .step_s = 0.125, .compute_s = 0.1, .max_rank = 7, .factor = 1.5};
    roundtrip(&m, &o);
    assert_true(o.heartbeat.has_perf);
    assert_int_equal(o.heartbeat.perf.ranks, 4);
    assert_true(o.heartbeat.perf.step_s == 0.125 && o.heartbeat.perf.compute_s == 0.1);
    assert_int_equal(o.heartbeat.perf.max_rank, 7);
    assert_true(o.heartbeat.perf.factor == 1.5);
    proto_msg_free(&o);
    m.heartbeat.perf.compute_s = -1; /* not reported: left out, and read back as absent */
    roundtrip(&m, &o);
    assert_true(o.heartbeat.perf.compute_s < 0);
    proto_msg_free(&o);
    memset(&m, 0, sizeof(m));
    m.type = PROTO_RESUME;
    m.id = 9;
    m.resume.node_id = "host_42_0";
    m.resume.round = 4;
    roundtrip(&m, &o);
    assert_int_equal(o.id, 9);
    assert_string_equal(o.resume.node_id, "host_42_0");
    assert_int_equal(o.resume.round, 4);
    assert_false(o.resume.rebuild);
    proto_msg_free(&o);
    /* A resume that carries what a restarted server rebuilds the round from. */
    struct proto_conf_kv rkv[1] = {{"resume_timeout", "2.5"}};
    m.resume.rebuild = true;
    m.resume.join = (struct proto_join){.node_id = "host_42_0",
                                        .nproc = 4,
                                        .min_nodes = 1,
                                        .max_nodes = 3,
                                        .hostname = "h",
                                        .master_port = 29511,
                                        .round = 4,
                                        .last_nnodes = 2,
                                        .restart_count = 1,
                                        .conf = rkv,
                                        .nconf = 1};
    m.resume.member = (struct proto_round){.run_id = "job7",
                                           .round = 4,
                                           .node_rank = 1,
                                           .nnodes = 2,
                                           .world_size = 8,
                                           .rank_offset = 4,
                                           .nproc = 4,
                                           .master_addr = "10.0.0.1",
                                           .master_port = 29500,
                                           .restart_count = 1};
    roundtrip(&m, &o);
    assert_true(o.resume.rebuild);
    assert_string_equal(o.resume.join.node_id, "host_42_0");
    assert_int_equal(o.resume.join.max_nodes, 3);
    assert_int_equal(o.resume.join.master_port, 29511);
    assert_int_equal(o.resume.join.nconf, 1);
    assert_string_equal(o.resume.join.conf[0].key, "resume_timeout");
    assert_string_equal(o.resume.join.conf[0].value, "2.5");
    assert_int_equal(o.resume.member.node_rank, 1);
    assert_int_equal(o.resume.member.world_size, 8);
    assert_int_equal(o.resume.member.rank_offset, 4);
    assert_string_equal(o.resume.member.master_addr, "10.0.0.1");
    assert_int_equal(o.resume.member.restart_count, 1);
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_ROUND;
    m.round = (struct proto_round){.run_id = "job7",
                                   .round = 3,
                                   .node_rank = 1,
                                   .nnodes = 2,
                                   .world_size = 12,
                                   .rank_offset = 8,
                                   .nproc = 4,
                                   .master_addr = "::1",
                                   .master_port = 1234,
                                   .restart_count = 2};
    roundtrip(&m, &o);
    assert_int_equal(o.round.round, 3);
    assert_int_equal(o.round.rank_offset, 8);
    assert_string_equal(o.round.master_addr, "::1");
    assert_int_equal(o.round.restart_count, 2);
    proto_msg_free(&o);
    /* restart_count is optional: a round without it is count 0 */
    const char *bare = "{\"v\":1,\"type\":\"round\",\"run_id\":\"j\",\"round\":1,\"node_rank\":0,"
                       "\"nnodes\":1,\"world_size\":1,\"rank_offset\":0,\"nproc\":1,"
                       "\"master_addr\":\"h\",\"master_port\":1}";
    char derr[256];
    assert_int_equal(proto_msg_decode(bare, strlen(bare), &o, derr, sizeof(derr)), 0);
    assert_int_equal(o.round.restart_count, 0);
    assert_int_equal(o.round.generation, 0); /* and so is generation */
    assert_null(o.round.replaced);
    proto_msg_free(&o);
    /* a round that goes on in place: its generation, the replaced ranks */
    m.round.generation = 4;
    m.round.replaced = "8,9,10,11";
    roundtrip(&m, &o);
    assert_int_equal(o.round.generation, 4);
    assert_string_equal(o.round.replaced, "8,9,10,11");
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_LEAVE;
    m.leave.reason = "barrier timed out";
    m.leave.finished = true;
    roundtrip(&m, &o);
    assert_true(o.leave.finished);
    proto_msg_free(&o);
    m.leave.finished = false;
    roundtrip(&m, &o);
    assert_false(o.leave.finished);
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_RESTART;
    m.restart.round = 4;
    m.restart.reason = "node_lost";
    m.restart.node_id = "b_1_0";
    m.restart.counted = false;
    m.restart.restart_count = 5;
    roundtrip(&m, &o);
    assert_string_equal(o.restart.reason, "node_lost");
    assert_false(o.restart.counted);
    assert_int_equal(o.restart.restart_count, 5);
    proto_msg_free(&o);

    /* replace, and its answer granted and refused */
    memset(&m, 0, sizeof(m));
    m.type = PROTO_REPLACE;
    m.replace.round = 7;
    m.replace.rank = 3;
    m.replace.reason = "worker_failure";
    roundtrip(&m, &o);
    assert_int_equal(o.replace.round, 7);
    assert_int_equal(o.replace.rank, 3);
    assert_string_equal(o.replace.reason, "worker_failure");
    assert_null(o.replace.ranks);
    proto_msg_free(&o);
    m.replace.ranks = "3,5"; /* several ranks together */
    roundtrip(&m, &o);
    assert_int_equal(o.replace.rank, 3);
    assert_string_equal(o.replace.ranks, "3,5");
    proto_msg_free(&o);
    memset(&m, 0, sizeof(m));
    m.type = PROTO_GENERATION;
    m.generation.round = 7;
    m.generation.generation = 2;
    m.generation.replaced = "3";
    m.generation.node_id = "b_1_0";
    roundtrip(&m, &o);
    assert_int_equal(o.generation.generation, 2);
    assert_string_equal(o.generation.replaced, "3");
    assert_string_equal(o.generation.node_id, "b_1_0");
    assert_null(o.generation.refused);
    proto_msg_free(&o);
    memset(&m, 0, sizeof(m));
    m.type = PROTO_BLAME;
    m.blame.round = 7;
    m.blame.rank = 5;
    m.blame.generation = 2;
    m.blame.node_id = "a_1_0";
    roundtrip(&m, &o);
    assert_int_equal(o.blame.round, 7);
    assert_int_equal(o.blame.rank, 5);
    assert_int_equal(o.blame.generation, 2);
    assert_string_equal(o.blame.node_id, "a_1_0");
    proto_msg_free(&o);
    memset(&m, 0, sizeof(m));
    m.type = PROTO_GENERATION;
    m.generation.round = 7;
    m.generation.generation = 0;
    m.generation.replaced = NULL;
    m.generation.refused = "round 6 is not the one running";
    roundtrip(&m, &o);
    assert_int_equal(o.generation.generation, 0);
    assert_string_equal(o.generation.refused, "round 6 is not the one running");
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_ERROR;
    m.error.code = CDDP_ETOKEN;
    m.error.message = "bad token";
    roundtrip(&m, &o);
    assert_int_equal(o.error.code, CDDP_ETOKEN);
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_ERROR;
    m.error.code = -ECONNRESET;
    roundtrip(&m, &o);
    assert_int_equal(o.error.code, -ECONNRESET);
    proto_msg_free(&o);

    /* Binary values survive base64, NUL bytes included. */
    memset(&m, 0, sizeof(m));
    m.type = PROTO_SET;
    m.id = 77;
    m.set.key = "torchelastic/x";
    m.set.value = (struct proto_bytes){"a\0b\xff", 4};
    roundtrip(&m, &o);
    assert_int_equal(o.id, 77);
    assert_int_equal(o.set.value.len, 4);
    assert_memory_equal(o.set.value.data, "a\0b\xff", 4);
    proto_msg_free(&o);

    const char *keys[] = {"a", "b"};
    memset(&m, 0, sizeof(m));
    m.type = PROTO_WAIT;
    m.id = 5;
    m.wait.keys = keys;
    m.wait.nkeys = 2;
    m.wait.timeout_ms = 1500;
    roundtrip(&m, &o);
    assert_int_equal(o.wait.nkeys, 2);
    assert_string_equal(o.wait.keys[1], "b");
    assert_int_equal(o.wait.timeout_ms, 1500);
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_GET;
    m.get.key = "k";
    m.get.timeout_ms = -1;
    roundtrip(&m, &o);
    assert_true(o.get.timeout_ms < 0);
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_RESULT;
    m.id = 9;
    m.result.has_number = true;
    m.result.number = -(1LL << 52);
    m.result.has_value = true;
    m.result.value = (struct proto_bytes){"", 0};
    roundtrip(&m, &o);
    assert_int_equal(o.result.code, 0);
    assert_true(o.result.number == -(1LL << 52));
    assert_true(o.result.has_value);
    assert_int_equal(o.result.value.len, 0);
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_RESULT;
    m.result.code = CDDP_ETIMEOUT;
    m.result.message = "wait timed out";
    roundtrip(&m, &o);
    assert_int_equal(o.result.code, CDDP_ETIMEOUT);
    assert_string_equal(o.result.message, "wait timed out");
    proto_msg_free(&o);

    memset(&m, 0, sizeof(m));
    m.type = PROTO_COMPARE_SET;
    m.compare_set.key = "k";
    m.compare_set.expected = (struct proto_bytes){"", 0};
    m.compare_set.desired = (struct proto_bytes){"xyz", 3};
    roundtrip(&m, &o);
    assert_int_equal(o.compare_set.desired.len, 3);
    proto_msg_free(&o);

    enum proto_type simple[] = {PROTO_HEARTBEAT, PROTO_LEAVE,   PROTO_CLOSE,
                                PROTO_CLOSED,    PROTO_WELCOME, PROTO_STATUS};
    for (size_t i = 0; i < sizeof(simple) / sizeof(simple[0]); i++) {
        memset(&m, 0, sizeof(m));
        m.type = simple[i];
        roundtrip(&m, &o);
        proto_msg_free(&o);
    }
}

/* A join's conf keys come from the peer: whatever JSON can escape in them
 * (tab, quote, backslash, other control characters) is written escaped, so
 * the server's own encoding of the message decodes to the same keys. */
static void test_msg_conf_keys_escaped(void **state)
{
    (void)state;
    const char *in = "{\"v\":1,\"type\":\"join\",\"node_id\":\"h_1_0\",\"nproc\":1,"
                     "\"min_nodes\":1,\"max_nodes\":2,"
                     "\"conf\":{\"la\\t_call\":\"1\",\"q\\\"b\\\\s\":\"2\",\"c\\u0001\":\"3\"}}";
    struct proto_msg m, o;
    char err[256];
    if (proto_msg_decode(in, strlen(in), &m, err, sizeof(err)) != 0)
        fail_msg("decode: %s", err);
    assert_int_equal(m.join.nconf, 3);
    assert_string_equal(m.join.conf[0].key, "la\t_call");
    int rc;
    char *json = proto_msg_to_json(&m, &rc);
    assert_non_null(json);
    for (const char *c = json; *c; c++)
        assert_true((unsigned char)*c >= 0x20);
    if (proto_msg_decode(json, strlen(json), &o, err, sizeof(err)) != 0)
        fail_msg("own encoding does not decode: %s\n%s", err, json);
    assert_int_equal(o.join.nconf, 3);
    assert_string_equal(o.join.conf[0].key, "la\t_call");
    assert_string_equal(o.join.conf[1].key, "q\"b\\s");
    assert_string_equal(o.join.conf[1].value, "2");
    assert_string_equal(o.join.conf[2].key, "c\x01");
    free(json);
    proto_msg_free(&o);
    proto_msg_free(&m);
}

static void test_msg_encode_refuses(void **state)
{
    (void)state;
    struct proto_msg m = {0};
    struct cddp_buf b;
    cddp_buf_init(&b, PROTO_FRAME_MAX + 4);
    m.type = PROTO_ROUND;
    m.round = (struct proto_round){.run_id = "r",
                                   .nnodes = 2,
                                   .node_rank = 2,
                                   .world_size = 2,
                                   .nproc = 1,
                                   .master_addr = "a"};
    assert_int_equal(proto_msg_encode(&m, &b), CDDP_EPROTO_FIELD);
    assert_int_equal(b.len, 0);
    m.type = (enum proto_type)999;
    assert_int_equal(proto_msg_encode(&m, &b), CDDP_EPROTO_TYPE);
    cddp_buf_free(&b);
}

static int decode_str(const char *json, char *err, size_t errlen)
{
    struct proto_msg m;
    int rc = proto_msg_decode(json, strlen(json), &m, err, errlen);
    if (rc == 0)
        proto_msg_free(&m);
    else
        assert_true(strlen(err) > 0);
    return rc;
}

static void test_msg_decode_errors(void **state)
{
    (void)state;
    char err[256];
    assert_int_equal(decode_str("", err, sizeof(err)), CDDP_EPARSE);
    assert_int_equal(decode_str("[1]", err, sizeof(err)), CDDP_EPARSE);
    assert_int_equal(decode_str("{\"v\":1", err, sizeof(err)), CDDP_EPARSE);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"heartbeat\"} x", err, sizeof(err)),
                     CDDP_EPARSE);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"heartbeat\"}  \n", err, sizeof(err)), 0);
    /* A heartbeat's perf: an object of checked numbers. */
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"heartbeat\",\"perf\":null}", err, sizeof(err)),
                     0);
    const char *bad_perf[] = {
        "[]",
        "{}",
        "{\"ranks\":0,\"step_s\":0.1,\"max_rank\":0,\"factor\":1.5}",
        "{\"ranks\":1,\"step_s\":0,\"max_rank\":0,\"factor\":1.5}",
        "{\"ranks\":1,\"step_s\":1e9,\"max_rank\":0,\"factor\":1.5}",
        "{\"ranks\":1,\"step_s\":0.1,\"compute_s\":-1,\"max_rank\":0,\"factor\":1.5}",
        "{\"ranks\":1,\"step_s\":0.1,\"max_rank\":-1,\"factor\":1.5}",
        "{\"ranks\":1,\"step_s\":0.1,\"max_rank\":0,\"factor\":0.5}",
        "{\"ranks\":1,\"step_s\":\"0.1\",\"max_rank\":0,\"factor\":1.5}",
    };
    for (size_t i = 0; i < sizeof(bad_perf) / sizeof(bad_perf[0]); i++) {
        char json[256];
        snprintf(json, sizeof(json), "{\"v\":1,\"type\":\"heartbeat\",\"perf\":%s}", bad_perf[i]);
        if (decode_str(json, err, sizeof(err)) != CDDP_EPROTO_FIELD)
            fail_msg("accepted: %s", json);
        assert_non_null(strstr(err, "perf"));
    }
    assert_int_equal(decode_str("{\"type\":\"heartbeat\"}", err, sizeof(err)), CDDP_EPROTO_FIELD);
    /* replace and generation: their fields checked */
    const char *bad_replace[] = {
        "{\"v\":1,\"type\":\"replace\",\"rank\":1}",
        "{\"v\":1,\"type\":\"replace\",\"round\":0,\"rank\":1}",
        "{\"v\":1,\"type\":\"replace\",\"round\":1,\"rank\":-1}",
        "{\"v\":1,\"type\":\"generation\",\"round\":1,\"generation\":2}",
        "{\"v\":1,\"type\":\"generation\",\"round\":1,\"generation\":2,\"replaced\":\"\"}",
        "{\"v\":1,\"type\":\"generation\",\"round\":1,\"generation\":0}",
        "{\"v\":1,\"type\":\"generation\",\"round\":1,\"generation\":-1,\"refused\":\"x\"}",
        "{\"v\":1,\"type\":\"blame\",\"round\":1,\"rank\":3}",
        "{\"v\":1,\"type\":\"blame\",\"round\":1,\"rank\":-3,\"generation\":0}",
    };
    for (size_t i = 0; i < sizeof(bad_replace) / sizeof(bad_replace[0]); i++) {
        if (decode_str(bad_replace[i], err, sizeof(err)) != CDDP_EPROTO_FIELD)
            fail_msg("accepted: %s", bad_replace[i]);
    }
    assert_int_equal(decode_str("{\"v\":2,\"type\":\"heartbeat\"}", err, sizeof(err)),
                     CDDP_EPROTO_VERSION);
    assert_non_null(strstr(err, "version 2"));
    assert_int_equal(decode_str("{\"v\":\"1\",\"type\":\"heartbeat\"}", err, sizeof(err)),
                     CDDP_EPROTO_VERSION);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"bogus\"}", err, sizeof(err)),
                     CDDP_EPROTO_TYPE);
    assert_non_null(strstr(err, "bogus"));
    assert_int_equal(decode_str("{\"v\":1,\"type\":7}", err, sizeof(err)), CDDP_EPROTO_FIELD);
    /* Strings are UTF-8 without raw control characters (a fuzzer finding:
     * such bytes decoded, then re-encoded into something that did not). */
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"heartbeat\",\"x\":\"\xff\"}", err, sizeof(err)),
        CDDP_EPARSE);
    assert_non_null(strstr(err, "UTF-8"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"heartbeat\",\"x\":\"\xc3\"}", err, sizeof(err)),
        CDDP_EPARSE);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"heartbeat\",\"x\":\"a\x03\"}", err, sizeof(err)),
        CDDP_EPARSE);
    assert_non_null(strstr(err, "control"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"heartbeat\",\"x\":\"\xc3\xa9\"}", err, sizeof(err)), 0);
    /* The new optional fields are checked like the others. */
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"heartbeat\",\"waiting\":-1}", err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"heartbeat\",\"waiting\":\"2\"}", err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"welcome\",\"resume\":1}", err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\"}", err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "round"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":0}", err,
                   sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"a b\",\"round\":1}", err,
                   sizeof(err)),
        CDDP_EPROTO_FIELD);
    /* resume's rebuild part: both objects or neither, consistent with the resume. */
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"join\":{"
                   "\"node_id\":\"n\",\"nproc\":2,\"min_nodes\":1,\"max_nodes\":2},\"member\":{"
                   "\"run_id\":\"j\",\"round\":2,\"node_rank\":0,\"nnodes\":2,\"world_size\":4,"
                   "\"rank_offset\":0,\"nproc\":2,\"master_addr\":\"h\",\"master_port\":1}}",
                   err, sizeof(err)),
        0);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"join\":{"
                   "\"node_id\":\"n\",\"nproc\":2,\"min_nodes\":1,\"max_nodes\":2}}",
                   err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "member"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"member\":"
                   "{\"run_id\":\"j\",\"round\":2,\"node_rank\":0,\"nnodes\":2,\"world_size\":4,"
                   "\"rank_offset\":0,\"nproc\":2,\"master_addr\":\"h\",\"master_port\":1}}",
                   err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "join"));
    assert_int_equal(
        decode_str(
            "{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"join\":3,"
            "\"member\":{\"run_id\":\"j\",\"round\":2,\"node_rank\":0,\"nnodes\":2,\"world_size\":"
            "4,\"rank_offset\":0,\"nproc\":2,\"master_addr\":\"h\",\"master_port\":1}}",
            err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "join"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"join\":{"
                   "\"node_id\":\"n\",\"nproc\":2,\"min_nodes\":1,\"max_nodes\":2},\"member\":{"
                   "\"run_id\":\"j\",\"round\":3,\"node_rank\":0,\"nnodes\":2,\"world_size\":4,"
                   "\"rank_offset\":0,\"nproc\":2,\"master_addr\":\"h\",\"master_port\":1}}",
                   err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "member"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"join\":{"
                   "\"node_id\":\"n\",\"nproc\":2,\"min_nodes\":1,\"max_nodes\":2},\"member\":{"
                   "\"run_id\":\"j\",\"round\":2,\"node_rank\":2,\"nnodes\":2,\"world_size\":4,"
                   "\"rank_offset\":0,\"nproc\":2,\"master_addr\":\"h\",\"master_port\":1}}",
                   err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "node_rank"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"join\":{"
                   "\"node_id\":\"n\",\"nproc\":2,\"min_nodes\":1,\"max_nodes\":2},\"member\":{"
                   "\"run_id\":\"j\",\"round\":2,\"node_rank\":0,\"nnodes\":2,\"world_size\":4,"
                   "\"rank_offset\":0,\"nproc\":1,\"master_addr\":\"h\",\"master_port\":1}}",
                   err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "nproc"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":2,\"join\":{"
                   "\"node_id\":\"m\",\"nproc\":2,\"min_nodes\":1,\"max_nodes\":2},\"member\":{"
                   "\"run_id\":\"j\",\"round\":2,\"node_rank\":0,\"nnodes\":2,\"world_size\":4,"
                   "\"rank_offset\":0,\"nproc\":2,\"master_addr\":\"h\",\"master_port\":1}}",
                   err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "join"));
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"resume\",\"id\":1,\"node_id\":\"n\",\"round\":1}", err,
                   sizeof(err)),
        0);
    /* Unknown extra fields are ignored. */
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"heartbeat\",\"later\":[1]}", err, sizeof(err)),
                     0);

    /* Nesting depth. */
    char deep[64] = "{\"v\":1,\"type\":\"heartbeat\",\"x\":";
    size_t n = strlen(deep);
    for (int i = 0; i < PROTO_MAX_DEPTH; i++)
        deep[n++] = '[';
    deep[n] = '\0';
    assert_int_equal(decode_str(deep, err, sizeof(err)), CDDP_ETOOBIG);
    assert_non_null(strstr(err, "nested"));

    /* Value count. */
    size_t cap = 16 * PROTO_MAX_VALUES;
    char *many = malloc(cap);
    int len = snprintf(many, cap, "{\"v\":1,\"type\":\"heartbeat\",\"x\":[");
    for (int i = 0; i < PROTO_MAX_VALUES + 1; i++)
        len += snprintf(many + len, cap - (size_t)len, "1,");
    snprintf(many + len, cap - (size_t)len, "1]}");
    assert_int_equal(decode_str(many, err, sizeof(err)), CDDP_ETOOBIG);
    free(many);

    /* Strings: NUL escapes, raw NULs, ids, lengths. */
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"hello\",\"run_id\":\"a\\u0000b\"}", err, sizeof(err)),
        CDDP_EPARSE);
    const char raw_nul[] = "{\"v\":1,\"type\":\"heartbeat\",\"x\":\"a\0\"}";
    struct proto_msg m;
    assert_int_equal(proto_msg_decode(raw_nul, sizeof(raw_nul) - 1, &m, err, sizeof(err)),
                     CDDP_EPARSE);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"hello\",\"run_id\":\"has space\"}", err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "run_id"));
    char longid[400];
    len = snprintf(longid, sizeof(longid), "{\"v\":1,\"type\":\"hello\",\"run_id\":\"");
    for (int i = 0; i < PROTO_MAX_ID + 1; i++)
        longid[len++] = 'x';
    snprintf(longid + len, sizeof(longid) - (size_t)len, "\"}");
    assert_int_equal(decode_str(longid, err, sizeof(err)), CDDP_EPROTO_FIELD);

    /* Field types and ranges. */
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"join\",\"node_id\":\"a\",\"nproc\":0,"
                                "\"min_nodes\":1,\"max_nodes\":1}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_non_null(strstr(err, "nproc"));
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"join\",\"node_id\":\"a\",\"nproc\":1.5,"
                                "\"min_nodes\":1,\"max_nodes\":1}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"join\",\"node_id\":\"a\",\"nproc\":1,"
                                "\"min_nodes\":3,\"max_nodes\":2}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"join\",\"node_id\":\"a\",\"nproc\":1,"
                                "\"min_nodes\":1,\"max_nodes\":2,\"conf\":{\"x\":1}}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"join\",\"node_id\":\"a\",\"nproc\":1,"
                                "\"min_nodes\":1,\"max_nodes\":2,\"conf\":[]}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"set\",\"id\":1,\"key\":\"k\","
                                "\"value\":\"not base64!\"}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"set\",\"id\":1,\"key\":\"\","
                                "\"value\":\"\"}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"set\",\"id\":-1,\"key\":\"k\","
                                "\"value\":\"\"}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"wait\",\"id\":1,\"keys\":[]}", err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_int_equal(
        decode_str("{\"v\":1,\"type\":\"wait\",\"id\":1,\"keys\":[\"a\",2]}", err, sizeof(err)),
        CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"add\",\"id\":1,\"key\":\"a\","
                                "\"delta\":1e300}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"round\",\"run_id\":\"r\",\"round\":0,"
                                "\"nnodes\":2,\"node_rank\":2,\"world_size\":2,"
                                "\"rank_offset\":0,\"nproc\":1,\"master_addr\":\"a\","
                                "\"master_port\":1}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(decode_str("{\"v\":1,\"type\":\"restart\",\"round\":1,\"reason\":\"x\","
                                "\"counted\":1}",
                                err, sizeof(err)),
                     CDDP_EPROTO_FIELD);
    /* Unknown error names decode to EPEER. */
    struct proto_msg e;
    const char *js = "{\"v\":1,\"type\":\"error\",\"code\":\"EWHATEVER\",\"message\":\"m\"}";
    assert_int_equal(proto_msg_decode(js, strlen(js), &e, err, sizeof(err)), 0);
    assert_int_equal(e.error.code, CDDP_EPEER);
    proto_msg_free(&e);
}

static void test_base64(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } v[] = {{"", ""},
             {"f", "Zg=="},
             {"fo", "Zm8="},
             {"foo", "Zm9v"},
             {"foob", "Zm9vYg=="},
             {"fooba", "Zm9vYmE="},
             {"foobar", "Zm9vYmFy"}};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char enc[16], dec[16];
        proto_base64_encode(v[i].in, strlen(v[i].in), enc);
        assert_string_equal(enc, v[i].out);
        long n = proto_base64_decode(enc, strlen(enc), dec, sizeof(dec));
        assert_int_equal(n, (long)strlen(v[i].in));
        assert_memory_equal(dec, v[i].in, (size_t)n);
    }
    char d[8];
    assert_int_equal(proto_base64_decode("Zg=", 3, d, 8), CDDP_EPARSE);
    assert_int_equal(proto_base64_decode("Zh==", 4, d, 8), CDDP_EPARSE); /* non-zero pad bits */
    assert_int_equal(proto_base64_decode("Z=g=", 4, d, 8), CDDP_EPARSE);
    assert_int_equal(proto_base64_decode("Zg==Zg==", 8, d, 8), CDDP_EPARSE);
    assert_int_equal(proto_base64_decode("Zm9vYmFy", 8, d, 5), CDDP_ETOOBIG);
}

static void test_error_names(void **state)
{
    (void)state;
    assert_string_equal(proto_error_name(CDDP_ETIMEOUT), "ETIMEOUT");
    assert_int_equal(proto_error_code("ETIMEOUT"), CDDP_ETIMEOUT);
    assert_int_equal(proto_error_code("ECONNREFUSED"), -ECONNREFUSED);
    assert_int_equal(proto_error_code("OK"), 0);
    assert_int_equal(proto_error_code("nonsense"), CDDP_EPEER);
#define XX(name, num, msg) assert_int_equal(proto_error_code(proto_error_name(num)), num);
    CDDP_ERRORS(XX)
#undef XX
}

/* A heartbeat's goodput: read back as sent; a bad one is dropped, not the
 * heartbeat, and the reason is kept. */
static void test_msg_goodput(void **state)
{
    (void)state;
    struct proto_msg m = {.type = PROTO_HEARTBEAT}, o;
    m.heartbeat.has_goodput = true;
    m.heartbeat.goodput =
        (struct proto_goodput){.s = {1.5, 100.25, 3, 4.5, 2, 0}, .lost_steps = 12, .step = 345};
    roundtrip(&m, &o);
    assert_true(o.heartbeat.has_goodput);
    assert_string_equal(o.heartbeat.goodput_error, "");
    for (int i = 0; i < PROTO_GOODPUT_PHASES; i++)
        assert_true(o.heartbeat.goodput.s[i] == m.heartbeat.goodput.s[i]);
    assert_int_equal(o.heartbeat.goodput.lost_steps, 12);
    assert_int_equal(o.heartbeat.goodput.step, 345);
    proto_msg_free(&o);
    /* Not sent: absent; the encoder refuses what it would not read. */
    m.heartbeat.has_goodput = false;
    roundtrip(&m, &o);
    assert_false(o.heartbeat.has_goodput);
    proto_msg_free(&o);
    m.heartbeat.has_goodput = true;
    m.heartbeat.goodput.s[1] = -1;
    struct cddp_buf b;
    cddp_buf_init(&b, 4096);
    assert_int_equal(proto_msg_encode(&m, &b), CDDP_EPROTO_FIELD);
    cddp_buf_free(&b);
    assert_string_equal(proto_goodput_phase_name(1), "productive");
    assert_string_equal(proto_goodput_phase_name(6), "?");

    const char *good[] = {
        "{}", /* every phase 0, no step */
        "{\"productive_s\":5,\"step\":-1,\"unknown\":\"x\"}",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char json[512], err[256];
        snprintf(json, sizeof(json), "{\"v\":1,\"type\":\"heartbeat\",\"goodput\":%s}", good[i]);
        assert_int_equal(proto_msg_decode(json, strlen(json), &o, err, sizeof(err)), 0);
        assert_true(o.heartbeat.has_goodput);
        assert_int_equal(o.heartbeat.goodput.s[0], 0);
        proto_msg_free(&o);
    }
    const char *bad[] = {
        "[]",
        "\"x\"",
        "7",
        "{\"productive_s\":-1}",
        "{\"productive_s\":\"5\"}",
        "{\"init_s\":1e300}",
        "{\"lost_s\":true}",
        "{\"lost_steps\":-1}",
        "{\"lost_steps\":1.5}",
        "{\"lost_steps\":1e30}",
        "{\"step\":-2}",
        "{\"step\":{}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char json[512], err[256];
        snprintf(json, sizeof(json),
                 "{\"v\":1,\"type\":\"heartbeat\",\"waiting\":2,\"goodput\":%s}", bad[i]);
        if (proto_msg_decode(json, strlen(json), &o, err, sizeof(err)) != 0)
            fail_msg("the heartbeat was refused: %s (%s)", json, err);
        if (o.heartbeat.has_goodput)
            fail_msg("accepted: %s", json);
        assert_non_null(strstr(o.heartbeat.goodput_error, "goodput"));
        assert_int_equal(o.heartbeat.waiting, 2); /* the rest of it is read */
        proto_msg_free(&o);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msg_goodput),           cmocka_unit_test(test_frame_split),
        cmocka_unit_test(test_frame_oversized),       cmocka_unit_test(test_msg_roundtrip),
        cmocka_unit_test(test_msg_conf_keys_escaped), cmocka_unit_test(test_msg_encode_refuses),
        cmocka_unit_test(test_msg_decode_errors),     cmocka_unit_test(test_base64),
        cmocka_unit_test(test_error_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
