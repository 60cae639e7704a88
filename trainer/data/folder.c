/*
 * folder.c: the folder dataset: torchvision's ImageFolder over JPEGs,
 * preprocessed as torchvision's ImageNet evaluation transform
 * (Resize(S), CenterCrop(S), ToTensor, Normalize(ImageNet mean/std)).
 *
 * Listing (at open): the classes are the sorted subdirectories of the split's
 * root; each class's images are found by a recursive walk that follows
 * symlinks, ordered as sorted(os.walk(...)) then sorted(files) order them.
 * Files with .jpg/.jpeg extensions (any case) are samples; a file with another
 * of ImageFolder's image extensions (.png, .bmp, ...) is refused at open,
 * since libjpeg-turbo cannot decode it and skipping it would make the sample
 * indices differ from torchvision's.
 *
 * Decoding (at get, thread-safe): libjpeg-turbo to RGB (grayscale expands to
 * RGB as PIL's convert("RGB")), warnings fatal (a truncated JPEG is an
 * error, as PIL raises), then Pillow's resampling algorithm for bilinear
 * resize: a triangle filter widened by the downscale factor, 22-bit
 * fixed-point weights, a horizontal pass then a vertical pass, each rounded
 * to 8 bits. Only the pixels the centre crop keeps are computed; they are the
 * values the full resize would give.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "common/errors.h"
#include "trainer/data/dataset.h"

#define MAX_DEPTH 64                /* symlink loops end here */
#define MAX_PIXELS 178956970ull     /* PIL's DecompressionBombError threshold */
#define MAX_FILE_BYTES (256u << 20) /* a JPEG larger than this is not a photo */
#define PRECISION_BITS (32 - 8 - 2) /* Pillow's fixed point for 8-bit images */

static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
static const float imagenet_std[3] = {0.229f, 0.224f, 0.225f};

struct sample {
    size_t path;    /* offset of the NUL-terminated path in folder.paths */
    size_t dir_len; /* the path's directory part, for the walk's sort order */
    int32_t label;
};

struct folder {
    struct trn_dataset base; /* first */
    char *paths;
    size_t paths_len, paths_cap;
    struct sample *samples;
    size_t n, cap;
    int size; /* crop size */
};

/* ------------------------------------------------------------- listing */

static int add_sample(struct folder *f, const char *dir, const char *name, int32_t label)
{
    size_t dl = strlen(dir), nl = strlen(name), need = dl + 1 + nl + 1;
    if (f->paths_len + need > f->paths_cap) {
        size_t nc = f->paths_cap ? f->paths_cap * 2 : 1 << 16;
        while (nc < f->paths_len + need)
            nc *= 2;
        char *p = realloc(f->paths, nc);
        if (p == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        f->paths = p, f->paths_cap = nc;
    }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 1024;
        struct sample *s = realloc(f->samples, nc * sizeof(*s));
        if (s == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        f->samples = s, f->cap = nc;
    }
    char *p = f->paths + f->paths_len;
    memcpy(p, dir, dl);
    p[dl] = '/';
    memcpy(p + dl + 1, name, nl + 1);
    f->samples[f->n++] = (struct sample){.path = f->paths_len, .dir_len = dl, .label = label};
    f->paths_len += need;
    return 0;
}

static const char *ext_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot : "";
}

static bool is_jpeg_name(const char *name)
{
    const char *e = ext_of(name);
    return strcasecmp(e, ".jpg") == 0 || strcasecmp(e, ".jpeg") == 0;
}

/* ImageFolder's other extensions (torchvision IMG_EXTENSIONS). */
static bool is_other_image_name(const char *name)
{
    static const char *const other[] = {".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
    const char *e = ext_of(name);
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
        if (strcasecmp(e, other[i]) == 0)
            return true;
    return false;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in dir (without . and ..), sorted; *dirs_only keeps directories. */
static int list_dir(const char *dir, bool dirs_only, char ***out, size_t *n, char *err,
                    size_t errlen)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (d == NULL) {
        int e = errno;
        snprintf(err, errlen, "folder: %s: %s", dir, strerror(e));
        return e == ENOENT ? CDDP_ENOTFOUND : CDDP_ERR_FROM_ERRNO(e);
    }
    char **names = NULL;
    size_t cap = 0, cnt = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (dirs_only) {
            char p[PATH_MAX];
            struct stat st;
            if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) >= sizeof(p) ||
                stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
                continue;
        }
        if (cnt == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof(*names));
            if (nn == NULL) {
                rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
                break;
            }
            names = nn;
        }
        if ((names[cnt] = strdup(de->d_name)) == NULL) {
            rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
            break;
        }
        cnt++;
    }
    closedir(d);
    if (rc) {
        for (size_t i = 0; i < cnt; i++)
            free(names[i]);
        free(names);
        snprintf(err, errlen, "folder: %s: out of memory", dir);
        return rc;
    }
    if (cnt > 1)
        qsort(names, cnt, sizeof(*names), cmp_str);
    *out = names;
    *n = cnt;
    return 0;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int walk(struct folder *f, const char *dir, int32_t label, int depth, char *err,
                size_t errlen)
{
    if (depth > MAX_DEPTH) {
        snprintf(err, errlen, "folder: %s: nested more than %d levels deep (a symlink loop?)", dir,
                 MAX_DEPTH);
        return CDDP_ECORRUPT;
    }
    char **names;
    size_t n;
    int rc = list_dir(dir, false, &names, &n, err, errlen);
    if (rc)
        return rc;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char p[PATH_MAX];
        struct stat st;
        if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, names[i]) >= sizeof(p)) {
            snprintf(err, errlen, "folder: %s/%s: path too long", dir, names[i]);
            rc = CDDP_ECONFIG;
        } else if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            rc = walk(f, p, label, depth + 1, err, errlen);
        } else if (is_jpeg_name(names[i])) {
            if ((rc = add_sample(f, dir, names[i], label)) != 0)
                snprintf(err, errlen, "folder: out of memory");
        } else if (is_other_image_name(names[i])) {
            snprintf(err, errlen, "folder: %s: only JPEG images are supported (.jpg, .jpeg)", p);
            rc = CDDP_ECONFIG;
        }
    }
    free_names(names, n);
    return rc;
}

/* sorted(os.walk(root)) then sorted(files): by directory path, then by name. */
static int cmp_sample(const void *a, const void *b, void *arg)
{
    const char *paths = arg;
    const struct sample *x = a, *y = b;
    const char *px = paths + x->path, *py = paths + y->path;
    size_t m = x->dir_len < y->dir_len ? x->dir_len : y->dir_len;
    int c = memcmp(px, py, m);
    if (c != 0)
        return c;
    if (x->dir_len != y->dir_len)
        return x->dir_len < y->dir_len ? -1 : 1;
    return strcmp(px + x->dir_len + 1, py + y->dir_len + 1);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ------------------------------------------------------------ decoding */

struct coeffs {
    int ksize;
    int *bounds; /* (out, 2): first input index, count */
    int32_t *k;  /* (out, ksize) fixed-point weights */
};

static double triangle(double x)
{
    x = x < 0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's coefficients for a bilinear resize of in_size to out_size. */
static int make_coeffs(int in_size, int out_size, struct coeffs *c)
{
    double scale = (double)(float)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale, ss = 1.0 / filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    c->ksize = ksize;
    c->bounds = malloc((size_t)out_size * 2 * sizeof(int));
    c->k = calloc((size_t)out_size * (size_t)ksize, sizeof(int32_t));
    double *w = malloc((size_t)ksize * sizeof(double));
    if (c->bounds == NULL || c->k == NULL || w == NULL) {
        free(w);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, total = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        xmin = xmin < 0 ? 0 : xmin;
        xmax = (xmax > in_size ? in_size : xmax) - xmin;
        for (int x = 0; x < xmax; x++) {
            w[x] = triangle((x + xmin - center + 0.5) * ss);
            total += w[x];
        }
        for (int x = 0; x < xmax; x++) {
            double v = total != 0.0 ? w[x] / total : w[x];
            c->k[(size_t)xx * (size_t)ksize + (size_t)x] =
                (int32_t)(v < 0 ? -0.5 + v * (1 << PRECISION_BITS)
                                : 0.5 + v * (1 << PRECISION_BITS));
        }
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = xmax;
    }
    free(w);
    return 0;
}

static void free_coeffs(struct coeffs *c)
{
    free(c->bounds);
    free(c->k);
}

static uint8_t clip8(int32_t ss)
{
    int32_t v = ss >> PRECISION_BITS; /* bilinear weights are >= 0, so ss is too */
    return (uint8_t)(v > 255 ? 255 : v < 0 ? 0 : v);
}

/* torchvision's CenterCrop offset: int(round((in - out) / 2.0)), Python's
 * round-half-to-even. */
static int crop_offset(int in, int out)
{
    int d = in - out, k = d / 2;
    return (d % 2 == 0) ? k : k + (k & 1);
}

static int read_file(const char *path, uint8_t **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return CDDP_ERR_FROM_ERRNO(e);
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_FILE_BYTES) {
        close(fd);
        return CDDP_ETOOBIG;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL) {
        close(fd);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = got;
    return 0;
}

/* Decodes path to RGB; *rgb is malloc'd (h * w * 3). */
static int decode_jpeg(const char *path, uint8_t **rgb, int *w, int *h, char *err, size_t errlen)
{
    uint8_t *jpg = NULL, *pix = NULL;
    size_t len = 0;
    int rc = read_file(path, &jpg, &len);
    if (rc) {
        snprintf(err, errlen, "folder: %s: %s", path,
                 rc == CDDP_ETOOBIG ? "not a regular file of at most 256 MiB" : cddp_strerror(rc));
        return rc;
    }
    tjhandle tj = tjInitDecompress();
    if (tj == NULL) {
        free(jpg);
        snprintf(err, errlen, "folder: %s: cannot start the JPEG decoder", path);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    /* libjpeg-turbo 2.1 leaves them unset for a header without a frame
     * (tables only): 0, not whatever was on the stack, so that JPEG is
     * reported as having no size, every time. */
    int subsamp = 0, colorspace = 0;
    *w = *h = 0;
    if (tjDecompressHeader3(tj, jpg, (unsigned long)len, w, h, &subsamp, &colorspace) != 0) {
        snprintf(err, errlen, "folder: %s: corrupt or not a JPEG (%s)", path, tjGetErrorStr2(tj));
        rc = CDDP_ECORRUPT;
        goto out;
    }
    if (*w < 1 || *h < 1) {
        snprintf(err, errlen, "folder: %s: corrupt JPEG (no image size in its header)", path);
        rc = CDDP_ECORRUPT;
        goto out;
    }
    if ((uint64_t)*w * (uint64_t)*h > MAX_PIXELS) {
        snprintf(err, errlen, "folder: %s: %dx%d pixels is too large (decompression bomb?)", path,
                 *w, *h);
        rc = CDDP_ECORRUPT;
        goto out;
    }
    pix = malloc((size_t)*w * (size_t)*h * 3);
    if (pix == NULL) {
        snprintf(err, errlen, "folder: %s: out of memory", path);
        rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
        goto out;
    }
    if (tjDecompress2(tj, jpg, (unsigned long)len, pix, *w, 0, *h, TJPF_RGB,
                      TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
        snprintf(err, errlen, "folder: %s: corrupt JPEG (%s)", path, tjGetErrorStr2(tj));
        rc = CDDP_ECORRUPT;
        goto out;
    }
out:
    tjDestroy(tj);
    free(jpg);
    if (rc) {
        free(pix);
        return rc;
    }
    *rgb = pix;
    return 0;
}

static int folder_get(const struct trn_dataset *d, size_t index, float *chw, int32_t *label,
                      char *err, size_t errlen)
{
    const struct folder *f = (const struct folder *)d;
    const char *path = f->paths + f->samples[index].path;
    int w, h, S = f->size;
    uint8_t *rgb;
    int rc = decode_jpeg(path, &rgb, &w, &h, err, errlen);
    if (rc)
        return rc;
    /* torchvision Resize(S): the shorter side becomes S, the longer
     * int(S * long / short). */
    int ow, oh;
    if (w <= h)
        ow = S, oh = (int)((double)((long long)S * h) / w);
    else
        oh = S, ow = (int)((double)((long long)S * w) / h);
    int top = crop_offset(oh, S), left = crop_offset(ow, S);
    struct coeffs cx = {0}, cy = {0};
    uint8_t *tmp = NULL;
    bool need_h = ow != w, need_v = oh != h;
    if ((need_h && (rc = make_coeffs(w, ow, &cx)) != 0) ||
        (need_v && (rc = make_coeffs(h, oh, &cy)) != 0))
        goto out;
    /* Horizontal pass over the input rows the vertical pass will read, for the
     * S output columns the crop keeps. */
    int y0 = need_v ? cy.bounds[2 * top] : top;
    int y1 = need_v ? cy.bounds[2 * (top + S - 1)] + cy.bounds[2 * (top + S - 1) + 1] : top + S;
    size_t rows = (size_t)(y1 - y0);
    tmp = malloc(rows * (size_t)S * 3);
    if (tmp == NULL) {
        rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
        goto out;
    }
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *in = rgb + ((size_t)y0 + r) * (size_t)w * 3;
        uint8_t *o = tmp + r * (size_t)S * 3;
        for (int xx = 0; xx < S; xx++) {
            int ox = left + xx;
            if (!need_h) {
                memcpy(o + xx * 3, in + (size_t)ox * 3, 3);
                continue;
            }
            int xmin = cx.bounds[2 * ox], xn = cx.bounds[2 * ox + 1];
            const int32_t *k = cx.k + (size_t)ox * (size_t)cx.ksize;
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int x = 0; x < xn; x++) {
                const uint8_t *p = in + (size_t)(xmin + x) * 3;
                s0 += p[0] * k[x];
                s1 += p[1] * k[x];
                s2 += p[2] * k[x];
            }
            o[xx * 3] = clip8(s0), o[xx * 3 + 1] = clip8(s1), o[xx * 3 + 2] = clip8(s2);
        }
    }
    /* Vertical pass for the S output rows the crop keeps, then ToTensor and
     * Normalize in float32, in torchvision's order of operations. */
    size_t plane = (size_t)S * (size_t)S;
    for (int yy = 0; yy < S; yy++) {
        int oy = top + yy;
        for (int xx = 0; xx < S; xx++) {
            uint8_t px[3];
            if (!need_v) {
                memcpy(px, tmp + ((size_t)(oy - y0) * (size_t)S + (size_t)xx) * 3, 3);
            } else {
                int ymin = cy.bounds[2 * oy] - y0, yn = cy.bounds[2 * oy + 1];
                const int32_t *k = cy.k + (size_t)oy * (size_t)cy.ksize;
                int32_t s[3] = {1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1),
                                1 << (PRECISION_BITS - 1)};
                for (int y = 0; y < yn; y++) {
                    const uint8_t *p = tmp + ((size_t)(ymin + y) * (size_t)S + (size_t)xx) * 3;
                    s[0] += p[0] * k[y];
                    s[1] += p[1] * k[y];
                    s[2] += p[2] * k[y];
                }
                px[0] = clip8(s[0]), px[1] = clip8(s[1]), px[2] = clip8(s[2]);
            }
            for (int c = 0; c < 3; c++) {
                float v = (float)px[c] / 255.0f;
                v = v - imagenet_mean[c];
                chw[(size_t)c * plane + (size_t)yy * (size_t)S + (size_t)xx] = v / imagenet_std[c];
            }
        }
    }
    *label = f->samples[index].label;
out:
    if (rc)
        snprintf(err, errlen, "folder: %s: out of memory", path);
    free(tmp);
    free_coeffs(&cx);
    free_coeffs(&cy);
    free(rgb);
    return rc;
}

static void folder_close(struct trn_dataset *d)
{
    struct folder *f = (struct folder *)d;
    free(f->paths);
    free(f->samples);
    free(f);
}

int trn_folder_open(const char *dir, const struct trn_dataset_opts *o, struct trn_dataset **out,
                    char *err, size_t errlen)
{
    char root[PATH_MAX], p[PATH_MAX];
    int size = o->image_size ? o->image_size : 224;
    if (size < 1 || size > 4096) {
        snprintf(err, errlen, "folder: image size %d out of range (1..4096)", size);
        return CDDP_ECONFIG;
    }
    if (!is_dir(dir)) {
        snprintf(err, errlen, "folder: %s: no such directory", dir);
        return CDDP_ENOTFOUND;
    }
    /* DIR/train with DIR/val (or DIR/test) is a split layout; else DIR is the
     * training set and there is no test split. */
    snprintf(p, sizeof(p), "%s/train", dir);
    bool split_layout = is_dir(p);
    const char *test_dir = NULL;
    if (split_layout) {
        snprintf(root, sizeof(root), "%s/val", dir);
        if (is_dir(root)) {
            test_dir = "val";
        } else {
            snprintf(root, sizeof(root), "%s/test", dir);
            test_dir = is_dir(root) ? "test" : NULL;
        }
        split_layout = test_dir != NULL;
    }
    if (o->split == TRN_SPLIT_TEST && !split_layout) {
        snprintf(err, errlen,
                 "folder: %s has no train/ and val/ (or test/) subfolders, so no test split", dir);
        return CDDP_ENOTFOUND;
    }
    int n = split_layout ? snprintf(root, sizeof(root), "%s/%s", dir,
                                    o->split == TRN_SPLIT_TEST ? test_dir : "train")
                         : snprintf(root, sizeof(root), "%s", dir);
    if (n < 0 || (size_t)n >= sizeof(root)) {
        snprintf(err, errlen, "folder: %s: path too long", dir);
        return CDDP_ECONFIG;
    }

    char **classes;
    size_t nclasses;
    int rc = list_dir(root, true, &classes, &nclasses, err, errlen);
    if (rc)
        return rc;
    if (nclasses == 0 || nclasses > INT32_MAX) {
        snprintf(err, errlen, "folder: %s has no class folders (DIR/CLASS/IMAGE.jpg)", root);
        free_names(classes, nclasses);
        return CDDP_ENOTFOUND;
    }
    struct folder *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        free_names(classes, nclasses);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    for (size_t c = 0; c < nclasses && rc == 0; c++) {
        size_t first = f->n;
        if ((size_t)snprintf(p, sizeof(p), "%s/%s", root, classes[c]) >= sizeof(p)) {
            snprintf(err, errlen, "folder: %s/%s: path too long", root, classes[c]);
            rc = CDDP_ECONFIG;
            break;
        }
        if ((rc = walk(f, p, (int32_t)c, 0, err, errlen)) != 0)
            break;
        if (f->n == first) {
            snprintf(err, errlen, "folder: class folder %s has no JPEG images", p);
            rc = CDDP_ENOTFOUND;
            break;
        }
        qsort_r(f->samples + first, f->n - first, sizeof(*f->samples), cmp_sample, f->paths);
    }
    free_names(classes, nclasses);
    if (rc) {
        folder_close(&f->base);
        return rc;
    }
    size_t len = f->n;
    if (o->limit > 0 && o->limit < len)
        len = o->limit;
    f->size = size;
    f->base = (struct trn_dataset){
        .kind = "folder",
        .len = len,
        .channels = 3,
        .height = size,
        .width = size,
        .num_classes = (int)nclasses,
        .get = folder_get,
        .close = folder_close,
    };
    *out = &f->base;
    return 0;
}
