/*
 * errorfile.h: torchrun's error file (TORCHELASTIC_ERROR_FILE, error.json),
 * built and parsed in one place for the agent (agent/report.c) and the
 * trainer (trainer/comm/failure.c). See shared/reference/torchrun.md 3.7.
 *
 * The format, as torch's @record writes it:
 *     {"message": {"message": "<Type>: <text>",
 *                  "extraInfo": {"py_callstack": "<text>",
 *                                "timestamp": "<epoch seconds>"},
 *                  "errorCode": <exit code>}}          (errorCode optional)
 * and, also accepted when reading, a plain string message with a top-level
 * timestamp: {"message": "<text>", "timestamp": <epoch seconds>}. A
 * timestamp is read as Python's int() would: a JSON number or a string of
 * digits.
 *
 * Pure: no I/O (callers read the file themselves and write it with
 * common/file.h's cddp_write_file_atomic), no global state, thread-safe.
 * Every string returned is malloc'd and the caller's to free().
 */
#ifndef CDDP_PROTO_ERRORFILE_H
#define CDDP_PROTO_ERRORFILE_H

#include <stdbool.h>
#include <stddef.h>

/*
 * The record as JSON text (one line, no newline). error_code NULL: no
 * "errorCode" member. NULL only when memory runs out.
 */
char *proto_errorfile_build(const char *message, const char *py_callstack, long timestamp,
                            const int *error_code);

/*
 * text with message.errorCode set to code, as torch's
 * override_error_code_in_rootcause_data (only a record whose message is an
 * object gets one; code 0 changes nothing). The rest is kept, re-printed
 * as one line. NULL when text is not JSON (or memory runs out).
 */
char *proto_errorfile_set_code(const char *text, int code);

struct proto_errorfile {
    char *message;      /* what torchrun shows as the traceback; owned */
    bool structured;    /* message came from a record (py_callstack, else message.message) */
    bool has_timestamp; /* timestamp was present and an integer */
    long timestamp;     /* seconds since the epoch */
};

/*
 * Reads an error file's text. 0, or CDDP_EPARSE with why (one line in <>,
 * as the failure table shows it) when text is not a JSON object or has no
 * usable "message"; -ENOMEM. A record whose message has neither
 * py_callstack nor message gives "<N/A>".
 */
int proto_errorfile_parse(const char *text, struct proto_errorfile *out, char *why, size_t whylen);
void proto_errorfile_free(struct proto_errorfile *f);

#endif
