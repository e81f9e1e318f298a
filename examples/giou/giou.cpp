// Generalized IoU of aligned box pairs as a multicore GpSimd C++ operator.
//
//   out[..., k] = GIoU(boxes1[..., k, :], boxes2[..., k, :])   boxes as (x1, y1, x2, y2)
//
// The M = numel / 4 box pairs are split into 8 contiguous shares, one per GpSimd core
// (the first M % 8 cores take one pair more). Each core streams its share through its
// 16 KB TCM pool in chunks: two input transfers of 16 bytes per pair, one output transfer
// of 4 bytes per pair, 36 bytes of TCM per pair in flight.
#include <tilescope/gpsimd.h>

#include <algorithm>

using namespace tilescope;

namespace {
constexpr size_t kChunk = 448;  // pairs per chunk: 448 * 36 B = 16128 B of the 16384 B pool
}

Tensor giou(const Tensor& boxes1, const Tensor& boxes2, double eps_d) {
    Tensor t_out = get_dst_tensor();
    const size_t pairs = static_cast<size_t>(boxes1.numel() / 4);
    const size_t cores = get_cpu_count(), id = get_cpu_id();
    const size_t base = pairs / cores, extra = pairs % cores;
    const size_t begin = id * base + std::min(id, extra);
    const size_t end = begin + base + (id < extra ? 1 : 0);
    const float eps = static_cast<float>(eps_d);

    float* a = static_cast<float*>(tcm_malloc(sizeof(float) * 4 * kChunk));
    float* g = static_cast<float*>(tcm_malloc(sizeof(float) * 4 * kChunk));
    float* res = static_cast<float*>(tcm_malloc(sizeof(float) * kChunk));
    auto in1 = tcm_accessor(boxes1);
    auto in2 = tcm_accessor(boxes2);
    auto out = tcm_accessor(t_out);
    for (size_t p = begin; p < end; p += kChunk) {
        const size_t n = std::min(kChunk, end - p);
        in1.tensor_to_tcm<float>(a, 4 * p, 4 * n);
        in2.tensor_to_tcm<float>(g, 4 * p, 4 * n);
        for (size_t j = 0; j < n; ++j) {
            const float x1 = a[4 * j], y1 = a[4 * j + 1], x2 = a[4 * j + 2], y2 = a[4 * j + 3];
            const float x1g = g[4 * j], y1g = g[4 * j + 1], x2g = g[4 * j + 2], y2g = g[4 * j + 3];
            const float iw = std::max(std::min(x2, x2g) - std::max(x1, x1g), 0.0f);
            const float ih = std::max(std::min(y2, y2g) - std::max(y1, y1g), 0.0f);
            const float inter = iw * ih;
            const float uni = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter;
            const float iou = inter / (uni + eps);
            const float area_c = (std::max(x2, x2g) - std::min(x1, x1g)) * (std::max(y2, y2g) - std::min(y1, y1g));
            res[j] = iou - (area_c - uni) / (area_c + eps);
        }
        out.tcm_to_tensor<float>(res, p, n);
    }
    tcm_free(res);
    tcm_free(g);
    tcm_free(a);
    return t_out;
}
