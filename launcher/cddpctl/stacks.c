/*
 * stacks.c: cddpctl stacks HOST:PORT [--timeout SECONDS]: POST /stacks asks
 * cddprun for a capture of every running worker's stacks (docs/status.md),
 * then GET /stacks until that capture is served; prints it (escaped as a
 * text with its lines and tabs, safe.h).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/exitcodes.h"
#include "launcher/cddpctl/ctl.h"
#include "launcher/cddpctl/http.h"
#include "launcher/cddpctl/safe.h"

/* POST /stacks: the number of the capture asked for, or 0 with the error
 * said (*rc set). */
static long long ask(const struct ctl_options *o, const char *url, double timeout_s,
                     struct ctl_frame *f, int *rc)
{
    struct ctl_reply r;
    long long id = 0;
    *rc = ctl_request(url, true, o->shown, timeout_s, &r, f);
    if (*rc == 0) {
        cJSON *root = cJSON_ParseWithLength(r.body.data, r.body.len);
        const cJSON *cap = cJSON_GetObjectItemCaseSensitive(root, "capture");
        id = r.code == 202 && cJSON_IsNumber(cap) ? (long long)cap->valuedouble : 0;
        if (id <= 0) {
            char ex[96];
            ctl_excerpt(&r.body, ex, sizeof(ex));
            ctl_http_error(f, url, r.code, ex);
            *rc = CDDP_EXIT_FAILURE;
        }
        cJSON_Delete(root);
    }
    ctl_reply_free(&r);
    return id;
}

int ctl_stacks(const struct ctl_options *o, struct ctl_frame *f)
{
    double timeout_s = o->timeout_given ? o->timeout_s : 15;
    char url[2100];
    snprintf(url, sizeof(url), "%s/stacks", o->base);
    int rc;
    long long id = ask(o, url, timeout_s, f, &rc);
    /* The capture is bounded on the agent's side (a few seconds); wait for
     * the one asked for, or a later one. */
    double waited = 0;
    while (rc == 0) {
        struct ctl_reply r;
        rc = ctl_request(url, false, o->shown, timeout_s, &r, f);
        long long got = 0;
        if (rc == 0 && r.code == 200 && sscanf(r.body.data, "# capture %lld", &got) == 1 &&
            got >= id) {
            fwrite(r.body.data, 1, r.body.len, f->out); /* escaped with the frame */
            ctl_reply_free(&r);
            break;
        }
        ctl_reply_free(&r);
        if (rc)
            break;
        if (waited >= timeout_s) {
            ctl_timed_out(f, o->shown, timeout_s);
            rc = CDDP_EXIT_FAILURE;
            break;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 0.2;
    }
    return rc;
}
