/*
 * mt_gpu_info.h — the receipt's GPU section (issue 19 item 5).
 *
 * On the cuda backend the receipt gets an object "gpu": the device (name,
 * count, compute capability, memory), driver / runtime / cuBLAS versions,
 * the precision and where it came from, peak device memory two ways (the
 * allocator's bucket peaks, which the plan predicts, and cudaMemGetInfo's
 * used bytes, which include the CUDA context and cuBLAS), the device's
 * datasheet peak for the precision with its source and the MFU against it,
 * and what did not run as asked (fallback_reason). Under the CPU emulator
 * every field is filled with the emulator's values and "emulated": true.
 */
#ifndef MT_GPU_INFO_H
#define MT_GPU_INFO_H

#include <stddef.h>

/* Dense (no sparsity) tensor-core peak in FLOP/s of a known device for
 * precision "bf16" or "fp32" (fp32: the non-tensor CUDA-core rate, what
 * cublasSgemm without TF32 runs on), from the device name as
 * cudaGetDeviceProperties reports it; the datasheet it comes from in `src`.
 * 0 (and src "") for a device not in the table. Pure. */
double mt_gpu_datasheet_peak(const char *device_name, const char *precision, char *src, size_t n);

#endif /* MT_GPU_INFO_H */
