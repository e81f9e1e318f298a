/* Chrome/Kineto trace events -> Parquet column pages, in one pass of C.
 *
 * scan(buf, final) parses the elements of a 'traceEvents' array, starting where an element
 * is expected (just after '[' or ','), and returns for the complete ones the bodies of one
 * Parquet data page per column (PLAIN values, RLE/bit-packed definition levels), ready for
 * tilescope.trace._parquet to frame. Python keeps the bytes it did not consume and calls
 * again with more. Every byte of an element is validated as JSON; an element that is not a
 * JSON object is counted as bad and skipped (its extent is found by bracket counting, as the
 * pure-Python scanner does), never guessed at.
 *
 * Columns (the order of tilescope.trace._schema.NATIVE_COLUMNS):
 *   ph cat name pid tid  VARCHAR   a JSON string's value; a number's text; an object/array
 *                                  minified; JSON null -> NULL
 *   ts_ns dur_ns         BIGINT    microseconds -> integer nanoseconds, exactly from the decimal
 *                                  text (rounded as floor(x * 1000 + 0.5)); NaN and
 *                                  Infinity (Python's json writes them) -> NULL
 *   id bp s              VARCHAR
 *   args                 JSON      the value minified (strings verbatim)
 *   correlation external_id stream device flow_id
 *                        BIGINT    args.correlation, args."External id", ...: an integer JSON
 *                                  number, or a string holding one (-?[0-9]+), within int64;
 *                                  anything else (fractions, exponents, booleans) -> NULL
 *   program_hash         VARCHAR   args.program_hash when it is a string
 * (the typed args columns as tilescope.trace._schema.ARG_COLUMNS defines them; the first of
 * duplicate keys counts, for the event's fields and its args alike, as in the DuckDB path, and
 * a key is matched as written, without unescaping it). Nesting has no depth limit.
 * A record without 'ph' gets 'X' if it has a duration, else 'i' if it has a time.
 *
 * Beside the pages, the five string columns come dictionary-encoded (one int32 code per row,
 * -1 for NULL, into the batch's distinct values in order of first use), and the 'M' records
 * that name processes and threads come with their args: the nesting's input (ph, cat, name,
 * lane) as arrays, with no Python object per row (tilescope.trace._rawcols).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

enum { F_PH, F_CAT, F_NAME, F_PID, F_TID, F_TS, F_DUR, F_ID, F_BP, F_S, F_ARGS,
       A_CORR, A_EXT, A_STREAM, A_DEVICE, A_FLOW, A_HASH, NF };
enum { N_CODED = F_TID + 1 };  /* ph cat name pid tid: the dictionary-encoded columns */
static const int IS_INT[NF] = {0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0};
enum { K_ABSENT, K_STRING, K_NUMBER, K_TRUE, K_FALSE, K_NULL, K_NESTED };

typedef struct { char *p; size_t len, cap; } Buf;

static int buf_grow(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}
static inline int buf_put(Buf *b, const void *s, size_t n) {
    if (!n) return 0;
    if (buf_grow(b, n)) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}
static inline int buf_byte(Buf *b, char c) { return buf_put(b, &c, 1); }

typedef struct {
    Buf values, valid;   /* valid: one bit per row, LSB first (= the definition levels) */
    int64_t nulls, min, max;
    int has_minmax;
} Column;

typedef struct { const char *s; size_t n; int kind; int esc; } Span;

/* ---- dictionary codes of a string column (per batch) ---------------------------------------- */
/* The distinct values are the column's own page bytes: a slot holds the offset of a value's
   length prefix in ``values`` (which may move when it grows, so no pointers are kept). */
typedef struct {
    uint32_t *slot;      /* offset + 1 of a distinct value's prefix; 0: empty */
    int32_t *code_of;    /* per slot: its code */
    size_t cap, n;       /* slots (a power of two), distinct values */
    Buf firsts;          /* uint32 prefix offset per code, in code order */
    Buf codes;           /* int32 per row */
    uint32_t last;       /* the previous row's value: offset + 1 (0: none), and its code */
    int32_t last_code;   /* (neighbouring events often share their category, process, thread) */
} Dict;

/* eight bytes at a time (names are often hundreds of bytes long: a kernel's signature) */
static inline uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

static int dict_grow(Dict *d, const Buf *values) {
    size_t cap = d->cap ? d->cap * 2 : 256;
    uint32_t *slot = calloc(cap, sizeof *slot);
    int32_t *code_of = malloc(cap * sizeof *code_of);
    if (!slot || !code_of) { free(slot); free(code_of); return -1; }
    for (size_t i = 0; i < d->cap; i++) {
        if (!d->slot[i]) continue;
        uint32_t off = d->slot[i] - 1, n;
        memcpy(&n, values->p + off, 4);
        size_t j = hash_bytes(values->p + off + 4, n) & (cap - 1);
        while (slot[j]) j = (j + 1) & (cap - 1);
        slot[j] = d->slot[i];
        code_of[j] = d->code_of[i];
    }
    free(d->slot);
    free(d->code_of);
    d->slot = slot;
    d->code_of = code_of;
    d->cap = cap;
    return 0;
}

/* The code of the value just appended to ``values`` at prefix offset ``at`` (-1: NULL). */
static int dict_put(Dict *d, const Buf *values, int is_null, size_t at) {
    int32_t code = -1;
    if (!is_null) {
        if (at > UINT32_MAX - 1) return -1;  /* a page body past 4 GiB: the caller's blocks are far smaller */
        if ((d->n + 1) * 2 > d->cap && dict_grow(d, values)) return -1;
        uint32_t n, m;
        memcpy(&n, values->p + at, 4);
        const char *v = values->p + at + 4;
        if (d->last) {
            memcpy(&m, values->p + d->last - 1, 4);
            if (m == n && !memcmp(values->p + d->last + 3, v, n)) {
                d->last = (uint32_t)at + 1;
                return buf_put(&d->codes, &d->last_code, 4);
            }
        }
        size_t j = hash_bytes(v, n) & (d->cap - 1);
        for (;;) {
            if (!d->slot[j]) {
                uint32_t off = (uint32_t)at;
                code = (int32_t)d->n++;
                d->slot[j] = off + 1;
                d->code_of[j] = code;
                if (buf_put(&d->firsts, &off, 4)) return -1;
                break;
            }
            uint32_t off = d->slot[j] - 1;
            memcpy(&m, values->p + off, 4);
            if (m == n && !memcmp(values->p + off + 4, v, n)) { code = d->code_of[j]; break; }
            j = (j + 1) & (d->cap - 1);
        }
        d->last = (uint32_t)at + 1;
        d->last_code = code;
    }
    return buf_put(&d->codes, &code, 4);
}

static void dict_free(Dict *d) {
    free(d->slot);
    free(d->code_of);
    free(d->firsts.p);
    free(d->codes.p);
}

/* The (name, pid, tid) code triples seen in a batch: a trace can repeat its naming 'M' records
   by the 100,000, and only the first of each triple is handed over. */
typedef struct { uint32_t *slot; int32_t *keys; size_t cap, n; } TripleSet;

static inline size_t triple_hash(const int32_t *k, size_t cap) {
    uint64_t h = ((uint64_t)(uint32_t)k[0] << 32 | (uint32_t)k[1]) * 0x9E3779B97F4A7C15ULL ^ (uint32_t)k[2];
    h *= 0xC4CEB9FE1A85EC53ULL;
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

/* 1 if the triple is new (now added), 0 if seen, -1 out of memory. */
static int triple_add(TripleSet *t, const int32_t k[3]) {
    if ((t->n + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        uint32_t *slot = calloc(cap, sizeof *slot);
        int32_t *keys = realloc(t->keys, cap / 2 * 3 * sizeof *keys);
        if (!slot || !keys) { free(slot); if (keys) t->keys = keys; return -1; }
        t->keys = keys;
        for (size_t i = 0; i < t->n; i++) {
            size_t j = triple_hash(keys + 3 * i, cap);
            while (slot[j]) j = (j + 1) & (cap - 1);
            slot[j] = (uint32_t)i + 1;
        }
        free(t->slot);
        t->slot = slot;
        t->cap = cap;
    }
    size_t j = triple_hash(k, t->cap);
    while (t->slot[j]) {
        const int32_t *o = t->keys + 3 * (t->slot[j] - 1);
        if (o[0] == k[0] && o[1] == k[1] && o[2] == k[2]) return 0;
        j = (j + 1) & (t->cap - 1);
    }
    memcpy(t->keys + 3 * t->n, k, 3 * sizeof *k);
    t->slot[j] = (uint32_t)++t->n;
    return 1;
}

/* (codes as bytes, distinct values as a tuple of str) */
static PyObject *dict_result(const Dict *d, const Buf *values) {
    PyObject *vals = PyTuple_New((Py_ssize_t)d->n);
    if (!vals) return NULL;
    for (size_t i = 0; i < d->n; i++) {
        uint32_t off, n;
        memcpy(&off, d->firsts.p + 4 * i, 4);
        memcpy(&n, values->p + off, 4);
        PyObject *v = PyUnicode_DecodeUTF8(values->p + off + 4, (Py_ssize_t)n, "replace");
        if (!v) { Py_DECREF(vals); return NULL; }
        PyTuple_SET_ITEM(vals, (Py_ssize_t)i, v);
    }
    return Py_BuildValue("(y#N)", d->codes.p ? d->codes.p : "", (Py_ssize_t)d->codes.len, vals);
}

/* byte classes, so that the hot loops skip runs of ordinary bytes with one table lookup each */
enum { C_WS = 1, C_STR = 2, C_STRUCT = 4 };
static unsigned char CLS[256];

static void init_classes(void) {
    CLS[' '] = CLS['\n'] = CLS['\r'] = CLS['\t'] = C_WS;
    for (int c = 0; c < 0x20; c++) CLS[c] |= C_STR;
    CLS['"'] |= C_STR | C_STRUCT;
    CLS['\\'] |= C_STR;
    CLS['{'] |= C_STRUCT; CLS['}'] |= C_STRUCT; CLS['['] |= C_STRUCT; CLS[']'] |= C_STRUCT; CLS[','] |= C_STRUCT;
}

static inline const char *skip_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* ---- validation ------------------------------------------------------------------------- */
static inline int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* *pp at the opening quote; on success *pp after the closing quote. Raw control characters
   are tolerated (real traces contain them); they are escaped when a value is kept as JSON. */
static int parse_string(const char **pp, const char *e, int *esc) {
    const char *p = *pp + 1;
    *esc = 0;
    while (p < e) {
        while (p < e && !(CLS[(unsigned char)*p] & C_STR)) p++;
        if (p >= e) break;
        char c = *p;
        if (c == '"') { *pp = p + 1; return 0; }
        if (c == '\\') {
            *esc = 1;
            if (p + 1 >= e) return -1;
            char d = p[1];
            if (d == 'u') {
                if (p + 6 > e) return -1;
                for (int i = 2; i < 6; i++) if (hexval(p[i]) < 0) return -1;
                p += 6;
            } else if (d == '"' || d == '\\' || d == '/' || d == 'b' || d == 'f' || d == 'n' || d == 'r' || d == 't') {
                p += 2;
            } else {
                return -1;
            }
        } else {
            if ((unsigned char)c < 0x20) *esc = 1;
            p++;
        }
    }
    return -1;
}

/* The non-finite tokens Python's json module writes and reads (allow_nan), as DuckDB's reader
   accepts them too: kept as numbers, so an args value keeps its text and a time is NULL. */
static const char *const NONFINITE[] = {"NaN", "Infinity", "-Infinity"};

static int parse_nonfinite(const char **pp, const char *e) {
    for (size_t i = 0; i < sizeof NONFINITE / sizeof *NONFINITE; i++) {
        size_t n = strlen(NONFINITE[i]);
        if ((size_t)(e - *pp) >= n && !memcmp(*pp, NONFINITE[i], n)) { *pp += n; return 0; }
    }
    return -1;
}

static int parse_number(const char **pp, const char *e) {
    const char *p = *pp;
    if (p < e && *p == '-') p++;
    if (p >= e) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < e && *p >= '0' && *p <= '9') p++; }
    else return parse_nonfinite(pp, e);
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') return -1;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return -1;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    *pp = p;
    return 0;
}

/* A scalar at *pp (string, literal or number): its kind, or -1. */
static int parse_scalar(const char **pp, const char *e, int *esc) {
    const char *p = *pp;
    int kind;
    *esc = 0;
    switch (*p) {
    case '"':
        if (parse_string(&p, e, esc)) return -1;
        kind = K_STRING;
        break;
    case 't':
        if (e - p < 4 || memcmp(p, "true", 4)) return -1;
        p += 4; kind = K_TRUE; break;
    case 'f':
        if (e - p < 5 || memcmp(p, "false", 5)) return -1;
        p += 5; kind = K_FALSE; break;
    case 'n':
        if (e - p < 4 || memcmp(p, "null", 4)) return -1;
        p += 4; kind = K_NULL; break;
    default:
        if (parse_number(&p, e)) return -1;
        kind = K_NUMBER;
    }
    *pp = p;
    return kind;
}

/* An object or array at *pp, validated without recursion, so any depth is read (as by the
   DuckDB path) with a constant C stack: one byte per open level says object or array. */
static int parse_container(const char **pp, const char *e) {
    unsigned char local[256], *open = local, *grown = NULL;
    size_t depth = 0, cap = sizeof local;
    const char *p = *pp;
    int rc = -1, esc;
    for (;;) {
        /* a value starts at p */
        if (p >= e) goto out;
        if (*p == '{' || *p == '[') {
            if (depth == cap) {
                unsigned char *bigger = malloc(cap * 2);
                if (!bigger) goto out;
                memcpy(bigger, open, cap);
                free(grown);
                open = grown = bigger;
                cap *= 2;
            }
            open[depth++] = *p == '{';
            p = skip_ws(p + 1, e);
            if (p < e && *p == (open[depth - 1] ? '}' : ']')) { p++; depth--; goto after_value; }
            goto member;
        }
        if (parse_scalar(&p, e, &esc) < 0) goto out;
    after_value:
        if (depth == 0) { *pp = p; rc = 0; goto out; }
        p = skip_ws(p, e);
        if (p >= e) goto out;
        if (*p == (open[depth - 1] ? '}' : ']')) { p++; depth--; goto after_value; }
        if (*p != ',') goto out;
        p = skip_ws(p + 1, e);
    member:
        if (open[depth - 1]) {  /* "key": */
            if (p >= e || *p != '"' || parse_string(&p, e, &esc)) goto out;
            p = skip_ws(p, e);
            if (p >= e || *p != ':') goto out;
            p = skip_ws(p + 1, e);
        }
    }
out:
    free(grown);
    return rc;
}

static int parse_value(const char **pp, const char *e, Span *out) {
    const char *p = *pp, *s = p;
    int kind, esc = 0;
    if (p >= e) return -1;
    if (*p == '{' || *p == '[') {
        if (parse_container(&p, e)) return -1;
        kind = K_NESTED;
    } else if ((kind = parse_scalar(&p, e, &esc)) < 0) {
        return -1;
    }
    if (out) {
        out->kind = kind;
        out->esc = esc;
        if (kind == K_STRING) { out->s = s + 1; out->n = (size_t)(p - s - 2); }
        else { out->s = s; out->n = (size_t)(p - s); }
    }
    *pp = p;
    return 0;
}

static int field_of(const char *k, size_t n) {
    switch (n) {
    case 1: if (k[0] == 's') return F_S; break;
    case 2:
        if (!memcmp(k, "ph", 2)) return F_PH;
        if (!memcmp(k, "ts", 2)) return F_TS;
        if (!memcmp(k, "id", 2)) return F_ID;
        if (!memcmp(k, "bp", 2)) return F_BP;
        break;
    case 3:
        if (!memcmp(k, "cat", 3)) return F_CAT;
        if (!memcmp(k, "pid", 3)) return F_PID;
        if (!memcmp(k, "tid", 3)) return F_TID;
        if (!memcmp(k, "dur", 3)) return F_DUR;
        break;
    case 4:
        if (!memcmp(k, "name", 4)) return F_NAME;
        if (!memcmp(k, "args", 4)) return F_ARGS;
        break;
    }
    return -1;
}

/* One event object starting at p (after whitespace); fills the known fields and sets *end
   just past its closing brace. -1 if it is not a valid JSON object or the buffer ends first. */
static int parse_event(const char *p, const char *e, Span *f, const char **end) {
    for (int i = 0; i < NF; i++) f[i].kind = K_ABSENT;
    if (p >= e || *p != '{') return -1;
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}') { *end = p + 1; return 0; }
    for (;;) {
        int esc;
        const char *k = p + 1;
        if (p >= e || *p != '"' || parse_string(&p, e, &esc)) return -1;
        int which = esc ? -1 : field_of(k, (size_t)(p - k - 1));
        p = skip_ws(p, e);
        if (p >= e || *p != ':') return -1;
        p = skip_ws(p + 1, e);
        Span v;
        if (parse_value(&p, e, which >= 0 ? &v : NULL)) return -1;
        if (which >= 0 && f[which].kind == K_ABSENT) f[which] = v;  /* the first of duplicates */
        p = skip_ws(p, e);
        if (p >= e) return -1;
        if (*p == ',') { p = skip_ws(p + 1, e); continue; }
        if (*p == '}') { *end = p + 1; return 0; }
        return -1;
    }
}

/* Which typed column an args key feeds (-1: none). */
static int arg_of(const char *k, size_t n) {
    switch (n) {
    case 6:
        if (!memcmp(k, "stream", 6)) return A_STREAM;
        if (!memcmp(k, "device", 6)) return A_DEVICE;
        break;
    case 7: if (!memcmp(k, "flow_id", 7)) return A_FLOW; break;
    case 11:
        if (!memcmp(k, "correlation", 11)) return A_CORR;
        if (!memcmp(k, "External id", 11)) return A_EXT;
        break;
    case 12: if (!memcmp(k, "program_hash", 12)) return A_HASH; break;
    }
    return -1;
}

/* The args members that become typed columns: fills f[A_*] from the object at f[F_ARGS]. */
static void args_members(Span *f) {
    for (int i = A_CORR; i < NF; i++) f[i].kind = K_ABSENT;
    const Span *a = &f[F_ARGS];
    if (a->kind != K_NESTED || *a->s != '{') return;
    const char *p = skip_ws(a->s + 1, a->s + a->n), *e = a->s + a->n;  /* validated by parse_event */
    while (p < e && *p == '"') {
        int esc;
        const char *k = p + 1;
        if (parse_string(&p, e, &esc)) return;
        int which = esc ? -1 : arg_of(k, (size_t)(p - k - 1));
        p = skip_ws(p, e);
        p = skip_ws(p + 1, e);  /* the ':' */
        Span v;
        if (parse_value(&p, e, &v)) return;
        if (which >= 0 && f[which].kind == K_ABSENT) f[which] = v;  /* the first of duplicates */
        p = skip_ws(p, e);
        if (p < e && *p == ',') p = skip_ws(p + 1, e);
    }
}

/* ---- values -------------------------------------------------------------------------------- */
static int put_utf8(Buf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) { t[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    return buf_put(b, t, n);
}

static uint32_t hex4(const char *p) {
    return (uint32_t)(hexval(p[0]) << 12 | hexval(p[1]) << 8 | hexval(p[2]) << 4 | hexval(p[3]));
}

/* The decoded text of a validated JSON string body (lone surrogates become U+FFFD). */
static int put_unescaped(Buf *b, const char *s, size_t n) {
    const char *e = s + n;
    while (s < e) {
        const char *q = memchr(s, '\\', (size_t)(e - s));
        if (!q) return buf_put(b, s, (size_t)(e - s));
        if (buf_put(b, s, (size_t)(q - s))) return -1;
        char d = q[1];
        s = q + 2;
        int r = 0;
        switch (d) {
        case 'b': r = buf_byte(b, '\b'); break;
        case 'f': r = buf_byte(b, '\f'); break;
        case 'n': r = buf_byte(b, '\n'); break;
        case 'r': r = buf_byte(b, '\r'); break;
        case 't': r = buf_byte(b, '\t'); break;
        case 'u': {
            uint32_t cp = hex4(s);
            s += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {
                if (e - s >= 6 && s[0] == '\\' && s[1] == 'u') {
                    uint32_t lo = hex4(s + 2);
                    if (lo >= 0xDC00 && lo < 0xE000) { cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00); s += 6; }
                    else cp = 0xFFFD;
                } else cp = 0xFFFD;
            } else if (cp >= 0xDC00 && cp < 0xE000) cp = 0xFFFD;
            r = put_utf8(b, cp);
            break;
        }
        default: r = buf_byte(b, d);  /* " \ / */
        }
        if (r) return -1;
    }
    return 0;
}

/* JSON text without the whitespace between tokens; raw control characters in strings escaped. */
static int put_minified(Buf *b, const char *s, size_t n) {
    const char *e = s + n;
    if (buf_grow(b, n)) return -1;
    char *o = b->p + b->len;
    int in_str = 0;
    while (s < e) {
        unsigned char c = (unsigned char)*s++;
        if (!in_str) {
            if (CLS[c] & C_WS) continue;
            in_str = c == '"';
            *o++ = (char)c;
        } else if (c >= 0x20) {
            *o++ = (char)c;
            if (c == '"') in_str = 0;
            else if (c == '\\' && s < e) *o++ = *s++;
        } else {  /* a raw control character: 6 bytes where 1 was reserved */
            b->len = (size_t)(o - b->p);
            if (buf_grow(b, 5 + (size_t)(e - s) + 1)) return -1;
            o = b->p + b->len;
            snprintf(o, 7, "\\u%04x", c);
            o += 6;
        }
    }
    b->len = (size_t)(o - b->p);
    return 0;
}

/* Microseconds as JSON number text -> nanoseconds. 0 on success, -2 for a number whose
   nanoseconds do not fit int64 (|x| beyond ~9.2e15 us, ~292 years), -1 otherwise. */
static int us_to_ns(const char *s, size_t n, int64_t *out) {
    const char *p = s, *e = s + n;
    int neg = 0;
    if (p < e && *p == '-') { neg = 1; p++; }
    if (p >= e || *p < '0' || *p > '9') return -1;  /* NaN, Infinity: no time */
    if (memchr(s, 'e', n) || memchr(s, 'E', n)) {
        char tmp[64];
        if (n >= sizeof tmp) return -1;
        memcpy(tmp, s, n);
        tmp[n] = 0;
        double ns = floor(strtod(tmp, NULL) * 1000.0 + 0.5);
        if (!isfinite(ns) || fabs(ns) > 9.2e18) return -2;
        *out = (int64_t)ns;
        return 0;
    }
    uint64_t ip = 0;
    while (p < e && *p >= '0' && *p <= '9') {
        if (ip > 9200000000000000ULL / 10) return -2;  /* beyond int64 nanoseconds */
        ip = ip * 10 + (uint64_t)(*p++ - '0');
    }
    uint64_t frac = 0;
    int digits = 0, d4 = 0, rest = 0;  /* the 4th decimal and whether any later one is non-zero */
    if (p < e && *p == '.') {
        p++;
        while (p < e && *p >= '0' && *p <= '9') {
            if (digits < 3) frac = frac * 10 + (uint64_t)(*p - '0');
            else if (digits == 3) d4 = *p - '0';
            else if (*p != '0') rest = 1;
            digits++;
            p++;
        }
    }
    for (int d = digits; d < 3; d++) frac *= 10;
    uint64_t ns = ip * 1000 + frac;
    if (ns > (uint64_t)INT64_MAX - 1) return -2;
    /* floor(x * 1000 + 0.5): halves go up, i.e. away from zero above it, towards it below */
    if (!neg ? d4 >= 5 : (d4 > 5 || (d4 == 5 && rest))) ns += 1;
    *out = neg ? -(int64_t)ns : (int64_t)ns;
    return 0;
}

static inline void set_valid(Column *c, int64_t row, int ok) {
    if (ok) c->valid.p[row >> 3] |= (char)(1u << (row & 7));
    else c->nulls++;
}

/* Append one row's value to a string column. */
static int put_text(Column *c, int64_t row, const Span *v, const char *fallback) {
    Buf *b = &c->values;
    if (v->kind == K_ABSENT || v->kind == K_NULL) {
        if (!fallback) { set_valid(c, row, 0); return 0; }
        uint32_t n = (uint32_t)strlen(fallback);
        if (buf_put(b, &n, 4) || buf_put(b, fallback, n)) return -1;
        set_valid(c, row, 1);
        return 0;
    }
    size_t at = b->len;
    uint32_t n = 0;
    if (buf_put(b, &n, 4)) return -1;
    int r;
    if (v->kind == K_STRING) r = v->esc ? put_unescaped(b, v->s, v->n) : buf_put(b, v->s, v->n);
    else if (v->kind == K_NESTED) r = put_minified(b, v->s, v->n);
    else r = buf_put(b, v->s, v->n);
    if (r) return -1;
    n = (uint32_t)(b->len - at - 4);
    memcpy(b->p + at, &n, 4);
    set_valid(c, row, 1);
    return 0;
}

static int put_json(Column *c, int64_t row, const Span *v) {
    if (v->kind == K_ABSENT || v->kind == K_NULL) { set_valid(c, row, 0); return 0; }
    Buf *b = &c->values;
    size_t at = b->len;
    uint32_t n = 0;
    if (buf_put(b, &n, 4)) return -1;
    if (v->kind == K_STRING) {
        Span q = *v;
        q.s -= 1; q.n += 2;  /* with its quotes */
        if (put_minified(b, q.s, q.n)) return -1;
    } else if (put_minified(b, v->s, v->n)) return -1;
    n = (uint32_t)(b->len - at - 4);
    memcpy(b->p + at, &n, 4);
    set_valid(c, row, 1);
    return 0;
}

/* A time field: a number, or a string holding one. */
static int time_of(const Span *v, int64_t *ns) {
    if (v->kind == K_NUMBER) return us_to_ns(v->s, v->n, ns);
    if (v->kind == K_STRING && !v->esc && v->n && v->n < 64) {
        const char *p = v->s;
        if (parse_number(&p, v->s + v->n) == 0 && p == v->s + v->n) return us_to_ns(v->s, v->n, ns);
    }
    return -1;
}

/* An args id: an integer JSON number or a string holding one, -?[0-9]+ within int64. 0 on
   success, -1 for NULL, -2 out of memory (``tmp`` holds an escaped string's text). */
static int id_of(const Span *v, Buf *tmp, int64_t *out) {
    const char *s, *e;
    if (v->kind == K_NUMBER) { s = v->s; e = s + v->n; }
    else if (v->kind == K_STRING && !v->esc) { s = v->s; e = s + v->n; }
    else if (v->kind == K_STRING) {
        tmp->len = 0;
        if (put_unescaped(tmp, v->s, v->n)) return -2;
        s = tmp->p; e = s + tmp->len;
    } else return -1;
    int neg = s < e && *s == '-';
    if (neg) s++;
    if (s >= e) return -1;
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, x = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9') return -1;
        uint64_t d = (uint64_t)(*s - '0');
        if (x > (limit - d) / 10) return -1;
        x = x * 10 + d;
    }
    *out = neg ? (int64_t)(0 - x) : (int64_t)x;
    return 0;
}

static int put_int(Column *c, int64_t row, int ok, int64_t v) {
    if (!ok) { set_valid(c, row, 0); return 0; }
    if (buf_put(&c->values, &v, 8)) return -1;
    if (!c->has_minmax) { c->min = c->max = v; c->has_minmax = 1; }
    else { if (v < c->min) c->min = v; if (v > c->max) c->max = v; }
    set_valid(c, row, 1);
    return 0;
}

/* Whether the value just written at prefix offset ``at`` (the column's length before the row:
   nothing was written for a NULL) is ``text``; whether a name is one that names a lane. */
static int written_is(const Buf *values, size_t at, const char *text) {
    uint32_t n;
    if (values->len == at) return 0;
    memcpy(&n, values->p + at, 4);
    return n == strlen(text) && !memcmp(values->p + at + 4, text, n);
}

static int names_lane(const Buf *values, size_t at) {
    return written_is(values, at, "process_name") || written_is(values, at, "process_labels")
        || written_is(values, at, "thread_name");
}

/* ---- batch stats (what the cache's meta.json reports per trace) ----------------------------- */
typedef struct {
    int64_t t_lo, t_hi, n_ev, no_ts, zero, neg, no_dur, be, huge_ts, huge_dur;
    int has_t;
} Stats;

static int is_ph(const Span *v, const char *fb, char c) {
    if (v->kind == K_STRING && !v->esc) return v->n == 1 && v->s[0] == c;
    if (v->kind == K_ABSENT || v->kind == K_NULL) return fb && fb[0] == c;
    return 0;
}

/* ---- the scan --------------------------------------------------------------------------------- */
/* From p (an element expected), the end of the element: the ',' or ']' after it at depth 0
   (outside strings). Returns NULL if the buffer ends first; *close_brace set on a stray '}'. */
static const char *element_end(const char *p, const char *e, int *stray) {
    int depth = 0;
    *stray = 0;
    while (p < e) {
        while (p < e && !(CLS[(unsigned char)*p] & C_STRUCT)) p++;
        if (p >= e) break;
        char c = *p;
        if (c == '"') {
            p++;
            for (;;) {
                const char *q = memchr(p, '"', (size_t)(e - p));
                if (!q) return NULL;
                const char *b = q;
                while (b > p && b[-1] == '\\') b--;
                p = q + 1;
                if (((q - b) & 1) == 0) break;  /* an even run of backslashes: the quote closes */
            }
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0) {
                if (c == '}') *stray = 1;
                return p;
            }
            depth--;
        } else if (c == ',' && depth == 0) return p;
        p++;
    }
    return NULL;
}

static PyObject *page_body(Column *c, int64_t rows) {
    /* [u32 length][varint bit-packed run header][bitmap] then the values */
    size_t groups = (size_t)((rows + 7) / 8);
    unsigned char hdr[10];
    size_t h = 0;
    uint64_t v = ((uint64_t)groups << 1) | 1;
    do { unsigned char byte = v & 0x7F; v >>= 7; hdr[h++] = byte | (v ? 0x80 : 0); } while (v);
    uint32_t deflen = (uint32_t)(h + groups);
    size_t total = 4 + deflen + c->values.len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!out) return NULL;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, &deflen, 4);
    memcpy(o + 4, hdr, h);
    if (groups) memcpy(o + 4 + h, c->valid.p, groups);  /* (no buffer at all when empty) */
    if (c->values.len) memcpy(o + 4 + deflen, c->values.p, c->values.len);
    return out;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    int final;
    if (!PyArg_ParseTuple(args, "y*p", &view, &final)) return NULL;
    const char *start = view.buf, *p = view.buf, *e = (const char *)view.buf + view.len;
    Column cols[NF];
    memset(cols, 0, sizeof cols);
    Stats st;
    memset(&st, 0, sizeof st);
    int64_t rows = 0, bad = 0;
    Py_ssize_t consumed = 0, ended = -1, stray_at = -1;
    int oom = 0;
    Span f[NF];
    Buf idtext = {0};  /* an escaped id string's text */
    Dict dicts[N_CODED];
    memset(dicts, 0, sizeof dicts);
    Buf names = {0};  /* per naming 'M' record: int64 row, uint32 args prefix offset + 1 (0: NULL) */
    TripleSet naming = {0};  /* its (name, pid, tid) codes: the first record of each only */

    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        const char *s = skip_ws(p, e);
        if (s >= e) { if (final) consumed = view.len; break; }
        if (*s == ']') { ended = (Py_ssize_t)(s + 1 - start); consumed = ended; break; }
        /* parse in place; only a malformed or unfinished element is delimited by bracket counting */
        const char *end, *obj_end;
        int ok = parse_event(s, e, f, &obj_end) == 0;
        if (ok) {
            end = skip_ws(obj_end, e);
            if (end >= e) {
                if (!final) break;  /* its separator is in the next block */
            } else if (*end != ',' && *end != ']') {
                ok = 0;  /* trailing bytes after the object */
            }
        }
        if (!ok) {
            int stray;
            end = element_end(s, e, &stray);
            if (stray) { stray_at = (Py_ssize_t)(end - start); break; }
            if (!end) break;  /* unfinished: left for the next call (or reported at the end) */
        }
        if (ok) {
            if (rows % 8 == 0) {
                for (int i = 0; i < NF; i++) {
                    if (buf_grow(&cols[i].valid, 1)) { oom = 1; break; }
                    cols[i].valid.p[cols[i].valid.len++] = 0;
                }
                if (oom) break;
            }
            int64_t ts = 0, dur = 0;
            int r_ts = f[F_TS].kind != K_ABSENT ? time_of(&f[F_TS], &ts) : -1;
            int r_dur = f[F_DUR].kind != K_ABSENT ? time_of(&f[F_DUR], &dur) : -1;
            /* an end past int64 nanoseconds is as unusable as a duration that is */
            if (r_ts == 0 && r_dur == 0 && dur > 0 && ts > INT64_MAX - dur) r_dur = -2;
            int has_ts = r_ts == 0, has_dur = r_dur == 0;
            if (r_ts == -2) st.huge_ts++;
            if (r_dur == -2) st.huge_dur++;
            const char *ph_fb = has_dur ? "X" : has_ts ? "i" : NULL;
            int r = 0;
            args_members(f);
            if (f[A_HASH].kind != K_STRING) f[A_HASH].kind = K_ABSENT;
            size_t at[NF];
            for (int i = 0; i < NF && !r; i++) {
                at[i] = cols[i].values.len;
                if (i == F_TS) r = put_int(&cols[i], rows, has_ts, ts);
                else if (i == F_DUR) r = put_int(&cols[i], rows, has_dur, dur);
                else if (i == F_ARGS) r = put_json(&cols[i], rows, &f[i]);
                else if (IS_INT[i]) {
                    int64_t id = 0;
                    int got = id_of(&f[i], &idtext, &id);
                    r = got == -2 ? -1 : put_int(&cols[i], rows, got == 0, id);
                }
                else r = put_text(&cols[i], rows, &f[i], i == F_PH ? ph_fb : NULL);
                if (!r && i < N_CODED) r = dict_put(&dicts[i], &cols[i].values, cols[i].values.len == at[i], at[i]);
            }
            if (!r && written_is(&cols[F_PH].values, at[F_PH], "M") && names_lane(&cols[F_NAME].values, at[F_NAME])) {
                int32_t key[3];
                for (int k = 0; k < 3; k++) memcpy(&key[k], dicts[F_NAME + k].codes.p + 4 * rows, 4);
                int fresh = triple_add(&naming, key);
                if (fresh < 0) r = -1;
                else if (fresh) {
                    uint32_t args_at = cols[F_ARGS].values.len == at[F_ARGS] ? 0 : (uint32_t)at[F_ARGS] + 1;
                    r = buf_put(&names, &rows, 8) || buf_put(&names, &args_at, 4);
                }
            }
            if (r) { oom = 1; break; }
            /* the same filters as the SQL this replaces (ph NULL is excluded from every count) */
            const Span *ph = &f[F_PH];
            int ph_null = (ph->kind == K_ABSENT || ph->kind == K_NULL) && !ph_fb;
            if (!ph_null) {
                int m = is_ph(ph, ph_fb, 'M');
                int flow = is_ph(ph, ph_fb, 's') || is_ph(ph, ph_fb, 't') || is_ph(ph, ph_fb, 'f');
                int x = is_ph(ph, ph_fb, 'X');
                if (!m && !flow) {
                    st.n_ev++;
                    if (has_ts) {
                        int64_t end_ns = ts + (has_dur && dur > 0 ? dur : 0);
                        if (!st.has_t) { st.t_lo = ts; st.t_hi = end_ns; st.has_t = 1; }
                        else { if (ts < st.t_lo) st.t_lo = ts; if (end_ns > st.t_hi) st.t_hi = end_ns; }
                    }
                }
                if (!m && !has_ts && r_ts != -2) st.no_ts++;
                if (x && has_dur && dur == 0) st.zero++;
                if (x && !has_dur && has_ts && r_dur != -2) st.no_dur++;
                if (is_ph(ph, ph_fb, 'B') || is_ph(ph, ph_fb, 'E')) st.be++;
            }
            if (has_dur && dur < 0) st.neg++;
            rows++;
        } else {
            bad++;
        }
        if (end >= e) { consumed = view.len; break; }
        if (*end == ']') { ended = (Py_ssize_t)(end + 1 - start); consumed = ended; break; }
        p = end + 1;  /* past the ',' */
        consumed = (Py_ssize_t)(p - start);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);

    PyObject *result = NULL, *bodies = NULL, *nulls = NULL, *codes = NULL, *named = NULL;
    if (oom) { PyErr_NoMemory(); goto done; }
    bodies = PyTuple_New(NF);
    nulls = PyTuple_New(NF);
    codes = PyTuple_New(N_CODED);
    named = PyList_New((Py_ssize_t)(names.len / 12));
    if (!bodies || !nulls || !codes || !named) goto done;
    for (int i = 0; i < N_CODED; i++) {
        PyObject *c = dict_result(&dicts[i], &cols[i].values);
        if (!c) goto done;
        PyTuple_SET_ITEM(codes, i, c);
    }
    for (size_t k = 0; k < names.len / 12; k++) {
        int64_t row;
        uint32_t args_at, n;
        memcpy(&row, names.p + 12 * k, 8);
        memcpy(&args_at, names.p + 12 * k + 8, 4);
        PyObject *args_text = Py_NewRef(Py_None);
        if (args_at) {
            memcpy(&n, cols[F_ARGS].values.p + args_at - 1, 4);
            Py_DECREF(args_text);
            args_text = PyUnicode_DecodeUTF8(cols[F_ARGS].values.p + args_at + 3, (Py_ssize_t)n, "replace");
        }
        PyObject *item = args_text ? Py_BuildValue("(LN)", (long long)row, args_text) : NULL;
        if (!item) goto done;
        PyList_SET_ITEM(named, (Py_ssize_t)k, item);
    }
    for (int i = 0; i < NF; i++) {
        PyObject *b = page_body(&cols[i], rows);
        if (!b) goto done;
        PyTuple_SET_ITEM(bodies, i, b);
        PyTuple_SET_ITEM(nulls, i, PyLong_FromLongLong(cols[i].nulls));
    }
    PyObject *ts_mm = cols[F_TS].has_minmax
        ? Py_BuildValue("(LL)", (long long)cols[F_TS].min, (long long)cols[F_TS].max) : Py_NewRef(Py_None);
    PyObject *dur_mm = cols[F_DUR].has_minmax
        ? Py_BuildValue("(LL)", (long long)cols[F_DUR].min, (long long)cols[F_DUR].max) : Py_NewRef(Py_None);
    PyObject *stats = Py_BuildValue("{s:N,s:N,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}",
        "t_lo", st.has_t ? PyLong_FromLongLong(st.t_lo) : Py_NewRef(Py_None),
        "t_hi", st.has_t ? PyLong_FromLongLong(st.t_hi) : Py_NewRef(Py_None),
        "events", (long long)st.n_ev, "no_ts", (long long)st.no_ts, "zero", (long long)st.zero,
        "neg", (long long)st.neg, "no_dur", (long long)st.no_dur, "be", (long long)st.be,
        "huge_ts", (long long)st.huge_ts, "huge_dur", (long long)st.huge_dur);
    result = Py_BuildValue("{s:n,s:n,s:L,s:L,s:n,s:N,s:N,s:N,s:N,s:N,s:N,s:N}",
        "consumed", consumed, "ended", ended, "rows", (long long)rows, "bad", (long long)bad,
        "stray", stray_at, "bodies", bodies, "nulls", nulls, "ts_minmax", ts_mm, "dur_minmax", dur_mm,
        "stats", stats, "codes", codes, "names", named);
    bodies = nulls = codes = named = NULL;  /* stolen by the dict */
done:
    Py_XDECREF(bodies);
    Py_XDECREF(nulls);
    Py_XDECREF(codes);
    Py_XDECREF(named);
    for (int i = 0; i < N_CODED; i++) dict_free(&dicts[i]);
    free(names.p);
    free(naming.slot);
    free(naming.keys);
    for (int i = 0; i < NF; i++) { free(cols[i].values.p); free(cols[i].valid.p); }
    free(idtext.p);
    return result;
}

/* ---- the nesting's stack walk (tilescope.trace._nesting: lanes whose slices straddle) -------- */
/* Slices a..b-1 of one lane, sorted by (start, end descending): each one's parent (the innermost
   open slice, -1: none) and depth (open slices), written into ``parent`` and ``depth``; returns
   how many slices end after the slice they start in (straddle). All four arrays are int64. */
static PyObject *nest_stack(PyObject *self, PyObject *args) {
    Py_buffer ts, end, parent, depth;
    Py_ssize_t a, b;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*w*nn", &ts, &end, &parent, &depth, &a, &b)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = ts.len / 8;
    if (ts.itemsize != 8 || end.itemsize != 8 || parent.itemsize != 8 || depth.itemsize != 8
            || end.len / 8 != n || parent.len / 8 != n || depth.len / 8 != n || a < 0 || b > n || a > b) {
        PyErr_SetString(PyExc_ValueError, "nest_stack: four int64 arrays of one length and 0 <= a <= b <= length");
        goto out;
    }
    const int64_t *T = ts.buf, *E = end.buf;
    int64_t *P = parent.buf, *D = depth.buf;
    Py_ssize_t *stack = malloc(((size_t)(b - a) + 1) * sizeof *stack), top = 0;
    long long straddles = 0;
    if (!stack) { PyErr_NoMemory(); goto out; }
    for (Py_ssize_t k = a; k < b; k++) {
        while (top && E[stack[top - 1]] <= T[k]) top--;
        P[k] = top ? (int64_t)stack[top - 1] : -1;
        D[k] = (int64_t)top;
        if (top && E[k] > E[stack[top - 1]]) straddles++;
        if (E[k] > T[k]) stack[top++] = k;
    }
    free(stack);
    result = PyLong_FromLongLong(straddles);
out:
    PyBuffer_Release(&ts);
    PyBuffer_Release(&end);
    PyBuffer_Release(&parent);
    PyBuffer_Release(&depth);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, final) -> dict: parse traceEvents elements from buf (an element expected first)."},
    {"nest_stack", nest_stack, METH_VARARGS,
     "nest_stack(ts, end, parent, depth, a, b) -> straddles: the stack walk over slices a..b-1 of one lane."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kscan(void) {
    init_classes();
    PyObject *m = PyModule_Create(&module);
    if (m) {
        PyModule_AddIntConstant(m, "COLUMNS", NF);
        PyModule_AddIntConstant(m, "RAW_COLUMNS", 1);  /* scan() returns "codes" and "names" */
        PyObject *is_int = PyTuple_New(NF);
        for (int i = 0; is_int && i < NF; i++) PyTuple_SET_ITEM(is_int, i, PyLong_FromLong(IS_INT[i]));
        if (PyModule_AddObject(m, "IS_INT", is_int) < 0) Py_XDECREF(is_int);
    }
    return m;
}
