// Package daemon is the in-sandbox server: it runs as PID 1 of every sandbox,
// mounted read-only into the unmodified task image, and serves the exec,
// process, session and file API. It imports no other sandman package.
package daemon
