/* workers.c: see workers.h. */
#include "agent/workers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/stacks.h"
#include "common/errors.h"
#include "common/fdlimit.h"
#include "common/log.h"

/* close_range(2), Linux 5.9+; the libc wrapper is recent, the syscall is not. */
static void close_from(int lowfd)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)lowfd, ~0U, 0) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = lowfd; fd < (max > 0 ? max : 1024); fd++)
        close((int)fd);
}

void agent_inherited_ignored(sigset_t *out)
{
    sigemptyset(out);
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction old;
        if (sig == SIGKILL || sig == SIGSTOP || sig == SIGPIPE || sig == SIGXFSZ)
            continue;
        if (sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            sigaddset(out, sig);
    }
}

/* Dispositions and mask as a freshly exec'd program expects them: an ignored
 * signal (the agent ignores SIGPIPE) would otherwise stay ignored across exec;
 * the ones the agent itself inherited ignored stay so, as with Python's
 * subprocess. */
static void reset_signals(const sigset_t *ignored)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        sa.sa_handler = ignored && sigismember(ignored, sig) == 1 ? SIG_IGN : SIG_DFL;
        sigaction(sig, &sa, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

static void write_str(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* In the child, between fork and exec: only async-signal-safe calls (the
 * child of _Fork() in a process with threads may find any lock taken).
 * Every signal is blocked on entry (see fork_blocked), so none can run the
 * agent's handlers here; one sent meanwhile stays pending and is delivered
 * with its default action when reset_signals() unblocks. */
static void child_exec(const struct agent_spawn *s, pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127); /* the agent died before the death signal was armed */
    setsid();
    reset_signals(s->ignored);
    if (s->cpus)
        sched_setaffinity(0, sizeof(*s->cpus), s->cpus);
    if (s->mems)
        syscall(SYS_set_mempolicy, MPOL_BIND, s->mems, s->mems_bits + 1);

    /* Move every source fd out of the way first, so placing one cannot
     * clobber another that happens to sit on its target number. */
    enum { HIGH = 64 };
    int out = s->fd_out >= 0 ? fcntl(s->fd_out, F_DUPFD, HIGH) : -1;
    int err = s->fd_err >= 0 ? fcntl(s->fd_err, F_DUPFD, HIGH) : -1;
    int keep[16];
    int nkeep = s->nkeep < 16 ? s->nkeep : 16;
    for (int i = 0; i < nkeep; i++)
        keep[i] = fcntl(s->keep_fds[i], F_DUPFD, HIGH);
    if (out >= 0)
        dup2(out, 1);
    if (err >= 0)
        dup2(err, 2);
    for (int i = 0; i < nkeep; i++)
        dup2(keep[i], 3 + i);
    close_from(3 + nkeep);
    cddp_fdlimit_restore(); /* the agent raised its own, not the worker's */

    execve(s->path, s->argv, s->envp);
    int e = errno;
    const char *why = strerrordesc_np(e); /* strerror may translate, and allocate */
    write_str(2, "cddprun: cannot execute ");
    write_str(2, s->path);
    write_str(2, ": ");
    write_str(2, why ? why : "unknown error");
    write_str(2, "\n");
    _exit(127);
}

/* A fork with every signal blocked in both processes until the parent
 * restores its mask: the child must not run the agent's signal handlers
 * (libuv's write into a pipe the agent reads, so the agent would think the
 * signal was its own). bare: _Fork(), which runs no pthread_atfork handler,
 * for a child that only execs (libuv's handler would make it a new signal
 * pipe just for execve to close); otherwise fork(). */
static pid_t fork_blocked(sigset_t *saved, bool bare)
{
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, saved);
    pid_t p = bare ? _Fork() : fork();
    int e = errno;
    if (p != 0)
        sigprocmask(SIG_SETMASK, saved, NULL);
    errno = e;
    return p;
}

/* Workers are forked, not made as posix_spawn makes them (clone with
 * CLONE_VM | CLONE_VFORK), though that costs less CPU: the agent would wait
 * for each child until its execve, and a child that calls setsid() (a new
 * scheduler autogroup) can wait milliseconds for a CPU on a busy machine,
 * so four workers' waits came one after another (docs/benchmarks.md,
 * "Launcher start-up"). Forked, they wait side by side. */
int agent_spawn(const struct agent_spawn *s, pid_t *pid)
{
    pid_t parent = getpid();
    sigset_t saved;
    pid_t p = fork_blocked(&saved, true);
    if (p < 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    if (p == 0)
        child_exec(s, parent);
    *pid = p;
    return 0;
}

int agent_signal_group(pid_t pgid, int sig)
{
    if (pgid <= 0)
        return CDDP_ERR_FROM_ERRNO(EINVAL);
    if (kill(-pgid, sig) != 0 && errno != ESRCH)
        return CDDP_ERR_FROM_ERRNO(errno);
    return 0;
}

bool agent_group_alive(pid_t pgid)
{
    if (pgid <= 0)
        return false;
    /* EPERM would mean a member we may not signal: still a member. */
    return kill(-pgid, 0) == 0 || errno == EPERM;
}

int agent_become_subreaper(void)
{
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    return 0;
}

/* The guardian's wire format: one record per message, 8 bytes, so a write
 * is atomic on the pipe. */
struct guardian_msg {
    int32_t op; /* 'A' add, 'D' remove */
    int32_t pgid;
};

static void guardian_main(int fd)
{
    /* Survive whatever is aimed at the agent's process group or terminal;
     * only EOF on the pipe ends the guardian. */
    setpgid(0, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        bool fatal = sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL ||
                     sig == SIGABRT || sig == SIGTRAP || sig == SIGCHLD;
        sa.sa_handler = fatal ? SIG_DFL : SIG_IGN;
        sigaction(sig, &sa, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
    }
    if (fd != 3) {
        dup2(fd, 3);
        fd = 3;
    }
    close_from(4);

    size_t cap = 64, n = 0;
    pid_t *groups = malloc(cap * sizeof(pid_t));
    struct guardian_msg m;
    for (;;) {
        ssize_t r = read(fd, &m, sizeof(m));
        if (r < 0 && errno == EINTR)
            continue;
        if (r != (ssize_t)sizeof(m))
            break; /* EOF: the agent is gone (or done) */
        if (m.op == 'A' && groups) {
            if (n == cap) {
                pid_t *g = realloc(groups, cap * 2 * sizeof(pid_t));
                if (g == NULL)
                    continue;
                groups = g;
                cap *= 2;
            }
            groups[n++] = m.pgid;
        } else if (m.op == 'D') {
            for (size_t i = 0; i < n; i++) {
                if (groups[i] == m.pgid) {
                    groups[i] = groups[--n];
                    break;
                }
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        kill(-groups[i], SIGKILL);
    _exit(0);
}

int agent_guardian_start(struct agent_guardian *g)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    sigset_t saved;
    pid_t p = fork_blocked(&saved, false);
    if (p < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return CDDP_ERR_FROM_ERRNO(e);
    }
    if (p == 0) {
        close(fds[1]);
        guardian_main(fds[0]);
    }
    close(fds[0]);
    g->pid = p;
    g->fd = fds[1];
    return 0;
}

static int guardian_send(struct agent_guardian *g, int op, pid_t pgid)
{
    if (g->fd < 0)
        return CDDP_ERR_FROM_ERRNO(EPIPE);
    struct guardian_msg m = {op, (int32_t)pgid};
    for (;;) {
        ssize_t w = write(g->fd, &m, sizeof(m));
        if (w == (ssize_t)sizeof(m))
            return 0;
        if (w < 0 && errno == EINTR)
            continue;
        return CDDP_ERR_FROM_ERRNO(w < 0 ? errno : EPIPE);
    }
}

int agent_guardian_add(struct agent_guardian *g, pid_t pgid)
{
    return guardian_send(g, 'A', pgid);
}

int agent_guardian_remove(struct agent_guardian *g, pid_t pgid)
{
    return guardian_send(g, 'D', pgid);
}

void agent_guardian_close(struct agent_guardian *g)
{
    if (g->fd >= 0)
        close(g->fd);
    g->fd = -1;
}

void agent_guardian_stop(struct agent_guardian *g)
{
    agent_guardian_close(g);
    if (g->pid > 0) {
        while (waitpid(g->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    g->pid = 0;
}

/* Processes a worker started outside its own process group (a daemon that
 * called setsid) are re-parented to the agent (a subreaper) once their parent
 * is gone; killpg cannot reach them. When a group of workers has been fully
 * stopped, whatever child of ours is left, other than the guardian, is one of
 * those: it does not outlive the attempt. */
void agent_kill_strays(pid_t spare)
{
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == NULL)
        return;
    struct dirent *t;
    while ((t = readdir(tasks)) != NULL) {
        if (t->d_name[0] == '.')
            continue;
        char path[300];
        snprintf(path, sizeof(path), "/proc/self/task/%s/children", t->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        long pid;
        while (fscanf(f, "%ld", &pid) == 1) {
            if (pid <= 0 || pid == spare)
                continue;
            char state = '?';
            pid_t pgrp;
            if (agent_proc_stat((pid_t)pid, &state, &pgrp) == 0 && state == 'D') {
                kill((pid_t)pid, SIGKILL); /* stuck at exit: A2414 said so; again, quietly */
                continue;
            }
            log_warn("A0506",
                     "killing process %ld, left behind by a worker outside its process group", pid);
            kill(-(pid_t)pid, SIGKILL); /* its own group, if it leads one */
            kill((pid_t)pid, SIGKILL);
        }
        fclose(f);
    }
    closedir(tasks);
}
