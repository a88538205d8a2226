//go:build !linux

package liveness

// isProcess cannot tell cheaply here; ProcessOf reads /proc instead.
func isProcess(int) bool { return false }
