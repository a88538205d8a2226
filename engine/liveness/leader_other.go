//go:build !linux

package liveness

// isProcess and inThreadGroup cannot tell cheaply here; ProcessOf reads /proc instead.
func isProcess(int) bool          { return false }
func inThreadGroup(int, int) bool { return false }

// threadGroupOf cannot ask the kernel here; ProcessOf reads /proc instead.
func threadGroupOf(int) (int, bool) { return 0, false }

// Without pidfds no process can be held: session leaders are read every time.
func openProcess(int) (int, bool) { return 0, false }
func stillRunning(int) bool       { return false }
func closeProcess(int)            {}
