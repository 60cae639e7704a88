/* goodput.c: a heartbeat's optional "goodput" object (proto/msg.h,
 * docs/protocol.md "heartbeat"): an agent's seconds per phase, its lost
 * steps and its highest step. */
#include <math.h>
#include <stdio.h>

#include "common/errors.h"
#include "proto/msg.h"

static const char *const phase_names[PROTO_GOODPUT_PHASES] = {
    "init", "productive", "lost", "restart", "rendezvous", "stopped",
};
static const char *const phase_keys[PROTO_GOODPUT_PHASES] = {
    "init_s", "productive_s", "lost_s", "restart_s", "rendezvous_s", "stopped_s",
};

const char *proto_goodput_phase_name(int phase)
{
    return phase >= 0 && phase < PROTO_GOODPUT_PHASES ? phase_names[phase] : "?";
}

/* An integer field in min..max (missing: dflt). */
static int get_count(const cJSON *o, const char *name, int64_t min, int64_t dflt, int64_t *out,
                     char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = dflt;
    if (v == NULL || cJSON_IsNull(v))
        return 0;
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(x >= (double)min && x <= (double)PROTO_MAX_INT) || x != floor(x))
        return cddp_fail(err, errlen, CDDP_EPROTO_FIELD,
                         "'heartbeat.goodput' field '%s' must be an integer in %lld..2^53", name,
                         (long long)min);
    *out = (int64_t)x;
    return 0;
}

int proto_goodput_from_json(const cJSON *o, struct proto_goodput *g, char *err, size_t errlen)
{
    if (!cJSON_IsObject(o))
        return cddp_fail(err, errlen, CDDP_EPROTO_FIELD,
                         "'heartbeat' field 'goodput' must be an object");
    for (int i = 0; i < PROTO_GOODPUT_PHASES; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, phase_keys[i]);
        g->s[i] = 0;
        if (v == NULL || cJSON_IsNull(v))
            continue;
        double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!(x >= 0 && x <= PROTO_MAX_GOODPUT_S))
            return cddp_fail(err, errlen, CDDP_EPROTO_FIELD,
                             "'heartbeat.goodput' field '%s' must be seconds in 0..%.0f",
                             phase_keys[i], PROTO_MAX_GOODPUT_S);
        g->s[i] = x;
    }
    int rc = get_count(o, "lost_steps", 0, 0, &g->lost_steps, err, errlen);
    if (rc == 0)
        rc = get_count(o, "step", -1, -1, &g->step, err, errlen);
    return rc;
}

int proto_goodput_to_json(const struct proto_goodput *g, char *buf, size_t len)
{
    size_t at = 0;
    for (int i = 0; i < PROTO_GOODPUT_PHASES; i++) {
        if (!(g->s[i] >= 0 && g->s[i] <= PROTO_MAX_GOODPUT_S))
            return CDDP_EPROTO_FIELD;
        int n = snprintf(buf + at, at < len ? len - at : 0, "%s\"%s\":%.3f", i ? "," : "{",
                         phase_keys[i], g->s[i]);
        if (n < 0)
            return CDDP_EPROTO_FIELD;
        at += (size_t)n;
    }
    if (g->lost_steps < 0 || g->lost_steps > PROTO_MAX_INT || g->step < -1 ||
        g->step > PROTO_MAX_INT)
        return CDDP_EPROTO_FIELD;
    int n = snprintf(buf + at, at < len ? len - at : 0, ",\"lost_steps\":%lld,\"step\":%lld}",
                     (long long)g->lost_steps, (long long)g->step);
    if (n < 0 || at + (size_t)n >= len)
        return CDDP_ETOOBIG;
    return (int)(at + (size_t)n);
}
