package main

import (
	"strings"
	"testing"
	"time"
)

// A bad flag value is named as it is written (two dashes), with what it should look like.
func TestFlagErrorsNameTheFlagAsWritten(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--gc-interval", "5"}, `--gc-interval "5" is not a duration`},
		{[]string{"--n", "x"}, `--n "x" is not a whole number`},
		{[]string{"--daemon=maybe"}, `--daemon takes no value, or true or false: "maybe"`},
		{[]string{"--name"}, "--name needs a value"},
		{[]string{"--bogus"}, "unknown flag --bogus"},
	} {
		fs := newFlags("mount")
		fs.Duration("gc-interval", time.Minute, "")
		fs.Int("n", 0, "")
		fs.Bool("daemon", false, "")
		fs.String("name", "", "")
		_, err := parseInterspersed(fs, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
