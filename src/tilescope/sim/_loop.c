/* The scheduler's loop in C (CPython API only).
 *
 * It does exactly what the Python loop does (tilescope.sim._schedule._loop_reference, with
 * the resources of tilescope.sim._resources): the same rules, the same floating-point
 * operations in the same order, so the times are bit-identical -- the tests compare the two
 * on real Programs. The cost model stays in Python: this file only claims engines, ports and
 * DMA queues/engines/HBM with durations the Python side computed.
 *
 * Inputs are contiguous arrays through the buffer protocol (int64, int32, float64, bool);
 * outputs are raw bytes (float64 start/end, int64 lane, and the LoadStationary rows). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- IntervalResource: sorted, disjoint busy intervals [start, end) -------------------- */
typedef struct { double *s, *e; Py_ssize_t n, cap; } ivals;

static int iv_reserve_room(ivals *r) {
    if (r->n < r->cap) return 0;
    Py_ssize_t cap = r->cap ? r->cap * 2 : 64;
    double *s = (double *)realloc(r->s, (size_t)cap * sizeof(double));
    if (!s) return -1;
    r->s = s;
    double *e = (double *)realloc(r->e, (size_t)cap * sizeof(double));
    if (!e) return -1;
    r->e = e;
    r->cap = cap;
    return 0;
}

static void iv_free(ivals *r) {
    free(r->s);
    free(r->e);
    r->s = r->e = NULL;
    r->n = r->cap = 0;
}

static int iv_copy(ivals *dst, const ivals *src) {
    dst->n = dst->cap = 0;
    dst->s = dst->e = NULL;
    if (src->n == 0) return 0;
    dst->s = (double *)malloc((size_t)src->n * sizeof(double));
    dst->e = (double *)malloc((size_t)src->n * sizeof(double));
    if (!dst->s || !dst->e) return -1;
    memcpy(dst->s, src->s, (size_t)src->n * sizeof(double));
    memcpy(dst->e, src->e, (size_t)src->n * sizeof(double));
    dst->n = dst->cap = src->n;
    return 0;
}

/* bisect.bisect_right */
static Py_ssize_t bisect_right(const double *a, Py_ssize_t n, double x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < a[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static double iv_earliest_gap(const ivals *r, double t0, double duration) {
    Py_ssize_t i = bisect_right(r->e, r->n, t0);
    double t = t0;
    for (; i < r->n; i++) {
        if (r->s[i] - t >= duration) return t;
        if (r->e[i] > t) t = r->e[i];
    }
    return t;
}

static int iv_reserve(ivals *r, double start, double end) {
    if (end <= start) return 0;
    Py_ssize_t n = r->n;
    Py_ssize_t i = bisect_right(r->s, n, start);
    int left = i > 0 && r->e[i - 1] >= start;
    int right = i < n && r->s[i] <= end;
    if (left && right) {
        r->e[i - 1] = r->e[i];
        memmove(r->s + i, r->s + i + 1, (size_t)(n - i - 1) * sizeof(double));
        memmove(r->e + i, r->e + i + 1, (size_t)(n - i - 1) * sizeof(double));
        r->n = n - 1;
    } else if (left) {
        if (end > r->e[i - 1]) r->e[i - 1] = end;
    } else if (right) {
        r->s[i] = start;
    } else {
        if (iv_reserve_room(r) < 0) return -1;
        memmove(r->s + i + 1, r->s + i, (size_t)(n - i) * sizeof(double));
        memmove(r->e + i + 1, r->e + i, (size_t)(n - i) * sizeof(double));
        r->s[i] = start;
        r->e[i] = end;
        r->n = n + 1;
    }
    return 0;
}

/* the pieces one consume() claims, reserved after they are all found */
typedef struct { double *v; Py_ssize_t n, cap; } dvec;

static int dpush2(dvec *a, double x, double y) {
    if (a->n + 2 > a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 64;
        double *v = (double *)realloc(a->v, (size_t)cap * sizeof(double));
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    a->v[a->n++] = y;
    return 0;
}

static int iv_consume(ivals *r, double t0, double amount, dvec *pieces, double *out) {
    if (amount <= 0) {
        *out = t0;
        return 0;
    }
    Py_ssize_t i = bisect_right(r->e, r->n, t0);
    double t = t0;
    pieces->n = 0;
    while (amount > 0) {
        if (i < r->n && r->s[i] <= t) {
            if (r->e[i] > t) t = r->e[i];
            i++;
            continue;
        }
        double gap_end = i < r->n ? r->s[i] : INFINITY;
        double room = gap_end - t;
        double take = room < amount ? room : amount;
        if (dpush2(pieces, t, t + take) < 0) return -1;
        amount -= take;
        t += take;
    }
    for (Py_ssize_t k = 0; k < pieces->n; k += 2)
        if (iv_reserve(r, pieces->v[k], pieces->v[k + 1]) < 0) return -1;
    *out = t;
    return 0;
}

/* ---- DmaEngines ------------------------------------------------------------------------ */
typedef struct {
    Py_ssize_t n, queues, n_eng; /* n_eng: 1 until the first partial transfer, then n */
    double *issue_free, *done, *order; /* order: queues x n (column 0 only while n_eng == 1) */
    ivals *engines;
    ivals hbm;
} dma_t;

static int dma_init(dma_t *d, Py_ssize_t engines, Py_ssize_t queues) {
    memset(d, 0, sizeof(*d));
    d->n = engines;
    d->queues = queues;
    d->n_eng = 1;
    d->issue_free = (double *)calloc((size_t)queues, sizeof(double));
    d->done = (double *)calloc((size_t)queues, sizeof(double));
    d->order = (double *)calloc((size_t)(queues * engines), sizeof(double));
    d->engines = (ivals *)calloc((size_t)engines, sizeof(ivals));
    return (d->issue_free && d->done && d->order && d->engines) ? 0 : -1;
}

static void dma_free(dma_t *d) {
    if (d->engines)
        for (Py_ssize_t k = 0; k < d->n; k++) iv_free(&d->engines[k]);
    free(d->engines);
    free(d->issue_free);
    free(d->done);
    free(d->order);
    iv_free(&d->hbm);
}

static Py_ssize_t dma_first_free_queue(const dma_t *d) {
    Py_ssize_t best = 0;
    for (Py_ssize_t q = 1; q < d->queues; q++)
        if (d->done[q] < d->done[best]) best = q;
    return best;
}

static int dma_split(dma_t *d) {
    for (Py_ssize_t k = 1; k < d->n; k++)
        if (iv_copy(&d->engines[k], &d->engines[0]) < 0) return -1;
    for (Py_ssize_t q = 0; q < d->queues; q++)
        for (Py_ssize_t k = 1; k < d->n; k++) d->order[q * d->n + k] = d->order[q * d->n];
    d->n_eng = d->n;
    return 0;
}

static int dma_transfer(dma_t *d, dvec *pieces, double ready, Py_ssize_t q, double fixed, int64_t first,
                        int64_t count, double piece, double hbm, double *s_out, double *e_out) {
    double s = d->issue_free[q];
    if (ready > s) s = ready;
    double issued = s + fixed;
    d->issue_free[q] = issued;
    double *order = d->order + q * d->n;
    double end;
    if (count >= d->n && d->n_eng == 1) {
        double t0 = order[0] > issued ? order[0] : issued;
        if (iv_consume(&d->engines[0], t0, piece, pieces, &end) < 0) return -1;
        order[0] = end;
    } else {
        if (d->n_eng == 1 && dma_split(d) < 0) return -1;
        end = issued;
        for (int64_t k = first; k < first + count; k++) {
            Py_ssize_t e = (Py_ssize_t)(k % d->n);
            double t0 = order[e] > issued ? order[e] : issued;
            double t;
            if (iv_consume(&d->engines[e], t0, piece, pieces, &t) < 0) return -1;
            order[e] = t;
            if (t > end) end = t;
        }
    }
    if (hbm > 0.0) {
        double h;
        if (iv_consume(&d->hbm, issued, hbm, pieces, &h) < 0) return -1;
        if (h > end) end = h;
    }
    d->done[q] = end;
    *s_out = s;
    *e_out = end;
    return 0;
}

/* ---- arguments ------------------------------------------------------------------------- */
static int get_buf(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *kinds, Py_ssize_t n,
                   const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (b->itemsize != itemsize || !strchr(kinds, *f) || (n >= 0 && b->len / itemsize < n)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous array of %zd-byte items (%s), got format %s, %zd bytes",
                     what, itemsize, kinds, b->format ? b->format : "?", b->len);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

enum { A_INDPTR, A_INDICES, A_LANE, A_DUR, A_LS, A_QUEUE, A_FIXED, A_FIRST, A_COUNT, A_PIECE, A_HBM, A_PSB,
       A_PPS, N_ARGS };

#define LANE_TENSOR 0
#define LANE_LS 1
#define LANE_DMA (-1)
#define N_FIXED_LANES 5

static PyObject *run(PyObject *self, PyObject *args) {
    PyObject *o[N_ARGS];
    Py_ssize_t n_engines, n_queues;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12], &n_engines, &n_queues))
        return NULL;
    if (n_engines < 1 || n_queues < 1) {
        PyErr_SetString(PyExc_ValueError, "need at least one DMA engine and one queue");
        return NULL;
    }
    static const struct { Py_ssize_t size; const char *kinds; const char *what; } spec[N_ARGS] = {
        {8, "lq", "indptr"}, {4, "i", "indices"}, {8, "lq", "lane"}, {8, "d", "dur"}, {8, "d", "ls"},
        {8, "lq", "queue"}, {8, "d", "fixed"}, {8, "lq", "first"}, {8, "lq", "count"}, {8, "d", "piece"},
        {8, "d", "hbm"}, {1, "?", "sbuf_port"}, {1, "?", "psum_port"},
    };
    Py_buffer b[N_ARGS];
    int got = 0;
    for (; got < N_ARGS; got++)
        if (get_buf(o[got], &b[got], spec[got].size, spec[got].kinds, -1, spec[got].what) < 0) break;
    PyObject *result = NULL;
    double *start = NULL, *end = NULL, *ls_s = NULL, *ls_e = NULL;
    int64_t *olane = NULL, *ls_i = NULL;
    Py_ssize_t n_ls = 0;
    dma_t dma;
    memset(&dma, 0, sizeof(dma));
    ivals sbuf = {0}, psum = {0};
    dvec pieces = {0};
    if (got < N_ARGS) goto done;
    Py_ssize_t n = b[A_LANE].len / 8;
    for (int k = A_DUR; k < N_ARGS; k++) {
        if (k == A_INDICES) continue;
        if (b[k].len / b[k].itemsize != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd entries, lane has %zd", spec[k].what,
                         b[k].len / b[k].itemsize, n);
            goto done;
        }
    }
    if (b[A_INDPTR].len / 8 != n + 1) {
        PyErr_SetString(PyExc_ValueError, "indptr must have one more entry than lane");
        goto done;
    }
    const int64_t *indptr = (const int64_t *)b[A_INDPTR].buf;
    const int32_t *indices = (const int32_t *)b[A_INDICES].buf;
    const int64_t *lane = (const int64_t *)b[A_LANE].buf, *queue = (const int64_t *)b[A_QUEUE].buf;
    const int64_t *first = (const int64_t *)b[A_FIRST].buf, *count = (const int64_t *)b[A_COUNT].buf;
    const double *dur = (const double *)b[A_DUR].buf, *ls = (const double *)b[A_LS].buf;
    const double *fixed = (const double *)b[A_FIXED].buf, *piece = (const double *)b[A_PIECE].buf;
    const double *hbm = (const double *)b[A_HBM].buf;
    const char *psb = (const char *)b[A_PSB].buf, *pps = (const char *)b[A_PPS].buf;
    Py_ssize_t n_idx = b[A_INDICES].len / 4;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (lane[i] < LANE_DMA || lane[i] >= N_FIXED_LANES || lane[i] == LANE_LS) {
            PyErr_Format(PyExc_ValueError, "instruction %zd has lane %lld", i, (long long)lane[i]);
            goto done;
        }
        if (lane[i] == LANE_DMA && (queue[i] >= n_queues || count[i] < 0)) {
            PyErr_Format(PyExc_ValueError, "DMA instruction %zd: queue %lld of %zd", i, (long long)queue[i], n_queues);
            goto done;
        }
        if (indptr[i] < 0 || indptr[i + 1] < indptr[i] || indptr[i + 1] > n_idx) {
            PyErr_SetString(PyExc_ValueError, "indptr is not a CSR index into indices");
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < n_idx; k++)
        if (indices[k] < 0 || indices[k] >= n) {
            PyErr_SetString(PyExc_ValueError, "a dependency index is out of range");
            goto done;
        }
    start = (double *)malloc((size_t)(n ? n : 1) * sizeof(double));
    end = (double *)calloc((size_t)(n ? n : 1), sizeof(double));
    olane = (int64_t *)malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    ls_i = (int64_t *)malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    ls_s = (double *)malloc((size_t)(n ? n : 1) * sizeof(double));
    ls_e = (double *)malloc((size_t)(n ? n : 1) * sizeof(double));
    if (!start || !end || !olane || !ls_i || !ls_s || !ls_e || dma_init(&dma, n_engines, n_queues) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    double engine_free[N_FIXED_LANES] = {0};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        double ready = 0.0;
        for (int64_t k = indptr[i]; k < indptr[i + 1]; k++) {
            double e = end[indices[k]];
            if (e > ready) ready = e;
        }
        int64_t ln = lane[i];
        double s, e;
        if (ln == LANE_DMA) {
            Py_ssize_t q = (Py_ssize_t)queue[i];
            if (q < 0) q = dma_first_free_queue(&dma);
            if (dma_transfer(&dma, &pieces, ready, q, fixed[i], first[i], count[i], piece[i], hbm[i], &s, &e) < 0) {
                failed = 1;
                break;
            }
            olane[i] = N_FIXED_LANES + q;
        } else if (ln == LANE_TENSOR) {
            s = engine_free[0] > ready ? engine_free[0] : ready;
            if (ls[i] > 0.0) {
                /* LoadStationary waits for producers on other engines, not earlier matmuls */
                double ls_ready = 0.0;
                for (int64_t k = indptr[i]; k < indptr[i + 1]; k++) {
                    int32_t j = indices[k];
                    if (lane[j] != 0 && end[j] > ls_ready) ls_ready = end[j];
                }
                double a = engine_free[LANE_LS] > ls_ready ? engine_free[LANE_LS] : ls_ready;
                double z = a + ls[i];
                engine_free[LANE_LS] = z;
                ls_i[n_ls] = i;
                ls_s[n_ls] = a;
                ls_e[n_ls] = z;
                n_ls++;
                if (z > s) s = z;
            }
            e = s + dur[i];
            engine_free[0] = e;
            olane[i] = 0;
        } else {
            s = engine_free[ln] > ready ? engine_free[ln] : ready;
            double d = dur[i];
            if (psb[i] || pps[i]) {
                for (;;) {
                    double t = s;
                    if (psb[i]) t = iv_earliest_gap(&sbuf, t, d);
                    if (pps[i]) t = iv_earliest_gap(&psum, t, d);
                    if (t == s) break;
                    s = t;
                }
                if (psb[i] && iv_reserve(&sbuf, s, s + d) < 0) { failed = 1; break; }
                if (pps[i] && iv_reserve(&psum, s, s + d) < 0) { failed = 1; break; }
            }
            e = s + d;
            engine_free[ln] = e;
            olane[i] = ln;
        }
        start[i] = s;
        end[i] = e;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_BuildValue("(y#y#y#y#y#y#)", (char *)start, n * 8, (char *)end, n * 8, (char *)olane, n * 8,
                           (char *)ls_i, n_ls * 8, (char *)ls_s, n_ls * 8, (char *)ls_e, n_ls * 8);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    dma_free(&dma);
    iv_free(&sbuf);
    iv_free(&psum);
    free(pieces.v);
    free(start);
    free(end);
    free(olane);
    free(ls_i);
    free(ls_s);
    free(ls_e);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(indptr, indices, lane, dur, ls, queue, fixed, first, count, piece, hbm, sbuf_port, psum_port, "
     "engines, queues) -> (start, end, lane, ls_index, ls_start, ls_end) as bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_loop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__loop(void) { return PyModule_Create(&module); }
