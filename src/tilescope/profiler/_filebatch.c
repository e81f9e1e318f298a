/* Writing a batch of new files without holding the GIL.
 *
 * write_files(paths, datas, links=None, hashed=None, moves=None) -> list
 *
 * creates (or truncates) each path and writes its data, in order, with the GIL released for
 * the whole batch, so that a thread calling it runs beside the exporter's Python work instead
 * of taking the GIL back after every system call. A profile is dozens of files, and on some
 * file systems (network ones, busy virtual disks) creating one costs hundreds of microseconds.
 *
 * paths are file-system paths (str, bytes or os.PathLike); datas bytes or str (written as
 * UTF-8), a tuple of them (written one after the other, with writev: a large file made of
 * parts is never joined into one buffer), or None to create the file if it is missing and
 * leave it as it is (a reservation: where creating a file is slow, its writer later only fills
 * it); links, when given, one None or (source, st_ino, st_size, st_mtime_ns) per path: the path
 * is then a hard link to source when source is still that file (same inode, size and
 * modification time), else it is written. A path's missing directories are made (the
 * profile's own directory and its executables/ and itraces/ are made here, off the exporter's
 * thread, by the first batch). Returns, per path, whether it was linked. The first failure
 * stops the batch and raises OSError with the errno and the path. All lists have one length.
 *
 * A path ending in "/" with a None data is a directory, made with its missing parents.
 *
 * moves, when given, one None or path per path: that file or directory, when it is there, is
 * renamed to the path first, as rename(2) does (a file is then written over); when it cannot
 * be (missing, or a directory onto a non-empty one), the path is made as if there were no
 * move. A directory made ahead of time, files reserved in it, becomes a profile's with one
 * rename where making it costs a creation per directory and file.
 *
 * hashed, when given, one bool per path: the SHA-256 of that file is made here too, without
 * the GIL -- of its data, or, for a None data, of the file as it is (one another writer made:
 * read, never created). The result is then, per path, (linked, size, hex digest) -- size and
 * digest None for a file not hashed. A profile's manifest lists every file's digest; made
 * here, the large files' digests cost the exporter's thread nothing. A linked file cannot be
 * hashed (its digest is known already).
 *
 * start(paths, datas, links=None, hashed=None, moves=None) -> Batch
 *
 * the same, on the module's writer thread -- a POSIX thread that never takes the GIL, so it
 * starts writing at once, whatever the caller's thread does meanwhile (a Python thread would
 * wait for the GIL, up to the interpreter's switch interval, before its first system call).
 * Batches are written one after another, in the order started. Batch.wait() releases the GIL
 * until the batch is written and returns what write_files returns (or raises its error).
 * start_worker() starts the thread ahead of the first batch. A forked child starts its own;
 * its parent's batches that were not written yet fail there with ECANCELED.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/evp.h>

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

/* the directory path and its missing parents; 0 or an errno */
static int make_dir(const char *path) {
    size_t n = strlen(path);
    char *dir = PyMem_RawMalloc(n + 1);
    if (!dir) return ENOMEM;
    memcpy(dir, path, n + 1);
    int err = make_dirs(dir);
    PyMem_RawFree(dir);
    return err;
}

/* parts NULL: the file is created if missing and left as it is (another writer may fill it);
 * else the n parts are written one after the other (writev, IOV_MAX parts at a time) */
static int write_one(const char *path, struct iovec *parts, int n) {
    int fd = open(path, O_WRONLY | O_CREAT | (parts ? O_TRUNC : 0) | O_CLOEXEC, 0666);
    if (fd < 0) return errno;
    while (n > 0 && parts) {
        ssize_t w = writev(fd, parts, n < IOV_MAX ? n : IOV_MAX);
        if (w < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            close(fd);
            return err;
        }
        /* past what was written: whole parts, then into the first one left */
        while (n > 0 && (size_t)w >= parts->iov_len) {
            w -= (ssize_t)parts->iov_len;
            parts++;
            n--;
        }
        if (n > 0) {
            parts->iov_base = (char *)parts->iov_base + w;
            parts->iov_len -= (size_t)w;
        }
    }
    return close(fd) < 0 ? errno : 0;
}

/* what one file of the batch needs, held while the GIL is released */
typedef struct {
    PyObject *given;    /* the path as given (for the error) */
    PyObject *encoded;  /* bytes: the path for the system */
    PyObject *data;     /* bytes, str or a tuple of them: a reference that keeps the parts alive */
    struct iovec *parts;  /* NULL for a reservation; else one, or PyMem-allocated for a tuple */
    struct iovec one;
    int nparts;
    PyObject *source;   /* bytes: the file to link, or NULL */
    unsigned long long ino;
    long long st_size, mtime_ns;
    int linked;
    int hashed;         /* its SHA-256 is made (of its parts, or of the file for a None data) */
    int directory;      /* a directory to make (its path given with a trailing "/") */
    PyObject *moved;    /* bytes: the file or directory renamed to the path first, or NULL */
    long long size;     /* bytes hashed */
    unsigned char digest[32];
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

/* bytes or str (its UTF-8, kept inside the str) as one part to write */
static int part_of(PyObject *data, struct iovec *part) {
    Py_ssize_t size;
    const char *bytes;
    if (PyBytes_Check(data)) {
        bytes = PyBytes_AS_STRING(data);
        size = PyBytes_GET_SIZE(data);
    } else if (PyUnicode_Check(data)) {
        if (!(bytes = PyUnicode_AsUTF8AndSize(data, &size))) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "write_files: data must be bytes, str, a tuple of them or None, not %.100s",
                     Py_TYPE(data)->tp_name);
        return -1;
    }
    part->iov_base = (void *)bytes;
    part->iov_len = (size_t)size;
    return 0;
}

static int hold(Item *it, PyObject *path, PyObject *data, PyObject *link) {
    it->given = Py_NewRef(path);
    if (!PyUnicode_FSConverter(path, &it->encoded)) return -1;
    Py_ssize_t len = PyBytes_GET_SIZE(it->encoded);
    if (data == Py_None && len > 1 && PyBytes_AS_STRING(it->encoded)[len - 1] == '/') {  /* a directory */
        PyObject *bare = PyBytes_FromStringAndSize(PyBytes_AS_STRING(it->encoded), len - 1);
        if (!bare) return -1;
        Py_SETREF(it->encoded, bare);
        it->directory = 1;
    }
    if (data == Py_None) {  /* a reservation: created if missing, never truncated */
        it->parts = NULL;
        it->nparts = 0;
    } else if (PyTuple_Check(data)) {
        Py_ssize_t n = PyTuple_GET_SIZE(data);
        if (n > INT_MAX) {
            PyErr_SetString(PyExc_ValueError, "write_files: too many parts in one file");
            return -1;
        }
        it->parts = PyMem_Calloc((size_t)(n ? n : 1), sizeof(struct iovec));
        if (!it->parts) {
            PyErr_NoMemory();
            return -1;
        }
        it->nparts = (int)n;
        for (Py_ssize_t k = 0; k < n; k++)
            if (part_of(PyTuple_GET_ITEM(data, k), &it->parts[k]) < 0) return -1;
    } else {
        if (part_of(data, &it->one) < 0) return -1;
        it->parts = &it->one;
        it->nparts = 1;
    }
    it->data = Py_NewRef(data);
    if (link == NULL || link == Py_None) return 0;
    if (it->directory) {
        PyErr_Format(PyExc_ValueError, "write_files: %R is a directory: it cannot be linked", path);
        return -1;
    }
    PyObject *source;
    if (!PyTuple_Check(link) || PyTuple_GET_SIZE(link) != 4) {
        PyErr_SetString(PyExc_TypeError, "write_files: a link is None or (source, st_ino, st_size, st_mtime_ns)");
        return -1;
    }
    if (!PyArg_ParseTuple(link, "OKLL:write_files link", &source, &it->ino, &it->st_size, &it->mtime_ns)) return -1;
    return PyUnicode_FSConverter(source, &it->source) ? 0 : -1;
}

/* the SHA-256 of the parts, or of the file at path when parts is NULL; 0 or an errno */
static int hash_item(Item *it, const char *path) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(ctx);
        return ENOMEM;
    }
    int err = 0;
    it->size = 0;
    if (it->parts) {
        for (int k = 0; k < it->nparts && !err; k++) {
            if (!EVP_DigestUpdate(ctx, it->parts[k].iov_base, it->parts[k].iov_len)) err = ENOMEM;
            it->size += (long long)it->parts[k].iov_len;
        }
    } else {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        /* on the stack, small enough for any thread's: a large heap block is a fresh mapping,
         * page faults each time */
        char buf[1 << 15];
        if (fd < 0) err = errno;
        while (!err) {
            ssize_t r = read(fd, buf, sizeof buf);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) err = errno;
            else if (r == 0) break;
            else if (!EVP_DigestUpdate(ctx, buf, (size_t)r)) err = ENOMEM;
            else it->size += r;
        }
        if (fd >= 0) close(fd);
    }
    if (!err && !EVP_DigestFinal_ex(ctx, it->digest, NULL)) err = ENOMEM;
    EVP_MD_CTX_free(ctx);
    return err;
}

/* every item written (or linked) in order, without the GIL; 0, or the errno of the first
 * failure and its index in *failed */
static int write_items(Item *items, Py_ssize_t n, Py_ssize_t *failed) {
    int err = 0;
    *failed = -1;
    for (Py_ssize_t i = 0; i < n && !err; i++) {
        Item *it = &items[i];
        const char *path = PyBytes_AS_STRING(it->encoded);
        /* taken over when it is there; else (missing, the path there already) made below */
        int moved = it->moved && rename(PyBytes_AS_STRING(it->moved), path) == 0;
        if (it->directory) {
            if (!moved && (err = make_dir(path)) != 0) *failed = i;
            continue;
        }
        if (it->hashed) {  /* before writing: a partial write moves the parts */
            if ((err = hash_item(it, path)) != 0) {
                *failed = i;
                break;
            }
            if (!it->parts) continue;  /* a file as another writer made it: read only */
        }
        if (it->source && same_file(it)) {
            const char *source = PyBytes_AS_STRING(it->source);
            if (link(source, path) == 0 || (errno == ENOENT && make_parent(path) == 0 && link(source, path) == 0)) {
                it->linked = 1;
                continue;
            }
        }
        err = write_one(path, it->parts, it->nparts);
        if (err == ENOENT) {  /* its directory is missing: made, or the reason it cannot be */
            int made = make_parent(path);
            err = made ? made : write_one(path, it->parts, it->nparts);
        }
        if (err) *failed = i;
    }
    return err;
}

/* one item's result with digests: (linked, size, hex digest or None) */
static PyObject *digest_result(const Item *it) {
    if (!it->hashed) return Py_BuildValue("(OOO)", it->linked ? Py_True : Py_False, Py_None, Py_None);
    static const char hex[] = "0123456789abcdef";
    char text[64];
    for (int k = 0; k < 32; k++) {
        text[2 * k] = hex[it->digest[k] >> 4];
        text[2 * k + 1] = hex[it->digest[k] & 15];
    }
    return Py_BuildValue("(OLs#)", it->linked ? Py_True : Py_False, it->size, text, (Py_ssize_t)64);
}

/* with the GIL: per item its linked flag -- or, with digests, digest_result -- or NULL with
 * OSError set */
static PyObject *batch_result(const Item *items, Py_ssize_t n, int err, Py_ssize_t failed, int digests) {
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, failed >= 0 ? items[failed].given : NULL);
    }
    PyObject *result = PyList_New(n);
    if (!result) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = digests ? digest_result(&items[i]) : PyBool_FromLong(items[i].linked);
        if (!r) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, r);
    }
    return result;
}

static void release_items(Item *items, Py_ssize_t n) {
    if (!items) return;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(items[i].given);
        Py_XDECREF(items[i].encoded);
        Py_XDECREF(items[i].data);
        Py_XDECREF(items[i].source);
        Py_XDECREF(items[i].moved);
        if (items[i].parts != &items[i].one) PyMem_Free(items[i].parts);
    }
    PyMem_Free(items);
}

/* the batch's items, every object held (NULL with an error set); *count: how many */
static Item *collect_items(PyObject *args, const char *fmt, Py_ssize_t *count, int *digests) {
    PyObject *paths, *datas, *links = Py_None, *hashed = Py_None, *moves = Py_None;
    if (!PyArg_ParseTuple(args, fmt, &PyList_Type, &paths, &PyList_Type, &datas, &links, &hashed, &moves))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(datas) != n || (links != Py_None && (!PyList_Check(links) || PyList_GET_SIZE(links) != n)) ||
        (hashed != Py_None && (!PyList_Check(hashed) || PyList_GET_SIZE(hashed) != n)) ||
        (moves != Py_None && (!PyList_Check(moves) || PyList_GET_SIZE(moves) != n))) {
        PyErr_Format(PyExc_ValueError, "write_files: one data (and one link, hashed flag, move, when given) per "
                     "path: %zd paths", n);
        return NULL;
    }
    *digests = hashed != Py_None;
    /* owned copies: a path's __fspath__ could change the lists while they are read */
    PyObject *own_paths = PyList_AsTuple(paths), *own_datas = PyList_AsTuple(datas);
    PyObject *own_links = links == Py_None ? NULL : PyList_AsTuple(links);
    Item *items = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Item));
    int ok = items && own_paths && own_datas && (links == Py_None || own_links);
    if (!items) PyErr_NoMemory();
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *link = own_links ? PyTuple_GET_ITEM(own_links, i) : NULL;
        ok = hold(&items[i], PyTuple_GET_ITEM(own_paths, i), PyTuple_GET_ITEM(own_datas, i), link) == 0;
        if (ok && hashed != Py_None) {
            int h = PyObject_IsTrue(PyList_GET_ITEM(hashed, i));  /* (a bool: cannot run Python code) */
            ok = h >= 0;
            if (h > 0 && items[i].source) {
                PyErr_Format(PyExc_ValueError, "write_files: %R is linked to a source and hashed: give its digest "
                             "instead of asking for it", items[i].given);
                ok = 0;
            }
            items[i].hashed = h > 0;
        }
        if (ok && moves != Py_None) {
            PyObject *move = PyList_GET_ITEM(moves, i);
            if (move != Py_None) ok = PyUnicode_FSConverter(move, &items[i].moved) != 0;
        }
        if (ok && items[i].directory && items[i].hashed) {
            PyErr_Format(PyExc_ValueError, "write_files: %R is a directory: it cannot be hashed", items[i].given);
            ok = 0;
        }
    }
    Py_XDECREF(own_paths);
    Py_XDECREF(own_datas);
    Py_XDECREF(own_links);
    if (!ok) {
        release_items(items, n);
        return NULL;
    }
    *count = n;
    return items;
}

static PyObject *write_files(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t n, failed;
    int digests = 0;
    Item *items = collect_items(args, "O!O!|OOO:write_files", &n, &digests);
    if (!items) return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = write_items(items, n, &failed);
    Py_END_ALLOW_THREADS
    PyObject *result = batch_result(items, n, err, failed, digests);
    release_items(items, n);
    return result;
}

/* ---- the writer thread ------------------------------------------------------------------ */

typedef struct BatchObject {
    PyObject_HEAD
    Item *items;
    Py_ssize_t n, failed;
    int err;
    int digests;               /* its result has each item's digest */
    int done;                  /* written (or failed); guarded by the queue's mutex */
    int queued;                /* the queue's reference not yet given back (by wait) */
    struct BatchObject *next;  /* the queue */
} BatchObject;

static pthread_mutex_t queue_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_work = PTHREAD_COND_INITIALIZER;  /* a batch was queued */
static pthread_cond_t queue_done = PTHREAD_COND_INITIALIZER;  /* a batch was written */
static BatchObject *queue_head, *queue_tail, *queue_current;
static int worker_started;

/* the thread: takes no Python object but the items' immutable bytes, held by their batch */
static void *worker(void *unused) {
    (void)unused;
    pthread_mutex_lock(&queue_mutex);
    for (;;) {
        while (!queue_head) pthread_cond_wait(&queue_work, &queue_mutex);
        BatchObject *b = queue_head;
        queue_head = b->next;
        if (!queue_head) queue_tail = NULL;
        queue_current = b;
        pthread_mutex_unlock(&queue_mutex);
        Py_ssize_t failed;
        int err = write_items(b->items, b->n, &failed);
        pthread_mutex_lock(&queue_mutex);
        b->err = err;
        b->failed = failed;
        b->done = 1;
        queue_current = NULL;
        pthread_cond_broadcast(&queue_done);
    }
    return NULL;
}

/* with the queue's mutex held; 0 or an errno */
static int ensure_worker(void) {
    if (worker_started) return 0;
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&thread, &attr, worker, NULL);
    pthread_attr_destroy(&attr);
    if (!err) worker_started = 1;
    return err;
}

static void cancel(BatchObject *b) {
    b->err = ECANCELED;
    b->failed = -1;
    b->done = 1;
}

/* in a forked child: the thread is gone, the mutex may be held by it; what it had not
 * written is not written here */
static void after_fork_in_child(void) {
    pthread_mutex_init(&queue_mutex, NULL);
    pthread_cond_init(&queue_work, NULL);
    pthread_cond_init(&queue_done, NULL);
    if (queue_current) cancel(queue_current);
    for (BatchObject *b = queue_head; b; b = b->next) cancel(b);
    queue_head = queue_tail = queue_current = NULL;
    worker_started = 0;
}

static PyObject *batch_wait(BatchObject *self, PyObject *Py_UNUSED(ignored)) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&queue_mutex);
    while (!self->done) pthread_cond_wait(&queue_done, &queue_mutex);
    pthread_mutex_unlock(&queue_mutex);
    Py_END_ALLOW_THREADS
    PyObject *result = batch_result(self->items, self->n, self->err, self->failed, self->digests);
    if (self->queued) {  /* the queue is done with it */
        self->queued = 0;
        Py_DECREF(self);
    }
    return result;
}

static void batch_dealloc(BatchObject *self) {
    release_items(self->items, self->n);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef batch_methods[] = {
    {"wait", (PyCFunction)batch_wait, METH_NOARGS,
     "wait() -> list: block (the GIL released) until the batch is written; per path, whether it was linked "
     "(with hashed flags: (linked, size, hex digest or None)). Raises the batch's OSError."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tilescope.profiler._filebatch.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch of files being written by the writer thread (see start).",
    .tp_methods = batch_methods,
};

static PyObject *start(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t n;
    int digests = 0;
    Item *items = collect_items(args, "O!O!|OOO:start", &n, &digests);
    if (!items) return NULL;
    BatchObject *b = PyObject_New(BatchObject, &BatchType);
    if (!b) {
        release_items(items, n);
        return NULL;
    }
    b->items = items;
    b->n = n;
    b->digests = digests;
    b->failed = -1;
    b->err = 0;
    b->done = 0;
    b->next = NULL;
    b->queued = 1;
    Py_INCREF(b);  /* the queue's reference, given back by wait() */
    pthread_mutex_lock(&queue_mutex);
    int err = ensure_worker();
    if (!err) {
        if (queue_tail) queue_tail->next = b;
        else queue_head = b;
        queue_tail = b;
        pthread_cond_signal(&queue_work);
    }
    pthread_mutex_unlock(&queue_mutex);
    if (err) {
        b->queued = 0;
        Py_DECREF(b);
        Py_DECREF(b);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return (PyObject *)b;
}

static PyObject *start_worker(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(ignored)) {
    pthread_mutex_lock(&queue_mutex);
    int err = ensure_worker();
    pthread_mutex_unlock(&queue_mutex);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"write_files", write_files, METH_VARARGS,
     "write_files(paths, datas, links=None, hashed=None, moves=None) -> list: create each file with its data "
     "(or directory), or link it to its unchanged source, or take it over from a move, and make the SHA-256 of "
     "those hashed, without holding the GIL"},
    {"start", start, METH_VARARGS,
     "start(paths, datas, links=None, hashed=None, moves=None) -> Batch: the same, on the writer thread "
     "(Batch.wait() for the result)"},
    {"start_worker", start_worker, METH_NOARGS, "start_worker(): start the writer thread now (it starts with the "
     "first batch otherwise)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_filebatch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__filebatch(void) {
    if (PyType_Ready(&BatchType) < 0) return NULL;
    pthread_atfork(NULL, NULL, after_fork_in_child);
    return PyModule_Create(&module);
}
