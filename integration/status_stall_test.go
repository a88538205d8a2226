package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A holder's process whose owner stalls its mmap lock (a fault on a file of a FUSE server that
// does not answer, holding the lock for reading, and an mmap queued behind it, which holds every
// later reader back) leaves status and status.json readable by everyone else, its row showing the
// process's name: a read of its command line would wait as long as the owner likes (procps's
// CVE-2018-1121), and with it every status read behind the status lock. The stall is checked to
// be real: a read of the process's /proc/<pid>/cmdline from here does not return while it lasts.
func TestStatusPastAHolderWhoseMemoryStalls(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 47710}, "s")
	stall := startMemoryStall(t)
	m.ok("touch $M/app/stacks/s/holders/h && echo pid=" + strconv.Itoa(stall.pid) + " > $M/app/stacks/s/holders/h")
	stall.begin(t)

	const bound = 10 * time.Second // generous: a read returns in milliseconds
	table := readWithin(t, m.Path("status"), bound)
	row := ""
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 7 && f[4] == "h" {
			row = strings.Join(f[5:8], " ")
		}
	}
	if want := "live " + strconv.Itoa(stall.pid) + " " + memoryStallName; row != want {
		t.Fatalf("the stalled holder's row reads %q, want %q:\n%s", row, want, table)
	}
	var st struct {
		Cockpits []struct {
			Stacks []struct {
				Holders []struct{ Name, State, Command string }
			}
		}
	}
	text := readWithin(t, m.Path("status.json"), bound)
	if err := json.Unmarshal([]byte(text), &st); err != nil {
		t.Fatal(err)
	}
	if h := st.Cockpits[0].Stacks[0].Holders; len(h) != 1 || h[0].State != "live" || h[0].Command != memoryStallName {
		t.Fatalf("status.json's holders while the stall lasts: %+v", h)
	}
	stall.end(t)
}

// readWithin reads path, failing the test if it takes longer than bound; the read itself goes on
// until it returns (the stall's cleanup ends it).
func readWithin(t *testing.T, path string, bound time.Duration) string {
	t.Helper()
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		data, err := os.ReadFile(path)
		done <- result{data, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return string(r.data)
	case <-time.After(bound):
		t.Fatalf("reading %s took over %v while a holder's memory stalls", path, bound)
		return ""
	}
}

// memoryStallEnv names, in a helper process's environment, the FUSE file whose page it faults
// in to stall its own mmap lock (runMemoryStall).
const memoryStallEnv = "COCKPITFS_TEST_MEMORY_STALL"

// memoryStallName is the helper's name (comm): the base name of the link it is run by.
const memoryStallName = "memory-stall"

// memoryStall is a helper process (this test binary, run by a link named memoryStallName) and
// the FUSE server whose file it maps.
type memoryStall struct {
	pid     int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	file    *stallFile
	release func() // answers the server's reads: every stalled read returns
	probe   chan struct{}
}

// startMemoryStall mounts the server and starts the helper, which maps the server's file and
// faults it in from a thread of its own (the fault's read waits for release). Its cleanups
// release the server's reads first, then kill the helper, then unmount: nothing is left waiting.
func startMemoryStall(t *testing.T) *memoryStall {
	t.Helper()
	dir := t.TempDir()
	file := &stallFile{arrived: make(chan struct{}), hold: make(chan struct{})}
	server, err := fusefs.Mount(dir, &stallRoot{file: file}, &fusefs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Unmount() })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), memoryStallName)
	if err := os.Symlink(self, link); err != nil {
		t.Fatal(err)
	}
	s := &memoryStall{file: file}
	var once sync.Once
	s.release = func() { once.Do(func() { close(file.hold) }) }
	s.cmd = exec.Command(link)
	s.cmd.Env = append(os.Environ(), memoryStallEnv+"="+filepath.Join(dir, "page"))
	var stderr syncBuffer
	s.cmd.Stderr = &stderr
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.pid = s.cmd.Process.Pid
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	})
	t.Cleanup(s.release)
	select {
	case <-file.arrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("the helper's fault did not reach the server; its stderr:\n%s", stderr.String())
	}
	return s
}

// begin queues the helper's mmap behind its stalled fault, and waits until a read of its command
// line from here does not return: the stall a reader of its argv meets.
func (s *memoryStall) begin(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(s.stdin, "mmap\n"); err != nil {
		t.Fatal(err)
	}
	for range 30 {
		probe := make(chan struct{})
		go func() {
			os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.pid))
			close(probe)
		}()
		select {
		case <-probe:
			time.Sleep(100 * time.Millisecond) // the mmap is not queued yet
		case <-time.After(time.Second):
			s.probe = probe
			return
		}
	}
	t.Fatal("a read of the helper's command line never stalled")
}

// end releases the stall and checks the probe's read returns.
func (s *memoryStall) end(t *testing.T) {
	t.Helper()
	s.release()
	select {
	case <-s.probe:
	case <-time.After(30 * time.Second):
		t.Fatal("the helper's command line still cannot be read after the release")
	}
}

type stallRoot struct {
	fusefs.Inode
	file *stallFile
}

func (r *stallRoot) OnAdd(ctx context.Context) {
	r.AddChild("page", r.NewPersistentInode(ctx, r.file, fusefs.StableAttr{Mode: syscall.S_IFREG}), false)
}

// stallFile is one page whose reads wait for hold to close; arrived closes at the first.
type stallFile struct {
	fusefs.Inode
	arrived, hold chan struct{}
	once          sync.Once
}

func (f *stallFile) Getattr(_ context.Context, _ fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size = syscall.S_IFREG|0o444, 4096
	return 0
}

func (f *stallFile) Open(context.Context, uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

func (f *stallFile) Read(_ context.Context, _ fusefs.FileHandle, dest []byte, _ int64) (fuse.ReadResult, syscall.Errno) {
	f.once.Do(func() { close(f.arrived) })
	<-f.hold
	return fuse.ReadResultData(make([]byte, len(dest))), 0
}

// runMemoryStall is the helper: it maps the file memoryStallEnv names and reads its page through
// /proc/self/mem from a thread of its own, a fault that holds its mmap lock for reading until the
// server answers. At a line on stdin it maps anonymous memory from another thread: that mmap
// waits for the lock for writing, and every reader of its memory that comes later waits behind
// it. It runs until killed.
func runMemoryStall(path string) {
	f, err := os.Open(path)
	if err != nil {
		panic(err)
	}
	page, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		panic(err)
	}
	addr := int64(uintptr(unsafe.Pointer(&page[0])))
	go func() {
		runtime.LockOSThread()
		unix.Pread(int(mem.Fd()), make([]byte, 1), addr)
	}()
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		panic(err)
	}
	go func() {
		runtime.LockOSThread()
		unix.Mmap(-1, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANON)
	}()
	for {
		time.Sleep(time.Hour)
	}
}
