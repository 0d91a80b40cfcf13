// Example (seed 004, Cisco's PII filter, in Go): mask e-mail addresses and secrets that look
// like NAME=value in record values, as the seed's kcat session shows:
//
//	AWS_SECRET_ACCESS_KEY=myawssecretkeyvalue  ->  AWS_SECRET_ACCESS_KEY=*******************
//	My email is example@email.com              ->  My email is *******@*****.***
//
// An e-mail address (local part of letters, digits and ._%+-, an @, a domain of labels with a
// final label of two or more letters) keeps its @, dots and other punctuation; its letters and
// digits become the mask, as builtin:pii-mask does. A secret is NAME=value where NAME (letters, digits, _) contains one of the configured
// words, case-insensitively (default SECRET, PASSWORD, TOKEN, API_KEY, PRIVATE_KEY); its value
// (up to whitespace, a quote, &, ; or ,) is masked character for character. Keys, headers and
// null values pass. Counters: "email", "secret".
//
// Config (all optional): {"mask": "*", "email": true, "secrets": true,
// "secret_words": ["SECRET", ...]}. The builtin:pii-mask filter does more (cards, IBANs,
// phone numbers, JSON fields); this is the small Go version of the idea.
package main

import (
	"bytes"
	"errors"

	"sluice"
)

type piiMask struct {
	mask    byte
	email   bool
	secrets bool
	words   [][]byte // upper case
}

func isLocal(c byte) bool {
	return isAlnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-'
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isName(c byte) bool { return isAlnum(c) || c == '_' }

func upper(c byte) byte {
	if c >= 'a' && c <= 'z' {
		return c - ('a' - 'A')
	}
	return c
}

// emailAt returns the span [start, end) of an e-mail address around the '@' at v[at].
func emailAt(v []byte, at int) (int, int, bool) {
	start := at
	for start > 0 && isLocal(v[start-1]) {
		start--
	}
	if start == at {
		return 0, 0, false
	}
	end := at + 1
	for end < len(v) && (isAlnum(v[end]) || v[end] == '.' || v[end] == '-') {
		end++
	}
	for end > at+1 && v[end-1] == '.' { // a sentence's full stop is not part of it
		end--
	}
	dot := bytes.LastIndexByte(v[at+1:end], '.')
	if dot <= 0 {
		return 0, 0, false
	}
	tld := v[at+1+dot+1 : end]
	if len(tld) < 2 {
		return 0, 0, false
	}
	for _, c := range tld {
		if !isLetter(c) {
			return 0, 0, false
		}
	}
	return start, end, true
}

// secretName reports whether name contains one of the words (case-insensitively).
func (p *piiMask) secretName(name []byte) bool {
	for _, w := range p.words {
		for i := 0; i+len(w) <= len(name); i++ {
			j := 0
			for j < len(w) && upper(name[i+j]) == w[j] {
				j++
			}
			if j == len(w) {
				return true
			}
		}
	}
	return false
}

func endOfValue(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', '"', '\'', '&', ';', ',':
		return true
	}
	return false
}

func (p *piiMask) OnRecord(rec *sluice.Record) (sluice.Decision, error) {
	v := rec.Value
	var out []byte // copy on first change
	masked := func(from, to int, keep func(byte) bool) {
		if out == nil {
			out = append([]byte(nil), v...)
		}
		for i := from; i < to; i++ {
			if keep == nil || !keep(v[i]) {
				out[i] = p.mask
			}
		}
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '@' && p.email:
			if s, e, ok := emailAt(v, i); ok {
				masked(s, e, func(c byte) bool { return !isAlnum(c) })
				sluice.Count("email", 1)
				i = e - 1
			}
		case c == '=' && p.secrets:
			start := i
			for start > 0 && isName(v[start-1]) {
				start--
			}
			end := i + 1
			for end < len(v) && !endOfValue(v[end]) {
				end++
			}
			if start < i && end > i+1 && p.secretName(v[start:i]) {
				masked(i+1, end, nil)
				sluice.Count("secret", 1)
				i = end - 1
			}
		}
	}
	if out == nil {
		return sluice.KeepRecord(), nil
	}
	return rec.WithValue(out), nil
}

func configure(config *sluice.JSON) (sluice.Filter, error) {
	p := &piiMask{mask: '*', email: true, secrets: true}
	if config.Kind != sluice.Null && config.Kind != sluice.Object {
		return nil, errors.New("pii-mask-go: the config must be a mapping")
	}
	if m := config.Get("mask"); m != nil {
		s, ok := m.AsString()
		if !ok || len(s) != 1 {
			return nil, errors.New("pii-mask-go: mask must be one ASCII character")
		}
		p.mask = s[0]
	}
	for name, dst := range map[string]*bool{"email": &p.email, "secrets": &p.secrets} {
		if b := config.Get(name); b != nil {
			if *dst, _ = b.AsBool(); b.Kind != sluice.Bool {
				return nil, errors.New("pii-mask-go: " + name + " must be true or false")
			}
		}
	}
	words := []string{"SECRET", "PASSWORD", "TOKEN", "API_KEY", "PRIVATE_KEY"}
	if w := config.Get("secret_words"); w != nil {
		if w.Kind != sluice.Array || len(w.Items) == 0 {
			return nil, errors.New("pii-mask-go: secret_words must be a non-empty list of words")
		}
		words = words[:0]
		for _, item := range w.Items {
			s, ok := item.AsString()
			if !ok || s == "" {
				return nil, errors.New("pii-mask-go: secret_words must be a non-empty list of words")
			}
			words = append(words, s)
		}
	}
	for _, w := range words {
		p.words = append(p.words, bytes.ToUpper([]byte(w)))
	}
	return p, nil
}

func init() { sluice.Register(configure) }

func main() {}
