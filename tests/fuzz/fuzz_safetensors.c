/*
 * libFuzzer target: trainer/safetensors.c's header decoder on arbitrary file
 * bytes. Whatever decodes must survive a round trip: re-encoded by the writer
 * and decoded again, it gives the same names, dtypes, shapes, sizes and
 * metadata (the writer lays the data out in header order, so offsets may move).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct trn_st_file f, g;
    char err[256];
    if (trn_st_decode(data, size, size, &f, err, sizeof(err)) != 0)
        return 0;
    struct trn_st_tensor *t = calloc(f.n_tensors + 1, sizeof(*t));
    if (t == NULL)
        abort();
    for (size_t i = 0; i < f.n_tensors; i++) {
        t[i] = f.tensors[i];
        t[i].data = data + f.data_start + f.tensors[i].offset;
    }
    uint8_t *hdr;
    size_t hlen;
    if (trn_st_encode_header(t, f.n_tensors, f.meta, f.n_meta, &hdr, &hlen, err, sizeof(err)) != 0)
        abort(); /* everything the reader accepts, the writer must write */
    uint8_t *img = calloc(1, hlen + (size_t)f.data_len + 1);
    if (img == NULL)
        abort();
    memcpy(img, hdr, hlen);
    if (trn_st_decode(img, hlen, hlen + f.data_len, &g, err, sizeof(err)) != 0)
        abort();
    if (g.n_tensors != f.n_tensors || g.n_meta != f.n_meta || g.data_len != f.data_len)
        abort();
    for (size_t i = 0; i < f.n_tensors; i++) {
        const struct trn_st_tensor *a = &f.tensors[i], *b = &g.tensors[i];
        if (strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->ndim != b->ndim ||
            a->nbytes != b->nbytes ||
            memcmp(a->shape, b->shape, sizeof(uint64_t) * (size_t)a->ndim) != 0)
            abort();
    }
    for (size_t i = 0; i < f.n_meta; i++)
        if (strcmp(f.meta[i].key, g.meta[i].key) != 0 ||
            strcmp(f.meta[i].value, g.meta[i].value) != 0)
            abort();
    trn_st_close(&g);
    free(img);
    free(hdr);
    free(t);
    trn_st_close(&f);
    return 0;
}
