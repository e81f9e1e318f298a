// Fault containment for the runtime (included by gpsimd_runtime.cpp only).
//
// A kernel is the user's native code running inside the Python process. A bug in it -- a
// null dereference, a stack overflow, a division by zero, abort() from a failed assert, an
// infinite loop -- must stop that kernel, not the process. Each thread that runs a kernel
// holds a Slot: a sigsetjmp point taken before user code runs, a deadline and a cancel flag.
// Handlers for the fault signals, SIGINT and one real-time "stop" signal jump back to that
// point when the signal hits a thread inside a kernel, recording what happened (signal,
// address, the faulting instruction and a backtrace) for the message; everywhere else they
// pass the signal on to the handler that was installed before (Python's SIGINT handler,
// faulthandler, or the default action), so code outside kernels behaves as before.
//
// A stop that is asynchronous (Ctrl-C, the timeout, a cancel request) and arrives while the
// thread is inside tilescope's runtime (updating the TCM pool's books) is deferred to the
// runtime call's return, where it throws; a fault is never deferred.
//
// Each slot also owns the thread's TCM arena: the emulated pool in memory of its own, with
// an inaccessible page on each side, so writes past a TCM buffer land in the arena (found by
// the guard bytes) or fault on the guard pages -- never in the host's heap.
//
// Limits (documented in docs/cpp-operators.md): a kernel stopped midway does not run its C++
// destructors (memory it took with new/malloc is lost); stopping it inside the C library's
// malloc can leave that lock held; a wild pointer into live host memory is not detectable.
#pragma once

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <mutex>

namespace tilescope {
namespace detail {
namespace guard {

enum Outcome : int32_t { kOk = 0, kFault = 2, kTimeout = 3, kInterrupted = 4, kCancelled = 5 };

constexpr int kSlots = 256;         // threads running kernels at once
constexpr int kMaxFrames = 24;
constexpr size_t kAltStackBytes = 64 * 1024;

inline int stop_signal() { return SIGRTMAX - 3; }  // timeout and cancel requests

struct Slot {
    std::atomic<unsigned long> owner{0};  // pthread_self() of the thread holding it, 0 when free
    volatile sig_atomic_t armed = 0;       // jb is valid: user code may be running
    volatile sig_atomic_t in_runtime = 0;  // inside the runtime: an asynchronous stop waits
    volatile sig_atomic_t pending = 0;     // an asynchronous stop that arrived inside the runtime
    std::atomic<int> cancel{0};
    int64_t deadline_ns = 0;  // CLOCK_MONOTONIC; 0: none
    sigjmp_buf jb;
    // what stopped the kernel
    int32_t outcome = 0;
    int32_t sig = 0;
    int32_t code = 0;
    int32_t access = 0;  // x86-64 page faults: 1 read, 2 write; 0 unknown
    uintptr_t addr = 0;
    uintptr_t pc = 0;
    uintptr_t sp = 0;
    void* frames[kMaxFrames + 4];
    int nframes = 0;
    // the thread's TCM arena: [PROT_NONE page][region][PROT_NONE page]
    unsigned char* map = nullptr;
    size_t map_bytes = 0;
    unsigned char* region = nullptr;
    size_t region_bytes = 0;
    void* altstack = nullptr;
};


inline int64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}


const int kHandled[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGINT};
constexpr int kMaxSignal = 65;

using Handler = void (*)(int, siginfo_t*, void*);

struct Handlers {
    struct sigaction prev[kMaxSignal];  // what was installed before ours, per signal
    volatile sig_atomic_t chaining[kMaxSignal];
    Handler installed[kMaxSignal];  // the guard handler installed (by any copy of this runtime)
    std::mutex mu;
};

// The slots and handlers of every copy of this runtime in the process. Each operator library
// (and its counting build) links its own copy; were each to keep its own, two copies would
// install their handlers over each other, each chaining to the other, and a signal outside
// kernels (Ctrl-C) would loop between them and end the process. So the first library opened
// owns the state and every later one adopts it (ts_guard_adopt, called by the loader): one
// handler per signal, chaining to what was there before any copy came, and any copy's
// handler finds any copy's running kernel.
struct Shared {
    Slot slots[kSlots];
    Handlers handlers;
};
inline Shared*& shared() {
    static Shared own;
    static Shared* current = &own;
    return current;
}
inline Slot* slots() { return shared()->slots; }
inline Handlers& handlers() { return shared()->handlers; }

// The slot of the calling thread (async-signal-safe: a scan, no locks, no TLS).
inline Slot* find_slot(unsigned long self) {
    Slot* s = slots();
    for (int k = 0; k < kSlots; ++k)
        if (s[k].owner.load(std::memory_order_acquire) == self) return &s[k];
    return nullptr;
}

void on_signal(int sig, siginfo_t* si, void* uc);

inline void default_action(int sig) {
    struct sigaction d {};
    d.sa_handler = SIG_DFL;
    sigemptyset(&d.sa_mask);
    sigaction(sig, &d, nullptr);
    if (sig == SIGINT) raise(sig);  // delivered when the handler returns; a fault recurs by itself
}

// Pass a signal that is not ours to handle to the handler installed before.
inline void chain(int sig, siginfo_t* si, void* uc) {
    Handlers& h = handlers();
    const struct sigaction& p = h.prev[sig];
    if (h.chaining[sig]) {  // a handler we chained to chained back to us (e.g. faulthandler): end it
        if (sig != stop_signal()) default_action(sig);
        return;
    }
    if (p.sa_flags & SA_SIGINFO) {
        if (p.sa_sigaction == nullptr || p.sa_sigaction == on_signal) return;
        h.chaining[sig] = 1;
        p.sa_sigaction(sig, si, uc);
        h.chaining[sig] = 0;
        return;
    }
    if (p.sa_handler == SIG_IGN) return;
    if (p.sa_handler == SIG_DFL) {
        if (sig != stop_signal()) default_action(sig);  // (a stale stop signal is ignored, never fatal)
        return;
    }
    h.chaining[sig] = 1;
    p.sa_handler(sig);
    h.chaining[sig] = 0;
}

inline void record(Slot* s, int outcome, int sig, siginfo_t* si, void* ucv) {
    s->outcome = outcome;
    s->sig = sig;
    s->code = si ? si->si_code : 0;
    s->addr = si ? reinterpret_cast<uintptr_t>(si->si_addr) : 0;
    s->pc = 0;
    s->sp = 0;
    s->access = 0;
    auto* uc = static_cast<ucontext_t*>(ucv);
#if defined(__x86_64__)
    if (uc) {
        s->pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
        s->sp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
        if (sig == SIGSEGV) s->access = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? 2 : 1;
    }
#elif defined(__aarch64__)
    if (uc) {
        s->pc = static_cast<uintptr_t>(uc->uc_mcontext.pc);
        s->sp = static_cast<uintptr_t>(uc->uc_mcontext.sp);
    }
#else
    (void)uc;
#endif
    // the handler's own frames, the signal trampoline, then the interrupted code's
    s->nframes = backtrace(s->frames, kMaxFrames + 4);
}

inline void on_signal(int sig, siginfo_t* si, void* uc) {
    const int saved_errno = errno;
    Slot* s = find_slot(static_cast<unsigned long>(pthread_self()));
    if (s != nullptr && s->armed) {
        int outcome = kFault;
        if (sig == stop_signal()) {
            outcome = s->cancel.load() ? kCancelled
                      : (s->deadline_ns && now_ns() >= s->deadline_ns) ? kTimeout : kOk;
        } else if (sig == SIGINT) {
            const struct sigaction& p = handlers().prev[SIGINT];
            outcome = (!(p.sa_flags & SA_SIGINFO) && p.sa_handler == SIG_IGN) ? kOk : kInterrupted;
        }
        if (outcome == kOk) {  // a stale stop signal (the run it was meant for ended)
            errno = saved_errno;
            return;
        }
        if (outcome != kFault && s->in_runtime) {  // the pool's books are being updated: at its return
            s->pending = outcome;
            errno = saved_errno;
            return;
        }
        record(s, outcome, sig, si, uc);
        s->armed = 0;
        siglongjmp(s->jb, 1);
    }
    chain(sig, si, uc);
    errno = saved_errno;
}

// Install our handler for every handled signal that does not have it (a library loaded
// later, faulthandler.enable() or signal.signal() may have replaced it since the last run).
inline void ensure_handlers() {
    Handlers& h = handlers();
    struct sigaction cur {};
    bool all = true;
    auto is_guard = [&h](int sig, const struct sigaction& a) {
        return (a.sa_flags & SA_SIGINFO) && (a.sa_sigaction == on_signal || a.sa_sigaction == h.installed[sig]);
    };
    for (int sig : kHandled) {
        sigaction(sig, nullptr, &cur);
        if (!is_guard(sig, cur)) all = false;
    }
    sigaction(stop_signal(), nullptr, &cur);
    if (all && is_guard(stop_signal(), cur)) return;
    std::lock_guard<std::mutex> lock(h.mu);
    static bool warmed = false;
    if (!warmed) {  // backtrace() loads libgcc on its first call: not inside a signal handler
        void* f[2];
        backtrace(f, 2);
        warmed = true;
    }
    auto install = [&](int sig) {
        sigaction(sig, nullptr, &cur);
        if (is_guard(sig, cur)) return;
        struct sigaction ours {};
        ours.sa_sigaction = on_signal;
        sigemptyset(&ours.sa_mask);
        // SIGINT keeps the previous handler's restart behaviour (Python's does not restart
        // system calls: it relies on EINTR to run its handlers promptly)
        ours.sa_flags = SA_SIGINFO | SA_ONSTACK |
                        (sig == SIGINT ? (cur.sa_flags & SA_RESTART) : (sig == stop_signal() ? SA_RESTART : 0));
        h.prev[sig] = cur;
        h.installed[sig] = on_signal;
        sigaction(sig, &ours, nullptr);
    };
    for (int sig : kHandled) install(sig);
    install(stop_signal());
}

// ---- a run: claim a slot, arm, release ------------------------------------------------

struct Run {
    Slot* slot = nullptr;
    bool own_altstack = false;
    bool timer = false;
    timer_t timer_id{};
};

inline Slot* claim_slot() {
    const unsigned long self = static_cast<unsigned long>(pthread_self());
    Slot* s = slots();
    for (int k = 0; k < kSlots; ++k) {
        unsigned long expected = 0;
        if (s[k].owner.load(std::memory_order_relaxed) == 0 &&
            s[k].owner.compare_exchange_strong(expected, self, std::memory_order_acq_rel))
            return &s[k];
    }
    return nullptr;
}

// Claim the thread's slot, make sure it has an alternate signal stack (a stack overflow's
// handler cannot run on the overflowed stack) and start the timeout.
inline bool begin(Run& run, double timeout_s) {
    ensure_handlers();
    Slot* s = claim_slot();
    if (s == nullptr) return false;
    run.slot = s;
    s->armed = 0;
    s->in_runtime = 0;
    s->pending = 0;
    s->cancel.store(0);
    s->outcome = kOk;
    s->deadline_ns = 0;
    stack_t cur {};
    if (sigaltstack(nullptr, &cur) == 0 && (cur.ss_flags & SS_DISABLE)) {
        if (s->altstack == nullptr) s->altstack = std::malloc(kAltStackBytes);
        if (s->altstack != nullptr) {
            stack_t st {};
            st.ss_sp = s->altstack;
            st.ss_size = kAltStackBytes;
            run.own_altstack = sigaltstack(&st, nullptr) == 0;
        }
    }
    if (timeout_s > 0) {
        s->deadline_ns = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
        sigevent sev {};
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = stop_signal();
        sev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
        if (timer_create(CLOCK_MONOTONIC, &sev, &run.timer_id) == 0) {
            itimerspec when {};
            const int64_t ns = static_cast<int64_t>(timeout_s * 1e9);
            when.it_value.tv_sec = ns / 1000000000;
            when.it_value.tv_nsec = ns % 1000000000;
            when.it_interval.tv_nsec = 250000000;  // again every 0.25 s, should the first be swallowed
            if (when.it_value.tv_sec == 0 && when.it_value.tv_nsec == 0) when.it_value.tv_nsec = 1;
            timer_settime(run.timer_id, 0, &when, nullptr);
            run.timer = true;
        }
    }
    return true;
}

inline void end(Run& run) {
    if (run.timer) timer_delete(run.timer_id);
    if (run.own_altstack) {
        stack_t st {};
        st.ss_flags = SS_DISABLE;
        sigaltstack(&st, nullptr);
    }
    if (run.slot != nullptr) {
        run.slot->armed = 0;
        run.slot->owner.store(0, std::memory_order_release);
    }
    run.slot = nullptr;
}

// Call body(data) with the slot armed; returns kOk, or the outcome of the signal that
// stopped it (recorded in the slot).
__attribute__((noinline)) inline int guarded(Slot* s, void (*body)(void*), void* data) {
    if (sigsetjmp(s->jb, 1) != 0) return s->outcome;  // arrived by siglongjmp: armed is 0 already
    s->armed = 1;
    body(data);
    s->armed = 0;
    return kOk;
}

// The TCM arena of the slot: `bytes` usable, an inaccessible page on each side.
inline unsigned char* arena(Slot* s, size_t bytes) {
    if (s->region != nullptr && s->region_bytes >= bytes) return s->region;
    if (s->map != nullptr) munmap(s->map, s->map_bytes);
    s->map = nullptr;
    s->region = nullptr;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t region = (bytes + page - 1) / page * page;
    void* m = mmap(nullptr, region + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    auto* base = static_cast<unsigned char*>(m);
    if (mprotect(base + page, region, PROT_READ | PROT_WRITE) != 0) {
        munmap(m, region + 2 * page);
        return nullptr;
    }
    s->map = base;
    s->map_bytes = region + 2 * page;
    s->region = base + page;
    s->region_bytes = region;
    return s->region;
}

// Ask every thread running a kernel of this library to stop (Ctrl-C while the device's
// worker runs one, or queued work being cancelled).
inline int interrupt_all() {
    int n = 0;
    Slot* s = slots();
    for (int k = 0; k < kSlots; ++k) {
        unsigned long owner = s[k].owner.load(std::memory_order_acquire);
        if (owner != 0 && s[k].armed) {
            s[k].cancel.store(1);
            if (pthread_kill(static_cast<pthread_t>(owner), stop_signal()) == 0) ++n;
        }
    }
    return n;
}

}  // namespace guard
}  // namespace detail
}  // namespace tilescope
