package deps
import (
 _ "github.com/hanwen/go-fuse/v2/fs"
 _ "github.com/dgraph-io/badger/v4"
 _ "golang.org/x/sys/unix"
 _ "github.com/BurntSushi/toml"
)
