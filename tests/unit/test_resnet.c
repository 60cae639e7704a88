/*
 * Unit tests for trainer/resnet.c: torchvision's state_dict (names, shapes,
 * order, counts), the initialisation, the flat buffers and the grad_ready
 * hook's order, gradient accumulation and loss scaling, the activation
 * arena's plan by lifetime, and the whole network's backward against finite
 * differences of its loss (through the planned arena).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/resnet.h"

#include "cpu_backend_fixture.h"

static void make(struct trn_resnet *m, const char *arch, int classes)
{
    char err[256];
    assert_int_equal(trn_resnet_create(m, &be, trn_arch_find(arch), classes, err, sizeof(err)), 0);
    trn_resnet_init(m, 1, false);
}

/* torchvision's counts: state_dict entries and parameters (num_classes 1000). */
static void test_state_dict_counts(void **state)
{
    (void)state;
    static const struct {
        const char *arch;
        size_t entries, params;
    } want[] = {
        {"resnet18", 122, 11689512},  {"resnet34", 218, 21797672},  {"resnet50", 320, 25557032},
        {"resnet101", 626, 44549160}, {"resnet152", 932, 60192808},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        struct trn_resnet m;
        char err[256];
        assert_int_equal(
            trn_resnet_create(&m, &be, trn_arch_find(want[i].arch), 1000, err, sizeof(err)), 0);
        assert_int_equal(m.n_state, want[i].entries);
        assert_int_equal(m.num_params, want[i].params);
        trn_resnet_free(&m);
    }
    assert_null(trn_arch_find("resnet19"));
}

static void test_state_dict_names_and_order(void **state)
{
    (void)state;
    struct trn_resnet m;
    make(&m, "resnet50", 10);
    static const char *first[] = {
        "conv1.weight",          "bn1.weight",          "bn1.bias",
        "bn1.running_mean",      "bn1.running_var",     "bn1.num_batches_tracked",
        "layer1.0.conv1.weight", "layer1.0.bn1.weight",
    };
    for (size_t i = 0; i < sizeof(first) / sizeof(first[0]); i++)
        assert_string_equal(m.state[i].name, first[i]);
    assert_string_equal(m.state[m.n_state - 2].name, "fc.weight");
    assert_string_equal(m.state[m.n_state - 1].name, "fc.bias");
    /* Bottleneck v1.5: the stride on conv2, the downsample after bn3 */
    const struct trn_state_entry *e = trn_resnet_find(&m, "layer2.0.conv2.weight");
    assert_non_null(e);
    assert_int_equal(e->ndim, 4);
    assert_int_equal(e->shape[0], 128);
    assert_int_equal(e->shape[1], 128);
    assert_int_equal(e->shape[2], 3);
    assert_int_equal(m.blocks[3].conv2.op.stride, 2); /* layer2.0 */
    assert_int_equal(m.blocks[3].conv1.op.stride, 1);
    const struct trn_state_entry *bn3 = trn_resnet_find(&m, "layer1.0.bn3.num_batches_tracked");
    const struct trn_state_entry *ds = trn_resnet_find(&m, "layer1.0.downsample.0.weight");
    assert_non_null(bn3);
    assert_non_null(ds);
    assert_true(ds == bn3 + 1);
    assert_int_equal(ds->shape[0], 256);
    assert_int_equal(ds->shape[1], 64);
    const struct trn_state_entry *fc = trn_resnet_find(&m, "fc.weight");
    assert_int_equal(fc->shape[0], 10);
    assert_int_equal(fc->shape[1], 2048);
    assert_int_equal(bn3->dtype, TRN_I64);
    assert_int_equal(bn3->ndim, 0);
    /* params tile the flat buffer in order, as do buffers */
    size_t p = 0, b = 0;
    for (size_t i = 0; i < m.n_state; i++) {
        const struct trn_state_entry *s = &m.state[i];
        if (s->kind == TRN_STATE_PARAM) {
            assert_int_equal(s->off, p);
            assert_ptr_equal(s->data, m.params + p);
            p += s->numel;
        } else if (s->kind == TRN_STATE_BUFFER) {
            assert_int_equal(s->off, b);
            b += s->numel;
        }
    }
    assert_int_equal(p, m.num_params);
    assert_int_equal(b, m.num_buffers);
    trn_resnet_free(&m);

    make(&m, "resnet18", 10);
    assert_null(trn_resnet_find(&m, "layer1.0.downsample.0.weight"));
    assert_non_null(trn_resnet_find(&m, "layer2.0.downsample.0.weight"));
    assert_null(trn_resnet_find(&m, "layer1.0.conv3.weight"));
    assert_int_equal(m.blocks[2].conv1.op.stride, 2); /* BasicBlock: stride on conv1 */
    trn_resnet_free(&m);
}

static double stddev(const float *p, size_t n)
{
    double s = 0, q = 0;
    for (size_t i = 0; i < n; i++) {
        s += p[i];
        q += (double)p[i] * p[i];
    }
    return sqrt(q / n - (s / n) * (s / n));
}

static void test_init(void **state)
{
    (void)state;
    struct trn_resnet m, m2;
    make(&m, "resnet50", 10);
    const struct trn_state_entry *w =
        trn_resnet_find(&m, "layer3.0.conv2.weight"); /* 256x256x3x3 */
    double want = sqrt(2.0 / (256 * 9));              /* fan_out */
    assert_true(fabs(stddev(w->data, w->numel) / want - 1) < 0.01);
    const float *bw = trn_resnet_find(&m, "layer1.0.bn3.weight")->data;
    const float *bb = trn_resnet_find(&m, "layer1.0.bn3.bias")->data;
    const float *rv = trn_resnet_find(&m, "layer1.0.bn3.running_var")->data;
    for (int c = 0; c < 256; c++) {
        assert_true(bw[c] == 1.0f && bb[c] == 0.0f && rv[c] == 1.0f);
    }
    const struct trn_state_entry *fc = trn_resnet_find(&m, "fc.weight");
    const float *fw = fc->data;
    double bound = 1 / sqrt(2048.0), mx = 0;
    for (size_t i = 0; i < fc->numel; i++)
        mx = fmax(mx, fabs(fw[i]));
    assert_true(mx <= bound && mx > 0.9 * bound);
    /* seeded: same seed, same weights; another seed, others */
    make(&m2, "resnet50", 10);
    assert_memory_equal(m.params, m2.params, m.num_params * sizeof(float));
    trn_resnet_init(&m2, 2, false);
    assert_memory_not_equal(m.params, m2.params, 4096);
    /* zero_init_residual: the last BN of each block has weight 0, nothing else changes */
    trn_resnet_init(&m2, 1, true);
    for (int c = 0; c < 256; c++)
        assert_true(((float *)trn_resnet_find(&m2, "layer1.0.bn3.weight")->data)[c] == 0.0f);
    assert_true(((float *)trn_resnet_find(&m2, "layer1.0.bn2.weight")->data)[0] == 1.0f);
    assert_true(((float *)trn_resnet_find(&m2, "layer1.0.downsample.1.weight")->data)[0] == 1.0f);
    trn_resnet_free(&m);
    trn_resnet_free(&m2);

    make(&m, "resnet18", 10);
    trn_resnet_init(&m, 1, true);
    assert_true(((float *)trn_resnet_find(&m, "layer4.1.bn2.weight")->data)[5] == 0.0f);
    assert_true(((float *)trn_resnet_find(&m, "layer4.1.bn1.weight")->data)[5] == 1.0f);
    trn_resnet_free(&m);
}

/* A small batch: n images of 3 x h x w and labels. */
struct batch {
    int n, h, w;
    float *x;
    int32_t labels[8];
};

static void make_batch(struct batch *b, int n, int h, int w, int classes)
{
    b->n = n;
    b->h = h;
    b->w = w;
    b->x = malloc(sizeof(float) * 3 * n * h * w);
    uint64_t s = 99;
    for (int i = 0; i < 3 * n * h * w; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        b->x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (int i = 0; i < n; i++)
        b->labels[i] = i % classes;
}

struct hook_log {
    size_t next_end; /* the previous call's offset: calls must walk down from num_params */
    size_t calls;
    int bad;
};

static void on_ready(void *arg, size_t off, size_t numel)
{
    struct hook_log *h = arg;
    if (off + numel != h->next_end)
        h->bad++;
    h->next_end = off;
    h->calls++;
}

static void test_grad_ready_in_reverse_order(void **state)
{
    (void)state;
    const char *archs[] = {"resnet18", "resnet50"};
    for (int a = 0; a < 2; a++) {
        struct trn_resnet m;
        make(&m, archs[a], 10);
        struct hook_log h = {m.num_params, 0, 0};
        m.hooks.grad_ready = on_ready;
        m.hooks.arg = &h;
        struct batch b;
        make_batch(&b, 2, 32, 32, 10);
        trn_resnet_forward(&m, b.x, b.labels, b.n, b.h, b.w, true);
        trn_resnet_backward(&m, 1.0f, false);
        /* every parameter tensor once, contiguous ranges from the end to 0 */
        assert_int_equal(h.bad, 0);
        assert_int_equal(h.next_end, 0);
        assert_int_equal(h.calls, (size_t)m.n_convs + (size_t)m.num_bn + 1);
        free(b.x);
        trn_resnet_free(&m);
    }
}

static void test_accumulate_and_scale(void **state)
{
    (void)state;
    struct trn_resnet m;
    make(&m, "resnet18", 10);
    struct batch b;
    make_batch(&b, 4, 32, 32, 10);
    size_t n = m.num_params;
    float *g1 = malloc(n * sizeof(float));
    trn_resnet_forward(&m, b.x, b.labels, b.n, b.h, b.w, true);
    trn_resnet_backward(&m, 1.0f, false);
    memcpy(g1, m.grads, n * sizeof(float));
    /* the same batch again, accumulated, at half scale: g1 + g1/2 */
    trn_resnet_forward(&m, b.x, b.labels, b.n, b.h, b.w, true);
    trn_resnet_backward(&m, 0.5f, true);
    double worst = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(m.grads[i] - 1.5 * g1[i]));
        mx = fmax(mx, fabs(g1[i]));
    }
    assert_true(mx > 0);
    assert_true(worst <= 1e-5 * mx);
    /* the counters count training forwards; eval does not touch them */
    assert_int_equal(m.num_batches_tracked[0], 2);
    trn_resnet_forward(&m, b.x, NULL, b.n, b.h, b.w, false);
    assert_int_equal(m.num_batches_tracked[0], 2);
    free(g1);
    free(b.x);
    trn_resnet_free(&m);
}

/*
 * The network's backward against central differences of its (training-mode)
 * loss, for a few tensors spread over the network (the stem, downsample
 * branches, a block's BN, fc): along each tensor's own gradient direction
 * d = g / |g|, (L(p + eps d) - L(p - eps d)) / 2 eps must equal g . d = |g|.
 * A directional difference moves the loss by eps |g|, far above the float
 * rounding of the forward pass, which single-element differences drown in.
 */
static void check_model_gradients(const char *arch, const char *const *names, size_t n_names)
{
    struct trn_resnet m;
    make(&m, arch, 10);
    struct batch b;
    make_batch(&b, 4, 48, 48, 10); /* 2x2 maps in layer4: 16 values per batch-norm channel */
    trn_resnet_forward(&m, b.x, b.labels, b.n, b.h, b.w, true);
    trn_resnet_backward(&m, 1.0f, false);
    float *grads = malloc(m.num_params * sizeof(float));
    float *keep = malloc(m.num_params * sizeof(float));
    memcpy(grads, m.grads, m.num_params * sizeof(float));
    memcpy(keep, m.params, m.num_params * sizeof(float));
    for (size_t t = 0; t < n_names; t++) {
        const struct trn_state_entry *e = trn_resnet_find(&m, names[t]);
        assert_non_null(e);
        const float *g = grads + e->off;
        double norm = 0;
        for (size_t i = 0; i < e->numel; i++)
            norm += (double)g[i] * g[i];
        norm = sqrt(norm);
        assert_true(norm > 0);
        /* a first-order change of the loss of 0.01: far above rounding, small
         * enough for the loss to be near linear (|g| reaches 1e3 in the stem
         * of an untrained ResNet-50) */
        const double eps = fmin(1e-3, 1e-2 / norm);
        double l[2];
        for (int side = 0; side < 2; side++) {
            double step = side == 0 ? eps : -eps;
            for (size_t i = 0; i < e->numel; i++)
                m.params[e->off + i] = (float)(keep[e->off + i] + step * g[i] / norm);
            l[side] = trn_resnet_forward(&m, b.x, b.labels, b.n, b.h, b.w, true);
        }
        memcpy(m.params + e->off, keep + e->off, e->numel * sizeof(float));
        double fd = (l[0] - l[1]) / (2 * eps);
        if (fabs(fd - norm) > 0.02 * norm)
            fail_msg("%s %s: |gradient| %g, directional finite difference %g", arch, names[t], norm,
                     fd);
    }
    free(keep);
    free(grads);
    free(b.x);
    trn_resnet_free(&m);
}

/* The arena is planned by lifetime: the backward's scratch lands in blocks
 * already backpropagated, so the plan is barely more than the activations
 * kept for backward (the old layout added four buffers of the largest
 * activation); a smaller shape plans less in the same allocation; and the
 * planned scratch gives the same gradients, bit for bit, step after step. */
static void test_arena_plan(void **state)
{
    (void)state;
    struct trn_resnet m;
    make(&m, "resnet50", 10);
    struct batch b;
    make_batch(&b, 4, 64, 64, 10);
    trn_resnet_forward(&m, b.x, b.labels, b.n, b.h, b.w, true);
    trn_resnet_backward(&m, 1.0f, false);
    size_t planned = m.plan_bytes, kept = m.kept_bytes, arena = m.arena_bytes;
    assert_true(kept > 0 && planned >= kept && planned < kept + kept / 20);
    assert_int_equal(arena, planned);
    float *g1 = malloc(m.num_params * sizeof(float));
    memcpy(g1, m.grads, m.num_params * sizeof(float));

    trn_resnet_forward(&m, b.x, b.labels, 2, b.h, b.w, true); /* the first two images */
    trn_resnet_backward(&m, 1.0f, false);
    assert_true(m.plan_bytes < planned);
    assert_int_equal(m.arena_bytes, arena); /* never shrinks */

    trn_resnet_forward(&m, b.x, b.labels, b.n, b.h, b.w, true);
    trn_resnet_backward(&m, 1.0f, false);
    assert_int_equal(m.plan_bytes, planned);
    assert_memory_equal(m.grads, g1, m.num_params * sizeof(float));
    free(g1);
    free(b.x);
    trn_resnet_free(&m);
}

static void test_model_gradients_basic(void **state)
{
    (void)state;
    static const char *names[] = {"conv1.weight",
                                  "bn1.bias",
                                  "layer1.0.conv2.weight",
                                  "layer2.0.downsample.0.weight",
                                  "layer3.1.bn2.weight",
                                  "layer4.1.conv1.weight",
                                  "fc.weight",
                                  "fc.bias"};
    check_model_gradients("resnet18", names, sizeof(names) / sizeof(names[0]));
}

static void test_model_gradients_bottleneck(void **state)
{
    (void)state;
    static const char *names[] = {
        "conv1.weight",        "layer1.0.downsample.1.weight", "layer1.0.conv3.weight",
        "layer2.1.bn3.weight", "layer4.0.downsample.0.weight", "fc.weight"};
    check_model_gradients("resnet50", names, sizeof(names) / sizeof(names[0]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_dict_counts),
        cmocka_unit_test(test_state_dict_names_and_order),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_grad_ready_in_reverse_order),
        cmocka_unit_test(test_accumulate_and_scale),
        cmocka_unit_test(test_arena_plan),
        cmocka_unit_test(test_model_gradients_basic),
        cmocka_unit_test(test_model_gradients_bottleneck),
    };
    return cmocka_run_group_tests(tests, cpu_backend_setup, cpu_backend_teardown);
}
