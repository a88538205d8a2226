// Package shell spells the commands cockpitfs prints for a user to paste.
package shell

import "strings"

// Quote quotes s for a POSIX shell, unless it needs none.
func Quote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_/.,:@%+=-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
