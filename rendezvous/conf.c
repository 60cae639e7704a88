/* conf.c: see conf.h. */
#include "rendezvous/conf.h"

#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

#define MAX_SECONDS (7.0 * 24 * 3600)

void rdzv_conf_init(struct rdzv_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->join_timeout_ms = 600 * 1000;
    c->last_call_timeout_ms = 30 * 1000;
    c->close_timeout_ms = 30 * 1000;
    c->keep_alive_interval_ms = 5 * 1000;
    c->keep_alive_max_attempt = 3;
    c->read_timeout_ms = 60 * 1000;
    c->is_host = -1;
}

const char *rdzv_conf_known_keys(void)
{
    return "join_timeout, last_call_timeout, close_timeout, keep_alive_interval, "
           "keep_alive_max_attempt, heartbeat_timeout, read_timeout, is_host, timeout, "
           "store_type, use_libuv, token, resume_timeout, protocol, cacert, cert, key, key_prefix, "
           "etcd_prefix, "
           "user, "
           "password";
}

bool rdzv_conf_etcd_only(const char *key)
{
    static const char *const keys[] = {"protocol",   "cacert",      "cert", "key",
                                       "key_prefix", "etcd_prefix", "user", "password"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strcmp(key, keys[i]) == 0)
            return true;
    }
    return false;
}

static int seconds(const char *key, const char *value, bool positive, uint64_t *out, char *err,
                   size_t errlen)
{
    double v;
    if (cddp_parse_double(value, 0, MAX_SECONDS, &v) != 0 || (positive && v <= 0)) {
        snprintf(err, errlen, "rdzv_conf %s='%s': expected seconds in %s0, %.0f]", key, value,
                 positive ? "(" : "[", MAX_SECONDS);
        return CDDP_ECONFIG;
    }
    *out = (uint64_t)(v * 1000.0 + 0.5);
    if (positive && *out == 0)
        *out = 1;
    return 0;
}

static int boolean(const char *key, const char *value, bool *out, char *err, size_t errlen)
{
    if (cddp_parse_bool(value, out) != 0) {
        snprintf(err, errlen, "rdzv_conf %s='%s': expected a boolean (1/0, true/false, yes/no)",
                 key, value);
        return CDDP_ECONFIG;
    }
    return 0;
}

int rdzv_conf_set(struct rdzv_conf *c, const char *key, const char *value, char *err, size_t errlen)
{
    if (strcmp(key, "join_timeout") == 0)
        return seconds(key, value, true, &c->join_timeout_ms, err, errlen);
    if (strcmp(key, "last_call_timeout") == 0)
        return seconds(key, value, false, &c->last_call_timeout_ms, err, errlen);
    if (strcmp(key, "close_timeout") == 0)
        return seconds(key, value, false, &c->close_timeout_ms, err, errlen);
    if (strcmp(key, "keep_alive_interval") == 0)
        return seconds(key, value, true, &c->keep_alive_interval_ms, err, errlen);
    if (strcmp(key, "resume_timeout") == 0) {
        c->has_resume_timeout = true;
        return seconds(key, value, false, &c->resume_timeout_ms, err, errlen);
    }
    if (strcmp(key, "read_timeout") == 0)
        return seconds(key, value, true, &c->read_timeout_ms, err, errlen);
    if (strcmp(key, "timeout") == 0)
        return seconds(key, value, true, &c->timeout_ms, err, errlen);
    if (strcmp(key, "heartbeat_timeout") == 0)
        return seconds(key, value, true, &c->heartbeat_timeout_ms, err, errlen);
    if (strcmp(key, "store_type") == 0) {
        /* torch's c10d backend can keep its state in a TCPStore or a
         * FileStore; cddp's rendezvous is always its own server. */
        if (strcmp(value, "tcp") == 0)
            return 0;
        snprintf(err, errlen,
                 "rdzv_conf store_type='%s': only 'tcp' (cddp's rendezvous is a server, not a "
                 "file)",
                 value);
        return CDDP_ECONFIG;
    }
    if (strcmp(key, "keep_alive_max_attempt") == 0) {
        long n;
        if (cddp_parse_long(value, 1, 1000000, &n) != 0) {
            snprintf(err, errlen, "rdzv_conf %s='%s': expected an integer >= 1", key, value);
            return CDDP_ECONFIG;
        }
        c->keep_alive_max_attempt = (int)n;
        return 0;
    }
    if (strcmp(key, "is_host") == 0) {
        bool b;
        int rc = boolean(key, value, &b, err, errlen);
        if (rc == 0)
            c->is_host = b;
        return rc;
    }
    if (strcmp(key, "use_libuv") == 0)
        return boolean(key, value, &c->use_libuv, err, errlen);
    if (strcmp(key, "token") == 0) {
        if (strlen(value) > PROTO_MAX_TOKEN) {
            snprintf(err, errlen, "rdzv_conf token: longer than %d bytes", PROTO_MAX_TOKEN);
            return CDDP_ECONFIG;
        }
        cddp_strlcpy(c->token, value, sizeof(c->token));
        c->has_token = value[0] != '\0';
        return 0;
    }
    if (strcmp(key, "protocol") == 0) {
        if (strcmp(value, "http") != 0 && strcmp(value, "https") != 0) {
            snprintf(err, errlen, "rdzv_conf protocol='%.64s': expected http or https", value);
            return CDDP_ECONFIG;
        }
        c->etcd_https = strcmp(value, "https") == 0;
        return 0;
    }
    struct {
        const char *name;
        char *dst;
        size_t len;
    } paths[] = {{"cacert", c->etcd_cacert, sizeof(c->etcd_cacert)},
                 {"cert", c->etcd_cert, sizeof(c->etcd_cert)},
                 {"key", c->etcd_key, sizeof(c->etcd_key)},
                 {"key_prefix", c->etcd_key_prefix, sizeof(c->etcd_key_prefix)},
                 {"etcd_prefix", c->etcd_key_prefix, sizeof(c->etcd_key_prefix)},
                 {"user", c->etcd_user, sizeof(c->etcd_user)},
                 {"password", c->etcd_password, sizeof(c->etcd_password)}};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        if (strcmp(key, paths[i].name) != 0)
            continue;
        if (strlen(value) >= paths[i].len) {
            snprintf(err, errlen, "rdzv_conf %s: longer than %zu bytes", key, paths[i].len - 1);
            return CDDP_ECONFIG;
        }
        if ((i == 3 || i == 4) && value[0] != '/') {
            snprintf(err, errlen, "rdzv_conf key_prefix='%.64s': must start with '/'", value);
            return CDDP_ECONFIG;
        }
        cddp_strlcpy(paths[i].dst, value, paths[i].len);
        return 0;
    }
    char shown[65];
    cddp_strlcpy(shown, key, sizeof(shown));
    snprintf(err, errlen, "rdzv_conf: unknown key '%s' (known: %s)", shown, rdzv_conf_known_keys());
    return CDDP_ECONFIG;
}

static void trim(const char **b, const char **e)
{
    while (*b < *e && (**b == ' ' || **b == '\t'))
        (*b)++;
    while (*e > *b && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
        (*e)--;
}

int rdzv_conf_parse(struct rdzv_conf *c, const char *s, char *err, size_t errlen)
{
    const char *p = s;
    const char *end = s + strlen(s);
    const char *b = p, *e = end;
    trim(&b, &e);
    if (b == e)
        return 0;
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        const char *eq = memchr(p, '=', (size_t)(item_end - p));
        if (eq == NULL) {
            snprintf(err, errlen, "rdzv_conf '%s': expected key=value pairs separated by commas",
                     s);
            return CDDP_ECONFIG;
        }
        const char *kb = p, *ke = eq, *vb = eq + 1, *ve = item_end;
        trim(&kb, &ke);
        trim(&vb, &ve);
        char key[65], value[PROTO_MAX_TOKEN + 1];
        if (ke == kb || (size_t)(ke - kb) >= sizeof(key)) {
            snprintf(err, errlen, "rdzv_conf '%s': empty or overlong key", s);
            return CDDP_ECONFIG;
        }
        if (ve == vb) {
            snprintf(err, errlen, "rdzv_conf: key '%.*s' has no value", (int)(ke - kb), kb);
            return CDDP_ECONFIG;
        }
        if ((size_t)(ve - vb) >= sizeof(value)) {
            snprintf(err, errlen, "rdzv_conf: value of '%.*s' is too long", (int)(ke - kb), kb);
            return CDDP_ECONFIG;
        }
        memcpy(key, kb, (size_t)(ke - kb));
        key[ke - kb] = '\0';
        memcpy(value, vb, (size_t)(ve - vb));
        value[ve - vb] = '\0';
        int rc = rdzv_conf_set(c, key, value, err, errlen);
        if (rc)
            return rc;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return 0;
}
