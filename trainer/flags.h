/*
 * flags.h: cddp-train's command line, declared once.
 *
 * Every flag is one row of a table (flags.c): its name, the field of
 * struct trn_config it sets, how its value is read and bounded, its
 * default, its help, another flag it needs, and whether every rank of a
 * distributed run must agree on it. The getopt_long table, --help, the
 * parser, the defaults and the flags digest (the line the ranks compare
 * before training, trn_ddp_check_config) are all derived from the table:
 * adding a flag is adding a row (and its field).
 *
 * Messages: a bad flag is reported as one line, "FLAG: why", in err; the
 * caller prefixes "cddp-train: " and exits 2 (docs/trainer.md). Nothing
 * here prints or exits, except trn_flags_usage, which prints; only
 * trn_flags_check_output looks at the filesystem.
 */
#ifndef CDDP_TRAINER_FLAGS_H
#define CDDP_TRAINER_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "trainer/fault.h"    /* struct trn_fault (--fault) */
#include "trainer/schedule.h" /* enum trn_lr_kind (--lr-schedule) */

/* What the flags say. A zero means "not given" where a field says so. */
struct trn_config {
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
    int lr_schedule; /* enum trn_lr_kind */
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
    int backend;     /* enum trn_comm_req (device.h): auto, gloo, nccl */
    int grad_reduce; /* enum trn_grad_reduce (device.h): fp32, bf16 */
    /* device (docs/trainer.md, "Devices") */
    int device;              /* enum trn_device_req; 0: not given (CDDP_DEVICE, else auto) */
    int amp;                 /* enum trn_amp */
    int tf32;                /* enum trn_tf32 */
    long cudnn_workspace_mb; /* cuDNN workspace bound */
    bool deterministic;      /* deterministic convolution algorithms */
    bool cuda_graphs;        /* capture the step once per shape and replay it (CUDA) */
    long prefetch;           /* batches a loader thread reads ahead; 0: none; -1
                                (TRN_PREFETCH_AUTO, the default): 2 on cuda, 0 on the cpu */
};

#define TRN_PREFETCH_AUTO (-1L)

/* --amp: mixed precision (CUDA only). */
enum trn_amp { TRN_AMP_OFF, TRN_AMP_BF16, TRN_AMP_FP16 };
extern const char *const trn_amp_names[]; /* "off", "bf16", "fp16", NULL */
/* --tf32: where TF32 tensor cores may round fp32 inputs (PyTorch's
 * allow_tf32 flags: convolutions on, matmul off by default). */
enum trn_tf32 { TRN_TF32_CONV, TRN_TF32_ALL, TRN_TF32_OFF };
extern const char *const trn_tf32_names[]; /* "conv", "all", "off", NULL */

enum trn_flag_kind {
    TRN_FLAG_LONG,   /* long, an integer in [min, max] */
    TRN_FLAG_DOUBLE, /* double, a number in [min, max] */
    TRN_FLAG_STRING, /* const char *, argv's own string; `check` may refuse it */
    TRN_FLAG_CHOICE, /* int, the index of the value in `choices` */
    TRN_FLAG_ON,     /* bool, no value: the flag sets it (default false) */
    TRN_FLAG_OFF,    /* bool, no value: the flag clears it (default true) */
    TRN_FLAG_PARSED, /* any field, filled by `parse` */
};

/* Whether the ranks of one run must agree on a flag, and how the flags
 * digest compares it. */
enum trn_flag_agree {
    TRN_AGREE_NO,     /* may differ: paths, threads, timeouts, what rank 0 alone does */
    TRN_AGREE_VALUE,  /* the value is in the digest */
    TRN_AGREE_GIVEN,  /* whether it is given is in the digest (a path: where may differ) */
    TRN_AGREE_EFFECT, /* must agree through what it makes (the dataset's size and shape,
                         the model's classes), which the trainer adds to the digest */
};

union trn_flag_value {
    long l;
    double d;
    const char *s;
    int choice;
};

struct trn_flag {
    const char *name; /* without the leading "--" */
    const char *arg;  /* the value's name in --help ("N"); NULL: takes no value */
    enum trn_flag_kind kind;
    size_t offset;              /* of the field in struct trn_config */
    double min, max;            /* LONG, DOUBLE (the LONG bounds are exact in a double) */
    union trn_flag_value def;   /* LONG, DOUBLE, STRING, CHOICE */
    const char *const *choices; /* CHOICE: the names, NULL-ended */
    /* STRING: refuses a value (0, or nonzero with err); PARSED: reads it. */
    int (*check)(const char *value, void *field, char *err, size_t errlen);
    const char *needs; /* the flag this one needs, without "--"; NULL: none */
    enum trn_flag_agree agree;
    const char *group; /* the --help section it is listed under */
    const char *help;  /* '\n' continues on an indented line */
    /* In --help after the help, in parentheses: NULL: the default; "": nothing. */
    const char *shown;
};

/* The table, in --help order; *n its length. */
const struct trn_flag *trn_flags_table(size_t *n);

/* The defaults: every row's default in its field. */
void trn_flags_defaults(struct trn_config *c);

enum {
    TRN_FLAGS_RUN = 0,  /* parsed: train */
    TRN_FLAGS_HELP,     /* --help: print trn_flags_usage, exit 0 */
    TRN_FLAGS_VERSION,  /* --version */
    TRN_FLAGS_BAD = -1, /* err says which flag and why */
};

/*
 * Sets *c to the defaults, then to argv[1..argc): every flag, then the
 * flags that need another (--eval-logits needs --eval, ...), then the
 * checkpoint file's relations to --save and --eval-logits. Stops at the
 * first problem. String fields point into argv. Uses getopt_long (resets
 * optind). Returns TRN_FLAGS_RUN, _HELP, _VERSION or _BAD.
 */
int trn_flags_parse(int argc, char **argv, struct trn_config *c, char *err, size_t errlen);

/*
 * Refuses an output path (--checkpoint, --save, --eval-logits) before
 * anything is done, rather than at its first write, an epoch or a whole
 * run later: its directory must exist, and the path must not be something
 * other than a file. 0, or -1 with err ("FLAG: why").
 */
int trn_flags_check_output(const char *flag, const char *path, char *err, size_t errlen);

/* Prints --help. */
void trn_flags_usage(FILE *f);

/*
 * The flags every rank must agree on (TRN_AGREE_VALUE, TRN_AGREE_GIVEN), as
 * a line of flags in table order ("--arch resnet18 --data synthetic
 * --batch-size 4 ..."), for trn_ddp_check_config to compare. Returns what
 * snprintf returns.
 */
int trn_flags_digest(const struct trn_config *c, char *buf, size_t len);

#endif
