/* libFuzzer target: the worker progress channel parser (proto/progress.c).
 * Feeds the input as a stream in pieces whose sizes come from the input's
 * first byte, and as one line; checks the counters stay consistent. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/progress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct progress_parser p;
    progress_init(&p);
    size_t piece = size ? (size_t)data[0] % 64 + 1 : 1;
    size_t newlines = 0;
    for (size_t off = 0; off < size; off += piece) {
        size_t n = size - off < piece ? size - off : piece;
        progress_feed(&p, (const char *)data + off, n, off + 1, (double)off);
    }
    for (size_t i = 0; i < size; i++)
        newlines += data[i] == '\n';
    progress_eof(&p, size + 1, (double)size);
    if (p.report.lines + p.report.malformed > newlines + 1)
        abort();

    struct progress_report r = {0};
    unsigned fields;
    bool is_auto;
    progress_parse_line((const char *)data, size, &r, &fields, &is_auto);
    return 0;
}
