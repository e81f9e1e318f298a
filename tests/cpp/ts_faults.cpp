// Kernels with the bugs users write: each must stop the kernel with a CppKernelError naming
// the core and the line (marked FAULT: ...), never the Python process (tests/test_cpp_faults.py).
#include <tilescope/gpsimd.h>

#include <cassert>
#include <cstdint>
#include <cstdlib>

using namespace tilescope;

namespace {
int deep(int n) {
    volatile char frame[512];
    frame[0] = static_cast<char>(n);
    return deep(n + 1) + frame[0];  // FAULT: recursion
}
}  // namespace

// mode: 0 copies x (a correct kernel), 1 writes through a null pointer made from data,
// 2 runs past a 256-byte TCM buffer by 1 KB (inside the pool), 3 runs far past the pool,
// 4 divides by zero, 5 recurses forever, 6 fails an assert, 7 loops forever when x[0] >= 0, 8 reads
// through a null pointer on core 3 only
Tensor faulty(const Tensor& x, int64_t mode, int64_t zero) {
    Tensor out = get_dst_tensor();
    const uint32_t id = get_cpu_id(), cores = get_cpu_count();
    const int64_t n = x.numel();
    const int64_t share = (n + cores - 1) / cores, begin = share * id;
    const int64_t end = begin + share < n ? begin + share : n;
    float* buf = static_cast<float*>(tcm_malloc(256));
    if (mode == 1) {
        float* p = reinterpret_cast<float*>(static_cast<uintptr_t>(zero));
        *p = 1.0f;  // FAULT: null write
    }
    if (mode == 2)
        for (int i = 0; i < 320; ++i) buf[i] = static_cast<float>(i);  // FAULT: overrun in pool
    if (mode == 3)
        for (int64_t i = 0; i < (1 << 22); ++i) buf[i] = 1.0f;  // FAULT: overrun past pool
    if (mode == 4) buf[0] = static_cast<float>(n / zero);  // FAULT: division
    if (mode == 5) buf[0] = static_cast<float>(deep(static_cast<int>(zero)));
    if (mode == 6) assert(zero != 0 && "zero must not be 0");  // FAULT: assert
    if (mode == 7) {  // loops while x[0] >= 0
        tcm_accessor(x).tensor_to_tcm<float>(buf, 0, 1);
        volatile int64_t k = 0;
        while (buf[0] >= 0.0f) k = k + 1;  // FAULT: infinite loop
    }
    if (mode == 8 && id == 3) {
        float* p = reinterpret_cast<float*>(static_cast<uintptr_t>(zero));
        buf[0] = *p;  // FAULT: null read on core 3
    }
    auto in = tcm_accessor(x);
    auto o = tcm_accessor(out);
    for (int64_t i = begin; i < end; i += 64) {
        const int64_t count = end - i < 64 ? end - i : 64;
        in.tensor_to_tcm<float>(buf, i, count);
        o.tcm_to_tensor<float>(buf, i, count);
    }
    tcm_free(buf);
    return out;
}

Tensor faulty_shape(const Tensor& x, int64_t mode, int64_t zero) { return empty(x.sizes(), kFloat); }

TILESCOPE_LIBRARY(ts_faults, m) { m.def("faulty", &faulty_shape, &faulty); }
