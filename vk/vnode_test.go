package vk

import (
	"net/http"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	kfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/sandman-dev/sandman/pool"
)

func TestNewNode(t *testing.T) {
	pl, err := pool.New(pool.Config{Name: "p", OnUpdate: func(pool.Update) {}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		cfg           Config
		opts          []NodeOpt
		wantErr       bool
		wantInformers int // pod, secret, config map, service, RuntimeClass (+ namespace)
	}{
		{name: "no client", cfg: Config{NodeName: "vn", Pool: pl}, wantErr: true},
		{name: "defaults", cfg: Config{NodeName: "vn", Pool: pl, Client: kfake.NewClientset(), Recorder: record.NewFakeRecorder(10)}, wantInformers: 5},
		{name: "namespace selector", cfg: Config{NodeName: "vn", Pool: pl, Client: kfake.NewClientset(), Recorder: record.NewFakeRecorder(10),
			AllowedNamespaceSelector: labels.SelectorFromSet(labels.Set{"team": "ml"})}, wantInformers: 6},
		{name: "options", cfg: Config{NodeName: "vn", Pool: pl, Client: kfake.NewClientset(), Recorder: record.NewFakeRecorder(10)}, opts: []NodeOpt{
			WithKubeletPort(10260), WithKubeletVersion("v1.2.3-sandman"), WithWorkers(4), WithPodWatch(PodWatchNode),
			WithRoutes(http.NewServeMux(), nil)}, wantInformers: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := NewNode(tc.cfg, tc.opts...)
			if tc.wantErr {
				if err == nil {
					t.Fatal("NewNode succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(n.Provider().Close)
			if len(n.informers) != tc.wantInformers {
				t.Errorf("%d informers, want %d", len(n.informers), tc.wantInformers)
			}
			if n.vnode == nil {
				t.Error("no virtual node")
			}
		})
	}
}
