// Package archive is sandman's one tar format for directory trees, written
// and read by both sides of a copy: the daemon (GET /v1/files?archive=tar
// and PUT …&archive=tar) and sandmanctl cp. It depends only on the standard
// library, so a client links none of the daemon's server.
//
// An archive holds directories (names ending in "/"), regular files and
// symbolic links (stored as links, never followed), with permission bits
// and modification times. Sockets, devices and FIFOs are skipped when
// writing and ignored when reading: they carry no content and mean nothing
// on another machine. Extraction also accepts hard links between entries.
//
// Extraction treats the archive as hostile (it may come from code running
// in a sandbox): names that are absolute or contain "..", and entries whose
// path would pass through a symbolic link leading outside the destination
// (one the archive made or one already there), are refused with ErrUnsafe.
// It works through an os.Root, so a link swapped in while it runs cannot
// lead it out either.
package archive
