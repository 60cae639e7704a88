/*
 * test_etcd_round.c: rendezvous/etcd_round.c, the etcd-v3 rendezvous's round
 * state (pure): its transitions, its JSON form, the join requests and their
 * folding.
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

static const struct etcd_round_conf CONF = {.last_call_timeout_ms = 1000};

static void join(struct etcd_round *r, uint64_t now, const char *id, int nproc)
{
    struct etcd_join j = {.id = id, .nproc = nproc, .addr = id, .port = 1000 + (int)strlen(id)};
    etcd_round_join(r, &CONF, now, &j);
}

static int rank_of(const struct etcd_round *r, const char *id)
{
    struct proto_round pr;
    if (etcd_round_place(r, "job", id, &pr) != 0)
        return -1;
    return pr.node_rank;
}

/* Encodes and decodes: every step of the tests goes through JSON, as the
 * agents' writes do. */
static void roundtrip(struct etcd_round *r)
{
    char *s = etcd_round_encode(r);
    assert_non_null(s);
    struct etcd_round back;
    char err[128];
    assert_int_equal(etcd_round_decode(s, strlen(s), &back, err, sizeof(err)), 0);
    char *again = etcd_round_encode(&back);
    assert_string_equal(s, again);
    free(s);
    free(again);
    etcd_round_free(r);
    *r = back;
}

static void test_round_forms(void **state)
{
    (void)state;
    struct etcd_round r;
    etcd_round_init(&r, 2, 3);
    join(&r, 0, "b", 2);
    roundtrip(&r);
    assert_int_equal(r.phase, ETCD_FORMING);
    assert_int_equal(r.last_call_at, 0);
    join(&r, 100, "a", 1);
    roundtrip(&r);
    /* min reached: last call armed, not complete yet */
    assert_int_equal(r.phase, ETCD_FORMING);
    assert_int_equal(r.last_call_at, 1100);
    assert_false(etcd_round_tick(&r, &CONF, 1099));
    assert_true(etcd_round_tick(&r, &CONF, 1100));
    roundtrip(&r);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(r.round, 1);
    /* newcomers by node id */
    assert_int_equal(rank_of(&r, "a"), 0);
    assert_int_equal(rank_of(&r, "b"), 1);
    struct proto_round pr;
    assert_int_equal(etcd_round_place(&r, "job", "b", &pr), 0);
    assert_int_equal(pr.nnodes, 2);
    assert_int_equal(pr.world_size, 3);
    assert_int_equal(pr.rank_offset, 1);
    assert_string_equal(pr.master_addr, "a");
    assert_int_equal(pr.master_port, 1001);
    assert_int_equal(etcd_round_place(&r, "job", "zz", &pr), CDDP_ENOTFOUND);
    etcd_round_free(&r);

    /* max nodes completes at once */
    etcd_round_init(&r, 1, 2);
    join(&r, 0, "x", 1);
    join(&r, 0, "y", 1);
    assert_int_equal(r.phase, ETCD_RUNNING);
    etcd_round_free(&r);
}

static void test_round_lost_node(void **state)
{
    (void)state;
    struct etcd_round r;
    etcd_round_init(&r, 1, 3);
    join(&r, 0, "a", 1);
    join(&r, 0, "b", 1);
    join(&r, 0, "c", 1);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(rank_of(&r, "c"), 2);
    /* b's lease expired: a new round, not counted */
    assert_true(etcd_round_lose(&r, &CONF, 10, "b", "node_lost", false));
    roundtrip(&r);
    assert_int_equal(r.round, 2);
    assert_int_equal(r.phase, ETCD_FORMING);
    assert_string_equal(r.reason, "node_lost");
    assert_string_equal(r.node, "b");
    assert_false(r.counted);
    assert_int_equal(r.restart_count, 0);
    /* losing it again changes nothing */
    assert_false(etcd_round_lose(&r, &CONF, 10, "b", "node_lost", false));
    /* the survivors rejoin: complete as soon as both are back, no last call */
    join(&r, 20, "c", 1);
    assert_int_equal(r.phase, ETCD_FORMING);
    join(&r, 30, "a", 1);
    assert_int_equal(r.phase, ETCD_RUNNING);
    /* ranks stay where they can: a 0, c moves down to 1 */
    assert_int_equal(rank_of(&r, "a"), 0);
    assert_int_equal(rank_of(&r, "c"), 1);
    /* a survivor that never comes back: last call ends the wait */
    etcd_round_lose(&r, &CONF, 40, "a", "node_lost", false);
    assert_int_equal(r.round, 3);
    join(&r, 50, "c", 1);
    assert_int_equal(r.phase, ETCD_RUNNING); /* a was removed: nobody else expected */
    etcd_round_free(&r);
}

static bool not_dead(void *arg, const char *id)
{
    (void)arg;
    return strcmp(id, "dead") != 0;
}

static void test_round_prune(void **state)
{
    (void)state;
    struct etcd_round r;
    etcd_round_init(&r, 2, 4);
    join(&r, 0, "a", 1);
    join(&r, 0, "dead", 1);
    assert_int_equal(r.last_call_at, 1000);
    struct etcd_round copy;
    assert_int_equal(etcd_round_copy(&copy, &r), 0);
    /* a node whose lease went before anyone watched it: pruned on join */
    assert_true(etcd_round_prune(&copy, &CONF, 5, not_dead, NULL));
    assert_int_equal(copy.nmembers, 1);
    assert_int_equal(copy.last_call_at, 0); /* below min again: disarmed */
    assert_false(etcd_round_prune(&copy, &CONF, 5, not_dead, NULL));
    assert_int_equal(r.nmembers, 2); /* the copy is deep */
    etcd_round_free(&copy);
    /* in a running round, a dead member restarts it */
    join(&r, 0, "b", 1);
    join(&r, 0, "c", 1);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_true(etcd_round_prune(&r, &CONF, 6, not_dead, NULL));
    assert_int_equal(r.round, 2);
    assert_int_equal(r.nmembers, 3);
    etcd_round_free(&r);
}

static void test_round_scale_and_wait(void **state)
{
    (void)state;
    struct etcd_round r;
    etcd_round_init(&r, 1, 2);
    join(&r, 0, "a", 1);
    etcd_round_tick(&r, &CONF, 2000);
    assert_int_equal(r.phase, ETCD_RUNNING);
    /* a late node below max: everyone restarts (not counted) to take it */
    join(&r, 3000, "b", 1);
    assert_int_equal(r.round, 2);
    assert_string_equal(r.reason, "node_joined");
    assert_false(r.counted);
    join(&r, 3010, "a", 1);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(rank_of(&r, "a"), 0);
    assert_int_equal(rank_of(&r, "b"), 1);
    /* at max, a third waits; the round goes on */
    join(&r, 4000, "c", 1);
    roundtrip(&r);
    assert_int_equal(r.round, 2);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(etcd_round_find(&r, "c")->state, ETCD_M_WAITING);
    assert_int_equal(rank_of(&r, "c"), -1);
    assert_false(etcd_round_tick(&r, &CONF, 99999));
    /* b is lost: c takes its place in the next round */
    etcd_round_lose(&r, &CONF, 5000, "b", "node_lost", false);
    assert_int_equal(r.round, 3);
    join(&r, 5010, "a", 1);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(rank_of(&r, "a"), 0);
    assert_int_equal(rank_of(&r, "c"), 1);
    etcd_round_free(&r);
}

static void test_round_failure_leave_close(void **state)
{
    (void)state;
    struct etcd_round r;
    etcd_round_init(&r, 2, 2);
    join(&r, 0, "a", 2);
    join(&r, 0, "b", 2);
    assert_int_equal(r.round, 1);
    /* a failure report about another round, or from a stranger: ignored */
    assert_false(etcd_round_failure(&r, &CONF, 1, "a", 7));
    assert_false(etcd_round_failure(&r, &CONF, 1, "zz", 1));
    assert_true(etcd_round_failure(&r, &CONF, 1, "a", 1));
    assert_int_equal(r.round, 2);
    assert_true(r.counted);
    assert_int_equal(r.restart_count, 1);
    assert_string_equal(r.reason, "worker_failure");
    join(&r, 2, "a", 2);
    join(&r, 2, "b", 2);
    struct proto_round pr;
    assert_int_equal(etcd_round_place(&r, "job", "b", &pr), 0);
    assert_int_equal(pr.restart_count, 1);
    /* a node that finished leaves the other undisturbed */
    assert_true(etcd_round_lose(&r, &CONF, 3, "a", "node_left", true));
    assert_int_equal(r.round, 2);
    assert_int_equal(r.phase, ETCD_RUNNING);
    /* closing: once; joins refused after it */
    assert_true(etcd_round_close(&r, "the job finished"));
    assert_false(etcd_round_close(&r, "again"));
    roundtrip(&r);
    assert_int_equal(r.phase, ETCD_CLOSED);
    assert_string_equal(r.closed_reason, "the job finished");
    struct etcd_join j = {.id = "late", .nproc = 1, .addr = "", .port = 1};
    assert_false(etcd_round_join(&r, &CONF, 4, &j));
    assert_int_equal(etcd_round_place(&r, "job", "b", &pr), CDDP_ESTATE);
    etcd_round_free(&r);
}

static void join_gens(struct etcd_round *r, uint64_t now, const char *id, int nproc, bool gens)
{
    struct etcd_join j = {
        .id = id, .nproc = nproc, .addr = id, .port = 1000 + (int)strlen(id), .gens = gens};
    etcd_round_join(r, &CONF, now, &j);
}

/* --restart_scope=worker: a member restarts one of its ranks alone; the
 * round goes on in place in its next generation, as the server's
 * `replace` decides (rendezvous/state.c). */
static void test_round_replace(void **state)
{
    (void)state;
    struct etcd_round r;
    char why[256];
    etcd_round_init(&r, 2, 2);
    join_gens(&r, 0, "a", 2, true);
    /* not running yet */
    assert_int_equal(etcd_round_replace(&r, 1, "a", 1, 0, NULL, why, sizeof(why)), CDDP_ESTATE);
    assert_non_null(strstr(why, "not the one running"));
    join_gens(&r, 0, "b", 2, true);
    roundtrip(&r);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(r.generation, 0);
    assert_int_equal(r.gen_rank, -1);
    assert_true(r.members[0].gens && r.members[1].gens);
    /* b holds ranks 2..3 */
    assert_int_equal(etcd_round_replace(&r, 10, "b", 7, 3, NULL, why, sizeof(why)), CDDP_ESTATE);
    assert_int_equal(etcd_round_replace(&r, 10, "zz", 1, 3, NULL, why, sizeof(why)), CDDP_ESTATE);
    assert_non_null(strstr(why, "not a member"));
    assert_int_equal(etcd_round_replace(&r, 10, "b", 1, 1, NULL, why, sizeof(why)), CDDP_ESTATE);
    assert_string_equal(why, "rank 1 is not one of this node's (2..3)");
    assert_int_equal(r.generation, 0);
    assert_int_equal(r.restart_count, 0);
    /* granted: the next generation, one of the job's counted restarts,
     * the round and its members as they were */
    assert_int_equal(etcd_round_replace(&r, 10, "b", 1, 3, NULL, why, sizeof(why)), 0);
    roundtrip(&r);
    assert_int_equal(r.round, 1);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(r.generation, 1);
    assert_int_equal(r.generation_at, 10);
    assert_int_equal(r.gen_rank, 3);
    assert_string_equal(r.gen_node, "b");
    assert_int_equal(r.restart_count, 1);
    assert_int_equal(rank_of(&r, "b"), 1);
    struct proto_round pr;
    assert_int_equal(etcd_round_place(&r, "job", "a", &pr), 0);
    assert_int_equal(pr.restart_count, 1);
    /* a second failure within the settle window: refused (the group
     * restarts); after it, granted */
    assert_int_equal(
        etcd_round_replace(&r, 10 + ETCD_ROUND_SETTLE_MS - 1, "a", 1, 0, NULL, why, sizeof(why)),
        CDDP_ESTATE);
    assert_non_null(strstr(why, "generation 1 was granted 999 ms ago"));
    assert_int_equal(
        etcd_round_replace(&r, 10 + ETCD_ROUND_SETTLE_MS, "a", 1, 0, NULL, why, sizeof(why)), 0);
    assert_int_equal(r.generation, 2);
    assert_int_equal(r.gen_rank, 0);
    assert_int_equal(r.restart_count, 2);
    /* a new round starts at generation 0 */
    assert_true(etcd_round_failure(&r, &CONF, 5000, "a", 1));
    join_gens(&r, 5001, "a", 2, true);
    join_gens(&r, 5001, "b", 2, true);
    roundtrip(&r);
    assert_int_equal(r.round, 2);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_int_equal(r.generation, 0);
    assert_int_equal(r.generation_at, 0);
    assert_int_equal(r.gen_rank, -1);
    assert_int_equal(r.restart_count, 3);
    /* a member whose agent cannot number generations (an older one) */
    etcd_round_free(&r);
    etcd_round_init(&r, 2, 2);
    join_gens(&r, 0, "a", 1, true);
    join_gens(&r, 0, "old", 1, false);
    roundtrip(&r);
    assert_int_equal(etcd_round_replace(&r, 10, "a", 1, 0, NULL, why, sizeof(why)), CDDP_ESTATE);
    assert_string_equal(why, "node old's agent is older and cannot number generations");
    etcd_round_free(&r);
    /* a state an older agent wrote (no generation fields) reads as
     * generation 0, no grant, its members not marked old */
    const char *old = "{\"v\":1,\"round\":4,\"phase\":\"running\",\"restart_count\":2,\"min\":1,"
                      "\"max\":1,\"last_call_at\":0,\"fast\":false,\"reason\":\"\",\"node\":\"\","
                      "\"counted\":false,\"closed_reason\":\"\",\"members\":[{\"id\":\"a\","
                      "\"s\":2,\"nproc\":1,\"addr\":\"h\",\"port\":1,\"rank\":0}]}";
    assert_int_equal(etcd_round_decode(old, strlen(old), &r, why, sizeof(why)), 0);
    assert_int_equal(r.generation, 0);
    assert_int_equal(r.generation_at, 0);
    assert_int_equal(r.gen_rank, -1);
    assert_string_equal(r.gen_node, "");
    assert_true(r.members[0].gens);
    etcd_round_free(&r);
    /* and bad generation fields are refused */
    const char *bad = "{\"v\":1,\"round\":4,\"phase\":\"running\",\"restart_count\":2,\"min\":1,"
                      "\"max\":1,\"last_call_at\":0,\"fast\":false,\"reason\":\"\",\"node\":\"\","
                      "\"counted\":false,\"closed_reason\":\"\",\"gen\":-1,\"members\":[]}";
    assert_int_equal(etcd_round_decode(bad, strlen(bad), &r, why, sizeof(why)), CDDP_EPARSE);
    assert_non_null(strstr(why, "'gen'"));
}

static void test_round_decode_refuses(void **state)
{
    (void)state;
    const char *bad[] = {
        "",
        "[]",
        "{\"v\":2}",
        "{\"v\":1,\"round\":0}",
        "{\"v\":1,\"round\":1,\"phase\":\"dancing\",\"restart_count\":0,\"min\":1,\"max\":1,"
        "\"last_call_at\":0,\"fast\":false,\"reason\":\"\",\"node\":\"\",\"counted\":false,"
        "\"closed_reason\":\"\",\"members\":[]}",
        "{\"v\":1,\"round\":1,\"phase\":\"forming\",\"restart_count\":0,\"min\":3,\"max\":1,"
        "\"last_call_at\":0,\"fast\":false,\"reason\":\"\",\"node\":\"\",\"counted\":false,"
        "\"closed_reason\":\"\",\"members\":[]}",
        "{\"v\":1,\"round\":1,\"phase\":\"forming\",\"restart_count\":0,\"min\":1,\"max\":1,"
        "\"last_call_at\":0,\"fast\":false,\"reason\":\"\",\"node\":\"\",\"counted\":false,"
        "\"closed_reason\":\"\",\"members\":[{\"id\":\"\",\"s\":0,\"nproc\":1,\"addr\":\"\","
        "\"port\":1,\"rank\":0}]}",
        "{\"v\":1,\"round\":1,\"phase\":\"forming\",\"restart_count\":0,\"min\":1,\"max\":1,"
        "\"last_call_at\":0,\"fast\":false,\"reason\":\"\",\"node\":\"\",\"counted\":false,"
        "\"closed_reason\":\"\",\"members\":[{\"id\":\"a\",\"s\":9,\"nproc\":1,\"addr\":\"\","
        "\"port\":1,\"rank\":0}]}",
        "{\"v\":1,\"round\":1,\"phase\":\"forming\",\"restart_count\":0,\"min\":1,\"max\":1,"
        "\"last_call_at\":0,\"fast\":false,\"reason\":\"\",\"node\":\"\",\"counted\":false,"
        "\"closed_reason\":\"\",\"members\":[{\"id\":\"a\",\"s\":0,\"nproc\":1,\"addr\":\"\","
        "\"port\":70000,\"rank\":0}]}",
        "{\"v\":1,\"members\":[[[[[[[[]]]]]]]]}",
    };
    char err[256];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct etcd_round r;
        err[0] = '\0';
        if (etcd_round_decode(bad[i], strlen(bad[i]), &r, err, sizeof(err)) == 0)
            fail_msg("accepted: %s", bad[i]);
        assert_true(err[0] != '\0');
        assert_null(r.members);
    }
}

/* Several ranks of one node together (replace's ranks): granted as one
 * generation and one counted restart when every active member's agent
 * can (its join said "r"; the state's "rr" says all can); the list
 * checked as the server checks it; an older agent's state reads as none
 * can. */
static void test_round_replace_ranks(void **state)
{
    (void)state;
    struct etcd_round r;
    char why[256];
    etcd_round_init(&r, 2, 2);
    for (int i = 0; i < 2; i++) {
        struct etcd_join j = {
            .id = i ? "b" : "a", .nproc = 2, .addr = "h", .port = 1, .gens = true, .ranks = true};
        etcd_round_join(&r, &CONF, 0, &j);
    }
    char *s = etcd_round_encode(&r);
    assert_non_null(strstr(s, "\"rr\":true"));
    assert_null(strstr(s, "gen_ranks"));
    free(s);
    roundtrip(&r);
    assert_int_equal(r.phase, ETCD_RUNNING);
    assert_true(r.members[0].ranks && r.members[1].ranks);
    /* b holds ranks 2..3 */
    assert_int_equal(etcd_round_replace(&r, 10, "b", 1, 2, "2,4", why, sizeof(why)), CDDP_ESTATE);
    assert_string_equal(why, "rank 4 is not one of this node's (2..3)");
    assert_int_equal(etcd_round_replace(&r, 10, "b", 1, 3, "2,3", why, sizeof(why)), CDDP_ESTATE);
    assert_string_equal(why, "ranks '2,3' does not begin with rank 3");
    assert_int_equal(etcd_round_replace(&r, 10, "b", 1, 2, "2,x", why, sizeof(why)), CDDP_ESTATE);
    assert_string_equal(why, "ranks '2,x' is not a list of decimal ranks");
    assert_int_equal(r.generation, 0);
    assert_int_equal(etcd_round_replace(&r, 10, "b", 1, 2, "2,3", why, sizeof(why)), 0);
    roundtrip(&r);
    assert_int_equal(r.generation, 1);
    assert_int_equal(r.gen_rank, 2);
    assert_string_equal(r.gen_ranks, "2,3");
    assert_int_equal(r.restart_count, 1); /* one, for both */
    /* a lone rank's grant after it says one rank again */
    assert_int_equal(
        etcd_round_replace(&r, 10 + ETCD_ROUND_SETTLE_MS, "a", 1, 1, NULL, why, sizeof(why)), 0);
    roundtrip(&r);
    assert_int_equal(r.gen_rank, 1);
    assert_string_equal(r.gen_ranks, "");
    etcd_round_free(&r);
    /* a member whose agent cannot: refused for several, granted for one */
    etcd_round_init(&r, 2, 2);
    struct etcd_join a = {
        .id = "a", .nproc = 2, .addr = "h", .port = 1, .gens = true, .ranks = true};
    struct etcd_join old = {.id = "old", .nproc = 2, .addr = "h", .port = 1, .gens = true};
    etcd_round_join(&r, &CONF, 0, &a);
    etcd_round_join(&r, &CONF, 0, &old);
    s = etcd_round_encode(&r);
    assert_null(strstr(s, "\"rr\""));
    free(s);
    roundtrip(&r);
    assert_int_equal(etcd_round_replace(&r, 10, "a", 1, 0, "0,1", why, sizeof(why)), CDDP_ESTATE);
    assert_string_equal(
        why, "not every member's agent can replace several ranks together (an older one)");
    assert_int_equal(etcd_round_replace(&r, 10, "a", 1, 0, NULL, why, sizeof(why)), 0);
    etcd_round_free(&r);
}

static void test_join_request(void **state)
{
    (void)state;
    struct etcd_join j = {.id = "n1", .nproc = 8, .addr = "h1.example", .port = 29500};
    char *s = etcd_round_request_encode(&j);
    assert_non_null(s);
    struct etcd_request q;
    char err[256];
    assert_int_equal(etcd_round_request_decode(s, strlen(s), &q, err, sizeof(err)), 0);
    free(s);
    assert_int_equal(q.nproc, 8);
    assert_int_equal(q.port, 29500);
    assert_string_equal(q.addr, "h1.example");
    assert_false(q.gens);
    j.gens = true;
    s = etcd_round_request_encode(&j);
    assert_non_null(s);
    assert_int_equal(etcd_round_request_decode(s, strlen(s), &q, err, sizeof(err)), 0);
    free(s);
    assert_true(q.gens);
    assert_false(q.ranks);
    j.ranks = true;
    s = etcd_round_request_encode(&j);
    assert_int_equal(etcd_round_request_decode(s, strlen(s), &q, err, sizeof(err)), 0);
    free(s);
    assert_true(q.gens && q.ranks);
    const char *bad[] = {"",
                         "[]",
                         "{\"nproc\":8,\"addr\":\"h\"}",
                         "{\"nproc\":0,\"addr\":\"h\",\"port\":1}",
                         "{\"nproc\":1,\"addr\":\"\",\"port\":1}",
                         "{\"nproc\":1,\"addr\":\"h\",\"port\":70000}",
                         "{\"nproc\":1.5,\"addr\":\"h\",\"port\":1}",
                         "{\"nproc\":1,\"addr\":\"h\",\"port\":1,\"g\":1}",
                         "{\"nproc\":"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(etcd_round_request_decode(bad[i], strlen(bad[i]), &q, err, sizeof(err)),
                         CDDP_EPARSE);
        assert_true(err[0] != '\0');
        assert_int_equal(q.nproc, 0);
    }
}

/* Folding a batch of requests decides as the joins one by one would. */
static void test_round_fold(void **state)
{
    (void)state;
    struct etcd_round a, b;
    etcd_round_init(&a, 3, 3);
    etcd_round_init(&b, 3, 3);
    struct etcd_join j[3] = {{.id = "c", .nproc = 1, .addr = "c", .port = 3},
                             {.id = "a", .nproc = 2, .addr = "a", .port = 1},
                             {.id = "b", .nproc = 1, .addr = "b", .port = 2}};
    assert_true(etcd_round_fold(&a, &CONF, 5, j, 2));
    assert_int_equal(a.phase, ETCD_FORMING);
    assert_true(etcd_round_fold(&a, &CONF, 6, j + 2, 1));
    for (int i = 0; i < 3; i++)
        etcd_round_join(&b, &CONF, i < 2 ? 5 : 6, &j[i]);
    assert_int_equal(a.phase, ETCD_RUNNING);
    char *ea = etcd_round_encode(&a), *eb = etcd_round_encode(&b);
    assert_string_equal(ea, eb);
    free(ea);
    free(eb);
    assert_int_equal(rank_of(&a, "a"), 0);
    assert_false(etcd_round_fold(&a, &CONF, 7, j, 0));
    etcd_round_close(&a, "done");
    assert_false(etcd_round_fold(&a, &CONF, 8, j, 3)); /* closed: nothing */
    etcd_round_free(&a);
    etcd_round_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_forms),
        cmocka_unit_test(test_round_lost_node),
        cmocka_unit_test(test_round_prune),
        cmocka_unit_test(test_round_scale_and_wait),
        cmocka_unit_test(test_round_failure_leave_close),
        cmocka_unit_test(test_round_replace),
        cmocka_unit_test(test_round_replace_ranks),
        cmocka_unit_test(test_round_decode_refuses),
        cmocka_unit_test(test_join_request),
        cmocka_unit_test(test_round_fold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
