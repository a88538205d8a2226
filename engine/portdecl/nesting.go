package portdecl

import (
	"bytes"
	"fmt"
)

// maxNesting bounds how deeply a document nests keys and values. The TOML decoder's work grows
// with the square of a key's depth (a 64 KiB document of one dotted key, or of nested inline
// tables, took 45 s to decode); a config needs three levels.
const maxNesting = 16

// checkNesting refuses a document whose tables, arrays and dotted keys nest deeper than
// maxNesting. It knows only TOML's strings and comments, which is enough to bound the decoder's
// work; whatever it lets through is still parsed, and judged, by the decoder.
func checkNesting(text []byte) error {
	depth, dots, line := 0, 0, 1
	for i := 0; i < len(text); i++ {
		switch c := text[i]; c {
		case '\n':
			line++
			dots = 0
		case '#':
			end := bytes.IndexByte(text[i:], '\n')
			if end < 0 {
				return nil
			}
			i += end - 1 // the newline itself is counted on the next turn
		case '"', '\'':
			end := stringEnd(text, i)
			if end < 0 {
				return nil // unterminated: the decoder reports it
			}
			line += bytes.Count(text[i:end], []byte{'\n'})
			i = end - 1
		case '[', '{':
			depth++
			dots = 0
		case ']', '}':
			depth--
		case '=', ',':
			dots = 0
		case '.':
			dots++
		}
		if depth+dots > maxNesting {
			return fmt.Errorf("config: line %d: keys or values nest more than %d deep", line, maxNesting)
		}
	}
	return nil
}

// stringEnd returns the index just past the string starting at text[start] (a quote), or -1 when
// it does not end. Basic strings ("...", """...""") honour backslash escapes; literal ones do not.
func stringEnd(text []byte, start int) int {
	quote := text[start]
	delimiter := []byte{quote}
	if bytes.HasPrefix(text[start:], []byte{quote, quote, quote}) {
		delimiter = []byte{quote, quote, quote}
	}
	for i := start + len(delimiter); i < len(text); i++ {
		switch {
		case text[i] == '\\' && quote == '"':
			i++
		case len(delimiter) == 1 && text[i] == '\n':
			return -1
		case bytes.HasPrefix(text[i:], delimiter):
			end := i + len(delimiter)
			// A multi-line string may end with up to two quotes of its own before the delimiter.
			for extra := 0; len(delimiter) == 3 && extra < 2 && end < len(text) && text[end] == quote; extra++ {
				end++
			}
			return end
		}
	}
	return -1
}
