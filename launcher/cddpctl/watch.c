/*
 * watch.c: --watch (status, job): the command's frame every --interval.
 * On a terminal each frame is drawn in place on the alternate screen (the
 * last one is left on the normal screen at the end); otherwise every
 * snapshot is printed after a "--- time target" line (with --json: one
 * JSON document a line). It ends on SIGINT, SIGTERM or SIGHUP (exit 0),
 * after --count snapshots, on a closed stdout, or when the server goes
 * away (refused, cut off, three timeouts in a row): exit 0 when the last
 * state seen was succeeded, else 1. docs/status.md, "--watch".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h> /* TIOCGWINSZ, the terminal's size */
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/strutil.h"
#include "launcher/cddpctl/ctl.h"
#include "launcher/cddpctl/safe.h"

/* A watch gives up after this many timeouts in a row (a refused or cut
 * connection ends it at once). */
#define WATCH_TIMEOUTS 3

volatile sig_atomic_t ctl_stop_signal;

static void on_stop_signal(int sig)
{
    ctl_stop_signal = sig;
}

static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal; /* no SA_RESTART: a sleep ends at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout shows as a write error */
}

/* Terminal size of stdout; 0 when unknown. */
static void term_size(int *cols, int *rows)
{
    struct winsize ws;
    *cols = *rows = 0;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row;
    }
}

/* A frame on the terminal: from the top left, every line cut to the width
 * and cleared to its end, the rest of the screen cleared; lines past the
 * screen's height are left out (so nothing scrolls). */
static void draw_tty(const char *frame, size_t len)
{
    int cols, rows;
    term_size(&cols, &rows);
    fputs("\033[H", stdout);
    int row = 0;
    for (const char *p = frame; p < frame + len && (rows == 0 || row < rows - 1); row++) {
        const char *nl = memchr(p, '\n', (size_t)(frame + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(frame + len - p);
        size_t shown = cols > 0 && n > (size_t)cols ? (size_t)cols : n;
        fwrite(p, 1, shown, stdout);
        fputs("\033[K\n", stdout);
        p = nl ? nl + 1 : frame + len;
    }
    fputs("\033[J", stdout);
}

/* Writes one frame: on a terminal in place under a header line (the
 * frame returned has the header, for the last screen), otherwise after a
 * "--- time target" line (none with --json). Takes buf; returns the frame
 * kept as the last one. */
static char *emit_frame(const struct ctl_options *o, bool tty, long snapshots, char *buf,
                        size_t *len)
{
    time_t now = time(NULL);
    struct tm tm;
    char when[32];
    localtime_r(&now, &tm);
    if (tty) {
        char head[512], run[208];
        strftime(when, sizeof(when), "%H:%M:%S", &tm);
        ctl_safe(o->npos > 1 ? o->pos[1] : "", run, sizeof(run));
        int hn = snprintf(head, sizeof(head), "every %gs: cddpctl %s %s%s%s   %s\n\n",
                          o->interval_s, o->cmd->name, o->shown, run[0] ? " " : "", run, when);
        if (hn < 0 || (size_t)hn >= sizeof(head))
            hn = (int)strlen(head);
        char *framed = NULL;
        size_t flen = 0;
        FILE *fm = open_memstream(&framed, &flen);
        if (fm) {
            fwrite(head, 1, (size_t)hn, fm);
            fwrite(buf, 1, *len, fm);
            fclose(fm);
            free(buf);
            buf = framed;
            *len = flen;
        }
        draw_tty(buf, *len);
        return buf;
    }
    if (!o->json) {
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        printf("%s--- %s %s\n", snapshots > 1 ? "\n" : "", when, o->shown);
    }
    fwrite(buf, 1, *len, stdout);
    return buf;
}

enum watch_end { RUNNING, INTERRUPTED, GONE, COUNTED, CLOSED_OUT, FAILED };

struct watch {
    const struct ctl_options *o;
    bool tty;
    char *last; /* the last frame drawn, for the normal screen at the end */
    size_t last_len;
    char last_state[32];
    long snapshots;
    int timeouts; /* in a row */
    char gone[512];
    int rc; /* with FAILED */
};

/* The frame shown when the program answers, but not with a status (HTTP
 * 503 while it starts): its error; with --json none (it would not be JSON). */
static char *error_frame(const struct watch *w, const char *errmsg, size_t *len)
{
    char *buf = NULL;
    *len = 0;
    FILE *mem = w->o->json ? NULL : open_memstream(&buf, len);
    if (mem) {
        fprintf(mem, "%s\n", errmsg);
        fclose(mem);
    }
    return buf;
}

/* One snapshot: render, then draw or print it, or decide that the watch
 * ends. */
static enum watch_end snapshot(struct watch *w)
{
    const struct ctl_options *o = w->o;
    char *buf;
    size_t len;
    struct ctl_frame f = {.quiet = w->snapshots > 0};
    int frc = ctl_render_frame(o, &f, &buf, &len);
    if (ctl_stop_signal) {
        free(buf);
        return INTERRUPTED;
    }
    if (buf == NULL) {
        w->rc = CDDP_EXIT_FAILURE; /* out of memory, said */
        return FAILED;
    }
    if (frc && w->snapshots == 0) {
        /* Nothing to watch: the error is logged, as without --watch. */
        free(buf);
        w->rc = frc == CTL_NO_RUN ? CDDP_EXIT_FAILURE : frc;
        return FAILED;
    }
    if (frc == CTL_EXIT_UNREACHABLE && f.timed_out && ++w->timeouts < WATCH_TIMEOUTS) {
        /* Keep the last frame; say so under it. */
        free(buf);
        if (w->tty) {
            fputs("\033[J", stdout);
            printf("\r(%s; trying again)", f.errmsg);
        }
        return RUNNING;
    }
    if (frc == CTL_EXIT_UNREACHABLE || frc == CTL_NO_RUN) {
        free(buf);
        cddp_strlcpy(w->gone, f.errmsg, sizeof(w->gone));
        return GONE;
    }
    if (frc == 0) {
        w->timeouts = 0;
        cddp_strlcpy(w->last_state, f.state, sizeof(w->last_state));
    } else {
        free(buf);
        buf = error_frame(w, f.errmsg, &len);
    }
    w->snapshots++;
    if (buf)
        buf = emit_frame(o, w->tty, w->snapshots, buf, &len);
    if (buf) {
        free(w->last);
        w->last = buf;
        w->last_len = len;
    }
    return RUNNING;
}

/* Until the next snapshot is due (from t0); a signal ends the sleep. */
static void wait_next(const struct ctl_options *o, uint64_t t0)
{
    uint64_t spent = cddp_mono_ms() - t0;
    uint64_t due = (uint64_t)(o->interval_s * 1000.0);
    if (spent < due) {
        uint64_t ms = due - spent;
        struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* The screen back, the last frame left on it, and the exit code. */
static int finish(struct watch *w, enum watch_end why)
{
    const struct ctl_options *o = w->o;
    if (w->tty) {
        fputs("\033[?25h\033[?1049l", stdout);
        if (w->last)
            fwrite(w->last, 1, w->last_len, stdout);
    }
    fflush(stdout);
    free(w->last);
    if (why == INTERRUPTED) {
        log_warn("K2001", "stopped watching %s after %ld snapshot%s (%s)", o->shown, w->snapshots,
                 w->snapshots == 1 ? "" : "s", strsignal(ctl_stop_signal));
        return 0;
    }
    if (why == GONE) {
        bool ok = strcmp(w->last_state, "succeeded") == 0;
        log_warn("K2002", "%s went away (%s); last state %s%s", o->shown, w->gone,
                 w->last_state[0] ? w->last_state : "unknown",
                 ok ? ""
                    : ": the outcome is not known (--status_linger keeps the final status "
                      "served)");
        return ok ? 0 : CDDP_EXIT_FAILURE;
    }
    return why == FAILED ? w->rc : 0;
}

int ctl_watch(const struct ctl_options *o)
{
    struct watch w = {.o = o, .tty = isatty(STDOUT_FILENO) && !o->json};
    catch_stop_signals();
    if (w.tty)
        fputs("\033[?1049h\033[?25l", stdout); /* the alternate screen, no cursor */
    enum watch_end why = RUNNING;
    while (why == RUNNING) {
        uint64_t t0 = cddp_mono_ms();
        why = snapshot(&w);
        if (why != RUNNING)
            break;
        if (fflush(stdout) != 0 || ferror(stdout))
            why = CLOSED_OUT;
        else if (o->count && w.snapshots >= o->count)
            why = COUNTED;
        else
            wait_next(o, t0);
        if (why == RUNNING && ctl_stop_signal)
            why = INTERRUPTED;
    }
    return finish(&w, why);
}
