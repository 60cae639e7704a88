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
 * model, the data, checkpoints, the training loop, evaluation, saving. The
 * pieces live beside it: resnet.c (the graph), ops/cpu/ (the kernels), data/
 * (datasets and the sampler), checkpoint.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"           /* cddp_mono_ns */
#include "common/errors.h"          /* error codes */
#include "common/exitcodes.h"       /* CDDP_EXIT_* */
#include "common/log.h"             /* log_info, log_debug */
#include "common/strutil.h"         /* cddp_parse_long, cddp_parse_double */
#include "config.h"                 /* CDDP_VERSION */
#include "trainer/checkpoint.h"     /* trn_ckpt_*, trn_weights_load, trn_weights_save */
#include "trainer/comm/bootstrap.h" /* trn_dist_init: torchrun's env -> communicator */
#include "trainer/comm/failure.h"   /* trn_comm_fail: error file, exit 75 */
#include "trainer/data/dataset.h"   /* trn_dataset: synthetic, idx, folder */
#include "trainer/data/sampler.h"   /* trn_sampler: DistributedSampler semantics */
#include "trainer/ddp.h"            /* trn_ddp: DDP buckets, SyncBatchNorm */
#include "trainer/fatal.h"          /* trn_fatal, trn_malloc */
#include "trainer/fault.h"          /* --fault */
#include "trainer/ops/ops.h"        /* trn_backend */
#include "trainer/resnet.h"         /* trn_resnet */

/* ------------------------------------------------------------------------ */
/* Flags                                                                     */

struct config {
    const char *arch;
    const char *data;
    long num_samples; /* synthetic */
    long image_size;  /* synthetic, folder */
    long num_classes; /* 0: the dataset's */
    long limit;       /* 0: all */
    long eval_limit;  /* test images for --eval; 0: all */
    long batch_size;
    long epochs;
    long steps; /* 0: no limit */
    double lr, momentum, weight_decay;
    bool cosine; /* --lr-schedule cosine */
    long seed;
    bool shuffle;
    long log_every;
    long threads; /* 0: OMP_NUM_THREADS, else all cores */
    bool eval;
    const char *eval_logits; /* write the test split's logits here */
    bool zero_init_residual;
    const char *init;       /* torchvision weights to start from */
    const char *save;       /* where to write the final weights */
    const char *checkpoint; /* resumed from if it exists, written every ckpt_every steps and at
                               each epoch's end */
    long ckpt_every;        /* 0: at epoch ends only */
    bool no_resume;         /* ignore (and overwrite) an existing checkpoint */
    /* distributed (docs/distributed.md) */
    bool drop_last;
    long accum_steps;          /* micro-batches per optimizer step */
    bool sync_bn;              /* SyncBatchNorm */
    double bucket_cap_mb;      /* DDP bucket size */
    bool overlap;              /* allreduce buckets during backward */
    double collective_timeout; /* s */
    double init_timeout;       /* s */
    struct trn_fault fault;
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
    .accum_steps = 1,
    .bucket_cap_mb = TRN_DEFAULT_BUCKET_CAP_MB,
    .overlap = true,
    .collective_timeout = TRN_COMM_DEFAULT_TIMEOUT_S,
    .init_timeout = TRN_DEFAULT_INIT_TIMEOUT_S,
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
               "  --lr-schedule S         constant, or cosine: torch's CosineAnnealingLR from\n"
               "                          --lr to 0 over all steps, stepped every step (constant)\n"
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
               "  --eval-limit N          evaluate on the first N test images only\n"
               "  --eval-logits PATH      with --eval, also write the test logits (N, classes) "
               "to PATH\n"
               "checkpoints:\n"
               "  --checkpoint PATH       resume from PATH if it exists; write it at the end of "
               "every\n"
               "                          epoch, every --ckpt-every steps and when training "
               "stops\n"
               "  --ckpt-every N          also write the checkpoint every N steps\n"
               "  --no-resume             start over even if PATH exists (overwriting it)\n"
               "distributed (torchrun's environment; see docs/distributed.md):\n"
               "  --accum-steps K         average gradients over K micro-batches per step (1)\n"
               "  --sync-bn               batch-norm statistics over all ranks (SyncBatchNorm)\n"
               "  --drop-last             drop the tail that does not divide among the ranks\n"
               "  --bucket-cap-mb X       DDP gradient bucket size in MiB (25)\n"
               "  --no-overlap            allreduce the gradients after backward, not during it\n"
               "  --collective-timeout S  bound on every collective, then exit 75 (600)\n"
               "  --init-timeout S        bound on connecting to the other ranks (300)\n"
               "  --fault SPEC            inject a fault: crash@step=N[,rank=R][,every],\n"
               "                          hang@step=N[,rank=R][,every], slow@step=N,ms=M[,...]\n"
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
    OPT_LR_SCHEDULE,
    OPT_SEED,
    OPT_NO_SHUFFLE,
    OPT_LOG_EVERY,
    OPT_THREADS,
    OPT_EVAL,
    OPT_EVAL_LOGITS,
    OPT_EVAL_LIMIT,
    OPT_ZERO_INIT_RESIDUAL,
    OPT_INIT,
    OPT_SAVE,
    OPT_CHECKPOINT,
    OPT_CKPT_EVERY,
    OPT_NO_RESUME,
    OPT_DROP_LAST,
    OPT_ACCUM_STEPS,
    OPT_SYNC_BN,
    OPT_BUCKET_CAP_MB,
    OPT_NO_OVERLAP,
    OPT_COLLECTIVE_TIMEOUT,
    OPT_INIT_TIMEOUT,
    OPT_FAULT,
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
    {"lr-schedule", required_argument, NULL, OPT_LR_SCHEDULE},
    {"seed", required_argument, NULL, OPT_SEED},
    {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
    {"log-every", required_argument, NULL, OPT_LOG_EVERY},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"eval", no_argument, NULL, OPT_EVAL},
    {"eval-logits", required_argument, NULL, OPT_EVAL_LOGITS},
    {"eval-limit", required_argument, NULL, OPT_EVAL_LIMIT},
    {"zero-init-residual", no_argument, NULL, OPT_ZERO_INIT_RESIDUAL},
    {"init", required_argument, NULL, OPT_INIT},
    {"save", required_argument, NULL, OPT_SAVE},
    {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
    {"ckpt-every", required_argument, NULL, OPT_CKPT_EVERY},
    {"no-resume", no_argument, NULL, OPT_NO_RESUME},
    {"drop-last", no_argument, NULL, OPT_DROP_LAST},
    {"accum-steps", required_argument, NULL, OPT_ACCUM_STEPS},
    {"sync-bn", no_argument, NULL, OPT_SYNC_BN},
    {"bucket-cap-mb", required_argument, NULL, OPT_BUCKET_CAP_MB},
    {"no-overlap", no_argument, NULL, OPT_NO_OVERLAP},
    {"collective-timeout", required_argument, NULL, OPT_COLLECTIVE_TIMEOUT},
    {"init-timeout", required_argument, NULL, OPT_INIT_TIMEOUT},
    {"fault", required_argument, NULL, OPT_FAULT},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* --checkpoint's companions need it; its directory must exist now, not at
 * the first write an epoch later. */
static void check_checkpoint_flags(const struct config *c)
{
    if (!c->checkpoint) {
        if (c->ckpt_every)
            bad_flag("--ckpt-every", "needs --checkpoint");
        if (c->no_resume)
            bad_flag("--no-resume", "needs --checkpoint");
        return;
    }
    if (c->checkpoint[0] == '\0')
        bad_flag("--checkpoint", "needs a file name");
    if ((c->save && strcmp(c->save, c->checkpoint) == 0) ||
        (c->eval_logits && strcmp(c->eval_logits, c->checkpoint) == 0))
        bad_flag("--checkpoint", "'%s' is also the --save or --eval-logits file", c->checkpoint);
    char dir[4096];
    cddp_strlcpy(dir, c->checkpoint, sizeof(dir));
    char *slash = strrchr(dir, '/');
    if (!slash)
        cddp_strlcpy(dir, ".", sizeof(dir));
    else
        slash[slash == dir] = '\0'; /* "/ckpt" keeps "/" */
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        bad_flag("--checkpoint", "directory '%s' does not exist", dir);
    if (stat(c->checkpoint, &st) == 0 && !S_ISREG(st.st_mode))
        bad_flag("--checkpoint", "'%s' exists and is not a file", c->checkpoint);
}

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
        case OPT_LR_SCHEDULE:
            if (strcmp(optarg, "cosine") == 0)
                c->cosine = true;
            else if (strcmp(optarg, "constant") == 0)
                c->cosine = false;
            else
                bad_flag("--lr-schedule", "'%s' is not constant or cosine", optarg);
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
        case OPT_EVAL_LIMIT:
            c->eval_limit = flag_long("--eval-limit", optarg, 1, 1L << 31);
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
        case OPT_CHECKPOINT:
            c->checkpoint = optarg;
            break;
        case OPT_CKPT_EVERY:
            c->ckpt_every = flag_long("--ckpt-every", optarg, 1, 1L << 40);
            break;
        case OPT_NO_RESUME:
            c->no_resume = true;
            break;
        case OPT_DROP_LAST:
            c->drop_last = true;
            break;
        case OPT_ACCUM_STEPS:
            c->accum_steps = flag_long("--accum-steps", optarg, 1, 65536);
            break;
        case OPT_SYNC_BN:
            c->sync_bn = true;
            break;
        case OPT_BUCKET_CAP_MB:
            c->bucket_cap_mb = flag_double("--bucket-cap-mb", optarg, 1e-3, 1e6);
            break;
        case OPT_NO_OVERLAP:
            c->overlap = false;
            break;
        case OPT_COLLECTIVE_TIMEOUT:
            c->collective_timeout = flag_double("--collective-timeout", optarg, 0.1, 1e7);
            break;
        case OPT_INIT_TIMEOUT:
            c->init_timeout = flag_double("--init-timeout", optarg, 0.1, 1e7);
            break;
        case OPT_FAULT: {
            char ferr[400];
            if (trn_fault_parse(optarg, &c->fault, ferr, sizeof(ferr)) != 0) {
                fprintf(stderr, "cddp-train: %s\n", ferr);
                exit(CDDP_EXIT_USAGE);
            }
            break;
        }
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
    if (c->eval_limit && !c->eval)
        bad_flag("--eval-limit", "needs --eval");
    check_checkpoint_flags(c);
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
        .limit = (size_t)(split == TRN_SPLIT_TRAIN ? c->limit : c->eval_limit),
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
/* Distributed                                                               */

/* Where the loop is, for the report when a collective fails. */
struct where {
    long step; /* -1: not in a step */
    int rank;
    const char *error_file;
};

/* A collective timed out or a peer failed: torchrun's error file, exit 75. */
static void collective_failed(void *arg, const struct trn_comm_error *e)
{
    const struct where *w = arg;
    trn_comm_fail(e, w->step, w->rank, w->error_file);
}

static void must_comm(struct trn_comm *comm, struct where *w, int rc)
{
    if (rc < 0)
        collective_failed(w, trn_comm_last_error(comm));
}

/* Everything every rank must agree on (trn_ddp_check_config): what shapes
 * the collectives (model, batches, steps, buckets, SyncBN, evaluation,
 * checkpoint barriers) and the data order. Paths, threads and timeouts may
 * differ. */
static void describe(const struct config *c, int num_classes, const struct trn_dataset *d,
                     char *buf, size_t len)
{
    snprintf(buf, len,
             "--arch %s --num-classes %d --data %s (%zu samples of %dx%dx%d) --batch-size %ld "
             "--epochs %ld --steps %ld --seed %ld%s%s --accum-steps %ld%s --bucket-cap-mb %g%s "
             "--lr %g --momentum %g --weight-decay %g%s --eval-limit %ld%s%s --ckpt-every %ld",
             c->arch, num_classes, c->data, d->len, d->channels, d->height, d->width, c->batch_size,
             c->epochs, c->steps, c->seed, c->shuffle ? "" : " --no-shuffle",
             c->drop_last ? " --drop-last" : "", c->accum_steps, c->sync_bn ? " --sync-bn" : "",
             c->bucket_cap_mb, c->overlap ? "" : " --no-overlap", c->lr, c->momentum,
             c->weight_decay, c->eval ? " --eval" : "", c->eval_limit,
             c->eval_logits ? " --eval-logits" : "", c->checkpoint ? " --checkpoint" : "",
             c->ckpt_every);
}

/* CDDP_PROGRESS_FD (cddprun's progress channel, docs/status.md): one JSON
 * line per step; dropped, never waited for, when the pipe is full. */
static int progress_fd = -1;

static void progress_open(void)
{
    const char *v = getenv("CDDP_PROGRESS_FD");
    long fd;
    if (v && cddp_parse_long(v, 0, 1 << 20, &fd) == 0 && fcntl((int)fd, F_GETFD) != -1) {
        progress_fd = (int)fd;
        fcntl(progress_fd, F_SETFL, fcntl(progress_fd, F_GETFL) | O_NONBLOCK);
    }
}

static void progress_report(long step, int epoch, double loss, double samples_per_s)
{
    if (progress_fd < 0)
        return;
    char line[256];
    int n = snprintf(line, sizeof(line),
                     "{\"step\":%ld,\"epoch\":%d,\"loss\":%.6g,\"samples_per_s\":%.3f}\n", step,
                     epoch, isfinite(loss) ? loss : 0.0, samples_per_s);
    if (write(progress_fd, line, (size_t)n) < 0 && errno != EAGAIN && errno != EINTR)
        progress_fd = -1; /* the agent went away: stop reporting */
}

/* ------------------------------------------------------------------------ */
/* Checkpoints (--checkpoint, --ckpt-every, --no-resume)                     */

/* What a checkpoint holds besides its metadata: the state_dict table, the
 * momentum buffer of each parameter (views into model->momentum, named as
 * the parameter), and the trainer's generator. */
struct ckpt {
    const char *path; /* NULL: no checkpoints */
    struct trn_ckpt_tensor *model, *momentum;
    size_t n_model, n_mom;
    /* The trainer's run-time generator (xoshiro256** state), seeded from
     * --seed. Nothing draws from it yet (no dropout or augmentation; the
     * shuffle is a function of seed + epoch, synthetic data of seed + index),
     * but it is saved and restored so that whatever draws from it later
     * resumes exactly. */
    uint64_t rng[4];
    long last_step; /* step of the checkpoint last written or resumed; -1: none */
    long lr_t_max;  /* --lr-schedule cosine's T_max: the run's optimizer steps; 0: constant */
};

static const char *lr_schedule_name(const struct config *c)
{
    return c->cosine ? "cosine" : "constant";
}

static void ckpt_init(struct ckpt *k, const struct config *c, const struct trn_resnet *m,
                      struct trn_ckpt_tensor *table)
{
    memset(k, 0, sizeof(*k));
    k->path = c->checkpoint;
    k->model = table;
    k->n_model = m->n_state;
    k->momentum = trn_calloc(m->n_state, sizeof(*k->momentum));
    for (size_t i = 0; i < m->n_state; i++) {
        if (m->state[i].kind != TRN_STATE_PARAM)
            continue;
        k->momentum[k->n_mom] = table[i];
        k->momentum[k->n_mom++].data = m->momentum + m->state[i].off; /* host memory on the CPU */
    }
    uint64_t x = (uint64_t)c->seed ^ 0x6A09E667F3BCC909ull; /* not the initialisation's stream */
    for (int i = 0; i < 4; i++) {                           /* splitmix64 */
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        k->rng[i] = z ^ (z >> 31);
    }
    k->last_step = -1;
}

/*
 * Continues from --checkpoint when it exists (unless --no-resume): the
 * model's tensors, the momentum buffers and the optimizer's step count, the
 * generator, and the position: *epoch, *step, and *first_batch of *epoch.
 * Returns false when there is nothing to resume (no --checkpoint, no file
 * yet, or --no-resume). A checkpoint that cannot be read or does not fit
 * this run stops the trainer with one line and exit 1, the file untouched:
 * never a silent fresh start. Rules: docs/trainer-data.md, "Resuming".
 *
 * DDP: every rank calls this and reads the same file, so all ranks resume
 * the same step at the same sampler position (main() checks they agree).
 */
static bool ckpt_resume(struct ckpt *k, const struct config *c, struct trn_resnet *m,
                        const struct trn_sampler *s, int batch, int rank, int *epoch, long *step,
                        long *first_batch)
{
    if (!k->path || c->no_resume)
        return false;
    struct trn_ckpt_meta meta;
    char err[2048];
    int rc = trn_ckpt_load(k->path, c->arch, k->model, k->n_model, k->momentum, k->n_mom, &meta,
                           err, sizeof(err));
    if (rc == CDDP_ENOTFOUND)
        return false;
    if (rc != 0) {
        fprintf(stderr, "cddp-train: --checkpoint: %s\n", err);
        exit(CDDP_EXIT_FAILURE);
    }
    struct trn_ckpt_run run = {
        .seed = (uint64_t)c->seed,
        .world_size = s->world,
        .batch_size = batch,
        .dataset_len = s->dataset_len,
        .shuffle = s->shuffle,
        .drop_last = s->drop_last,
        .rank_samples = s->num_samples,
    };
    struct trn_ckpt_start start;
    if (trn_ckpt_resume_point(&meta, &run, &start, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-train: --checkpoint: %s: %s\n", k->path, err);
        exit(CDDP_EXIT_FAILURE);
    }
    if (meta.epoch > INT32_MAX) {
        fprintf(stderr, "cddp-train: --checkpoint: %s: epoch %ld is out of range\n", k->path,
                meta.epoch);
        exit(CDDP_EXIT_FAILURE);
    }
    m->optimizer_steps = meta.optimizer_steps;
    memcpy(k->rng, meta.rng, sizeof(k->rng));
    *epoch = (int)start.epoch;
    *step = meta.step;
    *first_batch = (long)(start.rank_offset / (uint64_t)batch);
    k->last_step = meta.step;
    if (start.resized)
        log_warn("T0502",
                 "%s: written at the end of an epoch with world size %d, batch size %d, %" PRIu64
                 " samples%s; epoch %d is laid out for this run: world size %d, batch size %d, "
                 "%zu samples%s",
                 k->path, meta.world_size, meta.batch_size, meta.dataset_len,
                 meta.shuffle ? "" : ", --no-shuffle", *epoch, s->world, batch, s->dataset_len,
                 s->shuffle ? "" : ", --no-shuffle");
    if (meta.lr != c->lr || meta.momentum != c->momentum || meta.weight_decay != c->weight_decay)
        log_warn("T0503",
                 "%s: written with --lr %g --momentum %g --weight-decay %g; continuing with "
                 "--lr %g --momentum %g --weight-decay %g",
                 k->path, meta.lr, meta.momentum, meta.weight_decay, c->lr, c->momentum,
                 c->weight_decay);
    if (strcmp(meta.lr_schedule, lr_schedule_name(c)) != 0 || meta.lr_total_steps != k->lr_t_max)
        log_warn("T0505",
                 "%s: written with --lr-schedule %s (over %ld steps); continuing with "
                 "--lr-schedule %s (over %ld steps): the learning rate jumps to the new curve",
                 k->path, meta.lr_schedule, meta.lr_total_steps, lr_schedule_name(c), k->lr_t_max);
    if (c->init)
        log_info("T0504", "resuming from %s; --init %s is not read", k->path, c->init);
    if (rank == 0)
        printf("=> resumed from checkpoint '%s' (epoch %d, batch %ld, step %ld)\n", k->path, *epoch,
               *first_batch, *step);
    return true;
}

/*
 * Writes --checkpoint, atomically: the model, the momentum buffers, and
 * where training stands: `step` steps in all, in `epoch` with rank_offset of
 * this rank's samples of it done (at an epoch's end: the next epoch, 0). Does
 * nothing without --checkpoint, or when this step's checkpoint is already
 * the one on disk. A write that fails stops the trainer (exit 1); the
 * previous checkpoint stays in place.
 *
 * DDP: the state is the same on every rank; rank 0 writes, and
 * every rank then waits at a barrier here, so no rank runs on (or exits)
 * before the checkpoint it would be restarted from exists.
 */
static void ckpt_save(struct ckpt *k, const struct config *c, const struct trn_resnet *m,
                      const struct trn_sampler *s, int batch, int rank, int epoch, long step,
                      size_t rank_offset, struct trn_comm *comm, struct where *where)
{
    if (!k->path || k->last_step == step)
        return;
    struct trn_ckpt_meta meta = {
        .num_classes = m->num_classes,
        .seed = (uint64_t)c->seed,
        .epoch = epoch,
        .step = step,
        .epoch_offset = (uint64_t)rank_offset * (uint64_t)s->world,
        .world_size = s->world,
        .batch_size = batch,
        .dataset_len = s->dataset_len,
        .shuffle = s->shuffle,
        .drop_last = s->drop_last,
        .optimizer_steps = m->optimizer_steps,
        .lr = c->lr,
        .momentum = c->momentum,
        .weight_decay = c->weight_decay,
        .lr_total_steps = k->lr_t_max,
    };
    cddp_strlcpy(meta.arch, c->arch, sizeof(meta.arch));
    cddp_strlcpy(meta.lr_schedule, lr_schedule_name(c), sizeof(meta.lr_schedule));
    memcpy(meta.rng, k->rng, sizeof(meta.rng));
    if (rank == 0) {
        char err[1024];
        uint64_t t0 = cddp_mono_ns();
        if (trn_ckpt_save(k->path, k->model, k->n_model, k->momentum, k->n_mom, &meta, err,
                          sizeof(err)) != 0) {
            fprintf(stderr, "cddp-train: --checkpoint: %s\n", err);
            exit(CDDP_EXIT_FAILURE);
        }
        log_info("T0501", "checkpoint: step %ld, epoch %d + %zu samples, written to %s in %.3f s",
                 step, epoch, rank_offset, k->path, (double)(cddp_mono_ns() - t0) * 1e-9);
    }
    /* Nobody runs on before the checkpoint it would restart from exists. */
    if (trn_comm_world(comm) > 1)
        must_comm(comm, where, trn_comm_barrier(comm));
    k->last_step = step;
}

/* ------------------------------------------------------------------------ */
/* Evaluation                                                                */

/* Top-1 accuracy of the model in eval mode over the whole of ds, shared
 * among the ranks (rank r takes samples r, r + world, ...; the counts are
 * summed); with all_logits (ds->len, K), zeroed, not NULL, every sample's
 * logits too, on every rank. */
static double evaluate(struct trn_resnet *m, const struct trn_dataset *ds, int batch, float *x_host,
                       float *x_dev, int32_t *labels, float *all_logits, struct trn_comm *comm,
                       struct where *where)
{
    struct trn_backend *be = m->be;
    int rank = trn_comm_rank(comm), world = trn_comm_world(comm);
    size_t per = trn_dataset_sample_size(ds), K = (size_t)m->num_classes;
    int64_t counts[2] = {0, 0}; /* correct, seen */
    float *logits = trn_malloc((size_t)batch * K * sizeof(float));
    uint32_t *idx = trn_malloc((size_t)batch * sizeof(uint32_t));
    size_t stride = (size_t)world;
    for (size_t start = (size_t)rank; start < ds->len; start += (size_t)batch * stride) {
        int n = 0;
        for (size_t j = start; j < ds->len && n < batch; j += stride)
            idx[n++] = (uint32_t)j;
        load_batch(ds, idx, n, x_host, labels);
        be->ops->to_device(be, x_dev, x_host, (size_t)n * per * sizeof(float));
        trn_resnet_forward(m, x_dev, NULL, n, ds->height, ds->width, false);
        be->ops->to_host(be, logits, m->logits, (size_t)n * K * sizeof(float));
        for (int i = 0; i < n; i++) {
            const float *l = logits + (size_t)i * K;
            if (all_logits)
                memcpy(all_logits + idx[i] * K, l, K * sizeof(float));
            size_t best = 0;
            for (size_t k = 1; k < K; k++)
                if (l[k] > l[best])
                    best = k;
            counts[0] += (int64_t)best == labels[i];
            counts[1]++;
        }
    }
    free(idx);
    free(logits);
    must_comm(comm, where, trn_comm_allreduce(comm, counts, 2, TRN_COMM_I64, TRN_COMM_SUM));
    if (all_logits)
        must_comm(comm, where,
                  trn_comm_allreduce(comm, all_logits, ds->len * K, TRN_COMM_F32, TRN_COMM_SUM));
    return counts[1] ? (double)counts[0] / (double)counts[1] : 0.0;
}

/* ------------------------------------------------------------------------ */

/* What main() holds once the model, the data and the sampler exist. */
static void release(struct ckpt *ck, struct trn_ckpt_tensor *table, struct trn_sampler *sampler,
                    struct trn_resnet *model, struct trn_dataset *train, struct trn_dataset *test,
                    struct trn_backend *be)
{
    free(ck->momentum);
    free(table);
    trn_sampler_free(sampler);
    trn_resnet_free(model);
    trn_dataset_close(train);
    trn_dataset_close(test);
    trn_backend_cpu_free(be);
}

int main(int argc, char **argv)
{
    cddp_log_init("cddp-train");
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines reach a pipe as they are printed */
    struct config cfg;
    parse_args(argc, argv, &cfg);
    char err[1024];
    const char *rank_env = getenv("RANK");
    if (rank_env && *rank_env) {
        char tag[32];
        snprintf(tag, sizeof(tag), "rank%.16s", rank_env);
        cddp_log_set_tag(tag);
    }

    /* Who we are (docs/distributed.md): rank and world from torchrun's
     * environment; none of it set: one process. Connecting comes later,
     * once everything a rank can check alone has been checked. */
    struct trn_dist_env env;
    int rc = trn_dist_env_read(&env, getenv, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "cddp-train: %s\n", err);
        return CDDP_EXIT_USAGE;
    }
    int rank = env.rank, world = env.world;
    struct where where = {.step = -1, .rank = rank, .error_file = env.error_file};
    progress_open();

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
    struct trn_resnet model;
    if (trn_resnet_create(&model, &be, trn_arch_find(cfg.arch), num_classes, err, sizeof(err)))
        trn_fatal("%s", err);
    trn_resnet_init(&model, (uint64_t)cfg.seed, cfg.zero_init_residual);
    struct trn_ckpt_tensor *table = state_table(&model);
    /* (A checkpoint to resume replaces these weights below: --init is not read then.) */
    bool resuming = cfg.checkpoint && !cfg.no_resume && access(cfg.checkpoint, F_OK) == 0;
    if (cfg.init && !resuming &&
        trn_weights_load(cfg.init, table, model.n_state, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-train: --init: %s\n", err);
        free(table);
        trn_resnet_free(&model);
        trn_dataset_close(train);
        trn_dataset_close(test);
        trn_backend_cpu_free(&be);
        return CDDP_EXIT_FAILURE;
    }
    log_info("T0001", "%s: %zu parameters, %d classes, %s backend, %d threads", cfg.arch,
             model.num_params, num_classes, be.ops->name, be.threads);

    /* The order of samples: DistributedSampler semantics, reshuffled by seed + epoch. */
    struct trn_sampler sampler;
    if (trn_sampler_init(&sampler, train->len, world, rank, cfg.shuffle, cfg.drop_last,
                         (uint64_t)cfg.seed))
        bad_flag("--drop-last", "%zu training samples cannot be dropped to a multiple of %d ranks",
                 train->len, world);
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

    /* Where to start: from scratch, or where --checkpoint left off. Every
     * rank reads the same file (on several nodes it must be on a shared
     * filesystem; the ranks check below that they agree). */
    struct ckpt ck;
    ckpt_init(&ck, &cfg, &model, table);
    /* --lr-schedule cosine: CosineAnnealingLR(T_max = every step of the run,
     * eta_min 0) with scheduler.step() after each optimizer step. It is a
     * function of the global step, so a resumed run continues on the curve. */
    long steps_per_epoch = (batches + cfg.accum_steps - 1) / cfg.accum_steps;
    long total_steps = steps_per_epoch * cfg.epochs;
    if (cfg.steps && cfg.steps < total_steps)
        total_steps = cfg.steps;
    ck.lr_t_max = cfg.cosine ? total_steps : 0;
    int start_epoch = 0;
    long step = 0, first_batch = 0;
    bool resumed =
        ckpt_resume(&ck, &cfg, &model, &sampler, batch, rank, &start_epoch, &step, &first_batch);
    if (!resumed && resuming) {
        fprintf(stderr, "cddp-train: --checkpoint: %s: removed while cddp-train was starting\n",
                cfg.checkpoint);
        release(&ck, table, &sampler, &model, train, test, &be);
        return CDDP_EXIT_FAILURE;
    }

    /* Connecting (docs/distributed.md): rank 0 serves the bootstrap store on
     * MASTER_ADDR:MASTER_PORT, every rank reaches it, gloo connects them all. */
    struct trn_dist dist;
    struct trn_dist_options dopts = {.init_timeout_s = cfg.init_timeout,
                                     .collective_timeout_s = cfg.collective_timeout};
    rc = trn_dist_init(&dist, &dopts, getenv, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "cddp-train: %s\n", err);
        return rc == CDDP_ECONFIG || rc == CDDP_EPARSE || rc == CDDP_ERANGE_ARG ? CDDP_EXIT_USAGE
                                                                                : CDDP_EXIT_FAILURE;
    }

    /* DDP (ddp.h): every rank starts from rank 0's model; gradients are
     * averaged in buckets during backward; --sync-bn shares BN statistics. */
    struct trn_ddp ddp;
    struct trn_ddp_options ddo = {
        .bucket_cap_mb = cfg.bucket_cap_mb, .overlap = cfg.overlap, .sync_bn = cfg.sync_bn};
    if (trn_ddp_init(&ddp, &model, dist.comm, &ddo, collective_failed, &where, err, sizeof(err)))
        trn_fatal("%s", err);
    describe(&cfg, num_classes, train, err, sizeof(err));
    char desc[sizeof(err)];
    cddp_strlcpy(desc, err, sizeof(desc));
    int64_t at[4] = {resumed, step, start_epoch, first_batch};
    if (trn_ddp_check_config(&ddp, desc, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-train: %s\n", err);
        rc = CDDP_EXIT_USAGE;
    } else if (trn_ddp_check_same(&ddp, at, 4) != 0) {
        fprintf(stderr,
                "cddp-train: --checkpoint %s: the ranks would resume from different places (this "
                "rank: %s, step %ld); on several nodes the checkpoint must be on a shared "
                "filesystem\n",
                cfg.checkpoint ? cfg.checkpoint : "(none)", resumed ? "resumed" : "fresh start",
                step);
        rc = CDDP_EXIT_FAILURE;
    }
    if (rc != 0) {
        trn_ddp_free(&ddp);
        trn_dist_close(&dist);
        release(&ck, table, &sampler, &model, train, test, &be);
        return rc;
    }
    trn_ddp_broadcast_state(&ddp);
    if (world > 1) {
        trn_ddp_describe(&ddp, err, sizeof(err));
        log_info("T6201", "DDP over %d ranks (%s): %s, overlap %s, sync-bn %s, accum-steps %ld",
                 world, trn_comm_backend(dist.comm), err, cfg.overlap ? "on" : "off",
                 cfg.sync_bn ? "on" : "off", cfg.accum_steps);
    }

    size_t per = trn_dataset_sample_size(train);
    size_t xbytes = (size_t)batch * per * sizeof(float);
    float *x_host = trn_malloc(xbytes);
    float *x_dev = be.ops->alloc(&be, xbytes);
    TRN_CHECK(x_dev, "out of memory for the input batch (%zu bytes)", xbytes);
    int32_t *labels = trn_malloc((size_t)batch * sizeof(int32_t));

    /* Training: from the start, or from where --checkpoint left off. A step
     * is one optimizer step: --accum-steps micro-batches (the epoch's last
     * step may have fewer), each loss divided by their number, gradients
     * averaged across ranks only after the last one (no_sync). */
    long accum = cfg.accum_steps;
    for (int epoch = start_epoch; epoch < cfg.epochs; epoch++) {
        trn_sampler_set_epoch(&sampler, epoch);
        uint64_t t0 = cddp_mono_ns();
        double loss_sum = 0;
        long images = 0, done = 0;
        long b0 = epoch == start_epoch ? first_batch : 0; /* a resumed epoch starts inside */
        for (long g0 = b0; g0 < batches; g0 += accum) {
            if (cfg.steps && step >= cfg.steps)
                break;
            where.step = step;
            if (trn_fault_due(&cfg.fault, step, rank, env.restart_count))
                trn_fault_fire(&cfg.fault, step, rank);
            long g1 = g0 + accum < batches ? g0 + accum : batches;
            float k = (float)(g1 - g0), step_loss = 0;
            long step_images = 0;
            uint64_t ts = cddp_mono_ns();
            for (long b = g0; b < g1; b++) {
                int n = b == batches - 1 ? last : batch;
                const uint32_t *idx = sampler.indices + (size_t)b * (size_t)batch;
                load_batch(train, idx, n, x_host, labels);
                for (int i = 0; i < n; i++)
                    if (labels[i] < 0 || labels[i] >= num_classes)
                        trn_fatal("label %d of sample %u is outside [0, %d)", labels[i], idx[i],
                                  num_classes);
                be.ops->to_device(&be, x_dev, x_host, (size_t)n * per * sizeof(float));

                trn_ddp_sync_buffers(&ddp);
                float loss = trn_resnet_forward(&model, x_dev, labels, n, height, width, true);
                trn_ddp_begin_backward(&ddp, b == g1 - 1);
                trn_resnet_backward(&model, 1.0f / k, b > g0);
                done++;
                images += n;
                step_images += n;
                loss_sum += loss;
                step_loss += loss / k;
                if (!isfinite(loss))
                    log_warn("T0003", "step %ld: loss is %f", step, (double)loss);
                if (rank == 0 && b % cfg.log_every == 0)
                    printf("Epoch %d [%ld/%ld] Loss: %.4f\n", epoch, b, batches, (double)loss);
            }
            trn_ddp_finish_backward(&ddp);
            double lr = cfg.lr;
            if (cfg.cosine)
                lr = cfg.lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)ck.lr_t_max));
            trn_resnet_sgd_step(&model, (float)lr, (float)cfg.momentum, (float)cfg.weight_decay);
            step++;
            double secs = (double)(cddp_mono_ns() - ts) * 1e-9;
            log_debug("T0002", "step %ld loss %.9g time %.6f s", step, (double)step_loss, secs);
            progress_report(step, epoch, step_loss, (double)step_images / secs);
            /* --ckpt-every (an epoch's last step is saved as the epoch's end, below) */
            if (cfg.ckpt_every && step % cfg.ckpt_every == 0 && g1 < batches)
                ckpt_save(&ck, &cfg, &model, &sampler, batch, rank, epoch, step,
                          (size_t)g1 * (size_t)batch, dist.comm, &where);
        }
        if (done == 0)
            break;
        double secs = (double)(cddp_mono_ns() - t0) * 1e-9;
        if (rank == 0)
            printf("Epoch %d finished, avg loss: %.4f, time: %.2fs, throughput: %.1f img/s\n",
                   epoch, loss_sum / (double)done, secs, (double)images * world / secs);
        /* A checkpoint at the epoch's end, or where --steps stopped it. */
        bool complete = b0 + done == batches;
        ckpt_save(&ck, &cfg, &model, &sampler, batch, rank, complete ? epoch + 1 : epoch, step,
                  complete ? 0 : (size_t)(b0 + done) * (size_t)batch, dist.comm, &where);
        if (cfg.steps && step >= cfg.steps)
            break;
    }
    where.step = -1;

    /* Every rank holds the same model from here: the parameters were always
     * equal; the running statistics are rank 0's (as DDP broadcasts them). */
    trn_ddp_sync_buffers(&ddp);
    if (cddp_log_enabled(CDDP_LOG_INFO))
        log_info("T6202", "after %ld steps: state checksum %016" PRIx64, step,
                 trn_ddp_state_checksum(&model));
    if (world > 1)
        log_info("T6203",
                 "DDP: %ld steps, %ld bucket allreduces (%.1f MiB), %.3f s (%.2f ms/step) "
                 "waiting for gradients after backward, %ld SyncBN exchanges",
                 ddp.stats.backwards, ddp.stats.allreduces, ddp.stats.bytes / 1048576.0,
                 ddp.stats.wait_s,
                 ddp.stats.backwards ? ddp.stats.wait_s * 1e3 / (double)ddp.stats.backwards : 0.0,
                 ddp.stats.bn_exchanges);

    /* Evaluation on the test split, BN in eval mode, shared among the ranks. */
    if (test) {
        if (test->height != height || test->width != width || test->channels != 3)
            trn_fatal("--eval: test images are %dx%dx%d, training images 3x%dx%d", test->channels,
                      test->height, test->width, height, width);
        float *all = cfg.eval_logits ? trn_calloc(test->len * (size_t)num_classes, 4) : NULL;
        double acc = evaluate(&model, test, batch, x_host, x_dev, labels, all, dist.comm, &where);
        if (rank == 0)
            printf("test accuracy: %.4f\n", acc);
        if (all && rank == 0) {
            struct trn_st_tensor t = {.name = "logits",
                                      .dtype = TRN_ST_F32,
                                      .ndim = 2,
                                      .shape = {test->len, (uint64_t)num_classes},
                                      .data = all};
            if (trn_st_save(cfg.eval_logits, &t, 1, NULL, 0, err, sizeof(err)) != 0) {
                fprintf(stderr, "cddp-train: --eval-logits: %s\n", err);
                rc = CDDP_EXIT_FAILURE; /* released below, after the other ranks are done */
            }
        }
        free(all);
    }

    /* The final weights (--save), as a torchvision state_dict, from rank 0. */
    if (cfg.save && rank == 0 &&
        trn_weights_save(cfg.save, cfg.arch, num_classes, table, model.n_state, err, sizeof(err)) !=
            0) {
        fprintf(stderr, "cddp-train: --save: %s\n", err);
        rc = CDDP_EXIT_FAILURE;
    }
    /* Nobody leaves while another rank may still be reading from it. */
    if (world > 1)
        must_comm(dist.comm, &where, trn_comm_barrier(dist.comm));

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        log_debug("T0004", "peak_rss_kb %ld", ru.ru_maxrss);

    be.ops->free(&be, x_dev);
    free(x_host);
    free(labels);
    trn_ddp_free(&ddp);
    trn_dist_close(&dist);
    release(&ck, table, &sampler, &model, train, test, &be);
    return rc;
}
