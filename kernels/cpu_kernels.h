/* The CPU kernels' interface: every entry point kernels/cpu.py calls through ctypes, the
 * arguments of the fused decoder layer as one struct, and the few loops the .c files share.
 *
 *   cpu_attention.c     paged attention for a packed batch          minicb_paged_attention
 *   cpu_linear.c        x W^T (+ bias) for the few rows of a decode  minicb_linear
 *   cpu_decode_layer.c  a whole decoder layer for a step of decodes  minicb_decode_layer
 *
 * Each .c file includes this header and compiles on its own; kernels/cpu.py links the three into
 * one library (libminicb_cpu_kernels), once per instruction set (kernels/isa.py, cpu_simd.h). The
 * Python side mirrors struct minicb_layer_args field by field (cpu.LayerArgs), and a test checks
 * the two layouts against each other through minicb_layer_args_field below.
 *
 * Activations are float32 everywhere. Weights and the KV cache may be stored narrower (enum
 * minicb_dtype); every sum is accumulated in float32.
 */
#ifndef MINICB_CPU_KERNELS_H
#define MINICB_CPU_KERNELS_H

#include <stdint.h>

/* How a weight matrix or the KV cache is stored. An int8 weight comes with one float32 scale per
 * output channel ([n], beside it). An int8 cache keeps one float32 scale per token and KV head
 * inside its block, right after that head's values: a cache row (one token's one KV head) is
 * head_dim int8 values then the 4 bytes of its scale, so copying a block copies its scales. */
enum minicb_dtype { MINICB_F32 = 0, MINICB_BF16 = 1, MINICB_I8 = 2, MINICB_I4 = 3,
                    MINICB_I8_GROUPED = 4 };
/* An int4 weight (uint8 [n, k / 2]) or a grouped int8 one (int8 [n, k]) comes in groups of
 * MINICB_I4_GROUP values along a row, with a float32 (scale, offset) pair per group
 * ([n, k / 32, 2], passed as the scale): cpu_simd.h. */
#define MINICB_I4_GROUP 32
#define MINICB_KV_SCALE_BYTES 4

/* the largest head the attention kernel takes (its scratch row for a widened key) */
#define MINICB_MAX_HEAD_DIM 256

/* ---- entry points ------------------------------------------------------------------------- */

/* Attention for a packed batch over the paged cache; 0, -1 (no memory) or -2 (a block table
 * outside the pool, or shorter than its row's keys). With decodes_only, rows of more than one
 * query are skipped (their output is left as it was). */
int minicb_paged_attention(
    const float *q,               /* [num_tokens, q_heads, head_dim] */
    const void *k_cache,          /* [num_blocks, block_size, kv_heads, head_dim] as kv_dtype */
    const void *v_cache,          /* (int8: head_dim + 4 bytes a row, the scale last) */
    int32_t kv_dtype,
    float *out,                   /* [num_tokens, q_heads, head_dim] */
    const int32_t *cu_seqlens_q,  /* [num_seqs + 1] */
    const int32_t *seq_lens,      /* [num_seqs] */
    const int32_t *block_tables,  /* [num_seqs, table_width] */
    int64_t num_seqs, int64_t num_tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
    int64_t block_size, int64_t table_width, int64_t num_blocks, float scale,
    int32_t decodes_only);

/* y = x W^T (+ bias); 0, or -1 (no memory) */
int minicb_linear(
    const float *x,      /* [m, k] */
    const void *w,       /* [n, k] as w_dtype: torch's Linear weight, one output per row */
    const float *scale,  /* [n] for int8 weights, [n, k / 32, 2] for grouped ones, else NULL */
    int32_t w_dtype,
    const float *bias,   /* [n] or NULL */
    float *y,            /* [m, n] */
    int64_t m, int64_t n, int64_t k);

/* Everything one decoder layer of a decode step reads and writes. A pointer marked "or NULL" is
 * a part the model may not have (a bias, Qwen3's per-head q/k norms). */
struct minicb_layer_args {
    /* the residual stream, [m, hidden], updated in place */
    float *x;
    /* the layer's weights, as DecoderLayer.cpu_weights gives them */
    const float *norm1;          /* [hidden] input_layernorm */
    const void *w_qkv;           /* [(q_heads + 2 kv_heads) head_dim, hidden], as w_dtype */
    const float *b_qkv;          /* [(q_heads + 2 kv_heads) head_dim] or NULL */
    const float *q_norm;         /* [head_dim] or NULL: RMSNorm of each query head (Qwen3) */
    const float *k_norm;         /* [head_dim] or NULL: RMSNorm of each key head (Qwen3) */
    const void *w_o;             /* [hidden, q_heads head_dim] */
    const float *b_o;            /* [hidden] or NULL */
    const float *norm2;          /* [hidden] post_attention_layernorm */
    const void *w_gate_up;       /* [2 intermediate, hidden] */
    const float *b_gate_up;      /* [2 intermediate] or NULL */
    const void *w_down;          /* [hidden, intermediate] */
    const float *b_down;         /* [hidden] or NULL */
    /* int8 weights' per-output-channel scales, int4's per-group (scale, offset) pairs (NULL for
     * float weights) */
    const float *s_qkv, *s_o, *s_gate_up, *s_down;
    /* the step, shared by every layer */
    const float *cos;            /* [m, head_dim] */
    const float *signed_sin;     /* [m, head_dim] */
    void *k_cache;               /* [num_blocks, block_size, kv_heads, head_dim], as kv_dtype */
    void *v_cache;               /* (int8: head_dim + 4 bytes a row, the scale last) */
    const int64_t *slot_mapping; /* [m]: where each row's k and v go; -1 = not written */
    const int32_t *seq_lens;     /* [m]: keys of each row, its own included */
    const int32_t *block_tables; /* [m, table_width] */
    /* scratch rows */
    float *h;                    /* [m, hidden] */
    float *qkv;                  /* [m, (q_heads + 2 kv_heads) head_dim] */
    float *attn;                 /* [m, q_heads head_dim] */
    float *gate_up;              /* [m, 2 intermediate] */
    float *act;                  /* [m, intermediate] */
    void *x_round;               /* [m, max(hidden, q_heads head_dim, intermediate)] floats:
                                    a product's input rounded to bfloat16 (bfloat16 weights) */
    /* sizes */
    int64_t m, hidden, intermediate, q_heads, kv_heads, head_dim, block_size, table_width,
        num_blocks;
    int64_t w_dtype, kv_dtype;   /* enum minicb_dtype of the four matrices, and of the cache */
    float eps;                   /* every RMSNorm's epsilon */
    float scale;                 /* attention's softmax scale */
};

/* One decoder layer for a step in which every row decodes one token; 0, -1 (no memory) or -2 (a
 * bad block table or slot). */
int minicb_decode_layer(const struct minicb_layer_args *args);

/* The struct's layout, for the test that holds the ctypes mirror to it: field i's name, with its
 * byte offset and size in *offset and *size; NULL past the last field. */
const char *minicb_layer_args_field(int64_t i, int64_t *offset, int64_t *size);
int64_t minicb_layer_args_size(void);

/* ---- shared between the .c files (not called from Python) -------------------------------- */

/* Every block a row reads must be in the pool: -2 otherwise. Sets *max_seq_len to the longest
 * row's keys (at least 1). (cpu_attention.c) */
int minicb_check_tables(const int32_t *seq_lens, const int32_t *block_tables, int64_t num_seqs,
                        int64_t block_size, int64_t table_width, int64_t num_blocks,
                        int64_t *max_seq_len);

/* One thread's scratch rows for the scores (q_heads x max_seq_len); on failure sets *failed.
 * (cpu_attention.c) */
float *minicb_scores_scratch(int64_t q_heads, int64_t max_seq_len, int *failed);

/* One query token against keys 0..n-1 of its request, every head, written to ot. `scores` holds
 * q_heads rows of n floats, `row` 2 head_dim floats. (cpu_attention.c) */
void minicb_attend_token(const float *qt, float *ot, const void *k_cache, const void *v_cache,
                         int kv_dtype, const int32_t *table, int64_t n, int64_t q_heads,
                         int64_t kv_heads, int64_t head_dim, int64_t block_size, float scale,
                         float *scores);

/* Store one token's kv_heads rows of head_dim values into a cache slot as kv_dtype; for int8,
 * each row with its scale, max |value| / 127. (cpu_attention.c) */
void minicb_store_kv(const float *src, void *cache, int kv_dtype, int64_t slot, int64_t kv_heads,
                     int64_t head_dim);

/* y = x W^T (+ bias), or y += when accumulate, with the weight rows shared out among the threads
 * of the enclosing OpenMP parallel region (one thread does it all outside one). For bfloat16
 * weights x is first rounded to bfloat16 into x_round (m * k floats, shared by the threads), so
 * every build multiplies the same numbers. (cpu_linear.c) */
void minicb_linear_rows(const float *x, const void *w, const float *scale, int w_dtype,
                        const float *bias, float *y, int64_t m, int64_t n, int64_t k,
                        int accumulate, void *x_round);

#endif
