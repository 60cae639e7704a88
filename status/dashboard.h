/*
 * dashboard.h: the job dashboard the status port serves to browsers.
 *
 * One self-contained HTML page (status/dashboard.html: inline CSS and plain
 * JavaScript, no external assets) that polls /status, relative to itself,
 * and draws what it finds: an agent's workers, their states, restarts and
 * per-rank loss and throughput over time; cddp-rdzv's runs and nodes (and
 * those of the rendezvous an agent hosts). The same page serves both
 * programs: it tells them apart by the JSON's "kind".
 *
 * The page is compiled into the binary (meson turns dashboard.html into a C
 * array with dashboard_embed.py), so a node needs no files beside cddprun.
 *
 * `/` keeps serving its plain-text index to curl, scripts and probes: only a
 * client whose Accept header names HTML, at least as preferred as plain
 * text, gets the page (status_dashboard_wants_html). `/dashboard` serves
 * the page whatever the Accept header says.
 */
#ifndef CDDP_STATUS_DASHBOARD_H
#define CDDP_STATUS_DASHBOARD_H

#include <stdbool.h>
#include <stddef.h>

/* The page (UTF-8, NUL-terminated; len excludes the NUL). */
extern const char status_dashboard_html[];
extern const size_t status_dashboard_html_len;

/* The Content-Security-Policy the page is served with: it may run its own
 * inline script and style and fetch from its own origin, nothing else, so
 * a page that tried to load anything from elsewhere would fail visibly. */
#define STATUS_DASHBOARD_CSP                                                                       \
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "                  \
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "                     \
    "frame-ancestors 'none'"

/*
 * Content negotiation for `/` (pure). accept is the request's Accept header
 * or NULL. True when it names text/html or application/xhtml+xml with a
 * quality > 0 that is at least that of text/plain (matched by its most
 * specific range: text/plain, then text/any, then any/any). So a browser's
 * "text/html,...;q=0.8" gets HTML, and curl's any/any, "text/plain", no
 * header at all, or one past STATUS_ACCEPT_MAX bytes get text.
 */
#define STATUS_ACCEPT_MAX 4096
bool status_dashboard_wants_html(const char *accept);

#endif
