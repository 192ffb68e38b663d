/* One whole decoder layer for a step of decodes only, on the CPU, in one call.
 *
 * Why: with a few rows, a decode step is mostly fixed cost. The layer in minicb/model/llama.py is
 * about 25 torch operations (two norms, three matrix products, RoPE on q and k, the KV write,
 * attention, SiLU, two residual adds), each a few microseconds of dispatch for a few
 * microseconds of work; a 4-layer model pays it 100 times a step. This function does the same
 * arithmetic in one call, with the threads meeting at a barrier between the stages instead of
 * returning to Python: the CPU analogue of capturing a GPU's step as one CUDA graph.
 *
 * The stages, as in DecoderLayer.forward:
 *   h = rmsnorm(x) ; q, k, v = h Wqkv^T ; q, k = rope(q), rope(k) ; cache[slot] = k, v
 *   x += attention(q, cache) Wo^T ; h = rmsnorm(x) ; g, u = h Wgu^T ; x += (silu(g) * u) Wd^T
 * Each matrix product splits its weight rows among the threads (cpu_linear.c); attention runs one
 * query per work item (cpu_attention.c). float32 throughout; sums in a different order from
 * torch's, so results agree with the module path to about 1e-6, not bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* h[i] = w * x[i] / sqrt(mean(x[i]^2) + eps) */
static void rmsnorm_rows(const float *restrict x, const float *restrict w, float *restrict h,
                         int64_t m, int64_t dim, float eps)
{
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * dim;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t d = 0; d < dim; d++) ss += xi[d] * xi[d];
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int64_t d = 0; d < dim; d++) h[i * dim + d] = w[d] * (xi[d] * inv);
    }
}

/* RoPE as apply_rope in llama.py: out[d] = x[d] * cos[d] + x[d +- half] * signed_sin[d], on
 * `heads` heads of one token, in place. */
static inline void rope_heads(float *restrict x, const float *restrict cos_, const float *restrict
                              ssin, int64_t heads, int64_t head_dim)
{
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *xh = x + h * head_dim;
        for (int64_t d = 0; d < half; d++) {
            const float a = xh[d], b = xh[d + half];
            xh[d] = a * cos_[d] + b * ssin[d];
            xh[d + half] = b * cos_[d + half] + a * ssin[d + half];
        }
    }
}

int minicb_decode_layer_f32(
    float *x,                      /* [m, hidden]: the residual stream, updated in place */
    const float *norm1, const float *w_qkv, const float *b_qkv,      /* b_qkv may be NULL */
    const float *w_o, const float *norm2, const float *w_gate_up, const float *b_gate_up,
    const float *w_down, const float *b_down,                        /* biases may be NULL */
    const float *cos_, const float *signed_sin,  /* [m, head_dim] each */
    float *k_cache, float *v_cache,  /* [num_blocks, block_size, kv_heads, head_dim] */
    const int64_t *slot_mapping,   /* [m]: where each row's k and v go; -1 = not written */
    const int32_t *seq_lens,       /* [m]: keys of each row, its own included */
    const int32_t *block_tables,   /* [m, table_width] */
    float *h, float *qkv, float *attn, float *gate_up, float *act,
    /* scratch: h [m, hidden], qkv [m, (q + 2 kv heads) x head_dim], attn [m, q heads x head_dim],
     * gate_up [m, 2 x intermediate], act [m, intermediate] */
    int64_t m, int64_t hidden, int64_t intermediate, int64_t q_heads, int64_t kv_heads,
    int64_t head_dim, int64_t block_size, int64_t table_width, int64_t num_blocks, float eps,
    float scale)
{
    int64_t max_seq_len;           /* a bad table or slot is an error, never a wild read */
    if (check_tables(seq_lens, block_tables, m, block_size, table_width, num_blocks,
                     &max_seq_len) != 0)
        return -2;
    for (int64_t r = 0; r < m; r++)
        if (seq_lens[r] < 1 || slot_mapping[r] >= num_blocks * block_size) return -2;
    const int64_t q_size = q_heads * head_dim, kv_size = kv_heads * head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    int failed = 0;

#pragma omp parallel
    {
        float *scores = scores_scratch(q_heads, max_seq_len, &failed);
        rmsnorm_rows(x, norm1, h, m, hidden, eps);
        linear_rows(h, w_qkv, b_qkv, qkv, m, qkv_size, hidden, 0);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {     /* RoPE on q and k, then k and v into the cache */
            float *row = qkv + i * qkv_size;
            rope_heads(row, cos_ + i * head_dim, signed_sin + i * head_dim, q_heads + kv_heads,
                       head_dim);
            if (slot_mapping[i] >= 0) {
                float *kd = k_cache + slot_mapping[i] * kv_size;
                float *vd = v_cache + slot_mapping[i] * kv_size;
                for (int64_t d = 0; d < kv_size; d++) {
                    kd[d] = row[q_size + d];
                    vd[d] = row[q_size + kv_size + d];
                }
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < m; i++) {
            if (failed) continue;
            const float *qi = qkv + i * qkv_size;   /* q heads come first in the row */
            float *oi = attn + i * q_size;
            const int32_t *table = block_tables + i * table_width;
            attend_token_any(qi, oi, k_cache, v_cache, table, seq_lens[i], q_heads, kv_heads,
                             head_dim, block_size, scale, scores);
        }
        linear_rows(attn, w_o, NULL, x, m, hidden, q_size, 1);            /* x += o_proj */
        rmsnorm_rows(x, norm2, h, m, hidden, eps);
        linear_rows(h, w_gate_up, b_gate_up, gate_up, m, 2 * intermediate, hidden, 0);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {      /* silu(gate) * up */
            const float *g = gate_up + i * 2 * intermediate, *u = g + intermediate;
            float *a = act + i * intermediate;
            for (int64_t d = 0; d < intermediate; d++) a[d] = g[d] / (1.0f + expf(-g[d])) * u[d];
        }
        linear_rows(act, w_down, b_down, x, m, hidden, intermediate, 1);  /* x += down_proj */
        free(scores);
    }
    return failed ? -1 : 0;
}
