// Command lazycompare is the driver of hack/lazy-compare.sh, which measured
// the choice of a lazy-pulling snapshotter: it makes a large test
// image, fronts the registry with a counting (and
// optionally throttling) proxy, and pulls and runs an image through an
// isolated containerd with a given snapshotter, printing how long the first
// command took. The script runs the comparison (and converts the image to
// eStargz with sandmanctl images convert); this is its parts.
//
//	lazycompare mkimage REF MIB FILES       busybox, MIB of random files in layers of 8, a small app
//	lazycompare proxy LISTEN UPSTREAM MIBPS count (and throttle, MIBPS > 0) registry traffic; GET /_served[?reset=1]
//	lazycompare run SOCK SNAPSHOTTER REF CMD...  pull, create, start, wait: "RESULT ... total_ms=N"
//	lazycompare fetch SOCK REF              content only (what soci convert reads)
//	lazycompare push SOCK REF               push an image containerd holds
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/containerd/v2/pkg/snapshotters"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const namespace = "lazycompare"

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if len(os.Args) < 3 {
		log.Fatal("usage: see the package comment")
	}
	a := os.Args[2:]
	var err error
	switch os.Args[1] {
	case "mkimage":
		err = needArgs(a, 3, func() error { return mkimage(a[0], atoi(a[1]), atoi(a[2])) })
	case "proxy":
		err = needArgs(a, 3, func() error { return proxy(a[0], a[1], atoi(a[2])) })
	case "run":
		err = needArgs(a, 4, func() error { return run(a[0], a[1], a[2], a[3:]) })
	case "fetch":
		err = needArgs(a, 2, func() error { return fetch(a[0], a[1]) })
	case "push":
		err = needArgs(a, 2, func() error { return push(a[0], a[1]) })
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

func needArgs(a []string, n int, f func() error) error {
	if len(a) < n {
		return fmt.Errorf("%s needs %d arguments", os.Args[1], n)
	}
	return f()
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		log.Fatalf("%q: not a number", s)
	}
	return n
}

// tarLayer is a gzip layer of the files, with their parent directories.
func tarLayer(files map[string][]byte) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for n, b := range files {
		for d := path.Dir(n); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				return nil, err
			}
		}
		mode := int64(0o644)
		if bytes.HasPrefix(b, []byte("\x7fELF")) {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(b))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed))
}

// mkimage pushes busybox, then mib MiB of random (incompressible) data in
// n files, eight to a layer, then a small app layer.
func mkimage(ref string, mib, n int) error {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("busybox-static: %w", err)
	}
	base, err := tarLayer(map[string][]byte{"bin/busybox": bb, "etc/passwd": []byte("root:x:0:0:root:/root:/bin/sh\n")})
	if err != nil {
		return err
	}
	layers := []v1.Layer{base}
	per := (mib << 20) / n
	batch := map[string][]byte{}
	for i := range n {
		b := make([]byte, per)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		batch[fmt.Sprintf("data/blob%04d", i)] = b
		if len(batch) == 8 || i == n-1 {
			l, err := tarLayer(batch)
			if err != nil {
				return err
			}
			layers = append(layers, l)
			batch = map[string][]byte{}
		}
	}
	app, err := tarLayer(map[string][]byte{"app/hello.txt": []byte("hello\n"), "app/main.sh": []byte("cat /app/hello.txt\n")})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), append(layers, app)...)
	if err != nil {
		return err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Config.Cmd = []string{"/bin/busybox", "sh", "/app/main.sh"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	return remote.Write(r, img)
}

// proxy counts the bytes of every registry answer and, with a rate, paces
// them all together to it, as one registry link of that speed would.
type meter struct {
	mu     sync.Mutex
	rate   float64 // bytes per second; 0: unlimited
	start  time.Time
	paced  int64
	served atomic.Int64
}

func (m *meter) reset() {
	m.mu.Lock()
	m.start, m.paced = time.Now(), 0
	m.mu.Unlock()
	m.served.Store(0)
}

// took records n bytes and says how long to wait before passing them on.
func (m *meter) took(n int) time.Duration {
	m.served.Add(int64(n))
	if m.rate == 0 {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.paced == 0 || now.Sub(m.start) > time.Duration(float64(m.paced)/m.rate*float64(time.Second))+time.Second {
		m.start, m.paced = now, 0 // idle: do not bank unused bandwidth
	}
	m.paced += int64(n)
	return time.Until(m.start.Add(time.Duration(float64(m.paced) / m.rate * float64(time.Second))))
}

type paced struct {
	io.ReadCloser
	m *meter
}

func (p paced) Read(b []byte) (int, error) {
	if len(b) > 256<<10 {
		b = b[:256<<10]
	}
	n, err := p.ReadCloser.Read(b)
	if d := p.m.took(n); d > 0 {
		time.Sleep(d)
	}
	return n, err
}

func proxy(listen, upstream string, mibps int) error {
	u, err := url.Parse(upstream)
	if err != nil {
		return err
	}
	m := &meter{rate: float64(mibps) * (1 << 20)}
	m.reset()
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(r *http.Response) error {
		r.Body = paced{r.Body, m}
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/_served", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, m.served.Load())
		if r.URL.Query().Get("reset") != "" {
			m.reset()
		}
	})
	mux.Handle("/", rp)
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func client(sock string) (*ctrd.Client, context.Context, error) {
	c, err := ctrd.New(sock)
	return c, namespaces.WithNamespace(context.Background(), namespace), err
}

// run pulls ref into the snapshotter (a remote snapshotter gets the layer
// labels it needs to mount layers lazily), runs args in a container of it
// under runc, and prints the times.
func run(sock, snapshotter, ref string, args []string) error {
	c, ctx, err := client(sock)
	if err != nil {
		return err
	}
	defer c.Close()
	t0 := time.Now()
	opts := []ctrd.RemoteOpt{ctrd.WithPullUnpack, ctrd.WithPullSnapshotter(snapshotter)}
	if snapshotter != "overlayfs" {
		opts = append(opts, ctrd.WithImageHandlerWrapper(snapshotters.AppendInfoHandlerWrapper(ref)))
	}
	img, err := c.Pull(ctx, ref, opts...)
	if err != nil {
		return err
	}
	pulled := time.Since(t0)
	id := fmt.Sprintf("lazycompare-%d", time.Now().UnixNano())
	ctr, err := c.NewContainer(ctx, id, ctrd.WithSnapshotter(snapshotter), ctrd.WithNewSnapshot(id, img),
		ctrd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(args...)))
	if err != nil {
		return err
	}
	defer ctr.Delete(context.WithoutCancel(ctx), ctrd.WithSnapshotCleanup)
	var out bytes.Buffer
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &out, os.Stderr)))
	if err != nil {
		return err
	}
	defer task.Delete(context.WithoutCancel(ctx))
	exited, err := task.Wait(ctx)
	if err != nil {
		return err
	}
	if err := task.Start(ctx); err != nil {
		return err
	}
	st := <-exited
	total := time.Since(t0)
	fmt.Printf("RESULT snapshotter=%s pull_ms=%d total_ms=%d exit=%d out=%q\n", snapshotter, pulled.Milliseconds(), total.Milliseconds(), st.ExitCode(), out.String())
	if st.ExitCode() != 0 {
		return fmt.Errorf("%v exited %d", args, st.ExitCode())
	}
	return nil
}

func fetch(sock, ref string) error {
	c, ctx, err := client(sock)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Fetch(ctx, ref)
	return err
}

func push(sock, ref string) error {
	c, ctx, err := client(sock)
	if err != nil {
		return err
	}
	defer c.Close()
	img, err := c.ImageService().Get(ctx, ref)
	if err != nil {
		return err
	}
	return c.Push(ctx, ref, img.Target)
}
