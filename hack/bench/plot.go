package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// cdfSVG draws the cumulative distribution of each series (log time axis)
// as a self-contained SVG.
func cdfSVG(title string, series map[string]durations) string {
	return cdfSVGAxes(title, "create → Ready", "pods Ready", series)
}

// cdfSVGAxes is cdfSVG with its axes named: what is timed (x) and what
// counts (y).
func cdfSVGAxes(title, timed, counted string, series map[string]durations) string {
	const (
		w, h                     = 1200, 520
		left, right, top, bottom = 70, 470, 50, 60
	)
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, d := range series {
		for _, v := range d {
			s := math.Max(v.Seconds(), 1e-3)
			lo, hi = math.Min(lo, s), math.Max(hi, s)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.01, 1
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	x := func(sec float64) float64 {
		return left + pw*(math.Log10(math.Max(sec, lo))-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	y := func(frac float64) float64 { return top + ph*(1-frac) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="25" font-size="15" font-weight="bold">%s</text>`+"\n", left, escape(title))
	for dec := lo; dec <= hi*1.0001; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := dec * m
			if v > hi*1.0001 {
				break
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(v), top, x(v), h-bottom)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(v), h-bottom+16, time.Duration(v*float64(time.Second)).String())
		}
	}
	for _, f := range []float64{0, .25, .5, .75, .9, .99, 1} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", left, y(f), w-right, y(f))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g%%</text>`+"\n", left-6, y(f)+4, f*100)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s (log scale)</text>`+"\n", left+pw/2, h-15, escape(timed))
	fmt.Fprintf(&b, `<text x="18" y="%.1f" transform="rotate(-90 18 %.1f)" text-anchor="middle">%s</text>`+"\n", top+ph/2, top+ph/2, escape(counted))
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
	names := make([]string, 0, len(series))
	for name := range series {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		d := slices.Clone(series[name])
		slices.Sort(d)
		color := colors[i%len(colors)]
		var pts []string
		for j, v := range d {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(v.Seconds()), y(float64(j+1)/float64(len(d)))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		ly := top + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", w-right+15, ly, w-right+35, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s (n=%d, p99 %s)</text>`+"\n", w-right+40, ly+4, escape(name), len(d), d.p99().Round(time.Millisecond))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// seriesSVG draws each series over time (linear axes) as a self-contained
// SVG.
func seriesSVG(title, ylabel string, series map[string][]point) string {
	const (
		w, h                     = 1200, 520
		left, right, top, bottom = 70, 470, 50, 60
	)
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	maxT, maxV := 1.0, 1.0
	for _, s := range series {
		for _, p := range s {
			maxT, maxV = math.Max(maxT, p.at.Seconds()), math.Max(maxV, p.v)
		}
	}
	maxV = math.Pow(10, math.Ceil(math.Log10(maxV)))
	x := func(sec float64) float64 { return left + pw*sec/maxT }
	y := func(v float64) float64 { return top + ph*(1-v/maxV) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="25" font-size="15" font-weight="bold">%s</text>`+"\n", left, escape(title))
	for i := 0; i <= 10; i++ {
		t := maxT * float64(i) / 10
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(t), top, x(t), h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.0f s</text>`+"\n", x(t), h-bottom+16, t)
		v := maxV * float64(i) / 10
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", left, y(v), w-right, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, y(v)+4, v)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">time since the first pod was created</text>`+"\n", left+pw/2, h-15)
	fmt.Fprintf(&b, `<text x="18" y="%.1f" transform="rotate(-90 18 %.1f)" text-anchor="middle">%s</text>`+"\n", top+ph/2, top+ph/2, escape(ylabel))
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
	names := slices.Sorted(maps.Keys(series))
	for i, name := range names {
		color := colors[i%len(colors)]
		var pts []string
		peak := 0.0
		for _, p := range series[name] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.at.Seconds()), y(p.v)))
			peak = math.Max(peak, p.v)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		ly := top + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", w-right+15, ly, w-right+35, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s (peak %.0f)</text>`+"\n", w-right+40, ly+4, escape(name), peak)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
