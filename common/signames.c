/* signames.c: see signames.h. */
#include "common/signames.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/strutil.h"

static const struct {
    int sig;
    const char *name;
} signal_table[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"}, {SIGPROF, "SIGPROF"},
    {SIGSYS, "SIGSYS"},   {SIGWINCH, "SIGWINCH"},
};

int cddp_signal_from_name(const char *name)
{
    long n;
    if (cddp_parse_long(name, 1, 64, &n) == 0)
        return (int)n;
    for (size_t i = 0; i < sizeof(signal_table) / sizeof(signal_table[0]); i++) {
        if (strcasecmp(name, signal_table[i].name) == 0 ||
            strcasecmp(name, signal_table[i].name + 3) == 0)
            return signal_table[i].sig;
    }
    return -1;
}

const char *cddp_signal_name(int sig)
{
    static _Thread_local char buf[16];
    for (size_t i = 0; i < sizeof(signal_table) / sizeof(signal_table[0]); i++) {
        if (signal_table[i].sig == sig)
            return signal_table[i].name;
    }
    snprintf(buf, sizeof(buf), "SIG%d", sig);
    return buf;
}
