/* The experts of a mixture-of-experts layer for a small step on the CPU, reading only the
 * experts the step's tokens chose; linked with the other CPU kernels into one library by
 * kernels/cpu.py, called through kernels/cpu_moe.py.
 *
 * Why: a decode step of B rows with top-k routing touches at most B * k of the E experts. The
 * torch path (minicb/kernels/fused_moe_reference.py) runs each touched expert as about eight
 * torch operations (index, two products, chunk, SiLU, multiply, scale, scatter), each a few
 * microseconds of dispatch around a product of a handful of rows: at one row and 8 experts a
 * layer that is some 60 dispatches for a few hundred kilobytes of weights. Here the whole
 * grouped product is one call, with the threads meeting at a barrier between the stages.
 *
 * The input comes already grouped by expert (align_by_expert, vLLM's moe_align_block_size with
 * blocks of one row): `sorted_pairs` lists the (token, slot) pairs, pair = token * top_k + slot,
 * expert 0's first, then expert 1's, ...; counts[e] says how many are expert e's. For each
 * expert with rows, and only those:
 *   xs = the rows of x its pairs name ; gu = xs Wgu_e^T ; act = silu(g) * u ; ys = act Wd_e^T
 *   out[pair] = ys[row] * weights[pair]
 * Each product splits its weight rows among the threads (cpu_linear.c): each weight is read once
 * for all of the expert's rows, and an expert no token chose is never read. Weights and
 * activations are float32 (an MoE model is not quantized: minicb/model/loader.py refuses it). Pairs routed to an
 * expert this rank does not hold (expert parallelism: experts first_expert ..
 * first_expert + local_experts - 1 are here) stay zero.
 *
 * The weighted sum of a token's k outputs is not done here: the caller sums out's slots in
 * ascending expert id (fused_moe_reference.combine), the one accumulation order every MoE path
 * shares. Within a product the sums run in cpu_linear.c's order, not torch's, so out agrees with
 * the torch path to about 1e-6 relative, not bit for bit; each output is summed by one thread,
 * so the result does not depend on the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

/* 0, -1 (no memory) or -2 (counts that do not add up to the pairs, or a pair out of range) */
int minicb_moe_experts(
    const float *x,              /* [m, hidden] */
    const float *w_gate_up,      /* [local_experts, 2 inter, hidden] */
    const float *w_down,         /* [local_experts, hidden, inter] */
    const float *weights,        /* [m * top_k]: each pair's routing weight */
    const int64_t *sorted_pairs, /* [m * top_k]: the pairs grouped by expert */
    const int64_t *counts,       /* [num_experts]: pairs per expert */
    float *out,                  /* [m * top_k, hidden]: each pair's weighted output */
    int64_t m, int64_t top_k, int64_t hidden, int64_t inter, int64_t num_experts,
    int64_t first_expert, int64_t local_experts)
{
    const int64_t pairs = m * top_k;
    int64_t total = 0, most = 0;
    for (int64_t e = 0; e < num_experts; e++) {
        if (counts[e] < 0) return -2;
        total += counts[e];
        if (counts[e] > most) most = counts[e];
    }
    if (total != pairs) return -2;
    for (int64_t p = 0; p < pairs; p++)
        if (sorted_pairs[p] < 0 || sorted_pairs[p] >= pairs) return -2;
    memset(out, 0, (size_t)(pairs * hidden) * sizeof(float));
    if (most == 0) return 0;
    /* one expert's rows at a time: its inputs, gate and up, activation and output */
    float *scratch = malloc((size_t)(most * (2 * hidden + 3 * inter)) * sizeof(float));
    if (scratch == NULL) return -1;
    float *xs = scratch, *gu = xs + most * hidden, *act = gu + most * 2 * inter;
    float *ys = act + most * inter;

#pragma omp parallel
    {
        int64_t start = 0;
        for (int64_t e = 0; e < num_experts; e++) {   /* every thread walks the same experts */
            const int64_t rows = counts[e], local = e - first_expert;
            const int64_t *group = sorted_pairs + start;
            start += rows;
            if (rows == 0 || local < 0 || local >= local_experts) continue;
            const float *wgu = w_gate_up + local * 2 * inter * hidden;
            const float *wd = w_down + local * hidden * inter;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++)
                memcpy(xs + r * hidden, x + (group[r] / top_k) * hidden,
                       (size_t)hidden * sizeof(float));
            minicb_linear_rows(xs, wgu, NULL, MINICB_F32, NULL, gu, rows, 2 * inter, hidden, 0,
                               NULL);
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) {      /* silu(gate) * up */
                const float *g = gu + r * 2 * inter, *u = g + inter;
                float *a = act + r * inter;
                for (int64_t d = 0; d < inter; d++) a[d] = g[d] / (1.0f + expf(-g[d])) * u[d];
            }
            minicb_linear_rows(act, wd, NULL, MINICB_F32, NULL, ys, rows, hidden, inter, 0,
                               NULL);
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) {      /* scaled by the routing weight */
                const int64_t pair = group[r];
                const float w = weights[pair];
                float *o = out + pair * hidden;
                const float *y = ys + r * hidden;
                for (int64_t d = 0; d < hidden; d++) o[d] = y[d] * w;
            }
        }
    }
    free(scratch);
    return 0;
}
