/*
 * train.c: cddp-train, the worker cddprun supervises: ResNet training in C,
 * a reimplementation of the seed article's ddp_train.py (section 3).
 *
 *     cddp-train --arch resnet152 --data synthetic --batch-size 64 --epochs 100
 *
 * prints what the script prints (rank 0):
 *
 *     Epoch 0 [0/782] Loss: 6.9431
 *     Epoch 0 [50/782] Loss: 6.9077
 *     ...
 *     Epoch 0 finished, avg loss: 6.9120, time: 812.35s, throughput: 61.6 img/s
 *
 * This file reads top to bottom as the program: flags, the backend and the
 * model, the data, the training loop, evaluation, saving. The pieces live
 * beside it: resnet.c (the graph), ops/cpu/ (the kernels), data/ (datasets
 * and the sampler).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/clock.h"         /* cddp_mono_ns */
#include "common/errors.h"        /* error codes */
#include "common/exitcodes.h"     /* CDDP_EXIT_* */
#include "common/log.h"           /* log_info, log_debug */
#include "common/strutil.h"       /* cddp_parse_long, cddp_parse_double */
#include "config.h"               /* CDDP_VERSION */
#include "trainer/checkpoint.h"   /* trn_weights_load, trn_weights_save */
#include "trainer/data/dataset.h" /* trn_dataset: synthetic, idx, folder */
#include "trainer/data/sampler.h" /* trn_sampler: DistributedSampler semantics */
#include "trainer/fatal.h"        /* trn_fatal, trn_malloc */
#include "trainer/ops/ops.h"      /* trn_backend */
#include "trainer/resnet.h"       /* trn_resnet */

/* ------------------------------------------------------------------------ */
/* Flags                                                                     */

struct config {
    const char *arch;
    const char *data;
    long num_samples; /* synthetic */
    long image_size;  /* synthetic, folder */
    long num_classes; /* 0: the dataset's */
    long limit;       /* 0: all */
    long batch_size;
    long epochs;
    long steps; /* 0: no limit */
    double lr, momentum, weight_decay;
    long seed;
    bool shuffle;
    long log_every;
    long threads; /* 0: OMP_NUM_THREADS, else all cores */
    bool eval;
    const char *eval_logits; /* write the test split's logits here */
    bool zero_init_residual;
    const char *init; /* torchvision weights to start from */
    const char *save; /* where to write the final weights */
};

/* The seed script's values. */
static const struct config defaults = {
    .arch = "resnet152",
    .data = "synthetic",
    .num_samples = 50000,
    .image_size = 224,
    .batch_size = 64,
    .epochs = 100,
    .lr = 0.01,
    .momentum = 0.9,
    .weight_decay = 1e-4,
    .shuffle = true,
    .log_every = 50,
};

static void usage(FILE *f)
{
    fprintf(f, "usage: cddp-train [options]\n"
               "\n"
               "Trains a torchvision ResNet with SGD on the CPU, as the seed's ddp_train.py.\n"
               "\n"
               "model and optimiser:\n"
               "  --arch NAME             resnet18, resnet34, resnet50, resnet101, resnet152 "
               "(resnet152)\n"
               "  --num-classes N         outputs of the fc layer (the dataset's)\n"
               "  --zero-init-residual    zero the last BN weight of every block (torchvision's "
               "option)\n"
               "  --init PATH             start from a torchvision state_dict (.safetensors)\n"
               "  --save PATH             write the final state_dict there (.safetensors)\n"
               "  --seed N                seeds initialisation, data order and synthetic data (0)\n"
               "  --lr X                  learning rate (0.01)\n"
               "  --momentum X            SGD momentum (0.9)\n"
               "  --weight-decay X        SGD weight decay (1e-4)\n"
               "data:\n"
               "  --data SPEC             synthetic | idx[:DIR] | folder:DIR (synthetic)\n"
               "  --num-samples N         synthetic dataset size (50000)\n"
               "  --image-size N          synthetic and folder image side (224)\n"
               "  --limit N               use only the first N training images\n"
               "  --no-shuffle            keep the dataset's order\n"
               "training:\n"
               "  --batch-size N          images per step (64)\n"
               "  --epochs N              (100)\n"
               "  --steps N               stop after N steps in all (no limit)\n"
               "  --log-every N           print the loss every N batches (50)\n"
               "  --threads N             CPU threads (OMP_NUM_THREADS, else all cores)\n"
               "  --eval                  report accuracy on the test split at the end\n"
               "  --eval-logits PATH      with --eval, also write the test logits (N, classes) "
               "to PATH\n"
               "  --help, --version\n");
}

/* Exits 2 with one line naming the flag. */
static _Noreturn void bad_flag(const char *flag, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static _Noreturn void bad_flag(const char *flag, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "cddp-train: %s: %s\n", flag, msg);
    exit(CDDP_EXIT_USAGE);
}

static long flag_long(const char *flag, const char *v, long min, long max)
{
    long out;
    if (cddp_parse_long(v, min, max, &out) != 0)
        bad_flag(flag, "expected an integer in [%ld, %ld], got '%s'", min, max, v);
    return out;
}

static double flag_double(const char *flag, const char *v, double min, double max)
{
    double out;
    if (cddp_parse_double(v, min, max, &out) != 0)
        bad_flag(flag, "expected a number in [%g, %g], got '%s'", min, max, v);
    return out;
}

enum {
    OPT_ARCH = 256,
    OPT_DATA,
    OPT_NUM_SAMPLES,
    OPT_IMAGE_SIZE,
    OPT_NUM_CLASSES,
    OPT_LIMIT,
    OPT_BATCH_SIZE,
    OPT_EPOCHS,
    OPT_STEPS,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_WEIGHT_DECAY,
    OPT_SEED,
    OPT_NO_SHUFFLE,
    OPT_LOG_EVERY,
    OPT_THREADS,
    OPT_EVAL,
    OPT_EVAL_LOGITS,
    OPT_ZERO_INIT_RESIDUAL,
    OPT_INIT,
    OPT_SAVE,
    OPT_HELP,
    OPT_VERSION,
};

static const struct option long_options[] = {
    {"arch", required_argument, NULL, OPT_ARCH},
    {"data", required_argument, NULL, OPT_DATA},
    {"num-samples", required_argument, NULL, OPT_NUM_SAMPLES},
    {"image-size", required_argument, NULL, OPT_IMAGE_SIZE},
    {"num-classes", required_argument, NULL, OPT_NUM_CLASSES},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"batch-size", required_argument, NULL, OPT_BATCH_SIZE},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"lr", required_argument, NULL, OPT_LR},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
    {"seed", required_argument, NULL, OPT_SEED},
    {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
    {"log-every", required_argument, NULL, OPT_LOG_EVERY},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"eval", no_argument, NULL, OPT_EVAL},
    {"eval-logits", required_argument, NULL, OPT_EVAL_LOGITS},
    {"zero-init-residual", no_argument, NULL, OPT_ZERO_INIT_RESIDUAL},
    {"init", required_argument, NULL, OPT_INIT},
    {"save", required_argument, NULL, OPT_SAVE},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static void parse_args(int argc, char **argv, struct config *c)
{
    *c = defaults;
    opterr = 0; /* our own one-line messages */
    for (;;) {
        int prev = optind;
        /* "+": stop at the first non-option (no reordering); ":": report a missing value */
        int opt = getopt_long(argc, argv, "+:", long_options, NULL);
        if (opt == -1)
            break;
        char flag[64]; /* the option as typed, without "=value" */
        cddp_strlcpy(flag, argv[prev], sizeof(flag));
        flag[strcspn(flag, "=")] = '\0';
        switch (opt) {
        case OPT_ARCH:
            if (!trn_arch_find(optarg))
                bad_flag("--arch", "unknown architecture '%s' (one of %s)", optarg,
                         trn_arch_names());
            c->arch = optarg;
            break;
        case OPT_DATA:
            c->data = optarg;
            break;
        case OPT_NUM_SAMPLES:
            c->num_samples = flag_long("--num-samples", optarg, 1, 1L << 31);
            break;
        case OPT_IMAGE_SIZE:
            c->image_size = flag_long("--image-size", optarg, 1, 4096);
            break;
        case OPT_NUM_CLASSES:
            c->num_classes = flag_long("--num-classes", optarg, 1, 1000000);
            break;
        case OPT_LIMIT:
            c->limit = flag_long("--limit", optarg, 1, 1L << 31);
            break;
        case OPT_BATCH_SIZE:
            c->batch_size = flag_long("--batch-size", optarg, 1, 65536);
            break;
        case OPT_EPOCHS:
            c->epochs = flag_long("--epochs", optarg, 1, 1000000);
            break;
        case OPT_STEPS:
            c->steps = flag_long("--steps", optarg, 1, 1L << 40);
            break;
        case OPT_LR:
            c->lr = flag_double("--lr", optarg, 0, 1e6);
            break;
        case OPT_MOMENTUM:
            c->momentum = flag_double("--momentum", optarg, 0, 1);
            break;
        case OPT_WEIGHT_DECAY:
            c->weight_decay = flag_double("--weight-decay", optarg, 0, 1e6);
            break;
        case OPT_SEED:
            c->seed = flag_long("--seed", optarg, 0, (1L << 62));
            break;
        case OPT_NO_SHUFFLE:
            c->shuffle = false;
            break;
        case OPT_LOG_EVERY:
            c->log_every = flag_long("--log-every", optarg, 1, 1L << 40);
            break;
        case OPT_THREADS:
            c->threads = flag_long("--threads", optarg, 1, 4096);
            break;
        case OPT_EVAL:
            c->eval = true;
            break;
        case OPT_EVAL_LOGITS:
            c->eval_logits = optarg;
            break;
        case OPT_ZERO_INIT_RESIDUAL:
            c->zero_init_residual = true;
            break;
        case OPT_INIT:
            c->init = optarg;
            break;
        case OPT_SAVE:
            c->save = optarg;
            break;
        case OPT_HELP:
            usage(stdout);
            exit(CDDP_EXIT_OK);
        case OPT_VERSION:
            printf("cddp-train %s\n", CDDP_VERSION);
            exit(CDDP_EXIT_OK);
        case ':':
            bad_flag(flag, "needs a value");
        default:
            bad_flag(flag, "unknown option (see --help)");
        }
    }
    if (optind < argc)
        bad_flag(argv[optind], "unexpected argument (options start with --; see --help)");
    if (c->eval_logits && !c->eval)
        bad_flag("--eval-logits", "needs --eval");
}

/* ------------------------------------------------------------------------ */
/* Data                                                                      */

/* Opens --data for split; exits 2 with the dataset's one-line message when
 * it cannot (a missing directory or file, a bad spec, a malformed file). */
static struct trn_dataset *open_data(const struct config *c, enum trn_split split)
{
    struct trn_dataset_opts o = {
        .split = split,
        .seed = (uint64_t)c->seed,
        .num_samples = (size_t)c->num_samples,
        .image_size = (int)c->image_size,
        .num_classes = (int)c->num_classes,
        .limit = split == TRN_SPLIT_TRAIN ? (size_t)c->limit : 0,
    };
    struct trn_dataset *d;
    char err[512];
    if (trn_dataset_open(c->data, &o, &d, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-train: %s\n", err);
        exit(CDDP_EXIT_USAGE);
    }
    return d;
}

/* Gathers samples idx[0..n) into x (n, C, H, W) and their labels, on all
 * threads (datasets are read-only after open). A sample that cannot be read
 * (a corrupt JPEG) stops the worker with the dataset's message. */
static void load_batch(const struct trn_dataset *d, const uint32_t *idx, int n, float *x,
                       int32_t *labels)
{
    size_t per = trn_dataset_sample_size(d);
    int failed = 0;
    char first_err[512] = "";
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < n; i++) {
        char err[512];
        if (trn_dataset_get(d, idx[i], x + (size_t)i * per, &labels[i], err, sizeof(err)) != 0) {
#pragma omp critical
            if (!failed++)
                cddp_strlcpy(first_err, err, sizeof(first_err));
        }
    }
    if (failed) {
        fprintf(stderr, "cddp-train: %s\n", first_err);
        exit(CDDP_EXIT_FAILURE);
    }
}

/* The model's state_dict as checkpoint.h's table (host pointers: the CPU
 * backend's memory is host memory; a device backend stages through copies). */
static struct trn_ckpt_tensor *state_table(const struct trn_resnet *m)
{
    TRN_CHECK(m->be->device == TRN_DEVICE_CPU, "weights files need host copies on this backend");
    struct trn_ckpt_tensor *t = trn_calloc(m->n_state, sizeof(*t));
    for (size_t i = 0; i < m->n_state; i++) {
        const struct trn_state_entry *e = &m->state[i];
        t[i].name = e->name;
        t[i].dtype = e->dtype == TRN_I64 ? TRN_ST_I64 : TRN_ST_F32;
        t[i].ndim = e->ndim;
        memcpy(t[i].shape, e->shape, sizeof(t[i].shape));
        t[i].data = e->data;
    }
    return t;
}

/* ------------------------------------------------------------------------ */
/* Evaluation                                                                */

/* Top-1 accuracy of the model in eval mode over the whole of ds; with
 * all_logits (ds->len, K) not NULL, every sample's logits too. */
static double evaluate(struct trn_resnet *m, const struct trn_dataset *ds, int batch, float *x_host,
                       float *x_dev, int32_t *labels, float *all_logits)
{
    struct trn_backend *be = m->be;
    size_t per = trn_dataset_sample_size(ds), correct = 0;
    float *logits = trn_malloc((size_t)batch * m->num_classes * sizeof(float));
    uint32_t *idx = trn_malloc((size_t)batch * sizeof(uint32_t));
    for (size_t start = 0; start < ds->len; start += (size_t)batch) {
        int n = (int)(ds->len - start < (size_t)batch ? ds->len - start : (size_t)batch);
        for (int i = 0; i < n; i++)
            idx[i] = (uint32_t)(start + (size_t)i);
        load_batch(ds, idx, n, x_host, labels);
        be->ops->to_device(be, x_dev, x_host, (size_t)n * per * sizeof(float));
        trn_resnet_forward(m, x_dev, NULL, n, ds->height, ds->width, false);
        be->ops->to_host(be, logits, m->logits, (size_t)n * m->num_classes * sizeof(float));
        if (all_logits)
            memcpy(all_logits + start * (size_t)m->num_classes, logits,
                   (size_t)n * m->num_classes * sizeof(float));
        for (int i = 0; i < n; i++) {
            const float *l = logits + (size_t)i * m->num_classes;
            int best = 0;
            for (int k = 1; k < m->num_classes; k++)
                if (l[k] > l[best])
                    best = k;
            correct += best == labels[i];
        }
    }
    free(idx);
    free(logits);
    return (double)correct / (double)ds->len;
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    cddp_log_init("cddp-train");
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines reach a pipe as they are printed */
    struct config cfg;
    parse_args(argc, argv, &cfg);
    char err[512];
    int rc = CDDP_EXIT_FAILURE;
    /* Everything main owns, released at `out` (usage errors exit earlier, from bad_flag). */
    struct trn_resnet model = {0};
    struct trn_sampler sampler = {0};
    struct trn_ckpt_tensor *table = NULL;
    float *x_host = NULL, *x_dev = NULL, *all_logits = NULL;
    int32_t *labels = NULL;

    /* Distributed set-up goes here (issue 6): rank and world from torchrun's
     * environment. One process for now. */
    int rank = 0, world = 1;

    /* The backend: oneDNN and our kernels on cfg.threads OpenMP threads. */
    struct trn_backend be;
    if (trn_backend_cpu_init(&be, (int)cfg.threads, err, sizeof(err)) != 0)
        trn_fatal("%s", err);

    /* Data: the training split, and the test split for --eval. */
    struct trn_dataset *train = open_data(&cfg, TRN_SPLIT_TRAIN);
    struct trn_dataset *test = cfg.eval ? open_data(&cfg, TRN_SPLIT_TEST) : NULL;
    int num_classes = cfg.num_classes > 0 ? (int)cfg.num_classes : train->num_classes;
    if (num_classes < train->num_classes)
        bad_flag("--num-classes", "%d is fewer than the dataset's %d classes", num_classes,
                 train->num_classes);
    if (train->channels != 3)
        trn_fatal("--data %s: %d channels per image; the model takes 3", cfg.data, train->channels);

    /* The model: torchvision's initialisation (seeded), or its weights (--init). */
    if (trn_resnet_create(&model, &be, trn_arch_find(cfg.arch), num_classes, err, sizeof(err)))
        trn_fatal("%s", err);
    trn_resnet_init(&model, (uint64_t)cfg.seed, cfg.zero_init_residual);
    table = state_table(&model);
    if (cfg.init && trn_weights_load(cfg.init, table, model.n_state, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-train: --init: %s\n", err);
        goto out;
    }
    log_info("T0001", "%s: %zu parameters, %d classes, %s backend, %d threads", cfg.arch,
             model.num_params, num_classes, be.ops->name, be.threads);

    /* The order of samples: DistributedSampler semantics, reshuffled by seed + epoch. */
    if (trn_sampler_init(&sampler, train->len, world, rank, cfg.shuffle, false, (uint64_t)cfg.seed))
        trn_fatal("sampler: dataset of %zu samples over %d ranks", train->len, world);
    int batch = (int)cfg.batch_size;
    long batches = (long)((sampler.num_samples + (size_t)batch - 1) / (size_t)batch);
    int last = (int)(sampler.num_samples - (size_t)(batches - 1) * (size_t)batch);
    int height = train->height, width = train->width;
    /* PyTorch refuses to train batch norm on one value per channel. */
    if (trn_resnet_min_bn_count(&model, batch, height, width) < 2 ||
        trn_resnet_min_bn_count(&model, last, height, width) < 2)
        bad_flag("--batch-size",
                 "a batch of %d images of %dx%d leaves batch norm one value per channel; use a "
                 "larger batch, or a dataset size that is not 1 more than a multiple of it",
                 last < batch ? last : batch, height, width);

    size_t per = trn_dataset_sample_size(train);
    size_t xbytes = (size_t)batch * per * sizeof(float);
    x_host = trn_malloc(xbytes);
    x_dev = be.ops->alloc(&be, xbytes);
    TRN_CHECK(x_dev, "out of memory for the input batch (%zu bytes)", xbytes);
    labels = trn_malloc((size_t)batch * sizeof(int32_t));

    /* Where training starts: step 0 of epoch 0, or where a checkpoint left
     * off (resuming sets these three, the weights, the momentum buffers and
     * model.optimizer_steps; the epoch's order is a function of seed + epoch,
     * so skipping its first start_batch batches lands on the same samples). */
    long step = 0, start_batch = 0;
    int start_epoch = 0;

    for (int epoch = start_epoch; epoch < cfg.epochs; epoch++) {
        trn_sampler_set_epoch(&sampler, epoch);
        uint64_t t0 = cddp_mono_ns();
        double loss_sum = 0;
        long images = 0, done = 0;
        for (long b = epoch == start_epoch ? start_batch : 0; b < batches; b++) {
            if (cfg.steps && step >= cfg.steps)
                break;
            int n = b == batches - 1 ? last : batch;
            uint64_t ts = cddp_mono_ns();
            const uint32_t *idx = sampler.indices + (size_t)b * (size_t)batch;
            load_batch(train, idx, n, x_host, labels);
            for (int i = 0; i < n; i++)
                if (labels[i] < 0 || labels[i] >= num_classes)
                    trn_fatal("label %d of sample %u is outside [0, %d)", labels[i], idx[i],
                              num_classes);
            be.ops->to_device(&be, x_dev, x_host, (size_t)n * per * sizeof(float));

            float loss = trn_resnet_forward(&model, x_dev, labels, n, height, width, true);
            trn_resnet_backward(&model, 1.0f, false);
            trn_resnet_sgd_step(&model, (float)cfg.lr, (float)cfg.momentum,
                                (float)cfg.weight_decay);
            step++;
            done++;
            images += n;
            loss_sum += loss;
            log_debug("T0002", "step %ld loss %.9g time %.6f s", step, (double)loss,
                      (double)(cddp_mono_ns() - ts) * 1e-9);
            if (!isfinite(loss))
                log_warn("T0003", "step %ld: loss is %f", step, (double)loss);
            if (rank == 0 && b % cfg.log_every == 0)
                printf("Epoch %d [%ld/%ld] Loss: %.4f\n", epoch, b, batches, (double)loss);
            /* A checkpoint is written here (every N steps, and after an
             * epoch's last batch): epoch, b + 1, step. */
        }
        if (done == 0)
            break;
        double secs = (double)(cddp_mono_ns() - t0) * 1e-9;
        if (rank == 0)
            printf("Epoch %d finished, avg loss: %.4f, time: %.2fs, throughput: %.1f img/s\n",
                   epoch, loss_sum / (double)done, secs, (double)images * world / secs);
        if (cfg.steps && step >= cfg.steps)
            break;
    }

    /* Evaluation on the test split, BN in eval mode. */
    if (test) {
        if (test->height != height || test->width != width || test->channels != 3)
            trn_fatal("--eval: test images are %dx%dx%d, training images 3x%dx%d", test->channels,
                      test->height, test->width, height, width);
        if (cfg.eval_logits)
            all_logits = trn_malloc(test->len * (size_t)num_classes * sizeof(float));
        double acc = evaluate(&model, test, batch, x_host, x_dev, labels, all_logits);
        if (rank == 0)
            printf("test accuracy: %.4f\n", acc);
        if (all_logits && rank == 0) {
            struct trn_st_tensor t = {.name = "logits",
                                      .dtype = TRN_ST_F32,
                                      .ndim = 2,
                                      .shape = {test->len, (uint64_t)num_classes},
                                      .data = all_logits};
            if (trn_st_save(cfg.eval_logits, &t, 1, NULL, 0, err, sizeof(err)) != 0) {
                fprintf(stderr, "cddp-train: --eval-logits: %s\n", err);
                goto out;
            }
        }
    }

    /* The final weights (--save), as a torchvision state_dict. */
    if (cfg.save && rank == 0 &&
        trn_weights_save(cfg.save, cfg.arch, num_classes, table, model.n_state, err, sizeof(err)) !=
            0) {
        fprintf(stderr, "cddp-train: --save: %s\n", err);
        goto out;
    }

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        log_debug("T0004", "peak_rss_kb %ld", ru.ru_maxrss);
    rc = CDDP_EXIT_OK;

out:
    be.ops->free(&be, x_dev);
    free(all_logits);
    free(x_host);
    free(labels);
    free(table);
    trn_sampler_free(&sampler);
    trn_resnet_free(&model);
    trn_dataset_close(train);
    trn_dataset_close(test);
    trn_backend_cpu_free(&be);
    return rc;
}
