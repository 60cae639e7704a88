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
 * In backward the weight gradient is computed before the input gradient,
 * so a layer's gradient is final (and DDP can start reducing it) as early
 * as possible.
 *
 * Plans (primitives, memory objects) are built per input shape on first use
 * and kept: the training batch, the smaller last batch and eval each get
 * their own, built once. oneDNN's direct algorithm is deterministic for a
 * fixed thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/cpu/cpu.h"

#define MAX_PLANS 4

struct conv_plan {
    int n, h, w;        /* input shape it was built for */
    enum trn_layout xl; /* input layout */
    /* forward */
    dnnl_primitive_t fwd;
    dnnl_primitive_t w_to_fwd; /* OIHW -> fwd weights layout; NULL when equal */
    /* backward */
    dnnl_primitive_t bwd_w;
    dnnl_primitive_t dw_set, dw_add; /* bwd diff-weights layout -> OIHW (=, +=) */
    dnnl_primitive_t bwd_d;          /* NULL when the input gradient is not wanted */
    dnnl_primitive_t w_to_bwd_d;
    /* memory objects; handles are set before each execution */
    dnnl_memory_t x, y, dx, dy, w_user, w_fwd, w_bwd_d, dw_bwd;
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

/* The geometry shared by every descriptor of one plan. */
struct geometry {
    dnnl_memory_desc_t x, y, w_any, w_user;
    dnnl_dims_t strides, pad_l, pad_r;
};

static void geometry_init(struct geometry *g, const struct trn_conv *c, int n, int h, int w,
                          enum trn_layout xl, enum trn_layout yl)
{
    int oh = (h + 2 * c->pad - c->k) / c->stride + 1;
    int ow = (w + 2 * c->pad - c->k) / c->stride + 1;
    dnnl_dims_t xd = {n, c->cin, h, w}, yd = {n, c->cout, oh, ow};
    dnnl_dims_t wd = {c->cout, c->cin, c->k, c->k};
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->x, 4, xd, dnnl_f32, cpu_layout_tag(xl)));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->y, 4, yd, dnnl_f32, cpu_layout_tag(yl)));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->w_any, 4, wd, dnnl_f32, dnnl_format_tag_any));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&g->w_user, 4, wd, dnnl_f32, dnnl_oihw));
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
    geometry_init(&g, c, p->n, p->h, p->w, p->xl, yl);
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

static void build_backward(struct cpu_backend *cb, const struct trn_conv *c, struct conv_plan *p,
                           enum trn_layout yl)
{
    struct geometry g;
    geometry_init(&g, c, p->n, p->h, p->w, p->xl, yl);
    dnnl_primitive_attr_t attr = user_scratchpad_attr();
    dnnl_primitive_desc_t hint = fwd_pd(cb, &g, attr);

    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd;
    dnnlCheck(dnnl_convolution_backward_weights_desc_init(
        &d, dnnl_convolution_direct, &g.x, &g.w_any, NULL, &g.y, g.strides, g.pad_l, g.pad_r));
    dnnlCheck(dnnl_primitive_desc_create(&pd, &d, attr, cb->engine, hint));
    const dnnl_memory_desc_t *dwmd =
        dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
    dnnlCheck(dnnl_primitive_create(&p->bwd_w, pd));
    p->dw_set = make_reorder(cb, dwmd, &g.w_user, false);
    p->dw_add = make_reorder(cb, dwmd, &g.w_user, true);
    p->dw_bwd = make_mem(cb, dwmd);
    p->sp_bwd_w = reserve(cb, pd, dwmd);
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
    make_io_mems(cb, p, &g);
    dnnl_primitive_desc_destroy(hint);
    dnnl_primitive_attr_destroy(attr);
    p->bwd_built = true;
}

static void plan_destroy(struct conv_plan *p)
{
    dnnl_primitive_t prims[] = {p->fwd,    p->w_to_fwd, p->bwd_w,     p->dw_set,
                                p->dw_add, p->bwd_d,    p->w_to_bwd_d};
    for (size_t i = 0; i < sizeof(prims) / sizeof(prims[0]); i++)
        if (prims[i])
            dnnl_primitive_destroy(prims[i]);
    dnnl_memory_t mems[] = {p->x,       p->y,      p->dx,     p->dy,       p->w_user,  p->w_fwd,
                            p->w_bwd_d, p->dw_bwd, p->sp_fwd, p->sp_bwd_w, p->sp_bwd_d};
    for (size_t i = 0; i < sizeof(mems) / sizeof(mems[0]); i++)
        if (mems[i])
            dnnl_memory_destroy(mems[i]);
    memset(p, 0, sizeof(*p));
}

/* The plan for x's shape, found or made (replacing the oldest when full). */
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
        set_mem(p->w_user, w);
        set_mem(p->w_fwd, cb->wbuf);
        dnnl_exec_arg_t ra[] = {{DNNL_ARG_FROM, p->w_user}, {DNNL_ARG_TO, p->w_fwd}};
        run(cb, p->w_to_fwd, 2, ra);
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

void cpu_conv_backward(struct trn_backend *be, struct trn_conv *conv, const struct trn_tensor *x,
                       const float *w, const struct trn_tensor *dy, struct trn_tensor *dx,
                       float *dw, bool accumulate)
{
    struct cpu_backend *cb = cpu_of(be);
    struct conv_plan *p = plan_for(conv, x);
    if (!p->bwd_built)
        build_backward(cb, conv, p, dy->layout);

    /* Weight gradient first: it is what DDP waits for. */
    set_mem(p->x, x->data);
    set_mem(p->dy, dy->data);
    set_mem(p->dw_bwd, cb->wbuf);
    set_mem(p->sp_bwd_w, cb->scratchpad);
    dnnl_exec_arg_t wargs[] = {{DNNL_ARG_SRC, p->x},
                               {DNNL_ARG_DIFF_DST, p->dy},
                               {DNNL_ARG_DIFF_WEIGHTS, p->dw_bwd},
                               {DNNL_ARG_SCRATCHPAD, p->sp_bwd_w}};
    run(cb, p->bwd_w, 4, wargs);
    set_mem(p->w_user, dw);
    dnnl_exec_arg_t ra[] = {{DNNL_ARG_FROM, p->dw_bwd}, {DNNL_ARG_TO, p->w_user}};
    run(cb, accumulate ? p->dw_add : p->dw_set, 2, ra);

    if (!dx)
        return;
    TRN_CHECK(p->bwd_d, "conv %dx%d: input gradient asked of a layer built without one", conv->k,
              conv->k);
    const void *wp = w;
    if (p->w_to_bwd_d) {
        set_mem(p->w_user, w);
        set_mem(p->w_bwd_d, cb->wbuf);
        dnnl_exec_arg_t wa[] = {{DNNL_ARG_FROM, p->w_user}, {DNNL_ARG_TO, p->w_bwd_d}};
        run(cb, p->w_to_bwd_d, 2, wa);
        wp = cb->wbuf;
    }
    set_mem(p->w_bwd_d, wp);
    set_mem(p->dx, dx->data);
    set_mem(p->sp_bwd_d, cb->scratchpad);
    dnnl_exec_arg_t dargs[] = {{DNNL_ARG_DIFF_DST, p->dy},
                               {DNNL_ARG_WEIGHTS, p->w_bwd_d},
                               {DNNL_ARG_DIFF_SRC, p->dx},
                               {DNNL_ARG_SCRATCHPAD, p->sp_bwd_d}};
    run(cb, p->bwd_d, 4, dargs);
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
