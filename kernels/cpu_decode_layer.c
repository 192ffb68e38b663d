/* One whole decoder layer for a step of decodes only, on the CPU, in one call.
 *
 * Why: with a few rows, a decode step is mostly fixed cost. The layer in minicb/model/llama.py is
 * about 25 torch operations (two norms, three matrix products, RoPE on q and k, the KV write,
 * attention, SiLU, two residual adds), each a few microseconds of dispatch for a few
 * microseconds of work; a 4-layer model pays it 100 times a step. This function does the same
 * arithmetic in one call, with the threads meeting at a barrier between the stages instead of
 * returning to Python: the CPU analogue of capturing a GPU's step as one CUDA graph.
 *
 * The stages, as in DecoderLayer.forward (a part in brackets only where the model has it):
 *   h = rmsnorm(x) ; q, k, v = h Wqkv^T [+ bqkv] ; [q, k = rmsnorm of each head (Qwen3)]
 *   q, k = rope(q), rope(k) ; cache[slot] = k, v ; x += attention(q, cache) Wo^T [+ bo]
 *   h = rmsnorm(x) ; g, u = h Wgu^T [+ bgu] ; x += (silu(g) * u) Wd^T [+ bd]
 * Each matrix product splits its weight rows among the threads (cpu_linear.c); attention runs one
 * query per work item (cpu_attention.c). Activations and sums are float32; the matrices may be
 * stored as bfloat16, int8 or int4 and the cache as bfloat16 or int8 (w_dtype, kv_dtype), widened
 * (int4: dequantized by its group's scale and offset) in registers as they are read. Sums run in a different order from torch's, so in float32 results
 * agree with the module path to about 1e-6, not bit for bit.
 *
 * The arguments come as one struct (struct minicb_layer_args in cpu_kernels.h), mirrored field by
 * field by kernels/cpu.py's LayerArgs: 36 arguments in a row, 25 of them pointers, would let two
 * swapped ones of the same type load and compute garbage.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_kernels.h"

/* h = w * x / sqrt(mean(x^2) + eps) for one vector of dim values (h may be x) */
static inline void rmsnorm(const float *x, const float *restrict w, float *h, int64_t dim,
                           float eps)
{
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t d = 0; d < dim; d++) ss += x[d] * x[d];
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int64_t d = 0; d < dim; d++) h[d] = w[d] * (x[d] * inv);
}

/* rmsnorm of each of the m rows, shared out among the threads */
static void rmsnorm_rows(const float *restrict x, const float *restrict w, float *restrict h,
                         int64_t m, int64_t dim, float eps)
{
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; i++) rmsnorm(x + i * dim, w, h + i * dim, dim, eps);
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

int minicb_decode_layer(const struct minicb_layer_args *a)
{
    int64_t max_seq_len;           /* a bad table or slot is an error, never a wild read */
    if (minicb_check_tables(a->seq_lens, a->block_tables, a->m, a->block_size, a->table_width,
                            a->num_blocks, &max_seq_len) != 0)
        return -2;
    for (int64_t r = 0; r < a->m; r++)
        if (a->seq_lens[r] < 1 || a->slot_mapping[r] >= a->num_blocks * a->block_size) return -2;
    const int64_t m = a->m, hidden = a->hidden, inter = a->intermediate, head_dim = a->head_dim;
    const int64_t q_heads = a->q_heads, kv_heads = a->kv_heads;
    const int64_t q_size = q_heads * head_dim, kv_size = kv_heads * head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    const int wt = (int)a->w_dtype, kt = (int)a->kv_dtype;
    int failed = 0;

#pragma omp parallel
    {
        float *scores = minicb_scores_scratch(q_heads, max_seq_len, &failed);
        rmsnorm_rows(a->x, a->norm1, a->h, m, hidden, a->eps);
        minicb_linear_rows(a->h, a->w_qkv, a->s_qkv, wt, a->b_qkv, a->qkv, m, qkv_size, hidden, 0,
                           a->x_round);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {   /* [q/k norms,] RoPE on q and k, k and v to the cache */
            float *row = a->qkv + i * qkv_size;
            if (a->q_norm != NULL)
                for (int64_t h = 0; h < q_heads; h++)
                    rmsnorm(row + h * head_dim, a->q_norm, row + h * head_dim, head_dim, a->eps);
            if (a->k_norm != NULL)
                for (int64_t h = 0; h < kv_heads; h++)
                    rmsnorm(row + q_size + h * head_dim, a->k_norm, row + q_size + h * head_dim,
                            head_dim, a->eps);
            rope_heads(row, a->cos + i * head_dim, a->signed_sin + i * head_dim,
                       q_heads + kv_heads, head_dim);
            if (a->slot_mapping[i] >= 0) {
                minicb_store_kv(row + q_size, a->k_cache, kt, a->slot_mapping[i], kv_heads,
                                head_dim);
                minicb_store_kv(row + q_size + kv_size, a->v_cache, kt, a->slot_mapping[i],
                                kv_heads, head_dim);
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < m; i++) {
            if (failed) continue;
            const float *qi = a->qkv + i * qkv_size;   /* q heads come first in the row */
            float *oi = a->attn + i * q_size;
            const int32_t *table = a->block_tables + i * a->table_width;
            minicb_attend_token(qi, oi, a->k_cache, a->v_cache, kt, table, a->seq_lens[i],
                                q_heads, kv_heads, head_dim, a->block_size, a->scale, scores);
        }
        minicb_linear_rows(a->attn, a->w_o, a->s_o, wt, a->b_o, a->x, m, hidden, q_size, 1,
                           a->x_round);                                       /* x += o_proj */
        rmsnorm_rows(a->x, a->norm2, a->h, m, hidden, a->eps);
        minicb_linear_rows(a->h, a->w_gate_up, a->s_gate_up, wt, a->b_gate_up, a->gate_up, m,
                           2 * inter, hidden, 0, a->x_round);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {      /* silu(gate) * up */
            const float *g = a->gate_up + i * 2 * inter, *u = g + inter;
            float *act = a->act + i * inter;
            for (int64_t d = 0; d < inter; d++) act[d] = g[d] / (1.0f + expf(-g[d])) * u[d];
        }
        minicb_linear_rows(a->act, a->w_down, a->s_down, wt, a->b_down, a->x, m, hidden, inter, 1,
                           a->x_round);                                       /* x += down */
        free(scores);
    }
    return failed ? -1 : 0;
}

/* The struct's layout, field by field, for the test that holds kernels/cpu.py's mirror to it. */
#define FIELD(name) {#name, offsetof(struct minicb_layer_args, name), \
                     sizeof(((struct minicb_layer_args *)0)->name)}
static const struct { const char *name; size_t offset, size; } layer_args_fields[] = {
    FIELD(x), FIELD(norm1), FIELD(w_qkv), FIELD(b_qkv), FIELD(q_norm), FIELD(k_norm), FIELD(w_o),
    FIELD(b_o), FIELD(norm2), FIELD(w_gate_up), FIELD(b_gate_up), FIELD(w_down), FIELD(b_down),
    FIELD(s_qkv), FIELD(s_o), FIELD(s_gate_up), FIELD(s_down),
    FIELD(cos), FIELD(signed_sin), FIELD(k_cache), FIELD(v_cache),
    FIELD(slot_mapping), FIELD(seq_lens), FIELD(block_tables), FIELD(h), FIELD(qkv), FIELD(attn),
    FIELD(gate_up), FIELD(act), FIELD(x_round), FIELD(m), FIELD(hidden), FIELD(intermediate),
    FIELD(q_heads), FIELD(kv_heads), FIELD(head_dim), FIELD(block_size), FIELD(table_width),
    FIELD(num_blocks), FIELD(w_dtype), FIELD(kv_dtype), FIELD(eps), FIELD(scale),
};
#undef FIELD

const char *minicb_layer_args_field(int64_t i, int64_t *offset, int64_t *size)
{
    if (i < 0 || i >= (int64_t)(sizeof layer_args_fields / sizeof layer_args_fields[0]))
        return NULL;
    *offset = (int64_t)layer_args_fields[i].offset;
    *size = (int64_t)layer_args_fields[i].size;
    return layer_args_fields[i].name;
}

int64_t minicb_layer_args_size(void) { return (int64_t)sizeof(struct minicb_layer_args); }
