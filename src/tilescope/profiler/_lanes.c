/* The system trace's lanes as JSON text, the per-event loops of tilescope/profiler/_events.py.
 *
 * framework_lanes(events, cpu, head, extra, prefixes, ids=None, heads=None)
 *     -> (text, count, threads, ranges, end, found)
 *   every event of torch's list whose device_type.value == cpu, each as the text
 *   head(category, name, tid) + ts + ',"dur":' + dur + ',"args":{"External id":' + id + extra(evt) + '}}'
 *   (head is called once per (category, name, tid) missing from the dict heads, which keeps what it
 *   returns; extra only for events with input shapes or a stack). text: the events joined by ",";
 *   threads: torch thread -> tid, in order of first appearance; ranges: (category, name, tid, ts,
 *   dur) of the events whose name starts with one of prefixes; end: the latest ts + dur (0.0
 *   without events); found: id -> the first of those events whose id is in the set ids (the
 *   exporter's launching ops, found in the same pass).
 * placement(matched, fields, texts, clock_free_text) -> (rows, cores, end)
 *   _events.placement's rows (see there) of the executions ``matched``; fields: the indices in an
 *   Execution (a named tuple) of core, host_submit_ns, queued_ns, device_start_ns, device_end_ns,
 *   flow_id, then the 7 fields that key the clock-free texts (program_hash, op, core, lowering, kind,
 *   nbytes, direction); texts: those texts by key, made by clock_free_text(record) when missing and
 *   added; cores: each row's core; end: the latest hardware end (-inf without rows).
 * device_lanes(rows, tids, cores, shift, fw_pid, runtime_pid, hardware_pid) -> text
 *   the runtime slice, hardware slice and three flow events of each placement row
 *   (matched, runtime start, runtime dur, hardware start, hardware dur, framework op start, flow id,
 *   (runtime head, args after the flow id, hardware head, end of the hardware args)), joined by ",";
 *   tids: each row's framework lane, or a dict torch thread -> lane read with each row's
 *   matched.thread (0 when missing).
 * format_ms(x) -> str
 *   f"{x:.3f}", as both write every time.
 *
 * Times are written as Python's f"{x:.3f}" writes them (see ms_make), so that the text is the
 * same as the Python implementation's, which stays the reference (and the fallback
 * when this extension is not built). The Python-side callables make the JSON string literals:
 * every text they return and every name they escape is ASCII.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (n > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n) cap *= 2;  /* < PY_SSIZE_T_MAX: len + n < PY_SSIZE_T_MAX / 2 */
        char *grown = PyMem_Realloc(b->data, (size_t)cap);
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

#define PUT_LIT(b, s) buf_put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

/* a str (ASCII: see the file comment) */
static int buf_put_str(Buf *b, PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    return u ? buf_put(b, u, n) : -1;
}

/* f"{x:.3f}": Python rounds the exact binary value to 3 decimals, ties to even. For
 * |x| < 2^53 / 1000 that is done here in integers, exactly and whatever the FP environment:
 * |x| = m * 2^(e - 53) with a 53-bit integer m, so |x| * 1000 = m * 1000 / 2^s (s = 53 - e,
 * m * 1000 < 2^63), rounded by the shifted-out bits. Other values (NaN, infinities, huge
 * times) take Python's own conversion (PyOS_double_to_string, a general and slower one). */
typedef struct {
    char fixed[32];
    char *heap;  /* from PyOS_double_to_string, or NULL */
    const char *text;
    Py_ssize_t len;
} Ms;

static int ms_make(Ms *ms, double x) {
    ms->heap = NULL;
    if (isfinite(x) && fabs(x) < 9007199254740.0) {
        int e;
        double f = frexp(fabs(x), &e);  /* exact; f == 0 for x == 0 */
        uint64_t p = (uint64_t)ldexp(f, 53) * 1000u, n;
        int s = 53 - e;  /* >= 9 here */
        if (s >= 64) {
            n = 0;  /* p / 2^s < 2^63 / 2^64 */
        } else {
            uint64_t rest = p & ((UINT64_C(1) << s) - 1), half = UINT64_C(1) << (s - 1);
            n = p >> s;
            if (rest > half || (rest == half && (n & 1))) n++;
        }
        char digits[24];
        int k = 0, len = 0;
        do {
            digits[k++] = (char)('0' + n % 10);
            n /= 10;
        } while (n || k < 4);  /* at least "0.xyz" */
        if (signbit(x)) ms->fixed[len++] = '-';  /* "-0.000" too, as Python writes it */
        while (k > 3) ms->fixed[len++] = digits[--k];
        ms->fixed[len++] = '.';
        while (k > 0) ms->fixed[len++] = digits[--k];
        ms->text = ms->fixed;
        ms->len = len;
        return 0;
    }
    ms->heap = PyOS_double_to_string(x, 'f', 3, 0, NULL);
    if (!ms->heap) return -1;
    ms->text = ms->heap;
    ms->len = (Py_ssize_t)strlen(ms->heap);
    return 0;
}

static void ms_free(Ms *ms) {
    PyMem_Free(ms->heap);
    ms->heap = NULL;
}

static int buf_put_ms(Buf *b, double x) {
    Ms ms;
    if (ms_make(&ms, x) < 0) return -1;
    int rc = buf_put(b, ms.text, ms.len);
    ms_free(&ms);
    return rc;
}

/* str(obj) of an int without making a str (a small int's digits written here); other objects
 * through str() */
typedef struct {
    char digits[24];
    const char *text;
    Py_ssize_t len;
    PyObject *str;  /* str(obj) when it was needed, else NULL */
} IntText;

static int int_text(IntText *it, PyObject *obj) {
    it->str = NULL;
    if (PyLong_CheckExact(obj)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (!overflow && !(v == -1 && PyErr_Occurred()) && v > LLONG_MIN) {
            unsigned long long u = (unsigned long long)(v < 0 ? -v : v);
            char *end = it->digits + sizeof it->digits, *p = end;
            do {
                *--p = (char)('0' + u % 10);
                u /= 10;
            } while (u);
            if (v < 0) *--p = '-';
            it->text = p;
            it->len = end - p;
            return 0;
        }
        PyErr_Clear();
    }
    if (!(it->str = PyObject_Str(obj))) return -1;
    it->text = PyUnicode_AsUTF8AndSize(it->str, &it->len);
    if (!it->text) {
        Py_CLEAR(it->str);
        return -1;
    }
    return 0;
}

static void int_text_free(IntText *it) {
    Py_CLEAR(it->str);
}

/* str(obj) of an int (see int_text) */
static int buf_put_int(Buf *b, PyObject *obj) {
    IntText it;
    if (int_text(&it, obj) < 0) return -1;
    int rc = buf_put(b, it.text, it.len);
    int_text_free(&it);
    return rc;
}

static PyObject *buf_text(Buf *b) {
    return PyUnicode_DecodeASCII(b->data ? b->data : "", b->len, "strict");
}

static PyObject *s_device_type, *s_value, *s_thread, *s_name, *s_is_user_annotation, *s_time_range, *s_start,
    *s_end, *s_input_shapes, *s_stack, *s_id, *s_cpu_op, *s_user_annotation, *s_rec, *s_launch_us, *s_parent;

static double attr_double(PyObject *obj, PyObject *name, int *err) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) {
        *err = 1;
        return 0.0;
    }
    double d = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (d == -1.0 && PyErr_Occurred()) *err = 1;
    return d;
}

/* 1 when attribute ``name`` of obj is truthy, 0 when not, -1 on error */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* one event; 1 when it was written, 0 when it is not a CPU event, -1 on error */
static int framework_event(PyObject *evt, long cpu, PyObject *head_fn, PyObject *extra_fn, PyObject *prefixes,
                           PyObject *heads, PyObject *threads, PyObject *ranges, PyObject *ids, PyObject *found,
                           Buf *b, int first, double *end) {
    int rc = -1, err = 0;
    PyObject *dt = NULL, *dv = NULL, *thread = NULL, *tid = NULL, *name = NULL, *key = NULL, *span = NULL;
    PyObject *cat, *head = NULL, *id = NULL, *extra = NULL;
    if (!(dt = PyObject_GetAttr(evt, s_device_type)) || !(dv = PyObject_GetAttr(dt, s_value))) goto done;
    long v = PyLong_AsLong(dv);
    if (v == -1 && PyErr_Occurred()) goto done;
    if (v != cpu) {
        rc = 0;
        goto done;
    }
    if (!(thread = PyObject_GetAttr(evt, s_thread))) goto done;
    tid = PyDict_GetItemWithError(threads, thread);
    if (tid) {
        Py_INCREF(tid);
    } else {
        if (PyErr_Occurred() || !(tid = PyLong_FromSsize_t(PyDict_GET_SIZE(threads)))) goto done;
        if (PyDict_SetItem(threads, thread, tid) < 0) goto done;
    }
    if (!(name = PyObject_GetAttr(evt, s_name))) goto done;
    int ua = attr_true(evt, s_is_user_annotation);
    if (ua < 0) goto done;
    cat = ua ? s_user_annotation : s_cpu_op;
    if (!(key = PyTuple_Pack(3, cat, name, tid))) goto done;
    head = PyDict_GetItemWithError(heads, key);
    if (head) {
        Py_INCREF(head);
    } else {
        if (PyErr_Occurred() || !(head = PyObject_CallFunctionObjArgs(head_fn, cat, name, tid, NULL))) goto done;
        if (!PyUnicode_Check(head)) {
            PyErr_SetString(PyExc_TypeError, "framework_lanes: head() must return str");
            goto done;
        }
        if (PyDict_SetItem(heads, key, head) < 0) goto done;
    }
    if (!(span = PyObject_GetAttr(evt, s_time_range))) goto done;
    double start = attr_double(span, s_start, &err);
    if (err) goto done;
    double stop = attr_double(span, s_end, &err);
    if (err) goto done;
    double dur = stop - start;
    int shapes = attr_true(evt, s_input_shapes);
    int stack = shapes < 0 ? -1 : attr_true(evt, s_stack);
    if (shapes < 0 || stack < 0) goto done;
    if (shapes || stack) {
        if (!(extra = PyObject_CallOneArg(extra_fn, evt))) goto done;
        if (!PyUnicode_Check(extra)) {
            PyErr_SetString(PyExc_TypeError, "framework_lanes: extra() must return str");
            goto done;
        }
    }
    if (!(id = PyObject_GetAttr(evt, s_id))) goto done;
    if (ids) {
        int wanted = PySet_Contains(ids, id);
        if (wanted < 0 || (wanted && PyDict_SetDefault(found, id, evt) == NULL)) goto done;
    }
    if ((!first && PUT_LIT(b, ",")) || buf_put_str(b, head) || buf_put_ms(b, start) || PUT_LIT(b, ",\"dur\":") ||
        buf_put_ms(b, dur) || PUT_LIT(b, ",\"args\":{\"External id\":") || buf_put_int(b, id) ||
        (extra && buf_put_str(b, extra)) || PUT_LIT(b, "}}"))
        goto done;
    if (start + dur > *end) *end = start + dur;
    Py_ssize_t np = PyTuple_GET_SIZE(prefixes);
    for (Py_ssize_t i = 0; i < np; i++) {
        int hit = PyUnicode_Tailmatch(name, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1);
        if (hit < 0) goto done;
        if (hit) {
            PyObject *r = Py_BuildValue("(OOOdd)", cat, name, tid, start, dur);
            if (!r) goto done;
            int ok = PyList_Append(ranges, r);
            Py_DECREF(r);
            if (ok < 0) goto done;
            break;
        }
    }
    rc = 1;
done:
    Py_XDECREF(dt);
    Py_XDECREF(dv);
    Py_XDECREF(thread);
    Py_XDECREF(tid);
    Py_XDECREF(name);
    Py_XDECREF(key);
    Py_XDECREF(head);
    Py_XDECREF(span);
    Py_XDECREF(id);
    Py_XDECREF(extra);
    return rc;
}

static PyObject *framework_lanes(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *events, *head_fn, *extra_fn, *prefixes, *ids = Py_None, *heads = Py_None;
    long cpu;
    if (!PyArg_ParseTuple(args, "OlOOO!|OO:framework_lanes", &events, &cpu, &head_fn, &extra_fn, &PyTuple_Type,
                          &prefixes, &ids, &heads))
        return NULL;
    if (ids != Py_None && !PyAnySet_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "framework_lanes: ids must be a set or frozenset (or None)");
        return NULL;
    }
    if (heads != Py_None && !PyDict_Check(heads)) {
        PyErr_SetString(PyExc_TypeError, "framework_lanes: heads must be a dict (or None)");
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(events);  /* owned: callbacks cannot change what is read */
    if (!seq) return NULL;
    heads = heads == Py_None ? PyDict_New() : Py_NewRef(heads);
    PyObject *threads = PyDict_New(), *ranges = PyList_New(0), *found = PyDict_New();
    PyObject *result = NULL;
    Buf b = {NULL, 0, 0};
    double end = 0.0;
    Py_ssize_t count = 0;
    if (!heads || !threads || !ranges || !found) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        int w = framework_event(PyTuple_GET_ITEM(seq, i), cpu, head_fn, extra_fn, prefixes, heads, threads,
                                ranges, ids == Py_None ? NULL : ids, found, &b, count == 0, &end);
        if (w < 0) goto done;
        count += w;
    }
    PyObject *text = buf_text(&b);
    if (text) result = Py_BuildValue("(NnOOdO)", text, count, threads, ranges, end, found);
done:
    PyMem_Free(b.data);
    Py_DECREF(seq);
    Py_XDECREF(heads);
    Py_XDECREF(threads);
    Py_XDECREF(ranges);
    Py_XDECREF(found);
    return result;
}

/* what follows a flow event's id, up to its tid: one per kind of flow event, made once per call */
typedef struct {
    char text[3][80];
    Py_ssize_t len[3];
} FlowHeads;

static const char FLOW_OPEN[] = "{\"cat\":\"tilescope.flow\",\"name\":\"launch\",\"id\":";

/* row: (matched, rt_ts, rt_dur, hw_ts, hw_dur, fw_ts, flow_id, (rt_head, rest, hw_head, hw_tail)) */
static int device_row(Buf *b, PyObject *row, PyObject *tid, PyObject *core, double shift, const FlowHeads *flows,
                      int first) {
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 8 || !PyTuple_Check(PyTuple_GET_ITEM(row, 7)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(row, 7)) != 4) {
        PyErr_SetString(PyExc_TypeError, "device_lanes: each row is a placement tuple of 8 items, its texts a tuple of 4");
        return -1;
    }
    PyObject *texts = PyTuple_GET_ITEM(row, 7);
    for (int k = 0; k < 4; k++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(texts, k))) {
            PyErr_SetString(PyExc_TypeError, "device_lanes: a row's texts must be str");
            return -1;
        }
    }
    PyObject *rt_head = PyTuple_GET_ITEM(texts, 0), *rest = PyTuple_GET_ITEM(texts, 1);
    PyObject *hw_head = PyTuple_GET_ITEM(texts, 2), *hw_tail = PyTuple_GET_ITEM(texts, 3);
    double t[5];  /* runtime start, runtime dur, hardware start, hardware dur, framework op start */
    for (int k = 0; k < 5; k++) {
        t[k] = PyFloat_AsDouble(PyTuple_GET_ITEM(row, k + 1));
        if (t[k] == -1.0 && PyErr_Occurred()) return -1;
    }
    IntText flow, tid_text, core_text;
    int ints = 0, made = 0, rc = -1;
    Ms rt, hw, queued;
    if (int_text(&flow, PyTuple_GET_ITEM(row, 6)) < 0) goto done;
    ints = 1;
    if (int_text(&tid_text, tid) < 0) goto done;
    ints = 2;
    if (int_text(&core_text, core) < 0) goto done;
    ints = 3;
    if (ms_make(&rt, t[0] + shift) < 0) goto done;
    made = 1;
    if (ms_make(&hw, t[2] + shift) < 0) goto done;
    made = 2;
    if (ms_make(&queued, t[1]) < 0) goto done;
    made = 3;
    /* the runtime slice, then the hardware slice */
    if ((!first && PUT_LIT(b, ",")) || buf_put_str(b, rt_head) || PUT_LIT(b, ",\"ts\":") ||
        buf_put(b, rt.text, rt.len) || PUT_LIT(b, ",\"dur\":") || buf_put(b, queued.text, queued.len) ||
        PUT_LIT(b, ",\"args\":{\"flow_id\":") || buf_put(b, flow.text, flow.len) || buf_put_str(b, rest) ||
        PUT_LIT(b, ",\"queued_us\":") || buf_put(b, queued.text, queued.len) ||
        PUT_LIT(b, ",\"assumed_runtime_cost\":true}},") || buf_put_str(b, hw_head) || PUT_LIT(b, ",\"ts\":") ||
        buf_put(b, hw.text, hw.len) || PUT_LIT(b, ",\"dur\":") || buf_put_ms(b, t[3]) ||
        PUT_LIT(b, ",\"args\":{\"flow_id\":") || buf_put(b, flow.text, flow.len) || buf_put_str(b, rest) ||
        buf_put_str(b, hw_tail) || PUT_LIT(b, ","))
        goto done;
    /* the flow: framework op -> runtime slice -> hardware slice */
    if (PUT_LIT(b, FLOW_OPEN) || buf_put(b, flow.text, flow.len) || buf_put(b, flows->text[0], flows->len[0]) ||
        buf_put(b, tid_text.text, tid_text.len) || PUT_LIT(b, ",\"ts\":") || buf_put_ms(b, t[4] + shift) ||
        PUT_LIT(b, "},"))
        goto done;
    if (PUT_LIT(b, FLOW_OPEN) || buf_put(b, flow.text, flow.len) || buf_put(b, flows->text[1], flows->len[1]) ||
        buf_put(b, core_text.text, core_text.len) || PUT_LIT(b, ",\"ts\":") || buf_put(b, rt.text, rt.len) ||
        PUT_LIT(b, "},"))
        goto done;
    if (PUT_LIT(b, FLOW_OPEN) || buf_put(b, flow.text, flow.len) || buf_put(b, flows->text[2], flows->len[2]) ||
        buf_put(b, core_text.text, core_text.len) || PUT_LIT(b, ",\"ts\":") || buf_put(b, hw.text, hw.len) ||
        PUT_LIT(b, "}"))
        goto done;
    rc = 0;
done:
    if (made >= 1) ms_free(&rt);
    if (made >= 2) ms_free(&hw);
    if (made >= 3) ms_free(&queued);
    if (ints >= 1) int_text_free(&flow);
    if (ints >= 2) int_text_free(&tid_text);
    if (ints >= 3) int_text_free(&core_text);
    return rc;
}

static PyObject *device_lanes(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *rows, *tids, *cores;
    double shift;
    long fw_pid, rt_pid, hw_pid;
    if (!PyArg_ParseTuple(args, "O!OO!dlll:device_lanes", &PyList_Type, &rows, &tids, &PyList_Type, &cores, &shift,
                          &fw_pid, &rt_pid, &hw_pid))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    int by_thread = PyDict_Check(tids);  /* torch thread -> tid, of each row's matched ``thread`` (0 if missing) */
    if (!by_thread && !PyList_Check(tids)) {
        PyErr_Format(PyExc_TypeError, "device_lanes: tids is a list (one per row) or a dict (by thread), not %.100s",
                     Py_TYPE(tids)->tp_name);
        return NULL;
    }
    if ((!by_thread && PyList_GET_SIZE(tids) != n) || PyList_GET_SIZE(cores) != n) {
        PyErr_SetString(PyExc_ValueError, "device_lanes: one tid and one core per row");
        return NULL;
    }
    /* owned copies: a float's or a str's conversion could run code that changes the lists */
    PyObject *own_rows = PyList_AsTuple(rows), *own_cores = PyList_AsTuple(cores);
    PyObject *own_tids = by_thread ? PyDict_Copy(tids) : PyList_AsTuple(tids);
    PyObject *zero = PyLong_FromLong(0);
    Buf b = {NULL, 0, 0};
    PyObject *result = NULL;
    FlowHeads flows;
    const char *formats[3] = {",\"ph\":\"s\",\"pid\":%ld,\"tid\":", ",\"ph\":\"t\",\"pid\":%ld,\"tid\":",
                              ",\"ph\":\"f\",\"bp\":\"e\",\"pid\":%ld,\"tid\":"};
    long pids[3] = {fw_pid, rt_pid, hw_pid};
    for (int k = 0; k < 3; k++)
        flows.len[k] = snprintf(flows.text[k], sizeof flows.text[k], formats[k], pids[k]);
    if (!own_rows || !own_tids || !own_cores || !zero) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(own_rows, i), *tid = NULL, *thread = NULL;
        if (!by_thread) {
            tid = PyTuple_GET_ITEM(own_tids, i);
        } else {
            if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 8) {  /* (the rest is checked by device_row) */
                PyErr_SetString(PyExc_TypeError,
                                "device_lanes: each row is a placement tuple of 8 items, its texts a tuple of 4");
                goto done;
            }
            thread = PyObject_GetAttr(PyTuple_GET_ITEM(row, 0), s_thread);
            if (!thread) goto done;
            tid = PyDict_GetItemWithError(own_tids, thread);  /* borrowed: the copy is ours */
            Py_DECREF(thread);
            if (!tid) {
                if (PyErr_Occurred()) goto done;
                tid = zero;
            }
        }
        if (device_row(&b, row, tid, PyTuple_GET_ITEM(own_cores, i), shift, &flows, i == 0) < 0) goto done;
    }
    result = buf_text(&b);
done:
    PyMem_Free(b.data);
    Py_XDECREF(zero);
    Py_XDECREF(own_rows);
    Py_XDECREF(own_tids);
    Py_XDECREF(own_cores);
    return result;
}

/* ---- placement ------------------------------------------------------------------------ */

enum { F_CORE, F_SUBMIT, F_QUEUED, F_START, F_END, F_FLOW, F_KEY0 };  /* fields: see placement() */
#define N_KEY 7  /* the clock-free text's key: program_hash, op, core, lowering, kind, nbytes, direction */
#define N_FIELDS (F_KEY0 + N_KEY)

typedef struct {
    PyObject *core;  /* a reference */
    double end;
} CoreEnd;

/* a field of an Execution (a named tuple) by index, as a double (ints exactly below 2^53, as
 * Python's arithmetic on them) */
static int field_double(PyObject *rec, Py_ssize_t k, double *out) {
    *out = PyFloat_AsDouble(PyTuple_GET_ITEM(rec, k));
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* one row; NULL on error */
static PyObject *place_one(PyObject *m, const Py_ssize_t *f, PyObject *texts, PyObject *text_fn, CoreEnd **ends,
                           Py_ssize_t *n_ends, Py_ssize_t *cap_ends, PyObject **core_out, double *hw_end_out) {
    PyObject *rec = PyObject_GetAttr(m, s_rec), *launch = NULL, *parent = NULL, *key = NULL, *text = NULL, *row = NULL;
    PyObject *rt_obj = NULL, *hw_obj = NULL, *hwd_obj = NULL, *fw_obj = NULL;
    if (!rec) return NULL;
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) <= f[N_FIELDS]) {
        PyErr_Format(PyExc_TypeError,
                     "placement: an execution record is a named tuple of Execution's fields (at least %zd), not %.100s",
                     f[N_FIELDS] + 1, Py_TYPE(rec)->tp_name);
        goto done;
    }
    launch = PyObject_GetAttr(m, s_launch_us);
    if (!launch) goto done;
    double t_launch = PyFloat_AsDouble(launch), submit, queued, start, end;
    if (t_launch == -1.0 && PyErr_Occurred()) goto done;
    if (field_double(rec, f[F_SUBMIT], &submit) || field_double(rec, f[F_QUEUED], &queued) ||
        field_double(rec, f[F_START], &start) || field_double(rec, f[F_END], &end))
        goto done;
    PyObject *core = PyTuple_GET_ITEM(rec, f[F_CORE]);
    double rt_dur = (queued - submit) / 1000.0;
    double hw_ts = t_launch + (start - submit) / 1000.0;
    CoreEnd *slot = NULL;  /* the previous execution's end on this core (a few cores: a scan) */
    for (Py_ssize_t i = 0; i < *n_ends && !slot; i++) {
        int same = (*ends)[i].core == core ? 1 : PyObject_RichCompareBool((*ends)[i].core, core, Py_EQ);
        if (same < 0) goto done;
        if (same) slot = &(*ends)[i];
    }
    if (slot && slot->end > hw_ts) hw_ts = slot->end;
    if (t_launch + rt_dur > hw_ts) hw_ts = t_launch + rt_dur;
    double hw_dur = (end - start) / 1000.0;
    if (!slot) {
        if (*n_ends == *cap_ends) {
            Py_ssize_t cap = *cap_ends ? *cap_ends * 2 : 8;
            CoreEnd *grown = PyMem_Realloc(*ends, (size_t)cap * sizeof(CoreEnd));
            if (!grown) {
                PyErr_NoMemory();
                goto done;
            }
            *ends = grown;
            *cap_ends = cap;
        }
        slot = &(*ends)[(*n_ends)++];
        Py_INCREF(core);
        slot->core = core;
    }
    slot->end = hw_ts + hw_dur;
    /* the framework op's start: the launch when the op is not known; never after the launch */
    double fw_ts = t_launch;
    parent = PyObject_GetAttr(m, s_parent);
    if (!parent) goto done;
    if (parent != Py_None) {
        PyObject *span = PyObject_GetAttr(parent, s_time_range);
        if (!span) goto done;
        int err = 0;
        fw_ts = attr_double(span, s_start, &err);
        Py_DECREF(span);
        if (err) goto done;
    }
    if (fw_ts < t_launch - 1e-3) fw_ts = t_launch - 1e-3;
    key = PyTuple_New(N_KEY);
    if (!key) goto done;
    for (int k = 0; k < N_KEY; k++) {
        PyObject *v = PyTuple_GET_ITEM(rec, f[F_KEY0 + k]);
        Py_INCREF(v);
        PyTuple_SET_ITEM(key, k, v);
    }
    text = PyDict_GetItemWithError(texts, key);
    if (text) {
        Py_INCREF(text);  /* held: allocating the row could run a collection, and code that clears the dict */
    } else {
        if (PyErr_Occurred() || !(text = PyObject_CallOneArg(text_fn, rec))) goto done;
        if (PyDict_SetItem(texts, key, text) < 0) goto done;
    }
    if (!(rt_obj = PyFloat_FromDouble(rt_dur)) || !(hw_obj = PyFloat_FromDouble(hw_ts)) ||
        !(hwd_obj = PyFloat_FromDouble(hw_dur)) || !(fw_obj = PyFloat_FromDouble(fw_ts)))
        goto done;
    row = PyTuple_Pack(8, m, launch, rt_obj, hw_obj, hwd_obj, fw_obj, PyTuple_GET_ITEM(rec, f[F_FLOW]), text);
    if (row) {
        Py_INCREF(core);
        *core_out = core;
        *hw_end_out = hw_ts + hw_dur;
    }
done:
    Py_XDECREF(rec);
    Py_XDECREF(launch);
    Py_XDECREF(parent);
    Py_XDECREF(key);
    Py_XDECREF(text);
    Py_XDECREF(rt_obj);
    Py_XDECREF(hw_obj);
    Py_XDECREF(hwd_obj);
    Py_XDECREF(fw_obj);
    return row;
}

static PyObject *placement(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *matched, *fields, *texts, *text_fn;
    if (!PyArg_ParseTuple(args, "O!O!O!O:placement", &PyList_Type, &matched, &PyTuple_Type, &fields, &PyDict_Type,
                          &texts, &text_fn))
        return NULL;
    if (PyTuple_GET_SIZE(fields) != N_FIELDS) {
        PyErr_Format(PyExc_ValueError, "placement: %d field indices expected, got %zd", N_FIELDS,
                     PyTuple_GET_SIZE(fields));
        return NULL;
    }
    Py_ssize_t f[N_FIELDS + 1];  /* the indices, then the largest */
    f[N_FIELDS] = 0;
    for (int k = 0; k < N_FIELDS; k++) {
        f[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(fields, k));
        if (f[k] == -1 && PyErr_Occurred()) return NULL;
        if (f[k] < 0) {
            PyErr_SetString(PyExc_ValueError, "placement: field indices are >= 0");
            return NULL;
        }
        if (f[k] > f[N_FIELDS]) f[N_FIELDS] = f[k];
    }
    PyObject *own = PyList_AsTuple(matched);  /* attribute reads could run code that changes the list */
    if (!own) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(own);
    PyObject *rows = PyList_New(n), *cores = PyList_New(n), *result = NULL;
    CoreEnd *ends = NULL;
    Py_ssize_t n_ends = 0, cap_ends = 0;
    double latest = -Py_HUGE_VAL;
    if (!rows || !cores) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *core = NULL;
        double hw_end = 0.0;
        PyObject *row = place_one(PyTuple_GET_ITEM(own, i), f, texts, text_fn, &ends, &n_ends, &cap_ends, &core,
                                  &hw_end);
        if (!row) goto done;
        PyList_SET_ITEM(rows, i, row);
        PyList_SET_ITEM(cores, i, core);
        if (hw_end > latest) latest = hw_end;
    }
    result = Py_BuildValue("(OOd)", rows, cores, latest);
done:
    for (Py_ssize_t i = 0; i < n_ends; i++) Py_DECREF(ends[i].core);
    PyMem_Free(ends);
    Py_DECREF(own);
    Py_XDECREF(rows);
    Py_XDECREF(cores);
    return result;
}

static PyObject *format_ms(PyObject *Py_UNUSED(self), PyObject *arg) {
    double x = PyFloat_AsDouble(arg);
    if (x == -1.0 && PyErr_Occurred()) return NULL;
    Ms ms;
    if (ms_make(&ms, x) < 0) return NULL;
    PyObject *text = PyUnicode_FromStringAndSize(ms.text, ms.len);
    ms_free(&ms);
    return text;
}

static PyMethodDef methods[] = {
    {"format_ms", format_ms, METH_O, "format_ms(x) -> str: f\"{x:.3f}\", as the lanes write times"},
    {"framework_lanes", framework_lanes, METH_VARARGS,
     "framework_lanes(events, cpu, head, extra, prefixes, ids=None, heads=None) -> "
     "(text, count, threads, ranges, end, found)"},
    {"placement", placement, METH_VARARGS,
     "placement(matched, fields, texts, clock_free_text) -> (rows, cores, end)"},
    {"device_lanes", device_lanes, METH_VARARGS,
     "device_lanes(rows, tids, cores, shift, fw_pid, runtime_pid, hardware_pid) -> text"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lanes", NULL, -1, methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text) \
    if (!((var) = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__lanes(void) {
    INTERN(s_device_type, "device_type");
    INTERN(s_value, "value");
    INTERN(s_thread, "thread");
    INTERN(s_name, "name");
    INTERN(s_is_user_annotation, "is_user_annotation");
    INTERN(s_time_range, "time_range");
    INTERN(s_start, "start");
    INTERN(s_end, "end");
    INTERN(s_input_shapes, "input_shapes");
    INTERN(s_stack, "stack");
    INTERN(s_id, "id");
    INTERN(s_cpu_op, "cpu_op");
    INTERN(s_user_annotation, "user_annotation");
    INTERN(s_rec, "rec");
    INTERN(s_launch_us, "launch_us");
    INTERN(s_parent, "parent");
    return PyModule_Create(&module);
}
