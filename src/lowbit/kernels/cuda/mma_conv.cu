// CUDA C++ text of the tiled mma.sync implicit-GEMM conv kernel (rendered by `mma_conv.py`).
//
// `mma_conv.render` prepends a block of #define'd constants (the config knobs and the
// workload's shape, see `PRELUDE_NAMES`) to this file. The kernel works on bytes along the reduction:
// one s8 m16n8k32 step and one s4 m16n8k64 step both consume 32 bytes of A and B per row, with the
// same byte layout of the fragments, so one body serves both instructions.
//
// GEMM view: rows m = output pixels (n, p, q), columns = filters k, reduction over (r, s, c) in
// KRSC order. A block computes BM x BN outputs (BM = WARPS_M*TILES_M*16, BN = WARPS_N*TILES_N*8)
// in STEPS = R*S*CHUNKS steps of KB bytes of channels, two shared-memory stages deep (cp.async).
//
// - Plain load: each step stages the im2col tile A[BM][KB] (one gather per row) and B[BN][KB].
// - Duplicate-aware load (DUP): the block's rows are a TP x TQ tile of output pixels of one
//   image; once per channel chunk the input halo tile [HP*HQ][KB] is staged, and the R*S steps of
//   that chunk address their im2col rows inside it (ldmatrix takes one row address per lane), so
//   each input byte is read from global memory once per chunk instead of up to R*S times.
// - Register-level output packing (REG_PACK): requantized outputs are packed by the four lanes of
//   an accumulator quad with warp shuffles and stored as whole words; without it, sub-byte outputs
//   go through a shared-memory byte tile and a second pass packs them.
// Rows of shared tiles are padded by 16 bytes: (KB + 16) / 16 is odd, so the 8 row addresses of
// one ldmatrix 8x16-byte matrix fall into 8 distinct 16-byte bank groups.

#include "mma_conv_common.cu"
#include "mma_conv_device.cu"
#include "mma_conv_kernel.cu"
