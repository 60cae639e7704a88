/* slurm.c: a Slurm job step's environment -> proposed cddprun flags (slurm.h). */
#include "launcher/slurm.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/strutil.h"

/* The first of vars that is set (and not empty), with its name in *var. */
static const char *first_env(char **envp, const char *const *vars, const char **var)
{
    for (; *vars; vars++) {
        const char *v = cddp_flags_getenv(envp, *vars);
        if (v && *v) {
            *var = *vars;
            return v;
        }
    }
    *var = NULL;
    return NULL;
}

/* A Slurm id: a few letters, digits, '_', '.', '-' (job ids are numbers,
 * but sites and future versions may say otherwise). */
static bool is_slurm_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 31)
        return false;
    for (; *s; s++) {
        char c = *s;
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

static int number_env(const char *var, const char *v, long min, long max, const char *what,
                      long *out, char *err, size_t errlen)
{
    if (cddp_parse_long(v, min, max, out) != 0)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s='%s' is not %s (Slurm's environment)", var,
                         v, what);
    return 0;
}

static void propose(struct launch_slurm_value *val, const char *var, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void propose(struct launch_slurm_value *val, const char *var, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val->text, sizeof(val->text), fmt, ap);
    va_end(ap);
    val->var = var;
}

/* The port: 29400 + (job + step) % 1000 when both are numbers, else a
 * hash of both: the same on every node of the step. */
static int derive_port(const char *job, const char *step)
{
    long j, s;
    unsigned long sum;
    if (cddp_parse_long(job, 0, LONG_MAX / 2, &j) == 0 &&
        cddp_parse_long(step, 0, LONG_MAX / 2, &s) == 0) {
        sum = (unsigned long)j + (unsigned long)s;
    } else {
        sum = 2166136261u; /* FNV-1a over "job.step" */
        for (const char *p = job; *p; p++)
            sum = (sum ^ (unsigned char)*p) * 16777619u;
        sum = (sum ^ '.') * 16777619u;
        for (const char *p = step; *p; p++)
            sum = (sum ^ (unsigned char)*p) * 16777619u;
    }
    return LAUNCH_SLURM_PORT_BASE + (int)(sum % LAUNCH_SLURM_PORT_SPAN);
}

int launch_slurm_derive(char **envp, struct launch_slurm *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    static const char *const job_vars[] = {"SLURM_JOB_ID", "SLURM_JOBID", NULL};
    static const char *const step_vars[] = {"SLURM_STEP_ID", "SLURM_STEPID", NULL};
    static const char *const nnodes_vars[] = {"SLURM_STEP_NUM_NODES", "SLURM_NNODES",
                                              "SLURM_JOB_NUM_NODES", NULL};
    static const char *const nodeid_vars[] = {"SLURM_NODEID", NULL};
    static const char *const list_vars[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                            "SLURM_NODELIST", NULL};
    static const char *const tasks_vars[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                             NULL};
    static const char *const gpus_vars[] = {"SLURM_GPUS_ON_NODE", NULL};
    static const char *const ntasks_vars[] = {"SLURM_NTASKS_PER_NODE", NULL};
    const char *var, *v;
    long n;
    int rc;

    const char *job_var;
    out->job_id = first_env(envp, job_vars, &job_var);
    if (out->job_id == NULL)
        return 0;
    out->in_job = true;
    if (!is_slurm_id(out->job_id))
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s='%s' is not a Slurm job id", job_var,
                         out->job_id);
    const char *step_var;
    out->step_id = first_env(envp, step_vars, &step_var);
    if (out->step_id == NULL)
        return 0;
    out->in_step = true;
    if (!is_slurm_id(out->step_id))
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s='%s' is not a Slurm step id", step_var,
                         out->step_id);

    /* The node count and this node's place among them. */
    if ((v = first_env(envp, nnodes_vars, &var)) != NULL) {
        if ((rc = number_env(var, v, 1, 1000000, "a number of nodes (1-1000000)", &n, err, errlen)))
            return rc;
        out->nnodes_n = (int)n;
        propose(&out->nnodes, var, "%ld", n);
    }
    out->node_id = -1;
    if ((v = first_env(envp, nodeid_vars, &var)) != NULL) {
        long max = out->nnodes_n ? out->nnodes_n - 1 : 999999;
        char what[64];
        snprintf(what, sizeof(what), "a node index (0-%ld)", max);
        if ((rc = number_env(var, v, 0, max, what, &n, err, errlen)))
            return rc;
        out->node_id = (int)n;
        propose(&out->node_rank, var, "%ld", n);
    }

    /* One cddprun per node: it starts the node's workers itself. */
    if ((v = first_env(envp, tasks_vars, &var)) != NULL && out->node_id >= 0) {
        long here;
        char why[512];
        if (cddp_slurm_counts_nth(v, (size_t)out->node_id, &here, why, sizeof(why)) != 0)
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s (for SLURM_NODEID=%d): %s", var,
                             out->node_id, why);
        out->tasks_here = (int)here;
        out->tasks_var = var;
        if (here > 1)
            return cddp_fail(
                err, errlen, CDDP_ECONFIG,
                "srun started %ld tasks of this step on this node (%s=%s), so %ld cddprun agents "
                "would each start the node's workers: run one per node (srun "
                "--ntasks-per-node=1 cddprun ...), or give --no_slurm to lay the job out yourself",
                here, var, v, here);
    }

    /* The rendezvous: c10d on the first host, hosted by node 0's agent. */
    const char *list = first_env(envp, list_vars, &var);
    if (list != NULL) {
        char why[512];
        if (cddp_hostlist_nth(list, 0, out->first_host, sizeof(out->first_host), why,
                              sizeof(why)) != 0)
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s: %s", var, why);
        out->nodelist = list;
        out->port = derive_port(out->job_id, out->step_id);
        propose(&out->endpoint, var, "%s:%d", out->first_host, out->port);
        propose(&out->backend, var, "c10d");
    }
    propose(&out->rdzv_id, job_var, "%s.%s", out->job_id, out->step_id);

    /* Workers: the node's GPUs, else the tasks per node the job asked for. */
    if ((v = first_env(envp, gpus_vars, &var)) != NULL) {
        if ((rc = number_env(var, v, 0, 65536, "a number of GPUs (0-65536)", &n, err, errlen)))
            return rc;
        if (n >= 1)
            propose(&out->nproc, var, "%ld", n);
    }
    if (out->nproc.var == NULL && (v = first_env(envp, ntasks_vars, &var)) != NULL) {
        if ((rc = number_env(var, v, 1, 65536, "a number of tasks (1-65536)", &n, err, errlen)))
            return rc;
        propose(&out->nproc, var, "%ld", n);
    }
    propose(&out->signals, job_var, "%s", LAUNCH_SIGNALS_SLURM);
    return 0;
}

static struct launch_slurm last;

int launch_slurm_apply(char **envp, const struct launch_slurm_rows *rows,
                       struct cddp_flag_seen *seen, char *err, size_t errlen)
{
    struct launch_slurm *sl = &last;
    memset(sl, 0, sizeof(*sl));
    /* Off: nothing of Slurm's is read, not even to refuse it. */
    if (seen[rows->no_slurm].text) {
        const char *job = cddp_flags_getenv(envp, "SLURM_JOB_ID");
        if (job && *job)
            log_info("L2102", "%s: Slurm job %s's environment is not used",
                     seen[rows->no_slurm].source ? seen[rows->no_slurm].source : "--no_slurm", job);
        return 0;
    }
    int rc = launch_slurm_derive(envp, sl, err, errlen);
    if (rc)
        return rc;
    if (!sl->in_job)
        return 0;
    if (!sl->in_step) {
        log_info("L2101",
                 "in Slurm job %s but not in a job step (a batch script or salloc's shell): "
                 "Slurm's values are not used; start cddprun on every node with srun",
                 sl->job_id);
        return 0;
    }
    bool standalone = seen[rows->standalone].text != NULL;
    struct {
        int row;
        const char *flag;
        struct launch_slurm_value *val;
        bool rendezvous; /* left alone under --standalone */
        bool show_var;   /* the log names the variable */
    } fill[] = {
        {rows->nnodes, "--nnodes", &sl->nnodes, true, true},
        {rows->node_rank, "--node_rank", &sl->node_rank, true, true},
        {rows->backend, "--rdzv_backend", &sl->backend, true, false},
        {rows->endpoint, "--rdzv_endpoint", &sl->endpoint, true, false},
        {rows->rdzv_id, "--rdzv_id", &sl->rdzv_id, true, false},
        {rows->nproc, "--nproc_per_node", &sl->nproc, false, true},
        {rows->signals, "--signals_to_handle", &sl->signals, false, false},
    };
    struct cddp_buf used, kept;
    cddp_buf_init(&used, 2048);
    cddp_buf_init(&kept, 1024);
    bool endpoint_derived = false;
    for (size_t i = 0; i < sizeof(fill) / sizeof(fill[0]); i++) {
        struct cddp_flag_seen *s = &seen[fill[i].row];
        if (fill[i].val->var == NULL || (standalone && fill[i].rendezvous))
            continue;
        if (s->source != NULL) {
            cddp_buf_printf(&kept, "%s%s (%s)", kept.len ? ", " : "", fill[i].flag,
                            s->source[0] == '-' ? "command line" : s->source);
            continue;
        }
        s->text = fill[i].val->text;
        s->source = fill[i].val->var;
        cddp_buf_printf(&used, "%s%s=%s", used.len ? ", " : "", fill[i].flag, s->text);
        if (fill[i].row == rows->endpoint) {
            endpoint_derived = true;
            cddp_buf_printf(&used, " (first host of %s=%s)", fill[i].val->var, sl->nodelist);
        } else if (fill[i].show_var) {
            cddp_buf_printf(&used, " (%s)", fill[i].val->var);
        }
    }
    /* The derived endpoint is node 0's: its agent hosts the rendezvous,
     * the others only join (a port taken there is an error, not another
     * job's server to join by mistake). */
    const char *host_note = "";
    struct cddp_flag_seen *conf = &seen[rows->rdzv_conf];
    if (endpoint_derived && conf->source == NULL && strcmp(seen[rows->backend].text, "c10d") == 0) {
        conf->text = sl->node_id == 0 ? "is_host=1" : "is_host=0";
        conf->source = "SLURM_NODEID";
        host_note = sl->node_id == 0 ? "; this agent hosts the rendezvous (node 0)"
                                     : "; node 0's agent hosts the rendezvous";
    }
    log_info("L2100", "Slurm job %s step %s, node %d of %d: %s%s%s%s", sl->job_id, sl->step_id,
             sl->node_id, sl->nnodes_n, used.len ? (const char *)used.data : "nothing derived",
             host_note, kept.len ? "; kept as given: " : "",
             kept.len ? (const char *)kept.data : "");
    cddp_buf_free(&used);
    cddp_buf_free(&kept);
    return 0;
}
