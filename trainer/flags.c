/* flags.c: cddp-train's flags table and what follows from it; see flags.h. */
#include "trainer/flags.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "common/strutil.h"         /* cddp_parse_long, cddp_parse_double, cddp_strlcpy */
#include "trainer/buckets.h"        /* TRN_DEFAULT_BUCKET_CAP_MB */
#include "trainer/comm/bootstrap.h" /* TRN_DEFAULT_INIT_TIMEOUT_S */
#include "trainer/comm/comm.h"      /* TRN_COMM_DEFAULT_TIMEOUT_S */
#include "trainer/device.h"         /* trn_device_parse */
#include "trainer/resnet.h"         /* trn_arch_find */

static int check_arch(const char *v, void *field, char *err, size_t errlen)
{
    (void)field;
    if (trn_arch_find(v))
        return 0;
    snprintf(err, errlen, "--arch: unknown architecture '%s' (one of %s)", v, trn_arch_names());
    return -1;
}

static int parse_fault(const char *v, void *field, char *err, size_t errlen)
{
    return trn_fault_parse(v, field, err, errlen); /* err names --fault */
}

static int parse_device(const char *v, void *field, char *err, size_t errlen)
{
    return trn_device_parse("--device", v, field, err, errlen);
}

const char *const trn_amp_names[] = {"off", "bf16", "fp16", NULL};
const char *const trn_tf32_names[] = {"conv", "all", "off", NULL};

#define AT(field) offsetof(struct trn_config, field)
#define MODEL "model and optimiser"
#define DATA "data"
#define TRAINING "training"
#define CKPT "checkpoints"
#define DEVICE "device"
#define DIST "distributed (torchrun's environment; see docs/distributed.md)"

/* The seed script's defaults (ddp_train.py): ResNet-152, batch 64, 100
 * epochs, 50,000 random 224x224 images, SGD lr 0.01, momentum 0.9,
 * weight decay 1e-4. */
static const struct trn_flag table[] = {
    {"arch", "NAME", TRN_FLAG_STRING, AT(arch), .def.s = "resnet152", .check = check_arch,
     .agree = TRN_AGREE_VALUE, .group = MODEL,
     .help = "resnet18, resnet34, resnet50, resnet101, resnet152"},
    {"num-classes", "N", TRN_FLAG_LONG, AT(num_classes), 1, 1000000, .agree = TRN_AGREE_EFFECT,
     .group = MODEL, .help = "outputs of the fc layer", .shown = "the dataset's"},
    {"zero-init-residual", NULL, TRN_FLAG_ON, AT(zero_init_residual), .group = MODEL,
     .help = "zero the last BN weight of every block (torchvision's option)"},
    {"init", "PATH", TRN_FLAG_STRING, AT(init), .group = MODEL,
     .help = "start from a torchvision state_dict (.safetensors)"},
    {"save", "PATH", TRN_FLAG_STRING, AT(save), .group = MODEL,
     .help = "write the final state_dict there (.safetensors)"},
    {"seed", "N", TRN_FLAG_LONG, AT(seed), 0, (double)(1L << 62), .agree = TRN_AGREE_VALUE,
     .group = MODEL, .help = "seeds initialisation, data order and synthetic data"},
    {"lr", "X", TRN_FLAG_DOUBLE, AT(lr), 0, 1e6, .def.d = 0.01, .agree = TRN_AGREE_VALUE,
     .group = MODEL, .help = "learning rate"},
    {"momentum", "X", TRN_FLAG_DOUBLE, AT(momentum), 0, 1, .def.d = 0.9, .agree = TRN_AGREE_VALUE,
     .group = MODEL, .help = "SGD momentum"},
    {"weight-decay", "X", TRN_FLAG_DOUBLE, AT(weight_decay), 0, 1e6, .def.d = 1e-4,
     .agree = TRN_AGREE_VALUE, .group = MODEL, .help = "SGD weight decay", .shown = "1e-4"},
    {"lr-schedule", "S", TRN_FLAG_CHOICE, AT(lr_schedule), .def.choice = TRN_LR_CONSTANT,
     .choices = trn_lr_kind_names, .agree = TRN_AGREE_VALUE, .group = MODEL,
     .help = "constant, or cosine: torch's CosineAnnealingLR from\n"
             "--lr to 0 over all steps, stepped every step"},

    {"data", "SPEC", TRN_FLAG_STRING, AT(data), .def.s = "synthetic", .agree = TRN_AGREE_VALUE,
     .group = DATA, .help = "synthetic | idx[:DIR] | folder:DIR"},
    {"num-samples", "N", TRN_FLAG_LONG, AT(num_samples), 1, (double)(1L << 31), .def.l = 50000,
     .agree = TRN_AGREE_EFFECT, .group = DATA, .help = "synthetic dataset size"},
    {"image-size", "N", TRN_FLAG_LONG, AT(image_size), 1, 4096, .def.l = 224,
     .agree = TRN_AGREE_EFFECT, .group = DATA, .help = "synthetic and folder image side"},
    {"limit", "N", TRN_FLAG_LONG, AT(limit), 1, (double)(1L << 31), .agree = TRN_AGREE_EFFECT,
     .group = DATA, .help = "use only the first N training images", .shown = ""},
    {"no-shuffle", NULL, TRN_FLAG_OFF, AT(shuffle), .agree = TRN_AGREE_VALUE, .group = DATA,
     .help = "keep the dataset's order"},
    {"prefetch", "N", TRN_FLAG_LONG, AT(prefetch), -1, 64, .def.l = TRN_PREFETCH_AUTO,
     .group = DATA,
     .help = "batches a loader thread reads ahead of the step (pinned,\n"
             "uploaded on a copy stream on cuda); 0: read each in the\n"
             "step; -1: 2 on cuda, 0 on cpu",
     .shown = "-1"},

    {"batch-size", "N", TRN_FLAG_LONG, AT(batch_size), 1, 65536, .def.l = 64,
     .agree = TRN_AGREE_VALUE, .group = TRAINING, .help = "images per step"},
    {"epochs", "N", TRN_FLAG_LONG, AT(epochs), 1, 1000000, .def.l = 100, .agree = TRN_AGREE_VALUE,
     .group = TRAINING, .help = "passes over the training split"},
    {"steps", "N", TRN_FLAG_LONG, AT(steps), 1, (double)(1L << 40), .agree = TRN_AGREE_VALUE,
     .group = TRAINING, .help = "stop after N steps in all", .shown = "no limit"},
    {"log-every", "N", TRN_FLAG_LONG, AT(log_every), 1, (double)(1L << 40), .def.l = 50,
     .group = TRAINING, .help = "print the loss every N batches"},
    {"threads", "N", TRN_FLAG_LONG, AT(threads), 1, 4096, .group = TRAINING, .help = "CPU threads",
     .shown = "OMP_NUM_THREADS, else all cores"},
    {"eval", NULL, TRN_FLAG_ON, AT(eval), .agree = TRN_AGREE_VALUE, .group = TRAINING,
     .help = "report accuracy on the test split at the end"},
    {"eval-limit", "N", TRN_FLAG_LONG, AT(eval_limit), 1, (double)(1L << 31), .needs = "eval",
     .agree = TRN_AGREE_VALUE, .group = TRAINING,
     .help = "evaluate on the first N test images only", .shown = ""},
    {"eval-logits", "PATH", TRN_FLAG_STRING, AT(eval_logits), .needs = "eval",
     .agree = TRN_AGREE_GIVEN, .group = TRAINING,
     .help = "with --eval, also write the test logits (N, classes) to PATH"},

    {"checkpoint", "PATH", TRN_FLAG_STRING, AT(checkpoint), .agree = TRN_AGREE_GIVEN, .group = CKPT,
     .help = "resume from PATH if it exists (from PATH.prev, the one before,\n"
             "if PATH is damaged); write it at the end of every epoch, every\n"
             "--ckpt-every steps and when training stops"},
    {"ckpt-every", "N", TRN_FLAG_LONG, AT(ckpt_every), 1, (double)(1L << 40), .needs = "checkpoint",
     .agree = TRN_AGREE_VALUE, .group = CKPT, .help = "also write the checkpoint every N steps",
     .shown = ""},
    {"no-resume", NULL, TRN_FLAG_ON, AT(no_resume), .needs = "checkpoint", .group = CKPT,
     .help = "start over even if PATH exists (overwriting it)"},

    {"accum-steps", "K", TRN_FLAG_LONG, AT(accum_steps), 1, 65536, .def.l = 1,
     .agree = TRN_AGREE_VALUE, .group = DIST,
     .help = "average gradients over K micro-batches per step"},
    {"sync-bn", NULL, TRN_FLAG_ON, AT(sync_bn), .agree = TRN_AGREE_VALUE, .group = DIST,
     .help = "batch-norm statistics over all ranks (SyncBatchNorm)"},
    {"drop-last", NULL, TRN_FLAG_ON, AT(drop_last), .agree = TRN_AGREE_VALUE, .group = DIST,
     .help = "drop the tail that does not divide among the ranks"},
    {"bucket-cap-mb", "X", TRN_FLAG_DOUBLE, AT(bucket_cap_mb), 1e-3, 1e6,
     .def.d = TRN_DEFAULT_BUCKET_CAP_MB, .agree = TRN_AGREE_VALUE, .group = DIST,
     .help = "DDP gradient bucket size in MiB"},
    {"no-overlap", NULL, TRN_FLAG_OFF, AT(overlap), .agree = TRN_AGREE_VALUE, .group = DIST,
     .help = "allreduce the gradients after backward, not during it"},
    {"collective-timeout", "S", TRN_FLAG_DOUBLE, AT(collective_timeout), 0.1, 1e7,
     .def.d = TRN_COMM_DEFAULT_TIMEOUT_S, .group = DIST,
     .help = "bound on every collective, then exit 75"},
    {"init-timeout", "S", TRN_FLAG_DOUBLE, AT(init_timeout), 0.1, 1e7,
     .def.d = TRN_DEFAULT_INIT_TIMEOUT_S, .group = DIST,
     .help = "bound on connecting to the other ranks"},
    {"backend", "B", TRN_FLAG_CHOICE, AT(backend), .def.choice = TRN_COMM_REQ_AUTO,
     .choices = trn_comm_req_names, .agree = TRN_AGREE_VALUE, .group = DIST,
     .help = "the communicator: auto (nccl on cuda, gloo on the cpu),\n"
             "gloo or nccl"},
    {"grad-reduce-dtype", "T", TRN_FLAG_CHOICE, AT(grad_reduce), .def.choice = TRN_GRAD_REDUCE_FP32,
     .choices = trn_grad_reduce_names, .agree = TRN_AGREE_VALUE, .group = DIST,
     .help = "what the gradient allreduce carries: fp32, or bf16 (DDP's\n"
             "bf16_compress_hook; cuda and nccl only)"},
    {"fault", "SPEC", TRN_FLAG_PARSED, AT(fault), .check = parse_fault, .group = DIST,
     .help = "inject a fault: crash@step=N[,rank=R][,every],\n"
             "crash@reform[,rank=R] (while re-forming in place),\n"
             "hang@step=N[,rank=R][,every], slow@step=N,ms=M[,...],\n"
             "(rank=R-S: ranks R to S),\n"
             "nocma@rank=R (re-forming: no read of a peer's memory)",
     .shown = ""},

    {"device", "D", TRN_FLAG_PARSED, AT(device), .check = parse_device, .group = DEVICE,
     .help = "auto, cpu, cuda (GPU LOCAL_RANK) or cuda:N (GPU N, whatever\n"
             "LOCAL_RANK); auto: cuda when this build has it and a GPU is\n"
             "visible, else cpu",
     .shown = "CDDP_DEVICE, else auto"},
    {"amp", "P", TRN_FLAG_CHOICE, AT(amp), .def.choice = TRN_AMP_OFF, .choices = trn_amp_names,
     .agree = TRN_AGREE_VALUE, .group = DEVICE,
     .help = "mixed precision on cuda: off, bf16, or fp16 with\n"
             "GradScaler's loss scaling"},
    {"tf32", "S", TRN_FLAG_CHOICE, AT(tf32), .def.choice = TRN_TF32_CONV, .choices = trn_tf32_names,
     .agree = TRN_AGREE_VALUE, .group = DEVICE,
     .help = "TF32 on cuda: conv (PyTorch's default), all (also fc), off"},
    {"cudnn-workspace-mb", "N", TRN_FLAG_LONG, AT(cudnn_workspace_mb), 1, 1 << 20, .def.l = 256,
     .group = DEVICE, .help = "bound on cuDNN's convolution workspace, MiB"},
    {"deterministic", NULL, TRN_FLAG_ON, AT(deterministic), .agree = TRN_AGREE_VALUE,
     .group = DEVICE, .help = "deterministic cuDNN convolution algorithms only"},
    {"cuda-graphs", NULL, TRN_FLAG_ON, AT(cuda_graphs), .agree = TRN_AGREE_VALUE, .group = DEVICE,
     .help = "capture the training step into a CUDA graph after warm-up,\n"
             "once per batch shape, and replay it (one rank, no --sync-bn)"},
};

#define N_FLAGS (sizeof(table) / sizeof(table[0]))

const struct trn_flag *trn_flags_table(size_t *n)
{
    *n = N_FLAGS;
    return table;
}

static void *field_of(struct trn_config *c, const struct trn_flag *f)
{
    return (char *)c + f->offset;
}

static const void *cfield_of(const struct trn_config *c, const struct trn_flag *f)
{
    return (const char *)c + f->offset;
}

void trn_flags_defaults(struct trn_config *c)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < N_FLAGS; i++) {
        const struct trn_flag *f = &table[i];
        void *p = field_of(c, f);
        switch (f->kind) {
        case TRN_FLAG_LONG:
            *(long *)p = f->def.l;
            break;
        case TRN_FLAG_DOUBLE:
            *(double *)p = f->def.d;
            break;
        case TRN_FLAG_STRING:
            *(const char **)p = f->def.s;
            break;
        case TRN_FLAG_CHOICE:
            *(int *)p = f->def.choice;
            break;
        case TRN_FLAG_ON:
            *(bool *)p = false;
            break;
        case TRN_FLAG_OFF:
            *(bool *)p = true;
            break;
        case TRN_FLAG_PARSED:
            break; /* zero: not given */
        }
    }
}

/* Whether f's field differs from its default: for every flag in the
 * table, whether it was given (the ranges exclude the defaults where 0
 * means "not given"). */
static bool given(const struct trn_config *c, const struct trn_flag *f)
{
    const void *p = cfield_of(c, f);
    switch (f->kind) {
    case TRN_FLAG_LONG:
        return *(const long *)p != f->def.l;
    case TRN_FLAG_DOUBLE:
        return *(const double *)p != f->def.d;
    case TRN_FLAG_STRING: {
        const char *s = *(const char *const *)p;
        return s != f->def.s && (s == NULL || f->def.s == NULL || strcmp(s, f->def.s) != 0);
    }
    case TRN_FLAG_CHOICE:
        return *(const int *)p != f->def.choice;
    case TRN_FLAG_ON:
        return *(const bool *)p;
    case TRN_FLAG_OFF:
        return !*(const bool *)p;
    case TRN_FLAG_PARSED:
        break;
    }
    return false;
}

static const struct trn_flag *find(const char *name)
{
    for (size_t i = 0; i < N_FLAGS; i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

static int bad(char *err, size_t errlen, const char *flag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(char *err, size_t errlen, const char *flag, const char *fmt, ...)
{
    int n = snprintf(err, errlen, "%s: ", flag);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < errlen)
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return TRN_FLAGS_BAD;
}

/* Reads one flag's value into its field. */
static int set(struct trn_config *c, const struct trn_flag *f, const char *v, char *err,
               size_t errlen)
{
    char flag[64];
    snprintf(flag, sizeof(flag), "--%s", f->name);
    void *p = field_of(c, f);
    switch (f->kind) {
    case TRN_FLAG_LONG: {
        long min = (long)f->min, max = (long)f->max;
        if (cddp_parse_long(v, min, max, p) != 0)
            return bad(err, errlen, flag, "expected an integer in [%ld, %ld], got '%s'", min, max,
                       v);
        return 0;
    }
    case TRN_FLAG_DOUBLE:
        if (cddp_parse_double(v, f->min, f->max, p) != 0)
            return bad(err, errlen, flag, "expected a number in [%g, %g], got '%s'", f->min, f->max,
                       v);
        return 0;
    case TRN_FLAG_STRING:
        if (f->check && f->check(v, p, err, errlen) != 0)
            return TRN_FLAGS_BAD;
        *(const char **)p = v;
        return 0;
    case TRN_FLAG_CHOICE: {
        for (int i = 0; f->choices[i]; i++)
            if (strcmp(v, f->choices[i]) == 0) {
                *(int *)p = i;
                return 0;
            }
        char names[256] = "";
        for (int i = 0; f->choices[i]; i++) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof(names) - used, "%s%s",
                     i == 0              ? ""
                     : f->choices[i + 1] ? ", "
                                         : " or ",
                     f->choices[i]);
        }
        return bad(err, errlen, flag, "'%s' is not %s", v, names);
    }
    case TRN_FLAG_ON:
        *(bool *)p = true;
        return 0;
    case TRN_FLAG_OFF:
        *(bool *)p = false;
        return 0;
    case TRN_FLAG_PARSED:
        return f->check(v, p, err, errlen) != 0 ? TRN_FLAGS_BAD : 0;
    }
    return 0;
}

enum { OPT_HELP = 1, OPT_VERSION = 2, OPT_FLAG = 256 /* + the row */ };

int trn_flags_parse(int argc, char **argv, struct trn_config *c, char *err, size_t errlen)
{
    trn_flags_defaults(c);
    struct option opts[N_FLAGS + 3];
    for (size_t i = 0; i < N_FLAGS; i++)
        opts[i] = (struct option){table[i].name, table[i].arg ? required_argument : no_argument,
                                  NULL, OPT_FLAG + (int)i};
    opts[N_FLAGS] = (struct option){"help", no_argument, NULL, OPT_HELP};
    opts[N_FLAGS + 1] = (struct option){"version", no_argument, NULL, OPT_VERSION};
    opts[N_FLAGS + 2] = (struct option){NULL, 0, NULL, 0};

    optind = 0; /* a fresh scan (glibc: also resets its internal state) */
    opterr = 0; /* our own one-line messages */
    for (;;) {
        int prev = optind ? optind : 1;
        /* "+": stop at the first non-option (no reordering); ":": report a missing value */
        int opt = getopt_long(argc, argv, "+:", opts, NULL);
        if (opt == -1)
            break;
        if (opt == OPT_HELP)
            return TRN_FLAGS_HELP;
        if (opt == OPT_VERSION)
            return TRN_FLAGS_VERSION;
        if (opt < OPT_FLAG) {
            char flag[64]; /* the option as typed, without "=value" */
            cddp_strlcpy(flag, argv[prev], sizeof(flag));
            flag[strcspn(flag, "=")] = '\0';
            return opt == ':' ? bad(err, errlen, flag, "needs a value")
                              : bad(err, errlen, flag, "unknown option (see --help)");
        }
        if (set(c, &table[opt - OPT_FLAG], optarg, err, errlen) != 0)
            return TRN_FLAGS_BAD;
    }
    if (optind < argc)
        return bad(err, errlen, argv[optind],
                   "unexpected argument (options start with --; see --help)");
    for (size_t i = 0; i < N_FLAGS; i++) {
        const struct trn_flag *f = &table[i];
        if (f->needs && given(c, f) && !given(c, find(f->needs))) {
            char flag[64];
            snprintf(flag, sizeof(flag), "--%s", f->name);
            return bad(err, errlen, flag, "needs --%s", f->needs);
        }
    }
    if (c->checkpoint) {
        if (c->checkpoint[0] == '\0')
            return bad(err, errlen, "--checkpoint", "needs a file name");
        if ((c->save && strcmp(c->save, c->checkpoint) == 0) ||
            (c->eval_logits && strcmp(c->eval_logits, c->checkpoint) == 0))
            return bad(err, errlen, "--checkpoint", "'%s' is also the --save or --eval-logits file",
                       c->checkpoint);
    }
    return TRN_FLAGS_RUN;
}

int trn_flags_check_output(const char *flag, const char *path, char *err, size_t errlen)
{
    char dir[4096];
    cddp_strlcpy(dir, path, sizeof(dir));
    char *slash = strrchr(dir, '/');
    if (!slash)
        cddp_strlcpy(dir, ".", sizeof(dir));
    else
        slash[slash == dir] = '\0'; /* "/ckpt" keeps "/" */
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return bad(err, errlen, flag, "directory '%s' does not exist", dir);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return bad(err, errlen, flag, "'%s' exists and is not a file", path);
    return 0;
}

/* The default as --help shows it, or "" for none. */
static void shown_default(const struct trn_flag *f, char *buf, size_t len)
{
    buf[0] = '\0';
    if (f->shown) {
        cddp_strlcpy(buf, f->shown, len);
        return;
    }
    switch (f->kind) {
    case TRN_FLAG_LONG:
        snprintf(buf, len, "%ld", f->def.l);
        break;
    case TRN_FLAG_DOUBLE:
        snprintf(buf, len, "%g", f->def.d);
        break;
    case TRN_FLAG_STRING:
        if (f->def.s)
            cddp_strlcpy(buf, f->def.s, len);
        break;
    case TRN_FLAG_CHOICE:
        cddp_strlcpy(buf, f->choices[f->def.choice], len);
        break;
    case TRN_FLAG_ON:
    case TRN_FLAG_OFF:
    case TRN_FLAG_PARSED:
        break;
    }
}

#define HELP_COLUMN 26

void trn_flags_usage(FILE *f)
{
    fprintf(f, "usage: cddp-train [options]\n"
               "\n"
               "Trains a torchvision ResNet with SGD on the CPU or a CUDA GPU, as the seed's\n"
               "ddp_train.py.\n"
               "\n");
    const char *group = NULL;
    for (size_t i = 0; i < N_FLAGS; i++) {
        const struct trn_flag *t = &table[i];
        if (group == NULL || strcmp(group, t->group) != 0)
            fprintf(f, "%s:\n", group = t->group);
        char head[64];
        snprintf(head, sizeof(head), "  --%s%s%s", t->name, t->arg ? " " : "",
                 t->arg ? t->arg : "");
        fprintf(f, "%-*s", HELP_COLUMN, head);
        if (strlen(head) >= HELP_COLUMN)
            fprintf(f, "\n%*s", HELP_COLUMN, "");
        for (const char *h = t->help; *h; h++) {
            fputc(*h, f);
            if (*h == '\n')
                fprintf(f, "%*s", HELP_COLUMN, "");
        }
        char def[64];
        shown_default(t, def, sizeof(def));
        fprintf(f, def[0] ? " (%s)\n" : "\n", def);
    }
    fprintf(f, "  --help, --version\n");
}

/* Appends to buf[0..len) at *total (what snprintf would have written so far). */
static void append(char *buf, size_t len, int *total, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, int *total, const char *fmt, ...)
{
    size_t used = (size_t)*total < len ? (size_t)*total : len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
    if (n > 0)
        *total += n;
}

int trn_flags_digest(const struct trn_config *c, char *buf, size_t len)
{
    int total = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < N_FLAGS; i++) {
        const struct trn_flag *f = &table[i];
        if (f->agree != TRN_AGREE_VALUE && f->agree != TRN_AGREE_GIVEN)
            continue;
        const void *p = cfield_of(c, f);
        /* A flag without a value, or a path: the flag alone, when given. */
        if (f->agree == TRN_AGREE_GIVEN || f->kind == TRN_FLAG_ON || f->kind == TRN_FLAG_OFF) {
            if (given(c, f))
                append(buf, len, &total, "%s--%s", total ? " " : "", f->name);
            continue;
        }
        append(buf, len, &total, "%s--%s ", total ? " " : "", f->name);
        switch (f->kind) {
        case TRN_FLAG_LONG:
            append(buf, len, &total, "%ld", *(const long *)p);
            break;
        case TRN_FLAG_DOUBLE:
            append(buf, len, &total, "%g", *(const double *)p);
            break;
        case TRN_FLAG_STRING: {
            const char *s = *(const char *const *)p;
            append(buf, len, &total, "%s", s ? s : "(none)");
            break;
        }
        case TRN_FLAG_CHOICE:
            append(buf, len, &total, "%s", f->choices[*(const int *)p]);
            break;
        case TRN_FLAG_ON:
        case TRN_FLAG_OFF:
        case TRN_FLAG_PARSED:
            break;
        }
    }
    return total;
}
