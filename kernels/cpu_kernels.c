/* The CPU kernels, built as one library by kernels/cpu.py (one translation unit, so the fused
 * decode layer calls the matrix-product and attention loops directly):
 *   cpu_attention.c     paged attention for a packed batch (minicb_paged_attention_f32)
 *   cpu_linear.c        x W^T for the few rows of a decode step (minicb_linear_f32)
 *   cpu_decode_layer.c  a whole decoder layer for a step of decodes (minicb_decode_layer_f32)
 */
#include "cpu_attention.c"
#include "cpu_linear.c"
#include "cpu_decode_layer.c"
