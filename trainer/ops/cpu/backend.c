/*
 * backend.c: the CPU backend: oneDNN engine and stream, threads, memory, the
 * layout conversions, and the table of ops the other files in ops/cpu/
 * implement.
 *
 * Activations are kept in oneDNN's channel-blocked layout (nChw8c with AVX2,
 * nChw16c with AVX-512), the layout its direct convolutions read and write,
 * so no op reorders an activation: PyTorch keeps NCHW between ops and pays a
 * reorder into and out of every oneDNN convolution.
 */
#include "trainer/ops/cpu/cpu.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/errors.h"
#include "common/strutil.h"

void cpu_dnnl_check(dnnl_status_t st, const char *what, const char *file, int line)
{
    if (st != dnnl_success)
        trn_fatal_at(file, line, "oneDNN error %d in %s", (int)st, what);
}

void cpu_scratch_reserve(void **buf, size_t *have, size_t size)
{
    if (size <= *have)
        return;
    free(*buf);
    *buf = trn_aligned_alloc(size);
    *have = size;
}

dnnl_format_tag_t cpu_layout_tag(enum trn_layout l)
{
    switch (l) {
    case TRN_LAYOUT_NCHW:
        return dnnl_nchw;
    case TRN_LAYOUT_NCHW8C:
        return dnnl_nChw8c;
    case TRN_LAYOUT_NCHW16C:
        return dnnl_nChw16c;
    case TRN_LAYOUT_NHWC:
        return dnnl_nhwc;
    }
    trn_fatal("unknown layout %d", (int)l);
}

/* Memory comes zeroed and 64-byte aligned. A block of CPU_HUGE bytes or
 * more (the parameters, their gradients, the momentum, the step's snapshot
 * under --restart_scope=worker, the activations' arena) is an anonymous
 * mapping of its own, aligned to 2 MiB and marked for transparent huge
 * pages: the kernel clears it as it is first touched, one fault per 2 MiB
 * where clearing it here took one per 4 KiB. Faults are dear on a VM
 * (shadow paging): a ResNet-18 worker's 225 MiB took 0.3-0.4 s to clear
 * at start-up, most of a replacement's start when it re-forms in place
 * (docs/benchmarks.md). Where THP is off the mapping still spares the
 * memset, and pages nobody touches are never made. Smaller blocks come
 * from the heap and are cleared here. Under ASan every block comes from
 * the heap, so that its bounds and its leak are checked.
 *
 * A header (CPU_HEAD bytes) just before each block says which it is. */
#define CPU_HEAD 64
#define CPU_HUGE ((size_t)2 << 20)

#if defined(__SANITIZE_ADDRESS__)
#define CPU_MAP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CPU_MAP 0
#endif
#endif
#ifndef CPU_MAP
#define CPU_MAP 1
#endif

struct cpu_block {
    void *map; /* the mapping; NULL: from the heap */
    size_t len;
};

static void *cpu_map(size_t rounded)
{
    /* room to align the block to 2 MiB and cover its last huge page */
    size_t span = (rounded + CPU_HUGE - 1) / CPU_HUGE * CPU_HUGE;
    size_t len = span + CPU_HUGE;
    char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)base + CPU_HEAD + CPU_HUGE - 1) & ~(uintptr_t)(CPU_HUGE - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, span, MADV_HUGEPAGE); /* (a hint: EINVAL without THP) */
#endif
    struct cpu_block h = {base, len};
    memcpy(p - CPU_HEAD, &h, sizeof(h));
    return p;
}

static void *cpu_alloc(struct trn_backend *be, size_t bytes)
{
    (void)be;
    if (bytes > SIZE_MAX / 2)
        return NULL;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0)
        rounded = 64;
    if (CPU_MAP && rounded >= CPU_HUGE)
        return cpu_map(rounded);
    char *base = aligned_alloc(64, CPU_HEAD + rounded);
    if (base == NULL)
        return NULL;
    memset(base, 0, CPU_HEAD + rounded);
    return base + CPU_HEAD;
}

static void cpu_free(struct trn_backend *be, void *p)
{
    (void)be;
    if (p == NULL)
        return;
    struct cpu_block h;
    memcpy(&h, (char *)p - CPU_HEAD, sizeof(h));
    if (h.map != NULL)
        munmap(h.map, h.len);
    else
        free((char *)p - CPU_HEAD);
}

static void cpu_copy(struct trn_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes)
        memcpy(dst, src, bytes);
}

static void cpu_synchronize(struct trn_backend *be)
{
    (void)be;
}

void cpu_reorder(struct trn_backend *be, const struct trn_tensor *src, struct trn_tensor *dst)
{
    struct cpu_backend *cb = cpu_of(be);
    dnnl_dims_t dims = {src->n, src->c, src->h, src->w};
    dnnl_memory_desc_t smd, dmd;
    dnnlCheck(dnnl_memory_desc_init_by_tag(&smd, 4, dims, dnnl_f32, cpu_layout_tag(src->layout)));
    dnnlCheck(dnnl_memory_desc_init_by_tag(&dmd, 4, dims, dnnl_f32, cpu_layout_tag(dst->layout)));
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnlCheck(dnnl_reorder_primitive_desc_create(&pd, &smd, cb->engine, &dmd, cb->engine, NULL));
    dnnlCheck(dnnl_primitive_create(&prim, pd));
    dnnl_memory_t sm, dm;
    dnnlCheck(dnnl_memory_create(&sm, &smd, cb->engine, src->data));
    dnnlCheck(dnnl_memory_create(&dm, &dmd, cb->engine, dst->data));
    dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, sm}, {DNNL_ARG_TO, dm}};
    dnnlCheck(dnnl_primitive_execute(prim, cb->stream, 2, args));
    dnnlCheck(dnnl_stream_wait(cb->stream));
    dnnl_memory_destroy(sm);
    dnnl_memory_destroy(dm);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
}

static const struct trn_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .reorder = cpu_reorder,
    .conv_forward = cpu_conv_forward,
    .conv_backward_weights = cpu_conv_backward_weights,
    .conv_backward_data = cpu_conv_backward_data,
    .conv_release = cpu_conv_release,
    .bn_stats = cpu_bn_stats,
    .bn_prepare = cpu_bn_prepare,
    .bn_apply = cpu_bn_apply,
    .bn_backward_reduce = cpu_bn_backward_reduce,
    .bn_param_grads = cpu_bn_param_grads,
    .bn_backward_input = cpu_bn_backward_input,
    .relu_backward = cpu_relu_backward,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
    .avgpool_forward = cpu_avgpool_forward,
    .avgpool_backward = cpu_avgpool_backward,
    .fc_forward = cpu_fc_forward,
    .fc_backward = cpu_fc_backward,
    .xent_forward = cpu_xent_forward,
    .xent_backward = cpu_xent_backward,
    .sgd_step = cpu_sgd_step,
    .unscale = cpu_unscale,
};

/* Threads: the caller's choice, else OMP_NUM_THREADS (as PyTorch), else every core. */
static int pick_threads(int threads)
{
    if (threads > 0)
        return threads;
    const char *env = getenv("OMP_NUM_THREADS");
    long v;
    if (env && *env && cddp_parse_long(env, 1, 4096, &v) == 0)
        return (int)v;
    return omp_get_num_procs();
}

int trn_backend_cpu_init(struct trn_backend *be, int threads, char *err, size_t errlen)
{
    memset(be, 0, sizeof(*be));
    struct cpu_backend *cb = calloc(1, sizeof(*cb));
    if (!cb) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    be->ops = &cpu_ops;
    be->device = TRN_DEVICE_CPU;
    be->threads = pick_threads(threads);
    omp_set_num_threads(be->threads);
    /* nChw16c is what oneDNN's AVX-512 kernels want; nChw8c serves AVX2 (and
     * is what the reference kernels handle on anything older). */
    be->act_layout = dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core ? TRN_LAYOUT_NCHW16C
                                                                              : TRN_LAYOUT_NCHW8C;
    be->act_dtype = TRN_F32; /* --amp is CUDA only (train.c refuses it here) */
    if (dnnl_engine_create(&cb->engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&cb->stream, cb->engine, dnnl_stream_default_flags) != dnnl_success) {
        snprintf(err, errlen, "oneDNN: cannot create a CPU engine");
        if (cb->engine)
            dnnl_engine_destroy(cb->engine);
        free(cb);
        return CDDP_ECONFIG;
    }
    be->impl = cb;
    return 0;
}

void trn_backend_cpu_free(struct trn_backend *be)
{
    struct cpu_backend *cb = cpu_of(be);
    if (!cb)
        return;
    dnnl_stream_destroy(cb->stream);
    dnnl_engine_destroy(cb->engine);
    free(cb->scratchpad);
    free(cb->wbuf);
    free(cb->abuf);
    free(cb);
    be->impl = NULL;
}
