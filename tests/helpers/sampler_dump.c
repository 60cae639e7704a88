/*
 * cddp-sampler-dump: prints trainer/data/sampler.c's indices for the
 * compatibility test against torch.utils.data.DistributedSampler
 * (tests/compat/test_sampler_torch.py). A test helper, not installed.
 *
 * stdin: one case per line, "len world rank shuffle drop_last seed epoch";
 * stdout: one line per case, the rank's indices separated by spaces, or
 * "error <code>" when the sampler refuses the arguments.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "trainer/data/sampler.h"

int main(void)
{
    char line[256];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        unsigned long long len, seed;
        int world, rank, shuffle, drop_last, epoch;
        if (sscanf(line, "%llu %d %d %d %d %llu %d", &len, &world, &rank, &shuffle, &drop_last,
                   &seed, &epoch) != 7) {
            fprintf(stderr, "cddp-sampler-dump: bad line: %s", line);
            return 2;
        }
        struct trn_sampler s;
        int rc = trn_sampler_init(&s, (size_t)len, world, rank, shuffle != 0, drop_last != 0,
                                  (uint64_t)seed);
        if (rc < 0) {
            printf("error %d\n", rc);
            continue;
        }
        trn_sampler_set_epoch(&s, epoch);
        for (size_t i = 0; i < s.num_samples; i++)
            printf(i ? " %" PRIu32 : "%" PRIu32, s.indices[i]);
        putchar('\n');
        trn_sampler_free(&s);
    }
    return 0;
}
