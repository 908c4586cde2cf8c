// CHAINED (a bind-time mode, not a config knob: BitserialKernel.bind(chained=True)): the kernel
// is launched as a programmatic dependent of the previous kernel on the stream (the previous
// layer, which writes x), so nothing may read x, xpop or the split workspace, or write any
// output, before grid_dependency_wait. Kernels call chain_begin first: it waits, except where
// CHAIN_EARLY_WEIGHTS (the in-place kernel with bulk weights) lets the block issue its weights'
// copies (layer constants) and prefetch its epilogue data first and wait after them
// (bitserial_wgmma.cu). When the next kernel may launch: CHAINED = 1 at once (chain_begin);
// CHAINED = 2 once the one-tile kernels have issued their last MMAs (chain_mmas_issued;
// persistent kernels: at exit), so that where several blocks fit an SM the blocks of later
// layers do not pile up on the SMs, waiting, while this layer's blocks still run.
constexpr bool CHAIN_EARLY_WEIGHTS = CHAINED && BULK_WEIGHTS;
__device__ __forceinline__ void chain_begin() {
  if constexpr (CHAINED == 1) launch_dependents();
  if constexpr (CHAINED && !CHAIN_EARLY_WEIGHTS) grid_dependency_wait();
}
__device__ __forceinline__ void chain_mmas_issued() {
  if constexpr (CHAINED == 2) launch_dependents();
}

