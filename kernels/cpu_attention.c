/* Paged attention for a packed batch, on the CPU: the same contract as the Triton kernel
 * (docs/ARCHITECTURE.md, "The packed batch"), compiled on first use by kernels/cpu.py; the
 * entry point and the helpers the fused decode layer shares are declared in cpu_kernels.h.
 *
 * Why a CPU kernel at all: on a CPU the torch backend must first copy every decode row's keys out
 * of their blocks into one padded tensor (each row padded to the longest row), then read that copy
 * again in scaled_dot_product_attention. A decode is memory-bound, so that is three passes over
 * (padded) K/V where one over the real keys suffices. Here each query token reads its keys
 * straight from the blocks its block table names, once: K for the scores, V for the sum.
 *
 * One work item = one query token, all its heads: a key's heads lie side by side in its block, so
 * the item reads each key's K (then V) as one contiguous run. The G = q_heads / kv_heads query
 * heads of a KV head share it (grouped-query attention): each key is read once for all of them.
 * Query j of request i sits at position max(seq_len - q_len + j, 0) and sees keys 0..position.
 *
 * Softmax in three passes over a per-thread scratch row per head (scores; then max, exp and
 * normalise; then the weighted sum of V, straight into the output), all in float32. Parallel over
 * query tokens with OpenMP when compiled with it. The common head sizes (64, 128) get their own
 * copy of the loop, unrolled by the compiler.
 *
 * The cache may hold bfloat16 or int8 (enum minicb_dtype): each key head is widened to float32
 * (int8 times its token's and head's scale) into a scratch row once, then used by every query
 * head of its group, so a narrower cache reads fewer bytes and computes as a float32 one would
 * on the dequantized values. minicb_store_kv writes a token's k or v in the cache's format.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_simd.h"

static int64_t row_of(const int32_t *cu_seqlens_q, int64_t num_seqs, int64_t token) {
    /* the request whose segment holds `token`: cu[r] <= token < cu[r + 1] (binary search) */
    int64_t lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (cu_seqlens_q[mid] <= token) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* Key (or value) row `index` of the cache (one token's one KV head: head_dim values) as float32:
 * the row itself for a float32 cache, else widened into buf (int8: times the row's scale, stored
 * after its values). */
static inline __attribute__((always_inline)) const float *kv_row(
    const void *cache, const int dtype, int64_t index, const int64_t head_dim, float *restrict buf)
{
    if (dtype == MINICB_F32) return (const float *)cache + index * head_dim;
    if (dtype == MINICB_BF16) {
        const uint16_t *row = (const uint16_t *)cache + index * head_dim;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; d++) buf[d] = bf16_to_f32(row[d]);
        return buf;
    }
    const int8_t *row = (const int8_t *)cache + index * (head_dim + MINICB_KV_SCALE_BYTES);
    float s;
    memcpy(&s, row + head_dim, sizeof s);
#pragma omp simd
    for (int64_t d = 0; d < head_dim; d++) buf[d] = (float)row[d] * s;
    return buf;
}

/* One query token against keys 0..n-1 of its request, every head, written to ot. `scores` holds
 * q_heads rows of n floats, then head_dim floats for a widened row. Inlined with a constant
 * head_dim and cache format where one is known. */
static inline __attribute__((always_inline)) void attend_token(
    const float *restrict qt, float *restrict ot, const void *restrict k_cache,
    const void *restrict v_cache, const int dtype, const int32_t *restrict table, int64_t n,
    int64_t q_heads, int64_t kv_heads, const int64_t head_dim, int64_t block_size, float scale,
    float *restrict scores)
{
    const int64_t group = q_heads / kv_heads;
    float *buf = scores + q_heads * n;

    /* pass 1: scores[qh][p] = scale * q_qh . k_p, block by block; each key head is read (and
     * widened) once for the group of query heads that share it */
    for (int64_t start = 0; start < n; start += block_size) {
        const int64_t first = (int64_t)table[start / block_size] * block_size;  /* its 1st token */
        const int64_t len = n - start < block_size ? n - start : block_size;
        for (int64_t o = 0; o < len; o++) {
            for (int64_t h = 0; h < kv_heads; h++) {
                const float *kp = kv_row(k_cache, dtype, (first + o) * kv_heads + h, head_dim,
                                         buf);
                for (int64_t qh = h * group; qh < (h + 1) * group; qh++) {
                    const float *qp = qt + qh * head_dim;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t d = 0; d < head_dim; d++) s += qp[d] * kp[d];
                    scores[qh * n + start + o] = s * scale;
                }
            }
        }
    }
    /* pass 2: softmax weights (subtract the max, exp, divide by the sum) */
    for (int64_t qh = 0; qh < q_heads; qh++) {
        float *sq = scores + qh * n, m = sq[0], sum = 0.0f;
        for (int64_t p = 1; p < n; p++) m = sq[p] > m ? sq[p] : m;
        for (int64_t p = 0; p < n; p++) { sq[p] = expf(sq[p] - m); sum += sq[p]; }
        const float inv = 1.0f / sum;
        for (int64_t p = 0; p < n; p++) sq[p] *= inv;
    }
    /* pass 3: out[qh] = sum_p w[qh][p] * v_p */
    memset(ot, 0, sizeof(float) * (size_t)(q_heads * head_dim));
    for (int64_t start = 0; start < n; start += block_size) {
        const int64_t first = (int64_t)table[start / block_size] * block_size;
        const int64_t len = n - start < block_size ? n - start : block_size;
        for (int64_t o = 0; o < len; o++) {
            for (int64_t h = 0; h < kv_heads; h++) {
                const float *vp = kv_row(v_cache, dtype, (first + o) * kv_heads + h, head_dim,
                                         buf);
                for (int64_t qh = h * group; qh < (h + 1) * group; qh++) {
                    const float w = scores[qh * n + start + o];
                    float *oq = ot + qh * head_dim;
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; d++) oq[d] += w * vp[d];
                }
            }
        }
    }
}

/* attend_token with the cache format, and the head size where it is a common one (64, 128), as
 * compile-time constants: the compiler then unrolls the loops over the head and drops the other
 * formats' branches. */
#define ATTEND(DT, HD) attend_token(qt, ot, k_cache, v_cache, DT, table, n, q_heads, kv_heads, \
                                    HD, block_size, scale, scores)
#define ATTEND_FORMAT(DT)                                      \
    do {                                                       \
        if (head_dim == 64) ATTEND(DT, 64);                    \
        else if (head_dim == 128) ATTEND(DT, 128);             \
        else ATTEND(DT, head_dim);                             \
    } while (0)

void minicb_attend_token(const float *qt, float *ot, const void *k_cache, const void *v_cache,
                         int kv_dtype, const int32_t *table, int64_t n, int64_t q_heads,
                         int64_t kv_heads, int64_t head_dim, int64_t block_size, float scale,
                         float *scores)
{
    if (kv_dtype == MINICB_I8) ATTEND_FORMAT(MINICB_I8);
    else if (kv_dtype == MINICB_BF16) ATTEND_FORMAT(MINICB_BF16);
    else ATTEND_FORMAT(MINICB_F32);
}
#undef ATTEND_FORMAT
#undef ATTEND

void minicb_store_kv(const float *src, void *cache, int kv_dtype, int64_t slot, int64_t kv_heads,
                     int64_t head_dim)
{
    for (int64_t h = 0; h < kv_heads; h++) {
        const float *x = src + h * head_dim;
        const int64_t row = slot * kv_heads + h, at = row * head_dim;
        if (kv_dtype == MINICB_F32) {
            memcpy((float *)cache + at, x, sizeof(float) * (size_t)head_dim);
        } else if (kv_dtype == MINICB_BF16) {
            for (int64_t d = 0; d < head_dim; d++) ((uint16_t *)cache)[at + d] = f32_to_bf16(x[d]);
        } else {   /* symmetric int8: the head's largest |value| maps to 127 */
            float amax = 0.0f;
            for (int64_t d = 0; d < head_dim; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
            const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
            const float inv = 1.0f / s;
            int8_t *q = (int8_t *)cache + row * (head_dim + MINICB_KV_SCALE_BYTES);
            for (int64_t d = 0; d < head_dim; d++) q[d] = (int8_t)nearbyintf(x[d] * inv);
            memcpy(q + head_dim, &s, sizeof s);   /* the row's scale, inside its block */
        }
    }
}

/* Every block a row reads must be in the pool: a bad table is an error (-2), never a wild read.
 * Sets *max_seq_len to the longest row's keys (at least 1). */
int minicb_check_tables(const int32_t *seq_lens, const int32_t *block_tables, int64_t num_seqs,
                        int64_t block_size, int64_t table_width, int64_t num_blocks,
                        int64_t *max_seq_len)
{
    *max_seq_len = 1;
    for (int64_t r = 0; r < num_seqs; r++) {
        *max_seq_len = seq_lens[r] > *max_seq_len ? seq_lens[r] : *max_seq_len;
        const int64_t used = seq_lens[r] > block_size ? (seq_lens[r] + block_size - 1) / block_size : 1;
        if (used > table_width) return -2;
        for (int64_t b = 0; b < used; b++) {
            const int32_t id = block_tables[r * table_width + b];
            if (id < 0 || id >= num_blocks) return -2;
        }
    }
    return 0;
}

/* One thread's scratch rows for the scores (q_heads x max_seq_len), and a widened cache row of up
 * to 256 values (head_dim); on failure sets *failed. */
float *minicb_scores_scratch(int64_t q_heads, int64_t max_seq_len, int *failed)
{
    float *scores = malloc(sizeof(float) * (size_t)(q_heads * max_seq_len + MINICB_MAX_HEAD_DIM));
    if (scores == NULL) {
#pragma omp atomic write
        *failed = 1;
    }
    return scores;
}

int minicb_paged_attention(
    const float *q, const void *k_cache, const void *v_cache, int32_t kv_dtype, float *out,
    const int32_t *cu_seqlens_q, const int32_t *seq_lens, const int32_t *block_tables,
    int64_t num_seqs, int64_t num_tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
    int64_t block_size, int64_t table_width, int64_t num_blocks, float scale, int32_t decodes_only)
{
    int64_t max_seq_len;
    if (minicb_check_tables(seq_lens, block_tables, num_seqs, block_size, table_width,
                            num_blocks, &max_seq_len) != 0)
        return -2;
    int failed = 0;

#pragma omp parallel
    {
        float *scores = minicb_scores_scratch(q_heads, max_seq_len, &failed);
#pragma omp for schedule(dynamic, 1)
        for (int64_t token = 0; token < num_tokens; token++) {
            if (failed) continue;
            const int64_t row = row_of(cu_seqlens_q, num_seqs, token);
            const int64_t q_len = cu_seqlens_q[row + 1] - cu_seqlens_q[row];
            if (decodes_only && q_len > 1) continue;
            int64_t pos = (int64_t)seq_lens[row] - q_len + (token - cu_seqlens_q[row]);
            if (pos < 0) pos = 0;
            const float *qt = q + token * q_heads * head_dim;
            float *ot = out + token * q_heads * head_dim;
            const int32_t *table = block_tables + row * table_width;
            minicb_attend_token(qt, ot, k_cache, v_cache, kv_dtype, table, pos + 1, q_heads,
                                kv_heads, head_dim, block_size, scale, scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
