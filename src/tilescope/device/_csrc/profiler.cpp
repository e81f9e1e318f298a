// The sim device's activity profiler for Kineto, the engine behind torch.profiler: how a
// PrivateUse1 backend puts its device work into torch's own tables and traces
// (REGISTER_PRIVATEUSE1_PROFILER; CUDA does the same through CUPTI).
//
// While a session that asked for PrivateUse1 activities records, the Python runtime calls
// profiler_record() for every execution, on the launching thread and inside the op that
// launched it. Kineto tells the session which ranges open and close on each thread (the
// correlation ids torch pushes for every op and every record_function); a launch is linked
// to the innermost one -- the op that launched it. When the session stops, each execution
// becomes a device activity ("exec_running <op>", or "memcpy <op>" for a copy) on its core,
// timed by the device model and linked to that op: torch's parse then adds its modeled time
// to the op (key_averages' Self SIM / SIM total columns and the totals footer) and its
// Chrome trace shows it, with no tilescope code on torch's side.
//
// The launch also keeps the rest of the runtime's record of the execution (its Program, modeled
// times, bytes, launching thread) while a tilescope capture asks for it (profiler_keep): the
// exporter takes those records with the session's launches, so nothing per execution is kept in
// Python objects while the user's code runs. Python references are taken and released with the
// GIL held only: launches dropped where the GIL may not be held (a new session, a session nobody
// exported) wait in a graveyard released on the next call from Python.
//
// Times: an activity starts at its launch (the wall clock torch's events use) plus the
// modeled queue and runtime cost (device start - host submit), never before the previous
// activity on its core ends; its duration is the modeled one, unchanged.

#include <torch/csrc/utils/pybind.h>

#ifdef USE_KINETO  // set by the build when torch has Kineto (torch.autograd.kineto_available())
#include <libkineto.h>
#include <IActivityProfiler.h>
#include <GenericTraceActivity.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <pthread.h>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tilescope_sim {
namespace {

constexpr int kEnclosing = 3;  // enclosing ranges kept per launch (see Launch::enclosing)

// What the runtime's record of an execution adds to a launch (tilescope.device._runtime.Execution);
// the references are strong ones (see release()).
struct Detail {
  PyObject* op = nullptr;  // nullptr: not kept (no capture asked, or over its limit)
  PyObject* lowering = nullptr;
  PyObject* program = nullptr;
  PyObject* program_hash = nullptr;
  PyObject* direction = nullptr;
  PyObject* clock = nullptr;
  double queued_ns = 0, modeled_ns = 0, runtime_ns = 0;
  int64_t nbytes = 0;
  uint64_t thread_ident = 0;  // threading.get_ident()
  int64_t native_tid = 0;     // threading.get_native_id()
  bool first_run = false;
};

struct Launch {
  int64_t flow;
  int64_t range;      // correlation id of the innermost open range on the launching thread; 0: none
  // the ranges around it, innermost first (0: none): torch's parse merges an op into a parent
  // of the same name (aten::mean calling aten::mean), which then holds its device time
  int64_t enclosing[kEnclosing];
  int64_t launch_ns;  // wall clock (CLOCK_REALTIME, as torch's events)
  double host_ns, start_ns, end_ns;  // the device model's clock
  int32_t core;
  bool memcpy;
  std::string name;
  Detail detail;
};

// A finished session's launches, kept until the exporter of its trace takes them.
struct Processed {
  int64_t start_ns;  // wall clock when the session started recording
  std::vector<Launch> launches;
  int64_t dropped;  // launches whose details the limit let go
};

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr size_t kKeptSessions = 8;  // sessions nobody exported are dropped, oldest first

std::mutex g_mu;
std::vector<Launch> g_launches;  // the recording session's, launch order
int64_t g_start_ns = 0;          // when it started
std::deque<Processed> g_done;    // finished sessions not taken yet, oldest first
std::atomic<bool> g_recording{false};
std::atomic<bool> g_enabled{true};
std::atomic<uint64_t> g_session{0};
int64_t g_keep = 0;        // details kept per session (profiler_keep); 0: none
int64_t g_kept = 0;        // kept in the recording session so far
int64_t g_dropped = 0;     // and let go over the limit
std::vector<Launch> g_graveyard;  // dropped launches whose references wait for the GIL
std::atomic<bool> g_graveyard_full{false};

// Launches no longer needed, where the GIL may not be held: their references are released by the
// next call from Python (release_graveyard). Call with g_mu held.
void bury(std::vector<Launch>& launches) {
  for (Launch& l : launches)
    if (l.detail.op != nullptr) g_graveyard.push_back(std::move(l));
  launches.clear();
  if (!g_graveyard.empty()) g_graveyard_full = true;
}

void release(Detail& d) {  // with the GIL held
  Py_CLEAR(d.op);
  Py_CLEAR(d.lowering);
  Py_CLEAR(d.program);
  Py_CLEAR(d.program_hash);
  Py_CLEAR(d.direction);
  Py_CLEAR(d.clock);
}

void release_graveyard() {  // with the GIL held, g_mu not
  std::vector<Launch> dead;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    dead.swap(g_graveyard);
    g_graveyard_full = false;
  }
  for (Launch& l : dead) release(l.detail);
}

// Thread ids, asked for once per thread (the system's is a system call); a forked child's thread
// has another system id, so a fork starts a new generation.
std::atomic<uint64_t> g_fork_generation{1};
thread_local uint64_t t_ids_generation = 0;
thread_local int64_t t_native_tid = 0;
// (the lock is held across fork, so that a child never starts with it held by a thread it lacks)
[[maybe_unused]] const int kForkHook = pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
                                                      [] {
                                                        g_mu.unlock();
                                                        g_fork_generation.fetch_add(1);
                                                      });

int64_t native_tid() {
  const uint64_t generation = g_fork_generation.load(std::memory_order_relaxed);
  if (t_ids_generation != generation) {
    t_native_tid = static_cast<int64_t>(PyThread_get_thread_native_id());
    t_ids_generation = generation;
  }
  return t_native_tid;
}

// The ranges open on this thread, innermost last, tagged with the session that saw them open
// (a session that stops inside a range never sees it close).
struct Open {
  uint64_t session;
  uint64_t id;
};
thread_local std::vector<Open> t_open;

void push_range(uint64_t id) {
  const uint64_t session = g_session.load(std::memory_order_relaxed);
  if (!t_open.empty() && t_open.back().session != session) t_open.clear();
  t_open.push_back({session, id});
}

void pop_range() {
  if (!t_open.empty()) t_open.pop_back();
}

const libkineto::TraceSpan& sim_span() {
  // referenced by every copy Kineto keeps of our activities: never destroyed
  static const auto* span = new libkineto::TraceSpan(0, 0, "sim");
  return *span;
}

int32_t activity_id(int64_t flow) { return static_cast<int32_t>(flow & 0x7fffffff); }

class Session final : public libkineto::IActivityProfilerSession {
 public:
  ~Session() override { g_recording = false; }  // (a session dropped without stop() records no more)

  void start() override {
    std::lock_guard<std::mutex> guard(g_mu);
    bury(g_launches);  // a session dropped without stop() left its launches
    g_kept = g_dropped = 0;
    g_start_ns = wall_ns();
    g_session.fetch_add(1);
    g_recording = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    g_recording = false;
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { process(logger, nullptr); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    process(logger, &linked);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, "sim (modeled)", "sim"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (int32_t core : cores_) out.push_back({core, core, 0, "core:" + std::to_string(core)});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override { push_range(id); }
  void popCorrelationId() override { pop_range(); }
  void pushUserCorrelationId(uint64_t id) override { push_range(id); }
  void popUserCorrelationId() override { pop_range(); }

 private:
  void process(libkineto::ActivityLogger& logger, const libkineto::getLinkedActivityCallback* linked) {
    std::vector<Launch> launches;
    int64_t start_ns, dropped;
    {
      std::lock_guard<std::mutex> guard(g_mu);
      launches.swap(g_launches);
      start_ns = g_start_ns;
      dropped = g_dropped;
    }
    try {
      emit(logger, linked, launches);
    } catch (...) {  // the launches' references must still be released (with the GIL, later)
      std::lock_guard<std::mutex> guard(g_mu);
      bury(launches);
      throw;
    }
    std::lock_guard<std::mutex> guard(g_mu);
    g_done.push_back({start_ns, std::move(launches), dropped});
    while (g_done.size() > kKeptSessions) {
      bury(g_done.front().launches);
      g_done.pop_front();
    }
  }

  // Each launch as a device activity for Kineto, in flow order (submission order: threads may
  // reach profiler_record in another order).
  void emit(libkineto::ActivityLogger& logger, const libkineto::getLinkedActivityCallback* linked,
            std::vector<Launch>& launches) {
    std::sort(launches.begin(), launches.end(), [](const Launch& a, const Launch& b) { return a.flow < b.flow; });
    std::unordered_map<int32_t, int64_t> core_end;
    for (const Launch& l : launches) {
      int64_t start = l.launch_ns + std::llround(l.start_ns - l.host_ns);
      auto it = core_end.find(l.core);
      if (it != core_end.end() && start < it->second) start = it->second;
      const int64_t end = start + std::llround(l.end_ns - l.start_ns);
      core_end[l.core] = end;
      cores_.insert(l.core);
      libkineto::GenericTraceActivity a(
          sim_span(), l.memcpy ? libkineto::ActivityType::GPU_MEMCPY : libkineto::ActivityType::CONCURRENT_KERNEL,
          l.name);
      a.startTime = start;
      a.endTime = end;
      a.id = activity_id(l.flow);
      a.device = l.core;
      a.resource = l.core;
      a.linked = (linked != nullptr && l.range > 0) ? (*linked)(static_cast<int32_t>(l.range)) : nullptr;
      a.addMetadataQuoted("flow_id", std::to_string(l.flow));  // (addMetadata needs fmt's library)
      logger.handleGenericActivity(a);  // Kineto keeps a copy
    }
  }

  std::set<int32_t> cores_;
};

class SimActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    return session_for(types);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    return session_for(types);
  }

 private:
  // device work only when the session asked for device activities (ProfilerActivity.PrivateUse1)
  static std::unique_ptr<libkineto::IActivityProfilerSession> session_for(
      const std::set<libkineto::ActivityType>& types) {
    if (!g_enabled || types.count(libkineto::ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<Session>();
  }

  std::string name_{"tilescope-sim"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                libkineto::ActivityType::GPU_MEMCPY};
};

}  // namespace

REGISTER_PRIVATEUSE1_PROFILER(SimActivityProfiler);

// profiler_record(flow, op, memcpy, core, host_ns, start_ns, end_ns[, queued_ns, modeled_ns,
// runtime_ns, nbytes, lowering, program, program_hash, direction, clock, first_run]) -> bool: keep
// this launch for the recording session (False: no session records device activities). With
// the runtime's record (the optional arguments, while profiler_keep asks for them) the launch
// keeps it too. A C-level call (METH_FASTCALL): it runs once per device execution, inside the
// user's op.
constexpr Py_ssize_t kLaunchArgs = 7, kRecordArgs = 17;

bool as_double(PyObject* o, double* out) {
  *out = PyFloat_CheckExact(o) ? PyFloat_AS_DOUBLE(o) : PyFloat_AsDouble(o);
  return !(*out == -1.0 && PyErr_Occurred());
}

bool as_int64(PyObject* o, int64_t* out) {
  *out = PyLong_AsLongLong(o);
  return !(*out == -1 && PyErr_Occurred());
}

bool as_bool(PyObject* o, bool* out) {
  const int truth = PyObject_IsTrue(o);
  *out = truth == 1;
  return truth >= 0;
}

// The launch kept for the recording session; false when no session records any more. The
// references (with 17 arguments, under the limit) are taken once the launch is stored: nothing
// to release if storing it throws.
bool keep_launch(Launch&& launch, PyObject* const* args, Py_ssize_t nargs) {
  std::lock_guard<std::mutex> guard(g_mu);
  if (!g_recording) return false;
  const bool keep = nargs == kRecordArgs && g_kept < g_keep;
  if (nargs == kRecordArgs && !keep && g_keep > 0) ++g_dropped;
  g_launches.push_back(std::move(launch));
  if (keep) {  // (the GIL is held: a call from Python)
    Detail& d = g_launches.back().detail;
    PyObject** refs[] = {&d.op, &d.lowering, &d.program, &d.program_hash, &d.direction, &d.clock};
    PyObject* values[] = {args[1], args[11], args[12], args[13], args[14], args[15]};
    for (size_t k = 0; k < 6; ++k) {
      Py_INCREF(values[k]);
      *refs[k] = values[k];
    }
    ++g_kept;
  }
  return true;
}

PyObject* profiler_record(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (g_graveyard_full.load(std::memory_order_relaxed)) release_graveyard();
  if (nargs != kLaunchArgs && nargs != kRecordArgs) {
    PyErr_Format(PyExc_TypeError, "profiler_record takes %zd or %zd arguments, not %zd", kLaunchArgs, kRecordArgs,
                 nargs);
    return nullptr;
  }
  if (!g_recording.load(std::memory_order_relaxed)) Py_RETURN_FALSE;
  int64_t flow, core;
  double host_ns, start_ns, end_ns;
  bool memcpy;
  Py_ssize_t op_size = 0;
  const char* op = PyUnicode_AsUTF8AndSize(args[1], &op_size);
  if (op == nullptr || !as_int64(args[0], &flow) || !as_bool(args[2], &memcpy) || !as_int64(args[3], &core) ||
      !as_double(args[4], &host_ns) || !as_double(args[5], &start_ns) || !as_double(args[6], &end_ns))
    return nullptr;
  Detail detail;
  if (nargs == kRecordArgs) {
    if (!as_double(args[7], &detail.queued_ns) || !as_double(args[8], &detail.modeled_ns) ||
        !as_double(args[9], &detail.runtime_ns) || !as_int64(args[10], &detail.nbytes) ||
        !as_bool(args[16], &detail.first_run))
      return nullptr;
    detail.thread_ident = PyThread_get_thread_ident();
    detail.native_tid = native_tid();
  }
  const uint64_t session = g_session.load(std::memory_order_relaxed);
  int64_t ids[kEnclosing + 1] = {0};  // the innermost open range, then the ones around it
  int n = 0;
  for (auto it = t_open.rbegin(); it != t_open.rend() && n <= kEnclosing && it->session == session; ++it)
    ids[n++] = static_cast<int64_t>(it->id);
  try {  // a C function: no C++ exception may cross into the interpreter
    // as tilescope.device._runtime.activity_name: a copy's op names it already ("memcpy HtoD")
    const std::string_view op_name(op, static_cast<size_t>(op_size));
    std::string name(memcpy ? (op_name.rfind("memcpy ", 0) == 0 ? "" : "memcpy ") : "exec_running ");
    name.append(op_name);
    if (keep_launch({flow, ids[0], {ids[1], ids[2], ids[3]}, wall_ns(), host_ns, start_ns, end_ns,
                     static_cast<int32_t>(core), memcpy, std::move(name), detail},
                    args, nargs))
      Py_RETURN_TRUE;
    Py_RETURN_FALSE;
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "the sim device's profiler could not keep a launch: %s", e.what());
    return nullptr;
  }
}

PyMethodDef kRecordMethod = {"profiler_record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&profiler_record)),
                             METH_FASTCALL, "Keep one device execution for the recording session (see profiler.cpp)."};

// Python objects made with the C API (py::make_tuple casts each item, ~1 us per launch: this runs
// once per execution at export); `steal` owns a new reference or raises the pending error.
py::object steal(PyObject* o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

// A tuple of new references (on failure, the ones made are released), or an instance of the
// tuple subclass `type` (a named tuple) made from it as tuple.__new__(type, t) makes one.
py::object make_tuple_of(PyTypeObject* type, std::initializer_list<PyObject*> items) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  bool ok = t != nullptr;
  for (PyObject* item : items) ok = ok && item != nullptr;
  if (!ok) {
    for (PyObject* item : items) Py_XDECREF(item);
    Py_XDECREF(t);
    throw py::error_already_set();
  }
  Py_ssize_t k = 0;
  for (PyObject* item : items) PyTuple_SET_ITEM(t, k++, item);
  py::object tuple = py::reinterpret_steal<py::object>(t);
  if (type == &PyTuple_Type) return tuple;
  py::object args = steal(PyTuple_Pack(1, t));
  return steal(PyTuple_Type.tp_new(type, args.ptr(), nullptr));
}

PyObject* new_ref(PyObject* o) {
  Py_INCREF(o);
  return o;
}

// The runtime's record of a launch: an `execution_type` (tilescope.device._runtime.Execution).
py::object execution(PyTypeObject* execution_type, const Launch& l) {
  static PyObject* const kinds[2] = {steal(PyUnicode_InternFromString("kernel")).release().ptr(),
                                     steal(PyUnicode_InternFromString("memcpy")).release().ptr()};
  const Detail& d = l.detail;
  return make_tuple_of(
      execution_type,
      {PyLong_FromLongLong(l.flow), new_ref(d.op), new_ref(kinds[l.memcpy ? 1 : 0]), new_ref(d.lowering),
       new_ref(d.program), new_ref(d.program_hash), PyLong_FromLong(l.core), PyLong_FromLong(0),
       PyLong_FromUnsignedLongLong(d.thread_ident), PyFloat_FromDouble(l.host_ns), PyFloat_FromDouble(d.queued_ns),
       PyFloat_FromDouble(l.start_ns), PyFloat_FromDouble(l.end_ns), PyFloat_FromDouble(d.modeled_ns),
       PyFloat_FromDouble(d.runtime_ns), PyLong_FromLongLong(d.nbytes), new_ref(d.direction), new_ref(d.clock),
       PyBool_FromLong(d.first_run), new_ref(Py_True)});
}

// The finished session that started recording in [trace_start_ns - before_ns, trace_start_ns +
// after_ns], nearest to trace_start_ns, handed over once, or None. Otherwise (its start, wall-clock
// ns; its launches from trace_start_ns on, by flow id, each (flow, 0, launch time in us from
// trace_start_ns, None) -- the form in which tilescope's correlation matches launches to ops, the
// 0 and None standing for torch's thread and op, found later; {flow: (the correlation id of its
// linked range, then of the ranges around that one, innermost first)}; the set of those ids that
// are not 0; {flow: (the runtime's record as an `execution_type`, the launching thread's system
// id)} of those whose records were kept; how many records the limit let go). Everything the
// export would otherwise make in Python, once per execution.
py::object profiler_take(int64_t trace_start_ns, int64_t before_ns, int64_t after_ns, py::type execution_type) {
  auto* type = reinterpret_cast<PyTypeObject*>(execution_type.ptr());
  if (!PyType_IsSubtype(type, &PyTuple_Type) || type->tp_itemsize != PyTuple_Type.tp_itemsize)
    throw py::type_error("profiler_take: execution_type must be a named tuple (tilescope.device._runtime.Execution)");
  release_graveyard();
  std::vector<Launch> taken;
  int64_t start_ns = 0, dropped = 0;
  bool found = false;
  {
    std::lock_guard<std::mutex> guard(g_mu);
    auto best = g_done.end();
    for (auto it = g_done.begin(); it != g_done.end(); ++it) {
      const int64_t delta = it->start_ns - trace_start_ns;
      if (delta < -before_ns || delta > after_ns) continue;
      if (best == g_done.end() || std::llabs(delta) < std::llabs(best->start_ns - trace_start_ns)) best = it;
    }
    if (best != g_done.end()) {
      taken.swap(best->launches);
      start_ns = best->start_ns;
      dropped = best->dropped;
      found = true;
      g_done.erase(best);
    }
  }
  if (!found) return py::none();
  struct Release {  // every taken launch's references, also when making the Python objects fails
    std::vector<Launch>& launches;
    ~Release() {
      for (Launch& l : launches) release(l.detail);
    }
  } releasing{taken};
  py::list launches;
  py::dict ranges, records;
  py::set range_ids;
  for (const Launch& l : taken) {  // by flow id: emit() sorted them
    if (l.launch_ns < trace_start_ns) continue;  // before this trace: not its own
    int n = 0;
    while (n < kEnclosing && l.enclosing[n] != 0) ++n;
    py::object ids = steal(PyTuple_New(n + 1));
    for (int k = 0; k <= n; ++k) {
      const int64_t id = k == 0 ? l.range : l.enclosing[k - 1];
      PyObject* item = PyLong_FromLongLong(id);
      if (item == nullptr) throw py::error_already_set();
      PyTuple_SET_ITEM(ids.ptr(), k, item);
      if (id > 0 && PySet_Add(range_ids.ptr(), item) < 0) throw py::error_already_set();
    }
    py::object flow = steal(PyLong_FromLongLong(l.flow));
    const double launch_us = static_cast<double>(l.launch_ns - trace_start_ns) / 1000.0;
    launches.append(make_tuple_of(&PyTuple_Type, {new_ref(flow.ptr()), PyLong_FromLong(0), PyFloat_FromDouble(launch_us),
                                                  new_ref(Py_None)}));
    if (PyDict_SetItem(ranges.ptr(), flow.ptr(), ids.ptr()) < 0) throw py::error_already_set();
    if (l.detail.op != nullptr)
      records[flow] = make_tuple_of(&PyTuple_Type, {execution(type, l).release().ptr(), PyLong_FromLongLong(l.detail.native_tid)});
  }
  return py::make_tuple(start_ns, launches, ranges, range_ids, records, dropped);
}

// Keep the runtime's records of up to `limit` launches per session (0: none).
void profiler_keep(int64_t limit) {
  std::lock_guard<std::mutex> guard(g_mu);
  g_keep = limit < 0 ? 0 : limit;
}

void profiler_enable(bool on) { g_enabled = on; }
bool profiler_available() { return true; }

}  // namespace tilescope_sim

#else  // no Kineto in this torch: the profiler integration is absent (tilescope's markers stand in)

namespace tilescope_sim {
PyObject* profiler_record(PyObject*, PyObject* const*, Py_ssize_t) { Py_RETURN_FALSE; }
PyMethodDef kRecordMethod = {"profiler_record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&profiler_record)),
                             METH_FASTCALL, "No Kineto in this torch: records nothing."};
py::object profiler_take(int64_t, int64_t, int64_t, py::type) { return py::none(); }
void profiler_keep(int64_t) {}
void profiler_enable(bool) {}
bool profiler_available() { return false; }
}  // namespace tilescope_sim

#endif  // USE_KINETO

namespace tilescope_sim {

void bind_profiler(py::module& m) {
  py::object module_name = m.attr("__name__");
  py::object record = py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kRecordMethod, nullptr, module_name.ptr()));
  if (!record) throw py::error_already_set();
  m.add_object("profiler_record", record);
  m.def("profiler_take", &profiler_take);
  m.def("profiler_keep", &profiler_keep);
  m.def("profiler_enable", &profiler_enable);
  m.def("profiler_available", &profiler_available);
}

}  // namespace tilescope_sim
