package etcdstore_test

import (
	"context"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

func BenchmarkUpdate(b *testing.B) {
	s := etcdtest.Start(b, 3).Open(b, "bench")
	for b.Loop() {
		err := s.Update(context.Background(), func(tx storage.Txn) error {
			if _, err := tx.Get("k"); err != nil && err != storage.ErrNotFound {
				return err
			}
			return tx.Set("k", []byte("v"))
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
