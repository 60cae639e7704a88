/*
 * safetensors.h: read and write the safetensors format (huggingface/safetensors).
 *
 * A file is: 8 bytes N (little-endian u64), N bytes of UTF-8 JSON that starts
 * with '{' (padded at the end with spaces), then the data buffer. The JSON maps
 * each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}
 * (offsets relative to the data buffer, end one past) and may hold a
 * "__metadata__" map of strings to strings.
 *
 * The reader trusts nothing: the header length against the file size and the
 * 100 MB limit, the JSON grammar (a strict parser of its own: exact 64-bit
 * integers, UTF-8 checked, duplicate keys refused, unknown fields in a tensor
 * entry refused), dtypes, dimensions, shape vs byte size, offsets inside the
 * buffer, and that the tensors tile the buffer exactly (no overlap, no hole, no
 * trailing bytes). Every failure returns a negative code and writes one line
 * naming the problem into the caller's err buffer.
 *
 * The writer lays the tensors out in the order given, writes compact JSON with
 * "__metadata__" first and pads the header with spaces to a multiple of 8 bytes
 * (as the reference writer does), so the data buffer starts 8-aligned.
 * trn_st_save() writes atomically: a temporary file beside the target, fsync,
 * rename, fsync of the directory; a crash at any point leaves either the old
 * file or the new one, never a mix.
 *
 * Little-endian hosts only (as the format's data).
 */
#ifndef CDDP_TRAINER_SAFETENSORS_H
#define CDDP_TRAINER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* The reference implementation's limit on the header size. */
#define TRN_ST_MAX_HEADER ((uint64_t)100000000)
/* Dimensions per tensor this implementation handles (ResNets need 4). */
#define TRN_ST_MAX_DIMS 8

/* Every dtype of the format, so any valid file parses; users check what they need. */
#define TRN_ST_DTYPES(XX)                                                                          \
    XX(BOOL, 1)                                                                                    \
    XX(U8, 1)                                                                                      \
    XX(I8, 1)                                                                                      \
    XX(F8_E5M2, 1)                                                                                 \
    XX(F8_E4M3, 1)                                                                                 \
    XX(I16, 2)                                                                                     \
    XX(U16, 2)                                                                                     \
    XX(F16, 2)                                                                                     \
    XX(BF16, 2)                                                                                    \
    XX(I32, 4)                                                                                     \
    XX(U32, 4)                                                                                     \
    XX(F32, 4)                                                                                     \
    XX(F64, 8)                                                                                     \
    XX(I64, 8)                                                                                     \
    XX(U64, 8)

enum trn_st_dtype {
#define XX(name, size) TRN_ST_##name,
    TRN_ST_DTYPES(XX)
#undef XX
        TRN_ST_NUM_DTYPES
};

/* "F32", ...; "?" for a value outside the enum. */
const char *trn_st_dtype_name(enum trn_st_dtype d);
/* Bytes per element; 0 for a value outside the enum. */
size_t trn_st_dtype_size(enum trn_st_dtype d);

/*
 * One tensor. For the writer, the caller fills name, dtype, ndim, shape and
 * data (nbytes = numel * dtype size bytes, row-major, little-endian); the
 * other fields are ignored. The reader fills every field except data (NULL:
 * read the bytes with trn_st_read()). ndim 0 is a scalar (one element).
 */
struct trn_st_tensor {
    const char *name;
    enum trn_st_dtype dtype;
    int ndim;
    uint64_t shape[TRN_ST_MAX_DIMS];
    uint64_t numel;  /* reader: product of shape */
    uint64_t offset; /* reader: begin within the data buffer */
    uint64_t nbytes; /* reader: end - begin */
    const void *data;
};

struct trn_st_meta {
    const char *key;
    const char *value;
};

/* A parsed file. Everything it points to is owned by it (trn_st_close). */
struct trn_st_file {
    int fd;                        /* -1 when decoded from memory */
    uint64_t file_size;            /* 8 + header + data */
    uint64_t data_start;           /* 8 + header length */
    uint64_t data_len;             /* bytes in the data buffer */
    size_t n_tensors;              /* in header order */
    struct trn_st_tensor *tensors; /* (n_tensors) */
    size_t n_meta;
    struct trn_st_meta *meta; /* (n_meta) "__metadata__" in header order; empty if absent */
    size_t *by_name;          /* (n_tensors) indices sorted by name, for trn_st_find */
    char *strings;            /* decoded names and metadata */
    char *path;               /* for messages; NULL when decoded from memory */
};

/*
 * Decodes and validates a whole header. buf holds the first len bytes of a
 * file whose total size is file_size (len may be less: only 8 + N bytes are
 * needed). On success f owns what it holds and f->fd is -1; on failure f
 * holds nothing (trn_st_close is still safe). Returns 0, CDDP_EIO_SHORT (the
 * file or buf ends early), CDDP_ETOOBIG (header over 100 MB), CDDP_ECORRUPT
 * (anything else wrong) or -ENOMEM; err gets one line naming the problem.
 */
int trn_st_decode(const void *buf, size_t len, uint64_t file_size, struct trn_st_file *f, char *err,
                  size_t errlen);

/* Opens path and decodes its header (the data stays on disk until
 * trn_st_read). Codes as trn_st_decode, or -errno; messages start with path. */
int trn_st_open(const char *path, struct trn_st_file *f, char *err, size_t errlen);

/* Reads tensor t's bytes (t->nbytes) into dst. 0, CDDP_EIO_SHORT if the file
 * shrank since it was opened, or -errno. */
int trn_st_read(const struct trn_st_file *f, const struct trn_st_tensor *t, void *dst, char *err,
                size_t errlen);

/* zlib's CRC-32 of the whole data buffer, read from the file. */
int trn_st_data_crc32(const struct trn_st_file *f, uint32_t *crc, char *err, size_t errlen);

/* The tensor called name, or NULL. O(log n). */
const struct trn_st_tensor *trn_st_find(const struct trn_st_file *f, const char *name);
/* The metadata value for key, or NULL. */
const char *trn_st_meta_get(const struct trn_st_file *f, const char *key);

/* Frees what f holds and closes its fd; f may be zeroed or failed. */
void trn_st_close(struct trn_st_file *f);

/*
 * Serialises the header for tensors t[0..n) and meta[0..n_meta) into a
 * malloc'd buffer (*out, *out_len, 8-byte length prefix included; the caller
 * frees it). Checks names (non-empty, valid UTF-8, unique, not
 * "__metadata__"), dtypes and shapes. 0, CDDP_ECORRUPT with err naming the
 * tensor, CDDP_ETOOBIG or -ENOMEM.
 */
int trn_st_encode_header(const struct trn_st_tensor *t, size_t n, const struct trn_st_meta *meta,
                         size_t n_meta, uint8_t **out, size_t *out_len, char *err, size_t errlen);

/* Writes a whole file (header, then each tensor's data in order) to fd. 0,
 * the codes of trn_st_encode_header, or -errno. */
int trn_st_write_fd(int fd, const struct trn_st_tensor *t, size_t n, const struct trn_st_meta *meta,
                    size_t n_meta, char *err, size_t errlen);

/*
 * Writes path atomically: PATH.tmp in the same directory (created 0644, locked
 * with flock so two writers of one path fail instead of mixing), fsync,
 * rename over path, fsync of the directory. On failure the temporary file is
 * removed and path is as it was. 0, CDDP_EEXISTS if another process is
 * writing path right now, or the codes of trn_st_write_fd.
 */
int trn_st_save(const char *path, const struct trn_st_tensor *t, size_t n,
                const struct trn_st_meta *meta, size_t n_meta, char *err, size_t errlen);

/* CRC-32 (zlib) of the tensors' data as trn_st_save lays it out: lets a writer
 * put the checksum of the data buffer into the metadata it writes. */
uint32_t trn_st_tensors_crc32(const struct trn_st_tensor *t, size_t n);

#endif
