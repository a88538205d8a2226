package etcdstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
	"github.com/cockpitfs/cockpitfs/storage/storagetest"
)

func TestConformance(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	var prefixes atomic.Int64
	storagetest.Run(t, storagetest.Backend{
		Budget: etcdtest.Budget,
		Open: func(t *testing.T) (storage.Store, func() storage.Store) {
			prefix := fmt.Sprint("conformance-", prefixes.Add(1))
			s := cluster.Open(t, prefix)
			reopen := func() storage.Store {
				if err := s.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				return cluster.Open(t, prefix)
			}
			return s, reopen
		},
	})
}
