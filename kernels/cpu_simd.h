/* The vector width each build of the CPU kernels compiles for, and the number formats they read.
 *
 * kernels/isa.py compiles the same sources once per instruction set (generic x86-64, AVX2 + FMA,
 * AVX-512, AVX-512 with BF16) and loads the widest build the CPU runs. The loops are written once
 * against the names below (vf: a register of VW floats), so each build gets its own width without
 * a second copy of a loop. Built for no known vector set, VW is 0 and the callers keep their plain
 * loops, which the compiler vectorises as it can.
 *
 * The formats a weight or a cached key may be stored in (enum minicb_dtype, cpu_kernels.h):
 *   float32;
 *   bfloat16: float32's top 16 bits, so widening is a shift and exact;
 *   int8 with a float32 scale (per output channel of a weight, per token and KV head of the
 *   cache): the value is q * scale, and the scale is applied once to a finished sum;
 *   int4 (weights only), groups of MINICB_I4_GROUP values along a row, each group 16 bytes: byte
 *   b holds value b in its low nibble and value b + 16 in its high one, so one load of VW bytes
 *   widens into two vectors of VW consecutive values (the low nibbles, then the high ones). A
 *   group's value is q * scale + offset (q in 0..15), both float32, [n][k / 32][2] beside it;
 *   grouped int8 (weights only): int8 q in groups of 32 with the same (scale, offset) pairs.
 */
#ifndef MINICB_CPU_SIMD_H
#define MINICB_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"

/* bfloat16 -> float32: exact (the missing 16 mantissa bits are zero) */
static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float32 -> bfloat16, rounding to nearest even as torch's .to(torch.bfloat16) does. Every build
 * rounds with this scalar code (never with AVX-512 BF16's conversion, which flushes subnormals),
 * so all builds start a bfloat16 product from the same numbers. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* value i of a grouped row, int4 or int8 (its group's q, before scale and offset) */
static inline __attribute__((always_inline)) float grouped_at(const uint8_t *row, int64_t i,
                                                              const int dtype) {
    if (dtype == MINICB_I8_GROUPED) return (float)((const int8_t *)row)[i];
    const uint8_t b = row[i / MINICB_I4_GROUP * 16 + i % 16];
    return (float)(i % MINICB_I4_GROUP < 16 ? b & 15 : b >> 4);
}

/* element i of a weight or cache row stored as dtype, as float32 (before any scale) */
static inline __attribute__((always_inline)) float load_scalar(const void *p, int64_t i,
                                                               const int dtype) {
    if (dtype == MINICB_I8) return (float)((const int8_t *)p)[i];
    if (dtype == MINICB_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define VW 16
typedef __m512 vf;
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vsum(a) _mm512_reduce_add_ps(a)
#define vload_bf16(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define vload_i8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define vset1(f) _mm512_set1_ps(f)
/* 16 bytes of an int4 group, dequantized in registers: values b..b+15 and b+16..b+31. The 16
 * values a code can stand for (q * scale + offset, q = 0..15) fill one register, and vpermps
 * looks each code up in it: it reads only an index's low 4 bits, so the low nibbles need no mask
 * and the high ones one shift. Exactly the FMA of the other builds, with fewer instructions. */
static inline __attribute__((always_inline)) void vload_i4(const uint8_t *p, vf scale, vf offset,
                                                           vf *lo, vf *hi) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 table = _mm512_fmadd_ps(codes, scale, offset);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_permutexvar_ps(b, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VW 8
typedef __m256 vf;
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#define vload_bf16(p) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define vload_i8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define vset1(f) _mm256_set1_ps(f)
/* 8 bytes of an int4 group, dequantized in registers: values b..b+7 and b+16..b+23 */
static inline __attribute__((always_inline)) void vload_i4(const uint8_t *p, vf scale, vf offset,
                                                           vf *lo, vf *hi) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))), scale,
                          offset);
    *hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), scale, offset);
}
#else
#define VW 0
#endif

#if VW
/* Values c..c+VW-1 (lo) and c+16..c+16+VW-1 (hi) of group g of a grouped row (int4 or int8),
 * dequantized in registers: q * scale + offset, one FMA a vector. */
static inline __attribute__((always_inline)) void vload_group(const uint8_t *row, int64_t g,
                                                              int64_t c, vf scale, vf offset,
                                                              vf *lo, vf *hi, const int dtype) {
    if (dtype == MINICB_I8_GROUPED) {
        const int8_t *p = (const int8_t *)row + g * MINICB_I4_GROUP + c;
        *lo = vfma(vload_i8(p), scale, offset);
        *hi = vfma(vload_i8(p + 16), scale, offset);
        return;
    }
    vload_i4(row + g * 16 + c, scale, offset, lo, hi);
}

/* VW values of a row stored as dtype, from element i, widened to float32 in a register: the
 * dequantize happens here, never as a float copy of the whole weight */
static inline __attribute__((always_inline)) vf vload_typed(const void *p, int64_t i,
                                                            const int dtype) {
    if (dtype == MINICB_I8) return vload_i8((const int8_t *)p + i);
    if (dtype == MINICB_BF16) return vload_bf16((const uint16_t *)p + i);
    return vload((const float *)p + i);
}
#endif

#endif
