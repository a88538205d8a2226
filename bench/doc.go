// Package bench measures cockpitfs against its floors and its peer (issue 7): reads and claim
// cycles through a real mount of the built binary beside a minimal go-fuse filesystem with the same
// cache mode and tmpfs, the engine's throughput and lease allocation in-process, the daemon's
// footprint and start times, and the seeds' lock-file transaction on the same disk. Everything is
// a Go benchmark (go test -bench); scripts/bench runs them and prints medians and ratios.
package bench
