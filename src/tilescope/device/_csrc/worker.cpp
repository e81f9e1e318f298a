// The device worker and the modeled clock, in C++ so that neither costs the host the GIL.
//
// The worker is the device's execution stream: one thread computing the numerics of every
// execution in submission order. Two kinds of items share its queue: native ones (an aten op run
// on CPU views of device memory, queued by the dispatch fast path, dispatch.cpp) run without the
// GIL, so a loop of small ops does not wait for the worker's interpreter time; Python ones
// (tilescope.device._worker.put: first calls, copies, custom numerics) take the GIL to run.
// An item's error does not stop the worker: it is kept, with the execution's name, until the
// next wait takes it (tilescope.device._worker raises it there). Cancelling (Ctrl-C while the
// host waits) skips every item queued so far, counting them for the next wait to report; waits
// and the stop at exit take a timeout so that the host's interpreter can take its Ctrl-C.
//
// The clock is tilescope.device._runtime's scheduling state (per-core end of the last execution,
// the virtual host clock, the flow ids), shared by the Python runtime and the fast path.
#include "sim.h"

#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <thread>
#include <time.h>

namespace tilescope_sim {
namespace {

struct Item {
  enum Kind : uint8_t { kNative, kPython, kStop };
  Kind kind = kNative;
  uint64_t seq = 0;  // its place in submission order (1, 2, ...)
  std::optional<c10::OperatorHandle> op;
  NativeCall call;
  const std::string* label = nullptr;
  OutPlan* plan = nullptr;
  PyObject* py = nullptr;  // (fn, args, kwargs, label), a strong reference
};

struct Failure {
  std::string label;
  std::exception_ptr native;  // a native item's error
  PyObject* py = nullptr;     // a Python item's exception, a strong reference
};

struct Worker {
  std::mutex mu;
  std::condition_variable work;  // the worker waits for items
  std::condition_variable done;  // wait() waits for completions
  std::vector<Item> queue;    // swapped with the worker's batch: the two buffers ping-pong
  std::vector<Item> finished;  // native items run, for the host to release (see loop)
  uint64_t submitted = 0;
  std::atomic<uint64_t> completed{0};
  std::atomic<int> waiters{0};
  bool sleeping = false;  // waiting for a notification (else awake, or napping: see loop)
  bool running = false;
  bool stopped = false;  // stopped at exit: later items are dropped
  bool exited = false;   // the loop has run its stop item
  std::atomic<uint64_t> cancel_upto{0};  // items with seq <= this are skipped (worker_cancel)
  std::atomic<int64_t> skipped{0};       // items skipped since the last worker_take_skipped
  std::thread* thread = nullptr;
  std::thread::id id;
  std::vector<Failure> failures;
  std::atomic<int64_t> native_items{0}, python_items{0};
};

constexpr std::chrono::microseconds kNap{200};  // see loop()
Worker* g_worker = new Worker();  // replaced (the old one leaked) in a forked child
PyObject* g_on_start = nullptr;   // called first on the worker thread (its OpenMP threads)

std::string py_label(PyObject* label) {
  if (label != nullptr && PyUnicode_Check(label)) {
    const char* s = PyUnicode_AsUTF8(label);
    if (s != nullptr) return s;
    PyErr_Clear();
  }
  return "device work";
}

// The pending Python exception as one object (its traceback attached); clears the indicator.
PyObject* fetch_exception() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != nullptr && value != nullptr) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
}

// A skipped Python item: its reference dropped (with the GIL).
void drop_python(Item& item) {
  if (item.py == nullptr || !Py_IsInitialized()) return;  // (the interpreter is gone: leaked)
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(item.py);
  item.py = nullptr;
  PyGILState_Release(gil);
}

void run_python(Worker* w, Item& item) {
  if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing can run it (leaked)
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* t = item.py;
  PyObject* fn = PyTuple_GET_ITEM(t, 0);
  PyObject* args = PySequence_Tuple(PyTuple_GET_ITEM(t, 1));
  PyObject* kwargs = PyTuple_GET_ITEM(t, 2);
  if (!PyDict_Check(kwargs) || PyDict_GET_SIZE(kwargs) == 0) kwargs = nullptr;
  PyObject* result = args != nullptr ? PyObject_Call(fn, args, kwargs) : nullptr;
  if (result == nullptr) {
    PyObject* exc = fetch_exception();
    std::lock_guard<std::mutex> lock(w->mu);
    w->failures.push_back({py_label(PyTuple_GET_ITEM(t, 3)), nullptr, exc});
  }
  Py_XDECREF(result);
  Py_XDECREF(args);
  Py_DECREF(t);
  item.py = nullptr;
  PyGILState_Release(gil);
}

// The item's arguments and outputs as CPU views, made here (on the worker: the views' memory is
// allocated and freed by one thread).
struct Materialized {
  torch::jit::Stack stack;
  std::vector<at::Tensor> outs;
};

Materialized materialize(NativeCall& call) {
  Materialized m;
  m.stack.reserve(call.kinds.size());
  size_t v = 0;
  for (size_t i = 0; i < call.kinds.size(); ++i) {
    const int32_t kind = call.kinds[i];
    if (kind == 0) {
      m.stack.push_back(call.stack[i]);
    } else if (kind == 1) {
      m.stack.push_back(call.views[v++].make());
    } else {
      c10::List<at::Tensor> list;
      list.reserve(kind - 2);
      for (int32_t j = 0; j < kind - 2; ++j) list.push_back(call.views[v++].make());
      m.stack.push_back(std::move(list));
    }
  }
  m.outs.reserve(call.n_outs);
  for (size_t j = 0; j < call.n_outs; ++j) m.outs.push_back(call.views[v++].make());
  return m;
}

// The out= overload straight into the outputs; false when it cannot (then compute and copy).
bool run_into_outputs(OutPlan* plan, NativeCall& call, Materialized& m) {
  if (plan == nullptr || !plan->ok.load(std::memory_order_relaxed) || m.outs.size() != plan->n_outs) return false;
  torch::jit::Stack stack;
  stack.reserve(plan->arguments.size());
  size_t k = 0;
  for (int a : plan->arguments) stack.push_back(a >= 0 ? m.stack[a] : c10::IValue(m.outs[k++]));
  bool resized = false;
  try {
    plan->op.callBoxed(stack);
  } catch (const c10::Error& e) {
    if (std::strstr(e.what(), "resize") == nullptr) throw;
    resized = true;  // it tried to grow an output past its memory
  }
  const size_t first_out = call.views.size() - call.n_outs;
  for (size_t j = 0; j < m.outs.size() && !resized; ++j) {
    const ViewSpec& spec = call.views[first_out + j];
    resized = m.outs[j].sizes() != c10::IntArrayRef(spec.sizes) || m.outs[j].strides() != c10::IntArrayRef(spec.strides);
  }
  if (!resized) return true;
  // This overload resizes its outputs itself (a few CPU kernels do, e.g. mse_loss.out): never use
  // it again; the views it resized are remade (a failed resize leaves a view's sizes larger than
  // the memory behind it), and the op is computed and copied instead.
  plan->ok = false;
  for (size_t j = 0; j < m.outs.size(); ++j) m.outs[j] = call.views[first_out + j].make();
  return false;
}

void run_native(Worker* w, Item& item) {
  try {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // CPU views: no autograd to record
    Materialized m = materialize(item.call);
    if (run_into_outputs(item.plan, item.call, m)) return;
    item.op->callBoxed(m.stack);
    size_t k = 0;
    auto copy_out = [&](const at::Tensor& r) {
      if (r.defined() && k < m.outs.size()) m.outs[k++].copy_(r);
    };
    if (!m.outs.empty()) {
      for (const c10::IValue& v : m.stack) {
        if (v.isTensor()) {
          copy_out(v.toTensor());
        } else if (v.isTensorList()) {
          for (const at::Tensor& r : v.toTensorList()) copy_out(r);
        }
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(w->mu);
    w->failures.push_back({*item.label, std::current_exception(), nullptr});
  }
}

void call_on_start() {
  if (g_on_start == nullptr || !Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallNoArgs(g_on_start);
  if (r == nullptr) PyErr_WriteUnraisable(g_on_start);
  Py_XDECREF(r);
  PyGILState_Release(gil);
}

void loop(Worker* w) {
  at::enableRecordFunction(false);  // the worker's own aten calls are not the user's ops
  call_on_start();
  std::vector<Item> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(w->mu);
      if (w->queue.empty()) {
        // a short nap first: the fast path does not wake a napping worker (a wake-up costs both
        // threads a system call and a context switch per op), so a loop's items are taken in
        // batches; then sleep until notified
        w->work.wait_for(lock, kNap);
        while (w->queue.empty()) {
          w->sleeping = true;
          w->work.wait(lock);
        }
      }
      w->sleeping = false;
      batch.swap(w->queue);  // everything queued so far: one lock per batch, not per item
    }
    bool stop = false;
    for (Item& item : batch) {
      if (item.kind == Item::kStop) {
        stop = true;
        break;
      }
      if (item.seq <= w->cancel_upto.load(std::memory_order_relaxed)) {  // cancelled
        ++w->skipped;
        if (item.kind == Item::kPython) drop_python(item);
        continue;
      }
      if (item.kind == Item::kNative) {
        run_native(w, item);
        ++w->native_items;
      } else {
        run_python(w, item);
        ++w->python_items;
      }
    }
    // The host made the native items' argument lists and holds the references to their storages:
    // it releases them too (at its next item or wait). Freed here, every block would go to this
    // thread's malloc caches while the host's stay empty -- a producer-consumer pattern that made
    // the host's allocations several times slower than the op. The batch counts as done once
    // they are handed over.
    {
      std::lock_guard<std::mutex> lock(w->mu);
      for (Item& item : batch) {
        if (item.kind == Item::kNative) w->finished.push_back(std::move(item));
      }
      w->completed.fetch_add(batch.size());
      if (stop) w->exited = true;
      if (w->waiters.load() > 0) w->done.notify_all();
    }
    batch.clear();
    if (stop) return;
  }
}

// Release the finished items (on the calling thread: the host).
void release_finished(Worker* w) {
  std::vector<Item> done;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    done.swap(w->finished);
  }
}

// Queue an item (starting the worker if needed); `wake`: notify a napping worker too (else only
// a sleeping one). False: the worker was stopped (process exit).
bool enqueue(Item&& item, bool wake_napping = true) {
  Worker* w = g_worker;
  bool wake;
  // Two finished items, released after the lock: as many as one op makes, so the host's frees
  // interleave with its allocations (released in bulk they would overflow malloc's per-thread
  // caches, which hold a few blocks per size, and every allocation would take the slow path)
  Item done[2];
  {
    std::lock_guard<std::mutex> lock(w->mu);
    if (w->stopped) return false;
    if (!w->running) {
      w->thread = new std::thread(loop, w);  // never destroyed while joinable (stop joins it)
      w->id = w->thread->get_id();
      w->running = true;
    }
    item.seq = ++w->submitted;
    w->queue.push_back(std::move(item));
    for (Item& d : done) {
      if (w->finished.empty()) break;
      d = std::move(w->finished.back());
      w->finished.pop_back();
    }
    wake = w->sleeping || wake_napping;
    w->sleeping = false;
  }
  if (wake) w->work.notify_one();
  return true;
}

// ---- Python API (the GIL held) ----

void worker_put(py::object work) {
  PyObject* t = work.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
    throw py::type_error("a device work item is a tuple (fn, args, kwargs, label)");
  }
  Item item;
  item.kind = Item::kPython;
  Py_INCREF(t);
  item.py = t;
  if (!enqueue(std::move(item))) Py_DECREF(t);
}

// Items queued so far: what a wait started now waits for.
int64_t worker_submitted() {
  std::lock_guard<std::mutex> lock(g_worker->mu);
  return static_cast<int64_t>(g_worker->submitted);
}

// Wait until the first `target` items have completed, at most `timeout_s` seconds (< 0: no
// limit); true once they have. The host waits in slices so that its interpreter can take a
// Ctrl-C in between (tilescope.device._worker.wait).
bool worker_wait(int64_t target, double timeout_s) {
  Worker* w = g_worker;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    if (!w->running || std::this_thread::get_id() == w->id) return true;  // (an item waiting for itself)
  }
  bool done;
  {
    py::gil_scoped_release no_gil;  // Python items need it
    std::unique_lock<std::mutex> lock(w->mu);
    const auto reached = [&] { return w->completed.load() >= static_cast<uint64_t>(target); };
    ++w->waiters;
    if (!reached()) w->work.notify_one();  // (a napping worker)
    if (timeout_s < 0) {
      w->done.wait(lock, reached);
      done = true;
    } else {
      done = w->done.wait_for(lock, std::chrono::duration<double>(timeout_s), reached);
    }
    --w->waiters;
    lock.unlock();
    if (done) release_finished(w);  // what it ran no longer holds device memory once wait returns
  }
  return done;
}

// Skip every item queued so far (the one running finishes; Python's cancel hooks ask it to stop).
void worker_cancel() {
  Worker* w = g_worker;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->cancel_upto = w->submitted;
  }
  w->work.notify_one();
}

// Items skipped by cancels since the last call.
int64_t worker_take_skipped() { return g_worker->skipped.exchange(0); }

bool worker_has_failures() {
  std::lock_guard<std::mutex> lock(g_worker->mu);
  return !g_worker->failures.empty() || g_worker->skipped.load() > 0;  // (cancelled work is reported too)
}

// The failures since the last call, oldest first: [(label, exception)].
py::list worker_take_failures() {
  std::vector<Failure> taken;
  {
    std::lock_guard<std::mutex> lock(g_worker->mu);
    taken.swap(g_worker->failures);
  }
  py::list out;
  for (Failure& f : taken) {
    PyObject* exc = f.py;
    if (exc == nullptr) {
      torch::translate_exception_to_python(f.native);  // PyTorch's own mapping (IndexError, ...)
      exc = fetch_exception();
    }
    out.append(py::make_tuple(f.label, py::reinterpret_steal<py::object>(exc)));
  }
  return out;
}

// Queue the stop (after the items queued so far; later ones are dropped). False: no worker runs.
bool worker_request_stop() {
  Worker* w = g_worker;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    if (!w->running) {
      w->stopped = true;
      return false;
    }
  }
  Item stop;
  stop.kind = Item::kStop;
  enqueue(std::move(stop));
  return true;
}

// Wait at most `timeout_s` seconds for the stopped worker's thread to end; true once it has (or
// none runs).
bool worker_join(double timeout_s) {
  Worker* w = g_worker;
  std::thread* thread = nullptr;
  {
    py::gil_scoped_release no_gil;  // Python items need it
    std::unique_lock<std::mutex> lock(w->mu);
    if (!w->running) return true;
    ++w->waiters;
    const bool exited = w->done.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return w->exited; });
    --w->waiters;
    if (!exited) return false;
    thread = w->thread;
    w->thread = nullptr;
    w->running = false;
    w->stopped = true;
  }
  thread->join();  // (it has left its loop)
  delete thread;
  return true;
}

py::dict worker_stats() {
  Worker* w = g_worker;
  std::lock_guard<std::mutex> lock(w->mu);
  py::dict d;
  d["native_items"] = w->native_items.load();
  d["python_items"] = w->python_items.load();
  d["pending"] = static_cast<int64_t>(w->submitted - w->completed.load());
  d["skipped"] = w->skipped.load();
  d["running"] = w->running;
  std::hash<std::thread::id> h;
  d["thread"] = w->running ? static_cast<int64_t>(h(w->id)) : 0;
  return d;
}

void worker_on_start(py::object fn) {
  Py_XDECREF(g_on_start);
  g_on_start = fn.is_none() ? nullptr : fn.inc_ref().ptr();
}

// ---- the modeled clock ----
struct Clock {
  std::mutex mu;
  bool virt = false;
  double dispatch_ns = 0, runtime_ns = 0, vhost = 0;
  std::vector<double> core_end, core_busy;
  std::vector<int64_t> core_count;
  int64_t flow = 0;
};
Clock* g_clock = new Clock();  // replaced (the old one leaked) in a forked child

double perf_counter_ns() {  // Python's time.perf_counter_ns() on Linux: CLOCK_MONOTONIC
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec);
}

void clock_configure(bool virt, double dispatch_ns, double runtime_ns, int cores) {
  Clock* c = g_clock;
  std::lock_guard<std::mutex> lock(c->mu);
  c->virt = virt;
  c->dispatch_ns = dispatch_ns;
  c->runtime_ns = runtime_ns;
  if (static_cast<int>(c->core_end.size()) < cores) {
    c->core_end.resize(cores, 0.0);
    c->core_busy.resize(cores, 0.0);
    c->core_count.resize(cores, 0);
  }
}

void clock_reset(double base) {
  Clock* c = g_clock;
  std::lock_guard<std::mutex> lock(c->mu);
  c->vhost = 0.0;
  std::fill(c->core_end.begin(), c->core_end.end(), base);
}

py::tuple clock_submit_py(int core, double modeled_ns, int extra_wait_core) {
  const Scheduled s = clock_submit(core, modeled_ns, extra_wait_core);
  return py::make_tuple(s.flow, s.host_ns, s.queued_ns, s.start_ns, s.end_ns);
}

double clock_vhost() {
  std::lock_guard<std::mutex> lock(g_clock->mu);
  return g_clock->vhost;
}

void clock_advance_vhost(double to_ns) {
  std::lock_guard<std::mutex> lock(g_clock->mu);
  if (to_ns > g_clock->vhost) g_clock->vhost = to_ns;
}

double clock_core_end(int core) {
  Clock* c = g_clock;
  std::lock_guard<std::mutex> lock(c->mu);
  if (core >= 0) return c->core_end.at(core);
  double m = 0.0;
  for (double e : c->core_end) m = std::max(m, e);
  return m;
}

py::tuple clock_counters() {
  Clock* c = g_clock;
  std::lock_guard<std::mutex> lock(c->mu);
  return py::make_tuple(c->core_count, c->core_busy);
}

void after_fork_in_child() {
  // the worker thread does not survive fork(): the child starts its own on its first item
  auto* w = new Worker();
  w->failures.clear();
  g_worker = w;
  auto* c = new Clock();
  Clock* old = g_clock;  // (its lock may be held by a thread the child does not have)
  c->virt = old->virt;
  c->dispatch_ns = old->dispatch_ns;
  c->runtime_ns = old->runtime_ns;
  c->vhost = old->vhost;
  c->core_end = old->core_end;
  c->core_busy = old->core_busy;
  c->core_count = old->core_count;
  c->flow = old->flow;
  g_clock = c;
}

}  // namespace

void worker_put_native(const c10::OperatorHandle& op, NativeCall&& call, const std::string* label, OutPlan* plan) {
  Item item;
  item.plan = plan;
  item.kind = Item::kNative;
  item.op = op;
  item.call = std::move(call);
  item.label = label;
  enqueue(std::move(item), /*wake_napping=*/false);
}

void worker_release_finished() { release_finished(g_worker); }

Scheduled clock_submit(int core, double modeled_ns, int extra_wait_core) {
  Clock* c = g_clock;
  std::lock_guard<std::mutex> lock(c->mu);
  double host;
  if (c->virt) {
    c->vhost += c->dispatch_ns;
    host = c->vhost;
  } else {
    host = perf_counter_ns();
  }
  const double queued = host + c->runtime_ns;
  double start = c->core_end.at(core);
  if (extra_wait_core >= 0 && c->core_end.at(extra_wait_core) > start) start = c->core_end[extra_wait_core];
  if (queued > start) start = queued;
  const double end = start + modeled_ns;
  c->core_end[core] = end;
  c->core_busy[core] += modeled_ns;
  c->core_count[core] += 1;
  return {++c->flow, host, queued, start, end};
}

void bind_worker(py::module& m) {
  static bool at_fork = false;
  if (!at_fork) {
    pthread_atfork(nullptr, nullptr, &after_fork_in_child);
    at_fork = true;
  }
  m.def("worker_put", &worker_put);
  m.def("worker_submitted", &worker_submitted);
  m.def("worker_wait", &worker_wait);
  m.def("worker_cancel", &worker_cancel);
  m.def("worker_take_skipped", &worker_take_skipped);
  m.def("worker_has_failures", &worker_has_failures);
  m.def("worker_take_failures", &worker_take_failures);
  m.def("worker_request_stop", &worker_request_stop);
  m.def("worker_join", &worker_join);
  m.def("worker_stats", &worker_stats);
  m.def("worker_on_start", &worker_on_start);
  m.def("clock_configure", &clock_configure);
  m.def("clock_reset", &clock_reset);
  m.def("clock_submit", &clock_submit_py);
  m.def("clock_vhost", &clock_vhost);
  m.def("clock_advance_vhost", &clock_advance_vhost);
  m.def("clock_core_end", &clock_core_end);
  m.def("clock_counters", &clock_counters);
}

}  // namespace tilescope_sim
