/* y = x W^T (+ bias) for the few rows of a decode step, on the CPU; linked with the other CPU
 * kernels into one library by kernels/cpu.py (entry points in cpu_kernels.h).
 *
 * Why: a decode step multiplies a handful of rows (one per running request) by every weight
 * matrix. That is reading the weights, not arithmetic: 1 row x a 256 x 1408 matrix is 0.36 M
 * multiply-adds over 1.4 MB of float32 weights. The general matrix product torch calls is built
 * for big blocks of rows; for 1-16 rows it reads the weights on one core and runs a fraction of
 * the speed the memory allows. Here the weight rows are split evenly between the threads (each
 * reads its share of the weights once), and each thread keeps a tile of 4 weight rows x 3 input
 * rows in twelve vector registers (cpu_simd.h: 8 floats wide with AVX2, 16 with AVX-512): every
 * weight value loaded is used for up to 3 input rows, every input value for 4 weight rows.
 *
 * Fewer bytes per weight read means a faster decode, so the weights may be stored narrower:
 *   bfloat16: x is rounded to bfloat16 once per call, then each product of two bfloat16 numbers
 *     is exact in float32. With AVX-512 BF16 one instruction (vdpbf16ps) multiplies 32 pairs and
 *     adds them into 16 float32 sums; other builds widen the weights in registers and use FMA.
 *   int8 (weight-only, one scale per output channel): the weights are widened to float32 in
 *     registers and multiplied with the float32 x; the channel's scale multiplies the finished
 *     sum. x stays float32, so the result is dequantize-then-multiply up to float32 rounding.
 *     (VNNI's integer dot products would need x in int8 too: that is activation quantization,
 *     a different model, so it is not used here.)
 *   int4 (weight-only, groups of 32 values along a row, a float32 scale and offset per group):
 *     each load of VW bytes is widened to two vectors of nibbles and dequantized in registers
 *     (q * scale + offset: one FMA a vector, or with AVX-512 a vpermps look-up in the group's 16
 *     values, cpu_simd.h), then multiplied with x as above. An eighth of
 *     float32's bytes, half of int8's; no whole-weight conversion ever happens (tile_grouped).
 *     int8 in groups of 32 with the same pairs (a checkpoint quantized that way: compressed-
 *     tensors' W8A16) runs the same tile, each vector of 16 int8 values dequantized alike.
 * The sums are float32 in a different order from torch's (the lanes, then the lanes added), so
 * results differ from torch's, and between builds, in the last bits (about 1e-6 relative).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_kernels.h"
#include "cpu_simd.h"

/* Where a sum goes: y = s * scale + bias, or y += that when accumulating (a residual connection
 * added in place). */
static inline void store(float *y, float s, const float *scale, const float *bias, int64_t j,
                         int accumulate) {
    if (scale != NULL) s *= scale[j];
    const float v = bias != NULL ? s + bias[j] : s;
    *y = accumulate ? *y + v : v;
}

#if VW
/* rows (1-3) input rows x 4 weight rows; kv = k rounded down to a multiple of VW, the rest added
 * one by one. y points at the first output of the tile, j0 is its first column; n is y's row
 * stride. dtype is a constant where this is inlined, so each format gets its own loop. */
static inline __attribute__((always_inline)) void tile_4x3(
    const float *restrict x, const void *restrict w, const int dtype, float *restrict y,
    int64_t n, int64_t k, int64_t kv, int rows, const float *scale, const float *bias, int64_t j0,
    int accumulate)
{
    const int64_t r0 = j0 * k, r1 = r0 + k, r2 = r1 + k, r3 = r2 + k;   /* the 4 weight rows */
    const float *x0 = x, *x1 = x + k, *x2 = x + 2 * k;
    vf a00 = vzero(), a01 = a00, a02 = a00, a03 = a00;
    vf a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    vf a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    for (int64_t d = 0; d < kv; d += VW) {
        const vf v0 = vload_typed(w, r0 + d, dtype), v1 = vload_typed(w, r1 + d, dtype);
        const vf v2 = vload_typed(w, r2 + d, dtype), v3 = vload_typed(w, r3 + d, dtype);
        vf xv = vload(x0 + d);
        a00 = vfma(xv, v0, a00); a01 = vfma(xv, v1, a01);
        a02 = vfma(xv, v2, a02); a03 = vfma(xv, v3, a03);
        if (rows > 1) {
            xv = vload(x1 + d);
            a10 = vfma(xv, v0, a10); a11 = vfma(xv, v1, a11);
            a12 = vfma(xv, v2, a12); a13 = vfma(xv, v3, a13);
        }
        if (rows > 2) {
            xv = vload(x2 + d);
            a20 = vfma(xv, v0, a20); a21 = vfma(xv, v1, a21);
            a22 = vfma(xv, v2, a22); a23 = vfma(xv, v3, a23);
        }
    }
    const vf acc[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < 4; j++) {
            float s = vsum(acc[i][j]);
            for (int64_t d = kv; d < k; d++)
                s += x[i * k + d] * load_scalar(w, r0 + j * k + d, dtype);
            store(y + i * n + j, s, scale, bias, j0 + j, accumulate);
        }
}
#define TILE_ROWS 4
#else
#define TILE_ROWS 1
#endif

#if defined(__AVX512BF16__)
/* The bfloat16 tile with AVX-512 BF16: xb is x already rounded to bfloat16; each vdpbf16ps adds
 * 32 exact products into 16 float32 sums. kv = k rounded down to a multiple of 32. */
static void tile_4x3_dpbf16(const uint16_t *restrict xb, const uint16_t *restrict w,
                            float *restrict y, int64_t n, int64_t k, int64_t kv, int rows,
                            const float *bias, int64_t j0, int accumulate)
{
    const uint16_t *w0 = w, *w1 = w + k, *w2 = w + 2 * k, *w3 = w + 3 * k;
    const uint16_t *x0 = xb, *x1 = xb + k, *x2 = xb + 2 * k;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
#define LD(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
    for (int64_t d = 0; d < kv; d += 32) {
        const __m512bh v0 = LD(w0 + d), v1 = LD(w1 + d), v2 = LD(w2 + d), v3 = LD(w3 + d);
        __m512bh xv = LD(x0 + d);
        a00 = _mm512_dpbf16_ps(a00, xv, v0); a01 = _mm512_dpbf16_ps(a01, xv, v1);
        a02 = _mm512_dpbf16_ps(a02, xv, v2); a03 = _mm512_dpbf16_ps(a03, xv, v3);
        if (rows > 1) {
            xv = LD(x1 + d);
            a10 = _mm512_dpbf16_ps(a10, xv, v0); a11 = _mm512_dpbf16_ps(a11, xv, v1);
            a12 = _mm512_dpbf16_ps(a12, xv, v2); a13 = _mm512_dpbf16_ps(a13, xv, v3);
        }
        if (rows > 2) {
            xv = LD(x2 + d);
            a20 = _mm512_dpbf16_ps(a20, xv, v0); a21 = _mm512_dpbf16_ps(a21, xv, v1);
            a22 = _mm512_dpbf16_ps(a22, xv, v2); a23 = _mm512_dpbf16_ps(a23, xv, v3);
        }
    }
#undef LD
    const __m512 acc[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < 4; j++) {
            float s = _mm512_reduce_add_ps(acc[i][j]);
            for (int64_t d = kv; d < k; d++)
                s += bf16_to_f32(xb[i * k + d]) * bf16_to_f32(w[j * k + d]);
            store(y + i * n + j, s, NULL, bias, j0 + j, accumulate);
        }
}
#endif

#if VW
/* The grouped tile (int4, or int8 in groups): rows (1-3) input rows x 4 weight rows, as
 * tile_4x3, a group of 32 values at a time (k is a multiple of 32). so holds each row's (scale,
 * offset) pairs. The 4 rows' group parameters are broadcast once per group; each weight vector is
 * dequantized once and used for every input row. dtype is a constant where this is inlined. */
static inline __attribute__((always_inline)) void tile_grouped(
    const float *restrict x, const uint8_t *restrict w, const int dtype, const float *so,
    float *restrict y, int64_t n, int64_t k, int rows, const float *bias, int64_t j0,
    int accumulate)
{
    const int64_t groups = k / MINICB_I4_GROUP, bytes = dtype == MINICB_I4 ? k / 2 : k;
    const uint8_t *w0 = w + j0 * bytes, *w1 = w0 + bytes, *w2 = w1 + bytes, *w3 = w2 + bytes;
    const float *p0 = so + j0 * groups * 2, *p1 = p0 + groups * 2, *p2 = p1 + groups * 2,
                *p3 = p2 + groups * 2;
    const float *x0 = x, *x1 = x + k, *x2 = x + 2 * k;
    vf a00 = vzero(), a01 = a00, a02 = a00, a03 = a00;
    vf a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    vf a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    for (int64_t g = 0; g < groups; g++) {
        const vf s0 = vset1(p0[2 * g]), o0 = vset1(p0[2 * g + 1]);
        const vf s1 = vset1(p1[2 * g]), o1 = vset1(p1[2 * g + 1]);
        const vf s2 = vset1(p2[2 * g]), o2 = vset1(p2[2 * g + 1]);
        const vf s3 = vset1(p3[2 * g]), o3 = vset1(p3[2 * g + 1]);
        for (int64_t c = 0; c < 16; c += VW) {
            const int64_t d = g * MINICB_I4_GROUP + c;      /* the first value of lo */
            vf l0, h0, l1, h1, l2, h2, l3, h3;
            vload_group(w0, g, c, s0, o0, &l0, &h0, dtype);
            vload_group(w1, g, c, s1, o1, &l1, &h1, dtype);
            vload_group(w2, g, c, s2, o2, &l2, &h2, dtype);
            vload_group(w3, g, c, s3, o3, &l3, &h3, dtype);
            vf xl = vload(x0 + d), xh = vload(x0 + d + 16);
            a00 = vfma(xl, l0, a00); a01 = vfma(xl, l1, a01);
            a02 = vfma(xl, l2, a02); a03 = vfma(xl, l3, a03);
            a00 = vfma(xh, h0, a00); a01 = vfma(xh, h1, a01);
            a02 = vfma(xh, h2, a02); a03 = vfma(xh, h3, a03);
            if (rows > 1) {
                xl = vload(x1 + d); xh = vload(x1 + d + 16);
                a10 = vfma(xl, l0, a10); a11 = vfma(xl, l1, a11);
                a12 = vfma(xl, l2, a12); a13 = vfma(xl, l3, a13);
                a10 = vfma(xh, h0, a10); a11 = vfma(xh, h1, a11);
                a12 = vfma(xh, h2, a12); a13 = vfma(xh, h3, a13);
            }
            if (rows > 2) {
                xl = vload(x2 + d); xh = vload(x2 + d + 16);
                a20 = vfma(xl, l0, a20); a21 = vfma(xl, l1, a21);
                a22 = vfma(xl, l2, a22); a23 = vfma(xl, l3, a23);
                a20 = vfma(xh, h0, a20); a21 = vfma(xh, h1, a21);
                a22 = vfma(xh, h2, a22); a23 = vfma(xh, h3, a23);
            }
        }
    }
    const vf acc[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < 4; j++) store(y + i * n + j, vsum(acc[i][j]), NULL, bias, j0 + j,
                                          accumulate);
}
#endif

/* one output of a grouped row: x_row . (q * scale + offset) over the row's groups */
static inline __attribute__((always_inline)) float dot_grouped(
    const float *restrict a, const uint8_t *restrict row, const float *so, int64_t k,
    const int dtype) {
    float s = 0.0f;
    for (int64_t g = 0; g < k / MINICB_I4_GROUP; g++) {
        const float scale = so[2 * g], offset = so[2 * g + 1];
        for (int64_t d = g * MINICB_I4_GROUP; d < (g + 1) * MINICB_I4_GROUP; d++)
            s += a[d] * (grouped_at(row, d, dtype) * scale + offset);
    }
    return s;
}

/* every grouped tile, shared out among the threads as rows_typed shares the others */
static inline __attribute__((always_inline)) void rows_grouped(
    const float *restrict x, const uint8_t *restrict w, const int dtype, const float *so,
    const float *restrict bias, float *restrict y, int64_t m, int64_t n, int64_t k,
    int accumulate)
{
    const int64_t tiles = (n + TILE_ROWS - 1) / TILE_ROWS, groups = k / MINICB_I4_GROUP;
    const int64_t bytes = dtype == MINICB_I4 ? k / 2 : k;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t j0 = t * TILE_ROWS;
#if VW
        if (j0 + 4 <= n) {
            for (int64_t i0 = 0; i0 < m; i0 += 3)
                tile_grouped(x + i0 * k, w, dtype, so, y + i0 * n + j0, n, k,
                             m - i0 < 3 ? (int)(m - i0) : 3, bias, j0, accumulate);
            continue;
        }
#endif
        for (int64_t j = j0; j < n && j < j0 + TILE_ROWS; j++)
            for (int64_t i = 0; i < m; i++)
                store(y + i * n + j,
                      dot_grouped(x + i * k, w + j * bytes, so + j * groups * 2, k, dtype),
                      NULL, bias, j, accumulate);
    }
}

/* one output: x_row . w_row over k values */
static inline __attribute__((always_inline)) float dot(const float *restrict a, const void *w,
                                                       int64_t row, int64_t k, const int dtype) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < k; d++) s += a[d] * load_scalar(w, row * k + d, dtype);
    return s;
}

/* Every tile of weight rows, shared out among the threads: an orphaned `omp for`, so the fused
 * decode layer can call it between its other stages (outside a parallel region one thread does
 * it all). dtype is a constant where this is inlined. */
static inline __attribute__((always_inline)) void rows_typed(
    const float *restrict x, const void *restrict w, const int dtype, const float *scale,
    const float *restrict bias, float *restrict y, int64_t m, int64_t n, int64_t k,
    int accumulate)
{
    const int64_t tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t j0 = t * TILE_ROWS;
#if VW
        if (j0 + 4 <= n) {
            const int64_t kv = k - k % VW;
            for (int64_t i0 = 0; i0 < m; i0 += 3)
                tile_4x3(x + i0 * k, w, dtype, y + i0 * n + j0, n, k, kv,
                         m - i0 < 3 ? (int)(m - i0) : 3, scale, bias, j0, accumulate);
            continue;
        }
#endif
        for (int64_t j = j0; j < n && j < j0 + TILE_ROWS; j++)
            for (int64_t i = 0; i < m; i++)
                store(y + i * n + j, dot(x + i * k, w, j, k, dtype), scale, bias, j, accumulate);
    }
}

void minicb_linear_rows(const float *x, const void *w, const float *scale, int w_dtype,
                        const float *bias, float *y, int64_t m, int64_t n, int64_t k,
                        int accumulate, void *x_round)
{
    if (w_dtype == MINICB_I8) {
        rows_typed(x, w, MINICB_I8, scale, bias, y, m, n, k, accumulate);
        return;
    }
    if (w_dtype == MINICB_I4) {
        rows_grouped(x, w, MINICB_I4, scale, bias, y, m, n, k, accumulate);
        return;
    }
    if (w_dtype == MINICB_I8_GROUPED) {
        rows_grouped(x, w, MINICB_I8_GROUPED, scale, bias, y, m, n, k, accumulate);
        return;
    }
    if (w_dtype == MINICB_F32) {
        rows_typed(x, w, MINICB_F32, NULL, bias, y, m, n, k, accumulate);
        return;
    }
    /* bfloat16 weights: x rounded to bfloat16 once, by one thread, for all (the barrier at the
     * end of `single` makes it visible to every thread before the product) */
#if defined(__AVX512BF16__)
    uint16_t *xb = x_round;
#pragma omp single
    for (int64_t i = 0; i < m * k; i++) xb[i] = f32_to_bf16(x[i]);
    const int64_t tiles = (n + 3) / 4, kv = k - k % 32;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t j0 = t * 4;
        if (j0 + 4 <= n) {
            for (int64_t i0 = 0; i0 < m; i0 += 3)
                tile_4x3_dpbf16(xb + i0 * k, (const uint16_t *)w + j0 * k, y + i0 * n + j0, n, k,
                                kv, m - i0 < 3 ? (int)(m - i0) : 3, bias, j0, accumulate);
            continue;
        }
        for (int64_t j = j0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                float s = 0.0f;
                for (int64_t d = 0; d < k; d++)
                    s += bf16_to_f32(xb[i * k + d]) * bf16_to_f32(((const uint16_t *)w)[j * k + d]);
                store(y + i * n + j, s, NULL, bias, j, accumulate);
            }
    }
#else
    float *xr = x_round;
#pragma omp single
    for (int64_t i = 0; i < m * k; i++) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    rows_typed(xr, w, MINICB_BF16, NULL, bias, y, m, n, k, accumulate);
#endif
}

int minicb_linear(const float *x, const void *w, const float *scale, int32_t w_dtype,
                  const float *bias, float *y, int64_t m, int64_t n, int64_t k)
{
    void *x_round = NULL;
    if (w_dtype == MINICB_BF16 && (x_round = malloc(sizeof(float) * (size_t)(m * k))) == NULL)
        return -1;
#pragma omp parallel
    minicb_linear_rows(x, w, scale, w_dtype, bias, y, m, n, k, 0, x_round);
    free(x_round);
    return 0;
}
