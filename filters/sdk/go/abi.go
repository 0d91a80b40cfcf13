package sluice

import (
	"encoding/binary"
	"unsafe"
)

// The ABI exports. The host calls sluice_alloc exactly once before each call and writes the
// call's input there; the output stays referenced by outBuf until the next call, so the
// garbage collector keeps it while the host reads it.

var (
	inBuf  []byte
	outBuf []byte
)

//go:wasmexport sluice_abi_version
func abiVersion() int32 { return ABIVersion }

//go:wasmexport sluice_alloc
func alloc(size int32) int32 {
	n := int(size)
	if n < 1 {
		n = 1
	}
	if cap(inBuf) < n {
		inBuf = make([]byte, n)
	}
	inBuf = inBuf[:cap(inBuf)]
	return int32(uintptr(unsafe.Pointer(&inBuf[0])))
}

//go:wasmexport sluice_last_error
func lastError() int64 { return pack(errBuf[:errLen]) }

// input is the call's input: normally the buffer sluice_alloc handed out.
func input(ptr, size int32) []byte {
	errLen = 0
	counterN = 0
	hdrUsed = 0
	resetArena()
	if size <= 0 {
		return nil
	}
	if len(inBuf) >= int(size) && uintptr(unsafe.Pointer(&inBuf[0])) == uintptr(uint32(ptr)) {
		return inBuf[:size]
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(uintptr(uint32(ptr)))), int(size))
}

func pack(b []byte) int64 {
	if len(b) == 0 {
		return 0
	}
	return int64(uint64(uintptr(unsafe.Pointer(&b[0])))<<32 | uint64(len(b)))
}

func finish(out []byte) int64 {
	outBuf = out
	return pack(out)
}

func fail(message string) int64 {
	if errLen == 0 {
		SetError(message)
	}
	return -1
}

func failErr(err error, fallback string) int64 {
	if err == nil || err.Error() == "" {
		return fail(fallback)
	}
	return fail(err.Error())
}

//go:wasmexport sluice_init
func initFilter(ptr, size int32) int32 {
	cfg := input(ptr, size)
	config := &JSON{Kind: Null}
	if len(cfg) > 0 {
		var perr *JSONError
		if config, perr = ParseJSON(cfg); perr != nil {
			SetError("configuration is not valid JSON")
			return 1
		}
	}
	if configure == nil {
		SetError(errNoFilter.Error())
		return 1
	}
	f, err := configure(config)
	if err != nil || f == nil {
		failErr(err, "configuration rejected by the filter")
		return 1
	}
	filter = f
	return 0
}

func ensure() bool {
	if filter != nil {
		return true
	}
	if configure == nil {
		fail(errNoFilter.Error())
		return false
	}
	f, err := configure(&JSON{Kind: Null})
	if err != nil || f == nil {
		failErr(err, "filter needs a configuration")
		return false
	}
	filter = f
	return true
}

// Headers of a call's records come from one pool, reused by the next call: no allocation per
// record.
var (
	hdrPool []Header
	hdrUsed int
)

func headers(n int) []Header {
	if hdrUsed+n > len(hdrPool) {
		// Slices already handed out keep the old array alive until the call ends.
		hdrPool = make([]Header, 2*len(hdrPool)+n)
		hdrUsed = 0
	}
	h := hdrPool[hdrUsed : hdrUsed+n : hdrUsed+n]
	hdrUsed += n
	return h
}

type reader struct {
	buf []byte
	pos int
	ok  bool
}

func (r *reader) left() int { return len(r.buf) - r.pos }

func (r *reader) u8() byte {
	if r.left() < 1 {
		r.ok = false
		return 0
	}
	r.pos++
	return r.buf[r.pos-1]
}

func (r *reader) u32() uint32 {
	if r.left() < 4 {
		r.ok = false
		return 0
	}
	r.pos += 4
	return binary.LittleEndian.Uint32(r.buf[r.pos-4:])
}

func (r *reader) i64() int64 {
	if r.left() < 8 {
		r.ok = false
		return 0
	}
	r.pos += 8
	return int64(binary.LittleEndian.Uint64(r.buf[r.pos-8:]))
}

// take returns n bytes for a length just read (-1 = null where nullable).
func (r *reader) take(n int64, nullable bool) []byte {
	if !r.ok {
		return nil
	}
	if n < 0 {
		if !nullable || n != -1 {
			r.ok = false
		}
		return nil
	}
	if int64(r.left()) < n {
		r.ok = false
		return nil
	}
	start := r.pos
	r.pos += int(n)
	return r.buf[start:r.pos:r.pos]
}

func (r *reader) bytes(nullable bool) []byte {
	return r.take(int64(int32(r.u32())), nullable)
}

func (r *reader) str() []byte {
	b := r.bytes(false)
	if b == nil {
		return []byte{}
	}
	return b
}

func (r *reader) varlong() int64 {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		if r.pos >= len(r.buf) {
			break
		}
		b := r.buf[r.pos]
		r.pos++
		v |= uint64(b&0x7f) << shift
		if b&0x80 == 0 {
			return int64(v>>1) ^ -int64(v&1)
		}
	}
	r.ok = false
	return 0
}

// varint reads one of Kafka's 32-bit varint fields; anything wider is a malformed record. Most
// fields are one byte long: that case is small enough to be inlined (a call costs more than
// the decoding in Go's Wasm code).
func (r *reader) varint() int32 {
	if r.pos < len(r.buf) {
		if b := r.buf[r.pos]; b < 0x80 {
			r.pos++
			return int32(b>>1) ^ -int32(b&1)
		}
	}
	return r.varintSlow()
}

func (r *reader) varintSlow() int32 {
	v := r.varlong()
	if v < -1<<31 || v > 1<<31-1 {
		r.ok = false
	}
	if !r.ok {
		return 0
	}
	return int32(v)
}

func (r *reader) vbytes(nullable bool) []byte {
	return r.take(int64(r.varint()), nullable)
}

func w32(out []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(out, v) }

func wbytes(out []byte, b []byte, null bool) []byte {
	if null {
		return w32(out, 0xffffffff)
	}
	out = w32(out, uint32(len(b)))
	return append(out, b...)
}

func zigzag(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

func vsize(v int64) int {
	z, n := zigzag(v), 1
	for z > 0x7f {
		z >>= 7
		n++
	}
	return n
}

func wvar(out []byte, v int64) []byte {
	z := zigzag(v)
	for z > 0x7f {
		out = append(out, byte(z)&0x7f|0x80)
		z >>= 7
	}
	return append(out, byte(z))
}

// wvarSmall is wvar with the one-byte case (most record fields) inlined at the call.
func wvarSmall(out []byte, v int64) []byte {
	if v >= -64 && v < 64 {
		return append(out, byte(zigzag(v)))
	}
	return wvar(out, v)
}

func vblen(b []byte) int {
	if b == nil {
		return 1
	}
	return vsize(int64(len(b))) + len(b)
}

func wvbytes(out []byte, b []byte) []byte {
	if b == nil {
		return wvar(out, -1)
	}
	return append(wvar(out, int64(len(b))), b...)
}

func writeCounters(out []byte) []byte {
	out = w32(out, uint32(counterN))
	for _, c := range counters[:counterN] {
		out = w32(out, uint32(len(c.name)))
		out = append(out, c.name...)
		out = w32(out, c.n)
	}
	return out
}

// readContext reads the fields both batch entry points start with; false (error set) on a
// foreign version.
func readContext(r *reader) (Record, bool) {
	version := r.u32()
	if r.ok && version != ABIVersion {
		SetError("unsupported input version")
		return Record{}, false
	}
	var rec Record
	if r.u8() == 1 {
		rec.Direction = Fetch
	}
	rec.Topic = string(r.str())
	rec.Partition = int32(r.u32())
	rec.ClientID = string(r.str())
	rec.Principal = string(r.str())
	return rec, true
}

// out returns the reused output buffer, emptied, with room for n bytes.
func out(n int) []byte {
	if cap(outBuf) < n {
		outBuf = make([]byte, 0, n)
	}
	return outBuf[:0]
}

//go:wasmexport sluice_filter
func filterBatch(ptr, size int32) int64 {
	in := input(ptr, size)
	if !ensure() {
		return -1
	}
	r := reader{buf: in, ok: true}
	ctx, ok := readContext(&r)
	if !ok {
		return -1
	}
	count := r.u32()
	if !r.ok || int(count) > r.left()/28+1 {
		return fail("malformed batch header")
	}
	o := w32(out(64+int(count)), count)
	for i := uint32(0); i < count; i++ {
		rec := &current
		*rec = ctx
		rec.Index = i
		rec.Offset = r.i64()
		rec.TimestampMs = r.i64()
		rec.Key = r.bytes(true)
		rec.Value = r.bytes(true)
		hc := r.u32()
		if !r.ok || int(hc) > r.left()/8 {
			return fail("malformed record")
		}
		if hc > 0 {
			rec.Headers = headers(int(hc))
			for j := range rec.Headers {
				rec.Headers[j].Key = r.str()
				rec.Headers[j].Value = r.bytes(true)
			}
		}
		if !r.ok {
			return fail("malformed header")
		}
		d, err := filter.OnRecord(rec)
		if err != nil {
			return failErr(err, "filter error")
		}
		if d.Action > Reject {
			return fail("filter returned an unknown action")
		}
		o = append(o, byte(d.Action))
		switch d.Action {
		case Rewrite:
			o = wbytes(o, d.Key, d.Key == nil)
			o = wbytes(o, d.Value, d.Value == nil)
			o = w32(o, uint32(len(d.Headers)))
			for _, h := range d.Headers {
				o = wbytes(o, h.Key, false)
				o = wbytes(o, h.Value, h.Value == nil)
			}
		case Reject:
			o = wbytes(o, []byte(d.Reason), false)
		}
	}
	return finish(writeCounters(o))
}

// current is the record handed to OnRecord, reused for every record: a fresh one would escape
// to the heap (through the interface call) once per record.
var current Record

type native struct {
	raw            []byte
	attributes     byte
	timestampDelta int64
	offsetDelta    int32
	body           int // a rewrite's record size (without its length prefix)
	d              Decision
}

func rewriteBody(n *native) int {
	d := &n.d
	size := 1 + vsize(n.timestampDelta) + vsize(int64(n.offsetDelta)) + vblen(d.Key) +
		vblen(d.Value) + vsize(int64(len(d.Headers)))
	for _, h := range d.Headers {
		size += vsize(int64(len(h.Key))) + len(h.Key) + vblen(h.Value)
	}
	return size
}

var natives []native

//go:wasmexport sluice_filter_records
func filterRecords(ptr, size int32) int64 {
	in := input(ptr, size)
	if !ensure() {
		return -1
	}
	r := reader{buf: in, ok: true}
	ctx, ok := readContext(&r)
	if !ok {
		return -1
	}
	offsetBase := r.i64()
	timestampBase := r.i64()
	count := r.u32()
	// The smallest Kafka record is 7 bytes (length and six one-byte fields).
	if !r.ok || int(count) > r.left()/7+1 {
		return fail("malformed batch header")
	}
	if cap(natives) < int(count) {
		natives = make([]native, 0, count)
	}
	natives = natives[:0]
	recs := natives[:0]
	// The previous batch's decisions must not keep its values alive.
	defer clear(natives[:cap(natives)])
	var changed, rejects uint32
	recordsSize := 0
	for i := uint32(0); i < count; i++ {
		start := r.pos
		n := r.varint()
		if !r.ok || n < 0 || r.left() < int(n) {
			return fail("malformed record")
		}
		body := reader{buf: in[r.pos : r.pos+int(n)], ok: true}
		r.pos += int(n)
		// Filled in place: building a native and appending it would copy it once more.
		recs = recs[:i+1]
		nat := &recs[i]
		nat.raw = in[start:r.pos]
		nat.attributes = body.u8()
		nat.timestampDelta = body.varlong()
		nat.offsetDelta = body.varint()
		rec := &current
		*rec = ctx
		rec.Index = i
		rec.Offset = offsetBase + int64(nat.offsetDelta)
		rec.TimestampMs = timestampBase + nat.timestampDelta
		rec.Key = body.vbytes(true)
		rec.Value = body.vbytes(true)
		hc := body.varint()
		if !body.ok || hc < 0 || int(hc) > body.left()/2 {
			return fail("malformed record")
		}
		if hc > 0 {
			rec.Headers = headers(int(hc))
			for j := range rec.Headers {
				k := body.vbytes(false)
				if k == nil {
					k = []byte{}
				}
				rec.Headers[j].Key = k
				rec.Headers[j].Value = body.vbytes(true)
			}
		}
		if !body.ok || body.left() != 0 {
			return fail("malformed record")
		}
		d, err := filter.OnRecord(rec)
		if err != nil {
			return failErr(err, "filter error")
		}
		nat.d = d
		switch d.Action {
		case Keep:
			recordsSize += len(nat.raw)
		case Rewrite:
			b := rewriteBody(nat)
			nat.body = b
			recordsSize += vsize(int64(b)) + b
			changed++
		case Drop:
			changed++
		case Reject:
			changed++
			rejects++
		default:
			return fail("filter returned an unknown action")
		}
	}
	natives = recs
	if r.left() != 0 {
		return fail("malformed batch: bytes after the last record")
	}
	if recordsSize > 0x7fffffff {
		return fail("output too large")
	}
	want := 16 + int(count)
	if changed > 0 {
		want += recordsSize
	}
	o := w32(out(want), count)
	for i := range recs {
		o = append(o, byte(recs[i].d.Action))
	}
	if changed == 0 {
		o = w32(o, 0xffffffff) // -1: the records section is unchanged
	} else {
		o = w32(o, uint32(recordsSize))
		for i := range recs {
			n := &recs[i]
			switch n.d.Action {
			case Keep:
				o = append(o, n.raw...)
			case Rewrite:
				o = wvar(o, int64(n.body))
				o = append(o, n.attributes)
				o = wvarSmall(o, n.timestampDelta)
				o = wvarSmall(o, int64(n.offsetDelta))
				o = wvbytes(o, n.d.Key)
				o = wvbytes(o, n.d.Value)
				o = wvarSmall(o, int64(len(n.d.Headers)))
				for _, h := range n.d.Headers {
					o = wvar(o, int64(len(h.Key)))
					o = append(o, h.Key...)
					o = wvbytes(o, h.Value)
				}
			}
		}
	}
	o = w32(o, rejects)
	for i := range recs {
		if recs[i].d.Action == Reject {
			o = w32(o, uint32(i))
			o = wbytes(o, []byte(recs[i].d.Reason), false)
		}
	}
	return finish(writeCounters(o))
}

// HandleAdmin is sluice_admin's body; the sluice/admin package exports it. Filters that answer
// admin requests import that package (import _ "sluice/admin") and implement AdminFilter: a
// module exports sluice_admin only then, so one without it cannot be bound to admin.
func HandleAdmin(ptr, size int32) int64 {
	in := input(ptr, size)
	if !ensure() {
		return -1
	}
	a, ok := filter.(AdminFilter)
	if !ok {
		return fail("this filter does not handle admin requests")
	}
	res, err := a.OnAdmin(in)
	if err != nil {
		return failErr(err, "admin handler failed")
	}
	if len(res) == 0 {
		return fail("admin handler returned nothing")
	}
	return finish(res)
}
