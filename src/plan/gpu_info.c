/*
 * gpu_info.c — datasheet peaks of known GPUs (mt_gpu_info.h).
 *
 * Numbers are NVIDIA's dense figures (the datasheets list bf16 "with
 * sparsity" at twice these). They are the denominators of MFU: model FLOPs
 * per second / the peak of the precision the GEMMs ran in.
 */
#include "mt_gpu_info.h"

#include <stdio.h>
#include <string.h>

struct gpu_peak {
    const char *match;   /* substring of the device name (first match wins: specific first) */
    double bf16, fp32;   /* FLOP/s, dense */
    const char *source;
};

static const struct gpu_peak PEAKS[] = {
    {"H100 NVL", 835e12, 60.0e12, "NVIDIA H100 NVL datasheet: 835 TFLOPS bf16 dense, 60 TFLOPS fp32"},
    {"H100 PCIe", 756e12, 51.2e12, "NVIDIA H100 PCIe datasheet: 756 TFLOPS bf16 dense, 51.2 TFLOPS fp32"},
    {"H100", 989.4e12, 66.9e12, "NVIDIA H100 SXM5 datasheet: 989.4 TFLOPS bf16 dense, 66.9 TFLOPS fp32"},
    {"H200 NVL", 835e12, 60.0e12, "NVIDIA H200 NVL datasheet: 835 TFLOPS bf16 dense, 60 TFLOPS fp32"},
    {"H200", 989.4e12, 66.9e12, "NVIDIA H200 SXM datasheet: 989.4 TFLOPS bf16 dense, 66.9 TFLOPS fp32"},
    {"A100", 312e12, 19.5e12, "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 19.5 TFLOPS fp32"},
};

double mt_gpu_datasheet_peak(const char *device_name, const char *precision, char *src, size_t n)
{
    if (src && n) src[0] = 0;
    if (!device_name || !precision) return 0;
    const int bf16 = !strcmp(precision, "bf16");
    if (!bf16 && strcmp(precision, "fp32")) return 0;
    for (size_t i = 0; i < sizeof PEAKS / sizeof PEAKS[0]; i++) {
        if (!strstr(device_name, PEAKS[i].match)) continue;
        if (src && n) snprintf(src, n, "%s (%s)", PEAKS[i].source, bf16 ? "bf16" : "fp32");
        return bf16 ? PEAKS[i].bf16 : PEAKS[i].fp32;
    }
    return 0;
}
