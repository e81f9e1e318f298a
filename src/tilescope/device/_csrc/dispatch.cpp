// The device's kernel for every aten op it runs through tilescope.device._dispatch: a C++ fast
// path for the calls Python has seen before, and the bridge to the Python handler for the rest.
//
// A Python handler (tilescope.device._dispatch.Handler) decides everything about an op: the first
// call of a signature runs synchronously, is lowered to a Program and cached. What a later call
// of that signature does is then fixed -- allocate outputs of known sizes, schedule one execution
// of known modeled time, queue the numerics -- and needs no interpreter. So Python describes each
// op once (fast_describe) and teaches each signature (fast_learn, during the call the kernel
// handed to it); later calls of that signature never enter Python: signature key from the
// argument stack, outputs from the device allocator, the execution on the modeled clock
// (worker.cpp), the numerics as a native worker item (the op's CPU kernel on CPU views, no GIL).
// Metadata-only ops (views) run PyTorch's CPU kernels on the device tensors themselves.
//
// The fast path stands aside (the Python handler runs) whenever Python must see the execution:
// a listener subscribed or blocking mode (fast_enable(False)), a profiler recording (record
// function callbacks), an argument it does not key (a generator, a non-scalar host tensor,
// tensors on two cores), or a signature not taught yet.
#include "sim.h"

#include <ATen/record_function.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace tilescope_sim {
namespace {

// how a schema argument enters the signature key (tilescope.device._dispatch._arg_flag)
enum ArgFlag : uint8_t { kPlain = 0, kNumber = 1, kWrapped = 2 };
enum Kind : uint8_t { kSlow = 0, kMeta = 1, kFunctional = 2, kInplace = 3 };

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t v : k) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

struct OutSpec {
  bool defined = false;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
};

struct Entry {
  std::vector<OutSpec> outs;  // functional: one per result (list element); in-place: unused
  bool run = false;           // an execution to submit (False: nothing to compute, e.g. empty outputs)
  double modeled_ns = 0;
};

constexpr size_t kSignaturesPerOp = 4096;  // as the Python handler's cache

struct OpInfo {
  Kind kind = kSlow;
  std::vector<uint8_t> flags;  // per schema argument
  std::vector<int> write_pos;  // in-place: the arguments returned, in order
  int n_returns = 0;
  bool list_return = false;
  int device_arg = -1;  // a factory's `device` argument (schema index), -1: none
  std::string label;    // "aten::add.Tensor": names its executions' errors
  std::unique_ptr<OutPlan> out_plan;  // a functional op's out= overload, if it has one
  std::mutex mu;
  std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> cache;
};

std::mutex g_ops_mu;
std::vector<std::unique_ptr<OutPlan>> g_retired_plans;  // (g_ops_mu)
std::unordered_map<const c10::FunctionSchema*, OpInfo*> g_ops;  // OpInfos live until exit
std::atomic<bool> g_fast{false};      // the fast path may run (fast_enable)
std::atomic<bool> g_numerics{true};   // queue numerics (settings().numerics)
std::atomic<int64_t> g_fast_calls{0};
PyObject* g_handle = nullptr;         // tilescope.device._dispatch.handle(op, *args, **kwargs)

// The signature being handed to Python on this thread (innermost last): what fast_learn teaches.
struct Pending {
  OpInfo* info;
  const Key* key;
};
thread_local std::vector<Pending> t_pending;

struct PendingScope {
  explicit PendingScope(OpInfo* info, const Key* key) { t_pending.push_back({info, key}); }
  ~PendingScope() { t_pending.pop_back(); }
};

OpInfo* find_info(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(g_ops_mu);
  auto it = g_ops.find(&op.schema());
  return it == g_ops.end() ? nullptr : it->second;
}

// ---- the signature key ----
enum Tag : int64_t {
  kTagTensor = 1, kTagUndefined, kTagHostScalar, kTagList, kTagNumber, kTagNone, kTagInt, kTagDouble, kTagBool,
  kTagIntList, kTagString, kTagDevice, kTagDoubleList, kTagBoolList, kTagComplex,
};

struct KeyState {
  Key key;
  int core = -1;
};

// false: a value the fast path does not key (the Python handler takes the call)
bool key_tensor(const at::Tensor& t, KeyState& s, bool host_scalar_ok = true) {
  if (!t.defined()) {
    s.key.push_back(kTagUndefined);
    return true;
  }
  const c10::Device d = t.device();
  if (d.type() == c10::DeviceType::PrivateUse1) {
    const int core = d.index();
    if (s.core < 0) {
      s.core = core;
    } else if (s.core != core) {
      return false;  // two cores: the handler raises PyTorch's error
    }
    const int64_t dim = t.dim();
    s.key.push_back(kTagTensor);
    s.key.push_back(static_cast<int64_t>(t.scalar_type()) | (t.is_conj() ? 256 : 0) | (t.is_neg() ? 512 : 0));
    s.key.push_back(dim);
    const auto sizes = t.sizes();
    const auto strides = t.strides();
    s.key.insert(s.key.end(), sizes.begin(), sizes.end());
    s.key.insert(s.key.end(), strides.begin(), strides.end());
    return true;
  }
  if (host_scalar_ok && d.type() == c10::DeviceType::CPU && t.dim() == 0 && !t.requires_grad()) {
    s.key.push_back(kTagHostScalar);  // a wrapped number or a 0-dim host tensor: its value is an operand
    s.key.push_back(static_cast<int64_t>(t.scalar_type()));
    return true;
  }
  return false;
}

bool key_value(const c10::IValue& v, uint8_t flag, KeyState& s) {
  if (v.isTensor()) return key_tensor(v.toTensor(), s);
  if (v.isTensorList()) {
    const auto list = v.toTensorList();
    s.key.push_back(kTagList);
    s.key.push_back(static_cast<int64_t>(list.size()));
    for (const at::Tensor& t : list) {
      if (!t.defined() || !key_tensor(t, s, /*host_scalar_ok=*/false)) return false;
    }
    return true;
  }
  if (flag != kPlain && (v.isDouble() || v.isInt() || v.isBool() || v.isComplexDouble())) {
    s.key.push_back(kTagNumber);  // a runtime operand: keyed by type, not value
    s.key.push_back(v.isDouble() ? 0 : v.isInt() ? 1 : v.isBool() ? 2 : 3);
    return true;
  }
  if (v.isNone()) {
    s.key.push_back(kTagNone);
  } else if (v.isInt()) {
    s.key.push_back(kTagInt);
    s.key.push_back(v.toInt());
  } else if (v.isBool()) {
    s.key.push_back(kTagBool);
    s.key.push_back(v.toBool());
  } else if (v.isDouble()) {
    const double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    s.key.push_back(kTagDouble);
    s.key.push_back(bits);
  } else if (v.isIntList()) {
    const auto list = v.toIntList();
    s.key.push_back(kTagIntList);
    s.key.push_back(static_cast<int64_t>(list.size()));
    for (int64_t x : list) s.key.push_back(x);
  } else if (v.isString()) {
    const std::string& str = v.toStringRef();
    s.key.push_back(kTagString);
    s.key.push_back(static_cast<int64_t>(str.size()));
    for (size_t i = 0; i < str.size(); i += sizeof(int64_t)) {
      int64_t chunk = 0;
      std::memcpy(&chunk, str.data() + i, std::min(sizeof chunk, str.size() - i));
      s.key.push_back(chunk);
    }
  } else if (v.isDevice()) {
    const c10::Device d = v.toDevice();
    s.key.push_back(kTagDevice);
    s.key.push_back(static_cast<int64_t>(d.type()) * 1024 + d.index());
  } else if (v.isDoubleList()) {
    const auto list = v.toDoubleList();
    s.key.push_back(kTagDoubleList);
    s.key.push_back(static_cast<int64_t>(list.size()));
    for (double d : list) {
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      s.key.push_back(bits);
    }
  } else if (v.isBoolList()) {
    const auto list = v.toBoolList();
    s.key.push_back(kTagBoolList);
    s.key.push_back(static_cast<int64_t>(list.size()));
    for (bool b : list) s.key.push_back(b);
  } else {
    return false;  // generators, optional tensor lists, ...: the handler takes it
  }
  return true;
}

bool make_key(const OpInfo& info, const torch::jit::Stack& stack, size_t n_args, KeyState& s) {
  if (info.flags.size() != n_args) return false;
  s.key.reserve(8 * n_args + 1);
  // the default dtype decides a result's dtype (an integer tensor times a Python float)
  s.key.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  const size_t base = stack.size() - n_args;
  for (size_t i = 0; i < n_args; ++i) {
    if (!key_value(stack[base + i], info.flags[i], s)) return false;
  }
  return true;
}

// ---- the fast path ----

// A host tensor argument as the worker gets it: a wrapped number is the call's own; a user's
// 0-dim tensor may change after the call returns, so its value now.
at::Tensor host_operand(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->is_wrapped_number() ? t : t.clone();
}

bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// The worker's call for these arguments (see NativeCall): device tensors as views to make.
NativeCall native_call(const torch::jit::Stack& stack, size_t n_args) {
  NativeCall call;
  call.stack.reserve(n_args);
  call.kinds.reserve(n_args);
  const size_t base = stack.size() - n_args;
  for (size_t i = 0; i < n_args; ++i) {
    const c10::IValue& v = stack[base + i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (on_device(t)) {
        call.stack.emplace_back();
        call.kinds.push_back(1);
        call.views.emplace_back(t);
      } else {
        call.stack.emplace_back(t.defined() ? host_operand(t) : t);
        call.kinds.push_back(0);
      }
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      call.stack.emplace_back();
      call.kinds.push_back(static_cast<int32_t>(list.size()) + 2);
      for (const at::Tensor& t : list) call.views.emplace_back(t);  // (all on the device: see key_tensor)
    } else {
      call.stack.push_back(v);
      call.kinds.push_back(0);
    }
  }
  return call;
}

void run_fast(const c10::OperatorHandle& op, OpInfo& info, const Entry& e, int core, torch::jit::Stack* stack,
              size_t n_args) {
  std::vector<at::Tensor> outs;
  if (info.kind == kFunctional) {
    outs.reserve(e.outs.size());
    for (const OutSpec& o : e.outs) {
      outs.push_back(o.defined ? empty_strided_on(o.sizes, o.strides, o.dtype, core) : at::Tensor());
    }
  }
  if (e.run) {
    clock_submit(core, e.modeled_ns, -1);
    if (g_numerics.load(std::memory_order_relaxed)) {
      NativeCall call = native_call(*stack, n_args);
      for (const at::Tensor& o : outs) {
        if (!o.defined()) continue;
        call.views.emplace_back(o);
        ++call.n_outs;
      }
      worker_put_native(op, std::move(call), &info.label, info.out_plan.get());
    }
  }
  if (info.kind == kInplace) {
    const size_t base = stack->size() - n_args;
    std::vector<c10::IValue> results;
    for (int k = 0; k < info.n_returns; ++k) results.push_back((*stack)[base + info.write_pos[k]]);
    torch::jit::drop(*stack, n_args);
    for (auto& r : results) stack->push_back(std::move(r));
    return;
  }
  torch::jit::drop(*stack, n_args);
  if (info.list_return) {
    stack->push_back(c10::List<at::Tensor>(outs));
  } else {
    for (auto& o : outs) stack->push_back(std::move(o));
  }
}

// ---- the Python handler ----

bool is_default(const c10::Argument& a, const c10::IValue& v) {
  return a.default_value().has_value() && *a.default_value() == v;
}

py::object to_python(const c10::Argument& a, const c10::IValue& v) {
  if (v.isNone()) return py::none();
  auto is = [&](c10::TypeKind kind) {
    const auto& t = a.real_type();
    if (t->kind() == kind) return true;
    auto opt = t->cast<c10::OptionalType>();
    return opt && opt->getElementType()->kind() == kind;
  };
  // dtype, layout and memory format travel as ints in the stack: Python wants their objects
  if (is(c10::ScalarTypeType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
  }
  if (is(c10::LayoutType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
  }
  if (is(c10::MemoryFormatType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
  }
  return torch::jit::toPyObject(v);
}

// The call as PyTorch's Python kernels receive it: positional arguments up to the last one not
// at its default, keyword-only ones by name unless at their default.
void call_python(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& formals = schema.arguments();
  const size_t n = formals.size();
  std::vector<c10::IValue> args = torch::jit::pop(*stack, n);
  py::gil_scoped_acquire gil;
  size_t kw_start = n;
  while (kw_start > 0 && formals[kw_start - 1].kwarg_only()) --kw_start;
  size_t n_pos = kw_start;
  while (n_pos > 0 && is_default(formals[n_pos - 1], args[n_pos - 1])) --n_pos;
  py::tuple pos(n_pos + 1);
  pos[0] = py::reinterpret_borrow<py::object>(torch::detail::getTorchApiFunction(op));
  for (size_t i = 0; i < n_pos; ++i) pos[i + 1] = to_python(formals[i], args[i]);
  py::dict kwargs;
  for (size_t i = kw_start; i < n; ++i) {
    if (!is_default(formals[i], args[i])) kwargs[py::str(formals[i].name())] = to_python(formals[i], args[i]);
  }
  PyObject* r = PyObject_Call(g_handle, pos.ptr(), kwargs.ptr());
  if (r == nullptr) {
    python_error err;
    err.persist();
    throw std::move(err);
  }
  py::object result = py::reinterpret_steal<py::object>(r);
  args.clear();
  const auto& rets = schema.returns();
  if (rets.size() == 1) {
    stack->push_back(torch::jit::toIValue(result, rets[0].real_type()));
  } else if (rets.size() > 1) {
    py::tuple items = py::cast<py::tuple>(result);
    TORCH_CHECK(items.size() == rets.size(), schema.operator_name(), ": the device kernel returned ", items.size(),
                " values, the schema says ", rets.size());
    for (size_t i = 0; i < rets.size(); ++i) stack->push_back(torch::jit::toIValue(items[i], rets[i].real_type()));
  }
}

void sim_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpInfo* info = find_info(op);
  if (info != nullptr && info->kind != kSlow && g_fast.load(std::memory_order_relaxed)) {
    if (info->kind == kMeta) {
      g_fast_calls.fetch_add(1, std::memory_order_relaxed);
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
      return;
    }
    if (!at::hasCallbacks() && !torch::profiler::impl::profilerEnabled()) {
      const size_t n_args = op.schema().arguments().size();
      KeyState s;
      if (make_key(*info, *stack, n_args, s)) {
        std::shared_ptr<const Entry> entry;
        {
          std::lock_guard<std::mutex> lock(info->mu);
          auto it = info->cache.find(s.key);
          if (it != info->cache.end()) entry = it->second;
        }
        if (s.core < 0) {  // a factory: its device argument, or the current core
          const c10::IValue* d = info->device_arg >= 0 ? &(*stack)[stack->size() - n_args + info->device_arg] : nullptr;
          s.core = d != nullptr && d->isDevice() && d->toDevice().has_index() ? d->toDevice().index() : current_device();
        }
        if (entry) {
          g_fast_calls.fetch_add(1, std::memory_order_relaxed);
          run_fast(op, *info, *entry, s.core, stack, n_args);
          return;
        }
        PendingScope pending(info, &s.key);
        call_python(op, stack);
        return;
      }
    }
  }
  PendingScope pending(info, nullptr);
  call_python(op, stack);
}

// ---- Python API ----

std::vector<std::unique_ptr<torch::Library>> g_libs;  // keep the registrations alive

// Register the kernel for `names` ("add.Tensor") and as the device's fallback for every other op;
// `handle(op, *args, **kwargs)` is the Python handler.
void fast_register(const std::vector<std::string>& names, py::object handle) {
  TORCH_CHECK(g_handle == nullptr, "the sim device's kernels are registered once per process");
  g_handle = handle.inc_ref().ptr();
  auto fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1,
                                                   __FILE__, __LINE__);
  fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&sim_kernel>());
  g_libs.push_back(std::move(fallback));
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                              __FILE__, __LINE__);
  for (const std::string& name : names) lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&sim_kernel>());
  g_libs.push_back(std::move(lib));
}

// How a functional op's out= overload `out_overload` takes its arguments (see OutPlan).
std::unique_ptr<OutPlan> make_out_plan(const std::string& name, const std::string& out_overload,
                                       const c10::FunctionSchema& functional) {
  if (out_overload.empty()) return nullptr;
  auto handle = c10::Dispatcher::singleton().findSchema({name, out_overload});
  if (!handle.has_value()) return nullptr;
  auto plan = std::make_unique<OutPlan>(*handle);
  const auto& formals = functional.arguments();
  for (const c10::Argument& a : handle->schema().arguments()) {
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) {
      plan->arguments.push_back(-1);
      ++plan->n_outs;
      continue;
    }
    int index = -1;
    for (size_t i = 0; i < formals.size(); ++i) {
      if (formals[i].name() == a.name()) index = static_cast<int>(i);
    }
    if (index < 0) return nullptr;  // not the functional op's arguments plus outputs
    plan->arguments.push_back(index);
  }
  return plan;
}

// What the Python handler of `name.overload` decided about the op: its kind (0 slow: always the
// handler; 1 metadata only; 2 functional; 3 in place), each schema argument's key flag, the
// arguments an in-place op returns, its returns, and a functional op's out= overload ("" none).
void fast_describe(const std::string& name, const std::string& overload, int kind, std::vector<uint8_t> flags,
                   std::vector<int> write_pos, int n_returns, bool list_return, const std::string& out_overload) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(handle.has_value(), "no operator ", name, ".", overload);
  const auto& schema = handle->schema();
  TORCH_CHECK(flags.size() == schema.arguments().size(), name, ".", overload, ": ", flags.size(),
              " argument flags for ", schema.arguments().size(), " arguments");
  std::lock_guard<std::mutex> lock(g_ops_mu);
  OpInfo*& info = g_ops[&schema];
  if (info == nullptr) info = new OpInfo();
  info->kind = static_cast<Kind>(kind);
  info->flags = std::move(flags);
  info->write_pos = std::move(write_pos);
  info->n_returns = n_returns;
  info->list_return = list_return;
  info->label = name + (overload.empty() ? "" : "." + overload);
  // (a plan replaced stays alive: queued items may still point at it)
  if (info->out_plan) g_retired_plans.push_back(std::move(info->out_plan));
  info->out_plan = kind == kFunctional ? make_out_plan(name, out_overload, schema) : nullptr;
  info->device_arg = -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    if (schema.arguments()[i].name() == "device") info->device_arg = static_cast<int>(i);
  }
}

// Teach the signature the kernel is handing to Python on this thread (if it keyed one) for the
// op `label`: its outputs [(sizes, strides, dtype) or None], whether it runs an execution and
// its modeled time. Returns whether it was taught.
bool fast_learn(const std::string& label, py::list outs, bool run, double modeled_ns) {
  if (t_pending.empty()) return false;
  const Pending& p = t_pending.back();
  if (p.info == nullptr || p.key == nullptr || p.info->label != label) return false;
  auto e = std::make_shared<Entry>();
  e->run = run;
  e->modeled_ns = modeled_ns;
  for (const py::handle o : outs) {
    OutSpec spec;
    if (!o.is_none()) {
      auto t = o.cast<py::tuple>();
      spec.defined = true;
      spec.sizes = t[0].cast<std::vector<int64_t>>();
      spec.strides = t[1].cast<std::vector<int64_t>>();
      spec.dtype = reinterpret_cast<THPDtype*>(t[2].ptr())->scalar_type;
    }
    e->outs.push_back(std::move(spec));
  }
  std::lock_guard<std::mutex> lock(p.info->mu);
  if (p.info->cache.size() >= kSignaturesPerOp) p.info->cache.clear();
  p.info->cache[*p.key] = std::move(e);
  return true;
}

void fast_enable(bool on) { g_fast = on; }
void fast_numerics(bool on) { g_numerics = on; }
int64_t fast_calls() { return g_fast_calls.load(); }

void fast_forget() {  // every taught signature (settings that change Programs: a new preset)
  std::lock_guard<std::mutex> lock(g_ops_mu);
  for (auto& kv : g_ops) {
    std::lock_guard<std::mutex> op_lock(kv.second->mu);
    kv.second->cache.clear();
  }
}

}  // namespace

void bind_dispatch(py::module& m) {
  m.def("fast_register", &fast_register);
  m.def("fast_describe", &fast_describe);
  m.def("fast_learn", &fast_learn);
  m.def("fast_enable", &fast_enable);
  m.def("fast_numerics", &fast_numerics);
  m.def("fast_calls", &fast_calls);
  m.def("fast_forget", &fast_forget);
}

}  // namespace tilescope_sim
