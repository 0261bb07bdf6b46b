/*
 * test_gpu_info.c — the datasheet peaks behind the cuda receipt's MFU
 * (src/plan/gpu_info.c): device names as cudaGetDeviceProperties reports
 * them map to the right part (the specific variants NVL / PCIe before the
 * plain name), the precision picks the tensor-core bf16 or the CUDA-core
 * fp32 figure, and anything else is 0 with no source (the receipt then says
 * "device not in the table" and keeps the measured roof).
 */
#include <stdio.h>
#include <string.h>

#include "../src/plan/mt_gpu_info.h"
#include "mt_test.h"

static void expect(const char *dev, const char *prec, double want, const char *src_has)
{
    char src[200];
    double got = mt_gpu_datasheet_peak(dev, prec, src, sizeof src);
    int ok = got == want && (src_has ? strstr(src, src_has) != NULL : src[0] == 0);
    printf("%-4s %-28s %-5s -> %.4g (%s)\n", ok ? "ok" : "FAIL", dev ? dev : "(null)", prec ? prec : "(null)", got, src);
    n_fail += !ok;
}

int main(void)
{
    expect("NVIDIA H100 80GB HBM3", "bf16", 989.4e12, "H100 SXM5");
    expect("NVIDIA H100 80GB HBM3", "fp32", 66.9e12, "(fp32)");
    expect("NVIDIA H100 PCIe", "bf16", 756e12, "H100 PCIe");
    expect("NVIDIA H100 NVL", "bf16", 835e12, "H100 NVL");
    expect("NVIDIA H200", "bf16", 989.4e12, "H200 SXM");
    expect("NVIDIA H200 NVL", "fp32", 60.0e12, "H200 NVL");
    expect("NVIDIA A100-SXM4-80GB", "bf16", 312e12, "A100");
    expect("meshtrain CPU emulation of sm_90", "bf16", 0, NULL);
    expect("NVIDIA H100 80GB HBM3", "fp16", 0, NULL);
    expect(NULL, "bf16", 0, NULL);
    printf("test_gpu_info: %s\n", n_fail ? "FAILED" : "all checks passed");
    return n_fail != 0;
}
