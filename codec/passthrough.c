/* The pass-through fast path's readers, in C: what every relayed Produce and Fetch asks of
 * its frames, one call each (issue 29, workload 2: on the cold caches of a loaded machine a
 * pass-through request costs what its Python costs, bytecode by bytecode).
 *
 *   whole_frames(data, max)    the frame bodies of a read holding whole frames only, as
 *                              codec/frames.py's FrameBuffer hands them out
 *   read_frames(buffer, n, max)
 *                              the same, as read-only views of the buffer a socket read them
 *                              into (a large read is handed over, not copied)
 *   request_header(frame)      the request header, as codec/headers.py's RequestHeader
 *   produce_head(frame, start, version)
 *                              acks and the one topic name of a Produce request body at
 *                              `start`, as codec/produce_splice.py's ProduceTopics
 *   scan_produce_request(version, body)
 *                              the layout of a Produce request body, as codec/produce_splice.py's
 *                              scan_produce_request finds it (ProduceRequestLayout, its records
 *                              slices of the same view of `body`): what a filtered Produce is
 *                              scanned for (proxy/paths/base.py Exchange.produce_layout)
 *   produce_response_tagged(body, start, by_id)
 *   unfilled(n)                a bytearray of n bytes left as malloc gives them (not zeroed): a
 *                              large frame's body, read into by the socket before it is read
 *                              by anything (codec/frames.py FrameBuffer.get_buffer)
 *   grow(buffer, n)            that bytearray made n bytes long in place, not zeroed: such a
 *                              buffer when its frame is longer than what was reserved
 *   fetch_response_tagged(body, start, by_id, fixed, replica, top_fixed)
 *                              whether a Produce / Fetch response may carry top-level tagged
 *                              fields (KIP-951 node endpoints); -1: a partition the Python
 *                              reader must walk (not error-free, or with tagged fields)
 *
 * Each answers only the common case and hands anything else back (None, or -1 for the
 * Produce response scan) to the Python reader it stands in for, which stays the reference:
 * errors, rare encodings (a count or name length over 127 in the head readers, tagged fields
 * in a request header or a Produce request body, topics by id, a partition with an error)
 * are the Python's. So the verdicts and the errors
 * are the Python's by construction, and tests/codec/test_passthrough_native.py holds the two
 * to the same answers on generated and mutated frames.
 *
 * Built at install by codec/passthrough_build.py as the CPython extension
 * sluice.codec._passthrough (plain C, no library); without it the Python readers run alone.
 * Reads only: nothing here writes into a frame. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>

/* Set once by setup(): the named-tuple classes results are made of, the request header
 * flexibility table (api_key << 16 | version -> bool, filled by the Python reader), and per
 * Produce version its request body's shape (0: hand back, 1: classic, 2: flexible by name). */
static PyTypeObject *request_header_type = NULL;
static PyTypeObject *produce_topics_type = NULL;
static PyTypeObject *layout_type = NULL;  /* ProduceRequestLayout */
static PyTypeObject *topic_slot_type = NULL;
static PyTypeObject *partition_slot_type = NULL;
static PyObject *flexible_table = NULL;
static unsigned char produce_shapes[64];

static inline int32_t be16(const uint8_t *p) { return (int16_t)((p[0] << 8) | p[1]); }
static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

/* An unsigned varint of at most 5 bytes at *pos (codec/guard.py read_uvarint): 0 on success,
 * -1 when it runs past `end` or is longer. */
static int uvarint(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, int64_t *value) {
    int64_t result = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= end) return -1;
        uint8_t c = b[(*pos)++];
        result |= (int64_t)(c & 0x7F) << shift;
        if (c < 0x80) { *value = result; return 0; }
        shift += 7;
        if (shift > 28) return -1;
    }
}

/* A tagged-field section at *pos (codec/guard.py skip_tags): 0, or -1 when malformed. */
static int skip_tags(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos) {
    int64_t count, tag, size;
    if (uvarint(b, end, pos, &count) < 0) return -1;
    if (count > end - *pos) return -1;
    for (int64_t i = 0; i < count; i++) {
        if (uvarint(b, end, pos, &tag) < 0 || uvarint(b, end, pos, &size) < 0) return -1;
        *pos += size;
        if (*pos > end) return -1;
    }
    return 0;
}

/* A tagged-field section that is almost always empty: one byte, else the general skip. */
static inline int tags(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos) {
    if (*pos >= end) return -1;
    if (b[*pos] == 0) { (*pos)++; return 0; }
    return skip_tags(b, end, pos);
}

/* A compact count at *pos as the Python readers take it: the byte less one, through the
 * varint reader when the byte is 0x80 or more. */
static inline int compact_count(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, int64_t *n) {
    if (*pos >= end) return -1;
    int64_t v = b[*pos];
    if (v >= 0x80) {
        if (uvarint(b, end, pos, &v) < 0) return -1;
    } else {
        (*pos)++;
    }
    *n = v - 1;
    return 0;
}

static PyObject *make_tuple(PyTypeObject *type, Py_ssize_t n, PyObject **items) {
    /* What tuple.__new__(type, items) makes, without a Python-level call: the classes are
     * NamedTuples (tuple subclasses without a __dict__). Steals the references in items. */
    PyObject *obj = type->tp_alloc(type, n);
    if (obj == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(obj, i, items[i]);
    return obj;
}

static PyObject *setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyDict_Check(args[2])
        || !PyBytes_Check(args[3]) || !PyType_Check(args[4]) || !PyType_Check(args[5])
        || !PyType_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup(RequestHeader, ProduceTopics, flexible table, produce shapes, "
                        "ProduceRequestLayout, TopicSlot, PartitionSlot)");
        return NULL;
    }
    static const int classes[] = {0, 1, 4, 5, 6};
    for (int i = 0; i < 5; i++) {
        if (!PyType_IsSubtype((PyTypeObject *)args[classes[i]], &PyTuple_Type)) {
            PyErr_SetString(PyExc_TypeError, "the result classes must be tuples");
            return NULL;
        }
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[3]);
    if (n > (Py_ssize_t)sizeof(produce_shapes)) n = sizeof(produce_shapes);
    memset(produce_shapes, 0, sizeof(produce_shapes));
    memcpy(produce_shapes, PyBytes_AS_STRING(args[3]), n);
    Py_XSETREF(request_header_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(produce_topics_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(flexible_table, Py_NewRef(args[2]));
    Py_XSETREF(layout_type, (PyTypeObject *)Py_NewRef(args[4]));
    Py_XSETREF(topic_slot_type, (PyTypeObject *)Py_NewRef(args[5]));
    Py_XSETREF(partition_slot_type, (PyTypeObject *)Py_NewRef(args[6]));
    Py_RETURN_NONE;
}

/* request_header(frame) -> RequestHeader, or None: the Python reader decides. */
static PyObject *request_header(PyObject *self, PyObject *frame) {
    if (request_header_type == NULL) Py_RETURN_NONE;
    Py_buffer v;
    if (PyObject_GetBuffer(frame, &v, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const uint8_t *b = v.buf;
    Py_ssize_t n = v.len, pos = 10;
    PyObject *client_id = NULL, *result = NULL;
    if (n < 10) goto hand_back;
    int32_t api_key = be16(b), version = be16(b + 2), correlation = be32(b + 4);
    int32_t id_len = be16(b + 8);
    if (api_key < 0) goto hand_back;
    if (id_len == -1) {
        client_id = Py_NewRef(Py_None);
    } else {
        if (id_len < 0 || 10 + (Py_ssize_t)id_len > n) goto hand_back;
        client_id = PyUnicode_DecodeUTF8((const char *)b + 10, id_len, NULL);
        if (client_id == NULL) { PyErr_Clear(); goto hand_back; }
        pos = 10 + id_len;
    }
    PyObject *key = PyLong_FromLong((long)api_key << 16 | (version & 0xFFFF));
    if (key == NULL) goto error;
    PyObject *flex = PyDict_GetItemWithError(flexible_table, key);  /* borrowed */
    Py_DECREF(key);
    if (flex == NULL) {
        if (PyErr_Occurred()) goto error;
        goto hand_back;  /* the Python reader works it out and fills the table */
    }
    int flexible = flex == Py_True;
    if (flexible) {
        if (pos >= n || b[pos] != 0) goto hand_back;  /* tagged fields: the Python's */
        pos++;
    }
    PyObject *items[6] = {PyLong_FromLong(api_key), PyLong_FromLong(version),
                          PyLong_FromLong(correlation), client_id, PyLong_FromSsize_t(pos),
                          PyBool_FromLong(flexible)};
    client_id = NULL;  /* owned by items now */
    for (int i = 0; i < 6; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 6; j++) Py_XDECREF(items[j]);
            goto error;
        }
    }
    result = make_tuple(request_header_type, 6, items);
    PyBuffer_Release(&v);
    return result;
hand_back:
    Py_XDECREF(client_id);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
error:
    Py_XDECREF(client_id);
    PyBuffer_Release(&v);
    return NULL;
}

/* produce_head(frame, start, version) -> ProduceTopics(acks, [name]) of a Produce request
 * body at `start` naming exactly one topic by name; None: the Python reader decides (another
 * count, a topic id, a long name, anything short or malformed). */
static PyObject *produce_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "produce_head(frame, start, version)");
        return NULL;
    }
    if (produce_topics_type == NULL) Py_RETURN_NONE;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long version = PyLong_AsLong(args[2]);
    if ((start == -1 || version == -1) && PyErr_Occurred()) return NULL;
    if (version < 0 || version >= (long)sizeof(produce_shapes) || start < 0) Py_RETURN_NONE;
    int shape = produce_shapes[version];
    if (shape == 0) Py_RETURN_NONE;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (start >= v.len) goto hand_back;
    const uint8_t *b = (const uint8_t *)v.buf + start;
    Py_ssize_t end = v.len - start, name_at, size;
    int32_t acks;
    if (shape == 2) {
        Py_ssize_t pos = b[0];  /* compact transactional id: 0 null, n: n - 1 bytes */
        if (pos >= 0x80) goto hand_back;
        if (pos == 0) pos = 1;
        if (pos + 8 > end) goto hand_back;
        acks = be16(b + pos);
        if (b[pos + 6] != 2) goto hand_back;  /* not a compact count of one topic */
        name_at = pos + 7;
        size = b[name_at];
        if (size <= 1 || size >= 0x80 || name_at + size > end) goto hand_back;
        name_at += 1;
        size -= 1;
    } else {
        if (end < 2) goto hand_back;
        int32_t id_len = be16(b);
        Py_ssize_t pos = 2 + (id_len > 0 ? id_len : 0);
        if (pos + 12 > end) goto hand_back;
        acks = be16(b + pos);
        if (be32(b + pos + 6) != 1) goto hand_back;
        size = be16(b + pos + 10);
        name_at = pos + 12;
        if (size < 0 || name_at + size > end) goto hand_back;
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)b + name_at, size, NULL);
    if (name == NULL) { PyErr_Clear(); goto hand_back; }
    PyBuffer_Release(&v);
    PyObject *keys = PyList_New(1);
    if (keys == NULL) { Py_DECREF(name); return NULL; }
    PyList_SET_ITEM(keys, 0, name);
    PyObject *items[2] = {PyLong_FromLong(acks), keys};
    if (items[0] == NULL) { Py_DECREF(keys); return NULL; }
    return make_tuple(produce_topics_type, 2, items);
hand_back:
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

/* The smallest encoded topic and partition entries of a Produce request, classic and
 * flexible (codec/produce_splice.py _MIN_TOPIC, _MIN_PARTITION): a count that declares more
 * entries than the bytes left could hold is refused before anything is allocated for it. */
static const Py_ssize_t min_topic[2] = {2 + 4, 1 + 1 + 1};
static const Py_ssize_t min_partition[2] = {4 + 4, 4 + 1 + 1};

/* An array count at *pos as codec/produce_splice.py _count reads it (a negative count is an
 * empty array): 0, or -1 where the Python reader raises. */
static int array_count(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, int flexible,
                       Py_ssize_t minimum, int64_t *n) {
    if (flexible) {
        if (compact_count(b, end, pos, n) < 0) return -1;
    } else {
        if (*pos + 4 > end) return -1;
        *n = be32(b + *pos);
        *pos += 4;
    }
    if (*n < 0) *n = 0;
    return *n * minimum > end - *pos ? -1 : 0;
}

/* A string whose length prefix is at *pos (compact when flexible): *out is the string, or
 * None for a null one (a negative length); -1 where the Python reader raises (cut short, not
 * UTF-8), with no exception set. */
static int read_string(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, int flexible,
                       PyObject **out) {
    int64_t n;
    if (flexible) {
        if (compact_count(b, end, pos, &n) < 0) return -1;  /* n: the length, -1 null */
    } else {
        if (*pos + 2 > end) return -1;
        n = be16(b + *pos);
        *pos += 2;
    }
    if (n < 0) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (*pos + n > end) return -1;
    *out = PyUnicode_DecodeUTF8((const char *)b + *pos, (Py_ssize_t)n, NULL);
    if (*out == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -2;
        PyErr_Clear();
        return -1;
    }
    *pos += n;
    return 0;
}

/* Python ints for the items of a slot (NULL-checked by make_slot). */
#define INT(x) PyLong_FromSsize_t((Py_ssize_t)(x))

/* A named tuple of `type` from n new references, any of which may be NULL (a failed
 * allocation: the others are released and NULL returned, with the error set). */
static PyObject *make_slot(PyTypeObject *type, Py_ssize_t n, PyObject **items) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i] == NULL) {
            for (Py_ssize_t j = 0; j < n; j++) Py_XDECREF(items[j]);
            return NULL;
        }
    }
    return make_tuple(type, n, items);
}

/* The walk of scan_produce_request over b[0:end]: the layout's topics tuple in *topics and its
 * offsets; 0, -1 to hand back (no exception set), -2 on an error of Python's own (an
 * exception set: out of memory). `view` is the memoryview the records are slices of. */
static int scan_topics(PyObject *view, const uint8_t *b, Py_ssize_t end, int flexible,
                       Py_ssize_t *pos_io, PyObject **topics, Py_ssize_t offsets[3]) {
    Py_ssize_t pos = *pos_io;
    int64_t n_topics, n_parts;
    int r;
    offsets[0] = pos;
    if (array_count(b, end, &pos, flexible, min_topic[flexible], &n_topics) < 0) return -1;
    offsets[1] = pos;
    PyObject *all = PyTuple_New((Py_ssize_t)n_topics);
    if (all == NULL) return -2;
    for (int64_t t = 0; t < n_topics; t++) {
        Py_ssize_t t_start = pos;
        PyObject *name = NULL;
        if ((r = read_string(b, end, &pos, flexible, &name)) < 0) goto fail;
        if (name == Py_None) {  /* a null topic name: the Python reader's error */
            Py_DECREF(name);
            r = -1;
            goto fail;
        }
        Py_ssize_t count_at = pos;
        if (array_count(b, end, &pos, flexible, min_partition[flexible], &n_parts) < 0) {
            Py_DECREF(name);
            r = -1;
            goto fail;
        }
        Py_ssize_t count_end = pos;
        PyObject *parts = PyTuple_New((Py_ssize_t)n_parts);
        if (parts == NULL) {
            Py_DECREF(name);
            r = -2;
            goto fail;
        }
        /* Set at once, so that a failure below releases the name with the tuple. */
        PyObject *items[7] = {name, Py_NewRef(Py_None), parts, NULL, NULL, NULL, NULL};
        for (int64_t p = 0; p < n_parts; p++) {
            Py_ssize_t p_start = pos;
            int64_t size;
            r = -1;
            if (pos + 4 > end) goto fail_topic;
            int32_t index = be32(b + pos);
            pos += 4;
            Py_ssize_t records_at = pos;
            if (flexible) {
                if (compact_count(b, end, &pos, &size) < 0) goto fail_topic;
            } else {
                if (pos + 4 > end) goto fail_topic;
                size = be32(b + pos);
                pos += 4;
            }
            PyObject *records;
            if (size >= 0) {
                if (pos + size > end) goto fail_topic;
                records = PySequence_GetSlice(view, pos, pos + (Py_ssize_t)size);
                pos += (Py_ssize_t)size;
            } else {
                records = Py_NewRef(Py_None);
            }
            Py_ssize_t records_end = pos;
            if (flexible) {
                /* Tagged fields in a partition: the Python reader's (never sent by clients). */
                if (pos >= end || b[pos] != 0) { Py_XDECREF(records); goto fail_topic; }
                pos++;
            }
            PyObject *slot_items[6] = {PyLong_FromLong(index), records, INT(p_start),
                                       INT(records_at), INT(records_end), INT(pos)};
            PyObject *slot = make_slot(partition_slot_type, 6, slot_items);
            if (slot == NULL) { r = -2; goto fail_topic; }
            PyTuple_SET_ITEM(parts, (Py_ssize_t)p, slot);
        }
        if (flexible) {
            r = -1;
            if (pos >= end || b[pos] != 0) goto fail_topic;
            pos++;
        }
        items[3] = INT(t_start);
        items[4] = INT(count_at);
        items[5] = INT(count_end);
        items[6] = INT(pos);
        PyObject *topic = make_slot(topic_slot_type, 7, items);
        if (topic == NULL) { r = -2; goto fail; }
        PyTuple_SET_ITEM(all, (Py_ssize_t)t, topic);
        continue;
    fail_topic:
        for (int i = 0; i < 7; i++) Py_XDECREF(items[i]);
        goto fail;
    }
    offsets[2] = pos;
    *topics = all;
    *pos_io = pos;
    return 0;
fail:
    Py_DECREF(all);  /* the slots not made yet are NULL in it */
    return r;
}

/* scan_produce_request(version, body) -> ProduceRequestLayout, what
 * codec/produce_splice.py's scan_produce_request returns for the same arguments (the records
 * slices of the same view of `body`: `body` itself when it is a memoryview); None for
 * anything else: a version by topic id or unknown, tagged fields, a string not UTF-8, any
 * error (the Python scan raises it). */
static PyObject *scan_produce_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_produce_request(version, body)");
        return NULL;
    }
    if (layout_type == NULL || !PyLong_CheckExact(args[0])) Py_RETURN_NONE;
    int overflow;
    long version = PyLong_AsLongAndOverflow(args[0], &overflow);
    if (version == -1 && PyErr_Occurred()) return NULL;
    if (overflow || version < 0 || version >= (long)sizeof(produce_shapes)) Py_RETURN_NONE;
    int shape = produce_shapes[version];
    if (shape == 0) Py_RETURN_NONE;
    int flexible = shape == 2;
    PyObject *view, *txn = NULL, *topics = NULL;
    if (PyMemoryView_Check(args[1])) {
        view = Py_NewRef(args[1]);
    } else {
        view = PyMemoryView_FromObject(args[1]);
        if (view == NULL) { PyErr_Clear(); Py_RETURN_NONE; }
    }
    /* Bytes only: a view of another item size or shape is read otherwise by the Python scan
     * (its items are not bytes); a released view fails here, as it does there. */
    const Py_buffer *info = PyMemoryView_GET_BUFFER(view);
    Py_buffer v;
    if (info->ndim != 1 || info->itemsize != 1
        || (info->format != NULL && strcmp(info->format, "B") != 0)
        || PyObject_GetBuffer(view, &v, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_DECREF(view);
        Py_RETURN_NONE;
    }
    const uint8_t *b = v.buf;
    Py_ssize_t end = v.len, pos = 0, offsets[3];
    int r = read_string(b, end, &pos, flexible, &txn);
    if (r < 0) goto done;
    r = -1;
    if (pos + 6 > end) goto done;
    int32_t acks = be16(b + pos), timeout_ms = be32(b + pos + 2);
    pos += 6;
    r = scan_topics(view, b, end, flexible, &pos, &topics, offsets);
    if (r < 0) goto done;
    r = -1;
    if (flexible) {
        if (pos >= end || b[pos] != 0) goto done;
        pos++;
    }
    if (pos != end) goto done;  /* trailing bytes */
    PyBuffer_Release(&v);
    Py_DECREF(view);
    PyObject *items[9] = {Py_NewRef(args[0]), PyBool_FromLong(flexible), txn,
                          PyLong_FromLong(acks), PyLong_FromLong(timeout_ms), topics,
                          INT(offsets[0]), INT(offsets[1]), INT(offsets[2])};
    return make_slot(layout_type, 9, items);
done:
    PyBuffer_Release(&v);
    Py_DECREF(view);
    Py_XDECREF(txn);
    Py_XDECREF(topics);
    if (r == -2) return NULL;
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* An error-free flexible Produce partition response ends, 30 bytes in, with an empty
 * record_errors array, a null error_message and an empty tag section. */
#define PLAIN_PART 30

/* 1: may carry tags (or malformed: the full decode reports it), 0: proven not to,
 * -1: a partition that is not plain, for the Python reader's generic skip. */
static int produce_tagged(const uint8_t *b, Py_ssize_t end, Py_ssize_t pos, int by_id) {
    int64_t n_topics, n_parts, n;
    if (compact_count(b, end, &pos, &n_topics) < 0) return 1;
    if (n_topics * 2 > end - pos) return 1;
    for (int64_t t = 0; t < n_topics; t++) {
        if (by_id) {
            pos += 16;
        } else {
            if (compact_count(b, end, &pos, &n) < 0) return 1;
            if (n > 0) pos += n;  /* the name: n + 1 - 1 bytes */
        }
        if (compact_count(b, end, &pos, &n_parts) < 0) return 1;
        if (n_parts * 14 > end - pos) return 1;
        for (int64_t p = 0; p < n_parts; p++) {
            Py_ssize_t after = pos + PLAIN_PART;
            if (after + 3 <= end && b[after] == 1 && b[after + 1] == 0 && b[after + 2] == 0)
                pos = after + 3;
            else
                return -1;
        }
        if (tags(b, end, &pos) < 0) return 1;
    }
    return !(pos + 5 == end && b[end - 1] == 0);
}

static PyObject *produce_response_tagged(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "produce_response_tagged(body, start, by_id)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    int by_id = PyObject_IsTrue(args[2]);
    if (by_id < 0) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_SIMPLE) < 0) return NULL;
    int r = start < 0 ? -1 : produce_tagged(v.buf, v.len, start, by_id);
    PyBuffer_Release(&v);
    return PyLong_FromLong(r);
}

/* A nested tag section that must be empty (one 0 byte) for the walk to go on: 0 it is,
 * 1 past the end, -1 it is not. A known tag (a partition's current_leader, diverging_epoch,
 * snapshot_id) is read by a client as its struct, whatever size it declares; skipped by its
 * size here, a hostile broker's struct ending early would hide from this walk what a client
 * then reads (node endpoints included), so the schema walk decides (review, round 39). */
static inline int empty_tags(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos) {
    if (*pos >= end) return 1;
    if (b[*pos] != 0) return -1;
    (*pos)++;
    return 0;
}

/* codec/fetch_splice.py fetch_response_tagged's walk: 1 may carry tags (or malformed), 0 not,
 * -1 a nested tag section that is not empty (the schema walk decides). */
static int fetch_tagged(const uint8_t *b, Py_ssize_t end, Py_ssize_t pos, int by_id,
                        Py_ssize_t fixed, Py_ssize_t replica) {
    int64_t n_topics, n_parts, n, n_aborted;
    int r;
    if (compact_count(b, end, &pos, &n_topics) < 0) return 1;
    if (n_topics * (by_id ? 18 : 3) > end - pos) return 1;
    for (int64_t t = 0; t < n_topics; t++) {
        if (by_id) {
            pos += 16;
        } else {
            if (compact_count(b, end, &pos, &n) < 0) return 1;
            if (n > 0) pos += n;
        }
        if (compact_count(b, end, &pos, &n_parts) < 0) return 1;
        if (n_parts * (fixed + replica + 3) > end - pos) return 1;
        for (int64_t p = 0; p < n_parts; p++) {
            pos += fixed;
            if (compact_count(b, end, &pos, &n_aborted) < 0) return 1;
            if (n_aborted > 0) {
                if (n_aborted * 17 > end - pos) return 1;
                for (int64_t a = 0; a < n_aborted; a++) {
                    pos += 16;
                    if ((r = empty_tags(b, end, &pos)) != 0) return r;
                }
            }
            pos += replica;
            int64_t size;
            if (uvarint(b, end, &pos, &size) < 0) return 1;
            if (size > 1) {
                pos += size - 1;
                if (pos > end) return 1;
            }
            if ((r = empty_tags(b, end, &pos)) != 0) return r;
        }
        if ((r = empty_tags(b, end, &pos)) != 0) return r;
    }
    return !(pos + 1 == end && b[pos] == 0);
}

static PyObject *fetch_response_tagged(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "fetch_response_tagged(body, start, by_id, fixed, replica, top_fixed)");
        return NULL;
    }
    Py_ssize_t nums[5];
    int idx[5] = {1, 3, 4, 5, 2};
    for (int i = 0; i < 5; i++) {
        nums[i] = PyNumber_AsSsize_t(args[idx[i]], PyExc_OverflowError);
        if (nums[i] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_ssize_t start = nums[0], fixed = nums[1], replica = nums[2], top_fixed = nums[3];
    int by_id = nums[4] != 0;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_SIMPLE) < 0) return NULL;
    int r = 1;
    if (start >= 0 && fixed >= 0 && replica >= 0 && top_fixed >= 0)
        r = fetch_tagged(v.buf, v.len, start + top_fixed, by_id, fixed, replica);
    PyBuffer_Release(&v);
    return PyLong_FromLong(r);
}

/* The frames of b[0:n] when it holds whole frames only, back to back, each size within
 * 0..max: their count, or -1 (a frame cut at the end, a size outside that range). */
static Py_ssize_t count_whole(const uint8_t *b, Py_ssize_t n, long long max) {
    Py_ssize_t pos = 0, count = 0;
    while (n - pos >= 4) {
        int32_t size = be32(b + pos);
        if (size < 0 || size > max) return -1;
        pos += 4 + (Py_ssize_t)size;
        if (pos > n) return -1;
        count++;
    }
    return pos == n ? count : -1;
}

/* max_frame_size as the Python reader takes it: any limit a long long cannot hold is above
 * every int32 size (none refused); an OverflowError here failed every read of every
 * connection of a proxy configured with such a limit. -2 with an exception set. */
static long long frame_limit(PyObject *arg) {
    int overflow;
    long long max = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (max == -1 && PyErr_Occurred()) return -2;
    if (overflow) max = overflow > 0 ? LLONG_MAX : -1;
    return max;
}

/* The frame bodies of owner's first n bytes (at b) as slices of one view of it (read-only
 * when `readonly`), when they are whole frames only (count_whole); None for anything else. */
static PyObject *frames_of(PyObject *owner, const uint8_t *b, Py_ssize_t n, PyObject *max_arg,
                           int readonly) {
    long long max = frame_limit(max_arg);
    if (max == -2) return NULL;
    Py_ssize_t count = count_whole(b, n, max);
    if (count < 0) Py_RETURN_NONE;
    PyObject *out = PyList_New(count);
    if (out == NULL || count == 0) return out;
    PyObject *view = PyMemoryView_FromObject(owner);
    if (view != NULL && readonly) {
        PyObject *writable = view;
        view = PyObject_CallMethod(writable, "toreadonly", NULL);
        Py_DECREF(writable);
    }
    if (view == NULL) goto error;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t size = be32(b + pos);
        PyObject *lo = PyLong_FromSsize_t(pos + 4), *hi = PyLong_FromSsize_t(pos + 4 + size);
        if (lo == NULL || hi == NULL) { Py_XDECREF(lo); Py_XDECREF(hi); goto error; }
        PyObject *slice = PySlice_New(lo, hi, NULL), *frame;
        Py_DECREF(lo);
        Py_DECREF(hi);
        if (slice == NULL) goto error;
        frame = PyObject_GetItem(view, slice);
        Py_DECREF(slice);
        if (frame == NULL) goto error;
        PyList_SET_ITEM(out, i, frame);
        pos += 4 + size;
    }
    Py_DECREF(view);
    return out;
error:
    Py_XDECREF(view);
    Py_DECREF(out);
    return NULL;
}

/* whole_frames(data, max_frame_size) -> [memoryview, ...] of the frame bodies of `data` (a
 * bytes object) when it holds whole frames only, back to back; None for anything else (a
 * frame cut at the end, a size outside 0..max_frame_size): codec/frames.py's FrameBuffer
 * then reads it, raising what it raises. The views are slices of one view of `data`, as
 * FrameBuffer hands them out. */
static PyObject *whole_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "whole_frames(bytes, max_frame_size)");
        return NULL;
    }
    return frames_of(args[0], (const uint8_t *)PyBytes_AS_STRING(args[0]),
                     PyBytes_GET_SIZE(args[0]), args[1], 0);
}

/* The arguments of a call that takes a bytearray and a size (`wanted` arguments in all): the
 * size in *n; -1 with TypeError (`usage`) or OverflowError. */
static int bytearray_and_size(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t wanted,
                              const char *usage, Py_ssize_t *n) {
    if (nargs != wanted || !PyByteArray_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *n = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    return *n == -1 && PyErr_Occurred() ? -1 : 0;
}

/* read_frames(buffer, nbytes, max_frame_size) -> [memoryview, ...] of the frame bodies of
 * buffer[:nbytes] (a bytearray a socket was read into) when they are whole frames only, as
 * whole_frames; None for anything else. The views are read-only slices of the buffer itself,
 * not of a copy: codec/frames.py hands the buffer over with them (a large request's read is
 * forwarded from the buffer the socket read it into) and never writes into it again. */
static PyObject *read_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t n;
    if (bytearray_and_size(args, nargs, 3, "read_frames(bytearray, nbytes, max_frame_size)",
                           &n) < 0)
        return NULL;
    if (n < 0 || n > PyByteArray_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "read_frames: nbytes outside the buffer");
        return NULL;
    }
    return frames_of(args[0], (const uint8_t *)PyByteArray_AS_STRING(args[0]), n, args[2], 1);
}

/* unfilled(n) -> bytearray of n bytes, not zeroed: bytearray(n) writes n zeros that the socket
 * overwrites at once (for a 1 MB Fetch response a memset as long as the copy it saves). Its
 * bytes are never read before they are written: codec/frames.py hands a frame out only once
 * every byte of it came from the socket. */
static PyObject *unfilled(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "unfilled(n) needs n >= 0");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, n);
}

/* grow(buffer, n): the bytearray resized to n bytes in place (realloc: for a buffer the C
 * library mapped on its own, the kernel remaps its pages, no copy), the new bytes not zeroed;
 * BufferError while a view of it is alive. */
static PyObject *grow(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t n;
    if (bytearray_and_size(args, nargs, 2, "grow(bytearray, n)", &n) < 0) return NULL;
    if (n < PyByteArray_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "grow(buffer, n) needs n >= len(buffer)");
        return NULL;
    }
    if (PyByteArray_Resize(args[0], n) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"unfilled", unfilled, METH_O, "unfilled(n) -> bytearray of n bytes, not zeroed"},
    {"grow", (PyCFunction)(void (*)(void))grow, METH_FASTCALL,
     "grow(bytearray, n): resized in place to n bytes, not zeroed"},
    {"whole_frames", (PyCFunction)(void (*)(void))whole_frames, METH_FASTCALL,
     "whole_frames(bytes, max_frame_size) -> [memoryview, ...] | None"},
    {"read_frames", (PyCFunction)(void (*)(void))read_frames, METH_FASTCALL,
     "read_frames(bytearray, nbytes, max_frame_size) -> [read-only memoryview, ...] | None"},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL,
     "setup(RequestHeader, ProduceTopics, flexible table, produce shapes, "
     "ProduceRequestLayout, TopicSlot, PartitionSlot)"},
    {"request_header", request_header, METH_O, "request_header(frame) -> RequestHeader | None"},
    {"produce_head", (PyCFunction)(void (*)(void))produce_head, METH_FASTCALL,
     "produce_head(frame, start, version) -> ProduceTopics | None"},
    {"scan_produce_request", (PyCFunction)(void (*)(void))scan_produce_request, METH_FASTCALL,
     "scan_produce_request(version, body) -> ProduceRequestLayout | None"},
    {"produce_response_tagged", (PyCFunction)(void (*)(void))produce_response_tagged,
     METH_FASTCALL, "produce_response_tagged(body, start, by_id) -> 1 | 0 | -1"},
    {"fetch_response_tagged", (PyCFunction)(void (*)(void))fetch_response_tagged,
     METH_FASTCALL,
     "fetch_response_tagged(body, start, by_id, fixed, replica, top_fixed) -> 1 | 0 | -1"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_passthrough",
    "The pass-through fast path's readers (codec/passthrough.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__passthrough(void) { return PyModule_Create(&module); }
