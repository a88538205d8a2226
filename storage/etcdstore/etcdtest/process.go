package etcdtest

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// Process is one etcd member run from the installed etcd binary (Debian's etcd-server), for what
// only another etcd version than the embedded one shows. Kill and Restart are a crash and a start
// on the same data directory.
type Process struct {
	t            testing.TB
	dir          string
	peer, client string
	cmd          *exec.Cmd
	done         chan struct{}
}

// StartProcess starts one member of the installed etcd (testtool.Need: skipped, or failed under
// CI, when it is missing) and waits until it serves; it is killed when the test ends.
func StartProcess(t testing.TB) *Process {
	t.Helper()
	testtool.Need(t, "etcd")
	peer, client := freeURL(t), freeURL(t)
	p := &Process{t: t, dir: filepath.Join(t.TempDir(), "member"), peer: peer.String(), client: client.String()}
	p.Restart()
	t.Cleanup(p.Kill)
	return p
}

// Endpoint is the member's client address.
func (p *Process) Endpoint() string { return p.client[len("http://"):] }

// Kill ends the member with SIGKILL, as a crash would.
func (p *Process) Kill() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

// Restart starts the member (again) on its data directory and waits until it answers.
func (p *Process) Restart() {
	p.t.Helper()
	p.cmd = exec.Command("etcd", "--name", "m0", "--data-dir", p.dir,
		"--listen-peer-urls", p.peer, "--initial-advertise-peer-urls", p.peer,
		"--listen-client-urls", p.client, "--advertise-client-urls", p.client,
		"--initial-cluster", "m0="+p.peer, "--max-txn-ops", "2048")
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(p.cmd, p.done)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		p.t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "ready"); err != nil {
		p.t.Fatalf("etcd did not start: %v", err)
	}
}
