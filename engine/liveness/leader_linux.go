package liveness

import "golang.org/x/sys/unix"

// isProcess says whether tid is a thread-group leader, whose tid is its pid: pidfd_open refuses
// any other thread. A syscall, where /proc/<tid>/status has the kernel summarise the process's
// memory first.
func isProcess(tid int) bool {
	fd, err := unix.PidfdOpen(tid, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}
