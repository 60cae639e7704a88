/*
 * stacks.h: what a hung worker was doing, written before it is stopped.
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
 *
 * The caller bounds gdb's run (a stuck ptrace must not delay the restart:
 * SIGKILL its group after a few seconds) and reaps it (the agent reaps
 * every child). gdb needs ptrace permission over the worker: root, or
 * CAP_SYS_PTRACE, or kernel.yama.ptrace_scope=0; without it, or without gdb
 * on PATH, the file has /proc's part only.
 */
#ifndef CDDP_AGENT_STACKS_H
#define CDDP_AGENT_STACKS_H

#include <sys/types.h>

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

#endif
