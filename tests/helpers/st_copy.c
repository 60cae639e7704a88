/*
 * cddp-st-copy: a test helper. `cddp-st-copy IN OUT` reads every tensor of
 * IN with trainer/safetensors.c and writes them, with IN's metadata, in IN's
 * order, to OUT (atomically); `cddp-st-copy IN` only validates IN and prints
 * one line per tensor. Errors: one line on stderr, exit 1; usage: exit 2.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/exitcodes.h"
#include "trainer/safetensors.h"

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: cddp-st-copy IN [OUT]\n");
        return CDDP_EXIT_USAGE;
    }
    char err[1024];
    struct trn_st_file f;
    if (trn_st_open(argv[1], &f, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-st-copy: %s\n", err);
        return CDDP_EXIT_FAILURE;
    }
    int status = CDDP_EXIT_OK;
    struct trn_st_tensor *t = calloc(f.n_tensors ? f.n_tensors : 1, sizeof(*t));
    for (size_t i = 0; i < f.n_tensors && t != NULL; i++) {
        t[i] = f.tensors[i];
        void *buf = malloc(t[i].nbytes ? (size_t)t[i].nbytes : 1);
        t[i].data = buf;
        if (buf == NULL || trn_st_read(&f, &f.tensors[i], buf, err, sizeof(err)) != 0) {
            fprintf(stderr, "cddp-st-copy: %s\n", buf ? err : "out of memory");
            status = CDDP_EXIT_FAILURE;
            break;
        }
        if (argc == 2)
            printf("%s %s %d %llu\n", t[i].name, trn_st_dtype_name(t[i].dtype), t[i].ndim,
                   (unsigned long long)t[i].nbytes);
    }
    if (t == NULL) {
        fprintf(stderr, "cddp-st-copy: out of memory\n");
        status = CDDP_EXIT_FAILURE;
    }
    if (status == CDDP_EXIT_OK && argc == 3 &&
        trn_st_save(argv[2], t, f.n_tensors, f.meta, f.n_meta, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-st-copy: %s\n", err);
        status = CDDP_EXIT_FAILURE;
    }
    for (size_t i = 0; t != NULL && i < f.n_tensors; i++)
        free((void *)t[i].data);
    free(t);
    trn_st_close(&f);
    return status;
}
