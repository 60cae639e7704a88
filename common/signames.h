/* signames.h: the one table of signal names ("SIGTERM" <-> 15). */
#ifndef CDDP_COMMON_SIGNAMES_H
#define CDDP_COMMON_SIGNAMES_H

/* "SIGTERM", "TERM" (case-insensitive) or a decimal number -> signal; -1 if unknown. */
int cddp_signal_from_name(const char *name);
/* "SIGTERM"; "SIG<n>" in a static buffer for signals not in the table. */
const char *cddp_signal_name(int sig);

#endif
