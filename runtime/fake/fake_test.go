package fake_test

import (
	"testing"
	"time"

	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

func TestConformance(t *testing.T) {
	runtimetest.Suite(t, func(t *testing.T) runtimetest.Harness {
		rt, err := fake.New(fake.Config{
			Node: "fake-1", Slots: 4,
			Images:      []string{"busybox", "noshell"},
			BindLatency: time.Millisecond, ReadyLatency: time.Millisecond, RecycleLatency: time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rt.Close)
		return runtimetest.Harness{
			Runtime: rt, Slots: 4, WarmSlots: 4,
			Image: "busybox", NoShellImage: "noshell", MissingImage: "nope:latest",
		}
	})
}
