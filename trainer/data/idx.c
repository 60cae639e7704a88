/*
 * idx.c: the idx dataset: MNIST / Fashion-MNIST IDX files, gzipped or not.
 *
 * Both files of a split are read whole and checked at open (magic, type,
 * dimensions, exact length, matching counts, gzip integrity), so a bad file
 * fails at start-up with its name, never in the middle of an epoch. Pixels
 * stay as bytes (47 MB for Fashion-MNIST's training set) and are normalised
 * on get through a 256-entry table computed as torchvision's ToTensor +
 * Normalize compute it in float32: ((p / 255) - 0.2860) / 0.3530.
 */
#include "trainer/data/idx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/errors.h"
#include "common/log.h"
#include "trainer/data/dataset.h"

#define IDX_MEAN 0.2860f
#define IDX_STD 0.3530f
/* Largest decompressed file we accept (EMNIST's biggest is under 1 GiB). */
#define IDX_MAX_FILE ((size_t)8 << 30)

int trn_idx_decode(const uint8_t *buf, size_t len, int want_ndim, struct trn_idx_array *a,
                   char *err, size_t errlen)
{
    memset(a, 0, sizeof(*a));
    if (len < 4) {
        snprintf(err, errlen, "truncated: %zu bytes, shorter than the 4-byte IDX magic", len);
        return CDDP_EIO_SHORT;
    }
    if (buf[0] != 0 || buf[1] != 0) {
        snprintf(err, errlen, "not an IDX file (magic %02x %02x %02x %02x)", buf[0], buf[1], buf[2],
                 buf[3]);
        return CDDP_ECORRUPT;
    }
    if (buf[2] != 0x08) {
        snprintf(err, errlen, "IDX element type 0x%02x is not supported (only 0x08, unsigned byte)",
                 buf[2]);
        return CDDP_ECORRUPT;
    }
    if (buf[3] != want_ndim) {
        snprintf(err, errlen, "IDX file has %d dimensions, expected %d", buf[3], want_ndim);
        return CDDP_ECORRUPT;
    }
    size_t hdr = 4 + 4 * (size_t)want_ndim;
    if (len < hdr) {
        snprintf(err, errlen, "truncated: %zu bytes, shorter than the %zu-byte IDX header", len,
                 hdr);
        return CDDP_EIO_SHORT;
    }
    a->ndim = want_ndim;
    a->item = 1;
    for (int i = 0; i < want_ndim; i++) {
        const uint8_t *p = buf + 4 + 4 * i;
        a->dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (i > 0) {
            if (a->dims[i] == 0) {
                snprintf(err, errlen, "IDX dimension %d is 0", i);
                return CDDP_ECORRUPT;
            }
            if (a->item > SIZE_MAX / a->dims[i]) {
                snprintf(err, errlen, "IDX dimensions overflow");
                return CDDP_ECORRUPT;
            }
            a->item *= a->dims[i];
        }
    }
    a->count = a->dims[0];
    size_t body = len - hdr;
    if (a->item > 0 && a->count > body / a->item) {
        snprintf(err, errlen,
                 "truncated: the header declares %zu items of %zu bytes but the file holds %zu "
                 "bytes of data",
                 a->count, a->item, body);
        return CDDP_EIO_SHORT;
    }
    if (a->count * a->item != body) {
        snprintf(err, errlen, "%zu unexpected bytes after the %zu items the header declares",
                 body - a->count * a->item, a->count);
        return CDDP_ECORRUPT;
    }
    a->data = buf + hdr;
    return 0;
}

int trn_idx_read_file(const char *path, size_t max, uint8_t **out, size_t *len, char *err,
                      size_t errlen)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return CDDP_ERR_FROM_ERRNO(e);
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return CDDP_ECORRUPT;
    }
    gzFile gz = gzdopen(fd, "rb"); /* reads plain files as they are */
    if (gz == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        close(fd);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    gzbuffer(gz, 1 << 18);
    size_t cap = (size_t)st.st_size + 64, n = 0;
    uint8_t *buf = malloc(cap);
    int rc = buf ? 0 : CDDP_ERR_FROM_ERRNO(ENOMEM);
    while (rc == 0) {
        if (n == cap) {
            if (cap >= max) {
                snprintf(err, errlen, "%s: larger than %zu bytes decompressed", path, max);
                rc = CDDP_ETOOBIG;
                break;
            }
            size_t nc = cap * 2 < max ? cap * 2 : max;
            uint8_t *p = realloc(buf, nc);
            if (p == NULL) {
                rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
                break;
            }
            buf = p, cap = nc;
        }
        size_t want = cap - n > (1u << 30) ? (1u << 30) : cap - n;
        int r = gzread(gz, buf + n, (unsigned)want);
        if (r < 0) {
            int zerr;
            const char *msg = gzerror(gz, &zerr);
            if (zerr == Z_BUF_ERROR) {
                snprintf(err, errlen, "%s: truncated gzip data (%s)", path, msg);
                rc = CDDP_EIO_SHORT;
            } else {
                snprintf(err, errlen, "%s: corrupt gzip data (%s)", path, msg);
                rc = zerr == Z_ERRNO ? CDDP_ERR_FROM_ERRNO(errno ? errno : EIO) : CDDP_ECORRUPT;
            }
            break;
        }
        if (r == 0) {
            int zerr;
            const char *msg = gzerror(gz, &zerr);
            if (zerr != Z_OK) { /* a gzip stream cut short: Z_BUF_ERROR */
                snprintf(err, errlen, "%s: truncated gzip data (%s)", path, msg);
                rc = CDDP_EIO_SHORT;
            }
            break;
        }
        n += (size_t)r;
    }
    gzclose(gz);
    if (rc == CDDP_ERR_FROM_ERRNO(ENOMEM))
        snprintf(err, errlen, "%s: out of memory", path);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

struct idx {
    struct trn_dataset base; /* first */
    uint8_t *images_buf, *labels_buf;
    struct trn_idx_array images, labels;
    float lut[256];
};

static int idx_get(const struct trn_dataset *d, size_t index, float *chw, int32_t *label, char *err,
                   size_t errlen)
{
    (void)err, (void)errlen;
    const struct idx *x = (const struct idx *)d;
    const uint8_t *px = x->images.data + index * x->images.item;
    size_t plane = x->images.item;
    for (size_t i = 0; i < plane; i++)
        chw[i] = x->lut[px[i]];
    for (int c = 1; c < d->channels; c++)
        memcpy(chw + (size_t)c * plane, chw, plane * sizeof(float));
    *label = x->labels.data[index];
    return 0;
}

static void idx_close(struct trn_dataset *d)
{
    struct idx *x = (struct idx *)d;
    free(x->images_buf);
    free(x->labels_buf);
    free(x);
}

/* DIR/NAME, or DIR/NAME.gz when only that exists. */
static int find_file(const char *dir, const char *name, char *out, size_t outlen, char *err,
                     size_t errlen)
{
    snprintf(out, outlen, "%s/%s", dir, name);
    if (access(out, F_OK) == 0)
        return 0;
    snprintf(out, outlen, "%s/%s.gz", dir, name);
    if (access(out, F_OK) == 0)
        return 0;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        snprintf(err, errlen, "idx: %s: no such directory", dir);
    else
        snprintf(err, errlen, "idx: %s/%s[.gz]: no such file", dir, name);
    return CDDP_ENOTFOUND;
}

static int load(const char *path, int ndim, uint8_t **buf, struct trn_idx_array *a, char *err,
                size_t errlen)
{
    char msg[400];
    size_t len;
    int rc = trn_idx_read_file(path, IDX_MAX_FILE, buf, &len, err, errlen);
    if (rc)
        return rc;
    rc = trn_idx_decode(*buf, len, ndim, a, msg, sizeof(msg));
    if (rc)
        snprintf(err, errlen, "%s: %s", path, msg);
    return rc;
}

int trn_idx_open(const char *dir, const struct trn_dataset_opts *o, struct trn_dataset **out,
                 char *err, size_t errlen)
{
    const char *prefix = o->split == TRN_SPLIT_TEST ? "t10k" : "train";
    char ipath[4096], lpath[4096], name[64];
    snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
    int rc = find_file(dir, name, ipath, sizeof(ipath), err, errlen);
    if (rc)
        return rc;
    snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
    if ((rc = find_file(dir, name, lpath, sizeof(lpath), err, errlen)) != 0)
        return rc;

    struct idx *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if ((rc = load(ipath, 3, &x->images_buf, &x->images, err, errlen)) != 0 ||
        (rc = load(lpath, 1, &x->labels_buf, &x->labels, err, errlen)) != 0)
        goto fail;
    if (x->images.count != x->labels.count) {
        snprintf(err, errlen, "idx: %s holds %zu images but %s holds %zu labels", ipath,
                 x->images.count, lpath, x->labels.count);
        rc = CDDP_EMISMATCH;
        goto fail;
    }
    if (x->images.count == 0) {
        snprintf(err, errlen, "idx: %s holds no images", ipath);
        rc = CDDP_ECORRUPT;
        goto fail;
    }
    int max_label = 0;
    for (size_t i = 0; i < x->labels.count; i++)
        max_label = x->labels.data[i] > max_label ? x->labels.data[i] : max_label;
    size_t len = x->images.count;
    if (o->limit > 0 && o->limit < len)
        len = o->limit;
    else if (o->limit > len)
        log_warn("T0301", "idx: --limit %zu is more than the %zu images of %s; using all", o->limit,
                 len, ipath);
    for (int p = 0; p < 256; p++) {
        float v = (float)p / 255.0f; /* the float32 operations of ToTensor + Normalize */
        v = v - IDX_MEAN;
        x->lut[p] = v / IDX_STD;
    }
    x->base = (struct trn_dataset){
        .kind = "idx",
        .len = len,
        .channels = 3,
        .height = (int)x->images.dims[1],
        .width = (int)x->images.dims[2],
        .num_classes = max_label + 1,
        .get = idx_get,
        .close = idx_close,
    };
    if (x->images.dims[1] > 65536 || x->images.dims[2] > 65536) {
        snprintf(err, errlen, "idx: %s: images of %ux%u are too large", ipath, x->images.dims[1],
                 x->images.dims[2]);
        rc = CDDP_ECORRUPT;
        goto fail;
    }
    *out = &x->base;
    return 0;
fail:
    idx_close(&x->base);
    return rc;
}
