// Package fake is an in-memory runtime.Runtime with the containerd runtime's
// behaviour, configurable latencies and injectable failures, for unit tests
// and scale simulation (many nodes × many slots in one process).
package fake
