/* etcd_wire.c: see etcd_wire.h. */
#include "rendezvous/etcd_wire.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/errors.h"
#include "common/strutil.h"
#include "proto/msg.h"

size_t etcd_prefix_end(const char *prefix, size_t len, char *out)
{
    memcpy(out, prefix, len);
    while (len > 0) {
        unsigned char c = (unsigned char)out[len - 1];
        if (c < 0xff) {
            out[len - 1] = (char)(c + 1);
            return len;
        }
        len--;
    }
    return 0;
}

/* ---- requests ---- */

static bool add_b64(cJSON *o, const char *name, const void *p, size_t n)
{
    char *s = malloc(proto_base64_len(n) + 1);
    if (s == NULL)
        return false;
    proto_base64_encode(p, n, s);
    bool ok = cJSON_AddStringToObject(o, name, s) != NULL;
    free(s);
    return ok;
}

static bool add_i64(cJSON *o, const char *name, int64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%" PRId64, v);
    return cJSON_AddStringToObject(o, name, s) != NULL;
}

static char *finish(cJSON *o, bool ok)
{
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

static bool fill_range(cJSON *o, const char *key, const char *range_end, bool count_only,
                       bool keys_only)
{
    bool ok = add_b64(o, "key", key, strlen(key));
    if (range_end)
        ok = ok && add_b64(o, "range_end", range_end, strlen(range_end));
    if (count_only)
        ok = ok && cJSON_AddTrueToObject(o, "count_only");
    if (keys_only)
        ok = ok && cJSON_AddTrueToObject(o, "keys_only");
    return ok;
}

char *etcd_req_range(const char *key, const char *range_end, bool count_only, bool keys_only)
{
    cJSON *o = cJSON_CreateObject();
    return o ? finish(o, fill_range(o, key, range_end, count_only, keys_only)) : NULL;
}

static bool fill_put(cJSON *o, const char *key, const void *val, size_t vlen, int64_t lease)
{
    bool ok = add_b64(o, "key", key, strlen(key)) && add_b64(o, "value", val, vlen);
    if (lease)
        ok = ok && add_i64(o, "lease", lease);
    return ok;
}

char *etcd_req_put(const char *key, const void *val, size_t vlen, int64_t lease)
{
    cJSON *o = cJSON_CreateObject();
    return o ? finish(o, fill_put(o, key, val, vlen, lease)) : NULL;
}

char *etcd_req_cas(const char *key, int64_t mod_rev, const void *val, size_t vlen, int64_t lease)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    cJSON *cmp = cJSON_AddArrayToObject(o, "compare");
    cJSON *c = cJSON_CreateObject();
    bool ok = cmp && c && cJSON_AddItemToArray(cmp, c);
    if (!ok) {
        cJSON_Delete(c);
        return finish(o, false);
    }
    ok = cJSON_AddStringToObject(c, "target", "MOD") && add_b64(c, "key", key, strlen(key)) &&
         add_i64(c, "mod_revision", mod_rev) && cJSON_AddStringToObject(c, "result", "EQUAL");
    cJSON *succ = cJSON_AddArrayToObject(o, "success");
    cJSON *fail = cJSON_AddArrayToObject(o, "failure");
    cJSON *s = cJSON_CreateObject(), *f = cJSON_CreateObject();
    if (!ok || !succ || !fail || !s || !f || !cJSON_AddItemToArray(succ, s)) {
        cJSON_Delete(s);
        cJSON_Delete(f);
        return finish(o, false);
    }
    if (!cJSON_AddItemToArray(fail, f)) {
        cJSON_Delete(f);
        return finish(o, false);
    }
    cJSON *put = cJSON_AddObjectToObject(s, "request_put");
    cJSON *rng = cJSON_AddObjectToObject(f, "request_range");
    ok = put && rng && fill_put(put, key, val, vlen, lease) &&
         fill_range(rng, key, NULL, false, false);
    return finish(o, ok);
}

static bool add_cmp(cJSON *cmp, const char *key, int64_t mod_rev)
{
    cJSON *c = cJSON_CreateObject();
    if (c == NULL || !cJSON_AddItemToArray(cmp, c)) {
        cJSON_Delete(c);
        return false;
    }
    return cJSON_AddStringToObject(c, "target", "MOD") && add_b64(c, "key", key, strlen(key)) &&
           add_i64(c, "mod_revision", mod_rev) && cJSON_AddStringToObject(c, "result", "EQUAL");
}

static cJSON *add_op(cJSON *arr, const char *kind)
{
    cJSON *s = cJSON_CreateObject();
    if (s == NULL || !cJSON_AddItemToArray(arr, s)) {
        cJSON_Delete(s);
        return NULL;
    }
    return cJSON_AddObjectToObject(s, kind);
}

char *etcd_req_fold(const char *key, int64_t mod_rev, const void *val, size_t vlen, int64_t lease,
                    const char *copy, const char *const *del, const int64_t *del_rev, size_t ndel)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    cJSON *cmp = cJSON_AddArrayToObject(o, "compare");
    cJSON *succ = cJSON_AddArrayToObject(o, "success");
    cJSON *fail = cJSON_AddArrayToObject(o, "failure");
    bool ok = cmp && succ && fail && add_cmp(cmp, key, mod_rev);
    cJSON *put = ok ? add_op(succ, "request_put") : NULL;
    ok = put && fill_put(put, key, val, vlen, lease);
    if (ok && copy) {
        put = add_op(succ, "request_put");
        ok = put && fill_put(put, copy, val, vlen, lease);
    }
    for (size_t i = 0; ok && i < ndel; i++) {
        cJSON *d = add_cmp(cmp, del[i], del_rev[i]) ? add_op(succ, "request_delete_range") : NULL;
        ok = d && add_b64(d, "key", del[i], strlen(del[i]));
    }
    cJSON *rng = ok ? add_op(fail, "request_range") : NULL;
    ok = rng && fill_range(rng, key, NULL, false, false);
    return finish(o, ok);
}

char *etcd_req_delete(const char *key, const char *range_end)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    bool ok = add_b64(o, "key", key, strlen(key));
    if (range_end)
        ok = ok && add_b64(o, "range_end", range_end, strlen(range_end));
    return finish(o, ok);
}

char *etcd_req_lease_grant(int64_t ttl_s)
{
    cJSON *o = cJSON_CreateObject();
    return o ? finish(o, add_i64(o, "TTL", ttl_s)) : NULL;
}

char *etcd_req_lease_id(int64_t id)
{
    cJSON *o = cJSON_CreateObject();
    return o ? finish(o, add_i64(o, "ID", id)) : NULL;
}

char *etcd_req_auth(const char *name, const char *password)
{
    cJSON *o = cJSON_CreateObject();
    return o ? finish(o, cJSON_AddStringToObject(o, "name", name) &&
                             cJSON_AddStringToObject(o, "password", password))
             : NULL;
}

char *etcd_req_watch(const char *key, const char *range_end, int64_t start_rev)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    cJSON *c = cJSON_AddObjectToObject(o, "create_request");
    bool ok = c && fill_range(c, key, range_end, false, false);
    if (start_rev > 0)
        ok = ok && add_i64(c, "start_revision", start_rev);
    return finish(o, ok);
}

/* ---- answers ---- */

/* Bounds size and nesting before cJSON parses (it recurses). */
static cJSON *parse_bounded(const char *body, size_t len, char *err, size_t errlen)
{
    if (len > ETCD_MAX_ANSWER) {
        cddp_fail(err, errlen, CDDP_ETOOBIG, "etcd answer of %zu bytes (limit %u)", len,
                  ETCD_MAX_ANSWER);
        return NULL;
    }
    int depth = 0;
    bool str = false;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                str = false;
        } else if (c == '"') {
            str = true;
        } else if (c == '{' || c == '[') {
            if (++depth > ETCD_MAX_DEPTH) {
                cddp_fail(err, errlen, CDDP_ETOOBIG, "etcd answer nested deeper than %d",
                          ETCD_MAX_DEPTH);
                return NULL;
            }
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (j == NULL || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer is not a JSON object");
        return NULL;
    }
    return j;
}

/* An int64 field: absent is 0 (the gateway omits defaults); a string of
 * digits or a number otherwise. */
static int get_i64(const cJSON *o, const char *name, int64_t *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = 0;
    if (v == NULL || cJSON_IsNull(v))
        return 0;
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d < -9.0e18 || d > 9.0e18 || d != (double)(int64_t)d)
            return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: '%s' is not an integer", name);
        *out = (int64_t)d;
        return 0;
    }
    if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: '%s' is not an integer", name);
    errno = 0;
    char *end;
    long long n = strtoll(v->valuestring, &end, 10);
    if (errno || *end != '\0')
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: '%s'='%.40s' is not an integer",
                         name, v->valuestring);
    *out = n;
    return 0;
}

static int get_b64(const cJSON *o, const char *name, bool required, size_t max, unsigned char **out,
                   size_t *outlen, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = NULL;
    *outlen = 0;
    if (v == NULL) {
        if (required)
            return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: '%s' missing", name);
        /* An empty value is left out, like any default. */
        if ((*out = calloc(1, 1)) == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        return 0;
    }
    if (!cJSON_IsString(v))
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: '%s' is not a string", name);
    size_t n = strlen(v->valuestring);
    if (n / 4 * 3 > max)
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "etcd answer: '%s' longer than %zu bytes", name,
                         max);
    unsigned char *b = malloc(n / 4 * 3 + 1);
    if (b == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    long got = proto_base64_decode(v->valuestring, n, b, n / 4 * 3);
    if (got < 0) {
        free(b);
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: '%s' is not base64", name);
    }
    b[got] = '\0';
    *out = b;
    *outlen = (size_t)got;
    return 0;
}

static void kv_free(struct etcd_kv *kv)
{
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof(*kv));
}

static int parse_kv(const cJSON *o, bool with_value, struct etcd_kv *kv, char *err, size_t errlen)
{
    memset(kv, 0, sizeof(*kv));
    if (!cJSON_IsObject(o))
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: a kv is not an object");
    unsigned char *key;
    int rc = get_b64(o, "key", true, ETCD_MAX_KEY, &key, &kv->keylen, err, errlen);
    if (rc)
        return rc;
    kv->key = (char *)key;
    if (memchr(kv->key, '\0', kv->keylen)) {
        kv_free(kv);
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: a key holds a NUL byte");
    }
    if (with_value &&
        (rc = get_b64(o, "value", false, ETCD_MAX_VALUE, &kv->value, &kv->vlen, err, errlen))) {
        kv_free(kv);
        return rc;
    }
    if ((rc = get_i64(o, "create_revision", &kv->create_rev, err, errlen)) ||
        (rc = get_i64(o, "mod_revision", &kv->mod_rev, err, errlen)) ||
        (rc = get_i64(o, "version", &kv->version, err, errlen)) ||
        (rc = get_i64(o, "lease", &kv->lease, err, errlen))) {
        kv_free(kv);
        return rc;
    }
    return 0;
}

void etcd_range_free(struct etcd_range *r)
{
    for (size_t i = 0; i < r->nkvs; i++)
        kv_free(&r->kvs[i]);
    free(r->kvs);
    memset(r, 0, sizeof(*r));
}

static int header_rev(const cJSON *o, int64_t *rev, char *err, size_t errlen)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "header");
    if (!cJSON_IsObject(h))
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: no header");
    return get_i64(h, "revision", rev, err, errlen);
}

/* The range body o (with or without a header of its own). */
static int fill_range_answer(const cJSON *o, struct etcd_range *out, char *err, size_t errlen)
{
    int rc = get_i64(o, "count", &out->count, err, errlen);
    if (rc)
        return rc;
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(o, "kvs");
    if (kvs == NULL)
        return 0;
    if (!cJSON_IsArray(kvs))
        return cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: 'kvs' is not an array");
    int n = cJSON_GetArraySize(kvs);
    if (n > ETCD_MAX_KVS)
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "etcd answer: more than %d kvs", ETCD_MAX_KVS);
    if (n == 0)
        return 0;
    out->kvs = calloc((size_t)n, sizeof(*out->kvs));
    if (out->kvs == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, kvs)
    {
        if ((rc = parse_kv(kv, true, &out->kvs[out->nkvs], err, errlen)))
            return rc;
        out->nkvs++;
    }
    return 0;
}

bool etcd_parse_error(const char *body, size_t len, char *msg, size_t msglen)
{
    char err[64];
    cJSON *j = parse_bounded(body, len, err, sizeof(err));
    if (j == NULL)
        return false;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsObject(e)) /* a stream's error: {"error":{"message":..}} */
        e = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "message");
    const cJSON *s = cJSON_IsString(m) && m->valuestring[0] ? m : e;
    bool found = cJSON_IsString(s);
    if (found) {
        /* Printable ASCII only: it goes into one log line. */
        size_t o = 0;
        for (const char *p = s->valuestring; *p && o + 1 < msglen; p++)
            msg[o++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
        if (msglen)
            msg[o] = '\0';
    }
    cJSON_Delete(j);
    return found;
}

int etcd_parse_range(const char *body, size_t len, struct etcd_range *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    cJSON *j = parse_bounded(body, len, err, errlen);
    if (j == NULL)
        return CDDP_EPARSE;
    int rc = header_rev(j, &out->revision, err, errlen);
    if (rc == 0)
        rc = fill_range_answer(j, out, err, errlen);
    cJSON_Delete(j);
    if (rc)
        etcd_range_free(out);
    return rc;
}

int etcd_parse_cas(const char *body, size_t len, bool *succeeded, struct etcd_range *out, char *err,
                   size_t errlen)
{
    memset(out, 0, sizeof(*out));
    *succeeded = false;
    cJSON *j = parse_bounded(body, len, err, errlen);
    if (j == NULL)
        return CDDP_EPARSE;
    int rc = header_rev(j, &out->revision, err, errlen);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "succeeded");
    if (rc == 0 && s && !cJSON_IsBool(s))
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: 'succeeded' is not a boolean");
    *succeeded = cJSON_IsTrue(s);
    if (rc == 0 && !*succeeded) {
        const cJSON *resp = cJSON_GetObjectItemCaseSensitive(j, "responses");
        const cJSON *first = cJSON_IsArray(resp) ? cJSON_GetArrayItem(resp, 0) : NULL;
        const cJSON *rr = cJSON_IsObject(first)
                              ? cJSON_GetObjectItemCaseSensitive(first, "response_range")
                              : NULL;
        if (!cJSON_IsObject(rr))
            rc = cddp_fail(err, errlen, CDDP_EPARSE,
                           "etcd answer: a failed txn without its range response");
        else
            rc = fill_range_answer(rr, out, err, errlen);
    }
    cJSON_Delete(j);
    if (rc)
        etcd_range_free(out);
    return rc;
}

int etcd_parse_lease(const char *body, size_t len, int64_t *id, int64_t *ttl, char *err,
                     size_t errlen)
{
    *id = *ttl = 0;
    cJSON *j = parse_bounded(body, len, err, errlen);
    if (j == NULL)
        return CDDP_EPARSE;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "result");
    if (o == NULL)
        o = j;
    int rc = 0;
    if (!cJSON_IsObject(o))
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: 'result' is not an object");
    if (rc == 0 && cJSON_GetObjectItemCaseSensitive(o, "ID") == NULL)
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: no lease ID");
    if (rc == 0)
        rc = get_i64(o, "ID", id, err, errlen);
    if (rc == 0)
        rc = get_i64(o, "TTL", ttl, err, errlen);
    if (rc == 0 && (*ttl < 0 || *id == 0))
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: lease ID 0 or negative TTL");
    cJSON_Delete(j);
    return rc;
}

int etcd_parse_token(const char *body, size_t len, char *out, size_t outlen, char *err,
                     size_t errlen)
{
    cJSON *j = parse_bounded(body, len, err, errlen);
    if (j == NULL)
        return CDDP_EPARSE;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "token");
    int rc = 0;
    if (!cJSON_IsString(t) || t->valuestring[0] == '\0' || strlen(t->valuestring) >= outlen)
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: no usable auth token");
    for (const char *p = rc ? "" : t->valuestring; *p && rc == 0; p++) {
        if (*p < 0x21 || *p > 0x7e) /* it goes into an HTTP header */
            rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd answer: an auth token not printable");
    }
    if (rc == 0)
        cddp_strlcpy(out, t->valuestring, outlen);
    cJSON_Delete(j);
    return rc;
}

void etcd_watch_msg_free(struct etcd_watch_msg *m)
{
    for (size_t i = 0; i < m->nevents; i++)
        kv_free(&m->events[i].kv);
    free(m->events);
    memset(m, 0, sizeof(*m));
}

int etcd_parse_watch(const char *body, size_t len, struct etcd_watch_msg *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof(*out));
    cJSON *j = parse_bounded(body, len, err, errlen);
    if (j == NULL)
        return CDDP_EPARSE;
    int rc = 0;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "result");
    if (!cJSON_IsObject(o)) {
        char msg[256];
        if (etcd_parse_error(body, len, msg, sizeof(msg)))
            rc = cddp_fail(err, errlen, CDDP_EPEER, "etcd watch: %s", msg);
        else
            rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd watch message without 'result'");
        cJSON_Delete(j);
        return rc;
    }
    rc = header_rev(o, &out->revision, err, errlen);
    const cJSON *b;
    if (rc == 0 && (b = cJSON_GetObjectItemCaseSensitive(o, "created")))
        out->created = cJSON_IsTrue(b);
    if (rc == 0 && (b = cJSON_GetObjectItemCaseSensitive(o, "canceled")))
        out->canceled = cJSON_IsTrue(b);
    if (rc == 0)
        rc = get_i64(o, "compact_revision", &out->compact_revision, err, errlen);
    const cJSON *cr = cJSON_GetObjectItemCaseSensitive(o, "cancel_reason");
    if (cJSON_IsString(cr))
        cddp_strlcpy(out->cancel_reason, cr->valuestring, sizeof(out->cancel_reason));
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(o, "events");
    if (rc == 0 && evs && !cJSON_IsArray(evs))
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd watch: 'events' is not an array");
    int n = rc == 0 && evs ? cJSON_GetArraySize(evs) : 0;
    if (n > ETCD_MAX_KVS)
        rc = cddp_fail(err, errlen, CDDP_ETOOBIG, "etcd watch: more than %d events", ETCD_MAX_KVS);
    if (rc == 0 && n > 0 && (out->events = calloc((size_t)n, sizeof(*out->events))) == NULL)
        rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
    const cJSON *ev;
    if (rc == 0 && n > 0) {
        cJSON_ArrayForEach(ev, evs)
        {
            if (!cJSON_IsObject(ev)) {
                rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd watch: an event is not an object");
                break;
            }
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(ev, "type");
            struct etcd_event *e = &out->events[out->nevents];
            if (t == NULL || (cJSON_IsString(t) && strcmp(t->valuestring, "PUT") == 0) ||
                (cJSON_IsNumber(t) && t->valueint == 0))
                e->type = ETCD_PUT;
            else if ((cJSON_IsString(t) && strcmp(t->valuestring, "DELETE") == 0) ||
                     (cJSON_IsNumber(t) && t->valueint == 1))
                e->type = ETCD_DELETE;
            else {
                rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd watch: unknown event type");
                break;
            }
            if ((rc = parse_kv(cJSON_GetObjectItemCaseSensitive(ev, "kv"), e->type == ETCD_PUT,
                               &e->kv, err, errlen)))
                break;
            out->nevents++;
        }
    }
    cJSON_Delete(j);
    if (rc)
        etcd_watch_msg_free(out);
    return rc;
}
