/*
 * jsonw.h: a small streaming JSON writer.
 *
 * The status renderers run on the owner's event loop after every state
 * change, so they write JSON straight into a buffer instead of building a
 * cJSON tree and printing it (which allocates a node per value and formats
 * every number twice): about a third of the cost. cJSON stays the project's
 * JSON parser.
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
 * or at the top. Strings are escaped (", \, control characters) and bytes
 * that are not UTF-8 become U+FFFD, so the output is always valid JSON and
 * valid UTF-8. Non-finite numbers become null. Errors are sticky, as in
 * prom.h: CDDP_EPARSE for misuse (a key where none belongs, unbalanced
 * ends, nesting past JSONW_MAX_DEPTH), CDDP_ETOOBIG from the buffer.
 */
#ifndef CDDP_COMMON_JSONW_H
#define CDDP_COMMON_JSONW_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strutil.h"

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
void jsonw_int(struct jsonw *w, const char *key, int64_t value);
/* Seconds to the millisecond ("12.345"); non-finite writes null. */
void jsonw_seconds(struct jsonw *w, const char *key, double value);
void jsonw_bool(struct jsonw *w, const char *key, bool value);
void jsonw_null(struct jsonw *w, const char *key);
/* 0 when one complete value was written, else the first error. */
int jsonw_finish(const struct jsonw *w);

#endif
