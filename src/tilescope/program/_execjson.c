/* An executable's records as JSON text, in one pass of C.
 *
 * encode(records, prov, layouts, AP, RuntimeScalar) -> bytes
 *
 * writes the JSON array of the records -- instructions, or buffers / slots / provenance
 * entries -- as tilescope.program._program writes them through orjson, record for record.
 * layouts[type(record)] = (prefix, names, keys, plain): the record's opening text, the field
 * names, each field's '"name":' text (',"name":' after the first), and whether the values are
 * plain JSON. For an instruction the opening is '{"kind":K,"op":K' (without "op" when a field
 * is called op), ``prov`` holds one provenance index per record (',"prov":N' closes it), and
 * a field value is written as Instruction.to_json writes it:
 *   None, bool, int (int64), str         as is
 *   float                                its repr; nan/inf/-inf as {"float":"nan"} etc.
 *   AP                                   {"ap":[buffer,dtype,offset,dims]} (dims as arrays)
 *   RuntimeScalar                        {"runtime":name}
 *   tuple                                {"tuple":[<each element as a field value>]}
 * A plain record (a buffer: prefix '{', prov None) has None/bool/int/str/finite float values
 * and tuples of them, tuples as arrays -- what orjson writes for its dataclass.
 * Anything else (an unknown record class, a list, a numpy scalar, an int beyond int64, a
 * non-finite plain float) raises TypeError, and the caller takes the Python path for the
 * whole Program: this encoder only ever writes what that path would, faster.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char *p; size_t len, cap; } Buf;

static int buf_grow(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}
static inline int put(Buf *b, const char *s, size_t n) {
    if (buf_grow(b, n)) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}
#define PUT_LIT(b, s) put((b), (s), sizeof(s) - 1)

static int unsupported(PyObject *v) {
    PyErr_Format(PyExc_TypeError, "no JSON form for a %.100s value here", Py_TYPE(v)->tp_name);
    return -1;
}

static int put_bytes_obj(Buf *b, PyObject *bytes) {
    if (!PyBytes_Check(bytes)) { PyErr_SetString(PyExc_TypeError, "layout text must be bytes"); return -1; }
    return put(b, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
}

static int put_str(Buf *b, PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);  /* fails on lone surrogates, as orjson does */
    if (!u) return -1;
    if (buf_grow(b, (size_t)n * 6 + 3)) return -1;  /* worst case: every byte as \u00XX, sprintf's NUL */
    char *o = b->p + b->len;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)u[i];
        if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
        else if (c < 0x20) { o += sprintf(o, "\\u%04x", c); }
        else *o++ = (char)c;  /* UTF-8 passes through */
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    return 0;
}

static int put_int(Buf *b, PyObject *v) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) { PyErr_SetString(PyExc_TypeError, "integer beyond 64 bits"); return -1; }
    if (x == -1 && PyErr_Occurred()) return -1;
    char tmp[24], *end = tmp + sizeof tmp, *o = end;  /* digits right to left (snprintf: ~5x slower) */
    unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    do { *--o = (char)('0' + u % 10); u /= 10; } while (u);
    if (x < 0) *--o = '-';
    return put(b, o, (size_t)(end - o));
}

static int put_finite_float(Buf *b, double d) {
    char *r = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);  /* Python's repr */
    if (!r) return -1;
    int rc = put(b, r, strlen(r));
    PyMem_Free(r);
    return rc;
}

/* A value inside an AP or a RuntimeScalar: plain JSON (tuples as arrays), as orjson writes it. */
static int put_plain(Buf *b, PyObject *v, int depth) {
    if (depth > 32) { PyErr_SetString(PyExc_TypeError, "nested too deep"); return -1; }
    if (v == Py_None) return PUT_LIT(b, "null");
    if (v == Py_True) return PUT_LIT(b, "true");
    if (v == Py_False) return PUT_LIT(b, "false");
    if (PyLong_CheckExact(v)) return put_int(b, v);
    if (PyUnicode_CheckExact(v)) return put_str(b, v);
    if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        if (!isfinite(d)) return unsupported(v);
        return put_finite_float(b, d);
    }
    if (PyTuple_CheckExact(v)) {
        Py_ssize_t n = PyTuple_GET_SIZE(v);
        if (PUT_LIT(b, "[")) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i && PUT_LIT(b, ",")) return -1;
            if (put_plain(b, PyTuple_GET_ITEM(v, i), depth + 1)) return -1;
        }
        return PUT_LIT(b, "]");
    }
    return unsupported(v);
}

static PyObject *s_buffer, *s_dtype, *s_offset, *s_dims, *s_name;

static int put_attr(Buf *b, PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -1;
    int rc = put_plain(b, v, 0);
    Py_DECREF(v);
    return rc;
}

/* A field value, as Instruction.to_json / isa._instructions._to_json write it. */
static int put_field(Buf *b, PyObject *v, PyTypeObject *ap, PyTypeObject *rs, int depth) {
    if (depth > 32) { PyErr_SetString(PyExc_TypeError, "nested too deep"); return -1; }
    if (v == Py_None || v == Py_True || v == Py_False || PyLong_CheckExact(v) || PyUnicode_CheckExact(v))
        return put_plain(b, v, depth);
    if (PyObject_TypeCheck(v, ap)) {
        if (PUT_LIT(b, "{\"ap\":[") || put_attr(b, v, s_buffer) || PUT_LIT(b, ",") || put_attr(b, v, s_dtype)
            || PUT_LIT(b, ",") || put_attr(b, v, s_offset) || PUT_LIT(b, ",") || put_attr(b, v, s_dims))
            return -1;
        return PUT_LIT(b, "]}");
    }
    if (PyObject_TypeCheck(v, rs))
        return PUT_LIT(b, "{\"runtime\":") || put_attr(b, v, s_name) || PUT_LIT(b, "}");
    if (PyTuple_Check(v)) {
        Py_ssize_t n = PyTuple_GET_SIZE(v);
        if (PUT_LIT(b, "{\"tuple\":[")) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i && PUT_LIT(b, ",")) return -1;
            if (put_field(b, PyTuple_GET_ITEM(v, i), ap, rs, depth + 1)) return -1;
        }
        return PUT_LIT(b, "]}");
    }
    if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        if (isnan(d)) return PUT_LIT(b, "{\"float\":\"nan\"}");
        if (isinf(d)) return d > 0 ? PUT_LIT(b, "{\"float\":\"inf\"}") : PUT_LIT(b, "{\"float\":\"-inf\"}");
        return put_finite_float(b, d);
    }
    return unsupported(v);
}

static int put_record(Buf *b, PyObject *rec, PyObject *prov, PyObject *layouts, PyTypeObject *ap,
                      PyTypeObject *rs) {
    PyObject *layout = PyDict_GetItemWithError(layouts, (PyObject *)Py_TYPE(rec));  /* borrowed */
    if (!layout) {
        if (!PyErr_Occurred()) unsupported(rec);
        return -1;
    }
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 4) {
        PyErr_SetString(PyExc_TypeError, "a layout is (prefix, names, keys, plain)");
        return -1;
    }
    PyObject *names = PyTuple_GET_ITEM(layout, 1), *keys = PyTuple_GET_ITEM(layout, 2);
    int plain = PyObject_IsTrue(PyTuple_GET_ITEM(layout, 3));
    if (plain < 0) return -1;
    if (!PyTuple_Check(names) || !PyTuple_Check(keys) || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_TypeError, "a layout's names and keys are tuples of one length");
        return -1;
    }
    if (put_bytes_obj(b, PyTuple_GET_ITEM(layout, 0))) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        if (put_bytes_obj(b, PyTuple_GET_ITEM(keys, i))) return -1;
        PyObject *v = PyObject_GetAttr(rec, PyTuple_GET_ITEM(names, i));
        if (!v) return -1;
        int rc = plain ? put_plain(b, v, 0) : put_field(b, v, ap, rs, 0);
        Py_DECREF(v);
        if (rc) return -1;
    }
    if (prov) {
        if (!PyLong_CheckExact(prov)) return unsupported(prov);
        if (PUT_LIT(b, ",\"prov\":") || put_int(b, prov)) return -1;
    }
    return PUT_LIT(b, "}");
}

static PyObject *encode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *recs, *prov, *layouts, *ap, *rs;
    if (!PyArg_ParseTuple(args, "O!OO!O!O!:encode", &PyTuple_Type, &recs, &prov, &PyDict_Type, &layouts,
                          &PyType_Type, &ap, &PyType_Type, &rs))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(recs);
    if (prov == Py_None) prov = NULL;
    else if (!PyTuple_Check(prov) || PyTuple_GET_SIZE(prov) != n) {
        PyErr_SetString(PyExc_ValueError, "prov: None, or a tuple of one provenance index per record");
        return NULL;
    }
    Buf b = {0};
    if (PUT_LIT(&b, "[")) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i && PUT_LIT(&b, ",")) goto fail;
        if (put_record(&b, PyTuple_GET_ITEM(recs, i), prov ? PyTuple_GET_ITEM(prov, i) : NULL, layouts,
                       (PyTypeObject *)ap, (PyTypeObject *)rs))
            goto fail;
    }
    if (PUT_LIT(&b, "]")) goto fail;
    PyObject *out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
    free(b.p);
    return out;
fail:
    free(b.p);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS,
     "encode(records, prov, layouts, AP, RuntimeScalar) -> bytes: the JSON array of the records"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_execjson", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__execjson(void) {
    if (!(s_buffer = PyUnicode_InternFromString("buffer")) || !(s_dtype = PyUnicode_InternFromString("dtype"))
        || !(s_offset = PyUnicode_InternFromString("offset")) || !(s_dims = PyUnicode_InternFromString("dims"))
        || !(s_name = PyUnicode_InternFromString("name")))
        return NULL;
    return PyModule_Create(&module);
}
