/*
 * libFuzzer target: trainer/data/idx.c's IDX decoder. The first byte picks
 * the expected number of dimensions (1..4); the rest is the file. Whatever
 * decodes must describe exactly the bytes after its header.
 */
#include <stdint.h>
#include <stdlib.h>

#include "trainer/data/idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int ndim = 1 + data[0] % TRN_IDX_MAX_DIMS;
    struct trn_idx_array a;
    char err[256];
    if (trn_idx_decode(data + 1, size - 1, ndim, &a, err, sizeof(err)) != 0)
        return 0;
    size_t hdr = 4 + 4 * (size_t)ndim;
    if (a.data != data + 1 + hdr || a.count * a.item != size - 1 - hdr || a.count != a.dims[0])
        abort();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < a.count * a.item; i++)
        sink ^= a.data[i]; /* ASan checks every byte is inside the input */
    (void)sink;
    return 0;
}
