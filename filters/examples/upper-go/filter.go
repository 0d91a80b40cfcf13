// Example (seeds 001/002): upper-case every record value, written with the Go SDK.
//
// ASCII letters a-z become A-Z; other bytes (UTF-8 included) pass unchanged. Null values
// (tombstones) are kept as they are. Counts upper-cased records as "upper_cased". The same
// filter as filters/examples/upper (Zig), upper-c, upper-rust and upper-as.
package main

import "sluice"

type upper struct{}

func (upper) OnRecord(rec *sluice.Record) (sluice.Decision, error) {
	v := rec.Value
	first := 0
	for first < len(v) && (v[first] < 'a' || v[first] > 'z') {
		first++
	}
	if first >= len(v) {
		return sluice.KeepRecord(), nil // null, empty or nothing to change
	}
	out := sluice.Alloc(len(v)) // valid until the batch is answered, like C's sluice_malloc
	out = out[:len(v)]          // the same length as v: no bounds check per byte below
	for i, c := range v {
		if c-'a' < 26 { // a-z (the subtraction wraps below 'a')
			c -= 'a' - 'A'
		}
		out[i] = c
	}
	sluice.Count("upper_cased", 1)
	return rec.WithValue(out), nil
}

func init() {
	sluice.Register(func(*sluice.JSON) (sluice.Filter, error) { return upper{}, nil })
}

func main() {}
