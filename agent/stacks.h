/*
 * stacks.h: what a worker was doing, captured for a watchdog kill or on
 * demand (cddpctl stacks).
 *
 *     agent_stacks_write_proc(pgid, path)  every process of the group and
 *                                          every thread: what /proc says
 *                                          (comm, state, wchan, syscall);
 *                                          synchronous, never blocks on the
 *                                          worker
 *     agent_stacks_start_gdb(pgid, path)   appends gdb's backtraces of every
 *                                          thread of every process of the
 *                                          group (at most 16, the leader
 *                                          first, one gdb after the other:
 *                                          gdb -batch -p PID
 *                                          -ex 'thread apply all bt', and
 *                                          py-bt, which prints the Python
 *                                          stack when python3-dbg's gdb
 *                                          support is installed); runs as a
 *                                          child of the agent in its own
 *                                          process group
 *     struct agent_stacks_job              both of the above for a set of
 *                                          groups, on the agent's loop, gdb
 *                                          bounded to AGENT_STACKS_TIMEOUT_MS
 *                                          (a stuck ptrace must not delay a
 *                                          restart), then one callback
 *
 * The agent reaps every child: its SIGCHLD handler hands each reaped pid to
 * agent_stacks_job_reaped first. gdb needs ptrace permission over the
 * worker: root, or CAP_SYS_PTRACE, or kernel.yama.ptrace_scope=0; without
 * it, or without gdb on PATH, a file has /proc's part only.
 */
#ifndef CDDP_AGENT_STACKS_H
#define CDDP_AGENT_STACKS_H

#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

/* What /proc/PID/stat says of pid: its state letter (R, S, D, T, Z, ...)
 * and process group. 0, or -1 when pid is gone or unreadable. */
int agent_proc_stat(pid_t pid, char *state, pid_t *pgrp);

/* One line per process left in process group pgid, for a log: "pid N
 * (comm) state D wchan=...; ...", at most len bytes. Returns how many
 * processes are in the group. */
int agent_stacks_describe_group(pid_t pgid, char *out, size_t len);

/* 0 or a negative code (the file could not be written). */
int agent_stacks_write_proc(pid_t pgid, const char *path);

/* Forks a child that runs gdb on each process of group pgid in turn, its
 * output appended to path. *gdb_pid: the child (it leads its own process
 * group: kill that), or 0 when no gdb was found on PATH (returns 0 then
 * too). */
int agent_stacks_start_gdb(pid_t pgid, const char *path, pid_t *gdb_pid);

/* gdb may take this long to attach and print; then its process group is
 * killed, so a stuck ptrace delays what waits for the stacks by at most this. */
#define AGENT_STACKS_TIMEOUT_MS 5000

/* One process group to capture, and where its stacks go. */
struct agent_stacks_target {
    pid_t pgid;
    char path[4200];
    char label[128]; /* what agent_stacks_merge heads its part with */
    int rc;          /* after start: 0, or why its capture could not be made */
    pid_t gdb;       /* while running: gdb's child (0: finished, or none) */
};

struct agent_stacks_job;
/* The capture is over: every gdb finished, or the bound passed
 * (job->timed_out: the ones still running were killed), or it was ended. */
typedef void (*agent_stacks_done_cb)(struct agent_stacks_job *job);

/* A capture of a set of process groups. Embedded by its owner; the timer
 * is a handle of the owner's loop, closed by agent_stacks_job_close. */
struct agent_stacks_job {
    uv_timer_t timer; /* the bound; also reports a capture that needs no wait */
    void *data;       /* the owner's */
    struct agent_stacks_target *targets;
    int ntargets;
    int pending; /* gdbs still running */
    bool running;
    bool timed_out; /* read it in done: the bound passed */
    agent_stacks_done_cb done;
};

/* 0 or a libuv error (the timer could not be made). */
int agent_stacks_job_init(struct agent_stacks_job *job, uv_loop_t *loop, void *data);

/* Captures each target with pgid > 0 (/proc's part now, gdb's in a child)
 * into its path, and sets its rc (a target that could not be captured is
 * skipped; the caller says so). The targets stay the caller's and must
 * live until done is called. done is called once, from the loop (never
 * inside this call), when every gdb has finished or the bound passed.
 * Returns 0, or CDDP_EEXISTS without calling done: a capture is running. */
int agent_stacks_job_start(struct agent_stacks_job *job, struct agent_stacks_target *targets,
                           int ntargets, agent_stacks_done_cb done);

/* The agent reaped pid: true if it was one of this capture's gdbs (the
 * capture may end now, calling done). */
bool agent_stacks_job_reaped(struct agent_stacks_job *job, pid_t pid);

/* Ends a running capture now with what it has (gdbs still running are
 * killed; done is called). Nothing when none runs. */
void agent_stacks_job_finish(struct agent_stacks_job *job);

/* Closes the timer (end the capture first); cb as uv_close's. */
void agent_stacks_job_close(struct agent_stacks_job *job, uv_close_cb cb);

/* Writes path: the title line, then every target's file under a "## label"
 * head, each removed once copied (a target without a file is left out).
 * 0 or a negative code (path could not be written; the parts are removed
 * all the same). */
int agent_stacks_merge(const char *path, const char *title, const struct agent_stacks_target *t,
                       int n);

#endif
