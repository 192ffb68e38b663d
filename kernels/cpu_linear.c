/* y = x W^T (+ bias) for the few rows of a decode step, on the CPU; linked with the other CPU
 * kernels into one library by kernels/cpu.py (entry points in cpu_kernels.h).
 *
 * Why: a decode step multiplies a handful of rows (one per running request) by every weight
 * matrix. That is reading the weights, not arithmetic: 1 row x a 256 x 1408 matrix is 0.36 M
 * multiply-adds over 1.4 MB of weights. The general matrix product torch calls is built for big
 * blocks of rows; for 1-16 rows it reads the weights on one core and runs a fraction of the speed
 * the memory allows. Here the weight rows are split evenly between the threads (each reads its
 * share of the weights once), and each thread keeps a tile of 4 weight rows x 3 input rows in
 * twelve 8-wide registers: every weight value loaded is used for up to 3 input rows, every input
 * value for 4 weight rows.
 *
 * The sums are in float32 like torch's, in a different order (8 lanes, then the lanes added), so
 * results differ from torch's in the last bits (about 1e-6 relative), as two BLAS libraries do.
 * Built without AVX2 and FMA (another CPU, or a compiler without -march=native), a plain loop
 * the compiler vectorises as it can does the same work.
 */
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"

/* Where a sum goes: y = s + bias, or y += s + bias when accumulating (a residual connection
 * added in place). */
static inline void store(float *y, float s, const float *bias, int64_t j, int accumulate) {
    const float v = bias != NULL ? s + bias[j] : s;
    *y = accumulate ? *y + v : v;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float lanes_sum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* rows (1-3) input rows x 4 weight rows; kv = k rounded down to a multiple of 8, the rest added
 * one by one. y points at the first output of the tile, j0 is its first column; n is y's row
 * stride. */
static inline void tile_4x3(const float *restrict x, const float *restrict w, float *restrict y,
                            int64_t n, int64_t k, int64_t kv, int rows, const float *bias,
                            int64_t j0, int accumulate) {
    const float *w0 = w, *w1 = w + k, *w2 = w + 2 * k, *w3 = w + 3 * k;
    const float *x0 = x, *x1 = x + k, *x2 = x + 2 * k;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    for (int64_t d = 0; d < kv; d += 8) {
        const __m256 v0 = _mm256_loadu_ps(w0 + d), v1 = _mm256_loadu_ps(w1 + d);
        const __m256 v2 = _mm256_loadu_ps(w2 + d), v3 = _mm256_loadu_ps(w3 + d);
        __m256 xv = _mm256_loadu_ps(x0 + d);
        a00 = _mm256_fmadd_ps(xv, v0, a00); a01 = _mm256_fmadd_ps(xv, v1, a01);
        a02 = _mm256_fmadd_ps(xv, v2, a02); a03 = _mm256_fmadd_ps(xv, v3, a03);
        if (rows > 1) {
            xv = _mm256_loadu_ps(x1 + d);
            a10 = _mm256_fmadd_ps(xv, v0, a10); a11 = _mm256_fmadd_ps(xv, v1, a11);
            a12 = _mm256_fmadd_ps(xv, v2, a12); a13 = _mm256_fmadd_ps(xv, v3, a13);
        }
        if (rows > 2) {
            xv = _mm256_loadu_ps(x2 + d);
            a20 = _mm256_fmadd_ps(xv, v0, a20); a21 = _mm256_fmadd_ps(xv, v1, a21);
            a22 = _mm256_fmadd_ps(xv, v2, a22); a23 = _mm256_fmadd_ps(xv, v3, a23);
        }
    }
    const __m256 acc[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < 4; j++) {
            float s = lanes_sum(acc[i][j]);
            for (int64_t d = kv; d < k; d++) s += x[i * k + d] * w[j * k + d];
            store(y + i * n + j, s, bias, j0 + j, accumulate);
        }
}
#define TILE_ROWS 4
#else
#define TILE_ROWS 1
#endif

/* one output: x_row . w_row over k values */
static inline float dot(const float *restrict a, const float *restrict b, int64_t k) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < k; d++) s += a[d] * b[d];
    return s;
}

/* The tiles of weight rows shared out among the threads of the enclosing parallel region (an
 * orphaned `omp for`, so the fused decode layer can call it between its other stages; outside a
 * parallel region one thread does it all). */
void minicb_linear_rows(const float *restrict x, const float *restrict w,
                        const float *restrict bias, float *restrict y, int64_t m, int64_t n,
                        int64_t k, int accumulate)
{
    const int64_t tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t j0 = t * TILE_ROWS;
#if TILE_ROWS == 4
        if (j0 + 4 <= n) {
            const int64_t kv = k - k % 8;
            for (int64_t i0 = 0; i0 < m; i0 += 3)
                tile_4x3(x + i0 * k, w + j0 * k, y + i0 * n + j0, n, k, kv,
                         m - i0 < 3 ? (int)(m - i0) : 3, bias, j0, accumulate);
            continue;
        }
#endif
        for (int64_t j = j0; j < n && j < j0 + TILE_ROWS; j++)
            for (int64_t i = 0; i < m; i++)
                store(y + i * n + j, dot(x + i * k, w + j * k, k), bias, j, accumulate);
    }
}

void minicb_linear_f32(const float *x, const float *w, const float *bias, float *y, int64_t m,
                       int64_t n, int64_t k)
{
#pragma omp parallel
    minicb_linear_rows(x, w, bias, y, m, n, k, 0);
}
