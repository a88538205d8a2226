//go:build !linux

package liveness

import "errors"

// Exited cannot watch a process without pidfds.
func Exited(int) (<-chan struct{}, error) {
	return nil, errors.New("watching a process's exit needs Linux pidfds")
}
