package liveness

import "golang.org/x/sys/unix"

// isProcess says whether tid is a thread-group leader, whose tid is its pid.
func isProcess(tid int) bool { return inThreadGroup(tid, tid) }

// inThreadGroup says whether thread tid belongs to process pid: tgkill(pid, tid, 0) finds tid only
// in that thread group, and sends nothing. EPERM (another user's, for a daemon that is not root)
// found it too. One syscall, where pidfd_open and close were two and /proc/<tid>/status has the
// kernel summarise the process's memory first.
func inThreadGroup(pid, tid int) bool {
	err := unix.Tgkill(pid, tid, 0)
	return err == nil || err == unix.EPERM
}

// threadGroupOf is the process of thread tid, from the kernel's pidfd information (Linux 6.13 and
// later): three syscalls, where /proc/<tid>/status has the kernel render the whole status.
// false where the kernel cannot say so.
func threadGroupOf(tid int) (int, bool) {
	fd, err := unix.PidfdOpen(tid, unix.PIDFD_THREAD)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_PID}
	if err := unix.IoctlPidfdInfo(fd, &info); err != nil || info.Mask&unix.PIDFD_INFO_PID == 0 || info.Tgid == 0 {
		return 0, false
	}
	return int(info.Tgid), true
}

// openProcess returns a pidfd of pid: it names that very process for as long as it is held.
func openProcess(pid int) (int, bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	return fd, err == nil
}

// stillRunning says whether the process of pidfd fd has not exited. EPERM is another user's
// process, alive; anything but success or EPERM is taken for gone, which only costs a read.
func stillRunning(fd int) bool {
	err := unix.PidfdSendSignal(fd, 0, nil, 0)
	return err == nil || err == unix.EPERM
}

func closeProcess(fd int) { unix.Close(fd) }
