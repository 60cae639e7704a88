/*
 * loss.c: softmax cross-entropy, torch.nn.CrossEntropyLoss() with its
 * defaults (mean over the batch, no weights, no label smoothing).
 *
 * Per row: loss_i = logsumexp(logits_i) - logits_i[label_i], computed with
 * the row maximum subtracted and the sum of exponentials in double. The
 * softmax is kept for backward, where dlogits = (softmax - onehot) / n,
 * times a scale (1/K under gradient accumulation over K micro-batches).
 */
#include <math.h>

#include "trainer/ops/cpu/cpu.h"

float cpu_xent_forward(struct trn_backend *be, int n, int k, const float *logits,
                       const int32_t *labels, float *probs)
{
    (void)be;
    double total = 0;
    for (int i = 0; i < n; i++) {
        const float *l = logits + (size_t)i * k;
        float *p = probs + (size_t)i * k;
        float mx = l[0];
        for (int j = 1; j < k; j++)
            mx = l[j] > mx ? l[j] : mx;
        double s = 0;
        for (int j = 0; j < k; j++)
            s += exp((double)l[j] - mx);
        double lse = mx + log(s);
        for (int j = 0; j < k; j++)
            p[j] = (float)exp((double)l[j] - lse);
        total += lse - l[labels[i]];
    }
    return (float)(total / n);
}

void cpu_xent_backward(struct trn_backend *be, int n, int k, const float *probs,
                       const int32_t *labels, float scale, float *dlogits)
{
    (void)be;
    float f = scale / (float)n;
    for (int i = 0; i < n; i++) {
        const float *p = probs + (size_t)i * k;
        float *d = dlogits + (size_t)i * k;
        for (int j = 0; j < k; j++)
            d[j] = (p[j] - (j == labels[i] ? 1.0f : 0.0f)) * f;
    }
}
