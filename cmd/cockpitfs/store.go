package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
)

// storeFlags choose the store: badger in --data (the default), or an etcd prefix named by --store
// with etcdctl's connection flags.
type storeFlags struct {
	store, cacert, cert, key, user, password *string
	timeout                                  *time.Duration
}

func addStoreFlags(fs *flag.FlagSet) *storeFlags {
	return &storeFlags{
		store:    fs.String("store", "", "etcd://HOST:PORT[,HOST:PORT…]/PREFIX: share the namespace through etcd instead of --data"),
		cacert:   fs.String("cacert", "", "etcd: verify the members' certificates with this CA bundle"),
		cert:     fs.String("cert", "", "etcd: client certificate"),
		key:      fs.String("key", "", "etcd: client certificate's key"),
		user:     fs.String("user", "", "etcd: USER or USER:PASSWORD"),
		password: fs.String("password", "", "etcd: password of --user"),
		timeout:  fs.Duration("command-timeout", storage.Budget, "etcd: how long an operation waits for a quorum"),
	}
}

// etcd returns the etcd store's configuration, or ok=false when the store is badger's, refusing
// etcd flags without --store.
func (f *storeFlags) etcd() (cfg etcdconf.Config, ok bool, err error) {
	if *f.store == "" {
		if *f.cacert+*f.cert+*f.key+*f.user+*f.password != "" {
			return cfg, false, errors.New("--cacert, --cert, --key, --user and --password need --store etcd://…")
		}
		return cfg, false, nil
	}
	if team == nil {
		return cfg, false, errNoTeam
	}
	if cfg, err = etcdconf.ParseURL(*f.store); err != nil {
		return cfg, false, err
	}
	if cfg.TLS, err = (etcdconf.TLSFiles{CACert: *f.cacert, Cert: *f.cert, Key: *f.key}).Config(); err != nil {
		return cfg, false, err
	}
	cfg.Username, cfg.Password = *f.user, *f.password
	if *f.timeout <= 0 {
		return cfg, false, fmt.Errorf("--command-timeout %v is not a positive duration", *f.timeout)
	}
	cfg.Budget = *f.timeout
	if user, password, found := strings.Cut(*f.user, ":"); found {
		if *f.password != "" {
			return cfg, false, errors.New("give the password in --user USER:PASSWORD or in --password, not both")
		}
		cfg.Username, cfg.Password = user, password
	}
	if cfg.Password != "" && cfg.Username == "" {
		return cfg, false, errors.New("--password needs --user")
	}
	return cfg, true, nil
}

// team opens etcd stores; nil in a build without team mode (team.go, -tags team), which links no
// etcd client.
var team interface {
	serve(mnt string, st storeChoice, restart string) (servedStore, error)
	open(cfg etcdconf.Config, where string, source bool) (migrating, error)
	verify(cfg etcdconf.Config, url, data string) error
}

// errNoTeam refuses --store in a build without team mode.
var errNoTeam = errors.New("this cockpitfs is built without team mode (etcd); build it with -tags team: " +
	"CGO_ENABLED=0 go build -tags team -o ~/.local/bin/cockpitfs ./cmd/cockpitfs (docs/teams.md)")

// storeError is err from storeFlags.etcd as command's usage error, but for the refusal of a build
// without team mode, which is said alone: nothing is wrong with the command line.
func storeError(command string, err error) error {
	if errors.Is(err, errNoTeam) {
		return err
	}
	return &usageError{command: command, msg: err.Error()}
}
