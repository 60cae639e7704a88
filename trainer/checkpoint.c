/* checkpoint.c: checkpoints and weight files; see checkpoint.h. */
#include "trainer/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/errors.h"
#include "common/strutil.h"

#define MAX_LISTED 5 /* names listed per kind of mismatch before "and N more" */

static int errorf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int errorf(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t numel_of(const struct trn_ckpt_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

static struct trn_st_tensor st_view(const struct trn_ckpt_tensor *t, const char *name)
{
    struct trn_st_tensor s = {.name = name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
    for (int i = 0; i < t->ndim; i++)
        s.shape[i] = (uint64_t)t->shape[i];
    return s;
}

/* ------------------------------------------------------------------ save */

struct strings {
    char **v;
    size_t n;
};

static char *keep(struct strings *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A formatted string that lives until strings_free. NULL when out of memory. */
static char *keep(struct strings *s, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    char **v = realloc(s->v, (s->n + 1) * sizeof(*v));
    if (v == NULL)
        return NULL;
    s->v = v;
    return (s->v[s->n] = strdup(buf)) != NULL ? s->v[s->n++] : NULL;
}

static void strings_free(struct strings *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
}

static int save_file(const char *path, const struct trn_ckpt_tensor *model, size_t n_model,
                     const struct trn_ckpt_tensor *mom, size_t n_mom,
                     const struct trn_ckpt_meta *meta, const char *arch, int num_classes, char *err,
                     size_t errlen)
{
    struct strings s = {0};
    struct trn_st_meta md[32];
    size_t nm = 0;
    int rc = 0;
    struct trn_st_tensor *t = calloc(n_model + n_mom + 1, sizeof(*t));
    if (t == NULL)
        return errorf(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
    for (size_t i = 0; i < n_model; i++)
        t[i] = st_view(&model[i], model[i].name);
    for (size_t i = 0; i < n_mom; i++) {
        const char *name = keep(&s, "%s%s", TRN_CKPT_MOMENTUM_PREFIX, mom[i].name);
        if (name == NULL)
            goto oom;
        t[n_model + i] = st_view(&mom[i], name);
    }

#define META(k, ...)                                                                               \
    do {                                                                                           \
        const char *v_ = keep(&s, __VA_ARGS__);                                                    \
        if (v_ == NULL)                                                                            \
            goto oom;                                                                              \
        md[nm++] = (struct trn_st_meta){(k), v_};                                                  \
    } while (0)
    META("format", "pt"); /* what safetensors.torch.save_file writes */
    if (meta != NULL)
        META("cddp.checkpoint", "%d", TRN_CKPT_VERSION);
    META("arch", "%s", arch);
    META("num_classes", "%d", num_classes);
    if (meta != NULL) {
        META("seed", "%" PRIu64, meta->seed);
        META("epoch", "%ld", meta->epoch);
        META("step", "%ld", meta->step);
        META("sampler.epoch_offset", "%" PRIu64, meta->epoch_offset);
        META("sampler.world_size", "%d", meta->world_size);
        META("sampler.batch_size", "%d", meta->batch_size);
        META("sampler.dataset_len", "%" PRIu64, meta->dataset_len);
        META("sampler.shuffle", "%d", meta->shuffle ? 1 : 0);
        META("sampler.drop_last", "%d", meta->drop_last ? 1 : 0);
        META("optimizer", "sgd");
        META("optimizer.steps", "%ld", meta->optimizer_steps);
        META("optimizer.lr", "%.17g", meta->lr);
        META("optimizer.momentum", "%.17g", meta->momentum);
        META("optimizer.weight_decay", "%.17g", meta->weight_decay);
        META("optimizer.lr_schedule", "%s", meta->lr_schedule[0] ? meta->lr_schedule : "constant");
        META("optimizer.lr_total_steps", "%ld", meta->lr_total_steps);
        if (meta->amp_scaler) {
            META("amp.scale", "%.17g", meta->amp_scale);
            META("amp.growth_tracker", "%ld", meta->amp_growth_tracker);
        }
        META("data_crc32", "%08" PRIx32, trn_st_tensors_crc32(t, n_model + n_mom));
    }
#undef META
    rc = trn_st_save(path, t, n_model + n_mom, md, nm, err, errlen);
    goto out;
oom:
    rc = errorf(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
out:
    strings_free(&s);
    free(t);
    return rc;
}

int trn_ckpt_save(const char *path, const struct trn_ckpt_tensor *model, size_t n_model,
                  const struct trn_ckpt_tensor *momentum, size_t n_mom,
                  const struct trn_ckpt_meta *meta, char *err, size_t errlen)
{
    return save_file(path, model, n_model, momentum, n_mom, meta, meta->arch, meta->num_classes,
                     err, errlen);
}

int trn_weights_save(const char *path, const char *arch, int num_classes,
                     const struct trn_ckpt_tensor *model, size_t n_model, char *err, size_t errlen)
{
    return save_file(path, model, n_model, NULL, 0, NULL, arch, num_classes, err, errlen);
}

/* ------------------------------------------------------------------ load */

/* One tensor the model wants, with the name it has in the file. */
struct want {
    const char *name;
    const struct trn_ckpt_tensor *t;
    const struct trn_st_tensor *got;
    bool counter;
};

static bool is_counter_name(const char *name)
{
    const char *suffix = "num_batches_tracked";
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && strcmp(name + n - k, suffix) == 0;
}

static bool dtype_ok(enum trn_st_dtype want, enum trn_st_dtype got, bool convert)
{
    if (want == got)
        return true;
    if (!convert)
        return false;
    if (want == TRN_ST_F32)
        return got == TRN_ST_F16 || got == TRN_ST_BF16 || got == TRN_ST_F64;
    if (want == TRN_ST_I64)
        return got == TRN_ST_I32;
    return false;
}

static void fmt_shape(struct cddp_buf *b, int ndim, const uint64_t *shape)
{
    cddp_buf_printf(b, "[");
    for (int i = 0; i < ndim; i++)
        cddp_buf_printf(b, "%s%" PRIu64, i ? ", " : "", shape[i]);
    cddp_buf_printf(b, "]");
}

/*
 * Finds every wanted tensor in f with a dtype and shape that fit, and checks
 * that f holds nothing else (except names starting with ignore_prefix).
 * With zero_missing_counters, counters that are all absent are allowed
 * (their want->got stays NULL). CDDP_EMISMATCH with the lists otherwise.
 */
static int find_model_tensors(const struct trn_st_file *f, const char *path, struct want *w,
                              size_t n, bool convert, bool zero_missing_counters,
                              const char *ignore_prefix, char *err, size_t errlen)
{
    bool *seen = calloc(f->n_tensors + 1, sizeof(bool));
    if (seen == NULL)
        return errorf(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
    size_t missing = 0, missing_counters = 0, counters = 0, bad = 0, unexpected = 0;
    for (size_t i = 0; i < n; i++) {
        w[i].counter = w[i].t->dtype == TRN_ST_I64 && is_counter_name(w[i].name);
        counters += w[i].counter;
        w[i].got = trn_st_find(f, w[i].name);
        if (w[i].got == NULL) {
            missing++;
            missing_counters += w[i].counter;
            continue;
        }
        seen[w[i].got - f->tensors] = true;
        bool same =
            dtype_ok(w[i].t->dtype, w[i].got->dtype, convert) && w[i].got->ndim == w[i].t->ndim;
        for (int d = 0; same && d < w[i].t->ndim; d++)
            same = w[i].got->shape[d] == (uint64_t)w[i].t->shape[d];
        bad += !same;
    }
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!seen[i] && (ignore_prefix == NULL ||
                         strncmp(f->tensors[i].name, ignore_prefix, strlen(ignore_prefix)) != 0))
            unexpected++;
    bool zero_counters = zero_missing_counters && counters > 0 && missing == counters &&
                         missing_counters == counters;
    if (zero_counters)
        missing = 0;
    if (missing == 0 && unexpected == 0 && bad == 0) {
        free(seen);
        return 0;
    }

    /* One line, in the spirit of PyTorch's load_state_dict error. */
    struct cddp_buf b;
    cddp_buf_init(&b, 4096);
    cddp_buf_printf(&b, "%s: does not match the model:", path);
    if (missing) {
        size_t k = 0;
        cddp_buf_printf(&b, " missing keys:");
        for (size_t i = 0; i < n; i++)
            if (w[i].got == NULL && k++ < MAX_LISTED)
                cddp_buf_printf(&b, "%s \"%s\"", k > 1 ? "," : "", w[i].name);
        if (missing > MAX_LISTED)
            cddp_buf_printf(&b, " (and %zu more)", missing - MAX_LISTED);
        cddp_buf_printf(&b, ";");
    }
    if (unexpected) {
        size_t k = 0;
        cddp_buf_printf(&b, " unexpected keys:");
        for (size_t i = 0; i < f->n_tensors; i++)
            if (!seen[i] &&
                (ignore_prefix == NULL ||
                 strncmp(f->tensors[i].name, ignore_prefix, strlen(ignore_prefix)) != 0) &&
                k++ < MAX_LISTED)
                cddp_buf_printf(&b, "%s \"%s\"", k > 1 ? "," : "", f->tensors[i].name);
        if (unexpected > MAX_LISTED)
            cddp_buf_printf(&b, " (and %zu more)", unexpected - MAX_LISTED);
        cddp_buf_printf(&b, ";");
    }
    if (bad) {
        size_t k = 0;
        cddp_buf_printf(&b, " mismatched:");
        for (size_t i = 0; i < n && k < MAX_LISTED; i++) {
            const struct trn_st_tensor *g = w[i].got;
            if (g == NULL)
                continue;
            uint64_t shape[4];
            for (int d = 0; d < w[i].t->ndim; d++)
                shape[d] = (uint64_t)w[i].t->shape[d];
            bool same = dtype_ok(w[i].t->dtype, g->dtype, convert) && g->ndim == w[i].t->ndim &&
                        memcmp(g->shape, shape, sizeof(uint64_t) * (size_t)g->ndim) == 0;
            if (same)
                continue;
            cddp_buf_printf(&b, "%s %s is %s ", k++ ? "," : "", w[i].name,
                            trn_st_dtype_name(g->dtype));
            fmt_shape(&b, g->ndim, g->shape);
            cddp_buf_printf(&b, " in the file, %s ", trn_st_dtype_name(w[i].t->dtype));
            fmt_shape(&b, w[i].t->ndim, shape);
            cddp_buf_printf(&b, " in the model");
        }
        if (bad > MAX_LISTED)
            cddp_buf_printf(&b, " (and %zu more)", bad - MAX_LISTED);
        cddp_buf_printf(&b, ";");
    }
    if (b.len > 0 && b.data[b.len - 1] == ';')
        b.data[--b.len] = '\0';
    errorf(err, errlen, CDDP_EMISMATCH, "%s", b.data ? b.data : path);
    cddp_buf_free(&b);
    free(seen);
    return CDDP_EMISMATCH;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13); /* inf, NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {
        float v = ldexpf((float)man, -24); /* zero and subnormals: exact in float */
        return sign ? -v : v;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Converts n elements of src (dtype from) into dst (dtype to). */
static void convert(void *dst, enum trn_st_dtype to, const void *src, enum trn_st_dtype from,
                    uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (to == TRN_ST_I64) { /* from I32 */
            int32_t v;
            memcpy(&v, (const char *)src + 4 * i, 4);
            ((int64_t *)dst)[i] = v;
            continue;
        }
        float f;
        if (from == TRN_ST_F64) {
            double d;
            memcpy(&d, (const char *)src + 8 * i, 8);
            f = (float)d;
        } else {
            uint16_t h;
            memcpy(&h, (const char *)src + 2 * i, 2);
            if (from == TRN_ST_BF16) {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&f, &bits, 4);
            } else {
                f = half_to_float(h);
            }
        }
        ((float *)dst)[i] = f;
    }
}

static int by_offset(const void *a, const void *b)
{
    const struct want *x = a, *y = b;
    uint64_t ox = x->got ? x->got->offset : 0, oy = y->got ? y->got->offset : 0;
    return ox < oy ? -1 : ox > oy;
}

/* Reads every matched tensor into its table memory, in file order, and the
 * CRC-32 of what was read (the whole data buffer when nothing is ignored). */
static int read_all(const struct trn_st_file *f, const char *path, struct want *w, size_t n,
                    uint32_t *crc, char *err, size_t errlen)
{
    qsort(w, n, sizeof(*w), by_offset);
    uLong c = crc32_z(0L, Z_NULL, 0);
    for (size_t i = 0; i < n; i++) {
        const struct trn_st_tensor *g = w[i].got;
        if (g == NULL) {
            memset(w[i].t->data, 0, numel_of(w[i].t) * trn_st_dtype_size(w[i].t->dtype));
            continue;
        }
        bool same = g->dtype == w[i].t->dtype;
        void *dst = same ? w[i].t->data : malloc(g->nbytes ? (size_t)g->nbytes : 1);
        if (dst == NULL)
            return errorf(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
        int rc = trn_st_read(f, g, dst, err, errlen);
        if (rc == 0)
            c = crc32_z(c, dst, (size_t)g->nbytes);
        if (!same) {
            if (rc == 0)
                convert(w[i].t->data, w[i].t->dtype, dst, g->dtype, g->numel);
            free(dst);
        }
        if (rc)
            return rc;
    }
    *crc = (uint32_t)c;
    return 0;
}

static int open_file(const char *path, struct trn_st_file *f, char *err, size_t errlen)
{
    int rc = trn_st_open(path, f, err, errlen);
    if (rc == -ENOENT)
        return errorf(err, errlen, CDDP_ENOTFOUND, "%s: no such file", path);
    return rc;
}

/* The metadata value for key, parsed; an absent or malformed value is corrupt. */
static int meta_u64(const struct trn_st_file *f, const char *path, const char *key, uint64_t *out,
                    char *err, size_t errlen)
{
    const char *v = trn_st_meta_get(f, key);
    if (v == NULL)
        return errorf(err, errlen, CDDP_ECORRUPT, "%s: checkpoint metadata has no '%s'", path, key);
    uint64_t x = 0;
    const char *p = v;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (x > (UINT64_MAX - d) / 10)
            break;
        x = x * 10 + d;
    }
    if (p == v || *p != '\0')
        return errorf(err, errlen, CDDP_ECORRUPT,
                      "%s: checkpoint metadata '%s' is '%.40s', not a non-negative integer", path,
                      key, v);
    *out = x;
    return 0;
}

static int meta_long(const struct trn_st_file *f, const char *path, const char *key, long max,
                     long *out, char *err, size_t errlen)
{
    uint64_t v;
    int rc = meta_u64(f, path, key, &v, err, errlen);
    if (rc)
        return rc;
    if (v > (uint64_t)max)
        return errorf(err, errlen, CDDP_ECORRUPT,
                      "%s: checkpoint metadata '%s' = %" PRIu64 " is out of range", path, key, v);
    *out = (long)v;
    return 0;
}

static int meta_double(const struct trn_st_file *f, const char *path, const char *key, double *out,
                       char *err, size_t errlen)
{
    const char *v = trn_st_meta_get(f, key);
    if (v == NULL || cddp_parse_double(v, -1e300, 1e300, out) != 0)
        return errorf(err, errlen, CDDP_ECORRUPT,
                      "%s: checkpoint metadata '%s' is missing or not a number", path, key);
    return 0;
}

static int parse_meta(const struct trn_st_file *f, const char *path, struct trn_ckpt_meta *m,
                      char *err, size_t errlen)
{
    long v = 0;
    int rc;
    memset(m, 0, sizeof(*m));
    cddp_strlcpy(m->arch, trn_st_meta_get(f, "arch"), sizeof(m->arch));
    if ((rc = meta_long(f, path, "num_classes", INT32_MAX, &v, err, errlen)))
        return rc;
    m->num_classes = (int)v;
    if ((rc = meta_u64(f, path, "seed", &m->seed, err, errlen)) ||
        (rc = meta_long(f, path, "epoch", LONG_MAX, &m->epoch, err, errlen)) ||
        (rc = meta_long(f, path, "step", LONG_MAX, &m->step, err, errlen)) ||
        (rc = meta_u64(f, path, "sampler.epoch_offset", &m->epoch_offset, err, errlen)) ||
        (rc = meta_u64(f, path, "sampler.dataset_len", &m->dataset_len, err, errlen)) ||
        (rc = meta_long(f, path, "optimizer.steps", LONG_MAX, &m->optimizer_steps, err, errlen)) ||
        (rc = meta_double(f, path, "optimizer.lr", &m->lr, err, errlen)) ||
        (rc = meta_double(f, path, "optimizer.momentum", &m->momentum, err, errlen)) ||
        (rc = meta_double(f, path, "optimizer.weight_decay", &m->weight_decay, err, errlen)))
        return rc;
    /* Optional: checkpoints from before --lr-schedule have a constant lr. */
    const char *sched = trn_st_meta_get(f, "optimizer.lr_schedule");
    if (sched == NULL)
        sched = "constant";
    if (strcmp(sched, "constant") != 0 && strcmp(sched, "cosine") != 0)
        return errorf(err, errlen, CDDP_ECORRUPT,
                      "%s: checkpoint metadata 'optimizer.lr_schedule' is '%.40s', not constant "
                      "or cosine",
                      path, sched);
    cddp_strlcpy(m->lr_schedule, sched, sizeof(m->lr_schedule));
    if (trn_st_meta_get(f, "optimizer.lr_total_steps") != NULL &&
        (rc = meta_long(f, path, "optimizer.lr_total_steps", LONG_MAX, &m->lr_total_steps, err,
                        errlen)))
        return rc;
    /* Optional: only --amp fp16 runs write the scaler's state. */
    if (trn_st_meta_get(f, "amp.scale") != NULL) {
        m->amp_scaler = true;
        if ((rc = meta_double(f, path, "amp.scale", &m->amp_scale, err, errlen)) ||
            (rc = meta_long(f, path, "amp.growth_tracker", LONG_MAX, &m->amp_growth_tracker, err,
                            errlen)))
            return rc;
    }
    if ((rc = meta_long(f, path, "sampler.world_size", INT32_MAX, &v, err, errlen)))
        return rc;
    m->world_size = (int)v;
    if ((rc = meta_long(f, path, "sampler.batch_size", INT32_MAX, &v, err, errlen)))
        return rc;
    m->batch_size = (int)v;
    if ((rc = meta_long(f, path, "sampler.shuffle", 1, &v, err, errlen)))
        return rc;
    m->shuffle = v != 0;
    if ((rc = meta_long(f, path, "sampler.drop_last", 1, &v, err, errlen)))
        return rc;
    m->drop_last = v != 0;
    return 0;
}

int trn_ckpt_load(const char *path, const char *arch, const struct trn_ckpt_tensor *model,
                  size_t n_model, const struct trn_ckpt_tensor *momentum, size_t n_mom,
                  struct trn_ckpt_meta *meta, char *err, size_t errlen)
{
    struct trn_st_file f;
    int rc = open_file(path, &f, err, errlen);
    if (rc)
        return rc;
    struct want *w = calloc(n_model + n_mom + 1, sizeof(*w));
    struct strings names = {0};
    const char *version = trn_st_meta_get(&f, "cddp.checkpoint");
    const char *file_arch = trn_st_meta_get(&f, "arch");
    const char *crc_hex = trn_st_meta_get(&f, "data_crc32");
    char want_version[16];
    snprintf(want_version, sizeof(want_version), "%d", TRN_CKPT_VERSION);
    if (w == NULL) {
        rc = errorf(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
    } else if (version == NULL) {
        rc = errorf(err, errlen, CDDP_ECORRUPT,
                    "%s: not a cddp-train checkpoint (no cddp.checkpoint metadata; to start "
                    "from a state_dict use --init)",
                    path);
    } else if (strcmp(version, want_version) != 0) {
        rc = errorf(err, errlen, CDDP_EMISMATCH,
                    "%s: checkpoint format version '%.16s'; this cddp-train reads version %d", path,
                    version, TRN_CKPT_VERSION);
    } else if (file_arch == NULL || strlen(file_arch) >= sizeof(meta->arch)) {
        rc =
            errorf(err, errlen, CDDP_ECORRUPT, "%s: checkpoint metadata has no valid 'arch'", path);
    } else if (strcmp(file_arch, arch) != 0) {
        rc = errorf(err, errlen, CDDP_EMISMATCH,
                    "%s: checkpoint of %s, but this run trains %s (--arch); use another "
                    "--checkpoint, or --no-resume to start over",
                    path, file_arch, arch);
    } else if (crc_hex == NULL || strlen(crc_hex) != 8 ||
               strspn(crc_hex, "0123456789abcdef") != 8) {
        rc = errorf(err, errlen, CDDP_ECORRUPT,
                    "%s: checkpoint metadata 'data_crc32' is missing or malformed", path);
    } else {
        rc = parse_meta(&f, path, meta, err, errlen);
    }
    for (size_t i = 0; rc == 0 && i < n_model; i++)
        w[i] = (struct want){.name = model[i].name, .t = &model[i]};
    for (size_t i = 0; rc == 0 && i < n_mom; i++) {
        const char *name = keep(&names, "%s%s", TRN_CKPT_MOMENTUM_PREFIX, momentum[i].name);
        if (name == NULL)
            rc = errorf(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
        w[n_model + i] = (struct want){.name = name, .t = &momentum[i]};
    }
    if (rc == 0)
        rc = find_model_tensors(&f, path, w, n_model + n_mom, false, false, NULL, err, errlen);
    uint32_t crc = 0;
    if (rc == 0)
        rc = read_all(&f, path, w, n_model + n_mom, &crc, err, errlen);
    if (rc == 0 && strtoul(crc_hex, NULL, 16) != crc)
        rc = errorf(err, errlen, CDDP_ECORRUPT,
                    "%s: corrupt: the data's CRC-32 is %08" PRIx32 ", the header says %s", path,
                    crc, crc_hex);
    strings_free(&names);
    free(w);
    trn_st_close(&f);
    return rc;
}

/* ---------------------------------------------------------------- resume */

int trn_ckpt_resume_point(const struct trn_ckpt_meta *m, const struct trn_ckpt_run *run,
                          struct trn_ckpt_start *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (m->seed != run->seed)
        return errorf(err, errlen, CDDP_EMISMATCH,
                      "written by a run with --seed %" PRIu64 ", this run has --seed %" PRIu64
                      " (the seed decides the data order); use the same seed, or --no-resume to "
                      "start over",
                      m->seed, run->seed);
    if (m->world_size < 1 || m->batch_size < 1)
        return errorf(err, errlen, CDDP_ECORRUPT,
                      "sampler position counted with world size %d and batch size %d",
                      m->world_size, m->batch_size);
    bool same = m->world_size == run->world_size && m->batch_size == run->batch_size &&
                m->dataset_len == run->dataset_len && m->shuffle == run->shuffle &&
                m->drop_last == run->drop_last;
    out->epoch = m->epoch;
    if (m->epoch_offset == 0) {
        out->resized = !same;
        return 0;
    }
    if (!same) {
        /* Name every difference, in flag terms. */
        struct cddp_buf b;
        cddp_buf_init(&b, 256);
        if (m->world_size != run->world_size)
            cddp_buf_printf(&b, "%sworld size %d, this run %d", b.len ? "; " : "", m->world_size,
                            run->world_size);
        if (m->batch_size != run->batch_size)
            cddp_buf_printf(&b, "%s--batch-size %d, this run %d", b.len ? "; " : "", m->batch_size,
                            run->batch_size);
        if (m->dataset_len != run->dataset_len)
            cddp_buf_printf(&b, "%s%" PRIu64 " training samples, this run %" PRIu64,
                            b.len ? "; " : "", m->dataset_len, run->dataset_len);
        if (m->shuffle != run->shuffle)
            cddp_buf_printf(&b, "%s%s, this run %s", b.len ? "; " : "",
                            m->shuffle ? "shuffled" : "--no-shuffle",
                            run->shuffle ? "shuffled" : "--no-shuffle");
        if (m->drop_last != run->drop_last)
            cddp_buf_printf(&b, "%sdrop_last %s, this run %s", b.len ? "; " : "",
                            m->drop_last ? "on" : "off", run->drop_last ? "on" : "off");
        int rc = errorf(err, errlen, CDDP_EMISMATCH,
                        "stopped inside epoch %ld (%" PRIu64 " samples in) with %s: a position "
                        "inside an epoch only carries over to the same settings; rerun with "
                        "them, or --no-resume to start over",
                        m->epoch, m->epoch_offset, b.data ? b.data : "other settings");
        cddp_buf_free(&b);
        return rc;
    }
    uint64_t per = m->epoch_offset / (uint64_t)m->world_size;
    if (m->epoch_offset % (uint64_t)m->world_size != 0 || per % (uint64_t)m->batch_size != 0 ||
        per >= run->rank_samples)
        return errorf(err, errlen, CDDP_ECORRUPT,
                      "sampler position %" PRIu64 " is not a batch boundary inside epoch %ld "
                      "(%d rank(s) x %" PRIu64 " samples, batches of %d)",
                      m->epoch_offset, m->epoch, m->world_size, run->rank_samples, m->batch_size);
    out->rank_offset = per;
    return 0;
}

int trn_weights_load(const char *path, const struct trn_ckpt_tensor *model, size_t n_model,
                     char *err, size_t errlen)
{
    struct trn_st_file f;
    int rc = open_file(path, &f, err, errlen);
    if (rc)
        return rc;
    bool is_ckpt = trn_st_meta_get(&f, "cddp.checkpoint") != NULL;
    struct want *w = calloc(n_model + 1, sizeof(*w));
    if (w == NULL) {
        trn_st_close(&f);
        return errorf(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
    }
    for (size_t i = 0; i < n_model; i++)
        w[i] = (struct want){.name = model[i].name, .t = &model[i]};
    rc = find_model_tensors(&f, path, w, n_model, true, true,
                            is_ckpt ? TRN_CKPT_MOMENTUM_PREFIX : NULL, err, errlen);
    uint32_t crc;
    if (rc == 0)
        rc = read_all(&f, path, w, n_model, &crc, err, errlen);
    free(w);
    trn_st_close(&f);
    return rc;
}
