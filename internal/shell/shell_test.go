package shell

import (
	"os/exec"
	"testing"
)

// What Quote spells, a shell reads back as the string itself.
func TestQuoteReadsBackAsItself(t *testing.T) {
	for _, s := range []string{"", "plain/path-1.0", "it's", "$(touch /x) `id` \"q\"", "a b\nc\x1b[31m", "'''"} {
		out, err := exec.Command("sh", "-c", "printf %s "+Quote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("Quote(%q) = %s read back as %q (%v)", s, Quote(s), out, err)
		}
	}
}
