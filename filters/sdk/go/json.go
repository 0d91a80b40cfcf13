package sluice

import (
	"strconv"
	"unicode/utf8"
)

// JSON parser (RFC 8259, strict, UTF-8 checked, depth-limited): the same rules and messages as
// the C SDK's parser, so filters written in either language reject the same texts with the
// same reasons. encoding/json works in filters too; this one is smaller and faster.

// Kind is the type of a JSON value.
type Kind uint8

const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// JSON is a parsed JSON value. Numbers keep their text.
type JSON struct {
	Kind    Kind
	Bool    bool
	Text    string // Number: its text; String: its value
	Items   []*JSON
	Members []Member
}

// Member is one name/value pair of an object, in document order.
type Member struct {
	Name  string
	Value *JSON
}

// JSONError says why a text is not JSON and the byte offset where parsing stopped.
type JSONError struct {
	Message string
	Offset  int
}

func (e *JSONError) Error() string { return e.Message }

const jsonMaxDepth = 64

// ParseJSON parses one JSON text.
func ParseJSON(data []byte) (*JSON, *JSONError) {
	p := jsonParser{s: data}
	v, msg := p.value()
	if msg == "" {
		p.ws()
		if p.i != len(data) {
			msg = "trailing characters after JSON value"
		}
	}
	if msg != "" {
		return nil, &JSONError{Message: msg, Offset: p.i}
	}
	return v, nil
}

// Get returns the member called name of an object (the last duplicate wins, like most
// parsers), or nil.
func (j *JSON) Get(name string) *JSON {
	if j == nil || j.Kind != Object {
		return nil
	}
	for i := len(j.Members) - 1; i >= 0; i-- {
		if j.Members[i].Name == name {
			return j.Members[i].Value
		}
	}
	return nil
}

// AsString returns a string's value.
func (j *JSON) AsString() (string, bool) {
	if j == nil || j.Kind != String {
		return "", false
	}
	return j.Text, true
}

// AsBool returns a boolean's value.
func (j *JSON) AsBool() (bool, bool) {
	if j == nil || j.Kind != Bool {
		return false, false
	}
	return j.Bool, true
}

// AsInt64 returns the integer value of a number or of a string holding an integer (as Kafka
// configs are).
func (j *JSON) AsInt64() (int64, bool) {
	if j == nil || (j.Kind != Number && j.Kind != String) {
		return 0, false
	}
	v, err := strconv.ParseInt(j.Text, 10, 64)
	return v, err == nil
}

type jsonParser struct {
	s     []byte
	i     int
	depth int
}

func (p *jsonParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) hex4(at int) (rune, bool) {
	if at+4 > len(p.s) {
		return 0, false
	}
	var v rune
	for _, c := range p.s[at : at+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | rune(d)
	}
	return v, true
}

// utf8Len is the length of the valid UTF-8 sequence at the start of b (1..4), or 0.
func utf8Len(b []byte) int {
	c := b[0]
	var n int
	switch {
	case c <= 0x7f:
		return 1
	case c >= 0xc2 && c <= 0xdf:
		n = 2
	case c >= 0xe0 && c <= 0xef:
		n = 3
	case c >= 0xf0 && c <= 0xf4:
		n = 4
	default:
		return 0
	}
	if len(b) < n || !utf8.Valid(b[:n]) {
		return 0
	}
	return n
}

func (p *jsonParser) str() (string, string) {
	p.i++ // opening quote
	start := p.i
	// Fast path: no escapes.
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '"' {
			p.i++
			return string(p.s[start : p.i-1]), ""
		}
		if c < 0x20 {
			return "", "control character in string"
		}
		if c == '\\' {
			break
		}
		if c < 0x80 {
			p.i++
			continue
		}
		n := utf8Len(p.s[p.i:])
		if n == 0 {
			return "", "invalid UTF-8"
		}
		p.i += n
	}
	out := append([]byte(nil), p.s[start:p.i]...)
	for {
		if p.i >= len(p.s) {
			return "", "unterminated string"
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return string(out), ""
		case c < 0x20:
			return "", "control character in string"
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return "", "bad escape"
			}
			e := p.s[p.i+1]
			var lit byte
			switch e {
			case '"', '\\', '/':
				lit = e
			case 'b':
				lit = 8
			case 'f':
				lit = 12
			case 'n':
				lit = '\n'
			case 'r':
				lit = '\r'
			case 't':
				lit = '\t'
			case 'u':
			default:
				return "", "bad escape"
			}
			if e != 'u' {
				out = append(out, lit)
				p.i += 2
				continue
			}
			cp, ok := p.hex4(p.i + 2)
			if !ok {
				return "", "bad \\u escape"
			}
			p.i += 6
			if cp >= 0xd800 && cp <= 0xdbff {
				// A high surrogate must be followed by a low one.
				lo, okLo := rune(0), false
				if p.i+2 <= len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
					lo, okLo = p.hex4(p.i + 2)
				}
				if okLo && lo >= 0xdc00 && lo <= 0xdfff {
					p.i += 6
					cp = 0x10000 + (cp-0xd800)<<10 + (lo - 0xdc00)
				} else {
					cp = 0xfffd // lone surrogate: UTF-8 cannot hold it
				}
			} else if cp >= 0xdc00 && cp <= 0xdfff {
				cp = 0xfffd
			}
			out = utf8.AppendRune(out, cp)
		default:
			n := utf8Len(p.s[p.i:])
			if n == 0 {
				return "", "invalid UTF-8"
			}
			out = append(out, p.s[p.i:p.i+n]...)
			p.i += n
		}
	}
}

func (p *jsonParser) digit(at int) bool { return at < len(p.s) && p.s[at] >= '0' && p.s[at] <= '9' }

func (p *jsonParser) number() (*JSON, string) {
	s, start, q := p.s, p.i, p.i
	if q < len(s) && s[q] == '-' {
		q++
	}
	if q >= len(s) {
		return nil, "bad number"
	}
	if s[q] == '0' {
		q++
	} else if p.digit(q) {
		for p.digit(q) {
			q++
		}
	} else {
		return nil, "bad number"
	}
	if q < len(s) && s[q] == '.' {
		q++
		if !p.digit(q) {
			return nil, "bad number"
		}
		for p.digit(q) {
			q++
		}
	}
	if q < len(s) && (s[q] == 'e' || s[q] == 'E') {
		q++
		if q < len(s) && (s[q] == '+' || s[q] == '-') {
			q++
		}
		if !p.digit(q) {
			return nil, "bad number"
		}
		for p.digit(q) {
			q++
		}
	}
	p.i = q
	return &JSON{Kind: Number, Text: string(s[start:q])}, ""
}

func (p *jsonParser) literal(lit string, v *JSON) (*JSON, string) {
	if len(p.s)-p.i >= len(lit) && string(p.s[p.i:p.i+len(lit)]) == lit {
		p.i += len(lit)
		return v, ""
	}
	return nil, "unexpected token"
}

func (p *jsonParser) value() (*JSON, string) {
	p.ws()
	if p.i >= len(p.s) {
		return nil, "unexpected end of input"
	}
	c := p.s[p.i]
	switch {
	case c == '{' || c == '[':
		p.depth++
		if p.depth > jsonMaxDepth {
			return nil, "nesting too deep"
		}
		object := c == '{'
		closer := byte(']')
		if object {
			closer = '}'
		}
		v := &JSON{Kind: Array}
		if object {
			v.Kind = Object
		}
		p.i++
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == closer {
			p.i++
		} else {
			for {
				p.ws()
				name := ""
				if object {
					if p.i >= len(p.s) || p.s[p.i] != '"' {
						return nil, "expected member name"
					}
					var msg string
					if name, msg = p.str(); msg != "" {
						return nil, msg
					}
					p.ws()
					if p.i >= len(p.s) || p.s[p.i] != ':' {
						return nil, "expected ':'"
					}
					p.i++
				}
				item, msg := p.value()
				if msg != "" {
					return nil, msg
				}
				if object {
					v.Members = append(v.Members, Member{name, item})
				} else {
					v.Items = append(v.Items, item)
				}
				p.ws()
				if p.i >= len(p.s) {
					return nil, "unexpected end of input"
				}
				x := p.s[p.i]
				if x == ',' {
					p.i++
					continue
				}
				if x == closer {
					p.i++
					break
				}
				if object {
					return nil, "expected ',' or '}'"
				}
				return nil, "expected ',' or ']'"
			}
		}
		p.depth--
		return v, ""
	case c == '"':
		s, msg := p.str()
		if msg != "" {
			return nil, msg
		}
		return &JSON{Kind: String, Text: s}, ""
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return p.literal("true", &JSON{Kind: Bool, Bool: true})
	case c == 'f':
		return p.literal("false", &JSON{Kind: Bool})
	case c == 'n':
		return p.literal("null", &JSON{Kind: Null})
	}
	return nil, "unexpected character"
}
