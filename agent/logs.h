/*
 * logs.h: where workers' output goes, as torchrun's DefaultLogsSpecs.
 *
 *   <log_dir>/<run_id>_<random>/attempt_<restart_count>/<local_rank>/
 *       stdout.log  stderr.log  error.json
 *
 * log_dir defaults to a new torchelastic_XXXXXX directory under $TMPDIR.
 * An attempt directory is wiped and recreated when it is used again (a
 * restart for a membership change keeps its restart count). With
 * --log_dir=/dev/null nothing is written and TORCHELASTIC_ERROR_FILE is "".
 *
 * Per worker stream: inherited from the agent (no -r/-t), written to its file
 * (-r), or teed: the worker writes into a pipe the agent's loop reads; the
 * bytes go to the file unchanged and, line by line, to the agent's own
 * stdout/stderr behind a "[<role><local_rank>]:" prefix (or
 * TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE). --local_ranks_filter hides other
 * ranks from the console: their teed streams go only to the files, their
 * inherited streams to /dev/null.
 */
#ifndef CDDP_AGENT_LOGS_H
#define CDDP_AGENT_LOGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "agent/config.h"
#include "common/queue.h"
#include "common/strutil.h"

enum agent_stream_dest {
    AGENT_DEST_INHERIT, /* the agent's own stdout/stderr */
    AGENT_DEST_FILE,    /* stdout.log / stderr.log only */
    AGENT_DEST_TEE,     /* the file, and the console with a prefix */
    AGENT_DEST_DEVNULL, /* filtered out by --local_ranks_filter */
};

/* Where stream (1 stdout, 2 stderr) of local_rank goes. Pure. */
enum agent_stream_dest agent_stream_dest(const struct launch_config *cfg, bool logs_devnull,
                                         int local_rank, int stream);

/* Python's string.Template.safe_substitute over ${role_name}, ${rank},
 * ${local_rank} (and $name forms; $$ is a dollar; anything else stays).
 * Writes at most len-1 bytes to out, always NUL-terminated. */
void agent_log_prefix(const char *tmpl, const char *role, int rank, int local_rank, char *out,
                      size_t len);

struct agent_logs {
    char *root;        /* the base directory */
    bool root_is_ours; /* we created it (mkdtemp) */
    bool devnull;      /* --log_dir=/dev/null */
    char *run_dir;     /* <root>/<run_id>_XXXXXX */
    int attempts;      /* attempt_<n>/ directories made: n < attempts */
    int nworkers;      /* the most <local_rank>/ directories made in one */
};

/* Creates the base directory (mkdir -p, or mkdtemp) and the run directory.
 * 0 or a negative code with a one-line reason in err. */
int agent_logs_init(struct agent_logs *l, const char *log_dir, const char *run_id, char *err,
                    size_t errlen);
/* Wipes and creates attempt_<attempt>/ and its <local_rank>/ directories. */
int agent_logs_attempt(struct agent_logs *l, int attempt, int nworkers, char *err, size_t errlen);
/* <run_dir>/attempt_<attempt>/<local_rank>/<file> (local_rank < 0:
 * attempt_<attempt> itself), or "" under /dev/null. */
int agent_logs_path(const struct agent_logs *l, int attempt, int local_rank, const char *file,
                    char *out, size_t len);
/* Removes the base directory when it is a temporary one we created. */
void agent_logs_remove_tmp(struct agent_logs *l);
/* rm -rf dir, symbolic links not followed. When removing the first
 * directory took slow_ns or more (a file system that waits for the disk on
 * each removal), the rest are removed side by side by threads; see logs.c.
 * agent_logs_remove_tmp's way, named for the tests (0 forces threads). */
void agent_logs_remove_tree(const char *dir, uint64_t slow_ns);
void agent_logs_free(struct agent_logs *l);

/*
 * A line splitter: bytes in, whole lines out with the prefix. A line longer
 * than AGENT_TEE_MAX_LINE is cut there; a last line without a newline gets
 * one at EOF. Pure except for the write callback.
 */
#define AGENT_TEE_MAX_LINE 65536
struct agent_lines {
    char prefix[128];
    size_t prefix_len;
    struct cddp_buf pending; /* a partial line */
};
void agent_lines_init(struct agent_lines *s, const char *prefix);
/* emit(arg, line, len) is called once per line, with prefix and newline included. */
void agent_lines_feed(struct agent_lines *s, const char *data, size_t len,
                      void (*emit)(void *arg, const char *line, size_t len), void *arg);
void agent_lines_flush(struct agent_lines *s, void (*emit)(void *arg, const char *line, size_t len),
                       void *arg);
void agent_lines_free(struct agent_lines *s);

/* One teed stream: a pipe read by the loop. Owned by the tee set; it frees
 * itself once the pipe reaches EOF (every writer gone) or the set is closed. */
struct agent_tee_set {
    uv_loop_t *loop;
    struct cddp_queue tees; /* the open ones (struct agent_tee, in logs.c) */
    int open;
    /* --duplicate_std{out,err}_filters: [0] stdout, [1] stderr. A teed line
     * whose text holds any filter (a substring) is also written, with its
     * prefix, to filtered_fd (attempt_<n>/filtered_std{out,err}.log). */
    int filtered_fd[2]; /* owned; -1: none */
    const char *const *filters[2];
    int nfilters[2];
    /* What a full disk (or any write error) kept out of the log files:
     * bytes, and the files that lost some (the filtered files count once
     * each). The console and the worker go on regardless. */
    uint64_t dropped_bytes;
    unsigned dropped_files;
    int dropped_errno; /* the first write error */
    bool filtered_warned[2];
    /* Called on the loop at the first lost bytes, then at most every
     * AGENT_TEE_DROP_REPORT_MS while more are lost, and once after the last
     * (for the status port's counter). May be NULL. */
    void (*on_drop)(void *arg);
    void *on_drop_arg;
    uv_timer_t drop_timer; /* paces on_drop; open once a drop was reported */
    bool drop_timer_open;
    bool drop_pending; /* bytes lost since on_drop was last called */
};

#define AGENT_TEE_DROP_REPORT_MS 250

void agent_tee_set_init(struct agent_tee_set *set, uv_loop_t *loop);
/* Opens file_path (truncating) and a pipe; *worker_fd is the write end to
 * give the worker (the caller closes it after spawning). 0 or -errno. */
int agent_tee_open(struct agent_tee_set *set, const char *file_path, int console_fd,
                   const char *prefix, int *worker_fd);
/* Sets where stream's (1 stdout, 2 stderr) matching lines go from now on
 * for tees opened after this call; takes fd (-1: none), closing the one
 * before. Tees already open keep their own copy of the old one. */
void agent_tee_set_filtered(struct agent_tee_set *set, int stream, int fd,
                            const char *const *filters, int nfilters);
/* True when the line's text (len bytes) holds any of the filters. Pure. */
bool agent_line_matches(const char *line, size_t len, const char *const *filters, int nfilters);
/* Reads what is left in every pipe without waiting, then closes them all
 * (and the filtered files). */
void agent_tee_set_close(struct agent_tee_set *set);

#endif
