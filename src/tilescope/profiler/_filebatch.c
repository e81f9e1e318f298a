/* Writing a batch of new files without holding the GIL.
 *
 * write_files(paths, datas, links=None) -> list of bool
 *
 * creates (or truncates) each path and writes its data, in order, with the GIL released for
 * the whole batch, so that a thread calling it runs beside the exporter's Python work instead
 * of taking the GIL back after every system call. A profile is dozens of files, and on some
 * file systems (network ones, busy virtual disks) creating one costs hundreds of microseconds.
 *
 * paths are file-system paths (str, bytes or os.PathLike); datas bytes or str (written as
 * UTF-8); links, when given, one None or (source, st_ino, st_size, st_mtime_ns) per path: the
 * path is then a hard link to source when source is still that file (same inode, size and
 * modification time), else it is written. A path's missing directories are made (the
 * profile's own directory and its executables/ and itraces/ are made here, off the exporter's
 * thread, by the first batch). Returns,
 * per path, whether it was linked. The first failure stops the batch and raises OSError with
 * the errno and the path. All lists have one length.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

/* mkdir -p of dir (modified while it runs, restored); 0 or an errno */
static int make_dirs(char *dir) {
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return 0;
    if (errno != ENOENT) return errno;
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return ENOENT;
    *slash = '\0';
    int err = make_dirs(dir);
    *slash = '/';
    if (err) return err;
    return mkdir(dir, 0777) == 0 || errno == EEXIST ? 0 : errno;
}

/* the directories of path, made (existing ones are fine); 0 or an errno */
static int make_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return ENOENT;
    size_t n = (size_t)(slash - path);
    char *dir = PyMem_RawMalloc(n + 1);
    if (!dir) return ENOMEM;
    memcpy(dir, path, n);
    dir[n] = '\0';
    int err = make_dirs(dir);
    PyMem_RawFree(dir);
    return err;
}

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

/* what one file of the batch needs, held while the GIL is released */
typedef struct {
    PyObject *given;    /* the path as given (for the error) */
    PyObject *encoded;  /* bytes: the path for the system */
    PyObject *data;     /* bytes or str: a reference that keeps bytes alive */
    const char *bytes;
    Py_ssize_t size;
    PyObject *source;   /* bytes: the file to link, or NULL */
    unsigned long long ino;
    long long st_size, mtime_ns;
    int linked;
} Item;

#ifdef __APPLE__
#define ST_MTIM st_mtimespec
#else
#define ST_MTIM st_mtim
#endif

static int same_file(const Item *it) {
    struct stat st;
    if (stat(PyBytes_AS_STRING(it->source), &st) != 0) return 0;
    long long mtime_ns = (long long)st.ST_MTIM.tv_sec * 1000000000LL + (long long)st.ST_MTIM.tv_nsec;
    return (unsigned long long)st.st_ino == it->ino && (long long)st.st_size == it->st_size && mtime_ns == it->mtime_ns;
}

static int hold(Item *it, PyObject *path, PyObject *data, PyObject *link) {
    it->given = Py_NewRef(path);
    if (!PyUnicode_FSConverter(path, &it->encoded)) return -1;
    if (PyBytes_Check(data)) {
        it->bytes = PyBytes_AS_STRING(data);
        it->size = PyBytes_GET_SIZE(data);
    } else if (PyUnicode_Check(data)) {
        it->bytes = PyUnicode_AsUTF8AndSize(data, &it->size);  /* kept inside the str */
        if (!it->bytes) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "write_files: data must be bytes or str, not %.100s", Py_TYPE(data)->tp_name);
        return -1;
    }
    it->data = Py_NewRef(data);
    if (link == NULL || link == Py_None) return 0;
    PyObject *source;
    if (!PyTuple_Check(link) || PyTuple_GET_SIZE(link) != 4) {
        PyErr_SetString(PyExc_TypeError, "write_files: a link is None or (source, st_ino, st_size, st_mtime_ns)");
        return -1;
    }
    if (!PyArg_ParseTuple(link, "OKLL:write_files link", &source, &it->ino, &it->st_size, &it->mtime_ns)) return -1;
    return PyUnicode_FSConverter(source, &it->source) ? 0 : -1;
}

static PyObject *write_files(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *paths, *datas, *links = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!|O:write_files", &PyList_Type, &paths, &PyList_Type, &datas, &links))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(datas) != n || (links != Py_None && (!PyList_Check(links) || PyList_GET_SIZE(links) != n))) {
        PyErr_SetString(PyExc_ValueError, "write_files: one data (and one link, when links are given) per path");
        return NULL;
    }
    /* owned copies: a path's __fspath__ could change the lists while they are read */
    PyObject *own_paths = PyList_AsTuple(paths), *own_datas = PyList_AsTuple(datas);
    PyObject *own_links = links == Py_None ? NULL : PyList_AsTuple(links);
    Item *items = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Item));
    PyObject *result = NULL;
    Py_ssize_t i;
    if (!items) {
        PyErr_NoMemory();
        n = 0;  /* nothing to release below */
        goto done;
    }
    if (!own_paths || !own_datas || (links != Py_None && !own_links)) goto done;
    for (i = 0; i < n; i++) {
        PyObject *link = own_links ? PyTuple_GET_ITEM(own_links, i) : NULL;
        if (hold(&items[i], PyTuple_GET_ITEM(own_paths, i), PyTuple_GET_ITEM(own_datas, i), link) < 0) goto done;
    }
    int err = 0;
    Py_ssize_t failed = -1;
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n && !err; i++) {
        Item *it = &items[i];
        const char *path = PyBytes_AS_STRING(it->encoded);
        if (it->source && same_file(it)) {
            const char *source = PyBytes_AS_STRING(it->source);
            if (link(source, path) == 0 || (errno == ENOENT && make_parent(path) == 0 && link(source, path) == 0)) {
                it->linked = 1;
                continue;
            }
        }
        err = write_one(path, it->bytes, it->size);
        if (err == ENOENT) {  /* its directory is missing: made, or the reason it cannot be */
            int made = make_parent(path);
            err = made ? made : write_one(path, it->bytes, it->size);
        }
        if (err) failed = i;
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, items[failed].given);
        goto done;
    }
    if (!(result = PyList_New(n))) goto done;
    for (i = 0; i < n; i++) PyList_SET_ITEM(result, i, PyBool_FromLong(items[i].linked));
done:
    for (i = 0; i < n; i++) {
        Py_XDECREF(items[i].given);
        Py_XDECREF(items[i].encoded);
        Py_XDECREF(items[i].data);
        Py_XDECREF(items[i].source);
    }
    PyMem_Free(items);
    Py_XDECREF(own_paths);
    Py_XDECREF(own_datas);
    Py_XDECREF(own_links);
    return result;
}

static PyMethodDef methods[] = {
    {"write_files", write_files, METH_VARARGS,
     "write_files(paths, datas, links=None) -> list of bool: create each file with its data, or link it to its "
     "unchanged source, without holding the GIL"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_filebatch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__filebatch(void) { return PyModule_Create(&module); }
