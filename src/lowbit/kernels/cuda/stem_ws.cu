// CUDA C++ text of the warp-specialized first layer (rendered by `stem_ws.py`).
//
// `stem_ws.render` prepends #define'd constants (the image, the tile and the outputs, see
// `stem_ws.PRELUDE_NAMES`) to this file. One CTA per SM, persistent over tiles (image, band
// of pooled rows, block of pooled columns); 64 output channels per CTA (grid axis 1).
//
// - PRODUCER_WARPS producer warps: each fills whole ring slots in turn (fill f: warp
//   f % PRODUCER_WARPS). A fill is one pair of space-to-depth rows of the tile: the image
//   values loaded (chunks of EPC values a lane, the next chunk in flight while this one is
//   quantized), quantized (the float image by thresholds equal to IEEE division, `quantize_by_thresholds`,
//   or by division for extreme scales; the uint8 image by its table) and stored
//   as 4C-byte pixels (byte (d C + c) 2 + e of image pixel (2 (Y - PS) + d, 2 (X - PS) + e),
//   channel c). Slot f % NSLOT; the producer waits for the slot's "empty" mbarrier (its
//   previous fill consumed) before its first store, and arrives on its "full" mbarrier.
// - 2 x GROUPS consumer warps: warp (h, gi) owns channels 32h .. 32h + 31 of the CTA's 64
//   and pooled columns gi JW .. gi JW + JW - 1 of the tile (JW = 4 NT_W - 1). Per pooled row
//   t (a step) it waits for the slot of the step's newest pair, then per n-tile (4 pooled
//   columns) runs the two conv rows 2t - PP + 1, 2t - PP + 2 as int8 mma.sync m16n8k32
//   (weights [16 channels, K] in registers as the A operand, windows [K, 8 conv columns] as
//   B read from the ring with 32-bit shared loads; K = 64 C bytes), pools (conv columns of a
//   pair in one thread, the window's third column from the quad neighbour by one shuffle,
//   the carried row in registers) and writes the outputs of the pooled int32 values; then
//   it arrives on the slot of the step's oldest pair ("empty").
// Producers and consumers never wait for each other except through the ring's mbarriers, and
// consumer warps never wait for each other: quantization, MMA and epilogue of different
// rows overlap across warps.

#include "stem_ws_common.cu"
#include "mma_conv_device.cu"
#include "stem_ws_device.cu"
#include "stem_ws_kernel.cu"
