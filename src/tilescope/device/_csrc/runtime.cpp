// The sim device's native runtime: memory, device guard, generators, hooks and
// the metadata-only kernels. Everything that computes lives in Python
// (tilescope.device); this file holds only what PyTorch requires in C++ or what
// is on the per-op hot path.
#include "sim.h"

#include <ATen/ATen.h>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/resize_cpu_dispatch.h>
#include <torch/csrc/Generator.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/view_cpu_dispatch.h>
#include <ATen/ops/_reshape_alias_cpu_dispatch.h>
#include <ATen/ops/unfold_cpu_dispatch.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/CallOnce.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tilescope_sim {

constexpr int kMaxDevices = 16;
static std::atomic<int> g_device_count{1};
thread_local int t_current_device = 0;

// ---- memory ---------------------------------------------------------------
// A block of host memory standing in for device HBM. Reference counted so that
// CPU views handed to the numerics worker keep it alive after the tensor that
// owned it is resized or freed.
struct Block {
  std::atomic<int64_t> refs{1};
  void* ptr = nullptr;
  size_t nbytes = 0;
  int device = 0;
  c10::Storage* owner = nullptr;  // the CPU storage of adopted memory (see adopt)
};

struct DeviceStats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> frees{0};
  std::atomic<int64_t> limit{INT64_MAX};
};
static DeviceStats g_stats[kMaxDevices];

// Freed blocks are kept for reuse by size (like CUDA's caching allocator), so a training
// loop does not map and fault in fresh host pages for every activation. torch.sim.empty_cache()
// returns them.
static std::mutex g_cache_mutex;
static std::unordered_multimap<size_t, void*> g_cache;
static size_t g_cached_bytes = 0;
constexpr size_t kCacheLimit = size_t(2) << 30;  // bytes of freed blocks kept at most
// smaller blocks go straight back to malloc (whose per-thread caches serve them); 16 KB ones
// churned through malloc cost a loop of small ops more than the op itself (consolidation,
// frees on another thread than the allocation)
constexpr size_t kCacheMin = size_t(1) << 10;

static void keep_memory(void*) {}  // the deleter of CPU memory a device block took over (adopt)

// An adopted block's CPU storage, released: true when the memory is the block's to cache or free;
// false when a CPU tensor still uses it, which then frees it as CPU's allocator would.
static bool release_adopted(Block* b) {
  c10::Storage* owner = b->owner;
  b->owner = nullptr;
  const bool mine = owner->use_count() == 1;
  if (!mine) owner->mutable_data_ptr().compare_exchange_deleter(&keep_memory, c10::GetDefaultCPUAllocator()->raw_deleter());
  delete owner;
  return mine;
}

static void release_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  if (b->refs.fetch_sub(1) == 1) {
    g_stats[b->device].allocated -= static_cast<int64_t>(b->nbytes);
    g_stats[b->device].frees += 1;
    bool kept = false;
    if (b->owner != nullptr && !release_adopted(b)) {
      kept = true;  // its CPU storage frees it
    } else if (b->ptr != nullptr && b->nbytes >= kCacheMin) {
      std::lock_guard<std::mutex> lock(g_cache_mutex);
      if (g_cached_bytes + b->nbytes <= kCacheLimit) {
        g_cache.emplace(b->nbytes, b->ptr);
        g_cached_bytes += b->nbytes;
        kept = true;
      }
    }
    if (!kept) std::free(b->ptr);
    delete b;
  }
}

static void* cached_block(size_t nbytes) {
  if (nbytes < kCacheMin) return nullptr;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  auto it = g_cache.find(nbytes);
  if (it == g_cache.end()) return nullptr;
  void* p = it->second;
  g_cache.erase(it);
  g_cached_bytes -= nbytes;
  return p;
}

static int64_t empty_cache() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  int64_t freed = static_cast<int64_t>(g_cached_bytes);
  for (auto& kv : g_cache) std::free(kv.second);
  g_cache.clear();
  g_cached_bytes = 0;
  return freed;
}

static std::string human(int64_t n) {
  char buf[64];
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (n >= (1LL << 30)) snprintf(buf, sizeof buf, "%.2f GiB", n / gib);
  else if (n >= (1LL << 20)) snprintf(buf, sizeof buf, "%.2f MiB", n / (1024.0 * 1024.0));
  else snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(n));
  return buf;
}

static std::string g_backend_name = "sim";

// Counts nbytes more on device against its HBM limit (an out-of-memory error past it).
static void account(size_t nbytes, int device) {
  TORCH_CHECK(device >= 0 && device < g_device_count.load(), g_backend_name, ":", device,
              " does not exist: this process has ", g_device_count.load(), " ", g_backend_name,
              " devices (cores of the preset's chip)");
  auto& st = g_stats[device];
  int64_t now = st.allocated.load();
  const int64_t limit = st.limit.load();
  if (now + static_cast<int64_t>(nbytes) > limit) {
    worker_release_finished();  // memory only finished device work still held
    now = st.allocated.load();
  }
  if (now + static_cast<int64_t>(nbytes) > limit) {
    TORCH_CHECK_WITH(OutOfMemoryError, false,
        g_backend_name, " out of memory. Tried to allocate ", human(nbytes), " (device ",
        g_backend_name, ":", device, "; ", human(limit), " total capacity of the preset's HBM per core; ",
        human(now), " already allocated; ", human(limit - now), " free). Free tensors you no longer need "
        "(del them; pending device work keeps its inputs alive until it completes: call torch.",
        g_backend_name, ".synchronize()), use smaller batches, or choose a preset with more HBM.");
  }
  const int64_t after = st.allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  st.allocations += 1;
  int64_t peak = st.peak.load();
  while (after > peak && !st.peak.compare_exchange_weak(peak, after)) {}
}

static at::DataPtr allocate_on(size_t nbytes, int device) {
  account(nbytes, device);  // (the device index and the limit, before any host memory is taken)
  void* p = nbytes > 0 ? cached_block(nbytes) : nullptr;
  if (nbytes > 0 && p == nullptr && (posix_memalign(&p, 64, nbytes) != 0 || p == nullptr)) {
    g_stats[device].allocated -= static_cast<int64_t>(nbytes);
    g_stats[device].allocations -= 1;
    TORCH_CHECK_WITH(OutOfMemoryError, false, g_backend_name, " out of memory: the host could not provide ",
                     human(nbytes), " to back device memory");
  }
  auto* b = new Block();
  b->ptr = p;
  b->nbytes = nbytes;
  b->device = device;
  return {p, b, &release_block, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))};
}

struct SimAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override { return allocate_on(nbytes, t_current_device); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }
};
static SimAllocator g_allocator;

// Pinned host memory: plain host memory, remembered so is_pinned() can answer.
static std::mutex g_pinned_mutex;
static std::unordered_set<const void*> g_pinned;

static void release_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(p);
  }
  std::free(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nullptr;
    if (nbytes > 0) {
      TORCH_CHECK(posix_memalign(&p, 64, nbytes) == 0 && p, "could not allocate ", human(nbytes), " of pinned host memory");
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(p);
    }
    return {p, p, &release_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }
};
static PinnedAllocator g_pinned_allocator;

// ---- synchronisation: the Python runtime knows when the device is done ------------
static py::object* g_sync_callback = nullptr;  // leaked on purpose: alive until process exit

static void call_sync(int index) {
  if (g_sync_callback == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  (*g_sync_callback)(index);
}

// ---- device guard ------------------------------------------------------------
struct SimGuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;
  SimGuardImpl() = default;
  explicit SimGuardImpl(c10::DeviceType t) { TORCH_INTERNAL_ASSERT(t == static_type); }
  c10::DeviceType type() const override { return static_type; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.has_index()) t_current_device = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(static_type, static_cast<c10::DeviceIndex>(t_current_device)); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.index() < g_device_count.load(), "invalid device index ", static_cast<int>(d.index()));
    if (d.has_index()) t_current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) t_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(g_device_count.load()); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override { call_sync(stream.device_index()); }
  void synchronizeDevice(const c10::DeviceIndex index) const override { call_sync(index); }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuardImpl);

// ---- generators -----------------------------------------------------------------
struct SimGeneratorImpl : public at::CPUGeneratorImpl {
  explicit SimGeneratorImpl(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

static std::vector<at::Generator> g_default_generators;
static std::mutex g_gen_mutex;

static const at::Generator& default_generator(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(g_gen_mutex);
  if (g_default_generators.empty()) {
    for (int i = 0; i < kMaxDevices; ++i) {
      g_default_generators.push_back(at::make_generator<SimGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
    }
  }
  int idx = index < 0 ? t_current_device : index;
  TORCH_CHECK(idx < g_device_count.load(), "invalid ", g_backend_name, " device index ", idx);
  return g_default_generators[idx];
}

// ---- hooks -----------------------------------------------------------------------
struct SimHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(g_device_count.load()); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(t_current_device); }
  void setCurrentDevice(c10::DeviceIndex d) const override { t_current_device = d; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override { int old = t_current_device; t_current_device = d; return old; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override { return default_generator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<SimGeneratorImpl>(index < 0 ? static_cast<c10::DeviceIndex>(t_current_device) : index);
  }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(c10::DeviceType::PrivateUse1, 0); }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    return g_pinned.count(data) > 0;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    TORCH_CHECK(false, "resizing ", g_backend_name, " storages in place is not supported; allocate a new tensor");
  }
};

// ---- kernels: allocation and metadata-only ops ------------------------------------------
static bool supported_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: case c10::kBFloat16: case c10::kHalf: case c10::kDouble: case c10::kLong: case c10::kInt:
    case c10::kShort: case c10::kChar: case c10::kByte: case c10::kBool: case c10::ScalarType::Float8_e4m3fn:
    case c10::kComplexHalf: case c10::kComplexFloat: case c10::kComplexDouble:
      return true;
    default:
      return false;
  }
}

static std::string torch_name(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble: return "torch.float64";
    case c10::kComplexFloat: return "torch.complex64";
    case c10::kComplexDouble: return "torch.complex128";
    case c10::kComplexHalf: return "torch.complex32";
    case c10::ScalarType::UInt16: return "torch.uint16";
    case c10::ScalarType::UInt32: return "torch.uint32";
    case c10::ScalarType::UInt64: return "torch.uint64";
    case c10::ScalarType::Float8_e5m2: return "torch.float8_e5m2";
    default: return std::string("torch.") + c10::toString(t);
  }
}

static void check_dtype(c10::ScalarType t) {
  TORCH_CHECK_TYPE(supported_dtype(t), "the ", g_backend_name, " device does not support ", torch_name(t),
      " tensors: Trainium-class engines have no ", torch_name(t), " arithmetic. Supported dtypes: "
      "float32, bfloat16, float16, float8_e4m3fn, int64, int32, int16, int8, uint8, bool (float64 and "
      "complex are accepted for compatibility, computed on the host and modeled as float32). Fix: convert "
      "first, e.g. .to(torch.float32) or .to(torch.int32), before moving it to the device.");
}

static int device_index_of(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) return device->index();
  return t_current_device;
}

at::Tensor empty_strided_on(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype, int device) {
  check_dtype(dtype);
  const int saved = t_current_device;
  t_current_device = device;
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  at::Tensor t;
  try {
    t = at::detail::empty_strided_generic(size, stride, &g_allocator, ks, dtype);
  } catch (...) {
    t_current_device = saved;
    throw;
  }
  t_current_device = saved;
  return t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "the ", g_backend_name, " device supports strided tensors only");
  const auto dt = c10::dtype_or_default(dtype);
  check_dtype(dt);
  const int saved = t_current_device;
  t_current_device = device_index_of(device);
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  at::Tensor t;
  try {
    t = at::detail::empty_generic(size, &g_allocator, ks, dt, memory_format);
  } catch (...) {
    t_current_device = saved;
    throw;
  }
  t_current_device = saved;
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "the ", g_backend_name, " device supports strided tensors only");
  return empty_strided_on(size, stride, c10::dtype_or_default(dtype), device_index_of(device));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<int64_t> offset) {
  return at::cpu::as_strided(self, size, stride, offset);
}
at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::cpu::view(self, size); }
at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::_reshape_alias(self, size, stride);
}
at::Tensor unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) { return at::cpu::unfold(self, dim, size, step); }
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, source, offset, size, stride);
}
at::Tensor& set_storage_only(at::Tensor& self, c10::Storage source) { return at::cpu::set_(self, source); }
at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::cpu::set_(self, source); }
at::Tensor& set_empty(at::Tensor& self) { return at::cpu::set_(self); }

// nn.Module.to / .cpu() / .half() choose between moving each Parameter in place (``param.data =
// moved``, which keeps its identity, so tied weights stay one Parameter and optimizers keep it) and
// making a new Parameter, by asking this. PyTorch's own answer is yes for two dense tensors of its
// in-tree backends (CPU, CUDA, ...) and no for PrivateUse1; this device's tensors are plain dense
// TensorImpls like theirs, so a shallow copy between them is as sound: answer as for CUDA.
static bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](c10::DispatchKeySet ks) {
    constexpr auto backends = c10::DispatchKeySet(
        {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
         c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
         c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(backends);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self.key_set()) && dense(from.key_set()));
}

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", fused_sdp_choice);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_storage_only);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
}

// ---- autocast: the same op lists and policies as CUDA -----------------------------
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

#define TS_LOW_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TS_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TS_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TS_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

}  // namespace tilescope_sim

namespace at::autocast {  // the op lists name Tensor, ScalarType, ... unqualified
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TS_LOW_PRECISION)
  AT_FORALL_FP32(TS_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TS_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TS_PROMOTE)
}
}  // namespace at::autocast

namespace tilescope_sim {

// scaled_dot_product_attention on this device: the fused ("overrideable") kernel, whose
// forward and backward are single device executions defined in Python (dropout included),
// for 3-D/4-D inputs whose key/value heads the query heads share evenly (enable_gqa, or a
// single key/value head, which the math path broadcasts too). Otherwise -- or when the user
// disables the fused backends (torch.nn.attention.sdpa_kernel) -- the math decomposition,
// which also raises torch's own errors for inconsistent inputs.
int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  const auto& ctx = at::globalContext();
  const bool fused_on = ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
                        ctx.userEnabledMemEfficientSDP() || ctx.userEnabledCuDNNSDP();
  const int64_t d = q.dim();
  bool fits = (d == 3 || d == 4) && k.dim() == d && v.dim() == d && !(is_causal && mask.has_value()) &&
              q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
              at::isFloatingType(q.scalar_type());
  if (fits) {
    const int64_t hq = q.size(-3), hk = k.size(-3);
    fits = hk >= 1 && v.size(-3) == hk && (hq == hk || (hq % hk == 0 && (enable_gqa || hk == 1))) &&
           q.size(-1) == k.size(-1) && k.size(-2) == v.size(-2) &&
           (d == 3 || (q.size(0) == k.size(0) && k.size(0) == v.size(0)));
  }
  if (fits && fused_on) return static_cast<int64_t>(sdp::SDPBackend::overrideable);
  TORCH_CHECK(ctx.userEnabledMathSDP(),
              "scaled_dot_product_attention on the sim device: no enabled backend takes this call (the fused "
              "kernel needs 3-D/4-D query, key and value of one floating dtype, query heads a multiple of the "
              "key/value heads); enable the math backend or change the inputs");
  return static_cast<int64_t>(sdp::SDPBackend::math);
}

// ---- functions for the Python runtime ----------------------------------------------
static bool g_initialized = false;

void initialize(const std::string& backend_name, int device_count) {
  TORCH_CHECK(device_count >= 1 && device_count <= kMaxDevices, "device_count must be in [1, ", kMaxDevices, "]");
  g_backend_name = backend_name;
  g_device_count = device_count;
  if (!g_initialized) {
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_allocator);
    at::RegisterPrivateUse1HooksInterface(new SimHooks());
    g_initialized = true;
  }
}

// A CPU tensor aliasing a sim tensor's memory (same sizes, strides, offset) that
// keeps the memory alive: what the numerics worker computes on.
at::Tensor cpu_view_of(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset,
                       caffe2::TypeMeta dtype, bool conj, bool neg) {
  const auto& dp = storage.data_ptr();
  c10::DataPtr alias;
  if (dp.get_deleter() == &release_block) {
    auto* b = static_cast<Block*>(dp.get_context());
    b->refs.fetch_add(1);
    alias = c10::DataPtr(dp.get(), b, &release_block, c10::Device(c10::kCPU));
  } else {
    auto* keep = new c10::Storage(storage);
    alias = c10::DataPtr(dp.get(), keep, [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, c10::Device(c10::kCPU));
  }
  c10::Storage cpu_storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(alias), nullptr, false);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  // lazy conjugation / negation (complex views) travel with the view
  if (conj) out._set_conj(true);
  if (neg) out._set_neg(true);
  return out;
}

at::Tensor cpu_view(const at::Tensor& t) {
  return cpu_view_of(t.storage(), t.sizes(), t.strides(), t.storage_offset(), t.dtype(), t.is_conj(), t.is_neg());
}

at::Tensor empty(std::vector<int64_t> size, std::vector<int64_t> stride, c10::ScalarType dtype, int device) {
  return empty_strided_on(size, stride, dtype, device);
}

// A device tensor over the memory of a CPU tensor that nothing else references (the result of
// a signature's first call, computed on CPU): the result becomes device memory without a copy
// into fresh pages, which for a large tensor is most of that call's time and doubled its peak
// memory. Only plain memory of CPU's default allocator (64-byte aligned, freed with free()) is
// taken over: None for a shared storage (an input returned, results that alias each other, a
// view whose base is alive), for memory with another owner (numpy's, a copy-on-write clone's,
// device memory seen through a CPU view) and while CPU memory is profiled (the profiler expects
// to see the allocation freed). The caller copies then.
py::object adopt(const at::Tensor& cpu, int device) {
  TORCH_CHECK(cpu.device().is_cpu(), "adopt: expected a CPU tensor, got one on ", cpu.device());
  const c10::Storage& storage = cpu.storage();
  const auto cpu_deleter = c10::GetDefaultCPUAllocator()->raw_deleter();
  if (!storage || storage.use_count() != 1 || cpu.is_conj() || cpu.is_neg() || storage.nbytes() == 0 ||
      cpu_deleter == nullptr || storage.data_ptr().get_deleter() != cpu_deleter || c10::memoryProfilingEnabled() ||
      !storage.mutable_data_ptr().compare_exchange_deleter(cpu_deleter, &keep_memory)) {
    return py::none();
  }
  const size_t nbytes = storage.nbytes();
  account(nbytes, device);
  auto* b = new Block();
  b->ptr = const_cast<void*>(storage.data());
  b->nbytes = nbytes;
  b->device = device;
  // The block holds the CPU storage too, so a second adopt sees it shared and a CPU tensor that
  // outlives the device one keeps its memory (release_adopted); otherwise the block frees or
  // caches the memory like any block's.
  b->owner = new c10::Storage(storage);
  c10::DataPtr dp(b->ptr, b, &release_block, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  c10::Storage dev(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), &g_allocator, true);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(dev), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                      cpu.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
  return py::cast(out);
}

int64_t cached_bytes() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  return static_cast<int64_t>(g_cached_bytes);
}

py::dict memory_stats(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", device);
  worker_release_finished();  // (what finished device work held is free)
  auto& s = g_stats[device];
  py::dict d;
  d["allocated_bytes"] = s.allocated.load();
  d["peak_bytes"] = s.peak.load();
  d["allocations"] = s.allocations.load();
  d["frees"] = s.frees.load();
  d["limit_bytes"] = s.limit.load();
  return d;
}

void reset_peak(int device) { g_stats[device].peak = g_stats[device].allocated.load(); }
void set_limit(int device, int64_t limit) { g_stats[device].limit = limit; }
int current_device() { return t_current_device; }
void set_current_device(int d) {
  TORCH_CHECK(d >= 0 && d < g_device_count.load(), "invalid ", g_backend_name, " device index ", d,
              "; this process has ", g_device_count.load(), " devices");
  t_current_device = d;
}
int64_t data_ptr_of(const at::Tensor& t) { return reinterpret_cast<int64_t>(t.storage().data_ptr().get()); }

// resize_ on the tensor's own core (the Python side first waits for pending work when
// the storage must grow, since growing copies the old contents)
void resize(const at::Tensor& t, std::vector<int64_t> size, std::optional<c10::MemoryFormat> fmt) {
  const int saved = t_current_device;
  t_current_device = t.device().index();
  try {
    at::cpu::resize_(t, size, fmt);
  } catch (...) {
    t_current_device = saved;
    throw;
  }
  t_current_device = saved;
}

py::object default_generator_py(int index) {
  return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(index)));
}

int64_t storage_nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.storage().nbytes()); }

void set_sync_callback(py::object fn) {
  if (g_sync_callback == nullptr) g_sync_callback = new py::object(std::move(fn));
  else *g_sync_callback = std::move(fn);
}

void bind_profiler(py::module& m);  // profiler.cpp: the device's activity profiler for Kineto

}  // namespace tilescope_sim

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tilescope_sim::fused_sdp_choice);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace tilescope_sim;
  m.def("initialize", &initialize);
  m.def("cpu_view", &cpu_view);
  m.def("empty", &empty);
  m.def("adopt", &adopt);
  m.def("memory_stats", &memory_stats);
  m.def("reset_peak", &reset_peak);
  m.def("set_limit", &set_limit);
  m.def("current_device", &current_device);
  m.def("set_current_device", &set_current_device);
  m.def("resize", &resize);
  m.def("default_generator", &default_generator_py);
  m.def("storage_nbytes", &storage_nbytes);
  m.def("set_sync_callback", &set_sync_callback);
  m.def("empty_cache", &empty_cache);
  m.def("cached_bytes", &cached_bytes);
  bind_profiler(m);
  bind_worker(m);
  bind_dispatch(m);
}
