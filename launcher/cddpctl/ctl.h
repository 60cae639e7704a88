/*
 * ctl.h: what cddpctl's files share: the parsed command line, a frame of
 * output, the commands and the exit codes (docs/status.md, "cddpctl").
 *
 *     main.c     the command line (common/flags.c) and the command table;
 *                frames written out, sanitised (safe.h)
 *     http.c     libcurl: one request, many at once, the reply and its errors
 *     render.c   the tables and the status views as text
 *     safe.c     what a server sent made safe for a terminal
 *     status.c health.c job.c stacks.c   the commands
 *     watch.c    --watch: a command's frame again and again
 *
 * Everything a server sends is data: strings from it reach stdout or
 * stderr only through safe.h (control characters escaped as \x1b).
 */
#ifndef CDDP_LAUNCHER_CDDPCTL_CTL_H
#define CDDP_LAUNCHER_CDDPCTL_CTL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* health's "cannot tell": the same number as a usage error, on purpose. */
#define CTL_EXIT_UNREACHABLE 2
/* Internal to job: the run is not on the server (exit 1). */
#define CTL_NO_RUN 3
#define CTL_MAX_POSITIONAL 4

/* Groups of options, for "--x is an option of ...". */
enum {
    OPT_JSON = 1u << 0,
    OPT_HEALTH = 1u << 1,   /* --live, --verbose */
    OPT_WATCH = 1u << 2,    /* --watch, --interval, --count */
    OPT_STEPS = 1u << 3,    /* --total-steps */
    OPT_AGENTPORT = 1u << 4 /* --agent-port */
};

struct ctl_command;

struct ctl_options {
    const struct ctl_command *cmd;
    const char *pos[CTL_MAX_POSITIONAL]; /* after the command */
    int npos;
    unsigned given; /* OPT_* seen */
    bool json, live, verbose, watch;
    double timeout_s;
    bool timeout_given; /* stacks waits longer by default */
    double interval_s;
    long count;       /* --count; 0: no limit */
    long total_steps; /* --total-steps; 0: unknown */
    long agent_port;  /* --agent-port; 0: none */
    /* The first positional as a URL base and as shown in messages. */
    char base[2048];
    char shown[300];
};

/* One frame of output: a command renders into out. It returns 0,
 * CDDP_EXIT_FAILURE (an answer that is not a status), CTL_EXIT_UNREACHABLE
 * (*timed_out for a timeout) or CTL_NO_RUN, the error said by ctl_error.
 * quiet: errors go to errmsg, not the log (a watch reports them its own
 * way). state: the agent's or run's state (sanitised), for a watch's exit
 * code. */
struct ctl_frame {
    FILE *out;
    bool quiet;
    char errmsg[512];
    bool timed_out;
    char state[32];
};

struct ctl_command {
    const char *name;
    int nargs;           /* positionals after the command */
    const char *argdesc; /* for "no ... given" */
    unsigned opts;       /* OPT_* it takes (OPT_WATCH: it can be watched) */
    int (*frame)(const struct ctl_options *o, struct ctl_frame *f);
};

int ctl_status(const struct ctl_options *o, struct ctl_frame *f); /* status.c */
int ctl_health(const struct ctl_options *o, struct ctl_frame *f); /* health.c */
int ctl_job(const struct ctl_options *o, struct ctl_frame *f);    /* job.c */
int ctl_stacks(const struct ctl_options *o, struct ctl_frame *f); /* stacks.c */

/* The stop signal (SIGINT, SIGTERM, SIGHUP) a watch caught, or 0; a
 * transfer in flight is aborted when it is set (watch.c). */
extern volatile sig_atomic_t ctl_stop_signal;

/* --watch (watch.c): the command's frame every --interval until a signal,
 * --count or the server goes away. Returns the exit code. */
int ctl_watch(const struct ctl_options *o);

/* Renders one frame of o's command (f->out is set here) and makes it safe
 * to print (safe.h: as text, or as JSON with --json). Returns the
 * command's code; *buf (the caller frees it) and *len hold the frame, or
 * *buf is NULL when memory ran out (said, and CDDP_EXIT_FAILURE). */
int ctl_render_frame(const struct ctl_options *o, struct ctl_frame *f, char **buf, size_t *len);

/* An error: formatted, sanitised (safe.h), then logged at ERROR with id or,
 * with f->quiet, kept in f->errmsg. f may be NULL (logged). */
void ctl_error(struct ctl_frame *f, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "out of memory " and what (logged, K2004). */
void ctl_out_of_memory(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
