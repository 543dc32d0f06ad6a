package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// buildTemplate runs a build of name to its end (the fake daemon answers
// its steps) and returns it.
func (b *buildEnv) buildTemplate(key, ns, name string, start map[string]any) (templateRequestResponse, templateBuildInfo) {
	b.t.Helper()
	res := b.requestBuild(key, name)
	b.upload(key, res.TemplateID, projectTar(b.t.(*testing.T)))
	if r := b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, key, start); r.status != http.StatusAccepted {
		b.t.Fatalf("start build of %s: %d %s", name, r.status, r.body)
	}
	poll(b.t, "the sandbox of build "+res.BuildID, func() bool {
		for _, p := range b.sandboxPods(ns) {
			if p.Labels[podcontract.LabelE2BBuild] == res.BuildID {
				b.setStatus(ns, p.Name, ready(daemonAddr))
				return true
			}
		}
		return false
	})
	info, _ := b.waitBuild(key, res)
	return res, info
}

// TestTemplateCalls: the CLI's template calls. The list has the key's
// namespace's templates with their newest build's status; a template
// lists its builds a page at a time; a build's logs filter by level and
// run backward; a template cannot be made public; delete removes a
// template (its builds' states, its name), never another namespace's or
// the operator's, and falls through to snapshots.
func TestTemplateCalls(t *testing.T) {
	// A clock that moves, so that builds have an order.
	var ticks atomic.Int64
	b := newBuildEnv(t, func(c *Config) {
		c.Now = func() time.Time { return testNow.Add(time.Duration(ticks.Add(1)) * time.Millisecond) }
	})
	ok := map[string]any{"fromTemplate": "base", "steps": steps()}
	listed, info := b.buildTemplate(rawKeyA, nsA, "listed", ok)
	if info.Status != buildReady {
		t.Fatalf("build: %+v", info.Reason)
	}
	bad := steps()
	bad[0] = templateStep{Type: "RUN", Args: []string{"make && exit 3"}}
	broken, info := b.buildTemplate(rawKeyA, nsA, "broken", map[string]any{"fromTemplate": "base", "steps": bad})
	if info.Status != buildError {
		t.Fatalf("failing build: %s", info.Status)
	}
	again, info := b.buildTemplate(rawKeyA, nsA, "listed", map[string]any{"fromTemplate": "base", "steps": steps(), "force": true})
	if info.Status != buildReady || again.TemplateID != listed.TemplateID {
		t.Fatalf("second build: %s %+v", info.Status, again)
	}

	var list []templateInfo
	b.call(http.MethodGet, "/templates", rawKeyA, nil).decode(t, &list)
	if len(list) != 2 || list[0].Names[0] != "broken" || list[1].Names[0] != "listed" {
		t.Fatalf("list: %+v", list)
	}
	if l := list[1]; l.TemplateID != listed.TemplateID || l.BuildID != again.BuildID || l.BuildStatus != buildReady ||
		l.BuildCount != 2 || l.CPUCount != 2 || l.MemoryMB != 1024 || l.Public || l.EnvdVersion != EnvdVersion {
		t.Errorf("listed: %+v", l)
	}
	if l := list[0]; l.BuildStatus != buildError || l.BuildID != "" || l.BuildCount != 1 {
		t.Errorf("broken: %+v", l)
	}
	// v2: a page at a time.
	r := b.call(http.MethodGet, "/v2/templates?limit=1", rawKeyA, nil)
	r.decode(t, &list)
	if len(list) != 1 || list[0].Names[0] != "broken" || r.header.Get(headerNextToken) != "broken" {
		t.Errorf("v2 first page: %+v next %q", list, r.header.Get(headerNextToken))
	}
	r = b.call(http.MethodGet, "/v2/templates?limit=1&nextToken=broken", rawKeyA, nil)
	r.decode(t, &list)
	if len(list) != 1 || list[0].Names[0] != "listed" || r.header.Get(headerNextToken) != "" {
		t.Errorf("v2 last page: %+v next %q", list, r.header.Get(headerNextToken))
	}
	var other []templateInfo
	if b.call(http.MethodGet, "/templates", rawKeyB, nil).decode(t, &other); len(other) != 0 {
		t.Errorf("another namespace's list: %+v", other)
	}

	// Builds, a page at a time, newest first; by ID or name.
	r = b.call(http.MethodGet, "/templates/"+listed.TemplateID+"?limit=1", rawKeyA, nil)
	var page templateWithBuilds
	r.decode(t, &page)
	next := r.header.Get(headerNextToken)
	if len(page.Builds) != 1 || page.Builds[0].BuildID != again.BuildID || next == "" || page.Builds[0].FinishedAt == nil {
		t.Fatalf("first page: %+v next %q", page, next)
	}
	b.call(http.MethodGet, "/templates/listed?limit=1&nextToken="+next, rawKeyA, nil).decode(t, &page)
	if len(page.Builds) != 1 || page.Builds[0].BuildID != listed.BuildID || page.Builds[0].Status != buildReady {
		t.Errorf("second page: %+v", page)
	}
	for _, c := range []struct{ path, key string }{
		{"/templates/" + listed.TemplateID, rawKeyB}, {"/templates/base", rawKeyA}, {"/templates/nope", rawKeyA},
	} {
		if r := b.call(http.MethodGet, c.path, c.key, nil); r.status != http.StatusNotFound {
			t.Errorf("GET %s: %d %s", c.path, r.status, r.body)
		}
	}
	if r := b.call(http.MethodGet, "/templates/listed?limit=0", rawKeyA, nil); r.status != http.StatusBadRequest {
		t.Errorf("limit 0: %d", r.status)
	}

	// Logs: all, errors only, backward, limited.
	logs := func(q string) []buildLogEntry {
		t.Helper()
		r := b.call(http.MethodGet, "/templates/"+broken.TemplateID+"/builds/"+broken.BuildID+"/logs"+q, rawKeyA, nil)
		if r.status != http.StatusOK {
			t.Fatalf("logs%s: %d %s", q, r.status, r.body)
		}
		var out struct{ Logs []buildLogEntry }
		r.decode(t, &out)
		return out.Logs
	}
	all := logs("")
	if len(all) < 3 || !strings.Contains(logText(all), "exit code 3") {
		t.Fatalf("logs: %s", logText(all))
	}
	if errs := logs("?level=error"); len(errs) == 0 || len(errs) == len(all) {
		t.Errorf("error logs: %d of %d", len(errs), len(all))
	} else {
		for _, e := range errs {
			if e.Level != "error" {
				t.Errorf("level=error gave %+v", e)
			}
		}
	}
	if back := logs("?direction=backward&limit=1"); len(back) != 1 || back[0] != all[len(all)-1] {
		t.Errorf("backward: %+v, want %+v", back, all[len(all)-1])
	}
	if r := b.call(http.MethodGet, "/templates/"+broken.TemplateID+"/builds/"+broken.BuildID+"/logs", rawKeyB, nil); r.status != http.StatusNotFound {
		t.Errorf("logs with another namespace's key: %d", r.status)
	}

	// Public: refused; private: what it is.
	if r := b.call(http.MethodPatch, "/templates/listed", rawKeyA, map[string]any{"public": true}); r.status != http.StatusNotImplemented {
		t.Errorf("publish: %d %s", r.status, r.body)
	}
	if r := b.call(http.MethodPatch, "/v2/templates/listed", rawKeyA, map[string]any{"public": false}); r.status != http.StatusOK || !strings.Contains(string(r.body), `"names":["listed"]`) {
		t.Errorf("unpublish: %d %s", r.status, r.body)
	}
	if r := b.call(http.MethodPatch, "/templates/base", rawKeyA, map[string]any{"public": false}); r.status != http.StatusForbidden {
		t.Errorf("PATCH the operator's template: %d %s", r.status, r.body)
	}

	// Delete: not another namespace's, not the operator's; then gone.
	if r := b.call(http.MethodDelete, "/templates/"+listed.TemplateID, rawKeyB, nil); r.status != http.StatusNotFound {
		t.Errorf("delete with another namespace's key: %d %s", r.status, r.body)
	}
	if r := b.call(http.MethodDelete, "/templates/base", rawKeyA, nil); r.status != http.StatusForbidden {
		t.Errorf("delete the operator's template: %d %s", r.status, r.body)
	}
	if r := b.call(http.MethodDelete, "/templates/"+listed.TemplateID, rawKeyA, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := b.call(http.MethodGet, "/templates/aliases/listed", rawKeyA, nil); r.status != http.StatusNotFound {
		t.Errorf("exists after delete: %d", r.status)
	}
	if r := b.call(http.MethodPost, "/v2/sandboxes", rawKeyA, map[string]any{"templateID": "listed"}); r.status != http.StatusNotFound {
		t.Errorf("create after delete: %d %s", r.status, r.body)
	}
	cms, err := b.client.CoreV1().ConfigMaps(nsA).List(context.Background(), metav1.ListOptions{LabelSelector: labelBuildTemplate + "=" + listed.TemplateID})
	if err != nil || len(cms.Items) != 0 {
		t.Errorf("build states after delete: %d %v", len(cms.Items), err)
	}
	if r := b.call(http.MethodDelete, "/templates/"+listed.TemplateID, rawKeyA, nil); r.status != http.StatusNotFound {
		t.Errorf("delete again: %d %s", r.status, r.body)
	}
	b.call(http.MethodGet, "/templates", rawKeyA, nil).decode(t, &list)
	if len(list) != 1 || list[0].Names[0] != "broken" {
		t.Errorf("list after delete: %+v", list)
	}
}

// TestTemplateDeletedDuringBuild: deleting a template whose build is
// under way ends the build and its sandbox, and the build does not bring
// the template back.
func TestTemplateDeletedDuringBuild(t *testing.T) {
	b := newBuildEnv(t)
	res := b.requestBuild(rawKeyA, "doomed")
	b.upload(rawKeyA, res.TemplateID, projectTar(t))
	if r := b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, rawKeyA, map[string]any{"fromTemplate": "base", "steps": steps()}); r.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	var pod string
	poll(t, "the build sandbox", func() bool {
		for _, p := range b.sandboxPods(nsA) {
			pod = p.Name
			return true
		}
		return false
	})
	// Its sandbox never becomes ready: the build waits for it.
	if r := b.call(http.MethodDelete, "/templates/doomed", rawKeyA, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	poll(t, "the build sandbox deleted", func() bool {
		_, err := b.client.CoreV1().Pods(nsA).Get(context.Background(), pod, metav1.GetOptions{})
		return err != nil
	})
	poll(t, "the build to end", func() bool {
		_, running := b.gw.builds.get(res.BuildID)
		return !running
	})
	if r := b.call(http.MethodGet, "/templates/aliases/doomed", rawKeyA, nil); r.status != http.StatusNotFound {
		t.Errorf("the template after its build ended: %d %s", r.status, r.body)
	}
}
