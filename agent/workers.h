/*
 * workers.h: starting worker processes, signalling their process groups,
 * and the guardian that kills them if the agent dies.
 *
 * Each worker is the leader of its own session and process group (as
 * torchrun 2.2+'s start_new_session), so one killpg() reaches everything it
 * started. The agent is a child subreaper (PR_SET_CHILD_SUBREAPER): a
 * worker's orphaned children are re-parented to it, so their exits arrive as
 * SIGCHLD too, and an emptied group can be noticed without polling.
 *
 * Workers never outlive the agent. PR_SET_PDEATHSIG covers the worker itself;
 * its children are covered by the guardian: a tiny process forked when the
 * agent starts, in its own process group, that learns every worker's process
 * group over a pipe and SIGKILLs them all when the pipe reaches EOF, which
 * happens however the agent ends, SIGKILL included.
 */
#ifndef CDDP_AGENT_WORKERS_H
#define CDDP_AGENT_WORKERS_H

#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

struct agent_spawn {
    const char *path; /* given to execve */
    char *const *argv;
    char *const *envp;
    int fd_out;          /* the worker's stdout; -1: the agent's */
    int fd_err;          /* the worker's stderr; -1: the agent's */
    const int *keep_fds; /* become fds 3, 4, ... in the worker (progress channel, ...) */
    int nkeep;
    const sigset_t *ignored; /* signals the worker starts with ignored, or NULL */
    /* --numa_binding: the CPUs (sched_setaffinity) and the memory nodes
     * (set_mempolicy MPOL_BIND, mems_bits bits) the worker starts with, set
     * between fork and exec; NULL: inherited. A refusal there is ignored:
     * the worker runs unbound (the agent logged the plan). */
    const cpu_set_t *cpus;
    const unsigned long *mems;
    unsigned long mems_bits;
};

/* The signals ignored when this process started (a nohup or a `cmd &` in a
 * script ignores some), minus SIGPIPE and SIGXFSZ: what Python's subprocess
 * gives torchrun's workers. Call before installing any handler. */
void agent_inherited_ignored(sigset_t *out);

/*
 * Forks and execs one worker: own session (setsid), PR_SET_PDEATHSIG=SIGKILL,
 * default signal dispositions (but s->ignored) and an empty signal mask,
 * stdin inherited, every other fd closed. If execve fails the child writes
 * one line to its stderr and exits 127. Returns 0 and the pid (which is also
 * its process group id), or -errno when fork fails.
 */
int agent_spawn(const struct agent_spawn *s, pid_t *pid);

/* kill(-pgid, sig); ESRCH (nobody left) is not an error. 0 or -errno. */
int agent_signal_group(pid_t pgid, int sig);

/* True while any process is left in the process group. */
bool agent_group_alive(pid_t pgid);

/* Makes this process a child subreaper. 0 or -errno. */
int agent_become_subreaper(void);

/* SIGKILLs every child of this process but spare (the guardian), and the
 * process group each leads: processes a worker started outside its own
 * group, re-parented to the subreaper, which killpg cannot reach. Each is
 * logged, except one stuck in D state (already reported as such). */
void agent_kill_strays(pid_t spare);

struct agent_guardian {
    pid_t pid; /* 0 when not running */
    int fd;    /* write end of the pipe; -1 when not running */
};

/* Forks the guardian. 0 or -errno. */
int agent_guardian_start(struct agent_guardian *g);
/* Tells the guardian about a process group to kill if the agent dies / that
 * is gone. 0 or -errno (the guardian died; restart it). */
int agent_guardian_add(struct agent_guardian *g, pid_t pgid);
int agent_guardian_remove(struct agent_guardian *g, pid_t pgid);
/* Closes the pipe: the guardian kills what it still knows, then exits. */
void agent_guardian_close(struct agent_guardian *g);
/* Closes the pipe if still open, and reaps the guardian. */
void agent_guardian_stop(struct agent_guardian *g);

#endif
