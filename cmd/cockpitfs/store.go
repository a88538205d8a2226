package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
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

// openEtcd connects to the etcd store cfg names.
func openEtcd(cfg etcdconf.Config) (*etcdstore.Store, error) {
	s, err := etcdstore.Open(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w; nothing was changed", err)
	}
	return s, nil
}
