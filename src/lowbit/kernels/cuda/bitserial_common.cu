// What every bit-serial kernel includes, in order: the derived constants and row geometry, the
// device primitives (which the host emulation replaces), the chained-launch hooks, the side
// tables' kernels, operand staging, the accumulators, the kernels' arguments and the fused
// epilogue. Each family's entry file (bitserial_mma_sync.cu, bitserial_mma_sync_persistent.cu,
// bitserial_wgmma.cu, bitserial_wgmma_persistent.cu, bitserial_tap_shift.cu) includes this
// first; bitserial_render.py expands the includes after the rendered constexpr parameters.

#include "bitserial_params.cu"
#include "bitserial_device.cu"
#include "bitserial_chain.cu"
#include "bitserial_side_tables.cu"
#include "bitserial_staging.cu"
#include "bitserial_accumulators.cu"
#include "bitserial_kernel_args.cu"
#include "bitserial_epilogue.cu"
