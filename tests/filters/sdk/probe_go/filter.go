// SDK probe for tests/filters/sdk/test_sdk_abi.py and tests/filters/test_native_path.py: the
// Zig probe (probe_zig) in Go, command for command: each record value is a command ("keep",
// "drop", "count", "ctx", "fail", "reject", "key"); anything else is rewritten to
// prefix + value + "@" + topic with the headers replaced by one null header "h".
package main

import (
	"errors"
	"strconv"
	"strings"

	"sluice"
	_ "sluice/admin"
)

type probe struct {
	prefix string
}

func (p *probe) OnRecord(rec *sluice.Record) (sluice.Decision, error) {
	v := rec.Value
	if v == nil {
		return sluice.DropRecord(), nil
	}
	switch string(v) {
	case "fail":
		return sluice.Decision{}, errors.New("AskedToFail")
	case "reject":
		return sluice.RejectRecord("no"), nil
	case "key":
		return rec.WithKey(nil), nil
	case "keep":
		return sluice.KeepRecord(), nil
	case "drop":
		return sluice.DropRecord(), nil
	case "count":
		sluice.Count("a", 2)
		sluice.Count("b", 1)
		return sluice.KeepRecord(), nil
	case "ctx":
		text := strings.Join([]string{rec.Topic, strconv.Itoa(int(rec.Partition)), rec.ClientID,
			rec.Principal, strconv.Itoa(int(rec.Direction)),
			strconv.FormatInt(rec.Offset, 10), strconv.FormatInt(rec.TimestampMs, 10),
			p.prefix}, "|")
		return rec.WithValue([]byte(text)), nil
	}
	sluice.Count("seen", 1)
	out := make([]byte, 0, len(p.prefix)+len(v)+1+len(rec.Topic))
	out = append(out, p.prefix...)
	out = append(out, v...)
	out = append(out, '@')
	out = append(out, rec.Topic...)
	return sluice.RewriteRecord(rec.Key, out, []sluice.Header{{Key: []byte("h")}}), nil
}

func (p *probe) OnAdmin(request []byte) ([]byte, error) {
	req, err := sluice.ParseJSON(request)
	if err != nil {
		return nil, err
	}
	name, ok := req.Get("name").AsString()
	if !ok {
		return nil, errors.New("MissingField")
	}
	if strings.HasPrefix(name, "tmp") {
		return []byte(`{"decision":"deny","message":"no tmp topics"}`), nil
	}
	return []byte(`{"decision":"allow","message":""}`), nil
}

func init() {
	sluice.Register(func(config *sluice.JSON) (sluice.Filter, error) {
		if refuse, _ := config.Get("refuse").AsBool(); refuse {
			return nil, errors.New("RefusedOnPurpose")
		}
		prefix, _ := config.Get("prefix").AsString()
		return &probe{prefix: prefix}, nil
	})
}

func main() {}
