/* The hot loops of building a Program, in C (CPython API only): the allocation sweep and
 * the dependency sweep. Each does exactly what its Python reference does
 * (tilescope.program._alloc.place_reference, ._deps.sweep_reference), which the tests
 * compare it with; the Python side passes contiguous int64 / bool arrays through the
 * buffer protocol and gets raw int64 / int32 bytes back. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- small growable arrays ------------------------------------------------------------ */
typedef struct { int64_t *v; Py_ssize_t n, cap; } vec64;

static int vpush(vec64 *a, int64_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 16;
        int64_t *v = (int64_t *)realloc(a->v, (size_t)cap * sizeof(int64_t));
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct { Py_buffer view; int ok; } arg_t;

static int get_i64(PyObject *o, Py_buffer *b, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (b->itemsize != 8 || (b->format && strcmp(b->format, "l") && strcmp(b->format, "q") &&
                             strcmp(b->format, "<i8") && strcmp(b->format, "=q"))) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int64 array (got format %s)", what,
                     b->format ? b->format : "?");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static int get_bool(PyObject *o, Py_buffer *b, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (b->itemsize != 1) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous bool array", what);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* ---- place: the allocation sweep ------------------------------------------------------ */
/* free ranges [lo, hi), sorted and merged; a next-fit cursor */
typedef struct { int64_t *lo, *hi; Py_ssize_t n, cap; int64_t cursor, align; } freelist;

static int fl_insert(freelist *f, Py_ssize_t k, int64_t lo, int64_t hi) {
    if (f->n == f->cap) {
        Py_ssize_t cap = f->cap * 2 + 8;
        int64_t *a = (int64_t *)realloc(f->lo, (size_t)cap * 8), *b;
        if (!a) return -1;
        f->lo = a;
        b = (int64_t *)realloc(f->hi, (size_t)cap * 8);
        if (!b) return -1;
        f->hi = b;
        f->cap = cap;
    }
    memmove(f->lo + k + 1, f->lo + k, (size_t)(f->n - k) * 8);
    memmove(f->hi + k + 1, f->hi + k, (size_t)(f->n - k) * 8);
    f->lo[k] = lo;
    f->hi[k] = hi;
    f->n++;
    return 0;
}

static void fl_remove(freelist *f, Py_ssize_t k) {
    memmove(f->lo + k, f->lo + k + 1, (size_t)(f->n - k - 1) * 8);
    memmove(f->hi + k, f->hi + k + 1, (size_t)(f->n - k - 1) * 8);
    f->n--;
}

static int fl_is_free(freelist *f, int64_t lo, int64_t n) {
    for (Py_ssize_t k = 0; k < f->n; k++) {
        if (f->lo[k] <= lo && lo + n <= f->hi[k]) return 1;
        if (f->lo[k] > lo) break;
    }
    return 0;
}

static int64_t fl_next_fit(freelist *f, int64_t n) {
    for (Py_ssize_t k = 0; k < f->n; k++) {
        int64_t start = f->lo[k] > f->cursor ? f->lo[k] : f->cursor;
        if (start + n <= f->hi[k]) return start;
    }
    for (Py_ssize_t k = 0; k < f->n; k++)
        if (f->lo[k] + n <= f->hi[k]) return f->lo[k];
    return -1;
}

/* the smallest free range that holds n (the lowest on ties): MAX_REUSE */
static int64_t fl_best_fit(freelist *f, int64_t n) {
    int64_t best = -1, size = 0;
    for (Py_ssize_t k = 0; k < f->n; k++) {
        int64_t w = f->hi[k] - f->lo[k];
        if (w >= n && (best < 0 || w < size)) { best = f->lo[k]; size = w; }
    }
    return best;
}

/* policy 0: ring (next fit from the cursor), 1: max_reuse (best fit) -- _alloc.MODES */
static int64_t fl_pick(freelist *f, int64_t n, int policy) {
    return policy == 0 ? fl_next_fit(f, n) : fl_best_fit(f, n);
}

static int fl_take(freelist *f, int64_t lo, int64_t n) {
    int64_t hi = lo + n;
    for (Py_ssize_t k = 0; k < f->n; k++) {
        if (f->lo[k] <= lo && hi <= f->hi[k]) {
            int64_t a = f->lo[k], b = f->hi[k];
            fl_remove(f, k);
            Py_ssize_t at = k;
            if (lo > a) { if (fl_insert(f, at, a, lo) < 0) return -1; at++; }
            if (b > hi) { if (fl_insert(f, at, hi, b) < 0) return -1; }
            f->cursor = ((hi + f->align - 1) / f->align) * f->align;
            return 0;
        }
    }
    PyErr_SetString(PyExc_AssertionError, "range is not free");
    return -1;
}

static int fl_give(freelist *f, int64_t lo, int64_t n) {
    int64_t hi = lo + n;
    Py_ssize_t k = 0;
    while (k < f->n && f->lo[k] < lo) k++;
    if (fl_insert(f, k, lo, hi) < 0) return -1;
    if (k + 1 < f->n && f->hi[k] == f->lo[k + 1]) { f->hi[k] = f->hi[k + 1]; fl_remove(f, k + 1); }
    if (k > 0 && f->hi[k - 1] == f->lo[k]) { f->hi[k - 1] = f->hi[k]; fl_remove(f, k); }
    return 0;
}

/* min-heap of (last use, seq, tile) */
typedef struct { int64_t last, seq, tile; } hent;
typedef struct { hent *v; Py_ssize_t n, cap; } heap;

static int hless(const hent *a, const hent *b) {
    return a->last < b->last || (a->last == b->last && a->seq < b->seq);
}

static int hpush(heap *h, hent e) {
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap * 2 + 16;
        hent *v = (hent *)realloc(h->v, (size_t)cap * sizeof(hent));
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    Py_ssize_t i = h->n++;
    h->v[i] = e;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!hless(&h->v[i], &h->v[p])) break;
        hent t = h->v[i]; h->v[i] = h->v[p]; h->v[p] = t;
        i = p;
    }
    return 0;
}

static hent hpop(heap *h) {
    hent top = h->v[0];
    h->v[0] = h->v[--h->n];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && hless(&h->v[l], &h->v[m])) m = l;
        if (r < h->n && hless(&h->v[r], &h->v[m])) m = r;
        if (m == i) break;
        hent t = h->v[i]; h->v[i] = h->v[m]; h->v[m] = t;
        i = m;
    }
    return top;
}

static PyObject *place(PyObject *self, PyObject *args) {
    PyObject *o_first, *o_last, *o_nbytes, *o_site, *o_bufs;
    long long capacity, align;
    int policy = 0;
    if (!PyArg_ParseTuple(args, "OOOOOLL|i", &o_first, &o_last, &o_nbytes, &o_site, &o_bufs, &capacity, &align,
                          &policy))
        return NULL;
    Py_buffer bf, bl, bn, bs, bb;
    if (get_i64(o_first, &bf, "first") < 0) return NULL;
    if (get_i64(o_last, &bl, "last") < 0) { PyBuffer_Release(&bf); return NULL; }
    if (get_i64(o_nbytes, &bn, "nbytes") < 0) { PyBuffer_Release(&bf); PyBuffer_Release(&bl); return NULL; }
    if (get_i64(o_site, &bs, "site") < 0) {
        PyBuffer_Release(&bf); PyBuffer_Release(&bl); PyBuffer_Release(&bn); return NULL;
    }
    if (get_i64(o_bufs, &bb, "bufs") < 0) {
        PyBuffer_Release(&bf); PyBuffer_Release(&bl); PyBuffer_Release(&bn); PyBuffer_Release(&bs); return NULL;
    }
    Py_ssize_t T = bf.len / 8;
    const int64_t *first = bf.buf, *last = bl.buf, *nbytes = bn.buf, *site = bs.buf, *bufs = bb.buf;
    int64_t nsites = 0;
    for (Py_ssize_t t = 0; t < T; t++) if (site[t] + 1 > nsites) nsites = site[t] + 1;
    vec64 *rings = (vec64 *)calloc((size_t)(nsites ? nsites : 1), sizeof(vec64));
    int64_t *turn = (int64_t *)calloc((size_t)(nsites ? nsites : 1), sizeof(int64_t));
    PyObject *addr_bytes = PyBytes_FromStringAndSize(NULL, T * 8);
    freelist f = {0};
    heap active = {0};
    PyObject *result = NULL;
    int64_t fail = -1;
    if (!rings || !turn || !addr_bytes) { PyErr_NoMemory(); goto done; }
    int64_t *addr = (int64_t *)PyBytes_AS_STRING(addr_bytes);
    f.align = align;
    if (fl_insert(&f, 0, 0, capacity) < 0) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t t = 0; t < T; t++) {
        int64_t start = first[t];
        while (active.n && active.v[0].last < start) {
            hent d = hpop(&active);
            if (fl_give(&f, addr[d.tile], nbytes[d.tile]) < 0) { PyErr_NoMemory(); goto done; }
        }
        int64_t st = site[t], n = nbytes[t], a = -1;
        vec64 *ring = &rings[st];
        if (bufs[t] <= 0) {  /* no site ring: the mode's choice */
            a = fl_pick(&f, n, policy);
        } else if (ring->n >= bufs[t]) {
            int64_t k = turn[st]++;
            int64_t want = ring->v[k % bufs[t]];
            if (fl_is_free(&f, want, n)) a = want;
            else {
                a = fl_pick(&f, n, policy);
                if (a >= 0) ring->v[k % bufs[t]] = a;
            }
        } else {
            a = fl_pick(&f, n, policy);
            if (a >= 0 && vpush(ring, a) < 0) { PyErr_NoMemory(); goto done; }
        }
        if (a < 0) { fail = t; break; }
        addr[t] = a;
        if (fl_take(&f, a, n) < 0) goto done;
        hent e = {last[t], t + T, t};
        if (hpush(&active, e) < 0) { PyErr_NoMemory(); goto done; }
    }
    if (fail >= 0) {
        PyObject *live = PyList_New(active.n);
        if (!live) goto done;
        for (Py_ssize_t k = 0; k < active.n; k++) PyList_SET_ITEM(live, k, PyLong_FromLongLong(active.v[k].tile));
        result = Py_BuildValue("(O(LN))", Py_None, (long long)fail, live);
    } else {
        result = Py_BuildValue("(OO)", addr_bytes, Py_None);
    }
done:
    Py_XDECREF(addr_bytes);
    if (rings) { for (int64_t s = 0; s < nsites; s++) free(rings[s].v); free(rings); }
    free(turn);
    free(f.lo); free(f.hi); free(active.v);
    PyBuffer_Release(&bf); PyBuffer_Release(&bl); PyBuffer_Release(&bn); PyBuffer_Release(&bs); PyBuffer_Release(&bb);
    return result;
}

/* ---- group_slots: runs of one site at one address (see _alloc.group_slots) ---------------- */
typedef struct { int64_t a, b, owner; } seg;

static PyObject *group_slots(PyObject *self, PyObject *args) {
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    Py_buffer b[6];
    const char *names[6] = {"first", "last", "addr", "nbytes", "site", "parts"};
    int got = 0;
    for (; got < 6; got++)
        if (get_i64(o[got], &b[got], names[got]) < 0) { for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]); return NULL; }
    const int64_t *first = b[0].buf, *last = b[1].buf, *addr = b[2].buf, *nbytes = b[3].buf, *site = b[4].buf,
                  *parts = b[5].buf;
    Py_ssize_t T = b[0].len / 8;
    int64_t nsites = 0;
    for (Py_ssize_t t = 0; t < T; t++) if (site[t] + 1 > nsites) nsites = site[t] + 1;
    int64_t *counter = (int64_t *)calloc((size_t)(nsites ? nsites : 1), 8);
    PyObject *slot_of = PyBytes_FromStringAndSize(NULL, T * 8);
    vec64 s_site = {0}, s_n = {0}, s_addr = {0}, s_nbytes = {0}, s_parts = {0}, s_start = {0}, s_end = {0},
          s_open = {0}, a_ptr = {0}, a_idx = {0};
    seg *segs = NULL;
    Py_ssize_t nseg = 0, capseg = 0;
    PyObject *result = NULL;
    if (!counter || !slot_of || vpush(&a_ptr, 0) < 0) { PyErr_NoMemory(); goto done; }
    int64_t *so = (int64_t *)PyBytes_AS_STRING(slot_of);
    for (Py_ssize_t t = 0; t < T; t++) {
        int64_t lo = addr[t], hi = addr[t] + nbytes[t];
        /* segments overlapping [lo, hi) */
        Py_ssize_t k0 = 0, hi_k = nseg;
        while (k0 < hi_k) { Py_ssize_t m = (k0 + hi_k) / 2; if (segs[m].b <= lo) k0 = m + 1; else hi_k = m; }
        Py_ssize_t k1 = k0;
        while (k1 < nseg && segs[k1].a < hi) k1++;
        int64_t mine = -1;
        for (Py_ssize_t k = k0; k < k1; k++) {
            int64_t w = segs[k].owner;
            if (s_open.v[w] && s_site.v[w] == site[t] && s_addr.v[w] == lo && s_nbytes.v[w] >= nbytes[t]) { mine = w; break; }
        }
        for (Py_ssize_t k = k0; k < k1; k++) {  /* other open slots there close */
            int64_t w = segs[k].owner;
            if (w != mine) s_open.v[w] = 0;
        }
        if (mine < 0) {
            mine = s_site.n;
            if (vpush(&s_site, site[t]) < 0 || vpush(&s_n, counter[site[t]]++) < 0 || vpush(&s_addr, lo) < 0 ||
                vpush(&s_nbytes, nbytes[t]) < 0 || vpush(&s_parts, parts[t]) < 0 || vpush(&s_start, first[t]) < 0 ||
                vpush(&s_end, last[t]) < 0 || vpush(&s_open, 1) < 0) { PyErr_NoMemory(); goto done; }
            /* aliases: the owners of these bytes before, in address order, once each */
            for (Py_ssize_t k = k0; k < k1; k++) {
                int64_t w = segs[k].owner, dup = 0;
                for (Py_ssize_t m = a_ptr.v[a_ptr.n - 1]; m < a_idx.n; m++) if (a_idx.v[m] == w) { dup = 1; break; }
                if (!dup && vpush(&a_idx, w) < 0) { PyErr_NoMemory(); goto done; }
            }
            if (vpush(&a_ptr, a_idx.n) < 0) { PyErr_NoMemory(); goto done; }
            /* claim [lo, hi): keep the parts of overlapped segments outside it */
            seg left = {0, 0, -1}, right = {0, 0, -1};
            if (k0 < k1 && segs[k0].a < lo) left = (seg){segs[k0].a, lo, segs[k0].owner};
            if (k0 < k1 && segs[k1 - 1].b > hi) right = (seg){hi, segs[k1 - 1].b, segs[k1 - 1].owner};
            Py_ssize_t add = (left.owner >= 0) + 1 + (right.owner >= 0);
            Py_ssize_t need = nseg - (k1 - k0) + add;
            if (need > capseg) {
                capseg = need * 2 + 16;
                seg *ns = (seg *)realloc(segs, (size_t)capseg * sizeof(seg));
                if (!ns) { PyErr_NoMemory(); goto done; }
                segs = ns;
            }
            memmove(segs + k0 + add, segs + k1, (size_t)(nseg - k1) * sizeof(seg));
            Py_ssize_t at = k0;
            if (left.owner >= 0) segs[at++] = left;
            segs[at++] = (seg){lo, hi, mine};
            if (right.owner >= 0) segs[at++] = right;
            nseg = need;
        }
        if (last[t] > s_end.v[mine]) s_end.v[mine] = last[t];
        if (parts[t] > s_parts.v[mine]) s_parts.v[mine] = parts[t];
        so[t] = mine;
    }
    {
        vec64 *cols[9] = {&s_site, &s_n, &s_addr, &s_nbytes, &s_parts, &s_start, &s_end, &a_ptr, &a_idx};
        PyObject *out = PyTuple_New(10);
        if (!out) goto done;
        Py_INCREF(slot_of);
        PyTuple_SET_ITEM(out, 0, slot_of);
        for (int k = 0; k < 9; k++) {
            PyObject *bs = PyBytes_FromStringAndSize((const char *)cols[k]->v, cols[k]->n * 8);
            if (!bs) { Py_DECREF(out); goto done; }
            PyTuple_SET_ITEM(out, k + 1, bs);
        }
        result = out;
    }
done:
    Py_XDECREF(slot_of);
    free(counter);
    free(segs);
    free(s_site.v); free(s_n.v); free(s_addr.v); free(s_nbytes.v); free(s_parts.v); free(s_start.v); free(s_end.v);
    free(s_open.v); free(a_ptr.v); free(a_idx.v);
    for (int k = 0; k < 6; k++) PyBuffer_Release(&b[k]);
    return result;
}

/* ---- dependencies: the sweep over access boxes ------------------------------------------ */
typedef struct { int64_t r0, r1, c0, c1, idx; int alive; } rec;
typedef struct { rec *v; Py_ssize_t n, cap, dead; } recs;

static int rpush(recs *a, rec r) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 8;
        rec *v = (rec *)realloc(a->v, (size_t)cap * sizeof(rec));
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = r;
    return 0;
}

/* live records of ``a`` overlapping the box go to ``out``; with ``kill``, covered ones die */
static int rquery(recs *a, int64_t r0, int64_t r1, int64_t c0, int64_t c1, vec64 *out, int kill) {
    for (Py_ssize_t k = 0; k < a->n; k++) {
        rec *x = &a->v[k];
        if (!x->alive) continue;
        if (x->r0 < r1 && r0 < x->r1 && x->c0 < c1 && c0 < x->c1) {
            if (vpush(out, x->idx) < 0) return -1;
            if (kill && r0 <= x->r0 && x->r1 <= r1 && c0 <= x->c0 && x->c1 <= c1) {
                x->alive = 0;
                a->dead++;
            }
        }
    }
    if (a->dead > 16 && a->dead * 2 > a->n) {  /* compact */
        Py_ssize_t j = 0;
        for (Py_ssize_t k = 0; k < a->n; k++) if (a->v[k].alive) a->v[j++] = a->v[k];
        a->n = j;
        a->dead = 0;
    }
    return 0;
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static PyObject *dependencies(PyObject *self, PyObject *args) {
    PyObject *ok, *or0, *or1, *oc0, *oc1, *ord, *owr, *oap, *oai;
    Py_ssize_t n, width, nkeys;
    if (!PyArg_ParseTuple(args, "nnnOOOOOOOOO", &n, &width, &nkeys, &ok, &or0, &or1, &oc0, &oc1, &ord, &owr,
                          &oap, &oai))
        return NULL;
    Py_buffer b[9];
    int got = 0;
    PyObject *objs[9] = {ok, or0, or1, oc0, oc1, ord, owr, oap, oai};
    const char *names[9] = {"key", "r0", "r1", "c0", "c1", "reads", "writes", "alias_ptr", "alias_idx"};
    for (; got < 9; got++) {
        int r = (got == 5 || got == 6) ? get_bool(objs[got], &b[got], names[got])
                                       : get_i64(objs[got], &b[got], names[got]);
        if (r < 0) { for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]); return NULL; }
    }
    const int64_t *key = b[0].buf, *r0 = b[1].buf, *r1 = b[2].buf, *c0 = b[3].buf, *c1 = b[4].buf;
    const char *rd = b[5].buf, *wr = b[6].buf;
    const int64_t *aptr = b[7].buf, *aidx = b[8].buf;
    Py_ssize_t nalias = b[7].len / 8 - 1;
    recs *W = (recs *)calloc((size_t)(nkeys ? nkeys : 1), sizeof(recs));
    recs *R = (recs *)calloc((size_t)(nkeys ? nkeys : 1), sizeof(recs));
    char *seen = (char *)calloc((size_t)(nkeys ? nkeys : 1), 1);
    PyObject *indptr = PyBytes_FromStringAndSize(NULL, (n + 1) * 8);
    vec64 flat = {0}, deps = {0};
    PyObject *result = NULL;
    if (!W || !R || !seen || !indptr) { PyErr_NoMemory(); goto done; }
    int64_t *ip = (int64_t *)PyBytes_AS_STRING(indptr);
    ip[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        deps.n = 0;
        const int64_t *kr = key + i * width;
        for (Py_ssize_t j = 0; j < width; j++) {
            int64_t k = kr[j];
            if (k < 0 || seen[k]) continue;
            seen[k] = 1;
            if (k < nalias) {
                for (int64_t p = aptr[k]; p < aptr[k + 1]; p++) {
                    int64_t a = aidx[p];
                    recs *lists[2] = {&W[a], &R[a]};
                    for (int q = 0; q < 2; q++)
                        for (Py_ssize_t m = 0; m < lists[q]->n; m++)
                            if (lists[q]->v[m].alive && vpush(&deps, lists[q]->v[m].idx) < 0) { PyErr_NoMemory(); goto done; }
                }
            }
        }
        for (Py_ssize_t j = 0; j < width; j++) {  /* reads query writes */
            Py_ssize_t e = i * width + j;
            if (key[e] < 0 || !rd[e]) continue;
            if (rquery(&W[key[e]], r0[e], r1[e], c0[e], c1[e], &deps, 0) < 0) { PyErr_NoMemory(); goto done; }
        }
        for (Py_ssize_t j = 0; j < width; j++) {  /* writes query and kill writes and reads */
            Py_ssize_t e = i * width + j;
            if (key[e] < 0 || !wr[e]) continue;
            if (rquery(&W[key[e]], r0[e], r1[e], c0[e], c1[e], &deps, 1) < 0) { PyErr_NoMemory(); goto done; }
            if (rquery(&R[key[e]], r0[e], r1[e], c0[e], c1[e], &deps, 1) < 0) { PyErr_NoMemory(); goto done; }
        }
        for (Py_ssize_t j = 0; j < width; j++) {
            Py_ssize_t e = i * width + j;
            if (key[e] < 0) continue;
            rec x = {r0[e], r1[e], c0[e], c1[e], i, 1};
            if (rd[e] && rpush(&R[key[e]], x) < 0) { PyErr_NoMemory(); goto done; }
        }
        for (Py_ssize_t j = 0; j < width; j++) {
            Py_ssize_t e = i * width + j;
            if (key[e] < 0) continue;
            rec x = {r0[e], r1[e], c0[e], c1[e], i, 1};
            if (wr[e] && rpush(&W[key[e]], x) < 0) { PyErr_NoMemory(); goto done; }
        }
        if (deps.n) {
            qsort(deps.v, (size_t)deps.n, 8, cmp64);
            int64_t prevv = -1;
            for (Py_ssize_t m = 0; m < deps.n; m++) {
                int64_t d = deps.v[m];
                if (d == prevv || d == i) continue;
                prevv = d;
                if (vpush(&flat, d) < 0) { PyErr_NoMemory(); goto done; }
            }
        }
        ip[i + 1] = flat.n;
    }
    {
        PyObject *idx = PyBytes_FromStringAndSize(NULL, flat.n * 4);
        if (!idx) goto done;
        int32_t *o = (int32_t *)PyBytes_AS_STRING(idx);
        for (Py_ssize_t m = 0; m < flat.n; m++) o[m] = (int32_t)flat.v[m];
        result = Py_BuildValue("(ON)", indptr, idx);
    }
done:
    Py_XDECREF(indptr);
    if (W) { for (Py_ssize_t k = 0; k < nkeys; k++) free(W[k].v); free(W); }
    if (R) { for (Py_ssize_t k = 0; k < nkeys; k++) free(R[k].v); free(R); }
    free(seen);
    free(flat.v);
    free(deps.v);
    for (int k = 0; k < 9; k++) PyBuffer_Release(&b[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"place", place, METH_VARARGS,
     "place(first, last, nbytes, site, bufs, capacity, align[, policy]) -> (addr bytes, None) or (None, (tile, live))"},
    {"group_slots", group_slots, METH_VARARGS,
     "group_slots(first, last, addr, nbytes, site, parts) -> (slot_of, site, n, addr, nbytes, parts, start, end, "
     "alias_ptr, alias_idx)"},
    {"dependencies", dependencies, METH_VARARGS,
     "dependencies(n, width, nkeys, key, r0, r1, c0, c1, reads, writes, alias_ptr, alias_idx) -> (indptr, indices)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

/* VERSION: what the Python side checks before using this build (2: place takes a policy, and
   bufs <= 0 means no site ring); an older build is not used (the Python references are). */
PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "VERSION", 2) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
