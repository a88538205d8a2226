package kv

import (
	"path/filepath"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/storagetest"
)

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Backend{
		Budget: storage.Budget,
		Open: func(t *testing.T) (storage.Store, func() storage.Store) {
			dir := filepath.Join(t.TempDir(), "data")
			db, err := Open(dir)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() { db.Close() })
			reopen := func() storage.Store {
				if err := db.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if db, err = Open(dir); err != nil {
					t.Fatalf("reopen: %v", err)
				}
				return db
			}
			return db, reopen
		},
	})
}
