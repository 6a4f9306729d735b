/* capture._core: the compiled per-event core (docs/speed.md, "The compiled core").
 *
 * What runs once per streamed event, in C: framing a read of plain SSE events, matching a run of
 * events against a learnt template and splitting out its values, and writing a run's events back
 * from the values. Each function here has a pure-Python twin in capture/_event_templates.py or
 * capture/_sse.py: that code is the reference and the fallback (MCC_NO_EXTENSIONS=1, or an
 * install where this file could not be compiled); tests/capture/test_core.py holds both to the same
 * outputs, bit for bit. capture/_native.py chooses between them.
 *
 * Only the stable parts of CPython's C API are used, with no third-party header: pip builds this
 * with the machine's compiler and downloads nothing (as aiohttp, yarl and multidict ship theirs).
 */
#define _GNU_SOURCE /* memmem, where the C library has it */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if defined(__GLIBC__) || defined(__APPLE__) || defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__NetBSD__)
#define HAVE_MEMMEM 1
#endif

/* The first occurrence of needle in haystack[0:length], or NULL. The C library's memmem where
 * there is one (glibc's is several times faster than bytes.find on JSON, whose quotes defeat the
 * skip tables); else the first byte by memchr and the rest compared. */
static const char *
find_bytes(const char *haystack, Py_ssize_t length, const char *needle, Py_ssize_t needle_length)
{
    if (needle_length == 0)
        return haystack;
    if (needle_length > length)
        return NULL;
#ifdef HAVE_MEMMEM
    return memmem(haystack, (size_t)length, needle, (size_t)needle_length);
#endif
    const char first = needle[0];
    const char *last_start = haystack + length - needle_length;
    const char *at = haystack;
    while (at <= last_start) {
        at = memchr(at, first, (size_t)(last_start - at + 1));
        if (at == NULL)
            return NULL;
        if (memcmp(at, needle, (size_t)needle_length) == 0)
            return at;
        at++;
    }
    return NULL;
}

/* take_rows(parts, start, shortest, first, inner, last, text_slots, minimum, maximum)
 *     -> (fit, count, columns)
 *
 * EventTemplate.take_run's work (capture/_event_templates.py): ``fit`` is how many of
 * parts[start:] begin with ``first``, end with ``last`` and are ``minimum`` to ``maximum`` bytes
 * long; when fit >= shortest, ``count`` of them (from the first) are exactly the segments
 * (first, *inner, last) around values, each text slot's (text_slots[slot] != 0) holding no quote
 * and no backslash, and ``columns`` are each slot's values; otherwise count is 0 and columns None.
 * Each inner segment is the first occurrence after the previous one, as `EventTemplate.take` finds it.
 */
static PyObject *
take_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "take_rows takes 9 arguments");
        return NULL;
    }
    PyObject *parts = args[0], *inner = args[4], *text_slots = args[6];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t shortest = PyLong_AsSsize_t(args[2]);
    Py_ssize_t minimum = PyLong_AsSsize_t(args[7]);
    Py_ssize_t maximum = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(parts) || !PyTuple_Check(inner) || !PyBytes_Check(args[3]) || !PyBytes_Check(args[5])
            || !PyBytes_Check(text_slots)) {
        PyErr_SetString(PyExc_TypeError, "take_rows: parts is a list, inner a tuple, first, last and text_slots bytes");
        return NULL;
    }
    const char *first = PyBytes_AS_STRING(args[3]), *last = PyBytes_AS_STRING(args[5]);
    Py_ssize_t head = PyBytes_GET_SIZE(args[3]), tail = PyBytes_GET_SIZE(args[5]);
    Py_ssize_t inner_count = PyTuple_GET_SIZE(inner), slots = inner_count + 1;
    if (PyBytes_GET_SIZE(text_slots) != slots) {
        PyErr_SetString(PyExc_ValueError, "take_rows: one text_slots byte a slot");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < inner_count; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(inner, i))) {
            PyErr_SetString(PyExc_TypeError, "take_rows: inner segments are bytes");
            return NULL;
        }
    }
    const char *is_text = PyBytes_AS_STRING(text_slots);
    Py_ssize_t end = PyList_GET_SIZE(parts);
    if (start < 0)
        start = 0;
    Py_ssize_t fit = 0;
    for (Py_ssize_t at = start; at < end; at++) {
        PyObject *part = PyList_GET_ITEM(parts, at);
        if (!PyBytes_Check(part))
            break;
        Py_ssize_t size = PyBytes_GET_SIZE(part);
        const char *bytes = PyBytes_AS_STRING(part);
        if (size < minimum || size > maximum || size < head || size < tail || memcmp(bytes, first, (size_t)head) != 0
                || memcmp(bytes + size - tail, last, (size_t)tail) != 0)
            break;
        fit++;
    }
    if (fit < shortest)
        return Py_BuildValue("nnO", fit, (Py_ssize_t)0, Py_None);
    PyObject *columns = PyList_New(slots);
    if (columns == NULL)
        return NULL;
    for (Py_ssize_t slot = 0; slot < slots; slot++) {
        PyObject *column = PyList_New(0);
        if (column == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyList_SET_ITEM(columns, slot, column);
    }
    /* Each row's value bounds, found before any value is made: a row is taken whole or not at all. */
    Py_ssize_t *bounds = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)slots);
    if (bounds == NULL) {
        Py_DECREF(columns);
        return PyErr_NoMemory();
    }
    Py_ssize_t count = 0;
    for (; count < fit; count++) {
        PyObject *part = PyList_GET_ITEM(parts, start + count);
        const char *bytes = PyBytes_AS_STRING(part);
        Py_ssize_t position = head, stop = PyBytes_GET_SIZE(part) - tail;
        int fits = 1;
        for (Py_ssize_t slot = 0; slot < slots && fits; slot++) {
            Py_ssize_t value_end = stop, next = stop;
            if (slot < inner_count) {
                PyObject *segment = PyTuple_GET_ITEM(inner, slot);
                Py_ssize_t length = PyBytes_GET_SIZE(segment);
                const char *found = find_bytes(bytes + position, stop - position, PyBytes_AS_STRING(segment), length);
                if (found == NULL) {
                    fits = 0;
                    break;
                }
                value_end = found - bytes;
                next = value_end + length;
            }
            if (is_text[slot] && (memchr(bytes + position, '"', (size_t)(value_end - position)) != NULL
                                  || memchr(bytes + position, '\\', (size_t)(value_end - position)) != NULL))
                fits = 0;
            bounds[2 * slot] = position;
            bounds[2 * slot + 1] = value_end;
            position = next;
        }
        if (!fits)
            break;
        for (Py_ssize_t slot = 0; slot < slots; slot++) {
            PyObject *value = PyBytes_FromStringAndSize(bytes + bounds[2 * slot], bounds[2 * slot + 1] - bounds[2 * slot]);
            if (value == NULL || PyList_Append(PyList_GET_ITEM(columns, slot), value) < 0) {
                Py_XDECREF(value);
                PyMem_Free(bounds);
                Py_DECREF(columns);
                return NULL;
            }
            Py_DECREF(value);
        }
    }
    PyMem_Free(bounds);
    return Py_BuildValue("nnN", fit, count, columns);
}

/* write_rows(segments, columns, count) -> bytes
 *
 * capture/_event_templates.py's written_rows: ``count`` rows (fewer when a column is shorter),
 * each the segments around one value of each column (len(segments) == len(columns) + 1), joined.
 */
static PyObject *
write_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "write_rows takes 3 arguments");
        return NULL;
    }
    PyObject *segments = args[0], *columns = args[1];
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_Check(segments) || !PyList_Check(columns) || PyList_GET_SIZE(segments) != PyList_GET_SIZE(columns) + 1) {
        PyErr_SetString(PyExc_TypeError, "write_rows: segments and columns are lists, one segment more than columns");
        return NULL;
    }
    Py_ssize_t slots = PyList_GET_SIZE(columns);
    for (Py_ssize_t i = 0; i <= slots; i++) {
        if (!PyBytes_Check(PyList_GET_ITEM(segments, i))) {
            PyErr_SetString(PyExc_TypeError, "write_rows: segments are bytes");
            return NULL;
        }
    }
    if (count < 0)
        count = 0;
    Py_ssize_t rows = count;
    for (Py_ssize_t slot = 0; slot < slots; slot++) {
        PyObject *column = PyList_GET_ITEM(columns, slot);
        if (!PyList_Check(column)) {
            PyErr_SetString(PyExc_TypeError, "write_rows: columns are lists of bytes");
            return NULL;
        }
        if (PyList_GET_SIZE(column) < rows)
            rows = PyList_GET_SIZE(column);
    }
    /* As the reference writes them: one column and no row still gives the two segments. */
    int bare = (slots == 1 && rows == 0);
    Py_ssize_t fixed = 0;
    for (Py_ssize_t i = 0; i <= slots; i++)
        fixed += PyBytes_GET_SIZE(PyList_GET_ITEM(segments, i));
    Py_ssize_t total = bare ? fixed : fixed * rows;
    for (Py_ssize_t slot = 0; slot < slots; slot++) {
        PyObject *column = PyList_GET_ITEM(columns, slot);
        for (Py_ssize_t row = 0; row < rows; row++) {
            PyObject *value = PyList_GET_ITEM(column, row);
            if (!PyBytes_Check(value)) {
                PyErr_SetString(PyExc_TypeError, "write_rows: columns are lists of bytes");
                return NULL;
            }
            total += PyBytes_GET_SIZE(value);
        }
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *write = PyBytes_AS_STRING(out);
    Py_ssize_t written_rows = bare ? 1 : rows;
    for (Py_ssize_t row = 0; row < written_rows; row++) {
        for (Py_ssize_t i = 0; i <= slots; i++) {
            PyObject *segment = PyList_GET_ITEM(segments, i);
            Py_ssize_t length = PyBytes_GET_SIZE(segment);
            memcpy(write, PyBytes_AS_STRING(segment), (size_t)length);
            write += length;
            if (i < slots && !bare) {
                PyObject *value = PyList_GET_ITEM(PyList_GET_ITEM(columns, i), row);
                length = PyBytes_GET_SIZE(value);
                memcpy(write, PyBytes_AS_STRING(value), (size_t)length);
                write += length;
            }
        }
    }
    return out;
}

/* plain_events(chunk, max_event_bytes) -> (events, field_lines) or None
 *
 * SSEParser.feed_plain's reading of a chunk (capture/_sse.py's plain_events): the chunk is whole
 * events of the plain shape -- "data: VALUE" or "event: NAME" + "data: VALUE", each line ending in
 * LF, each event in a blank line -- as (type, data, lines) tuples, and the field lines they hold;
 * None when it is anything else (the caller then frames it the general way).
 */
static PyObject *
plain_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "plain_events(chunk: bytes, max_event_bytes: int)");
        return NULL;
    }
    PyObject *chunk = args[0];
    Py_ssize_t max_event_bytes = PyLong_AsSsize_t(args[1]);
    if (max_event_bytes == -1 && PyErr_Occurred())
        return NULL;
    const char *bytes = PyBytes_AS_STRING(chunk);
    Py_ssize_t size = PyBytes_GET_SIZE(chunk);
    if (size < 2 || bytes[size - 1] != '\n' || bytes[size - 2] != '\n' || memchr(bytes, '\r', (size_t)size) != NULL)
        Py_RETURN_NONE;
    PyObject *events = PyList_New(0);
    if (events == NULL)
        return NULL;
    Py_ssize_t field_lines = 0, body_end = size - 2, at = 0;
    static PyObject *message = NULL;
    if (message == NULL && (message = PyUnicode_InternFromString("message")) == NULL)
        goto fail;
    for (;;) {
        /* One part: up to the next blank line (LF LF), or to the end of the body. */
        const char *found = find_bytes(bytes + at, body_end - at, "\n\n", 2);
        Py_ssize_t part_end = found == NULL ? body_end : found - bytes;
        const char *part = bytes + at;
        Py_ssize_t part_size = part_end - at;
        PyObject *kind;
        Py_ssize_t data_start;
        if (part_size >= 6 && memcmp(part, "data: ", 6) == 0) {
            if (memchr(part, '\n', (size_t)part_size) != NULL)
                goto not_plain; /* Several data lines, or another field after this one. */
            kind = Py_NewRef(message);
            data_start = 6;
            field_lines += 1;
        } else if (part_size >= 7 && memcmp(part, "event: ", 7) == 0) {
            const char *line_end = memchr(part, '\n', (size_t)part_size);
            Py_ssize_t name_end = line_end == NULL ? part_size : line_end - part;
            Py_ssize_t data_line = line_end == NULL ? part_size : name_end + 1;
            if (part_size - data_line < 6 || memcmp(part + data_line, "data: ", 6) != 0
                    || memchr(part + data_line, '\n', (size_t)(part_size - data_line)) != NULL)
                goto not_plain;
            if (name_end == 7)
                kind = Py_NewRef(message);
            else if ((kind = PyUnicode_DecodeUTF8(part + 7, name_end - 7, "replace")) == NULL)
                goto fail;
            data_start = data_line + 6;
            field_lines += 2;
        } else {
            goto not_plain; /* A comment, an id or retry field, a blank line, ... */
        }
        if (part_size - data_start + 6 > max_event_bytes) {
            Py_DECREF(kind);
            goto not_plain; /* The general way drops and counts it. */
        }
        PyObject *data = PyBytes_FromStringAndSize(part + data_start, part_size - data_start);
        PyObject *lines = data == NULL ? NULL : PyBytes_FromStringAndSize(part, part_size);
        PyObject *event = lines == NULL ? NULL : PyTuple_Pack(3, kind, data, lines);
        Py_DECREF(kind);
        Py_XDECREF(data);
        Py_XDECREF(lines);
        if (event == NULL || PyList_Append(events, event) < 0) {
            Py_XDECREF(event);
            goto fail;
        }
        Py_DECREF(event);
        if (found == NULL)
            break;
        at = part_end + 2;
    }
    return Py_BuildValue("Nn", events, field_lines);
not_plain:
    Py_DECREF(events);
    Py_RETURN_NONE;
fail:
    Py_DECREF(events);
    return NULL;
}

/* first_of(data, markers) -> int
 *
 * Where the first of ``markers`` (a tuple of bytes) starts in ``data``, or -1: StreamTap's
 * quiet_prefix (capture/_tap.py's first_of), which looks for a terminal event's name in every read.
 */
static PyObject *
first_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "first_of(data: bytes, markers: tuple[bytes, ...])");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(args[0]);
    Py_ssize_t end = PyBytes_GET_SIZE(args[0]), first = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[1]); i++) {
        PyObject *marker = PyTuple_GET_ITEM(args[1], i);
        if (!PyBytes_Check(marker)) {
            PyErr_SetString(PyExc_TypeError, "first_of: markers are bytes");
            return NULL;
        }
        /* Only before the first found so far: a later find cannot be first. */
        Py_ssize_t length = PyBytes_GET_SIZE(marker), within = first < 0 ? end : first + length - 1;
        if (within > end)
            within = end;
        const char *found = find_bytes(data, within, PyBytes_AS_STRING(marker), length);
        if (found != NULL && (first < 0 || found - data < first))
            first = found - data;
    }
    return PyLong_FromSsize_t(first);
}

/* split_events(piece) -> list[bytes]
 *
 * piece[:-2].split(b"\n\n") for a piece of whole events (capture/_tap.py's split_events): each
 * event without its blank line. LF is rare in JSON events (only at their ends), so each is found by
 * memchr.
 */
static PyObject *
split_events(PyObject *module, PyObject *piece)
{
    if (!PyBytes_Check(piece)) {
        PyErr_SetString(PyExc_TypeError, "split_events(piece: bytes)");
        return NULL;
    }
    const char *bytes = PyBytes_AS_STRING(piece);
    Py_ssize_t end = PyBytes_GET_SIZE(piece) - 2;
    if (end < 0)
        end = 0;
    PyObject *parts = PyList_New(0);
    if (parts == NULL)
        return NULL;
    Py_ssize_t start = 0, at = 0;
    for (;;) {
        const char *lf = at < end ? memchr(bytes + at, '\n', (size_t)(end - at)) : NULL;
        while (lf != NULL && (lf - bytes + 1 >= end || lf[1] != '\n')) {
            at = lf - bytes + 1;
            lf = at < end ? memchr(bytes + at, '\n', (size_t)(end - at)) : NULL;
        }
        Py_ssize_t stop = lf == NULL ? end : lf - bytes;
        PyObject *part = PyBytes_FromStringAndSize(bytes + start, stop - start);
        if (part == NULL || PyList_Append(parts, part) < 0) {
            Py_XDECREF(part);
            Py_DECREF(parts);
            return NULL;
        }
        Py_DECREF(part);
        if (lf == NULL)
            return parts;
        start = at = stop + 2;
    }
}

static PyMethodDef core_methods[] = {
    {"first_of", (PyCFunction)(void (*)(void))first_of, METH_FASTCALL,
     "Where the first of the markers starts in the data, or -1 (capture._tap.first_of)."},
    {"split_events", (PyCFunction)split_events, METH_O,
     "A piece of whole events split at their blank lines (capture._tap.split_events)."},
    {"take_rows", (PyCFunction)(void (*)(void))take_rows, METH_FASTCALL,
     "A run of events of a template's shape and its slots' values (capture._event_templates)."},
    {"write_rows", (PyCFunction)(void (*)(void))write_rows, METH_FASTCALL,
     "Rows of segments around values, joined (capture._event_templates.written_rows)."},
    {"plain_events", (PyCFunction)(void (*)(void))plain_events, METH_FASTCALL,
     "A chunk of plain SSE events as (type, data, lines), or None (capture._sse)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "capture._core",
    "The compiled per-event core; capture._native chooses it or the pure-Python reference.", -1, core_methods,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModule_Create(&core_module);
}
