package engine

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Printable is s as a text view shows it (docs/spec.md §2, "Text views"): a backslash as \\, and
// each control character (C0, DEL, C1), each other rune Go's unicode.IsPrint refuses (line
// separators, bidirectional overrides …) and each byte that is not UTF-8 as Go's strconv.Quote
// spells it (\n, \t, \x1b, \u202e, \xff). A value then fills one line, stays in its field, and
// writes nothing a terminal acts on; the JSON views hold the value itself.
func Printable(s string) string {
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		plain = s[i] >= ' ' && s[i] < 0x7f && s[i] != '\\'
	}
	if plain {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case r == '\\':
			b.WriteString(`\\`)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// PrintableJSON is JSON data with each rune Printable would escape and JSON leaves as it is (DEL,
// C1 controls, other runes unicode.IsPrint refuses) written as a \u escape: the same value to
// every JSON reader, and nothing a terminal acts on. Such runes occur only inside strings.
func PrintableJSON(data []byte) []byte {
	plain := true
	for i := 0; i < len(data) && plain; i++ {
		plain = data[i] < 0x7f
	}
	if plain {
		return data
	}
	out := make([]byte, 0, len(data)+32)
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size == 1, r < 0x7f, unicode.IsPrint(r):
			out = append(out, data[i:i+size]...)
		case r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}
