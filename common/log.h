/*
 * log.h: the one logging module of every cddp program.
 *
 * Each line is written with a single write(2), so lines from threads and
 * processes sharing a stream never interleave:
 *
 *     cddprun[4242] node0 12:00:00.123 WARNING A0201: worker group FAILED ...
 *
 * program[pid], a tag (node rank or rank, set once known), wall time,
 * level, a stable message id for grep, then the message. The level comes
 * from LOGLEVEL (DEBUG, INFO, WARNING, ERROR, CRITICAL), WARNING by default,
 * as torchrun.
 */
#ifndef CDDP_COMMON_LOG_H
#define CDDP_COMMON_LOG_H

#include <stdbool.h>

enum cddp_log_level {
    CDDP_LOG_DEBUG = 10,
    CDDP_LOG_INFO = 20,
    CDDP_LOG_WARNING = 30,
    CDDP_LOG_ERROR = 40,
    CDDP_LOG_CRITICAL = 50,
};

/* Sets the program name and reads LOGLEVEL. A bad LOGLEVEL keeps WARNING and says so. */
void cddp_log_init(const char *program);

/* Tag printed after program[pid], e.g. "node0" or "rank3". Copied. */
void cddp_log_set_tag(const char *tag);
void cddp_log_set_level(int level);
int cddp_log_get_level(void);
/* Destination fd (default 2). */
void cddp_log_set_fd(int fd);

/* "DEBUG".."CRITICAL" (case-insensitive) or a number -> level. 0 or CDDP_EPARSE. */
int cddp_log_parse_level(const char *s, int *level);

static inline bool cddp_log_enabled(int level)
{
    return level >= cddp_log_get_level();
}

void cddp_log_write(int level, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CDDP_LOG_AT(level, id, ...)                                                                \
    do {                                                                                           \
        if (cddp_log_enabled(level))                                                               \
            cddp_log_write(level, id, __VA_ARGS__);                                                \
    } while (0)

#define log_debug(id, ...) CDDP_LOG_AT(CDDP_LOG_DEBUG, id, __VA_ARGS__)
#define log_info(id, ...) CDDP_LOG_AT(CDDP_LOG_INFO, id, __VA_ARGS__)
#define log_warn(id, ...) CDDP_LOG_AT(CDDP_LOG_WARNING, id, __VA_ARGS__)
#define log_error(id, ...) CDDP_LOG_AT(CDDP_LOG_ERROR, id, __VA_ARGS__)
#define log_crit(id, ...) CDDP_LOG_AT(CDDP_LOG_CRITICAL, id, __VA_ARGS__)

#endif
