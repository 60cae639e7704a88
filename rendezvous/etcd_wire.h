/*
 * etcd_wire.h: etcd v3's JSON gateway (grpc-gateway over /v3/...), pure.
 *
 * No I/O: request bodies are built here, answers are decoded and checked
 * here, and rendezvous/etcd.c moves the bytes. Keys and values travel
 * base64-encoded; 64-bit numbers come as JSON strings ("revision":"7") and
 * fields equal to their default are left out (a false "succeeded", a PUT
 * event's "type"), which the decoders take as the default.
 *
 * Every answer is bounded before cJSON sees it (ETCD_MAX_ANSWER bytes,
 * ETCD_MAX_DEPTH nesting) and then checked field by field: a missing or
 * mistyped field, bad base64, a number out of range or too many entries
 * is CDDP_EPARSE / CDDP_ETOOBIG with one line in err, never a crash. What
 * a decoder fills is owned by the caller and freed with the matching
 * *_free (safe on a zeroed struct and after a failed decode).
 */
#ifndef CDDP_RENDEZVOUS_ETCD_WIRE_H
#define CDDP_RENDEZVOUS_ETCD_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ETCD_MAX_ANSWER (8u << 20) /* one answer or one watch message */
#define ETCD_MAX_DEPTH 12
#define ETCD_MAX_KEY 4096
#define ETCD_MAX_VALUE (4u << 20)
#define ETCD_MAX_KVS 100000 /* kvs in one range, events in one watch message */

/* Keys and values are base64 with padding (proto/msg.h's proto_base64_*). */

/* The range end that covers every key starting with prefix (etcd's
 * clientv3.GetPrefixRangeEnd): the prefix with its last byte incremented,
 * dropping trailing 0xff bytes. out must hold len bytes; returns the new
 * length (0: the whole keyspace, "\0"). */
size_t etcd_prefix_end(const char *prefix, size_t len, char *out);

/* ---- requests: malloc'd NUL-terminated JSON bodies (NULL: out of memory) ---- */

char *etcd_req_range(const char *key, const char *range_end, bool count_only, bool keys_only);
/* lease 0: none */
char *etcd_req_put(const char *key, const void *val, size_t vlen, int64_t lease);
/* Puts key only if its mod_revision is still mod_rev (0: the key must not
 * exist); otherwise reads it back in the same round trip (the failure
 * branch), so a conflict costs no extra request. */
char *etcd_req_cas(const char *key, int64_t mod_rev, const void *val, size_t vlen, int64_t lease);
/* etcd_req_cas that also writes the same value to copy (unless NULL) and
 * deletes the keys del[i], each compared on its mod_revision del_rev[i]
 * (the leader's batch of folded join requests; etcd refuses a txn of over
 * 128 operations by default). */
char *etcd_req_fold(const char *key, int64_t mod_rev, const void *val, size_t vlen, int64_t lease,
                    const char *copy, const char *const *del, const int64_t *del_rev, size_t ndel);
char *etcd_req_delete(const char *key, const char *range_end);
char *etcd_req_lease_grant(int64_t ttl_s);
char *etcd_req_lease_id(int64_t id); /* keepalive, revoke */
/* auth/authenticate (etcd's user name and password). */
char *etcd_req_auth(const char *name, const char *password);
/* A watch on [key, range_end) from start_rev (0: now). */
char *etcd_req_watch(const char *key, const char *range_end, int64_t start_rev);

/* ---- answers ---- */

struct etcd_kv {
    char *key; /* NUL-terminated (keys with NUL bytes are refused) */
    size_t keylen;
    unsigned char *value; /* NUL-terminated after vlen bytes; NULL for a DELETE event */
    size_t vlen;
    int64_t create_rev, mod_rev, version, lease;
};

struct etcd_range {
    int64_t revision; /* the header's: the store's revision when answered */
    int64_t count;
    struct etcd_kv *kvs;
    size_t nkvs;
};
void etcd_range_free(struct etcd_range *r);

/* An error answer ({"error":..,"code":..,"message":..}) anywhere: true and
 * its message in msg (for HTTP statuses other than 200). */
bool etcd_parse_error(const char *body, size_t len, char *msg, size_t msglen);

/* kv/range, or a put/delete (no kvs: only the revision). */
int etcd_parse_range(const char *body, size_t len, struct etcd_range *out, char *err,
                     size_t errlen);
/* kv/txn from etcd_req_cas: succeeded, and on failure the key as it is now
 * (out->nkvs 0: it does not exist). */
int etcd_parse_cas(const char *body, size_t len, bool *succeeded, struct etcd_range *out, char *err,
                   size_t errlen);
/* lease/grant ({ID, TTL}) or lease/keepalive ({"result":{ID, TTL}}); a
 * keepalive for a lease that is gone answers without TTL: *ttl = 0. */
int etcd_parse_lease(const char *body, size_t len, int64_t *id, int64_t *ttl, char *err,
                     size_t errlen);

/* auth/authenticate's answer: the token (at most outlen-1 printable bytes). */
int etcd_parse_token(const char *body, size_t len, char *out, size_t outlen, char *err,
                     size_t errlen);

enum etcd_event_type { ETCD_PUT = 0, ETCD_DELETE = 1 };
struct etcd_event {
    enum etcd_event_type type;
    struct etcd_kv kv;
};
struct etcd_watch_msg {
    int64_t revision;
    bool created, canceled;
    int64_t compact_revision; /* > 0: the start revision was compacted away */
    char cancel_reason[256];
    struct etcd_event *events;
    size_t nevents;
};
void etcd_watch_msg_free(struct etcd_watch_msg *m);
/* One message of the watch stream ({"result":{...}} or {"error":...}, the
 * latter returned as CDDP_EPEER with its message in err). */
int etcd_parse_watch(const char *body, size_t len, struct etcd_watch_msg *out, char *err,
                     size_t errlen);

#endif
