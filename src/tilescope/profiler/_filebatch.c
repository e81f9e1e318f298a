/* Writing a batch of new files without holding the GIL.
 *
 * write_files(paths, datas) -> None
 *
 * creates (or truncates) each path and writes its bytes, in order, with the GIL released for
 * the whole batch, so that a thread calling it runs beside the exporter's Python work instead
 * of taking the GIL back after every system call. A profile is dozens of files, and on some
 * file systems (network ones, busy virtual disks) creating one costs hundreds of microseconds.
 * The first failure stops the batch and raises OSError with the errno and the path. paths are
 * file-system paths (str, bytes or os.PathLike), datas bytes; both lists of one length.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

static int write_one(const char *path, const char *data, Py_ssize_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return errno;
    while (size > 0) {
        ssize_t n = write(fd, data, (size_t)size);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            close(fd);
            return err;
        }
        data += n;
        size -= n;
    }
    return close(fd) < 0 ? errno : 0;
}

static PyObject *write_files(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *paths, *datas;
    if (!PyArg_ParseTuple(args, "O!O!:write_files", &PyList_Type, &paths, &PyList_Type, &datas)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(datas) != n) {
        PyErr_SetString(PyExc_ValueError, "write_files: one data per path");
        return NULL;
    }
    /* held for the batch: the paths, as given and encoded, and the data (the lists could
     * change while the GIL is released) */
    size_t slots = (size_t)(n ? n : 1);
    PyObject **given = PyMem_Calloc(slots, sizeof(PyObject *));
    PyObject **encoded = PyMem_Calloc(slots, sizeof(PyObject *));
    PyObject **held = PyMem_Calloc(slots, sizeof(PyObject *));
    if (!given || !encoded || !held) {
        PyMem_Free(given);
        PyMem_Free(encoded);
        PyMem_Free(held);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t i;
    for (i = 0; i < n; i++) {
        given[i] = Py_NewRef(PyList_GET_ITEM(paths, i));
        if (!PyUnicode_FSConverter(given[i], &encoded[i])) goto done;
        PyObject *d = PyList_GET_ITEM(datas, i);
        if (!PyBytes_Check(d)) {
            PyErr_Format(PyExc_TypeError, "write_files: data must be bytes, not %.100s", Py_TYPE(d)->tp_name);
            goto done;
        }
        Py_INCREF(d);
        held[i] = d;
    }
    int err = 0;
    Py_ssize_t failed = -1;
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n && !err; i++) {
        err = write_one(PyBytes_AS_STRING(encoded[i]), PyBytes_AS_STRING(held[i]), PyBytes_GET_SIZE(held[i]));
        if (err) failed = i;
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, given[failed]);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (i = 0; i < n; i++) {
        Py_XDECREF(given[i]);
        Py_XDECREF(encoded[i]);
        Py_XDECREF(held[i]);
    }
    PyMem_Free(given);
    PyMem_Free(encoded);
    PyMem_Free(held);
    return result;
}

static PyMethodDef methods[] = {
    {"write_files", write_files, METH_VARARGS,
     "write_files(paths, datas) -> None: create each file with its bytes, without holding the GIL"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_filebatch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__filebatch(void) { return PyModule_Create(&module); }
