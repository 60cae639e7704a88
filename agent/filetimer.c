/* filetimer.c: see filetimer.h. */
#include "agent/filetimer.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "common/uuid.h"

/* Timers armed at once, all workers together; torch has no bound. */
#define FILETIMER_MAX_TIMERS 65536
/* The longest the timer sleeps, so a wall clock that is set forward is
 * seen within this (expirations are wall-clock times). */
#define FILETIMER_MAX_SLEEP_MS 1000

struct agent_filetimer {
    uv_pipe_t pipe;
    uv_timer_t timer;
    int handles;   /* open handles; freed when it reaches 0 after close */
    int writer_fd; /* our own writer: no EOF between clients */
    char *path;
    struct agent_filetimer_hooks hooks;
    struct filetimer_table table;
    char line[FILETIMER_MAX_LINE + 1];
    size_t len;
    bool discarding; /* inside a line longer than FILETIMER_MAX_LINE */
    bool closing;
    unsigned long long requests;
    char readbuf[8192];
};

static void schedule(struct agent_filetimer *ft);

static void on_timer(uv_timer_t *t)
{
    struct agent_filetimer *ft = t->data;
    struct filetimer_kill kills[16];
    size_t n;
    while ((n = filetimer_expired(&ft->table, cddp_wall_time(), kills, 16)) > 0) {
        for (size_t i = 0; i < n; i++) {
            const struct filetimer_kill *k = &kills[i];
            int rank = ft->hooks.owner ? ft->hooks.owner(ft->hooks.arg, (pid_t)k->pid) : -1;
            if (rank < 0) {
                log_warn("A2403",
                         "file timer: scope '%s' of pid %lld expired, but that process is not in "
                         "a worker group of this agent: not killed",
                         k->scope, (long long)k->pid);
                continue;
            }
            if (k->signal <= 0) {
                log_info("A2404",
                         "file timer: scope '%s' of pid %lld (local_rank %d) expired; it asked "
                         "for no signal: not killed",
                         k->scope, (long long)k->pid, rank);
                continue;
            }
            int err = kill((pid_t)k->pid, k->signal) == 0 || errno == ESRCH ? 0 : errno;
            if (ft->hooks.killed)
                ft->hooks.killed(ft->hooks.arg, rank, k, err);
        }
    }
    schedule(ft);
}

static void schedule(struct agent_filetimer *ft)
{
    if (ft->closing)
        return;
    double next = filetimer_next(&ft->table);
    if (next == 0) {
        uv_timer_stop(&ft->timer);
        return;
    }
    double wait = (next - cddp_wall_time()) * 1000.0;
    uint64_t ms = wait <= 0                        ? 0
                  : wait >= FILETIMER_MAX_SLEEP_MS ? FILETIMER_MAX_SLEEP_MS
                                                   : (uint64_t)wait + 1;
    uv_update_time(ft->timer.loop);
    uv_timer_start(&ft->timer, on_timer, ms, 0);
}

static void handle_line(struct agent_filetimer *ft, const char *line, size_t len)
{
    if (len > 0 && line[len - 1] == '\r')
        len--;
    if (len == 0)
        return;
    ft->requests++;
    struct filetimer_request r;
    char why[256] = "";
    int rc = filetimer_parse(line, len, &r, why, sizeof(why));
    if (rc) {
        log_warn("A2401", "file timer: malformed request ignored (%s): %.*s", why,
                 len > 200 ? 200 : (int)len, line);
        return;
    }
    rc = filetimer_apply(&ft->table, &r);
    if (rc)
        log_warn("A2402", "file timer: request of pid %lld (scope '%s') ignored: %s",
                 (long long)r.pid, r.scope,
                 rc == CDDP_ETOOBIG ? "too many timers armed" : cddp_strerror(rc));
    else
        log_debug("A2405", "file timer: pid %lld %s scope '%s'", (long long)r.pid,
                  r.expiration < 0 ? "released" : "armed", r.scope);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct agent_filetimer *ft = h->data;
    (void)suggested;
    *buf = uv_buf_init(ft->readbuf, sizeof(ft->readbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct agent_filetimer *ft = s->data;
    if (nread < 0) {
        /* Cannot happen while we hold a writer; stop rather than spin. */
        log_warn("A2406", "file timer: reading the pipe: %s; requests are no longer read",
                 uv_strerror((int)nread));
        uv_read_stop(s);
        return;
    }
    for (ssize_t i = 0; i < nread; i++) {
        char c = buf->base[i];
        if (c == '\n') {
            if (ft->discarding)
                log_warn("A2401", "file timer: malformed request ignored (longer than %d bytes)",
                         FILETIMER_MAX_LINE);
            else
                handle_line(ft, ft->line, ft->len);
            ft->len = 0;
            ft->discarding = false;
        } else if (!ft->discarding) {
            if (ft->len == FILETIMER_MAX_LINE)
                ft->discarding = true;
            else
                ft->line[ft->len++] = c;
        }
    }
    schedule(ft);
}

int agent_filetimer_open(uv_loop_t *loop, const char *path, const struct agent_filetimer_hooks *h,
                         struct agent_filetimer **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISFIFO(st.st_mode))
            return cddp_fail(err, errlen, CDDP_EEXISTS,
                             "TORCHELASTIC_TIMER_FILE=%s exists and is not a named pipe", path);
        unlink(path); /* torch's FileTimerServer replaces it too */
    }
    if (mkfifo(path, 0600) != 0)
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(errno),
                         "TORCHELASTIC_TIMER_FILE=%s: mkfifo: %s", path, strerror(errno));
    struct agent_filetimer *ft = calloc(1, sizeof(*ft));
    int rd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    int e = errno;
    int wr = rd >= 0 ? open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC) : -1;
    e = wr < 0 ? errno : e;
    if (ft == NULL || rd < 0 || wr < 0 || (ft->path = strdup(path)) == NULL) {
        if (rd >= 0)
            close(rd);
        if (wr >= 0)
            close(wr);
        if (ft)
            free(ft->path);
        free(ft);
        unlink(path);
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(e ? e : ENOMEM),
                         "TORCHELASTIC_TIMER_FILE=%s: opening the pipe: %s", path,
                         strerror(e ? e : ENOMEM));
    }
    ft->writer_fd = wr;
    ft->hooks = *h;
    filetimer_table_init(&ft->table, FILETIMER_MAX_TIMERS);
    uv_pipe_init(loop, &ft->pipe, 0);
    ft->pipe.data = ft;
    uv_timer_init(loop, &ft->timer);
    ft->timer.data = ft;
    ft->handles = 2;
    int rc = uv_pipe_open(&ft->pipe, rd);
    if (rc)
        close(rd); /* not the handle's yet */
    else
        rc = uv_read_start((uv_stream_t *)&ft->pipe, on_alloc, on_read);
    if (rc) {
        cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(-rc), "TORCHELASTIC_TIMER_FILE=%s: %s", path,
                  uv_strerror(rc));
        agent_filetimer_close(ft);
        return CDDP_ERR_FROM_ERRNO(-rc);
    }
    *out = ft;
    return 0;
}

void agent_filetimer_reset(struct agent_filetimer *ft)
{
    if (ft == NULL)
        return;
    filetimer_clear(&ft->table);
    schedule(ft);
}

unsigned long long agent_filetimer_requests(const struct agent_filetimer *ft)
{
    return ft ? ft->requests : 0;
}

static void on_closed(uv_handle_t *h)
{
    struct agent_filetimer *ft = h->data;
    if (--ft->handles > 0)
        return;
    filetimer_table_free(&ft->table);
    free(ft->path);
    free(ft);
}

void agent_filetimer_close(struct agent_filetimer *ft)
{
    if (ft == NULL || ft->closing)
        return;
    ft->closing = true;
    unlink(ft->path);
    if (ft->writer_fd >= 0)
        close(ft->writer_fd);
    ft->writer_fd = -1;
    uv_close((uv_handle_t *)&ft->pipe, on_closed);
    uv_close((uv_handle_t *)&ft->timer, on_closed);
}

/* ---- the agent's side: which worker a pid is, what its hang note says ---- */

/* The local rank whose live worker group holds pid, or -1. */
static int filetimer_owner(void *arg, pid_t pid)
{
    struct agent *a = arg;
    char state;
    pid_t pgrp;
    if (agent_proc_stat(pid, &state, &pgrp) != 0)
        return -1;
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].group_alive && a->workers[i].pgid > 0 && a->workers[i].pgid == pgrp)
            return i;
    return -1;
}

static void filetimer_killed(void *arg, int i, const struct filetimer_kill *k, int err)
{
    struct agent *a = arg;
    struct agent_worker *w = &a->workers[i];
    double late = cddp_wall_time() - k->expiration;
    if (err) {
        log_error("A2408",
                  "[%s] file timer: scope '%s' of pid %lld (local_rank %d) expired; %s: %s",
                  a->cfg->role, k->scope, (long long)k->pid, i, cddp_signal_name(k->signal),
                  strerror(err));
        return;
    }
    log_error("A2409",
              "[%s] file timer: scope '%s' of pid %lld (local_rank %d) expired %.1f s ago; killed "
              "it with %s, as torch's FileTimerServer does",
              a->cfg->role, k->scope, (long long)k->pid, i, late, cddp_signal_name(k->signal));
    if (w->hang_note[0] == '\0') {
        snprintf(
            w->hang_note, sizeof(w->hang_note),
            "file timer: scope '%.200s' expired (expires(after=...) overran by %.1f s); pid %lld "
            "was killed with %s",
            k->scope, late, (long long)k->pid, cddp_signal_name(k->signal));
        w->hung_at = cddp_wall_time();
    }
}

void agent_filetimer_default_path(char *out, size_t len)
{
    char id[CDDP_UUID_STR_SIZE];
    cddp_uuid4_str(id);
    snprintf(out, len, "/tmp/watchdog_timer_%s", id);
}

/* TORCHELASTIC_ENABLE_FILE_TIMER=1: serve the pipe at TORCHELASTIC_TIMER_FILE
 * (or a fresh one the workers are told of), as torchrun's agent does. */
int agent_filetimer_start(struct agent *a, char *why, size_t whylen)
{
    const char *on = getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
    if (on == NULL || strcmp(on, "1") != 0)
        return 0;
    const char *path = getenv("TORCHELASTIC_TIMER_FILE");
    if (path && path[0])
        cddp_strlcpy(a->filetimer_path, path, sizeof(a->filetimer_path));
    else
        agent_filetimer_default_path(a->filetimer_path, sizeof(a->filetimer_path));
    struct agent_filetimer_hooks h = {
        .arg = a, .owner = filetimer_owner, .killed = filetimer_killed};
    int rc = agent_filetimer_open(&a->loop, a->filetimer_path, &h, &a->filetimer, why, whylen);
    if (rc == 0)
        log_info("A2410", "[%s] serving torch's file timer at TORCHELASTIC_TIMER_FILE=%s",
                 a->cfg->role, a->filetimer_path);
    return rc;
}
