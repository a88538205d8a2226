package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"unicode/utf16"
)

// isCanonicalJSON reports whether body is canonical JSON as the seeds define it: what
// JSON.stringify writes for JSON.parse(body) with every object's keys sorted. encoding/json is
// not that writer: it escapes <, >, &, U+2028 and U+2029, writes -0 as "-0" and sorts keys by
// bytes where JavaScript compares UTF-16 code units.
func isCanonicalJSON(body string) bool {
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		return false
	}
	var b bytes.Buffer
	writeCanonical(&b, v)
	return b.String() == body
}

func writeCanonical(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case float64:
		writeNumber(b, v)
	case string:
		writeString(b, v)
	case []any:
		b.WriteByte('[')
		for i, item := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, item)
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return lessUTF16(keys[i], keys[j]) })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			writeCanonical(b, v[k])
		}
		b.WriteByte('}')
	default:
		panic(fmt.Sprintf("engine: %T is not a decoded JSON value", v))
	}
}

// writeNumber writes f as JavaScript's Number#toString does, which encoding/json follows for
// float64 except for negative zero.
func writeNumber(b *bytes.Buffer, f float64) {
	if f == 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		b.WriteByte('0') // -0 reads "0"; NaN and infinities never come out of JSON.parse
		return
	}
	data, _ := json.Marshal(f)
	b.Write(data)
}

// writeString quotes s as JSON.stringify does: only the quote, the backslash and control
// characters are escaped, with the short escapes where JSON has them.
func writeString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// lessUTF16 orders strings by UTF-16 code units, as JavaScript's < does.
func lessUTF16(a, b string) bool {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}
