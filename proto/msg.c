/* msg.c: see msg.h. Decoding is in three steps: a linear pre-scan that
 * bounds what cJSON will be asked to build, cJSON itself, then per-type
 * field extraction that checks presence, type and range of every field. */
#include "proto/msg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/jsonw.h"
#include "common/utf8.h"
#include "proto/frame.h"

/* The longest JSON string the pre-scan lets through: a base64 store value. */
#define PROTO_MAX_STRING ((PROTO_MAX_VALUE + 2) / 3 * 4)

static const char *const type_names[PROTO_TYPE_COUNT] = {[PROTO_NONE] = "?",
#define XX(name, str) [PROTO_##name] = str,
                                                         PROTO_TYPES(XX)
#undef XX
};

const char *proto_type_name(enum proto_type t)
{
    if ((int)t <= 0 || t >= PROTO_TYPE_COUNT)
        return "?";
    return type_names[t];
}

static enum proto_type type_from_name(const char *s)
{
    for (int t = 1; t < PROTO_TYPE_COUNT; t++) {
        if (strcmp(type_names[t], s) == 0)
            return (enum proto_type)t;
    }
    return PROTO_NONE;
}

/* ---- decoding ---- */

struct blob {
    struct blob *next;
    max_align_t align[];
};

static void *msg_alloc(struct proto_msg *m, size_t n)
{
    struct blob *b = malloc(sizeof(*b) + (n ? n : 1));
    if (b == NULL)
        return NULL;
    b->next = m->mem;
    m->mem = b;
    return b->align;
}

void proto_msg_free(struct proto_msg *m)
{
    cJSON_Delete(m->json);
    m->json = NULL;
    struct blob *b = m->mem;
    while (b) {
        struct blob *next = b->next;
        free(b);
        b = next;
    }
    m->mem = NULL;
}

/* Bounds depth, value count and string lengths in one pass, before any
 * allocation; also refuses NUL bytes and \u0000 escapes, which C strings
 * cannot carry (a key would silently change meaning). */
static int prescan(const char *p, size_t n, char *err, size_t errlen)
{
    size_t depth = 0, values = 0, slen = 0;
    bool in_str = false;
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    if (i == n)
        return cddp_fail(err, errlen, CDDP_EPARSE, "empty payload (expected a JSON object)");
    if (p[i] != '{')
        return cddp_fail(err, errlen, CDDP_EPARSE, "payload is not a JSON object");
    for (; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\0')
            return cddp_fail(err, errlen, CDDP_EPARSE, "NUL byte at offset %zu", i);
        if (in_str) {
            if (++slen > PROTO_MAX_STRING)
                return cddp_fail(err, errlen, CDDP_ETOOBIG, "a string is longer than %u bytes",
                                 (unsigned)PROTO_MAX_STRING);
            if (c == '\\') {
                if (i + 5 < n && p[i + 1] == 'u' && memcmp(p + i + 2, "0000", 4) == 0)
                    return cddp_fail(err, errlen, CDDP_EPARSE, "\\u0000 in a string");
                i++;
            } else if (c == '"') {
                in_str = false;
            } else if (c < 0x20) {
                /* JSON forbids raw control characters in strings; cJSON would
                 * take them, and our encoder would then write them escaped. */
                return cddp_fail(err, errlen, CDDP_EPARSE,
                                 "control character 0x%02x in a string at "
                                 "offset %zu",
                                 c, i);
            } else if (c >= 0x80) {
                /* Strings are UTF-8: a peer cannot make us store (and later
                 * echo) bytes that are not. Check the length the lead byte
                 * announces fits before reading the continuation bytes. */
                size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
                unsigned char seq[5] = {0};
                size_t len = 0;
                if (i + want <= n) {
                    memcpy(seq, p + i, want);
                    len = cddp_utf8_len(seq);
                }
                if (len == 0)
                    return cddp_fail(err, errlen, CDDP_EPARSE,
                                     "invalid UTF-8 in a string at offset %zu", i);
                i += len - 1;
                slen += len - 1;
            }
            continue;
        }
        switch (c) {
        case '"':
            in_str = true;
            slen = 0;
            values++;
            break;
        case '{':
        case '[':
            if (++depth > PROTO_MAX_DEPTH)
                return cddp_fail(err, errlen, CDDP_ETOOBIG, "JSON nested deeper than %d levels",
                                 PROTO_MAX_DEPTH);
            values++;
            break;
        case '}':
        case ']':
            if (depth > 0)
                depth--;
            break;
        case ',':
        case ':':
            values++;
            break;
        default:
            break;
        }
        if (values > PROTO_MAX_VALUES)
            return cddp_fail(err, errlen, CDDP_ETOOBIG, "more than %d JSON values",
                             PROTO_MAX_VALUES);
    }
    return 0;
}

struct dec {
    const cJSON *obj;
    const char *type;
    struct proto_msg *m;
    char *err;
    size_t errlen;
};

static int bad_field(struct dec *d, const char *name, const char *what)
{
    return cddp_fail(d->err, d->errlen, CDDP_EPROTO_FIELD, "'%s' message: field '%s' %s", d->type,
                     name, what);
}

static const cJSON *field(struct dec *d, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(d->obj, name);
}

enum str_kind { STR_TEXT, STR_ID };

/* A string field of at most max bytes. STR_ID: printable ASCII, no spaces. */
static int get_str(struct dec *d, const char *name, bool required, size_t max, enum str_kind kind,
                   const char **out)
{
    const cJSON *it = field(d, name);
    *out = NULL;
    if (it == NULL || cJSON_IsNull(it)) {
        if (required)
            return bad_field(d, name, "is missing");
        return 0;
    }
    if (!cJSON_IsString(it) || it->valuestring == NULL)
        return bad_field(d, name, "must be a string");
    size_t len = strlen(it->valuestring);
    if (len > max) {
        char what[64];
        snprintf(what, sizeof(what), "is longer than %zu bytes", max);
        return bad_field(d, name, what);
    }
    if (kind == STR_ID) {
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)it->valuestring[i];
            if (c <= 0x20 || c >= 0x7f)
                return bad_field(d, name, "must be printable ASCII without spaces");
        }
    }
    *out = it->valuestring;
    return 0;
}

static int get_int(struct dec *d, const char *name, bool required, int64_t min, int64_t max,
                   int64_t dflt, int64_t *out)
{
    const cJSON *it = field(d, name);
    *out = dflt;
    if (it == NULL || cJSON_IsNull(it)) {
        if (required)
            return bad_field(d, name, "is missing");
        return 0;
    }
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v) || floor(v) != v || v < (double)min ||
        v > (double)max) {
        char what[96];
        snprintf(what, sizeof(what), "must be an integer in %lld..%lld", (long long)min,
                 (long long)max);
        return bad_field(d, name, what);
    }
    *out = (int64_t)v;
    return 0;
}

static int get_small(struct dec *d, const char *name, bool required, int min, int max, int dflt,
                     int *out)
{
    int64_t v;
    int rc = get_int(d, name, required, min, max, dflt, &v);
    *out = (int)v;
    return rc;
}

/* A finite number in [min, max] (optional: dflt when absent). */
static int get_num(struct dec *d, const char *name, bool required, double min, double max,
                   double dflt, double *out)
{
    const cJSON *it = field(d, name);
    *out = dflt;
    if (it == NULL || cJSON_IsNull(it)) {
        if (required)
            return bad_field(d, name, "is missing");
        return 0;
    }
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v) || v < min || v > max) {
        char what[96];
        snprintf(what, sizeof(what), "must be a number in %g..%g", min, max);
        return bad_field(d, name, what);
    }
    *out = v;
    return 0;
}

static int get_bool(struct dec *d, const char *name, bool *out)
{
    const cJSON *it = field(d, name);
    *out = false;
    if (it == NULL || cJSON_IsNull(it))
        return 0;
    if (!cJSON_IsBool(it))
        return bad_field(d, name, "must be true or false");
    *out = cJSON_IsTrue(it);
    return 0;
}

static int get_bytes(struct dec *d, const char *name, bool required, struct proto_bytes *out,
                     bool *present)
{
    const char *s;
    out->data = NULL;
    out->len = 0;
    if (present)
        *present = false;
    int rc = get_str(d, name, required, PROTO_MAX_STRING, STR_TEXT, &s);
    if (rc || s == NULL)
        return rc;
    size_t n = strlen(s);
    size_t cap = n / 4 * 3;
    char *buf = msg_alloc(d->m, cap + 1);
    if (buf == NULL)
        return cddp_fail(d->err, d->errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory");
    long got = proto_base64_decode(s, n, buf, cap);
    if (got < 0)
        return bad_field(d, name, "is not canonical base64");
    if ((size_t)got > PROTO_MAX_VALUE)
        return bad_field(d, name, "decodes to more than 512 KiB");
    buf[got] = '\0';
    out->data = buf;
    out->len = (size_t)got;
    if (present)
        *present = true;
    return 0;
}

static int get_key(struct dec *d, const char **out)
{
    int rc = get_str(d, "key", true, PROTO_MAX_KEY, STR_TEXT, out);
    if (rc == 0 && (*out)[0] == '\0')
        return bad_field(d, "key", "must not be empty");
    return rc;
}

static int get_timeout(struct dec *d, int64_t *out)
{
    return get_int(d, "timeout_ms", false, 0, PROTO_MAX_TIMEOUT_MS, -1, out);
}

static int get_id(struct dec *d)
{
    int64_t id;
    int rc = get_int(d, "id", true, 0, PROTO_MAX_INT, 0, &id);
    d->m->id = (uint64_t)id;
    return rc;
}

/* The fields of a join, from d->obj (a join message, or a resume's "join"). */
static int decode_join_into(struct dec *d, struct proto_join *j)
{
    struct proto_msg *m = d->m;
    int rc;
    if ((rc = get_str(d, "node_id", true, PROTO_MAX_ID, STR_ID, &j->node_id)) ||
        (rc = get_small(d, "nproc", true, 1, PROTO_MAX_NPROC, 1, &j->nproc)) ||
        (rc = get_small(d, "min_nodes", true, 1, PROTO_MAX_NODES, 1, &j->min_nodes)) ||
        (rc = get_small(d, "max_nodes", true, 1, PROTO_MAX_NODES, 1, &j->max_nodes)) ||
        (rc = get_str(d, "local_addr", false, 255, STR_ID, &j->local_addr)) ||
        (rc = get_str(d, "hostname", false, 255, STR_ID, &j->hostname)) ||
        (rc = get_small(d, "master_port", false, 0, 65535, 0, &j->master_port)) ||
        (rc = get_small(d, "status_port", false, 0, 65535, 0, &j->status_port)) ||
        (rc = get_int(d, "restart_count", false, 0, PROTO_MAX_INT, 0, &j->restart_count)) ||
        (rc = get_small(d, "last_nnodes", false, 0, PROTO_MAX_NODES, 0, &j->last_nnodes)))
        return rc;
    int64_t round;
    if ((rc = get_int(d, "round", false, 0, PROTO_MAX_INT, 0, &round)))
        return rc;
    j->round = (uint64_t)round;
    if (j->node_id[0] == '\0')
        return bad_field(d, "node_id", "must not be empty");
    if (j->min_nodes > j->max_nodes)
        return bad_field(d, "min_nodes", "must not exceed max_nodes");

    const cJSON *conf = field(d, "conf");
    if (conf == NULL || cJSON_IsNull(conf))
        return 0;
    if (!cJSON_IsObject(conf))
        return bad_field(d, "conf", "must be an object of strings");
    size_t n = (size_t)cJSON_GetArraySize(conf);
    if (n > PROTO_MAX_CONF)
        return bad_field(d, "conf", "has more than 64 entries");
    struct proto_conf_kv *kv = msg_alloc(m, n * sizeof(*kv));
    if (kv == NULL)
        return cddp_fail(d->err, d->errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory");
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, conf)
    {
        if (!cJSON_IsString(it) || it->string == NULL || strlen(it->string) > 64 ||
            strlen(it->valuestring) > 1024)
            return bad_field(d, "conf",
                             "must map keys of at most 64 bytes to strings of at most 1024");
        kv[i].key = it->string;
        kv[i].value = it->valuestring;
        i++;
    }
    j->conf = kv;
    j->nconf = i;
    return 0;
}

static int decode_join(struct dec *d)
{
    return decode_join_into(d, &d->m->join);
}

static int decode_wait(struct dec *d)
{
    struct proto_msg *m = d->m;
    int rc;
    if ((rc = get_id(d)) || (rc = get_timeout(d, &m->wait.timeout_ms)))
        return rc;
    const cJSON *keys = field(d, "keys");
    if (keys == NULL)
        return bad_field(d, "keys", "is missing");
    if (!cJSON_IsArray(keys))
        return bad_field(d, "keys", "must be an array of strings");
    size_t n = (size_t)cJSON_GetArraySize(keys);
    if (n == 0 || n > PROTO_MAX_WAIT_KEYS)
        return bad_field(d, "keys", "must hold 1..1024 keys");
    const char **v = msg_alloc(m, n * sizeof(*v));
    if (v == NULL)
        return cddp_fail(d->err, d->errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory");
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, keys)
    {
        if (!cJSON_IsString(it) || it->valuestring[0] == '\0' ||
            strlen(it->valuestring) > PROTO_MAX_KEY)
            return bad_field(d, "keys", "must hold non-empty strings of at most 4096 bytes");
        v[i++] = it->valuestring;
    }
    m->wait.keys = v;
    m->wait.nkeys = n;
    return 0;
}

static int decode_result(struct dec *d)
{
    struct proto_msg *m = d->m;
    const char *code;
    int rc;
    if ((rc = get_id(d)) || (rc = get_str(d, "code", false, 64, STR_ID, &code)) ||
        (rc = get_str(d, "message", false, PROTO_MAX_TEXT, STR_TEXT, &m->result.message)) ||
        (rc = get_bytes(d, "value", false, &m->result.value, &m->result.has_value)))
        return rc;
    m->result.code = code ? proto_error_code(code) : 0;
    const cJSON *num = field(d, "number");
    if (num && !cJSON_IsNull(num)) {
        if ((rc = get_int(d, "number", false, -PROTO_MAX_INT, PROTO_MAX_INT, 0, &m->result.number)))
            return rc;
        m->result.has_number = true;
    }
    cJSON *st = cJSON_GetObjectItemCaseSensitive(d->obj, "status");
    if (st && !cJSON_IsNull(st)) {
        if (!cJSON_IsObject(st))
            return bad_field(d, "status", "must be an object");
        m->result.status = st;
    }
    return 0;
}

/* The fields of a round, from d->obj (a round message, or a resume's
 * "member"). */
static int decode_round_into(struct dec *d, struct proto_round *r)
{
    int64_t v;
    int rc;
    if ((rc = get_str(d, "run_id", true, PROTO_MAX_ID, STR_ID, &r->run_id)) ||
        (rc = get_int(d, "round", true, 0, PROTO_MAX_INT, 0, &v)))
        return rc;
    r->round = (uint64_t)v;
    if ((rc = get_small(d, "nnodes", true, 1, PROTO_MAX_NODES, 1, &r->nnodes)) ||
        (rc = get_small(d, "node_rank", true, 0, PROTO_MAX_NODES - 1, 0, &r->node_rank)) ||
        (rc = get_small(d, "world_size", true, 1, INT32_MAX, 1, &r->world_size)) ||
        (rc = get_small(d, "rank_offset", true, 0, INT32_MAX - 1, 0, &r->rank_offset)) ||
        (rc = get_small(d, "nproc", true, 1, PROTO_MAX_NPROC, 1, &r->nproc)) ||
        (rc = get_str(d, "master_addr", true, 255, STR_ID, &r->master_addr)) ||
        (rc = get_small(d, "master_port", true, 0, 65535, 0, &r->master_port)) ||
        (rc = get_int(d, "restart_count", false, 0, PROTO_MAX_INT, 0, &r->restart_count)) ||
        (rc = get_int(d, "generation", false, 0, PROTO_MAX_INT, 0, &r->generation)) ||
        (rc = get_str(d, "replaced", false, PROTO_MAX_REPLACED, STR_ID, &r->replaced)))
        return rc;
    if (r->node_rank >= r->nnodes)
        return bad_field(d, "node_rank", "must be below nnodes");
    if ((int64_t)r->rank_offset + r->nproc > r->world_size)
        return bad_field(d, "rank_offset", "plus nproc must not exceed world_size");
    return 0;
}

/* A heartbeat's optional "perf": an agent's summary of its ranks' step
 * times (struct proto_perf). */
static int decode_perf(struct dec *d)
{
    struct proto_msg *m = d->m;
    const cJSON *perf = field(d, "perf");
    if (perf == NULL || cJSON_IsNull(perf))
        return 0;
    if (!cJSON_IsObject(perf))
        return bad_field(d, "perf", "must be an object");
    struct dec sub = *d;
    sub.obj = perf;
    sub.type = "heartbeat.perf";
    struct proto_perf *p = &m->heartbeat.perf;
    int rc;
    if ((rc = get_small(&sub, "ranks", true, 1, PROTO_MAX_NPROC, 1, &p->ranks)) ||
        (rc = get_num(&sub, "step_s", true, 1e-9, PROTO_MAX_STEP_S, 0, &p->step_s)) ||
        (rc = get_num(&sub, "compute_s", false, 0, PROTO_MAX_STEP_S, -1, &p->compute_s)) ||
        (rc = get_small(&sub, "max_rank", true, 0, INT32_MAX, 0, &p->max_rank)) ||
        (rc = get_num(&sub, "factor", true, 1.0, 1000.0, 1.5, &p->factor)))
        return rc;
    m->heartbeat.has_perf = true;
    return 0;
}

/* A resume's optional rebuild part: "join" and "member", both objects. */
static int decode_rebuild(struct dec *d)
{
    struct proto_msg *m = d->m;
    const cJSON *join = field(d, "join");
    const cJSON *member = field(d, "member");
    bool has_join = join && !cJSON_IsNull(join), has_member = member && !cJSON_IsNull(member);
    if (!has_join && !has_member)
        return 0;
    if (!has_join || !cJSON_IsObject(join))
        return bad_field(d, "join", "must be an object (with \"member\")");
    if (!has_member || !cJSON_IsObject(member))
        return bad_field(d, "member", "must be an object (with \"join\")");
    struct dec sub = *d;
    sub.obj = join;
    sub.type = "resume.join";
    int rc = decode_join_into(&sub, &m->resume.join);
    if (rc)
        return rc;
    sub.obj = member;
    sub.type = "resume.member";
    if ((rc = decode_round_into(&sub, &m->resume.member)))
        return rc;
    if (m->resume.member.round != m->resume.round)
        return bad_field(d, "member", "must be the round being resumed");
    if (strcmp(m->resume.join.node_id, m->resume.node_id) != 0)
        return bad_field(d, "join", "must be the join of the node being resumed");
    if (m->resume.member.nproc != m->resume.join.nproc)
        return bad_field(d, "member", "must have the join's nproc");
    m->resume.rebuild = true;
    return 0;
}

static int decode_fields(struct dec *d)
{
    struct proto_msg *m = d->m;
    int64_t v;
    int rc = 0;
    switch (m->type) {
    case PROTO_HELLO:
        if ((rc = get_str(d, "token", false, PROTO_MAX_TOKEN, STR_TEXT, &m->hello.token)) ||
            (rc = get_str(d, "run_id", false, PROTO_MAX_ID, STR_ID, &m->hello.run_id)) ||
            (rc = get_str(d, "client", false, PROTO_MAX_TEXT, STR_TEXT, &m->hello.client)) ||
            (rc = get_bool(d, "heartbeat_ack", &m->hello.heartbeat_ack)))
            return rc;
        if (m->hello.run_id == NULL)
            m->hello.run_id = "";
        return 0;
    case PROTO_WELCOME:
        if ((rc = get_str(d, "server", false, PROTO_MAX_TEXT, STR_TEXT, &m->welcome.server)) ||
            (rc = get_bool(d, "heartbeat_ack", &m->welcome.heartbeat_ack)) ||
            (rc = get_bool(d, "resume", &m->welcome.resume)) ||
            (rc = get_bool(d, "generations", &m->welcome.generations)))
            return rc;
        return get_bool(d, "replace_ranks", &m->welcome.replace_ranks);
    case PROTO_JOIN:
        return decode_join(d);
    case PROTO_JOINED:
        if ((rc = get_int(d, "round", true, 0, PROTO_MAX_INT, 0, &v)))
            return rc;
        m->joined.round = (uint64_t)v;
        return get_bool(d, "waiting", &m->joined.waiting);
    case PROTO_HEARTBEAT:
        if ((rc = get_int(d, "waiting", false, 0, PROTO_MAX_NODES, -1, &m->heartbeat.waiting)))
            return rc;
        m->heartbeat.has_waiting = m->heartbeat.waiting >= 0;
        if ((rc = decode_perf(d)))
            return rc;
        /* Ignored when bad (msg.h): the heartbeat itself still counts. */
        const cJSON *gp = field(d, "goodput");
        if (gp && !cJSON_IsNull(gp))
            m->heartbeat.has_goodput =
                proto_goodput_from_json(gp, &m->heartbeat.goodput, m->heartbeat.goodput_error,
                                        sizeof(m->heartbeat.goodput_error)) == 0;
        return 0;
    case PROTO_RESUME:
        if ((rc = get_id(d)) ||
            (rc = get_str(d, "node_id", true, PROTO_MAX_ID, STR_ID, &m->resume.node_id)) ||
            (rc = get_int(d, "round", true, 1, PROTO_MAX_INT, 1, &v)))
            return rc;
        m->resume.round = (uint64_t)v;
        if (m->resume.node_id[0] == '\0')
            return bad_field(d, "node_id", "must not be empty");
        return decode_rebuild(d);
    case PROTO_LEAVE:
    case PROTO_CLOSE:
    case PROTO_CLOSED:
        /* leave, close and closed share one layout. */
        if ((rc = get_str(d, "reason", false, PROTO_MAX_TEXT, STR_TEXT, &m->leave.reason)))
            return rc;
        return m->type == PROTO_LEAVE ? get_bool(d, "finished", &m->leave.finished) : 0;
    case PROTO_FAILURE:
        if ((rc = get_int(d, "round", true, 0, PROTO_MAX_INT, 0, &v)))
            return rc;
        m->failure.round = (uint64_t)v;
        return get_str(d, "reason", false, PROTO_MAX_TEXT, STR_TEXT, &m->failure.reason);
    case PROTO_REPLACE:
        if ((rc = get_int(d, "round", true, 1, PROTO_MAX_INT, 1, &v)) ||
            (rc = get_small(d, "rank", true, 0, INT32_MAX - 1, 0, &m->replace.rank)) ||
            (rc = get_str(d, "ranks", false, PROTO_MAX_REPLACED, STR_ID, &m->replace.ranks)))
            return rc;
        m->replace.round = (uint64_t)v;
        return get_str(d, "reason", false, PROTO_MAX_TEXT, STR_TEXT, &m->replace.reason);
    case PROTO_GENERATION:
        if ((rc = get_int(d, "round", true, 1, PROTO_MAX_INT, 1, &v)) ||
            (rc = get_int(d, "generation", true, 0, PROTO_MAX_INT, 0, &m->generation.generation)) ||
            (rc = get_str(d, "replaced", false, PROTO_MAX_REPLACED, STR_ID,
                          &m->generation.replaced)) ||
            (rc = get_str(d, "node_id", false, PROTO_MAX_ID, STR_ID, &m->generation.node_id)) ||
            (rc = get_str(d, "refused", false, PROTO_MAX_TEXT, STR_TEXT, &m->generation.refused)) ||
            (rc = get_int(d, "restart_count", false, 0, PROTO_MAX_INT, 0,
                          &m->generation.restart_count)))
            return rc;
        m->generation.round = (uint64_t)v;
        if (m->generation.generation > 0 &&
            (m->generation.replaced == NULL || m->generation.replaced[0] == '\0'))
            return bad_field(d, "replaced", "must name the ranks of a granted generation");
        if (m->generation.generation == 0 && m->generation.refused == NULL)
            return bad_field(d, "refused", "must say why when generation is 0");
        return 0;
    case PROTO_BLAME:
        if ((rc = get_int(d, "round", true, 1, PROTO_MAX_INT, 1, &v)) ||
            (rc = get_small(d, "rank", true, 0, INT32_MAX - 1, 0, &m->blame.rank)) ||
            (rc = get_int(d, "generation", true, 0, PROTO_MAX_INT, 0, &m->blame.generation)))
            return rc;
        m->blame.round = (uint64_t)v;
        return get_str(d, "node_id", false, PROTO_MAX_ID, STR_ID, &m->blame.node_id);
    case PROTO_ROUND:
        return decode_round_into(d, &m->round);
    case PROTO_RESTART:
        if ((rc = get_int(d, "round", true, 0, PROTO_MAX_INT, 0, &v)))
            return rc;
        m->restart.round = (uint64_t)v;
        if ((rc = get_str(d, "reason", true, PROTO_MAX_TEXT, STR_TEXT, &m->restart.reason)) ||
            (rc = get_str(d, "node_id", false, PROTO_MAX_ID, STR_ID, &m->restart.node_id)) ||
            (rc = get_int(d, "restart_count", false, 0, PROTO_MAX_INT, 0,
                          &m->restart.restart_count)))
            return rc;
        return get_bool(d, "counted", &m->restart.counted);
    case PROTO_ERROR: {
        const char *code;
        if ((rc = get_str(d, "code", true, 64, STR_ID, &code)) ||
            (rc = get_str(d, "message", false, PROTO_MAX_TEXT, STR_TEXT, &m->error.message)))
            return rc;
        m->error.code = proto_error_code(code);
        return 0;
    }
    case PROTO_SET:
        if ((rc = get_id(d)) || (rc = get_key(d, &m->set.key)))
            return rc;
        return get_bytes(d, "value", true, &m->set.value, NULL);
    case PROTO_GET:
        if ((rc = get_id(d)) || (rc = get_key(d, &m->get.key)))
            return rc;
        return get_timeout(d, &m->get.timeout_ms);
    case PROTO_WAIT:
        return decode_wait(d);
    case PROTO_ADD:
        if ((rc = get_id(d)) || (rc = get_key(d, &m->add.key)))
            return rc;
        return get_int(d, "delta", true, -PROTO_MAX_INT, PROTO_MAX_INT, 0, &m->add.delta);
    case PROTO_COMPARE_SET:
        if ((rc = get_id(d)) || (rc = get_key(d, &m->compare_set.key)) ||
            (rc = get_bytes(d, "expected", true, &m->compare_set.expected, NULL)))
            return rc;
        return get_bytes(d, "desired", true, &m->compare_set.desired, NULL);
    case PROTO_RESULT:
        return decode_result(d);
    case PROTO_STATUS:
        return get_id(d);
    default:
        return cddp_fail(d->err, d->errlen, CDDP_EPROTO_TYPE, "unhandled message type");
    }
}

int proto_msg_decode(const char *payload, size_t len, struct proto_msg *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    if (err && errlen)
        err[0] = '\0';
    if (len > PROTO_FRAME_MAX)
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "payload of %zu bytes exceeds %u", len,
                         PROTO_FRAME_MAX);
    int rc = prescan(payload, len, err, errlen);
    if (rc)
        return rc;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(payload, len, &end, 0);
    if (root == NULL) {
        size_t at = end && end >= payload && end <= payload + len ? (size_t)(end - payload) : 0;
        return cddp_fail(err, errlen, CDDP_EPARSE, "payload is not valid JSON (near byte %zu)", at);
    }
    m->json = root;
    for (; end < payload + len; end++) {
        if (*end != ' ' && *end != '\t' && *end != '\r' && *end != '\n') {
            rc = cddp_fail(err, errlen, CDDP_EPARSE, "text after the JSON object (byte %zu)",
                           (size_t)(end - payload));
            goto out;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "payload is not a JSON object");
        goto out;
    }

    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "v");
    if (v == NULL) {
        rc = cddp_fail(err, errlen, CDDP_EPROTO_FIELD, "message without protocol version 'v'");
        goto out;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != PROTO_VERSION) {
        char shown[32] = "?";
        if (cJSON_IsNumber(v) && isfinite(v->valuedouble))
            snprintf(shown, sizeof(shown), "%g", v->valuedouble);
        rc = cddp_fail(err, errlen, CDDP_EPROTO_VERSION,
                       "protocol version %s is not supported (this side speaks %d)", shown,
                       PROTO_VERSION);
        goto out;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "type");
    if (!cJSON_IsString(t)) {
        rc = cddp_fail(err, errlen, CDDP_EPROTO_FIELD, "message without a string 'type'");
        goto out;
    }
    m->type = type_from_name(t->valuestring);
    if (m->type == PROTO_NONE) {
        char shown[40];
        cddp_strlcpy(shown, t->valuestring, sizeof(shown));
        for (char *c = shown; *c; c++) {
            if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
                *c = '?';
        }
        rc = cddp_fail(err, errlen, CDDP_EPROTO_TYPE, "unknown message type '%s'", shown);
        goto out;
    }
    struct dec d = {.obj = root, .type = type_names[m->type], .m = m, .err = err, .errlen = errlen};
    rc = decode_fields(&d);
out:
    if (rc) {
        proto_msg_free(m);
        m->type = PROTO_NONE;
    }
    return rc;
}

/* ---- encoding ----
 *
 * Written straight into the output buffer (no cJSON tree, no number
 * formatting through doubles): the server encodes one round message per
 * node, and at 10,000 nodes that cost matters. */

struct enc {
    struct cddp_buf *b;
    int rc;
    bool first;
};

static void raw(struct enc *e, const char *p, size_t n)
{
    if (e->rc == 0)
        e->rc = cddp_buf_append(e->b, p, n);
}

/* A JSON string, every byte kept (common/jsonw.h, CDDP_JSON_STRICT): what a
 * peer sent comes back as it was, so encode(decode(x)) is a fixed point. */
static void quoted(struct enc *e, const char *s)
{
    if (e->rc == 0)
        e->rc = cddp_json_put_string(e->b, s, CDDP_JSON_STRICT);
}

/* A member's name, escaped as a string is: most are ours, but a join's conf
 * keys come from a peer and may hold any character JSON can escape. */
static void key(struct enc *e, const char *name)
{
    if (!e->first)
        raw(e, ",", 1);
    e->first = false;
    quoted(e, name);
    raw(e, ":", 1);
}

static void put_str(struct enc *e, const char *name, const char *s, size_t max)
{
    if (e->rc || s == NULL)
        return;
    if (strlen(s) > max) {
        e->rc = CDDP_EPROTO_FIELD;
        return;
    }
    key(e, name);
    quoted(e, s);
}

static void put_int(struct enc *e, const char *name, int64_t v, int64_t min, int64_t max)
{
    if (e->rc)
        return;
    if (v < min || v > max) {
        e->rc = CDDP_EPROTO_FIELD;
        return;
    }
    char buf[24];
    int n = snprintf(buf, sizeof(buf), "%lld", (long long)v);
    key(e, name);
    raw(e, buf, (size_t)n);
}

/* A finite number, to 9 significant digits. */
static void put_num(struct enc *e, const char *name, double v, double min, double max)
{
    if (e->rc)
        return;
    if (!isfinite(v) || v < min || v > max) {
        e->rc = CDDP_EPROTO_FIELD;
        return;
    }
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "%.9g", v);
    key(e, name);
    raw(e, buf, (size_t)n);
}

static void put_bool(struct enc *e, const char *name, bool v)
{
    if (e->rc)
        return;
    key(e, name);
    raw(e, v ? "true" : "false", v ? 4 : 5);
}

static void put_bytes(struct enc *e, const char *name, struct proto_bytes b)
{
    if (e->rc)
        return;
    if (b.len > PROTO_MAX_VALUE) {
        e->rc = CDDP_ETOOBIG;
        return;
    }
    char *text = malloc(proto_base64_len(b.len) + 1);
    if (text == NULL) {
        e->rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
        return;
    }
    proto_base64_encode(b.data ? b.data : "", b.len, text);
    key(e, name);
    quoted(e, text);
    free(text);
}

static void put_id(struct enc *e, uint64_t id)
{
    put_int(e, "id", (int64_t)id, 0, PROTO_MAX_INT);
}

static void put_timeout(struct enc *e, int64_t t)
{
    if (t >= 0)
        put_int(e, "timeout_ms", t, 0, PROTO_MAX_TIMEOUT_MS);
}

/* name: {fields}, a nested object. */
static void open_object(struct enc *e, const char *name)
{
    if (e->rc)
        return;
    key(e, name);
    raw(e, "{", 1);
    e->first = true;
}

static void close_object(struct enc *e)
{
    raw(e, "}", 1);
    e->first = false;
}

static void encode_join_fields(struct enc *e, const struct proto_join *j)
{
    put_str(e, "node_id", j->node_id, PROTO_MAX_ID);
    put_int(e, "nproc", j->nproc, 1, PROTO_MAX_NPROC);
    put_int(e, "min_nodes", j->min_nodes, 1, PROTO_MAX_NODES);
    put_int(e, "max_nodes", j->max_nodes, j->min_nodes, PROTO_MAX_NODES);
    put_str(e, "local_addr", j->local_addr, 255);
    put_str(e, "hostname", j->hostname, 255);
    put_int(e, "master_port", j->master_port, 0, 65535);
    if (j->status_port)
        put_int(e, "status_port", j->status_port, 0, 65535);
    if (j->round)
        put_int(e, "round", (int64_t)j->round, 0, PROTO_MAX_INT);
    if (j->last_nnodes)
        put_int(e, "last_nnodes", j->last_nnodes, 0, PROTO_MAX_NODES);
    if (j->restart_count)
        put_int(e, "restart_count", j->restart_count, 0, PROTO_MAX_INT);
    if (e->rc || j->nconf == 0)
        return;
    if (j->nconf > PROTO_MAX_CONF) {
        e->rc = CDDP_EPROTO_FIELD;
        return;
    }
    open_object(e, "conf");
    for (size_t i = 0; i < j->nconf && e->rc == 0; i++) {
        if (strlen(j->conf[i].key) > 64) {
            e->rc = CDDP_EPROTO_FIELD;
            break;
        }
        put_str(e, j->conf[i].key, j->conf[i].value, 1024);
    }
    close_object(e);
}

static void encode_round_fields(struct enc *e, const struct proto_round *r)
{
    put_str(e, "run_id", r->run_id, PROTO_MAX_ID);
    put_int(e, "round", (int64_t)r->round, 0, PROTO_MAX_INT);
    put_int(e, "node_rank", r->node_rank, 0, r->nnodes - 1);
    put_int(e, "nnodes", r->nnodes, 1, PROTO_MAX_NODES);
    put_int(e, "world_size", r->world_size, 1, INT32_MAX);
    put_int(e, "rank_offset", r->rank_offset, 0, (int64_t)r->world_size - r->nproc);
    put_int(e, "nproc", r->nproc, 1, PROTO_MAX_NPROC);
    put_str(e, "master_addr", r->master_addr ? r->master_addr : "", 255);
    put_int(e, "master_port", r->master_port, 0, 65535);
    put_int(e, "restart_count", r->restart_count, 0, PROTO_MAX_INT);
    if (r->generation > 0) {
        put_int(e, "generation", r->generation, 0, PROTO_MAX_INT);
        put_str(e, "replaced", r->replaced ? r->replaced : "", PROTO_MAX_REPLACED);
    }
}

/* A heartbeat's optional fields: waiting, perf, goodput. */
static void encode_heartbeat(struct enc *e, const struct proto_msg *m)
{
    if (m->heartbeat.has_waiting)
        put_int(e, "waiting", m->heartbeat.waiting, 0, PROTO_MAX_NODES);
    if (m->heartbeat.has_perf) {
        const struct proto_perf *p = &m->heartbeat.perf;
        open_object(e, "perf");
        put_int(e, "ranks", p->ranks, 1, PROTO_MAX_NPROC);
        put_num(e, "step_s", p->step_s, 1e-9, PROTO_MAX_STEP_S);
        if (p->compute_s >= 0)
            put_num(e, "compute_s", p->compute_s, 0, PROTO_MAX_STEP_S);
        put_int(e, "max_rank", p->max_rank, 0, INT32_MAX);
        put_num(e, "factor", p->factor, 1.0, 1000.0);
        close_object(e);
    }
    if (m->heartbeat.has_goodput && e->rc == 0) {
        char gp[512];
        int n = proto_goodput_to_json(&m->heartbeat.goodput, gp, sizeof(gp));
        if (n < 0) {
            e->rc = n;
            return;
        }
        key(e, "goodput");
        raw(e, gp, (size_t)n);
    }
}

/* replace and its answer, generation, and blame (--restart_scope=worker). */
static void encode_replace(struct enc *e, const struct proto_msg *m)
{
    if (m->type == PROTO_BLAME) {
        put_int(e, "round", (int64_t)m->blame.round, 1, PROTO_MAX_INT);
        put_int(e, "rank", m->blame.rank, 0, INT32_MAX - 1);
        put_int(e, "generation", m->blame.generation, 0, PROTO_MAX_INT);
        put_str(e, "node_id", m->blame.node_id, PROTO_MAX_ID);
        return;
    }
    if (m->type == PROTO_REPLACE) {
        put_int(e, "round", (int64_t)m->replace.round, 1, PROTO_MAX_INT);
        put_int(e, "rank", m->replace.rank, 0, INT32_MAX - 1);
        put_str(e, "ranks", m->replace.ranks, PROTO_MAX_REPLACED);
        put_str(e, "reason", m->replace.reason, PROTO_MAX_TEXT);
        return;
    }
    put_int(e, "round", (int64_t)m->generation.round, 1, PROTO_MAX_INT);
    put_int(e, "generation", m->generation.generation, 0, PROTO_MAX_INT);
    put_str(e, "replaced", m->generation.replaced, PROTO_MAX_REPLACED);
    put_str(e, "node_id", m->generation.node_id, PROTO_MAX_ID);
    put_str(e, "refused", m->generation.refused, PROTO_MAX_TEXT);
    put_int(e, "restart_count", m->generation.restart_count, 0, PROTO_MAX_INT);
}

static void encode_fields(struct enc *e, const struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_HELLO:
        put_str(e, "token", m->hello.token, PROTO_MAX_TOKEN);
        put_str(e, "run_id", m->hello.run_id, PROTO_MAX_ID);
        put_str(e, "client", m->hello.client, PROTO_MAX_TEXT);
        if (m->hello.heartbeat_ack)
            put_bool(e, "heartbeat_ack", true);
        break;
    case PROTO_WELCOME:
        put_str(e, "server", m->welcome.server, PROTO_MAX_TEXT);
        if (m->welcome.heartbeat_ack)
            put_bool(e, "heartbeat_ack", true);
        if (m->welcome.resume)
            put_bool(e, "resume", true);
        if (m->welcome.generations)
            put_bool(e, "generations", true);
        if (m->welcome.replace_ranks)
            put_bool(e, "replace_ranks", true);
        break;
    case PROTO_JOIN:
        encode_join_fields(e, &m->join);
        break;
    case PROTO_JOINED:
        put_int(e, "round", (int64_t)m->joined.round, 0, PROTO_MAX_INT);
        put_bool(e, "waiting", m->joined.waiting);
        break;
    case PROTO_HEARTBEAT:
        encode_heartbeat(e, m);
        break;
    case PROTO_RESUME:
        put_id(e, m->id);
        put_str(e, "node_id", m->resume.node_id, PROTO_MAX_ID);
        put_int(e, "round", (int64_t)m->resume.round, 1, PROTO_MAX_INT);
        if (!m->resume.rebuild)
            break;
        open_object(e, "join");
        encode_join_fields(e, &m->resume.join);
        close_object(e);
        open_object(e, "member");
        encode_round_fields(e, &m->resume.member);
        close_object(e);
        break;
    case PROTO_LEAVE:
    case PROTO_CLOSE:
    case PROTO_CLOSED:
        put_str(e, "reason", m->leave.reason, PROTO_MAX_TEXT);
        if (m->type == PROTO_LEAVE && m->leave.finished)
            put_bool(e, "finished", true);
        break;
    case PROTO_FAILURE:
        put_int(e, "round", (int64_t)m->failure.round, 0, PROTO_MAX_INT);
        put_str(e, "reason", m->failure.reason, PROTO_MAX_TEXT);
        break;
    case PROTO_REPLACE:
    case PROTO_GENERATION:
    case PROTO_BLAME:
        encode_replace(e, m);
        break;
    case PROTO_ROUND:
        encode_round_fields(e, &m->round);
        break;
    case PROTO_RESTART:
        put_int(e, "round", (int64_t)m->restart.round, 0, PROTO_MAX_INT);
        put_str(e, "reason", m->restart.reason ? m->restart.reason : "", PROTO_MAX_TEXT);
        put_str(e, "node_id", m->restart.node_id, PROTO_MAX_ID);
        put_bool(e, "counted", m->restart.counted);
        put_int(e, "restart_count", m->restart.restart_count, 0, PROTO_MAX_INT);
        break;
    case PROTO_ERROR:
        put_str(e, "code", proto_error_name(m->error.code), 64);
        put_str(e, "message", m->error.message, PROTO_MAX_TEXT);
        break;
    case PROTO_SET:
        put_id(e, m->id);
        put_str(e, "key", m->set.key, PROTO_MAX_KEY);
        put_bytes(e, "value", m->set.value);
        break;
    case PROTO_GET:
        put_id(e, m->id);
        put_str(e, "key", m->get.key, PROTO_MAX_KEY);
        put_timeout(e, m->get.timeout_ms);
        break;
    case PROTO_WAIT:
        put_id(e, m->id);
        put_timeout(e, m->wait.timeout_ms);
        if (e->rc)
            break;
        if (m->wait.nkeys == 0 || m->wait.nkeys > PROTO_MAX_WAIT_KEYS) {
            e->rc = CDDP_EPROTO_FIELD;
            break;
        }
        key(e, "keys");
        raw(e, "[", 1);
        for (size_t i = 0; i < m->wait.nkeys && e->rc == 0; i++) {
            if (strlen(m->wait.keys[i]) > PROTO_MAX_KEY) {
                e->rc = CDDP_EPROTO_FIELD;
                break;
            }
            if (i)
                raw(e, ",", 1);
            quoted(e, m->wait.keys[i]);
        }
        raw(e, "]", 1);
        break;
    case PROTO_ADD:
        put_id(e, m->id);
        put_str(e, "key", m->add.key, PROTO_MAX_KEY);
        put_int(e, "delta", m->add.delta, -PROTO_MAX_INT, PROTO_MAX_INT);
        break;
    case PROTO_COMPARE_SET:
        put_id(e, m->id);
        put_str(e, "key", m->compare_set.key, PROTO_MAX_KEY);
        put_bytes(e, "expected", m->compare_set.expected);
        put_bytes(e, "desired", m->compare_set.desired);
        break;
    case PROTO_RESULT:
        put_id(e, m->id);
        if (m->result.code) {
            put_str(e, "code", proto_error_name(m->result.code), 64);
            put_str(e, "message", m->result.message, PROTO_MAX_TEXT);
        }
        if (m->result.has_value)
            put_bytes(e, "value", m->result.value);
        if (m->result.has_number)
            put_int(e, "number", m->result.number, -PROTO_MAX_INT, PROTO_MAX_INT);
        if (m->result.status && e->rc == 0) {
            char *st = cJSON_PrintUnformatted(m->result.status);
            if (st == NULL) {
                e->rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
                break;
            }
            key(e, "status");
            raw(e, st, strlen(st));
            cJSON_free(st);
        }
        break;
    case PROTO_STATUS:
        put_id(e, m->id);
        break;
    default:
        e->rc = CDDP_EPROTO_TYPE;
        break;
    }
}

/* Appends the JSON object for m to b; all or nothing. */
static int encode_json(const struct proto_msg *m, struct cddp_buf *b)
{
    size_t mark = b->len;
    struct enc e = {.b = b, .rc = 0, .first = true};
    if ((int)m->type <= 0 || m->type >= PROTO_TYPE_COUNT) {
        e.rc = CDDP_EPROTO_TYPE;
    } else {
        raw(&e, "{\"v\":1,\"type\":\"", 15);
        raw(&e, type_names[m->type], strlen(type_names[m->type]));
        raw(&e, "\"", 1);
        e.first = false;
        encode_fields(&e, m);
        raw(&e, "}", 1);
    }
    if (e.rc) {
        b->len = mark;
        if (b->data)
            b->data[mark] = '\0';
    }
    return e.rc;
}

char *proto_msg_to_json(const struct proto_msg *m, int *err)
{
    struct cddp_buf b;
    cddp_buf_init(&b, PROTO_FRAME_MAX);
    int rc = encode_json(m, &b);
    if (rc == 0 && b.data == NULL)
        rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (err)
        *err = rc;
    if (rc) {
        cddp_buf_free(&b);
        return NULL;
    }
    return b.data;
}

int proto_msg_encode(const struct proto_msg *m, struct cddp_buf *out)
{
    size_t mark = out->len;
    unsigned char hdr[PROTO_FRAME_HEADER] = {0};
    int rc = cddp_buf_append(out, hdr, sizeof(hdr));
    if (rc)
        return rc;
    rc = encode_json(m, out);
    size_t len = out->len - mark - PROTO_FRAME_HEADER;
    if (rc == 0 && len > PROTO_FRAME_MAX)
        rc = CDDP_ETOOBIG;
    if (rc) {
        out->len = mark;
        if (out->data)
            out->data[mark] = '\0';
        return rc;
    }
    proto_frame_header((uint32_t)len, (unsigned char *)out->data + mark);
    return 0;
}
