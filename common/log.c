/* log.c: see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/strutil.h"

static char log_program[32] = "cddp";
static char log_tag[32] = "";
static atomic_int log_level = CDDP_LOG_WARNING;
static atomic_int log_fd = 2;

static const struct {
    const char *name;
    int level;
} level_names[] = {
    {"DEBUG", CDDP_LOG_DEBUG},    {"INFO", CDDP_LOG_INFO},   {"WARNING", CDDP_LOG_WARNING},
    {"WARN", CDDP_LOG_WARNING},   {"ERROR", CDDP_LOG_ERROR}, {"CRITICAL", CDDP_LOG_CRITICAL},
    {"FATAL", CDDP_LOG_CRITICAL},
};

static const char *level_name(int level)
{
    if (level >= CDDP_LOG_CRITICAL)
        return "CRITICAL";
    if (level >= CDDP_LOG_ERROR)
        return "ERROR";
    if (level >= CDDP_LOG_WARNING)
        return "WARNING";
    if (level >= CDDP_LOG_INFO)
        return "INFO";
    return "DEBUG";
}

int cddp_log_parse_level(const char *s, int *level)
{
    for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (strcasecmp(s, level_names[i].name) == 0) {
            *level = level_names[i].level;
            return 0;
        }
    }
    long v;
    if (cddp_parse_long(s, 0, 100, &v) == 0) {
        *level = (int)v;
        return 0;
    }
    return CDDP_EPARSE;
}

void cddp_log_init(const char *program)
{
    cddp_strlcpy(log_program, program, sizeof(log_program));
    const char *env = getenv("LOGLEVEL");
    if (env && *env) {
        int level;
        if (cddp_log_parse_level(env, &level) == 0)
            atomic_store(&log_level, level);
        else
            cddp_log_write(CDDP_LOG_WARNING, "C0001",
                           "LOGLEVEL=%s is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL; "
                           "using WARNING",
                           env);
    }
}

void cddp_log_set_tag(const char *tag)
{
    cddp_strlcpy(log_tag, tag, sizeof(log_tag));
}
void cddp_log_set_level(int level)
{
    atomic_store(&log_level, level);
}
int cddp_log_get_level(void)
{
    return atomic_load(&log_level);
}
void cddp_log_set_fd(int fd)
{
    atomic_store(&log_fd, fd);
}

void cddp_log_write(int level, const char *id, const char *fmt, ...)
{
    char line[4096];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);

    int n = snprintf(line, sizeof(line), "%s[%d]%s%s %02d:%02d:%02d.%03d %s %s: ", log_program,
                     (int)getpid(), log_tag[0] ? " " : "", log_tag, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), level_name(level), id);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;

    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + len, sizeof(line) - len, fmt, ap);
    va_end(ap);
    if (m > 0)
        len += (size_t)m < sizeof(line) - len ? (size_t)m : sizeof(line) - len - 1;
    /* Always end with exactly one newline, truncating long lines. */
    if (len >= sizeof(line) - 1)
        len = sizeof(line) - 2;
    while (len > 0 && line[len - 1] == '\n')
        len--;
    line[len++] = '\n';

    int fd = atomic_load(&log_fd);
    const char *p = line;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w <= 0)
            return;
        p += w;
        len -= (size_t)w;
    }
}
