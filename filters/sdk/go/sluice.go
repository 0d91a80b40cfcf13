// Package sluice is the Go SDK for Sluice Wasm filters (Sluice Wasm ABI v1).
//
// A filter is ONE Go file (filter.go, package main) built with the standard toolchain as a
// WASI reactor (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared); `sluice filter build`
// runs that. It registers a configure function in init:
//
//	package main
//
//	import "sluice"
//
//	type upper struct{}
//
//	func (upper) OnRecord(rec *sluice.Record) (sluice.Decision, error) {
//		if rec.Value == nil {
//			return sluice.Keep(), nil
//		}
//		return rec.WithValue(bytes.ToUpper(rec.Value)), nil
//	}
//
//	func init() {
//		sluice.Register(func(config *sluice.JSON) (sluice.Filter, error) { return upper{}, nil })
//	}
//
//	func main() {}
//
// The package exports (//go:wasmexport) sluice_abi_version, sluice_alloc, sluice_init,
// sluice_filter, sluice_filter_records (the host's fast path over Kafka's own record encoding:
// kept records are copied verbatim, one call per batch), sluice_admin and sluice_last_error.
//
// Memory: record slices (Key, Value, header keys and values) point into the host's input and
// are valid until the call returns; copy what you keep across batches. The *Record is reused
// for the next record: do not keep the pointer. Go's garbage collector
// frees the rest. A nil slice is a null key, value or header value; an empty non-nil slice is
// an empty one.
package sluice

import "errors"

// ABIVersion is the Sluice Wasm ABI this package implements.
const ABIVersion = 1

// Direction is produce (client -> broker) or fetch (broker -> client).
type Direction uint8

const (
	Produce Direction = 0
	Fetch   Direction = 1
)

// Header is one record header: the key is never null, the value may be (nil).
type Header struct {
	Key   []byte
	Value []byte
}

// Record is one record and its context.
type Record struct {
	Direction Direction
	Topic     string
	Partition int32
	ClientID  string // "" when the client sent none
	Principal string // "" when unauthenticated
	// Index is the record's position in the batch.
	Index uint32
	// Offset is the offset delta within the batch on produce, the absolute offset on fetch.
	Offset      int64
	TimestampMs int64
	Key         []byte // nil: null key
	Value       []byte // nil: null value (a tombstone)
	Headers     []Header
}

// Header returns the value of the first header called name (nil when absent or null).
func (r *Record) Header(name string) []byte {
	for i := range r.Headers {
		if string(r.Headers[i].Key) == name {
			return r.Headers[i].Value
		}
	}
	return nil
}

// WithValue is a rewrite with the same key and headers and a new value.
func (r *Record) WithValue(value []byte) Decision {
	return Decision{Action: Rewrite, Key: r.Key, Value: value, Headers: r.Headers}
}

// WithKey is a rewrite with the same value and headers and a new key (nil: no key).
func (r *Record) WithKey(key []byte) Decision {
	return Decision{Action: Rewrite, Key: key, Value: r.Value, Headers: r.Headers}
}

// Action is what becomes of a record.
type Action uint8

const (
	// Keep passes the record on unchanged.
	Keep Action = 0
	// Rewrite passes it on with a new key, value and headers (offset, timestamp and attributes
	// are kept).
	Rewrite Action = 1
	// Drop silently removes it.
	Drop Action = 2
	// Reject refuses it: the producer gets INVALID_RECORD with the reason.
	Reject Action = 3
)

// Decision is the answer for one record. The zero value keeps the record.
type Decision struct {
	Action  Action
	Key     []byte
	Value   []byte
	Headers []Header
	Reason  string
}

// KeepRecord passes the record on unchanged.
func KeepRecord() Decision { return Decision{Action: Keep} }

// DropRecord silently removes the record.
func DropRecord() Decision { return Decision{Action: Drop} }

// RejectRecord refuses the record with a reason (at most 500 characters are kept).
func RejectRecord(reason string) Decision { return Decision{Action: Reject, Reason: reason} }

// RewriteRecord replaces key, value and headers as a whole.
func RewriteRecord(key, value []byte, headers []Header) Decision {
	return Decision{Action: Rewrite, Key: key, Value: value, Headers: headers}
}

// Filter is what a filter author writes: OnRecord runs once per record. An error fails the
// whole batch (the filter's on_error policy applies); prefer RejectRecord for a bad record.
type Filter interface {
	OnRecord(rec *Record) (Decision, error)
}

// AdminFilter is a Filter that also answers admin requests (FILTER_ABI.md section 5): one
// resource request as JSON in, a JSON answer out.
type AdminFilter interface {
	Filter
	OnAdmin(request []byte) ([]byte, error)
}

// Configure builds the filter from its `config:` mapping (a JSON null without one). An error
// refuses the configuration: the proxy does not start and prints the message.
type Configure func(config *JSON) (Filter, error)

var (
	configure Configure
	filter    Filter
)

// Register sets the filter's configure function; call it from an init function.
func Register(fn Configure) { configure = fn }

// Count adds n to the detector counter name for this batch (reported to the host's
// telemetry). At most 32 names per batch.
func Count(name string, n uint32) {
	for i := 0; i < counterN; i++ {
		if counters[i].name == name {
			counters[i].n += n
			return
		}
	}
	if counterN < maxCounters {
		counters[counterN] = counter{name, n}
		counterN++
	}
}

const maxCounters = 32

type counter struct {
	name string
	n    uint32
}

var (
	counters [maxCounters]counter
	counterN int
	errBuf   [256]byte
	errLen   int
)

// SetError sets the message the host reads through sluice_last_error (first 256 bytes kept).
func SetError(message string) {
	errLen = copy(errBuf[:], message)
}

var errNoFilter = errors.New("no filter registered: call sluice.Register in an init function")
