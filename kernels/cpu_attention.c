/* Paged attention for a packed batch, on the CPU: the same contract as the Triton kernel
 * (docs/ARCHITECTURE.md, "The packed batch"), compiled on first use by minicb/kernels/cpu.py.
 *
 * Why a CPU kernel at all: on a CPU the torch backend must first copy every decode row's keys out
 * of their blocks into one padded tensor (each row padded to the longest row), then read that copy
 * again in scaled_dot_product_attention. A decode is memory-bound, so that is three passes over
 * (padded) K/V where one over the real keys suffices. Here each (query token, KV head) reads its
 * keys straight from the blocks its block table names, once: K for the scores, V for the sum.
 *
 * One work item = one query token and one KV head. Its G = q_heads / kv_heads query heads share
 * that KV head (grouped-query attention), so each key is read once for all G of them.
 * Query j of request i sits at position max(seq_len - q_len + j, 0) and sees keys 0..position.
 *
 * Softmax in three passes over a per-thread scratch row (scores, then max and exp, then the
 * weighted sum of V), all in float32. Parallel over work items with OpenMP when compiled with it.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int64_t row_of(const int32_t *cu_seqlens_q, int64_t num_seqs, int64_t token) {
    /* the request whose segment holds `token`: cu[r] <= token < cu[r + 1] (binary search) */
    int64_t lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (cu_seqlens_q[mid] <= token) lo = mid; else hi = mid - 1;
    }
    return lo;
}

int minicb_paged_attention_f32(
    const float *q,               /* [num_tokens, q_heads, head_dim] */
    const float *k_cache,         /* [num_blocks, block_size, kv_heads, head_dim] */
    const float *v_cache,
    float *out,                   /* [num_tokens, q_heads, head_dim] */
    const int32_t *cu_seqlens_q,  /* [num_seqs + 1] */
    const int32_t *seq_lens,      /* [num_seqs] */
    const int32_t *block_tables,  /* [num_seqs, table_width] */
    int64_t num_seqs, int64_t num_tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
    int64_t block_size, int64_t table_width, int64_t num_blocks, float scale, int32_t decodes_only)
{
    const int64_t group = q_heads / kv_heads;
    const int64_t key_stride = kv_heads * head_dim;          /* from one key to the next in a block */
    const int64_t block_stride = block_size * key_stride;
    const int64_t items = num_tokens * kv_heads;
    int64_t max_seq_len = 1;
    for (int64_t r = 0; r < num_seqs; r++) max_seq_len = seq_lens[r] > max_seq_len ? seq_lens[r] : max_seq_len;
    /* every block a row reads must be in the pool: a bad table is an error, never a wild read */
    for (int64_t r = 0; r < num_seqs; r++) {
        const int64_t used = seq_lens[r] > block_size ? (seq_lens[r] + block_size - 1) / block_size : 1;
        if (used > table_width) return -2;
        for (int64_t b = 0; b < used; b++) {
            const int32_t id = block_tables[r * table_width + b];
            if (id < 0 || id >= num_blocks) return -2;
        }
    }
    int failed = 0;

#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * (size_t)(group * max_seq_len));
        float *acc = malloc(sizeof(float) * (size_t)(group * head_dim));
        if (scores == NULL || acc == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 4)
        for (int64_t item = 0; item < items; item++) {
            if (failed) continue;
            const int64_t token = item / kv_heads, h = item % kv_heads;
            const int64_t row = row_of(cu_seqlens_q, num_seqs, token);
            const int64_t q_len = cu_seqlens_q[row + 1] - cu_seqlens_q[row];
            if (decodes_only && q_len > 1) continue;
            const int64_t j = token - cu_seqlens_q[row];
            int64_t pos = (int64_t)seq_lens[row] - q_len + j;
            if (pos < 0) pos = 0;
            const int64_t n = pos + 1;
            const int32_t *table = block_tables + row * table_width;
            const float *qg = q + (token * q_heads + h * group) * head_dim;

            /* pass 1: scores[g][p] = scale * q_g . k_p, block by block */
            for (int64_t start = 0; start < n; start += block_size) {
                const float *kb = k_cache + (int64_t)table[start / block_size] * block_stride + h * head_dim;
                const int64_t len = n - start < block_size ? n - start : block_size;
                for (int64_t o = 0; o < len; o++) {
                    const float *kp = kb + o * key_stride;
                    for (int64_t g = 0; g < group; g++) {
                        const float *qp = qg + g * head_dim;
                        float s = 0.0f;
#pragma omp simd reduction(+ : s)
                        for (int64_t d = 0; d < head_dim; d++) s += qp[d] * kp[d];
                        scores[g * n + start + o] = s * scale;
                    }
                }
            }
            /* pass 2: softmax weights, unnormalised; remember each head's sum */
            for (int64_t g = 0; g < group; g++) {
                float *sg = scores + g * n, m = sg[0], sum = 0.0f;
                for (int64_t p = 1; p < n; p++) m = sg[p] > m ? sg[p] : m;
                for (int64_t p = 0; p < n; p++) { sg[p] = expf(sg[p] - m); sum += sg[p]; }
                float *ag = acc + g * head_dim;
                memset(ag, 0, sizeof(float) * (size_t)head_dim);
                /* stash 1/sum in the output row until pass 3 is done */
                out[(token * q_heads + h * group + g) * head_dim] = 1.0f / sum;
            }
            /* pass 3: acc[g] = sum_p w[g][p] * v_p */
            for (int64_t start = 0; start < n; start += block_size) {
                const float *vb = v_cache + (int64_t)table[start / block_size] * block_stride + h * head_dim;
                const int64_t len = n - start < block_size ? n - start : block_size;
                for (int64_t o = 0; o < len; o++) {
                    const float *vp = vb + o * key_stride;
                    for (int64_t g = 0; g < group; g++) {
                        const float w = scores[g * n + start + o];
                        float *ag = acc + g * head_dim;
#pragma omp simd
                        for (int64_t d = 0; d < head_dim; d++) ag[d] += w * vp[d];
                    }
                }
            }
            for (int64_t g = 0; g < group; g++) {
                float *dst = out + (token * q_heads + h * group + g) * head_dim;
                const float inv = dst[0];
                const float *ag = acc + g * head_dim;
                for (int64_t d = 0; d < head_dim; d++) dst[d] = ag[d] * inv;
            }
        }
        free(scores);
        free(acc);
    }
    return failed ? -1 : 0;
}
