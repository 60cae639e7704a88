/* filetimer_core.c: see filetimer_core.h. */
#include "agent/filetimer_core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

/* An integer-valued JSON number (Python writes pid and signal as ints). */
static bool int_field(const cJSON *o, const char *name, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return false;
    *out = (int64_t)d;
    return true;
}

int filetimer_parse(const char *line, size_t len, struct filetimer_request *out, char *err,
                    size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (len > FILETIMER_MAX_LINE)
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "a request of %zu bytes (at most %d)", len,
                         FILETIMER_MAX_LINE);
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (o == NULL || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return cddp_fail(err, errlen, CDDP_EPARSE, "not a JSON object");
    }
    int rc = 0;
    int64_t pid = 0, sig = 0;
    const cJSON *scope = cJSON_GetObjectItemCaseSensitive(o, "scope_id");
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(o, "expiration_time");
    if (!int_field(o, "pid", &pid))
        rc = cddp_fail(err, errlen, CDDP_EPROTO_FIELD, "\"pid\" is missing or not an integer");
    else if (!cJSON_IsString(scope))
        rc = cddp_fail(err, errlen, CDDP_EPROTO_FIELD, "\"scope_id\" is missing or not a string");
    else if (!cJSON_IsNumber(exp))
        rc = cddp_fail(err, errlen, CDDP_EPROTO_FIELD,
                       "\"expiration_time\" is missing or not a number");
    else if (!int_field(o, "signal", &sig))
        rc = cddp_fail(err, errlen, CDDP_EPROTO_FIELD, "\"signal\" is missing or not an integer");
    else if (pid <= 0 || pid > INT32_MAX)
        rc =
            cddp_fail(err, errlen, CDDP_ERANGE_ARG, "pid %lld is not a process id", (long long)pid);
    else if (sig > 64)
        rc = cddp_fail(err, errlen, CDDP_ERANGE_ARG, "signal %lld is not a signal", (long long)sig);
    else if (!isfinite(exp->valuedouble))
        rc = cddp_fail(err, errlen, CDDP_ERANGE_ARG, "expiration_time is not finite");
    else if (strlen(scope->valuestring) >= sizeof(out->scope))
        rc = cddp_fail(err, errlen, CDDP_ETOOBIG, "scope_id longer than %d bytes",
                       FILETIMER_MAX_SCOPE - 1);
    if (rc == 0) {
        out->pid = pid;
        out->signal = sig < 0 ? 0 : (int)sig;
        out->expiration = exp->valuedouble;
        cddp_strlcpy(out->scope, scope->valuestring, sizeof(out->scope));
    }
    cJSON_Delete(o);
    return rc;
}

void filetimer_table_init(struct filetimer_table *t, size_t max_timers)
{
    memset(t, 0, sizeof(*t));
    t->max = max_timers;
}

void filetimer_clear(struct filetimer_table *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->e[i].scope);
    t->n = 0;
}

void filetimer_table_free(struct filetimer_table *t)
{
    filetimer_clear(t);
    free(t->e);
    t->e = NULL;
    t->cap = 0;
}

static void remove_at(struct filetimer_table *t, size_t i)
{
    free(t->e[i].scope);
    t->e[i] = t->e[--t->n];
}

int filetimer_apply(struct filetimer_table *t, const struct filetimer_request *r)
{
    for (size_t i = 0; i < t->n; i++) {
        if (t->e[i].pid != r->pid || strcmp(t->e[i].scope, r->scope) != 0)
            continue;
        if (r->expiration < 0) {
            remove_at(t, i);
        } else {
            t->e[i].expiration = r->expiration;
            t->e[i].signal = r->signal;
        }
        return 0;
    }
    if (r->expiration < 0)
        return 0;
    if (t->n >= t->max)
        return CDDP_ETOOBIG;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        struct filetimer_entry *e = realloc(t->e, cap * sizeof(*e));
        if (e == NULL)
            return -ENOMEM;
        t->e = e;
        t->cap = cap;
    }
    char *scope = strdup(r->scope);
    if (scope == NULL)
        return -ENOMEM;
    t->e[t->n++] = (struct filetimer_entry){
        .pid = r->pid, .scope = scope, .expiration = r->expiration, .signal = r->signal};
    return 0;
}

size_t filetimer_expired(struct filetimer_table *t, double now, struct filetimer_kill *kills,
                         size_t max)
{
    size_t nk = 0;
    while (nk < max) {
        /* The next pid with an expired timer... */
        int64_t pid = 0;
        for (size_t i = 0; i < t->n && pid == 0; i++)
            if (t->e[i].expiration <= now)
                pid = t->e[i].pid;
        if (pid == 0)
            break;
        /* ...gets the signal of its earliest expired timer that has one
         * (torch sorts them by expiration_time); all its timers go. */
        struct filetimer_kill *k = &kills[nk++];
        memset(k, 0, sizeof(*k));
        k->pid = pid;
        const struct filetimer_entry *best = NULL, *first = NULL;
        for (size_t i = 0; i < t->n; i++) {
            const struct filetimer_entry *e = &t->e[i];
            if (e->pid != pid || e->expiration > now)
                continue;
            if (first == NULL || e->expiration < first->expiration)
                first = e;
            if (e->signal > 0 && (best == NULL || e->expiration < best->expiration))
                best = e;
        }
        const struct filetimer_entry *why = best ? best : first;
        k->signal = best ? best->signal : 0;
        k->expiration = why->expiration;
        cddp_strlcpy(k->scope, why->scope, sizeof(k->scope));
        for (size_t i = t->n; i-- > 0;)
            if (t->e[i].pid == pid)
                remove_at(t, i);
    }
    return nk;
}

double filetimer_next(const struct filetimer_table *t)
{
    double next = 0;
    for (size_t i = 0; i < t->n; i++)
        if (next == 0 || t->e[i].expiration < next)
            next = t->e[i].expiration;
    return next;
}
