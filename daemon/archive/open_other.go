//go:build !unix

package archive

// readFlags: no FIFOs to guard against here.
const readFlags = 0
