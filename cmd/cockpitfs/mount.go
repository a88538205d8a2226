package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
	cfs "github.com/cockpitfs/cockpitfs/fs"
	"github.com/cockpitfs/cockpitfs/internal/mountinfo"
	"github.com/cockpitfs/cockpitfs/internal/shell"
	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
)

// daemonLogName is the log of mount --daemon's daemon, in its data directory.
const daemonLogName = "cockpitfs.log"

// readyEnv names the fd a daemonised child reports readiness on.
const readyEnv = "COCKPITFS_READY_FD"

// Log levels of --log-level.
const (
	logError = iota
	logInfo
	logDebug
)

var logLevel = logInfo

// infof logs what the daemon does (serving, unmounting) unless --log-level error.
func infof(format string, args ...any) {
	if logLevel >= logInfo {
		log.Printf(format, args...)
	}
}

func mountCommand(args []string) error {
	fset := newFlags("mount")
	data := dataFlag(fset)
	sf := addStoreFlags(fset)
	daemon := fset.Bool("daemon", false, "")
	allowOther := fset.Bool("allow-other", false, "")
	nonempty := fset.Bool("nonempty", false, "")
	leasesPerUID := fset.Int("max-leases-per-uid", defaultLeasesPerUID, "")
	cockpitsPerUID := fset.Int("max-cockpits-per-uid", defaultCockpitsPerUID, "")
	stacksPerUID := fset.Int("max-stacks-per-uid", defaultStacksPerUID, "")
	openBytesPerUID := fset.Int64("max-open-bytes-per-uid", cfs.DefaultMaxOpenBytesPerUID, "")
	waitsPerUID := fset.Int("max-waits-per-uid", cfs.DefaultMaxWaitsPerUID, "")
	gcInterval := fset.Duration("gc-interval", defaultGCInterval, "")
	level := fset.String("log-level", "info", "")
	proxyPort := fset.Int("proxy", 0, "")
	proxyHTTPS := fset.Bool("proxy-https", false, "")
	debug := fset.Bool("debug", false, "") // kept for scripts of earlier releases: --log-level debug
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return &usageError{command: "mount", msg: "mount takes one MOUNTPOINT"}
	}
	switch *level {
	case "error":
		logLevel = logError
	case "info":
		logLevel = logInfo
	case "debug":
		logLevel = logDebug
	default:
		return &usageError{command: "mount", msg: fmt.Sprintf("--log-level %q is not error, info or debug", *level)}
	}
	if *debug {
		logLevel = logDebug
	}
	if *leasesPerUID < 0 {
		return &usageError{command: "mount", msg: fmt.Sprintf("--max-leases-per-uid %d is negative (0: no bound)", *leasesPerUID)}
	}
	if *cockpitsPerUID < 0 {
		return &usageError{command: "mount", msg: fmt.Sprintf("--max-cockpits-per-uid %d is negative (0: no bound)", *cockpitsPerUID)}
	}
	if *stacksPerUID < 0 {
		return &usageError{command: "mount", msg: fmt.Sprintf("--max-stacks-per-uid %d is negative (0: no bound)", *stacksPerUID)}
	}
	if *gcInterval < 0 {
		return &usageError{command: "mount", msg: fmt.Sprintf("--gc-interval %s is negative (0: never)", *gcInterval)}
	}
	if *openBytesPerUID < 0 {
		return &usageError{command: "mount", msg: fmt.Sprintf("--max-open-bytes-per-uid %d is negative (0: no bound)", *openBytesPerUID)}
	}
	if *waitsPerUID < 0 {
		return &usageError{command: "mount", msg: fmt.Sprintf("--max-waits-per-uid %d is negative (0: no bound)", *waitsPerUID)}
	}
	if *proxyPort < 0 || *proxyPort > 65535 {
		return &usageError{command: "mount", msg: fmt.Sprintf("--proxy %d is not a TCP port", *proxyPort)}
	}
	if *proxyHTTPS && *proxyPort == 0 {
		return &usageError{command: "mount", msg: "--proxy-https needs --proxy PORT"}
	}
	mnt, err := resolveMountpoint(positional[0])
	if err != nil {
		return err
	}
	// Checked here, so a daemon's parent reports a bad flag itself.
	etcdCfg, isEtcd, err := sf.etcd()
	if err != nil {
		return storeError("mount", err)
	}
	if *daemon {
		// Refused before the daemon's log is made in the data directory. A mount (maybe a dead
		// one) is the daemon's to look at: a stat of a dead one fails.
		if typ, err := mountType(mnt); err == nil && typ == "" {
			if err := checkMountpoint(mnt, *nonempty); err != nil {
				return err
			}
		}
		return daemonize(args, *data)
	}
	st := storeChoice{data: *data, leasesPerUID: *leasesPerUID, cockpitsPerUID: *cockpitsPerUID, stacksPerUID: *stacksPerUID, proxyPort: *proxyPort, proxyHTTPS: *proxyHTTPS}
	if isEtcd {
		st.etcd, st.url = &etcdCfg, *sf.store
	}
	restart := restartCommand(mnt, st, sf, *allowOther)
	return serve(mnt, st, *nonempty, restart, cfs.Options{AllowOther: *allowOther, Debug: logLevel >= logDebug, MaxOpenBytesPerUID: *openBytesPerUID, MaxWaitsPerUID: *waitsPerUID, GCInterval: *gcInterval})
}

// storeChoice is the store a daemon serves: badger in data, or the etcd prefix url names; and
// how many active leases each user's claims may hold there (--max-leases-per-uid), and how many
// cockpits and stacks each user may make (--max-cockpits-per-uid, --max-stacks-per-uid).
type storeChoice struct {
	data           string
	etcd           *etcdconf.Config
	url            string
	leasesPerUID   int
	cockpitsPerUID int
	stacksPerUID   int
	// proxyPort, when not 0, is the loopback port the stacks' web proxy serves on (with HTTPS
	// when proxyHTTPS).
	proxyPort  int
	proxyHTTPS bool
}

// defaultGCInterval is --gc-interval's default: a sweep reads every active stack's record (from
// memory), probes its holders and stats their checkouts, so once a minute costs nothing a
// machine notices, and a stack waits at most a minute past its cockpit's grace.
const defaultGCInterval = time.Minute

// defaultLeasesPerUID is --max-leases-per-uid's default: one developer's stacks running at once
// on a shared machine, with room left for everyone else in a cockpit of the usual 20 families.
const defaultLeasesPerUID = 8

// defaultCockpitsPerUID is --max-cockpits-per-uid's default: a cockpit per project a developer
// works on. 32 cockpits of 60 KB configs (a config may be 64 KiB) add ≈ 2 MiB to the store and to
// the daemon's settled memory (docs/machines.md); unbounded, one user's 2,000 held 775 MiB.
const defaultCockpitsPerUID = 32

// defaultStacksPerUID is --max-stacks-per-uid's default: one cockpit's worth (MaxStacks), every
// cockpit counted. Unbounded, one user's 8,192 stacks (8 cockpits of 1,024) left the settled
// daemon 18.5 MiB more anonymous memory, and 32 cockpits of them ≈ 75 MiB (docs/machines.md).
const defaultStacksPerUID = engine.MaxStacks

func unmountCommand(args []string) error {
	fset := newFlags("unmount")
	lazy := fset.Bool("lazy", false, "")
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return &usageError{command: "unmount", msg: "unmount takes one MOUNTPOINT"}
	}
	return unmount(positional[0], *lazy)
}

// stopSignals end a foreground daemon with a clean unmount: Ctrl-C, kill, the terminal closing
// (SIGHUP) and Ctrl-\ (SIGQUIT, whose default would leave a dead mount behind).
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// serve mounts and serves until a stop signal or an unmount from outside, then unmounts and
// closes the store. restart is the command the NOT-MOUNTED note gives to start it again.
func serve(mnt string, st storeChoice, nonempty bool, restart string, o cfs.Options) (err error) {
	ready := readyPipe()
	defer func() {
		if ready != nil && err != nil {
			fmt.Fprintln(ready, err)
		}
	}()
	// Signals are caught from the start: one arriving while the store opens or the mount is
	// made must still end in a clean unmount. Ctrl-Z would stop the server and hang every
	// process using the mount; a closed stdout or stderr pipe must not kill it either.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, stopSignals...)
	signal.Ignore(syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE)
	syscall.Umask(daemonUmask)
	boundHeap()
	if os.Geteuid() != 0 {
		if _, lerr := exec.LookPath("fusermount3"); lerr != nil {
			if _, lerr := exec.LookPath("fusermount"); lerr != nil {
				return errors.New("mounting as a non-root user needs fusermount3 (Debian: apt-get install fuse3)")
			}
		}
	}
	// Before anything touches the path: a dead mount answers its stat with ENOTCONN.
	if err := clearStaleMount(mnt); err != nil {
		return err
	}
	// A refused mount leaves nothing new behind: what can be refused is, before anything is made
	// (the mountpoint checked, the store locked), and what was made for a mount that then fails
	// is removed.
	if err := checkMountpoint(mnt, nonempty); err != nil {
		return err
	}
	// An etcd daemon keeps only what it saw of the cluster there (openServed), and trusts the
	// directory as a badger one does.
	if err := checkDataDir(st.data); err != nil {
		return err
	}
	discardStore := discardFresh(st.data)
	store, err := openServed(mnt, st, restart)
	if err != nil {
		discardStore()
		return err
	}
	if st.proxyPort != 0 {
		// Before the mount, so a port that is taken refuses the whole mount and leaves nothing.
		stopProxy, err := startProxy(store.eng, st, mnt)
		if err != nil {
			store.close()
			discardStore()
			return err
		}
		defer stopProxy()
	}
	beneath, undoMountpoint, err := prepareMountpoint(mnt, nonempty, restart)
	if err != nil {
		store.close()
		discardStore()
		return err
	}
	defer beneath.Close()
	server, err := cfs.Mount(mnt, store.eng, o)
	if err != nil {
		undoMountpoint()
		store.close()
		discardStore()
		return mountError(mnt, err)
	}
	protectMountpoint(beneath)
	defer store.close()
	store.served()
	infof("serving %s (%s)", mnt, store.from)
	if ready != nil {
		fmt.Fprintln(ready, "ok")
		ready.Close()
		ready = nil
	}
	logStatsOnSIGUSR1()
	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	select {
	case s := <-signals:
		infof("%s: unmounting %s", s, mnt)
		shutdown(server, mnt, done)
	case <-done: // unmounted from outside (cockpitfs unmount, umount)
	}
	return nil
}

// servedStore is the store a daemon serves, opened by openServed: its engine, what it is (for the
// log), close, which ends what the opening started, and served, called once the mount serves,
// which starts what only a serving daemon does: the rolling backups of a data directory. Not
// before: a refused mount (a proxy port taken, fusermount3's refusal) leaves nothing new behind,
// and one restarted in a loop by its service manager would otherwise rotate every older backup
// out with copies of the same store.
type servedStore struct {
	eng           *engine.Engine
	from          string
	close, served func()
}

// openServed opens the store a daemon serves and its engine; restart is the command that starts
// the daemon again.
func openServed(mnt string, st storeChoice, restart string) (servedStore, error) {
	if st.etcd != nil {
		return team.serve(mnt, st, restart)
	}
	data := st.data
	if err := os.MkdirAll(data, 0o700); err != nil {
		return servedStore{}, dataDirError(data, err)
	}
	if err := unfinishedMigration(data); err != nil {
		return servedStore{}, err
	}
	db, err := kv.Open(data)
	if err != nil {
		return servedStore{}, damageHint(err, data)
	}
	closeDB := func() {
		if err := db.Close(); err != nil {
			log.Print(err)
		}
	}
	stopBackups := make(chan struct{})
	var backupsDone chan struct{} // made once the backups start
	served := func() {
		backupsDone = make(chan struct{})
		go func() { keepBackups(db, data, stopBackups); close(backupsDone) }()
	}
	closeStore := func() {
		if backupsDone != nil {
			close(stopBackups)
			<-backupsDone
		}
		closeDB()
	}
	eng := engine.New(db)
	// Whoever runs the daemon may take every family it could take by running one of its own.
	eng.BoundLeases(st.leasesPerUID, uint32(os.Getuid()))
	eng.BoundCockpits(st.cockpitsPerUID, uint32(os.Getuid()))
	if err := eng.CountStacks(context.Background(), st.stacksPerUID, uint32(os.Getuid())); err != nil {
		closeStore()
		return servedStore{}, err
	}
	// The holds of every active lease are taken again before the mount serves anyone.
	lost, err := eng.HoldPorts(portlock.Machine, engine.DaemonIdentity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: data, Mount: mnt})
	if err != nil {
		closeStore()
		return servedStore{}, fmt.Errorf("holding the leased ports: %w", err)
	}
	for _, l := range lost {
		log.Printf("conflict: %s/%s: %s; reported in its health and events", l.Cockpit, l.Stack, l)
	}
	return servedStore{eng, "data " + data, closeStore, served}, nil
}

// discardFresh returns what removes the store a failed mount made in data: the directory when it
// did not exist, its files but the log when it held only the log (mount --daemon makes it for
// the log, which then says why), nothing when it held a store.
func discardFresh(data string) func() {
	entries, err := os.ReadDir(data)
	switch {
	case os.IsNotExist(err):
		return func() { os.RemoveAll(data) }
	case err != nil:
		return func() {}
	}
	for _, e := range entries {
		if e.Name() != daemonLogName {
			return func() {}
		}
	}
	return func() {
		entries, _ := os.ReadDir(data)
		for _, e := range entries {
			if e.Name() != daemonLogName {
				os.RemoveAll(filepath.Join(data, e.Name()))
			}
		}
	}
}

// mountError words a failed mount: go-fuse reports fusermount's failure by its wait status only,
// while fusermount itself has already said why on our stderr.
func mountError(mnt string, err error) error {
	msg := strings.TrimSpace(err.Error())
	if strings.HasPrefix(msg, "fusermount exited") {
		msg = "fusermount3 refused the mount (its own message says why)"
	}
	return fmt.Errorf("mount %s: %s", mnt, msg)
}

// shutdown unmounts; while files are still open on the mount it detaches it and aborts the FUSE
// connection, so the daemon exits promptly and closes the store cleanly either way.
func shutdown(server *fuse.Server, mnt string, done <-chan struct{}) {
	// The connection's number from mountinfo, not from a stat: the daemon never makes requests to
	// its own mount, which a kill during one would leave unanswerable.
	device, devErr := mountDevice(mnt)
	if err := server.Unmount(); err == nil {
		select {
		case <-done:
			return
		case <-time.After(2 * time.Second):
		}
	}
	log.Printf("%s is busy; detaching it", mnt)
	if err := detachMount(mnt); err != nil {
		log.Printf("detach %s: %v", mnt, err)
	}
	// Only root may abort a connection; a user's daemon's exit, closing /dev/fuse, ends it.
	if devErr == nil && os.Geteuid() == 0 {
		// Open files keep a detached connection alive; abort it so the server stops.
		abort := fmt.Sprintf("/sys/fs/fuse/connections/%s/abort", device)
		if err := os.WriteFile(abort, []byte("1"), 0); err != nil {
			log.Printf("abort the FUSE connection: %v", err)
		}
	}
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		log.Printf("the kernel has not released %s; closing the store anyway", mnt)
	}
}

// readyPipe is the daemonising parent's pipe, when this process is its child.
func readyPipe() *os.File {
	fd := os.Getenv(readyEnv)
	if fd == "" {
		return nil
	}
	os.Unsetenv(readyEnv)
	return os.NewFile(3, "ready")
}

// daemonize starts this command again in the foreground, in its own session, logging to
// DATA/cockpitfs.log, and returns once it reports it is serving (or why it is not). The child
// keeps none of our standard streams, so a caller capturing them is not held open.
func daemonize(args []string, data string) error {
	if err := checkDataDir(data); err != nil {
		return err
	}
	if err := os.MkdirAll(data, 0o700); err != nil {
		return dataDirError(data, err)
	}
	logPath := filepath.Join(data, daemonLogName)
	// Never through a link, whatever was put there since the check.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("the daemon's log: %w", err)
	}
	defer logFile.Close()
	// Where this start's lines begin, to show them if it fails.
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	var child []string
	for _, a := range args {
		if a != "--daemon" && a != "-daemon" {
			child = append(child, a)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	// /proc/self/exe, not the path: the daemon runs this very binary even if the path is not
	// searchable by the user (setpriv from root's directory) or was replaced since.
	cmd := exec.Command("/proc/self/exe", append([]string{"mount"}, child...)...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), readyEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	if line == "ok" {
		fmt.Printf("cockpitfs serving (pid %d); log: %s\n", cmd.Process.Pid, logPath)
		return cmd.Process.Release()
	}
	cmd.Wait()
	if line == "" {
		line = "the daemon exited before it was serving"
	}
	fmt.Fprintln(os.Stderr, "cockpitfs:", line)
	said := daemonSaid(logPath, logStart, line)
	for _, l := range said {
		fmt.Fprintln(os.Stderr, "  "+l)
	}
	for _, fix := range mountFixes(strings.Join(said, "\n") + "\n" + line) {
		fmt.Fprintln(os.Stderr, "fix:", fix)
	}
	fmt.Fprintln(os.Stderr, "the daemon's log:", logPath)
	return &exitError{code: 1}
}

// daemonSaid returns the lines a failed daemon wrote to its log from offset on, but the line with
// the error it also reported through the ready pipe.
func daemonSaid(logPath string, offset int64, reported string) []string {
	f, err := os.Open(logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil
	}
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasSuffix(l, reported) {
			lines = append(lines, l)
		}
	}
	return lines
}

// mountFixes names what to do about the failures fusermount3 and the kernel report in their own
// words.
func mountFixes(said string) []string {
	var fixes []string
	has := func(s ...string) bool {
		for _, x := range s {
			if !strings.Contains(said, x) {
				return false
			}
		}
		return true
	}
	switch {
	case has("user_allow_other"):
		fixes = append(fixes, "as root, add the line user_allow_other to /etc/fuse.conf; or mount without --allow-other")
	case has("/dev/fuse", "ermission denied"):
		fixes = append(fixes, "/dev/fuse must be readable and writable by you: as root, chmod 0666 /dev/fuse (what Debian's udev rule does); or mount as root")
	case has("/dev/fuse", "No such file or directory"):
		fixes = append(fixes, "load the fuse module (as root: modprobe fuse); in a container, give it the device (docker run --device /dev/fuse)")
	case has("fusermount", "Operation not permitted"):
		fixes = append(fixes, "fusermount3 must be setuid root (apt-get install --reinstall fuse3); in a container, add --cap-add SYS_ADMIN")
	case has("user has no write access to mountpoint"):
		fixes = append(fixes, "mount on a directory you own")
	}
	return fixes
}

// mountType returns the filesystem type of the mount at dir per /proc/self/mountinfo, "" when
// dir is not a mount point. Reading mountinfo never touches the path, which a dead mount answers
// with ENOTCONN.
func mountType(dir string) (string, error) {
	m, err := mountinfo.Of(dir)
	return m.Type, err
}

// mountDevice returns the minor device number of the mount at dir: its FUSE connection's number.
func mountDevice(dir string) (string, error) {
	m, err := mountinfo.Of(dir)
	if err == nil && m.Minor == "" {
		err = fmt.Errorf("%s is not mounted", dir)
	}
	return m.Minor, err
}

// mountDaemon finds the process serving the FUSE mount m on mnt: the one holding both /dev/fuse
// and the directory beneath the mount open, as a daemon does while it serves (see serve). It
// returns the pid and its start time (to tell it from a later process of the same pid), or 0 when
// there is none this process can see.
func mountDaemon(mnt string, m mountinfo.Info) (pid int, start string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		n, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // another user's
		}
		var fuseDev, beneath bool
		for _, fd := range fds {
			switch link, _ := os.Readlink(filepath.Join(fdDir, fd.Name())); link {
			case "/dev/fuse":
				fuseDev = true
			case mnt:
				// The path names the mount too: only an fd on the parent mount is beneath it.
				info, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "fdinfo", fd.Name()))
				beneath = beneath || fdinfoField(string(info), "mnt_id") == m.Parent
			}
		}
		if fuseDev && beneath {
			return n, liveness.RunningStart(n)
		}
	}
	return 0, ""
}

// fdinfoField is the value of a "name:\tvalue" line of /proc/PID/fdinfo/FD.
func fdinfoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// daemonExitWait is how long unmount waits for the daemon of the mount it unmounted to close its
// store and exit.
const daemonExitWait = 10 * time.Second

// waitExit waits until process pid, started at start, has exited; false if it has not within
// daemonExitWait.
func waitExit(pid int, start string) bool {
	deadline := time.Now().Add(daemonExitWait)
	for liveness.RunningStart(pid) == start {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// clearStaleMount detaches a mount a killed daemon left on mnt ("transport endpoint is not
// connected"); a live mount there is refused.
func clearStaleMount(mnt string) error {
	typ, err := mountType(mnt)
	if err != nil || typ == "" {
		return err
	}
	if typ != cfs.MountType {
		return fmt.Errorf("%s is already a %s mount point", mnt, typ)
	}
	switch mountState(mnt) {
	case "serving":
		return fmt.Errorf("%s is already mounted and serving (cockpitfs unmount %s first)", mnt, mnt)
	case "hung":
		return fmt.Errorf("%s is mounted by a daemon that does not answer (cockpitfs unmount %s detaches it)", mnt, mnt)
	}
	log.Printf("clearing the stale mount on %s", mnt)
	if err := detachMount(mnt); err != nil {
		return fmt.Errorf("clearing the stale mount on %s: %w", mnt, err)
	}
	return nil
}

// busyError is the refusal of an unmount the kernel answers EBUSY, and the ways out.
func busyError(mnt string) error {
	q := shell.Quote(mnt)
	return fmt.Errorf("%s is busy: something has files open or a cwd inside it (fuser -vm %s names them); end them, or `cockpitfs unmount --lazy %s` detaches it now and the daemon exits once they are gone", mnt, q, q)
}

// whileBusy runs unmount until it is not refused busy, for up to busyFor: a lookup under way
// keeps a mount busy for its moment, such as the daemon's own helper's after a drain released
// holders (fs/forget.go), or a shell's completion; a cwd or an open file inside stays.
func whileBusy(unmount func() (busy bool, err error)) error {
	deadline := time.Now().Add(busyFor)
	for {
		busy, err := unmount()
		if !busy || time.Now().After(deadline) {
			return err
		}
		time.Sleep(busyFor / 20)
	}
}

// busyFor is how long unmount retries a mount refused busy.
const busyFor = time.Second

// mountOption is the value of option name=value in a mountinfo options field, "" if absent.
func mountOption(options, name string) string {
	for _, o := range strings.Split(options, ",") {
		if k, v, ok := strings.Cut(o, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// detachMount unmounts mnt lazily: as root with MNT_DETACH, as a user through fusermount3 -u -z,
// since only root may call umount2.
func detachMount(mnt string) error {
	if os.Geteuid() == 0 {
		return unix.Unmount(mnt, unix.MNT_DETACH)
	}
	return fusermount("-u", "-z", mnt)
}

// fusermount runs fusermount3 (else fusermount, as a mount finds it), returning its own words
// when it fails.
func fusermount(args ...string) error {
	prog := "fusermount3"
	if _, err := exec.LookPath(prog); err != nil {
		prog = "fusermount"
	}
	if out, err := exec.Command(prog, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// answerWait is how long unmount and mount wait for a mount to answer a stat before calling its
// daemon hung (stopped, or stuck): a stat of a hung FUSE mount blocks, and not even SIGINT ends it.
const answerWait = 2 * time.Second

// mountState is how a mount answered a stat: "serving", "dead" (its daemon is gone: ENOTCONN),
// or "hung" (no answer within answerWait). The stat of a hung mount is left behind in its
// goroutine; the connection's abort, or the process's exit, ends it.
func mountState(mnt string) string {
	answered := make(chan error, 1)
	go func() {
		var st unix.Stat_t
		answered <- unix.Stat(mnt, &st)
	}()
	select {
	case err := <-answered:
		if errors.Is(err, unix.ENOTCONN) {
			return "dead"
		}
		return "serving"
	case <-time.After(answerWait):
		return "hung"
	}
}

// unmount unmounts mnt and says what it did: a dead mount is detached; a hung one is detached and,
// as root, its FUSE connection aborted, so whatever waits on it gets ENOTCONN.
func unmount(dir string, lazy bool) error {
	mnt, err := resolveMountpoint(dir)
	if err != nil {
		return err
	}
	info, err := mountinfo.Of(mnt)
	if err != nil {
		return err
	}
	if info.Type == "" {
		return fmt.Errorf("%s is not mounted", mnt)
	}
	if info.Type != cfs.MountType {
		return fmt.Errorf("%s is a %s mount, not a cockpitfs one: left mounted", mnt, info.Type)
	}
	if uid := mountOption(info.Options, "user_id"); os.Geteuid() != 0 && uid != strconv.Itoa(os.Geteuid()) {
		return fmt.Errorf("%s is another user's mount (uid %s): only that user or root can unmount it", mnt, uid)
	}
	state := mountState(mnt)
	// The daemon, to wait for: unmount returns once it has closed its store.
	var pid int
	var start string
	if state == "serving" && !lazy {
		pid, start = mountDaemon(mnt, info)
	}
	detach := lazy || state != "serving"
	if os.Geteuid() != 0 {
		args := []string{"-u", mnt}
		if detach {
			args = []string{"-u", "-z", mnt}
		}
		err := whileBusy(func() (bool, error) {
			err := fusermount(args...)
			return err != nil && strings.Contains(err.Error(), "Device or resource busy"), err
		})
		if err != nil {
			if strings.Contains(err.Error(), "Device or resource busy") {
				return busyError(mnt)
			}
			return err
		}
	} else {
		flags := 0
		if detach {
			flags = unix.MNT_DETACH
		}
		err := whileBusy(func() (bool, error) {
			err := unix.Unmount(mnt, flags)
			return errors.Is(err, unix.EBUSY), err
		})
		if err != nil {
			if errors.Is(err, unix.EBUSY) {
				return busyError(mnt)
			}
			return fmt.Errorf("unmount %s: %w", mnt, err)
		}
	}
	switch {
	case state == "serving" && lazy:
		fmt.Printf("detached %s; its daemon exits once nothing has files open or a cwd inside it\n", mnt)
	case state == "serving":
		if pid != 0 && !waitExit(pid, start) {
			return fmt.Errorf("unmounted %s, but its daemon (pid %d) has not exited within %s: it still holds its store (its log says why; kill %d ends it)", mnt, pid, daemonExitWait, pid)
		}
		fmt.Printf("unmounted %s\n", mnt)
	case state == "dead":
		fmt.Printf("detached %s, whose daemon had died\n", mnt)
	case state == "hung":
		aborted := ""
		if os.Geteuid() == 0 {
			abort := fmt.Sprintf("/sys/fs/fuse/connections/%s/abort", info.Minor)
			if err := os.WriteFile(abort, []byte("1"), 0); err == nil {
				aborted = " and aborted its FUSE connection (whatever waited on it gets ENOTCONN)"
			}
		}
		fmt.Printf("%s did not answer within %s (its daemon is stopped or stuck): detached it lazily%s; the daemon process was left as it is\n",
			mnt, answerWait, aborted)
	}
	return nil
}

// dataDirError says which data directory could not be made, and how to give another: the default
// is below $HOME, which a service user's may not allow (HOME=/nonexistent).
func dataDirError(data string, err error) error {
	return fmt.Errorf("cannot make the data directory %s: %w (give one with --data DIR)", data, err)
}
