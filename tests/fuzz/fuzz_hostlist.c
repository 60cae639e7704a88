/* libFuzzer target: Slurm's host and count lists (common/hostlist.c).
 * The input is the list (NUL-terminated copy, cut at the first NUL); checks
 * that count and nth agree: a list that counts N hosts yields host 0, N/2
 * and N-1, each a non-empty name of allowed characters that fits, and no
 * host N. The same bytes are also read as a count list. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/hostlist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_host(const char *expr, size_t index)
{
    char host[CDDP_HOSTLIST_NAME_MAX + 1];
    char err[512];
    if (cddp_hostlist_nth(expr, index, host, sizeof(host), err, sizeof(err)) != 0)
        abort();
    size_t n = strlen(host);
    if (n == 0 || n > CDDP_HOSTLIST_NAME_MAX)
        abort();
    for (size_t i = 0; i < n; i++) {
        char c = host[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '.' || c == '_'))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *expr = malloc(size + 1);
    if (expr == NULL)
        return 0;
    memcpy(expr, data, size);
    expr[size] = '\0';
    char err[512];
    size_t count = 0;
    if (cddp_hostlist_count(expr, &count, err, sizeof(err)) == 0) {
        if (count == 0 || count > CDDP_HOSTLIST_MAX_HOSTS)
            abort();
        check_host(expr, 0);
        check_host(expr, count / 2);
        check_host(expr, count - 1);
        char host[CDDP_HOSTLIST_NAME_MAX + 1];
        if (cddp_hostlist_nth(expr, count, host, sizeof(host), err, sizeof(err)) != CDDP_ERANGE_ARG)
            abort();
    } else if (strchr(err, '\n') != NULL || err[0] == '\0') {
        abort(); /* every refusal is one non-empty line */
    }
    long v;
    if (cddp_slurm_counts_nth(expr, 0, &v, err, sizeof(err)) == 0 && (v < 0 || v > 999999999))
        abort();
    free(expr);
    return 0;
}
