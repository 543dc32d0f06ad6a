package main

import (
	"net"
	"testing"
	"time"
)

// With the cap reached, the next connection is accepted only once one of
// the open ones closes.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := limitListen(inner, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, second := <-accepted, <-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted with the cap at 2")
	case <-time.After(200 * time.Millisecond):
		// Nothing more within a while: the accept loop is waiting for a
		// slot (a negative check; the positive one follows).
	}
	first.Close()
	first.Close() // a second Close gives back nothing more
	select {
	case third := <-accepted:
		third.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the third connection was not accepted after one closed")
	}
	second.Close()
	l.Close()
	if _, ok := <-accepted; ok {
		t.Fatal("Accept returned a connection after Close")
	}
}
