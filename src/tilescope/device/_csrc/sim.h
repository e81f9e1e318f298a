// What the sim device's native sources share: memory (runtime.cpp), the device worker and the
// modeled clock (worker.cpp), the dispatch kernel (dispatch.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <string>
#include <vector>

namespace tilescope_sim {

// ---- runtime.cpp ----
// A CPU tensor aliasing a device tensor's memory, keeping it alive: what the worker computes on.
at::Tensor cpu_view(const at::Tensor& t);
at::Tensor cpu_view_of(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset,
                       caffe2::TypeMeta dtype, bool conj, bool neg);

// A device tensor's CPU view, to be made later (by the worker) as the tensor is now: its storage
// (a reference) and geometry, copied at dispatch so that a later set_ / resize_ / .data = on the
// tensor cannot change what a queued execution reads.
struct ViewSpec {
  c10::Storage storage;  // undefined: an undefined tensor
  c10::SmallVector<int64_t, 6> sizes, strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  bool conj = false, neg = false;

  ViewSpec() = default;
  explicit ViewSpec(const at::Tensor& t) {
    if (!t.defined()) return;
    storage = t.storage();
    sizes.assign(t.sizes().begin(), t.sizes().end());
    strides.assign(t.strides().begin(), t.strides().end());
    offset = t.storage_offset();
    dtype = t.dtype();
    conj = t.is_conj();
    neg = t.is_neg();
  }
  at::Tensor make() const {
    return storage ? cpu_view_of(storage, sizes, strides, offset, dtype, conj, neg) : at::Tensor();
  }
};

// A native item's call: `stack` holds its arguments with each device tensor left out (None),
// `kinds` says per argument where its value comes from (0: the stack as is; 1: the next view;
// n + 2: a list of n tensors, the next n views), `views` are the device tensors' CPU views to
// make, then the `n_outs` outputs' (a functional op's results go there).
struct NativeCall {
  torch::jit::Stack stack;
  std::vector<int32_t> kinds;
  std::vector<ViewSpec> views;
  size_t n_outs = 0;
};
at::Tensor empty_strided_on(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype, int device);
int current_device();

// ---- worker.cpp: the device worker (one thread computing every execution's numerics, in order) ----
// How a functional op computes straight into its outputs: its out= overload, and where each of
// that overload's arguments comes from (>= 0: the functional argument of that index; -1: the
// next output). `ok` turns false when the overload turns out to resize its outputs itself.
struct OutPlan {
  c10::OperatorHandle op;
  std::vector<int> arguments;
  size_t n_outs = 0;
  std::atomic<bool> ok{true};
  explicit OutPlan(c10::OperatorHandle h) : op(std::move(h)) {}
};

// Queue a native item: `op` run on `call`'s arguments (CPU views of device tensors, made by the
// worker) without the GIL; a functional op's tensor results go into its outputs, through `plan`
// when it has one, else copied. `label` names the execution in errors; it and `plan` must
// outlive the item.
void worker_put_native(const c10::OperatorHandle& op, NativeCall&& call, const std::string* label, OutPlan* plan);
// Let go of the argument lists of the native items the worker has run (the device memory they
// keep alive): the host does so a few at a time as it queues more; memory statistics and an
// allocation that would exceed the device's memory do it at once.
void worker_release_finished();

// ---- worker.cpp: the modeled clock (tilescope.device._runtime's scheduling, shared with it) ----
struct Scheduled {
  int64_t flow;
  double host_ns, queued_ns, start_ns, end_ns;
};
// Schedule one execution of `modeled_ns` on `core` (after `extra_wait_core`'s pending work too
// when >= 0): the runtime's time semantics, see _runtime.submit.
Scheduled clock_submit(int core, double modeled_ns, int extra_wait_core);

void bind_worker(py::module& m);
void bind_dispatch(py::module& m);

}  // namespace tilescope_sim
