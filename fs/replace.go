package fs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// Replacing config by taking it away first. install(1) removes its target and creates it again,
// GNU mv from another filesystem does the same, and cp --backup renames config aside (config~,
// config.~N~) before creating config. A cockpit is never without its config, so such a removal
// or rename, by a process that may write config, begins a replacement by that process: config
// stays, every other process reads the old document, and to that process alone config is missing
// until it creates it again. What it writes there is applied whole when it closes it, once, as a
// write in place is; a refused document leaves the old one and says why at that close. A process
// that exits without creating config again, or is killed before it closes it, abandons the
// replacement: config stays as it was, and one events line says so.

// replacement is one process's replacement of a cockpit's config.
type replacement struct {
	caller engine.Caller // who began it, and how (unlink, or rename to a backup name)
	// doc is the config the process created again (nil until it does): a scratch file whose
	// close applies it.
	doc *scratch
	// applied: its document was applied. The mode, owner and times it then sets on config
	// (install -m, by path, after its close) change nothing and are accepted, as a copy's
	// restored onto the fd it wrote are.
	applied bool
	ended   bool // applied, refused or abandoned: config is config again to the process
}

// replacements are the replacements under way, and the ended ones of processes still running, by
// cockpit and process. Each is forgotten when its process exits.
type replacements struct {
	mu      sync.Mutex
	m       map[string]map[int]*replacement
	pending map[string]int // by cockpit: how many have not ended (none: a lookup resolves no caller)
}

// backupName matches the names GNU cp, mv, install and ln --backup give the file they move aside:
// config~ (simple) and config.~N~ (numbered).
var backupName = regexp.MustCompile(`^config(~|\.~[1-9][0-9]{0,8}~)$`)

// of is the caller's replacement of cockpit's config under way, nil when there is none.
func (rs *replacements) of(ctx context.Context, cockpit string) *replacement {
	rs.mu.Lock()
	none := rs.pending[cockpit] == 0
	rs.mu.Unlock()
	if none {
		return nil
	}
	c := caller(ctx, "", "")
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r := rs.m[cockpit][c.PID]; r != nil && !r.ended {
		return r
	}
	return nil
}

// restoring says the caller is a process whose replacement of cockpit's config was applied.
func (rs *replacements) restoring(ctx context.Context, cockpit string) bool {
	rs.mu.Lock()
	none := len(rs.m[cockpit]) == 0
	rs.mu.Unlock()
	if none {
		return false
	}
	c := caller(ctx, "", "")
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.m[cockpit][c.PID]
	return r != nil && r.applied
}

// end ends r (under rs.mu). An open of the document it created answers ESTALE from then on, so the
// kernel looks config up again.
func (rs *replacements) end(cockpit string, r *replacement, applied bool) {
	if !r.ended {
		r.ended, r.applied = true, applied
		rs.pending[cockpit]--
	}
}

// ended says r has ended.
func (rs *replacements) ended(r *replacement) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return r.ended
}

// beginReplacement begins c's replacement of d's config, or refuses it: c may not write config,
// its process cannot be watched, or the cockpit has maxScratch replacements under way.
func (d *dir) beginReplacement(c engine.Caller) error {
	if err := d.fsys.eng.MayWriteConfig(c, d.cockpit); err != nil {
		return err
	}
	unsupported := &engine.Refusal{Code: engine.Unsupported,
		Message: d.child("config") + " cannot be removed, only replaced, and this process cannot be followed until it creates it again",
		Fix:     "copy the new document onto it (cp new.toml config), or mv the file beside config first, then onto config"}
	if c.PID == 0 {
		return unsupported
	}
	rs := &d.fsys.replacing
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.pending[d.cockpit] >= maxScratch {
		return &engine.Refusal{Code: engine.ConfigEditLimit, Fix: "let the other replacements finish first",
			Message: fmt.Sprintf("cockpit %s already has %d replacements of its config under way", d.cockpit, maxScratch)}
	}
	if rs.m == nil {
		rs.m, rs.pending = map[string]map[int]*replacement{}, map[string]int{}
	}
	if rs.m[d.cockpit] == nil {
		rs.m[d.cockpit] = map[int]*replacement{}
	}
	if r := rs.m[d.cockpit][c.PID]; r != nil {
		// The same process again (a script replacing config twice, or removing what it created
		// again): its watch goes on, and a document it had created is dropped.
		rs.end(d.cockpit, r, false)
		rs.m[d.cockpit][c.PID] = &replacement{caller: c}
		rs.pending[d.cockpit]++
		return nil
	}
	exited, err := liveness.Exited(c.PID)
	if err != nil {
		return unsupported
	}
	r := &replacement{caller: c}
	rs.m[d.cockpit][c.PID] = r
	rs.pending[d.cockpit]++
	go d.fsys.forgetAtExit(d.cockpit, c.PID, exited)
	return nil
}

// forgetAtExit forgets pid's replacement of cockpit's config when the process exits; one it had
// not ended is abandoned, with its events line.
func (f *FS) forgetAtExit(cockpit string, pid int, exited <-chan struct{}) {
	<-exited
	rs := &f.replacing
	rs.mu.Lock()
	r := rs.m[cockpit][pid]
	delete(rs.m[cockpit], pid)
	if len(rs.m[cockpit]) == 0 {
		delete(rs.m, cockpit)
	}
	abandoned := r != nil && !r.ended
	if abandoned {
		rs.end(cockpit, r, false)
	}
	rs.mu.Unlock()
	if abandoned {
		f.fail(r.caller, cockpit, "", &engine.Refusal{Code: engine.WriteAbandoned,
			Message: fmt.Sprintf("the process (pid %d) that took %s away (%s) to replace it exited without creating it again: config stays as it was", pid, childPath(cockpit, "config"), r.caller.Op),
			Fix:     "write the new document onto config (cp new.toml config); a cockpit's config can be replaced, not removed"})
	}
}

// createReplacement is the caller's create of config in its replacement: its new document.
func (d *dir) createReplacement(ctx context.Context, mode uint32) error {
	r := d.fsys.replacing.of(ctx, d.cockpit)
	rs := &d.fsys.replacing
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r == nil || r.ended || r.doc != nil {
		return &engine.Refusal{Code: engine.Exists, Message: d.child("config") + " exists"}
	}
	r.doc = newScratch(r.caller.UID, mode, nil, time.Now())
	return nil
}

// replacementEntry is config as the caller sees it in its replacement r: missing until it creates
// it again, then the document it writes. The kernel keeps neither: every other process looks
// config up and finds the old one.
func (d *dir) replacementEntry(r *replacement) (entry, bool) {
	d.fsys.replacing.mu.Lock()
	defer d.fsys.replacing.mu.Unlock()
	if r.doc == nil || r.ended {
		return entry{}, false
	}
	path := d.child("config")
	return entry{name: "config", unkept: true,
		node: &replacementFile{scratchFile: scratchFile{fsys: d.fsys, path: path, s: r.doc}, cockpit: d.cockpit, r: r}}, true
}

// unlinkConfig is an unlink of config: a replacement begins (see above), unless the caller is a
// program that only removes (rm, unlink(1)): config cannot be removed, and telling rm it was
// would report success for what is never applied.
func (d *dir) unlinkConfig(ctx context.Context) syscall.Errno {
	c := caller(ctx, "unlink", d.child("config"))
	if removerOnly(c.PID) {
		return d.fsys.fail(c, d.cockpit, "", &engine.Refusal{Code: engine.Unsupported,
			Message: d.child("config") + " cannot be removed: a cockpit's config is replaced, not removed",
			Fix:     "write the new document onto config (cp new.toml config), or rmdir the cockpit to end it"})
	}
	if err := d.beginReplacement(c); err != nil {
		return d.fsys.fail(c, d.cockpit, "", err)
	}
	return 0
}

// removerOnly says pid runs a program whose unlink of a file is the whole of what it does to it
// (rm, unlink), as its name in /proc says: unlike install, mv or an editor, it will not create
// the file again.
func removerOnly(pid int) bool {
	if pid == 0 {
		return false
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return false
	}
	switch strings.TrimSpace(string(comm)) {
	case "rm", "unlink":
		return true
	}
	return false
}

// renameConfigAside is a rename of config to a backup name: the backup is a scratch file of the
// caller's holding the document config has, and a replacement begins (see above). A backup of
// the same name is replaced, unless the rename says not to (RENAME_NOREPLACE: cp
// --backup=numbered).
func (d *dir) renameConfigAside(ctx context.Context, newName string, flags uint32) syscall.Errno {
	c := caller(ctx, "rename", d.child("config"))
	old := d.fsys.scratch.get(d.cockpit, newName)
	var refused error
	switch {
	case old != nil && !old.mine(ctx):
		refused = &engine.Refusal{Code: engine.PermissionDenied, Message: d.child(newName) + " is another user's",
			Fix: "back config up under another name (cp --backup=numbered)"}
	case old != nil && flags&unix.RENAME_NOREPLACE != 0:
		refused = &engine.Refusal{Code: engine.Exists, Message: d.child(newName) + " exists"}
	}
	if refused != nil {
		return d.fsys.fail(c, d.cockpit, "", refused)
	}
	v, err := d.fsys.configView(d.cockpit)()
	if err == nil {
		err = d.beginReplacement(c)
	}
	if err != nil {
		return d.fsys.fail(c, d.cockpit, "", err)
	}
	if err := d.fsys.scratch.put(d.cockpit, newName, newScratch(c.UID, 0o644, v.data, v.mtime)); err != nil {
		rs := &d.fsys.replacing
		rs.mu.Lock()
		rs.end(d.cockpit, rs.m[d.cockpit][c.PID], false) // nothing was moved aside: config is config again
		rs.mu.Unlock()
		return d.fsys.fail(c, d.cockpit, "", err)
	}
	return 0
}

// replacementFile is the config a process creates again in its replacement: a scratch file whose
// last close (or fsync) applies it as the cockpit's whole config.
type replacementFile struct {
	scratchFile
	cockpit string
	r       *replacement
}

var (
	_ = (gofs.NodeOpener)((*replacementFile)(nil))
	_ = (gofs.NodeFlusher)((*replacementFile)(nil))
	_ = (gofs.NodeFsyncer)((*replacementFile)(nil))
	_ = (gofs.NodeReleaser)((*replacementFile)(nil))
)

func (n *replacementFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.fsys.replacing.ended(n.r) {
		return nil, 0, n.fsys.failNoEvent("open", n.path, errGone) // config is config again: the kernel looks it up anew
	}
	return n.scratchFile.Open(ctx, flags)
}

func (n *replacementFile) Fsync(ctx context.Context, _ gofs.FileHandle, _ uint32) (errno syscall.Errno) {
	defer n.fsys.guard("fsync", n.path, "", &errno)
	return n.apply(uninterrupted(ctx), "fsync")
}

func (n *replacementFile) Flush(ctx context.Context, _ gofs.FileHandle) (errno syscall.Errno) {
	defer n.fsys.guard("flush", n.path, "", &errno)
	return n.apply(uninterrupted(ctx), "write")
}

// Release applies what a close held back for another descriptor of its process (see apply) once
// the last one is gone.
func (n *replacementFile) Release(ctx context.Context, fh gofs.FileHandle) (errno syscall.Errno) {
	defer n.fsys.guard("release", n.path, "", &errno)
	n.apply(uninterrupted(ctx), "release")
	return n.scratchFile.Release(ctx, fh)
}

// apply ends the replacement with the document written: applied, or refused with its errno and
// events line. A writer a signal killed applies nothing (what it wrote may stop anywhere). The
// close of a copy another process inherited (a child the writer started) ends nothing, and
// neither does the close of a duplicate while the writer holds another descriptor of it for
// writing (one open for reading, of the old document, is no duplicate).
func (n *replacementFile) apply(ctx context.Context, op string) syscall.Errno {
	n.s.mu.Lock() // held to the end: one close applies it
	defer n.s.mu.Unlock()
	if n.fsys.replacing.ended(n.r) {
		return 0
	}
	last := op == "release" // nobody is left to read its errno
	if last {
		op = "write"
	}
	c := caller(ctx, op, n.path)
	if !last && op == "write" && c.PID != 0 && c.PID != n.r.caller.PID {
		return 0 // a child of the writer closes the copy it inherited
	}
	var refused error
	fc, _ := fuse.FromContext(ctx)
	if sig, killed := liveness.KilledBy(int(fc.Pid)); killed {
		refused = &engine.Refusal{Code: engine.WriteAbandoned,
			Message: fmt.Sprintf("its writer was killed (%s) before it closed %s, which it had taken away to replace it: config stays as it was", unix.SignalName(sig), n.path),
			Fix:     "write it again, whole"}
	} else if !last && op == "write" && liveness.HoldsOpenForWriting(int(fc.Pid), filepath.Join(n.fsys.dir, n.path)) {
		return 0
	} else {
		refused = n.fsys.eng.SetConfig(ctx, c, n.cockpit, n.s.data)
	}
	rs := &n.fsys.replacing
	rs.mu.Lock()
	rs.end(n.cockpit, n.r, refused == nil)
	rs.mu.Unlock()
	if refused != nil {
		return n.fsys.fail(c, n.cockpit, "", refused)
	}
	return 0
}
