/* stacks.c: see stacks.h. */
#include "agent/stacks.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/strutil.h"

/* The first line of a /proc file, newline removed ("" when unreadable). */
static void read_line(const char *path, char *out, size_t len)
{
    out[0] = '\0';
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return;
    if (fgets(out, (int)len, f) == NULL)
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* The state letter and process group from /proc/PID/stat ("pid (comm) S ppid pgrp ..."). */
static int stat_fields(const char *dir, char *state, long *pgrp)
{
    char path[300], line[1024];
    snprintf(path, sizeof(path), "%s/stat", dir);
    read_line(path, line, sizeof(line));
    const char *p = strrchr(line, ')');
    long ppid;
    if (p == NULL || sscanf(p + 1, " %c %ld %ld", state, &ppid, pgrp) != 3)
        return -1;
    return 0;
}

int agent_proc_stat(pid_t pid, char *state, pid_t *pgrp)
{
    char dir[64];
    long g = 0;
    snprintf(dir, sizeof(dir), "/proc/%d", (int)pid);
    if (pid <= 0 || stat_fields(dir, state, &g) != 0)
        return -1;
    *pgrp = (pid_t)g;
    return 0;
}

static void write_thread(FILE *out, const char *dir, const char *tid)
{
    char path[800], comm[256], wchan[256], syscall[256];
    char state = '?';
    long pgrp = 0;
    snprintf(path, sizeof(path), "%s/comm", dir);
    read_line(path, comm, sizeof(comm));
    snprintf(path, sizeof(path), "%s/wchan", dir);
    read_line(path, wchan, sizeof(wchan));
    snprintf(path, sizeof(path), "%s/syscall", dir);
    read_line(path, syscall, sizeof(syscall));
    stat_fields(dir, &state, &pgrp);
    fprintf(out, "  thread %s: comm=%s state=%c wchan=%s syscall=%s\n", tid, comm, state,
            wchan[0] ? wchan : "?", syscall[0] ? syscall : "?");
}

int agent_stacks_describe_group(pid_t pgid, char *out, size_t len)
{
    size_t used = 0;
    int count = 0;
    out[0] = '\0';
    DIR *procs = opendir("/proc");
    struct dirent *e;
    while (procs && (e = readdir(procs)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char dir[300], path[400], comm[64], wchan[128];
        char state;
        long pgrp;
        snprintf(dir, sizeof(dir), "/proc/%s", e->d_name);
        if (stat_fields(dir, &state, &pgrp) != 0 || pgrp != (long)pgid)
            continue;
        snprintf(path, sizeof(path), "%s/comm", dir);
        read_line(path, comm, sizeof(comm));
        snprintf(path, sizeof(path), "%s/wchan", dir);
        read_line(path, wchan, sizeof(wchan));
        const char *what = state == 'D'   ? " (uninterruptible: a hung mount or driver)"
                           : state == 'T' ? " (stopped)"
                           : state == 'Z' ? " (a zombie its parent has not reaped)"
                                          : "";
        if (used < len) {
            int n =
                snprintf(out + used, len - used, "%spid %s (%s) state %c%s wchan=%s",
                         count ? "; " : "", e->d_name, comm, state, what, wchan[0] ? wchan : "?");
            used += n > 0 ? (size_t)n : 0;
        }
        count++;
    }
    if (procs)
        closedir(procs);
    return count;
}

int agent_stacks_write_proc(pid_t pgid, const char *path)
{
    FILE *out = fopen(path, "we");
    if (out == NULL)
        return CDDP_ERR_FROM_ERRNO(errno);
    fprintf(out, "# processes of process group %d, as /proc shows them\n", (int)pgid);
    DIR *procs = opendir("/proc");
    struct dirent *e;
    while (procs && (e = readdir(procs)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char dir[300], cmd[512];
        char state;
        long pgrp;
        snprintf(dir, sizeof(dir), "/proc/%s", e->d_name);
        if (stat_fields(dir, &state, &pgrp) != 0 || pgrp != (long)pgid)
            continue;
        char p[400];
        snprintf(p, sizeof(p), "%s/cmdline", dir);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, cmd, sizeof(cmd) - 1) : -1;
        if (fd >= 0)
            close(fd);
        n = n < 0 ? 0 : n;
        for (ssize_t k = 0; k < n; k++)
            cmd[k] = cmd[k] == '\0' ? ' ' : cmd[k];
        cmd[n] = '\0';
        fprintf(out, "process %s (state %c): %s\n", e->d_name, state, cmd);
        snprintf(p, sizeof(p), "%s/task", dir);
        DIR *tasks = opendir(p);
        struct dirent *t;
        while (tasks && (t = readdir(tasks)) != NULL) {
            if (t->d_name[0] == '.')
                continue;
            char tdir[700];
            snprintf(tdir, sizeof(tdir), "%s/task/%s", dir, t->d_name);
            write_thread(out, tdir, t->d_name);
        }
        if (tasks)
            closedir(tasks);
    }
    if (procs)
        closedir(procs);
    int rc = ferror(out) ? CDDP_ERR_FROM_ERRNO(EIO) : 0;
    if (fclose(out) != 0 && rc == 0)
        rc = CDDP_ERR_FROM_ERRNO(errno);
    return rc;
}

static char *find_gdb(void)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path;;) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        char cand[4096];
        if (dl > 0 && dl + 5 < sizeof(cand)) {
            memcpy(cand, p, dl);
            memcpy(cand + dl, "/gdb", 5);
            if (access(cand, X_OK) == 0)
                return strdup(cand);
        }
        if (colon == NULL)
            return NULL;
        p = colon + 1;
    }
}

/* The processes of group pgid, its leader first: at most max. */
static int group_pids(pid_t pgid, pid_t *out, int max)
{
    int n = 0;
    if (max > 0 && kill(pgid, 0) == 0)
        out[n++] = pgid;
    DIR *procs = opendir("/proc");
    struct dirent *e;
    while (procs && n < max && (e = readdir(procs)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char dir[300];
        char state;
        long pgrp;
        snprintf(dir, sizeof(dir), "/proc/%s", e->d_name);
        long pid = strtol(e->d_name, NULL, 10);
        if (pid != (long)pgid && stat_fields(dir, &state, &pgrp) == 0 && pgrp == (long)pgid)
            out[n++] = (pid_t)pid;
    }
    if (procs)
        closedir(procs);
    return n;
}

/* gdb attaches to this many processes of a group at most, leader first. */
#define GDB_MAX_PROCS 16

int agent_stacks_start_gdb(pid_t pgid, const char *path, pid_t *gdb_pid)
{
    *gdb_pid = 0;
    char *gdb = find_gdb();
    if (gdb == NULL)
        return 0;
    pid_t pids[GDB_MAX_PROCS];
    int npids = group_pids(pgid, pids, GDB_MAX_PROCS);
    /* Everything the child needs is made before the fork: after it, only
     * async-signal-safe calls (fork, exec, waitpid, write). */
    char pidargs[GDB_MAX_PROCS][32], heads[GDB_MAX_PROCS][96];
    for (int k = 0; k < npids; k++) {
        snprintf(pidargs[k], sizeof(pidargs[k]), "%d", (int)pids[k]);
        snprintf(heads[k], sizeof(heads[k]),
                 "\n# gdb, process %d: every thread's native stack, then py-bt\n", (int)pids[k]);
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || devnull < 0) {
        int rc = CDDP_ERR_FROM_ERRNO(errno);
        if (fd >= 0)
            close(fd);
        if (devnull >= 0)
            close(devnull);
        free(gdb);
        return rc;
    }
    pid_t child = fork();
    if (child == 0) {
        /* One gdb after the other, the leader first; the agent kills this
         * whole process group at its time bound. */
        setpgid(0, 0);
        dup2(devnull, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        /* The agent's handlers (libuv's) write to the agent's own pipes:
         * not from here. */
        for (int sg = 1; sg < NSIG; sg++)
            signal(sg, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int k = 0; k < npids; k++) {
            if (write(1, heads[k], strlen(heads[k])) < 0) {
                /* gdb's output says what it can */
            }
            pid_t g = fork();
            if (g == 0) {
                execl(gdb, "gdb", "-nx", "-batch", "-p", pidargs[k], "-ex", "set pagination off",
                      "-ex", "thread apply all bt", "-ex", "py-bt", (char *)NULL);
                _exit(127);
            }
            while (g > 0 && waitpid(g, NULL, 0) < 0 && errno == EINTR) {
            }
        }
        _exit(0);
    }
    int err = errno;
    close(fd);
    close(devnull);
    free(gdb);
    if (child < 0)
        return CDDP_ERR_FROM_ERRNO(err);
    setpgid(child, child); /* both sides, so a kill of the group never misses it */
    *gdb_pid = child;
    return 0;
}

/* ---- a capture of several groups, bounded ---- */

int agent_stacks_job_init(struct agent_stacks_job *job, uv_loop_t *loop, void *data)
{
    memset(job, 0, sizeof(*job));
    job->data = data;
    int rc = uv_timer_init(loop, &job->timer);
    job->timer.data = job;
    return rc;
}

static void on_job_timer(uv_timer_t *t)
{
    struct agent_stacks_job *job = t->data;
    if (!job->running)
        return;
    job->timed_out = job->pending > 0;
    agent_stacks_job_finish(job);
}

int agent_stacks_job_start(struct agent_stacks_job *job, struct agent_stacks_target *targets,
                           int ntargets, agent_stacks_done_cb done)
{
    if (job->running)
        return CDDP_EEXISTS;
    job->targets = targets;
    job->ntargets = ntargets;
    job->pending = 0;
    job->timed_out = false;
    job->done = done;
    for (int i = 0; i < ntargets; i++) {
        struct agent_stacks_target *t = &targets[i];
        t->gdb = 0;
        t->rc = 0;
        if (t->pgid <= 0)
            continue;
        t->rc = agent_stacks_write_proc(t->pgid, t->path);
        if (t->rc == 0)
            t->rc = agent_stacks_start_gdb(t->pgid, t->path, &t->gdb);
        job->pending += t->gdb > 0;
    }
    job->running = true;
    /* Without a gdb to wait for, the capture is complete: said from the
     * loop all the same, as the callback rule promises. */
    uv_timer_start(&job->timer, on_job_timer, job->pending ? AGENT_STACKS_TIMEOUT_MS : 0, 0);
    return 0;
}

bool agent_stacks_job_reaped(struct agent_stacks_job *job, pid_t pid)
{
    if (!job->running || pid <= 0)
        return false;
    for (int i = 0; i < job->ntargets; i++) {
        if (job->targets[i].gdb != pid)
            continue;
        job->targets[i].gdb = 0; /* reaped: not killed again */
        if (--job->pending == 0)
            agent_stacks_job_finish(job);
        return true;
    }
    return false;
}

void agent_stacks_job_finish(struct agent_stacks_job *job)
{
    if (!job->running)
        return;
    job->running = false;
    uv_timer_stop(&job->timer);
    for (int i = 0; i < job->ntargets; i++) {
        if (job->targets[i].gdb > 0)
            kill(-job->targets[i].gdb, SIGKILL); /* out of time; reaped by the agent */
        job->targets[i].gdb = 0;
    }
    job->pending = 0;
    job->done(job); /* may start the next capture */
}

void agent_stacks_job_close(struct agent_stacks_job *job, uv_close_cb cb)
{
    uv_close((uv_handle_t *)&job->timer, cb);
}

int agent_stacks_merge(const char *path, const char *title, const struct agent_stacks_target *t,
                       int n)
{
    FILE *out = fopen(path, "we");
    int rc = out ? 0 : CDDP_ERR_FROM_ERRNO(errno);
    if (out)
        fprintf(out, "%s\n", title);
    for (int i = 0; i < n; i++) {
        FILE *in = t[i].pgid > 0 ? fopen(t[i].path, "re") : NULL;
        if (in == NULL)
            continue;
        if (out) {
            fprintf(out, "\n## %s\n", t[i].label);
            char buf[8192];
            size_t got;
            while ((got = fread(buf, 1, sizeof(buf), in)) > 0)
                fwrite(buf, 1, got, out);
        }
        fclose(in);
        unlink(t[i].path);
    }
    if (out && fclose(out) != 0)
        rc = CDDP_ERR_FROM_ERRNO(errno);
    return rc;
}
