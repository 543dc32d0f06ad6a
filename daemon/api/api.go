// Package api holds the wire types of the daemon's HTTP API v1, shared by the
// server (package daemon) and the Go client (package daemon/client). The API
// is documented in docs/daemon-api.md.
package api

import "time"

// Port is the TCP port the daemon listens on inside every sandbox.
const Port = 49983

// EnvEnvdUser, in the sandbox's environment, names the user envd calls
// (E2B's protocol) that name none act as, in place of the daemon's own:
// E2B's default user. A daemon running as root (the pod's runAsUser 0)
// with EnvEnvdUser=user acts as E2B's envd does: commands and file calls
// run as user unless they name another, root included. It narrows nothing
// a call may ask for; the v1 API and the main command are not affected.
const EnvEnvdUser = "SANDMAN_ENVD_USER"

// Error is the body of every non-2xx answer: {"error":{"code":..,"message":..}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorBody wraps Error as it travels.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Error codes. Each maps to one HTTP status in the server.
const (
	CodeBadRequest      = "bad_request"        // 400
	CodeUnauthorized    = "unauthorized"       // 401
	CodeForbidden       = "permission_denied"  // 403
	CodeNotFound        = "not_found"          // 404
	CodeConflict        = "conflict"           // 409: exists, not empty, already exited
	CodeNotADirectory   = "not_a_directory"    // 400
	CodeIsADirectory    = "is_a_directory"     // 400
	CodeTooLarge        = "too_large"          // 413
	CodeTooManyRequests = "too_many_processes" // 429
	CodeNoShell         = "no_shell"           // 422: the image has no shell
	CodeNoSpace         = "no_space"           // 507: the sandbox's disk is full
	CodeInternal        = "internal"           // 500
	CodeUnavailable     = "shutting_down"      // 503
)

// Health is GET /v1/health.
type Health struct {
	Status      string  `json:"status"`
	Version     string  `json:"version"`
	IdleSeconds float64 `json:"idle_seconds"`
	// CallIdleSeconds is the time since the last authenticated call ended
	// (0 while one is in progress), whatever the sandbox's processes do:
	// what the virtual node's auto-pause waits for.
	CallIdleSeconds float64 `json:"call_idle_seconds"`
	// Running counts execs, background processes and session runs in progress.
	Running int `json:"running"`
	// MainRestarts counts restarts of the main process (its restart policy).
	MainRestarts int `json:"main_restarts,omitempty"`
}

// ExecRequest is POST /v1/exec. Exactly one of Cmd and Shell is set.
type ExecRequest struct {
	// Cmd is an argv; Cmd[0] is looked up in PATH.
	Cmd []string `json:"cmd,omitempty"`
	// Shell is a command line run by ShellPath -c (default: /bin/bash when the
	// image has it, else /bin/sh).
	Shell     string `json:"shell,omitempty"`
	ShellPath string `json:"shell_path,omitempty"`
	// Env is merged over the sandbox's environment.
	Env map[string]string `json:"env,omitempty"`
	// Cwd defaults to the sandbox's working directory.
	Cwd string `json:"cwd,omitempty"`
	// Stdin is written to the process, then closed; without it stdin is empty.
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutSeconds kills the whole process group when it passes (0: none).
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
	// MaxOutputBytes caps stdout and stderr each (0: the daemon's default).
	// Output past the cap is read and dropped; Truncated says so.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
}

// ExecResult is the answer of POST /v1/exec. Output that is valid UTF-8 comes
// in Stdout/Stderr; other output comes base64-encoded in StdoutBase64/
// StderrBase64 (the bytes are kept exactly either way).
type ExecResult struct {
	ExitCode     int    `json:"exit_code"`
	Signal       string `json:"signal,omitempty"`
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	StdoutBase64 []byte `json:"stdout_base64,omitempty"`
	StderrBase64 []byte `json:"stderr_base64,omitempty"`
	TimedOut     bool   `json:"timed_out"`
	Truncated    bool   `json:"truncated"`
	DurationMS   int64  `json:"duration_ms"`
}

// Event types of NDJSON streams (exec ?stream=1, process output).
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// Event is one line of an NDJSON stream. Data is raw bytes (base64 in JSON).
type Event struct {
	Type string `json:"type"`
	// Offset is the position of Data in the process's combined output.
	Offset int64     `json:"offset,omitempty"`
	Time   time.Time `json:"time,omitzero"`
	Data   []byte    `json:"data,omitempty"`
	// For exit events.
	ExitCode  *int   `json:"exit_code,omitempty"`
	Signal    string `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	// Dropped counts output bytes no longer retained before Offset.
	Dropped    int64  `json:"dropped,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	Error      *Error `json:"error,omitempty"`
}

// ProcessRequest is POST /v1/processes: a background process.
type ProcessRequest struct {
	Cmd       []string          `json:"cmd,omitempty"`
	Shell     string            `json:"shell,omitempty"`
	ShellPath string            `json:"shell_path,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	// Stdin keeps the process's stdin open for POST /v1/processes/{id}/stdin.
	Stdin bool `json:"stdin,omitempty"`
	// TimeoutSeconds kills the process group when it passes (0: none).
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
	// Tag is free text for the caller, returned in listings.
	Tag string `json:"tag,omitempty"`
}

// Process describes a background process (and the main process, id "main").
type Process struct {
	ID        string     `json:"id"`
	PID       int        `json:"pid"`
	Cmd       []string   `json:"cmd"`
	Tag       string     `json:"tag,omitempty"`
	Running   bool       `json:"running"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	TimedOut  bool       `json:"timed_out,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	ExitedAt  *time.Time `json:"exited_at,omitempty"`
	// OutputBytes is the total written to stdout and stderr so far.
	OutputBytes int64 `json:"output_bytes"`
}

// SignalRequest is POST /v1/processes/{id}/signal and sessions' interrupt.
type SignalRequest struct {
	// Signal is a name ("TERM", "SIGKILL") or a number ("9").
	Signal string `json:"signal"`
	// Group sends it to the whole process group (default true).
	Group *bool `json:"group,omitempty"`
}

// SessionRequest is POST /v1/sessions.
type SessionRequest struct {
	ShellPath string            `json:"shell_path,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
}

// Session describes a persistent shell.
type Session struct {
	ID        string    `json:"id"`
	PID       int       `json:"pid"`
	Shell     string    `json:"shell"`
	Busy      bool      `json:"busy"`
	Alive     bool      `json:"alive"`
	StartedAt time.Time `json:"started_at"`
}

// RunRequest is POST /v1/sessions/{id}/run.
type RunRequest struct {
	Command        string  `json:"command"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
	MaxOutputBytes int64   `json:"max_output_bytes,omitempty"`
}

// RunResult is the answer of a session run: the same shape as an exec, plus
// whether the shell survived the command (a command may `exit` the shell).
type RunResult struct {
	ExecResult
	SessionAlive bool `json:"session_alive"`
}

// FileInfo is GET /v1/files/stat and one entry of a listing.
type FileInfo struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"` // for symlinks
}

// FileList is GET /v1/files/list.
type FileList struct {
	Entries []FileInfo `json:"entries"`
	// Truncated says the listing stopped at the entry limit.
	Truncated bool `json:"truncated,omitempty"`
}

// MoveRequest is POST /v1/files/move.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Overwrite replaces an existing destination (default false: 409).
	Overwrite bool `json:"overwrite,omitempty"`
}

// WriteResult is the answer of PUT /v1/files.
type WriteResult struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
	// Entries counts extracted entries for archive uploads.
	Entries int `json:"entries,omitempty"`
}

// AssignRequest is POST /v1/assign: the node agent hands a waiting (hot)
// sandbox to a pod.
type AssignRequest struct {
	TokenHashes          []string `json:"token_hashes,omitempty"`
	AllowUnauthenticated bool     `json:"allow_unauthenticated,omitempty"`
	// Env (KEY=VALUE) is set over the sandbox's environment.
	Env []string `json:"env,omitempty"`
	// Dir is the default working directory.
	Dir string `json:"dir,omitempty"`
	// Main is the pod's command, started as the main process.
	Main []string `json:"main,omitempty"`
	// RestartPolicy for Main: Never (default), OnFailure or Always.
	RestartPolicy string `json:"restart_policy,omitempty"`
	// Reassign replaces an assigned sandbox's tokens (TokenHashes,
	// AllowUnauthenticated) and nothing else: a sandbox restored from
	// another's checkpoint gets its own pod's. NextAssignTokenSHA256 (hex)
	// then replaces the assign token, which is spent.
	Reassign              bool   `json:"reassign,omitempty"`
	NextAssignTokenSHA256 string `json:"next_assign_token_sha256,omitempty"`
}

// TokenRequest is POST /v1/token: the caller's own token is replaced by the
// one whose SHA-256 this is (hex); the sandbox's other tokens stay.
type TokenRequest struct {
	TokenSHA256 string `json:"token_sha256"`
}
