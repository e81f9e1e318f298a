// The runtime behind tilescope/gpsimd.h, compiled into every operator library.
//
// It emulates what a kernel sees on one GpSimd core -- its id, its TCM pool, TCM accessors,
// the output tensor -- and checks every use: pool exhaustion, accessor copies outside the
// tensor or outside the TCM buffer, writes into inputs, buffer overruns (guard bytes around
// each allocation), leaks. Each accessor copy is logged (direction, tensor, offset, count,
// source line) for tilescope's coverage checks and for the device model, which turns each
// one into a DMA transfer. In a library built for counting (the user's sources compiled with
// -fsanitize-coverage=trace-pc), every basic block the kernel executes calls
// __sanitizer_cov_trace_pc below, which counts it: the device model's compute estimate is
// those counts times each block's instructions, the same for the same inputs on every run.
// The Python side (tilescope.cpp) calls the C ABI at the bottom. A fault, Ctrl-C or a timeout
// inside the user's code stops the kernel, not the process (fault_guard.h).
#include <tilescope/gpsimd.h>

#include "fault_guard.h"

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace tilescope {
namespace detail {
namespace {

constexpr size_t kAlign = 64;    // 512-bit SIMD registers: allocations are 64-byte aligned
constexpr size_t kGuard = 64;    // guard bytes before and after each allocation (not counted)
constexpr unsigned char kGuardByte = 0xA5;

struct LogRec {
    int32_t dir;  // 0: tensor -> TCM, 1: TCM -> tensor
    int32_t arg;  // argument position, -1 for the output
    int32_t file;
    int32_t line;
    int32_t core;
    int32_t elem_size;
    int64_t offset;
    int64_t count;
};

struct RunStats {
    int64_t blocks;         // distinct basic blocks counted (counting builds; 0 otherwise)
    int64_t executed;       // basic blocks executed (counting builds; 0 otherwise)
    int64_t tcm_peak;       // bytes of the pool in use at the high-water mark
    int64_t tcm_leaked;     // bytes never freed
    int32_t leaks;          // allocations never freed
    int32_t dst_requested;  // the kernel called get_dst_tensor()
};

struct Alloc {
    size_t addr;       // offset inside the core's pool
    size_t accounted;  // bytes charged to the pool
    size_t size;       // bytes requested
    unsigned char* block;  // its guard bytes before, then the data, then guard bytes after
    const char* file;
    int line;
};

// Executions per basic block, keyed by the block's probe return address: open addressing,
// grown at half load (a kernel has a few hundred blocks; the probe runs once per block executed).
struct PcCount {
    uint64_t offset;  // return address of the block's probe, relative to the library's load base
    uint64_t count;
};
struct PcTable {
    std::vector<uintptr_t> pc;
    std::vector<uint64_t> n;
    size_t used = 0;
    void clear() {
        pc.assign(1024, 0);
        n.assign(1024, 0);
        used = 0;
    }
    void add(uintptr_t p) {
        if (pc.empty()) clear();
        size_t mask = pc.size() - 1;
        size_t i = (p >> 2) * 0x9E3779B97F4A7C15ull >> 20 & mask;
        while (pc[i] != p) {
            if (pc[i] == 0) {
                if (2 * (used + 1) > pc.size()) {
                    grow();
                    add(p);
                    return;
                }
                pc[i] = p;
                ++used;
                break;
            }
            i = (i + 1) & mask;
        }
        ++n[i];
    }
    void grow() {
        std::vector<uintptr_t> old_pc;
        std::vector<uint64_t> old_n;
        old_pc.swap(pc);
        old_n.swap(n);
        pc.assign(old_pc.size() * 2, 0);
        n.assign(old_pc.size() * 2, 0);
        used = 0;
        for (size_t k = 0; k < old_pc.size(); ++k)
            if (old_pc[k]) {
                size_t mask = pc.size() - 1;
                size_t i = (old_pc[k] >> 2) * 0x9E3779B97F4A7C15ull >> 20 & mask;
                while (pc[i]) i = (i + 1) & mask;
                pc[i] = old_pc[k];
                n[i] = old_n[k];
                ++used;
            }
    }
};

struct Context {
    bool in_kernel = false;
    bool in_shape = false;
    uint32_t cpu_id = 0;
    uint32_t cpu_count = 1;
    const Arg* args = nullptr;
    int nargs = 0;
    TensorDesc dst{};
    const char* op = "";
    bool dst_requested = false;
    size_t capacity = 0;
    size_t used = 0;
    size_t peak = 0;
    std::map<uintptr_t, Alloc> by_ptr;  // user pointer -> allocation
    std::map<size_t, uintptr_t> by_addr;
    bool logging = false;
    bool counting = false;
    PcTable pcs;                                   // this core run's executed blocks
    std::vector<std::vector<PcCount>> counts;      // per core run: (block offset, executions)
    std::vector<LogRec> log;
    std::vector<const char*> files;
    std::vector<std::string> notes;  // per core run: live allocations at return (leaks)
    guard::Slot* slot = nullptr;     // this thread's slot while a kernel or shape function runs
    unsigned char* arena = nullptr;  // the emulated pool of the core run (in the slot's arena)
    int32_t stop_outcome = 0;        // how the last run stopped (guard::Outcome)
    std::vector<uint64_t> stop_frames;  // its instruction and return addresses in this library (offsets)
};

thread_local Context ctx;

struct OpTable {
    std::vector<OpEntry> ops;
    std::string error;
};
OpTable& table() {
    static OpTable t;
    return t;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

const char* dtype_name(int32_t d) {
    static const char* names[] = {"float32", "bfloat16", "float16", "int32", "int16", "int8", "uint8", "bool"};
    return d >= 0 && d < 8 ? names[d] : "unknown";
}
const char* ctype_name(int32_t d) {
    static const char* names[] = {"float", "tilescope::bfloat16", "tilescope::half", "int32_t",
                                  "int16_t", "int8_t", "uint8_t", "bool"};
    return d >= 0 && d < 8 ? names[d] : "?";
}

std::string where() {
    if (!ctx.in_kernel) return "";
    if (ctx.cpu_count > 1) return fmt("on GpSimd core %u of %u: ", ctx.cpu_id, ctx.cpu_count);
    return "";
}

std::string tensor_name(const TensorDesc& t) {
    if (t.role == kRoleOutput) return "the output tensor";
    if (t.role == kRoleMeta) return "a tensor without data";
    return fmt("argument %d", t.index);
}

std::string shape_str(const TensorDesc& t) {
    std::string s = "[";
    for (int k = 0; k < t.ndim; ++k) s += (k ? ", " : "") + std::to_string(t.sizes[k]);
    return s + "]";
}

void require_kernel(const char* what, const char* file, int line) {
    if (!ctx.in_kernel)
        fail(std::string(what) + " was called outside a kernel function" +
                 (ctx.in_shape ? " (in a shape function, which runs on the host and has no device data)" : ""),
             file, line);
}

int file_id(const char* file) {
    for (size_t k = 0; k < ctx.files.size(); ++k)
        if (ctx.files[k] == file) return static_cast<int>(k);
    ctx.files.push_back(file);
    return static_cast<int>(ctx.files.size() - 1);
}

bool guard_intact(const Alloc& a) {
    for (size_t k = 0; k < kGuard; ++k)
        if (a.block[k] != kGuardByte || a.block[kGuard + a.size + k] != kGuardByte) return false;
    return true;
}

std::string describe_live() {
    std::string s;
    int n = 0;
    for (auto& kv : ctx.by_addr) {
        const Alloc& a = ctx.by_ptr.at(kv.second);
        if (n++ == 6) {
            s += ", ...";
            break;
        }
        s += fmt("%s%zu B at %s:%d", n > 1 ? ", " : "", a.size, a.file, a.line);
    }
    return s;
}

// Largest free gap of the pool, and the first gap that fits `need` (or SIZE_MAX).
size_t first_fit(size_t need, size_t* largest) {
    size_t prev = 0, fit = SIZE_MAX;
    *largest = 0;
    for (auto& kv : ctx.by_addr) {
        size_t gap = kv.first - prev;
        if (gap > *largest) *largest = gap;
        if (gap >= need && fit == SIZE_MAX) fit = prev;
        const Alloc& a = ctx.by_ptr.at(kv.second);
        prev = a.addr + a.accounted;
    }
    size_t tail = ctx.capacity > prev ? ctx.capacity - prev : 0;
    if (tail > *largest) *largest = tail;
    if (tail >= need && fit == SIZE_MAX) fit = prev;
    return fit;
}

void release(Alloc&) {}  // the block lives in the core's arena, reused by the next run

// The pool's host memory: allocation at pool offset A starts at arena + kGuard + 2*A, so
// between two allocations there are at least as many bytes as the first one holds (and at
// least kGuard): guard bytes after each allocation, before the next (see fault_guard.h).
size_t arena_bytes(size_t capacity) { return 2 * capacity + 2 * kGuard + kAlign; }

// Marks the runtime's own code for asynchronous stops (Ctrl-C, timeout, cancel): one that
// arrives inside waits for the call's return, where check_pending() throws it.
struct InRuntime {
    guard::Slot* s;
    InRuntime() : s(ctx.slot) { if (s) ++s->in_runtime; }
    ~InRuntime() { if (s) --s->in_runtime; }
};

struct Stopped {  // an asynchronous stop deferred to a runtime call's return
    int outcome;
    const char* file;
    int line;
};

void check_pending(const char* file, int line) {
    guard::Slot* s = ctx.slot;
    if (s && s->pending && s->in_runtime == 1) {
        int outcome = s->pending;
        s->pending = 0;
        throw Stopped{outcome, file, line};
    }
}

void reset_pool() {
    for (auto& kv : ctx.by_ptr) release(kv.second);
    ctx.by_ptr.clear();
    ctx.by_addr.clear();
    ctx.used = 0;
    ctx.peak = 0;
}

// The TCM allocation holding [p, p + nbytes), or a failed check.
const Alloc& tcm_region(const void* p, size_t count, size_t elem_size, const char* what, const char* file,
                        int line) {
    const size_t nbytes = count * elem_size;
    uintptr_t u = reinterpret_cast<uintptr_t>(p);
    auto it = ctx.by_ptr.upper_bound(u);
    if (it != ctx.by_ptr.begin()) {
        --it;
        const Alloc& a = it->second;
        if (u >= it->first && u < it->first + (a.size ? a.size : 1)) {
            size_t start = u - it->first;
            if (start + nbytes > a.size)
                fail(where() + fmt("%s of %zu elements (%zu bytes) covers bytes [%zu, %zu) of the TCM buffer "
                                   "allocated at %s:%d, which has %zu bytes: %zu bytes past its end. Copy at "
                                   "most %zu elements there, or allocate a larger buffer",
                                   what, count, nbytes, start, start + nbytes, a.file, a.line, a.size,
                                   start + nbytes - a.size, (a.size - start) / elem_size),
                     file, line);
            return a;
        }
    }
    fail(where() + fmt("%s uses a pointer that is not inside a live tcm_malloc'ed buffer; TCM accessors copy "
                       "between a tensor and TCM: pass a pointer returned by tcm_malloc (plus an offset "
                       "inside it)",
                       what),
         file, line);
}

void check_tensor_range(const TensorDesc& t, int32_t elem_dtype, size_t elem_size, size_t offset, size_t count,
                        const char* what, const char* file, int line) {
    if (t.role == kRoleMeta || t.data == nullptr)
        fail(where() + fmt("%s on a tensor without data: tensors made by empty()/zeros() only describe a shape "
                           "(for shape functions); kernels read their arguments and write get_dst_tensor()",
                           what),
             file, line);
    if (elem_dtype != t.dtype)
        fail(where() + fmt("%s<%s> on %s, whose dtype is %s: the template type must match the tensor's "
                           "dtype; use %s<%s>",
                           what, ctype_name(elem_dtype), tensor_name(t).c_str(), dtype_name(t.dtype), what,
                           ctype_name(t.dtype)),
             file, line);
    (void)elem_size;
    const size_t n = static_cast<size_t>(t.numel);
    if (static_cast<int64_t>(offset) < 0 || static_cast<int64_t>(count) < 0)
        fail(where() + fmt("%s with tensor_offset %lld and num_elem %lld (as signed values): a negative "
                           "value was converted to size_t; check the offset arithmetic",
                           what, static_cast<long long>(offset), static_cast<long long>(count)),
             file, line);
    if (offset > n || count > n - offset)
        fail(where() + fmt("%s reaches elements [%zu, %zu) of %s (shape %s, %zu elements): %zu elements past "
                           "the end. Valid offsets are 0 .. %zu, with offset + num_elem <= %zu",
                           what, offset, offset + count, tensor_name(t).c_str(), shape_str(t).c_str(), n,
                           offset + count - n, n ? n - 1 : 0, n),
             file, line);
}

void log_copy(int32_t dir, const TensorDesc& t, size_t offset, size_t count, size_t elem_size, const char* file,
              int line) {
    if (!ctx.logging) return;
    ctx.log.push_back(LogRec{dir, t.role == kRoleOutput ? -1 : t.index, file_id(file), line,
                             static_cast<int32_t>(ctx.cpu_id), static_cast<int32_t>(elem_size),
                             static_cast<int64_t>(offset), static_cast<int64_t>(count)});
}

}  // namespace

[[noreturn]] void fail(const std::string& message, const char* file, int line) {
    throw Error(std::string(file) + ":" + std::to_string(line) + ": " + message);
}

void* tcm_malloc(size_t nbytes, const char* file, int line) {
    InRuntime scope;
    require_kernel("tcm_malloc", file, line);
    if (static_cast<int64_t>(nbytes) < 0)
        fail(where() + fmt("tcm_malloc(%lld bytes): a negative size was converted to size_t",
                           static_cast<long long>(nbytes)),
             file, line);
    size_t accounted = (nbytes + kAlign - 1) / kAlign * kAlign;
    if (accounted == 0) accounted = kAlign;
    size_t largest = 0;
    size_t addr = first_fit(accounted, &largest);
    if (addr == SIZE_MAX) {
        size_t free_bytes = ctx.capacity - ctx.used;
        // with no room left at all, smaller chunks cannot help: the live buffers must go
        const std::string advice =
            largest == 0 ? std::string("No block is free: tcm_free buffers you no longer need (a loop that "
                                       "allocates without freeing fills the pool)")
                         : fmt("Process the data in smaller chunks (at most %zu bytes), or tcm_free buffers you "
                               "no longer need",
                               largest);
        fail(where() + fmt("tcm_malloc(%zu bytes) failed: the TCM pool of this core holds %zu bytes and %zu are "
                           "in use by %zu live allocation%s (%s), so %zu bytes are free (largest free block %zu "
                           "bytes; allocations are rounded up to %zu bytes). %s",
                           nbytes, ctx.capacity, ctx.used, ctx.by_ptr.size(), ctx.by_ptr.size() == 1 ? "" : "s",
                           ctx.by_ptr.empty() ? "none" : describe_live().c_str(), free_bytes, largest, kAlign,
                           advice.c_str()),
             file, line);
    }
    if (!ctx.arena) fail("host out of memory while emulating the TCM pool", file, line);
    unsigned char* block = ctx.arena + 2 * addr;
    std::memset(block, kGuardByte, kGuard);
    std::memset(block + kGuard, 0xFF, nbytes);  // NaN for floats: reads of unset values show
    std::memset(block + kGuard + nbytes, kGuardByte, kGuard);
    void* p = block + kGuard;
    ctx.by_ptr[reinterpret_cast<uintptr_t>(p)] = Alloc{addr, accounted, nbytes, block, file, line};
    ctx.by_addr[addr] = reinterpret_cast<uintptr_t>(p);
    ctx.used += accounted;
    if (ctx.used > ctx.peak) ctx.peak = ctx.used;
    check_pending(file, line);
    return p;
}

void tcm_free(void* ptr, const char* file, int line) {
    InRuntime scope;
    require_kernel("tcm_free", file, line);
    if (ptr == nullptr) return;
    auto it = ctx.by_ptr.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == ctx.by_ptr.end())
        fail(where() + "tcm_free of a pointer that tcm_malloc did not return (or that was already freed)", file,
             line);
    Alloc a = it->second;
    if (!guard_intact(a))
        fail(where() + fmt("the TCM buffer of %zu bytes allocated at %s:%d was written outside its bounds "
                           "(its guard bytes changed; found at tcm_free): a loop writes past the end (or "
                           "before the start) of the buffer",
                           a.size, a.file, a.line),
             file, line);
    ctx.by_addr.erase(a.addr);
    ctx.by_ptr.erase(it);
    ctx.used -= a.accounted;
    release(a);
    check_pending(file, line);
}

void tensor_to_tcm(const TensorDesc& t, void* tcm_ptr, int32_t elem_dtype, size_t elem_size, size_t offset,
                   size_t count, const char* file, int line) {
    InRuntime scope;
    require_kernel("tensor_to_tcm", file, line);
    check_tensor_range(t, elem_dtype, elem_size, offset, count, "tensor_to_tcm", file, line);
    tcm_region(tcm_ptr, count, elem_size, "tensor_to_tcm", file, line);
    std::memcpy(tcm_ptr, static_cast<const char*>(t.data) + offset * elem_size, count * elem_size);
    log_copy(0, t, offset, count, elem_size, file, line);
    check_pending(file, line);
}

void tcm_to_tensor(const TensorDesc& t, const void* tcm_ptr, int32_t elem_dtype, size_t elem_size, size_t offset,
                   size_t count, const char* file, int line) {
    InRuntime scope;
    require_kernel("tcm_to_tensor", file, line);
    if (t.role == kRoleInput)
        fail(where() + fmt("tcm_to_tensor into argument %d, an input: a kernel writes only its output. Get it "
                           "with Tensor t_out = get_dst_tensor(); and write through tcm_accessor(t_out)",
                           t.index),
             file, line);
    check_tensor_range(t, elem_dtype, elem_size, offset, count, "tcm_to_tensor", file, line);
    tcm_region(tcm_ptr, count, elem_size, "tcm_to_tensor", file, line);
    std::memcpy(static_cast<char*>(t.data) + offset * elem_size, tcm_ptr, count * elem_size);
    log_copy(1, t, offset, count, elem_size, file, line);
    check_pending(file, line);
}

uint32_t cpu_id(const char* file, int line) {
    require_kernel("get_cpu_id", file, line);
    return ctx.cpu_id;
}

uint32_t cpu_count(const char* file, int line) {
    require_kernel("get_cpu_count", file, line);
    return ctx.cpu_count;
}

TensorDesc dst_tensor(const char* file, int line) {
    require_kernel("get_dst_tensor", file, line);
    ctx.dst_requested = true;
    return ctx.dst;
}

TensorDesc meta_tensor(const int64_t* sizes, int ndim, ScalarType dtype, const char* file, int line) {
    TensorDesc d{};
    d.ndim = ndim;
    d.numel = 1;
    for (int k = 0; k < ndim; ++k) {
        if (sizes[k] < 0) fail(fmt("empty(): dimension %d has negative size %lld", k, (long long)sizes[k]), file, line);
        d.sizes[k] = sizes[k];
        d.numel *= sizes[k];
    }
    d.dtype = static_cast<int32_t>(dtype);
    d.role = kRoleMeta;
    d.index = -3;
    return d;
}

void register_op(const OpEntry& entry) {
    OpTable& t = table();
    for (const OpEntry& e : t.ops)
        if (std::strcmp(e.lib, entry.lib) == 0 && std::strcmp(e.name, entry.name) == 0 && t.error.empty())
            t.error = fmt("%s:%d: operator %s::%s is defined twice (first at %s:%d)", entry.file, entry.line,
                          entry.lib, entry.name, e.file, e.line);
    t.ops.push_back(entry);
}

}  // namespace detail
}  // namespace tilescope

// ---- C ABI used by tilescope.cpp (ctypes) ------------------------------------------------
using namespace tilescope::detail;

namespace {
void copy_error(const std::string& msg, char* err, int errlen) {
    if (!err || errlen <= 0) return;
    std::snprintf(err, static_cast<size_t>(errlen), "%s", msg.c_str());
}
}  // namespace

extern "C" {

TILESCOPE_API int ts_abi_version() { return TILESCOPE_GPSIMD_ABI; }

TILESCOPE_API void ts_abi_sizes(int64_t* out) {
    out[0] = sizeof(TensorDesc);
    out[1] = sizeof(Arg);
    out[2] = sizeof(LogRec);
    out[3] = sizeof(RunStats);
}

TILESCOPE_API const char* ts_registration_error() { return table().error.c_str(); }
TILESCOPE_API int ts_op_count() { return static_cast<int>(table().ops.size()); }
TILESCOPE_API const char* ts_op_lib(int i) { return table().ops.at(i).lib; }
TILESCOPE_API const char* ts_op_name(int i) { return table().ops.at(i).name; }
TILESCOPE_API const char* ts_op_kinds(int i) { return table().ops.at(i).kinds; }
TILESCOPE_API const char* ts_op_file(int i) { return table().ops.at(i).file; }
TILESCOPE_API int ts_op_line(int i) { return table().ops.at(i).line; }

namespace {
// The load base of this library, so counted blocks are named by offsets objdump shows.
uintptr_t library_base() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&library_base), &info) && info.dli_fbase)
        return reinterpret_cast<uintptr_t>(info.dli_fbase);
    return 0;
}

const char* signal_name(int sig) {
    switch (sig) {
        case SIGSEGV: return "SIGSEGV";
        case SIGBUS: return "SIGBUS";
        case SIGFPE: return "SIGFPE";
        case SIGILL: return "SIGILL";
        case SIGABRT: return "SIGABRT";
        case SIGINT: return "SIGINT";
        default: return "a signal";
    }
}

// What a fault was, in words: the signal, the access and its likely cause.
std::string describe_fault(const guard::Slot& s) {
    const char* access = s.access == 2 ? "a write to" : s.access == 1 ? "a read of" : "an access to";
    switch (s.sig) {
        case SIGSEGV: {
            const unsigned char* pool = s.region_bytes ? s.region : nullptr;
            if (s.addr < 4096)
                return fmt("SIGSEGV, %s address 0x%zx: a null pointer dereference", access, (size_t)s.addr);
            if (pool && s.addr >= reinterpret_cast<uintptr_t>(s.map) &&
                s.addr < reinterpret_cast<uintptr_t>(s.map) + s.map_bytes)
                return fmt("SIGSEGV, %s memory past this core's TCM pool (a pointer run off the end, or before "
                           "the start, of a tcm_malloc'ed buffer)", access);
            const uintptr_t gap = s.addr > s.sp ? s.addr - s.sp : s.sp - s.addr;
            if (s.sp && gap < 256 * 1024)
                return fmt("SIGSEGV, %s address 0x%zx next to the stack pointer: a stack overflow (deep or "
                           "infinite recursion, or a large local array)", access, (size_t)s.addr);
            return fmt("SIGSEGV, %s address 0x%zx, which is not mapped: a wild or dangling pointer", access,
                       (size_t)s.addr);
        }
        case SIGBUS: return fmt("SIGBUS at address 0x%zx: a misaligned or unbacked memory access", (size_t)s.addr);
        case SIGFPE:
            if (s.code == FPE_INTDIV) return "SIGFPE: an integer division by zero";
            if (s.code == FPE_INTOVF) return "SIGFPE: an integer overflow (e.g. INT_MIN / -1)";
            return "SIGFPE: an arithmetic exception";
        case SIGILL:
            return "SIGILL: an illegal instruction (compilers place one where code has undefined behaviour, "
                   "e.g. a function returning a value that ends without a return statement)";
        case SIGABRT:
            return "SIGABRT: the kernel called abort() (a failed assert(), or an exception escaping a noexcept "
                   "function; its message, if any, is on stderr)";
        default: return signal_name(s.sig);
    }
}

// The stopped code's instruction address and return addresses, as offsets in this library
// (the Python side names their source lines); UINT64_MAX for an address in another object.
void save_stop_frames(const guard::Slot& s) {
    ctx.stop_frames.clear();
    const uintptr_t base = library_base();
    auto offset = [&](uintptr_t a) -> uint64_t {
        Dl_info info{};
        if (a && dladdr(reinterpret_cast<void*>(a), &info) && reinterpret_cast<uintptr_t>(info.dli_fbase) == base)
            return static_cast<uint64_t>(a - base);
        return UINT64_MAX;
    };
    ctx.stop_frames.push_back(offset(s.pc));
    int first = 0;  // the frames after the interrupted instruction's (skip the handler's and the trampoline)
    for (int k = 0; k < s.nframes; ++k)
        if (reinterpret_cast<uintptr_t>(s.frames[k]) == s.pc) first = k + 1;
    if (first == 0) first = s.nframes > 2 ? 2 : s.nframes;
    for (int k = first; k < s.nframes && ctx.stop_frames.size() < static_cast<size_t>(guard::kMaxFrames); ++k)
        ctx.stop_frames.push_back(offset(reinterpret_cast<uintptr_t>(s.frames[k])));
}

// Where the stopped code was, when it was not in this library (e.g. "in libc.so.6 (memset)").
std::string elsewhere(uintptr_t pc) {
    Dl_info info{};
    if (!pc || !dladdr(reinterpret_cast<void*>(pc), &info) || !info.dli_fname) return "";
    if (reinterpret_cast<uintptr_t>(info.dli_fbase) == library_base()) return "";
    const char* name = std::strrchr(info.dli_fname, '/');
    return fmt(" in %s%s%s%s", name ? name + 1 : info.dli_fname, info.dli_sname ? " (" : "",
               info.dli_sname ? info.dli_sname : "", info.dli_sname ? ")" : "");
}

// The message of a run stopped by a signal, a timeout, Ctrl-C or a cancel request.
std::string describe_stop(const guard::Slot& s, const char* what, double timeout_s) {
    switch (s.outcome) {
        case guard::kFault:
            return fmt("%s faulted: %s%s", what, describe_fault(s).c_str(),
                       s.sig == SIGABRT ? "" : elsewhere(s.pc).c_str());
        case guard::kTimeout:
            return fmt("%s ran longer than the %g s limit and was stopped%s (an infinite loop? the limit is "
                       "timeout_s of tilescope.cpp.load / load_library)",
                       what, timeout_s, elsewhere(s.pc).c_str());
        case guard::kInterrupted: return fmt("%s was interrupted (Ctrl-C)", what);
        case guard::kCancelled: return fmt("%s was stopped: the device's queued work was cancelled", what);
        default: return fmt("%s stopped", what);
    }
}

struct ShapeCall {
    const OpEntry* e;
    const Arg* args;
    TensorDesc* out;
    char* err;
    int errlen;
    int rc;
};

void shape_body(void* data) {
    auto* c = static_cast<ShapeCall*>(data);
    const OpEntry& e = *c->e;
    try {
        e.shape_thunk(e.shape, c->args, c->out);
    } catch (const tilescope::Error& x) {
        copy_error(x.what(), c->err, c->errlen);
        c->rc = 1;
    } catch (const Stopped& x) {
        c->rc = 100 + x.outcome;
    } catch (const std::exception& x) {
        copy_error(fmt("the shape function of %s::%s threw: %s", e.lib, e.name, x.what()), c->err, c->errlen);
        c->rc = 1;
    } catch (...) {
        copy_error(fmt("the shape function of %s::%s threw an exception of unknown type", e.lib, e.name), c->err,
                   c->errlen);
        c->rc = 1;
    }
}
}  // namespace

TILESCOPE_API int ts_shape(int op, const Arg* args, int nargs, TensorDesc* out, char* err, int errlen) {
    const OpEntry& e = table().ops.at(op);
    if (nargs != e.nargs) {
        copy_error(fmt("%s::%s takes %d arguments, got %d", e.lib, e.name, e.nargs, nargs), err, errlen);
        return 1;
    }
    ctx.in_shape = true;
    ctx.stop_outcome = guard::kOk;
    ShapeCall call{&e, args, out, err, errlen, 0};
    guard::Run run;
    if (guard::begin(run, 0.0)) {
        ctx.slot = run.slot;
        int outcome = guard::guarded(run.slot, shape_body, &call);
        if (outcome != guard::kOk) {
            save_stop_frames(*run.slot);
            ctx.stop_outcome = outcome;
            copy_error(describe_stop(*run.slot, fmt("the shape function of %s::%s", e.lib, e.name).c_str(), 0.0),
                       err, errlen);
            call.rc = 1;
        }
        ctx.slot = nullptr;
        guard::end(run);
    } else {
        shape_body(&call);
    }
    ctx.in_shape = false;
    return call.rc;
}

namespace {
// This core run's block counts, sorted by offset (deterministic order), into ctx.counts.
void save_counts(RunStats* stats) {
    std::vector<PcCount> out;
    const uintptr_t base = library_base();
    int64_t executed = 0;
    for (size_t i = 0; i < ctx.pcs.pc.size(); ++i)
        if (ctx.pcs.pc[i]) {
            out.push_back({static_cast<uint64_t>(ctx.pcs.pc[i] - base), ctx.pcs.n[i]});
            executed += static_cast<int64_t>(ctx.pcs.n[i]);
        }
    std::sort(out.begin(), out.end(), [](const PcCount& a, const PcCount& b) { return a.offset < b.offset; });
    stats->blocks = static_cast<int64_t>(out.size());
    stats->executed = executed;
    ctx.counts.push_back(std::move(out));
}

struct KernelCall {
    const OpEntry* e;
    const Arg* args;
    char* err;
    int errlen;
    int rc;
    int stopped;  // a deferred asynchronous stop (guard::Outcome), 0 if none
    const char* stop_file;
    int stop_line;
};

void kernel_body(void* data) {
    auto* c = static_cast<KernelCall*>(data);
    const OpEntry& e = *c->e;
    try {
        e.kernel_thunk(e.kernel, c->args);
        for (auto& kv : ctx.by_ptr)
            if (!guard_intact(kv.second))
                fail(where() + fmt("the TCM buffer of %zu bytes allocated at %s:%d was written outside its "
                                   "bounds (its guard bytes changed; found when the kernel returned): a loop "
                                   "writes past the end (or before the start) of the buffer",
                                   kv.second.size, kv.second.file, kv.second.line),
                     kv.second.file, kv.second.line);
    } catch (const tilescope::Error& x) {
        copy_error(x.what(), c->err, c->errlen);
        c->rc = 1;
    } catch (const Stopped& x) {
        c->stopped = x.outcome;
        c->stop_file = x.file;
        c->stop_line = x.line;
        c->rc = 1;
    } catch (const std::exception& x) {
        copy_error(fmt("%s::%s: the kernel threw %s", e.lib, e.name, x.what()), c->err, c->errlen);
        c->rc = 1;
    } catch (...) {
        copy_error(fmt("%s::%s: the kernel threw an exception of unknown type", e.lib, e.name), c->err, c->errlen);
        c->rc = 1;
    }
}

// One run of the kernel as core cpu_id; returns 0 or 1 (error message in err).
int run_core(const OpEntry& e, const Arg* args, int nargs, const TensorDesc* dst, uint32_t cpu_id,
             uint32_t cpu_count, int64_t tcm_bytes, int32_t flags, RunStats* stats, char* err, int errlen,
             double timeout_s) {
    ctx.in_kernel = true;
    ctx.cpu_id = cpu_id;
    ctx.cpu_count = cpu_count;
    ctx.args = args;
    ctx.nargs = nargs;
    ctx.dst = *dst;
    ctx.op = e.name;
    ctx.dst_requested = false;
    ctx.capacity = static_cast<size_t>(tcm_bytes);
    reset_pool();
    ctx.arena = ctx.slot ? guard::arena(ctx.slot, arena_bytes(ctx.capacity)) : nullptr;
    std::vector<unsigned char> fallback;  // no slot (every one taken): a plain buffer
    if (!ctx.slot) {
        fallback.resize(arena_bytes(ctx.capacity));
        ctx.arena = fallback.data();
    }
    ctx.logging = (flags & 1) != 0;
    ctx.pcs.clear();
    ctx.counting = (flags & 4) != 0;
    KernelCall call{&e, args, err, errlen, 0, 0, nullptr, 0};
    int outcome = ctx.slot ? guard::guarded(ctx.slot, kernel_body, &call) : (kernel_body(&call), guard::kOk);
    ctx.counting = false;
    std::fflush(stdout);
    if (outcome != guard::kOk) {  // stopped by a signal, inside the user's code
        save_stop_frames(*ctx.slot);
        ctx.stop_outcome = outcome;
        copy_error(where() + describe_stop(*ctx.slot, "the kernel", timeout_s), err, errlen);
        call.rc = 1;
    } else if (call.stopped) {  // stopped at the return of a runtime call: that call's line
        guard::Slot stop{};
        stop.outcome = call.stopped;
        ctx.stop_outcome = call.stopped;
        ctx.stop_frames.clear();
        copy_error(fmt("%s:%d: ", call.stop_file, call.stop_line) + where() +
                       describe_stop(stop, "the kernel", timeout_s),
                   err, errlen);
    }
    save_counts(stats);
    stats->tcm_peak = static_cast<int64_t>(ctx.peak);
    int64_t leaked = 0;
    for (auto& kv : ctx.by_ptr) leaked += static_cast<int64_t>(kv.second.size);
    stats->tcm_leaked = leaked;
    stats->leaks = static_cast<int32_t>(ctx.by_ptr.size());
    stats->dst_requested = ctx.dst_requested ? 1 : 0;
    ctx.notes.push_back(ctx.by_ptr.empty() ? std::string() : describe_live());
    reset_pool();
    ctx.arena = nullptr;
    ctx.in_kernel = false;
    return call.rc;
}
}  // namespace

// Runs the kernel as cores cpu_begin .. cpu_end-1 (of cpu_count), one after another, in one
// call (so the caller's interpreter lock is released once). stats: one per core run.
// flags: 1 = log accessor copies, 4 = count executed blocks (libraries built for counting),
// 8 = no fault guard (for measuring what it costs).
// timeout_s > 0: stop the kernel after that long (the whole call). ts_stop_info tells how
// a failed run stopped. Returns 0, or 1 + the index of the failing run (its message in err;
// later cores did not run).
TILESCOPE_API int ts_run(int op, const Arg* args, int nargs, const TensorDesc* dst, uint32_t cpu_begin,
                         uint32_t cpu_end, uint32_t cpu_count, int64_t tcm_bytes, int32_t flags, RunStats* stats,
                         char* err, int errlen, double timeout_s) {
    const OpEntry& e = table().ops.at(op);
    ctx.stop_outcome = guard::kOk;
    ctx.stop_frames.clear();
    if (nargs != e.nargs) {
        copy_error(fmt("%s::%s takes %d arguments, got %d", e.lib, e.name, e.nargs, nargs), err, errlen);
        return 1;
    }
    ctx.log.clear();
    ctx.files.clear();
    ctx.notes.clear();
    ctx.counts.clear();
    guard::Run run;  // (flags & 8: without the guard -- benchmarks/cpp_call_overhead.py measures its cost)
    ctx.slot = !(flags & 8) && guard::begin(run, timeout_s) ? run.slot : nullptr;
    int rc = 0;
    for (uint32_t c = cpu_begin; c < cpu_end && !rc; ++c)
        if (run_core(e, args, nargs, dst, c, cpu_count, tcm_bytes, flags, &stats[c - cpu_begin], err, errlen,
                     timeout_s))
            rc = 1 + static_cast<int>(c - cpu_begin);
    ctx.slot = nullptr;
    guard::end(run);
    return rc;
}

// How the last failed ts_run / ts_shape on this thread stopped: out[0] = guard::Outcome
// (0: a check failed or the kernel threw), out[1] = the number of frame offsets that follow
// (the stopped instruction's, then return addresses; UINT64_MAX outside this library).
TILESCOPE_API int ts_stop_info(uint64_t* out, int max) {
    if (max < 2) return 0;
    out[0] = static_cast<uint64_t>(ctx.stop_outcome);
    int n = 0;
    for (uint64_t f : ctx.stop_frames) {
        if (2 + n >= max) break;
        out[2 + n++] = f;
    }
    out[1] = static_cast<uint64_t>(n);
    return n;
}

// Stop every kernel of this library running on any thread (Ctrl-C while the device worker
// runs one, or the device's queued work cancelled); returns how many were asked.
TILESCOPE_API int ts_interrupt() { return guard::interrupt_all(); }

// The fault guard's state (slots, signal handlers) this library uses, and its size; a library
// opened later adopts the first one's (see guard::Shared) -- before it runs any kernel.
TILESCOPE_API void* ts_guard_state(int64_t* size) {
    *size = static_cast<int64_t>(sizeof(guard::Shared));
    return guard::shared();
}
TILESCOPE_API int ts_guard_adopt(void* state, int64_t size) {
    if (state == nullptr || size != static_cast<int64_t>(sizeof(guard::Shared))) return 0;
    guard::shared() = static_cast<guard::Shared*>(state);
    return 1;
}

// The mode the library was built for: the cores its kernels split work over (1 or the
// preset's GpSimd cores; 0 when the build did not say).
TILESCOPE_API int ts_build_cores() {
#ifdef TILESCOPE_BUILD_CORES
    return TILESCOPE_BUILD_CORES;
#else
    return 0;
#endif
}

TILESCOPE_API int64_t ts_log_size() { return static_cast<int64_t>(ctx.log.size()); }
TILESCOPE_API const void* ts_log_data() { return ctx.log.data(); }
TILESCOPE_API int ts_log_file_count() { return static_cast<int>(ctx.files.size()); }
TILESCOPE_API const char* ts_log_file(int k) { return ctx.files.at(k); }
TILESCOPE_API const char* ts_note(int k) { return k >= 0 && k < static_cast<int>(ctx.notes.size()) ? ctx.notes[k].c_str() : ""; }

// Executed blocks of core run k of the last ts_run (counting builds): (offset, count) pairs.
TILESCOPE_API int64_t ts_count_size(int k) {
    return k >= 0 && k < static_cast<int>(ctx.counts.size()) ? static_cast<int64_t>(ctx.counts[k].size()) : 0;
}
TILESCOPE_API const void* ts_count_data(int k) {
    return k >= 0 && k < static_cast<int>(ctx.counts.size()) ? ctx.counts[k].data() : nullptr;
}

// The probe -fsanitize-coverage=trace-pc puts at the start of every basic block of the user's
// sources (counting builds only): one execution of the block that called it.
void __sanitizer_cov_trace_pc() {
    if (ctx.counting) ctx.pcs.add(reinterpret_cast<uintptr_t>(__builtin_return_address(0)));
}

}  // extern "C"
