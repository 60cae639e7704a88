/*
 * idx.h: the IDX file decoder behind the idx dataset (exposed for its unit
 * tests and fuzz target).
 *
 * An IDX file (yann.lecun.com/exdb/mnist) is: two zero bytes, a type byte
 * (0x08: unsigned byte, the only type MNIST-like files use and the only one
 * accepted here), the number of dimensions, each dimension as a big-endian
 * u32, then the data, row-major. The first dimension counts the items.
 */
#ifndef CDDP_TRAINER_IDX_H
#define CDDP_TRAINER_IDX_H

#include <stddef.h>
#include <stdint.h>

#define TRN_IDX_MAX_DIMS 4

struct trn_idx_array {
    int ndim;
    uint32_t dims[TRN_IDX_MAX_DIMS];
    size_t count;        /* dims[0] */
    size_t item;         /* bytes per item: the product of the other dims */
    const uint8_t *data; /* count * item bytes, inside the decoded buffer */
};

/*
 * Decodes an IDX file held in buf (len bytes, already decompressed) that must
 * have want_ndim dimensions. data points into buf. 0, CDDP_EIO_SHORT (the
 * file holds less than its header declares) or CDDP_ECORRUPT; err gets one
 * line (without the file name: the caller adds it).
 */
int trn_idx_decode(const uint8_t *buf, size_t len, int want_ndim, struct trn_idx_array *a,
                   char *err, size_t errlen);

/* Reads a whole file, gunzipping it if it is gzip (zlib), into a malloc'd
 * buffer of at most max bytes. 0, -errno, CDDP_ETOOBIG or CDDP_ECORRUPT (bad
 * or truncated gzip stream); err names path. */
int trn_idx_read_file(const char *path, size_t max, uint8_t **out, size_t *len, char *err,
                      size_t errlen);

#endif
