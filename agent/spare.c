/*
 * spare.c: --spare_workers (docs/distributed.md, "Warm spares"). Under
 * --restart_scope=worker the agent keeps N spare processes of the
 * entrypoint started beside the group. A spare runs with CDDP_SPARE=1 and
 * CDDP_SPARE_FD (one end of a SOCK_SEQPACKET pair), does its start-up
 * that does not depend on its rank, and waits. When a worker fails, the
 * first spare is handed that worker's place in one message: the whole
 * environment the worker started now would get (NUL-separated "K=V"
 * entries, as /proc/PID/environ), and with it, as SCM_RIGHTS, the fds it
 * would get (stdout, stderr, the progress channel), placed where
 * CDDP_SPARE_FDS says. The spare becomes that local rank's process; a new
 * spare is started once the group has re-formed (its start-up would slow
 * the recovery on a busy machine).
 *
 * A spare is in its own process group with the death signal armed, and in
 * the guardian's list, like a worker: it dies with the agent. It is killed
 * whenever the group stops. One that dies unused is logged and started
 * again; after SPARE_MAX_DEATHS such deaths in a row (a program that does
 * not speak the protocol) no more are started, and the job goes on.
 */
#include "agent/agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

enum {
    SPARE_MAX_DEATHS = 3,
    SPARE_MAX_MSG = 192 * 1024, /* under a SOCK_SEQPACKET socket's default send buffer */
    SPARE_MAX_FDS = AGENT_EXTRA_MAX + 2,
};

int agent_spares_init(struct agent *a)
{
    a->spares.n = a->pol.scope == RESTART_SCOPE_WORKER ? a->cfg->spare_workers : 0;
    if (a->spares.n == 0)
        return 0;
    a->spares.s = calloc((size_t)a->spares.n, sizeof(*a->spares.s));
    if (a->spares.s == NULL)
        return -ENOMEM;
    for (int k = 0; k < a->spares.n; k++)
        a->spares.s[k].sock = -1;
    return 0;
}

void agent_spares_free(struct agent *a)
{
    free(a->spares.s);
    a->spares.s = NULL;
    a->spares.n = 0;
}

int agent_spares_ready(const struct agent *a)
{
    int n = 0;
    for (int k = 0; k < a->spares.n; k++)
        n += a->spares.s[k].pid > 0;
    return n;
}

static void slot_clear(struct agent *a, struct agent_spare *sp)
{
    if (sp->sock >= 0)
        close(sp->sock);
    if (sp->pid > 0)
        agent_guardian_remove(&a->guardian, sp->pid);
    sp->sock = -1;
    sp->pid = 0;
}

/* A spare's environment: local rank 0's, without what names a rank (an
 * entrypoint that does not know CDDP_SPARE then fails at once rather than
 * join as rank 0), with CDDP_SPARE=1 and CDDP_SPARE_FD=3. envp: room for
 * every entry of src and 2 more. */
static void spare_envp(char *const *src, char **envp)
{
    static const char *const drop[] = {"RANK=",
                                       "LOCAL_RANK=",
                                       "ROLE_RANK=",
                                       "CDDP_GENERATION=",
                                       "TORCHELASTIC_ERROR_FILE=",
                                       "CDDP_SPARE=",
                                       "CDDP_SPARE_FD="};
    int n = 0;
    for (; *src; src++) {
        bool keep = true;
        for (size_t d = 0; d < sizeof(drop) / sizeof(drop[0]); d++)
            keep = keep && strncmp(*src, drop[d], strlen(drop[d])) != 0;
        if (keep)
            envp[n++] = *src;
    }
    envp[n++] = "CDDP_SPARE=1";
    envp[n++] = "CDDP_SPARE_FD=3";
    envp[n] = NULL;
}

/* Where a spare writes before it is assigned: spare_<seq>.log in the
 * attempt's log directory (-1: the agent's own stdout and stderr). */
static int spare_log(struct agent *a, unsigned seq)
{
    char dir[4096], path[4200];
    if (a->logs.devnull || agent_logs_path(&a->logs, a->attempt, -1, NULL, dir, sizeof(dir)) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/spare_%u.log", dir, seq);
    return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
}

static int spare_start(struct agent *a, struct agent_spare *sp)
{
    struct agent_env env;
    int rank;
    int rc = agent_worker_env(a, 0, "", NULL, &env, &rank);
    if (rc)
        return rc;
    size_t count = 0;
    while (env.envp[count])
        count++;
    char **envp = malloc((count + 3) * sizeof(char *));
    int sv[2] = {-1, -1};
    if (envp == NULL)
        rc = -ENOMEM;
    else if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        rc = CDDP_ERR_FROM_ERRNO(errno);
    pid_t pid = 0;
    unsigned seq = a->spares.seq++;
    if (rc == 0) {
        spare_envp(env.envp, envp);
        int log_fd = spare_log(a, seq);
        struct agent_spawn s = {
            .path = a->cfg->program,
            .argv = a->cfg->argv,
            .envp = envp,
            .fd_out = log_fd,
            .fd_err = log_fd,
            .keep_fds = &sv[1],
            .nkeep = 1,
            .ignored = &a->inherited_ignored,
        };
        rc = agent_spawn(&s, &pid);
        if (log_fd >= 0)
            close(log_fd);
    }
    if (sv[1] >= 0)
        close(sv[1]);
    free(envp);
    agent_env_free(&env);
    if (rc) {
        if (sv[0] >= 0)
            close(sv[0]);
        return rc;
    }
    sp->pid = pid;
    sp->sock = sv[0];
    sp->started = cddp_wall_time();
    if (agent_guardian_add(&a->guardian, pid) != 0)
        log_warn("A0247", "the guardian is gone; it is restarted when its exit is seen (a spare)");
    log_info("A0240",
             "[%s] started spare worker %u (pid %d): it waits to take a failed rank's place",
             a->cfg->role, seq, (int)pid);
    return 0;
}

void agent_spares_fill(struct agent *a)
{
    if (a->spares.n == 0 || a->spares.given_up || a->shutting_down || a->pol.state != AGENT_RUNNING)
        return;
    for (int k = 0; k < a->spares.n; k++) {
        struct agent_spare *sp = &a->spares.s[k];
        if (sp->pid > 0)
            continue;
        int rc = spare_start(a, sp);
        if (rc) {
            log_warn("A0241",
                     "[%s] could not start a spare worker: %s (the job goes on without it)",
                     a->cfg->role, cddp_strerror(rc));
            return;
        }
    }
}

void agent_spares_stop(struct agent *a)
{
    for (int k = 0; k < a->spares.n; k++) {
        struct agent_spare *sp = &a->spares.s[k];
        if (sp->pid <= 0)
            continue;
        agent_signal_group(sp->pid, SIGKILL);
        /* (SIGKILLed while it waits on its socket: reaped at once) */
        while (waitpid(sp->pid, NULL, 0) < 0 && errno == EINTR)
            ;
        log_debug("A0242", "spare worker pid %d stopped with the group", (int)sp->pid);
        slot_clear(a, sp);
    }
}

bool agent_spares_reaped(struct agent *a, pid_t pid, int status)
{
    for (int k = 0; k < a->spares.n; k++) {
        struct agent_spare *sp = &a->spares.s[k];
        if (sp->pid != pid)
            continue;
        char how[64];
        if (WIFSIGNALED(status))
            snprintf(how, sizeof(how), "killed by signal %d", WTERMSIG(status));
        else
            snprintf(how, sizeof(how), "exit code %d", WEXITSTATUS(status));
        agent_signal_group(pid, SIGKILL); /* whatever it started */
        slot_clear(a, sp);
        a->spares.deaths++;
        if (a->spares.deaths >= SPARE_MAX_DEATHS) {
            a->spares.given_up = true;
            log_warn("A0244",
                     "[%s] spare worker pid %d exited unused (%s): %d spares in a row did; no "
                     "more are started (does %s speak the spare protocol? docs/distributed.md, "
                     "\"Warm spares\"); failed workers are started anew",
                     a->cfg->role, (int)pid, how, a->spares.deaths, a->entry_name);
        } else {
            log_warn("A0243", "[%s] spare worker pid %d exited unused (%s); starting another",
                     a->cfg->role, (int)pid, how);
            agent_spares_fill(a);
        }
        return true;
    }
    return false;
}

/* The assignment: envp as NUL-separated entries, then CDDP_SPARE_FDS
 * naming where each passed fd goes; fds as SCM_RIGHTS. */
static int send_assignment(int sock, char *const *envp, const int *fds, const int *where, int nfds)
{
    size_t len = 0;
    for (char *const *e = envp; *e; e++)
        len += strlen(*e) + 1;
    len += 64;
    if (len > SPARE_MAX_MSG)
        return CDDP_ERR_FROM_ERRNO(EMSGSIZE);
    char *msg = malloc(len);
    if (msg == NULL)
        return -ENOMEM;
    size_t n = 0;
    for (char *const *e = envp; *e; e++) {
        size_t l = strlen(*e) + 1;
        memcpy(msg + n, *e, l);
        n += l;
    }
    n += (size_t)snprintf(msg + n, len - n, "CDDP_SPARE_FDS=");
    for (int k = 0; k < nfds; k++)
        n += (size_t)snprintf(msg + n, len - n, "%s%d", k ? "," : "", where[k]);
    n++; /* its NUL */

    struct iovec iov = {.iov_base = msg, .iov_len = n};
    union {
        char buf[CMSG_SPACE(sizeof(int) * SPARE_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t w = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    int e = errno;
    free(msg);
    if (w < 0)
        return CDDP_ERR_FROM_ERRNO(e);
    return (size_t)w == n ? 0 : CDDP_ERR_FROM_ERRNO(EMSGSIZE);
}

int agent_spares_take(struct agent *a, int i)
{
    struct agent_spare *sp = NULL;
    for (int k = 0; k < a->spares.n && sp == NULL; k++)
        if (a->spares.s[k].pid > 0)
            sp = &a->spares.s[k];
    if (sp == NULL)
        return CDDP_ERR_FROM_ERRNO(ESRCH);
    struct agent_worker_extras extras;
    struct agent_env env;
    int rc = agent_worker_prepare(a, i, &extras, &env);
    if (rc)
        return rc;
    int out_fd = -1, err_fd = -1;
    rc = agent_worker_stdio(a, i, &out_fd, &err_fd);
    /* (a stream the worker would inherit is the agent's own: the spare's
     * went to its log file until now) */
    int fds[SPARE_MAX_FDS], where[SPARE_MAX_FDS], nfds = 0;
    fds[nfds] = out_fd >= 0 ? out_fd : 1;
    where[nfds++] = 1;
    fds[nfds] = err_fd >= 0 ? err_fd : 2;
    where[nfds++] = 2;
    for (int k = 0; k < extras.nfds; k++) {
        fds[nfds] = extras.fds[k];
        where[nfds++] = 3 + k; /* as agent_spawn places them */
    }
    if (rc == 0)
        rc = send_assignment(sp->sock, env.envp, fds, where, nfds);
    if (out_fd >= 0)
        close(out_fd);
    if (err_fd >= 0)
        close(err_fd);
    agent_worker_release_extras(&extras);
    agent_env_free(&env);
    pid_t pid = sp->pid;
    if (rc) {
        log_warn("A0245",
                 "[%s] handing local_rank %d to spare worker pid %d: %s; starting a new "
                 "process instead",
                 a->cfg->role, i, (int)pid, cddp_strerror(rc));
        agent_signal_group(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        slot_clear(a, sp);
        return rc;
    }
    slot_clear(a, sp); /* the guardian takes it back as the worker's group */
    a->spares.deaths = 0;
    agent_worker_started(a, i, pid);
    log_info("A0246", "[%s] spare worker pid %d takes the place of local_rank %d (rank %d)",
             a->cfg->role, (int)pid, i, a->workers[i].info.rank);
    return 0;
}

void agent_spares_guard(struct agent *a)
{
    for (int k = 0; k < a->spares.n; k++)
        if (a->spares.s[k].pid > 0)
            agent_guardian_add(&a->guardian, a->spares.s[k].pid);
}
