/*
 * safe.h: what a server sent, made safe to print on a terminal.
 *
 * A status port is a peer: its host name, run ids, node ids, check names,
 * stack dumps and error messages are its own text, and an escape sequence
 * in one of them (ESC [ ... in a host name) would be obeyed by the
 * terminal cddpctl prints to: recolour, move the cursor, rewrite what was
 * printed before, set the window title. So every such string is escaped
 * before it is printed:
 *
 *   text   every control character (C0, DEL, and C1: U+0080..U+009F, which
 *          terminals may take for ESC [) and every byte that is not valid
 *          UTF-8 is written as \xNN, one per byte ("\x1b[31m"); the rest,
 *          non-ASCII letters included, stays as it is. Backslashes are not
 *          doubled: the escapes are for a reader, not for a parser.
 *   JSON   (--json) inside strings, the same characters are written as
 *          JSON escapes (\u001b), so the document means exactly what the
 *          server sent; bytes that are not UTF-8 become U+FFFD. Between
 *          tokens a control character other than a newline or a tab (which
 *          cJSON reads as whitespace) becomes a space. A clean document is
 *          printed byte for byte as served.
 */
#ifndef CDDP_LAUNCHER_CDDPCTL_SAFE_H
#define CDDP_LAUNCHER_CDDPCTL_SAFE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/strutil.h"

/* Appends s[0..n) to out, escaped as text; with layout, '\n' and '\t' stay
 * (multi-line texts: a stack dump, a health report). CDDP_ETOOBIG when out
 * is full (what fitted is kept). */
int ctl_safe_text(const char *s, size_t n, bool layout, struct cddp_buf *out);

/* The NUL-terminated s escaped as text (no layout) into buf, cut to len - 1
 * bytes at a character's end; returns buf. */
const char *ctl_safe(const char *s, char *buf, size_t len);

/* Escapes s in place (through a copy), as ctl_safe into its own size. */
void ctl_safe_inplace(char *s, size_t size);

/* Appends the JSON text s[0..n) to out with its strings made safe (above). */
int ctl_safe_json(const char *s, size_t n, struct cddp_buf *out);

/* Every string value and key of a parsed document escaped as text, in
 * place: what renders it as a table may then print any of them. Strings
 * that need nothing are left alone. 0, or CDDP_ERR_FROM_ERRNO(ENOMEM)
 * (the strings done so far stay done). */
int ctl_safe_tree(cJSON *item);

#endif
