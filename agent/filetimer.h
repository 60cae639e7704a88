/*
 * filetimer.h: the agent's end of torch's file timer
 * (TORCHELASTIC_ENABLE_FILE_TIMER=1), on the agent's libuv loop.
 *
 * It makes the named pipe (mkfifo, mode 0600; a named pipe already at the
 * path is replaced, as torch does, anything else there is an error), reads
 * FileTimerClient's request lines from it (agent/filetimer_core.h parses
 * them and keeps the timers) and, when a timer expires, kills its pid with
 * the signal it asked for: kill(pid, signal), that process only, as torch's
 * FileTimerServer._reap_worker does. Unlike torch it kills only a process
 * of one of this agent's worker groups (the owner hook says which worker):
 * any other pid in a request is logged and left alone, so whoever can write
 * the pipe cannot make the agent kill an unrelated process.
 *
 * A malformed request (not JSON, a field missing, longer than PIPE_BUF) is
 * logged and ignored; the pipe goes on. The agent keeps a writer open on
 * its own pipe, so the read side never sees end-of-file between clients.
 * agent_filetimer_close stops reading, removes the pipe and frees the
 * server once its handles are closed (the loop must run for that).
 */
#ifndef CDDP_AGENT_FILETIMER_H
#define CDDP_AGENT_FILETIMER_H

#include <stddef.h>
#include <sys/types.h>
#include <uv.h>

#include "agent/filetimer_core.h"

struct agent_filetimer;

struct agent_filetimer_hooks {
    void *arg;
    /* The local rank whose worker group holds pid, or -1: not ours. */
    int (*owner)(void *arg, pid_t pid);
    /* pid of local rank's group was sent k->signal (kill's errno in err, 0
     * when it was delivered or the process was already gone). */
    void (*killed)(void *arg, int local_rank, const struct filetimer_kill *k, int err);
};

/* Makes the pipe at path and serves it on loop. 0, or a negative code with
 * err filled (the pipe cannot be made or opened); the hooks are copied. */
int agent_filetimer_open(uv_loop_t *loop, const char *path, const struct agent_filetimer_hooks *h,
                         struct agent_filetimer **out, char *err, size_t errlen);

/* Drops every armed timer (a new attempt: the old pids are gone). */
void agent_filetimer_reset(struct agent_filetimer *ft);

/* Requests read so far (for tests and logs). */
unsigned long long agent_filetimer_requests(const struct agent_filetimer *ft);

/* torchrun's name for a pipe nobody named (TORCHELASTIC_TIMER_FILE unset):
 * /tmp/watchdog_timer_<uuid4>, cut to len - 1 characters. */
void agent_filetimer_default_path(char *out, size_t len);

/* Stops, removes the pipe; ft is freed once its handles close. NULL: no-op. */
void agent_filetimer_close(struct agent_filetimer *ft);

#endif
