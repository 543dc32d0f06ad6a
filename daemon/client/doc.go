// Package client is the Go SDK that trainers use to talk to a sandbox's daemon.
package client
