// Example (seed 000, Sluice ABI): enrich JSON events with a timestamp and drop events without
// a user_id, written with the Go SDK (the same filter as filters/examples/enrich in C).
//
//   - value not a JSON object  -> reject ("value is not a JSON object: <parser error>")
//   - no top-level "user_id"   -> drop
//   - no top-level "timestamp" -> add "timestamp": the record's own timestamp as RFC 3339 UTC
//     with milliseconds (a Wasm filter has no clock; the record timestamp is what the
//     producer set)
//   - otherwise                -> keep, byte for byte
//
// The original text is kept as it is; the new member is appended before the closing brace.
package main

import (
	"bytes"

	"sluice"
)

// civilFromDays turns days since 1970-01-01 into a civil date (proleptic Gregorian).
func civilFromDays(z int64) (y, m, d int64) {
	z += 719468
	era := z
	if era < 0 {
		era -= 146096
	}
	era /= 146097
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = doy - (153*mp+2)/5 + 1
	m = mp + 3
	if mp >= 10 {
		m = mp - 9
	}
	y = yoe + era*400
	if m <= 2 {
		y++
	}
	return y, m, d
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func digits(out []byte, v int64, width int) []byte {
	var tmp [8]byte
	for i := width - 1; i >= 0; i-- {
		tmp[i] = byte('0' + v%10)
		v /= 10
	}
	return append(out, tmp[:width]...)
}

func rfc3339(out []byte, ms int64) []byte {
	secs := floorDiv(ms, 1000)
	days := floorDiv(secs, 86400)
	sod := secs - days*86400
	y, m, d := civilFromDays(days)
	out = digits(out, y, 4)
	out = append(out, '-')
	out = digits(out, m, 2)
	out = append(out, '-')
	out = digits(out, d, 2)
	out = append(out, 'T')
	out = digits(out, sod/3600, 2)
	out = append(out, ':')
	out = digits(out, sod/60%60, 2)
	out = append(out, ':')
	out = digits(out, sod%60, 2)
	out = append(out, '.')
	out = digits(out, ms-secs*1000, 3)
	return append(out, 'Z')
}

type enrich struct{}

func (enrich) OnRecord(rec *sluice.Record) (sluice.Decision, error) {
	if rec.Value == nil {
		return sluice.RejectRecord("value is not a JSON object: null value"), nil
	}
	doc, err := sluice.ParseJSON(rec.Value)
	if err != nil {
		return sluice.RejectRecord("value is not a JSON object: " + err.Message), nil
	}
	if doc.Kind != sluice.Object {
		return sluice.RejectRecord("value is not a JSON object"), nil
	}
	if doc.Get("user_id") == nil {
		sluice.Count("dropped_no_user_id", 1)
		return sluice.DropRecord(), nil
	}
	if doc.Get("timestamp") != nil {
		return sluice.KeepRecord(), nil
	}
	// The object has a member (user_id), so a comma goes before the new one.
	closing := bytes.LastIndexByte(rec.Value, '}')
	out := make([]byte, 0, len(rec.Value)+40)
	out = append(out, rec.Value[:closing]...)
	out = append(out, `,"timestamp":"`...)
	out = rfc3339(out, rec.TimestampMs)
	out = append(out, '"')
	out = append(out, rec.Value[closing:]...)
	sluice.Count("timestamp_added", 1)
	return rec.WithValue(out), nil
}

func init() {
	sluice.Register(func(*sluice.JSON) (sluice.Filter, error) { return enrich{}, nil })
}

func main() {}
