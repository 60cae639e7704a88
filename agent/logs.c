/* logs.c: see logs.h. */
#include "agent/logs.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/array.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

enum agent_stream_dest agent_stream_dest(const struct launch_config *cfg, bool logs_devnull,
                                         int local_rank, int stream)
{
    /* torchrun with --log_dir=/dev/null redirects nothing and tails nothing,
     * and skips the filter too (DefaultLogsSpecs.reify). */
    if (logs_devnull)
        return AGENT_DEST_INHERIT;
    unsigned bit = stream == 1 ? LAUNCH_STD_OUT : LAUNCH_STD_ERR;
    unsigned tee = launch_std_for(&cfg->tee, local_rank);
    unsigned redirect = launch_std_for(&cfg->redirects, local_rank) | tee;
    bool shown = launch_rank_shown(cfg, local_rank);
    if (tee & bit)
        return shown ? AGENT_DEST_TEE : AGENT_DEST_FILE;
    if (redirect & bit)
        return AGENT_DEST_FILE;
    return shown ? AGENT_DEST_INHERIT : AGENT_DEST_DEVNULL;
}

static bool ident_start(char c)
{
    return c == '_' || isalpha((unsigned char)c);
}

static bool ident_char(char c)
{
    return c == '_' || isalnum((unsigned char)c);
}

void agent_log_prefix(const char *tmpl, const char *role, int rank, int local_rank, char *out,
                      size_t len)
{
    struct cddp_buf b;
    cddp_buf_init(&b, len > 0 ? len - 1 : 0);
    if (tmpl == NULL) {
        cddp_buf_printf(&b, "[%s%d]:", role, local_rank);
    } else {
        for (const char *p = tmpl; *p;) {
            if (*p != '$') {
                cddp_buf_append(&b, p++, 1);
                continue;
            }
            if (p[1] == '$') {
                cddp_buf_append(&b, "$", 1);
                p += 2;
                continue;
            }
            bool braced = p[1] == '{';
            const char *name = p + 1 + braced;
            size_t n = 0;
            if (ident_start(name[0])) {
                while (ident_char(name[n]))
                    n++;
            }
            if (n == 0 || (braced && name[n] != '}')) {
                cddp_buf_append(&b, p++, 1); /* not a placeholder: keep the '$' */
                continue;
            }
            size_t whole = 1 + braced + n + braced;
            if (n == 9 && strncmp(name, "role_name", n) == 0)
                cddp_buf_printf(&b, "%s", role);
            else if (n == 4 && strncmp(name, "rank", n) == 0)
                cddp_buf_printf(&b, "%d", rank);
            else if (n == 10 && strncmp(name, "local_rank", n) == 0)
                cddp_buf_printf(&b, "%d", local_rank);
            else
                cddp_buf_append(&b, p, whole); /* unknown: left as written */
            p += whole;
        }
    }
    if (len > 0) {
        size_t n = b.len < len - 1 ? b.len : len - 1;
        if (n)
            memcpy(out, b.data, n);
        out[n] = '\0';
    }
    cddp_buf_free(&b);
}

/* ---- directories ---- */

static int mkdir_p(const char *path)
{
    char buf[4096];
    if (cddp_strlcpy(buf, path, sizeof(buf)) >= sizeof(buf))
        return CDDP_ERR_FROM_ERRNO(ENAMETOOLONG);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return CDDP_ERR_FROM_ERRNO(errno);
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return CDDP_ERR_FROM_ERRNO(errno);
    struct stat st;
    if (stat(buf, &st) != 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    if (!S_ISDIR(st.st_mode))
        return CDDP_ERR_FROM_ERRNO(ENOTDIR);
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void rm_rf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (s == NULL)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

int agent_logs_init(struct agent_logs *l, const char *log_dir, const char *run_id, char *err,
                    size_t errlen)
{
    memset(l, 0, sizeof(*l));
    if (log_dir && strcmp(log_dir, "/dev/null") == 0) {
        l->devnull = true;
        return 0;
    }
    int rc;
    if (log_dir == NULL) {
        const char *tmp = getenv("TMPDIR");
        l->root = str_printf("%s/torchelastic_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (l->root == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        if (mkdtemp(l->root) == NULL) {
            rc = CDDP_ERR_FROM_ERRNO(errno);
            snprintf(err, errlen, "cannot create a log directory %s: %s", l->root, strerror(errno));
            return rc;
        }
        l->root_is_ours = true;
    } else {
        /* Absolute, as Python's mkdtemp makes torchrun's paths: a worker that
         * changes directory can still write its TORCHELASTIC_ERROR_FILE. */
        char cwd[4096];
        if (log_dir[0] != '/' && getcwd(cwd, sizeof(cwd)) != NULL)
            l->root = str_printf("%s/%s", cwd, log_dir);
        else
            l->root = strdup(log_dir);
        if (l->root == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        if ((rc = mkdir_p(l->root)) != 0) {
            snprintf(err, errlen, "--log_dir=%s: %s", log_dir, cddp_strerror(rc));
            return rc;
        }
    }
    /* tempfile.mkdtemp(prefix=f"{run_id}_", dir=root); a '/' in the id would
     * make it a path, so it becomes '_'. A file name holds 255 bytes: an id
     * over 248 (run ids go up to 256) names the folder by its first 248
     * (docs/cli.md); the workers' TORCHELASTIC_RUN_ID has it whole. */
    l->run_dir = str_printf("%s/%.248s_XXXXXX", l->root, run_id);
    if (l->run_dir == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    for (char *p = l->run_dir + strlen(l->root) + 1; *p; p++) {
        if (*p == '/')
            *p = '_';
    }
    if (mkdtemp(l->run_dir) == NULL) {
        rc = CDDP_ERR_FROM_ERRNO(errno);
        snprintf(err, errlen, "cannot create the run log directory %s: %s", l->run_dir,
                 strerror(errno));
        return rc;
    }
    return 0;
}

int agent_logs_path(const struct agent_logs *l, int attempt, int local_rank, const char *file,
                    char *out, size_t len)
{
    if (l->devnull) {
        if (len)
            out[0] = '\0';
        return 0;
    }
    int n;
    if (local_rank < 0)
        n = snprintf(out, len, "%s/attempt_%d", l->run_dir, attempt);
    else if (file == NULL)
        n = snprintf(out, len, "%s/attempt_%d/%d", l->run_dir, attempt, local_rank);
    else
        n = snprintf(out, len, "%s/attempt_%d/%d/%s", l->run_dir, attempt, local_rank, file);
    return n < 0 || (size_t)n >= len ? CDDP_ERR_FROM_ERRNO(ENAMETOOLONG) : 0;
}

int agent_logs_attempt(struct agent_logs *l, int attempt, int nworkers, char *err, size_t errlen)
{
    if (l->devnull)
        return 0;
    char path[4096];
    int rc = agent_logs_path(l, attempt, -1, NULL, path, sizeof(path));
    if (rc)
        return rc;
    rm_rf(path);
    if (attempt >= l->attempts)
        l->attempts = attempt + 1;
    if (nworkers > l->nworkers)
        l->nworkers = nworkers;
    if (mkdir(path, 0777) != 0) {
        rc = CDDP_ERR_FROM_ERRNO(errno);
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return rc;
    }
    for (int i = 0; i < nworkers; i++) {
        if ((rc = agent_logs_path(l, attempt, i, NULL, path, sizeof(path))) != 0)
            return rc;
        if (mkdir(path, 0777) != 0) {
            rc = CDDP_ERR_FROM_ERRNO(errno);
            snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
            return rc;
        }
    }
    return 0;
}

/*
 * Removing the temporary tree, fast where every removal waits for the disk.
 *
 * An ext4 without a journal mounted with `discard` (this project's machine)
 * issues a synchronous discard for each block it frees, so each rmdir of a
 * directory waits for the device: 1-4 ms here, and a run's seven
 * directories took 18-26 ms one after another, more than the whole run
 * (docs/benchmarks.md, "Launcher start-up"). Elsewhere (tmpfs, a journaled
 * ext4, which discards at commit) an rmdir takes microseconds.
 *
 * So the directories are removed one by one, deepest first, and the first
 * removal is timed: when it was slow, the rest are removed together. Each
 * directory below the run directory is renamed into the base directory (a
 * rename frees nothing), so that every one holds files only, and threads
 * remove them side by side, each waiting for its own discard. A directory
 * that still holds files has them unlinked first (symbolic links are never
 * followed). What a step leaves behind (a failed rename, a directory nobody
 * listed) is found by the walk that ends every removal that was not
 * complete, so this is never less thorough than rm -rf.
 */
#define RM_SLOW_NS 500000 /* an rmdir this slow waited for the device */
#define RM_MAX_THREADS 8
#define RM_MAX_DEPTH 16
#define RM_MAX_DIRS (1 << 20)

struct rm_dir {
    char *path;
    int level; /* 1: a child of the base */
};

typedef CDDP_ARRAY(struct rm_dir) rm_list;

/* Takes path (freed when it cannot be listed). */
static void rm_list_add(rm_list *d, char *path, int level)
{
    int rc;
    struct rm_dir *e = path ? cddp_array_push(d, &rc) : NULL;
    if (e == NULL) {
        free(path); /* not listed: the walk at the end gets it */
        return;
    }
    e->path = path;
    e->level = level;
}

static void rm_list_free(rm_list *d)
{
    for (size_t i = 0; i < d->len; i++)
        free(d->items[i].path);
    cddp_array_free(d);
}

/* Lists the directories below path, each after its own subdirectories. */
static void rm_collect(const char *path, int level, rm_list *d)
{
    if (level >= RM_MAX_DEPTH)
        return;
    DIR *dir = opendir(path);
    if (dir == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN)
            continue;
        char *sub = str_printf("%s/%s", path, e->d_name);
        struct stat st;
        if (sub == NULL ||
            (e->d_type == DT_UNKNOWN && (lstat(sub, &st) != 0 || !S_ISDIR(st.st_mode)))) {
            free(sub);
            continue;
        }
        rm_collect(sub, level + 1, d);
        rm_list_add(d, sub, level + 1);
    }
    closedir(dir);
}

/* Removes the directory name (relative to dirfd), first unlinking the files
 * in it if it holds any; one with a subdirectory left stays. */
static void rm_dir_at(int dirfd, const char *name)
{
    if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY)
        return;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    DIR *dir = fdopendir(fd);
    if (dir == NULL) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_type != DT_DIR)
            unlinkat(fd, e->d_name, 0); /* "." and "..": EISDIR */
    }
    closedir(dir);
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

struct rm_pool {
    int basefd;
    char **names; /* relative to basefd */
    size_t n;
    atomic_size_t next;
};

static void *rm_pool_run(void *arg)
{
    struct rm_pool *p = arg;
    size_t i;
    while ((i = atomic_fetch_add(&p->next, 1)) < p->n)
        rm_dir_at(p->basefd, p->names[i]);
    return NULL;
}

/* The slow case: d->items[from..] flattened into base, then removed by up
 * to RM_MAX_THREADS threads (this one among them). */
static void rm_parallel(const char *base, const rm_list *d, size_t from)
{
    int basefd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char **names = calloc(d->len, sizeof(*names));
    if (basefd < 0 || names == NULL) {
        if (basefd >= 0)
            close(basefd);
        free(names);
        return;
    }
    size_t n = 0;
    for (size_t i = from; i < d->len; i++) {
        char *name = d->items[i].level == 1 ? strdup(strrchr(d->items[i].path, '/') + 1)
                                            : str_printf(".cddp-rm-%zu", i);
        if (name && (d->items[i].level == 1 ||
                     renameat2(AT_FDCWD, d->items[i].path, basefd, name, RENAME_NOREPLACE) == 0))
            names[n++] = name;
        else
            free(name); /* stays where it is; its parent stays too; the walk gets both */
    }
    struct rm_pool pool = {.basefd = basefd, .names = names, .n = n};
    atomic_init(&pool.next, 0);
    pthread_t tids[RM_MAX_THREADS];
    size_t nt = 0;
    while (nt < RM_MAX_THREADS && nt + 1 < n &&
           pthread_create(&tids[nt], NULL, rm_pool_run, &pool) == 0)
        nt++;
    rm_pool_run(&pool); /* with none started, this thread does it all */
    for (size_t t = 0; t < nt; t++)
        pthread_join(tids[t], NULL);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    close(basefd);
}

/* Removes the listed directories (each after its subdirectories, all below
 * base), then base; true when base is gone. */
static bool rm_listed(const char *base, const rm_list *d, uint64_t slow_ns)
{
    for (size_t i = 0; i < d->len; i++) {
        uint64_t t0 = cddp_mono_ns();
        rm_dir_at(AT_FDCWD, d->items[i].path);
        if (i == 0 && d->len > 2 && cddp_mono_ns() - t0 >= slow_ns) {
            rm_parallel(base, d, 1);
            break;
        }
    }
    return rmdir(base) == 0 || errno == ENOENT;
}

void agent_logs_remove_tree(const char *dir, uint64_t slow_ns)
{
    rm_list d;
    cddp_array_init(&d, RM_MAX_DIRS);
    rm_collect(dir, 0, &d);
    bool gone = rm_listed(dir, &d, slow_ns);
    rm_list_free(&d);
    if (!gone)
        rm_rf(dir); /* what is left */
}

/* The directories agent_logs_init and agent_logs_attempt made, each after
 * its subdirectories: no walk needed for a tree that holds nothing else. */
static void list_made(const struct agent_logs *l, rm_list *d)
{
    char path[4096];
    for (int a = 0; a < l->attempts; a++) {
        for (int r = 0; r < l->nworkers; r++) {
            if (agent_logs_path(l, a, r, NULL, path, sizeof(path)) == 0)
                rm_list_add(d, strdup(path), 3);
        }
        if (agent_logs_path(l, a, -1, NULL, path, sizeof(path)) == 0)
            rm_list_add(d, strdup(path), 2);
    }
    rm_list_add(d, strdup(l->run_dir), 1);
}

void agent_logs_remove_tmp(struct agent_logs *l)
{
    if (!l->root_is_ours || l->root == NULL)
        return;
    rm_list d;
    cddp_array_init(&d, RM_MAX_DIRS);
    if (l->run_dir)
        list_made(l, &d);
    bool gone = rm_listed(l->root, &d, RM_SLOW_NS);
    rm_list_free(&d);
    if (!gone)
        agent_logs_remove_tree(l->root, RM_SLOW_NS); /* something else was put there */
}

void agent_logs_free(struct agent_logs *l)
{
    free(l->root);
    free(l->run_dir);
    l->root = NULL;
    l->run_dir = NULL;
}

/* ---- line splitting ---- */

void agent_lines_init(struct agent_lines *s, const char *prefix)
{
    s->prefix_len = cddp_strlcpy(s->prefix, prefix, sizeof(s->prefix));
    if (s->prefix_len >= sizeof(s->prefix))
        s->prefix_len = sizeof(s->prefix) - 1;
    cddp_buf_init(&s->pending, AGENT_TEE_MAX_LINE + sizeof(s->prefix) + 1);
}

static void emit_line(struct agent_lines *s, const char *data, size_t len,
                      void (*emit)(void *, const char *, size_t), void *arg)
{
    /* prefix + line + '\n' in one call, so lines of different workers do
     * not interleave mid-line on the console. */
    struct cddp_buf b;
    cddp_buf_init(&b, len + s->prefix_len + 1);
    if (cddp_buf_append(&b, s->prefix, s->prefix_len) == 0 && cddp_buf_append(&b, data, len) == 0 &&
        cddp_buf_append(&b, "\n", 1) == 0)
        emit(arg, b.data, b.len);
    cddp_buf_free(&b);
}

void agent_lines_feed(struct agent_lines *s, const char *data, size_t len,
                      void (*emit)(void *arg, const char *line, size_t len), void *arg)
{
    while (len > 0) {
        const char *nl = memchr(data, '\n', len);
        size_t seg = nl ? (size_t)(nl - data) : len; /* bytes before the newline */
        size_t room = AGENT_TEE_MAX_LINE - s->pending.len;
        if (seg > room) {
            /* Too long for one line: cut it at the limit. */
            cddp_buf_append(&s->pending, data, room);
            emit_line(s, s->pending.data, s->pending.len, emit, arg);
            cddp_buf_reset(&s->pending);
            data += room;
            len -= room;
            continue;
        }
        if (nl == NULL) {
            cddp_buf_append(&s->pending, data, seg); /* wait for the rest of the line */
            return;
        }
        if (s->pending.len == 0) {
            emit_line(s, data, seg, emit, arg); /* the common case: no copy */
        } else {
            cddp_buf_append(&s->pending, data, seg);
            emit_line(s, s->pending.data, s->pending.len, emit, arg);
            cddp_buf_reset(&s->pending);
        }
        data += seg + 1;
        len -= seg + 1;
    }
}

void agent_lines_flush(struct agent_lines *s, void (*emit)(void *arg, const char *line, size_t len),
                       void *arg)
{
    if (s->pending.len > 0) {
        emit_line(s, s->pending.data, s->pending.len, emit, arg);
        cddp_buf_reset(&s->pending);
    }
}

void agent_lines_free(struct agent_lines *s)
{
    cddp_buf_free(&s->pending);
}

/* ---- tees ---- */

struct agent_tee {
    uv_pipe_t pipe;
    struct agent_tee_set *set;
    struct cddp_queue node; /* in set->tees */
    char *file_path;        /* for the warning when its disk is full */
    uint64_t dropped;       /* bytes that did not reach file_fd */
    int file_fd;
    int console_fd;
    int filtered_fd; /* a copy of the set's for this stream, or -1 */
    const char *const *filters;
    int nfilters;
    bool finished;
    struct agent_lines lines;
};

/* Blocking write of everything; a full console that is non-blocking gets a
 * bounded wait. Output nobody can take (EPIPE, ENOSPC, ...) is dropped:
 * returns how many bytes were, with the error in *err. */
static size_t write_all(int fd, const char *p, size_t n, int *err)
{
    *err = 0;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            if (poll(&pfd, 1, 1000) > 0)
                continue;
        }
        *err = w < 0 ? errno : EIO;
        return n;
    }
    return 0;
}

static void on_drop_timer(uv_timer_t *h)
{
    struct agent_tee_set *set = h->data;
    if (!set->drop_pending)
        return;
    set->drop_pending = false;
    set->on_drop(set->on_drop_arg);
    uv_timer_start(&set->drop_timer, on_drop_timer, AGENT_TEE_DROP_REPORT_MS, 0);
}

/* Bytes that did not reach a log file: counted, and said once per file
 * (path, error, bytes), since a full disk would otherwise cut the logs
 * without a word while the run goes on and exits 0. */
static void count_drop(struct agent_tee_set *set, bool *warned, const char *path, size_t lost,
                       int err)
{
    if (lost == 0)
        return;
    set->dropped_bytes += lost;
    if (!*warned) {
        *warned = true;
        set->dropped_files++;
        if (set->dropped_errno == 0)
            set->dropped_errno = err;
        log_warn("A0212",
                 "%s: %s: %zu bytes of a worker's output dropped from this file, and whatever "
                 "more does not fit (the worker keeps running; the console still shows it)",
                 path, strerror(err), lost);
    }
    if (set->on_drop == NULL)
        return;
    if (!set->drop_timer_open) {
        uv_timer_init(set->loop, &set->drop_timer);
        set->drop_timer.data = set;
        set->drop_timer_open = true;
    }
    if (uv_is_active((uv_handle_t *)&set->drop_timer)) {
        set->drop_pending = true; /* on_drop_timer reports it */
        return;
    }
    set->on_drop(set->on_drop_arg);
    uv_timer_start(&set->drop_timer, on_drop_timer, AGENT_TEE_DROP_REPORT_MS, 0);
}

bool agent_line_matches(const char *line, size_t len, const char *const *filters, int nfilters)
{
    for (int i = 0; i < nfilters; i++) {
        size_t fl = strlen(filters[i]);
        if (fl == 0 || memmem(line, len, filters[i], fl) != NULL)
            return true;
    }
    return false;
}

static void console_emit(void *arg, const char *line, size_t len)
{
    struct agent_tee *t = arg;
    int err;
    write_all(t->console_fd, line, len, &err); /* a console nobody reads is not a log */
    /* torchrun's tail_logfile matches the worker's text, then writes the
     * line behind its header: the prefix is not searched. */
    size_t pl = t->lines.prefix_len < len ? t->lines.prefix_len : len;
    if (t->filtered_fd >= 0 && agent_line_matches(line + pl, len - pl, t->filters, t->nfilters)) {
        int k = t->console_fd == 2 ? 1 : 0;
        size_t lost = write_all(t->filtered_fd, line, len, &err);
        count_drop(t->set, &t->set->filtered_warned[k],
                   k ? "filtered_stderr.log" : "filtered_stdout.log", lost, err);
    }
}

static void tee_data(struct agent_tee *t, const char *buf, size_t n)
{
    if (t->file_fd >= 0) {
        int err;
        size_t lost = write_all(t->file_fd, buf, n, &err);
        bool warned = t->dropped > 0;
        t->dropped += lost;
        count_drop(t->set, &warned, t->file_path, lost, err);
    }
    agent_lines_feed(&t->lines, buf, n, console_emit, t);
}

static void tee_closed(uv_handle_t *h)
{
    struct agent_tee *t = h->data;
    agent_lines_free(&t->lines);
    free(t->file_path);
    free(t);
}

static void tee_finish(struct agent_tee *t)
{
    if (t->finished)
        return;
    t->finished = true;
    agent_lines_flush(&t->lines, console_emit, t);
    if (t->file_fd >= 0)
        close(t->file_fd);
    t->file_fd = -1;
    if (t->filtered_fd >= 0)
        close(t->filtered_fd);
    t->filtered_fd = -1;
    cddp_queue_remove(&t->node);
    t->set->open--;
    uv_close((uv_handle_t *)&t->pipe, tee_closed);
}

/* One buffer for every tee: a read callback consumes it before returning. */
static char tee_buffer[65536];

static void tee_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(tee_buffer, sizeof(tee_buffer));
}

static void tee_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct agent_tee *t = s->data;
    if (nread > 0) {
        tee_data(t, buf->base, (size_t)nread);
    } else if (nread < 0) {
        if (nread != UV_EOF)
            log_warn("A0211", "reading a worker's output: %s", uv_strerror((int)nread));
        tee_finish(t);
    }
}

void agent_tee_set_init(struct agent_tee_set *set, uv_loop_t *loop)
{
    set->loop = loop;
    cddp_queue_init(&set->tees);
    set->open = 0;
    set->dropped_bytes = 0;
    set->dropped_files = 0;
    set->dropped_errno = 0;
    set->filtered_warned[0] = set->filtered_warned[1] = false;
    set->on_drop = NULL;
    set->on_drop_arg = NULL;
    set->drop_timer_open = false;
    set->drop_pending = false;
    for (int i = 0; i < 2; i++) {
        set->filtered_fd[i] = -1;
        set->filters[i] = NULL;
        set->nfilters[i] = 0;
    }
}

void agent_tee_set_filtered(struct agent_tee_set *set, int stream, int fd,
                            const char *const *filters, int nfilters)
{
    int k = stream == 2 ? 1 : 0;
    if (set->filtered_fd[k] >= 0)
        close(set->filtered_fd[k]);
    set->filtered_fd[k] = fd;
    set->filtered_warned[k] = false; /* a new file: its losses are said again */
    set->filters[k] = filters;
    set->nfilters[k] = nfilters;
}

int agent_tee_open(struct agent_tee_set *set, const char *file_path, int console_fd,
                   const char *prefix, int *worker_fd)
{
    struct agent_tee *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    t->set = set;
    t->console_fd = console_fd;
    t->filtered_fd = -1;
    t->file_path = strdup(file_path);
    if (t->file_path == NULL) {
        free(t);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    t->file_fd = open(file_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (t->file_fd < 0) {
        int rc = CDDP_ERR_FROM_ERRNO(errno);
        free(t->file_path);
        free(t);
        return rc;
    }
    uv_file fds[2];
    int rc = uv_pipe(fds, UV_NONBLOCK_PIPE, 0); /* read end non-blocking, both CLOEXEC */
    if (rc) {
        close(t->file_fd);
        free(t->file_path);
        free(t);
        return rc;
    }
    /* From here on tee_finish() closes it. */
    int k = console_fd == 2 ? 1 : 0;
    if (set->filtered_fd[k] >= 0) {
        t->filtered_fd = fcntl(set->filtered_fd[k], F_DUPFD_CLOEXEC, 3);
        t->filters = set->filters[k];
        t->nfilters = set->nfilters[k];
    }
    uv_pipe_init(set->loop, &t->pipe, 0);
    t->pipe.data = t;
    rc = uv_pipe_open(&t->pipe, fds[0]);
    if (rc == 0)
        rc = uv_read_start((uv_stream_t *)&t->pipe, tee_alloc, tee_read);
    agent_lines_init(&t->lines, prefix);
    cddp_queue_insert_tail(&set->tees, &t->node);
    set->open++;
    if (rc) {
        close(fds[1]);
        tee_finish(t);
        return rc;
    }
    *worker_fd = fds[1];
    return 0;
}

void agent_tee_set_close(struct agent_tee_set *set)
{
    while (!cddp_queue_empty(&set->tees)) {
        struct agent_tee *t = cddp_queue_data(cddp_queue_head(&set->tees), struct agent_tee, node);
        uv_read_stop((uv_stream_t *)&t->pipe);
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&t->pipe, &fd) == 0) {
            for (;;) {
                ssize_t n = read(fd, tee_buffer, sizeof(tee_buffer));
                if (n > 0) {
                    tee_data(t, tee_buffer, (size_t)n);
                    continue;
                }
                if (n < 0 && errno == EINTR)
                    continue;
                break; /* EOF, or EAGAIN: a process outside the group still holds it */
            }
        }
        tee_finish(t);
    }
    agent_tee_set_filtered(set, 1, -1, NULL, 0);
    agent_tee_set_filtered(set, 2, -1, NULL, 0);
    if (set->drop_timer_open) {
        /* What it had not reported yet reaches the agent's final state. */
        set->drop_timer_open = false;
        uv_close((uv_handle_t *)&set->drop_timer, NULL);
    }
}
