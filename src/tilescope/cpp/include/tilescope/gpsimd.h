// tilescope/gpsimd.h -- the C++ API of tilescope's GpSimd custom operators.
//
// A custom operator is a *kernel function* that runs on the GpSimd engine's cores and a
// *shape function* that runs on the host and says what the output looks like. Both take
// the same arguments (tilescope::Tensor, double, int64_t or bool) and return a Tensor.
//
//   #include <tilescope/gpsimd.h>
//   using namespace tilescope;
//
//   Tensor negate(const Tensor& t_in) {                 // kernel function
//       Tensor t_out = get_dst_tensor();
//       uint32_t n = t_in.numel(), cores = get_cpu_count(), id = get_cpu_id();
//       size_t share = (n + cores - 1) / cores, begin = share * id;
//       size_t end = begin + share < n ? begin + share : n;
//       float* buf = (float*)tcm_malloc(sizeof(float) * 1024);
//       auto in = tcm_accessor(t_in);
//       auto out = tcm_accessor(t_out);
//       for (size_t i = begin; i < end; i += 1024) {
//           size_t count = end - i < 1024 ? end - i : 1024;
//           in.tensor_to_tcm<float>(buf, i, count);
//           for (size_t j = 0; j < count; j++) buf[j] = -buf[j];
//           out.tcm_to_tensor<float>(buf, i, count);
//       }
//       tcm_free(buf);
//       return t_out;
//   }
//
//   Tensor negate_shape(const Tensor& t_in) { return empty(t_in.sizes(), kFloat); }
//
//   TILESCOPE_LIBRARY(my_ops, m) { m.def("negate", &negate_shape, &negate); }
//
// Built by tilescope.cpp.load(...), the operator is torch.ops.my_ops.negate.
//
// Everything the kernel does with memory is checked: TCM allocations against the core's
// pool, accessor copies against both the tensor and the TCM buffer, writes against the
// output. A failed check raises an error that names the values, the limit and the line
// of your code that made the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#define TILESCOPE_GPSIMD_ABI 4

#if defined(__GNUC__) || defined(__clang__)
#define TILESCOPE_API __attribute__((visibility("default")))
#define TILESCOPE_HERE_FILE __builtin_FILE()
#define TILESCOPE_HERE_LINE __builtin_LINE()
#else
#define TILESCOPE_API
#define TILESCOPE_HERE_FILE "?"
#define TILESCOPE_HERE_LINE 0
#endif

namespace tilescope {

// ---- element types ------------------------------------------------------------------
// The codes match tilescope.cpp's Python side; the set is the simulated device's dtypes.
enum class ScalarType : int32_t {
    Float = 0, BFloat16 = 1, Half = 2, Int = 3, Short = 4, Char = 5, Byte = 6, Bool = 7,
};
constexpr ScalarType kFloat = ScalarType::Float, kFloat32 = ScalarType::Float;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kHalf = ScalarType::Half, kFloat16 = ScalarType::Half;
constexpr ScalarType kInt = ScalarType::Int, kInt32 = ScalarType::Int;
constexpr ScalarType kShort = ScalarType::Short, kInt16 = ScalarType::Short;
constexpr ScalarType kChar = ScalarType::Char, kInt8 = ScalarType::Char;
constexpr ScalarType kByte = ScalarType::Byte, kUInt8 = ScalarType::Byte;
constexpr ScalarType kBool = ScalarType::Bool;

// 16-bit floating-point storage types (bit patterns), with float conversions.
struct bfloat16 {
    uint16_t bits;
};
struct half {
    uint16_t bits;
};

inline float to_float(bfloat16 v) {
    uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
inline bfloat16 to_bfloat16(float f) {  // round to nearest even
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return bfloat16{static_cast<uint16_t>((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bfloat16{static_cast<uint16_t>(u >> 16)};
}
inline float to_float(half v) {
    uint32_t sign = (v.bits & 0x8000u) << 16, exp = (v.bits >> 10) & 0x1fu, man = v.bits & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man) {  // subnormal half -> normal float
        int e = -1;
        do { man <<= 1; ++e; } while (!(man & 0x400u));
        u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
    } else {
        u = sign;
    }
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
inline half to_half(float f) {  // round to nearest even
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return half{static_cast<uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u))};
    if (a >= 0x477ff000u) return half{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
    if (a < 0x38800000u) {  // below the smallest normal half: subnormal or zero
        if (a < 0x33000000u) return half{static_cast<uint16_t>(sign)};
        uint64_t man = (a & 0x7fffffu) | 0x800000u;  // 24-bit mantissa with the implicit one
        int drop = 126 - static_cast<int>(a >> 23);   // value / 2^-24 = man >> drop
        uint64_t keep = man >> drop, lost = man & ((1ull << drop) - 1ull), tie = 1ull << (drop - 1);
        if (lost > tie || (lost == tie && (keep & 1ull))) keep++;
        return half{static_cast<uint16_t>(sign | static_cast<uint32_t>(keep))};
    }
    uint32_t h = ((a >> 13) - (112u << 10));
    uint32_t lost = a & 0x1fffu;
    if (lost > 0x1000u || (lost == 0x1000u && (h & 1u))) h++;
    return half{static_cast<uint16_t>(sign | h)};
}

constexpr int kMaxDims = 8;

namespace detail {

// Layouts shared with tilescope.cpp's ctypes declarations: keep in sync (see ts_abi_sizes).
struct TensorDesc {
    void* data;
    int64_t sizes[kMaxDims];
    int64_t numel;
    int32_t ndim;
    int32_t dtype;
    int32_t role;   // 0: input argument, 1: the output (get_dst_tensor), 2: metadata only
    int32_t index;  // argument position (-1 for the output)
};
struct Arg {
    int32_t kind;  // 't' tensor, 'f' double, 'i' int64_t, 'b' bool
    int32_t pad;
    double f;
    int64_t i;
    TensorDesc t;
};
enum : int32_t { kRoleInput = 0, kRoleOutput = 1, kRoleMeta = 2 };

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr ScalarType value = kFloat; };
template <> struct dtype_of<bfloat16> { static constexpr ScalarType value = kBFloat16; };
template <> struct dtype_of<half> { static constexpr ScalarType value = kHalf; };
template <> struct dtype_of<int32_t> { static constexpr ScalarType value = kInt; };
template <> struct dtype_of<int16_t> { static constexpr ScalarType value = kShort; };
template <> struct dtype_of<int8_t> { static constexpr ScalarType value = kChar; };
template <> struct dtype_of<uint8_t> { static constexpr ScalarType value = kByte; };
template <> struct dtype_of<bool> { static constexpr ScalarType value = kBool; };
template <class T, class = void> struct has_dtype : std::false_type {};
template <class T> struct has_dtype<T, decltype((void)dtype_of<T>::value)> : std::true_type {};

// Runtime entry points (defined in the runtime source tilescope links into every library).
void* tcm_malloc(size_t nbytes, const char* file, int line);
void tcm_free(void* ptr, const char* file, int line);
void tensor_to_tcm(const TensorDesc& t, void* tcm_ptr, int32_t elem_dtype, size_t elem_size,
                   size_t offset, size_t count, const char* file, int line);
void tcm_to_tensor(const TensorDesc& t, const void* tcm_ptr, int32_t elem_dtype, size_t elem_size,
                   size_t offset, size_t count, const char* file, int line);
uint32_t cpu_id(const char* file, int line);
uint32_t cpu_count(const char* file, int line);
TensorDesc dst_tensor(const char* file, int line);
TensorDesc meta_tensor(const int64_t* sizes, int ndim, ScalarType dtype, const char* file, int line);
[[noreturn]] void fail(const std::string& message, const char* file, int line);

}  // namespace detail

// The error type of every failed check (the Python side re-raises it with its message).
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---- sizes ----------------------------------------------------------------------------
class IntArrayRef {
  public:
    IntArrayRef() = default;
    // {d0, d1, ...}: any integer types (size_t included), at most 8 dimensions.
    template <class... I, std::enable_if_t<(sizeof...(I) > 0) && (std::is_integral<I>::value && ...), int> = 0>
    IntArrayRef(I... dims) : n_(static_cast<int>(sizeof...(I))) {
        static_assert(sizeof...(I) <= kMaxDims, "a tensor has at most 8 dimensions");
        int k = 0;
        ((d_[k++] = static_cast<int64_t>(dims)), ...);
    }
    IntArrayRef(const int64_t* dims, int n) : n_(n) {
        for (int k = 0; k < n; ++k) d_[k] = dims[k];
    }
    size_t size() const { return static_cast<size_t>(n_); }
    const int64_t* begin() const { return d_; }
    const int64_t* end() const { return d_ + n_; }
    const int64_t* data() const { return d_; }
    int64_t operator[](size_t k) const { return d_[k]; }
    bool operator==(const IntArrayRef& o) const {
        if (n_ != o.n_) return false;
        for (int k = 0; k < n_; ++k)
            if (d_[k] != o.d_[k]) return false;
        return true;
    }
    bool operator!=(const IntArrayRef& o) const { return !(*this == o); }

  private:
    int64_t d_[kMaxDims] = {};
    int n_ = 0;
};

// ---- tensors --------------------------------------------------------------------------
// A handle on a tensor in device memory. Its data is reached only through TCM accessors.
class Tensor {
  public:
    Tensor() { desc_.role = detail::kRoleMeta; desc_.index = -2; }
    explicit Tensor(const detail::TensorDesc& d) : desc_(d) {}

    int64_t dim() const { return desc_.ndim; }
    int64_t numel() const { return desc_.numel; }
    IntArrayRef sizes() const { return IntArrayRef(desc_.sizes, desc_.ndim); }
    int64_t size(int64_t d, const char* file = TILESCOPE_HERE_FILE, int line = TILESCOPE_HERE_LINE) const {
        int64_t k = d < 0 ? d + desc_.ndim : d;
        if (k < 0 || k >= desc_.ndim)
            detail::fail("Tensor::size(" + std::to_string(d) + ") on a tensor with " + std::to_string(desc_.ndim) +
                             " dimensions (valid: -" + std::to_string(desc_.ndim) + " .. " +
                             std::to_string(desc_.ndim - 1) + ")",
                         file, line);
        return desc_.sizes[k];
    }
    ScalarType scalar_type() const { return static_cast<ScalarType>(desc_.dtype); }
    ScalarType dtype() const { return scalar_type(); }
    bool defined() const { return desc_.index != -2; }
    const detail::TensorDesc& desc() const { return desc_; }

  private:
    detail::TensorDesc desc_{};
};

// A tensor with a shape and dtype but no data: what a shape function returns.
inline Tensor empty(IntArrayRef sizes, ScalarType dtype, const char* file = TILESCOPE_HERE_FILE,
                    int line = TILESCOPE_HERE_LINE) {
    return Tensor(detail::meta_tensor(sizes.data(), static_cast<int>(sizes.size()), dtype, file, line));
}
inline Tensor zeros(IntArrayRef sizes, ScalarType dtype, const char* file = TILESCOPE_HERE_FILE,
                    int line = TILESCOPE_HERE_LINE) {
    return empty(sizes, dtype, file, line);
}

// TILESCOPE_CHECK(condition, message): fail with the message and this line when the
// condition is false (shape functions use it to reject arguments; kernels may too).
#define TILESCOPE_CHECK(cond, message)                                                          \
    do {                                                                                        \
        if (!(cond)) ::tilescope::detail::fail(std::string(message) + " (check failed: " #cond ")", \
                                               __FILE__, __LINE__);                             \
    } while (0)

// ---- cores ----------------------------------------------------------------------------
inline uint32_t get_cpu_id(const char* file = TILESCOPE_HERE_FILE, int line = TILESCOPE_HERE_LINE) {
    return detail::cpu_id(file, line);
}
inline uint32_t get_cpu_count(const char* file = TILESCOPE_HERE_FILE, int line = TILESCOPE_HERE_LINE) {
    return detail::cpu_count(file, line);
}
// The operator's output tensor. Kernels write their results into it through a TCM accessor.
inline Tensor get_dst_tensor(const char* file = TILESCOPE_HERE_FILE, int line = TILESCOPE_HERE_LINE) {
    return Tensor(detail::dst_tensor(file, line));
}

// ---- TCM scratch memory ---------------------------------------------------------------
// Each GpSimd core has a pool of TCM for user code (16 KB on NeuronCore-v2). New memory is
// filled with 0xFF bytes (NaN for floating-point types) so reads of unset values show.
inline void* tcm_malloc(size_t nbytes, const char* file = TILESCOPE_HERE_FILE, int line = TILESCOPE_HERE_LINE) {
    return detail::tcm_malloc(nbytes, file, line);
}
inline void tcm_free(void* ptr, const char* file = TILESCOPE_HERE_FILE, int line = TILESCOPE_HERE_LINE) {
    detail::tcm_free(ptr, file, line);
}

// ---- TCM accessors --------------------------------------------------------------------
// Copies between a tensor (indexed as if flattened) and a tcm_malloc'ed buffer. Each copy
// is one DMA transfer in the device model.
template <bool ReadOnly>
class TcmAccessor {
  public:
    explicit TcmAccessor(const Tensor& t) : t_(t.desc()) {}

    template <typename T>
    void tensor_to_tcm(T* tcm_ptr, size_t tensor_offset, size_t num_elem, const char* file = TILESCOPE_HERE_FILE,
                       int line = TILESCOPE_HERE_LINE) const {
        static_assert(detail::has_dtype<T>::value,
                      "tensor_to_tcm<T>: T must be float, tilescope::bfloat16, tilescope::half, int32_t, "
                      "int16_t, int8_t, uint8_t or bool");
        detail::tensor_to_tcm(t_, tcm_ptr, static_cast<int32_t>(detail::dtype_of<T>::value), sizeof(T),
                              tensor_offset, num_elem, file, line);
    }

    template <typename T>
    void tcm_to_tensor(const T* tcm_ptr, size_t tensor_offset, size_t num_elem,
                       const char* file = TILESCOPE_HERE_FILE, int line = TILESCOPE_HERE_LINE) const {
        static_assert(!ReadOnly,
                      "tcm_to_tensor needs a writable accessor: this one was made from a const Tensor (an "
                      "input). Write through tcm_accessor(t_out) with Tensor t_out = get_dst_tensor();");
        static_assert(detail::has_dtype<T>::value,
                      "tcm_to_tensor<T>: T must be float, tilescope::bfloat16, tilescope::half, int32_t, "
                      "int16_t, int8_t, uint8_t or bool");
        detail::tcm_to_tensor(t_, tcm_ptr, static_cast<int32_t>(detail::dtype_of<T>::value), sizeof(T),
                              tensor_offset, num_elem, file, line);
    }

  private:
    detail::TensorDesc t_;
};

inline TcmAccessor<true> tcm_accessor(const Tensor& t) { return TcmAccessor<true>(t); }
inline TcmAccessor<false> tcm_accessor(Tensor& t) { return TcmAccessor<false>(t); }

// ---- registration ---------------------------------------------------------------------
namespace detail {

using AnyFn = void (*)();
using ShapeThunk = void (*)(AnyFn fn, const Arg* args, TensorDesc* out);
using KernelThunk = void (*)(AnyFn fn, const Arg* args);

struct OpEntry {
    const char* lib;
    const char* name;
    const char* file;
    int line;
    int nargs;
    char kinds[17];
    AnyFn shape;
    AnyFn kernel;
    ShapeThunk shape_thunk;
    KernelThunk kernel_thunk;
};
void register_op(const OpEntry& entry);

template <class T> struct kind_of { static constexpr char value = 0; };
template <> struct kind_of<Tensor> { static constexpr char value = 't'; };
template <> struct kind_of<double> { static constexpr char value = 'f'; };
template <> struct kind_of<int64_t> { static constexpr char value = 'i'; };
template <> struct kind_of<bool> { static constexpr char value = 'b'; };
template <class T> using bare = std::remove_cv_t<std::remove_reference_t<T>>;

template <class T>
bare<T> unpack(const Arg& a) {
    using B = bare<T>;
    if constexpr (std::is_same<B, Tensor>::value) return Tensor(a.t);
    else if constexpr (std::is_same<B, double>::value) return a.f;
    else if constexpr (std::is_same<B, int64_t>::value) return a.i;
    else return a.i != 0;
}

template <class R, class... A, size_t... I>
R invoke(R (*f)(A...), const Arg* args, std::index_sequence<I...>) {
    std::tuple<bare<A>...> values{unpack<A>(args[I])...};
    return f(std::get<I>(values)...);
}

template <class... A>
void shape_thunk(AnyFn fn, const Arg* args, TensorDesc* out) {
    auto f = reinterpret_cast<Tensor (*)(A...)>(fn);
    *out = invoke(f, args, std::index_sequence_for<A...>{}).desc();
}

template <class... A>
void kernel_thunk(AnyFn fn, const Arg* args) {
    auto f = reinterpret_cast<Tensor (*)(A...)>(fn);
    (void)invoke(f, args, std::index_sequence_for<A...>{});
}

template <class A, class K>
constexpr bool same_kind() { return kind_of<bare<A>>::value == kind_of<bare<K>>::value; }

class Library {
  public:
    Library(const char* lib, const char* file, int line) : lib_(lib), file_(file), line_(line) {}

    // def(op_name, &shape_function, &kernel_function): both take the same arguments.
    template <class... S, class... K>
    Library& def(const char* name, Tensor (*shape)(S...), Tensor (*kernel)(K...),
                 int line = TILESCOPE_HERE_LINE) {
        static_assert(sizeof...(S) == sizeof...(K),
                      "m.def(name, shape, kernel): the shape function and the kernel must take the same "
                      "number of arguments");
        static_assert(sizeof...(S) <= 16, "a C++ operator takes at most 16 arguments");
        static_assert(((kind_of<bare<S>>::value != 0) && ...),
                      "shape function arguments must be tilescope::Tensor, double, int64_t or bool (as in "
                      "PyTorch custom operators: not float, int or long)");
        static_assert(((kind_of<bare<K>>::value != 0) && ...),
                      "kernel arguments must be tilescope::Tensor, double, int64_t or bool (as in PyTorch "
                      "custom operators: not float, int or long)");
        static_assert((same_kind<S, K>() && ...),
                      "m.def(name, shape, kernel): argument k of the shape function and of the kernel must "
                      "have the same type");
        OpEntry e{};
        e.lib = lib_;
        e.name = name;
        e.file = file_;
        e.line = line;
        e.nargs = static_cast<int>(sizeof...(S));
        const char kinds[] = {kind_of<bare<S>>::value..., 0};
        for (int k = 0; k <= e.nargs; ++k) e.kinds[k] = kinds[k];
        e.shape = reinterpret_cast<AnyFn>(shape);
        e.kernel = reinterpret_cast<AnyFn>(kernel);
        e.shape_thunk = &shape_thunk<S...>;
        e.kernel_thunk = &kernel_thunk<K...>;
        register_op(e);
        return *this;
    }

  private:
    const char* lib_;
    const char* file_;
    int line_;
};

struct LibraryRegistrar {
    LibraryRegistrar(const char* lib, const char* file, int line, void (*init)(Library&)) {
        Library m(lib, file, line);
        init(m);
    }
};

}  // namespace detail
}  // namespace tilescope

// TILESCOPE_LIBRARY(lib, m) { m.def("op", &op_shape, &op_kernel); ... }
// registers torch.ops.lib.op for every m.def in the block.
#define TILESCOPE_LIBRARY(lib, m)                                                                    \
    static void tilescope_library_init_##lib(::tilescope::detail::Library&);                        \
    static const ::tilescope::detail::LibraryRegistrar tilescope_library_registrar_##lib(            \
        #lib, __FILE__, __LINE__, &tilescope_library_init_##lib);                                    \
    static void tilescope_library_init_##lib(::tilescope::detail::Library& m)
