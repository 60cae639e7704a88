/*
 * jsonw.h: the JSON writer: string escaping (the project's only copy) and a
 * small streaming writer on top of it.
 *
 * cddp_json_put_string() appends one JSON string literal to a cddp_buf.
 * Every writer of JSON text calls it: the streaming writer below (status
 * pages), proto/msg.c (wire messages, member names included) and
 * trainer/safetensors.c (headers). It escapes what RFC 8259 demands
 * (", \, and the control characters: \b \f \n \r \t by name, the rest as
 * \u00XX) and, by mode:
 *   CDDP_JSON_STRICT  every other byte as it is, so a parser reads back
 *                     exactly the input: for text the caller already knows
 *                     to be UTF-8 (safetensors checks first) or bytes a
 *                     peer sent and must get back unchanged (proto/).
 *   CDDP_JSON_LOSSY   a byte that does not start a valid UTF-8 sequence
 *                     (common/utf8.h) becomes U+FFFD, so the output is
 *                     always valid UTF-8 whatever the input (status pages
 *                     show worker-supplied text).
 * It reads s up to its NUL and allocates only through the buffer, whose
 * maximum (set at cddp_buf_init) bounds the output: past it the call
 * returns CDDP_ETOOBIG and the buffer may hold part of the string (callers
 * that need all or nothing mark and truncate, as proto/msg.c does).
 *
 * The streaming writer (struct jsonw): the status renderers run on the
 * owner's event loop after every state change, so they write JSON straight
 * into a buffer instead of building a cJSON tree and printing it (which
 * allocates a node per value and formats every number twice): about a third
 * of the cost. cJSON stays the project's JSON parser.
 *
 *     jsonw_init(&w, &buf);
 *     jsonw_object_begin(&w, NULL);
 *     jsonw_string(&w, "state", "running");
 *     jsonw_array_begin(&w, "workers");
 *     jsonw_int(&w, NULL, 3);
 *     jsonw_array_end(&w);
 *     jsonw_object_end(&w);
 *     if (jsonw_finish(&w) < 0) ...
 *
 * Every value takes a key: a string inside an object, NULL inside an array
 * or at the top. Strings and keys are escaped CDDP_JSON_LOSSY, so the output
 * is always valid JSON and valid UTF-8. Non-finite numbers become null.
 * Errors are sticky, as in prom.h: CDDP_EPARSE for misuse (a key where none
 * belongs, unbalanced ends, nesting past JSONW_MAX_DEPTH), CDDP_ETOOBIG
 * from the buffer. The
 * writer owns nothing: the caller owns the buffer (and frees it); a jsonw
 * lives on the stack, one per document, used from one thread.
 */
#ifndef CDDP_COMMON_JSONW_H
#define CDDP_COMMON_JSONW_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strutil.h"

enum cddp_json_escape {
    CDDP_JSON_STRICT, /* bytes kept as they are */
    CDDP_JSON_LOSSY,  /* bytes that are not UTF-8 become U+FFFD */
};

/* Appends s as a quoted JSON string. 0, or the buffer's error. */
int cddp_json_put_string(struct cddp_buf *b, const char *s, enum cddp_json_escape how);

#define JSONW_MAX_DEPTH 16

struct jsonw {
    struct cddp_buf *out;
    int err;
    int depth;                       /* open containers */
    bool in_object[JSONW_MAX_DEPTH]; /* per level: object (true) or array */
    bool has_items[JSONW_MAX_DEPTH]; /* per level: a comma goes before the next */
    bool done;                       /* the top-level value is complete */
};

void jsonw_init(struct jsonw *w, struct cddp_buf *out);
void jsonw_object_begin(struct jsonw *w, const char *key);
void jsonw_object_end(struct jsonw *w);
void jsonw_array_begin(struct jsonw *w, const char *key);
void jsonw_array_end(struct jsonw *w);
/* value NULL writes null. */
void jsonw_string(struct jsonw *w, const char *key, const char *value);
/* Shortest round-trip decimal; NaN and infinities write null. */
void jsonw_number(struct jsonw *w, const char *key, double value);
/* printf's %.*g (digits: significant digits) or %.*f (decimals), for output
 * whose precision is part of its format (progress lines, logs); 0..17
 * (clamped). Non-finite writes null. */
void jsonw_number_digits(struct jsonw *w, const char *key, double value, int digits);
void jsonw_number_fixed(struct jsonw *w, const char *key, double value, int decimals);
void jsonw_int(struct jsonw *w, const char *key, int64_t value);
/* Seconds to the millisecond ("12.345"); non-finite writes null. */
void jsonw_seconds(struct jsonw *w, const char *key, double value);
void jsonw_bool(struct jsonw *w, const char *key, bool value);
void jsonw_null(struct jsonw *w, const char *key);
/* 0 when one complete value was written, else the first error. */
int jsonw_finish(const struct jsonw *w);

#endif
