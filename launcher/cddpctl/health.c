/*
 * health.c: cddpctl health HOST:PORT: GET /readyz?verbose (--live:
 * /livez), for scripts and exec probes: exit 0 when ready (alive), 1 when
 * not, 2 when unreachable. The server's check lines are printed escaped
 * (safe.h).
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "common/exitcodes.h"
#include "common/strutil.h"
#include "launcher/cddpctl/ctl.h"
#include "launcher/cddpctl/http.h"
#include "launcher/cddpctl/safe.h"

/* health --json: {"target", "endpoint", "ok", "http_status", "checks":
 * [{"name", "ok", "reason"}]} from the ?verbose list ("[+]loop ok",
 * "[-]workers failed: why"). */
static void print_health_json(FILE *out, const char *shown, const char *endpoint,
                              const struct ctl_reply *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "target", shown);
    cJSON_AddStringToObject(o, "endpoint", endpoint);
    cJSON_AddBoolToObject(o, "ok", r->code == 200);
    cJSON_AddNumberToObject(o, "http_status", (double)r->code);
    cJSON *checks = cJSON_AddArrayToObject(o, "checks");
    for (const char *line = r->body.data; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if (n > 3 && line[0] == '[' && (line[1] == '+' || line[1] == '-') && line[2] == ']') {
            char text[1024];
            snprintf(text, sizeof(text), "%.*s", (int)(n - 3), line + 3);
            bool ok = line[1] == '+';
            char *sp = strchr(text, ' ');
            const char *reason = NULL;
            if (sp) {
                *sp = '\0';
                reason = sp + 1;
                if (strncmp(reason, "failed: ", 8) == 0)
                    reason += 8;
            }
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "name", text);
            cJSON_AddBoolToObject(c, "ok", ok);
            if (ok || reason == NULL)
                cJSON_AddNullToObject(c, "reason");
            else
                cJSON_AddStringToObject(c, "reason", reason);
            cJSON_AddItemToArray(checks, c);
        }
        line = nl ? nl + 1 : NULL;
    }
    char *text = cJSON_PrintUnformatted(o);
    fprintf(out, "%s\n", text ? text : "{}");
    cJSON_free(text);
    cJSON_Delete(o);
}

/* The lines of the report (all, or the failed ones), indented, escaped. */
static void print_checks(FILE *out, const char *body, bool all)
{
    for (const char *line = body; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if (all || strncmp(line, "[-]", 3) == 0) {
            struct cddp_buf safe;
            cddp_buf_init(&safe, 64 * 1024);
            ctl_safe_text(line, n, false, &safe);
            fprintf(out, "  %s\n", safe.data ? safe.data : "");
            cddp_buf_free(&safe);
        }
        line = nl ? nl + 1 : NULL;
    }
}

int ctl_health(const struct ctl_options *o, struct ctl_frame *f)
{
    char url[2100];
    const char *endpoint = o->live ? "/livez" : "/readyz";
    snprintf(url, sizeof(url), "%s%s?verbose", o->base, endpoint);
    struct ctl_reply r;
    int rc = ctl_request(url, false, o->shown, o->timeout_s, &r, f);
    if (rc) {
        ctl_reply_free(&r);
        return rc;
    }
    const char *what = o->live ? "alive" : "ready";
    if (o->json) {
        print_health_json(f->out, o->shown, endpoint, &r);
        if (r.code != 200)
            rc = CDDP_EXIT_FAILURE;
    } else if (r.code == 200) {
        fprintf(f->out, "%s %s\n", o->shown, what);
        if (o->verbose) {
            struct cddp_buf safe;
            cddp_buf_init(&safe, 4 * CTL_REPLY_MAX);
            ctl_safe_text(r.body.data, r.body.len, true, &safe);
            if (safe.data)
                fwrite(safe.data, 1, safe.len, f->out);
            cddp_buf_free(&safe);
        }
    } else {
        fprintf(f->out, "%s not %s (HTTP %ld)\n", o->shown, what, r.code);
        /* The failed checks, or everything with --verbose. */
        print_checks(f->out, r.body.data, o->verbose);
        rc = CDDP_EXIT_FAILURE;
    }
    ctl_reply_free(&r);
    return rc;
}
