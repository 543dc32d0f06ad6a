package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/sandman-dev/sandman/lazyimage"
)

// imagesConvert converts images to eStargz, which workers with lazy pulling
// start before the pull ends, and pushes each beside its source (or --to).
// It needs no cluster: it reads and writes registries with the docker
// config's credentials ($DOCKER_CONFIG, ~/.docker/config.json).
func (c *ctl) imagesConvert(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("images convert", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	to := fs.String("to", "", "target reference (one IMAGE only; default: IMAGE's repository, its tag + "+lazyimage.TagSuffix+")")
	prioritize := fs.String("prioritize", "", "comma-separated files (paths in the image) to put first: fetched when a worker mounts the layer")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to registries that are not on loopback")
	platform := fs.String("platform", "linux/amd64", "the manifest to convert of a multi-platform image")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	const usage = "usage: sandmanctl images convert [--to REF] [--prioritize FILE,...] [--insecure] [--platform OS/ARCH] IMAGE..."
	if fs.NArg() == 0 {
		return fail(exitUsage, usage)
	}
	if *to != "" && fs.NArg() > 1 {
		return fail(exitUsage, "--to names one target: give one IMAGE (%d given)", fs.NArg())
	}
	plat, err := v1.ParsePlatform(*platform)
	if err != nil {
		return fail(exitUsage, "--platform %q: %v", *platform, err)
	}
	var nopts []name.Option
	if *insecure {
		nopts = append(nopts, name.Insecure)
	}
	var prio []string
	for _, f := range strings.Split(*prioritize, ",") {
		if f = strings.TrimPrefix(strings.TrimSpace(f), "/"); f != "" {
			prio = append(prio, f)
		}
	}
	type job struct {
		src name.Reference
		dst name.Reference
	}
	var jobs []job
	for _, a := range fs.Args() {
		src, err := name.ParseReference(a, nopts...)
		if err != nil {
			return fail(exitUsage, "image %q: %v", a, err)
		}
		var dst name.Reference
		if *to != "" {
			if dst, err = name.ParseReference(*to, nopts...); err != nil {
				return fail(exitUsage, "--to %q: %v", *to, err)
			}
		} else if dst, err = lazyimage.DefaultTarget(src); err != nil {
			return fail(exitUsage, "image %q: %v", a, err)
		}
		jobs = append(jobs, job{src, dst})
	}
	for _, j := range jobs {
		p := &convertProgress{out: c.errw, tty: isTerminal(c.errw), image: j.src.String(), start: time.Now()}
		res, err := lazyimage.Convert(ctx, j.src, j.dst, lazyimage.Options{
			Prioritized: prio,
			Platform:    plat,
			Remote:      []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)},
			Progress:    p.show,
		})
		p.end()
		if err != nil {
			return convertFailed(err)
		}
		switch {
		case res.Already && res.Converted == 0 && j.src.Name() == j.dst.Name():
			fmt.Fprintf(c.errw, "%s is eStargz already\n", j.src)
		case res.Converted < res.Layers:
			fmt.Fprintf(c.errw, "converted %s: %d of %d layers (the others were eStargz already), %s, in %s\n",
				j.src, res.Converted, res.Layers, humanBytes(res.Bytes), res.Took.Round(100*time.Millisecond))
		default:
			fmt.Fprintf(c.errw, "converted %s: %d layers, %s, in %s\n", j.src, res.Layers, humanBytes(res.Bytes), res.Took.Round(100*time.Millisecond))
		}
		fmt.Fprintf(c.out, "%s@%s\n", j.dst.Name(), res.Target.DigestStr())
	}
	return nil
}

// convertFailed gives a failed conversion its exit code from the registry's
// answer: 3 not found, 4 unauthorized or denied, else 1.
func convertFailed(err error) error {
	code := exitError
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			code = exitNotFound
		case http.StatusUnauthorized, http.StatusForbidden:
			code = exitUnauthorized
		}
	}
	return cliError{code: code, err: fmt.Errorf("images convert: %w", err)}
}

// convertProgress shows a conversion: on a terminal one bar rewritten in
// place, otherwise a line per layer.
type convertProgress struct {
	out   io.Writer
	tty   bool
	image string
	start time.Time
	drawn bool
}

func (p *convertProgress) show(pr lazyimage.Progress) {
	frac := 0.0
	if pr.Total > 0 {
		frac = float64(pr.Done) / float64(pr.Total)
	}
	const width = 30
	full := int(frac * width)
	text := fmt.Sprintf("%s  %s %3.0f%%  layer %d/%d  %s of %s  %s", p.image,
		strings.Repeat("█", full)+strings.Repeat("░", width-full), frac*100,
		pr.Layer, pr.Layers, humanBytes(pr.Done), humanBytes(pr.Total), time.Since(p.start).Round(time.Second))
	if p.tty {
		fmt.Fprintf(p.out, "\r\x1b[2K%s", text)
		p.drawn = true
		return
	}
	if pr.Layer > 0 {
		fmt.Fprintln(p.out, text)
	}
}

func (p *convertProgress) end() {
	if p.drawn {
		fmt.Fprintln(p.out)
		p.drawn = false
	}
}
