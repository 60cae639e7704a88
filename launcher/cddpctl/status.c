/*
 * status.c: cddpctl status HOST:PORT: GET /status, printed as a table (an
 * agent's or a rendezvous server's view, render.h) or, with --json, as
 * served (one line; safe.h escapes what a terminal would obey).
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "common/exitcodes.h"
#include "common/strutil.h"
#include "launcher/cddpctl/ctl.h"
#include "launcher/cddpctl/http.h"
#include "launcher/cddpctl/render.h"
#include "launcher/cddpctl/safe.h"

int ctl_status(const struct ctl_options *o, struct ctl_frame *f)
{
    int rc;
    struct cddp_buf raw = {0};
    cJSON *root = ctl_fetch_status(o->base, o->shown, o->timeout_s, f, &rc, &raw);
    if (root == NULL)
        return rc;
    ctl_safe(ctl_str(root, "state", ""), f->state, sizeof(f->state));
    if (o->json) {
        /* As served: one line (the server writes it compact). */
        fwrite(raw.data, 1, raw.len, f->out);
        if (raw.len == 0 || raw.data[raw.len - 1] != '\n')
            fputc('\n', f->out);
    } else {
        const char *kind = ctl_str(root, "kind", "");
        bool agent = strcmp(kind, "agent") == 0, rdzv = strcmp(kind, "rdzv") == 0;
        if ((agent || rdzv) && ctl_safe_tree(root) != 0) {
            ctl_out_of_memory("escaping the status");
            rc = CDDP_EXIT_FAILURE;
        } else if (agent) {
            ctl_print_agent(o, f->out, root);
        } else if (rdzv) {
            ctl_print_rdzv(f->out, root);
        } else {
            /* A newer or unknown server: show what it said, as JSON (which
             * escapes control characters; the frame escapes the rest). */
            char *pretty = cJSON_Print(root);
            fprintf(f->out, "%s\n", pretty ? pretty : "");
            cJSON_free(pretty);
        }
    }
    cJSON_Delete(root);
    cddp_buf_free(&raw);
    return rc;
}
