/*
 * job.c: cddpctl job RDZV_HOST:PORT RUN_ID: a run as its rendezvous
 * server knows it (cddp-rdzv's /status, or a hosting agent's rdzv_server)
 * and, through each agent's status port (told in its join, or
 * --agent-port), every worker of the job; docs/status.md, "cddpctl job".
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/exitcodes.h"
#include "common/hostport.h"
#include "common/strutil.h"
#include "launcher/cddpctl/ctl.h"
#include "launcher/cddpctl/http.h"
#include "launcher/cddpctl/render.h"
#include "launcher/cddpctl/safe.h"

/* The host a node id names. cddprun's agents join as "HOST_PID_0", or
 * "rNNNNNNN_HOST_PID" with a fixed node rank (agent/rdzv_c10d.c); other
 * clients as "HOST:PORT". False when the id has none of these shapes. */
static bool node_host(const char *node, char *host, size_t len)
{
    struct cddp_hostport hp;
    char err[64];
    if (strchr(node, '_') == NULL) {
        if (cddp_hostport_parse(node, -1, &hp, err, sizeof(err)) != 0 || !hp.has_port)
            return false;
        cddp_strlcpy(host, hp.host, len);
        return host[0] != '\0';
    }
    const char *b = node, *e = node + strlen(node);
    if (b[0] == 'r' && strspn(b + 1, "0123456789") == 7 && b[8] == '_') {
        b += 9; /* rNNNNNNN_HOST_PID */
    } else {
        /* HOST_PID_0: drop the last field. */
        const char *u = strrchr(b, '_');
        if (u == NULL || u[1] == '\0' || strspn(u + 1, "0123456789") != strlen(u + 1))
            return false;
        e = u;
    }
    const char *u = e;
    while (u > b && u[-1] != '_')
        u--;
    if (u <= b + 1 || u == e || strspn(u, "0123456789") != (size_t)(e - u))
        return false; /* no "_PID" */
    size_t n = (size_t)(u - 1 - b);
    if (n + 1 > len)
        return false;
    memcpy(host, b, n);
    host[n] = '\0';
    return true;
}

struct job_node {
    const cJSON *node; /* in the server's run */
    bool waiting;
    char agent[300]; /* HOST:PORT of its agent, "" when not asked */
    char url[400];
    struct ctl_reply reply;
    cJSON *status; /* the agent's /status, or NULL */
    char error[512];
};

/* The run in a server's /status (cddp-rdzv's, or the one a hosting agent
 * serves under rdzv_server); NULL with a message when it is not there. */
static const cJSON *find_run(const cJSON *root, const char *run_id, char *msg, size_t len)
{
    const cJSON *runs = ctl_field(root, "runs");
    if (strcmp(ctl_str(root, "kind", ""), "agent") == 0) {
        const cJSON *hosted = ctl_field(root, "rdzv_server");
        if (!cJSON_IsObject(hosted)) {
            snprintf(msg, len,
                     "this is an agent that does not host the rendezvous server: give the "
                     "status port of cddp-rdzv or of the hosting agent");
            return NULL;
        }
        runs = ctl_field(hosted, "runs");
    }
    const cJSON *r;
    size_t n = (size_t)snprintf(msg, len, "no run '%s' on it (runs:", run_id);
    int count = 0;
    cJSON_ArrayForEach(r, runs)
    {
        if (strcmp(ctl_str(r, "run_id", ""), run_id) == 0)
            return r;
        if (n < len)
            n += (size_t)snprintf(msg + n, len - n, " %s", ctl_str(r, "run_id", "?"));
        count++;
    }
    if (n < len)
        snprintf(msg + n, len - n, "%s)", count ? "" : " none");
    return NULL;
}

/* Asks every node's agent for its /status at once (http.h). */
static void job_fetch_agents(const struct ctl_options *o, struct job_node *nodes, size_t n)
{
    const char **urls = calloc(n, sizeof(*urls));
    struct ctl_reply **replies = calloc(n, sizeof(*replies));
    if (urls == NULL || replies == NULL) {
        for (size_t i = 0; i < n; i++)
            snprintf(nodes[i].error, sizeof(nodes[i].error), "out of memory");
        free(urls);
        free(replies);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct job_node *jn = &nodes[i];
        replies[i] = &jn->reply;
        if (!jn->agent[0])
            continue;
        snprintf(jn->url, sizeof(jn->url), "http://%s/status", jn->agent);
        urls[i] = jn->url;
    }
    ctl_get_many(urls, replies, n, o->timeout_s);
    for (size_t i = 0; i < n; i++) {
        struct job_node *jn = &nodes[i];
        if (urls[i] == NULL)
            continue;
        struct ctl_reply *r = &jn->reply;
        if (r->curl_rc != 0) {
            ctl_transfer_error(r, jn->url, jn->agent, o->timeout_s, jn->error, sizeof(jn->error));
        } else if (r->code != 200) {
            snprintf(jn->error, sizeof(jn->error), "%s answered HTTP %ld", jn->url, r->code);
        } else {
            jn->status = cJSON_ParseWithLength(r->body.data, r->body.len);
            if (!cJSON_IsObject(jn->status) ||
                strcmp(ctl_str(jn->status, "kind", ""), "agent") != 0) {
                snprintf(jn->error, sizeof(jn->error), "%s is not a cddprun status port",
                         jn->agent);
                cJSON_Delete(jn->status);
                jn->status = NULL;
            }
        }
        ctl_reply_free(r);
    }
    free(urls);
    free(replies);
}

/* job --json: {"run_id", "rdzv", "state", "round", "min_nodes", "max_nodes",
 * "nodes": [{"node", "state", "node_rank", "nproc", "joined_at",
 * "last_seen_at", "waiting", "agent", "agent_error", "status"}]}. */
static void job_json(FILE *out, const struct ctl_options *o, const cJSON *run,
                     const struct job_node *nodes, size_t n)
{
    cJSON *j = cJSON_CreateObject();
    double v;
    cJSON_AddStringToObject(j, "run_id", o->pos[1]);
    cJSON_AddStringToObject(j, "rdzv", o->shown);
    cJSON_AddStringToObject(j, "state", ctl_str(run, "state", ""));
    static const char *const nums[] = {"round", "min_nodes", "max_nodes", "last_round_at"};
    for (size_t k = 0; k < 4; k++) {
        if (ctl_num(run, nums[k], &v))
            cJSON_AddNumberToObject(j, nums[k], v);
        else
            cJSON_AddNullToObject(j, nums[k]);
    }
    cJSON *arr = cJSON_AddArrayToObject(j, "nodes");
    for (size_t i = 0; i < n; i++) {
        const struct job_node *jn = &nodes[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "node", ctl_str(jn->node, "node", ""));
        cJSON_AddStringToObject(e, "state",
                                ctl_str(jn->node, "state", jn->waiting ? "waiting" : ""));
        static const char *const nkeys[] = {"node_rank", "nproc", "joined_at", "last_seen_at"};
        for (size_t k = 0; k < 4; k++) {
            if (ctl_num(jn->node, nkeys[k], &v))
                cJSON_AddNumberToObject(e, nkeys[k], v);
            else
                cJSON_AddNullToObject(e, nkeys[k]);
        }
        cJSON_AddBoolToObject(e, "waiting", jn->waiting);
        if (jn->agent[0])
            cJSON_AddStringToObject(e, "agent", jn->agent);
        else
            cJSON_AddNullToObject(e, "agent");
        if (jn->error[0])
            cJSON_AddStringToObject(e, "agent_error", jn->error);
        else
            cJSON_AddNullToObject(e, "agent_error");
        if (jn->status)
            cJSON_AddItemToObject(e, "status", cJSON_Duplicate(jn->status, true));
        else
            cJSON_AddNullToObject(e, "status");
        cJSON_AddItemToArray(arr, e);
    }
    char *text = cJSON_PrintUnformatted(j);
    fprintf(out, "%s\n", text ? text : "{}");
    cJSON_free(text);
    cJSON_Delete(j);
}

static void job_table(FILE *out, const struct ctl_options *o, const cJSON *root, const cJSON *run,
                      const struct job_node *nodes, size_t n)
{
    double now = 0;
    ctl_num(root, "generated_at", &now);
    char a[64], b[64], c[64], last[64];
    fprintf(out, "run %s on %s: %s, round %s, %zu node%s (min:max %s:%s), last round %s\n",
            o->pos[1], o->shown, ctl_str(run, "state", "-"),
            ctl_fmt_num(run, "round", "%.0f", a, 64), n, n == 1 ? "" : "s",
            ctl_fmt_num(run, "min_nodes", "%.0f", b, 64),
            ctl_fmt_num(run, "max_nodes", "%.0f", c, 64),
            ctl_fmt_ago(run, "last_round_at", now, last, sizeof(last)));
    if (n == 0)
        return;
    fprintf(out, "\n");
    struct ctl_table t = {0};
    ctl_table_row(&t, 7, "NODE", "STATE", "RANK", "NPROC", "JOINED", "LAST SEEN", "AGENT");
    for (size_t i = 0; i < n; i++) {
        const struct job_node *jn = &nodes[i];
        char rank[16], nproc[16], joined[64], seen[64], agent[CTL_CELL];
        const char *agent_s = "-";
        if (jn->agent[0]) {
            if (jn->status)
                snprintf(agent, sizeof(agent), "%.40s %.20s", jn->agent,
                         ctl_str(jn->status, "state", "?"));
            else
                snprintf(agent, sizeof(agent), "%.50s unreachable", jn->agent);
            agent_s = agent;
        }
        ctl_table_row(&t, 7, ctl_str(jn->node, "node", "-"),
                      jn->waiting ? "waiting" : ctl_str(jn->node, "state", "-"),
                      jn->waiting ? "-"
                                  : ctl_fmt_num(jn->node, "node_rank", "%.0f", rank, sizeof(rank)),
                      ctl_fmt_num(jn->node, "nproc", "%.0f", nproc, sizeof(nproc)),
                      ctl_fmt_ago(jn->node, "joined_at", now, joined, sizeof(joined)),
                      ctl_fmt_ago(jn->node, "last_seen_at", now, seen, sizeof(seen)), agent_s);
    }
    ctl_table_print(&t, out);
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any = any || nodes[i].agent[0] || nodes[i].error[0];
    if (!any) {
        fprintf(out, "\n(no agent of this run told the rendezvous server a status port: "
                     "--agent-port PORT asks each node's agent on that port for its workers)\n");
        return;
    }
    /* Every worker of the job, node by node; NODE replaces LOCAL's place. */
    bool bar = false;
    for (size_t i = 0; i < n; i++)
        if (nodes[i].status && ctl_workers_have_bar(o, ctl_field(nodes[i].status, "workers")))
            bar = true;
    fprintf(out, "\n");
    /* NODE RANK LOCAL PID STATE EXIT RESTARTS STEP LOSS SAMPLES/S LAST [BAR]:
     * EPOCH and STEP TIME are left out to stay within 12 columns. */
    static const int pick[] = {1, 0, 2, 3, 4, 5, 6, 8, 9, 11, 12};
    const char *row[CTL_MAX_COLS];
    size_t ncols = bar ? 12 : 11;
    row[0] = "NODE";
    for (size_t k = 0; k + 1 < ncols; k++)
        row[k + 1] = ctl_worker_titles[pick[k]];
    ctl_table_rowv(&t, ncols, row);
    for (size_t i = 0; i < n; i++) {
        const struct job_node *jn = &nodes[i];
        char host[CTL_CELL];
        cddp_strlcpy(host, jn->agent[0] ? jn->agent : ctl_str(jn->node, "node", "-"), sizeof(host));
        if (jn->status == NULL) {
            /* Its error is listed under the table. */
            const char *cells[CTL_MAX_COLS];
            for (size_t k = 0; k < ncols; k++)
                cells[k] = "-";
            cells[0] = host;
            cells[4] = "unknown";
            ctl_table_rowv(&t, ncols, cells);
            continue;
        }
        const cJSON *w;
        cJSON_ArrayForEach(w, ctl_field(jn->status, "workers"))
        {
            struct ctl_worker_cells wc;
            ctl_worker_row(o, w, bar, &wc);
            row[0] = host;
            for (size_t k = 0; k + 1 < ncols; k++)
                row[k + 1] = wc.p[pick[k]];
            ctl_table_rowv(&t, ncols, row);
        }
    }
    ctl_table_print(&t, out);
    for (size_t i = 0; i < n; i++)
        if (nodes[i].status == NULL && nodes[i].error[0])
            fprintf(out, "%s: %s\n", ctl_str(nodes[i].node, "node", "-"), nodes[i].error);
}

/* For the tables: every string the server and the agents sent, and what
 * was made of them (an agent's address, an error naming it), escaped
 * (safe.h). 0 or CDDP_ERR_FROM_ERRNO(ENOMEM). */
static int safe_for_table(cJSON *root, struct job_node *nodes, size_t n)
{
    int rc = ctl_safe_tree(root);
    for (size_t i = 0; i < n && rc == 0; i++) {
        ctl_safe_inplace(nodes[i].agent, sizeof(nodes[i].agent));
        ctl_safe_inplace(nodes[i].error, sizeof(nodes[i].error));
        rc = ctl_safe_tree(nodes[i].status);
    }
    return rc;
}

int ctl_job(const struct ctl_options *o, struct ctl_frame *f)
{
    int rc;
    cJSON *root = ctl_fetch_status(o->base, o->shown, o->timeout_s, f, &rc, NULL);
    if (root == NULL)
        return rc;
    char msg[512];
    const cJSON *run = find_run(root, o->pos[1], msg, sizeof(msg));
    if (run == NULL) {
        ctl_error(f, "K2003", "%s: %s", o->shown, msg);
        cJSON_Delete(root);
        return CTL_NO_RUN;
    }
    ctl_safe(ctl_str(run, "state", ""), f->state, sizeof(f->state));
    size_t n = (size_t)cJSON_GetArraySize(ctl_field(run, "members")) +
               (size_t)cJSON_GetArraySize(ctl_field(run, "waiting"));
    struct job_node *nodes = calloc(n ? n : 1, sizeof(*nodes));
    if (nodes == NULL) {
        ctl_out_of_memory("listing %zu nodes", n);
        cJSON_Delete(root);
        return CDDP_EXIT_FAILURE;
    }
    size_t i = 0, asked = 0;
    static const char *const lists[] = {"members", "waiting"};
    for (int l = 0; l < 2; l++) {
        const cJSON *nd;
        cJSON_ArrayForEach(nd, ctl_field(run, lists[l]))
        {
            struct job_node *jn = &nodes[i++];
            jn->node = nd;
            jn->waiting = l == 1;
            char host[256];
            /* --agent-port, else the status port the agent told the
             * server when it joined (cddprun with --status_port). */
            double told = 0;
            int port = o->agent_port;
            if (port == 0 && ctl_num(nd, "status_port", &told) && told >= 1 && told <= 65535)
                port = (int)told;
            if (port == 0)
                continue;
            asked++;
            /* A told port is the agent's own: reach it where its
             * connection to the server comes from (the node id's host
             * name need not resolve); --agent-port keeps the node id's. */
            const char *addr = ctl_str(nd, "addr", "");
            if (o->agent_port == 0 && addr[0])
                cddp_hostport_format(addr, port, jn->agent, sizeof(jn->agent));
            else if (node_host(ctl_str(nd, "node", ""), host, sizeof(host)))
                cddp_hostport_format(host, port, jn->agent, sizeof(jn->agent));
            else
                snprintf(jn->error, sizeof(jn->error), "no host name in the node id");
        }
    }
    if (asked)
        job_fetch_agents(o, nodes, n);
    if (o->json)
        job_json(f->out, o, run, nodes, n);
    else if (safe_for_table(root, nodes, n) == 0)
        job_table(f->out, o, root, run, nodes, n);
    else
        ctl_out_of_memory("escaping the status");
    for (i = 0; i < n; i++)
        cJSON_Delete(nodes[i].status);
    free(nodes);
    cJSON_Delete(root);
    return 0;
}
