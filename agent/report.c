/* report.c: see report.h. */
#include "agent/report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/hostname.h"
#include "common/log.h"
#include "common/file.h"
#include "common/signames.h"
#include "proto/errorfile.h"

#define ERROR_FILE_MAX (4u << 20)

extern char **environ;

/* "\n" -> "\n  ", as torch indents a traceback under its field. */
static char *indent(const char *s)
{
    size_t extra = 0;
    for (const char *p = s; *p; p++)
        extra += *p == '\n' ? 2 : 0;
    char *out = malloc(strlen(s) + extra + 1);
    if (out == NULL)
        return NULL;
    char *q = out;
    for (const char *p = s; *p; p++) {
        *q++ = *p;
        if (*p == '\n') {
            *q++ = ' ';
            *q++ = ' ';
        }
    }
    *q = '\0';
    return out;
}

static char *read_file(const char *path, size_t max, int *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *err = errno;
        return NULL;
    }
    struct cddp_buf b;
    cddp_buf_init(&b, max);
    char chunk[8192];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            *err = errno;
            break;
        }
        if (n == 0) {
            *err = 0;
            break;
        }
        if (cddp_buf_append(&b, chunk, (size_t)n) != 0) {
            *err = EFBIG;
            break;
        }
    }
    close(fd);
    if (*err) {
        cddp_buf_free(&b);
        return NULL;
    }
    if (b.data == NULL)
        cddp_buf_append(&b, "", 0);
    return b.data;
}

static void set_default_message(struct agent_failure *f)
{
    char buf[256];
    if (f->exitcode < 0)
        snprintf(buf, sizeof(buf), "Signal %d (%s) received by PID %d", -f->exitcode,
                 cddp_signal_name(-f->exitcode), f->pid);
    else
        snprintf(buf, sizeof(buf),
                 "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html");
    free(f->message);
    f->message = strdup(buf);
}

static int load(struct agent_failure *f, const char *error_file_path)
{
    f->message = NULL;
    f->error_json = NULL;
    f->has_error_file = false;
    f->timestamp = (long)floor(f->observed);
    cddp_strlcpy(f->error_file, AGENT_NOT_AVAILABLE, sizeof(f->error_file));

    struct stat st;
    if (error_file_path == NULL || error_file_path[0] == '\0' || stat(error_file_path, &st) != 0 ||
        !S_ISREG(st.st_mode)) {
        set_default_message(f);
        if (f->watchdog || f->note) {
            free(f->message);
            f->message = strdup(f->watchdog ? f->watchdog : f->note);
        }
        return f->message ? 0 : CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    f->has_error_file = true;
    cddp_strlcpy(f->error_file, error_file_path, sizeof(f->error_file));

    int err = 0;
    char *text = read_file(error_file_path, ERROR_FILE_MAX, &err);
    char why[256] = "";
    struct proto_errorfile ef = {0};
    int rc = 0;
    if (text == NULL) {
        snprintf(why, sizeof(why), "<error file unreadable: %s>", strerror(err));
        f->message = strdup(why);
    } else if ((rc = proto_errorfile_parse(text, &ef, why, sizeof(why))) == CDDP_EPARSE) {
        f->message = strdup(why);
    } else if (rc == 0) {
        if (ef.has_timestamp)
            f->timestamp = ef.timestamp;
        /* torch indents a record's traceback under its field; a plain
         * string is shown as it is. */
        f->message = ef.structured ? indent(ef.message) : strdup(ef.message);
        f->error_json = strdup(text);
    }
    proto_errorfile_free(&ef);
    free(text);
    if (f->message && f->message[0] == '\0')
        set_default_message(f);
    if (f->watchdog) {
        free(f->message);
        f->message = strdup(f->watchdog);
    }
    return f->message ? 0 : CDDP_ERR_FROM_ERRNO(ENOMEM);
}

/* What Python prints when torch is not there (a name after it, as in
 * 'torch.distributed', would be another problem). */
#define TORCH_MISSING "ModuleNotFoundError: No module named 'torch'"
#define TAIL_BYTES 16384
#define PROBE_MS 10000

/* The last TAIL_BYTES of the stderr.log beside error_file_path (the logs
 * layout: attempt_<n>/<local_rank>/), in *len bytes; NULL when there is
 * none: the worker's stderr was not redirected or teed (then the agent
 * never saw it), or the logs go to /dev/null. */
static char *read_tail(const char *error_file_path, size_t *len)
{
    const char *slash = error_file_path ? strrchr(error_file_path, '/') : NULL;
    if (slash == NULL)
        return NULL;
    struct cddp_buf path;
    cddp_buf_init(&path, 8192);
    int fd = -1;
    if (cddp_buf_printf(&path, "%.*s/stderr.log", (int)(slash - error_file_path),
                        error_file_path) == 0)
        fd = open(path.data, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    cddp_buf_free(&path);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *tail = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (tail = malloc(TAIL_BYTES)) != NULL) {
        off_t from = st.st_size > TAIL_BYTES ? st.st_size - TAIL_BYTES : 0;
        ssize_t n;
        do {
            n = pread(fd, tail, TAIL_BYTES, from);
        } while (n < 0 && errno == EINTR);
        *len = n > 0 ? (size_t)n : 0;
    }
    close(fd);
    return tail;
}

/* Whether python finds torch (importlib's find_spec: located, not
 * imported, so it is quick either way), asked by running it with the
 * agent's environment, as the workers were: 1 it does, 0 it does not, -1
 * it could not tell (would not start, failed otherwise, took longer than
 * PROBE_MS). The answer for the last interpreter asked is kept: a table
 * of many failures asks once. */
static int python_finds_torch(const char *python)
{
    static char asked[4096];
    static int answer = -1;
    if (strcmp(asked, python) == 0)
        return answer;
    static const char code[] = "import importlib.util, sys\n"
                               "sys.exit(0 if importlib.util.find_spec('torch') else 3)\n";
    char *argv[] = {(char *)python, (char *)"-c", (char *)code, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawn_file_actions_init(&fa);
    for (int fd = 0; fd < 3; fd++)
        posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd ? O_WRONLY : O_RDONLY, 0);
    posix_spawnattr_init(&attr);
    /* The agent's signal dispositions and mask are its own. */
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawn(&pid, python, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    int result = -1;
    if (rc == 0) {
        int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pfd >= 0) {
            struct pollfd p = {.fd = pfd, .events = POLLIN};
            int r;
            do {
                r = poll(&p, 1, PROBE_MS);
            } while (r < 0 && errno == EINTR);
            if (r <= 0)
                kill(pid, SIGKILL);
            close(pfd);
        }
        int status;
        pid_t w;
        do {
            w = waitpid(pid, &status, 0);
        } while (w < 0 && errno == EINTR);
        if (w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0)
            result = 1;
        else if (w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 3)
            result = 0;
    }
    cddp_strlcpy(asked, python, sizeof(asked));
    answer = result;
    return result;
}

/* agent_failure_load's no_torch (report.h). */
static bool torch_missing(const struct agent_failure *f, const char *error_file_path)
{
    if (f->python == NULL || f->watchdog)
        return false;
    if (f->has_error_file && f->message && strstr(f->message, TORCH_MISSING))
        return true;
    size_t len = 0;
    char *tail = read_tail(error_file_path, &len);
    if (tail) {
        bool hit = memmem(tail, len, TORCH_MISSING, strlen(TORCH_MISSING)) != NULL;
        free(tail);
        return hit;
    }
    /* Nothing of the worker's output to read: an uncaught exception
     * (exit 1) in a Python that has no torch is taken for this one. */
    return !f->has_error_file && f->exitcode == 1 && python_finds_torch(f->python) == 0;
}

int agent_failure_load(struct agent_failure *f, const char *error_file_path)
{
    int rc = load(f, error_file_path);
    f->no_torch = rc == 0 && torch_missing(f, error_file_path);
    return rc;
}

void agent_failure_free(struct agent_failure *f)
{
    free(f->message);
    free(f->error_json);
    f->message = NULL;
    f->error_json = NULL;
}

int agent_failure_root(const struct agent_failure *f, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (f[i].recovered != f[best].recovered) {
            if (!f[i].recovered)
                best = i;
            continue;
        }
        if (f[i].timestamp < f[best].timestamp ||
            (f[i].timestamp == f[best].timestamp && f[i].seq < f[best].seq))
            best = i;
    }
    return best;
}

/* datetime.fromtimestamp(ts).isoformat(sep="_") */
static void iso_time(long ts, char *out, size_t len)
{
    time_t t = (time_t)ts;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(out, len, "%Y-%m-%d_%H:%M:%S", &tm);
}

static int format_failure(struct cddp_buf *b, int idx, const struct agent_failure *f,
                          const char *host)
{
    char when[64];
    iso_time(f->timestamp, when, sizeof(when));
    return cddp_buf_printf(b,
                           "[%d]:\n"
                           "  time      : %s\n"
                           "  host      : %s\n"
                           "  rank      : %d (local_rank: %d)\n"
                           "  exitcode  : %d (pid: %d)\n"
                           "  error_file: %s\n"
                           "  traceback : %s",
                           idx, when, host, f->rank, f->local_rank, f->exitcode, f->pid,
                           f->error_file, f->message ? f->message : AGENT_NOT_AVAILABLE);
}

static size_t longest_line(const char *s, size_t len)
{
    size_t best = 0, cur = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\n') {
            best = cur > best ? cur : best;
            cur = 0;
        } else {
            cur++;
        }
    }
    return cur > best ? cur : best;
}

static int repeat(struct cddp_buf *b, char c, size_t n)
{
    char line[64];
    memset(line, c, sizeof(line));
    while (n > 0) {
        size_t k = n < sizeof(line) ? n : sizeof(line);
        int rc = cddp_buf_append(b, line, k);
        if (rc)
            return rc;
        n -= k;
    }
    return cddp_buf_append(b, "\n", 1);
}

int agent_failure_table(const char *name, const struct agent_failure *f, int n, const char *host,
                        const char *exit_note, struct cddp_buf *out)
{
    return agent_failure_table_as(name, "FAILED", f, n, host, exit_note, out);
}

int agent_failure_table_as(const char *name, const char *verdict, const struct agent_failure *f,
                           int n, const char *host, const char *exit_note, struct cddp_buf *out)
{
    if (n <= 0)
        return CDDP_ESTATE;
    int root = agent_failure_root(f, n);
    struct cddp_buf others, rootb, one;
    cddp_buf_init(&others, 64u << 20);
    cddp_buf_init(&rootb, 64u << 20);
    cddp_buf_init(&one, 64u << 20);
    size_t width = strlen(name) + 1 + strlen(verdict);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        cddp_buf_reset(&one);
        rc = format_failure(&one, i, &f[i], host);
        if (rc)
            break;
        size_t w = longest_line(one.data, one.len);
        width = w > width ? w : width;
        if (i == root) {
            rc = cddp_buf_append(&rootb, one.data, one.len);
        } else {
            if (others.len)
                rc = cddp_buf_append(&others, "\n", 1);
            if (rc == 0)
                rc = cddp_buf_append(&others, one.data, one.len);
        }
    }
    if (width > 60)
        width = 60;
    if (rc == 0 && others.len == 0)
        rc = cddp_buf_printf(&others, "  <NO_OTHER_FAILURES>");
    if (rc == 0)
        rc = repeat(out, '=', width);
    if (rc == 0)
        rc = cddp_buf_printf(out, "%s %s\n", name, verdict);
    if (rc == 0)
        rc = repeat(out, '-', width);
    if (rc == 0)
        rc = cddp_buf_printf(out, "Failures:\n%s\n", others.data);
    if (rc == 0)
        rc = repeat(out, '-', width);
    if (rc == 0)
        rc = cddp_buf_printf(out, "Root Cause (first observed failure):\n%s\n", rootb.data);
    for (int i = 0; i < n && rc == 0; i++) {
        if (f[i].no_torch) {
            rc = cddp_buf_printf(
                out,
                "hint: %s, the workers' Python, has no torch (ModuleNotFoundError); "
                "set PYTHON_EXEC to a Python that has PyTorch\n",
                f[i].python);
            break;
        }
    }
    if (rc == 0 && exit_note)
        rc = cddp_buf_printf(out, "%s\n", exit_note);
    if (rc == 0)
        rc = repeat(out, '=', width);
    cddp_buf_free(&others);
    cddp_buf_free(&rootb);
    cddp_buf_free(&one);
    return rc;
}

static int write_error_file(const char *path, char *json)
{
    if (json == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    int rc = cddp_write_file_atomic(path, json, strlen(json), 0644, NULL, 0);
    free(json);
    return rc;
}

int agent_write_error_file(const char *path, const struct agent_failure *root, const char *name,
                           const char *table)
{
    char *json = root->error_json && !root->watchdog
                     ? proto_errorfile_set_code(root->error_json, root->exitcode)
                     : NULL;
    if (json == NULL) {
        char text[1024];
        if (root->watchdog)
            snprintf(text, sizeof(text),
                     "WatchdogTimeout: %s FAILED: local_rank %d (rank %d, pid %d) was hung: %s",
                     name, root->local_rank, root->rank, root->pid, root->watchdog);
        else if (root->note)
            snprintf(text, sizeof(text), "ChildFailedError: %s FAILED: local_rank %d (rank %d) %s",
                     name, root->local_rank, root->rank, root->note);
        else if (root->exitcode < 0)
            snprintf(text, sizeof(text),
                     "ChildFailedError: %s FAILED: local_rank %d (rank %d, pid %d) was "
                     "killed by %s",
                     name, root->local_rank, root->rank, root->pid,
                     cddp_signal_name(-root->exitcode));
        else
            snprintf(text, sizeof(text),
                     "ChildFailedError: %s FAILED: local_rank %d (rank %d, pid %d) exited "
                     "with code %d",
                     name, root->local_rank, root->rank, root->pid, root->exitcode);
        json = proto_errorfile_build(text, table ? table : "", root->timestamp, &root->exitcode);
    }
    return write_error_file(path, json);
}

int agent_write_agent_error(const char *path, const char *message)
{
    char text[1024];
    snprintf(text, sizeof(text), "AgentError: %s", message);
    return write_error_file(path, proto_errorfile_build(text, text, (long)time(NULL), NULL));
}

/* ---- the agent's report (agent_int.h) ---- */

static void error_file_failed(const char *path, int rc)
{
    log_error("A0302", "writing the agent's error file %s: %s", path, cddp_strerror(rc));
}

void agent_note_replaced(struct agent *a, int i, int64_t gen)
{
    struct agent_replaced *grown =
        realloc(a->replaced, (size_t)(a->nreplaced + 1) * sizeof(*grown));
    if (grown == NULL) {
        log_warn("A0304", "out of memory noting a replaced worker for the failure table");
        return;
    }
    a->replaced = grown;
    const struct agent_worker *w = &a->workers[i];
    struct agent_replaced *x = &a->replaced[a->nreplaced];
    memset(x, 0, sizeof(*x));
    x->generation = gen;
    struct agent_failure *f = &x->f;
    f->local_rank = i;
    f->rank = w->info.rank;
    f->pid = (int)w->info.pid;
    f->exitcode = w->info.exitcode;
    f->observed = w->info.exit_time;
    f->seq = w->exit_seq;
    f->recovered = true;
    f->python = a->cfg->kind != LAUNCH_BINARY ? a->cfg->program : NULL;
    if (agent_failure_load(f, w->error_file) != 0) {
        agent_failure_free(f);
        return;
    }
    /* (the error file may be the replacement's next: the message now) */
    char head[512];
    snprintf(head, sizeof(head),
             "replaced in place (restart scope worker, rank %d, generation %lld%s%s): ", f->rank,
             (long long)gen, w->blame_note[0] ? "; " : "", w->blame_note);
    size_t len = strlen(head) + strlen(f->message) + 1;
    char *msg = malloc(len);
    if (msg != NULL) {
        snprintf(msg, len, "%s%s", head, f->message);
        free(f->message);
        f->message = msg;
    }
    a->nreplaced++;
}

/* The table of f[0..n) on stderr, "<entry> <verdict>". */
static void print_table(struct agent *a, const char *verdict, const struct agent_failure *f, int n,
                        const char *exit_note, struct cddp_buf *table)
{
    char host[256];
    cddp_fqdn(host, sizeof(host));
    if (agent_failure_table_as(a->entry_name, verdict, f, n, host, exit_note, table) != 0)
        return;
    /* torchrun prints it as the uncaught ChildFailedError's message. */
    cddp_buf_append(table, "\n", 1);
    const char *p = table->data;
    size_t len = table->len;
    while (len > 0) {
        ssize_t wr = write(2, p, len);
        if (wr < 0 && errno == EINTR)
            continue;
        if (wr <= 0)
            break;
        p += wr;
        len -= (size_t)wr;
    }
}

void agent_report_replaced(struct agent *a)
{
    if (a->nreplaced == 0)
        return;
    struct agent_failure *f = calloc((size_t)a->nreplaced, sizeof(*f));
    if (f == NULL)
        return;
    for (int i = 0; i < a->nreplaced; i++)
        f[i] = a->replaced[i].f; /* (shallow: the records own the strings) */
    struct cddp_buf table;
    cddp_buf_init(&table, 256u << 20);
    print_table(a, "RECOVERED IN PLACE", f, a->nreplaced,
                "every failure above was recovered in place (--restart_scope=worker); the run "
                "succeeded",
                &table);
    cddp_buf_free(&table);
    free(f);
}

void agent_report_failures(struct agent *a)
{
    int n = 0;
    /* this attempt's failed workers, then those replaced in place before */
    struct agent_failure *f = calloc((size_t)(a->nworkers + a->nreplaced), sizeof(*f));
    if (f == NULL) {
        log_crit("A0301", "out of memory building the failure report");
        return;
    }
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        if ((w->info.exitcode == 0 && w->hang_note[0] == '\0') || w->not_started)
            continue;
        f[n].local_rank = i;
        f[n].rank = w->info.rank;
        f[n].pid = (int)w->info.pid;
        f[n].exitcode = w->info.exitcode;
        f[n].observed = w->info.exit_time;
        f[n].seq = w->exit_seq;
        if (w->hang_note[0]) {
            f[n].observed = w->hung_at;
            f[n].watchdog = w->hang_note;
        }
        if (w->start_error[0])
            f[n].note = w->start_error;
        f[n].python = a->cfg->kind != LAUNCH_BINARY ? a->cfg->program : NULL;
        agent_failure_load(&f[n], w->error_file);
        n++;
    }
    int own = n;
    for (int i = 0; i < a->nreplaced; i++)
        f[n++] = a->replaced[i].f; /* (shallow: not freed here) */
    if (n == 0) {
        free(f);
        return;
    }
    struct cddp_buf table;
    cddp_buf_init(&table, 256u << 20);
    int root = agent_failure_root(f, n);
    /* The policy has decided the exit by now; torchrun's 1 keeps its table. */
    char note[160], *exit_note = NULL;
    if (policy_finished(&a->pol) && a->pol.exit_code != CDDP_EXIT_FAILURE) {
        snprintf(note, sizeof(note), "exit code: %d (%s; docs/cli.md, \"Exit codes\")",
                 a->pol.exit_code, cddp_exit_name(a->pol.exit_code));
        exit_note = note;
    }
    print_table(a, "FAILED", f, n, exit_note, &table);
    if (a->cfg->error_file) {
        int rc = agent_write_error_file(a->cfg->error_file, &f[root], a->entry_name, table.data);
        if (rc)
            error_file_failed(a->cfg->error_file, rc);
        else
            log_info("A0303", "dumped error file to parent's %s", a->cfg->error_file);
    }
    cddp_buf_free(&table);
    for (int i = 0; i < own; i++)
        agent_failure_free(&f[i]);
    free(f);
}

void agent_report_agent_error(const struct agent *a)
{
    if (a->cfg->error_file == NULL)
        return;
    int rc = agent_write_agent_error(a->cfg->error_file,
                                     a->fail_reason[0] ? a->fail_reason : "the agent failed");
    if (rc)
        error_file_failed(a->cfg->error_file, rc);
}
