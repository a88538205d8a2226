package liveness

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// startSleep starts `sleep 60` and kills it when the test ends.
func startSleep(t *testing.T, configure func(*exec.Cmd)) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if configure != nil {
		configure(cmd)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func requireLinux(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("needs /proc; running on %s", runtime.GOOS)
	}
}

func TestObserveSelf(t *testing.T) {
	requireLinux(t)
	obs := Observe(os.Getpid())
	if obs.State != Present || !strings.HasPrefix(obs.Start, "proc:") || !IsStart(obs.Start) || obs.Reason != "" {
		t.Fatalf("Observe(self) = %+v, want present with a proc: identity", obs)
	}
	if again := Observe(os.Getpid()); again.Start != obs.Start {
		t.Errorf("identity changed between two reads: %q then %q", obs.Start, again.Start)
	}
}

func TestObserveInvalidPid(t *testing.T) {
	pids := []int{0, -1, math.MinInt32}
	if big := int64(math.MaxInt32) + 1; int64(int(big)) == big {
		pids = append(pids, int(big))
	}
	for _, pid := range pids {
		obs := Observe(pid)
		if obs.State != Unknown || obs.Reason == "" || obs.Start != "" {
			t.Errorf("Observe(%d) = %+v, want unknown with a reason", pid, obs)
		}
		if Gone("", obs) {
			t.Errorf("Gone(\"\", Observe(%d)) = true: unknown must never be dead", pid)
		}
	}
}

func TestObserveKilledChild(t *testing.T) {
	requireLinux(t)
	cmd := startSleep(t, nil)
	pid := cmd.Process.Pid
	alive := Observe(pid)
	if alive.State != Present || !IsStart(alive.Start) {
		t.Fatalf("Observe(running child) = %+v, want present", alive)
	}
	if Gone(alive.Start, alive) {
		t.Fatalf("Gone(own start, running) = true")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	dead := Observe(pid)
	if dead.State != Absent || dead.Start != "" {
		t.Errorf("Observe(killed and reaped child) = %+v, want absent", dead)
	}
	if !Gone(alive.Start, dead) {
		t.Errorf("Gone(%q, %+v) = false, want true", alive.Start, dead)
	}
}

// A killed child that is not yet reaped is a zombie: signal 0 still finds it and /proc still
// holds its start, so it reads as the same live process until its parent waits for it.
func TestObserveZombieIsPresent(t *testing.T) {
	requireLinux(t)
	cmd := startSleep(t, nil)
	pid := cmd.Process.Pid
	before := Observe(pid)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Wait for the kill to land without reaping the child.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waitid: %v", err)
	}
	zombie := Observe(pid)
	if zombie.State != Present || zombie.Start != before.Start {
		t.Errorf("Observe(zombie) = %+v, want present with %q", zombie, before.Start)
	}
}

// The kernel takes the command name from the executable's file name, so a link with a hostile name
// gives a real process whose stat line has spaces, parentheses and a newline in its comm.
func TestObserveHostileCommandName(t *testing.T) {
	requireLinux(t)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	link := filepath.Join(t.TempDir(), "a) (b\nc) 1 2")
	if err := os.Symlink(sleep, link); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(link, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(stat), "(a) (b\nc) 1 2)") {
		t.Fatalf("comm not taken from the link name; stat = %q", stat)
	}
	obs := Observe(cmd.Process.Pid)
	if obs.State != Present || !IsStart(obs.Start) {
		t.Fatalf("Observe(hostile comm) = %+v, want present", obs)
	}
	got, err := SessionHolder(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if own, _ := SessionHolder(os.Getpid()); got != own {
		t.Errorf("SessionHolder(hostile comm) = %d, want this test's session holder %d", got, own)
	}
}

// An identity from ps is what non-Linux systems record; Linux's procps prints the same format.
func TestObserveLstartSelf(t *testing.T) {
	if _, err := psStart(os.Getpid()); err != nil {
		skipUnlessCI(t, "ps cannot report start times here: %v", err)
	}
	obs := observeLstart(os.Getpid())
	if obs.State != Present || !strings.HasPrefix(obs.Start, "lstart:") || !IsStart(obs.Start) {
		t.Fatalf("observeLstart(self) = %+v, want present with an lstart: identity", obs)
	}
	procObs := Observation{State: Present, Start: "proc:6ecf8df8-5308-48f4-a516-1ffda9da1137:1"}
	if Gone(obs.Start, procObs) {
		t.Errorf("an lstart identity was judged against a proc one")
	}
}

func TestObserveLstartMissingProcess(t *testing.T) {
	cmd := startSleep(t, nil)
	pid := cmd.Process.Pid
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if obs := observeLstart(pid); obs.State != Unknown || obs.Reason == "" {
		t.Errorf("observeLstart(reaped pid) = %+v, want unknown with a reason (ps fails)", obs)
	}
}

// Observed as root this cannot give EPERM; TestObserveAsOtherUser covers that from the other side.
func TestObserveOtherUsersProcess(t *testing.T) {
	requireLinux(t)
	if os.Geteuid() != 0 {
		obs := Observe(1)
		if obs.State != Present {
			t.Fatalf("Observe(1) as uid %d = %+v; init belongs to root and must read present", os.Geteuid(), obs)
		}
		return
	}
	cmd := startSleep(t, func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	})
	if obs := Observe(cmd.Process.Pid); obs.State != Present || !IsStart(obs.Start) {
		t.Errorf("Observe(uid 65534 child) = %+v, want present", obs)
	}
}

func TestSessionHolder(t *testing.T) {
	requireLinux(t)
	own, err := SessionHolder(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if sid, _ := unix.Getsid(0); sid > 0 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(sid)); err == nil && own != sid {
			t.Errorf("SessionHolder(self) = %d; want the visible session leader %d", own, sid)
		}
	}
	// Setsid runs before exec, and Start returns only once exec succeeded.
	leader := startSleep(t, func(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} })
	if got, err := SessionHolder(leader.Process.Pid); err != nil || got != leader.Process.Pid {
		t.Errorf("SessionHolder(setsid child) = %d, %v; want its own pid %d", got, err, leader.Process.Pid)
	}
	member := startSleep(t, nil)
	if got, err := SessionHolder(member.Process.Pid); err != nil || got != own {
		t.Errorf("SessionHolder(plain child) = %d, %v; want this test's %d", got, err, own)
	}
	if _, err := SessionHolder(-1); err == nil {
		t.Error("SessionHolder(-1) succeeded")
	}
}

// When the leader has exited, what is left of its session is held by its outermost survivor: here
// a shell orphaned by the leader, and its child.
func TestSessionHolderLeaderExited(t *testing.T) {
	requireLinux(t)
	out, err := exec.Command("setsid", "sh", "-c", `sh -c 'sleep 60; :' >/dev/null 2>&1 & echo $!`).Output()
	if err != nil {
		t.Fatal(err)
	}
	survivor, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("survivor pid %q: %v", out, err)
	}
	testtool.KillAtEnd(t, survivor)
	children := "/proc/" + strconv.Itoa(survivor) + "/task/" + strconv.Itoa(survivor) + "/children"
	var child int
	for range 500 {
		text, err := os.ReadFile(children)
		if err != nil {
			t.Fatal(err)
		}
		if fields := strings.Fields(string(text)); len(fields) > 0 {
			if child, err = strconv.Atoi(fields[0]); err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 {
		t.Fatalf("the survivor %d never started sleep", survivor)
	}
	testtool.KillAtEnd(t, child)
	for _, pid := range []int{survivor, child} {
		if got, err := SessionHolder(pid); err != nil || got != survivor {
			t.Errorf("SessionHolder(%d) = %d, %v; want the survivor %d", pid, got, err, survivor)
		}
	}
}

func TestProcessOf(t *testing.T) {
	requireLinux(t)
	tasks := tasksWithASecondThread(t)
	others := 0
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			t.Fatalf("/proc/self/task entry %q: %v", task.Name(), err)
		}
		if tid != os.Getpid() {
			others++
		}
		if got, err := ProcessOf(tid); err != nil || got != os.Getpid() {
			t.Errorf("ProcessOf(thread %d) = %d, %v; want %d", tid, got, err, os.Getpid())
		}
	}
	if others == 0 {
		t.Fatalf("found no thread other than the main one in /proc/self/task (%d entries)", len(tasks))
	}
	if _, err := ProcessOf(-1); err == nil {
		t.Error("ProcessOf(-1) succeeded")
	}
}

// A thread's process remembered wrongly (its id reused by another process's thread) is not
// trusted: the thread's own process is found, and remembered instead.
func TestProcessOfChecksWhatItRemembers(t *testing.T) {
	requireLinux(t)
	for _, task := range tasksWithASecondThread(t) {
		tid, _ := strconv.Atoi(task.Name())
		if tid == os.Getpid() {
			continue
		}
		threadGroups.put(tid, 1) // init's, which no test thread is
		if got, err := ProcessOf(tid); err != nil || got != os.Getpid() {
			t.Errorf("ProcessOf(thread %d) remembered as init's = %d, %v; want %d", tid, got, err, os.Getpid())
		}
		if pid, ok := threadGroups.get(tid); !ok || pid != os.Getpid() {
			t.Errorf("thread %d is remembered as process %d (%v), want %d", tid, pid, ok, os.Getpid())
		}
	}
}

// Of a process's threads, only the first is a process; a pid that exited is none.
func TestIsProcessOnlyTheThreadGroupLeader(t *testing.T) {
	requireLinux(t)
	for _, task := range tasksWithASecondThread(t) {
		tid, _ := strconv.Atoi(task.Name())
		if got := isProcess(tid); got != (tid == os.Getpid()) {
			t.Errorf("isProcess(thread %d of process %d) = %v", tid, os.Getpid(), got)
		}
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if isProcess(gone.Process.Pid) {
		t.Errorf("isProcess(exited %d) = true", gone.Process.Pid)
	}
}

func TestCwd(t *testing.T) {
	requireLinux(t)
	dir := t.TempDir()
	cmd := startSleep(t, func(cmd *exec.Cmd) { cmd.Dir = dir })
	got, err := Cwd(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	gotResolved, err := filepath.EvalSymlinks(got)
	if err != nil {
		t.Fatal(err)
	}
	wantResolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if gotResolved != wantResolved {
		t.Errorf("Cwd(child) = %q, want %q", gotResolved, wantResolved)
	}
	if _, err := Cwd(-1); err == nil {
		t.Error("Cwd(-1) succeeded")
	}
}

// ObserveSessionHolder finds the holder SessionHolder finds, observed as Observe observes it,
// for a leader, a member of this test's session, a survivor of an exited leader's session, and a
// process gone since.
func TestObserveSessionHolderIsSessionHolderObserved(t *testing.T) {
	requireLinux(t)
	leader := startSleep(t, func(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} })
	member := startSleep(t, nil)
	for _, pid := range []int{os.Getpid(), leader.Process.Pid, member.Process.Pid} {
		want, err := SessionHolder(pid)
		if err != nil {
			t.Fatal(err)
		}
		got, obs, err := ObserveSessionHolder(pid)
		if err != nil || got != want {
			t.Errorf("ObserveSessionHolder(%d) = %d, %v; want SessionHolder's %d", pid, got, err, want)
		}
		if observed := Observe(want); obs != observed || obs.State != Present {
			t.Errorf("ObserveSessionHolder(%d) observed %+v; Observe(%d) = %+v", pid, obs, want, observed)
		}
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ObserveSessionHolder(gone.Process.Pid); err == nil {
		t.Errorf("ObserveSessionHolder(exited %d) succeeded", gone.Process.Pid)
	}
}

// readProc reads what os.ReadFile reads (a sleeping process's files, which do not change while it
// sleeps but for its user's queued signals), also when the file is longer than the first buffer,
// and a missing file is fs.ErrNotExist as os.ReadFile's is.
func TestReadProcIsReadFile(t *testing.T) {
	requireLinux(t)
	sleeper := startSleep(t, nil)
	for _, name := range []string{"status", "stat"} {
		path := "/proc/" + strconv.Itoa(sleeper.Process.Pid) + "/" + name
		// Until sleep has loaded and gone to sleep, its files change between two reads.
		var mismatch string
		for try := 0; try < 20; try++ {
			time.Sleep(50 * time.Millisecond)
			mismatch = ""
			want, wantErr := os.ReadFile(path)
			for _, size := range []int{4096, 64, 1} {
				got, err := readProcFrom(path, size)
				if err != nil || wantErr != nil || steady(got) != steady(want) {
					mismatch = fmt.Sprintf("readProcFrom(%s, %d) = %q, %v; os.ReadFile: %q, %v", path, size, got, err, want, wantErr)
				}
			}
			if mismatch == "" {
				break
			}
		}
		if mismatch != "" {
			t.Error(mismatch)
		}
	}
	if _, err := readProc("/proc/0/stat"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("readProc(/proc/0/stat) = %v, want fs.ErrNotExist", err)
	}
}

// steady is a status or stat file without its SigQ line: the signals queued to the process's
// user, anywhere on the machine, which other processes change at any time.
func steady(b []byte) string {
	var kept []string
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasPrefix(line, "SigQ:") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "")
}

// A session leader held from an earlier claim is forgotten once it exits: its members' holder is
// then found as if it had never been held, never the exited leader.
func TestObserveSessionHolderForgetsAnExitedLeader(t *testing.T) {
	requireLinux(t)
	leader := exec.Command("sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $!; wait")
	leader.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := leader.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leader.Process.Kill(); _ = leader.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	member, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	testtool.KillAtEnd(t, member)
	for range 2 { // the second answer comes from the held leader
		got, obs, err := ObserveSessionHolder(member)
		if err != nil || got != leader.Process.Pid || obs != Observe(leader.Process.Pid) {
			t.Fatalf("ObserveSessionHolder(member %d) = %d, %+v, %v; want the leader %d as Observe sees it", member, got, obs, err, leader.Process.Pid)
		}
	}
	if _, held := leaders.running(leader.Process.Pid); !held {
		t.Fatalf("leader %d is not held after two claims from its session", leader.Process.Pid)
	}
	_ = leader.Process.Kill()
	_ = leader.Wait()
	got, obs, err := ObserveSessionHolder(member)
	if err != nil || got != member || obs != Observe(member) || obs.State != Present {
		t.Fatalf("after its leader exited, ObserveSessionHolder(member %d) = %d, %+v, %v; want the member itself, present", member, got, obs, err)
	}
	if _, held := leaders.running(leader.Process.Pid); held {
		t.Errorf("the exited leader %d is still held", leader.Process.Pid)
	}
	if obs := Observe(leader.Process.Pid); obs.State != Absent {
		t.Errorf("Observe(exited leader %d) = %+v, want absent", leader.Process.Pid, obs)
	}
}

// A held leader is observed as an unheld one is, and a leader that exits while held reads absent
// at once: the probe of a holder whose session ended must not find it alive.
func TestObserveHeldLeader(t *testing.T) {
	requireLinux(t)
	leader := startSleep(t, func(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} })
	pid := leader.Process.Pid
	unheld := Observe(pid)
	if _, _, err := ObserveSessionHolder(pid); err != nil {
		t.Fatal(err)
	}
	if _, held := leaders.running(pid); !held {
		t.Fatalf("leader %d is not held after a claim from its session", pid)
	}
	if held := Observe(pid); held != unheld || held.State != Present {
		t.Fatalf("Observe(held leader %d) = %+v; unheld it was %+v", pid, held, unheld)
	}
	_ = leader.Process.Kill()
	_ = leader.Wait()
	if obs := Observe(pid); obs.State != Absent {
		t.Errorf("Observe(leader %d, exited while held) = %+v, want absent", pid, obs)
	}
}

// The kernel's pidfd information names each thread's process as its status does, where the
// kernel has it (6.13 and later; ProcessOf reads the status elsewhere).
func TestThreadGroupOfIsStatusTgid(t *testing.T) {
	requireLinux(t)
	tasks := tasksWithASecondThread(t)
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		status, err := readProc("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue // exited since the listing
		}
		want, _ := parseTgid(string(status))
		got, ok := threadGroupOf(tid)
		if !ok {
			t.Skipf("this kernel gives no pidfd information (thread %d)", tid)
		}
		if got != want || got != os.Getpid() {
			t.Errorf("threadGroupOf(%d) = %d; its status says %d, and this process is %d", tid, got, want, os.Getpid())
		}
	}
}

// tasksWithASecondThread lists this process's threads while a goroutine locked to a thread of its
// own, kept until the test ends, guarantees one other than the main thread.
func tasksWithASecondThread(t *testing.T) []os.DirEntry {
	t.Helper()
	ready, done := make(chan struct{}), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		close(ready)
		<-done
	}()
	<-ready
	t.Cleanup(func() { close(done) })
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}

// RunningStart names a running process by its start, and a killed one that nobody has reaped yet
// (a zombie, which signal 0 still finds) as exited.
func TestRunningStartEndsAtTheZombie(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	fields, err := readStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if got := RunningStart(pid); got != fields.startTicks {
		t.Fatalf("RunningStart of a running sleep = %q, want its start %q", got, fields.startTicks)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatalf("the killed sleep is gone before it was reaped (%v): not the zombie case", err)
		}
		if text := string(stat); strings.HasPrefix(text[strings.LastIndexByte(text, ')'):], ") Z ") {
			break
		}
		runtime.Gosched() // until the kill lands
	}
	if got := RunningStart(pid); got != "" {
		t.Fatalf("RunningStart of a zombie = %q, want \"\"", got)
	}
	cmd.Wait()
	if got := RunningStart(pid); got != "" {
		t.Fatalf("RunningStart of a reaped process = %q", got)
	}
}

// A read of a file counts as holding it open, and only a write open counts as holding it open for
// writing, whatever else the process has open.
func TestHoldsOpenForWriting(t *testing.T) {
	requireLinux(t)
	path := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if HoldsOpen(os.Getpid(), path) || HoldsOpenForWriting(os.Getpid(), path) {
		t.Fatal("holds a file it never opened")
	}
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !HoldsOpen(os.Getpid(), path) || HoldsOpenForWriting(os.Getpid(), path) {
		t.Fatalf("read open: HoldsOpen %v, HoldsOpenForWriting %v; want true, false", HoldsOpen(os.Getpid(), path), HoldsOpenForWriting(os.Getpid(), path))
	}
	for _, flag := range []int{os.O_WRONLY, os.O_RDWR} {
		w, err := os.OpenFile(path, flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !HoldsOpenForWriting(os.Getpid(), path) {
			t.Errorf("open with flags %#o: not held for writing", flag)
		}
		w.Close()
		if HoldsOpenForWriting(os.Getpid(), path) {
			t.Errorf("closed the open with flags %#o: still held for writing", flag)
		}
	}
}
