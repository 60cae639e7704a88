/*
 * resnet.c: the ResNet graph, forward and backward, over the ops table.
 *
 * The network, as torchvision builds it:
 *
 *   conv1 7x7/2 -> bn1 -> relu -> maxpool 3x3/2
 *   layer1..layer4: blocks; the first block of layers 2-4 has stride 2, and
 *     a block whose shape changes has a downsample (1x1 conv + bn) shortcut
 *     BasicBlock:  conv3x3 -> bn -> relu -> conv3x3 -> bn  (+ shortcut) -> relu
 *     Bottleneck:  conv1x1 -> bn -> relu -> conv3x3/s -> bn -> relu -> conv1x1 -> bn
 *                  (+ shortcut) -> relu, 4x as many channels out as in the middle
 *   adaptive avgpool 1x1 -> fc
 *
 * Fusions (no extra memory traffic for the cheap ops): each BN's transform
 * is folded into y = scale * x + shift and applied together with the ReLU,
 * and at the end of a block together with the shortcut (with the downsample
 * BN folded in too); backward masks gradients by the saved ReLU outputs on
 * the fly and adds the two gradients reaching a block's input inside the
 * next ReLU mask. Kept for backward per block: each conv's output and each
 * BN+ReLU output, as PyTorch keeps.
 *
 * Backward uses four scratch gradient buffers, each the size of the largest
 * activation, handed out and returned as the block is walked.
 *
 * Activations and their gradients are in the backend's dtype
 * (be->act_dtype: fp32, or bf16/fp16 on CUDA under --amp, half the arena);
 * parameters, gradients, the pooled features, logits and loss stay fp32.
 */
#include "trainer/resnet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/array.h"
#include "common/errors.h"
#include "common/log.h"
#include "trainer/fatal.h"
#include "trainer/mem_plan.h"

static const struct trn_arch archs[] = {
    {"resnet18", false, {2, 2, 2, 2}},  {"resnet34", false, {3, 4, 6, 3}},
    {"resnet50", true, {3, 4, 6, 3}},   {"resnet101", true, {3, 4, 23, 3}},
    {"resnet152", true, {3, 8, 36, 3}},
};

const struct trn_arch *trn_arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
        if (strcmp(archs[i].name, name) == 0)
            return &archs[i];
    return NULL;
}

const char *trn_arch_names(void)
{
    return "resnet18, resnet34, resnet50, resnet101, resnet152";
}

/* ------------------------------------------------------------------------ */
/* Building: names, shapes and offsets in state_dict order                   */

struct builder {
    struct trn_resnet *m;
    size_t cap;
    int conv_cap;
};

static struct trn_state_entry *add_entry(struct builder *b, const char *name, const char *suffix,
                                         enum trn_state_kind kind, int ndim, const int64_t *shape)
{
    struct trn_resnet *m = b->m;
    TRN_CHECK(m->n_state < b->cap, "state_dict larger than planned");
    struct trn_state_entry *e = &m->state[m->n_state++];
    snprintf(e->name, sizeof(e->name), "%s%s", name, suffix);
    e->kind = kind;
    e->dtype = kind == TRN_STATE_COUNTER ? TRN_I64 : TRN_F32;
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        e->numel *= (size_t)shape[i];
    }
    switch (kind) {
    case TRN_STATE_PARAM:
        e->off = m->num_params;
        m->num_params += e->numel;
        break;
    case TRN_STATE_BUFFER:
        e->off = m->num_buffers;
        m->num_buffers += e->numel;
        break;
    case TRN_STATE_COUNTER:
        e->off = (size_t)m->num_bn;
        break;
    }
    return e;
}

static void add_conv(struct builder *b, struct trn_conv_layer *l, const char *name, int cin,
                     int cout, int k, int stride)
{
    struct trn_conv op = {cin, cout, k, stride, k / 2, true, NULL};
    l->op = op;
    int64_t shape[4] = {cout, cin, k, k};
    l->off = add_entry(b, name, ".weight", TRN_STATE_PARAM, 4, shape)->off;
    TRN_CHECK(b->m->n_convs < b->conv_cap, "more convs than planned");
    b->m->convs[b->m->n_convs++] = l;
}

static void add_bn(struct builder *b, struct trn_bn_layer *l, const char *name, int c)
{
    int64_t shape[1] = {c};
    l->c = c;
    l->index = b->m->num_bn;
    l->off = add_entry(b, name, ".weight", TRN_STATE_PARAM, 1, shape)->off;
    add_entry(b, name, ".bias", TRN_STATE_PARAM, 1, shape);
    add_entry(b, name, ".running_mean", TRN_STATE_BUFFER, 1, shape);
    add_entry(b, name, ".running_var", TRN_STATE_BUFFER, 1, shape);
    add_entry(b, name, ".num_batches_tracked", TRN_STATE_COUNTER, 0, NULL);
    b->m->bns[b->m->num_bn++] = l;
}

static int count_blocks(const struct trn_arch *a)
{
    return a->blocks[0] + a->blocks[1] + a->blocks[2] + a->blocks[3];
}

/* Points every layer and state entry into the flat buffers (after allocation). */
static void bind(struct trn_resnet *m)
{
    for (int i = 0; i < m->n_convs; i++) {
        struct trn_conv_layer *l = m->convs[i];
        l->w = m->params + l->off;
        l->dw = m->grads + l->off;
    }
    size_t boff = 0, soff = 0;
    for (int i = 0; i < m->num_bn; i++) {
        struct trn_bn_layer *l = m->bns[i];
        int c = l->c;
        l->weight = m->params + l->off;
        l->bias = l->weight + c;
        l->dweight = m->grads + l->off;
        l->dbias = l->dweight + c;
        l->running_mean = m->buffers + boff;
        l->running_var = m->buffers + boff + c;
        boff += 2 * (size_t)c;
        l->num_batches_tracked = &m->num_batches_tracked[i];
        float *s = m->bn_scratch + soff;
        l->mean = s;
        l->var = s + c;
        l->invstd = s + 2 * c;
        l->scale = s + 3 * c;
        l->shift = s + 4 * c;
        l->sum_dy = s + 5 * c;
        l->sum_dy_xmu = s + 6 * c;
        soff += 7 * (size_t)c;
    }
    m->fc_w = m->params + m->fc_off;
    m->fc_b = m->fc_w + (size_t)m->num_classes * m->feat;
    m->fc_dw = m->grads + m->fc_off;
    m->fc_db = m->fc_dw + (size_t)m->num_classes * m->feat;
    for (size_t i = 0; i < m->n_state; i++) {
        struct trn_state_entry *e = &m->state[i];
        e->data = e->kind == TRN_STATE_PARAM    ? (void *)(m->params + e->off)
                  : e->kind == TRN_STATE_BUFFER ? (void *)(m->buffers + e->off)
                                                : (void *)&m->num_batches_tracked[e->off];
        e->host = e->data;
        if (e->kind == TRN_STATE_PARAM && m->host_params)
            e->host = m->host_params + e->off;
        else if (e->kind == TRN_STATE_BUFFER && m->host_buffers)
            e->host = m->host_buffers + e->off;
    }
}

int trn_resnet_create(struct trn_resnet *m, struct trn_backend *be, const struct trn_arch *arch,
                      int num_classes, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    m->arch = arch;
    m->be = be;
    m->num_classes = num_classes;
    m->n_blocks = count_blocks(arch);
    m->blocks = trn_calloc((size_t)m->n_blocks, sizeof(*m->blocks));
    int max_convs = 1 + 4 * m->n_blocks, max_bn = max_convs;
    struct builder b = {m, (size_t)max_convs + 5 * (size_t)max_bn + 2, max_convs};
    m->state = trn_calloc(b.cap, sizeof(*m->state));
    m->convs = trn_calloc((size_t)max_convs, sizeof(*m->convs));
    m->bns = trn_calloc((size_t)max_bn, sizeof(*m->bns));

    add_conv(&b, &m->conv1, "conv1", 3, 64, 7, 2);
    m->conv1.op.need_dx = false;
    add_bn(&b, &m->bn1, "bn1", 64);
    int expansion = arch->bottleneck ? 4 : 1, inplanes = 64, bi = 0;
    for (int s = 0; s < 4; s++) {
        int planes = 64 << s, stride = s == 0 ? 1 : 2;
        for (int j = 0; j < arch->blocks[s]; j++, bi++) {
            struct trn_block *blk = &m->blocks[bi];
            int st = j == 0 ? stride : 1;
            char nm[48];
            blk->bottleneck = arch->bottleneck;
            blk->downsample = j == 0 && (st != 1 || inplanes != planes * expansion);
#define NAME(part) (snprintf(nm, sizeof(nm), "layer%d.%d." part, s + 1, j), nm)
            if (arch->bottleneck) {
                add_conv(&b, &blk->conv1, NAME("conv1"), inplanes, planes, 1, 1);
                add_bn(&b, &blk->bn1, NAME("bn1"), planes);
                add_conv(&b, &blk->conv2, NAME("conv2"), planes, planes, 3, st);
                add_bn(&b, &blk->bn2, NAME("bn2"), planes);
                add_conv(&b, &blk->conv3, NAME("conv3"), planes, planes * 4, 1, 1);
                add_bn(&b, &blk->bn3, NAME("bn3"), planes * 4);
            } else {
                add_conv(&b, &blk->conv1, NAME("conv1"), inplanes, planes, 3, st);
                add_bn(&b, &blk->bn1, NAME("bn1"), planes);
                add_conv(&b, &blk->conv2, NAME("conv2"), planes, planes, 3, 1);
                add_bn(&b, &blk->bn2, NAME("bn2"), planes);
            }
            if (blk->downsample) {
                add_conv(&b, &blk->ds_conv, NAME("downsample.0"), inplanes, planes * expansion, 1,
                         st);
                add_bn(&b, &blk->ds_bn, NAME("downsample.1"), planes * expansion);
            }
#undef NAME
            inplanes = planes * expansion;
        }
    }
    m->feat = inplanes;
    int64_t fw[2] = {num_classes, inplanes}, fb[1] = {num_classes};
    m->fc_off = add_entry(&b, "fc", ".weight", TRN_STATE_PARAM, 2, fw)->off;
    add_entry(&b, "fc", ".bias", TRN_STATE_PARAM, 1, fb);

    size_t bn_channels = 0;
    for (int i = 0; i < m->num_bn; i++)
        bn_channels += (size_t)m->bns[i]->c;
    const struct trn_ops *ops = be->ops;
    m->params = ops->alloc(be, m->num_params * sizeof(float));
    m->grads = ops->alloc(be, m->num_params * sizeof(float));
    m->momentum = ops->alloc(be, m->num_params * sizeof(float));
    m->buffers = ops->alloc(be, m->num_buffers * sizeof(float));
    m->bn_scratch = ops->alloc(be, 7 * bn_channels * sizeof(float));
    m->num_batches_tracked = trn_calloc((size_t)m->num_bn, sizeof(int64_t));
    if (be->device != TRN_DEVICE_CPU) {
        m->host_params = trn_calloc(m->num_params, sizeof(float));
        m->host_momentum = trn_calloc(m->num_params, sizeof(float));
        m->host_buffers = trn_calloc(m->num_buffers, sizeof(float));
    }
    if (!m->params || !m->grads || !m->momentum || !m->buffers || !m->bn_scratch) {
        snprintf(err, errlen, "%s: out of memory for %zu parameters", arch->name, m->num_params);
        trn_resnet_free(m);
        return -ENOMEM;
    }
    bind(m);
    return 0;
}

void trn_resnet_free(struct trn_resnet *m)
{
    struct trn_backend *be = m->be;
    if (!be)
        return;
    for (int i = 0; i < m->n_convs; i++)
        be->ops->conv_release(be, &m->convs[i]->op);
    be->ops->free(be, m->params);
    be->ops->free(be, m->grads);
    be->ops->free(be, m->momentum);
    be->ops->free(be, m->buffers);
    be->ops->free(be, m->bn_scratch);
    be->ops->free(be, m->arena);
    free(m->takes);
    free(m->num_batches_tracked);
    free(m->host_params);
    free(m->host_momentum);
    free(m->host_buffers);
    free(m->state);
    free(m->convs);
    free(m->bns);
    free(m->blocks);
    memset(m, 0, sizeof(*m));
}

void trn_resnet_pull(struct trn_resnet *m)
{
    struct trn_backend *be = m->be;
    if (!m->host_params)
        return;
    be->ops->to_host(be, m->host_params, m->params, m->num_params * sizeof(float));
    be->ops->to_host(be, m->host_momentum, m->momentum, m->num_params * sizeof(float));
    be->ops->to_host(be, m->host_buffers, m->buffers, m->num_buffers * sizeof(float));
}

void trn_resnet_push(struct trn_resnet *m)
{
    struct trn_backend *be = m->be;
    if (!m->host_params)
        return;
    be->ops->to_device(be, m->params, m->host_params, m->num_params * sizeof(float));
    be->ops->to_device(be, m->momentum, m->host_momentum, m->num_params * sizeof(float));
    be->ops->to_device(be, m->buffers, m->host_buffers, m->num_buffers * sizeof(float));
    be->ops->synchronize(be);
}

float *trn_resnet_host_momentum(const struct trn_resnet *m)
{
    return m->host_momentum ? m->host_momentum : m->momentum;
}

const struct trn_state_entry *trn_resnet_find(const struct trn_resnet *m, const char *name)
{
    for (size_t i = 0; i < m->n_state; i++)
        if (strcmp(m->state[i].name, name) == 0)
            return &m->state[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Initialisation                                                            */

/* splitmix64 seeds xoshiro256**; normals by Box-Muller, uniforms in [0, 1). */
struct rng {
    uint64_t s[4];
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static double rng_uniform(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static void fill_normal(struct rng *r, float *p, size_t n, double std)
{
    for (size_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r); /* u1 in (0, 1] */
        double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        p[i] = (float)(std * rad * cos(th));
        if (i + 1 < n)
            p[i + 1] = (float)(std * rad * sin(th));
    }
}

static void fill_uniform(struct rng *r, float *p, size_t n, double bound)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((2.0 * rng_uniform(r) - 1.0) * bound);
}

void trn_resnet_init(struct trn_resnet *m, uint64_t seed, bool zero_init_residual)
{
    struct rng r;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r.s[i] = splitmix64(&x);
    /* Built on the host, copied to the device once. */
    float *p = trn_calloc(m->num_params ? m->num_params : 1, sizeof(float));
    float *bufs = trn_calloc(m->num_buffers ? m->num_buffers : 1, sizeof(float));
    for (int i = 0; i < m->n_convs; i++) {
        struct trn_conv *c = &m->convs[i]->op;
        size_t n = (size_t)c->cout * c->cin * c->k * c->k;
        /* kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / fan_out) */
        fill_normal(&r, p + m->convs[i]->off, n, sqrt(2.0 / ((double)c->cout * c->k * c->k)));
    }
    size_t boff = 0;
    for (int i = 0; i < m->num_bn; i++) {
        struct trn_bn_layer *l = m->bns[i];
        for (int c = 0; c < l->c; c++) {
            p[l->off + c] = 1.0f;       /* weight */
            p[l->off + l->c + c] = 0.f; /* bias */
            bufs[boff + c] = 0.f;       /* running_mean */
            bufs[boff + l->c + c] = 1.f;
        }
        boff += 2 * (size_t)l->c;
        m->num_batches_tracked[i] = 0;
    }
    if (zero_init_residual)
        for (int i = 0; i < m->n_blocks; i++) {
            struct trn_block *b = &m->blocks[i];
            struct trn_bn_layer *last = b->bottleneck ? &b->bn3 : &b->bn2;
            memset(p + last->off, 0, sizeof(float) * (size_t)last->c);
        }
    /* nn.Linear's reset_parameters: kaiming_uniform_(a=sqrt(5)) gives a
     * bound of 1/sqrt(fan_in) for the weight, and the bias uses the same. */
    double bound = 1.0 / sqrt((double)m->feat);
    fill_uniform(&r, p + m->fc_off, (size_t)m->num_classes * m->feat, bound);
    fill_uniform(&r, p + m->fc_off + (size_t)m->num_classes * m->feat, (size_t)m->num_classes,
                 bound);
    struct trn_backend *be = m->be;
    be->ops->to_device(be, m->params, p, m->num_params * sizeof(float));
    be->ops->to_device(be, m->buffers, bufs, m->num_buffers * sizeof(float));
    free(p);
    free(bufs);
    m->optimizer_steps = 0;
}

/* ------------------------------------------------------------------------ */
/* Activation memory                                                         */

/*
 * The arena is planned in two passes over layout(): the first records each
 * buffer as a request (its size, and whose backward it lives to: `owner`, a
 * block index, or WHOLE_STEP), the second hands out base + the planned
 * offsets in the same order. Between them set_shape runs the backward dry
 * (struct pool, below) to learn when each block's backward ends and when
 * each scratch buffer is taken and given back.
 */
#define WHOLE_STEP (-1)
#define ARENA_ALIGN 256 /* cuDNN's and the CPU's vector loads alike */

#define PLAN_MAX_BUFFERS 100000 /* far above ResNet-152's ~1,000 */

/* One buffer of the plan: its request, and whose backward it lives to. */
struct arena_buf {
    struct trn_mem_req r;
    int owner; /* block index or WHOLE_STEP */
};

struct arena {
    char *base;                        /* NULL while recording */
    CDDP_ARRAY(struct arena_buf) bufs; /* in carve order */
    size_t next;                       /* placing: the next buffer */
};

static void *carve_for(struct arena *a, size_t bytes, int owner)
{
    if (a->base) {
        TRN_CHECK(a->next < a->bufs.len && a->bufs.items[a->next].r.bytes == bytes,
                  "resnet: arena layout changed");
        return a->base + a->bufs.items[a->next++].r.offset;
    }
    int rc;
    struct arena_buf *b = cddp_array_push(&a->bufs, &rc);
    TRN_CHECK(b, "resnet: cannot record the arena's buffers: %s", cddp_strerror(rc));
    *b = (struct arena_buf){{bytes, 0, 0, 0}, owner};
    return NULL;
}

static void *carve(struct arena *a, size_t bytes)
{
    return carve_for(a, bytes, WHOLE_STEP);
}

/* An activation in the backend's layout and dtype (bf16/fp16 under --amp:
 * half the bytes of fp32). */
static struct trn_tensor carve_activation(struct trn_resnet *m, struct arena *a, int c, int h,
                                          int w, int owner)
{
    struct trn_tensor t = {NULL, m->n, c, h, w, m->be->act_dtype, m->be->act_layout, m->be->device};
    t.data = carve_for(a, trn_tensor_bytes(&t), owner);
    return t;
}

/* Whether the input is reordered to channels-last before conv1 (resnet.h). */
static bool input_to_nhwc(const struct trn_resnet *m)
{
    return m->be->act_layout == TRN_LAYOUT_NHWC;
}

static int conv_out(const struct trn_conv *c, int in)
{
    return (in + 2 * c->pad - c->k) / c->stride + 1;
}

/* Lays out every activation for m->n, h, w in a (measure only when a->base is NULL). */
static void layout(struct trn_resnet *m, struct arena *a)
{
    size_t act_size = trn_dtype_size(m->be->act_dtype);
    m->x_nhwc = input_to_nhwc(m) ? carve(a, (size_t)m->n * 3 * m->h * m->w * act_size) : NULL;
    int h = conv_out(&m->conv1.op, m->h), w = conv_out(&m->conv1.op, m->w);
    m->stem_c = carve_activation(m, a, 64, h, w, WHOLE_STEP);
    m->stem_a = carve_activation(m, a, 64, h, w, WHOLE_STEP);
    h = (h - 1) / 2 + 1; /* max-pool 3x3/2 pad 1 */
    w = (w - 1) / 2 + 1;
    m->stem_p = carve_activation(m, a, 64, h, w, WHOLE_STEP);
    m->pool_argmax = carve(a, trn_tensor_numel(&m->stem_p));
    struct trn_tensor in = m->stem_p;
    for (int i = 0; i < m->n_blocks; i++) {
        struct trn_block *b = &m->blocks[i];
        b->in = in;
        int h1 = conv_out(&b->conv1.op, in.h), w1 = conv_out(&b->conv1.op, in.w);
        b->c1 = carve_activation(m, a, b->conv1.op.cout, h1, w1, i);
        b->a1 = carve_activation(m, a, b->conv1.op.cout, h1, w1, i);
        int h2 = conv_out(&b->conv2.op, h1), w2 = conv_out(&b->conv2.op, w1);
        b->c2 = carve_activation(m, a, b->conv2.op.cout, h2, w2, i);
        if (b->bottleneck) {
            b->a2 = carve_activation(m, a, b->conv2.op.cout, h2, w2, i);
            b->c3 = carve_activation(m, a, b->conv3.op.cout, h2, w2, i);
        }
        if (b->downsample)
            b->cd = carve_activation(m, a, b->ds_conv.op.cout, h2, w2, i);
        int cout = b->bottleneck ? b->conv3.op.cout : b->conv2.op.cout;
        b->out = carve_activation(m, a, cout, h2, w2, i);
        in = b->out;
    }
    size_t nf = (size_t)m->n * m->feat, nk = (size_t)m->n * m->num_classes;
    m->pooled = carve(a, nf * sizeof(float));
    m->dpooled = carve(a, nf * sizeof(float));
    m->logits = carve(a, nk * sizeof(float));
    m->probs = carve(a, nk * sizeof(float));
    m->dlogits = carve(a, nk * sizeof(float));
    m->labels = carve(a, (size_t)m->n * sizeof(int32_t));
}

/*
 * The backward's scratch gradient buffers: take one shaped like t, give it
 * back. The takes come in the same order in every backward of a shape, so
 * take k is the plan's k-th buffer (set_shape). Dry (set_shape's planning
 * run, m->planning: no op runs), each take and give is a position in time
 * and a take's pointer is a tag, never dereferenced.
 */
#define POOL_LIVE_MAX 8

struct pool {
    struct trn_resnet *m;
    int next;                /* takes so far */
    int live[POOL_LIVE_MAX]; /* takes not given back yet */
    int n_live;
    /* dry (m->planning) */
    int pos;
    CDDP_ARRAY(struct trn_mem_req) rec; /* each take's size and lifetime */
    int *block_end; /* (n_blocks) the position where each block's backward ended */
};

static void pool_dry(struct pool *p, struct trn_resnet *m)
{
    memset(p, 0, sizeof(*p));
    p->m = m;
    cddp_array_init(&p->rec, PLAN_MAX_BUFFERS);
    p->block_end = trn_calloc((size_t)m->n_blocks, sizeof(int));
    m->planning = true;
}

static int pool_dry_takes(const struct pool *p, const struct trn_mem_req **takes, int *end_pos,
                          const int **block_end)
{
    p->m->planning = false;
    *takes = p->rec.items;
    *end_pos = p->pos + 1;
    *block_end = p->block_end;
    return p->next;
}

static void pool_dry_free(struct pool *p)
{
    cddp_array_free(&p->rec);
    free(p->block_end);
}

static struct trn_tensor take(struct pool *p, const struct trn_tensor *like)
{
    struct trn_tensor t = *like;
    size_t bytes = trn_tensor_bytes(like);
    int k = p->next++;
    TRN_CHECK(p->n_live < POOL_LIVE_MAX, "resnet backward: more than %d scratch buffers live",
              POOL_LIVE_MAX);
    p->live[p->n_live++] = k;
    if (p->m->planning) {
        int rc;
        struct trn_mem_req *rec = cddp_array_push(&p->rec, &rc);
        TRN_CHECK(rec, "resnet: cannot record the backward's scratch: %s", cddp_strerror(rc));
        *rec = (struct trn_mem_req){bytes, ++p->pos, -1, 0};
        t.data = (float *)(uintptr_t)(((uintptr_t)k + 1) * ARENA_ALIGN);
        return t;
    }
    struct trn_resnet *m = p->m;
    TRN_CHECK(k < m->n_takes && bytes <= m->takes[k].bytes,
              "resnet backward: scratch take %d (%zu bytes) is not the planned one", k, bytes);
    t.data = (float *)((char *)m->arena + m->takes[k].offset);
    return t;
}

static void give(struct pool *p, const struct trn_tensor *t)
{
    for (int i = 0; i < p->n_live; i++) {
        int k = p->live[i];
        bool match = p->m->planning
                         ? (uintptr_t)t->data == ((uintptr_t)k + 1) * ARENA_ALIGN
                         : (char *)t->data == (char *)p->m->arena + p->m->takes[k].offset;
        if (match) {
            p->live[i] = p->live[--p->n_live];
            if (p->m->planning)
                p->rec.items[k].last = ++p->pos;
            return;
        }
    }
    trn_fatal("resnet backward: returned a buffer that is not scratch");
}

/* After block i's backward (dry: where its activations die). */
static void block_done(struct pool *p, int i)
{
    if (p->m->planning)
        p->block_end[i] = ++p->pos;
}

static void backward_from_logits(struct trn_resnet *m, struct pool *p, bool accumulate);

/*
 * Makes the activations fit a batch of n x 3 x h x w: records the layout,
 * runs the backward dry for the lifetimes, plans the arena (mem_plan.h),
 * grows it if the plan is larger (it never shrinks), and lays the tensors
 * out at the planned offsets.
 */
static void set_shape(struct trn_resnet *m, int n, int h, int w)
{
    if (m->n == n && m->h == h && m->w == w)
        return;
    m->n = n;
    m->h = h;
    m->w = w;
    struct arena a = {0};
    cddp_array_init(&a.bufs, PLAN_MAX_BUFFERS);
    layout(m, &a);
    struct pool p;
    pool_dry(&p, m);
    backward_from_logits(m, &p, false);
    const struct trn_mem_req *takes;
    const int *block_end;
    int end_pos, nt = pool_dry_takes(&p, &takes, &end_pos, &block_end);
    int na = (int)a.bufs.len, total = na + nt;
    struct trn_mem_req *reqs = trn_calloc((size_t)total, sizeof(*reqs));
    size_t kept = 0; /* the activations alone: all live at the forward's end */
    for (int i = 0; i < total; i++) {
        if (i < na) {
            const struct arena_buf *ab = &a.bufs.items[i];
            reqs[i] = ab->r;
            reqs[i].first = 0; /* every activation is written in the forward */
            reqs[i].last = ab->owner == WHOLE_STEP ? end_pos : block_end[ab->owner];
        } else {
            reqs[i] = takes[i - na];
        }
        if (i < na)
            kept += (reqs[i].bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    }
    size_t bytes = trn_mem_plan(reqs, total, ARENA_ALIGN);
    TRN_CHECK(bytes != (size_t)-1, "resnet: no memory plan for batch %d, %dx%d", n, h, w);
    free(m->takes);
    m->takes = trn_calloc(nt ? (size_t)nt : 1, sizeof(*m->takes));
    m->n_takes = nt;
    for (int k = 0; k < nt; k++)
        m->takes[k] = (struct trn_scratch_take){reqs[na + k].offset, reqs[na + k].bytes};
    for (int i = 0; i < na; i++)
        a.bufs.items[i].r.offset = reqs[i].offset;
    pool_dry_free(&p);
    free(reqs);
    if (bytes > m->arena_bytes) {
        m->be->ops->free(m->be, m->arena);
        m->arena = m->be->ops->alloc(m->be, bytes);
        TRN_CHECK(m->arena, "out of memory for %zu bytes of activations (batch %d, %dx%d)", bytes,
                  n, h, w);
        m->arena_bytes = bytes;
    }
    m->plan_bytes = bytes;
    m->kept_bytes = kept;
    a.base = m->arena;
    layout(m, &a);
    cddp_array_free(&a.bufs);
    log_debug("T2410",
              "activations for batch %d, %dx%d: %.1f MiB planned, of which the activations kept "
              "for backward %.1f MiB (the backward's scratch reuses what it has consumed)",
              n, h, w, (double)bytes / (1 << 20), (double)kept / (1 << 20));
}

long trn_resnet_min_bn_count(const struct trn_resnet *m, int n, int h, int w)
{
    /* conv1 /2, maxpool /2, then a /2 per stride-2 stage */
    h = conv_out(&m->conv1.op, h);
    w = conv_out(&m->conv1.op, w);
    h = (h - 1) / 2 + 1;
    w = (w - 1) / 2 + 1;
    for (int s = 1; s < 4; s++) {
        h = (h - 1) / 2 + 1;
        w = (w - 1) / 2 + 1;
    }
    return (long)n * h * w;
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                   */

static void conv_forward(struct trn_resnet *m, struct trn_conv_layer *l, const struct trn_tensor *x,
                         struct trn_tensor *y)
{
    m->be->ops->conv_forward(m->be, &l->op, x, l->w, y);
}

/* Fills bn's scale and shift from the batch (training) or the running statistics. */
static void bn_prepare(struct trn_resnet *m, struct trn_bn_layer *bn, const struct trn_tensor *x,
                       bool training)
{
    struct trn_backend *be = m->be;
    if (!training) {
        be->ops->bn_prepare(be, bn->c, bn->running_mean, bn->running_var, 0, TRN_BN_EPS, 0,
                            bn->weight, bn->bias, NULL, NULL, bn->invstd, bn->scale, bn->shift);
        return;
    }
    be->ops->bn_stats(be, x, bn->mean, bn->var);
    bn->count = (double)x->n * x->h * x->w;
    if (m->hooks.bn_stats)
        m->hooks.bn_stats(m->hooks.arg, bn, bn->mean, bn->var, &bn->count);
    be->ops->bn_prepare(be, bn->c, bn->mean, bn->var, bn->count, TRN_BN_EPS, TRN_BN_MOMENTUM,
                        bn->weight, bn->bias, bn->running_mean, bn->running_var, bn->invstd,
                        bn->scale, bn->shift);
    (*bn->num_batches_tracked)++;
}

/* y = relu(bn(x)) */
static void bn_relu(struct trn_resnet *m, struct trn_bn_layer *bn, const struct trn_tensor *x,
                    struct trn_tensor *y, bool training)
{
    bn_prepare(m, bn, x, training);
    m->be->ops->bn_apply(m->be, x, bn->scale, bn->shift, NULL, NULL, NULL, true, y);
}

static void block_forward(struct trn_resnet *m, struct trn_block *b, bool training)
{
    const struct trn_ops *ops = m->be->ops;
    conv_forward(m, &b->conv1, &b->in, &b->c1);
    bn_relu(m, &b->bn1, &b->c1, &b->a1, training);
    conv_forward(m, &b->conv2, &b->a1, &b->c2);
    struct trn_tensor *last_c = &b->c2;
    struct trn_bn_layer *last_bn = &b->bn2;
    if (b->bottleneck) {
        bn_relu(m, &b->bn2, &b->c2, &b->a2, training);
        conv_forward(m, &b->conv3, &b->a2, &b->c3);
        last_c = &b->c3;
        last_bn = &b->bn3;
    }
    bn_prepare(m, last_bn, last_c, training);
    /* out = relu(bn(last_c) + shortcut), the shortcut being the input or bn(downsample(in)) */
    if (b->downsample) {
        conv_forward(m, &b->ds_conv, &b->in, &b->cd);
        bn_prepare(m, &b->ds_bn, &b->cd, training);
        ops->bn_apply(m->be, last_c, last_bn->scale, last_bn->shift, &b->cd, b->ds_bn.scale,
                      b->ds_bn.shift, true, &b->out);
    } else {
        ops->bn_apply(m->be, last_c, last_bn->scale, last_bn->shift, &b->in, NULL, NULL, true,
                      &b->out);
    }
}

/* The network up to the logits (m->logits); the shape already set. */
static void forward_logits(struct trn_resnet *m, const float *x, int n, int h, int w, bool training)
{
    struct trn_backend *be = m->be;
    const struct trn_ops *ops = be->ops;
    struct trn_tensor in = {(float *)x, n, 3, h, w, TRN_F32, TRN_LAYOUT_NCHW, be->device};
    m->x = in;
    if (input_to_nhwc(m)) {
        m->x.data = m->x_nhwc;
        m->x.layout = TRN_LAYOUT_NHWC;
        m->x.dtype = be->act_dtype; /* cast in the same pass under --amp */
        ops->reorder(be, &in, &m->x);
    }

    conv_forward(m, &m->conv1, &m->x, &m->stem_c);
    bn_relu(m, &m->bn1, &m->stem_c, &m->stem_a, training);
    ops->maxpool_forward(be, &m->stem_a, &m->stem_p, m->pool_argmax);
    for (int i = 0; i < m->n_blocks; i++)
        block_forward(m, &m->blocks[i], training);
    ops->avgpool_forward(be, &m->blocks[m->n_blocks - 1].out, m->pooled);
    ops->fc_forward(be, n, m->feat, m->num_classes, m->pooled, m->fc_w, m->fc_b, m->logits);
}

float trn_resnet_forward(struct trn_resnet *m, const float *x, const int32_t *labels, int n, int h,
                         int w, bool training)
{
    struct trn_backend *be = m->be;
    const struct trn_ops *ops = be->ops;
    set_shape(m, n, h, w);
    forward_logits(m, x, n, h, w, training);
    m->have_labels = labels != NULL;
    if (!labels)
        return 0.0f;
    ops->to_device(be, m->labels, labels, (size_t)n * sizeof(int32_t));
    return ops->xent_forward(be, n, m->num_classes, m->logits, m->labels, m->probs);
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                  */

static void ready(struct trn_resnet *m, size_t off, size_t numel)
{
    if (m->hooks.grad_ready && !m->planning)
        m->hooks.grad_ready(m->hooks.arg, off, numel);
}

/*
 * Backward through a batch norm whose input was x: the parameter gradients
 * (then the hook), and dx unless NULL. dy is masked by relu_y > 0 if given.
 */
static void bn_backward(struct trn_resnet *m, struct trn_bn_layer *bn, const struct trn_tensor *x,
                        const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                        struct trn_tensor *dx, bool accumulate)
{
    struct trn_backend *be = m->be;
    if (m->planning)
        return;
    be->ops->bn_backward_reduce(be, x, dy, relu_y, bn->mean, bn->sum_dy, bn->sum_dy_xmu);
    /* The parameter gradients use this rank's sums (DDP averages them like any
     * other), the input gradient all ranks' (SyncBatchNorm's backward). */
    be->ops->bn_param_grads(be, bn->c, bn->invstd, bn->sum_dy, bn->sum_dy_xmu, bn->dweight,
                            bn->dbias, accumulate);
    ready(m, bn->off, 2 * (size_t)bn->c);
    if (!dx)
        return;
    if (m->hooks.bn_grads)
        m->hooks.bn_grads(m->hooks.arg, bn, bn->sum_dy, bn->sum_dy_xmu);
    be->ops->bn_backward_input(be, x, dy, relu_y, bn->mean, bn->invstd, bn->weight, bn->sum_dy,
                               bn->sum_dy_xmu, bn->count, dx);
}

/* The weight gradient (then the hook), then dx unless NULL. */
static void conv_backward(struct trn_resnet *m, struct trn_conv_layer *l,
                          const struct trn_tensor *x, const struct trn_tensor *dy,
                          struct trn_tensor *dx, bool accumulate)
{
    if (m->planning)
        return;
    m->be->ops->conv_backward_weights(m->be, &l->op, x, dy, l->dw, accumulate);
    ready(m, l->off, (size_t)l->op.cout * l->op.cin * l->op.k * l->op.k);
    if (dx)
        m->be->ops->conv_backward_data(m->be, &l->op, l->w, dy, dx);
}

/*
 * A block's backward. In: d1 (+ d2, if not NULL): the gradient reaching the
 * block's output, before its final ReLU. Out: *main and *shortcut, the two
 * gradients reaching its input (their sum is the input's gradient). d1 is
 * turned into the masked output gradient in place; d2 is given back.
 */
static void block_backward(struct trn_resnet *m, struct pool *p, struct trn_block *b,
                           struct trn_tensor *d1, struct trn_tensor *d2, struct trn_tensor *main,
                           struct trn_tensor *shortcut, bool acc)
{
    const struct trn_ops *ops = m->be->ops;
    struct trn_tensor g = *d1;
    if (!m->planning)
        ops->relu_backward(m->be, d1, d2, &b->out, &g);
    if (d2)
        give(p, d2);

    /* downsample first: its parameters come last in the flat buffer */
    if (b->downsample) {
        struct trn_tensor dcd = take(p, &b->cd);
        bn_backward(m, &b->ds_bn, &b->cd, &g, NULL, &dcd, acc);
        *shortcut = take(p, &b->in);
        conv_backward(m, &b->ds_conv, &b->in, &dcd, shortcut, acc);
        give(p, &dcd);
    } else {
        *shortcut = g;
    }

    /* then the main branch, last layer first */
    struct trn_conv_layer *convs[3] = {&b->conv1, &b->conv2, &b->conv3};
    struct trn_bn_layer *bns[3] = {&b->bn1, &b->bn2, &b->bn3};
    struct trn_tensor *cs[3] = {&b->c1, &b->c2, &b->c3};
    struct trn_tensor *as[3] = {&b->a1, &b->a2, NULL}; /* ReLU outputs after bn1, bn2 */
    struct trn_tensor *ins[3] = {&b->in, &b->a1, &b->a2};
    int last = b->bottleneck ? 2 : 1;
    struct trn_tensor dy =
        g; /* gradient at the output of bns[k] (masked: after the block's ReLU) */
    const struct trn_tensor *mask = NULL;
    for (int k = last; k >= 0; k--) {
        struct trn_tensor dc = take(p, cs[k]);
        bn_backward(m, bns[k], cs[k], &dy, mask, &dc, acc);
        if (k == last) {
            if (b->downsample)
                give(p, &g);
        } else {
            give(p, &dy);
        }
        struct trn_tensor dx = take(p, ins[k]);
        conv_backward(m, convs[k], ins[k], &dc, &dx, acc);
        give(p, &dc);
        dy = dx;
        mask = k > 0 ? as[k - 1] : NULL;
    }
    *main = dy;
}

void trn_resnet_backward(struct trn_resnet *m, float loss_scale, bool accumulate)
{
    struct trn_backend *be = m->be;
    const struct trn_ops *ops = be->ops;
    TRN_CHECK(m->have_labels, "backward without a training forward with labels");
    int n = m->n;

    ops->xent_backward(be, n, m->num_classes, m->probs, m->labels, loss_scale, m->dlogits);
    struct pool p = {.m = m};
    backward_from_logits(m, &p, accumulate);
}

/* Backward from m->dlogits down to conv1's weight gradient, its scratch
 * from p (dry when m->planning: the same takes and gives, no op). */
static void backward_from_logits(struct trn_resnet *m, struct pool *p, bool accumulate)
{
    struct trn_backend *be = m->be;
    const struct trn_ops *ops = be->ops;
    bool run = !m->planning;
    int n = m->n;
    if (run)
        ops->fc_backward(be, n, m->feat, m->num_classes, m->pooled, m->fc_w, m->dlogits, m->dpooled,
                         m->fc_dw, m->fc_db, accumulate);
    ready(m, m->fc_off, (size_t)m->num_classes * m->feat + (size_t)m->num_classes);

    struct trn_tensor d1 = take(p, &m->blocks[m->n_blocks - 1].out), d2, *pd2 = NULL;
    if (run)
        ops->avgpool_backward(be, m->dpooled, &d1);
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        struct trn_tensor main, shortcut;
        block_backward(m, p, &m->blocks[i], &d1, pd2, &main, &shortcut, accumulate);
        block_done(p, i);
        d1 = main;
        d2 = shortcut;
        pd2 = &d2;
    }

    /*
     * Into the max-pool: the two gradients of layer1.0's input added. The
     * add goes through relu_backward masked by the pool's output, which drops
     * nothing: an output of 0 came from an input of 0 after the stem's ReLU,
     * whose gradient that ReLU zeroes anyway.
     */
    if (run)
        ops->relu_backward(be, &d1, &d2, &m->stem_p, &d1);
    give(p, &d2);
    struct trn_tensor da = take(p, &m->stem_a);
    if (run)
        ops->maxpool_backward(be, &d1, m->pool_argmax, &da);
    give(p, &d1);
    bn_backward(m, &m->bn1, &m->stem_c, &da, &m->stem_a, &da, accumulate);
    conv_backward(m, &m->conv1, &m->x, &da, NULL, accumulate);
    give(p, &da);
}

void trn_resnet_sgd_step(struct trn_resnet *m, float lr, float momentum, float weight_decay)
{
    m->be->ops->sgd_step(m->be, m->params, m->grads, m->momentum, m->num_params, lr, momentum,
                         weight_decay, m->optimizer_steps == 0);
    m->optimizer_steps++;
}

/* ------------------------------------------------------------------------ */
/* CUDA graphs (train.c's graph step): the same step with no host value in it */

void trn_resnet_upload_labels(struct trn_resnet *m, const int32_t *labels, int n, int h, int w)
{
    set_shape(m, n, h, w);
    m->be->ops->to_device(m->be, m->labels, labels, (size_t)n * sizeof(int32_t));
}

void trn_resnet_forward_dev(struct trn_resnet *m, const float *x, int n, int h, int w, float *loss)
{
    const struct trn_ops *ops = m->be->ops;
    TRN_CHECK(ops->xent_forward_dev, "the %s backend has no device-side loss", ops->name);
    TRN_CHECK(m->n == n && m->h == h && m->w == w,
              "forward_dev: labels uploaded for another shape (%dx%dx%d, not %dx%dx%d)", m->n, m->h,
              m->w, n, h, w);
    forward_logits(m, x, n, h, w, true);
    m->have_labels = true;
    ops->xent_forward_dev(m->be, n, m->num_classes, m->logits, m->labels, m->probs, loss);
}

void trn_resnet_backward_dev(struct trn_resnet *m, const float *loss_scale, bool accumulate)
{
    const struct trn_ops *ops = m->be->ops;
    TRN_CHECK(m->have_labels, "backward without a training forward with labels");
    ops->xent_backward_dev(m->be, m->n, m->num_classes, m->probs, m->labels, loss_scale,
                           m->dlogits);
    struct pool p = {.m = m};
    backward_from_logits(m, &p, accumulate);
}

void trn_resnet_sgd_step_dev(struct trn_resnet *m, const float *lr, const int32_t *skip,
                             float momentum, float weight_decay)
{
    TRN_CHECK(m->optimizer_steps > 0, "sgd_step_dev before the first SGD step fills the momentum");
    m->be->ops->sgd_step_dev(m->be, m->params, m->grads, m->momentum, m->num_params, lr, momentum,
                             weight_decay, false, skip);
}

void trn_resnet_count_forward(struct trn_resnet *m)
{
    for (int i = 0; i < m->num_bn; i++)
        m->num_batches_tracked[i]++;
}
