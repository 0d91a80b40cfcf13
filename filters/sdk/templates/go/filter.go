// {{NAME}}: a Sluice Wasm filter (Sluice ABI v1, Go SDK).
//
// OnRecord runs once per record and returns what becomes of it:
//
//	sluice.KeepRecord()                      pass it on unchanged
//	rec.WithValue(b)                         pass it on with a new value (rec.WithKey: new key)
//	sluice.RewriteRecord(key, value, hdrs)   ... or a new key, value and headers
//	sluice.DropRecord()                      silently remove it
//	sluice.RejectRecord("why")               refuse it (the producer gets INVALID_RECORD)
//	an error                                 fail the whole batch (the on_error policy applies)
//
// rec.Key, rec.Value and header slices point into the host's input: copy what you keep past
// the call. A nil slice is null.
//
// This starter rejects records without a value, drops records whose "x-drop" header is "yes",
// tags the rest by appending the configured suffix to the value, and counts what it did.
package main

import "sluice"

type starter struct {
	suffix []byte // from the config: {"suffix": "..."}
}

func (s *starter) OnRecord(rec *sluice.Record) (sluice.Decision, error) {
	if len(rec.Value) == 0 {
		sluice.Count("rejected_empty", 1)
		return sluice.RejectRecord("{{NAME}}: a record needs a value"), nil
	}
	if string(rec.Header("x-drop")) == "yes" {
		sluice.Count("dropped", 1)
		return sluice.DropRecord(), nil
	}
	out := make([]byte, 0, len(rec.Value)+len(s.suffix))
	out = append(out, rec.Value...)
	out = append(out, s.suffix...)
	sluice.Count("tagged", 1)
	return rec.WithValue(out), nil
}

func init() {
	sluice.Register(func(config *sluice.JSON) (sluice.Filter, error) {
		suffix, ok := config.Get("suffix").AsString()
		if !ok {
			suffix = " [checked]"
		}
		return &starter{suffix: []byte(suffix)}, nil // an error refuses the config
	})
}

func main() {}
