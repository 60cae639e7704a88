/*
 * conv.c: 2-d convolution (no bias), forward and backward, on oneDNN.
 *
 * oneDNN's direct convolutions are what PyTorch runs on this CPU too. We
 * ask for them with activations in the backend's blocked layout (nChw8c /
 * nChw16c) on both sides, so nothing is reordered between layers; only the
 * network input is plain NCHW (3 channels), which the first convolution
 * reads directly. The weights stay OIHW in the flat parameter buffer and are
 * reordered into the layout each primitive wants just before it runs, into
 * one shared scratch buffer (a layer's weights are small next to its
 * activations); the weight gradient comes back the same way, added to the
 * flat gradient buffer when accumulating.
 *
 * The weight gradient on small maps (the last stages at small inputs, 4x4
 * outputs or fewer) is one matrix product instead: oneDNN's direct kernel
 * parallelises it poorly there (18 GFLOP/s at 4x4 against 60 for sgemm on
 * one core here) and at 2x2 with a 3x3 kernel it has none at all and falls
 * back to reference loops, a thousand times slower. With the activations in
 * NHWC (n, y, x, c) the gradient is
 *
 *     dW (O, kh*kw*C) = dY^T (O, N*OH*OW) . col (N*OH*OW, kh*kw*C)
 *
 * where each row of col holds the input patch under one output position
 * (im2col); dW comes out as OHWI and is reordered to OIHW.
 *
 * Backward is two calls, weights then data, so a layer's weight gradient is
 * final (and DDP can start reducing it) before its input gradient is done.
 *
 * Plans (primitives, memory objects) are built per input shape on first use
 * and kept: the training batch, the smaller last batch and eval each get
 * their own. Everything here is deterministic for a fixed thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/cpu/cpu.h"

#define MAX_PLANS 4
/* Output maps of at most this many positions take the sgemm weight gradient. */
#define GEMM_WGRAD_MAX_POSITIONS 16

struct conv_plan {
    int n, h, w, oh, ow; /* input shape it was built for, and the output's */
    enum trn_layout xl;  /* input layout */
    /* forward */
    dnnl_primitive_t fwd;
    dnnl_primitive_t w_to_fwd; /* OIHW -> fwd weights layout; NULL when equal */
    /* weight gradient: oneDNN's ... */
    dnnl_primitive_t bwd_w;
    dnnl_primitive_t dw_set, dw_add; /* its weights layout -> OIHW (=, +=) */
    /* ... or im2col + sgemm (gemm_wgrad) */
    bool gemm_wgrad;
    dnnl_primitive_t x_to_nhwc, dy_to_nhwc;
    /* input gradient; NULL when not wanted */
    dnnl_primitive_t bwd_d;
    dnnl_primitive_t w_to_bwd_d;
    /* memory objects; handles are set before each execution */
    dnnl_memory_t x, y, dx, dy, w_user, w_fwd, w_bwd_d, dw_bwd, x_nhwc, dy_nhwc;
    dnnl_memory_t sp_fwd, sp_bwd_w, sp_bwd_d; /* each primitive's view of the scratchpad */
    bool fwd_built, bwd_built;
};

struct conv_impl {
    struct conv_plan plans[MAX_PLANS];
    int n_plans;
    int lru; /* next plan slot to replace when all are used */
};

static dnnl_memory_t make_mem(struct cpu_backend *cb, const dnnl_memory_desc_t *md)
{
    dnnl_memory_t m;
    dnnlCheck(dnnl_memory_create(&m, md, cb->engine, DNNL_MEMORY_NONE));
    return m;
}

static void set_mem(dnnl_memory_t m, const void *p)
{
    dnnlCheck(dnnl_memory_set_data_handle(m, (void *)p));
}

static void run(struct cpu_backend *cb, dnnl_primitive_t p, int nargs, const dnnl_exec_arg_t *args)
{
    dnnlCheck(dnnl_primitive_execute(p, cb->stream, nargs, args));
}

/* Runs a reorder primitive from memory `from` (data at src) to `to` (data at dst). */
static void run_reorder(struct cpu_backend *cb, dnnl_primitive_t r, dnnl_memory_t from,
                        const void *src, dnnl_memory_t to, void *dst)
{
    set_mem(from, src);
    set_mem(to, dst);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    run(cb, r, 2, args);
}

/* A reorder primitive from md `from` to md `to`, optionally adding to the destination. */
static dnnl_primitive_t make_reorder(struct cpu_backend *cb, const dnnl_memory_desc_t *from,
                                     const dnnl_memory_desc_t *to, bool add)
{
    dnnl_primitive_attr_t attr = NULL;
    if (add) {
        dnnl_post_ops_t po;
        dnnlCheck(dnnl_primitive_attr_create(&attr));
        dnnlCheck(dnnl_post_ops_create(&po));
        dnnlCheck(dnnl_post_ops_append_sum(po, 1.0f));
        dnnlCheck(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnlCheck(dnnl_reorder_primitive_desc_create(&pd, from, cb->engine, to, cb->engine, attr));
    dnnlCheck(dnnl_primitive_create(&p, pd));
    dnnl_primitive_desc_destroy(pd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return p;
}

/* Whether oneDNN chose its reference (naive loop) implementation. */
static bool is_reference(dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    dnnlCheck(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    return impl && strncmp(impl, "ref", 3) == 0;
}

/* The memory descriptors and geometry of one plan. */
struct geometry {
    dnnl_memory_desc_t x, y, w_any, w_user, x_nhwc, y_nhwc, w_ohwi;
    dnnl_dims_t strides, pad_l, pad_r;
};

static void geometry_init(struct geometry *g, const struct trn_conv *c, const struct conv_plan *p,
                          enum trn_layout yl)
{
    dnnl_dims_t xd = {p->n, c->cin, p->h, p->w}, yd = {p->n, c->cout, p->oh, p->ow};
    dnnl_dims_t wd = {c->cout, c->cin, c->k, c->k};
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->x, 4, xd, dnnl_f32, cpu_layout_tag(p->xl)));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->y, 4, yd, dnnl_f32, cpu_layout_tag(yl)));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->x_nhwc, 4, xd, dnnl_f32, dnnl_nhwc));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->y_nhwc, 4, yd, dnnl_f32, dnnl_nhwc));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->w_any, 4, wd, dnnl_f32, dnnl_format_tag_any));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->w_user, 4, wd, dnnl_f32, dnnl_oihw));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->w_ohwi, 4, wd, dnnl_f32, dnnl_ohwi));
    g->strides[0] = g->strides[1] = c->stride;
    g->pad_l[0] = g->pad_l[1] = c->pad;
    g->pad_r[0] = g->pad_r[1] = c->pad;
}

static dnnl_primitive_attr_t user_scratchpad_attr(void)
{
    dnnl_primitive_attr_t attr;
    dnnlCheck(dnnl_primitive_attr_create(&attr));
    dnnlCheck(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    return attr;
}

static dnnl_primitive_desc_t fwd_pd(struct cpu_backend *cb, const struct geometry *g,
                                    dnnl_primitive_attr_t attr)
{
    dnnl_convolution_desc_t d;
    dnnlCheck(dnnl_convolution_forward_desc_init(&d, dnnl_forward_training, dnnl_convolution_direct,
                                                 &g->x, &g->w_any, NULL, &g->y, g->strides,
                                                 g->pad_l, g->pad_r));
    dnnl_primitive_desc_t pd;
    dnnlCheck(dnnl_primitive_desc_create(&pd, &d, attr, cb->engine, NULL));
    return pd;
}

/* Reserves the shared scratchpad for pd and the shared weight buffer for md;
 * returns a memory object for pd's scratchpad. */
static dnnl_memory_t reserve(struct cpu_backend *cb, dnnl_primitive_desc_t pd,
                             const dnnl_memory_desc_t *md)
{
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    cpu_scratch_reserve(&cb->scratchpad, &cb->scratchpad_size, dnnl_memory_desc_get_size(sp));
    cpu_scratch_reserve(&cb->wbuf, &cb->wbuf_size, dnnl_memory_desc_get_size(md));
    return make_mem(cb, sp);
}

static void make_io_mems(struct cpu_backend *cb, struct conv_plan *p, const struct geometry *g)
{
    if (p->x)
        return;
    p->x = make_mem(cb, &g->x);
    p->y = make_mem(cb, &g->y);
    p->dy = make_mem(cb, &g->y);
    p->w_user = make_mem(cb, &g->w_user);
}

static void build_forward(struct cpu_backend *cb, const struct trn_conv *c, struct conv_plan *p,
                          enum trn_layout yl)
{
    struct geometry g;
    geometry_init(&g, c, p, yl);
    dnnl_primitive_attr_t attr = user_scratchpad_attr();
    dnnl_primitive_desc_t pd = fwd_pd(cb, &g, attr);
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnlCheck(dnnl_primitive_create(&p->fwd, pd));
    if (!dnnl_memory_desc_equal(wmd, &g.w_user))
        p->w_to_fwd = make_reorder(cb, &g.w_user, wmd, false);
    p->sp_fwd = reserve(cb, pd, wmd);
    make_io_mems(cb, p, &g);
    p->w_fwd = make_mem(cb, wmd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    p->fwd_built = true;
}

/* The sgemm weight gradient's buffers: x and dy as NHWC, then col. */
static size_t gemm_wgrad_bytes(const struct trn_conv *c, const struct conv_plan *p)
{
    size_t np = (size_t)p->n * p->oh * p->ow;
    size_t x = (size_t)p->n * p->h * p->w * c->cin, dy = np * c->cout;
    size_t col = np * c->k * c->k * c->cin;
    return (x + dy + col) * sizeof(float) + 128;
}

static void build_backward(struct cpu_backend *cb, const struct trn_conv *c, struct conv_plan *p,
                           enum trn_layout yl)
{
    struct geometry g;
    geometry_init(&g, c, p, yl);
    make_io_mems(cb, p, &g);
    dnnl_primitive_attr_t attr = user_scratchpad_attr();
    dnnl_primitive_desc_t hint = fwd_pd(cb, &g, attr);

    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd;
    dnnlCheck(dnnl_convolution_backward_weights_desc_init(
        &d, dnnl_convolution_direct, &g.x, &g.w_any, NULL, &g.y, g.strides, g.pad_l, g.pad_r));
    dnnlCheck(dnnl_primitive_desc_create(&pd, &d, attr, cb->engine, hint));
    p->gemm_wgrad = p->oh * p->ow <= GEMM_WGRAD_MAX_POSITIONS || is_reference(pd);
    if (p->gemm_wgrad) {
        p->x_to_nhwc = make_reorder(cb, &g.x, &g.x_nhwc, false);
        p->dy_to_nhwc = make_reorder(cb, &g.y, &g.y_nhwc, false);
        p->x_nhwc = make_mem(cb, &g.x_nhwc);
        p->dy_nhwc = make_mem(cb, &g.y_nhwc);
        p->dw_set = make_reorder(cb, &g.w_ohwi, &g.w_user, false);
        p->dw_add = make_reorder(cb, &g.w_ohwi, &g.w_user, true);
        p->dw_bwd = make_mem(cb, &g.w_ohwi);
        cpu_scratch_reserve(&cb->abuf, &cb->abuf_size, gemm_wgrad_bytes(c, p));
        cpu_scratch_reserve(&cb->wbuf, &cb->wbuf_size, dnnl_memory_desc_get_size(&g.w_ohwi));
    } else {
        const dnnl_memory_desc_t *dwmd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
        dnnlCheck(dnnl_primitive_create(&p->bwd_w, pd));
        p->dw_set = make_reorder(cb, dwmd, &g.w_user, false);
        p->dw_add = make_reorder(cb, dwmd, &g.w_user, true);
        p->dw_bwd = make_mem(cb, dwmd);
        p->sp_bwd_w = reserve(cb, pd, dwmd);
    }
    dnnl_primitive_desc_destroy(pd);

    if (c->need_dx) {
        dnnlCheck(dnnl_convolution_backward_data_desc_init(
            &d, dnnl_convolution_direct, &g.x, &g.w_any, &g.y, g.strides, g.pad_l, g.pad_r));
        dnnlCheck(dnnl_primitive_desc_create(&pd, &d, attr, cb->engine, hint));
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        dnnlCheck(dnnl_primitive_create(&p->bwd_d, pd));
        if (!dnnl_memory_desc_equal(wmd, &g.w_user))
            p->w_to_bwd_d = make_reorder(cb, &g.w_user, wmd, false);
        p->w_bwd_d = make_mem(cb, wmd);
        p->dx = make_mem(cb, &g.x);
        p->sp_bwd_d = reserve(cb, pd, wmd);
        dnnl_primitive_desc_destroy(pd);
    }
    dnnl_primitive_desc_destroy(hint);
    dnnl_primitive_attr_destroy(attr);
    p->bwd_built = true;
}

static void plan_destroy(struct conv_plan *p)
{
    dnnl_primitive_t prims[] = {p->fwd,       p->w_to_fwd,   p->bwd_w, p->dw_set,    p->dw_add,
                                p->x_to_nhwc, p->dy_to_nhwc, p->bwd_d, p->w_to_bwd_d};
    for (size_t i = 0; i < sizeof(prims) / sizeof(prims[0]); i++)
        if (prims[i])
            dnnl_primitive_destroy(prims[i]);
    dnnl_memory_t mems[] = {p->x,      p->y,        p->dx,      p->dy,     p->w_user,
                            p->w_fwd,  p->w_bwd_d,  p->dw_bwd,  p->x_nhwc, p->dy_nhwc,
                            p->sp_fwd, p->sp_bwd_w, p->sp_bwd_d};
    for (size_t i = 0; i < sizeof(mems) / sizeof(mems[0]); i++)
        if (mems[i])
            dnnl_memory_destroy(mems[i]);
    memset(p, 0, sizeof(*p));
}

/* The plan for input shape x, found or made (replacing the oldest when full). */
static struct conv_plan *plan_for(struct trn_conv *c, const struct trn_tensor *x)
{
    struct conv_impl *im = c->impl;
    if (!im)
        im = c->impl = trn_calloc(1, sizeof(*im));
    for (int i = 0; i < im->n_plans; i++) {
        struct conv_plan *p = &im->plans[i];
        if (p->n == x->n && p->h == x->h && p->w == x->w && p->xl == x->layout)
            return p;
    }
    struct conv_plan *p;
    if (im->n_plans < MAX_PLANS) {
        p = &im->plans[im->n_plans++];
    } else {
        p = &im->plans[im->lru];
        im->lru = (im->lru + 1) % MAX_PLANS;
        plan_destroy(p);
    }
    p->n = x->n;
    p->h = x->h;
    p->w = x->w;
    p->oh = (x->h + 2 * c->pad - c->k) / c->stride + 1;
    p->ow = (x->w + 2 * c->pad - c->k) / c->stride + 1;
    p->xl = x->layout;
    return p;
}

void cpu_conv_forward(struct trn_backend *be, struct trn_conv *conv, const struct trn_tensor *x,
                      const float *w, struct trn_tensor *y)
{
    struct cpu_backend *cb = cpu_of(be);
    struct conv_plan *p = plan_for(conv, x);
    if (!p->fwd_built)
        build_forward(cb, conv, p, y->layout);
    const void *wp = w;
    if (p->w_to_fwd) {
        run_reorder(cb, p->w_to_fwd, p->w_user, w, p->w_fwd, cb->wbuf);
        wp = cb->wbuf;
    }
    set_mem(p->x, x->data);
    set_mem(p->w_fwd, wp);
    set_mem(p->y, y->data);
    set_mem(p->sp_fwd, cb->scratchpad);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->x},
                              {DNNL_ARG_WEIGHTS, p->w_fwd},
                              {DNNL_ARG_DST, p->y},
                              {DNNL_ARG_SCRATCHPAD, p->sp_fwd}};
    run(cb, p->fwd, 4, args);
}

/* col (N*OH*OW, k*k*C): row (n, oy, ox) holds x_nhwc's C-vectors under the
 * kernel window, in (ky, kx) order, zeros where the window leaves the map. */
static void im2col_nhwc(const struct trn_conv *c, const struct conv_plan *p, const float *x,
                        float *col)
{
    int rows = p->n * p->oh * p->ow, C = c->cin, K = c->k;
    size_t row_len = (size_t)K * K * C;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        int i = r / (p->oh * p->ow), oy = r / p->ow % p->oh, ox = r % p->ow;
        float *dst = col + (size_t)r * row_len;
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++, dst += C) {
                int iy = oy * c->stride - c->pad + ky, ix = ox * c->stride - c->pad + kx;
                if (iy < 0 || iy >= p->h || ix < 0 || ix >= p->w)
                    memset(dst, 0, (size_t)C * sizeof(float));
                else
                    memcpy(dst, x + (((size_t)i * p->h + iy) * p->w + ix) * C,
                           (size_t)C * sizeof(float));
            }
    }
}

void cpu_conv_backward_weights(struct trn_backend *be, struct trn_conv *conv,
                               const struct trn_tensor *x, const struct trn_tensor *dy, float *dw,
                               bool accumulate)
{
    struct cpu_backend *cb = cpu_of(be);
    struct conv_plan *p = plan_for(conv, x);
    if (!p->bwd_built)
        build_backward(cb, conv, p, dy->layout);
    if (p->gemm_wgrad) {
        float *xn = cb->abuf;
        float *dyn = xn + (size_t)p->n * p->h * p->w * conv->cin;
        float *col = dyn + (size_t)p->n * p->oh * p->ow * conv->cout;
        run_reorder(cb, p->x_to_nhwc, p->x, x->data, p->x_nhwc, xn);
        run_reorder(cb, p->dy_to_nhwc, p->dy, dy->data, p->dy_nhwc, dyn);
        im2col_nhwc(conv, p, xn, col);
        long np = (long)p->n * p->oh * p->ow, kkc = (long)conv->k * conv->k * conv->cin;
        /* dW_ohwi (O, kkc) = dy_nhwc^T (O, np) . col (np, kkc) */
        dnnlCheck(dnnl_sgemm('T', 'N', conv->cout, kkc, np, 1.0f, dyn, conv->cout, col, kkc, 0.0f,
                             cb->wbuf, kkc));
    } else {
        set_mem(p->x, x->data);
        set_mem(p->dy, dy->data);
        set_mem(p->dw_bwd, cb->wbuf);
        set_mem(p->sp_bwd_w, cb->scratchpad);
        dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p->x},
                                  {DNNL_ARG_DIFF_DST, p->dy},
                                  {DNNL_ARG_DIFF_WEIGHTS, p->dw_bwd},
                                  {DNNL_ARG_SCRATCHPAD, p->sp_bwd_w}};
        run(cb, p->bwd_w, 4, args);
    }
    run_reorder(cb, accumulate ? p->dw_add : p->dw_set, p->dw_bwd, cb->wbuf, p->w_user, dw);
}

void cpu_conv_backward_data(struct trn_backend *be, struct trn_conv *conv, const float *w,
                            const struct trn_tensor *dy, struct trn_tensor *dx)
{
    struct cpu_backend *cb = cpu_of(be);
    struct conv_plan *p = plan_for(conv, dx);
    if (!p->bwd_built)
        build_backward(cb, conv, p, dy->layout);
    TRN_CHECK(p->bwd_d, "conv %dx%d: input gradient asked of a layer built without one", conv->k,
              conv->k);
    const void *wp = w;
    if (p->w_to_bwd_d) {
        run_reorder(cb, p->w_to_bwd_d, p->w_user, w, p->w_bwd_d, cb->wbuf);
        wp = cb->wbuf;
    }
    set_mem(p->w_bwd_d, wp);
    set_mem(p->dy, dy->data);
    set_mem(p->dx, dx->data);
    set_mem(p->sp_bwd_d, cb->scratchpad);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_DIFF_DST, p->dy},
                              {DNNL_ARG_WEIGHTS, p->w_bwd_d},
                              {DNNL_ARG_DIFF_SRC, p->dx},
                              {DNNL_ARG_SCRATCHPAD, p->sp_bwd_d}};
    run(cb, p->bwd_d, 4, args);
}

void cpu_conv_release(struct trn_backend *be, struct trn_conv *conv)
{
    (void)be;
    struct conv_impl *im = conv->impl;
    if (!im)
        return;
    for (int i = 0; i < im->n_plans; i++)
        plan_destroy(&im->plans[i]);
    free(im);
    conv->impl = NULL;
}
