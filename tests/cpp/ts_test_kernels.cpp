// Kernels of tilescope's C++ operator tests: correct ones, and one per classic mistake.
#include <tilescope/gpsimd.h>

#include <algorithm>

using namespace tilescope;

namespace {
struct Rows {
    size_t rows, row_size;
};
Rows rows_of(const Tensor& x) {
    size_t rows = x.dim() ? static_cast<size_t>(x.size(0)) : 1;
    return Rows{rows, rows ? static_cast<size_t>(x.numel()) / rows : 0};
}
void scale_row(const TcmAccessor<true>& in, const TcmAccessor<false>& out, float* buf, size_t offset, size_t n,
               float alpha) {
    in.tensor_to_tcm<float>(buf, offset, n);
    for (size_t j = 0; j < n; ++j) buf[j] *= alpha;
    out.tcm_to_tensor<float>(buf, offset, n);
}
}  // namespace

// Correct: the first rows % cores cores take one row more; row i of core c starts at
// (start_row(c) + i) * row_size.
Tensor scale_rows(const Tensor& x, double alpha) {
    Tensor out = get_dst_tensor();
    Rows r = rows_of(x);
    const size_t cores = get_cpu_count(), id = get_cpu_id();
    const size_t base = r.rows / cores, extra = r.rows % cores;
    const size_t start = id * base + std::min(id, extra), count = base + (id < extra ? 1 : 0);
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * r.row_size));
    for (size_t i = 0; i < count; ++i)
        scale_row(tcm_accessor(x), tcm_accessor(out), buf, (start + i) * r.row_size, r.row_size,
                  static_cast<float>(alpha));
    tcm_free(buf);
    return out;
}

// The classic mistake: the partition offset is not scaled by the row size.
Tensor scale_rows_bad_offset(const Tensor& x, double alpha) {
    Tensor out = get_dst_tensor();
    Rows r = rows_of(x);
    const size_t partition = r.rows / get_cpu_count(), cpu_id = get_cpu_id(), row_size = r.row_size;
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * row_size));
    auto in_acc = tcm_accessor(x);
    auto out_acc = tcm_accessor(out);
    for (size_t i = 0; i < partition; ++i) {
        in_acc.tensor_to_tcm<float>(buf, partition * cpu_id + i * row_size, row_size);
        for (size_t j = 0; j < row_size; ++j) buf[j] *= static_cast<float>(alpha);
        out_acc.tcm_to_tensor<float>(buf, partition * cpu_id + i * row_size, row_size);
    }
    tcm_free(buf);
    return out;
}

// Forgets the remainder when rows do not divide evenly among the cores.
Tensor scale_rows_no_tail(const Tensor& x, double alpha) {
    Tensor out = get_dst_tensor();
    Rows r = rows_of(x);
    const size_t partition = r.rows / get_cpu_count(), cpu_id = get_cpu_id();
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * r.row_size));
    for (size_t i = 0; i < partition; ++i)
        scale_row(tcm_accessor(x), tcm_accessor(out), buf, (partition * cpu_id + i) * r.row_size, r.row_size,
                  static_cast<float>(alpha));
    tcm_free(buf);
    return out;
}

// Asks for more TCM than the pool has left.
Tensor tcm_hog(const Tensor& x, int64_t first, int64_t second) {
    void* a = tcm_malloc(static_cast<size_t>(first));
    void* b = tcm_malloc(static_cast<size_t>(second));  // the failing request
    tcm_free(b);
    tcm_free(a);
    return get_dst_tensor();
}

// Reads past the end of its input.
Tensor read_past_end(const Tensor& x, int64_t extra) {
    float* buf = static_cast<float*>(tcm_malloc(4096));
    tcm_accessor(x).tensor_to_tcm<float>(buf, static_cast<size_t>(x.numel()) - 8, 8 + static_cast<size_t>(extra));
    tcm_free(buf);
    return get_dst_tensor();
}

// Copies more elements than its TCM buffer holds.
Tensor overflow_tcm(const Tensor& x) {
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * 64));
    tcm_accessor(x).tensor_to_tcm<float>(buf, 0, 100);
    tcm_free(buf);
    return get_dst_tensor();
}

// Writes past the end of a TCM buffer with a plain loop (caught by the guard bytes).
Tensor overrun_buffer(const Tensor& x) {
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * 16));
    for (int j = 0; j <= 16; ++j) buf[j] = 0.0f;
    tcm_free(buf);
    return get_dst_tensor();
}

// Writes into an input tensor.
Tensor write_input(const Tensor& x) {
    Tensor y = x;
    float* buf = static_cast<float*>(tcm_malloc(64));
    tcm_accessor(y).tcm_to_tensor<float>(buf, 0, 4);
    tcm_free(buf);
    return get_dst_tensor();
}

// Uses the wrong element type for a float32 tensor.
Tensor wrong_type(const Tensor& x) {
    int32_t* buf = static_cast<int32_t*>(tcm_malloc(64));
    tcm_accessor(x).tensor_to_tcm<int32_t>(buf, 0, 4);
    tcm_free(buf);
    return get_dst_tensor();
}

// Single-core style: everything from one core, leaking its buffer.
Tensor copy_leaky(const Tensor& x) {
    Tensor out = get_dst_tensor();
    if (get_cpu_id() != 0) return out;
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * x.numel()));
    tcm_accessor(x).tensor_to_tcm<float>(buf, 0, x.numel());
    tcm_accessor(out).tcm_to_tensor<float>(buf, 0, x.numel());
    return out;
}

// Every scalar kind: out = x * a + k (+1 when flag).
Tensor axpb(const Tensor& x, double a, int64_t k, bool flag) {
    Tensor out = get_dst_tensor();
    if (get_cpu_id() != 0) return out;
    const size_t n = static_cast<size_t>(x.numel());
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * 256));
    for (size_t i = 0; i < n; i += 256) {
        size_t c = std::min<size_t>(256, n - i);
        tcm_accessor(x).tensor_to_tcm<float>(buf, i, c);
        for (size_t j = 0; j < c; ++j) buf[j] = buf[j] * static_cast<float>(a) + static_cast<float>(k) + (flag ? 1.f : 0.f);
        tcm_accessor(out).tcm_to_tensor<float>(buf, i, c);
    }
    tcm_free(buf);
    return out;
}

// float32 -> float16 and bfloat16 bit patterns (int16), and float16 bits -> float32.
Tensor to_half_bits(const Tensor& x, bool bf16) {
    Tensor out = get_dst_tensor();
    if (get_cpu_id() != 0) return out;
    const size_t n = static_cast<size_t>(x.numel());
    float* f = static_cast<float*>(tcm_malloc(sizeof(float) * 512));
    int16_t* h = static_cast<int16_t*>(tcm_malloc(sizeof(int16_t) * 512));
    for (size_t i = 0; i < n; i += 512) {
        size_t c = std::min<size_t>(512, n - i);
        tcm_accessor(x).tensor_to_tcm<float>(f, i, c);
        for (size_t j = 0; j < c; ++j)
            h[j] = static_cast<int16_t>(bf16 ? to_bfloat16(f[j]).bits : to_half(f[j]).bits);
        tcm_accessor(out).tcm_to_tensor<int16_t>(h, i, c);
    }
    tcm_free(h);
    tcm_free(f);
    return out;
}

Tensor from_half_bits(const Tensor& x, bool bf16) {
    Tensor out = get_dst_tensor();
    if (get_cpu_id() != 0) return out;
    const size_t n = static_cast<size_t>(x.numel());
    int16_t* h = static_cast<int16_t*>(tcm_malloc(sizeof(int16_t) * 512));
    float* f = static_cast<float*>(tcm_malloc(sizeof(float) * 512));
    for (size_t i = 0; i < n; i += 512) {
        size_t c = std::min<size_t>(512, n - i);
        tcm_accessor(x).tensor_to_tcm<int16_t>(h, i, c);
        for (size_t j = 0; j < c; ++j) {
            uint16_t b = static_cast<uint16_t>(h[j]);
            f[j] = bf16 ? to_float(bfloat16{b}) : to_float(half{b});
        }
        tcm_accessor(out).tcm_to_tensor<float>(f, i, c);
    }
    tcm_free(f);
    tcm_free(h);
    return out;
}

// Data-dependent transfers: the chunk size is the input's first element (1..256).
Tensor chunked_copy(const Tensor& x) {
    Tensor out = get_dst_tensor();
    if (get_cpu_id() != 0) return out;
    const size_t n = static_cast<size_t>(x.numel());
    float* buf = static_cast<float*>(tcm_malloc(sizeof(float) * 256));
    tcm_accessor(x).tensor_to_tcm<float>(buf, 0, 1);
    size_t chunk = buf[0] < 1.f ? 1 : (buf[0] > 256.f ? 256 : static_cast<size_t>(buf[0]));
    for (size_t i = 0; i < n; i += chunk) {
        size_t c = std::min(chunk, n - i);
        tcm_accessor(x).tensor_to_tcm<float>(buf, i, c);
        tcm_accessor(out).tcm_to_tensor<float>(buf, i, c);
    }
    tcm_free(buf);
    return out;
}
